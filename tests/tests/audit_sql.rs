//! The audit trail read with SQL, on both stores, over a seeded trail of
//! 20,000 records ([`talos_sso_tests::audit_seed`]), three in ten of them
//! Talos API calls:
//!
//! - every query of docs/audit.md's "Queries for those who prefer SQL" is
//!   run on its database and must give the rows computed here from the
//!   records themselves (so the page cannot drift from the schema or the
//!   views);
//! - the store's own filters (the role condition, an API call's method and
//!   node, the ordering chosen for a time bound, newest first) give what a
//!   scan of every record gives.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sqlx::{Column, Row, TypeInfo, ValueRef};
use talos_sso_server::audit::StoredRecord;
use talos_sso_server::audit::store::{AuditFilter, AuditStore, MethodFilter, StoreOptions};
use talos_sso_tests::audit_seed::{SeedPlan, Trail, in_company_ranges};
use talos_sso_tests::harness::{Backend, BareStore, TestDatabase, migrate_up_to};
use time::{Duration, OffsetDateTime};

/// A seeded store, and every record it holds.
struct Seeded {
    store: AuditStore,
    records: Vec<StoredRecord>,
    database: Option<TestDatabase>,
    _dir: Option<tempfile::TempDir>,
}

impl Seeded {
    async fn new(backend: Backend) -> Self {
        let BareStore {
            store, database, dir, ..
        } = BareStore::open(backend).await;
        let plan = SeedPlan {
            records: 20_000,
            seed: 11,
            until: OffsetDateTime::now_utc(),
            days: 90,
            users: 200,
            api_calls: 0.3,
        };
        let trail: Vec<_> = Trail::new(&plan).collect();
        for batch in trail.chunks(500) {
            store.append_batch(batch).await.unwrap();
        }
        let records = store.page(0, 100_000).await.unwrap();
        assert_eq!(records.len(), 20_000);
        Self {
            store,
            records,
            database,
            _dir: dir,
        }
    }

    async fn finish(self) {
        let check = self.store.verify_chain().await.unwrap();
        assert_eq!((check.verified, check.first_broken), (20_000, None));
        self.store.close().await;
        if let Some(database) = self.database {
            database.drop_now().await;
        }
    }
}

/// One SQL block of the page: its database, title and text.
#[derive(Debug)]
struct DocQuery {
    backend: Backend,
    title: String,
    sql: String,
}

const SECTION: &str = "## Queries for those who prefer SQL";

/// Every ```sql block of the section, each opening with
/// `-- Postgres: title` or `-- SQLite: title`.
fn doc_queries() -> Vec<DocQuery> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/audit.md")).unwrap();
    let start = page.find(SECTION).expect("docs/audit.md has no SQL section");
    let section = &page[start + SECTION.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut queries = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```sql" {
            continue;
        }
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        let header = block.first().copied().unwrap_or_default();
        let (backend, title) = if let Some(title) = header.strip_prefix("-- Postgres: ") {
            (Backend::Postgres, title)
        } else if let Some(title) = header.strip_prefix("-- SQLite: ") {
            (Backend::Sqlite, title)
        } else {
            panic!("a SQL block of docs/audit.md does not say its database: {header:?}")
        };
        queries.push(DocQuery {
            backend,
            title: title.trim().to_owned(),
            sql: block[1..].join("\n").trim().trim_end_matches(';').to_owned(),
        });
    }
    queries
}

/// The views the section's table lists, each with the columns it names
/// (text in parentheses explains a column and is not one).
fn documented_views() -> Vec<(String, Vec<String>)> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/audit.md")).unwrap();
    let section = &page[page.find(SECTION).expect("docs/audit.md has no SQL section")..];
    let ticked = |text: &str| -> Vec<String> {
        let mut plain = String::new();
        let mut depth = 0;
        for c in text.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => plain.push(c),
                _ => {}
            }
        }
        plain.split('`').skip(1).step_by(2).map(str::to_owned).collect()
    };
    section
        .lines()
        .filter(|l| l.starts_with("| `audit_"))
        .map(|line| {
            let cells: Vec<&str> = line.split(" | ").collect();
            let view = ticked(cells[0]).remove(0);
            (view, ticked(cells[2]))
        })
        .collect()
}

