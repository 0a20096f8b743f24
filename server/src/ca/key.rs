//! The CA private key: the PEM labels Talos accepts, decoding each form
//! (PKCS#8 Ed25519, ECDSA and RSA; SEC1 EC; PKCS#1 RSA), and proof that the
//! key belongs to the CA certificate.

use der::Decode;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, RsaKeyPair};
use spki::ObjectIdentifier;

use super::CaError;
use crate::keys::{Signer, SoftwareKey};
use crate::x509::{self, ParsedCertificate, oid};

/// The PEM labels Talos's own loader accepts for private keys.
pub const ACCEPTED_KEY_LABELS: [&str; 4] = [
    "ED25519 PRIVATE KEY",
    "PRIVATE KEY",
    "EC PRIVATE KEY",
    "RSA PRIVATE KEY",
];

/// What a key signs to prove it belongs to the certificate (at start, and
/// for `/readyz` when the key is in a token).
pub(super) const PROBE: &[u8] = b"talos-sso: does this key belong to the CA certificate?";

/// Decode the private key and prove it belongs to `cert` by signing a probe
/// and verifying it with the certificate's public key.
pub(super) fn decode_key(text: &str, origin: &str, cert: &ParsedCertificate) -> Result<SoftwareKey, CaError> {
    match text.trim() {
        "" => {
            return Err(CaError::EmptyKey {
                origin: origin.to_owned(),
            });
        }
        "******" => {
            return Err(CaError::RedactedKey {
                origin: origin.to_owned(),
            });
        }
        _ => {}
    }
    let mut blocks = x509::pem_blocks(text).map_err(|_| CaError::NotPem {
        origin: origin.to_owned(),
        what: "unreadable PEM",
    })?;
    // A key file may hold other blocks first (`openssl ecparam -genkey`
    // writes EC PARAMETERS before the key): take the private key block, and
    // only name another label when there is none.
    let position = blocks
        .iter()
        .position(|(label, _)| label.ends_with("PRIVATE KEY"))
        .or_else(|| blocks.iter().position(|(label, _)| label != "CERTIFICATE"));
    let Some((label, der)) = position.map(|i| blocks.swap_remove(i)) else {
        return Err(CaError::NotPem {
            origin: origin.to_owned(),
            what: "no PRIVATE KEY block",
        });
    };
    let bad = |reason: String| CaError::BadKey {
        origin: origin.to_owned(),
        label: label.clone(),
        reason,
    };
    let rng = SystemRandom::new();
    let cert_key = cert.spki().subject_public_key.raw_bytes();
    let key = match label.as_str() {
        "ED25519 PRIVATE KEY" | "PRIVATE KEY" => {
            let info = pkcs8::PrivateKeyInfoRef::from_der(&der).map_err(|e| bad(e.to_string()))?;
            let algorithm = info.algorithm.oid;
            if algorithm == oid::ED25519 {
                SoftwareKey::Ed25519(
                    Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| bad(e.to_string()))?,
                )
            } else if algorithm == oid::EC_PUBLIC_KEY {
                let curve = info
                    .algorithm
                    .parameters
                    .and_then(|p| p.decode_as::<ObjectIdentifier>().ok());
                let sec1 = sec1::EcPrivateKey::from_der(info.private_key.as_bytes())
                    .map_err(|e| bad(e.to_string()))?;
                ecdsa_key(curve, sec1.private_key, cert_key, &rng, origin)
                    .map_err(|e| e.unwrap_or_else(&bad))?
            } else if algorithm == oid::RSA_ENCRYPTION {
                SoftwareKey::Rsa(RsaKeyPair::from_pkcs8(&der).map_err(|e| bad(e.to_string()))?)
            } else {
                return Err(bad(format!("unsupported key algorithm {algorithm}")));
            }
        }
        "EC PRIVATE KEY" => {
            let sec1 = sec1::EcPrivateKey::from_der(&der).map_err(|e| bad(e.to_string()))?;
            let curve = sec1.parameters.and_then(|p| p.named_curve());
            ecdsa_key(curve, sec1.private_key, cert_key, &rng, origin).map_err(|e| e.unwrap_or_else(&bad))?
        }
        "RSA PRIVATE KEY" => SoftwareKey::Rsa(RsaKeyPair::from_der(&der).map_err(|e| bad(e.to_string()))?),
        _ => {
            return Err(CaError::UnsupportedKeyLabel {
                origin: origin.to_owned(),
                label,
            });
        }
    };
    let matches = key.sign(PROBE).is_ok_and(|sig| {
        x509::verify_signature(cert.spki(), &key.signature_algorithm(), PROBE, &sig).is_ok()
    });
    if !matches {
        return Err(CaError::KeyMismatch {
            origin: origin.to_owned(),
        });
    }
    Ok(key)
}

/// ring needs the public point next to the scalar; SEC1 keys may omit it, so
/// take it from the certificate: ring refuses a scalar that does not produce
/// that point, which is exactly a key that does not match its certificate.
/// The error is `Ok(CaError)` for a mismatch, `Err(reason)` for a bad key.
fn ecdsa_key(
    curve: Option<ObjectIdentifier>,
    scalar: &[u8],
    cert_public_key: &[u8],
    rng: &SystemRandom,
    origin: &str,
) -> Result<SoftwareKey, Result<CaError, String>> {
    let (algorithm, wrap): (_, fn(EcdsaKeyPair) -> SoftwareKey) = match curve {
        Some(c) if c == oid::SECP256R1 => {
            (&signature::ECDSA_P256_SHA256_ASN1_SIGNING, SoftwareKey::EcdsaP256)
        }
        Some(c) if c == oid::SECP384R1 => {
            (&signature::ECDSA_P384_SHA384_ASN1_SIGNING, SoftwareKey::EcdsaP384)
        }
        Some(c) => return Err(Err(format!("unsupported curve {c}"))),
        None => return Err(Err("the key names no curve".into())),
    };
    EcdsaKeyPair::from_private_key_and_public_key(algorithm, scalar, cert_public_key, rng)
        .map(wrap)
        .map_err(|_| {
            Ok(CaError::KeyMismatch {
                origin: origin.to_owned(),
            })
        })
}
