//! The extensions CA and leaf certificates carry: what a certificate is
//! for, and the key identifiers that link it to its issuer.

use der::Encode;
use der::asn1::OctetString;
use spki::{ObjectIdentifier, SubjectPublicKeyInfoOwned};
use x509_cert::ext::Extension;
use x509_cert::ext::pkix::{BasicConstraints, ExtendedKeyUsage, KeyUsage};

use super::{ParsedCertificate, X509Error, oid};

/// A key identifier per RFC 7093 method 1: the leftmost 160 bits of the
/// SHA-256 of the subjectPublicKey bits.
pub fn key_identifier(spki: &SubjectPublicKeyInfoOwned) -> Vec<u8> {
    let digest = ring::digest::digest(&ring::digest::SHA256, spki.subject_public_key.raw_bytes());
    digest.as_ref()[..20].to_vec()
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
