//! `--debug` (and `TALOS_SSO_DEBUG=1`): what the client did and why, on
//! standard error, for the person whose login fails at 3 a.m. Two kinds of
//! lines, both prefixed `debug:`:
//!
//! - the HTTP exchanges with the talos-sso server and the identity
//!   provider (method, URL, status, time taken, and a summary of each
//!   body), written by the two request paths: [`crate::api`] for the
//!   server, [`HttpClient`] (what openidconnect sends through) for the
//!   provider;
//! - the decisions (silent or interactive login and why, which flow, the
//!   certificate asked for, the talosconfig written), from [`note`].
//!
//! Nothing secret is written: tokens, codes, the PKCE verifier, state and
//! nonce, the device code, client secrets, keys and CSRs, headers. The
//! redaction works by allow-list ([`SHOWN_FIELDS`], [`SHOWN_FORM_FIELDS`],
//! [`SHOWN_QUERY`]): a field is shown only when it is known to be harmless,
//! so a field a provider adds tomorrow is hidden, not leaked. No header is
//! written at all. Every value shown is escaped and bounded, since the
//! provider's text is whoever answered's text.
//!
//! Whether debugging is on is a process-wide switch set once at start
//! ([`enable`]): the lines come from deep inside the login flows, and
//! threading a logger through every call for a flag read at start would
//! change every signature for nothing. With it off, each call site costs a
//! relaxed atomic load.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use openidconnect::{AsyncHttpClient, HttpClientError, HttpRequest, HttpResponse};

static ON: AtomicBool = AtomicBool::new(false);

/// Turn debugging on (or off) for the rest of the process.
pub fn enable(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Longest debug line, in characters.
const LINE_CHARS: usize = 2000;

/// Longest body summary, in characters.
const BODY_CHARS: usize = 800;

/// What a redacted value is shown as.
const REDACTED: &str = "<redacted>";

/// Write `line` when debugging is on: escaped (it may carry the
/// provider's or the server's text) and bounded.
fn emit(line: &str) {
    eprintln!("debug: {}", talos_sso_text::bounded(line, LINE_CHARS));
}

/// A decision, as one line on standard error when debugging is on. The
/// text is escaped, but never pass a secret: this is for what the client
/// chose and why.
pub fn note(text: std::fmt::Arguments<'_>) {
    if enabled() {
        emit(&text.to_string());
    }
}

/// JSON fields whose values are shown, in answers and requests of the
/// server and the provider: what says what happened, and nothing that
/// proves an identity. Everything else is [`REDACTED`] (an ID token,
/// `refresh_token`, `device_code`, a CSR, a certificate, a key).
pub const SHOWN_FIELDS: &[&str] = &[
    // OAuth 2.0 and OpenID Connect answers.
    "token_type",
    "expires_in",
    "ext_expires_in",
    "scope",
    "error",
    "error_description",
    "error_codes",
    "error_uri",
    "interval",
    "verification_uri",
    "verification_url",
    "user_code",
    // Discovery.
    "issuer",
    "authorization_endpoint",
    "token_endpoint",
    "device_authorization_endpoint",
    "jwks_uri",
    "end_session_endpoint",
    "scopes_supported",
    "grant_types_supported",
    "code_challenge_methods_supported",
    "authorization_response_iss_parameter_supported",
    // Key sets: which keys, not their material.
    "keys",
    "kid",
    "kty",
    "alg",
    "use",
    // The talos-sso API.
    "type",
    "title",
    "status",
    "code",
    "detail",
    "request_id",
    "retry_after_seconds",
    "entitled",
    "server_version",
    "api_version",
    "client_id",
    "scopes",
    "token",
    "clusters",
    "name",
    "description",
    "default_ttl_seconds",
    "max_ttl_seconds",
    "cluster",
    "roles",
    "ttl_seconds",
    "context",
    "not_after",
    "serial",
    "endpoints",
    "nodes",
    "identity",
    "username",
    "subject",
    "reason",
    "added_by",
    "added_at",
    "expires_at",
    "entries",
    "entry",
    "removed",
    "audit_id",
    "next_cursor",
    "intact",
    "verified",
    "last_seq",
];

/// Form fields whose values are shown (token and device requests): not
/// `code`, `code_verifier`, `refresh_token`, `device_code`,
/// `client_secret`, `client_assertion`.
pub const SHOWN_FORM_FIELDS: &[&str] = &[
    "grant_type",
    "client_id",
    "redirect_uri",
    "scope",
    "response_type",
];

/// Query parameters whose values are shown: the audit filters and the
/// harmless parts of an authorization request (not `state`, `nonce`,
/// `code_challenge`, `code`).
pub const SHOWN_QUERY: &[&str] = &[
    "client_id",
    "response_type",
    "response_mode",
    "scope",
    "redirect_uri",
    "code_challenge_method",
    "prompt",
    "api-version",
    "since",
    "until",
    "username",
    "subject",
    "cluster",
    "role",
    "outcome",
    "event",
    "serial",
    "client_ip",
    "cursor",
    "limit",
];

/// `url` as a debug line shows it: no user information, no fragment, and
/// the value of each query parameter not in [`SHOWN_QUERY`] redacted.
pub fn url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return REDACTED.to_owned();
    };
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    parsed.set_fragment(None);
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let shown = if SHOWN_QUERY.contains(&k.as_ref()) {
                    v.into_owned()
                } else {
                    REDACTED.to_owned()
                };
                (k.into_owned(), shown)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// A form body with each value not in [`SHOWN_FORM_FIELDS`] redacted.
