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
use crate::audit::{AuditRecord, event, format_micros, outcome};
use crate::certificate::{self, IssueError, LeafRequest};
use crate::identity::authenticator::AuthError;
use crate::identity::token::{TokenError, VerifiedToken, unverified_claims};
use crate::policy::{Claims, Denial};

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
    let keys_age = app.authenticator.provider().keys_age();
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
    user_agent: Option<String>,
    client_version: Option<String>,
}

fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.chars().take(256).collect())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
        .filter(|t| !t.is_empty())
}

/// The token id the replay guard claims: `uti`/`jti`, else a hash of the token.
fn token_id(verified: &VerifiedToken, token: &str) -> String {
    verified.token_id.clone().unwrap_or_else(|| {
        format!(
            "sha256:{}",
            hex::encode(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()))
        )
    })
}

impl Caller {
    fn record(&self, app: &App, event: &str, outcome: &str) -> AuditRecord {
        let mut record = AuditRecord::new(event, outcome, &self.request_id, app.clock.now());
        record.client_ip = self.client_ip.clone();
        record.user_agent = self.user_agent.clone();
        record.client_version = self.client_version.clone();
        record
    }
}

fn with_identity(record: &mut AuditRecord, verified: &VerifiedToken) {
    record.issuer = Some(verified.issuer.clone());
    record.tenant = verified.tenant.clone();
    record.subject = Some(verified.subject.clone());
    record.username = Some(verified.username.clone());
    record.identity_verified = true;
    record.groups_evaluated = verified.groups.clone();
    record.token_id = verified.token_id.clone();
    record.token_issued_at = verified.issued_at;
}

/// For a token that failed verification: record who it *claimed* to be,
/// marked unverified.
fn with_claimed_identity(record: &mut AuditRecord, token: &str) {
    let Some(claims) = unverified_claims(token) else {
        return;
    };
    let text = |name: &str| {
        claims
            .get(name)
            .and_then(Value::as_str)
            .map(|s| s.chars().take(256).collect::<String>())
    };
    record.issuer = text("iss");
    record.tenant = text("tid");
    record.subject = text("oid").or_else(|| text("sub"));
    record.username = text("preferred_username")
        .or_else(|| text("upn"))
        .or_else(|| text("email"));
    record.token_id = text("uti").or_else(|| text("jti"));
    record.identity_verified = false;
}

fn count_denied(app: &App, cluster: &str, reason: &str) {
    let labels = crate::metrics::DeniedLabels {
        cluster: cluster.to_owned(),
        reason: reason.to_owned(),
    };
    app.metrics.denied.get_or_create(&labels).inc();
}

