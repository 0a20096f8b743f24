//! Signature checks for the algorithms a Talos CA or a client CSR can
//! reasonably use.

use ring::signature;
use spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};

use super::{X509Error, oid};
use crate::keys::{KeyKind, key_kind};

/// Verify a signature made with the key in `spki`. Only the algorithms a
/// Talos CA or a client CSR can reasonably use are accepted.
pub fn verify_signature(
    spki: &SubjectPublicKeyInfoOwned,
    algorithm: &AlgorithmIdentifierOwned,
    message: &[u8],
    signature_bytes: &[u8],
) -> Result<(), X509Error> {
    let kind = key_kind(spki);
    let mismatch = || X509Error::AlgorithmKeyMismatch {
        algorithm: algorithm.oid,
        key: kind.clone(),
    };
    let verifier: &dyn signature::VerificationAlgorithm = match algorithm.oid {
        a if a == oid::ED25519 => match kind {
            KeyKind::Ed25519 => &signature::ED25519,
            _ => return Err(mismatch()),
        },
        a if a == oid::ECDSA_WITH_SHA256 => match kind {
            KeyKind::EcdsaP256 => &signature::ECDSA_P256_SHA256_ASN1,
            KeyKind::EcdsaP384 => &signature::ECDSA_P384_SHA256_ASN1,
            _ => return Err(mismatch()),
        },
        a if a == oid::ECDSA_WITH_SHA384 => match kind {
            KeyKind::EcdsaP256 => &signature::ECDSA_P256_SHA384_ASN1,
            KeyKind::EcdsaP384 => &signature::ECDSA_P384_SHA384_ASN1,
            _ => return Err(mismatch()),
        },
        a if a == oid::SHA256_WITH_RSA || a == oid::SHA384_WITH_RSA || a == oid::SHA512_WITH_RSA => {
            if !matches!(kind, KeyKind::Rsa { .. }) {
                return Err(mismatch());
            }
            if a == oid::SHA256_WITH_RSA {
                &signature::RSA_PKCS1_2048_8192_SHA256
            } else if a == oid::SHA384_WITH_RSA {
                &signature::RSA_PKCS1_2048_8192_SHA384
            } else {
                &signature::RSA_PKCS1_2048_8192_SHA512
            }
        }
        other => return Err(X509Error::UnsupportedSignatureAlgorithm(other)),
    };
    signature::UnparsedPublicKey::new(verifier, spki.subject_public_key.raw_bytes())
        .verify(message, signature_bytes)
        .map_err(|_| X509Error::BadSignature)
}
