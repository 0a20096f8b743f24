//! Handlers: extract, authenticate, authorize, call the domain, record the
//! decision, answer. Every decision on `POST /v1/certificates` (issued or
//! denied, for any reason) is committed to the audit trail before the answer
//! leaves; when that is impossible the answer is 503 `audit_unavailable` and
//! nothing is issued.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};

use super::RequestId;
use super::error::ApiError;
use crate::app::App;
use crate::audit::store::{Append, Appended, TokenClaim};
use crate::audit::{AuditRecord, event, format_micros, outcome, text};
use crate::certificate::{self, IssueError, LeafRequest};
use crate::identity::authenticator::AuthError;
use crate::identity::token::TokenError;
use crate::identity::{ClaimedIdentity, VerifiedIdentity};
use crate::policy::{Claims, Denial};
use crate::ratelimit::address_key;
use crate::refusals::Admission;

/// The version of this API (`/v1`).
pub const API_VERSION: u32 = 1;

/// Header the CLI sends with its version, recorded in the audit trail.
pub const CLIENT_VERSION_HEADER: &str = "x-talos-sso-client-version";

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn not_found(Extension(RequestId(request_id)): Extension<RequestId>) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint").request_id(&request_id)
}

/// Ready when the database answers and the provider's keys are fresh.
pub async fn readyz(State(app): State<Arc<App>>) -> (StatusCode, Json<Value>) {
    let database = app.audit.store().ping().await.is_ok();
    let keys_age = app.authenticator.keys_age();
    let keys_fresh = keys_age < Duration::from_secs(24 * 3600);
    let ready = database && keys_fresh;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({
            "ready": ready,
            "database": database,
            "identity_provider_keys_fresh": keys_fresh,
            "clusters": app.clusters.len(),
        })),
    )
}

/// Prometheus metrics (OpenMetrics text).
pub async fn metrics(State(app): State<Arc<App>>) -> impl axum::response::IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.render(&app),
    )
}

pub async fn info(State(app): State<Arc<App>>) -> Json<Value> {
    let identity = &app.config.identity;
    let clusters: Vec<Value> = app
        .clusters
        .values()
        .map(|c| {
            json!({
                "name": c.name,
                "description": c.config.description,
                "default_ttl_seconds": c.config.ttl.as_secs(),
                "max_ttl_seconds": c.config.max_ttl.as_secs(),
            })
        })
        .collect();
    Json(json!({
        "server_version": env!("CARGO_PKG_VERSION"),
        "api_version": API_VERSION,
        "issuer": identity.issuer,
        "discovery_url": identity.discovery_url,
        "client_id": identity.client_id,
        "scopes": identity.scopes,
        "clusters": clusters,
    }))
}

/// `POST /v1/certificates` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateRequest {
    pub cluster: String,
    /// PEM PKCS#10 request.
    pub csr: String,
    #[serde(default)]
    pub roles: Vec<String>,
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

/// What is known about the caller for the audit record.
struct Caller {
    request_id: String,
    client_ip: Option<String>,
    /// What the client is rate-limited under ([`address_key`]).
    address_key: Option<String>,
    user_agent: Option<String>,
    client_version: Option<String>,
}

/// A header as text for the record: bytes that are not UTF-8 kept as
/// replacement characters, then escaped and bounded.
fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .map(|v| text::clean_field(&String::from_utf8_lossy(v.as_bytes())))
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
        .filter(|t| !t.is_empty())
}

impl Caller {
    fn new(app: &App, peer: SocketAddr, headers: &HeaderMap, request_id: &str) -> Self {
        let ip = super::client_ip(app, Some(peer), headers);
        Self {
            client_ip: ip.map(|ip| ip.to_string()),
            address_key: ip.map(address_key),
            user_agent: header_text(headers, "user-agent"),
            client_version: header_text(headers, CLIENT_VERSION_HEADER),
            request_id: request_id.to_owned(),
        }
    }

    fn record(&self, app: &App, event: &str, outcome: &str) -> AuditRecord {
        let mut record = AuditRecord::new(event, outcome, &self.request_id, app.clock.now());
        record.client_ip = self.client_ip.clone();
        record.user_agent = self.user_agent.clone();
        record.client_version = self.client_version.clone();
        record
    }
}

