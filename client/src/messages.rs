//! What a person reads when something goes wrong: each server `code` becomes
//! a sentence that says what happened and what to do about it.

use talos_sso_api::ErrorCode;

use crate::api::ApiError;

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// The difference between the server's clock (`server_time`) and ours,
/// when it matters.
fn clock_skew(server_time: &str) -> Option<i64> {
    let server = talos_sso_api::audit::parse_micros(server_time)?;
    let skew = (time::OffsetDateTime::now_utc() - server).whole_seconds();
    (skew.abs() >= 60).then_some(skew)
}

fn ttl_refused(cluster: &str, max_ttl_seconds: u64) -> String {
    format!(
        "that --ttl is not allowed on cluster `{cluster}` (at most {max_ttl_seconds} seconds); ask for less"
    )
}

/// A message for `error` while asking for a certificate on `cluster`.
pub fn explain(error: &ApiError, cluster: &str) -> String {
    let ApiError::Problem {
        code,
        error,
        detail,
        request_id,
        ..
    } = error
    else {
        return match error {
            // Its sentence names the cause and the fix (see `connection`).
            ApiError::Unreachable(failure) => failure.to_string(),
            other => format!("{other}. Is --server pointing at a talos-sso server?"),
        };
    };
    let message = match error {
        ErrorCode::NoMatchingRule { would_grant } => format!(
            "no group or app role of yours grants a role on cluster `{cluster}`; ask for membership in one of: {}",
            list(would_grant)
        ),
        ErrorCode::WorkloadNotAdmitted => format!(
            "no workload rule of cluster `{cluster}` admits this token; the server's audit record of this request says which rule and claim missed ({detail})"
        ),
        ErrorCode::TokenIssuerUntrusted => format!(
            "the server trusts no issuer named in this token ({detail}); an administrator adds it under identity.trusted_issuers"
        ),
        ErrorCode::RoleNotPermitted { refused, entitled } => format!(
            "you may not have {} on cluster `{cluster}`; you are entitled to: {}. Ask with --role for one of those",
            list(refused),
            list(entitled)
        ),
        ErrorCode::RoleRequired { entitled } => format!(
            "cluster `{cluster}` grants no role unless you ask for one; run again with --role (you may have: {})",
            list(entitled)
        ),
        ErrorCode::TtlTooLong { max_ttl_seconds } => ttl_refused(cluster, *max_ttl_seconds),
        ErrorCode::TtlInvalid => "a --ttl must be at least one second; ask for more".into(),
        ErrorCode::TokenExpired { server_time }
        | ErrorCode::TokenNotYetValid { server_time }
        | ErrorCode::TokenIssuedInFuture { server_time } => match clock_skew(server_time) {
            Some(skew) => format!(
                "the server clock and yours differ by {} minutes ({}), so your login looks {}; fix the clock (NTP) and log in again",
                skew.abs() / 60 + i64::from(skew.abs() % 60 >= 30),
                if skew > 0 { "yours is ahead" } else { "yours is behind" },
                if matches!(error, ErrorCode::TokenExpired { .. }) { "expired" } else { "not valid yet" }
            ),
            None => "your login has expired; run `talos-sso login` again".into(),
        },
        ErrorCode::TokenReplayed => "this login was already used for a certificate; run `talos-sso login` again".into(),
        ErrorCode::TokenMissing
        | ErrorCode::TokenMalformed
        | ErrorCode::TokenSignatureInvalid
        | ErrorCode::TokenKeyUnknown
        | ErrorCode::TokenIssuerInvalid
        | ErrorCode::TokenAudienceInvalid
        | ErrorCode::TokenClientInvalid
        | ErrorCode::TokenAlgorithmNotAllowed
        | ErrorCode::TokenSubjectMissing => {
            format!(
                "the server does not accept this login ({detail}); check that the server and your identity provider belong together, then log in again"
            )
        }
        ErrorCode::TokenTenantMissing | ErrorCode::TokenTenantNotAllowed => {
            format!("your account's organisation is not allowed on this server ({detail}); log in with your work account")
        }
        ErrorCode::GroupsOverageUnresolved => format!(
            "you are in so many groups that they do not fit in your login token, and the server could not look them up; {detail}"
        ),
        ErrorCode::IdentityDenied => "you are blocked from new certificates on this server; ask the platform team".into(),
        ErrorCode::ClusterUnknown { clusters } => {
            format!("the server has no cluster `{cluster}`; it has: {}. Use --cluster", list(clusters))
        }
        ErrorCode::AuditUnavailable => {
            "the server cannot record decisions right now (its audit database is down), so it issues nothing; try again in a minute"
                .into()
        }
        ErrorCode::SigningUnavailable => {
            "the server cannot reach its CA signing key (a hardware security module) right now, so it issues nothing; \
             it reconnects by itself: try again in a minute, and tell the platform team if it lasts"
                .into()
        }
        ErrorCode::CsrInvalid { .. } => format!("the server refused the certificate request ({detail}); please report this"),
        ErrorCode::NotAnAuditor => {
            "reading the audit trail is for the security team; ask to be added to one of the server's `auditors` groups".into()
        }
        ErrorCode::NotAnAdmin => {
            "the deny list is for administrators; ask to be added to one of the server's `admins` groups".into()
        }
        // The server's detail says who asked too often and how long to
        // wait; an answer without one still gets the wait from its field.
        ErrorCode::RateLimited { retry_after_seconds } if detail.is_empty() => {
            format!("the server asks you to slow down; try again in {retry_after_seconds} s")
        }
        ErrorCode::RateLimited { .. } => format!("the server asks you to slow down: {detail}"),
        ErrorCode::NotFound
        | ErrorCode::MethodNotAllowed
        | ErrorCode::BodyTooLarge
        | ErrorCode::RequestTimeout
        | ErrorCode::RequestInvalid { .. }
        | ErrorCode::TokenUsernameMissing
        | ErrorCode::SubjectRequired
        | ErrorCode::SubjectAmbiguous { .. }
        | ErrorCode::AlreadyDenied { .. }
        | ErrorCode::CheckpointsNotConfigured
        | ErrorCode::InternalError
        | ErrorCode::Unknown => format!("{detail} [{code}]"),
    };
    format!("{message} (request id {request_id})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The error the client makes of a problem body with `code` and the
    /// fields in `extra`.
    fn problem(code: &str, extra: serde_json::Value) -> ApiError {
        let mut body = json!({"type": "about:blank", "title": "Forbidden", "status": 403,
            "code": code, "detail": format!("detail of {code}"), "request_id": "req-1"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().cloned().unwrap());
        crate::api::problem(403, &body.to_string()).unwrap()
    }

    #[test]
    fn every_server_code_has_its_sentence() {
        // The server's clock agrees with ours: a stale login, not a clock problem.
        let now = talos_sso_api::audit::format_micros(time::OffsetDateTime::now_utc());
        let cases = [
            (
                "no_matching_rule",
                json!({"would_grant": ["group g1", "app role Talos.Reader"]}),
                "ask for membership in one of: group g1, app role Talos.Reader",
            ),
            (
                "role_not_permitted",
                json!({"refused": ["os:admin"], "entitled": ["os:reader"]}),
                "you may not have os:admin on cluster `prod`; you are entitled to: os:reader",
            ),
            (
                "role_required",
                json!({"entitled": ["os:admin"]}),
                "run again with --role (you may have: os:admin)",
            ),
            (
                "ttl_too_long",
                json!({"max_ttl_seconds": 900}),
                "at most 900 seconds",
            ),
            ("ttl_invalid", json!({}), "a --ttl must be at least one second"),
            (
                "token_expired",
                json!({"server_time": now}),
                "your login has expired",
            ),
            ("token_replayed", json!({}), "already used"),
            ("token_signature_invalid", json!({}), "does not accept this login"),
            ("token_audience_invalid", json!({}), "does not accept this login"),
            (
                "token_tenant_not_allowed",
                json!({}),
                "organisation is not allowed",
            ),
            (
                "groups_overage_unresolved",
                json!({}),
                "so many groups that they do not fit",
            ),
            ("identity_denied", json!({}), "blocked from new certificates"),
            (
                "cluster_unknown",
                json!({"clusters": ["lab", "prod"]}),
                "it has: lab, prod",
            ),
            ("audit_unavailable", json!({}), "audit database is down"),
            (
                "signing_unavailable",
                json!({}),
                "cannot reach its CA signing key",
            ),
            (
                "csr_invalid",
                json!({"reason": "csr_malformed"}),
                "refused the certificate request",
            ),
            (
                "something_new",
                json!({}),
                "detail of something_new [something_new]",
            ),
        ];
        for (code, extra, expected) in cases {
            let message = explain(&problem(code, extra), "prod");
            assert!(message.contains(expected), "{code}: {message}");
            assert!(message.ends_with("(request id req-1)"), "{message}");
        }
    }

    #[test]
    fn a_rate_limit_says_its_wait_once() {
        let body = json!({"type": "about:blank", "title": "Too Many Requests", "status": 429,
            "code": "rate_limited", "retry_after_seconds": 1,
            "detail": "too many requests from you; try again in 1 second", "request_id": "req-1"});
        let error = crate::api::problem(429, &body.to_string()).unwrap();
        let message = explain(&error, "prod");
        assert_eq!(
            message,
            "the server asks you to slow down: too many requests from you; try again in 1 second (request id req-1)"
        );
        assert_eq!(message.matches("try again").count(), 1, "{message}");
    }

    #[test]
    fn a_clock_difference_is_named_in_minutes() {
        let ahead = time::OffsetDateTime::now_utc() - time::Duration::minutes(7);
        let server_time = ahead
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        let message = explain(
            &problem("token_not_yet_valid", json!({"server_time": server_time})),
            "prod",
        );
        assert!(
            message.contains("the server clock and yours differ by 7 minutes (yours is ahead)"),
            "{message}"
        );
    }

    #[test]
    fn transport_failures_say_where_and_why() {
        let error = ApiError::Unreachable(crate::connection::ConnectionError {
            peer: crate::connection::Peer::Server,
            url: "https://sso.example".into(),
            cause: crate::connection::Cause::Refused,
            chain: "tcp connect error".into(),
        });
        assert_eq!(
            explain(&error, "prod"),
            "the talos-sso server at https://sso.example cannot be reached: nothing listens on sso.example:443 \
             (connection refused); is the server running, and is the port right? [tcp connect error]"
        );
    }
}
