//! `soak`: the real `talos-sso-server serve` binary as a process of its own,
//! on a fresh Postgres database, driven at a steady open-loop rate for a
//! given time or number of requests. Requests are scheduled at fixed
//! intervals whatever the server answers (a slow answer does not delay the
//! next request), and each latency counts from the request's scheduled time,
//! so a stall shows in the figures instead of lowering the rate quietly.
//!
//! ```sh
//! cargo run --release -p talos-sso-tests --bin soak -- [--rate 1500] [--duration 10m] [--requests N] [--milestone 100000] [--period 60s]
//! ```
//!
//! `--requests` stops after that many requests even before `--duration`;
//! `--milestone` prints the server's RSS when that many certificates have
//! been issued; `--period` is the length of a row of the table.
//!
//! It prints the server's resident memory (VmRSS of its process) idle
//! before load, at the start, every minute and at the end; per minute the
//! achieved rate, p50/p99 and the errors (anything but 201); then it
//! verifies the audit chain with `talos-sso-server audit verify` and counts
//! the audit rows against the 201s, stops the server with SIGTERM and gives
//! a verdict: pass when nothing failed, the RSS grew by less than 10% from
//! the end of the first minute (the warm-up) to the end, the chain is intact
//! and there is one audit row per 201. It exits 1 on a fail.
//!
//! Tokens are minted during the run, each used once (the replay guard lets a
//! token mint one certificate), by a thread of this process that keeps a few
//! seconds of them ahead; CSRs are made before the start and reused.

// Measurement tooling: a broken setup should stop the run loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use talos_sso_tests::emulator::{EmulatorConfig, EmulatorHandle};
use talos_sso_tests::harness::{TestDatabase, Workdir, config_yaml};
use talos_sso_tests::load;
use talos_sso_tests::quickstart::workspace_binary;

/// The RSS growth after the warm-up minute that fails the soak.
const MAX_GROWTH: f64 = 0.10;
/// Distinct CSRs, reused round robin.
const CSRS: usize = 2000;

struct Options {
    rate: u32,
    duration: Duration,
    requests: Option<usize>,
    /// Print the server's RSS once this many certificates were issued.
    milestone: usize,
    /// The length of one row of the table.
    period: Duration,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        rate: 1500,
        duration: Duration::from_secs(600),
        requests: None,
        milestone: 100_000,
        period: Duration::from_secs(60),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rate" => options.rate = value.parse().map_err(|_| "--rate takes requests per second")?,
            "--duration" => {
                options.duration =
                    humantime::parse_duration(&value).map_err(|e| format!("--duration: {e}"))?
            }
            "--requests" => options.requests = Some(value.parse().map_err(|_| "--requests takes a number")?),
            "--milestone" => options.milestone = value.parse().map_err(|_| "--milestone takes a number")?,
            "--period" => {
                options.period = humantime::parse_duration(&value).map_err(|e| format!("--period: {e}"))?
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if options.rate == 0 || options.period.is_zero() {
        return Err("--rate and --period must be above zero".into());
    }
    Ok(options)
}

/// VmRSS of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("server /proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc status")
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The server process, its configuration and its log (JSON lines on stderr).
struct ServerProcess {
    child: tokio::process::Child,
    pid: u32,
    base_url: String,
    config: PathBuf,
    log: PathBuf,
}

impl ServerProcess {
    async fn start(binary: &Path, config: PathBuf, log: PathBuf) -> Self {
        let stderr = std::fs::File::create(&log).expect("server log file");
        let child = tokio::process::Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("start talos-sso-server");
        let pid = child.id().expect("server pid");
        let mut server = Self {
            child,
            pid,
            base_url: String::new(),
            config,
            log,
        };
        server.base_url = format!("http://{}", server.listening_address().await);
        server
    }