fn with_identity(record: &mut AuditRecord, verified: &VerifiedIdentity) {
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

/// Count a denial. Labels take only configured values: `cluster` is a
/// configured cluster's name (the record holds nothing else there) or
/// `unknown`, `reason` one of the server's own codes.
fn count_denied(app: &App, cluster: Option<&str>, reason: &'static str) {
    let cluster = cluster
        .filter(|c| app.clusters.contains_key(*c))
        .unwrap_or("unknown");
    let labels = crate::metrics::DeniedLabels {
        cluster: cluster.to_owned(),
        reason: reason.to_owned(),
    };
    app.metrics.denied.get_or_create(&labels).inc();
}

/// Commit a denial, then answer with it (or 503 when it cannot be recorded).
/// Refusals of callers nobody authenticated, and rate-limited ones, are
/// aggregated per client address instead ([`crate::refusals`]): only the
/// first of each kind per window waits for its own record.
async fn deny(app: &App, mut record: AuditRecord, error: ApiError) -> ApiError {
    record.reason_code = Some(error.code.to_owned());
    record.outcome = outcome::DENIED.into();
    if record.event == event::CERTIFICATE_DENIED {
        count_denied(app, record.cluster.as_deref(), error.code);
    }
    if !record.identity_verified && record.roles_requested.len() > UNVERIFIED_ROLES {
        // Nobody vouched for this caller: keep a glimpse, not their list.
        let more = record.roles_requested.len() - UNVERIFIED_ROLES;
        record.roles_requested.truncate(UNVERIFIED_ROLES);
        record.roles_requested.push(format!("… {more} more"));
    }
    if !record.identity_verified || error.code == RATE_LIMITED {
        let key = record
            .client_ip
            .as_deref()
            .and_then(|ip| ip.parse().ok())
            .map(address_key);
        if app.refusals.admit(key.as_deref(), &record) == Admission::Counted {
            return error;
        }
    }
    match app
        .audit
        .append(Append {
            record,
            ..Default::default()
        })
        .await
    {
        Ok(_) => error,
        Err(_) => ApiError::audit_unavailable().request_id(&error.request_id),
    }
}

fn token_error(error: &AuthError, now: time::OffsetDateTime) -> ApiError {
    match error {
        AuthError::OverageUnresolved(_) => {
            ApiError::new(StatusCode::FORBIDDEN, error.code(), error.to_string())
        }
        AuthError::Token(token_error) => {
            let api = ApiError::new(StatusCode::UNAUTHORIZED, error.code(), error.to_string());
            match token_error {
                // Let the client tell a clock problem from a stale token.
                TokenError::Expired | TokenError::NotYetValid | TokenError::IssuedInFuture => {
                    api.with("server_time", json!(format_micros(now)))
                }
                _ => api,
            }
        }
    }
}

const RATE_LIMITED: &str = "rate_limited";

/// Requested roles kept in the record of a caller nobody authenticated.
const UNVERIFIED_ROLES: usize = 8;

fn rate_limited(retry: Duration, who: &str) -> ApiError {
    let seconds = retry.as_secs().max(1);
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        RATE_LIMITED,
        format!("too many requests from {who}; try again in {seconds} seconds"),
    )
    .with("retry_after_seconds", json!(seconds))
}

fn policy_error(denial: &Denial) -> ApiError {
    let api = ApiError::new(StatusCode::FORBIDDEN, denial.code(), denial.to_string());
    match denial {
        Denial::NoMatchingRule { would_grant } => api.with("would_grant", json!(would_grant)),
        Denial::RoleNotPermitted { requested, entitled } => api
            .with("refused", json!(requested))
            .with("entitled", json!(entitled)),
        Denial::RoleRequired { entitled } => api.with("entitled", json!(entitled)),
    }
}

pub async fn certificates(
    state: State<Arc<App>>,
    connect: ConnectInfo<SocketAddr>,
    request_id: Extension<RequestId>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let started = std::time::Instant::now();
    let app = state.0.clone();
    let answer = issue_certificate(state, connect, request_id, headers, body).await;
    app.metrics
        .issuance_seconds
        .observe(started.elapsed().as_secs_f64());
    answer
}

