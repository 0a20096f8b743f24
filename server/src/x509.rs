//! Low-level X.509 and DER: reading certificates while keeping the exact bytes
//! of their names, building and signing certificates, and checking signatures.
//!
//! Everything here is mechanism, not policy: which extensions a Talos client
//! certificate carries is decided in `certificate`, which CA material is
//! acceptable in `ca`. This module knows nothing about roles, clusters or HTTP.

use std::fmt;

use const_oid::AssociatedOid;
use der::asn1::{AnyRef, BitStringRef, OctetString, UintRef};
use der::{Decode, Encode, Reader, Sequence, Tag, Tagged};
use ring::rand::SecureRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use spki::{AlgorithmIdentifierOwned, ObjectIdentifier, SubjectPublicKeyInfoOwned};
use time::OffsetDateTime;
use x509_cert::ext::Extension;
use x509_cert::ext::pkix::{BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectKeyIdentifier};
use x509_cert::time::Time;

/// The object identifiers the crate uses, under short names, all taken from
/// `const_oid`'s database (each `use` names the RFC module it comes from), so
/// none is spelled out by hand.
pub mod oid {
    pub use const_oid::db::rfc4519::{COMMON_NAME, ORGANIZATION_NAME as ORGANIZATION};
    pub use const_oid::db::rfc5280::{
        ID_CE_AUTHORITY_KEY_IDENTIFIER as AUTHORITY_KEY_ID, ID_CE_BASIC_CONSTRAINTS as BASIC_CONSTRAINTS,
        ID_CE_EXT_KEY_USAGE as EXT_KEY_USAGE, ID_CE_KEY_USAGE as KEY_USAGE,
        ID_CE_SUBJECT_ALT_NAME as SUBJECT_ALT_NAME, ID_CE_SUBJECT_KEY_IDENTIFIER as SUBJECT_KEY_ID,
        ID_KP_CLIENT_AUTH as KP_CLIENT_AUTH, ID_KP_SERVER_AUTH as KP_SERVER_AUTH,
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
    #[error("signing failed")]
    SigningFailed,
    /// The key lives in a PKCS#11 token that cannot sign right now.
    #[error("{0}")]
    SigningUnavailable(crate::pkcs11::Pkcs11Error),
    #[error("the system random number generator failed")]
    NoRandomness,
    #[error("the extension {0} appears more than once; RFC 5280 allows one of each")]
    DuplicateExtension(ObjectIdentifier),
    #[error("the extension {0} cannot be read")]
    UnreadableExtension(ObjectIdentifier),
}

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
    if alg.oid == oid::ED25519 {
        return if alg.parameters.is_none() && spki.subject_public_key.raw_bytes().len() == 32 {
            KeyKind::Ed25519
        } else {
            KeyKind::Other("malformed Ed25519 key".into())
        };
    }
    if alg.oid == oid::ED448 {
        return KeyKind::Other("Ed448".into());
    }
    if alg.oid == oid::EC_PUBLIC_KEY {
        let curve = alg
            .parameters
            .as_ref()
            .and_then(|p| p.decode_as::<ObjectIdentifier>().ok());
        return match curve {
            Some(c) if c == oid::SECP256R1 => KeyKind::EcdsaP256,
            Some(c) if c == oid::SECP384R1 => KeyKind::EcdsaP384,
            Some(c) if c == oid::SECP521R1 => KeyKind::Other("ECDSA P-521".into()),
            Some(c) => KeyKind::Other(format!("ECDSA on curve {c}")),
            None => KeyKind::Other("ECDSA without a named curve".into()),
        };
    }
    if alg.oid == oid::RSA_ENCRYPTION {
        return match rsa_modulus_bits(spki.subject_public_key.raw_bytes()) {
            Some(bits) => KeyKind::Rsa { bits },
            None => KeyKind::Other("malformed RSA key".into()),
        };
    }
    KeyKind::Other(format!("key algorithm {}", alg.oid))
}

/// RSAPublicKey ::= SEQUENCE { modulus INTEGER, publicExponent INTEGER }
#[derive(Sequence)]
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

