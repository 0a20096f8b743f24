//! The authorization endpoint: the browser's step of the code flow.

use axum::extract::{Path, Query, State as AxumState};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};

use super::{Params, Shared, arrive, lock};
use crate::emulator::tokens::random_id;
use crate::emulator::{CLI_CLIENT_ID, PendingCode};

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

pub(super) async fn authorize(
    AxumState(state): AxumState<Shared>,
    Path(tenant): Path<String>,
    Query(q): Query<Params>,
) -> Response {
    if let Some(refusal) = arrive(&state, &tenant).await {
        return refusal;
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
    s.record("authorization_code", &code);
    s.record("code_challenge", &get("code_challenge"));
    s.record("state", &state_param);
    s.record("nonce", &get("nonce"));
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
