//! Errors as RFC 9457 problem details (`application/problem+json`): every
//! refusal has a stable `code`, its HTTP status, and the typed extra fields
//! that let the CLI tell the person what to do (the roles they may have, the
//! server's clock, when to try again). Also [`error_chain`], the one way
//! both programs write an error with its causes on one line.

use serde::{Deserialize, Serialize};

/// `error` and each of its causes not already in the text before it,
/// joined by `: ` (`error sending request: ... invalid peer certificate:
/// UnknownIssuer`): the top line alone rarely says what to fix.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The media type of every error body.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// Why a request was refused, serialised as `"code": "snake_case"` next to
/// the extra fields of that code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum ErrorCode {
    /// No such endpoint.
    NotFound,
    /// The endpoint exists, not with this method (the `Allow` header names
    /// those it takes).
    MethodNotAllowed,
    /// The body is larger than the server reads (`http.body_limit`).
    BodyTooLarge,
    /// The request did not arrive, or was not answered, within
    /// `http.request_timeout`.
    RequestTimeout,
    /// The body or a query parameter is not what the endpoint takes.
    RequestInvalid {
        /// The query parameter at fault, when one is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parameter: Option<String>,
    },
    /// No `Authorization: Bearer` token.
    TokenMissing,
    TokenMalformed,
    TokenAlgorithmNotAllowed,
    TokenKeyUnknown,
    TokenSignatureInvalid,
    /// `server_time` lets the client tell a clock problem from a stale token.
    TokenExpired {
        server_time: String,
    },
    TokenNotYetValid {
        server_time: String,
    },
    TokenIssuedInFuture {
        server_time: String,
    },
    TokenIssuerInvalid,
    /// The token's issuer (`iss`) is none the server trusts.
    TokenIssuerUntrusted,
    TokenAudienceInvalid,
    TokenClientInvalid,
    TokenTenantMissing,
    TokenTenantNotAllowed,
    TokenSubjectMissing,
    TokenUsernameMissing,
    /// The token already minted a certificate.
    TokenReplayed,
    /// Too many groups for the token, and Graph could not list them.
    GroupsOverageUnresolved,
    RateLimited {
        retry_after_seconds: u64,
    },
    ClusterUnknown {
        /// The clusters this server has.
        clusters: Vec<String>,
    },
    NoMatchingRule {
        /// What membership would grant a role ("group ...", "app role ...").
        would_grant: Vec<String>,
    },
    /// A workload token no workload rule of the cluster admits. Which rule
    /// and which claim missed is in the audit record (by the request id),
    /// never in the answer: anyone can mint a token for any audience.
    WorkloadNotAdmitted,
    RoleNotPermitted {
        refused: Vec<String>,
        entitled: Vec<String>,
    },
    RoleRequired {
        entitled: Vec<String>,
    },
    TtlInvalid,
    TtlTooLong {
        max_ttl_seconds: u64,
    },
    CsrInvalid {
        /// A stable code of its own (`csr_signature_invalid`, ...).
        reason: String,
    },
    /// On the deny list.
    IdentityDenied,
    NotAnAuditor,
    NotAnAdmin,
    /// A deny entry names a username no verified record ties to a subject.
    SubjectRequired,
    SubjectAmbiguous {
        subjects: Vec<String>,
    },
    AlreadyDenied {
        audit_id: i64,
    },
    /// The server signs no audit checkpoints (`audit.checkpoints` is not
    /// configured), so it cannot sign one on request.
    CheckpointsNotConfigured,
    /// The decision could not be recorded, so nothing happened.
    AuditUnavailable,
    /// The CA's key is in a hardware security module that cannot sign right
    /// now; nothing was issued, and the server retries by itself.
    SigningUnavailable,
    InternalError,
    /// A code this build does not know (a newer server).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// The `code` as sent.
    pub fn code(&self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::RequestInvalid { .. } => "request_invalid",
            ErrorCode::TokenMissing => "token_missing",
            ErrorCode::TokenMalformed => "token_malformed",
            ErrorCode::TokenAlgorithmNotAllowed => "token_algorithm_not_allowed",
            ErrorCode::TokenKeyUnknown => "token_key_unknown",
            ErrorCode::TokenSignatureInvalid => "token_signature_invalid",
            ErrorCode::TokenExpired { .. } => "token_expired",
            ErrorCode::TokenNotYetValid { .. } => "token_not_yet_valid",
            ErrorCode::TokenIssuedInFuture { .. } => "token_issued_in_future",
            ErrorCode::TokenIssuerInvalid => "token_issuer_invalid",
            ErrorCode::TokenIssuerUntrusted => "token_issuer_untrusted",
            ErrorCode::TokenAudienceInvalid => "token_audience_invalid",
            ErrorCode::TokenClientInvalid => "token_client_invalid",
            ErrorCode::TokenTenantMissing => "token_tenant_missing",
            ErrorCode::TokenTenantNotAllowed => "token_tenant_not_allowed",
            ErrorCode::TokenSubjectMissing => "token_subject_missing",
            ErrorCode::TokenUsernameMissing => "token_username_missing",
            ErrorCode::TokenReplayed => "token_replayed",
            ErrorCode::GroupsOverageUnresolved => "groups_overage_unresolved",
            ErrorCode::RateLimited { .. } => "rate_limited",
            ErrorCode::ClusterUnknown { .. } => "cluster_unknown",
            ErrorCode::NoMatchingRule { .. } => "no_matching_rule",
            ErrorCode::WorkloadNotAdmitted => "workload_not_admitted",
            ErrorCode::RoleNotPermitted { .. } => "role_not_permitted",
            ErrorCode::RoleRequired { .. } => "role_required",
            ErrorCode::TtlInvalid => "ttl_invalid",
            ErrorCode::TtlTooLong { .. } => "ttl_too_long",
            ErrorCode::CsrInvalid { .. } => "csr_invalid",
            ErrorCode::IdentityDenied => "identity_denied",
            ErrorCode::NotAnAuditor => "not_an_auditor",
            ErrorCode::NotAnAdmin => "not_an_admin",
            ErrorCode::SubjectRequired => "subject_required",
            ErrorCode::SubjectAmbiguous { .. } => "subject_ambiguous",
            ErrorCode::AlreadyDenied { .. } => "already_denied",
            ErrorCode::CheckpointsNotConfigured => "checkpoints_not_configured",
            ErrorCode::AuditUnavailable => "audit_unavailable",
            ErrorCode::SigningUnavailable => "signing_unavailable",
            ErrorCode::InternalError => "internal_error",
            ErrorCode::Unknown => "unknown",
        }
    }

    /// The HTTP status this code is sent with.
    pub fn status(&self) -> u16 {
        match self {
            ErrorCode::RequestInvalid { .. }
            | ErrorCode::TtlInvalid
            | ErrorCode::TtlTooLong { .. }
            | ErrorCode::CsrInvalid { .. }
            | ErrorCode::SubjectRequired => 400,
            ErrorCode::TokenMissing
            | ErrorCode::TokenMalformed
            | ErrorCode::TokenAlgorithmNotAllowed
            | ErrorCode::TokenKeyUnknown
            | ErrorCode::TokenSignatureInvalid
            | ErrorCode::TokenExpired { .. }
            | ErrorCode::TokenNotYetValid { .. }
            | ErrorCode::TokenIssuedInFuture { .. }
            | ErrorCode::TokenIssuerInvalid
            | ErrorCode::TokenIssuerUntrusted
            | ErrorCode::TokenAudienceInvalid
            | ErrorCode::TokenClientInvalid
            | ErrorCode::TokenTenantMissing
            | ErrorCode::TokenTenantNotAllowed
            | ErrorCode::TokenSubjectMissing
            | ErrorCode::TokenUsernameMissing
            | ErrorCode::TokenReplayed => 401,
            ErrorCode::GroupsOverageUnresolved
            | ErrorCode::NoMatchingRule { .. }
            | ErrorCode::WorkloadNotAdmitted
            | ErrorCode::RoleNotPermitted { .. }
            | ErrorCode::RoleRequired { .. }
            | ErrorCode::IdentityDenied
            | ErrorCode::NotAnAuditor
            | ErrorCode::NotAnAdmin => 403,
            ErrorCode::NotFound | ErrorCode::ClusterUnknown { .. } | ErrorCode::CheckpointsNotConfigured => {
                404
            }
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::BodyTooLarge => 413,
            ErrorCode::SubjectAmbiguous { .. } | ErrorCode::AlreadyDenied { .. } => 409,
            ErrorCode::RateLimited { .. } => 429,
            ErrorCode::InternalError | ErrorCode::Unknown => 500,
            ErrorCode::AuditUnavailable | ErrorCode::SigningUnavailable => 503,
        }
    }
}

