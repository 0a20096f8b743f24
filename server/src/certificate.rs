//! The Talos client certificate profile, and the CSR checks in front of it.
//!
//! [`issue`] depends only on its arguments (CA, CSR, identity, roles,
//! validity, clock) and on the CA's random number generator, which picks the
//! serial: it verifies the CSR's self-signature, keeps only its public key,
//! and signs a leaf that Talos's apid accepts. apid reads the roles from the
//! leaf's Subject Organization values (`pkg/grpc/middleware/authz/injector.go`
//! in the siderolabs/talos repository), so the leaf has one `O` per role,
//! `CN` = username, the issuer copied byte for byte from the CA subject, key
//! usage digitalSignature (critical), extended key usage exactly `clientAuth`,
//! not a CA, an authority key id and a 128-bit random serial. Who may have
//! which roles for how long is decided before this is called (`policy`);
//! nothing here reads the clock, the network or a database.
//!
//! This module uses `ca` (the signer) and never the reverse.

use std::time::Duration;

use der::asn1::AnyRef;
use der::{Decode, Encode, Reader, SliceReader};
use spki::SubjectPublicKeyInfoOwned;
use time::OffsetDateTime;
use x509_cert::ext::pkix::{BasicConstraints, KeyUsage, KeyUsages};
use x509_cert::request::CertReq;

use crate::ca::CertificateAuthority;
use crate::keys::{KeyKind, key_kind};
use crate::x509::{self, CertificateTemplate, ParsedCertificate, X509Error, oid};

/// Longest accepted username (the certificate's CN). Entra UPNs can exceed
/// X.520's 64 characters, and Talos never reads the CN, so allow more.
pub const MAX_USERNAME_LEN: usize = 256;

/// Largest CSR accepted, PEM or DER (an RSA-8192 CSR is about 2.5 KiB as PEM).
pub const MAX_CSR_LEN: usize = 16 * 1024;

/// Why a CSR was refused. The HTTP layer maps every variant to `csr_invalid`
/// with [`CsrError::reason`] as the detail code.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    #[error("the CSR is not a PEM or DER PKCS#10 request: {0}")]
    Malformed(String),
    #[error("the CSR is larger than {MAX_CSR_LEN} bytes")]
    TooLarge,
    #[error("the CSR's signature does not verify: it was not signed by the key it carries")]
    BadSignature,
    #[error("the CSR is signed with an unsupported algorithm ({0})")]
    UnsupportedSignatureAlgorithm(String),
    #[error(
        "a {0} key is not accepted; use Ed25519 (what talos-sso generates), ECDSA P-256 or RSA of at least 2048 bits"
    )]
    UnsupportedKey(KeyKind),
    #[error("an RSA key of {bits} bits is too small; at least 2048 bits are required")]
    RsaKeyTooSmall { bits: usize },
}

impl CsrError {
    pub fn reason(&self) -> &'static str {
        match self {
            CsrError::Malformed(_) => "csr_malformed",
            CsrError::TooLarge => "csr_too_large",
            CsrError::BadSignature => "csr_signature_invalid",
            CsrError::UnsupportedSignatureAlgorithm(_) => "csr_signature_algorithm_unsupported",
            CsrError::UnsupportedKey(_) => "csr_key_type_unsupported",
            CsrError::RsaKeyTooSmall { .. } => "csr_key_too_small",
        }
    }
}

