//! API errors as RFC 9457 problem details (`application/problem+json`), each
//! with a stable `code` and the `request_id` that also appears in the logs
//! and the audit record. 5xx bodies say nothing about internals.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::REQUEST_ID_HEADER;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
    /// Machine-readable extras (entitled roles, CSR reason, server time...).
    pub extra: Map<String, Value>,
    pub request_id: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: detail.into(),
            extra: Map::new(),
            request_id: String::new(),
        }
    }

    pub fn with(mut self, key: &str, value: Value) -> Self {
        self.extra.insert(key.to_owned(), value);
        self
    }

    pub fn request_id(mut self, request_id: &str) -> Self {
        self.request_id = request_id.to_owned();
        self
    }

    /// The audit trail could not record the decision: nothing is issued.
    pub fn audit_unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "audit_unavailable",
            "the audit trail is unavailable, so no certificate can be issued; try again shortly",
        )
    }

    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "internal error; the request id is in the server log",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let title = self.status.canonical_reason().unwrap_or("Error");
        let mut body = json!({
            "type": "about:blank",
            "title": title,
            "status": self.status.as_u16(),
            "code": self.code,
            "detail": self.detail,
            "request_id": self.request_id,
        });
        if let Value::Object(map) = &mut body {
            map.extend(self.extra.clone());
        }
        let mut response = (self.status, body.to_string()).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = self.extra.get("retry_after_seconds").and_then(Value::as_u64)
            && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        if let Ok(id) = HeaderValue::from_str(&self.request_id) {
            response.headers_mut().insert(REQUEST_ID_HEADER, id);
        }
        response
    }
}