/// A parsed certificate that also keeps the verbatim DER of the parts whose
/// exact bytes matter: the names (Go's TLS client compares raw issuer bytes
/// with raw CA subject bytes) and the signed TBS (for signature checks).
#[derive(Debug, Clone)]
pub struct ParsedCertificate {
    pub der: Vec<u8>,
    pub cert: x509_cert::Certificate,
    pub raw_subject: Vec<u8>,
    pub raw_issuer: Vec<u8>,
    pub raw_tbs: Vec<u8>,
}

impl ParsedCertificate {
    /// Parse a certificate, refusing one that carries an extension twice:
    /// which of the two a verifier reads differs between implementations.
    pub fn from_der(der: &[u8]) -> Result<Self, X509Error> {
        let cert = x509_cert::Certificate::from_der(der)?;
        refuse_duplicate_extensions(cert.tbs_certificate())?;
        refuse_unreadable_extensions(cert.tbs_certificate())?;
        let outer = AnyRef::from_der(der)?;
        let tbs = outer.sequence(|r| {
            let tbs = AnyRef::decode(r)?;
            let _algorithm = AnyRef::decode(r)?;
            let _signature = AnyRef::decode(r)?;
            Ok::<_, der::Error>(tbs)
        })?;
        let (raw_issuer, raw_subject) = tbs.sequence(|r| {
            // version [0] EXPLICIT is optional (absent means v1)
            let version_tag = Tag::ContextSpecific {
                constructed: true,
                number: der::TagNumber(0),
            };
            if Tag::peek(r)? == version_tag {
                AnyRef::decode(r)?;
            }
            let _serial = AnyRef::decode(r)?;
            let _signature = AnyRef::decode(r)?;
            let issuer = AnyRef::decode(r)?.to_der()?;
            let _validity = AnyRef::decode(r)?;
            let subject = AnyRef::decode(r)?.to_der()?;
            while !r.is_finished() {
                AnyRef::decode(r)?;
            }
            Ok::<_, der::Error>((issuer, subject))
        })?;
        Ok(Self {
            der: der.to_vec(),
            raw_tbs: tbs.to_der()?,
            cert,
            raw_subject,
            raw_issuer,
        })
    }

    pub fn tbs(&self) -> &x509_cert::TbsCertificate {
        self.cert.tbs_certificate()
    }

    pub fn spki(&self) -> &SubjectPublicKeyInfoOwned {
        self.tbs().subject_public_key_info()
    }

    pub fn not_before(&self) -> OffsetDateTime {
        to_offset(self.tbs().validity().not_before)
    }

    pub fn not_after(&self) -> OffsetDateTime {
        to_offset(self.tbs().validity().not_after)
    }

    pub fn is_self_issued(&self) -> bool {
        self.raw_subject == self.raw_issuer
    }

    /// The extension with this OID, if present ([`Self::from_der`] refused
    /// certificates that carry one twice).
    pub fn extension(&self, id: ObjectIdentifier) -> Option<&Extension> {
        self.tbs()
            .extensions()
            .and_then(|exts| exts.iter().find(|e| e.extn_id == id))
    }

    /// The value of a known extension; a value that does not decode counts
    /// as absent. `get_extension` also refuses duplicates, which
    /// [`Self::from_der`] has already refused.
    fn known_extension<'a, T: Decode<'a> + AssociatedOid>(&'a self) -> Option<T> {
        self.tbs()
            .get_extension::<T>()
            .ok()
            .flatten()
            .map(|(_critical, value)| value)
    }

    /// The subject key identifier, if the certificate carries one.
    pub fn subject_key_id(&self) -> Option<Vec<u8>> {
        self.known_extension::<SubjectKeyIdentifier>()
            .map(|id| id.0.as_bytes().to_vec())
    }

    /// (is a CA, path length) from basicConstraints; absent means not a CA.
    pub fn basic_constraints(&self) -> Option<BasicConstraints> {
        self.known_extension()
    }

    pub fn key_usage(&self) -> Option<KeyUsage> {
        self.known_extension()
    }

    /// The extended key usages, or `None` when the extension is absent.
    pub fn ext_key_usage(&self) -> Option<Vec<ObjectIdentifier>> {
        self.known_extension::<ExtendedKeyUsage>().map(|eku| eku.0)
    }

    /// Every Organization value in the subject, in order (Talos reads roles
    /// from these).
    pub fn subject_organizations(&self) -> Vec<String> {
        attribute_strings(self.tbs().subject(), oid::ORGANIZATION)
    }

