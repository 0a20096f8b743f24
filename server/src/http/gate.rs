//! The gate every API request passes once, before anything is done for
//! it: the address rate limit, the token, the per-identity rate limit. The
//! gate builds the request's audit record (the caller, what they asked,
//! who the token says they are) and commits every refusal of the request
//! the same way, whoever refuses it: the gate, the privilege check, or the
//! endpoint after them ([`Admitted::refuse`]).

use std::sync::Arc;

use serde_json::{Value, json};
use talos_sso_api::{CertificateRequest, ErrorCode};

use super::caller::{Caller, Credentials};
use super::error::ApiError;
use crate::app::{App, Settings};
use crate::audit::{AuditRecord, outcome};
use crate::identity::{ClaimedIdentity, VerifiedIdentity};
use crate::issuance::refusal::{RefusalRecorder, mark_refused};
use crate::ratelimit::address_key;
use crate::refusals::Admission;
use talos_sso_text as text;

/// Requested roles kept in the record of a caller nobody authenticated.
const UNVERIFIED_ROLES: usize = 8;

/// Which per-identity limit applies once the caller is known.
#[derive(Debug, Clone, Copy)]
pub enum IdentityLimit {
    /// Certificates per identity.
    Certificates,
    /// Audit and deny-list requests per identity.
    Api,
}

/// A request on its way in: its record so far, and the settings it is
/// decided with (taken once, even if a reload lands meanwhile).
pub struct Gate<'a> {
    app: &'a App,
    caller: &'a Caller,
    settings: Arc<Settings>,
    record: AuditRecord,
}

/// The caller (never their token) and the record so far.
impl std::fmt::Debug for Gate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("caller", self.caller)
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

impl<'a> Gate<'a> {
    /// The record of a request for `event`, denied until an action
    /// succeeds.
    pub fn open(app: &'a App, caller: &'a Caller, event: &str) -> Self {
        Self {
            app,
            caller,
            settings: app.settings(),
            record: caller.record(app, event),
        }
    }

    /// What a certificate request asks for, in its record before any check,
    /// so that a refusal says it. Only a configured name goes in `cluster`
    /// (and into metric labels); anything else is kept, escaped, as what it
    /// is: a name asked for.
    pub fn asking_for(mut self, request: &CertificateRequest) -> Self {
        if self.settings.clusters.contains_key(&request.cluster) {
            self.record.cluster = Some(request.cluster.clone());
        } else {
            self.record.details = json!({ "requested_cluster": text::clean(&request.cluster, 64) });
        }
        self.record.roles_requested = request.roles.clone();
        self
    }

    /// The facts of the request its record keeps (`details`).
    pub fn with_details(mut self, details: Value) -> Self {
        self.record.details = details;
        self
    }

    /// Rate limits, then the token: who is asking, as only a token we
    /// verified ourselves says. Every refusal is recorded (with who the
    /// token *claimed* to be, marked unverified); a rate-limit refusal is
    /// also counted by limit (`talos_sso_rate_limited_total`).
    pub async fn pass(mut self, limit: IdentityLimit) -> Result<Admitted<'a>, ApiError> {
        let (app, caller) = (self.app, self.caller);
        let token = caller.credentials();
        // A flood from one address is stopped before any token work.
        if let Some(address) = &caller.address_key
            && let Err(retry) = self.settings.rate_limits.check_address(address)
        {
            app.metrics.count_rate_limited("address");
            if let Credentials::Bearer(token) = token {
                with_claimed_identity(&mut self.record, app.authenticator.claimed(token));
            }
            return Err(self.refuse(ApiError::rate_limited(retry, "this address")).await);
        }
        let token = match token {
            Credentials::Bearer(token) => token,
            Credentials::Missing => {
                let error = ApiError::new(
                    ErrorCode::TokenMissing,
                    "send the identity provider's token as `Authorization: Bearer ...`",
                );
                return Err(self.refuse(error).await);
            }
            Credentials::Unreadable(why) => {
                let error = ApiError::new(ErrorCode::TokenMalformed, *why);
                return Err(self.refuse(error).await);
            }
        };
        let verified = match app
            .authenticator
            .authenticate(token, app.clock.now(), &self.settings.relevant_groups)
            .await
        {
            Ok(verified) => verified,
            Err(error) => {
                match error.verified_identity() {
                    // A valid token whose groups could not be resolved: an
                    // authenticated decision, recorded in full.
                    Some(verified) => with_identity(&mut self.record, verified),
                    None => with_claimed_identity(&mut self.record, app.authenticator.claimed(token)),
                }
                tracing::info!(request_id = %caller.request_id, code = error.code(), "token refused");
                let error = ApiError::token(&error, app.clock.now());
                return Err(self.refuse(error).await);
            }
        };
        with_identity(&mut self.record, &verified);
        let rate_limits = &self.settings.rate_limits;
        let subject = verified.qualified_subject();
        let (limited, name) = match limit {
            IdentityLimit::Certificates => (rate_limits.check_identity(&subject), "identity"),
            IdentityLimit::Api => (rate_limits.check_api_identity(&subject), "api_identity"),
        };
        if let Err(retry) = limited {
            app.metrics.count_rate_limited(name);
            return Err(self.refuse(ApiError::rate_limited(retry, "you")).await);
        }
        Ok(Admitted { gate: self, verified })
    }

    async fn refuse(self, error: ApiError) -> ApiError {
        refuse(self.app, self.record, error).await
    }
}

