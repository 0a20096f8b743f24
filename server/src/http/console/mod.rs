//! The security team's console at `/ui` (docs/console.md): server-rendered
//! HTML (maud escapes every value), one stylesheet built into the binary,
//! no script. What it owns:
//!
//! - `session`: sessions and logins in progress, kept in the trail's
//!   database (any replica serves any request), their cookies, CSRF
//!   tokens; `kept`, what a session keeps of the person;
//! - `login`: the authorization code flow with PKCE against the login
//!   identity provider, the ID token verified as the API verifies tokens;
//! - `page`: the layout, the security headers, the pages that explain a
//!   refusal;
//! - `views`: the trail, a record, who held a role, a person, the chain,
//!   the charts, exports (streamed page by page, bounded in time and
//!   number), the deny list; one file each.
//!
//! Only members of `auditors` or `admins` get a session. Who sees what is
//! decided at every request, from the groups of the ID token of the login
//! (kept until the session ends) under the live configuration, with the
//! API's rules: `auditors` read the trail, `admins` also change the deny
//! list; the deny list applies at once. Every view that reads records is
//! itself recorded (`audit.query`), once per session and filter.

pub mod kept;
pub mod login;
pub mod page;
pub mod session;
pub mod views;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde_json::Value;

use super::caller::Caller;
use super::error::ApiError;
use super::gate::{refuse, with_identity};
use super::privileged::{commit, is_member};
use crate::app::App;
use crate::audit::{event, outcome};
use crate::config::GroupList;
use crate::policy::AppRoleSelector;
use session::{SESSION_COOKIE, Session, Sessions, cookie};
use zeroize::Zeroizing;

/// What the console needs beyond the app: its sessions and its client.
pub struct Console {
    pub sessions: Sessions,
    pub client_id: String,
    /// Never printed (see the `Debug` below), wiped from memory when
    /// dropped.
    pub client_secret: Option<Zeroizing<String>>,
    pub redirect_uri: String,
    /// `scheme://host[:port]` of `console.public_url`: what a form's
    /// `Origin` must be.
    pub origin: String,
    pub lifetime: Duration,
    http: reqwest::Client,
    /// Exports running, in all and per person.
    pub exports: Arc<crate::slots::Slots>,
    /// How long an export may take to reach its client.
    pub export_timeout: Duration,
    /// The charts' counts of buckets that have ended.
    charts: views::ChartCache,
}

impl Console {
    /// The console `config` describes; `None` when it is not enabled.
    pub fn new(config: &crate::config::Config) -> Result<Option<Self>, String> {
        let console = &config.console;
        if !console.enabled {
            return Ok(None);
        }
        let redirect_uri = console
            .redirect_uri()
            .ok_or("console.public_url is required when the console is enabled")?;
        let public = url::Url::parse(console.public_url.as_deref().unwrap_or_default())
            .map_err(|e| format!("console.public_url: {e}"))?;
        let client_secret = match &console.client_secret_file {
            Some(path) => {
                let where_ = format!("console.client_secret_file {}", path.display());
                match crate::secret_file::check(path).map_err(|e| format!("{where_}: {e}"))? {
                    Ok(()) => {}
                    Err(open) => {
                        return Err(format!(
                            "{where_} is readable by others (mode {:o}); chmod 600 it",
                            open.mode
                        ));
                    }
                }
                let text =
                    Zeroizing::new(std::fs::read_to_string(path).map_err(|e| format!("{where_}: {e}"))?);
                Some(Zeroizing::new(text.trim().to_owned()))
            }
            None => None,
        };
        let roots = match &config.identity.ca_file {
            Some(path) => crate::identity::provider::extra_roots(path)?,
            None => Vec::new(),
        };
        let http = crate::identity::provider::with_roots(reqwest::Client::builder(), &roots)
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("console HTTP client: {e}"))?;
        Ok(Some(Self {
            sessions: Sessions::new(
                console.max_sessions,
                console.session_idle,
                console.session_lifetime,
            ),
            client_id: console
                .client_id
                .clone()
                .unwrap_or_else(|| config.identity.client_id.clone()),
            client_secret,
            redirect_uri,
            origin: public.origin().ascii_serialization(),
            lifetime: console.session_lifetime,
            http,
            exports: crate::slots::Slots::new(console.max_exports, console.max_exports_per_person),
            export_timeout: console.export_timeout,
            charts: views::ChartCache::default(),
        }))
    }
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("sessions", &self.sessions)
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("redirect_uri", &self.redirect_uri)
            .field("origin", &self.origin)
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

