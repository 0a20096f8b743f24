//! The emulator's HTTP endpoints. Entra's paths, parameters, error codes and
//! document shapes; the state lives behind one mutex never held across an
//! await.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use axum::Router;
use axum::extract::{Form, Path, Query, State as AxumState};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::tokens::{self, TokenKind, b64, random_id};
use super::{
    CLI_CLIENT_ID, DeviceGrant, DeviceStatus, PendingCode, RefreshGrant, SERVER_APP_ID, SERVER_APP_SECRET,
    State, TENANT_ID,
};

type Shared = Arc<Mutex<State>>;
type Params = HashMap<String, String>;

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(index))
        .route(
            "/{tenant}/v2.0/.well-known/openid-configuration",
            get(discovery_v2),
        )
        .route("/{tenant}/.well-known/openid-configuration", get(discovery_v1))
        .route("/{tenant}/discovery/v2.0/keys", get(jwks))
        .route("/{tenant}/discovery/keys", get(jwks))
        .route("/{tenant}/oauth2/v2.0/authorize", get(authorize))
        .route("/{tenant}/oauth2/v2.0/token", post(token))
        .route("/{tenant}/oauth2/v2.0/devicecode", post(devicecode))
        .route("/devicelogin", get(devicelogin_page).post(devicelogin_submit))
        .route("/v1.0/users/{oid}/getMemberObjects", post(graph_member_objects))
        .route(
            "/token-claim-source/{oid}/getMemberObjects",
            post(token_claim_source),
        )
        .with_state(state)
}

fn lock(state: &Shared) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The "slow answers" knob.
async fn pause(state: &Shared) {
    let delay = lock(state).faults.delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body.to_string(),
    )
        .into_response()
}

/// Entra's OAuth error body.
fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    json_response(
        status,
        json!({"error": error, "error_description": description, "error_codes": [], "timestamp": "", "trace_id": random_id(8)}),
    )
}

fn known_tenant(tenant: &str) -> bool {
    tenant == TENANT_ID || tenant == "organizations" || tenant == "common"
}

fn bad_tenant(tenant: &str) -> Response {
    oauth_error(
        StatusCode::BAD_REQUEST,
        "invalid_tenant",
        &format!(
            "AADSTS90002: Tenant '{}' not found.",
            tenant.chars().take(64).collect::<String>()
        ),
    )
}

async fn index(AxumState(state): AxumState<Shared>) -> Html<String> {
    let state = lock(&state);
    let users: String = state
        .config
        .users
        .iter()
        .map(|u| {
            format!(
                "<li>{} &lt;{}&gt; groups: {}, app roles: {}</li>",
                u.name,
                u.username,
                u.groups.len(),
                u.app_roles.join(", ")
            )
        })
        .collect();
    Html(format!(
        "<!doctype html><title>Entra ID emulator</title><h1>Entra ID emulator</h1>\
         <p>Tenant <code>{TENANT_ID}</code>; issuer <code>{}/{TENANT_ID}/v2.0</code>.</p><ul>{users}</ul>",
        state.base_url
    ))
}

fn malformed_document() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        "{\"issuer\": \"https://",
    )
        .into_response()
}

/// A discovery document for `tenant`, built by `document(base, tenant,
/// issuer tenant)` after the checks and faults every document shares. The
/// multi-tenant names get the literal `{tenantid}` issuer template.
async fn discovery(
    state: Shared,
    tenant: String,
    document: impl FnOnce(&str, &str, &str) -> Value,
) -> Response {
    pause(&state).await;
    let mut s = lock(&state);
    s.counters.discovery += 1;
    if !known_tenant(&tenant) {
        return bad_tenant(&tenant);
    }
    if s.faults.malformed_documents {
        return malformed_document();
    }
    let issuer_tenant = if tenant == TENANT_ID {
        TENANT_ID
    } else {
        "{tenantid}"
    };
    json_response(StatusCode::OK, document(&s.base_url, &tenant, issuer_tenant))
}

