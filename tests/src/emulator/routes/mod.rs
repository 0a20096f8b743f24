//! The emulator's HTTP endpoints. Entra's paths, parameters, error codes and
//! document shapes; the state lives behind one mutex never held across an
//! await.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::extract::State as AxumState;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::tokens::random_id;
use super::{State, TENANT_ID};

mod authorize;
mod device;
mod discovery;
mod graph;
mod token;

use authorize::authorize;
pub(crate) use device::set_device_status;
use device::{devicecode, devicelogin_page, devicelogin_submit};
use discovery::{discovery_v1, discovery_v2, jwks};
use graph::{graph_member_objects, token_claim_source};
use token::token;

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

/// What every tenant's endpoint does first: wait the configured delay,
/// then refuse a tenant Entra would not know. `None`: go on.
async fn arrive(state: &Shared, tenant: &str) -> Option<Response> {
    pause(state).await;
    (!known_tenant(tenant)).then(|| bad_tenant(tenant))
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
