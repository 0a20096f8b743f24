//! The server's API as the client sees it: a small typed client over the
//! wire types of `talos_sso_api`. Errors keep the server's stable `code`
//! and its typed extras so that `messages` can tell the person what to do.

use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use talos_sso_api::{
    AuditPage, AuditQuery, CLIENT_VERSION_HEADER, CertificateRequest, ChainStatus, DenyAdded, DenyList,
    DenyRemoved, DenyRequest, ErrorCode, IssuedCertificate, Problem, ServerInfo,
};

use talos_sso_api::feed::{STREAM_PATH, StreamLine};

use crate::connection::{ConnectionError, Peer};
use crate::debug;
use crate::trust::ExtraRoots;

/// The `Content-Type` of a request or an answer, to summarise its body by.
fn content_type(headers: &reqwest::header::HeaderMap) -> Option<String> {
    headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// How long one request to the server may take, answer included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of an answer that is not the API shown in an error.
const SNIPPET_LIMIT: usize = 120;

/// A problem-details answer, or a transport failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// No answer: the address, the network or TLS (see [`crate::connection`]).
    #[error(transparent)]
    Unreachable(ConnectionError),
    #[error("{detail} [{code}]")]
    Problem {
        status: u16,
        /// The `code` as sent: also the name of one this build does not
        /// know, for which `error` is [`ErrorCode::Unknown`].
        code: String,
        error: ErrorCode,
        detail: String,
        request_id: String,
    },
    #[error(
        "the server answered HTTP {status} with something that is not its API: {}",
        shown_snippet(snippet)
    )]
    Unexpected { status: u16, snippet: String },
}

/// The start of an answer as an error shows it; an empty one is named, so
/// that the sentence does not end in nothing.
fn shown_snippet(snippet: &str) -> &str {
    if snippet.trim().is_empty() {
        "an empty body"
    } else {
        snippet
    }
}

impl ApiError {
    pub fn code(&self) -> &str {
        match self {
            ApiError::Unreachable(failure) if failure.cause.is_address() => "server_address_invalid",
            ApiError::Unreachable(_) => "server_unreachable",
            ApiError::Problem { code, .. } => code,
            ApiError::Unexpected { .. } => "server_unexpected",
        }
    }
}

/// What every problem body has, read loosely: a body whose code this build
/// knows but whose fields it does not (an older or newer server) still
/// tells the person what happened, as [`ErrorCode::Unknown`].
#[derive(Deserialize)]
struct LooseProblem {
    code: String,
    #[serde(default)]
    detail: String,
    #[serde(default)]
    request_id: String,
}

/// The error an answer of `status` with the problem body `text` stands for;
/// `None` when the body is not problem details (it has no `code`).
pub(crate) fn problem(status: u16, text: &str) -> Option<ApiError> {
    let LooseProblem {
        code,
        detail,
        request_id,
    } = serde_json::from_str(text).ok()?;
    let error = serde_json::from_str::<Problem>(text).map_or(ErrorCode::Unknown, |p| p.error);
    Some(ApiError::Problem {
        status,
        code,
        error,
        detail,
        request_id,
    })
}

#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    /// For answers that last (the audit stream): no overall timeout, but
    /// one on each read, longer than the server's heartbeat. Built on first
    /// use: each client loads the system's root certificates, which is most
    /// of the CPU a login or a watch's renewal spends here.
    streaming: std::sync::Arc<std::sync::OnceLock<reqwest::Client>>,
    roots: Option<ExtraRoots>,
    timeout: Duration,
    base: String,
}

