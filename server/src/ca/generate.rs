//! Making new CA material: a self-signed Talos-style root (for evaluation
//! clusters, the quick start and tests), an intermediate signed by the
//! Talos root, so that the root key can stay offline, and a client-only CA
//! of talos-sso's own that Talos lists in `machine.acceptedCAs` (the
//! accepted-CA mode), so that the cluster CA key never reaches talos-sso.
//!
//! Keys are written the way Talos and OpenSSL can both read them: Ed25519 as
//! PKCS#8 v1 (ring's own encoding is v2, which OpenSSL 3.0 cannot read).

use std::time::Duration;

use der::Encode;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair};
use time::OffsetDateTime;
use x509_cert::ext::pkix::{BasicConstraints, KeyUsage, KeyUsages};

use super::CertificateAuthority;
use crate::keys::software::ed25519_pkcs8_v1;
use crate::keys::{SignError, Signer, SoftwareKey};
use crate::x509::{self, CertificateTemplate, ParsedCertificate, X509Error, oid};

/// How far an intermediate's (or a client-only CA's) `not_before` is moved
/// into the past, so that a client whose clock runs behind sees it valid as
/// early as the leaves it
/// signs (backdated five minutes by default, `certificate::DEFAULT_CLOCK_SKEW`).
const INTERMEDIATE_BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Key types a new CA can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewKeyType {
    Ed25519,
    EcdsaP256,
    EcdsaP384,
}

/// A new private key and its PEM encoding.
pub struct NewKey {
    pub key: SoftwareKey,
    pub pem: String,
}

impl std::fmt::Debug for NewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NewKey({})", self.key.kind())
    }
}

pub fn generate_key(key_type: NewKeyType, rng: &SystemRandom) -> Result<NewKey, X509Error> {
    let no_randomness = |_| X509Error::NoRandomness;
    match key_type {
        NewKeyType::Ed25519 => {
            let mut seed = [0u8; 32];
            rng.fill(&mut seed).map_err(no_randomness)?;
            let pkcs8 = ed25519_pkcs8_v1(&seed)?;
            let key = Ed25519KeyPair::from_seed_unchecked(&seed).map_err(|_| SignError::Failed)?;
            Ok(NewKey {
                key: SoftwareKey::Ed25519(key),
                pem: x509::pem_encode("ED25519 PRIVATE KEY", &pkcs8),
            })
        }
        NewKeyType::EcdsaP256 | NewKeyType::EcdsaP384 => {
            let alg = if key_type == NewKeyType::EcdsaP256 {
                &signature::ECDSA_P256_SHA256_ASN1_SIGNING
            } else {
                &signature::ECDSA_P384_SHA384_ASN1_SIGNING
            };
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, rng).map_err(no_randomness)?;
            let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), rng).map_err(|_| SignError::Failed)?;
            let key = if key_type == NewKeyType::EcdsaP256 {
                SoftwareKey::EcdsaP256(pair)
            } else {
                SoftwareKey::EcdsaP384(pair)
            };
            Ok(NewKey {
                key,
                pem: x509::pem_encode("PRIVATE KEY", pkcs8.as_ref()),
            })
        }
    }
}

/// A new CA: its certificate PEM and key PEM.
#[derive(Debug)]
pub struct NewCa {
    /// The CA certificate; for an intermediate, followed by its issuer chain
    /// up to the Talos root (the form `cert_file` expects).
    pub cert_pem: String,
    pub key_pem: String,
    pub cert: ParsedCertificate,
}

/// What a CA certificate is for, and the id of its key.
fn ca_extensions(
    spki: &spki::SubjectPublicKeyInfoOwned,
    usage: der::flagset::FlagSet<KeyUsages>,
    extended: Vec<spki::ObjectIdentifier>,
    path_len: Option<u8>,
) -> Result<Vec<x509_cert::ext::Extension>, X509Error> {
    let mut extensions = x509::purpose_extensions(
        KeyUsage(usage),
        extended,
        BasicConstraints {
            ca: true,
            path_len_constraint: path_len,
        },
    )?;
    extensions.push(x509::subject_key_id(spki)?);
    Ok(extensions)
}

/// A self-signed CA shaped like the one `talosctl gen secrets` makes:
/// subject `O=talos` (or the given organization), CA:TRUE, key usage
/// digitalSignature + keyCertSign, EKU serverAuth + clientAuth, a subject key id.
pub fn new_root(
    key_type: NewKeyType,
    organization: &str,
    validity: Duration,
    now: OffsetDateTime,
) -> Result<NewCa, X509Error> {
    let rng = SystemRandom::new();
    let new_key = generate_key(key_type, &rng)?;
    let spki = new_key.key.public_key_info()?;
    let name = x509::encode_name(&[(oid::ORGANIZATION, organization)])?;
    let extensions = ca_extensions(
        &spki,
        KeyUsages::DigitalSignature | KeyUsages::KeyCertSign,
        vec![oid::KP_SERVER_AUTH, oid::KP_CLIENT_AUTH],
        None,
    )?;
    let cert = self_signed(&new_key.key, &name, extensions, now, now + validity)?;
    Ok(NewCa {
        cert_pem: cert.to_pem(),
        key_pem: new_key.pem,
        cert,
    })
}