/// Which records each view holds.
fn in_view(view: &str, r: &StoredRecord) -> bool {
    let event = r.record.event.as_str();
    match view {
        "audit_issued" | "issued_certificates" => is_issued(r),
        "audit_denied" | "denied_requests" => r.record.outcome == "denied",
        "audit_deny_changes" => event == "deny.added" || event == "deny.removed",
        "audit_reads" => event == "audit.query",
        "audit_undelivered" => event == "certificate.undelivered",
        "audit_break_glass" => event == "break_glass.issued",
        "audit_api_calls" => event == "api.call",
        "audit_workloads" => r.record.details.get("workload").is_some(),
        other => panic!("docs/audit.md lists a view this test does not know: {other}"),
    }
}

/// The rows of `sql`, each as a JSON object by column name.
async fn run(store: &AuditStore, sql: &str) -> Vec<BTreeMap<String, Value>> {
    let object = |v: Value| match v {
        Value::Object(map) => map.into_iter().collect(),
        other => panic!("not a row: {other}"),
    };
    match store {
        AuditStore::Postgres(pool) => {
            // Postgres says what each of its types is in JSON.
            let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT to_jsonb(q)::text FROM ({sql}) q"
            )))
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{sql}"));
            rows.iter()
                .map(|r| object(serde_json::from_str(r).unwrap()))
                .collect()
        }
        AuditStore::Sqlite(sqlite) => {
            let pool = sqlite.pool();
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .fetch_all(pool)
                .await
                .unwrap_or_else(|e| panic!("{e}\n{sql}"));
            rows.iter()
                .map(|row| {
                    row.columns()
                        .iter()
                        .map(|column| {
                            let i = column.ordinal();
                            let kind = row.try_get_raw(i).unwrap().type_info().name().to_owned();
                            let value = match kind.as_str() {
                                "NULL" => Value::Null,
                                "INTEGER" => json!(row.get::<i64, _>(i)),
                                "REAL" => json!(row.get::<f64, _>(i)),
                                _ => json!(row.get::<String, _>(i)),
                            };
                            (column.name().to_owned(), value)
                        })
                        .collect()
                })
                .collect()
        }
    }
}

/// What a query must answer: these columns of each row; in this order
/// when `ordered`, else as a set (ties in an ORDER BY may fall either way).
struct Expected {
    columns: &'static [&'static str],
    rows: Vec<Vec<Value>>,
    ordered: bool,
}

fn is_issued(r: &StoredRecord) -> bool {
    ["certificate.issued", "break_glass.issued"].contains(&r.record.event.as_str())
}

/// An `api.call` record, of `method` and naming `node` when they are given.
fn is_call(r: &StoredRecord, method: Option<&str>, node: Option<&str>) -> bool {
    r.record.event == "api.call"
        && method.is_none_or(|m| detail(r, "method") == m)
        && node.is_none_or(|n| {
            detail(r, "nodes")
                .as_array()
                .is_some_and(|nodes| nodes.iter().any(|v| v == n))
        })
}

fn detail(r: &StoredRecord, key: &str) -> Value {
    r.record.details.get(key).cloned().unwrap_or(Value::Null)
}

