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
            ApiError::Unreachable { url, reason } => format!(
                "the talos-sso server at {url} cannot be reached ({reason}). Is it running, and is --server right?"
            ),
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
        _ => format!("{detail} [{code}]"),
    };
    format!("{message} (request id {request_id})")
}
