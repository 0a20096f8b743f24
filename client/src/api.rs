//! The server's API as the client sees it: wire types and a small typed
//! client. Errors keep the server's stable `code` and its extras so that
//! `messages` can tell the person what to do.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::connection::{ConnectionError, Peer};

/// Sent with every request; recorded in the audit trail.
pub const CLIENT_VERSION_HEADER: &str = "x-talos-sso-client-version";

/// How long one request to the server may take, answer included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct ClusterInfo {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub default_ttl_seconds: u64,
    #[serde(default)]
    pub max_ttl_seconds: u64,
}

/// `GET /v1/info`.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ServerInfo {
    pub server_version: String,
    pub api_version: u32,
    pub issuer: String,
    #[serde(default)]
    pub discovery_url: Option<String>,
    pub client_id: String,
    pub scopes: Vec<String>,
    pub clusters: Vec<ClusterInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CertificateRequest<'a> {
    pub cluster: &'a str,
    pub csr: &'a str,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub roles: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct Identity {
    pub issuer: String,
    #[serde(default)]
    pub tenant: Option<String>,
    pub subject: String,
    pub username: String,
}

/// `201` from `POST /v1/certificates`.
#[derive(Debug, Clone, Deserialize)]
pub struct IssuedCertificate {
    /// Leaf, then intermediates: the talosconfig `crt`.
    pub certificate: String,
    /// The Talos CA bundle: the talosconfig `ca`.
    pub ca: String,
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub nodes: Vec<String>,
    pub cluster: String,
    pub context: String,
    pub roles: Vec<String>,
    pub identity: Identity,
    pub serial: String,
    pub not_before: String,
    pub not_after: String,
    pub audit_id: i64,
}

/// One page of `GET /v1/audit`.
#[derive(Debug, Clone, Deserialize)]
pub struct AuditPage {
    pub records: Vec<Map<String, Value>>,
    pub next_cursor: Option<i64>,
}

/// A problem-details answer, or a transport failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// No answer: the address, the network or TLS (see [`crate::connection`]).
    #[error(transparent)]
    Unreachable(ConnectionError),
    #[error("{detail} [{code}]")]
    Problem {
        status: u16,
        code: String,
        detail: String,
        request_id: String,
        extra: Map<String, Value>,
    },
    #[error("the server answered HTTP {status} with something that is not its API: {snippet}")]
    Unexpected { status: u16, snippet: String },
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

#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
}

impl ApiClient {
    pub fn new(server: &str) -> Result<Self, ApiError> {
        Self::with_timeout(server, REQUEST_TIMEOUT)
    }

    /// [`ApiClient::new`] with another request timeout (tests wait less).
    pub fn with_timeout(server: &str, timeout: Duration) -> Result<Self, ApiError> {
        ConnectionError::check_address(Peer::Server, server).map_err(ApiError::Unreachable)?;
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(concat!("talos-sso/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ApiError::Unreachable(ConnectionError::from_error(Peer::Server, server, &e)))?;
        Ok(Self {
            http,
            base: server.trim_end_matches('/').to_owned(),
        })
    }

    async fn read<T: for<'de> Deserialize<'de>>(&self, response: reqwest::Response) -> Result<T, ApiError> {
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| self.unreachable(e))?;
        if (200..300).contains(&status) {
            return serde_json::from_str(&text).map_err(|_| ApiError::Unexpected {
                status,
                snippet: text.chars().take(120).collect(),
            });
        }
        match serde_json::from_str::<Map<String, Value>>(&text) {
            Ok(mut body) if body.get("code").is_some_and(Value::is_string) => {
                let take = |body: &mut Map<String, Value>, key: &str| {
                    body.remove(key)
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                };
                let code = take(&mut body, "code");
                let detail = take(&mut body, "detail");
                let request_id = take(&mut body, "request_id");
                for key in ["type", "title", "status"] {
                    body.remove(key);
                }
                Err(ApiError::Problem {
                    status,
                    code,
                    detail,
                    request_id,
                    extra: body,
                })
            }
            _ => Err(ApiError::Unexpected {
                status,
                snippet: text.chars().take(120).collect(),
            }),
        }
    }

    fn unreachable(&self, error: reqwest::Error) -> ApiError {
        ApiError::Unreachable(ConnectionError::from_error(Peer::Server, &self.base, &error))
    }

    pub async fn info(&self) -> Result<ServerInfo, ApiError> {
        let response = self
            .http
            .get(format!("{}/v1/info", self.base))
            .header(CLIENT_VERSION_HEADER, env!("CARGO_PKG_VERSION"))
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        self.read(response).await
    }

    /// `GET /v1/audit` with filter parameters; returns (records, next cursor).
    pub async fn audit(&self, token: &str, params: &[(&str, String)]) -> Result<AuditPage, ApiError> {
        let response = self
            .http
            .get(format!("{}/v1/audit", self.base))
            .query(params)
            .bearer_auth(token)
            .header(CLIENT_VERSION_HEADER, env!("CARGO_PKG_VERSION"))
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        self.read(response).await
    }

    /// `GET /v1/audit/verify`.
    pub async fn audit_verify(&self, token: &str) -> Result<Value, ApiError> {
        let response = self
            .http
            .get(format!("{}/v1/audit/verify", self.base))
            .bearer_auth(token)
            .header(CLIENT_VERSION_HEADER, env!("CARGO_PKG_VERSION"))
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        self.read(response).await
    }

    /// `GET`, `POST` or `DELETE /v1/deny` (admins).
    pub async fn deny(
        &self,
        token: &str,
        method: reqwest::Method,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> Result<Value, ApiError> {
        let mut request = self
            .http
            .request(method, format!("{}/v1/deny", self.base))
            .query(query)
            .bearer_auth(token)
            .header(CLIENT_VERSION_HEADER, env!("CARGO_PKG_VERSION"));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        self.read(response).await
    }

    pub async fn request_certificate(
        &self,
        token: &str,
        request: &CertificateRequest<'_>,
    ) -> Result<IssuedCertificate, ApiError> {
        let response = self
            .http
            .post(format!("{}/v1/certificates", self.base))
            .bearer_auth(token)
            .header(CLIENT_VERSION_HEADER, env!("CARGO_PKG_VERSION"))
            .json(request)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        self.read(response).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_address_without_a_scheme_is_refused_before_any_request() {
        let error = ApiClient::new("127.0.0.1:8443").unwrap_err();
        assert_eq!(error.code(), "server_address_invalid");
        assert_eq!(
            crate::messages::explain(&error, ""),
            "the server address `127.0.0.1:8443` has no scheme: use https://HOST:PORT, \
             e.g. --server https://127.0.0.1:8443"
        );
    }

    /// The CLI has no knob for the request timeout (30 seconds), so the
    /// timeout is shortened here: a server that accepts and never answers.
    #[tokio::test]
    async fn a_server_that_never_answers_times_out_with_a_sentence() {
        let (port, held) = crate::connection::test_peers::silent_peer().await;
        let url = format!("https://127.0.0.1:{port}");
        let api = ApiClient::with_timeout(&url, Duration::from_millis(300)).unwrap();
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
