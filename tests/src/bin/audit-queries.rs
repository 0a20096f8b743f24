//! `audit-queries`: how long the store takes to answer the audit queries
//! people ask, on a database filled by `seed-audit`: the store's own
//! queries (`AuditStore::query`, what `GET /v1/audit` runs, 100 records a
//! page, oldest first) and their newest-first form
//! (`AuditStore::query_newest_first`, what a console would run), each
//! repeated, following the cursor for a few pages, as time per page
//! (p50 / p95 / max). The time is the store call in this process: the SQL,
//! the rows' transfer and their decoding into records; HTTP and JSON come
//! on top.
//!
//! ```sh
//! cargo run --release -p talos-sso-tests --bin audit-queries -- --database URL [--repeat 20] [--pages 3]
//! ```
//! The database is not changed (no migration is run). The people, serial
//! and cursors asked about are taken from the trail itself, from a record
//! two thirds of the way along it. "Cursor far into the trail" is the page
//! after record LAST-150 oldest first, and the page before record 150
//! newest first.

// A command-line tool: a broken setup should stop the run loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::time::{Duration, Instant};

use talos_sso_server::audit::StoredRecord;
use talos_sso_server::audit::store::{AuditFilter, AuditStore, MethodFilter, StoreOptions};
use talos_sso_tests::load::percentile;
use time::OffsetDateTime;

struct Options {
    database: String,
    repeat: usize,
    pages: usize,
}