/// Count rows by key, as `GROUP BY` does.
fn grouped<K: Ord>(keys: impl Iterator<Item = K>) -> BTreeMap<K, i64> {
    let mut counts = BTreeMap::new();
    for key in keys {
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

/// The answer to the query titled `title`, computed from the records, at `now`.
fn expected(title: &str, records: &[StoredRecord], now: OffsetDateTime) -> Expected {
    let since = |days: i64| now - Duration::days(days);
    let text = |v: &Option<String>| json!(v);
    match title {
        "certificates per person and cluster, last month" => {
            let this_month = now.date().replace_day(1).unwrap().midnight().assume_utc();
            let last_month = (this_month.date() - Duration::days(1))
                .replace_day(1)
                .unwrap()
                .midnight()
                .assume_utc();
            let counts = grouped(
                records
                    .iter()
                    .filter(|r| {
                        is_issued(r)
                            && r.record.occurred_at >= last_month
                            && r.record.occurred_at < this_month
                    })
                    .map(|r| (r.record.username.clone(), r.record.cluster.clone())),
            );
            Expected {
                columns: &["username", "cluster", "certificates"],
                rows: counts
                    .into_iter()
                    .map(|((u, c), n)| vec![text(&u), text(&c), json!(n)])
                    .collect(),
                ordered: false,
            }
        }
        "every os:admin certificate" => Expected {
            columns: &["seq", "username", "cluster", "serial"],
            rows: records
                .iter()
                .filter(|r| is_issued(r) && r.record.roles_granted.iter().any(|g| g == "os:admin"))
                .map(|r| {
                    vec![
                        json!(r.seq),
                        text(&r.record.username),
                        text(&r.record.cluster),
                        text(&r.record.serial),
                    ]
                })
                .collect(),
            ordered: true,
        },
        "refusals by reason, last 7 days" => {
            let mut by_reason: BTreeMap<Option<String>, (i64, i64)> = BTreeMap::new();
            for r in records
                .iter()
                .filter(|r| r.record.outcome == "denied" && r.record.occurred_at >= since(7))
            {
                let attempts = match (r.record.event.as_str(), detail(r, "count").as_i64()) {
                    ("refusals.aggregated", Some(count)) => count,
                    _ => 1,
                };
                let entry = by_reason.entry(r.record.reason_code.clone()).or_default();
                entry.0 += attempts;
                entry.1 += 1;
            }
            Expected {
                columns: &["reason_code", "refusals", "records"],
                rows: by_reason
                    .into_iter()
                    .map(|(reason, (refusals, rows))| vec![json!(reason), json!(refusals), json!(rows)])
                    .collect(),
                ordered: false,
            }
        }
        "certificates from outside the company's ranges, last 30 days" => Expected {
            columns: &["seq", "username", "client_ip"],
            rows: records
                .iter()
                .filter(|r| is_issued(r) && r.record.occurred_at >= since(30))
                .filter(|r| {
                    r.record
                        .client_ip
                        .as_deref()
                        .is_some_and(|ip| !in_company_ranges(ip))
                })
                .map(|r| vec![json!(r.seq), text(&r.record.username), text(&r.record.client_ip)])
                .collect(),
            ordered: true,
        },
        "addresses first seen for a person in the last 7 days" => {
            let mut seen: BTreeMap<(Option<String>, String), (OffsetDateTime, i64)> = BTreeMap::new();
            for r in records.iter().filter(|r| is_issued(r)) {
                if let Some(ip) = &r.record.client_ip {
                    let entry = seen
                        .entry((r.record.username.clone(), ip.clone()))
                        .or_insert((r.record.occurred_at, 0));
                    entry.0 = entry.0.min(r.record.occurred_at);
                    entry.1 += 1;
                }
            }
            Expected {
                columns: &["username", "client_ip", "certificates"],
                rows: seen
                    .into_iter()
                    .filter(|(_, (first, _))| *first >= since(7))
                    .map(|((u, ip), (_, n))| vec![json!(u), json!(ip), json!(n)])
                    .collect(),
                ordered: false,
            }
        }
        "the deny list's history" => Expected {
            columns: &[
                "seq",
                "event",
                "admin_username",
                "target_username",
                "reason",
                "entries_changed",
            ],
            rows: records
                .iter()
                .filter(|r| r.record.event.starts_with("deny.") && r.record.event != "deny.listed")
                .map(|r| {
                    vec![
                        json!(r.seq),
                        json!(r.record.event),
                        text(&r.record.username),
                        detail(r, "target_username"),
                        detail(r, "reason"),
                        detail(r, "entries_changed"),
                    ]
                })
                .collect(),
            ordered: true,
        },
        "who read the trail, last 30 days" => {
            let counts = grouped(
                records
                    .iter()
                    .filter(|r| r.record.event == "audit.query" && r.record.occurred_at >= since(30))
                    .map(|r| {
                        (
                            r.record.username.clone(),
                            detail(r, "action").as_str().map(str::to_owned),
                            r.record.outcome.clone(),
                        )
                    }),
            );
            Expected {
                columns: &["username", "action", "outcome", "reads"],
                rows: counts
                    .into_iter()
                    .map(|((u, a, o), n)| vec![json!(u), json!(a), json!(o), json!(n)])
                    .collect(),
                ordered: false,
            }
        }
        "who rebooted node 10.5.0.2, last 7 days" => Expected {
            columns: &["seq", "outcome", "username", "request_id"],
            rows: records
                .iter()
                .filter(|r| {
                    is_call(r, Some("/machine.MachineService/Reboot"), Some("10.5.0.2"))
                        && r.record.occurred_at >= since(7)
                })
                .map(|r| {
                    vec![
                        json!(r.seq),
                        json!(r.record.outcome),
                        text(&r.record.username),
                        json!(r.record.request_id),
                    ]
                })
                .collect(),
            ordered: true,
        },
        "API calls per person and method, last 7 days" => {
            let mut by_call: BTreeMap<(Option<String>, Option<String>), (i64, i64)> = BTreeMap::new();
            for r in records
                .iter()
                .filter(|r| is_call(r, None, None) && r.record.occurred_at >= since(7))
                .filter(|r| r.record.outcome != "started")
            {
                let method = detail(r, "method").as_str().map(str::to_owned);
                let entry = by_call.entry((r.record.username.clone(), method)).or_default();
                entry.0 += detail(r, "calls").as_i64().unwrap_or(1);
                if r.record.outcome != "success" {
                    entry.1 += 1;
                }
            }
            Expected {
                columns: &["username", "method", "calls", "not_ok"],
                rows: by_call
                    .into_iter()
                    .map(|((u, m), (calls, not_ok))| vec![json!(u), json!(m), json!(calls), json!(not_ok)])
                    .collect(),
                ordered: false,
            }
        }
        "calls that changed a node and have not ended" => {
            let ended: std::collections::BTreeSet<&str> = records
                .iter()
                .filter(|r| is_call(r, None, None) && r.record.outcome != "started")
                .map(|r| r.record.request_id.as_str())
                .collect();
            Expected {
                columns: &["seq", "username", "method", "request_id"],
                rows: records
                    .iter()
                    .filter(|r| is_call(r, None, None) && r.record.outcome == "started")
                    .filter(|r| !ended.contains(r.record.request_id.as_str()))
                    .map(|r| {
                        vec![
                            json!(r.seq),
                            text(&r.record.username),
                            detail(r, "method"),
                            json!(r.record.request_id),
                        ]
                    })
                    .collect(),
                ordered: true,
            }
        }
        other => panic!("docs/audit.md has a query this test does not know: {other:?}"),
    }
}

fn pick(rows: &[BTreeMap<String, Value>], columns: &[&str]) -> Vec<Vec<Value>> {
    rows.iter()
        .map(|row| {
            columns
                .iter()
                .map(|c| {
                    row.get(*c)
                        .cloned()
                        .unwrap_or_else(|| panic!("no column {c} in {row:?}"))
                })
                .collect()
        })
        .collect()
}

fn sorted(mut rows: Vec<Vec<Value>>) -> Vec<Vec<Value>> {
    rows.sort_by_key(|row| serde_json::to_string(row).unwrap_or_default());
    rows
}

async fn documented_queries_answer_what_the_records_say(backend: Backend) {
    let seeded = Seeded::new(backend).await;
    let queries: Vec<DocQuery> = doc_queries()
        .into_iter()
        .filter(|q| q.backend == backend)
        .collect();
    assert!(queries.len() >= 7, "{queries:?}");
    for query in &queries {
        // A record on a window's edge may be in or out as the clock moves
        // on while the query runs: either answer is right.
        let before = OffsetDateTime::now_utc();
        let rows = run(&seeded.store, &query.sql).await;
        let after = OffsetDateTime::now_utc();
        let answers = [before, after].map(|now| expected(&query.title, &seeded.records, now));
        let right = answers.iter().any(|want| {
            let got = pick(&rows, want.columns);
            if want.ordered {
                got == want.rows
            } else {
                sorted(got) == sorted(want.rows.clone())
            }
        });
        assert!(
            !answers[0].rows.is_empty(),
            "{:?}: the seeded trail gives it nothing to find",
            query.title
        );
        assert!(
            right,
            "{:?} ({backend:?}) answered {} rows, the records say {}:\n{}",
            query.title,
            rows.len(),
            answers[0].rows.len(),
            query.sql
        );
    }
    // Each view has the columns the page lists, and the records it says.
    let views = documented_views();
    assert_eq!(views.len(), 8, "{views:?}");
    for (view, columns) in views
        .into_iter()
        .chain(["issued_certificates", "denied_requests"].map(|v| (v.to_owned(), Vec::new())))
    {
        let listed = if columns.is_empty() {
            "*".to_owned()
        } else {
            columns.join(", ")
        };
        let rows = run(&seeded.store, &format!("SELECT {listed} FROM {view}")).await;
        let want = seeded.records.iter().filter(|r| in_view(&view, r)).count();
        assert_eq!(rows.len(), want, "{view}");
        if let Some(row) = rows.first() {
            assert!(columns.iter().all(|c| row.contains_key(c)), "{view}: {row:?}");
        }
    }
    seeded.finish().await;
}

#[test]
fn each_documented_query_is_there_for_both_databases() {
    let queries = doc_queries();
    let titles = |backend: Backend| {
        let mut titles: Vec<&str> = queries
            .iter()
            .filter(|q| q.backend == backend)
            .map(|q| q.title.as_str())
            .collect();
        titles.sort_unstable();
        titles
    };
    assert_eq!(titles(Backend::Postgres), titles(Backend::Sqlite));
}

/// What the store must answer for `filter`, oldest first: a scan of every record.
fn scanned(records: &[StoredRecord], filter: &AuditFilter) -> Vec<i64> {
    let same = |want: &Option<String>, have: &Option<String>| want.is_none() || want == have;
    records
        .iter()
        .filter(|s| {
            let r = &s.record;
            s.seq > filter.after_seq
                && filter.since.is_none_or(|t| r.occurred_at >= t)
                && filter.until.is_none_or(|t| r.occurred_at < t)
                && same(&filter.username, &r.username)
                && same(&filter.subject, &r.subject)
                && same(&filter.cluster, &r.cluster)
                && filter.outcome.as_deref().is_none_or(|o| o == r.outcome)
                && filter.event.as_deref().is_none_or(|e| e == r.event)
                && same(&filter.serial, &r.serial)
                && filter
                    .role
                    .as_ref()
                    .is_none_or(|role| r.roles_granted.contains(role) || r.roles_requested.contains(role))
                && filter.except_event.as_deref().is_none_or(|e| e != r.event)
                && match &filter.method {
                    None => true,
                    Some(MethodFilter::Exact(m)) => is_call(s, Some(m), None),
                    Some(MethodFilter::Prefix(p)) => {
                        is_call(s, None, None)
                            && detail(s, "method")
                                .as_str()
                                .is_some_and(|m| m.starts_with(p.as_str()))
                    }
                }
                && filter.node.as_deref().is_none_or(|n| is_call(s, None, Some(n)))
        })
        .map(|s| s.seq)
        .collect()
}

async fn store_filters_match_a_scan_of_every_record(backend: Backend) {
    let seeded = Seeded::new(backend).await;
    let records = &seeded.records;
    let now = OffsetDateTime::now_utc();
    let sample = &records[records.len() * 2 / 3..]
        .iter()
        .find(|r| r.record.event == "certificate.issued")
        .unwrap()
        .record;
    let text = |t: &str| Some(t.to_owned());
    // Each filter, and whether the trail holds records it matches.
    let filters = [
        (
            AuditFilter {
                since: Some(now - Duration::days(30)),
                role: text("os:admin"),
                ..Default::default()
            },
            true,
        ),
        // Refused requests for os:admin name it only as requested.
        (
            AuditFilter {
                role: text("os:admin"),
                outcome: text("denied"),
                ..Default::default()
            },
            true,
        ),
        (
            AuditFilter {
                role: text("os:etcd:backup"),
                cluster: text("prod"),
                until: Some(now - Duration::days(60)),
                ..Default::default()
            },
            true,
        ),
        (
            AuditFilter {
                role: text("os:impersonator"),
                ..Default::default()
            },
            false,
        ),
        // A role that is a part of another one's name is not that role.
        (
            AuditFilter {
                role: text("os:etcd"),
                ..Default::default()
            },
            false,
        ),
        (
            AuditFilter {
                since: Some(now - Duration::days(7)),
                outcome: text("denied"),
                ..Default::default()
            },
            true,
        ),
        (
            AuditFilter {
                username: sample.username.clone(),
                since: Some(now - Duration::days(45)),
                until: Some(now - Duration::days(5)),
                ..Default::default()
            },
            true,
        ),
        (
            AuditFilter {
                subject: sample.subject.clone(),
                ..Default::default()
            },
            true,
        ),
        (
            AuditFilter {
                event: text("deny.added"),
                ..Default::default()
            },
            true,
        ),
        (
            AuditFilter {
                after_seq: 19_950,
                ..Default::default()
            },
            true,
        ),
        // API calls: by method, exactly or by a prefix, and by node; no
        // other event has either.
        (
            AuditFilter {
                method: Some(MethodFilter::Exact("/machine.MachineService/Reboot".into())),
                node: text("10.5.0.2"),
                since: Some(now - Duration::days(30)),
                ..Default::default()
            },
            true,
        ),
        (
            AuditFilter {
                method: Some(MethodFilter::Prefix("/machine.MachineService/Etcd".into())),
                ..Default::default()
            },
            true,
        ),
        (
            AuditFilter {
                method: Some(MethodFilter::Prefix("/cosi.".into())),
                outcome: text("failed"),
                until: Some(now - Duration::days(45)),
                ..Default::default()
            },
            true,
        ),
        (
            AuditFilter {
                node: text("10.6.0.3"),
                role: text("os:operator"),
                ..Default::default()
            },
            true,
        ),
        (
            AuditFilter {
                username: sample.username.clone(),
                except_event: text("api.call"),
                ..Default::default()
            },
            true,
        ),
        // A node is a whole member of the list, not a part of one.
        (
            AuditFilter {
                node: text("10.5.0"),
                ..Default::default()
            },
            false,
        ),
        (
            AuditFilter {
                method: Some(MethodFilter::Exact("/machine.MachineService/Etcd".into())),
                ..Default::default()
            },
            false,
        ),
        // Other events hold no method: the event of a certificate names none.
        (
            AuditFilter {
                method: Some(MethodFilter::Prefix("/".into())),
                event: text("certificate.issued"),
                ..Default::default()
            },
            false,
        ),
    ];
    for (filter, matches) in filters {
        let all = scanned(records, &filter);
        assert_eq!(!all.is_empty(), matches, "{filter:?}: {} records", all.len());
        // Oldest first, page after page.
        let mut pages = Vec::new();
        let mut page = AuditFilter {
            limit: 100,
            ..filter.clone()
        };
        loop {
            let found = seeded.store.query(&page).await.unwrap();
            pages.extend(found.iter().map(|r| r.seq));
            match found.last() {
                Some(last) if found.len() == 100 => page.after_seq = last.seq,
                _ => break,
            }
        }
        assert_eq!(pages, all, "{filter:?} oldest first");
        // Newest first, page after page, down to the cursor.
        let mut back = Vec::new();
        let mut before = None;
        loop {
            let page = AuditFilter {
                limit: 100,
                ..filter.clone()
            };
            let found = seeded.store.query_newest_first(&page, before).await.unwrap();
            back.extend(found.iter().map(|r| r.seq));
            match found.last() {
                Some(last) if found.len() == 100 => before = Some(last.seq),
                _ => break,
            }
        }
        back.reverse();
        assert_eq!(back, all, "{filter:?} newest first");
    }
    seeded.finish().await;
}

mod documented_queries {
    use super::*;

    #[tokio::test]
    async fn postgres() {
        documented_queries_answer_what_the_records_say(Backend::Postgres).await;
    }

    #[tokio::test]
    async fn sqlite() {
        documented_queries_answer_what_the_records_say(Backend::Sqlite).await;
    }
}

mod store_filters {
    use super::*;

    #[tokio::test]
    async fn postgres() {
        store_filters_match_a_scan_of_every_record(Backend::Postgres).await;
    }

    #[tokio::test]
    async fn sqlite() {
        store_filters_match_a_scan_of_every_record(Backend::Sqlite).await;
    }
}

/// Each role of each record (granted or requested), as
/// `audit_event_roles` should hold it.
fn roles_of(records: &[StoredRecord]) -> Vec<(i64, String)> {
    let mut roles: Vec<(i64, String)> = records
        .iter()
        .flat_map(|s| {
            let r = &s.record;
            r.roles_granted
                .iter()
                .chain(&r.roles_requested)
                .map(move |role| (s.seq, role.clone()))
        })
        .collect();
    roles.sort();
    roles.dedup();
    roles
}

async fn role_rows(pool: &sqlx::SqlitePool) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT seq, role FROM audit_event_roles ORDER BY seq, role")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// SQLite's role filter reads `audit_event_roles`, derived from the
/// records: filled from the records already there when 0004 is applied,
/// then by its trigger; refusing to say anything the records do not; and
/// following the records when their owner has removed the append-only
/// triggers, so that the store still appends. The chain does not cover it.
#[tokio::test]
async fn sqlite_role_table_says_what_the_records_say() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/audit.db", dir.path().display());
    let store = AuditStore::connect(&url, &StoreOptions::default()).await.unwrap();
    let AuditStore::Sqlite(sqlite) = &store else {
        panic!("{url} is not SQLite")
    };
    let pool = sqlite.pool();
    migrate_up_to(&store, 3).await.unwrap();
    let plan = SeedPlan {
        records: 3_000,
        seed: 5,
        until: OffsetDateTime::now_utc(),
        days: 30,
        users: 50,
        api_calls: 0.0,
    };
    let trail: Vec<_> = Trail::new(&plan).collect();
    let (earlier, later) = trail.split_at(2_000);
    // Written by this server to the older schema: records only (the deny
    // list's later columns and view are not there yet).
    let earlier: Vec<_> = earlier
        .iter()
        .map(|append| talos_sso_server::audit::store::Append {
            deny_check: false,
            deny_change: None,
            ..append.clone()
        })
        .collect();
    for batch in earlier.chunks(500) {
        store.append_batch(batch).await.unwrap();
    }
    store.migrate().await.unwrap();
    for batch in later.chunks(500) {
        store.append_batch(batch).await.unwrap();
    }
    let records = store.page(0, 10_000).await.unwrap();
    let expected = roles_of(&records);
    assert!(expected.iter().any(|(seq, _)| *seq <= 2_000) && expected.iter().any(|(seq, _)| *seq > 2_000));
    assert_eq!(role_rows(pool).await, expected);

    // Not a way around the append-only trail, nor a way to make the
    // filter find or miss a record.
    let (seq, role) = expected[0].clone();
    let missing = expected.iter().find(|(_, r)| r != &role).unwrap().1.clone();
    let listed_elsewhere = records
        .iter()
        .find(|s| !s.record.roles_granted.contains(&missing) && !s.record.roles_requested.contains(&missing))
        .unwrap()
        .seq;
    for (sql, refusal) in [
        (
            format!("UPDATE audit_event_roles SET role = '{missing}' WHERE seq = {seq}"),
            "append-only: UPDATE refused",
        ),
        (
            format!("DELETE FROM audit_event_roles WHERE seq = {seq}"),
            "append-only: DELETE refused",
        ),
        (
            format!("INSERT INTO audit_event_roles (seq, role) VALUES ({listed_elsewhere}, '{missing}')"),
            "holds only the roles of audit_events",
        ),
        (
            format!("INSERT INTO audit_event_roles (seq, role) VALUES (99999, '{role}')"),
            "holds only the roles of audit_events",
        ),
    ] {
        let error = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .execute(pool)
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains(refusal), "{sql}: {error}");
    }
    assert_eq!(role_rows(pool).await, expected);

    // The owner removes the append-only triggers: a record changed, the
    // last ones removed. The roles follow, and the store appends again
    // at the removed places.
    sqlx::raw_sql(
        "DROP TRIGGER audit_events_no_update; DROP TRIGGER audit_events_no_delete; \
         UPDATE audit_events SET roles_granted = '[\"os:impersonator\"]' WHERE seq = 10; \
         DELETE FROM audit_events WHERE seq > 2900;",
    )
    .execute(pool)
    .await
    .unwrap();
    let changed = store.page(0, 10_000).await.unwrap();
    assert_eq!(role_rows(pool).await, roles_of(&changed));
    assert!(role_rows(pool).await.contains(&(10, "os:impersonator".into())));
    for batch in later[..200].chunks(100) {
        store.append_batch(batch).await.unwrap();
    }
    let appended = store.page(0, 10_000).await.unwrap();
    assert_eq!(appended.len(), 3_100);
    assert_eq!(role_rows(pool).await, roles_of(&appended));

    // The chain is the records': broken at the changed one, whatever the
    // table holds.
    let check = store.verify_chain().await.unwrap();
    assert_eq!(check.first_broken.map(|b| b.seq), Some(10));
    store.close().await;
}