/// An error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// Always `about:blank`: the `code` says what happened.
    #[serde(rename = "type")]
    pub kind: String,
    /// The status's reason phrase.
    pub title: String,
    pub status: u16,
    #[serde(flatten)]
    pub error: ErrorCode,
    /// For people; 5xx details say nothing about internals.
    pub detail: String,
    /// Also in the server's log and the audit record.
    pub request_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_chain_names_each_cause_once() {
        #[derive(Debug)]
        struct Layer(&'static str, Option<Box<Layer>>);
        impl std::fmt::Display for Layer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Layer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|l| l as _)
            }
        }
        let error = Layer(
            "error sending request",
            Some(Box::new(Layer(
                "tls: error sending request",
                Some(Box::new(Layer("invalid peer certificate: UnknownIssuer", None))),
            ))),
        );
        assert_eq!(
            error_chain(&error),
            "error sending request: tls: error sending request: invalid peer certificate: UnknownIssuer"
        );
        assert_eq!(error_chain(&Layer("alone", None)), "alone");
    }
    use serde_json::json;

    fn every_code() -> Vec<ErrorCode> {
        let list = || vec!["x".to_owned()];
        let time = || "2026-01-01T00:00:00.000000Z".to_owned();
        vec![
            ErrorCode::NotFound,
            ErrorCode::MethodNotAllowed,
            ErrorCode::BodyTooLarge,
            ErrorCode::RequestTimeout,
            ErrorCode::RequestInvalid { parameter: None },
            ErrorCode::TokenMissing,
            ErrorCode::TokenMalformed,
            ErrorCode::TokenAlgorithmNotAllowed,
            ErrorCode::TokenKeyUnknown,
            ErrorCode::TokenSignatureInvalid,
            ErrorCode::TokenExpired { server_time: time() },
            ErrorCode::TokenNotYetValid { server_time: time() },
            ErrorCode::TokenIssuedInFuture { server_time: time() },
            ErrorCode::TokenIssuerInvalid,
            ErrorCode::TokenIssuerUntrusted,
            ErrorCode::TokenAudienceInvalid,
            ErrorCode::TokenClientInvalid,
            ErrorCode::TokenTenantMissing,
            ErrorCode::TokenTenantNotAllowed,
            ErrorCode::TokenSubjectMissing,
            ErrorCode::TokenUsernameMissing,
            ErrorCode::TokenReplayed,
            ErrorCode::GroupsOverageUnresolved,
            ErrorCode::RateLimited {
                retry_after_seconds: 3,
            },
            ErrorCode::ClusterUnknown { clusters: list() },
            ErrorCode::NoMatchingRule { would_grant: list() },
            ErrorCode::WorkloadNotAdmitted,
            ErrorCode::RoleNotPermitted {
                refused: list(),
                entitled: list(),
            },
            ErrorCode::RoleRequired { entitled: list() },
            ErrorCode::TtlInvalid,
            ErrorCode::TtlTooLong { max_ttl_seconds: 9 },
            ErrorCode::CsrInvalid { reason: "r".into() },
            ErrorCode::IdentityDenied,
            ErrorCode::NotAnAuditor,
            ErrorCode::NotAnAdmin,
            ErrorCode::SubjectRequired,
            ErrorCode::SubjectAmbiguous { subjects: list() },
            ErrorCode::AlreadyDenied { audit_id: 4 },
            ErrorCode::AuditUnavailable,
            ErrorCode::SigningUnavailable,
            ErrorCode::InternalError,
        ]
    }

    #[test]
    fn each_code_is_sent_as_its_name_and_read_back_with_its_fields() {
        for error in every_code() {
            let problem = Problem {
                kind: "about:blank".into(),
                title: "t".into(),
                status: error.status(),
                error: error.clone(),
                detail: "d".into(),
                request_id: "r".into(),
            };
            let body = serde_json::to_value(&problem).unwrap();
            assert_eq!(body["code"], error.code(), "{error:?}");
            let back: Problem = serde_json::from_value(body).unwrap();
            assert_eq!(back, problem);
        }
    }

    #[test]
    fn a_code_from_a_newer_server_is_unknown_not_an_error() {
        let body = json!({"type": "about:blank", "title": "Forbidden", "status": 403,
            "code": "approval_pending", "approvers": ["x"], "detail": "d", "request_id": "r"});
        let problem: Problem = serde_json::from_value(body).unwrap();
        assert_eq!(problem.error, ErrorCode::Unknown);
        assert_eq!(problem.status, 403);
    }

    #[test]
    fn the_extra_fields_are_beside_the_code() {
        let body = serde_json::to_value(ErrorCode::RateLimited {
            retry_after_seconds: 7,
        })
        .unwrap();
        assert_eq!(body, json!({"code": "rate_limited", "retry_after_seconds": 7}));
        let body = serde_json::to_value(ErrorCode::RequestInvalid { parameter: None }).unwrap();
        assert_eq!(body, json!({"code": "request_invalid"}));
    }
}
