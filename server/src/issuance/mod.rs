//! Issuance: given who is asking (a person whose token was verified, or a
//! break-glass operator on the server host), what they ask for and the time,
//! decide, sign and record, and say what happened. Every decision, issued
//! or refused, is committed to the audit trail before it is returned: a
//! certificate never leaves without its record, and a refusal that cannot
//! be recorded becomes [`IssuanceError::AuditUnavailable`].
//!
//! Nothing here knows HTTP: the handler turns a request into a call and an
//! [`IssuanceError`] into an answer; `break_glass` calls the same service.
//! A refusal is committed by [`refusal::RefusalRecorder`], the one way any
//! refused request becomes a record, here and in the API's gate.

pub mod refusal;

use std::time::Duration;

use spki::SubjectPublicKeyInfoOwned;
use time::OffsetDateTime;

use crate::audit::recorder::Recorder;
use crate::audit::store::{Append, Appended, TokenClaim};
use crate::audit::{AuditRecord, RecordExt, StoredRecord, event, outcome};
use crate::certificate::{self, CsrError, IssueError, LeafRequest, SignedLeaf};
use crate::cluster::{Cluster, Clusters};
use crate::identity::VerifiedIdentity;
use crate::identity::issuer::workload::Workload;
use crate::keys::SignError;
use crate::metrics::Metrics;
use crate::policy::{Applicant, Denial, WorkloadDenial};
use crate::x509::X509Error;
use refusal::RefusalRecorder;
use serde_json::{Value, json};
use talos_sso_api::ErrorCode;
use talos_sso_api::audit::workload as keys;
use talos_sso_text as text;

/// What a person asks for (the body of `POST /v1/certificates`).
pub use talos_sso_api::CertificateRequest;

/// Why nothing was issued (a refusal). Each has been recorded, except
/// [`IssuanceError::AuditUnavailable`], which says that recording failed.
#[derive(Debug, thiserror::Error)]
pub enum IssuanceError {
    #[error("no cluster `{}` here", text::clean(requested, 64))]
    ClusterUnknown { requested: String, known: Vec<String> },
    #[error("{0}")]
    Policy(Denial),
    #[error("{0}")]
    Workload(WorkloadDenial),
    #[error("ttl_seconds must be at least 1")]
    TtlInvalid,
    #[error("at most {} seconds on cluster `{cluster}`", max.as_secs())]
    TtlTooLong { cluster: String, max: Duration },
    #[error(transparent)]
    Csr(CsrError),
    /// Signing failed for a reason that is the server's, not the caller's.
    #[error("signing failed: {0}")]
    Signing(IssueError),
    /// The cluster's CA key is in a PKCS#11 token that cannot sign now.
    #[error(
        "the CA's signing key cannot be reached right now ({0}), so nothing was issued; try again shortly"
    )]
    SigningUnavailable(crate::keys::KeyUnavailable),
    #[error("you are blocked from new certificates on this server (deny list); ask the platform team")]
    IdentityDenied,
    #[error("this token was already used for a certificate; log in again for a new one")]
    TokenReplayed,
    #[error("the audit trail is unavailable, so no certificate can be issued; try again shortly")]
    AuditUnavailable,
}

impl IssuanceError {
    /// The API code of this refusal, with its fields: the one value the
    /// answer, the audit record's reason and the metrics take their code
    /// from.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            IssuanceError::ClusterUnknown { known, .. } => ErrorCode::ClusterUnknown {
                clusters: known.clone(),
            },
            IssuanceError::Policy(denial) => denial.error_code(),
            IssuanceError::Workload(denial) => denial.error_code(),
            IssuanceError::TtlInvalid => ErrorCode::TtlInvalid,
            IssuanceError::TtlTooLong { max, .. } => ErrorCode::TtlTooLong {
                max_ttl_seconds: max.as_secs(),
            },
            IssuanceError::Csr(csr) => ErrorCode::CsrInvalid {
                reason: csr.reason().into(),
            },
            // The server's failure, not the caller's: nothing to say.
            IssuanceError::Signing(_) => ErrorCode::InternalError,
            IssuanceError::SigningUnavailable(_) => ErrorCode::SigningUnavailable,
            IssuanceError::IdentityDenied => ErrorCode::IdentityDenied,
            IssuanceError::TokenReplayed => ErrorCode::TokenReplayed,
            IssuanceError::AuditUnavailable => ErrorCode::AuditUnavailable,
        }
    }

    /// The stable code, as recorded and counted.
    pub fn code(&self) -> &'static str {
        self.error_code().code()
    }
}

