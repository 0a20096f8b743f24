//! talos-sso, the client: logs a person in with single sign-on and writes a
//! short-lived Talos client certificate into their talosconfig.
//!
//! - `key`: the per-certificate Ed25519 key and the CSR sent in its place.

pub mod key;
