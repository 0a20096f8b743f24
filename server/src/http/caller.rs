//! The caller of an endpoint: what the request says about them before any
//! check (address, user agent, client version, bearer token), and the
//! record of a request of theirs. Their authentication, and the recording
//! of every refusal, is the gate's ([`super::gate`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use talos_sso_api::CLIENT_VERSION_HEADER;

use super::RequestId;
use super::error::ApiError;
use crate::app::App;
use crate::audit::{AuditRecord, outcome};
use crate::ratelimit::address_key;
use talos_sso_text as text;

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
pub(super) enum Credentials {
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

    /// What the `Authorization` header holds, unverified.
    pub(super) fn credentials(&self) -> &Credentials {
        &self.credentials
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