/// How long a finished verification of the chain answers the chain page:
/// a full verification reads the whole trail, so pages (or another site's
/// links) cannot keep one running without end. "Verify again" (a form,
/// with its CSRF token) starts a new one.
pub const REVERIFY_AFTER: Duration = Duration::from_secs(5 * 60);

/// How long the chain page waits for a verification before it says that
/// one is running.
pub const VERIFY_WAIT: Duration = Duration::from_secs(5);

/// The console's routes, under `/ui`.
pub fn router(app: Arc<App>, console: Arc<Console>) -> Router<Arc<App>> {
    Router::new()
        .route("/ui", get(views::trail))
        .route("/ui/records/{seq}", get(views::record))
        .route("/ui/held", get(views::held))
        .route("/ui/person", get(views::person))
        .route("/ui/chain", get(views::chain).post(views::verify_again))
        .route("/ui/charts", get(views::charts))
        .route("/ui/export", get(views::export))
        .route("/ui/deny", get(views::deny_list).post(views::deny_add))
        .route("/ui/deny/remove", post(views::deny_remove))
        .route("/ui/login", get(login::login))
        .route(login::CALLBACK_PATH, get(login::callback))
        .route("/ui/logout", post(login::logout))
        .route("/ui/signed-out", get(page::signed_out))
        .route(page::STYLESHEET_PATH, get(page::stylesheet))
        .route("/ui/{*rest}", any(page::not_found))
        .layer(axum::middleware::from_fn(fetched_here_only))
        .layer(axum::middleware::from_fn_with_state(app, address_limit))
        .layer(axum::Extension(console))
}

/// Every console request counts against its client address's quota, the
/// API's (`rate_limits.per_address_per_minute`): a flood of logins started
/// (anyone can start one) or of views stops here, before any work.
async fn address_limit(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let caller = match Caller::from_request_parts(&mut parts, &app).await {
        Ok(caller) => caller,
        Err(error) => return error.into_response(),
    };
    if let Some(address) = &caller.address_key
        && let Err(retry) = app.settings().rate_limits.check_address(address)
    {
        app.metrics.count_rate_limited("address");
        let mut record = caller.record(&app, event::AUDIT_QUERY);
        record.details = serde_json::json!({"via": "console", "view": parts.uri.path()});
        return refuse_rate(&app, record, retry, "this address").await;
    }
    next.run(Request::from_parts(parts, body)).await
}

/// A rate-limit refusal, recorded as the API records its own (aggregated
/// per address), answered with the console's page.
async fn refuse_rate(app: &App, record: crate::audit::AuditRecord, retry: Duration, who: &str) -> Response {
    let error = refuse(app, record, ApiError::rate_limited(retry, who)).await;
    if error.error == talos_sso_api::ErrorCode::AuditUnavailable {
        return page::unavailable();
    }
    page::rate_limited(retry)
}

/// The Content-Security-Policy of every console answer: nothing but this
/// server's stylesheet and inline data images; no script at all.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// HSTS when the console is served over https: a year.
const STRICT_TRANSPORT_SECURITY: &str = "max-age=31536000";