async fn issue_certificate(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = Caller::new(&app, peer, &headers, &request_id);
    let mut record = caller.record(&app, event::CERTIFICATE_DENIED, outcome::DENIED);
    let problem = |status, code, detail: String| ApiError::new(status, code, detail).request_id(&request_id);
    let parsed: Result<CertificateRequest, String> = serde_json::from_slice(&body).map_err(|e| e.to_string());
    if let Ok(request) = &parsed {
        // Only a configured name goes in `cluster` (and into metric labels);
        // anything else is kept, escaped, as what it is: a name asked for.
        if app.clusters.contains_key(&request.cluster) {
            record.cluster = Some(request.cluster.clone());
        } else {
            record.details = json!({ "requested_cluster": text::clean(&request.cluster, 64) });
        }
        record.roles_requested = request.roles.clone();
    }

    // A flood from one address is stopped before any token work.
    if let Some(address) = &caller.address_key
        && let Err(retry) = app.rate_limits.check_address(address)
    {
        if let Some(token) = bearer(&headers) {
            with_claimed_identity(&mut record, app.authenticator.claimed(token));
        }
        return Err(deny(
            &app,
            record,
            rate_limited(retry, "this address").request_id(&request_id),
        )
        .await);
    }

    // Who is asking: only a token we verified ourselves says so.
    let Some(token) = bearer(&headers) else {
        let error = problem(
            StatusCode::UNAUTHORIZED,
            "token_missing",
            "send the identity provider's token as `Authorization: Bearer ...`".into(),
        );
        return Err(deny(&app, record, error).await);
    };
    let verified = match app.authenticator.authenticate(token, app.clock.now()).await {
        Ok(verified) => verified,
        Err(error) => {
            with_claimed_identity(&mut record, app.authenticator.claimed(token));
            tracing::info!(request_id = %request_id, code = error.code(), "token refused");
            return Err(deny(
                &app,
                record,
                token_error(&error, app.clock.now()).request_id(&request_id),
            )
            .await);
        }
    };
    with_identity(&mut record, &verified);
    if let Err(retry) = app.rate_limits.check_identity(&verified.subject) {
        return Err(deny(&app, record, rate_limited(retry, "you").request_id(&request_id)).await);
    }

    let request = match parsed {
        Ok(request) => request,
        Err(reason) => {
            let error = problem(
                StatusCode::BAD_REQUEST,
                "request_invalid",
                format!("the request body is not a certificate request: {reason}"),
            );
            return Err(deny(&app, record, error).await);
        }
    };
    let Some(cluster) = app.clusters.get(&request.cluster) else {
        let known: Vec<&String> = app.clusters.keys().collect();
        let error = problem(
            StatusCode::NOT_FOUND,
            "cluster_unknown",
            format!("no cluster `{}` here", text::clean(&request.cluster, 64)),
        )
        .with("clusters", json!(known));
        return Err(deny(&app, record, error).await);
    };

    let claims = Claims {
        tenant: verified.tenant.clone(),
        subject: verified.subject.clone(),
        username: verified.username.clone(),
        groups: verified.groups.clone(),
        app_roles: verified.app_roles.clone(),
        raw: verified.claims.clone(),
    };
    let decision = match cluster.policy.decide(&claims, &request.roles) {
        Ok(decision) => decision,
        Err(denial) => return Err(deny(&app, record, policy_error(&denial).request_id(&request_id)).await),
    };

    let ttl = match request.ttl_seconds {
        None => cluster.config.ttl,
        Some(0) => {
            let error = problem(
                StatusCode::BAD_REQUEST,
                "ttl_invalid",
                "ttl_seconds must be at least 1".into(),
            );
            return Err(deny(&app, record, error).await);
        }
        Some(seconds) if Duration::from_secs(seconds) > cluster.config.max_ttl => {
            let max = cluster.config.max_ttl.as_secs();
            let error = problem(
                StatusCode::BAD_REQUEST,
                "ttl_too_long",
                format!("at most {max} seconds on cluster `{}`", cluster.name),
            )
            .with("max_ttl_seconds", json!(max));
            return Err(deny(&app, record, error).await);
        }
        Some(seconds) => Duration::from_secs(seconds),
    };

    let now = app.clock.now();
    let leaf = LeafRequest {
        csr: request.csr.as_bytes(),
        username: &verified.username,
        roles: &decision.granted,
        ttl,
        clock_skew: cluster.config.clock_skew,
    };
    let issued = match certificate::issue(&cluster.ca, &leaf, now) {
        Ok(issued) => issued,
        Err(IssueError::Csr(csr)) => {
            let error = problem(StatusCode::BAD_REQUEST, "csr_invalid", csr.to_string())
                .with("reason", json!(csr.reason()));
            return Err(deny(&app, record, error).await);
        }
        Err(other) => {
            tracing::error!(request_id = %request_id, cluster = %cluster.name, error = %other, "signing failed");
            let error = ApiError::internal().request_id(&request_id);
            return Err(deny(&app, record, error).await);
        }
    };

    record.event = event::CERTIFICATE_ISSUED.into();
    record.outcome = outcome::SUCCESS.into();
    record.set_certificate(&issued);
    let claim = TokenClaim {
        token_id: verified.replay_key(),
        expires_at: Some(verified.expires_at),
    };
    let stored = match app
        .audit
        .append(Append {
            record,
            claim: Some(claim),
            deny_check: true,
            deny_change: None,
        })
        .await
    {
        Ok(Appended::Recorded(stored)) => stored,
        Ok(Appended::Denied(_)) => {
            count_denied(&app, Some(&cluster.name), "identity_denied");
            return Err(problem(
                StatusCode::FORBIDDEN,
                "identity_denied",
                "you are blocked from new certificates on this server (deny list); ask the platform team"
                    .into(),
            ));
        }
        Ok(Appended::Replayed(_)) => {
            count_denied(&app, Some(&cluster.name), "token_replayed");
            return Err(problem(
                StatusCode::UNAUTHORIZED,
                "token_replayed",
                "this token was already used for a certificate; log in again for a new one".into(),
            ));
        }
        Err(_) => return Err(ApiError::audit_unavailable().request_id(&request_id)),
    };
    for role in &issued.roles {
        let labels = crate::metrics::IssuedLabels {
            cluster: cluster.name.clone(),
            role: role.clone(),
        };
        app.metrics.issued.get_or_create(&labels).inc();
    }
    tracing::info!(request_id = %request_id, cluster = %cluster.name, username = %text::clean_field(&verified.username),
        roles = ?issued.roles, serial = %issued.serial_hex, audit_seq = stored.seq, "certificate issued");

    Ok((
        StatusCode::CREATED,
        Json(json!({
            "certificate": issued.chain_pem,
            "ca": cluster.ca.trust_bundle_pem(),
            "endpoints": cluster.config.endpoints,
            "nodes": cluster.config.nodes,
            "cluster": cluster.name,
            "context": cluster.context_name(),
            "roles": issued.roles,
            "identity": {
                "issuer": verified.issuer,
                "tenant": verified.tenant,
                "subject": verified.subject,
                "username": verified.username,
            },
            "serial": issued.serial_hex,
            "not_before": format_micros(issued.not_before),
            "not_after": format_micros(issued.not_after),
            "audit_id": stored.seq,
        })),
    ))
}