async fn discovery_v2(AxumState(state): AxumState<Shared>, Path(tenant): Path<String>) -> Response {
    discovery(state, tenant, |base, tenant, issuer_tenant| {
        json!({
            "token_endpoint": format!("{base}/{tenant}/oauth2/v2.0/token"),
            "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt", "client_secret_basic"],
            "jwks_uri": format!("{base}/{tenant}/discovery/v2.0/keys"),
            "response_modes_supported": ["query", "fragment", "form_post"],
            "subject_types_supported": ["pairwise"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
            "scopes_supported": ["openid", "profile", "email", "offline_access"],
            "issuer": format!("{base}/{issuer_tenant}/v2.0"),
            "request_uri_parameter_supported": false,
            "userinfo_endpoint": format!("{base}/oidc/userinfo"),
            "authorization_endpoint": format!("{base}/{tenant}/oauth2/v2.0/authorize"),
            "device_authorization_endpoint": format!("{base}/{tenant}/oauth2/v2.0/devicecode"),
            "http_logout_supported": true,
            "frontchannel_logout_supported": true,
            "end_session_endpoint": format!("{base}/{tenant}/oauth2/v2.0/logout"),
            "claims_supported": ["sub", "iss", "cloud_instance_name", "cloud_instance_host_name", "cloud_graph_host_name",
                "msgraph_host", "aud", "exp", "iat", "auth_time", "acr", "nonce", "preferred_username", "name", "tid",
                "ver", "at_hash", "c_hash", "email"],
            "kerberos_endpoint": format!("{base}/{tenant}/kerberos"),
            "tenant_region_scope": "EU",
            "cloud_instance_name": "microsoftonline.com",
            "cloud_graph_host_name": "graph.windows.net",
            "msgraph_host": "graph.microsoft.com",
            "rbac_url": "https://pas.windows.net"
        })
    })
    .await
}

