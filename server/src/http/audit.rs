//! `GET /v1/audit`, `GET /v1/audit/verify` and `POST /v1/audit/checkpoint`
//! (auditors). Reading the trail
//! is itself recorded (`audit.query`) before the answer leaves. The query
//! parameters ([`AuditQuery`]) are checked once the caller is known to be an
//! auditor, so that nobody else learns anything from how they are refused.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::json;
use talos_sso_api::audit::{DEFAULT_PAGE, MAX_PAGE, record_kind};
use talos_sso_api::{AuditPage, AuditQuery, ChainStatus};

use super::caller::Caller;
use super::error::ApiError;
use super::privileged::{Privilege, authorize, commit};
use super::{QueryParams, query_or_400};
use crate::app::App;
use crate::audit::store::{AuditFilter, KindFilter, MethodFilter};
use crate::audit::{event, outcome};
use talos_sso_api::checkpoint::{Checkpoint, trigger};
use talos_sso_text as text;

/// Why a query parameter was refused: `(parameter, what is wrong)`.
type ParamError = (&'static str, String);

/// An RFC 3339 time, or a duration back from `now`, in UTC; `None` when it
/// is neither or falls outside the times this server can represent: the
/// stores bind it in UTC, SQLite as the one text form of a time, which has
/// years 0 to 9999 (an offset can move a time written within them outside).
pub fn parse_when(text: &str, now: time::OffsetDateTime) -> Option<time::OffsetDateTime> {
    let when = match time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339) {
        Ok(t) => t,
        Err(_) => {
            let back = humantime::parse_duration(text).ok()?;
            now.checked_sub(time::Duration::try_from(back).ok()?)?
        }
    };
    when.checked_to_offset(time::UtcOffset::UTC)
        .filter(|utc| (0..=9999).contains(&utc.year()))
}

fn bounded_int(name: &'static str, text: &str, min: i64, max: i64) -> Result<i64, ParamError> {
    let value: i64 = text.trim().parse().map_err(|_| {
        (
            name,
            format!("`{name}` must be a whole number from {min} to {max}"),
        )
    })?;
    if !(min..=max).contains(&value) {
        return Err((name, format!("`{name}` must be from {min} to {max}")));
    }
    Ok(value)
}

/// A `method` filter: a full gRPC method (`/machine.MachineService/Reboot`),
/// or a prefix of one ending in `*` (`/machine.MachineService/Etcd*`).
/// Anything else would match no record and look like a quiet trail.
fn method_filter(text: &str) -> Result<MethodFilter, ParamError> {
    let refused = |why: &str| ("method", format!("`method` {why}"));
    if !text.starts_with('/') {
        return Err(refused(
            "must be a gRPC method as recorded (`/machine.MachineService/Reboot`), or a prefix of one \
             ending in `*` (`/machine.MachineService/Etcd*`)",
        ));
    }
    match text.strip_suffix('*') {
        Some(prefix) if prefix.contains('*') => Err(refused("may hold one `*`, at its end")),
        Some(prefix) => Ok(MethodFilter::Prefix(prefix.to_owned())),
        None if text.contains('*') => Err(refused("may hold one `*`, at its end")),
        None => Ok(MethodFilter::Exact(text.to_owned())),
    }
}

/// A `node` filter: one node, as a record lists it (an address or a name);
/// several (`10.5.0.2,10.5.0.3`) or none would match nothing.
fn node_filter(text: &str) -> Result<String, ParamError> {
    if text.is_empty() || text.contains(|c: char| c == ',' || c.is_whitespace()) {
        return Err((
            "node",
            "`node` must be one node as recorded: an address or a name (`10.5.0.2`), without spaces or commas"
                .to_owned(),
        ));
    }
    Ok(text.to_owned())
}

/// A `kind` filter: one workload kind, `workload` or `person`
/// ([`record_kind::ALL`]).
fn kind_filter(text: &str) -> KindFilter {
    match text {
        record_kind::WORKLOAD => KindFilter::AnyWorkload,
        record_kind::PERSON => KindFilter::Person,
        kind => KindFilter::Workload(kind.to_owned()),
    }
}