type QueryParams<T> = Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>;

/// Query parameters, or a 400 `request_invalid` saying what is wrong with them.
fn query_or_400<T>(query: QueryParams<T>, request_id: &str) -> Result<T, ApiError> {
    query.map(|q| q.0).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "request_invalid", e.body_text()).request_id(request_id)
    })
}

/// Query parameters of `GET /v1/audit`, as sent: each is checked (and a
/// bad one refused with the parameter named) once the caller is known to be
/// an auditor.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// RFC 3339 time, or a duration back from now (`7d`, `12h`).
    #[serde(default)]
    pub since: Option<String>,
    #[serde(default)]
    pub until: Option<String>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub cluster: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub outcome: Option<String>,
    #[serde(default)]
    pub event: Option<String>,
    #[serde(default)]
    pub serial: Option<String>,
    /// The `next_cursor` of the previous page (a sequence number, 0 or more).
    #[serde(default)]
    pub cursor: Option<String>,
    /// Records per page, 1 to `MAX_QUERY_LIMIT`.
    #[serde(default)]
    pub limit: Option<String>,
}

/// Why a query parameter was refused: `(parameter, what is wrong)`.
type ParamError = (&'static str, String);

/// An RFC 3339 time, or a duration back from `now`; `None` when it is
/// neither or falls outside the times this server can represent.
pub fn parse_when(text: &str, now: time::OffsetDateTime) -> Option<time::OffsetDateTime> {
    if let Ok(t) = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339) {
        return Some(t);
    }
    let back = humantime::parse_duration(text).ok()?;
    now.checked_sub(time::Duration::try_from(back).ok()?)
}