pub fn form(body: &[u8]) -> String {
    let fields: Vec<String> = url::form_urlencoded::parse(body)
        .map(|(k, v)| {
            if SHOWN_FORM_FIELDS.contains(&k.as_ref()) {
                format!("{k}={v}")
            } else {
                format!("{k}={REDACTED}")
            }
        })
        .collect();
    format!("form {{{}}}", fields.join(", "))
}

/// A JSON value with every field not in [`SHOWN_FIELDS`] redacted, at
/// any depth (a shown field's objects are redacted the same way).
fn redact_json(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(key, value)| {
                    let value = if SHOWN_FIELDS.contains(&key.as_str()) {
                        redact_json(value)
                    } else {
                        Value::String(REDACTED.to_owned())
                    };
                    (key, value)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(redact_json).collect()),
        other => other,
    }
}

/// A body as a debug line shows it: JSON and forms with their secrets
/// redacted, anything else as its size alone.
pub fn body(content_type: Option<&str>, bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "no body".to_owned();
    }
    let kind = content_type.unwrap_or("").split(';').next().unwrap_or("").trim();
    let summary = if kind == "application/x-www-form-urlencoded" {
        form(bytes)
    } else if let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) {
        format!("json {}", redact_json(value))
    } else {
        let kind = if kind.is_empty() { "no content type" } else { kind };
        format!("{} bytes of {kind}", bytes.len())
    };
    talos_sso_text::bounded(&summary, BODY_CHARS)
}

/// Who an exchange is with.
#[derive(Debug, Clone, Copy)]
pub enum Peer {
    Server,
    IdentityProvider,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Server => "server",
            Peer::IdentityProvider => "identity provider",
        }
    }
}

/// One HTTP exchange being logged: [`Exchange::start`] writes the request,
/// then [`Exchange::answered`] or [`Exchange::failed`] the outcome with the
/// time taken. `None` when debugging is off.
#[derive(Debug)]
pub struct Exchange {
    peer: Peer,
    method: String,
    /// As requested: only to find it in an error's text (see [`Self::failed`]).
    target: String,
    /// As shown, redacted.
    url: String,
    started: Instant,
}

