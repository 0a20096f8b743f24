//! Workload logins in the trail, on both stores: the store's `kind`
//! filter (one workload kind, any workload, people) gives what a scan of
//! every record gives, oldest first and newest first, page after page,
//! alone and with the other filters; the view `audit_workloads` lifts
//! `details.workload` into its columns. The records are appended here as
//! the server writes them (`details.workload` on a workload's certificate
//! records), so nothing depends on how tokens are verified.

use serde_json::{Value, json};
use talos_sso_server::audit::StoredRecord;
use talos_sso_server::audit::store::{Append, AuditFilter, AuditStore, KindFilter};
use talos_sso_server::audit::{AuditRecord, event, outcome};
use talos_sso_tests::harness::{Backend, BareStore};
use time::{Duration, OffsetDateTime};

on_both_stores!(
    kind_filters_match_a_scan_of_every_record,
    the_workloads_view_lifts_each_workloads_facts,
);

/// Records in the trail.
const RECORDS: i64 = 420;

/// The `details` of a workload's certificate record of `kind`.
fn workload(kind: &str, issued: bool, use_: i64) -> Value {
    let issuer = kind.split('-').next().unwrap_or(kind);
    let mut details = json!({
        "kind": kind, "issuer": issuer, "claims": {"sub": format!("{kind}:job"), "run": use_},
        "token_use": use_, "token_uses_max": 2,
    });
    if issued {
        details["rules"] = json!(["deploy"]);
    } else {
        details["misses"] = json!([{"rule": "deploy", "claims": ["ref"]}]);
    }
    json!({ "workload": details })
}

/// Record `i` of the trail: people's certificates and API calls, refused
/// tokens nobody verified, and workloads of each kind, issued and refused;
/// now and then a workload object whose kind is not text.
fn record(i: i64, start: OffsetDateTime) -> AuditRecord {
    let at = start + Duration::minutes(i);
    let (name, ending, details, verified) = match i {
        i if i % 29 == 0 => (
            event::CERTIFICATE_DENIED,
            outcome::DENIED,
            workload("gitlab-ci", false, 1),
            true,
        ),
        i if i % 10 == 0 => (
            event::CERTIFICATE_ISSUED,
            outcome::SUCCESS,
            workload("github-actions", true, 1 + i % 2),
            true,
        ),
        i if i % 10 == 3 => (
            event::CERTIFICATE_ISSUED,
            outcome::SUCCESS,
            workload("kubernetes", true, 1),
            true,
        ),
        i if i % 50 == 1 => (
            event::CERTIFICATE_ISSUED,
            outcome::SUCCESS,
            json!({"workload": {"kind": 7}}),
            true,
        ),
        i if i % 10 == 5 => (
            event::API_CALL,
            outcome::SUCCESS,
            json!({"method": "/machine.MachineService/Version", "nodes": ["10.5.0.2"]}),
            true,
        ),
        i if i % 10 == 7 => (event::CERTIFICATE_DENIED, outcome::DENIED, json!({}), false),
        _ => (event::CERTIFICATE_ISSUED, outcome::SUCCESS, json!({}), true),
    };
    let mut record = AuditRecord::new(name, ending, &format!("req-{i}"), at);
    let who = details
        .pointer("/workload/kind")
        .and_then(Value::as_str)
        .map_or_else(
            || format!("person{}@example.com", i % 4),
            |kind| format!("{kind}:job"),
        );
    record.username = Some(who.clone());
    record.subject = Some(who);
    record.identity_verified = verified;
    record.cluster = Some(if i % 3 == 0 { "prod" } else { "dev" }.to_owned());
    record.details = details;
    record
}

/// A store holding the trail, and every record it holds.
async fn seeded(backend: Backend) -> (BareStore, Vec<StoredRecord>) {
    let bare = BareStore::open(backend).await;
    let start = OffsetDateTime::now_utc() - Duration::days(1);
    let appends: Vec<Append> = (0..RECORDS)
        .map(|i| Append {
            record: record(i, start),
            ..Append::default()
        })
        .collect();
    for batch in appends.chunks(100) {
        bare.store.append_batch(batch).await.unwrap();
    }
    let records = bare.store.page(0, 1000).await.unwrap();
    assert_eq!(records.len() as i64, RECORDS);
    (bare, records)
}

/// Whether `kind` keeps `record`, as the API documents it.
fn kept(kind: &KindFilter, record: &AuditRecord) -> bool {
    let workload = record.details.get("workload");
    match kind {
        KindFilter::Workload(k) => {
            workload.and_then(|w| w.get("kind")).and_then(Value::as_str) == Some(k.as_str())
        }
        KindFilter::AnyWorkload => workload.is_some(),
        KindFilter::Person => record.identity_verified && workload.is_none(),
    }
}

/// Every record of `filter`, oldest first (then newest first, reversed),
/// read seven at a time.
async fn paged(store: &AuditStore, filter: &AuditFilter) -> (Vec<i64>, Vec<i64>) {
    let mut forward = Vec::new();
    let mut page = AuditFilter {
        limit: 7,
        ..filter.clone()
    };
    loop {
        let found = store.query(&page).await.unwrap();
        forward.extend(found.iter().map(|r| r.seq));
        match found.last() {
            Some(last) if found.len() == 7 => page.after_seq = last.seq,
            _ => break,
        }
    }
    let mut back = Vec::new();
    let mut before = None;
    loop {
        let page = AuditFilter {
            limit: 7,
            ..filter.clone()
        };
        let found = store.query_newest_first(&page, before).await.unwrap();
        back.extend(found.iter().map(|r| r.seq));
        match found.last() {
            Some(last) if found.len() == 7 => before = Some(last.seq),
            _ => break,
        }
    }
    back.reverse();
    (forward, back)
}