fn bounded_int(name: &'static str, text: &str, min: i64, max: i64) -> Result<i64, ParamError> {
    let value: i64 = text.trim().parse().map_err(|_| {
        (
            name,
            format!("`{name}` must be a whole number from {min} to {max}"),
        )
    })?;
    if !(min..=max).contains(&value) {
        return Err((name, format!("`{name}` must be from {min} to {max}")));
    }
    Ok(value)
}

impl AuditQuery {
    /// The store filter these parameters ask for. Text values are cleaned
    /// exactly as stored records are, so a filter matches what was kept.
    pub fn filter(&self, now: time::OffsetDateTime) -> Result<crate::audit::store::AuditFilter, ParamError> {
        use crate::audit::store::MAX_QUERY_LIMIT;
        let when = |text: &Option<String>, name: &'static str| {
            text.as_deref()
                .map(|t| {
                    parse_when(t, now).ok_or((
                        name,
                        format!("`{name}` is not an RFC 3339 time or a duration back from now within range"),
                    ))
                })
                .transpose()
        };
        let clean = |v: &Option<String>| v.as_deref().map(text::clean_field);
        // A misspelt outcome or event would match nothing and look like an
        // empty trail: name the values instead.
        let one_of = |v: &Option<String>, name: &'static str, known: &[&str]| match v.as_deref() {
            Some(value) if !known.contains(&value) => {
                Err((name, format!("`{name}` must be one of: {}", known.join(", "))))
            }
            _ => Ok(()),
        };
        one_of(&self.outcome, "outcome", &crate::audit::outcome::ALL)?;
        one_of(&self.event, "event", &crate::audit::event::ALL)?;
        Ok(crate::audit::store::AuditFilter {
            since: when(&self.since, "since")?,
            until: when(&self.until, "until")?,
            username: clean(&self.username),
            subject: clean(&self.subject),
            cluster: clean(&self.cluster),
            role: clean(&self.role),
            outcome: clean(&self.outcome),
            event: clean(&self.event),
            serial: clean(&self.serial),
            after_seq: match &self.cursor {
                Some(c) => bounded_int("cursor", c, 0, i64::MAX)?,
                None => 0,
            },
            limit: match &self.limit {
                Some(l) => bounded_int("limit", l, 1, MAX_QUERY_LIMIT)?,
                None => 100,
            },
        })
    }

    /// The parameters as recorded in the `audit.query` record, each
    /// bounded like any other field (the caller may not be an auditor).
    fn details(&self) -> Value {
        let field = |v: &Option<String>| v.as_deref().map(text::clean_field);
        json!({
            "since": field(&self.since), "until": field(&self.until), "username": field(&self.username),
            "subject": field(&self.subject), "cluster": field(&self.cluster), "role": field(&self.role),
            "outcome": field(&self.outcome), "event": field(&self.event), "serial": field(&self.serial),
            "cursor": field(&self.cursor), "limit": field(&self.limit),
        })
    }
}

fn is_member(list: &crate::config::GroupList, verified: &VerifiedIdentity) -> bool {
    list.groups
        .iter()
        .any(|g| verified.groups.iter().any(|have| have.eq_ignore_ascii_case(g)))
        || list.app_roles.iter().any(|r| verified.app_roles.contains(r))
}

