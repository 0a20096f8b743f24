//! A refusal committed: the one way a refused request (by the issuance, or
//! by the API's gate before it) becomes a record, with its code from the
//! typed [`ErrorCode`], and a refused certificate a count.

use talos_sso_api::ErrorCode;

use super::Clusters;
use crate::audit::recorder::Recorder;
use crate::audit::store::Append;
use crate::audit::writer::AuditError;
use crate::audit::{AuditRecord, event, outcome};
use crate::metrics::{DeniedLabels, Metrics};

/// `record` as the record of a refusal with `code`.
pub fn mark_refused(record: &mut AuditRecord, code: &ErrorCode) {
    record.reason_code = Some(code.code().to_owned());
    record.outcome = outcome::DENIED.into();
}

/// Commits refusals and counts the refused certificates among them.
#[derive(Debug)]
pub struct RefusalRecorder<'a, R> {
    pub recorder: &'a R,
    /// The configured clusters: the only names a count is labelled with.
    pub clusters: &'a Clusters,
    pub metrics: &'a Metrics,
}

impl<R: Recorder> RefusalRecorder<'_, R> {
    /// Commit `record` as refused with `code`, counting it when it is a
    /// refused certificate.
    pub async fn record(&self, mut record: AuditRecord, code: &ErrorCode) -> Result<(), AuditError> {
        mark_refused(&mut record, code);
        self.count(&record, code);
        self.recorder
            .append(Append {
                record,
                ..Default::default()
            })
            .await
            .map(|_| ())
    }

    /// Count `record` when it is a refused certificate (other refusals are
    /// recorded, not counted); for a refusal recorded with others later
    /// ([`crate::refusals`]) too.
    pub fn count(&self, record: &AuditRecord, code: &ErrorCode) {
        if record.event == event::CERTIFICATE_DENIED {
            self.count_certificate(record.cluster.as_deref(), code);
        }
    }

    /// Count a refused certificate. Labels take only configured values:
    /// `cluster` is a configured cluster's name or `unknown`, `reason` one
    /// of the server's own codes.
    pub fn count_certificate(&self, cluster: Option<&str>, code: &ErrorCode) {
        let cluster = cluster
            .filter(|c| self.clusters.contains_key(*c))
            .unwrap_or("unknown");
        let labels = DeniedLabels {
            cluster: cluster.to_owned(),
            reason: code.code().to_owned(),
        };
        self.metrics.denied.get_or_create(&labels).inc();
    }
}