/// The console's headers on every answer under `/ui`, whoever made it
/// (a view, or the server's outer layers: a 405, a 413, a timeout). The
/// outermost layer of the server's router.
pub async fn security_headers(State(console): State<Arc<Console>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let under_ui = path == "/ui" || path.starts_with("/ui/");
    let mut response = next.run(request).await;
    if !under_ui {
        return response;
    }
    let headers = response.headers_mut();
    if console.origin.starts_with("https://") {
        headers.insert(
            header::STRICT_TRANSPORT_SECURITY,
            axum::http::HeaderValue::from_static(STRICT_TRANSPORT_SECURITY),
        );
    }
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, axum::http::HeaderValue::from_static(value));
    }
    headers.insert(
        "cross-origin-opener-policy",
        axum::http::HeaderValue::from_static("same-origin"),
    );
    response
}

/// A 303 to `location`.
pub fn redirect(location: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, location.to_owned())]).into_response()
}

/// Who may see a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Auditor,
    Admin,
}

/// The person looking, as their session says, with what they may do now.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub session_id: String,
    pub session: Session,
    /// What they may see now: the navigation shows only that.
    pub auditor: bool,
    pub admin: bool,
    pub caller: Caller,
}

impl Viewer {
    /// The record of this viewer's request for `event`, with `details`:
    /// who asked, as their session says (denied until marked otherwise).
    pub fn record(&self, app: &App, event: &str, details: Value) -> crate::audit::AuditRecord {
        let mut record = self.caller.record(app, event);
        with_identity(&mut record, &self.session.identity);
        record.details = details;
        record
    }
}

/// What a refusal of the viewer is recorded as.
#[derive(Debug)]
pub enum Refusal<'a> {
    /// A view: `audit.query` (with the view), once per session, as the
    /// API records each of its refusals for each request.
    View,
    /// A form's action (`deny.added`, `deny.removed`) with its details
    /// (the target), each time, as the API records it; never for a form
    /// without the session's CSRF token (another site's), which records
    /// nothing.
    Action {
        event: &'static str,
        details: Value,
        csrf: &'a str,
    },
}

/// The viewer of this request, allowed `need`; or the page to answer
/// instead (sign in, too many requests, ask for membership, blocked).
/// Every refusal is recorded as `refusal` says, with the API's codes
/// (`not_an_auditor`, `not_an_admin`, `identity_denied`).
pub async fn viewer(
    app: &App,
    console: &Console,
    headers: &HeaderMap,
    caller: Caller,
    need: Need,
    here: &str,
    refusal: Refusal<'_>,
) -> Result<Viewer, Response> {
    let Some(session_id) = cookie(headers, SESSION_COOKIE) else {
        return Err(page::sign_in(here));
    };
    let session = match console.sessions.get(app, session_id).await {
        Ok(Some(session)) => session,
        Ok(None) => return Err(page::sign_in(here)),
        Err(error) => return Err(page::state_unavailable(&error)),
    };
    let session_id = session_id.to_owned();
    let settings = app.settings();
    // The audit API's quota per person holds here too: each view reads
    // the trail as an API call does.
    if let Err(retry) = settings
        .rate_limits
        .check_api_identity(&session.identity.qualified_subject())
    {
        app.metrics.count_rate_limited("api_identity");
        let mut record = caller.record(app, event::AUDIT_QUERY);
        with_identity(&mut record, &session.identity);
        record.details = serde_json::json!({"via": "console", "view": here});
        return Err(refuse_rate(app, record, retry, "you").await);
    }
    let tenants = &settings.config.identity.allowed_tenants;
    let (auditor, admin) = (
        is_member(&settings.config.auditors, tenants, &session.identity),
        is_member(&settings.config.admins, tenants, &session.identity),
    );
    let allowed = match need {
        Need::Auditor => auditor,
        Need::Admin => admin,
    };
    let viewer = Viewer {
        session_id,
        session,
        auditor,
        admin,
        caller,
    };
    if let Refusal::Action { csrf, .. } = &refusal
        && let Some(page) = views::refused_form(console, headers, &viewer, csrf)
    {
        return Err(page);
    }
    // The refusal, recorded as `refusal` says; `once` names it in the
    // session so that a view's is recorded once.
    let refuse = |error: ApiError, once: String| {
        let viewer = &viewer;
        let refusal = &refusal;
        async move {
            let (event, details) = match refusal {
                Refusal::View => {
                    match console.sessions.recorded(app, &viewer.session_id, &once).await {
                        Ok(true) => return Ok(()),
                        Ok(false) => {}
                        Err(error) => return Err(page::state_unavailable(&error)),
                    }
                    (
                        event::AUDIT_QUERY,
                        serde_json::json!({"via": "console", "view": here}),
                    )
                }
                Refusal::Action { event, details, .. } => (*event, details.clone()),
            };
            let record = viewer.record(app, event, details);
            let answered = refuse(app, record, error).await;
            if answered.error == talos_sso_api::ErrorCode::AuditUnavailable {
                return Err(page::unavailable());
            }
            if matches!(refusal, Refusal::View) {
                console
                    .sessions
                    .note_recorded(app, &viewer.session_id, &once)
                    .await;
            }
            Ok(())
        }
    };
    if !allowed {
        let (list, code, what) = match need {
            Need::Auditor => (
                &settings.config.auditors,
                talos_sso_api::ErrorCode::NotAnAuditor,
                "auditors",
            ),
            Need::Admin => (
                &settings.config.admins,
                talos_sso_api::ErrorCode::NotAnAdmin,
                "admins",
            ),
        };
        let message = format!("the console needs membership in `{what}`");
        refuse(ApiError::new(code, message), format!("refused {what}")).await?;
        return Err(page::membership(
            Some(&viewer),
            &viewer.session.identity.username,
            what,
            list,
            &settings.config.identity.allowed_tenants,
        ));
    }
    let identity = &viewer.session.identity;
    match app
        .audit
        .store()
        .is_denied(&identity.subject, &identity.username)
        .await
    {
        Ok(false) => Ok(viewer),
        Ok(true) => {
            refuse(super::privileged::identity_denied(), "refused blocked".into()).await?;
            Err(page::blocked(&viewer))
        }
        Err(_) => Err(page::unavailable()),
    }
}