/// Who may do what beyond asking for a certificate.
#[derive(Debug, Clone, Copy)]
enum Privilege {
    Auditor,
    Admin,
}

/// Authenticate a caller and check `privilege`; every refusal is recorded.
/// On success, the returned record (event `event`, outcome success) is
/// ready to be appended with the action.
async fn privileged(
    app: &App,
    peer: SocketAddr,
    request_id: &str,
    headers: &HeaderMap,
    privilege: Privilege,
    event: &str,
    details: Value,
) -> Result<(VerifiedIdentity, AuditRecord), ApiError> {
    let caller = Caller::new(app, peer, headers, request_id);
    let mut record = caller.record(app, event, outcome::DENIED);
    record.details = details;
    if let Some(address) = &caller.address_key
        && let Err(retry) = app.rate_limits.check_address(address)
    {
        let error = rate_limited(retry, "this address").request_id(request_id);
        return Err(deny(app, record, error).await);
    }
    let Some(token) = bearer(headers) else {
        let error = ApiError::new(StatusCode::UNAUTHORIZED, "token_missing", "send a bearer token")
            .request_id(request_id);
        return Err(deny(app, record, error).await);
    };
    let verified = match app.authenticator.authenticate(token, app.clock.now()).await {
        Ok(verified) => verified,
        Err(error) => {
            with_claimed_identity(&mut record, app.authenticator.claimed(token));
            return Err(deny(
                app,
                record,
                token_error(&error, app.clock.now()).request_id(request_id),
            )
            .await);
        }
    };
    with_identity(&mut record, &verified);
    if let Err(retry) = app.rate_limits.check_api_identity(&verified.subject) {
        return Err(deny(app, record, rate_limited(retry, "you").request_id(request_id)).await);
    }
    let (list, code, message) = match privilege {
        Privilege::Auditor => (
            &app.config.auditors,
            "not_an_auditor",
            "reading the audit trail needs membership in one of the `auditors` groups or app roles",
        ),
        Privilege::Admin => (
            &app.config.admins,
            "not_an_admin",
            "changing the deny list needs membership in one of the `admins` groups or app roles",
        ),
    };
    if !is_member(list, &verified) {
        let error = ApiError::new(StatusCode::FORBIDDEN, code, message).request_id(request_id);
        return Err(deny(app, record, error).await);
    }
    // A deny-listed auditor or admin is out too. Checked here so that they
    // get no answer computed for them, and again in the transaction that
    // commits the action ([`commit_privileged`]), so no change slips between.
    match app
        .audit
        .store()
        .is_denied(&verified.subject, &verified.username)
        .await
    {
        Ok(false) => {}
        Ok(true) => return Err(deny(app, record, identity_denied(request_id)).await),
        Err(_) => return Err(ApiError::audit_unavailable().request_id(request_id)),
    }
    record.outcome = outcome::SUCCESS.into();
    Ok((verified, record))
}

fn identity_denied(request_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "identity_denied",
        "you are blocked on this server (deny list); ask the platform team",
    )
    .request_id(request_id)
}

/// Commit the record of a privileged action, with its deny-list change, in
/// one transaction that also checks the caller is not on the deny list:
/// refused there, neither the change nor the answer happens.
async fn commit_privileged(
    app: &App,
    record: AuditRecord,
    deny_change: Option<crate::audit::store::DenyChange>,
    request_id: &str,
) -> Result<crate::audit::StoredRecord, ApiError> {
    let appended = app
        .audit
        .append(Append {
            record,
            claim: None,
            deny_check: true,
            deny_change,
        })
        .await;
    match appended {
        Ok(Appended::Recorded(stored)) => Ok(stored),
        Ok(Appended::Denied(_)) => Err(identity_denied(request_id)),
        Ok(Appended::Replayed(_)) | Err(_) => Err(ApiError::audit_unavailable().request_id(request_id)),
    }
}

async fn auditor(
    app: &App,
    peer: SocketAddr,
    request_id: &str,
    headers: &HeaderMap,
    details: Value,
) -> Result<(VerifiedIdentity, AuditRecord), ApiError> {
    privileged(
        app,
        peer,
        request_id,
        headers,
        Privilege::Auditor,
        event::AUDIT_QUERY,
        details,
    )
    .await
}

