//! API errors as RFC 9457 problem details (`application/problem+json`), each
//! with a stable `code` ([`ErrorCode`], shared with the CLI) and the
//! `request_id` that also appears in the logs and the audit record. 5xx
//! bodies say nothing about internals.
//!
//! Handlers return an [`ApiError`] without a request id; the request-id
//! middleware writes the body, with the id, once ([`ApiError::render`]).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use talos_sso_api::error::PROBLEM_CONTENT_TYPE;
use talos_sso_api::{ErrorCode, Problem};

use crate::audit::store::StoreError;
use crate::audit::writer::AuditError;
use crate::identity::auth_error::AuthError;
use crate::issuance::IssuanceError;
use crate::policy::Denial;
use talos_sso_text as text;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub error: ErrorCode,
    pub detail: String,
}

impl ApiError {
    /// The detail is escaped and bounded here, once: parser messages quote
    /// what the caller sent (unknown field names, query keys, token headers).
    pub fn new(error: ErrorCode, detail: impl Into<String>) -> Self {
        Self {
            error,
            detail: text::clean(&detail.into(), text::REASON_CHARS),
        }
    }

    /// The stable code, as recorded and counted.
    pub fn code(&self) -> &'static str {
        self.error.code()
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// `400 request_invalid`, optionally naming the query parameter at fault.
    pub fn request_invalid(detail: impl Into<String>, parameter: Option<&str>) -> Self {
        Self::new(
            ErrorCode::RequestInvalid {
                parameter: parameter.map(str::to_owned),
            },
            detail,
        )
    }

    /// The audit trail could not record the decision: nothing happened.
    pub fn audit_unavailable() -> Self {
        Self::new(
            ErrorCode::AuditUnavailable,
            "the audit trail is unavailable, so no certificate can be issued; try again shortly",
        )
    }

    pub fn internal() -> Self {
        Self::new(
            ErrorCode::InternalError,
            "internal error; the request id is in the server log",
        )
    }

    pub fn rate_limited(retry: std::time::Duration, who: &str) -> Self {
        let seconds = retry.as_secs().max(1);
        Self::new(
            ErrorCode::RateLimited {
                retry_after_seconds: seconds,
            },
            format!(
                "too many requests from {who}; try again in {}",
                in_seconds(seconds)
            ),
        )
    }

    /// The problem for a refusal that the router or its layers answered
    /// with a bare status and no body of ours: a method the endpoint does
    /// not take, a body over `http.body_limit` or one that could not be
    /// read (a broken chunked encoding), a request slower than
    /// `http.request_timeout`. Every error the API sends is a problem with
    /// a code; `None` for a status that is not such a refusal.
    pub fn for_plain_refusal(status: StatusCode) -> Option<Self> {
        let (error, detail) = match status {
            StatusCode::METHOD_NOT_ALLOWED => (
                ErrorCode::MethodNotAllowed,
                "this endpoint does not take that method; the Allow header names those it does",
            ),
            StatusCode::PAYLOAD_TOO_LARGE => (
                ErrorCode::BodyTooLarge,
                "the request body is larger than this server reads",
            ),
            StatusCode::REQUEST_TIMEOUT => (ErrorCode::RequestTimeout, "the request did not arrive in time"),
            StatusCode::BAD_REQUEST => (
                ErrorCode::RequestInvalid { parameter: None },
                "the request body could not be read",
            ),
            _ => return None,
        };
        Some(Self::new(error, detail))
    }

    /// A refused token; times come with the server's clock so that the
    /// client can tell a clock problem from a stale token.
    pub fn token(error: &AuthError, now: time::OffsetDateTime) -> Self {
        Self::new(error.error_code(now), error.to_string())
    }

    /// The whole answer, with the request id of the request it answers.
    pub fn render(&self, request_id: &str) -> Response {
        let status = self.status();
        let problem = Problem {
            kind: "about:blank".into(),
            title: status.canonical_reason().unwrap_or("Error").into(),
            status: status.as_u16(),
            error: self.error.clone(),
            detail: self.detail.clone(),
            request_id: request_id.to_owned(),
        };
        let body = serde_json::to_string(&problem).unwrap_or_default();
        let mut response = (status, body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(PROBLEM_CONTENT_TYPE),
        );
        if let ErrorCode::RateLimited { retry_after_seconds } = &self.error
            && let Ok(value) = HeaderValue::from_str(&retry_after_seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

impl IntoResponse for ApiError {
    /// Rendered without a request id; the request-id middleware finds the
    /// error in the response and renders it again with the id.
    fn into_response(self) -> Response {
        let mut response = self.render("");
        response.extensions_mut().insert(self);
        response
    }
}

impl From<Denial> for ApiError {
    fn from(denial: Denial) -> Self {
        Self::new(denial.error_code(), denial.to_string())
    }
}

impl From<IssuanceError> for ApiError {
    fn from(error: IssuanceError) -> Self {
        let code = error.error_code();
        match error {
            IssuanceError::Csr(csr) => Self::new(code, csr.to_string()),
            IssuanceError::Signing(_) => Self::internal(),
            IssuanceError::SigningUnavailable(_) => Self::new(
                code,
                "the CA's signing key (a hardware security module) cannot be reached right now, \
                 so nothing was issued; try again shortly",
            ),
            IssuanceError::AuditUnavailable => Self::audit_unavailable(),
            other => Self::new(code, other.to_string()),
        }
    }
}

impl From<AuditError> for ApiError {
    fn from(_: AuditError) -> Self {
        Self::audit_unavailable()
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        tracing::error!(%error, "audit store");
        Self::audit_unavailable()
    }
}

/// A wait in words: "1 second", "2 seconds".
pub(crate) fn in_seconds(seconds: u64) -> String {
    match seconds {
        1 => "1 second".into(),
        n => format!("{n} seconds"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_limit_says_its_wait_once_in_words() {
        let one = ApiError::rate_limited(std::time::Duration::from_millis(300), "you");
        assert_eq!(one.detail, "too many requests from you; try again in 1 second");
        let two = ApiError::rate_limited(std::time::Duration::from_secs(2), "your address");
        assert_eq!(
            two.detail,
            "too many requests from your address; try again in 2 seconds"
        );
    }

    #[test]
    fn what_the_caller_sent_comes_back_escaped_and_bounded() {
        let sent = format!("unknown field `\u{1b}[31mred\u{202e}`, and {}", "x".repeat(5000));
        let error = ApiError::request_invalid(
            format!("the request body is not a certificate request: {sent}"),
            None,
        );
        assert!(
            !error.detail.contains('\u{1b}') && !error.detail.contains('\u{202e}'),
            "{}",
            error.detail
        );
        assert!(error.detail.contains("\\u{1b}"), "{}", error.detail);
        assert!(
            error.detail.chars().count() <= text::REASON_CHARS + 16,
            "{}",
            error.detail.len()
        );

        let denial = Denial::RoleNotPermitted {
            requested: vec!["os:admin\u{0}".into()],
            entitled: vec!["os:reader".into()],
        };
        let ApiError {
            error: ErrorCode::RoleNotPermitted { refused, .. },
            detail,
        } = ApiError::from(denial)
        else {
            panic!("not role_not_permitted");
        };
        assert_eq!(refused, ["os:admin\\u{0}"]);
        assert!(!detail.contains('\0'), "{detail}");
    }
}