/// Why a certificate could not be issued for an otherwise valid request.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error(transparent)]
    Csr(#[from] CsrError),
    #[error("no roles to grant: a Talos certificate without roles can do nothing")]
    NoRoles,
    #[error("`{0}` is not a well-formed role name")]
    InvalidRole(String),
    #[error("the username is empty, longer than {MAX_USERNAME_LEN} characters, or has control characters")]
    InvalidUsername,
    #[error("the TTL must be at least one second")]
    InvalidTtl,
    #[error("the signing CA is not valid at this time")]
    CaNotValid,
    #[error("signing failed: {0}")]
    Signing(#[from] X509Error),
}

/// Parse a CSR (PEM or DER), verify its self-signature, and return the only
/// thing we take from it: the public key. The subject and any requested
/// extensions are ignored: identity comes from the verified token.
pub fn verify_csr(input: &[u8]) -> Result<SubjectPublicKeyInfoOwned, CsrError> {
    if input.len() > MAX_CSR_LEN {
        return Err(CsrError::TooLarge);
    }
    let der = if input.trim_ascii_start().starts_with(b"-----BEGIN") {
        let text = std::str::from_utf8(input).map_err(|_| CsrError::Malformed("PEM is not UTF-8".into()))?;
        let mut blocks = x509::pem_blocks(text).map_err(|e| CsrError::Malformed(e.to_string()))?;
        // Exactly one block: with two requests (or a request next to
        // something else), which key gets certified would depend on which
        // block a reader picks, and a reviewer of the request may pick
        // another one than this server.
        let count = blocks.len();
        let (Some((label, der)), 1) = (blocks.pop(), count) else {
            return Err(CsrError::Malformed(format!(
                "{count} PEM blocks; send exactly one CERTIFICATE REQUEST"
            )));
        };
        if label != "CERTIFICATE REQUEST" && label != "NEW CERTIFICATE REQUEST" {
            return Err(CsrError::Malformed(format!(
                "a `{}` PEM block, not a CERTIFICATE REQUEST",
                label.chars().take(40).collect::<String>()
            )));
        }
        der
    } else {
        input.to_vec()
    };
    let malformed = |e: der::Error| CsrError::Malformed(e.to_string());
    let request = CertReq::from_der(&der).map_err(malformed)?;
    let signed = signed_request_info(&der).map_err(malformed)?;
    let spki = request.info.public_key;

    match key_kind(&spki) {
        KeyKind::Ed25519 | KeyKind::EcdsaP256 => {}
        KeyKind::Rsa { bits } if bits < 2048 => return Err(CsrError::RsaKeyTooSmall { bits }),
        KeyKind::Rsa { bits } if bits <= 8192 => {}
        other => return Err(CsrError::UnsupportedKey(other)),
    }
    let signature = request
        .signature
        .as_bytes()
        .ok_or_else(|| CsrError::Malformed("signature has unused bits".into()))?;
    x509::verify_signature(&spki, &request.algorithm, signed, signature).map_err(|e| match e {
        X509Error::UnsupportedSignatureAlgorithm(a) => CsrError::UnsupportedSignatureAlgorithm(a.to_string()),
        X509Error::AlgorithmKeyMismatch { algorithm, key } => {
            CsrError::UnsupportedSignatureAlgorithm(format!("{algorithm} with a {key} key"))
        }
        _ => CsrError::BadSignature,
    })?;
    Ok(spki)
}

/// The CertificationRequestInfo exactly as received, which is what the
/// signature covers. Re-encoding the decoded value need not give these bytes
/// back: DER decoding sorts a SET OF (the attributes, a multi-valued RDN)
/// that the requester's encoder left unsorted.
fn signed_request_info(der: &[u8]) -> der::Result<&[u8]> {
    let request = AnyRef::from_der(der)?;
    SliceReader::new(request.value())?.tlv_bytes()
}

/// Everything the leaf says that does not come from the CA or its key.
#[derive(Debug, Clone)]
pub struct LeafRequest<'a> {
    /// Written as the CN (for people and audit; Talos ignores it).
    pub username: &'a str,
    /// Talos roles, one `O` each, in this order (duplicates dropped).
    pub roles: &'a [String],
    pub ttl: Duration,
    /// `not_before` = now - clock_skew.
    pub clock_skew: Duration,
}

/// A signed leaf certificate and the facts the audit record needs about it
/// (the API's `IssuedCertificate` answer is made from it).
#[derive(Debug, Clone)]
pub struct SignedLeaf {
    pub leaf: ParsedCertificate,
    /// Leaf then intermediates (in intermediate mode): the talosconfig `crt`.
    pub chain_pem: String,
    pub serial_hex: String,
    pub roles: Vec<String>,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    /// Hex SHA-256 of the leaf DER.
    pub certificate_sha256: String,
    /// Hex SHA-256 of the leaf's SubjectPublicKeyInfo DER.
    pub public_key_sha256: String,
}

/// Sign a Talos client certificate for the key of `csr` (a PKCS#10 request,
/// PEM or DER), once its self-signature verifies.
pub fn issue(
    ca: &CertificateAuthority,
    csr: &[u8],
    request: &LeafRequest<'_>,
    now: OffsetDateTime,
) -> Result<SignedLeaf, IssueError> {
    let spki = verify_csr(csr)?;
    sign_leaf(ca, &spki, request, now)
}