    pub fn subject_common_name(&self) -> Option<String> {
        attribute_strings(self.tbs().subject(), oid::COMMON_NAME)
            .into_iter()
            .next()
    }

    /// Check that `issuer` signed this certificate.
    pub fn verify_signed_by(&self, issuer: &SubjectPublicKeyInfoOwned) -> Result<(), X509Error> {
        verify_signature(
            issuer,
            self.cert.signature_algorithm(),
            &self.raw_tbs,
            self.cert.signature().raw_bytes(),
        )
    }

    /// Hex SHA-256 of the whole certificate, the usual fingerprint.
    pub fn sha256_fingerprint(&self) -> String {
        hex::encode(ring::digest::digest(&ring::digest::SHA256, &self.der))
    }

    pub fn to_pem(&self) -> String {
        pem_encode("CERTIFICATE", &self.der)
    }
}

fn refuse_duplicate_extensions(tbs: &x509_cert::TbsCertificate) -> Result<(), X509Error> {
    let extensions = tbs.extensions().map(Vec::as_slice).unwrap_or_default();
    for (i, extension) in extensions.iter().enumerate() {
        if extensions[..i]
            .iter()
            .any(|seen| seen.extn_id == extension.extn_id)
        {
            return Err(X509Error::DuplicateExtension(extension.extn_id));
        }
    }
    Ok(())
}

/// The extensions that decide what a certificate may do must be readable:
/// one that is present but does not decode must not count as absent (an
/// unreadable key usage would otherwise let a CA sign).
fn refuse_unreadable_extensions(tbs: &x509_cert::TbsCertificate) -> Result<(), X509Error> {
    fn readable<'a, T: Decode<'a> + AssociatedOid>(
        tbs: &'a x509_cert::TbsCertificate,
    ) -> Result<(), X509Error> {
        tbs.get_extension::<T>()
            .map(|_| ())
            .map_err(|_| X509Error::UnreadableExtension(T::OID))
    }
    readable::<KeyUsage>(tbs)?;
    readable::<BasicConstraints>(tbs)?;
    readable::<ExtendedKeyUsage>(tbs)
}

/// Every string value of an attribute type in a name (PrintableString,
/// UTF8String, IA5String are what real CAs and Talos write).
pub fn attribute_strings(name: &x509_cert::name::Name, attribute: ObjectIdentifier) -> Vec<String> {
    name.iter()
        .filter(|atv| atv.oid == attribute)
        .filter_map(|atv| {
            let tag = atv.value.tag();
            match tag {
                Tag::PrintableString | Tag::Utf8String | Tag::Ia5String | Tag::TeletexString => {
                    std::str::from_utf8(atv.value.value()).ok().map(str::to_owned)
                }
                _ => None,
            }
        })
        .collect()
}

fn to_offset(t: Time) -> OffsetDateTime {
    let secs = t.to_unix_duration().as_secs();
    OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(i64::MAX))
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// A certificate serial: 128 random bits, never zero, to be encoded as a
/// positive INTEGER.
pub fn random_serial(rng: &dyn SecureRandom) -> Result<Vec<u8>, X509Error> {
    let mut serial = [0u8; 16];
    loop {
        rng.fill(&mut serial).map_err(|_| X509Error::NoRandomness)?;
        if serial.iter().any(|b| *b != 0) {
            return Ok(serial.to_vec());
        }
    }
}

/// RFC 5280 4.1.2.5: UTCTime through 2049, GeneralizedTime from 2050. Seconds
/// precision; anything before 1970 is clamped to the epoch.
pub fn x509_time(at: OffsetDateTime) -> Result<Time, X509Error> {
    let secs = u64::try_from(at.unix_timestamp()).unwrap_or(0);
    let duration = std::time::Duration::from_secs(secs);
    if at.year() < 2050 {
        Ok(Time::UtcTime(der::asn1::UtcTime::from_unix_duration(duration)?))
    } else {
        Ok(Time::GeneralTime(der::asn1::GeneralizedTime::from_unix_duration(
            duration,
        )?))
    }
}

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