async fn discovery_v1(AxumState(state): AxumState<Shared>, Path(tenant): Path<String>) -> Response {
    discovery(state, tenant, |base, tenant, issuer_tenant| {
        json!({
            "token_endpoint": format!("{base}/{tenant}/oauth2/token"),
            "jwks_uri": format!("{base}/{tenant}/discovery/keys"),
            "response_types_supported": ["code", "id_token", "code id_token", "token id_token", "token"],
            "subject_types_supported": ["pairwise"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "issuer": format!("{base}/sts/{issuer_tenant}/"),
            "authorization_endpoint": format!("{base}/{tenant}/oauth2/authorize"),
            "device_authorization_endpoint": format!("{base}/{tenant}/oauth2/devicecode"),
        })
    })
    .await
}

async fn jwks(AxumState(state): AxumState<Shared>, Path(tenant): Path<String>) -> Response {
    pause(&state).await;
    let mut s = lock(&state);
    s.counters.jwks += 1;
    if !known_tenant(&tenant) {
        return bad_tenant(&tenant);
    }
    if s.faults.jwks_unavailable {
        return (StatusCode::SERVICE_UNAVAILABLE, "the key service is unavailable").into_response();
    }
    if s.faults.malformed_documents {
        return malformed_document();
    }
    let issuer = if tenant == TENANT_ID {
        format!("{}/{TENANT_ID}/v2.0", s.base_url)
    } else {
        format!("{}/{{tenantid}}/v2.0", s.base_url)
    };
    let keys: Vec<Value> = s
        .keys
        .iter()
        .map(|k| {
            let public: ring::signature::RsaPublicKeyComponents<Vec<u8>> = k.pair.public().into();
            json!({"kty": "RSA", "use": "sig", "kid": k.kid, "x5t": k.kid, "n": b64(&public.n), "e": b64(&public.e), "issuer": issuer})
        })
        .collect();
    json_response(StatusCode::OK, json!({"keys": keys}))
}

fn is_loopback_redirect(uri: &str) -> bool {
    match url::Url::parse(uri) {
        Ok(url) => url.scheme() == "http" && matches!(url.host_str(), Some("localhost") | Some("127.0.0.1")),
        Err(_) => false,
    }
}

fn redirect_with(redirect_uri: &str, params: &[(&str, &str)]) -> Response {
    match url::Url::parse(redirect_uri) {
        Ok(mut url) => {
            url.query_pairs_mut().extend_pairs(params);
            // Entra answers 302 Found.
            (StatusCode::FOUND, [(header::LOCATION, url.to_string())]).into_response()
        }
        Err(_) => (StatusCode::BAD_REQUEST, "invalid redirect_uri").into_response(),
    }
}

async fn authorize(
    AxumState(state): AxumState<Shared>,
    Path(tenant): Path<String>,
    Query(q): Query<Params>,
) -> Response {
    pause(&state).await;
    if !known_tenant(&tenant) {
        return bad_tenant(&tenant);
    }
    let get = |name: &str| q.get(name).cloned().unwrap_or_default();
    let (client_id, redirect_uri, state_param) = (get("client_id"), get("redirect_uri"), get("state"));
    if client_id != CLI_CLIENT_ID {
        return (
            StatusCode::BAD_REQUEST,
            Html("AADSTS700016: Application not found in the directory.".to_owned()),
        )
            .into_response();
    }
    if !is_loopback_redirect(&redirect_uri) {
        return (
            StatusCode::BAD_REQUEST,
            Html("AADSTS50011: The redirect URI does not match the redirect URIs configured for the application.".to_owned()),
        )
            .into_response();
    }
    if get("response_type") != "code" {
        return redirect_with(
            &redirect_uri,
            &[("error", "unsupported_response_type"), ("state", &state_param)],
        );
    }
    if get("code_challenge").is_empty() || get("code_challenge_method") != "S256" {
        return redirect_with(
            &redirect_uri,
            &[
                ("error", "invalid_request"),
                ("error_description", "PKCE with S256 is required"),
                ("state", &state_param),
            ],
        );
    }
    let mut s = lock(&state);
    let chosen = q.get("login_hint").cloned().or_else(|| s.auto_login.clone());
    let Some(username) = chosen.and_then(|hint| s.user(&hint).map(|u| u.username.clone())) else {
        // A person picks a user on a page; each link repeats the request with a login_hint.
        let links: String = s
            .config
            .users
            .iter()
            .map(|u| {
                let mut params = q.clone();
                params.insert("login_hint".into(), u.username.clone());
                let query = url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(params.iter())
                    .finish();
                format!(
                    "<li><a href=\"/{tenant}/oauth2/v2.0/authorize?{query}\">{} ({})</a></li>",
                    u.name, u.username
                )
            })
            .collect();
        return Html(format!(
            "<!doctype html><title>Sign in</title><h1>Entra ID emulator: pick an account</h1><ul>{links}</ul>"
        ))
        .into_response();
    };
    let code = random_id(32);
    s.codes.insert(
        code.clone(),
        PendingCode {
            client_id,
            redirect_uri: redirect_uri.clone(),
            code_challenge: get("code_challenge"),
            nonce: q.get("nonce").cloned(),
            scope: get("scope"),
            user: username,
        },
    );
    drop(s);
    redirect_with(
        &redirect_uri,
        &[
            ("code", &code),
            ("state", &state_param),
            ("session_state", &random_id(8)),
        ],
    )
}

/// The token response for `user`: ID token when `openid` was asked for,
/// refresh token with `offline_access`, an access token for the server API.
fn issue_tokens(s: &mut State, user: &str, client_id: &str, scope: &str, nonce: Option<String>) -> Response {
    let now = match s.last_token_time {
        Some(last) if s.faults.repeat_token_time > 0 => {
            s.faults.repeat_token_time -= 1;
            last
        }
        _ => s.now(),
    };
    s.last_token_time = Some(now);
    s.token_time = Some(now);
    let response = token_answer(s, user, client_id, scope, nonce);
    s.token_time = None;
    response
}

fn token_answer(s: &mut State, user: &str, client_id: &str, scope: &str, nonce: Option<String>) -> Response {
    let Some(user) = s.user(user).cloned() else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "AADSTS50034: The user account does not exist.",
        );
    };
    let version = s.config.access_token_version;
    let access = match tokens::mint(s, &user, TokenKind::Access { version }) {
        Ok(token) => token,
        Err(e) => return oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", &e),
    };
    let mut body = json!({
        "token_type": "Bearer",
        "scope": scope,
        "expires_in": 3599,
        "ext_expires_in": 3599,
        "access_token": access,
    });
    let scopes: Vec<&str> = scope.split_whitespace().collect();
    if scopes.contains(&"openid") {
        match tokens::mint(s, &user, TokenKind::Id { nonce }) {
            Ok(id) => body["id_token"] = json!(id),
            Err(e) => return oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", &e),
        }
    }
    if scopes.contains(&"offline_access") {
        let refresh = random_id(48);
        s.refresh_tokens.insert(
            refresh.clone(),
            RefreshGrant {
                client_id: client_id.to_owned(),
                scope: scope.to_owned(),
                user: user.username.clone(),
            },
        );
        body["refresh_token"] = json!(refresh);
    }
    json_response(StatusCode::OK, body)
}