/// An auditor's request: the extractor answers with the sign-in,
/// membership or blocked page instead when the session is not one.
#[derive(Debug)]
pub struct Auditor(pub Viewer);

/// An admin's request, likewise.
#[derive(Debug)]
pub struct Admin(pub Viewer);

/// The viewer of the request in `parts`, allowed `need`.
async fn extract(parts: &mut Parts, app: &Arc<App>, need: Need) -> Result<Viewer, Response> {
    let Some(console) = parts.extensions.get::<Arc<Console>>().cloned() else {
        return Err(page::unavailable());
    };
    let caller = Caller::from_request_parts(parts, app)
        .await
        .map_err(IntoResponse::into_response)?;
    let here = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/ui".into());
    viewer(app, &console, &parts.headers, caller, need, &here, Refusal::View).await
}

/// Every request to the console but a form's must come from the console
/// itself or from the person ([`fetched_here`]), whatever its method: axum
/// answers `HEAD` with the `GET` handler, which records, exports or
/// verifies as the `GET` would. Forms (`POST`) carry their CSRF token and
/// have their `Origin` checked instead. The login callback is exempt: the
/// identity provider sends the browser there from its own site, and
/// `state` and PKCE guard it.
async fn fetched_here_only(request: Request, next: Next) -> Response {
    let method = request.method();
    if *method == axum::http::Method::POST
        || request.uri().path() == login::CALLBACK_PATH
        || fetched_here(request.headers())
    {
        return next.run(request).await;
    }
    if *method == axum::http::Method::GET || *method == axum::http::Method::HEAD {
        let here = request
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/ui".into());
        return page::open_here(&here);
    }
    page::cross_site()
}

/// Whether a view was asked for from the console itself or by the person
/// (typed, bookmarked): `Sec-Fetch-Site` is `same-origin` or `none`. A
/// view records, exports, verifies or computes; another site's link (the
/// session cookie is SameSite=Lax, so it rides along) must do none of
/// that. Browsers send the header; a request without it is treated as
/// from elsewhere.
fn fetched_here(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .is_some_and(|site| matches!(site.as_bytes(), b"same-origin" | b"none"))
}