/// `GET /v1/audit`: records matching the filters, oldest first, a page at a
/// time. The query itself is recorded (`audit.query`) before the answer.
pub async fn audit_list(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
    query: QueryParams<AuditQuery>,
) -> Result<Json<Value>, ApiError> {
    let query = query_or_400(query, &request_id)?;
    let details = json!({"action": "list", "filter": query.details()});
    let (_, record) = auditor(&app, peer, &request_id, &headers, details).await?;
    let filter = match query.filter(app.clock.now()) {
        Ok(filter) => filter,
        Err((parameter, detail)) => {
            let error = ApiError::new(StatusCode::BAD_REQUEST, "request_invalid", detail)
                .with("parameter", json!(parameter))
                .request_id(&request_id);
            return Err(deny(&app, record, error).await);
        }
    };
    let records = app.audit.store().query(&filter).await.map_err(|error| {
        tracing::error!(request_id = %request_id, %error, "audit query failed");
        ApiError::audit_unavailable().request_id(&request_id)
    })?;
    commit_privileged(&app, record, None, &request_id).await?;
    let full_page = records.len() as i64 >= filter.limit;
    let next_cursor = if full_page {
        records.last().map(|r| r.seq)
    } else {
        None
    };
    Ok(Json(json!({ "records": records, "next_cursor": next_cursor })))
}

/// `GET /v1/audit/verify`: recompute the hash chain.
pub async fn audit_verify(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let (_, record) = auditor(&app, peer, &request_id, &headers, json!({"action": "verify"})).await?;
    commit_privileged(&app, record, None, &request_id).await?;
    let check = app.audit.store().verify_chain().await.map_err(|error| {
        tracing::error!(request_id = %request_id, %error, "audit verify failed");
        ApiError::audit_unavailable().request_id(&request_id)
    })?;
    Ok(Json(json!({
        "intact": check.first_broken.is_none(),
        "verified": check.verified,
        "last_seq": check.last_seq,
        "first_broken": check.first_broken.map(|b| json!({"seq": b.seq, "reason": b.reason})),
    })))
}

/// `POST /v1/deny` body; `DELETE /v1/deny` query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenyRequest {
    /// Entra oid or OIDC sub: what an entry blocks (required when adding).
    #[serde(default)]
    pub subject: Option<String>,
    /// Username, kept with the entry for people to read; it blocks nothing,
    /// because its owner can change it. Removing by username removes
    /// entries that were added with a username only.
    #[serde(default)]
    pub username: Option<String>,
    /// Why (required when adding; recorded).
    #[serde(default)]
    pub reason: Option<String>,
}

fn deny_target(
    request: &DenyRequest,
    request_id: &str,
) -> Result<(Option<String>, Option<String>), ApiError> {
    let clean = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(text::clean_field)
    };
    let (subject, username): (Option<String>, Option<String>) =
        (clean(&request.subject), clean(&request.username));
    if subject.is_none() && username.is_none() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "request_invalid",
            "name a `subject` or a `username`",
        )
        .request_id(request_id));
    }
    Ok((subject, username.map(|u| u.to_lowercase())))
}

/// `GET /v1/deny` (admins).
pub async fn deny_list(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    // Only a refusal is recorded: reading the list changes nothing.
    privileged(
        &app,
        peer,
        &request_id,
        &headers,
        Privilege::Admin,
        event::DENY_LISTED,
        json!({}),
    )
    .await?;
    let entries = app
        .audit
        .store()
        .deny_list()
        .await
        .map_err(|_| ApiError::audit_unavailable().request_id(&request_id))?;
    Ok(Json(json!({ "entries": entries })))
}

