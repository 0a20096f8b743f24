//! Key pairs made inside a token (`ca intermediate --pkcs11-generate`) and
//! public keys read from one: what an offline root certifies, and what the
//! audit key's token holds.

use const_oid::db::{rfc5912, rfc8410};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass};
use cryptoki::session::{Session, UserType};
use cryptoki::types::AuthPin;
use der::Decode;
use spki::SubjectPublicKeyInfoOwned;

use super::module::{find_token, module, unavailable};
use super::{Pkcs11Error, Pkcs11Source};
use crate::keys::KeyKind;

/// The public key of `key_label` on the token, as a SubjectPublicKeyInfo:
/// what an offline root signs into the certificate of a key made inside the
/// token. Read from the public key object of the same label; no login.
pub fn token_public_key(source: &Pkcs11Source) -> Result<SubjectPublicKeyInfoOwned, Pkcs11Error> {
    let module = module(&source.module)?;
    let mut state = module.read();
    let mut slot = find_token(&state.pkcs11, source);
    if let Err(Pkcs11Error::TokenUnknown { .. }) = slot {
        let seen = state.epoch;
        drop(state);
        module.reinitialize(seen)?;
        state = module.read();
        slot = find_token(&state.pkcs11, source);
    }
    let session = state
        .pkcs11
        .open_ro_session_no_drop(slot?)
        .map_err(|e| unavailable(source, "C_OpenSession", &e))?;
    let read = read_public_key(&session, source);
    if let Err(error) = session.close() {
        tracing::debug!(%error, "C_CloseSession");
    }
    read
}

/// Make a key pair of `kind` inside the token, labelled `source.key_label`
/// (the private key sensitive and not extractable: it never leaves the
/// token), and return its public key. Refused when the label is taken.
pub fn generate_key_pair(
    source: &Pkcs11Source,
    pin: &str,
    kind: KeyKind,
) -> Result<SubjectPublicKeyInfoOwned, Pkcs11Error> {
    // The curve as CKA_EC_PARAMS: the DER of its OID (RFC 8410, SEC 2).
    let (mechanism, curve): (Mechanism, &[u8]) = match kind {
        KeyKind::Ed25519 => (Mechanism::EccEdwardsKeyPairGen, &[0x06, 0x03, 0x2b, 0x65, 0x70]),
        KeyKind::EcdsaP256 => (
            Mechanism::EccKeyPairGen,
            &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07],
        ),
        other => return Err(Pkcs11Error::UnsupportedKeyType(other)),
    };
    let module = module(&source.module)?;
    let state = module.read();
    let slot = find_token(&state.pkcs11, source)?;
    let session = state
        .pkcs11
        .open_rw_session(slot)
        .map_err(|e| unavailable(source, "C_OpenSession", &e))?;
    match session.login(UserType::User, Some(&AuthPin::from(pin.to_owned()))) {
        Ok(()) | Err(CkError::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => {}
        Err(CkError::Pkcs11(RvError::PinIncorrect, _)) => {
            return Err(Pkcs11Error::PinIncorrect {
                token_label: source.token_label.clone(),
                pin_file: source.pin_file.clone(),
            });
        }
        Err(e) => return Err(unavailable(source, "C_Login", &e)),
    }
    let label = source.key_label.as_bytes().to_vec();
    let taken = session
        .find_objects(&[Attribute::Label(label.clone())])
        .map_err(|e| unavailable(source, "C_FindObjects", &e))?;
    if !taken.is_empty() {
        return Err(Pkcs11Error::KeyExists {
            token_label: source.token_label.clone(),
            key_label: source.key_label.clone(),
        });
    }
    let public = [
        Attribute::Token(true),
        Attribute::Verify(true),
        Attribute::EcParams(curve.to_vec()),
        Attribute::Label(label.clone()),
    ];
    let private = [
        Attribute::Token(true),
        Attribute::Private(true),
        Attribute::Sensitive(true),
        Attribute::Extractable(false),
        Attribute::Sign(true),
        Attribute::Label(label),
    ];
    session
        .generate_key_pair(&mechanism, &public, &private)
        .map_err(|e| unavailable(source, "C_GenerateKeyPair", &e))?;
    read_public_key(&session, source)
}

fn read_public_key(
    session: &Session,
    source: &Pkcs11Source,
) -> Result<SubjectPublicKeyInfoOwned, Pkcs11Error> {
    let template = [
        Attribute::Class(ObjectClass::PUBLIC_KEY),
        Attribute::Label(source.key_label.as_bytes().to_vec()),
    ];
    let key = *session
        .find_objects(&template)
        .map_err(|e| unavailable(source, "C_FindObjects", &e))?
        .first()
        .ok_or_else(|| Pkcs11Error::KeyUnknown {
            token_label: source.token_label.clone(),
            key_label: source.key_label.clone(),
        })?;
    let attributes = session
        .get_attributes(key, &[AttributeType::KeyType, AttributeType::EcPoint])
        .map_err(|e| unavailable(source, "C_GetAttributeValue", &e))?;
    let mut key_type = None;
    let mut point = None;
    for attribute in attributes {
        match attribute {
            Attribute::KeyType(t) => key_type = Some(t),
            Attribute::EcPoint(p) => point = Some(unwrap_octet_string(&p)),
            _ => {}
        }
    }
    let point = point.ok_or_else(|| Pkcs11Error::KeyUnknown {
        token_label: source.token_label.clone(),
        key_label: source.key_label.clone(),
    })?;
    let algorithm = match key_type {
        Some(t) if t == KeyType::EC_EDWARDS && point.len() == 32 => spki::AlgorithmIdentifierOwned {
            oid: rfc8410::ID_ED_25519,
            parameters: None,
        },
        Some(t) if t == KeyType::EC && point.len() == 65 => spki::AlgorithmIdentifierOwned {
            oid: rfc5912::ID_EC_PUBLIC_KEY,
            parameters: Some(
                der::asn1::Any::encode_from(&rfc5912::SECP_256_R_1)
                    .map_err(|e| unavailable_der(source, &e))?,
            ),
        },
        _ => {
            return Err(Pkcs11Error::UnsupportedKeyType(KeyKind::Other(
                "this token key".into(),
            )));
        }
    };
    Ok(SubjectPublicKeyInfoOwned {
        algorithm,
        subject_public_key: der::asn1::BitString::from_bytes(&point)
            .map_err(|e| unavailable_der(source, &e))?,
    })
}

fn unavailable_der(source: &Pkcs11Source, error: &der::Error) -> Pkcs11Error {
    Pkcs11Error::Unavailable {
        token_label: source.token_label.clone(),
        operation: "C_GetAttributeValue",
        reason: error.to_string(),
    }
}

/// `CKA_EC_POINT` is a DER OCTET STRING by the standard; some modules give
/// the bare point. Accept both.
fn unwrap_octet_string(value: &[u8]) -> Vec<u8> {
    match der::asn1::OctetString::from_der(value) {
        Ok(inner) => inner.as_bytes().to_vec(),
        Err(_) => value.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use der::Encode;

    use super::*;

    #[test]
    fn an_ec_point_is_read_wrapped_or_bare() {
        let point = [4u8; 65];
        let wrapped = der::asn1::OctetString::new(point.to_vec())
            .unwrap()
            .to_der()
            .unwrap();
        assert_eq!(unwrap_octet_string(&wrapped), point.to_vec());
        assert_eq!(unwrap_octet_string(&point), point.to_vec());
    }
}
