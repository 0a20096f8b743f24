//! `loadgen`: issuances per second and latency of a real talos-sso-server
//! (HTTP, token verification, policy, signing, audit commit) at several
//! concurrency levels, with the Postgres and the SQLite audit store, on this
//! machine, load generator included; and the pure crypto cost per issuance
//! (token verify + CSR verify + sign) measured in the same run, so that the
//! throughput can be read as a ratio to that floor; and, for each level, the
//! storage floor: the level's audit records appended again, in the batch
//! size the group-commit writer made on average, straight through a fresh
//! store of the same kind (no HTTP, no crypto, no writer task), and the CPU
//! time that took per record (this process's, and the Postgres server's).
//! The last columns are the throughput's ratios to both floors added: in
//! time per issuance (the crypto on all cores, then the storage, one batch
//! after another, so round trips on an idle machine count in full), and in
//! CPU time (the crypto and the storage's CPU work shared by all cores: the
//! machine's capacity for the two alone). What is left is what the HTTP and
//! application layers and the load generator cost.
//!
//! ```sh
//! cargo run --release -p talos-sso-tests --bin loadgen -- [--requests 4000] [--concurrency 1,16,64] [--store postgres,sqlite] [--ca file,softhsm]
//! ```
//! `--ca softhsm` signs with the CA key in a SoftHSM 2 token (Ed25519,
//! through PKCS#11; needs the `softhsm2` and `opensc` packages), next to the
//! file-backed key in the same run.
//! Tokens and CSRs are made before the clock starts: the client's key
//! generation is not what is measured. Each level's clients open their
//! connections as it starts, all at once; standard error says what their
//! first requests took and the p99 of the rest, since at concurrency 64
//! those first requests alone are more than the slowest 1%.

// Measurement tooling: a broken setup should stop the run loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::atomic::Ordering;

use talos_sso_server::audit::StoredRecord;
use talos_sso_server::audit::store::{Append, AuditStore, TokenClaim};
use talos_sso_server::certificate::{self, LeafRequest};
use talos_sso_server::identity::jwks::KeySet;
use talos_sso_tests::harness::{Backend, BareStore, TestEnv};
use talos_sso_tests::load;

/// Where the CA key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CaKey {
    File,
    SoftHsm,
}