fn options() -> Result<Options, String> {
    let mut database = None;
    let (mut repeat, mut pages) = (20, 3);
    for (flag, value) in talos_sso_tests::load::flag_pairs()? {
        let number = |what: &str| {
            value
                .parse::<usize>()
                .map_err(|_| format!("{what} takes a whole number"))
                .map(|n| n.clamp(1, 10_000))
        };
        match flag.as_str() {
            "--database" => database = Some(value),
            "--repeat" => repeat = number("--repeat")?,
            "--pages" => pages = number("--pages")?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let database = database.ok_or("--database URL is required (postgres://... or sqlite://...)")?;
    Ok(Options {
        database,
        repeat,
        pages,
    })
}

/// One query: a name as the CLI would spell it, its filter, and where the
/// newest-first form starts (`None`: from the newest record; a cursor
/// here reads back from it to the start of the trail).
struct Case {
    name: String,
    filter: AuditFilter,
    before_seq: Option<i64>,
}

fn days_ago(now: OffsetDateTime, days: i64) -> Option<OffsetDateTime> {
    Some(now - time::Duration::days(days))
}

fn cases(sample: &StoredRecord, last_seq: i64, now: OffsetDateTime) -> Vec<Case> {
    let page = |filter: AuditFilter| AuditFilter { limit: 100, ..filter };
    let user = sample.record.username.clone();
    let subject = sample.record.subject.clone();
    let serial = sample.record.serial.clone();
    let role = |r: &str| Some(r.to_owned());
    let text = |t: &str| Some(t.to_owned());
    let case = |name: &str, filter: AuditFilter| Case {
        name: name.to_owned(),
        filter: page(filter),
        before_seq: None,
    };
    vec![
        case("(no filter)", AuditFilter::default()),
        case(
            "--since 30d --role os:admin",
            AuditFilter {
                since: days_ago(now, 30),
                role: role("os:admin"),
                ..Default::default()
            },
        ),
        case(
            "--user U",
            AuditFilter {
                username: user.clone(),
                ..Default::default()
            },
        ),
        case(
            "--user U --since 7d",
            AuditFilter {
                username: user,
                since: days_ago(now, 7),
                ..Default::default()
            },
        ),
        case(
            "--subject S",
            AuditFilter {
                subject,
                ..Default::default()
            },
        ),
        case(
            "--cluster prod --role os:admin",
            AuditFilter {
                cluster: text("prod"),
                role: role("os:admin"),
                ..Default::default()
            },
        ),
        case(
            "--cluster prod --role os:admin --since 7d",
            AuditFilter {
                cluster: text("prod"),
                role: role("os:admin"),
                since: days_ago(now, 7),
                ..Default::default()
            },
        ),
        case(
            "--outcome denied --since 7d",
            AuditFilter {
                outcome: text("denied"),
                since: days_ago(now, 7),
                ..Default::default()
            },
        ),
        case(
            "--serial X",
            AuditFilter {
                serial,
                ..Default::default()
            },
        ),
        case(
            "--event deny.added",
            AuditFilter {
                event: text("deny.added"),
                ..Default::default()
            },
        ),
        case(
            "--event certificate.denied --since 30d",
            AuditFilter {
                event: text("certificate.denied"),
                since: days_ago(now, 30),
                ..Default::default()
            },
        ),
        case(
            "--user nobody (matches nothing)",
            AuditFilter {
                username: text("nobody@example.com"),
                ..Default::default()
            },
        ),
        case(
            "--role os:impersonator --since 30d (matches nothing)",
            AuditFilter {
                role: role("os:impersonator"),
                since: days_ago(now, 30),
                ..Default::default()
            },
        ),
        // The gateway's API calls (a trail seeded with `--api-calls`; on
        // one without, each matches nothing).
        case(
            "--event api.call --method Reboot --node 10.5.0.2 --since 7d",
            AuditFilter {
                event: text("api.call"),
                method: Some(MethodFilter::Exact("/machine.MachineService/Reboot".into())),
                node: text("10.5.0.2"),
                since: days_ago(now, 7),
                ..Default::default()
            },
        ),
        case(
            "--method EtcdLeaveCluster (a rare method)",
            AuditFilter {
                method: Some(MethodFilter::Exact(
                    "/machine.MachineService/EtcdLeaveCluster".into(),
                )),
                ..Default::default()
            },
        ),
        case(
            "--method '/machine.MachineService/Etcd*'",
            AuditFilter {
                method: Some(MethodFilter::Prefix("/machine.MachineService/Etcd".into())),
                ..Default::default()
            },
        ),
        case(
            "--method Reboot --since 30d",
            AuditFilter {
                method: Some(MethodFilter::Exact("/machine.MachineService/Reboot".into())),
                since: days_ago(now, 30),
                ..Default::default()
            },
        ),
        case(
            "--node 10.9.9.9 (matches nothing)",
            AuditFilter {
                node: text("10.9.9.9"),
                ..Default::default()
            },
        ),
        case(
            "--method /x.Y/Nothing (matches nothing)",
            AuditFilter {
                method: Some(MethodFilter::Exact("/x.Y/Nothing".into())),
                ..Default::default()
            },
        ),
        Case {
            name: "cursor far into the trail (no filter)".into(),
            filter: page(AuditFilter {
                after_seq: (last_seq - 150).max(0),
                ..Default::default()
            }),
            before_seq: Some(150),
        },
        Case {
            name: "cursor far into the trail, --role os:admin".into(),
            filter: page(AuditFilter {
                after_seq: (last_seq - 150).max(0),
                role: role("os:admin"),
                ..Default::default()
            }),
            before_seq: Some(150),
        },
    ]
}

struct Timing {
    per_page: Vec<Duration>,
    pages: usize,
    first_page_rows: usize,
}

/// `repeat` times: the first page and up to `pages - 1` more after it.
async fn time_case(
    store: &AuditStore,
    case: &Case,
    newest_first: bool,
    repeat: usize,
    pages: usize,
) -> Result<Timing, String> {
    let mut per_page = Vec::new();
    let (mut walked, mut first_page_rows) = (0, 0);
    for _ in 0..repeat {
        let mut filter = case.filter.clone();
        let mut before = case.before_seq;
        if newest_first && before.is_some() {
            // Deep into the trail going back is near its start.
            filter.after_seq = 0;
        }
        walked = 0;
        for n in 0..pages {
            let started = Instant::now();
            let records = if newest_first {
                store.query_newest_first(&filter, before).await
            } else {
                store.query(&filter).await
            }
            .map_err(|e| e.to_string())?;
            per_page.push(started.elapsed());
            walked += 1;
            if n == 0 {
                first_page_rows = records.len();
            }
            match records.last() {
                Some(last) if records.len() as i64 >= filter.limit => {
                    if newest_first {
                        before = Some(last.seq);
                    } else {
                        filter.after_seq = last.seq;
                    }
                }
                _ => break,
            }
        }
    }
    per_page.sort();
    Ok(Timing {
        per_page,
        pages: walked,
        first_page_rows,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

async fn indexes(store: &AuditStore) -> Result<Vec<String>, sqlx::Error> {
    match store {
        AuditStore::Postgres(pool) => {
            sqlx::query_scalar(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'audit_events' ORDER BY indexname",
            )
            .fetch_all(pool)
            .await
        }
        AuditStore::Sqlite(sqlite) => {
            let pool = sqlite.pool();
            sqlx::query_scalar(
                "SELECT coalesce(sql, name || ' (automatic)') FROM sqlite_master \
             WHERE (type = 'index' AND tbl_name IN ('audit_events', 'audit_event_roles')) \
             OR (type = 'table' AND name = 'audit_event_roles') ORDER BY name",
            )
            .fetch_all(pool)
            .await
        }
    }
}

fn main() -> Result<(), String> {
    let options = options()?;
    let runtime = talos_sso_tests::load::runtime()?;
    runtime.block_on(async {
        let store = AuditStore::connect(&options.database, &StoreOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let last = store
            .query_newest_first(
                &AuditFilter {
                    limit: 1,
                    ..Default::default()
                },
                None,
            )
            .await
            .map_err(|e| e.to_string())?;
        let last_seq = last
            .first()
            .map(|r| r.seq)
            .ok_or("the trail is empty: run seed-audit first")?;
        // An issuance two thirds along: its person, subject and serial.
        let sample = store
            .query(&AuditFilter {
                after_seq: last_seq * 2 / 3,
                event: Some("certificate.issued".into()),
                limit: 1,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?
            .pop()
            .ok_or("no certificate.issued record in the last third of the trail")?;
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        println!(
            "audit-queries: {} store, {last_seq} records, {cores} cores, load average {}",
            store.kind(),
            load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        );
        println!(
            "U = {}, S = {}, X = {}",
            sample.record.username.as_deref().unwrap_or("-"),
            sample.record.subject.as_deref().unwrap_or("-"),
            sample.record.serial.as_deref().unwrap_or("-")
        );
        println!("indexes:");
        for index in indexes(&store).await.map_err(|e| e.to_string())? {
            println!("  {index}");
        }
        println!(
            "each query {} times, up to {} pages of 100 each time; ms per page",
            options.repeat, options.pages
        );
        println!();
        println!("| query | order | rows (first page) | pages | p50 | p95 | max |");
        println!("|---|---|---|---|---|---|---|");
        let now = OffsetDateTime::now_utc();
        for case in cases(&sample, last_seq, now) {
            for newest_first in [false, true] {
                // Warm the caches once, as a server that has been running has.
                time_case(&store, &case, newest_first, 1, 1).await?;
                let t = time_case(&store, &case, newest_first, options.repeat, options.pages).await?;
                println!(
                    "| `{}` | {} | {} | {} | {} | {} | {} |",
                    case.name,
                    if newest_first {
                        "newest first"
                    } else {
                        "oldest first"
                    },
                    t.first_page_rows,
                    t.pages,
                    ms(percentile(&t.per_page, 0.50)),
                    ms(percentile(&t.per_page, 0.95)),
                    ms(t.per_page.last().copied().unwrap_or_default()),
                );
            }
        }
        store.close().await;
        Ok(())
    })
}
