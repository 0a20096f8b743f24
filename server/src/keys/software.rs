//! A private key in this process's memory, signing with ring: what a CA
//! key file, a `talosctl gen secrets` bundle or a machine config holds, and
//! the audit key file. Also the PKCS#8 v1 encoding of new Ed25519 keys.

use std::fmt;

use const_oid::db::{rfc5912, rfc8410};
use der::Encode;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use spki::{AlgorithmIdentifierOwned, ObjectIdentifier, SubjectPublicKeyInfoOwned};

use super::{KeyKind, SignError, Signer};

/// A private key in memory. ECDSA keys sign with the curve's own hash
/// (`*_ASN1_SIGNING`: DER signatures), RSA with PKCS#1 v1.5 SHA-256.
pub enum SoftwareKey {
    Ed25519(Ed25519KeyPair),
    EcdsaP256(EcdsaKeyPair),
    EcdsaP384(EcdsaKeyPair),
    Rsa(RsaKeyPair),
}

impl fmt::Debug for SoftwareKey {
    // Never print key material, not even by accident in a Debug dump.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SoftwareKey({})", self.kind())
    }
}

impl Signer for SoftwareKey {
    fn kind(&self) -> KeyKind {
        match self {
            SoftwareKey::Ed25519(_) => KeyKind::Ed25519,
            SoftwareKey::EcdsaP256(_) => KeyKind::EcdsaP256,
            SoftwareKey::EcdsaP384(_) => KeyKind::EcdsaP384,
            SoftwareKey::Rsa(k) => KeyKind::Rsa {
                bits: k.public().modulus_len() * 8,
            },
        }
    }

    fn signature_algorithm(&self) -> AlgorithmIdentifierOwned {
        let (oid, parameters) = match self {
            SoftwareKey::Ed25519(_) => (rfc8410::ID_ED_25519, None),
            SoftwareKey::EcdsaP256(_) => (rfc5912::ECDSA_WITH_SHA_256, None),
            SoftwareKey::EcdsaP384(_) => (rfc5912::ECDSA_WITH_SHA_384, None),
            SoftwareKey::Rsa(_) => (rfc5912::SHA_256_WITH_RSA_ENCRYPTION, Some(der::asn1::Any::null())),
        };
        AlgorithmIdentifierOwned { oid, parameters }
    }

    fn public_key_info(&self) -> Result<SubjectPublicKeyInfoOwned, der::Error> {
        let (algorithm, key): (AlgorithmIdentifierOwned, &[u8]) = match self {
            SoftwareKey::Ed25519(k) => (
                AlgorithmIdentifierOwned {
                    oid: rfc8410::ID_ED_25519,
                    parameters: None,
                },
                k.public_key().as_ref(),
            ),
            SoftwareKey::EcdsaP256(k) => (ec_algorithm(rfc5912::SECP_256_R_1)?, k.public_key().as_ref()),
            SoftwareKey::EcdsaP384(k) => (ec_algorithm(rfc5912::SECP_384_R_1)?, k.public_key().as_ref()),
            SoftwareKey::Rsa(k) => (
                AlgorithmIdentifierOwned {
                    oid: rfc5912::RSA_ENCRYPTION,
                    parameters: Some(der::asn1::Any::null()),
                },
                k.public_key().as_ref(),
            ),
        };
        Ok(SubjectPublicKeyInfoOwned {
            algorithm,
            subject_public_key: der::asn1::BitString::from_bytes(key)?,
        })
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, SignError> {
        // The system generator holds no state: one per signature costs nothing.
        let rng = SystemRandom::new();
        match self {
            SoftwareKey::Ed25519(k) => Ok(k.sign(message).as_ref().to_vec()),
            SoftwareKey::EcdsaP256(k) | SoftwareKey::EcdsaP384(k) => k
                .sign(&rng, message)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| SignError::Failed),
            SoftwareKey::Rsa(k) => {
                let mut out = vec![0u8; k.public().modulus_len()];
                k.sign(&signature::RSA_PKCS1_SHA256, &rng, message, &mut out)
                    .map_err(|_| SignError::Failed)?;
                Ok(out)
            }
        }
    }
}

fn ec_algorithm(curve: ObjectIdentifier) -> Result<AlgorithmIdentifierOwned, der::Error> {
    Ok(AlgorithmIdentifierOwned {
        oid: rfc5912::ID_EC_PUBLIC_KEY,
        parameters: Some(der::asn1::Any::encode_from(&curve)?),
    })
}

/// PKCS#8 v1 (RFC 5208 PrivateKeyInfo, no public key) for an Ed25519 seed:
/// what Talos and OpenSSL 3.0 read (ring's own encoding is v2, which
/// OpenSSL 3.0 cannot read).
pub fn ed25519_pkcs8_v1(seed: &[u8; 32]) -> Result<Vec<u8>, der::Error> {
    let curve_private_key = der::asn1::OctetString::new(seed.as_slice())?.to_der()?;
    let info = pkcs8::PrivateKeyInfoRef::new(
        spki::AlgorithmIdentifier {
            oid: rfc8410::ID_ED_25519,
            parameters: None,
        },
        der::asn1::OctetStringRef::new(&curve_private_key)?,
    );
    info.to_der()
}