async fn token(
    AxumState(state): AxumState<Shared>,
    Path(tenant): Path<String>,
    Form(f): Form<Params>,
) -> Response {
    pause(&state).await;
    if !known_tenant(&tenant) {
        return bad_tenant(&tenant);
    }
    let get = |name: &str| f.get(name).cloned().unwrap_or_default();
    let mut s = lock(&state);
    match get("grant_type").as_str() {
        "authorization_code" => {
            let Some(pending) = s.codes.remove(&get("code")) else {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_grant",
                    "AADSTS70008: The provided authorization code or refresh token has expired or was already redeemed.",
                );
            };
            if pending.client_id != get("client_id") || pending.redirect_uri != get("redirect_uri") {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_grant",
                    "AADSTS70002: client_id or redirect_uri does not match the authorization request.",
                );
            }
            let verifier = get("code_verifier");
            let computed = b64(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()).as_ref());
            if verifier.is_empty() || computed != pending.code_challenge {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_grant",
                    "AADSTS501481: The Code_Verifier does not match the code_challenge supplied in the authorization request.",
                );
            }
            issue_tokens(
                &mut s,
                &pending.user,
                &pending.client_id,
                &pending.scope,
                pending.nonce,
            )
        }
        "refresh_token" => {
            // Rotation: a refresh token works once; a new one comes back.
            let Some(grant) = s.refresh_tokens.remove(&get("refresh_token")) else {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_grant",
                    "AADSTS70008: The refresh token has expired or was already redeemed.",
                );
            };
            if grant.client_id != get("client_id") {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_grant",
                    "AADSTS700005: the refresh token was issued to another client.",
                );
            }
            let scope = f.get("scope").cloned().unwrap_or(grant.scope);
            issue_tokens(&mut s, &grant.user, &grant.client_id, &scope, None)
        }
        "urn:ietf:params:oauth:grant-type:device_code" => {
            poll_device(&mut s, &get("device_code"), &get("client_id"))
        }
        "client_credentials" => {
            client_credentials(&mut s, &get("client_id"), &get("client_secret"), &get("scope"))
        }
        other => oauth_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            &format!("AADSTS70003: grant type `{other}` is not supported"),
        ),
    }
}