async fn kind_filters_match_a_scan_of_every_record(backend: Backend) {
    let (bare, records) = seeded(backend).await;
    let middle = records[records.len() / 2].record.occurred_at;
    let text = |t: &str| Some(t.to_owned());
    let kind = |k: &str| Some(KindFilter::Workload(k.to_owned()));
    // Each filter, and how many records it must find (counted from the
    // trail's pattern, so that a scan that found nothing would not pass).
    let filters = [
        (
            AuditFilter {
                kind: kind("github-actions"),
                ..Default::default()
            },
            40,
        ),
        (
            AuditFilter {
                kind: kind("kubernetes"),
                ..Default::default()
            },
            41,
        ),
        (
            AuditFilter {
                kind: kind("gitlab-ci"),
                ..Default::default()
            },
            15,
        ),
        (
            AuditFilter {
                kind: Some(KindFilter::AnyWorkload),
                ..Default::default()
            },
            105,
        ),
        (
            AuditFilter {
                kind: Some(KindFilter::Person),
                ..Default::default()
            },
            275,
        ),
        // With the other filters: a kind's refusals, any workload since
        // the middle of the trail, people in one cluster before it.
        (
            AuditFilter {
                kind: kind("gitlab-ci"),
                outcome: text(outcome::DENIED),
                ..Default::default()
            },
            15,
        ),
        (
            AuditFilter {
                kind: Some(KindFilter::AnyWorkload),
                since: Some(middle),
                event: text(event::CERTIFICATE_ISSUED),
                ..Default::default()
            },
            45,
        ),
        (
            AuditFilter {
                kind: Some(KindFilter::Person),
                until: Some(middle),
                cluster: text("prod"),
                ..Default::default()
            },
            46,
        ),
        (
            AuditFilter {
                kind: Some(KindFilter::Person),
                event: text(event::API_CALL),
                ..Default::default()
            },
            41,
        ),
        // No workload has a person's name, and a kind is matched whole.
        (
            AuditFilter {
                kind: kind("github-actions"),
                username: text("person1@example.com"),
                ..Default::default()
            },
            0,
        ),
        (
            AuditFilter {
                kind: kind("github"),
                ..Default::default()
            },
            0,
        ),
        (
            AuditFilter {
                kind: kind("7"),
                ..Default::default()
            },
            0,
        ),
    ];
    for (filter, count) in filters {
        let want: Vec<i64> = records
            .iter()
            .filter(|s| {
                let r = &s.record;
                filter.kind.as_ref().is_none_or(|k| kept(k, r))
                    && filter.since.is_none_or(|t| r.occurred_at >= t)
                    && filter.until.is_none_or(|t| r.occurred_at < t)
                    && filter.outcome.as_deref().is_none_or(|o| o == r.outcome)
                    && filter.event.as_deref().is_none_or(|e| e == r.event)
                    && filter
                        .cluster
                        .as_ref()
                        .is_none_or(|c| Some(c) == r.cluster.as_ref())
                    && filter
                        .username
                        .as_ref()
                        .is_none_or(|u| Some(u) == r.username.as_ref())
            })
            .map(|s| s.seq)
            .collect();
        assert_eq!(want.len(), count, "{filter:?}: the trail's pattern changed");
        let (forward, back) = paged(&bare.store, &filter).await;
        assert_eq!(forward, want, "{backend:?} {filter:?} oldest first");
        assert_eq!(back, want, "{backend:?} {filter:?} newest first");
    }
    bare.close().await;
}

async fn the_workloads_view_lifts_each_workloads_facts(backend: Backend) {
    let (bare, records) = seeded(backend).await;
    type Row = (i64, String, Option<String>, Option<String>, Option<i64>);
    let sql = "SELECT seq, event, CAST(kind AS TEXT), workload_issuer, \
               CAST(token_uses_max AS BIGINT) FROM audit_workloads ORDER BY seq";
    let rows: Vec<Row> = match &bare.store {
        AuditStore::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await.unwrap(),
        AuditStore::Sqlite(sqlite) => sqlx::query_as(sql).fetch_all(sqlite.pool()).await.unwrap(),
    };
    let want: Vec<Row> = records
        .iter()
        .filter(|s| s.record.details.get("workload").is_some())
        .map(|s| {
            let w = &s.record.details["workload"];
            (
                s.seq,
                s.record.event.clone(),
                // A kind that is not text is still the record's (as text).
                w.get("kind")
                    .map(|k| k.as_str().map_or_else(|| k.to_string(), str::to_owned)),
                w.get("issuer").and_then(Value::as_str).map(str::to_owned),
                w.get("token_uses_max").and_then(Value::as_i64),
            )
        })
        .collect();
    assert_eq!(rows.len(), 105);
    assert_eq!(rows, want, "{backend:?}");
    // The rules of the issued, the misses of the refused, as JSON.
    let lists = "SELECT CAST(rules AS TEXT), CAST(misses AS TEXT) FROM audit_workloads \
                 WHERE kind = 'gitlab-ci' ORDER BY seq LIMIT 1";
    let (rules, misses): (Option<String>, Option<String>) = match &bare.store {
        AuditStore::Postgres(pool) => sqlx::query_as(lists).fetch_one(pool).await.unwrap(),
        AuditStore::Sqlite(sqlite) => sqlx::query_as(lists).fetch_one(sqlite.pool()).await.unwrap(),
    };
    assert_eq!(rules, None);
    let misses: Value = serde_json::from_str(&misses.unwrap()).unwrap();
    assert_eq!(misses, json!([{"rule": "deploy", "claims": ["ref"]}]));
    bare.close().await;
}
