//! The client's key and certificate request. A fresh Ed25519 key is made for
//! every certificate and never leaves this machine: only the CSR is sent.
//!
//! The key is written as Talos writes it: PKCS#8 v1 (RFC 5208, 48 bytes of
//! DER, no embedded public key) under the PEM label `ED25519 PRIVATE KEY`.
//! ring's own PKCS#8 output is v2, which OpenSSL 3.0 cannot read.

use std::fmt;
use std::str::FromStr;

use der::{Encode, asn1::BitString};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{Ed25519KeyPair, KeyPair};
use spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};
use x509_cert::name::Name;
use x509_cert::request::{CertReq, CertReqInfo, Version};
use zeroize::Zeroizing;

use const_oid::db::rfc8410::ID_ED_25519 as ED25519;

/// The PEM label Talos uses for Ed25519 keys (Go's `crypto/tls` accepts any
/// label ending in `PRIVATE KEY`).
pub const KEY_PEM_LABEL: &str = "ED25519 PRIVATE KEY";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the system random number generator failed")]
    Random,
    #[error("encoding failed: {0}")]
    Encoding(#[from] der::Error),
}

/// A new Ed25519 key pair. `Debug` shows only the public key.
pub struct ClientKey {
    pkcs8_v1: Zeroizing<Vec<u8>>,
    pair: Ed25519KeyPair,
}

impl fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ClientKey(Ed25519, public {})",
            hex_prefix(self.pair.public_key().as_ref())
        )
    }
}

fn hex_prefix(bytes: &[u8]) -> String {
    bytes.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

impl ClientKey {
    pub fn generate() -> Result<Self, KeyError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        SystemRandom::new()
            .fill(seed.as_mut())
            .map_err(|_| KeyError::Random)?;
        // PrivateKeyInfo v1: the private key is CurvePrivateKey, itself an
        // OCTET STRING holding the 32-byte seed (RFC 8410 section 7).
        let curve_private_key = Zeroizing::new(der::asn1::OctetString::new(seed.as_slice())?.to_der()?);
        let info = pkcs8::PrivateKeyInfoRef::new(
            spki::AlgorithmIdentifier {
                oid: ED25519,
                parameters: None,
            },
            der::asn1::OctetStringRef::new(&curve_private_key)?,
        );
        let pkcs8_v1 = Zeroizing::new(info.to_der()?);
        let pair = Ed25519KeyPair::from_seed_unchecked(seed.as_slice()).map_err(|_| KeyError::Random)?;
        Ok(Self { pkcs8_v1, pair })
    }

    /// PKCS#8 v1 DER.
    pub fn pkcs8_der(&self) -> &[u8] {
        &self.pkcs8_v1
    }

    /// The key as it goes into the talosconfig `key` (before base64).
    pub fn private_key_pem(&self) -> Zeroizing<String> {
        Zeroizing::new(pem(KEY_PEM_LABEL, &self.pkcs8_v1))
    }

    pub fn public_key_info(&self) -> Result<SubjectPublicKeyInfoOwned, KeyError> {
        Ok(SubjectPublicKeyInfoOwned {
            algorithm: AlgorithmIdentifierOwned {
                oid: ED25519,
                parameters: None,
            },
            subject_public_key: BitString::from_bytes(self.pair.public_key().as_ref())?,
        })
    }

    /// A PKCS#10 request signed with this key. The subject is informational:
    /// the server takes identity from the verified token, never from the CSR.
    pub fn csr_der(&self) -> Result<Vec<u8>, KeyError> {
        let info = CertReqInfo {
            version: Version::V1,
            subject: Name::from_str("CN=talos-sso")?,
            public_key: self.public_key_info()?,
            attributes: Default::default(),
        };
        let signature = self.pair.sign(&info.to_der()?);
        let request = CertReq {
            info,
            algorithm: AlgorithmIdentifierOwned {
                oid: ED25519,
                parameters: None,
            },
            signature: BitString::from_bytes(signature.as_ref())?,
        };
        Ok(request.to_der()?)
    }

    pub fn csr_pem(&self) -> Result<String, KeyError> {
        Ok(pem("CERTIFICATE REQUEST", &self.csr_der()?))
    }
}

/// One PEM block, LF line endings (the `pem` crate's default is CRLF).
fn pem(label: &str, der: &[u8]) -> String {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    pem::encode_config(&pem::Pem::new(label, der), config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkcs8_is_v1_and_48_bytes_like_talos() {
        let key = ClientKey::generate().unwrap();
        let der = key.pkcs8_der();
        assert_eq!(der.len(), 48);
        let info = pkcs8::PrivateKeyInfoRef::try_from(der).unwrap();
        assert_eq!(info.version(), pkcs8::Version::V1);
        assert!(info.public_key.is_none());
        assert!(
            key.private_key_pem()
                .starts_with("-----BEGIN ED25519 PRIVATE KEY-----\n")
        );
    }

    #[test]
    fn every_key_is_new() {
        let a = ClientKey::generate().unwrap();
        let b = ClientKey::generate().unwrap();
        assert_ne!(a.public_key_info().unwrap(), b.public_key_info().unwrap());
    }

    #[test]
    fn debug_never_prints_the_private_key() {
        let key = ClientKey::generate().unwrap();
        let shown = format!("{key:?}");
        assert!(!shown.contains("PRIVATE"));
        assert!(shown.len() < 60);
    }
}