/// The store filter `query` asks for; `query` is cleaned exactly as stored
/// records are ([`text::clean_field`]), so a filter matches what was kept.
pub fn filter(query: &AuditQuery, now: time::OffsetDateTime) -> Result<AuditFilter, ParamError> {
    let when = |text: &Option<String>, name: &'static str| {
        text.as_deref()
            .map(|t| {
                parse_when(t, now).ok_or((
                    name,
                    format!("`{name}` is not an RFC 3339 time or a duration back from now within range"),
                ))
            })
            .transpose()
    };
    // A misspelt outcome or event would match nothing and look like an
    // empty trail: name the values instead.
    let one_of = |v: &Option<String>, name: &'static str, known: &[&str]| match v.as_deref() {
        Some(value) if !known.contains(&value) => {
            Err((name, format!("`{name}` must be one of: {}", known.join(", "))))
        }
        _ => Ok(()),
    };
    one_of(&query.outcome, "outcome", &outcome::ALL)?;
    one_of(&query.event, "event", &event::ALL)?;
    one_of(&query.kind, "kind", &record_kind::ALL)?;
    let method = query.method.as_deref().map(method_filter).transpose()?;
    let node = query.node.as_deref().map(node_filter).transpose()?;
    Ok(AuditFilter {
        since: when(&query.since, "since")?,
        until: when(&query.until, "until")?,
        username: query.username.clone(),
        subject: query.subject.clone(),
        cluster: query.cluster.clone(),
        role: query.role.clone(),
        outcome: query.outcome.clone(),
        event: query.event.clone(),
        serial: query.serial.clone(),
        client_ip: query.client_ip.clone(),
        method,
        node,
        kind: query.kind.as_deref().map(kind_filter),
        except_event: None,
        after_seq: match &query.cursor {
            Some(c) => bounded_int("cursor", c, 0, i64::MAX)?,
            None => 0,
        },
        limit: match &query.limit {
            Some(l) => bounded_int("limit", l, 1, MAX_PAGE)?,
            None => DEFAULT_PAGE,
        },
    })
}

/// `GET /v1/audit`: records matching the filters, oldest first, a page at a
/// time.
pub async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    query: QueryParams<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    // Cleaned once, as every field is (the caller may not be an auditor):
    // recorded as sent, and matched against what the records hold.
    let query = query_or_400(query)?.map(text::clean_field);
    let details = json!({"action": "list", "filter": query});
    let admitted = authorize(&app, &caller, Privilege::Auditor, event::AUDIT_QUERY, details).await?;
    let filter = match filter(&query, app.clock.now()) {
        Ok(filter) => filter,
        Err((parameter, detail)) => {
            let error = ApiError::request_invalid(detail, Some(parameter));
            return Err(admitted.refuse(error).await);
        }
    };
    let records = app.audit.store().query(&filter).await?;
    commit(&app, admitted.into_success().1, None).await?;
    let full_page = records.len() as i64 >= filter.limit;
    let next_cursor = if full_page {
        records.last().map(|r| r.seq)
    } else {
        None
    };
    Ok(Json(AuditPage { records, next_cursor }))
}

/// `GET /v1/audit/verify`: recompute the hash chain, and check it against
/// the signed checkpoints when the server signs them. One verification runs
/// at a time on a replica ([`App::verify_chain`], shared with the
/// console): a caller who asks while one runs gets its answer.
pub async fn verify(State(app): State<Arc<App>>, caller: Caller) -> Result<Json<ChainStatus>, ApiError> {
    let details = json!({"action": "verify"});
    let admitted = authorize(&app, &caller, Privilege::Auditor, event::AUDIT_QUERY, details).await?;
    commit(&app, admitted.into_success().1, None).await?;
    match app.verify_chain().finished().await {
        Some(status) => Ok(Json(status)),
        None => Err(ApiError::audit_unavailable()),
    }
}