/// An intermediate CA signed by `root` (which must be the Talos root itself,
/// not another intermediate): path length 0, key usage keyCertSign,
/// EKU clientAuth only (so it cannot vouch for a server pretending to be a
/// Talos node). Its validity never exceeds the root's.
pub fn new_intermediate(
    root: &CertificateAuthority,
    key_type: NewKeyType,
    common_name: &str,
    validity: Duration,
    now: OffsetDateTime,
) -> Result<NewCa, X509Error> {
    // The root's generator makes the new key, the serial and the signature.
    let new_key = generate_key(key_type, root.rng())?;
    let spki = new_key.key.public_key_info()?;
    let (cert, cert_pem) = intermediate_certificate(root, &spki, common_name, validity, now)?;
    Ok(NewCa {
        cert_pem,
        key_pem: new_key.pem,
        cert,
    })
}

/// The certificate of an intermediate whose key is `spki` (a key made
/// inside a PKCS#11 token, say, of which only the public half is known),
/// signed by `root` as [`new_intermediate`] signs; with the PEM that
/// `cert_file` expects (the intermediate, then the root).
pub fn intermediate_certificate(
    root: &CertificateAuthority,
    spki: &spki::SubjectPublicKeyInfoOwned,
    common_name: &str,
    validity: Duration,
    now: OffsetDateTime,
) -> Result<(ParsedCertificate, String), X509Error> {
    let rng = root.rng();
    let parent = root.signer();
    // Only clientAuth: it cannot vouch for a server pretending to be a node.
    let mut extensions = ca_extensions(
        spki,
        KeyUsages::KeyCertSign.into(),
        vec![oid::KP_CLIENT_AUTH],
        Some(0),
    )?;
    let subject = x509::encode_name(&[(oid::COMMON_NAME, common_name)])?;
    extensions.extend(x509::authority_key_id(parent)?);
    let serial = x509::random_serial(rng)?;
    let spki_der = spki.to_der()?;
    let template = CertificateTemplate {
        serial: &serial,
        issuer: &parent.raw_subject,
        subject: &subject,
        subject_public_key_info: &spki_der,
        not_before: now - INTERMEDIATE_BACKDATE,
        not_after: std::cmp::min(now + validity, parent.not_after()),
        extensions,
    };
    let der = x509::sign_certificate(&template, root.key())?;
    let cert = ParsedCertificate::from_der(&der)?;
    let cert_pem = format!("{}{}", cert.to_pem(), parent.to_pem());
    Ok((cert, cert_pem))
}

/// The subject of a client-only CA: it names talos-sso, the cluster and the
/// day it was made (so that two CAs of one cluster, during a rotation, can
/// be told apart in `machine.acceptedCAs`).
fn client_ca_subject(cluster: &str, now: OffsetDateTime) -> Result<Vec<u8>, X509Error> {
    let day = format!(
        "talos-sso client CA {:04}-{:02}-{:02}",
        now.year(),
        u8::from(now.month()),
        now.day()
    );
    x509::encode_name(&[
        (oid::ORGANIZATION, "talos-sso"),
        (oid::ORGANIZATIONAL_UNIT, cluster),
        (oid::COMMON_NAME, &day),
    ])
}

/// A new client-only CA for `cluster`, its key made here ([`client_ca_certificate`]
/// says what it may do).
pub fn new_client_ca(
    key_type: NewKeyType,
    cluster: &str,
    validity: Duration,
    now: OffsetDateTime,
) -> Result<NewCa, X509Error> {
    let rng = SystemRandom::new();
    let new_key = generate_key(key_type, &rng)?;
    let cert = client_ca_certificate(&new_key.key, cluster, validity, now)?;
    Ok(NewCa {
        cert_pem: cert.to_pem(),
        key_pem: new_key.pem,
        cert,
    })
}

/// The self-signed certificate of a client-only CA whose key is `key` (in
/// memory, or inside a PKCS#11 token): CA with path length 0 (it signs
/// leaves, never another CA), key usage keyCertSign + cRLSign only, and
/// extended key usage clientAuth only. Go's `crypto/x509`, which apid and
/// talosctl use, applies extended key usages down the chain, so nothing
/// this CA signs can pass as a server: a stolen key cannot impersonate an
/// apid endpoint. No name constraints: Talos reads no names from client
/// certificates.
pub fn client_ca_certificate(
    key: &dyn Signer,
    cluster: &str,
    validity: Duration,
    now: OffsetDateTime,
) -> Result<ParsedCertificate, X509Error> {
    let spki = key.public_key_info()?;
    let name = client_ca_subject(cluster, now)?;
    let extensions = ca_extensions(
        &spki,
        KeyUsages::KeyCertSign | KeyUsages::CRLSign,
        vec![oid::KP_CLIENT_AUTH],
        Some(0),
    )?;
    self_signed(
        key,
        &name,
        extensions,
        now - INTERMEDIATE_BACKDATE,
        now + validity,
    )
}

/// A certificate `key` signs for itself, named `name`, with a random serial.
fn self_signed(
    key: &dyn Signer,
    name: &[u8],
    extensions: Vec<x509_cert::ext::Extension>,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> Result<ParsedCertificate, X509Error> {
    let serial = x509::random_serial(&SystemRandom::new())?;
    let spki_der = key.public_key_info()?.to_der()?;
    let template = CertificateTemplate {
        serial: &serial,
        issuer: name,
        subject: name,
        subject_public_key_info: &spki_der,
        not_before,
        not_after,
        extensions,
    };
    ParsedCertificate::from_der(&x509::sign_certificate(&template, key)?)
}