/// The client credentials grant: the server's own app gets Graph tokens;
/// a registered application gets a token of its own for the API its
/// `scope` names (`<app id or api://app id>/.default`, as Entra requires).
fn client_credentials(s: &mut State, client_id: &str, secret: &str, scope: &str) -> Response {
    let invalid_client = || {
        oauth_error(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            "AADSTS7000215: Invalid client secret provided.",
        )
    };
    if client_id == SERVER_APP_ID {
        if secret != SERVER_APP_SECRET {
            return invalid_client();
        }
        return match tokens::graph_app_token(s) {
            Ok(token) => {
                s.graph_tokens.push(token.clone());
                json_response(
                    StatusCode::OK,
                    json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}),
                )
            }
            Err(e) => oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", &e),
        };
    }
    let Some(application) = s
        .config
        .applications
        .iter()
        .find(|a| a.client_id == client_id && a.client_secret == secret)
        .cloned()
    else {
        return invalid_client();
    };
    let Some(resource) = scope.strip_suffix("/.default") else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_scope",
            "AADSTS1002012: The provided value for scope is not valid. Client credential flows must have a scope value with /.default suffixed to the resource identifier (application ID URI).",
        );
    };
    let resource = resource.strip_prefix("api://").unwrap_or(resource);
    if resource != SERVER_APP_ID {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_resource",
            "AADSTS500011: The resource principal was not found in the tenant.",
        );
    }
    let claims = tokens::app_claims(s, &application, resource);
    match tokens::sign(s, &claims, s.config.access_token_version == 1) {
        Ok(token) => json_response(
            StatusCode::OK,
            json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}),
        ),
        Err(e) => oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", &e),
    }
}

fn poll_device(s: &mut State, device_code: &str, client_id: &str) -> Response {
    let interval = std::time::Duration::from_secs(s.config.device_interval);
    let Some(grant) = s.devices.get_mut(device_code) else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "bad_verification_code",
            "AADSTS70019: the device code is unknown.",
        );
    };
    if grant.client_id != client_id {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "the device code was issued to another client.",
        );
    }
    let now = Instant::now();
    if now >= grant.expires_at {
        s.devices.remove(device_code);
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "expired_token",
            "AADSTS70020: The provided value for the input parameter 'device_code' is not valid. This device code has expired.",
        );
    }
    let too_soon = grant
        .last_poll
        .is_some_and(|last| now.duration_since(last) < interval);
    grant.last_poll = Some(now);
    if too_soon {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "slow_down",
            "polling faster than the interval",
        );
    }
    match grant.status.clone() {
        DeviceStatus::Pending => oauth_error(
            StatusCode::BAD_REQUEST,
            "authorization_pending",
            "AADSTS70016: OAuth 2.0 device flow error. Authorization is pending. Continue polling.",
        ),
        DeviceStatus::Declined => {
            s.devices.remove(device_code);
            oauth_error(
                StatusCode::BAD_REQUEST,
                "authorization_declined",
                "AADSTS70000: the user declined the sign-in.",
            )
        }
        DeviceStatus::Approved(user) => {
            let grant = s.devices.remove(device_code);
            let (client, scope) = grant.map(|g| (g.client_id, g.scope)).unwrap_or_default();
            // Device-code ID tokens carry no nonce.
            issue_tokens(s, &user, &client, &scope, None)
        }
    }
}

fn new_user_code() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut raw = [0u8; 9];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw).expect("randomness");
    // 32 symbols, so `% 32` keeps the distribution uniform.
    raw.iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

async fn devicecode(
    AxumState(state): AxumState<Shared>,
    Path(tenant): Path<String>,
    Form(f): Form<Params>,
) -> Response {
    pause(&state).await;
    if !known_tenant(&tenant) {
        return bad_tenant(&tenant);
    }
    if f.get("client_id").map(String::as_str) != Some(CLI_CLIENT_ID) {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "unauthorized_client",
            "AADSTS700016: Application not found in the directory.",
        );
    }
    let mut s = lock(&state);
    let device_code = random_id(48);
    let user_code = new_user_code();
    let expires_in = s.config.device_expires_in;
    s.devices.insert(
        device_code.clone(),
        DeviceGrant {
            user_code: user_code.clone(),
            client_id: CLI_CLIENT_ID.into(),
            scope: f.get("scope").cloned().unwrap_or_default(),
            expires_at: Instant::now() + expires_in,
            last_poll: None,
            status: DeviceStatus::Pending,
        },
    );
    let verification_uri = format!("{}/devicelogin", s.base_url);
    json_response(
        StatusCode::OK,
        json!({
            "user_code": user_code,
            "device_code": device_code,
            "verification_uri": verification_uri,
            "expires_in": expires_in.as_secs(),
            "interval": s.config.device_interval,
            "message": format!("To sign in, use a web browser to open the page {verification_uri} and enter the code {user_code} to authenticate."),
        }),
    )
}

