//! The server's API as the client sees it: wire types and a small typed
//! client. Errors keep the server's stable `code` and its extras so that
//! `messages` can tell the person what to do.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Sent with every request; recorded in the audit trail.
pub const CLIENT_VERSION_HEADER: &str = "x-talos-sso-client-version";

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
    #[error("the server at {url} cannot be reached: {reason}")]
    Unreachable { url: String, reason: String },
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
            ApiError::Unreachable { .. } => "server_unreachable",
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
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .user_agent(concat!("talos-sso/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ApiError::Unreachable {
                url: server.to_owned(),
                reason: e.to_string(),
            })?;
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
        ApiError::Unreachable {
            url: self.base.clone(),
            reason: error.without_url().to_string(),
        }
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
