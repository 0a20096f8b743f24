//! Logging in to the console: the server is the OAuth client. The
//! authorization code flow with PKCE (S256), `state` and `nonce` checked,
//! the code redeemed by the server at the provider's token endpoint, and
//! the ID token verified by the same [`crate::identity::Authenticator`] as
//! every API call, so that auditors and admins are who the API says they
//! are.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::session::{
    LOGIN_COOKIE, LOGIN_TIMEOUT, SESSION_COOKIE, SessionError, cookie, same_secret, set_cookie,
};
use super::{Console, page, redirect};
use crate::app::App;
use crate::audit::event;
use crate::http::caller::Caller;
use crate::http::error::ApiError;
use crate::http::gate::{refuse, with_identity};
use crate::http::privileged::is_member;
use crate::identity::VerifiedIdentity;
use talos_sso_api::ErrorCode;

/// The S256 challenge of a PKCE verifier.
pub fn challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()))
}

/// The longest path a login returns to: a filter's query fits; a login in
/// progress held in the database stays small.
pub const RETURN_MAX: usize = 1024;

/// Where the identity provider sends the browser back (from its own site).
pub const CALLBACK_PATH: &str = "/ui/callback";

/// A console path to return to after login: `/ui` or below it, nothing
/// that could lead off the site, at most [`RETURN_MAX`] bytes.
fn return_path(asked: Option<&String>) -> String {
    match asked {
        Some(path)
            if path.len() <= RETURN_MAX
                && (path == "/ui" || path.starts_with("/ui/") || path.starts_with("/ui?"))
                && !path.contains("//")
                && !path.contains('\\')
                && !path.chars().any(char::is_control) =>
        {
            path.clone()
        }
        _ => "/ui".into(),
    }
}

/// The scopes the console asks for: the CLI's (`identity.scopes`), which
/// are chosen so that the provider releases the claims the server decides
/// on (Keycloak, Dex and oidc-provider put `groups` in the ID token only
/// for a `groups` scope; `openid profile` alone gets a person with no
/// groups, never an auditor). Less `offline_access`: the console redeems
/// its code once and keeps no token, so a refresh token would be a
/// credential issued for nothing. `openid` always: the login is an ID token.
fn scope(configured: &[String]) -> String {
    std::iter::once("openid")
        .chain(
            configured
                .iter()
                .map(String::as_str)
                .filter(|s| !matches!(*s, "openid" | "offline_access")),
        )
        .collect::<Vec<_>>()
        .join(" ")
}

