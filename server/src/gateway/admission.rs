//! Who is on a connection: the client certificate passed the handshake
//! (it chains to the cluster's gateway CA and is within its validity); it
//! is admitted only when the trail holds the record of its issuance, for
//! this cluster, with this certificate's fingerprint, and no record that it
//! never left the server. The person, their roles and groups are read from
//! that record, not from the certificate alone.

use time::OffsetDateTime;

use crate::audit::event;
use crate::audit::store::{AuditFilter, AuditStore};
use crate::certificate::serial_hex;
use crate::talos_api::calls::Caller;
use crate::x509::ParsedCertificate;

/// Why a certificate was not admitted (the connection is closed; the
/// handshake already refused certificates of other CAs and expired ones).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("the client certificate cannot be read")]
    Unreadable,
    #[error("no issuance of this certificate is in the audit trail")]
    Unknown,
    #[error("this certificate was recorded as never delivered")]
    Undelivered,
    #[error("the audit trail cannot be read right now")]
    TrailUnavailable,
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Unreadable => "certificate_unreadable",
            Refusal::Unknown => "certificate_unknown",
            Refusal::Undelivered => "certificate_undelivered",
            Refusal::TrailUnavailable => "audit_unavailable",
        }
    }
}

/// The caller a verified client certificate stands for.
pub async fn admit(
    store: &AuditStore,
    cluster: &str,
    leaf_der: &[u8],
    client_ip: &str,
) -> Result<Caller, Refusal> {
    let leaf = ParsedCertificate::from_der(leaf_der).map_err(|_| Refusal::Unreadable)?;
    let serial = serial_hex(leaf.tbs().serial_number().as_bytes());
    let fingerprint = leaf.sha256_fingerprint();
    let find = |event: &str| AuditFilter {
        event: Some(event.to_owned()),
        serial: Some(serial.clone()),
        cluster: Some(cluster.to_owned()),
        limit: 10,
        ..AuditFilter::default()
    };
    let issued = store
        .query(&find(event::CERTIFICATE_ISSUED))
        .await
        .map_err(|_| Refusal::TrailUnavailable)?;
    let record = issued
        .into_iter()
        .map(|stored| stored.record)
        .find(|record| {
            record.outcome == crate::audit::outcome::SUCCESS
                && record.certificate_sha256.as_deref() == Some(fingerprint.as_str())
        })
        .ok_or(Refusal::Unknown)?;
    let undelivered = store
        .query(&find(event::CERTIFICATE_UNDELIVERED))
        .await
        .map_err(|_| Refusal::TrailUnavailable)?;
    if undelivered
        .iter()
        .any(|stored| stored.record.certificate_sha256.as_deref() == Some(fingerprint.as_str()))
    {
        return Err(Refusal::Undelivered);
    }
    Ok(Caller {
        cluster: cluster.to_owned(),
        issuer: record.issuer,
        tenant: record.tenant,
        subject: record.subject,
        username: record.username,
        serial,
        roles: record.roles_granted,
        groups: record.groups_evaluated,
        not_after: record.not_after.unwrap_or_else(|| leaf.not_after()),
        client_ip: client_ip.to_owned(),
    })
}

/// Whether a certificate that ends at `not_after` may start a call at `now`.
pub fn within_validity(caller: &Caller, now: OffsetDateTime) -> bool {
    now < caller.not_after
}