    /// The address of the `listening` log line (the port is chosen by the
    /// system, so that two runs never collide).
    async fn listening_address(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let address = log.lines().find_map(|line| {
                let line: serde_json::Value = serde_json::from_str(line).ok()?;
                (line["fields"]["message"] == "listening")
                    .then(|| line["fields"]["address"].as_str().map(str::to_owned))
                    .flatten()
            });
            if let Some(address) = address {
                return address;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("talos-sso-server exited at start ({status}):\n{log}");
            }
            if Instant::now() > deadline {
                panic!("talos-sso-server did not listen within 60 s:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn rss(&self) -> u64 {
        rss_kib(self.pid)
    }

    /// SIGTERM, as a service manager stops it; the exit status.
    async fn stop(mut self) -> std::process::ExitStatus {
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .expect("kill -TERM");
        assert!(sent.success(), "could not signal the server");
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the server stops within 30 s of SIGTERM")
            .expect("server exit status")
    }

    /// Lines the server logged at WARN or ERROR once it was listening (the
    /// start-up warnings about the test configuration are expected).
    fn warnings(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .skip_while(|line| !line.contains(r#""message":"listening""#))
            .filter(|line| line.contains(r#""level":"WARN""#) || line.contains(r#""level":"ERROR""#))
            .map(str::to_owned)
            .collect()
    }
}

/// What completed in one period of the table.
#[derive(Default)]
struct Period {
    latencies: Vec<Duration>,
    created: usize,
    /// Status codes other than 201, and transport errors (`0`).
    errors: Vec<u16>,
}

/// A thread minting tokens ahead of the schedule, into a bounded queue.
fn token_minter(emulator: EmulatorHandle, total: usize, ahead: usize) -> tokio::sync::mpsc::Receiver<String> {
    let (tx, rx) = tokio::sync::mpsc::channel(ahead);
    std::thread::spawn(move || {
        for n in 0..total {
            if tx.blocking_send(load::token(&emulator, n)).is_err() {
                return;
            }
        }
    });
    rx
}

fn main() -> Result<(), String> {
    let options = options()?;
    let runtime = load::runtime()?;
    let passed = runtime.block_on(soak(options))?;
    if passed { Ok(()) } else { Err("soak failed".into()) }
}

async fn soak(options: Options) -> Result<bool, String> {
    let binary = workspace_binary("talos-sso-server", "talos-sso-server", "talos-sso-server")?;
    let emulator = EmulatorHandle::start(EmulatorConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    let work = Workdir::new();
    let database = TestDatabase::create().await;
    let config = work.path().join("server.yaml");
    std::fs::write(
        &config,
        format!(
            // Plain HTTP is served behind a proxy that terminates TLS, and
            // that proxy is trusted: here the load generator, one address,
            // plays it. Without this line a stall that leaves more than
            // `max_connections_per_address` (128) requests in flight has the
            // further connections closed at once, by design.
            "{}log: {{ format: json }}\nhttp: {{ trusted_proxies: [\"127.0.0.1/32\"] }}\n",
            config_yaml(&emulator, &work, &database.url)
        ),
    )
    .map_err(|e| e.to_string())?;
    let server = ServerProcess::start(&binary, config, work.path().join("server.log")).await;

    let scheduled_total = options
        .requests
        .unwrap_or(usize::MAX)
        .min((options.duration.as_secs_f64() * f64::from(options.rate)).ceil() as usize);
    println!(
        "soak: {} at {} requests/s for {} ({} requests), server {} pid {}, database {}",
        binary.display(),
        options.rate,
        humantime::format_duration(options.duration),
        scheduled_total,
        server.base_url,
        server.pid,
        database.name
    );
    println!("load average at start (1, 5, 15 min): {}", load_average());

    let csrs: Arc<Vec<String>> = Arc::new((0..CSRS).map(|_| load::csr()).collect());
    // A few seconds of tokens ahead, so that minting runs beside the load
    // instead of before it (900,000 tokens would take minutes and a GiB).
    let ahead = (options.rate as usize * 3).clamp(100, 20_000);
    let mut tokens = token_minter(emulator.clone(), scheduled_total, ahead);
    while tokens.len() < ahead.min(scheduled_total) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = server.rss();
    println!("server RSS idle before load: {}", mib(idle));

    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(512)
        // Longer than the server's own `http.request_timeout` (15 s): a
        // slow request is the server's to answer (503), not ours to drop.
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let current = Arc::new(Mutex::new(Period::default()));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let issued = Arc::new(AtomicUsize::new(0));
    let mut milestone_seen = false;
    let started = Instant::now();
    // Checked while sending and once more after the last answer (with
    // `--requests`, the milestone may be the very last certificate).
    let milestone = |seen: &mut bool| {
        if !*seen && issued.load(Ordering::Relaxed) >= options.milestone {
            *seen = true;
            println!(
                "server RSS after {} certificates issued ({:.0} s): {}",
                options.milestone,
                started.elapsed().as_secs_f64(),
                mib(server.rss())
            );
        }
    };
    let at_start = server.rss();
    println!("server RSS at start: {}", mib(at_start));
    println!();
    let row_name = if options.period == Duration::from_secs(60) {
        "minute".to_owned()
    } else {
        format!("period of {}", humantime::format_duration(options.period))
    };
    println!(
        "| {row_name} | server RSS at its end | issuances/s | p50 | p99 | errors | most in flight | late starts |"
    );
    println!("|---|---|---|---|---|---|---|---|");

    let mut rows: Vec<(f64, u64, usize)> = Vec::new();
    let mut totals = (0usize, 0usize);
    let mut sent = 0usize;
    let mut next_row = started + options.period;
    let mut row_started = started;
    let mut most_in_flight = 0usize;
    let mut late = 0usize;
    let finish_row = |row_started: Instant,
                      most: usize,
                      late: usize,
                      rows: &mut Vec<(f64, u64, usize)>,
                      totals: &mut (usize, usize)| {
        let period = std::mem::take(&mut *current.lock().unwrap());
        let rss = server.rss();
        let seconds = row_started.elapsed().as_secs_f64();
        let mut latencies = period.latencies;
        latencies.sort();
        let rate = period.created as f64 / seconds;
        let mut codes = period.errors.clone();
        codes.sort();
        codes.dedup();
        println!(
            "| {} | {} | {:.0} | {:.2} ms | {:.2} ms | {}{} | {most} | {late} |",
            rows.len() + 1,
            mib(rss),
            rate,
            load::percentile(&latencies, 0.50).as_secs_f64() * 1000.0,
            load::percentile(&latencies, 0.99).as_secs_f64() * 1000.0,
            period.errors.len(),
            if codes.is_empty() {
                String::new()
            } else {
                format!(" (status {codes:?}; 0 = no answer)")
            },
        );
        totals.0 += period.created;
        totals.1 += period.errors.len();
        rows.push((seconds, rss, period.errors.len()));
    };

    while sent < scheduled_total {
        let now = Instant::now();
        milestone(&mut milestone_seen);
        if now >= next_row {
            finish_row(row_started, most_in_flight, late, &mut rows, &mut totals);
            row_started = now;
            next_row += options.period;
            most_in_flight = 0;
            late = 0;
        }
        let scheduled = started + Duration::from_secs_f64(sent as f64 / f64::from(options.rate));
        if scheduled > now {
            tokio::time::sleep_until(scheduled.into()).await;
            continue;
        }
        // A start 10 ms behind the schedule: the load generator (token
        // minting, this machine) could not keep the rate.
        if now.duration_since(scheduled) > Duration::from_millis(10) {
            late += 1;
        }
        let Some(token) = tokens.recv().await else { break };
        let csr = csrs.clone();
        let client = client.clone();
        let base_url = server.base_url.clone();
        let current = current.clone();
        let in_flight = in_flight.clone();
        let issued = issued.clone();
        most_in_flight = most_in_flight.max(in_flight.fetch_add(1, Ordering::Relaxed) + 1);
        let n = sent;
        tokio::spawn(async move {
            let answer = load::issue(&client, &base_url, &token, &csr[n % csr.len()]).await;
            let latency = scheduled.elapsed();
            {
                let mut period = current.lock().unwrap();
                match answer {
                    Ok(201) => {
                        issued.fetch_add(1, Ordering::Relaxed);
                        period.created += 1;
                        period.latencies.push(latency);
                    }
                    Ok(status) => period.errors.push(status),
                    Err(error) => {
                        if period.errors.is_empty() {
                            eprintln!("request {n}: no answer: {error:?}");
                        }
                        period.errors.push(0);
                    }
                }
            }
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
        sent += 1;
    }
    // Every request ends within the client's timeout.
    while in_flight.load(Ordering::Relaxed) > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    milestone(&mut milestone_seen);
    finish_row(row_started, most_in_flight, late, &mut rows, &mut totals);
    let elapsed = started.elapsed();
    let end = server.rss();
    let (created, errors) = totals;
    println!();
    println!(
        "sent {sent} in {:.1} s ({:.0}/s): {created} × 201, {errors} errors",
        elapsed.as_secs_f64(),
        created as f64 / elapsed.as_secs_f64()
    );
    println!("server RSS at the end: {}", mib(end));
    println!("load average at the end (1, 5, 15 min): {}", load_average());

    let warnings = server.warnings();
    let config = server.config.clone();
    let stopped = server.stop().await;
    println!(
        "server stopped on SIGTERM: {stopped}; {} WARN/ERROR log lines after start",
        warnings.len()
    );
    for line in warnings.iter().take(5) {
        println!("  {line}");
    }
    let chain_ok = verify_chain(&binary, &config).await?;
    let (rows_total, rows_issued, database_size) = audit_rows(&database).await;
    println!("audit rows: {rows_total} ({rows_issued} certificate.issued) for {created} × 201");
    println!(
        "database size: {} ({:.0} bytes per audit row; the trail and the replay guard's used tokens are kept)",
        mib((database_size / 1024) as u64),
        database_size as f64 / rows_total.max(1) as f64
    );
    database.drop_now().await;

    // The warm-up is the first row; growth is judged from its end.
    let growth = match (rows.len() >= 2, rows.first()) {
        (true, Some(&(_, warm, _))) => Some((end as f64 - warm as f64) / warm as f64),
        _ => None,
    };
    let checks = [
        ("zero errors", errors == 0 && sent == scheduled_total),
        (
            "RSS growth after the first period under 10%",
            growth.is_none_or(|g| g < MAX_GROWTH),
        ),
        ("audit chain verified", chain_ok),
        (
            "one audit row per 201",
            rows_total == created as i64 && rows_issued == created as i64,
        ),
        ("clean stop on SIGTERM", stopped.success()),
    ];
    match growth {
        Some(g) => println!(
            "RSS growth from the end of period 1 to the end: {:+.1}%",
            g * 100.0
        ),
        None => println!("RSS growth: not judged (fewer than two periods)"),
    }
    for (name, ok) in &checks {
        println!("{}: {name}", if *ok { "ok" } else { "FAILED" });
    }
    let passed = checks.iter().all(|(_, ok)| *ok);
    println!("verdict: {}", if passed { "PASS" } else { "FAIL" });
    Ok(passed)
}

/// The chain as an operator checks it, with the real command, once the
/// server has stopped; up to three attempts, as an operator would retry
/// when the database does not answer in time (each attempt is printed).
async fn verify_chain(binary: &Path, config: &Path) -> Result<bool, String> {
    for attempt in 1..=3 {
        let verify = tokio::process::Command::new(binary)
            .args(["audit", "verify", "--config"])
            .arg(config)
            .env("RUST_LOG", "warn")
            .output()
            .await
            .map_err(|e| e.to_string())?;
        let out = String::from_utf8_lossy(&verify.stdout).trim().to_owned();
        let err = String::from_utf8_lossy(&verify.stderr).trim().to_owned();
        println!("audit verify (attempt {attempt}): {out}{err}");
        if verify.status.success() {
            return Ok(out.starts_with("audit chain intact"));
        }
        if err.contains("broken") {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    Ok(false)
}

/// All rows of the trail, the issuance rows among them, and the size of
/// the database in bytes.
async fn audit_rows(database: &TestDatabase) -> (i64, i64, i64) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&database.url)
        .await
        .expect("connect to the soak database");
    sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE event = 'certificate.issued'), \
         pg_database_size(current_database()) FROM audit_events",
    )
    .fetch_one(&mut conn)
    .await
    .expect("count audit rows")
}
