//! A provider's JSON Web Key Set, reduced to the keys we can verify with.
//!
//! Only signing keys of the allowed algorithms are kept: RSA (RS256, at least
//! 2048 bits), EC P-256 (ES256) and Ed25519 (EdDSA). Encryption keys, other
//! curves and malformed entries are skipped rather than failing the whole
//! set, as a provider may publish keys for other purposes next to ours.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;

/// A public key usable for one JWS algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyingKey {
    /// RS256: modulus and exponent, big-endian.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// ES256: the uncompressed point 0x04 || x || y.
    EcP256 { point: Vec<u8> },
    /// EdDSA with Ed25519: the 32-byte public key.
    Ed25519 { x: Vec<u8> },
}

impl VerifyingKey {
    /// The only JWS `alg` this key may verify: a key never changes algorithm,
    /// which rules out algorithm confusion.
    pub fn algorithm(&self) -> &'static str {
        match self {
            VerifyingKey::Rsa { .. } => "RS256",
            VerifyingKey::EcP256 { .. } => "ES256",
            VerifyingKey::Ed25519 { .. } => "EdDSA",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("the key set is not a JWKS document: {0}")]
    NotJwks(String),
    #[error("the key set holds no usable signing key")]
    Empty,
}

/// Keys by `kid`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySet {
    keys: HashMap<String, VerifyingKey>,
}

#[derive(Deserialize)]
struct JwksDocument {
    keys: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
    alg: Option<String>,
    n: Option<String>,
    e: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

fn b64(value: Option<&String>) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(value?.trim_end_matches('=')).ok()
}

impl KeySet {
    pub fn from_json(text: &str) -> Result<Self, JwksError> {
        let document: JwksDocument =
            serde_json::from_str(text).map_err(|e| JwksError::NotJwks(e.to_string()))?;
        let mut keys = HashMap::new();
        for value in document.keys {
            let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
                continue;
            };
            let (Some(kid), Some(key)) = (jwk.kid.clone(), Self::key_of(&jwk)) else {
                continue;
            };
            if jwk.use_.as_deref().is_some_and(|u| u != "sig") {
                continue;
            }
            if jwk.alg.as_deref().is_some_and(|alg| alg != key.algorithm()) {
                continue;
            }
            keys.insert(kid, key);
        }
        if keys.is_empty() {
            return Err(JwksError::Empty);
        }
        Ok(Self { keys })
    }

    fn key_of(jwk: &Jwk) -> Option<VerifyingKey> {
        match (jwk.kty.as_str(), jwk.crv.as_deref()) {
            ("RSA", _) => {
                let n = b64(jwk.n.as_ref())?;
                let e = b64(jwk.e.as_ref())?;
                // Leading zero bytes carry no bits: a short modulus padded
                // with them is still short, and an empty or all-zero one
                // is no key at all.
                let n = &n[n.iter().position(|b| *b != 0)?..];
                let bits = n.len() * 8 - n.first().map_or(0, |b| b.leading_zeros() as usize);
                (bits >= 2048).then(|| VerifyingKey::Rsa { n: n.to_vec(), e })
            }
            ("EC", Some("P-256")) => {
                let (x, y) = (b64(jwk.x.as_ref())?, b64(jwk.y.as_ref())?);
                if x.len() != 32 || y.len() != 32 {
                    return None;
                }
                Some(VerifyingKey::EcP256 {
                    point: [&[4u8][..], &x, &y].concat(),
                })
            }
            ("OKP", Some("Ed25519")) => {
                let x = b64(jwk.x.as_ref())?;
                (x.len() == 32).then_some(VerifyingKey::Ed25519 { x })
            }
            _ => None,
        }
    }

    pub fn get(&self, kid: &str) -> Option<&VerifyingKey> {
        self.keys.get(kid)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Add or replace a key (tests and key-set merging).
    pub fn insert(&mut self, kid: impl Into<String>, key: VerifyingKey) {
        self.keys.insert(kid.into(), key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_keys_are_skipped_not_fatal() {
        let n = URL_SAFE_NO_PAD.encode([0xC5u8; 256]);
        let short_n = URL_SAFE_NO_PAD.encode([0xC5u8; 128]);
        let x = URL_SAFE_NO_PAD.encode([7u8; 32]);
        let json = format!(
            r#"{{"keys":[
              {{"kty":"RSA","kid":"good","use":"sig","n":"{n}","e":"AQAB","x5c":["..."],"issuer":"x"}},
              {{"kty":"RSA","kid":"small","n":"{short_n}","e":"AQAB"}},
              {{"kty":"RSA","kid":"enc","use":"enc","n":"{n}","e":"AQAB"}},
              {{"kty":"RSA","kid":"hs","alg":"HS256","n":"{n}","e":"AQAB"}},
              {{"kty":"oct","kid":"secret","k":"c2VjcmV0"}},
              {{"kty":"OKP","crv":"Ed25519","kid":"ed","x":"{x}"}},
              {{"kty":"EC","crv":"P-384","kid":"p384","x":"{x}","y":"{x}"}},
              {{"kty":"RSA","n":"{n}","e":"AQAB"}}
            ]}}"#
        );
        let set = KeySet::from_json(&json).unwrap();
        assert_eq!(set.len(), 2);
        assert_eq!(set.get("good").unwrap().algorithm(), "RS256");
        assert_eq!(set.get("ed").unwrap().algorithm(), "EdDSA");
        assert!(set.get("secret").is_none() && set.get("hs").is_none() && set.get("small").is_none());
    }

    /// Found by fuzzing (`fuzz/regressions/jwks/`): an empty modulus made
    /// the bit count underflow (a panic in debug builds; in release, a
    /// huge count that let the key through), and leading zero bytes were
    /// counted as bits, so a 2000-bit modulus passed for 2072 bits.
    #[test]
    fn an_empty_or_zero_padded_short_modulus_is_not_a_key() {
        let short = URL_SAFE_NO_PAD.encode([[0u8; 10].as_slice(), &[0xC5u8; 250]].concat());
        let zeros = URL_SAFE_NO_PAD.encode([0u8; 300]);
        let padded = URL_SAFE_NO_PAD.encode([[0u8; 1].as_slice(), &[0xC5u8; 256]].concat());
        let json = format!(
            r#"{{"keys":[
              {{"kty":"RSA","kid":"empty","n":"","e":"AQAB"}},
              {{"kty":"RSA","kid":"short","n":"{short}","e":"AQAB"}},
              {{"kty":"RSA","kid":"zeros","n":"{zeros}","e":"AQAB"}},
              {{"kty":"RSA","kid":"padded","n":"{padded}","e":"AQAB"}}
            ]}}"#
        );
        let set = KeySet::from_json(&json).unwrap();
        assert_eq!(set.len(), 1);
        assert_eq!(
            set.get("padded"),
            Some(&VerifyingKey::Rsa {
                n: vec![0xC5; 256],
                e: vec![1, 0, 1]
            })
        );
    }

    #[test]
    fn garbage_and_empty_sets_are_errors() {
        assert!(matches!(KeySet::from_json("<html>"), Err(JwksError::NotJwks(_))));
        assert!(matches!(
            KeySet::from_json(r#"{"keys":[]}"#),
            Err(JwksError::Empty)
        ));
    }
}