/// `POST /v1/audit/checkpoint`: sign the head now (auditors). The request
/// is recorded first, so the checkpoint covers its own record.
pub async fn checkpoint(State(app): State<Arc<App>>, caller: Caller) -> Result<Json<Checkpoint>, ApiError> {
    let details = json!({"action": "checkpoint"});
    let admitted = authorize(&app, &caller, Privilege::Auditor, event::AUDIT_QUERY, details).await?;
    let Some(checkpoints) = &app.checkpoints else {
        let error = ApiError::new(
            talos_sso_api::ErrorCode::CheckpointsNotConfigured,
            "this server signs no audit checkpoints: `audit.checkpoints` is not configured",
        );
        return Err(admitted.refuse(error).await);
    };
    commit(&app, admitted.into_success().1, None).await?;
    let signed = checkpoints
        .publish(app.audit.store(), trigger::REQUEST, app.clock.now())
        .await
        .map_err(|error| {
            tracing::error!(target: "talos_sso::audit::checkpoint", "no checkpoint signed on request: {error}");
            ApiError::audit_unavailable()
        })?;
    Ok(Json(signed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use talos_sso_api::audit::{format_micros, parse_micros};

    /// Found by fuzzing (`fuzz/regressions/audit_query/`): a time whose UTC
    /// form is outside years 0 to 9999 has no text form, yet it was bound
    /// into the query (SQLite binds the text; Postgres encodes UTC).
    /// `since=2101yr` gave year -75, written as `-075-...`, which does not
    /// read back; `until=9999-12-31T23:59:59-01:00` is year 10000 in UTC,
    /// and converting it panicked.
    #[test]
    fn query_times_without_a_utc_text_form_are_refused() {
        let now = time::macros::datetime!(2026-12-01 12:00 UTC);
        for text in ["2101yr", "9999-12-31T23:59:59-01:00", "0000-01-01T00:00:00+00:01"] {
            assert_eq!(parse_when(text, now), None, "{text}");
        }
        for text in ["2000yr", "9999-12-31T23:59:59Z", "0000-01-01T00:00:00-01:00"] {
            let t = parse_when(text, now).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(parse_micros(&format_micros(t)), Some(t), "{text}");
        }
        let query = AuditQuery {
            until: Some("9999-12-31T23:59:59-01:00".into()),
            ..AuditQuery::default()
        };
        assert_eq!(filter(&query, now).unwrap_err().0, "until");
    }

    #[test]
    fn method_and_node_filters_are_checked_and_named_when_refused() {
        let now = time::macros::datetime!(2026-12-01 12:00 UTC);
        let query = |method: Option<&str>, node: Option<&str>| AuditQuery {
            method: method.map(Into::into),
            node: node.map(Into::into),
            ..AuditQuery::default()
        };
        let accepted = filter(
            &query(Some("/machine.MachineService/Reboot"), Some("10.5.0.2")),
            now,
        )
        .unwrap();
        assert_eq!(
            accepted.method,
            Some(MethodFilter::Exact("/machine.MachineService/Reboot".into()))
        );
        assert_eq!(accepted.node.as_deref(), Some("10.5.0.2"));
        let prefix = filter(&query(Some("/machine.MachineService/Etcd*"), None), now).unwrap();
        assert_eq!(
            prefix.method,
            Some(MethodFilter::Prefix("/machine.MachineService/Etcd".into()))
        );
        for bad in ["Reboot", "*", "/machine.*/Reboot", "/a**", ""] {
            assert_eq!(
                filter(&query(Some(bad), None), now).unwrap_err().0,
                "method",
                "{bad}"
            );
        }
        for bad in ["", "10.5.0.2,10.5.0.3", "10.5.0.2 10.5.0.3", "node\t1"] {
            assert_eq!(
                filter(&query(None, Some(bad)), now).unwrap_err().0,
                "node",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn kind_filters_name_a_workload_kind_any_workload_or_a_person() {
        let now = time::macros::datetime!(2026-12-01 12:00 UTC);
        let kind = |text: &str| {
            filter(
                &AuditQuery {
                    kind: Some(text.into()),
                    ..AuditQuery::default()
                },
                now,
            )
        };
        for (text, want) in [
            ("github-actions", KindFilter::Workload("github-actions".into())),
            ("kubernetes", KindFilter::Workload("kubernetes".into())),
            ("gitlab-ci", KindFilter::Workload("gitlab-ci".into())),
            ("workload", KindFilter::AnyWorkload),
            ("person", KindFilter::Person),
        ] {
            assert_eq!(kind(text).unwrap().kind, Some(want), "{text}");
        }
        for bad in ["", "GitHub-Actions", "github", "people", "kubernetes,gitlab-ci"] {
            let (name, why) = kind(bad).unwrap_err();
            assert_eq!(name, "kind", "{bad:?}");
            assert!(why.contains("github-actions") && why.contains("person"), "{why}");
        }
        let none = filter(&AuditQuery::default(), now).unwrap();
        assert_eq!(none.kind, None);
    }
}
