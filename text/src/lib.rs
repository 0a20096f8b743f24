//! Text that came from outside, made safe, shared by the server and the
//! client so that both refuse the same characters in the same way.
//!
//! - [`safe`]: one test of which characters may not be kept or shown as
//!   they are, the visible escape that replaces them, and the bounds that
//!   keep one value from growing without end (the server's `clean*` for
//!   what it stores, the client's `escape`, `bounded` and `json` for what
//!   it prints).
//! - [`csv`]: CSV for spreadsheets (the console's exports and the CLI's),
//!   through the `csv` crate, with the one guard that keeps a cell from
//!   being run as a formula.

pub mod csv;
pub mod safe;

pub use safe::{
    FIELD_CHARS, ITEM_CHARS, LIST_ITEMS, REASON_CHARS, bounded, clean, clean_field, clean_json, clean_list,
    escape, is_unsafe, is_unsafe_to_keep, json,
};