/// `GET /ui/login`: off to the identity provider.
pub async fn login(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let started = console
        .sessions
        .start_login(&app, return_path(query.get("return")), caller.address_key)
        .await;
    let (id, pending) = match started {
        Ok(started) => started,
        Err(SessionError::Random) => {
            return page::failure("The server could not start a login (no randomness); try again.");
        }
        Err(SessionError::Store(error)) => return page::state_unavailable(&error),
    };
    let endpoint = app
        .authenticator
        .login()
        .provider()
        .metadata()
        .authorization_endpoint;
    let Ok(mut url) = url::Url::parse(&endpoint) else {
        return page::failure("The identity provider's authorization endpoint is not a URL.");
    };
    url.query_pairs_mut()
        .append_pair("client_id", &console.client_id)
        .append_pair("response_type", "code")
        .append_pair("redirect_uri", &console.redirect_uri)
        .append_pair("response_mode", "query")
        .append_pair("scope", &scope(&app.settings().config.identity.scopes))
        .append_pair("state", &pending.state)
        .append_pair("nonce", &pending.nonce)
        .append_pair("code_challenge", &challenge(&pending.verifier))
        .append_pair("code_challenge_method", "S256");
    let mut response = redirect(url.as_str());
    if let Ok(value) = set_cookie(LOGIN_COOKIE, Some(&id), LOGIN_TIMEOUT).parse() {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// `GET /ui/callback`: the provider sends the browser back with a code.
pub async fn callback(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    caller: Caller,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let pending = match cookie(&headers, LOGIN_COOKIE) {
        Some(id) => console.sessions.take_login(&app, id).await,
        None => Ok(None),
    };
    let mut response = match pending {
        Err(error) => page::state_unavailable(&error),
        Ok(None) => page::failure(
            "This login is unknown, was used already or took too long (over ten minutes). Start again from the console's sign-in page.",
        ),
        Ok(Some(pending)) => match finish(&app, &console, &query, &pending).await {
            Ok(Finished::Member(verified)) => match console.sessions.open(&app, &verified).await {
                Ok(session) => {
                    tracing::info!(target: "talos_sso::console", user = %talos_sso_text::clean_field(&verified.username), "console login");
                    let mut response = redirect(&pending.return_to);
                    if let Ok(value) = set_cookie(SESSION_COOKIE, Some(&session), console.lifetime).parse() {
                        response.headers_mut().append(header::SET_COOKIE, value);
                    }
                    response
                }
                Err(SessionError::Random) => {
                    page::failure("The server could not open a session (no randomness); try again.")
                }
                Err(SessionError::Store(error)) => page::state_unavailable(&error),
            },
            Ok(Finished::NotMember(verified)) => not_a_member(&app, &caller, &verified).await,
            Err(message) => page::failure(&message),
        },
    };
    if let Ok(value) = set_cookie(LOGIN_COOKIE, None, LOGIN_TIMEOUT).parse() {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// How a login that reached the ID token ended.
enum Finished {
    /// An auditor or admin: a session is opened for them.
    Member(Box<VerifiedIdentity>),
    /// Someone else: no session, only the page that says whom to ask.
    NotMember(Box<VerifiedIdentity>),
}

/// Someone who is neither an auditor nor an admin logged in: no session is
/// kept for them (a session is a place others' could be pushed out of),
/// the refusal is recorded as the API records `not_an_auditor`.
async fn not_a_member(app: &App, caller: &Caller, verified: &VerifiedIdentity) -> Response {
    let mut record = caller.record(app, event::AUDIT_QUERY);
    with_identity(&mut record, verified);
    record.details = serde_json::json!({"via": "console", "view": "login"});
    let error = refuse(
        app,
        record,
        ApiError::new(
            ErrorCode::NotAnAuditor,
            "the console needs membership in `auditors` or `admins`",
        ),
    )
    .await;
    if error.error == ErrorCode::AuditUnavailable {
        return page::unavailable();
    }
    let settings = app.settings();
    page::membership(
        None,
        &verified.username,
        "auditors",
        &settings.config.auditors,
        &settings.config.identity.allowed_tenants,
    )
}

/// Redeem the code, verify the ID token: who logged in, or what to tell
/// the person.
async fn finish(
    app: &App,
    console: &Console,
    query: &HashMap<String, String>,
    pending: &super::session::PendingLogin,
) -> Result<Finished, String> {
    let sent_state = query.get("state").map(String::as_str).unwrap_or_default();
    if !same_secret(sent_state, &pending.state) {
        return Err(
            "The identity provider's answer does not belong to this login (state). Start again.".into(),
        );
    }
    // RFC 9207: an answer that names its provider must name the login
    // issuer, or it is another provider's (a mix-up); a provider that says
    // it names itself in every answer sent none without.
    let metadata = app.authenticator.login().provider().metadata();
    match query.get("iss") {
        Some(iss) if iss != &metadata.issuer => {
            return Err(
                "The answer names another identity provider than this server's (iss). Start again.".into(),
            );
        }
        None if metadata.authorization_response_iss_parameter_supported => {
            return Err(
                "The answer does not name the identity provider, which names itself in all of its answers (iss). Start again."
                    .into(),
            );
        }
        _ => {}
    }
    if let Some(error) = query.get("error") {
        let description = query
            .get("error_description")
            .map(String::as_str)
            .unwrap_or_default();
        return Err(format!(
            "The identity provider refused the login: {} {}",
            talos_sso_text::clean_field(error),
            talos_sso_text::clean_field(description)
        ));
    }
    let code = query
        .get("code")
        .ok_or("The identity provider sent no authorization code.")?;
    let endpoint = app.authenticator.login().provider().metadata().token_endpoint;
    let mut form = vec![
        ("grant_type", "authorization_code"),
        ("code", code.as_str()),
        ("redirect_uri", console.redirect_uri.as_str()),
        ("client_id", console.client_id.as_str()),
        ("code_verifier", pending.verifier.as_str()),
    ];
    if let Some(secret) = &console.client_secret {
        form.push(("client_secret", secret.as_str()));
    }
    let answer = console
        .http
        .post(&endpoint)
        .form(&form)
        .send()
        .await
        .map_err(|e| {
            tracing::warn!(target: "talos_sso::console", "token endpoint unreachable: {}", talos_sso_api::error::error_chain(&e.without_url()));
            "The identity provider's token endpoint could not be reached; try again.".to_owned()
        })?;
    let status = answer.status();
    let body: serde_json::Value = answer.json().await.unwrap_or_default();
    if !status.is_success() {
        // The provider's error code and description only: no token here.
        // The provider's answer is outside text: escaped and bounded in the log.
        let error = talos_sso_text::clean_field(body["error"].as_str().unwrap_or("no error code"));
        tracing::warn!(target: "talos_sso::console", status = status.as_u16(), error = %error, "the code was not redeemed");
        return Err(format!(
            "The identity provider did not redeem the login ({}): {}",
            talos_sso_text::clean_field(body["error"].as_str().unwrap_or("no error code")),
            talos_sso_text::clean_field(body["error_description"].as_str().unwrap_or_default()),
        ));
    }
    let id_token = body["id_token"]
        .as_str()
        .ok_or("The identity provider sent no ID token.")?;
    let verified = app
        .authenticator
        .authenticate(id_token, app.clock.now(), &app.settings().relevant_groups)
        .await
        .map_err(|e| format!("The ID token was refused: {e}"))?;
    if !verified.from_login_issuer() || verified.application.is_some() {
        return Err("Only people of the login identity provider use the console.".into());
    }
    let nonce = verified
        .claims
        .get("nonce")
        .and_then(|n| n.as_str())
        .unwrap_or_default();
    if !same_secret(nonce, &pending.nonce) {
        return Err("The ID token was not issued for this login (nonce). Start again.".into());
    }
    let settings = app.settings();
    let tenants = &settings.config.identity.allowed_tenants;
    if !is_member(&settings.config.auditors, tenants, &verified)
        && !is_member(&settings.config.admins, tenants, &verified)
    {
        return Ok(Finished::NotMember(Box::new(verified)));
    }
    Ok(Finished::Member(Box::new(verified)))
}

/// `POST /ui/logout`: with the session's CSRF token only, so that no
/// other site can sign anyone out.
pub async fn logout(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<HashMap<String, String>>,
) -> Response {
    if let Some(id) = cookie(&headers, SESSION_COOKIE) {
        let sent = form.get("csrf").map(String::as_str).unwrap_or_default();
        match console.sessions.get(&app, id).await {
            Ok(Some(session)) if !super::session::forged(&console.origin, &headers, sent, &session.csrf) => {
                // Deleted from the database: ended on every replica.
                if let Err(error) = console.sessions.close(&app, id).await {
                    return page::state_unavailable(&error);
                }
            }
            Ok(Some(_)) => return redirect("/ui"),
            Ok(None) => {}
            Err(error) => return page::state_unavailable(&error),
        }
    }
    let mut response = redirect("/ui/signed-out");
    if let Ok(value) = set_cookie(SESSION_COOKIE, None, console.lifetime).parse() {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_challenge_is_rfc_7636s() {
        // RFC 7636, appendix B.
        assert_eq!(
            challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn the_console_asks_for_the_clis_scopes_but_offline_access() {
        let scopes = |list: &[&str]| scope(&list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(scopes(&["openid", "profile", "offline_access"]), "openid profile");
        assert_eq!(
            scopes(&["openid", "profile", "email", "groups", "offline_access"]),
            "openid profile email groups"
        );
        assert_eq!(scopes(&["groups", "openid"]), "openid groups");
        assert_eq!(scopes(&[]), "openid");
    }

    #[test]
    fn only_console_paths_are_returned_to() {
        for (asked, to) in [
            ("/ui/records/5", "/ui/records/5"),
            ("/ui?user=a", "/ui?user=a"),
            ("https://evil.example/", "/ui"),
            ("//evil.example/ui", "/ui"),
            ("/ui//evil.example", "/ui"),
            ("/ui\\..\\x", "/ui"),
            ("/uix", "/ui"),
        ] {
            assert_eq!(return_path(Some(&asked.to_owned())), to, "{asked}");
        }
        assert_eq!(return_path(None), "/ui");
        let long = format!("/ui?user={}", "a".repeat(RETURN_MAX));
        assert_eq!(return_path(Some(&long)), "/ui", "too long to keep");
        let longest = format!("/ui?user={}", "a".repeat(RETURN_MAX - 9));
        assert_eq!(return_path(Some(&longest)), longest);
    }
}
