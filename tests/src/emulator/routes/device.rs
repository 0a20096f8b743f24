//! The device code flow: the code, its polling, and the page where the
//! person enters it.

use std::time::Instant;

use axum::extract::{Form, Path, State as AxumState};
use axum::http::StatusCode;
use axum::response::{Html, Response};
use serde_json::json;

use super::token::issue_tokens;
use super::{Params, Shared, arrive, json_response, lock, oauth_error};
use crate::emulator::tokens::random_id;
use crate::emulator::{CLI_CLIENT_ID, DeviceGrant, DeviceStatus, State};

pub(super) fn poll_device(s: &mut State, device_code: &str, client_id: &str) -> Response {
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

pub(super) async fn devicecode(
    AxumState(state): AxumState<Shared>,
    Path(tenant): Path<String>,
    Form(f): Form<Params>,
) -> Response {
    if let Some(refusal) = arrive(&state, &tenant).await {
        return refusal;
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
    s.record("device_code", &device_code);
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

pub(super) async fn devicelogin_page(AxumState(state): AxumState<Shared>) -> Html<String> {
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

pub(super) async fn devicelogin_submit(
    AxumState(state): AxumState<Shared>,
    Form(f): Form<Params>,
) -> Html<String> {
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