struct Options {
    requests: usize,
    concurrency: Vec<usize>,
    stores: Vec<Backend>,
    cas: Vec<CaKey>,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        requests: 4000,
        concurrency: vec![1, 16, 64],
        stores: vec![Backend::Postgres, Backend::Sqlite],
        cas: vec![CaKey::File],
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--requests" => options.requests = value.parse().map_err(|_| "--requests takes a number")?,
            "--concurrency" => {
                options.concurrency = value
                    .split(',')
                    .map(|c| c.trim().parse())
                    .collect::<Result<_, _>>()
                    .map_err(|_| "--concurrency takes numbers")?
            }
            "--store" => {
                options.stores = value
                    .split(',')
                    .map(|s| match s.trim() {
                        "postgres" => Ok(Backend::Postgres),
                        "sqlite" => Ok(Backend::Sqlite),
                        other => Err(format!("unknown store {other}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--ca" => {
                options.cas = value
                    .split(',')
                    .map(|s| match s.trim() {
                        "file" => Ok(CaKey::File),
                        "softhsm" => Ok(CaKey::SoftHsm),
                        other => Err(format!("unknown CA key place {other} (file or softhsm)")),
                    })
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(options)
}

struct Run {
    throughput: f64,
    p50: Duration,
    p99: Duration,
    failures: usize,
    /// Each client's first request, which opens its connection while every
    /// other client opens theirs (sorted).
    firsts: Vec<Duration>,
    /// p99 of the requests after each client's first.
    p99_after_firsts: Duration,
}

async fn fire(env: &TestEnv, work: Vec<(String, String)>, concurrency: usize) -> Run {
    let url = env.server.base_url.clone();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .expect("client");
    let queue = Arc::new(tokio::sync::Mutex::new(work.into_iter()));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let queue = queue.clone();
        let client = client.clone();
        let url = url.clone();
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failures = 0;
            loop {
                let next = queue.lock().await.next();
                let Some((token, csr)) = next else { break };
                let t0 = Instant::now();
                let ok = load::issue(&client, &url, &token, &csr)
                    .await
                    .is_ok_and(|status| status == 201);
                latencies.push(t0.elapsed());
                if !ok {
                    failures += 1;
                }
            }
            (latencies, failures)
        }));
    }
    let mut latencies = Vec::new();
    let mut firsts = Vec::new();
    let mut after_firsts = Vec::new();
    let mut failures = 0;
    for worker in workers {
        let (l, f) = worker.await.expect("worker");
        if let Some((first, rest)) = l.split_first() {
            firsts.push(*first);
            after_firsts.extend_from_slice(rest);
        }
        latencies.extend(l);
        failures += f;
    }
    let elapsed = started.elapsed();
    latencies.sort();
    firsts.sort();
    after_firsts.sort();
    Run {
        throughput: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: load::percentile(&latencies, 0.50),
        p99: load::percentile(&latencies, 0.99),
        failures,
        firsts,
        p99_after_firsts: load::percentile(&after_firsts, 0.99),
    }
}

/// Token verify + CSR verify + sign, one core, no I/O: the floor.
async fn crypto_cost(env: &TestEnv) -> Duration {
    let jwks = reqwest::get(format!(
        "{}/{}/discovery/v2.0/keys",
        env.emulator.base_url,
        talos_sso_tests::emulator::TENANT_ID
    ))
    .await
    .expect("jwks")
    .text()
    .await
    .expect("jwks text");
    let keys = KeySet::from_json(&jwks).expect("key set");
    let rules = env.server.app.authenticator.login().rules();
    let settings = env.server.app.settings();
    let cluster = &settings.clusters["prod"];
    let work = load::prepare(&env.emulator, 500);
    let roles = vec!["os:operator".to_owned()];
    let now = time::OffsetDateTime::now_utc();
    let started = Instant::now();
    for (jwt, csr) in &work {
        let verified = rules.verify(jwt, &keys, now).expect("token");
        let request = LeafRequest {
            username: &verified.username,
            roles: &roles,
            ttl: Duration::from_secs(300),
            clock_skew: cluster.config.clock_skew,
        };
        certificate::issue(&cluster.ca, csr.as_bytes(), &request, now).expect("issue");
    }
    started.elapsed() / work.len() as u32
}

/// Every record of `store` after `after`, in order.
async fn records_after(store: &AuditStore, mut after: i64) -> Vec<StoredRecord> {
    let mut all = Vec::new();
    loop {
        let page = store.page(after, 1000).await.expect("page");
        let Some(last) = page.last() else { break };
        after = last.seq;
        all.extend(page);
    }
    all
}

/// The storage floor of one level.
struct StorageFloor {
    /// Appends per second, one batch after the other.
    rate: f64,
    /// CPU time per record: this process's and, on Postgres, the database
    /// server's (SQLite runs in this process).
    cpu: Duration,
    /// The database server's part of `cpu` (Postgres).
    database_cpu: Duration,
}

/// `records` appended again straight through `store` (each with a token id
/// of its own to claim, checked against the deny list, as an issuance is)
/// in batches of `batch`, one after the other, as the writer commits them:
/// how fast, and the CPU time it took.
async fn storage_floor(store: &AuditStore, records: &[StoredRecord], batch: usize) -> StorageFloor {
    let expires_at = Some(time::OffsetDateTime::now_utc() + Duration::from_secs(3600));
    let appends: Vec<Append> = records
        .iter()
        .map(|stored| {
            let mut record = stored.record.clone();
            let token_id = format!(
                "floor-{}",
                record.token_id.as_deref().unwrap_or(&record.request_id)
            );
            record.token_id = Some(token_id.clone());
            Append {
                record,
                claim: Some(TokenClaim {
                    token_id,
                    expires_at,
                    uses: 1,
                }),
                deny_check: true,
                deny_change: None,
            }
        })
        .collect();
    let database_cpu = || match store {
        AuditStore::Postgres(_) => load::postgres_cpu(),
        AuditStore::Sqlite(_) => Duration::ZERO,
    };
    let (started, own, database) = (Instant::now(), load::own_cpu(), database_cpu());
    for chunk in appends.chunks(batch.max(1)) {
        store.append_batch(chunk).await.expect("storage floor append");
    }
    let elapsed = started.elapsed();
    let (own, database) = (load::own_cpu() - own, database_cpu() - database);
    let records = appends.len().max(1) as u32;
    StorageFloor {
        rate: appends.len() as f64 / elapsed.as_secs_f64(),
        cpu: (own + database) / records,
        database_cpu: database / records,
    }
}

/// How the store makes a commit durable, as it says itself: what the
/// figures depend on most.
async fn durability(store: &AuditStore) -> String {
    match store {
        AuditStore::Postgres(pool) => {
            let show = |setting: &'static str| async move {
                let value: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
                    .fetch_one(pool)
                    .await
                    .expect("SHOW");
                format!("{setting} = {value}")
            };
            format!("{}, {}", show("fsync").await, show("synchronous_commit").await)
        }
        AuditStore::Sqlite(sqlite) => {
            // The same on every connection (a unit test checks both pools).
            let pool = sqlite.pool();
            let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
                .fetch_one(pool)
                .await
                .expect("PRAGMA");
            // 2 is FULL: each commit is fsynced.
            let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(pool)
                .await
                .expect("PRAGMA");
            format!("journal_mode = {journal}, synchronous = {synchronous} (2 is FULL)")
        }
    }
}

fn main() -> Result<(), String> {
    let options = options()?;
    let runtime = load::runtime()?;
    runtime.block_on(async {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        println!("loadgen: {} requests per level, {cores} cores, server and load generator in one process", options.requests);
        println!();
        println!("| store | CA key | concurrency | issuances/s | p50 | p99 | failures | records per batch | storage floor/s | storage CPU per record | ratio to crypto floor | ratio to crypto + storage floor | ratio to CPU floor |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        let hsm = options
            .cas
            .contains(&CaKey::SoftHsm)
            .then(talos_sso_tests::softhsm::SoftHsm::exclusive);
        let token_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let runs: Vec<(Backend, CaKey)> = options
            .stores
            .iter()
            .flat_map(|b| options.cas.iter().map(move |c| (*b, *c)))
            .collect();
        for (backend, ca) in &runs {
            let backend = &backend;
            let ca_line = match (ca, &hsm) {
                (CaKey::SoftHsm, Some(hsm)) => {
                    let token = hsm.token(token_dir.path(), talos_sso_tests::softhsm::TokenKey::Ed25519, "talos-ca");
                    let (_, cert_file) = talos_sso_tests::softhsm::intermediate_for(token_dir.path(), &token.source);
                    Some(talos_sso_tests::softhsm::ca_line(&cert_file, &token.source))
                }
                _ => None,
            };
            let env = TestEnv::start_with(**backend, |yaml| match &ca_line {
                Some(line) => talos_sso_tests::softhsm::with_ca_line(&yaml, line),
                None => yaml,
            })
            .await;
            let store = env.server.app.audit.store().clone();
            let settings = durability(&store).await;
            let cost = crypto_cost(&env).await;
            let floor = cores as f64 / cost.as_secs_f64();
            // Warm up connections, caches and the database.
            let warm = load::prepare(&env.emulator, 200);
            fire(&env, warm, 16).await;
            let stats = env.server.app.audit.stats().clone();
            let mut levels = Vec::new();
            for &concurrency in &options.concurrency {
                let work = load::prepare(&env.emulator, options.requests);
                let (head, _) = store.head().await.map_err(|e| e.to_string())?;
                let (batches, records) = (stats.batches.load(Ordering::Relaxed), stats.records.load(Ordering::Relaxed));
                let ahead = stats.locked_ahead.load(Ordering::Relaxed);
                // On stderr, for tools that watch the run (tests/profile-callgrind.sh
                // measures between these two lines).
                eprintln!("loadgen: {backend:?} concurrency {concurrency}: sending");
                let run = fire(&env, work, concurrency).await;
                eprintln!("loadgen: {backend:?} concurrency {concurrency}: answered");
                let batches = stats.batches.load(Ordering::Relaxed) - batches;
                let ahead = stats.locked_ahead.load(Ordering::Relaxed) - ahead;
                eprintln!("loadgen: {backend:?} concurrency {concurrency}: {ahead} of {batches} batches began with the lock taken ahead");
                // All clients connect at once as a level starts, so at 64
                // their first requests alone are more than 1% of 4,000.
                let ms = |d: Duration| d.as_secs_f64() * 1000.0;
                eprintln!(
                    "loadgen: {backend:?} concurrency {concurrency}: each client's first request (connecting) {:.2} to {:.2} ms, median {:.2} ms; p99 of the others {:.2} ms",
                    ms(run.firsts.first().copied().unwrap_or_default()),
                    ms(run.firsts.last().copied().unwrap_or_default()),
                    ms(load::percentile(&run.firsts, 0.5)),
                    ms(run.p99_after_firsts),
                );
                let per_batch = (stats.records.load(Ordering::Relaxed) - records) as f64 / batches.max(1) as f64;
                let (last, _) = store.head().await.map_err(|e| e.to_string())?;
                levels.push((concurrency, run, head + 1..=last, per_batch));
            }
            // The storage floors after every level, into a database made
            // now: making one (and appending to it) while the server is
            // measured would load the same disk and database server.
            let floor_store = BareStore::open(**backend).await;
            for (concurrency, run, seqs, per_batch) in levels {
                let mut written = records_after(&store, seqs.start() - 1).await;
                written.retain(|r| seqs.contains(&r.seq));
                let storage = storage_floor(&floor_store.store, &written, per_batch.round() as usize).await;
                // Time per issuance at both floors: the crypto on every
                // core, then its record through the store.
                let both = 1.0 / (1.0 / floor + 1.0 / storage.rate);
                // Issuances per second if every core did nothing but the
                // crypto and the storage's CPU work.
                let cpu_floor = cores as f64 / (cost + storage.cpu).as_secs_f64();
                let storage_cpu = match backend {
                    Backend::Postgres => format!(
                        "{:.0} µs ({:.0} µs Postgres)",
                        storage.cpu.as_secs_f64() * 1e6,
                        storage.database_cpu.as_secs_f64() * 1e6
                    ),
                    Backend::Sqlite => format!("{:.0} µs", storage.cpu.as_secs_f64() * 1e6),
                };
                println!(
                    "| {:?} | {ca:?} | {concurrency} | {:.0} | {:.2} ms | {:.2} ms | {} | {per_batch:.1} | {:.0} | {storage_cpu} | {:.2} | {:.2} | {:.2} |",
                    backend,
                    run.throughput,
                    run.p50.as_secs_f64() * 1000.0,
                    run.p99.as_secs_f64() * 1000.0,
                    run.failures,
                    storage.rate,
                    run.throughput / floor,
                    run.throughput / both,
                    run.throughput / cpu_floor,
                );
            }
            println!(
                "| {:?} | {ca:?} | crypto floor | {floor:.0} ({:.1} µs per issuance on one core, x{cores} cores) | | | | | | | 1.00 | | |",
                backend,
                cost.as_secs_f64() * 1e6
            );
            println!("| {:?} | {ca:?} | durability | {settings} | | | | | | | | | |", backend);
            floor_store.close().await;
            let check = env.server.app.audit.store().verify_chain().await.map_err(|e| e.to_string())?;
            println!("| {:?} | {ca:?} | chain | {} records verified, intact: {} | | | | | | | | | |", backend, check.verified, check.first_broken.is_none());
            env.finish().await;
        }
        Ok(())
    })
}
