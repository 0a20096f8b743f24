//! `seed-audit`: fill an empty audit database with a realistic, made-up
//! trail ([`talos_sso_tests::audit_seed`]), through the store as the server
//! writes it (`AuditStore::append_batch`: hash-chained, deny-list changes in
//! the same transaction), so that `talos-sso-server audit verify` passes on
//! the result. Deterministic from `--seed` and `--until`.
//!
//! ```sh
//! cargo run --release -p talos-sso-tests --bin seed-audit -- \
//!     --database postgres://postgres@127.0.0.1:5432/audit_big --records 1000000
//! cargo run --release -p talos-sso-tests --bin seed-audit -- \
//!     --database sqlite:///tmp/audit-big.db --records 1000000
//! ```
//! Options: `--seed N` (1), `--until RFC3339` (now), `--days N` (90),
//! `--users N` (3000), `--batch N` (500 records a transaction),
//! `--api-calls SHARE` (0: the share of Talos API calls, 0 to 1). The
//! database is migrated first and must hold no records; a Postgres
//! database must exist. Prints the time taken, then checks the chain.

// A command-line tool: a broken setup should stop the run loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::time::Instant;

use talos_sso_server::audit::store::{AuditStore, StoreOptions};
use talos_sso_tests::audit_seed::{SeedPlan, Trail};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

struct Options {
    database: String,
    plan: SeedPlan,
    batch: usize,
}

fn options() -> Result<Options, String> {
    let mut database = None;
    let mut plan = SeedPlan::new(1_000_000, OffsetDateTime::now_utc());
    let mut batch = 500;
    for (flag, value) in talos_sso_tests::load::flag_pairs()? {
        let number = |what: &str| {
            value
                .parse::<u64>()
                .map_err(|_| format!("{what} takes a whole number"))
        };
        match flag.as_str() {
            "--database" => database = Some(value),
            "--records" => plan.records = number("--records")?,
            "--seed" => plan.seed = number("--seed")?,
            "--days" => plan.days = number("--days")?.clamp(1, 3650) as u32,
            "--users" => plan.users = number("--users")?.clamp(8, 1_000_000) as usize,
            "--batch" => batch = number("--batch")?.clamp(1, 5000) as usize,
            "--api-calls" => {
                plan.api_calls = value
                    .parse::<f64>()
                    .ok()
                    .filter(|share| (0.0..=1.0).contains(share))
                    .ok_or("--api-calls takes a share of the records, 0 to 1")?
            }
            "--until" => {
                plan.until = OffsetDateTime::parse(&value, &Rfc3339)
                    .map_err(|e| format!("--until takes an RFC 3339 time: {e}"))?
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let database = database.ok_or("--database URL is required (postgres://... or sqlite://...)")?;
    Ok(Options {
        database,
        plan,
        batch,
    })
}

fn main() -> Result<(), String> {
    let options = options()?;
    let runtime = talos_sso_tests::load::runtime()?;
    runtime.block_on(async {
        let store = AuditStore::connect(&options.database, &StoreOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        if !store.page(0, 1).await.map_err(|e| e.to_string())?.is_empty() {
            return Err("the database already holds audit records: seed an empty one".into());
        }
        let plan = &options.plan;
        println!(
            "seed-audit: {} records on {} (seed {}, {} users, {} days up to {}), {} a transaction",
            plan.records,
            store.kind(),
            plan.seed,
            plan.users,
            plan.days,
            plan.until.format(&Rfc3339).unwrap_or_default(),
            options.batch
        );
        let started = Instant::now();
        let mut trail = Trail::new(plan);
        let mut written = 0u64;
        let mut next_report = 100_000;
        loop {
            let batch: Vec<_> = trail.by_ref().take(options.batch).collect();
            if batch.is_empty() {
                break;
            }
            store.append_batch(&batch).await.map_err(|e| e.to_string())?;
            written += batch.len() as u64;
            if written >= next_report {
                let secs = started.elapsed().as_secs_f64();
                println!(
                    "  {written} records, {secs:.0} s, {:.0} records/s",
                    written as f64 / secs
                );
                next_report += 100_000;
            }
        }
        let seeding = started.elapsed();
        println!(
            "seeded {written} records in {:.1} s ({:.0} records/s)",
            seeding.as_secs_f64(),
            written as f64 / seeding.as_secs_f64()
        );
        if let AuditStore::Postgres(pool) = &store {
            // What autovacuum would do soon after such a load: the planner
            // needs the statistics.
            sqlx::query("ANALYZE audit_events")
                .execute(pool)
                .await
                .map_err(|e| e.to_string())?;
        }
        let started = Instant::now();
        let check = store.verify_chain().await.map_err(|e| e.to_string())?;
        store.close().await;
        match check.first_broken {
            None => {
                println!(
                    "audit chain intact: {} records verified (last seq {}) in {:.1} s",
                    check.verified,
                    check.last_seq,
                    started.elapsed().as_secs_f64()
                );
                Ok(())
            }
            Some(broken) => Err(format!(
                "audit chain broken at record {}: {}",
                broken.seq, broken.reason
            )),
        }
    })
}
