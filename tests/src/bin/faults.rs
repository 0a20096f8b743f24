//! `faults`: the fault scenarios against real processes, longer than the
//! test binary runs them, one verdict each; exits non-zero when any fails.
//!
//! ```sh
//! cargo run -p talos-sso-tests --bin faults -- [SCENARIO ...] [--before SECONDS] [--after SECONDS] [--clients N]
//! ```
//! Scenarios: `postgres-restart-fast`, `postgres-restart-immediate`,
//! `server-sigkill`, `replica-sigkill`, `identity-outage` (the provider
//! answering after 30 s), `sqlite-disk` (a tmpfs filled up, then
//! remounted read-only) (default: all). Needs root (the
//! Postgres cluster of its own runs as user `postgres`).

use std::time::Duration;

use talos_sso_tests::faults::scenarios::{self, Timing};

const ALL: [&str; 6] = [
    "postgres-restart-fast",
    "postgres-restart-immediate",
    "server-sigkill",
    "replica-sigkill",
    "identity-outage",
    "sqlite-disk",
];

fn seconds(value: Option<String>, flag: &str) -> Result<Duration, String> {
    value
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| *v >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or(format!("{flag} takes a number of seconds"))
}

fn main() -> std::process::ExitCode {
    let mut timing = Timing {
        before: Duration::from_secs(5),
        after: Duration::from_secs(5),
        clients: 16,
    };
    let mut chosen = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let parsed = match arg.as_str() {
            "--before" => seconds(args.next(), "--before").map(|d| timing.before = d),
            "--after" => seconds(args.next(), "--after").map(|d| timing.after = d),
            "--clients" => args
                .next()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
                .map(|n| timing.clients = n)
                .ok_or("--clients takes a number".to_owned()),
            name if ALL.contains(&name) => {
                chosen.push(name.to_owned());
                Ok(())
            }
            other => Err(format!("unknown argument {other}; scenarios: {}", ALL.join(", "))),
        };
        if let Err(error) = parsed {
            eprintln!("faults: {error}");
            return std::process::ExitCode::from(2);
        }
    }
    if chosen.is_empty() {
        chosen = ALL.iter().map(|s| s.to_string()).collect();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("faults: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let verdicts: Vec<(String, bool)> = runtime.block_on(async {
        let mut verdicts = Vec::new();
        for name in &chosen {
            let result = match name.as_str() {
                "postgres-restart-fast" => scenarios::postgres_restart("fast", timing).await,
                "postgres-restart-immediate" => scenarios::postgres_restart("immediate", timing).await,
                "server-sigkill" => scenarios::server_sigkill(timing).await,
                "sqlite-disk" => scenarios::sqlite_disk(timing).await,
                "identity-outage" => scenarios::identity_outage(Duration::from_secs(30)).await,
                _ => scenarios::replica_sigkill(timing).await,
            };
            match result {
                Ok(report) => verdicts.push((report.verdict(), report.passed())),
                Err(error) => verdicts.push((format!("{name}: FAIL (could not run: {error})"), false)),
            }
        }
        verdicts
    });
    println!();
    for (verdict, _) in &verdicts {
        println!("{verdict}");
    }
    if verdicts.iter().all(|(_, passed)| *passed) {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
