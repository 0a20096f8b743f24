//! Text from elsewhere (audit records from the server, the identity
//! provider's answers, a browser redirect) made safe to show in a terminal:
//! the rules of the shared crate `talos-sso-text` (the server keeps text by
//! the same ones), found here by the modules that have not yet named the
//! crate themselves.

pub use talos_sso_text::{bounded, escape, is_unsafe, json};
