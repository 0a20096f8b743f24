//! [`ParsedCertificate`]: a certificate read from DER, keeping the exact
//! bytes of its names and its TBS, refused when an extension appears twice
//! or one that decides what it may do cannot be read.

use const_oid::AssociatedOid;
use der::asn1::AnyRef;
use der::{Decode, Encode, Reader, Tag};
use spki::{ObjectIdentifier, SubjectPublicKeyInfoOwned};
use time::OffsetDateTime;
use x509_cert::ext::Extension;
use x509_cert::ext::pkix::{BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectKeyIdentifier};
use x509_cert::time::Time;

use super::names::attribute_strings;
use super::{X509Error, oid, pem_encode, verify_signature};

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

fn to_offset(t: Time) -> OffsetDateTime {
    let secs = t.to_unix_duration().as_secs();
    OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(i64::MAX))
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use der::asn1::OctetString;

    use super::*;
    use crate::keys::{Signer, SoftwareKey};
    use crate::x509::{CertificateTemplate, encode_name, extension, sign_certificate};

    /// A self-signed certificate with these extensions, by a fixed Ed25519 key.
    fn certificate_with(extensions: Vec<Extension>) -> Vec<u8> {
        let key =
            SoftwareKey::Ed25519(ring::signature::Ed25519KeyPair::from_seed_unchecked(&[7; 32]).unwrap());
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
        sign_certificate(&template, &key).unwrap()
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
}
