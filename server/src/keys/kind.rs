//! Which public key types the crate tells apart ([`KeyKind`]), read from a
//! SubjectPublicKeyInfo. Signers, X.509 verification and the CA checks all
//! speak of keys in these terms.

use std::fmt;

use const_oid::db::{rfc5912, rfc8410};
use der::Decode;
use der::asn1::UintRef;
use spki::{ObjectIdentifier, SubjectPublicKeyInfoOwned};

/// The public key types this crate can tell apart. `Other` carries a
/// printable description so errors can say what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    Ed25519,
    EcdsaP256,
    EcdsaP384,
    Rsa { bits: usize },
    Other(String),
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyKind::Ed25519 => f.write_str("Ed25519"),
            KeyKind::EcdsaP256 => f.write_str("ECDSA P-256"),
            KeyKind::EcdsaP384 => f.write_str("ECDSA P-384"),
            KeyKind::Rsa { bits } => write!(f, "RSA-{bits}"),
            KeyKind::Other(what) => f.write_str(what),
        }
    }
}

/// Classify a SubjectPublicKeyInfo. Malformed RSA keys and unknown curves come
/// back as `Other` so that the caller reports "unsupported" rather than crashing.
pub fn key_kind(spki: &SubjectPublicKeyInfoOwned) -> KeyKind {
    let alg = &spki.algorithm;
    if alg.oid == rfc8410::ID_ED_25519 {
        return if alg.parameters.is_none() && spki.subject_public_key.raw_bytes().len() == 32 {
            KeyKind::Ed25519
        } else {
            KeyKind::Other("malformed Ed25519 key".into())
        };
    }
    if alg.oid == rfc8410::ID_ED_448 {
        return KeyKind::Other("Ed448".into());
    }
    if alg.oid == rfc5912::ID_EC_PUBLIC_KEY {
        let curve = alg
            .parameters
            .as_ref()
            .and_then(|p| p.decode_as::<ObjectIdentifier>().ok());
        return match curve {
            Some(c) if c == rfc5912::SECP_256_R_1 => KeyKind::EcdsaP256,
            Some(c) if c == rfc5912::SECP_384_R_1 => KeyKind::EcdsaP384,
            Some(c) if c == rfc5912::SECP_521_R_1 => KeyKind::Other("ECDSA P-521".into()),
            Some(c) => KeyKind::Other(format!("ECDSA on curve {c}")),
            None => KeyKind::Other("ECDSA without a named curve".into()),
        };
    }
    if alg.oid == rfc5912::RSA_ENCRYPTION {
        return match rsa_modulus_bits(spki.subject_public_key.raw_bytes()) {
            Some(bits) => KeyKind::Rsa { bits },
            None => KeyKind::Other("malformed RSA key".into()),
        };
    }
    KeyKind::Other(format!("key algorithm {}", alg.oid))
}

/// RSAPublicKey ::= SEQUENCE { modulus INTEGER, publicExponent INTEGER }
#[derive(der::Sequence)]
struct RsaPublicKey<'a> {
    modulus: UintRef<'a>,
    public_exponent: UintRef<'a>,
}

fn rsa_modulus_bits(der: &[u8]) -> Option<usize> {
    let key = RsaPublicKey::from_der(der).ok()?;
    let _ = key.public_exponent;
    let bytes = key.modulus.as_bytes();
    let first = *bytes.first()?;
    Some((bytes.len() - 1) * 8 + (8 - first.leading_zeros() as usize))
}
