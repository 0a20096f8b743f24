//! A certificate from its template: the TBS built with the issuer's name
//! bytes copied as they are, signed by any [`Signer`]; and the serials and
//! times that go into it.

use der::asn1::{AnyRef, BitStringRef, UintRef};
use der::{Decode, Encode, Sequence};
use ring::rand::SecureRandom;
use spki::AlgorithmIdentifierOwned;
use time::OffsetDateTime;
use x509_cert::ext::Extension;
use x509_cert::time::Time;

use super::X509Error;
use crate::keys::Signer;

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
pub fn sign_certificate(template: &CertificateTemplate<'_>, key: &dyn Signer) -> Result<Vec<u8>, X509Error> {
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
    let signature = key.sign(&tbs)?;
    let cert = CertificateOut {
        tbs_certificate: AnyRef::from_der(&tbs)?,
        signature_algorithm: algorithm,
        signature: BitStringRef::from_bytes(&signature)?,
    };
    Ok(cert.to_der()?)
}