/// Commit a denial, then answer with it (or 503 when it cannot be recorded).
async fn deny(app: &App, mut record: AuditRecord, error: ApiError) -> ApiError {
    record.reason_code = Some(error.code.to_owned());
    if record.event == event::CERTIFICATE_DENIED {
        count_denied(app, record.cluster.as_deref().unwrap_or_default(), error.code);
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

fn rate_limited(retry: Duration, who: &str) -> ApiError {
    let seconds = retry.as_secs().max(1);
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        format!("too many certificate requests from {who}; try again in {seconds} seconds"),
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
    let caller = Caller {
        client_ip: super::client_ip(&app, Some(peer), &headers).map(|ip| ip.to_string()),
        user_agent: header_text(&headers, "user-agent"),
        client_version: header_text(&headers, CLIENT_VERSION_HEADER),
        request_id: request_id.clone(),
    };
    let mut record = caller.record(&app, event::CERTIFICATE_DENIED, outcome::DENIED);
    let problem = |status, code, detail: String| ApiError::new(status, code, detail).request_id(&request_id);
    let parsed: Result<CertificateRequest, String> = serde_json::from_slice(&body).map_err(|e| e.to_string());
    if let Ok(request) = &parsed {
        record.cluster = Some(request.cluster.chars().take(64).collect());
        record.roles_requested = request
            .roles
            .iter()
            .map(|r| r.chars().take(64).collect())
            .collect();
    }

    // A flood from one address is stopped before any token work.
    if let Some(address) = &caller.client_ip
        && let Err(retry) = app.rate_limits.check_address(address)
    {
        if let Some(token) = bearer(&headers) {
            with_claimed_identity(&mut record, token);
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
            with_claimed_identity(&mut record, token);
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
            format!("no cluster `{}` here", record.cluster.clone().unwrap_or_default()),
        )
        .with("clusters", json!(known));
        return Err(deny(&app, record, error).await);
    };

    let claims = Claims {
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
        token_id: token_id(&verified, token),
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
            count_denied(&app, &cluster.name, "identity_denied");
            return Err(problem(
                StatusCode::FORBIDDEN,
                "identity_denied",
                "you are blocked from new certificates on this server (deny list); ask the platform team"
                    .into(),
            ));
        }
        Ok(Appended::Replayed(_)) => {
            count_denied(&app, &cluster.name, "token_replayed");
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
    tracing::info!(request_id = %request_id, cluster = %cluster.name, username = %verified.username,
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

/// Query parameters of `GET /v1/audit`.
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
    /// The `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<i64>,
    #[serde(default)]
    pub limit: Option<i64>,
}

fn parse_when(text: &str, now: time::OffsetDateTime) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .ok()
        .or_else(|| humantime::parse_duration(text).ok().map(|d| now - d))
}

fn is_member(list: &crate::config::GroupList, verified: &VerifiedToken) -> bool {
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
) -> Result<(VerifiedToken, AuditRecord), ApiError> {
    let caller = Caller {
        client_ip: super::client_ip(app, Some(peer), headers).map(|ip| ip.to_string()),
        user_agent: header_text(headers, "user-agent"),
        client_version: header_text(headers, CLIENT_VERSION_HEADER),
        request_id: request_id.to_owned(),
    };
    let mut record = caller.record(app, event, outcome::DENIED);
    record.details = details;
    let Some(token) = bearer(headers) else {
        let error = ApiError::new(StatusCode::UNAUTHORIZED, "token_missing", "send a bearer token")
            .request_id(request_id);
        return Err(deny(app, record, error).await);
    };
    let verified = match app.authenticator.authenticate(token, app.clock.now()).await {
        Ok(verified) => verified,
        Err(error) => {
            with_claimed_identity(&mut record, token);
            return Err(deny(
                app,
                record,
                token_error(&error, app.clock.now()).request_id(request_id),
            )
            .await);
        }
    };
    with_identity(&mut record, &verified);
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
    record.outcome = outcome::SUCCESS.into();
    Ok((verified, record))
}

async fn auditor(
    app: &App,
    peer: SocketAddr,
    request_id: &str,
    headers: &HeaderMap,
    details: Value,
) -> Result<(VerifiedToken, AuditRecord), ApiError> {
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
    let now = app.clock.now();
    let when = |text: &Option<String>, name: &str| -> Result<Option<time::OffsetDateTime>, ApiError> {
        text.as_deref()
            .map(|t| {
                parse_when(t, now).ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "request_invalid",
                        format!("`{name}` is not a time or a duration"),
                    )
                    .request_id(&request_id)
                })
            })
            .transpose()
    };
    let filter = crate::audit::store::AuditFilter {
        since: when(&query.since, "since")?,
        until: when(&query.until, "until")?,
        username: query.username.clone(),
        subject: query.subject.clone(),
        cluster: query.cluster.clone(),
        role: query.role.clone(),
        outcome: query.outcome.clone(),
        event: query.event.clone(),
        serial: query.serial.clone(),
        after_seq: query.cursor.unwrap_or(0),
        limit: query.limit.unwrap_or(100),
    };
    let details = json!({
        "action": "list",
        "filter": {
            "since": filter.since.map(format_micros), "until": filter.until.map(format_micros),
            "username": filter.username, "subject": filter.subject, "cluster": filter.cluster,
            "role": filter.role, "outcome": filter.outcome, "event": filter.event, "serial": filter.serial,
            "cursor": filter.after_seq, "limit": filter.limit,
        }
    });
    let (_, record) = auditor(&app, peer, &request_id, &headers, details).await?;
    let records = app.audit.store().query(&filter).await.map_err(|error| {
        tracing::error!(request_id = %request_id, %error, "audit query failed");
        ApiError::audit_unavailable().request_id(&request_id)
    })?;
    app.audit
        .append(Append {
            record,
            ..Default::default()
        })
        .await
        .map_err(|_| ApiError::audit_unavailable().request_id(&request_id))?;
    let full_page = records.len() as i64 >= filter.limit.clamp(1, crate::audit::store::MAX_QUERY_LIMIT);
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
    app.audit
        .append(Append {
            record,
            ..Default::default()
        })
        .await
        .map_err(|_| ApiError::audit_unavailable().request_id(&request_id))?;
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
    /// Entra oid or OIDC sub.
    #[serde(default)]
    pub subject: Option<String>,
    /// Username (matched case-insensitively).
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
            .map(|v| v.chars().take(256).collect())
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
    let (verified, record) = privileged(
        &app,
        peer,
        &request_id,
        &headers,
        Privilege::Admin,
        event::DENY_ADDED,
        details,
    )
    .await?;
    let entry = crate::audit::store::DenyEntry {
        subject,
        username,
        reason: reason.chars().take(1024).collect(),
        added_by: verified.username.clone(),
        added_at: record.occurred_at,
    };
    let appended = app
        .audit
        .append(Append {
            record,
            deny_change: Some(crate::audit::store::DenyChange::Add(entry.clone())),
            ..Default::default()
        })
        .await
        .map_err(|_| ApiError::audit_unavailable().request_id(&request_id))?;
    tracing::warn!(request_id = %request_id, by = %verified.username, "deny list entry added");
    Ok((
        StatusCode::CREATED,
        Json(json!({ "entry": entry, "audit_id": appended.stored().seq })),
    ))
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
    let (verified, record) = privileged(
        &app,
        peer,
        &request_id,
        &headers,
        Privilege::Admin,
        event::DENY_REMOVED,
        details,
    )
    .await?;
    let appended = app
        .audit
        .append(Append {
            record,
            deny_change: Some(crate::audit::store::DenyChange::Remove { subject, username }),
            ..Default::default()
        })
        .await
        .map_err(|_| ApiError::audit_unavailable().request_id(&request_id))?;
    let stored = appended.stored();
    tracing::warn!(request_id = %request_id, by = %verified.username, "deny list entry removed");
    Ok(Json(
        json!({ "removed": stored.record.details["entries_changed"], "audit_id": stored.seq }),
    ))
}