/// A certificate, signed and recorded.
#[derive(Debug)]
pub struct Issued<'a> {
    pub cluster: &'a Cluster,
    pub certificate: SignedLeaf,
    pub record: StoredRecord,
}

/// What a break-glass operator asks for: no identity provider, no policy
/// decision; only roles some rule of the cluster grants.
#[derive(Debug)]
pub struct BreakGlassGrant<'a> {
    pub cluster: &'a str,
    /// `break-glass:OPERATOR@HOST`: the certificate's CN.
    pub username: &'a str,
    pub roles: &'a [String],
    pub ttl: Duration,
    /// The key made on the host for this certificate.
    pub public_key: &'a SubjectPublicKeyInfoOwned,
}

/// Decides, signs and records, against one recorder.
#[derive(Debug)]
pub struct Issuance<'a, R> {
    pub clusters: &'a Clusters,
    pub recorder: &'a R,
    pub metrics: &'a Metrics,
}

impl<'a, R: Recorder> Issuance<'a, R> {
    /// A certificate for a verified person or workload: the cluster's
    /// policy (a workload's: its workload rules) decides the roles, the TTL
    /// is checked against the cluster's limits, the CSR is verified, and
    /// the record is committed with the token's replay claim (a workload's
    /// token may be claimed up to its issuer's `certificates_per_token`
    /// times) and the deny-list check in the same transaction.
    ///
    /// `record` holds what is known of the request (caller, identity);
    /// it becomes the record of the decision, whichever it is.
    pub async fn issue(
        &self,
        identity: &VerifiedIdentity,
        request: &CertificateRequest,
        mut record: AuditRecord,
        now: OffsetDateTime,
    ) -> Result<Issued<'a>, IssuanceError> {
        let Some(cluster) = self.clusters.get(&request.cluster) else {
            let known = self.clusters.keys().cloned().collect();
            let error = IssuanceError::ClusterUnknown {
                requested: request.cluster.clone(),
                known,
            };
            return Err(self.refuse(record, error).await);
        };
        // The lifetime when none is asked for, and the longest one may ask
        // for: the cluster's, or for a workload its rules' `ttl` for both.
        let (granted, default_ttl, max_ttl) = match &identity.workload {
            Some(workload) => match decide_workload(cluster, identity, workload, request, &mut record) {
                Ok(grant) => grant,
                Err(denial) => return Err(self.refuse(record, IssuanceError::Workload(denial)).await),
            },
            None => match cluster.policy.decide(&applicant(identity), &request.roles) {
                Ok(decision) => (decision.granted, cluster.config.ttl, cluster.config.max_ttl),
                Err(denial) => return Err(self.refuse(record, IssuanceError::Policy(denial)).await),
            },
        };
        let ttl = match request.ttl_seconds {
            None => default_ttl,
            Some(0) => return Err(self.refuse(record, IssuanceError::TtlInvalid).await),
            Some(seconds) => Duration::from_secs(seconds),
        };
        if ttl > max_ttl {
            let error = IssuanceError::TtlTooLong {
                cluster: cluster.name.clone(),
                max: max_ttl,
            };
            return Err(self.refuse(record, error).await);
        }
        let public_key = match certificate::verify_csr(request.csr.as_bytes()) {
            Ok(public_key) => public_key,
            Err(csr) => return Err(self.refuse(record, IssuanceError::Csr(csr)).await),
        };
        let leaf = LeafRequest {
            username: &identity.username,
            roles: &granted,
            ttl,
            clock_skew: cluster.config.clock_skew,
        };
        let claim = TokenClaim {
            token_id: identity.replay_key(),
            expires_at: Some(identity.expires_at),
            uses: identity.workload.as_ref().map_or(1, |w| w.token_uses),
        };
        let commit = Commit {
            issued_event: event::CERTIFICATE_ISSUED,
            claim: Some(claim),
            deny_check: true,
            record_failure: true,
            for_gateway: true,
        };
        self.sign_and_record(cluster, &public_key, &leaf, record, commit, now)
            .await
    }

    /// A break-glass certificate: recorded under its own event, with the
    /// operator's facts already in `record.details`.
    pub async fn issue_break_glass(
        &self,
        grant: &BreakGlassGrant<'_>,
        mut record: AuditRecord,
        now: OffsetDateTime,
    ) -> Result<Issued<'a>, IssuanceError> {
        let cluster = self
            .clusters
            .get(grant.cluster)
            .ok_or_else(|| IssuanceError::ClusterUnknown {
                requested: grant.cluster.to_owned(),
                known: self.clusters.keys().cloned().collect(),
            })?;
        within_max_ttl(cluster, grant.ttl)?;
        let leaf = LeafRequest {
            username: grant.username,
            roles: grant.roles,
            ttl: grant.ttl,
            clock_skew: cluster.config.clock_skew,
        };
        record.event = event::BREAK_GLASS_ISSUED.into();
        record.cluster = Some(cluster.name.clone());
        record.username = Some(grant.username.to_owned());
        record.roles_requested = grant.roles.to_vec();
        // No token to claim, and no deny list: the operator is on the host,
        // and sees a failure on their terminal (there is no request to
        // record; a record under `break_glass.issued` would read as issued).
        let commit = Commit {
            issued_event: event::BREAK_GLASS_ISSUED,
            claim: None,
            deny_check: false,
            record_failure: false,
            for_gateway: false,
        };
        self.sign_and_record(cluster, grant.public_key, &leaf, record, commit, now)
            .await
    }

    /// Sign, then commit the record naming the certificate; only a
    /// committed record lets the certificate out. A signing failure is
    /// recorded as a refusal when `commit.record_failure` says so.
    async fn sign_and_record(
        &self,
        cluster: &'a Cluster,
        public_key: &SubjectPublicKeyInfoOwned,
        leaf: &LeafRequest<'_>,
        mut record: AuditRecord,
        commit: Commit,
        now: OffsetDateTime,
    ) -> Result<Issued<'a>, IssuanceError> {
        let signed = {
            let ca = if commit.for_gateway {
                cluster.people_ca(now)
            } else {
                cluster.signing_ca(now)
            };
            let _turn = ca.turn_to_sign().await;
            certificate::sign_leaf(ca, public_key, leaf, now)
        };
        let issued = match signed {
            Ok(issued) => issued,
            Err(error) => {
                tracing::error!(request_id = %record.request_id, cluster = %cluster.name, %error, "signing failed");
                let error = match error {
                    IssueError::Signing(X509Error::Signing(SignError::Unavailable(token))) => {
                        let labels = crate::metrics::ClusterLabels {
                            cluster: cluster.name.clone(),
                        };
                        self.metrics.signing_unavailable.get_or_create(&labels).inc();
                        IssuanceError::SigningUnavailable(token)
                    }
                    other => IssuanceError::Signing(other),
                };
                if !commit.record_failure {
                    return Err(error);
                }
                return Err(self.refuse(record, error).await);
            }
        };
        record.event = commit.issued_event.into();
        record.outcome = outcome::SUCCESS.into();
        record.set_certificate(&issued);
        let appended = self
            .recorder
            .append(Append {
                record,
                claim: commit.claim,
                deny_check: commit.deny_check,
                deny_change: None,
            })
            .await;
        let stored = match appended {
            Ok(Appended::Recorded(stored)) => stored,
            // Recorded by the store in place of the issuance; counted here.
            Ok(Appended::Denied(_)) => {
                let error = IssuanceError::IdentityDenied;
                self.refusals()
                    .count_certificate(Some(&cluster.name), &error.error_code());
                return Err(error);
            }
            Ok(Appended::Replayed(_)) => {
                let error = IssuanceError::TokenReplayed;
                self.refusals()
                    .count_certificate(Some(&cluster.name), &error.error_code());
                return Err(error);
            }
            Err(_) => return Err(IssuanceError::AuditUnavailable),
        };
        self.metrics.count_issued(&cluster.name, &issued.roles);
        tracing::info!(request_id = %stored.record.request_id, cluster = %cluster.name,
            username = %text::clean_field(leaf.username), roles = ?issued.roles,
            serial = %issued.serial_hex, audit_seq = stored.seq, "certificate issued");
        Ok(Issued {
            cluster,
            certificate: issued,
            record: stored,
        })
    }

    /// Record a refusal of a verified caller and return it (or
    /// `AuditUnavailable` when it cannot be recorded).
    async fn refuse(&self, record: AuditRecord, error: IssuanceError) -> IssuanceError {
        match self.refusals().record(record, &error.error_code()).await {
            Ok(()) => error,
            Err(_) => IssuanceError::AuditUnavailable,
        }
    }

    fn refusals(&self) -> RefusalRecorder<'_, R> {
        RefusalRecorder {
            recorder: self.recorder,
            clusters: self.clusters,
            metrics: self.metrics,
        }
    }
}

