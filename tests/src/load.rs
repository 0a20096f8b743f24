//! The request both load tools send (`loadgen`, closed loop, and `soak`,
//! open loop): a fresh ID token per issuance (the replay guard lets a token
//! mint one certificate), a CSR that may be made in advance and reused (the
//! server does not refuse a key it has signed before), one
//! `POST /v1/certificates`, the percentile of sorted latencies, the CPU
//! time processes have used, and the tools' runtime.

use std::time::Duration;

use serde_json::json;
use talos_sso::key::ClientKey;

use crate::emulator::{EmulatorHandle, TokenKind};

/// The demo users the load is spread over: both are on call in `prod`.
pub const USERS: [&str; 2] = ["bob@example.com", "carol@example.com"];

/// A new ID token (its own `uti`) for the `n`th request.
pub fn token(emulator: &EmulatorHandle, n: usize) -> String {
    emulator
        .token_for(USERS[n % USERS.len()], TokenKind::id())
        .expect("token for a demo user")
}

/// A CSR for a new Ed25519 key, as `talos-sso` makes.
pub fn csr() -> String {
    ClientKey::generate().and_then(|k| k.csr_pem()).expect("csr")
}

/// `count` (token, CSR) pairs, made before a clock starts.
pub fn prepare(emulator: &EmulatorHandle, count: usize) -> Vec<(String, String)> {
    (0..count).map(|n| (token(emulator, n), csr())).collect()
}

/// `POST {base_url}/v1/certificates` for the cluster `prod`; the status code.
pub async fn issue(
    client: &reqwest::Client,
    base_url: &str,
    token: &str,
    csr: &str,
) -> Result<u16, reqwest::Error> {
    client
        .post(format!("{base_url}/v1/certificates"))
        .bearer_auth(token)
        .json(&json!({"cluster": "prod", "csr": csr}))
        .send()
        .await
        .map(|r| r.status().as_u16())
}

/// The runtime of a load tool: two workers, as this machine has cores.
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

/// The `p` quantile (0..=1) of `sorted`, nearest rank; zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// The tools' command line as `--flag value` pairs, in order; a flag
/// without its value is an error.
pub fn flag_pairs() -> Result<Vec<(String, String)>, String> {
    let mut args = std::env::args().skip(1);
    let mut pairs = Vec::new();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        pairs.push((flag, value));
    }
    Ok(pairs)
}

/// CPU time (user and system) used so far by this process, every thread.
pub fn own_cpu() -> Duration {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| StatTimes::parse(&stat))
        .map_or(Duration::ZERO, |times| times.user + times.system)
}

/// CPU time used so far by the Postgres server on this machine: every
/// process named `postgres`, with the children each has reaped (a backend
/// that ended is counted in the postmaster's). A load tool reads it before
/// and after a run against a local Postgres, on a machine otherwise quiet.
pub fn postgres_cpu() -> Duration {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    entries
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter_map(|stat| StatTimes::parse(&stat))
        .filter(|times| times.command == "postgres")
        .map(|times| times.user + times.system + times.reaped)
        .sum()
}

/// The CPU times of one `/proc/<pid>/stat` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatTimes {
    pub command: String,
    /// utime.
    pub user: Duration,
    /// stime.
    pub system: Duration,
    /// cutime + cstime: children that ended and were waited for.
    pub reaped: Duration,
}

impl StatTimes {
    pub fn parse(stat: &str) -> Option<Self> {
        // The command is in parentheses and may hold spaces or parentheses
        // itself: the fields start after the last `)`.
        let (open, close) = (stat.find('(')?, stat.rfind(')')?);
        let fields: Vec<&str> = stat.get(close + 2..)?.split(' ').collect();
        // Linux reports these in USER_HZ, 100 on every architecture it runs on.
        let ticks = |i: usize| -> Option<Duration> {
            Some(Duration::from_millis(fields.get(i)?.parse::<u64>().ok()? * 10))
        };
        Some(Self {
            command: stat.get(open + 1..close)?.to_owned(),
            user: ticks(11)?,
            system: ticks(12)?,
            reaped: ticks(13)? + ticks(14)?,
        })
    }
}