/// A CA private key that can sign certificates. The algorithm used follows
/// the key, as Talos does: Ed25519, ECDSA with the curve's own hash, RSA with
/// PKCS#1 v1.5 SHA-256.
pub enum SigningKey {
    Ed25519(Ed25519KeyPair),
    EcdsaP256(EcdsaKeyPair),
    EcdsaP384(EcdsaKeyPair),
    Rsa(RsaKeyPair),
    /// A key inside a PKCS#11 token (Ed25519 or ECDSA P-256); it never
    /// enters this process.
    Pkcs11(Box<crate::pkcs11::Pkcs11Key>),
}

impl fmt::Debug for SigningKey {
    // Never print key material, not even by accident in a Debug dump.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({})", self.kind())
    }
}

impl SigningKey {
    pub fn kind(&self) -> KeyKind {
        match self {
            SigningKey::Ed25519(_) => KeyKind::Ed25519,
            SigningKey::EcdsaP256(_) => KeyKind::EcdsaP256,
            SigningKey::EcdsaP384(_) => KeyKind::EcdsaP384,
            SigningKey::Rsa(k) => KeyKind::Rsa {
                bits: k.public().modulus_len() * 8,
            },
            SigningKey::Pkcs11(k) => k.kind(),
        }
    }

    /// The signatureAlgorithm this key writes into certificates.
    pub fn signature_algorithm(&self) -> AlgorithmIdentifierOwned {
        match self {
            SigningKey::Ed25519(_) => AlgorithmIdentifierOwned {
                oid: oid::ED25519,
                parameters: None,
            },
            SigningKey::EcdsaP256(_) => AlgorithmIdentifierOwned {
                oid: oid::ECDSA_WITH_SHA256,
                parameters: None,
            },
            SigningKey::Pkcs11(k) if k.kind() == KeyKind::Ed25519 => AlgorithmIdentifierOwned {
                oid: oid::ED25519,
                parameters: None,
            },
            SigningKey::Pkcs11(_) => AlgorithmIdentifierOwned {
                oid: oid::ECDSA_WITH_SHA256,
                parameters: None,
            },
            SigningKey::EcdsaP384(_) => AlgorithmIdentifierOwned {
                oid: oid::ECDSA_WITH_SHA384,
                parameters: None,
            },
            SigningKey::Rsa(_) => AlgorithmIdentifierOwned {
                oid: oid::SHA256_WITH_RSA,
                parameters: Some(der::asn1::Any::null()),
            },
        }
    }

