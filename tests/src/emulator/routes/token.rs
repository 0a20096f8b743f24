//! The token endpoint: its grants, and the tokens it answers with.

use axum::extract::{Form, Path, State as AxumState};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::device::poll_device;
use super::{Params, Shared, arrive, json_response, lock, oauth_error};
use crate::emulator::tokens::{self, TokenKind, b64, random_id};
use crate::emulator::{RefreshGrant, SERVER_APP_ID, SERVER_APP_SECRET, State};

/// The token response for `user`: ID token when `openid` was asked for,
/// refresh token with `offline_access`, an access token for the server API.
pub(super) fn issue_tokens(
    s: &mut State,
    user: &str,
    client_id: &str,
    scope: &str,
    nonce: Option<String>,
) -> Response {
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
    s.record("access_token", &access);
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
            Ok(id) => {
                s.record("id_token", &id);
                body["id_token"] = json!(id);
            }
            Err(e) => return oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", &e),
        }
    }
    if scopes.contains(&"offline_access") {
        let refresh = random_id(48);
        s.record("refresh_token", &refresh);
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

pub(super) async fn token(
    AxumState(state): AxumState<Shared>,
    Path(tenant): Path<String>,
    Form(f): Form<Params>,
) -> Response {
    if let Some(refusal) = arrive(&state, &tenant).await {
        return refusal;
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
            s.record("code_verifier", &verifier);
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
