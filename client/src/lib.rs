//! talos-sso, the client: logs a person in with single sign-on and writes a
//! short-lived Talos client certificate into their talosconfig; reads the
//! audit trail for the security team and keeps the deny list for
//! administrators.
//!
//! - `cli`: the commands (`login`, `status`, `logout`, `exec`, `audit`,
//!   `deny`, `version`, `completions`).
//! - `api`: the typed client over `talos-sso-api`'s wire types.
//! - `connection`: why a connection failed, as a sentence with the fix.
//! - `login`: discovery, browser (PKCE) and device flows, refresh, and the
//!   saved logins (the keyring, or a file).
//! - `key`: the per-certificate Ed25519 key and the CSR sent in its place.
//! - `talosconfig`: read-modify-write that keeps what it does not know.
//! - `state`: the client's own configuration (server, default cluster, logins).
//! - `trust`: certificate authorities trusted per server beyond the system's.
//! - `messages`: server error codes as sentences a person can act on.
//! - `certinfo`: roles and expiry read back from a certificate.
//! - `files`: locked, atomic, private file writes.
//! - `paths`: where the client's files are, one rule on every Unix.
//! - `debug`: `--debug`, the HTTP exchanges and decisions on stderr, every
//!   secret redacted.
//!
//! Text from the server or the identity provider is made safe to print by
//! the shared crate `talos-sso-text` (the server keeps records by the same
//! rules).

/// The source revision of this build (`git rev-parse HEAD`, or
/// `TALOS_SSO_REVISION` at build time), `unknown` when neither was there.
pub const REVISION: &str = env!("TALOS_SSO_REVISION");

/// What `--version` prints after the name: the version and the revision.
pub const VERSION_LINE: &str = env!("TALOS_SSO_VERSION_LINE");

pub mod api;
pub mod certinfo;
pub mod cli;
pub mod connection;
pub mod debug;
pub mod files;
pub mod key;
pub mod login;
pub mod messages;
pub mod paths;
pub mod state;
pub mod talosconfig;
pub mod trust;