    pub fn sign(&self, rng: &dyn SecureRandom, message: &[u8]) -> Result<Vec<u8>, X509Error> {
        match self {
            SigningKey::Ed25519(k) => Ok(k.sign(message).as_ref().to_vec()),
            SigningKey::EcdsaP256(k) | SigningKey::EcdsaP384(k) => k
                .sign(rng, message)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| X509Error::SigningFailed),
            SigningKey::Rsa(k) => {
                let mut out = vec![0u8; k.public().modulus_len()];
                k.sign(&signature::RSA_PKCS1_SHA256, rng, message, &mut out)
                    .map_err(|_| X509Error::SigningFailed)?;
                Ok(out)
            }
            SigningKey::Pkcs11(k) => k.sign(message).map_err(X509Error::SigningUnavailable),
        }
    }

    /// The public key as a SubjectPublicKeyInfo, e.g. for a new CA certificate.
    pub fn public_key_info(&self) -> Result<SubjectPublicKeyInfoOwned, X509Error> {
        let (algorithm, key): (AlgorithmIdentifierOwned, &[u8]) = match self {
            SigningKey::Pkcs11(k) => return Ok(k.public_key_info().clone()),
            SigningKey::Ed25519(k) => (
                AlgorithmIdentifierOwned {
                    oid: oid::ED25519,
                    parameters: None,
                },
                k.public_key().as_ref(),
            ),
            SigningKey::EcdsaP256(k) => (ec_algorithm(oid::SECP256R1)?, k.public_key().as_ref()),
            SigningKey::EcdsaP384(k) => (ec_algorithm(oid::SECP384R1)?, k.public_key().as_ref()),
            SigningKey::Rsa(k) => (
                AlgorithmIdentifierOwned {
                    oid: oid::RSA_ENCRYPTION,
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
}

fn ec_algorithm(curve: ObjectIdentifier) -> Result<AlgorithmIdentifierOwned, X509Error> {
    Ok(AlgorithmIdentifierOwned {
        oid: oid::EC_PUBLIC_KEY,
        parameters: Some(der::asn1::Any::encode_from(&curve)?),
    })
}

/// A key identifier per RFC 7093 method 1: the leftmost 160 bits of the
/// SHA-256 of the subjectPublicKey bits.
pub fn key_identifier(spki: &SubjectPublicKeyInfoOwned) -> Vec<u8> {
    let digest = ring::digest::digest(&ring::digest::SHA256, spki.subject_public_key.raw_bytes());
    digest.as_ref()[..20].to_vec()
}

/// Encode a distinguished name from (attribute, value) pairs, one RDN each, in
/// order. Values that fit PrintableString are written as such (what Go and
/// Talos write), anything else as UTF8String.
pub fn encode_name(attributes: &[(ObjectIdentifier, &str)]) -> Result<Vec<u8>, X509Error> {
    use x509_cert::attr::AttributeTypeAndValue;
    use x509_cert::name::{RdnSequence, RelativeDistinguishedName};
    let mut rdns = RdnSequence::default();
    for (attribute, value) in attributes {
        let tag = if is_printable_string(value) {
            Tag::PrintableString
        } else {
            Tag::Utf8String
        };
        let mut rdn = RelativeDistinguishedName::default();
        rdn.insert(AttributeTypeAndValue {
            oid: *attribute,
            value: der::asn1::Any::new(tag, value.as_bytes())?,
        })?;
        rdns.push(rdn);
    }
    Ok(rdns.to_der()?)
}

fn is_printable_string(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b" '()+,-./:=?".contains(&b))
}

/// One X.509 v3 extension, DER-encoding its value.
pub fn extension<T: Encode>(id: ObjectIdentifier, critical: bool, value: &T) -> Result<Extension, X509Error> {
    Ok(Extension {
        extn_id: id,
        critical,
        extn_value: OctetString::new(value.to_der()?)?,
    })
}

/// What a certificate is for: key usage (critical), extended key usage,
/// basic constraints (critical), in that order, as Go writes them.
pub fn purpose_extensions(
    usage: KeyUsage,
    extended: Vec<ObjectIdentifier>,
    constraints: BasicConstraints,
) -> Result<Vec<Extension>, X509Error> {
    Ok(vec![
        extension(oid::KEY_USAGE, true, &usage)?,
        extension(oid::EXT_KEY_USAGE, false, &ExtendedKeyUsage(extended))?,
        extension(oid::BASIC_CONSTRAINTS, true, &constraints)?,
    ])
}

/// The subjectKeyIdentifier of a CA's own key ([`key_identifier`]).
pub fn subject_key_id(spki: &SubjectPublicKeyInfoOwned) -> Result<Extension, X509Error> {
    extension(
        oid::SUBJECT_KEY_ID,
        false,
        &OctetString::new(key_identifier(spki))?,
    )
}

/// The authorityKeyIdentifier pointing at `issuer`'s subject key id. Like Go,
/// which copies the parent's key id, nothing is written when the issuer has
/// no subject key id.
pub fn authority_key_id(issuer: &ParsedCertificate) -> Result<Option<Extension>, X509Error> {
    let Some(key_id) = issuer.subject_key_id() else {
        return Ok(None);
    };
    let aki = x509_cert::ext::pkix::AuthorityKeyIdentifier {
        key_identifier: Some(OctetString::new(key_id)?),
        ..Default::default()
    };
    Ok(Some(extension(oid::AUTHORITY_KEY_ID, false, &aki)?))
}

/// What goes into a certificate apart from the signature. Names and the key
/// are pre-encoded DER so that the issuer can be copied byte for byte.
#[derive(Debug)]
pub struct CertificateTemplate<'a> {
    pub serial: &'a [u8],
    pub issuer: &'a [u8],
    pub subject: &'a [u8],
    pub subject_public_key_info: &'a [u8],
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    pub extensions: Vec<Extension>,
}

#[derive(Sequence)]
struct TbsCertificateOut<'a> {
    #[asn1(context_specific = "0", tag_mode = "EXPLICIT")]
    version: u8,
    serial_number: UintRef<'a>,
    signature: AlgorithmIdentifierOwned,
    issuer: AnyRef<'a>,
    validity: x509_cert::time::Validity,
    subject: AnyRef<'a>,
    subject_public_key_info: AnyRef<'a>,
    #[asn1(context_specific = "3", tag_mode = "EXPLICIT")]
    extensions: Vec<Extension>,
}