/// Sign a Talos client certificate for a public key the caller already
/// trusts (a verified CSR's, or a key made here for break-glass).
pub fn sign_leaf(
    ca: &CertificateAuthority,
    spki: &SubjectPublicKeyInfoOwned,
    request: &LeafRequest<'_>,
    now: OffsetDateTime,
) -> Result<SignedLeaf, IssueError> {
    let roles = checked_roles(request.roles)?;
    let username = request.username;
    if username.is_empty()
        || username.chars().count() > MAX_USERNAME_LEN
        || username.chars().any(char::is_control)
    {
        return Err(IssueError::InvalidUsername);
    }
    if request.ttl < Duration::from_secs(1) {
        return Err(IssueError::InvalidTtl);
    }

    let signer = ca.signer();
    // A leaf never outlives the certificates above it.
    let ca_not_after = ca
        .chain_to_send()
        .map(ParsedCertificate::not_after)
        .fold(signer.not_after(), std::cmp::min);
    let ca_not_after = std::cmp::min(ca_not_after, ca.root().not_after());
    if now < signer.not_before() || now >= ca_not_after {
        return Err(IssueError::CaNotValid);
    }
    // The TTL and the skew come from the configuration, which bounds
    // neither: past the times this server can represent, the leaf starts
    // at the epoch (where `x509_time` clamps anyway) or ends with its CA.
    let not_before = time::Duration::try_from(request.clock_skew)
        .ok()
        .and_then(|skew| now.checked_sub(skew))
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let not_after = time::Duration::try_from(request.ttl)
        .ok()
        .and_then(|ttl| now.checked_add(ttl))
        .map_or(ca_not_after, |end| std::cmp::min(end, ca_not_after));

    let mut subject: Vec<_> = roles.iter().map(|r| (oid::ORGANIZATION, r.as_str())).collect();
    subject.push((oid::COMMON_NAME, username));
    let subject = x509::encode_name(&subject)?;
    let spki_der = spki.to_der().map_err(X509Error::from)?;
    let serial = x509::random_serial(ca.rng())?;

    let mut extensions = x509::purpose_extensions(
        KeyUsage(KeyUsages::DigitalSignature.into()),
        vec![oid::KP_CLIENT_AUTH],
        BasicConstraints {
            ca: false,
            path_len_constraint: None,
        },
    )?;
    // Go copies the CA's subject key id; a CA without one gets no AKI, as in Talos.
    extensions.extend(x509::authority_key_id(signer)?);

    let template = CertificateTemplate {
        serial: &serial,
        issuer: &signer.raw_subject,
        subject: &subject,
        subject_public_key_info: &spki_der,
        not_before,
        not_after,
        extensions,
    };
    let der = x509::sign_certificate(&template, ca.key())?;
    let leaf = ParsedCertificate::from_der(&der)?;
    let chain_pem = std::iter::once(&leaf)
        .chain(ca.chain_to_send())
        .map(ParsedCertificate::to_pem)
        .collect();
    Ok(SignedLeaf {
        serial_hex: serial_hex(&serial),
        certificate_sha256: leaf.sha256_fingerprint(),
        public_key_sha256: hex::encode(ring::digest::digest(&ring::digest::SHA256, &spki_der)),
        not_before: leaf.not_before(),
        not_after: leaf.not_after(),
        leaf,
        chain_pem,
        roles,
    })
}

/// Role names end up as `O` values that Talos parses with `role.Parse`:
/// keep them short, printable and free of separators. Duplicates are dropped.
fn checked_roles(roles: &[String]) -> Result<Vec<String>, IssueError> {
    let mut out: Vec<String> = Vec::with_capacity(roles.len());
    for role in roles {
        let well_formed = !role.is_empty()
            && role.len() <= 64
            && role
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b":._-".contains(&b));
        if !well_formed {
            return Err(IssueError::InvalidRole(role.chars().take(64).collect()));
        }
        if !out.contains(role) {
            out.push(role.clone());
        }
    }
    if out.is_empty() {
        return Err(IssueError::NoRoles);
    }
    Ok(out)
}

/// The serial as OpenSSL prints it: hex, no leading zero bytes.
pub fn serial_hex(serial: &[u8]) -> String {
    let first = serial
        .iter()
        .position(|b| *b != 0)
        .unwrap_or(serial.len().saturating_sub(1));
    hex::encode(&serial[first..])
}

#[cfg(test)]
mod tests {
    use const_oid::db::rfc2985::{PKCS_9_AT_CHALLENGE_PASSWORD, PKCS_9_AT_UNSTRUCTURED_NAME};
    use der::asn1::{BitStringRef, SetOfVec, Utf8StringRef};
    use der::{Tag, TagNumber};
    use ring::signature::{Ed25519KeyPair, KeyPair};
    use spki::AlgorithmIdentifierOwned;
    use x509_cert::attr::Attribute;

    use super::*;

    fn tlv(tag: Tag, content: &[u8]) -> Vec<u8> {
        AnyRef::new(tag, content).unwrap().to_der().unwrap()
    }