/// What people's rules read of a verified person.
fn applicant(identity: &VerifiedIdentity) -> Applicant {
    Applicant {
        issuer_name: identity.issuer_name.clone(),
        tenant: identity.tenant.clone(),
        subject: identity.subject.clone(),
        username: identity.username.clone(),
        groups: identity.groups.clone(),
        app_roles: identity.app_roles.clone(),
        raw: identity.claims.clone(),
        application: identity.application.is_some(),
        workload: false,
    }
}

/// The cluster's workload rules on a workload's token: the roles, the
/// default lifetime and the longest they grant (a rule's `ttl` is both). Either way `record.details.workload` says
/// what was judged; a refusal also says which rules missed which claims,
/// there and in the log, never in the answer.
fn decide_workload(
    cluster: &Cluster,
    identity: &VerifiedIdentity,
    workload: &Workload,
    request: &CertificateRequest,
    record: &mut AuditRecord,
) -> Result<(Vec<String>, Duration, Duration), WorkloadDenial> {
    let decided = cluster
        .policy
        .workloads
        .decide(&identity.issuer_name, workload, &request.roles);
    let claims: serde_json::Map<String, Value> = workload
        .claims
        .iter()
        .map(|(name, value)| (name.clone(), Value::String(text::clean_field(value))))
        .collect();
    let mut facts = json!({
        keys::KIND: workload.kind,
        keys::ISSUER: identity.issuer_name,
        keys::CLAIMS: claims,
        keys::TOKEN_USES_MAX: workload.token_uses,
    });
    let answer = match decided {
        Ok(grant) => {
            facts[keys::RULES] = json!(grant.rules);
            match grant.ttl {
                Some(ttl) => Ok((grant.granted, ttl, ttl)),
                None => Ok((grant.granted, cluster.config.ttl, cluster.config.max_ttl)),
            }
        }
        Err(denial) => {
            if let WorkloadDenial::NotAdmitted { misses } = &denial {
                let misses: Vec<Value> = misses
                    .iter()
                    .map(|miss| json!({ "rule": miss.rule, keys::CLAIMS: miss.claims }))
                    .collect();
                let misses = Value::Array(misses);
                tracing::info!(request_id = %record.request_id, cluster = %cluster.name,
                    issuer = %identity.issuer_name, subject = %text::clean_field(&identity.subject),
                    misses = %misses, "workload token not admitted");
                facts[keys::MISSES] = misses;
            }
            Err(denial)
        }
    };
    if !record.details.is_object() {
        record.details = json!({});
    }
    record.details[keys::KEY] = facts;
    answer
}

/// How an issuance is committed.
#[derive(Debug)]
struct Commit {
    /// The record's event once signed.
    issued_event: &'static str,
    /// The token whose one certificate this is.
    claim: Option<TokenClaim>,
    /// Refuse it in the committing transaction when the identity is denied.
    deny_check: bool,
    /// Record a signing failure as a refusal of the request.
    record_failure: bool,
    /// A person's certificate: on a gateway cluster, signed by the
    /// gateway's client CA. Break-glass goes to apid directly, signed by
    /// the cluster's `ca` (the gateway may be what is down).
    for_gateway: bool,
}

fn within_max_ttl(cluster: &Cluster, ttl: Duration) -> Result<(), IssuanceError> {
    if ttl > cluster.config.max_ttl {
        return Err(IssuanceError::TtlTooLong {
            cluster: cluster.name.clone(),
            max: cluster.config.max_ttl,
        });
    }
    Ok(())
}