#[derive(Sequence)]
struct CertificateOut<'a> {
    tbs_certificate: AnyRef<'a>,
    signature_algorithm: AlgorithmIdentifierOwned,
    signature: BitStringRef<'a>,
}

/// Build the TBS, sign it, and return the certificate DER.
pub fn sign_certificate(
    template: &CertificateTemplate<'_>,
    key: &SigningKey,
    rng: &dyn SecureRandom,
) -> Result<Vec<u8>, X509Error> {
    let algorithm = key.signature_algorithm();
    let tbs = TbsCertificateOut {
        version: 2, // v3
        serial_number: UintRef::new(template.serial)?,
        signature: algorithm.clone(),
        issuer: AnyRef::from_der(template.issuer)?,
        validity: x509_cert::time::Validity::new(
            x509_time(template.not_before)?,
            x509_time(template.not_after)?,
        ),
        subject: AnyRef::from_der(template.subject)?,
        subject_public_key_info: AnyRef::from_der(template.subject_public_key_info)?,
        extensions: template.extensions.clone(),
    }
    .to_der()?;
    let signature = key.sign(rng, &tbs)?;
    let cert = CertificateOut {
        tbs_certificate: AnyRef::from_der(&tbs)?,
        signature_algorithm: algorithm,
        signature: BitStringRef::from_bytes(&signature)?,
    };
    Ok(cert.to_der()?)
}

pub fn pem_encode(label: &str, der: &[u8]) -> String {
    // pem-rfc7468 only fails for invalid labels, which are all constants here.
    der::pem::encode_string(label, der::pem::LineEnding::LF, der).unwrap_or_default()
}

/// Why PEM text could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error(transparent)]
    Malformed(#[from] pem::PemError),
    #[error("a PEM block has no END line")]
    Unterminated,
    #[error("the `{label}` block has headers (an encrypted key?); only plain PEM is read")]
    Headers { label: String },
}