/// A client for `server`, trusting `roots` too.
fn client(
    builder: reqwest::ClientBuilder,
    roots: Option<&ExtraRoots>,
    server: &str,
) -> Result<reqwest::Client, ApiError> {
    ExtraRoots::apply(roots, builder)
        .user_agent(concat!("talos-sso/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ApiError::Unreachable(ConnectionError::from_error(Peer::Server, server, &e)))
}

/// Longest wait for the next bytes of the audit stream: several of the
/// server's heartbeats (15 seconds by default).
pub const STREAM_READ_TIMEOUT: Duration = Duration::from_secs(90);

/// Longest line of the audit stream read (a record is a few KiB).
const MAX_STREAM_LINE: usize = 4 * 1024 * 1024;

/// An open `GET /v1/audit/stream`, read a line at a time.
#[derive(Debug)]
pub struct AuditStream {
    response: reqwest::Response,
    buffer: Vec<u8>,
    base: String,
}

impl AuditStream {
    /// The next line; `None` when the connection ended (after the server's
    /// last line, or cut).
    pub async fn next_line(&mut self) -> Result<Option<StreamLine>, ApiError> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return serde_json::from_slice(&line)
                    .map(Some)
                    .map_err(|_| ApiError::Unexpected {
                        status: 200,
                        snippet: String::from_utf8_lossy(&line)
                            .chars()
                            .take(SNIPPET_LIMIT)
                            .collect(),
                    });
            }
            if self.buffer.len() > MAX_STREAM_LINE {
                return Err(ApiError::Unexpected {
                    status: 200,
                    snippet: format!("a line longer than {MAX_STREAM_LINE} bytes"),
                });
            }
            let chunk = self.response.chunk().await.map_err(|e| {
                ApiError::Unreachable(ConnectionError::from_error(Peer::Server, &self.base, &e))
            })?;
            match chunk {
                Some(bytes) => self.buffer.extend_from_slice(&bytes),
                None => return Ok(None),
            }
        }
    }
}

impl ApiClient {
    pub fn new(server: &str) -> Result<Self, ApiError> {
        Self::with_options(server, REQUEST_TIMEOUT, None)
    }

    /// A client that also trusts `roots` (`login --certificate-authority`).
    pub fn trusting(server: &str, roots: Option<&ExtraRoots>) -> Result<Self, ApiError> {
        Self::with_options(server, REQUEST_TIMEOUT, roots)
    }

    /// [`ApiClient::new`] with another request timeout (tests wait less)
    /// and extra trusted authorities.
    pub fn with_options(
        server: &str,
        timeout: Duration,
        roots: Option<&ExtraRoots>,
    ) -> Result<Self, ApiError> {
        ConnectionError::check_address(Peer::Server, server).map_err(ApiError::Unreachable)?;
        let http = client(reqwest::Client::builder().timeout(timeout), roots, server)?;
        Ok(Self {
            http,
            streaming: Default::default(),
            roots: roots.cloned(),
            timeout,
            base: server.trim_end_matches('/').to_owned(),
        })
    }

