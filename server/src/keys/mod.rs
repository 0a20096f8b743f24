//! Private keys that sign: the [`Signer`] trait, and its kinds. A key is
//! either in this process ([`software`], ring) or outside it, where the
//! private half never enters the process ([`pkcs11`], a hardware security
//! module). `x509`, the CA and the audit checkpoints sign through the trait
//! and know no kind.
//!
//! A new kind (a cloud key service, say) is a module of its own here that
//! implements [`Signer`], plus the line that opens it where the
//! configuration names it (`ca::authority::open_key` for a CA,
//! `audit::checkpoint::AuditKey::configured` for the audit key).
//!
//! This module knows nothing of certificates, HTTP or configuration files.

mod kind;
pub mod pkcs11;
pub mod software;

use std::sync::Arc;

use spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};

pub use kind::{KeyKind, key_kind};
pub use software::SoftwareKey;

/// A private key that signs. The algorithm follows the key, as Talos does:
/// Ed25519, ECDSA with the curve's own hash, RSA with PKCS#1 v1.5 SHA-256.
pub trait Signer: std::fmt::Debug + Send + Sync {
    /// The key's type.
    fn kind(&self) -> KeyKind;

    /// The signatureAlgorithm this key writes into certificates.
    fn signature_algorithm(&self) -> AlgorithmIdentifierOwned;

    /// The public key, e.g. for a new CA certificate.
    fn public_key_info(&self) -> Result<SubjectPublicKeyInfoOwned, der::Error>;

    /// Sign `message` as X.509 wants it (ECDSA as a DER `Ecdsa-Sig-Value`).
    /// A key outside the process waits for its answer without holding up
    /// the async runtime's other tasks; when it cannot be reached, the
    /// error is [`SignError::Unavailable`].
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, SignError>;

    /// Where the key lives when it is outside this process (a token, a key
    /// service), for `check` and `ca inspect`; `None` for a key in memory.
    /// Such a key may be unreachable: `/readyz` probes it.
    fn location(&self) -> Option<String> {
        None
    }

    /// Turns to sign, when the key can only sign so many times at once (an
    /// HSM's sessions): issuances wait here without holding a thread.
    /// `None`: as many at once as come.
    fn turns(&self) -> Option<&tokio::sync::Semaphore> {
        None
    }
}

/// Why a signature was not made.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SignError {
    /// A key in memory refused to sign (not expected to happen).
    #[error("signing failed")]
    Failed,
    /// The key is outside this process and cannot sign right now.
    #[error("{0}")]
    Unavailable(KeyUnavailable),
}

/// Why a key outside this process could not sign: the kind's own error,
/// kept for its message (it names the token or service).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct KeyUnavailable(Arc<dyn std::error::Error + Send + Sync>);

impl KeyUnavailable {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }
}