/// Every PEM block in `text` as (label, DER), in order. Text outside blocks is
/// ignored, like Go's `pem.Decode` loop.
pub fn pem_blocks(text: &str) -> Result<Vec<(String, Vec<u8>)>, PemError> {
    let blocks = pem::parse_many(text)?;
    // `parse_many` stops quietly at a BEGIN line with no END after it: a
    // truncated file would lose its last block (a chain its root) unnoticed.
    if text.matches("-----BEGIN ").count() > blocks.len() {
        return Err(PemError::Unterminated);
    }
    blocks
        .into_iter()
        .map(|block| {
            if block.headers().iter().next().is_some() {
                return Err(PemError::Headers {
                    label: block.tag().to_owned(),
                });
            }
            Ok((block.tag().to_owned(), block.into_contents()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_string_detection_matches_x680() {
        assert!(is_printable_string("os:admin"));
        assert!(is_printable_string("talos"));
        assert!(!is_printable_string("alice@example.com"));
        assert!(!is_printable_string("os_admin"));
    }

    #[test]
    fn names_round_trip_with_several_organizations() {
        let der = encode_name(&[
            (oid::ORGANIZATION, "os:admin"),
            (oid::ORGANIZATION, "os:reader"),
            (oid::COMMON_NAME, "alice@example.com"),
        ])
        .unwrap();
        let name = x509_cert::name::Name::from_der(&der).unwrap();
        assert_eq!(
            attribute_strings(&name, oid::ORGANIZATION),
            ["os:admin", "os:reader"]
        );
        assert_eq!(attribute_strings(&name, oid::COMMON_NAME), ["alice@example.com"]);
    }

    /// A self-signed certificate with these extensions, by a fixed Ed25519 key.
    fn certificate_with(extensions: Vec<Extension>) -> Vec<u8> {
        let key = SigningKey::Ed25519(Ed25519KeyPair::from_seed_unchecked(&[7; 32]).unwrap());
        let spki = key.public_key_info().unwrap().to_der().unwrap();
        let name = encode_name(&[(oid::ORGANIZATION, "talos")]).unwrap();
        let now = OffsetDateTime::from_unix_timestamp(1_900_000_000).unwrap();
        let template = CertificateTemplate {
            serial: &[1],
            issuer: &name,
            subject: &name,
            subject_public_key_info: &spki,
            not_before: now,
            not_after: now + time::Duration::hours(1),
            extensions,
        };
        sign_certificate(&template, &key, &ring::rand::SystemRandom::new()).unwrap()
    }

    #[test]
    fn a_certificate_whose_key_usage_cannot_be_read_is_refused() {
        let garbage = Extension {
            extn_id: oid::KEY_USAGE,
            critical: true,
            extn_value: OctetString::new(vec![0xff, 0x00]).unwrap(),
        };
        let der = certificate_with(vec![garbage]);
        assert!(
            x509_cert::Certificate::from_der(&der).is_ok(),
            "well-formed DER otherwise"
        );
        match ParsedCertificate::from_der(&der) {
            Err(X509Error::UnreadableExtension(id)) => assert_eq!(id, oid::KEY_USAGE),
            other => panic!("expected an unreadable-extension refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_certificate_with_an_extension_twice_is_refused() {
        use x509_cert::ext::pkix::KeyUsages;
        let may_sign = extension(oid::KEY_USAGE, true, &KeyUsage(KeyUsages::KeyCertSign.into())).unwrap();
        let may_not = extension(
            oid::KEY_USAGE,
            true,
            &KeyUsage(KeyUsages::DigitalSignature.into()),
        )
        .unwrap();
        let ca = extension(
            oid::BASIC_CONSTRAINTS,
            true,
            &BasicConstraints {
                ca: true,
                path_len_constraint: None,
            },
        )
        .unwrap();

        let once =
            ParsedCertificate::from_der(&certificate_with(vec![ca.clone(), may_sign.clone()])).unwrap();
        assert!(once.key_usage().unwrap().key_cert_sign());
        assert!(once.basic_constraints().unwrap().ca);

        for twice in [
            vec![may_sign.clone(), ca.clone(), may_not],
            vec![ca.clone(), may_sign, ca],
        ] {
            let der = certificate_with(twice);
            assert!(
                x509_cert::Certificate::from_der(&der).is_ok(),
                "well-formed DER otherwise"
            );
            match ParsedCertificate::from_der(&der) {
                Err(X509Error::DuplicateExtension(id)) => {
                    assert!(id == oid::KEY_USAGE || id == oid::BASIC_CONSTRAINTS, "{id}")
                }
                other => panic!("expected a duplicate-extension refusal, got {other:?}"),
            }
        }
    }

    #[test]
    fn pem_blocks_reads_every_block_and_skips_text() {
        let a = pem_encode("CERTIFICATE", b"\x30\x00");
        let b = pem_encode("ED25519 PRIVATE KEY", b"\x30\x01\x00");
        let text = format!("comment\n{a}junk\n{b}");
        let blocks = pem_blocks(&text).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].0, "CERTIFICATE");
        assert_eq!(blocks[1].0, "ED25519 PRIVATE KEY");
        assert_eq!(blocks[1].1, b"\x30\x01\x00");
    }

    #[test]
    fn pem_blocks_refuses_truncated_and_encrypted_blocks() {
        let whole = pem_encode("CERTIFICATE", b"\x30\x00");
        let truncated = format!("{whole}-----BEGIN CERTIFICATE-----\nMAA=\n");
        assert!(matches!(pem_blocks(&truncated), Err(PemError::Unterminated)));
        let encrypted = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n\
                         DEK-Info: AES-128-CBC,00112233445566778899AABBCCDDEEFF\n\nMAA=\n\
                         -----END RSA PRIVATE KEY-----\n";
        assert!(
            matches!(pem_blocks(encrypted), Err(PemError::Headers { label }) if label == "RSA PRIVATE KEY")
        );
        assert!(pem_blocks("-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n").is_err());
        assert!(pem_blocks("-----BEGIN A-----\nMAA=\n-----END B-----\n").is_err());
        assert_eq!(pem_blocks("no PEM here").unwrap(), []);
    }
}