    /// A request to `path` (`/v1/...`) on this server.
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .header(CLIENT_VERSION_HEADER, env!("CARGO_PKG_VERSION"))
    }

    /// Send `request` on `client`: the one path every request to the
    /// server takes, so that `--debug` sees each of them (see
    /// [`crate::debug`]). The answer's body is left to the caller, which
    /// reports it with the returned exchange.
    async fn send(
        &self,
        client: &reqwest::Client,
        request: reqwest::RequestBuilder,
    ) -> Result<(reqwest::Response, Option<debug::Exchange>), ApiError> {
        let request = request.build().map_err(|e| self.unreachable(e))?;
        if !debug::enabled() {
            let response = client.execute(request).await.map_err(|e| self.unreachable(e))?;
            return Ok((response, None));
        }
        let exchange = debug::Exchange::start(
            debug::Peer::Server,
            request.method().as_str(),
            request.url().as_str(),
            content_type(request.headers()).as_deref(),
            request
                .body()
                .and_then(reqwest::Body::as_bytes)
                .unwrap_or_default(),
        );
        match client.execute(request).await {
            Ok(response) => Ok((response, exchange)),
            Err(error) => {
                if let Some(exchange) = exchange {
                    exchange.failed(&error);
                }
                Err(self.unreachable(error))
            }
        }
    }

    /// Send `request` and read its answer: `T` on success, else the
    /// server's problem details.
    async fn call<T: DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> Result<T, ApiError> {
        let (response, exchange) = self.send(&self.http, request).await?;
        let status = response.status().as_u16();
        let kind = content_type(response.headers());
        let text = match response.text().await {
            Ok(text) => text,
            Err(error) => {
                if let Some(exchange) = exchange {
                    exchange.failed(&error);
                }
                return Err(self.unreachable(error));
            }
        };
        if let Some(exchange) = exchange {
            exchange.answered(status, kind.as_deref(), Some(text.as_bytes()));
        }
        let unexpected = || ApiError::Unexpected {
            status,
            snippet: text.chars().take(SNIPPET_LIMIT).collect(),
        };
        if (200..300).contains(&status) {
            return serde_json::from_str(&text).map_err(|_| unexpected());
        }
        Err(problem(status, &text).unwrap_or_else(unexpected))
    }

    fn unreachable(&self, error: reqwest::Error) -> ApiError {
        ApiError::Unreachable(ConnectionError::from_error(Peer::Server, &self.base, &error))
    }

    pub async fn info(&self) -> Result<ServerInfo, ApiError> {
        self.call(self.request(reqwest::Method::GET, "/v1/info")).await
    }

    /// One page of `GET /v1/audit` for `query`.
    pub async fn audit(&self, token: &str, query: &AuditQuery) -> Result<AuditPage, ApiError> {
        let request = self.request(reqwest::Method::GET, "/v1/audit").query(query);
        self.call(request.bearer_auth(token)).await
    }

    /// `GET /v1/audit/stream` for `query` (its `cursor` included): the
    /// stream once the server accepted it, else its problem.
    pub async fn audit_stream(&self, token: &str, query: &AuditQuery) -> Result<AuditStream, ApiError> {
        let streaming = match self.streaming.get() {
            Some(streaming) => streaming,
            None => {
                let built = client(
                    reqwest::Client::builder()
                        .connect_timeout(self.timeout)
                        .read_timeout(STREAM_READ_TIMEOUT),
                    self.roots.as_ref(),
                    &self.base,
                )?;
                self.streaming.get_or_init(|| built)
            }
        };
        let request = streaming
            .get(format!("{}{STREAM_PATH}", self.base))
            .header(CLIENT_VERSION_HEADER, env!("CARGO_PKG_VERSION"))
            .query(query)
            .bearer_auth(token);
        let (response, exchange) = self.send(streaming, request).await?;
        let status = response.status().as_u16();
        if let Some(exchange) = exchange {
            // The records follow as they are committed: not read here.
            exchange.answered(status, None, None);
        }
        if status == 200 {
            return Ok(AuditStream {
                response,
                buffer: Vec::new(),
                base: self.base.clone(),
            });
        }
        let text = response.text().await.map_err(|e| self.unreachable(e))?;
        Err(problem(status, &text).unwrap_or_else(|| ApiError::Unexpected {
            status,
            snippet: text.chars().take(SNIPPET_LIMIT).collect(),
        }))
    }

    /// `GET /v1/audit/verify`.
    pub async fn audit_verify(&self, token: &str) -> Result<ChainStatus, ApiError> {
        let request = self.request(reqwest::Method::GET, "/v1/audit/verify");
        self.call(request.bearer_auth(token)).await
    }

    /// `GET /v1/deny` (admins).
    pub async fn deny_list(&self, token: &str) -> Result<DenyList, ApiError> {
        let request = self.request(reqwest::Method::GET, "/v1/deny");
        self.call(request.bearer_auth(token)).await
    }

    /// `POST /v1/deny` (admins).
    pub async fn deny_add(&self, token: &str, entry: &DenyRequest) -> Result<DenyAdded, ApiError> {
        let request = self.request(reqwest::Method::POST, "/v1/deny").json(entry);
        self.call(request.bearer_auth(token)).await
    }

    /// `DELETE /v1/deny` (admins): the entries `target` names.
    pub async fn deny_remove(&self, token: &str, target: &DenyRequest) -> Result<DenyRemoved, ApiError> {
        let request = self.request(reqwest::Method::DELETE, "/v1/deny").query(target);
        self.call(request.bearer_auth(token)).await
    }

    pub async fn request_certificate(
        &self,
        token: &str,
        request: &CertificateRequest,
    ) -> Result<IssuedCertificate, ApiError> {
        debug::note(format_args!(
            "asking for a certificate for cluster {} with {} for {}",
            request.cluster,
            if request.roles.is_empty() {
                "the cluster's default roles".to_owned()
            } else {
                format!("the roles {}", request.roles.join(", "))
            },
            request
                .ttl_seconds
                .map_or("the cluster's default lifetime".to_owned(), |s| format!(
                    "{s} seconds"
                )),
        ));
        let request = self
            .request(reqwest::Method::POST, "/v1/certificates")
            .json(request);
        self.call(request.bearer_auth(token)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_whose_fields_this_build_does_not_know_still_names_its_code() {
        // `token_expired` without its `server_time`, and a code from a newer server.
        for body in [
            r#"{"code":"token_expired","detail":"expired","request_id":"r-1"}"#,
            r#"{"type":"about:blank","title":"Forbidden","status":403,"code":"approval_pending","detail":"wait","request_id":"r-2","approvers":["x"]}"#,
        ] {
            let Some(ApiError::Problem {
                code, error, detail, ..
            }) = problem(403, body)
            else {
                panic!("not read as a problem: {body}");
            };
            assert_eq!(error, ErrorCode::Unknown, "{body}");
            assert!(!code.is_empty() && !detail.is_empty(), "{body}");
        }
        let typed = r#"{"type":"about:blank","title":"Too Many Requests","status":429,"code":"rate_limited","retry_after_seconds":3,"detail":"slow","request_id":"r"}"#;
        assert!(matches!(
            problem(429, typed),
            Some(ApiError::Problem {
                error: ErrorCode::RateLimited {
                    retry_after_seconds: 3
                },
                ..
            })
        ));
        assert!(
            problem(500, r#"{"error":"nope"}"#).is_none(),
            "no code, no problem"
        );
    }

    #[test]
    fn a_server_address_without_a_scheme_is_refused_before_any_request() {
        let error = ApiClient::new("127.0.0.1:8443").unwrap_err();
        assert_eq!(error.code(), "server_address_invalid");
        assert_eq!(
            crate::messages::explain(&error, ""),
            "the server address `127.0.0.1:8443` has no scheme: use https://HOST:PORT, \
             or http:// for a server on this machine, e.g. --server http://127.0.0.1:8443"
        );
    }

    /// A web server that is not talos-sso answers 404 to `/v1/info`, often
    /// with nothing at all.
    #[tokio::test]
    async fn an_empty_answer_that_is_not_the_api_is_named_as_such() {
        let (port, serving) = crate::connection::test_peers::answering_peer(
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await;
        let api = ApiClient::new(&format!("http://127.0.0.1:{port}")).unwrap();
        let error = api.info().await.unwrap_err();
        assert_eq!(error.code(), "server_unexpected");
        assert_eq!(
            crate::messages::explain(&error, ""),
            "the server answered HTTP 404 with something that is not its API: an empty body. \
             Is --server pointing at a talos-sso server?"
        );
        serving.abort();
    }

    #[test]
    fn an_answer_that_is_not_the_api_is_quoted() {
        let html = ApiError::Unexpected {
            status: 502,
            snippet: "<html>Bad Gateway</html>".into(),
        };
        assert_eq!(
            html.to_string(),
            "the server answered HTTP 502 with something that is not its API: <html>Bad Gateway</html>"
        );
    }

    #[test]
    fn problem_details_keep_the_code_as_sent() {
        let body = |code: &str, extra: &str| {
            format!(
                r#"{{"type": "about:blank", "title": "Forbidden", "status": 403, "code": "{code}",
                    "detail": "d", "request_id": "r"{extra}}}"#
            )
        };
        let Some(ApiError::Problem { code, error, .. }) =
            problem(403, &body("role_required", r#", "entitled": ["os:reader"]"#))
        else {
            panic!("a problem");
        };
        assert_eq!(code, "role_required");
        assert_eq!(
            error,
            ErrorCode::RoleRequired {
                entitled: vec!["os:reader".into()]
            }
        );
        // A newer server's code: unknown to this build, still named.
        let newer = problem(403, &body("approval_pending", r#", "approvers": ["x"]"#)).unwrap();
        assert_eq!(newer.code(), "approval_pending");
        assert_eq!(newer.to_string(), "d [approval_pending]");
        // Not problem details at all.
        assert!(problem(404, "").is_none());
        assert!(problem(404, r#"{"error": "not found"}"#).is_none());
    }

    /// The CLI has no knob for the request timeout (30 seconds), so the
    /// timeout is shortened here: a server that accepts and never answers.
    #[tokio::test]
    async fn a_server_that_never_answers_times_out_with_a_sentence() {
        let (port, held) = crate::connection::test_peers::silent_peer().await;
        let url = format!("https://127.0.0.1:{port}");
        let api = ApiClient::with_options(&url, Duration::from_millis(300), None).unwrap();
        let error = api.info().await.unwrap_err();
        assert_eq!(error.code(), "server_unreachable");
        assert_eq!(
            crate::messages::explain(&error, ""),
            format!(
                "the talos-sso server at {url} cannot be reached: 127.0.0.1:{port} did not answer in time; \
                 the server or the network is slow, or a firewall drops the traffic: try again, and check \
                 the address [error sending request: operation timed out]"
            )
        );
        held.abort();
    }
}