impl Exchange {
    pub fn start(
        peer: Peer,
        method: &str,
        target: &str,
        content_type: Option<&str>,
        request_body: &[u8],
    ) -> Option<Self> {
        if !enabled() {
            return None;
        }
        let url = url(target);
        let mut line = format!("{} request: {method} {url}", peer.name());
        if !request_body.is_empty() {
            let _ = write!(line, " with {}", body(content_type, request_body));
        }
        emit(&line);
        Some(Self {
            peer,
            method: method.to_owned(),
            target: target.to_owned(),
            url,
            started: Instant::now(),
        })
    }

    fn elapsed_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    /// The answer: its status, the time taken, and its body when read
    /// (`None` for a stream, read later).
    pub fn answered(self, status: u16, content_type: Option<&str>, response_body: Option<&[u8]>) {
        let mut line = format!(
            "{} answered {status} to {} {} in {:.1} ms",
            self.peer.name(),
            self.method,
            self.url,
            self.elapsed_ms()
        );
        if let Some(bytes) = response_body {
            let _ = write!(line, ": {}", body(content_type, bytes));
        }
        emit(&line);
    }

    /// No answer (the network, TLS, a timeout). The error's text names
    /// the URL as requested (reqwest's does): shown redacted there too.
    pub fn failed(self, error: &dyn std::error::Error) {
        emit(&self.failure_line(error));
    }

    fn failure_line(&self, error: &dyn std::error::Error) -> String {
        let text = talos_sso_api::error::error_chain(error).replace(&self.target, &self.url);
        format!(
            "{} did not answer {} {} after {:.1} ms: {text}",
            self.peer.name(),
            self.method,
            self.url,
            self.elapsed_ms(),
        )
    }
}

/// The HTTP client the login flows talk to the identity provider through
/// (openidconnect's requests and discovery): the reqwest client, with each
/// exchange logged when debugging is on.
#[derive(Debug, Clone)]
pub struct HttpClient {
    inner: openidconnect::reqwest::Client,
}

impl HttpClient {
    pub fn new(inner: openidconnect::reqwest::Client) -> Self {
        Self { inner }
    }

    /// `GET url` outside openidconnect (Entra's multi-tenant discovery).
    pub async fn get(
        &self,
        url: &str,
    ) -> Result<openidconnect::reqwest::Response, openidconnect::reqwest::Error> {
        let exchange = Exchange::start(Peer::IdentityProvider, "GET", url, None, &[]);
        let result = self.inner.get(url).send().await;
        if let Some(exchange) = exchange {
            match &result {
                // The body is read by the caller: its size is not known yet.
                Ok(response) => exchange.answered(response.status().as_u16(), None, None),
                Err(error) => exchange.failed(error),
            }
        }
        result
    }
}

