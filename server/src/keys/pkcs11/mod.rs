//! A key that never leaves a hardware security module: signing through a
//! PKCS#11 module (a YubiHSM 2, a cloud or network HSM, SoftHSM for tests).
//!
//! [`Pkcs11Key`] holds the module, the token's slot and a small pool of
//! logged-in sessions, so that concurrent issuances each sign on their own
//! session instead of queueing behind one (`session_pool`). PKCS#11 keeps
//! the login state per token and application: the first session logs in
//! and every later one shares that state (`CKR_USER_ALREADY_LOGGED_IN` is
//! expected, not an error). A failed signature closes the pool,
//! re-initializes the module (some modules, SoftHSM among them, see a token
//! that came back only then) and tries once more; while the token stays
//! away every signature (an issuance, or the `/readyz` probe) tries again,
//! so the server recovers by itself when the HSM comes back. PKCS#11
//! initialization is per process, so keys on one module share one loaded
//! module (`module`), and re-initializing waits until none of them is
//! inside a call. A signature that cannot be made is [`Pkcs11Error`], which
//! issuance answers with `signing_unavailable` and never records as issued.
//!
//! The parts: `module` (loading, epochs, finding the token, waiting off the
//! runtime's workers), `session_pool` ([`Pkcs11Key`]: sessions and
//! signing), `generate` (key pairs made inside a token, public keys read
//! from one), `signature` (the token's raw signatures as X.509 wants them).
//!
//! The PIN comes from a file with the permission rules of a key file and is
//! kept only as a `secrecy` string. This module knows nothing about HTTP.

mod generate;
mod module;
mod session_pool;
mod signature;

use std::path::PathBuf;

use super::KeyKind;

pub use generate::{generate_key_pair, token_public_key};
pub use session_pool::Pkcs11Key;

/// Where the key is: configuration data (`config`).
use crate::config::Pkcs11Source;

/// Why the token could not sign (or be opened). Each names the token.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Pkcs11Error {
    #[error("cannot load the PKCS#11 module {module}: {reason}")]
    Module { module: PathBuf, reason: String },
    #[error("no PKCS#11 token labelled `{token_label}` in {module} (tokens present: {present})")]
    TokenUnknown {
        module: PathBuf,
        token_label: String,
        present: String,
    },
    #[error(
        "the PIN in {pin_file} is incorrect for PKCS#11 token `{token_label}` (CKR_PIN_INCORRECT); \
         repeated attempts may lock the token"
    )]
    PinIncorrect { token_label: String, pin_file: PathBuf },
    #[error(
        "the user PIN of PKCS#11 token `{token_label}` is locked (CKR_PIN_LOCKED); unlock it with the SO PIN"
    )]
    PinLocked { token_label: String },
    #[error("PKCS#11 token `{token_label}` has no private key labelled `{key_label}`")]
    KeyUnknown { token_label: String, key_label: String },
    #[error("PKCS#11 token `{token_label}` already holds a key labelled `{key_label}`; choose another label")]
    KeyExists { token_label: String, key_label: String },
    #[error(
        "PKCS#11 token `{token_label}`, key `{key_label}`: the key is a {found} key, the certificate's is {expected}"
    )]
    KeyTypeMismatch {
        token_label: String,
        key_label: String,
        found: String,
        expected: KeyKind,
    },
    #[error("the certificate's {0} key cannot sign through PKCS#11 here; use Ed25519 or ECDSA P-256")]
    UnsupportedKeyType(KeyKind),
    #[error("PKCS#11 token `{token_label}` is unavailable ({operation}: {reason})")]
    Unavailable {
        token_label: String,
        operation: &'static str,
        reason: String,
    },
}

impl Pkcs11Error {
    pub fn code(&self) -> &'static str {
        match self {
            Pkcs11Error::Module { .. } => "ca_pkcs11_module",
            Pkcs11Error::TokenUnknown { .. } => "ca_pkcs11_token_unknown",
            Pkcs11Error::KeyExists { .. } => "ca_pkcs11_key_exists",
            Pkcs11Error::PinIncorrect { .. } => "ca_pkcs11_pin_incorrect",
            Pkcs11Error::PinLocked { .. } => "ca_pkcs11_pin_locked",
            Pkcs11Error::KeyUnknown { .. } => "ca_pkcs11_key_unknown",
            Pkcs11Error::KeyTypeMismatch { .. } => "ca_key_mismatch",
            Pkcs11Error::UnsupportedKeyType(_) => "ca_key_type_unsupported",
            Pkcs11Error::Unavailable { .. } => "ca_pkcs11_unavailable",
        }
    }
}

/// The token as found: what `ca inspect` and `check` report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFacts {
    pub token_label: String,
    pub manufacturer: String,
    pub model: String,
    pub serial: String,
    pub slot: u64,
    pub key_label: String,
}

impl std::fmt::Display for TokenFacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PKCS#11 token `{}` (slot {}, {} {}, serial {}), key `{}`",
            self.token_label, self.slot, self.manufacturer, self.model, self.serial, self.key_label
        )
    }
}
