//! What a person reads when something goes wrong: each server `code` becomes
//! a sentence that says what happened and what to do about it.

use serde_json::Value;

use crate::api::ApiError;

fn list(value: Option<&Value>) -> String {
    match value.and_then(Value::as_array) {
        Some(items) if !items.is_empty() => items
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(", "),
        _ => "none".into(),
    }
}

/// The difference between the server's clock and ours, when it matters.
fn clock_skew(extra: &serde_json::Map<String, Value>) -> Option<i64> {
    let server = extra.get("server_time")?.as_str()?;
    let server = time::OffsetDateTime::parse(server, &time::format_description::well_known::Rfc3339).ok()?;
    let skew = (time::OffsetDateTime::now_utc() - server).whole_seconds();
    (skew.abs() >= 60).then_some(skew)
}

/// A message for `error` while asking for a certificate on `cluster`.
pub fn explain(error: &ApiError, cluster: &str) -> String {
    let ApiError::Problem {
        code,
        detail,
        request_id,
        extra,
        ..
    } = error
    else {
        return match error {
            // Its sentence names the cause and the fix (see `connection`).
            ApiError::Unreachable(failure) => failure.to_string(),
            other => format!("{other}. Is --server pointing at a talos-sso server?"),
        };
    };
    let message = match code.as_str() {
        "no_matching_rule" => format!(
            "you are in none of the groups that grant a role on cluster `{cluster}`; ask for membership in one of: {}",
            list(extra.get("would_grant"))
        ),
        "role_not_permitted" => format!(
            "you may not have {} on cluster `{cluster}`; you are entitled to: {}. Ask with --role for one of those",
            list(extra.get("refused")),
            list(extra.get("entitled"))
        ),
        "role_required" => format!(
            "cluster `{cluster}` grants no role unless you ask for one; run again with --role (you may have: {})",
            list(extra.get("entitled"))
        ),
        "ttl_too_long" | "ttl_invalid" => format!(
            "that --ttl is not allowed on cluster `{cluster}` (at most {} seconds); ask for less",
            extra.get("max_ttl_seconds").and_then(Value::as_u64).unwrap_or_default()
        ),
        "token_expired" | "token_not_yet_valid" | "token_issued_in_future" => match clock_skew(extra) {
            Some(skew) => format!(
                "the server clock and yours differ by {} minutes ({}), so your login looks {}; fix the clock (NTP) and log in again",
                skew.abs() / 60 + i64::from(skew.abs() % 60 >= 30),
                if skew > 0 { "yours is ahead" } else { "yours is behind" },
                if code == "token_expired" { "expired" } else { "not valid yet" }
            ),
            None => "your login has expired; run `talos-sso login` again".into(),
        },
        "token_replayed" => "this login was already used for a certificate; run `talos-sso login` again".into(),
        "token_missing" | "token_malformed" | "token_signature_invalid" | "token_key_unknown" | "token_issuer_invalid"
        | "token_audience_invalid" | "token_client_invalid" | "token_algorithm_not_allowed" | "token_subject_missing" => {
            format!(
                "the server does not accept this login ({detail}); check that the server and your identity provider belong together, then log in again"
            )
        }
        "token_tenant_missing" | "token_tenant_not_allowed" => {
            format!("your account's organisation is not allowed on this server ({detail}); log in with your work account")
        }
        "groups_overage_unresolved" => format!(
            "you are in so many groups that they do not fit in your login token, and the server could not look them up; {detail}"
        ),
        "identity_denied" => "you are blocked from new certificates on this server; ask the platform team".into(),
        "cluster_unknown" => {
            format!("the server has no cluster `{cluster}`; it has: {}. Use --cluster", list(extra.get("clusters")))
        }
        "audit_unavailable" => {
            "the server cannot record decisions right now (its audit database is down), so it issues nothing; try again in a minute"
                .into()
        }
        "csr_invalid" => format!("the server refused the certificate request ({detail}); please report this"),
        "not_an_auditor" => {
            "reading the audit trail is for the security team; ask to be added to one of the server's `auditors` groups".into()
        }
        "not_an_admin" => {
            "the deny list is for administrators; ask to be added to one of the server's `admins` groups".into()
        }
        "rate_limited" => format!(
            "the server asks you to slow down ({detail}); try again in {} seconds",
            extra.get("retry_after_seconds").and_then(Value::as_u64).unwrap_or(60)
        ),
        _ => format!("{detail} [{code}]"),
    };
    format!("{message} (request id {request_id})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problem(code: &str, extra: Value) -> ApiError {
        ApiError::Problem {
            status: 403,
            code: code.into(),
            detail: format!("detail of {code}"),
            request_id: "req-1".into(),
            extra: extra.as_object().cloned().unwrap_or_default(),
        }
    }

    #[test]
    fn every_server_code_has_its_sentence() {
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
            ("token_expired", json!({}), "your login has expired"),
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
