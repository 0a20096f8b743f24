//! Low-level X.509 and DER: reading certificates while keeping the exact bytes
//! of their names, building and signing certificates, and checking signatures.
//!
//! Everything here is mechanism, not policy: which extensions a Talos client
//! certificate carries is decided in `certificate`, which CA material is
//! acceptable in `ca`. This module knows nothing about roles, clusters, HTTP
//! or where a key lives: it signs with any [`crate::keys::Signer`].
//!
//! The parts: `parse` ([`ParsedCertificate`]), `names` (distinguished names
//! written and read), `extensions` (the extensions a CA or a leaf carries),
//! `sign` (a template into a signed certificate), `verify` (signatures
//! checked), `pem` (PEM text in and out).

mod extensions;
mod names;
mod parse;
mod pem_text;
mod sign;
mod verify;

use spki::ObjectIdentifier;

use crate::keys::{KeyKind, SignError};

pub use extensions::{authority_key_id, extension, key_identifier, purpose_extensions, subject_key_id};
pub use names::{attribute_strings, encode_name};
pub use parse::ParsedCertificate;
pub use pem_text::{PemError, pem_blocks, pem_encode};
pub use sign::{CertificateTemplate, random_serial, sign_certificate, x509_time};
pub use verify::verify_signature;

/// The object identifiers the crate uses, under short names, all taken from
/// `const_oid`'s database (each `use` names the RFC module it comes from), so
/// none is spelled out by hand.
pub mod oid {
    pub use const_oid::db::rfc4519::{
        COMMON_NAME, ORGANIZATION_NAME as ORGANIZATION, ORGANIZATIONAL_UNIT_NAME as ORGANIZATIONAL_UNIT,
    };
    pub use const_oid::db::rfc5280::{
        ANY_EXTENDED_KEY_USAGE, ID_CE_AUTHORITY_KEY_IDENTIFIER as AUTHORITY_KEY_ID,
        ID_CE_BASIC_CONSTRAINTS as BASIC_CONSTRAINTS, ID_CE_EXT_KEY_USAGE as EXT_KEY_USAGE,
        ID_CE_KEY_USAGE as KEY_USAGE, ID_CE_SUBJECT_ALT_NAME as SUBJECT_ALT_NAME,
        ID_CE_SUBJECT_KEY_IDENTIFIER as SUBJECT_KEY_ID, ID_KP_CLIENT_AUTH as KP_CLIENT_AUTH,
        ID_KP_SERVER_AUTH as KP_SERVER_AUTH,
    };
    pub use const_oid::db::rfc5912::{
        ECDSA_WITH_SHA_256 as ECDSA_WITH_SHA256, ECDSA_WITH_SHA_384 as ECDSA_WITH_SHA384,
        ID_EC_PUBLIC_KEY as EC_PUBLIC_KEY, RSA_ENCRYPTION, SECP_256_R_1 as SECP256R1,
        SECP_384_R_1 as SECP384R1, SECP_521_R_1 as SECP521R1, SHA_256_WITH_RSA_ENCRYPTION as SHA256_WITH_RSA,
        SHA_384_WITH_RSA_ENCRYPTION as SHA384_WITH_RSA, SHA_512_WITH_RSA_ENCRYPTION as SHA512_WITH_RSA,
    };
    pub use const_oid::db::rfc8410::{ID_ED_448 as ED448, ID_ED_25519 as ED25519};
}

/// What can go wrong below the policy layer.
#[derive(Debug, thiserror::Error)]
pub enum X509Error {
    #[error("malformed DER: {0}")]
    Der(#[from] der::Error),
    #[error("unsupported signature algorithm {0}")]
    UnsupportedSignatureAlgorithm(ObjectIdentifier),
    #[error("signature algorithm {algorithm} does not fit a {key} key")]
    AlgorithmKeyMismatch {
        algorithm: ObjectIdentifier,
        key: KeyKind,
    },
    #[error("the signature does not verify")]
    BadSignature,
    /// The key could not sign: in memory it refused, outside the process
    /// (a token) it cannot be reached now.
    #[error(transparent)]
    Signing(#[from] SignError),
    #[error("the system random number generator failed")]
    NoRandomness,
    #[error("the extension {0} appears more than once; RFC 5280 allows one of each")]
    DuplicateExtension(ObjectIdentifier),
    #[error("the extension {0} cannot be read")]
    UnreadableExtension(ObjectIdentifier),
}