/// `POST /v1/deny`: block an identity from new certificates, at once.
pub async fn deny_add(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let request: DenyRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "request_invalid",
            format!("not a deny request: {e}"),
        )
        .request_id(&request_id)
    })?;
    let (subject, username) = deny_target(&request, &request_id)?;
    let reason = request
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "request_invalid",
                "a `reason` is required",
            )
            .request_id(&request_id)
        })?;
    let details = json!({"target_subject": subject, "target_username": username, "reason": reason});
    let (verified, mut record) = privileged(
        &app,
        peer,
        &request_id,
        &headers,
        Privilege::Admin,
        event::DENY_ADDED,
        details,
    )
    .await?;
    let subject = match (subject, &username) {
        (Some(subject), _) => subject,
        (None, Some(username)) => match subject_of(&app, username, &request_id).await {
            Ok(subject) => subject,
            Err(error) => return Err(deny(&app, record, error).await),
        },
        (None, None) => return Err(ApiError::internal().request_id(&request_id)),
    };
    if let Value::Object(details) = &mut record.details {
        details.insert("target_subject".into(), json!(subject));
    }
    let subject = Some(subject);
    let entry = crate::audit::store::DenyEntry {
        subject,
        username,
        reason: text::clean(reason, text::REASON_CHARS),
        added_by: verified.username.clone(),
        added_at: record.occurred_at,
    };
    let change = crate::audit::store::DenyChange::Add(entry.clone());
    let stored = commit_privileged(&app, record, Some(change), &request_id).await?;
    if stored.record.details["entries_changed"] == 0 {
        // Recorded as tried; nothing changed, and the caller must know.
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_denied",
            "this subject is already on the deny list; nothing was changed",
        )
        .with("audit_id", json!(stored.seq))
        .request_id(&request_id));
    }
    tracing::warn!(request_id = %request_id, by = %text::clean_field(&verified.username), "deny list entry added");
    Ok((
        StatusCode::CREATED,
        Json(json!({ "entry": entry, "audit_id": stored.seq })),
    ))
}

/// The one subject that verified records name with `username`. A deny
/// entry blocks a subject, never a username (its owner can change it), so
/// a username is resolved once, here, or refused when that is not certain.
async fn subject_of(app: &App, username: &str, request_id: &str) -> Result<String, ApiError> {
    let subjects = app
        .audit
        .store()
        .subjects_of(username, 10)
        .await
        .map_err(|_| ApiError::audit_unavailable().request_id(request_id))?;
    match subjects.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "subject_required",
            format!(
                "no verified record names `{username}`, so its subject is unknown; name the `subject` to block \
                 (Entra object id, or the provider's `sub`): a username can be changed by its owner, so it \
                 cannot block anyone"
            ),
        )
        .request_id(request_id)),
        several => Err(ApiError::new(
            StatusCode::CONFLICT,
            "subject_ambiguous",
            format!(
                "`{username}` has been used by {} different subjects; name the `subject` to block",
                several.len()
            ),
        )
        .with("subjects", json!(several))
        .request_id(request_id)),
    }
}

/// `DELETE /v1/deny?subject=...` or `?username=...`.
pub async fn deny_remove(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
    query: QueryParams<DenyRequest>,
) -> Result<Json<Value>, ApiError> {
    let request = query_or_400(query, &request_id)?;
    let (subject, username) = deny_target(&request, &request_id)?;
    let details = json!({"target_subject": subject, "target_username": username});
    let (verified, mut record) = privileged(
        &app,
        peer,
        &request_id,
        &headers,
        Privilege::Admin,
        event::DENY_REMOVED,
        details,
    )
    .await?;
    // A username names the subject verified records tie it to (entries
    // block subjects), and entries added with that username alone.
    let subject = match (subject, &username) {
        (Some(subject), _) => Some(subject),
        (None, Some(name)) => match subject_of(&app, name, &request_id).await {
            Ok(subject) => Some(subject),
            Err(error) if error.code == "subject_required" => None,
            Err(error) => return Err(deny(&app, record, error).await),
        },
        (None, None) => None,
    };
    if let (Value::Object(details), Some(subject)) = (&mut record.details, &subject) {
        details.insert("target_subject".into(), json!(subject));
    }
    let change = crate::audit::store::DenyChange::Remove { subject, username };
    let stored = commit_privileged(&app, record, Some(change), &request_id).await?;
    tracing::warn!(request_id = %request_id, by = %text::clean_field(&verified.username), "deny list entry removed");
    Ok(Json(
        json!({ "removed": stored.record.details["entries_changed"], "audit_id": stored.seq }),
    ))
}