/// The `Content-Type` of a request or an answer, to read its body by.
fn content_type(headers: &openidconnect::http::HeaderMap) -> Option<String> {
    headers
        .get(openidconnect::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

impl<'c> AsyncHttpClient<'c> for HttpClient {
    type Error = HttpClientError<openidconnect::reqwest::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, Self::Error>> + Send + Sync + 'c>>;

    fn call(&'c self, request: HttpRequest) -> Self::Future {
        Box::pin(async move {
            if !enabled() {
                return self.inner.call(request).await;
            }
            let exchange = Exchange::start(
                Peer::IdentityProvider,
                request.method().as_str(),
                &request.uri().to_string(),
                content_type(request.headers()).as_deref(),
                request.body(),
            );
            let result = self.inner.call(request).await;
            if let Some(exchange) = exchange {
                match &result {
                    Ok(response) => exchange.answered(
                        response.status().as_u16(),
                        content_type(response.headers()).as_deref(),
                        Some(response.body()),
                    ),
                    Err(error) => exchange.failed(error),
                }
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_urls_are_redacted_and_filters_kept() {
        let shown = url(
            "https://user:pw@idp.example/authorize?client_id=cli&state=s3cret&nonce=n0nce\
             &code_challenge=ch4llenge&redirect_uri=http%3A%2F%2Flocalhost%3A8000%2Fcallback\
             &scope=openid+offline_access#frag",
        );
        for secret in ["user", "pw", "s3cret", "n0nce", "ch4llenge", "frag"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("client_id=cli"), "{shown}");
        assert!(shown.contains("state=%3Credacted%3E"), "{shown}");
        assert!(shown.contains("scope=openid+offline_access"), "{shown}");
        let audit = url("https://sso.example/v1/audit?cursor=7&limit=100&user=x&cluster=prod");
        assert!(audit.contains("cursor=7&limit=100"), "{audit}");
        assert!(audit.contains("cluster=prod"), "{audit}");
        assert_eq!(url("not a url"), REDACTED);
    }

    #[test]
    fn token_requests_show_the_grant_and_hide_every_code() {
        let shown = form(
            b"grant_type=authorization_code&code=AUTHCODE&code_verifier=VERIFIER\
              &redirect_uri=http%3A%2F%2Flocalhost%3A8000%2Fcallback&client_id=cli\
              &refresh_token=RT&device_code=DC&client_secret=CS",
        );
        for secret in ["AUTHCODE", "VERIFIER", "RT", "DC", "CS"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("grant_type=authorization_code"), "{shown}");
        assert!(shown.contains("code_verifier=<redacted>"), "{shown}");
        assert!(
            shown.contains("redirect_uri=http://localhost:8000/callback"),
            "{shown}"
        );
    }

    #[test]
    fn token_answers_show_what_happened_not_the_tokens() {
        let answer = br#"{"token_type":"Bearer","expires_in":3599,"scope":"openid",
            "access_token":"AT.x.y","id_token":"IDT.x.y","refresh_token":"RT",
            "device_code":"DC","user_code":"ABCD-EFGH","some_new_secret":{"nested":"NS"}}"#;
        let shown = body(Some("application/json; charset=utf-8"), answer);
        for secret in ["AT.x.y", "IDT.x.y", "RT", "DC", "NS"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        for kept in [
            r#""token_type":"Bearer""#,
            r#""expires_in":3599"#,
            r#""user_code":"ABCD-EFGH""#,
            r#""id_token":"<redacted>""#,
        ] {
            assert!(shown.contains(kept), "{kept} not in {shown}");
        }
        // A certificate request: the cluster and roles, not the CSR.
        let request = br#"{"cluster":"prod","csr":"-----BEGIN CERTIFICATE REQUEST-----","roles":["os:admin"],"ttl_seconds":300}"#;
        let shown = body(Some("application/json"), request);
        assert!(!shown.contains("BEGIN"), "{shown}");
        assert!(shown.contains(r#""roles":["os:admin"]"#), "{shown}");
        // Not JSON: its size only.
        assert_eq!(
            body(Some("text/html"), b"<html>hi</html>"),
            "15 bytes of text/html"
        );
        assert_eq!(body(None, b""), "no body");
    }

    #[test]
    fn a_failure_names_the_url_redacted() {
        let target = "https://sso.example/v1/thing?state=s3cret&cursor=1";
        let exchange = Exchange {
            peer: Peer::Server,
            method: "GET".into(),
            target: target.into(),
            url: url(target),
            started: Instant::now(),
        };
        let error = std::io::Error::other(format!("error sending request for url ({target})"));
        let line = exchange.failure_line(&error);
        assert!(!line.contains("s3cret"), "{line}");
        assert!(
            line.contains(
                "sending request for url (https://sso.example/v1/thing?state=%3Credacted%3E&cursor=1)"
            ),
            "{line}"
        );
    }

    #[test]
    fn the_providers_text_is_escaped_and_bounded() {
        let answer = format!(
            r#"{{"error":"invalid_grant","error_description":"\u001b[2J\u202e{}"}}"#,
            "x".repeat(5000)
        );
        let shown = body(Some("application/json"), answer.as_bytes());
        assert!(!shown.chars().any(talos_sso_text::is_unsafe), "{shown}");
        assert!(shown.chars().count() <= BODY_CHARS, "{}", shown.len());
        assert!(shown.contains("invalid_grant"), "{shown}");
    }
}
