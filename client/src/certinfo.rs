//! What the client reads back from a certificate it holds: roles (the
//! Subject Organization values, as Talos reads them), username (CN) and
//! expiry.

use const_oid::db::rfc4519::{COMMON_NAME, ORGANIZATION_NAME as ORGANIZATION};
use der::{Tag, Tagged};
use spki::ObjectIdentifier;
use time::OffsetDateTime;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafInfo {
    pub roles: Vec<String>,
    pub common_name: Option<String>,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

/// The first certificate of a PEM chain.
pub fn leaf_info(chain_pem: &str) -> Option<LeafInfo> {
    let cert = x509_cert::Certificate::load_pem_chain(chain_pem.as_bytes())
        .ok()?
        .into_iter()
        .next()?;
    let tbs = cert.tbs_certificate();
    let strings = |oid: ObjectIdentifier| -> Vec<String> {
        tbs.subject()
            .iter()
            .filter(|atv| atv.oid == oid)
            .filter(|atv| {
                matches!(
                    atv.value.tag(),
                    Tag::PrintableString | Tag::Utf8String | Tag::Ia5String
                )
            })
            .filter_map(|atv| {
                std::str::from_utf8(atv.value.value())
                    .ok()
                    .map(|s| s.trim().to_owned())
            })
            .filter(|s| !s.is_empty())
            .collect()
    };
    let instant = |time: &x509_cert::time::Time| {
        let seconds = i64::try_from(time.to_unix_duration().as_secs()).ok()?;
        OffsetDateTime::from_unix_timestamp(seconds).ok()
    };
    Some(LeafInfo {
        roles: strings(ORGANIZATION),
        common_name: strings(COMMON_NAME).into_iter().next(),
        not_before: instant(&tbs.validity().not_before)?,
        not_after: instant(&tbs.validity().not_after)?,
    })
}