    /// A CSR whose two attributes are written in the order given, signed
    /// over exactly those bytes (as an encoder that does not sort SET OF does).
    fn csr_with_attributes_in_order(key: &Ed25519KeyPair, descending: bool) -> Vec<u8> {
        let attribute = |oid, value| {
            let mut values = SetOfVec::new();
            values.insert(Utf8StringRef::new(value).unwrap().into()).unwrap();
            Attribute { oid, values }.to_der().unwrap()
        };
        let mut attributes = [
            attribute(PKCS_9_AT_UNSTRUCTURED_NAME, "node"),
            attribute(PKCS_9_AT_CHALLENGE_PASSWORD, "secret"),
        ];
        attributes.sort();
        if descending {
            attributes.reverse();
        }
        let spki = SubjectPublicKeyInfoOwned {
            algorithm: AlgorithmIdentifierOwned {
                oid: x509::oid::ED25519,
                parameters: None,
            },
            subject_public_key: der::asn1::BitString::from_bytes(key.public_key().as_ref()).unwrap(),
        };
        let attributes_tag = Tag::ContextSpecific {
            constructed: true,
            number: TagNumber(0),
        };
        let info = tlv(
            Tag::Sequence,
            &[
                0u8.to_der().unwrap(),
                x509::encode_name(&[(x509::oid::COMMON_NAME, "talos-sso")]).unwrap(),
                spki.to_der().unwrap(),
                tlv(attributes_tag, &attributes.concat()),
            ]
            .concat(),
        );
        let algorithm = AlgorithmIdentifierOwned {
            oid: x509::oid::ED25519,
            parameters: None,
        };
        let signature = key.sign(&info);
        let signature = BitStringRef::from_bytes(signature.as_ref()).unwrap();
        tlv(
            Tag::Sequence,
            &[info, algorithm.to_der().unwrap(), signature.to_der().unwrap()].concat(),
        )
    }

    /// Found while writing the `csr` fuzz target, whose checks fail on the
    /// inputs in `fuzz/regressions/csr/` (the fuzzer itself had not reached
    /// them in 10 minutes): `now - clock_skew` and
    /// `now + ttl` panicked past the year 9999, and neither is bounded by
    /// the configuration (`clock_skew: 20000y`, or `max_ttl: 20000y` and a
    /// request for that long): every issuance would have panicked.
    #[test]
    fn a_ttl_or_skew_past_the_representable_times_is_clamped_not_a_panic() {
        let now = OffsetDateTime::from_unix_timestamp(1_796_126_400).unwrap();
        let root = crate::ca::generate::new_root(
            crate::ca::generate::NewKeyType::Ed25519,
            "talos",
            Duration::from_secs(3650 * 86_400),
            now - Duration::from_secs(86_400),
        )
        .unwrap();
        let ca =
            CertificateAuthority::from_pem(&root.cert_pem, &root.key_pem, "test", Vec::new(), now).unwrap();
        let key = Ed25519KeyPair::from_seed_unchecked(&[3; 32]).unwrap();
        let spki = SubjectPublicKeyInfoOwned {
            algorithm: AlgorithmIdentifierOwned {
                oid: x509::oid::ED25519,
                parameters: None,
            },
            subject_public_key: der::asn1::BitString::from_bytes(key.public_key().as_ref()).unwrap(),
        };
        let roles = ["os:reader".to_owned()];
        let huge = Duration::from_secs(u64::MAX);
        let leaf = |ttl, clock_skew| {
            let request = LeafRequest {
                username: "alice",
                roles: &roles,
                ttl,
                clock_skew,
            };
            sign_leaf(&ca, &spki, &request, now).unwrap()
        };
        let long = leaf(huge, Duration::from_secs(300));
        assert_eq!(long.not_after, ca.signer().not_after());
        assert_eq!(long.not_before, now - Duration::from_secs(300));
        let early = leaf(Duration::from_secs(300), huge);
        assert_eq!(early.not_before, OffsetDateTime::UNIX_EPOCH);
        assert_eq!(early.not_after, now + Duration::from_secs(300));
    }

    #[test]
    fn the_signature_is_checked_over_the_request_info_as_received() {
        let key = Ed25519KeyPair::from_seed_unchecked(&[9; 32]).unwrap();
        for descending in [false, true] {
            let csr = csr_with_attributes_in_order(&key, descending);
            let spki = verify_csr(&csr).unwrap();
            assert_eq!(spki.subject_public_key.raw_bytes(), key.public_key().as_ref());
            // Decoding sorts the attributes: re-encoded, the unsorted request
            // is not what was signed, so only the received bytes verify.
            let reencoded = CertReq::from_der(&csr).unwrap().info.to_der().unwrap();
            let received = signed_request_info(&csr).unwrap();
            assert_eq!(reencoded == received, !descending);
        }
        // A change to the received bytes still breaks the signature.
        let mut altered = csr_with_attributes_in_order(&key, true);
        let at = altered.windows(6).position(|w| w == b"secret").unwrap();
        altered[at] = b'S';
        assert_eq!(
            verify_csr(&altered).unwrap_err().reason(),
            "csr_signature_invalid"
        );
    }
}
