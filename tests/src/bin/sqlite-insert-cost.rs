//! `sqlite-insert-cost`: where the CPU time of appending to the SQLite audit
//! store goes, part by part of its schema. The same seeded records
//! ([`talos_sso_tests::audit_seed`]) are appended through the store as the
//! group-commit writer does (`AuditStore::append_batch`, batches of
//! `--batch`), into a fresh database per variant: the schema as migrated,
//! then with parts of it dropped (the role table's guard trigger, its
//! triggers, the secondary indexes, both). What it prints is this process's
//! CPU time per record, user and system (every thread: SQLite runs on
//! sqlx's worker thread; writing the WAL and syncing it is system time),
//! and the wall time per batch, of the round that took least CPU.
//! Only for measuring: the variants that drop a part are not schemas the
//! server may run with.
//!
//! ```sh
//! cargo run --release -p talos-sso-tests --bin sqlite-insert-cost -- [--records 20000] [--batch 26] [--rounds 3]
//! ```

// Measurement tooling: a broken setup should stop the run loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::time::{Duration, Instant};

use talos_sso_server::audit::store::{Append, AuditStore, StoreOptions};
use talos_sso_tests::audit_seed::{SeedPlan, Trail};

/// The secondary indexes of `audit_events` (migrations 0001, 0004, 0005).
const INDEXES: [&str; 6] = [
    "audit_events_occurred_at",
    "audit_events_username",
    "audit_events_serial",
    "audit_events_subject",
    "audit_events_event",
    "audit_events_client_ip",
];

/// A variant: its name, and what is dropped from the migrated schema.
fn variants() -> Vec<(&'static str, String)> {
    let drop_indexes: String = INDEXES.iter().map(|i| format!("DROP INDEX {i};")).collect();
    let drop_roles = "DROP TRIGGER audit_event_roles_only_listed; DROP TRIGGER audit_events_roles_on_insert;";
    vec![
        ("as migrated", String::new()),
        (
            "without the role table's guard (audit_event_roles_only_listed)",
            "DROP TRIGGER audit_event_roles_only_listed;".into(),
        ),
        ("without the role table's triggers", drop_roles.into()),
        ("without the six secondary indexes", drop_indexes.clone()),
        ("the table alone (neither)", format!("{drop_roles}{drop_indexes}")),
    ]
}

/// User and system CPU time of this process, every thread.
fn cpu_time() -> talos_sso_tests::load::StatTimes {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    talos_sso_tests::load::StatTimes::parse(&stat).expect("stat format")
}

/// One round's figures: CPU per record, wall time per batch.
#[derive(Debug, Clone, Copy)]
struct Round {
    user: Duration,
    system: Duration,
    wall: Duration,
}

struct Options {
    records: u64,
    batch: usize,
    rounds: usize,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        records: 20_000,
        batch: 26,
        rounds: 3,
    };
    for (flag, value) in talos_sso_tests::load::flag_pairs()? {
        let number = |what: &str| {
            value
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or(format!("{what} takes a whole number above zero"))
        };
        match flag.as_str() {
            "--records" => options.records = number("--records")?,
            "--batch" => options.batch = number("--batch")? as usize,
            "--rounds" => options.rounds = number("--rounds")? as usize,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(options)
}

/// One round of the variant that drops `drop`.
async fn round(drop: &str, appends: &[Append], batch: usize) -> Round {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/audit.db", dir.path().display());
    let store = AuditStore::connect(&url, &StoreOptions::default())
        .await
        .expect("store");
    store.migrate().await.expect("migrations");
    let AuditStore::Sqlite(sqlite) = &store else {
        unreachable!("a sqlite:// URL opens SQLite")
    };
    let pool = sqlite.pool();
    if !drop.is_empty() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop.to_owned()))
            .execute(pool)
            .await
            .expect("the variant's schema");
    }
    let (cpu, wall) = (cpu_time(), Instant::now());
    for chunk in appends.chunks(batch) {
        store.append_batch(chunk).await.expect("append");
    }
    let (after, wall) = (cpu_time(), wall.elapsed());
    store.close().await;
    let (records, batches) = (appends.len() as u32, appends.len().div_ceil(batch) as u32);
    Round {
        user: (after.user - cpu.user) / records,
        system: (after.system - cpu.system) / records,
        wall: wall / batches,
    }
}

fn main() -> Result<(), String> {
    let options = options()?;
    let runtime = talos_sso_tests::load::runtime()?;
    let plan = SeedPlan::new(options.records, time::OffsetDateTime::now_utc());
    let appends: Vec<Append> = Trail::new(&plan).collect();
    println!(
        "sqlite-insert-cost: {} seeded records in batches of {}, best of {} rounds",
        appends.len(),
        options.batch,
        options.rounds
    );
    println!("| schema | CPU per record: user | system | wall per batch |");
    println!("|---|---:|---:|---:|");
    runtime.block_on(async {
        for (name, drop) in variants() {
            let mut best: Option<Round> = None;
            for _ in 0..options.rounds {
                let this = round(&drop, &appends, options.batch).await;
                // The round that took least CPU in all.
                if best.is_none_or(|b| this.user + this.system < b.user + b.system) {
                    best = Some(this);
                }
            }
            let best = best.expect("at least one round");
            println!(
                "| {name} | {:.1} µs | {:.1} µs | {:.2} ms |",
                best.user.as_secs_f64() * 1e6,
                best.system.as_secs_f64() * 1e6,
                best.wall.as_secs_f64() * 1e3
            );
        }
    });
    Ok(())
}