/// A request whose caller was authenticated: who they are, and the record
/// of the request, which any later refusal commits ([`Admitted::refuse`])
/// or the action completes.
#[derive(Debug)]
pub struct Admitted<'a> {
    gate: Gate<'a>,
    pub verified: VerifiedIdentity,
}

impl Admitted<'_> {
    /// The settings the request is decided with.
    pub fn settings(&self) -> &Arc<Settings> {
        &self.gate.settings
    }

    /// Refuse the request: recorded as every refusal is.
    pub async fn refuse(self, error: ApiError) -> ApiError {
        self.gate.refuse(error).await
    }

    /// Who asked, and the request's record, for the action to complete and
    /// commit (a certificate's, through the issuance).
    pub fn into_parts(self) -> (VerifiedIdentity, AuditRecord) {
        (self.verified, self.gate.record)
    }

    /// As [`Admitted::into_parts`], the record marked successful: the
    /// record of a privileged action, committed with it.
    pub fn into_success(self) -> (VerifiedIdentity, AuditRecord) {
        let (verified, mut record) = self.into_parts();
        record.outcome = outcome::SUCCESS.into();
        (verified, record)
    }
}

/// Who a verified token is about, in a request's record.
pub(super) fn with_identity(record: &mut AuditRecord, verified: &VerifiedIdentity) {
    record.issuer = Some(verified.issuer.clone());
    record.tenant = verified.tenant.clone();
    record.subject = Some(verified.subject.clone());
    record.username = Some(verified.username.clone());
    record.identity_verified = true;
    record.groups_evaluated = verified.groups.clone();
    record.token_id = verified.token_id.clone();
    record.token_issued_at = verified.issued_at;
}

/// For a token that failed verification: record who it *claimed* to be
/// (as its issuer reads it, already cleaned), marked unverified.
fn with_claimed_identity(record: &mut AuditRecord, claimed: Option<ClaimedIdentity>) {
    let Some(claimed) = claimed else {
        return;
    };
    record.issuer = claimed.issuer;
    record.tenant = claimed.tenant;
    record.subject = claimed.subject;
    record.username = claimed.username;
    record.token_id = claimed.token_id;
    record.identity_verified = false;
}

/// Commit a refusal, then answer with it (or 503 when it cannot be
/// recorded). Refusals of callers nobody authenticated, and rate-limited
/// ones, are aggregated per client address instead ([`crate::refusals`]):
/// only the first of each kind per window waits for its own record.
pub async fn refuse(app: &App, mut record: AuditRecord, error: ApiError) -> ApiError {
    mark_refused(&mut record, &error.error);
    if !record.identity_verified && record.roles_requested.len() > UNVERIFIED_ROLES {
        // Nobody vouched for this caller: keep a glimpse, not their list.
        let more = record.roles_requested.len() - UNVERIFIED_ROLES;
        record.roles_requested.truncate(UNVERIFIED_ROLES);
        record.roles_requested.push(format!("… {more} more"));
    }
    let settings = app.settings();
    let refusals = RefusalRecorder {
        recorder: &app.audit,
        clusters: &settings.clusters,
        metrics: &app.metrics,
    };
    if !record.identity_verified || matches!(error.error, ErrorCode::RateLimited { .. }) {
        let key = record
            .client_ip
            .as_deref()
            .and_then(|ip| ip.parse().ok())
            .map(address_key);
        if app.refusals.admit(key.as_deref(), &record) == Admission::Counted {
            refusals.count(&record, &error.error);
            return error;
        }
    }
    match refusals.record(record, &error.error).await {
        Ok(()) => error,
        Err(_) => ApiError::audit_unavailable(),
    }
}