impl FromRequestParts<Arc<App>> for Auditor {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Response> {
        extract(parts, app, Need::Auditor).await.map(Auditor)
    }
}

impl FromRequestParts<Arc<App>> for Admin {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Response> {
        extract(parts, app, Need::Admin).await.map(Admin)
    }
}

/// Record that `viewer` looked at `view` (its filter in `details`), unless
/// this session already did: one `audit.query` record per session and
/// view. Nothing is shown unless it was recorded, and a view is marked
/// recorded only once its record is committed.
pub async fn record_view(
    app: &App,
    console: &Console,
    viewer: &Viewer,
    view: &str,
    details: Value,
) -> Result<(), Response> {
    match console.sessions.recorded(app, &viewer.session_id, view).await {
        Ok(true) => return Ok(()),
        Ok(false) => {}
        Err(error) => return Err(page::state_unavailable(&error)),
    }
    record_now(app, viewer, details).await?;
    console
        .sessions
        .note_recorded(app, &viewer.session_id, view)
        .await;
    Ok(())
}

/// Record what `viewer` does now (`audit.query`, `details`), whether or
/// not the session did the same before; the record as committed.
pub async fn record_now(
    app: &App,
    viewer: &Viewer,
    details: Value,
) -> Result<crate::audit::StoredRecord, Response> {
    let mut details = details;
    if let Value::Object(map) = &mut details {
        map.insert("via".into(), "console".into());
    }
    let mut record = viewer.record(app, event::AUDIT_QUERY, details);
    record.outcome = outcome::SUCCESS.into();
    commit(app, record, None).await.map_err(|error| {
        if error.error == talos_sso_api::ErrorCode::IdentityDenied {
            page::blocked(viewer)
        } else {
            page::unavailable()
        }
    })
}

/// The groups and app roles of `list`, as the membership page names them:
/// an app role with the tenant it counts in, as a denial names it
/// (`tenants` are the login issuer's).
pub fn members_of(list: &GroupList, tenants: &[String]) -> Vec<String> {
    list.groups
        .iter()
        .map(|g| format!("group {g}"))
        .chain(
            list.app_roles
                .iter()
                .filter_map(|r| AppRoleSelector::parse(r).describe(tenants)),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_client_secret_is_never_printed() {
        let dir = std::env::temp_dir().join(format!("console-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "s3cr3t-value\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let yaml = format!(
            "{}\nconsole: {{ enabled: true, public_url: \"https://sso.example.com\", client_secret_file: {} }}\n",
            crate::config::tests::MINIMAL,
            path.display()
        );
        let config = crate::config::Config::from_yaml(&yaml).unwrap();
        let console = Console::new(&config).unwrap().expect("the console is on");
        assert_eq!(
            console.client_secret.as_deref().map(String::as_str),
            Some("s3cr3t-value")
        );
        let shown = format!("{console:?}");
        assert!(
            !shown.contains("s3cr3t") && shown.contains("<redacted>"),
            "{shown}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_membership_page_names_app_roles_with_their_tenant_as_denials_do() {
        const HOME: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
        const PARTNER: &str = "bbbbbbbb-0000-4000-8000-00000000000b";
        let list = GroupList {
            groups: vec!["security".into()],
            app_roles: vec!["Talos.Auditor".into(), format!("{PARTNER}/Talos.Reader")],
            client_ids: vec!["siem".into()],
        };
        assert_eq!(
            members_of(&list, &[HOME.to_owned()]),
            [
                "group security".to_owned(),
                format!("app role Talos.Auditor in tenant {HOME}"),
                format!("app role Talos.Reader in tenant {PARTNER}"),
            ]
        );
        // A login issuer without tenants: the role as written.
        assert_eq!(
            members_of(&list, &[]),
            [
                "group security".to_owned(),
                "app role Talos.Auditor".to_owned(),
                format!("app role {PARTNER}/Talos.Reader"),
            ]
        );
    }
}
