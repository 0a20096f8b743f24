//! The caller of an endpoint: what the request says about them before any
//! check (address, user agent, client version, bearer token), their
//! authentication with the rate limits around it, and how a refusal of
//! them is recorded. Every endpoint that authenticates goes through here,
//! so each refusal is recorded the same way whichever endpoint refused it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use talos_sso_api::{CLIENT_VERSION_HEADER, ErrorCode};

use super::RequestId;
use super::error::ApiError;
use crate::app::{App, Settings};
use crate::audit::{AuditRecord, outcome, text};
use crate::identity::{ClaimedIdentity, VerifiedIdentity};
use crate::issuance::{count_refusal, record_denial};
use crate::ratelimit::address_key;
use crate::refusals::Admission;

/// Requested roles kept in the record of a caller nobody authenticated.
const UNVERIFIED_ROLES: usize = 8;

/// What is known about the caller before any check.
#[derive(Clone)]
pub struct Caller {
    pub request_id: String,
    pub client_ip: Option<String>,
    /// What the client is rate-limited under ([`address_key`]).
    pub address_key: Option<String>,
    pub user_agent: Option<String>,
    pub client_version: Option<String>,
    /// The bearer token, unverified.
    credentials: Credentials,
}

/// What the `Authorization` header holds, before any check.
#[derive(Clone)]
enum Credentials {
    /// No header, another scheme, or an empty bearer token.
    Missing,
    /// A bearer token, unverified.
    Bearer(String),
    /// A header that cannot be read one way only: sent more than once
    /// (a proxy in front may have read the other one), or a bearer token
    /// that is not ASCII text.
    Unreadable(&'static str),
}

/// Never the token: a `?caller` in a log line must not leak it.
impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("request_id", &self.request_id)
            .field("client_ip", &self.client_ip)
            .field(
                "token",
                &matches!(self.credentials, Credentials::Bearer(_)).then_some("<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

impl FromRequestParts<Arc<App>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        let request_id = parts
            .extensions
            .get::<RequestId>()
            .map(|RequestId(id)| id.clone())
            .unwrap_or_default();
        // Every connection the serve loop accepts carries its peer; without
        // it no address limit could apply, so nothing is served.
        let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>().copied() else {
            tracing::error!(request_id = %request_id, "a request without its peer address; refused");
            return Err(ApiError::internal());
        };
        let headers = &parts.headers;
        let ip = super::client_ip(app, Some(peer), headers);
        Ok(Self {
            request_id,
            client_ip: ip.map(|ip| ip.to_string()),
            address_key: ip.map(address_key),
            user_agent: header_text(headers, "user-agent"),
            client_version: header_text(headers, CLIENT_VERSION_HEADER),
            credentials: credentials(headers),
        })
    }
}

/// Which per-identity limit applies once the caller is known.
#[derive(Debug, Clone, Copy)]
pub enum IdentityLimit {
    /// Certificates per identity.
    Certificates,
    /// Audit and deny-list requests per identity.
    Api,
}

impl Caller {
    /// The record of this request's decision: `event`, denied until an
    /// action succeeds.
    pub fn record(&self, app: &App, event: &str) -> AuditRecord {
        let mut record = AuditRecord::new(event, outcome::DENIED, &self.request_id, app.clock.now());
        record.client_ip = self.client_ip.clone();
        record.user_agent = self.user_agent.clone();
        record.client_version = self.client_version.clone();
        record
    }

