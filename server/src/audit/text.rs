//! Text from outside made safe to keep: every string that reaches an audit
//! record (request bodies, unverified token claims, query filters, headers)
//! passes through here before it is hashed and stored. The rules live in
//! the shared crate `talos-sso-text` (the client shows text by the same
//! ones); this module is where the server's code finds them until its
//! callers name the crate themselves.

use serde_json::Value;
pub use talos_sso_text::{
    FIELD_CHARS, ITEM_CHARS, LIST_ITEMS, REASON_CHARS, clean, clean_field, clean_list, is_unsafe,
};

/// Every string (and object key) in `value` cleaned, nesting bounded; a
/// number outside what the canonical encoding reads exactly (RFC 8785
/// reads numbers as doubles: an integer beyond 2^53 would share its bytes,
/// and so its hash, with a neighbour) is kept as text, and so are
/// fractions, so that every number in a record is an integer any JSON
/// reader and any verifier writes alike (docs/audit.md, "The hash chain").
pub fn clean_json(value: Value) -> Value {
    talos_sso_text::clean_json(value, talos_sso_api::chain::is_safe_integer)
}
