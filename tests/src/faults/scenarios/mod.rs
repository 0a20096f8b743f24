//! The fault scenarios: each sets up what it breaks, breaks it under load,
//! lets it recover, checks the trail, and stops itself. Each returns a
//! [`Report`] whose verdict is pass or fail; none of them panics on a
//! broken expectation, so that every figure is still printed.

use std::path::PathBuf;
use std::time::Duration;

use super::{
    Attempt, Load, Report, ServerProcess, audit_verify, check_trail, server_binary, write_server_config,
};
use crate::emulator::{EmulatorConfig, EmulatorHandle};
use crate::harness::Workdir;

mod identity_outage;
mod postgres_restart;
mod sigkill;
mod sqlite_disk;

pub use identity_outage::{OUTBOUND_TIMEOUT, identity_outage};
pub use postgres_restart::postgres_restart;
pub use sigkill::{replica_sigkill, server_sigkill};
pub use sqlite_disk::sqlite_disk;

/// How long the clients issue before and after each fault.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub before: Duration,
    pub after: Duration,
    /// Concurrent clients.
    pub clients: usize,
}

impl Timing {
    /// The short form, for the test binary and CI.
    pub fn short() -> Self {
        Self {
            before: Duration::from_millis(1500),
            after: Duration::from_millis(1500),
            clients: 8,
        }
    }
}

/// Certificates the load must have before a fault is injected (on a busy
/// machine the first ones can take a while).
const WARM: usize = 20;

/// A request with no answer after this long counts as hung.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Refusals among `attempts`, as `count × label`.
fn refused(attempts: &[Attempt]) -> (usize, String) {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for attempt in attempts.iter().filter(|a| !a.issued()) {
        *counts.entry(attempt.label()).or_default() += 1;
    }
    let total = counts.values().sum();
    let text = counts
        .iter()
        .map(|(label, n)| format!("{n} × {label}"))
        .collect::<Vec<_>>()
        .join(", ");
    (total, if text.is_empty() { "none".into() } else { text })
}

/// Expects certificates issued (by any server) since `since`, saying how
/// many and `when`.
fn expect_issued(report: &mut Report, load: &Load, since: Duration, when: &str) {
    let issued = load.issued_since(since, None);
    report.expect(issued > 0, format!("{issued} certificates issued {when}"));
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

async fn readyz(base_url: &str) -> (u16, String) {
    match reqwest::get(format!("{base_url}/readyz")).await {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
        Err(error) => (0, error.to_string()),
    }
}

/// The trail and `audit verify` for a finished load, into `report`.
async fn check_everything(
    report: &mut Report,
    database_url: &str,
    config: &std::path::Path,
    attempts: &[Attempt],
) -> Result<(), String> {
    let check = check_trail(database_url, attempts).await?;
    let binary = server_binary()?;
    let config = config.to_owned();
    let verify = blocking(move || audit_verify(&binary, &config)).await;
    report.trail(&check, &verify);
    Ok(())
}

/// What the single-server scenarios start from: the server binary, an
/// emulator, a work folder, one server on `database` (its configuration
/// written as `server.yaml`) and clients issuing through it, warmed up
/// (`WARM` certificates issued after `timing.before`).
struct OneServer {
    binary: PathBuf,
    emulator: EmulatorHandle,
    work: Workdir,
    database_url: String,
    config: PathBuf,
    url: String,
    server: ServerProcess,
    load: Load,
}

impl OneServer {
    /// `database`: the URL, given the work folder (which the SQLite
    /// scenario mounts its file system in).
    async fn start(
        timing: &Timing,
        database: impl FnOnce(&Workdir) -> Result<String, String>,
    ) -> Result<Self, String> {
        let binary = server_binary()?;
        let emulator = EmulatorHandle::start(EmulatorConfig::default())
            .await
            .map_err(|e| e.to_string())?;
        let work = Workdir::new();
        let database_url = database(&work)?;
        let (config, url) = write_server_config(&emulator, &work, &database_url, "server.yaml", |t| t)?;
        let server = ServerProcess::spawn(&binary, &config, &url, Duration::from_secs(30)).await?;
        let load = Load::start(&emulator, vec![url.clone()], timing.clients, CLIENT_TIMEOUT);
        tokio::time::sleep(timing.before).await;
        load.wait_issued(None, WARM, Duration::from_secs(30)).await;
        Ok(Self {
            binary,
            emulator,
            work,
            database_url,
            config,
            url,
            server,
            load,
        })
    }
}