    /// Rate limits, then the token: who is asking, as only a token we
    /// verified ourselves says. Every refusal is recorded in `record`
    /// (with who the token *claimed* to be, marked unverified); a rate-limit
    /// refusal is also counted by limit (`talos_sso_rate_limited_total`).
    /// `settings` are the ones the request is decided with (taken once).
    pub async fn authenticate(
        &self,
        app: &App,
        settings: &Settings,
        record: &mut AuditRecord,
        limit: IdentityLimit,
    ) -> Result<VerifiedIdentity, ApiError> {
        // A flood from one address is stopped before any token work.
        if let Some(address) = &self.address_key
            && let Err(retry) = settings.rate_limits.check_address(address)
        {
            app.metrics.count_rate_limited("address");
            if let Credentials::Bearer(token) = &self.credentials {
                with_claimed_identity(record, app.authenticator.claimed(token));
            }
            return Err(deny(app, record.clone(), ApiError::rate_limited(retry, "this address")).await);
        }
        let token = match &self.credentials {
            Credentials::Bearer(token) => token,
            Credentials::Missing => {
                let error = ApiError::new(
                    ErrorCode::TokenMissing,
                    "send the identity provider's token as `Authorization: Bearer ...`",
                );
                return Err(deny(app, record.clone(), error).await);
            }
            Credentials::Unreadable(why) => {
                let error = ApiError::new(ErrorCode::TokenMalformed, *why);
                return Err(deny(app, record.clone(), error).await);
            }
        };
        let verified = match app
            .authenticator
            .authenticate(token, app.clock.now(), &settings.relevant_groups)
            .await
        {
            Ok(verified) => verified,
            Err(error) => {
                match error.verified_identity() {
                    // A valid token whose groups could not be resolved: an
                    // authenticated decision, recorded in full.
                    Some(verified) => with_identity(record, verified),
                    None => with_claimed_identity(record, app.authenticator.claimed(token)),
                }
                tracing::info!(request_id = %self.request_id, code = error.code(), "token refused");
                let error = ApiError::token(&error, app.clock.now());
                return Err(deny(app, record.clone(), error).await);
            }
        };
        with_identity(record, &verified);
        let rate_limits = &settings.rate_limits;
        let (limited, name) = match limit {
            IdentityLimit::Certificates => (
                rate_limits.check_identity(&verified.qualified_subject()),
                "identity",
            ),
            IdentityLimit::Api => (
                rate_limits.check_api_identity(&verified.qualified_subject()),
                "api_identity",
            ),
        };
        if let Err(retry) = limited {
            app.metrics.count_rate_limited(name);
            return Err(deny(app, record.clone(), ApiError::rate_limited(retry, "you")).await);
        }
        Ok(verified)
    }
}

/// A header as text for the record: bytes that are not UTF-8 kept as
/// replacement characters, then escaped and bounded.
fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .map(|v| text::clean_field(&String::from_utf8_lossy(v.as_bytes())))
}

fn credentials(headers: &HeaderMap) -> Credentials {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Credentials::Missing;
    };
    if values.next().is_some() {
        return Credentials::Unreadable("send one `Authorization` header, not several");
    }
    let bytes = value.as_bytes();
    let Some(space) = bytes.iter().position(|b| *b == b' ') else {
        return Credentials::Missing;
    };
    if !bytes[..space].eq_ignore_ascii_case(b"bearer") {
        return Credentials::Missing;
    }
    match std::str::from_utf8(&bytes[space + 1..]) {
        Ok(token) if token.is_ascii() => match token.trim() {
            "" => Credentials::Missing,
            token => Credentials::Bearer(token.to_owned()),
        },
        _ => Credentials::Unreadable("the bearer token is not ASCII text, so it is no token"),
    }
}

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
pub async fn deny(app: &App, mut record: AuditRecord, error: ApiError) -> ApiError {
    record.reason_code = Some(error.code().to_owned());
    record.outcome = outcome::DENIED.into();
    if !record.identity_verified && record.roles_requested.len() > UNVERIFIED_ROLES {
        // Nobody vouched for this caller: keep a glimpse, not their list.
        let more = record.roles_requested.len() - UNVERIFIED_ROLES;
        record.roles_requested.truncate(UNVERIFIED_ROLES);
        record.roles_requested.push(format!("… {more} more"));
    }
    if !record.identity_verified || matches!(error.error, ErrorCode::RateLimited { .. }) {
        let key = record
            .client_ip
            .as_deref()
            .and_then(|ip| ip.parse().ok())
            .map(address_key);
        if app.refusals.admit(key.as_deref(), &record) == Admission::Counted {
            count_refusal(&app.settings().clusters, &app.metrics, &record, error.code());
            return error;
        }
    }
    let settings = app.settings();
    match record_denial(&app.audit, &settings.clusters, &app.metrics, record, error.code()).await {
        Ok(()) => error,
        Err(_) => ApiError::audit_unavailable(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_in_a_log_line_shows_no_token() {
        let caller = Caller {
            request_id: "r-1".into(),
            client_ip: Some("203.0.113.7".into()),
            address_key: None,
            user_agent: None,
            client_version: None,
            credentials: Credentials::Bearer("eyJhbGciOi.secret.part".into()),
        };
        let shown = format!("{caller:?}");
        assert!(
            !shown.contains("secret") && shown.contains("<redacted>"),
            "{shown}"
        );
    }
}