pub(crate) fn set_device_status(s: &mut State, user_code: &str, status: DeviceStatus) -> bool {
    if let DeviceStatus::Approved(user) = &status
        && s.user(user).is_none()
    {
        return false;
    }
    match s
        .devices
        .values_mut()
        .find(|g| g.user_code.eq_ignore_ascii_case(user_code.trim()) && g.status == DeviceStatus::Pending)
    {
        Some(grant) => {
            grant.status = status;
            true
        }
        None => false,
    }
}

async fn devicelogin_page(AxumState(state): AxumState<Shared>) -> Html<String> {
    let s = lock(&state);
    let options: String = s
        .config
        .users
        .iter()
        .map(|u| format!("<option value=\"{0}\">{1} ({0})</option>", u.username, u.name))
        .collect();
    Html(format!(
        "<!doctype html><title>Enter code</title><h1>Entra ID emulator: enter the code</h1>\
         <form method=post><input name=user_code placeholder=CODE autofocus> <select name=user>{options}</select> \
         <button name=action value=approve>Sign in</button> <button name=action value=decline>Decline</button></form>"
    ))
}

async fn devicelogin_submit(AxumState(state): AxumState<Shared>, Form(f): Form<Params>) -> Html<String> {
    let mut s = lock(&state);
    let code = f.get("user_code").cloned().unwrap_or_default();
    let status = if f.get("action").map(String::as_str) == Some("decline") {
        DeviceStatus::Declined
    } else {
        DeviceStatus::Approved(f.get("user").cloned().unwrap_or_default())
    };
    if set_device_status(&mut s, &code, status) {
        Html("<!doctype html><p>Done. You may close this window and return to your terminal.</p>".into())
    } else {
        Html("<!doctype html><p>That code is unknown or already used.</p>".into())
    }
}

async fn graph_member_objects(
    AxumState(state): AxumState<Shared>,
    Path(oid): Path<String>,
    headers: HeaderMap,
) -> Response {
    // Counted on arrival, so a test can tell a request is in flight.
    lock(&state).counters.graph_member_objects += 1;
    pause(&state).await;
    let s = lock(&state);
    if s.faults.graph_unavailable {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": {"code": "serviceNotAvailable", "message": "Service unavailable"}}),
        );
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !s.graph_tokens.iter().any(|t| t == bearer) {
        return json_response(
            StatusCode::UNAUTHORIZED,
            json!({"error": {"code": "InvalidAuthenticationToken", "message": "Access token is empty or invalid."}}),
        );
    }
    match s.config.users.iter().find(|u| u.oid == oid) {
        Some(user) => json_response(
            StatusCode::OK,
            json!({"@odata.context": "https://graph.microsoft.com/v1.0/$metadata#Collection(Edm.String)", "value": user.groups}),
        ),
        None => json_response(
            StatusCode::NOT_FOUND,
            json!({"error": {"code": "Request_ResourceNotFound", "message": format!("Resource '{oid}' does not exist.")}}),
        ),
    }
}

/// The URL written into overage tokens. The server must never call it.
async fn token_claim_source(AxumState(state): AxumState<Shared>) -> Response {
    lock(&state).counters.token_claim_source += 1;
    json_response(
        StatusCode::FORBIDDEN,
        json!({"error": "this URL came from a token and must not be fetched"}),
    )
}
