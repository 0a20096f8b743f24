//! The fault scenarios: each sets up what it breaks, breaks it under load,
//! lets it recover, checks the trail, and stops itself. Each returns a
//! [`Report`] whose verdict is pass or fail; none of them panics on a
//! broken expectation, so that every figure is still printed.

use std::time::{Duration, Instant};

use super::{
    Attempt, Load, PostgresCluster, Report, ServerProcess, audit_verify, check_trail, server_binary,
    write_server_config,
};
use crate::emulator::{EmulatorConfig, EmulatorHandle};
use crate::harness::Workdir;

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

/// Scenario 1: Postgres restarted (`mode`: `fast` or `immediate`) while
/// clients issue; the server process is never restarted.
pub async fn postgres_restart(mode: &str, timing: Timing) -> Result<Report, String> {
    let mut report = Report::new(&format!("postgres-restart-{mode}"));
    let binary = server_binary()?;
    let emulator = EmulatorHandle::start(EmulatorConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    let work = Workdir::new();
    let postgres = blocking(PostgresCluster::start).await?;
    let (config, url) = write_server_config(&emulator, &work, &postgres.url(), "server.yaml", |t| t)?;
    let mut server = ServerProcess::spawn(&binary, &config, &url, Duration::from_secs(30)).await?;
    let load = Load::start(&emulator, vec![url.clone()], timing.clients, CLIENT_TIMEOUT);
    tokio::time::sleep(timing.before).await;
    let before = load.issued_since(Duration::ZERO, None);
    report.expect(
        before > 0,
        format!("{before} certificates issued before the restart"),
    );

    let fault = load.elapsed();
    let started = Instant::now();
    let pg_mode = if mode == "immediate" { "immediate" } else { "fast" };
    let (restart, postgres) = blocking(move || {
        let result = postgres.restart(pg_mode);
        (result, postgres)
    })
    .await;
    restart?;
    let back = load.elapsed();
    report.say(format!(
        "pg_ctl restart -m {mode}: {:.2} s until Postgres accepted connections again",
        started.elapsed().as_secs_f64()
    ));
    let recovery = load.first_issued_since(back, None, Duration::from_secs(30)).await;
    match recovery {
        Some(after) => report.say(format!(
            "recovery: the first request sent after Postgres was back was issued {:.3} s later",
            after.as_secs_f64()
        )),
        None => report.expect(false, "no certificate within 30 s of Postgres being back"),
    }
    tokio::time::sleep(timing.after).await;
    let after = load.issued_since(back, None);
    report.expect(
        after > 0,
        format!("{after} certificates issued after the restart"),
    );
    let attempts = load.stop().await;
    let outage: Vec<Attempt> = attempts
        .iter()
        .filter(|a| a.sent + a.latency >= fault)
        .cloned()
        .collect();
    let (count, codes) = refused(&outage);
    report.say(format!("refused during the outage: {count} ({codes})"));
    report.expect(
        attempts[..attempts.len() - outage.len()]
            .iter()
            .all(Attempt::issued),
        "nothing refused before the restart",
    );
    report.expect(
        outage
            .iter()
            .filter(|a| !a.issued())
            .all(|a| a.label() == "503 audit_unavailable"),
        "every refusal is 503 audit_unavailable (no cut connection, no other code)",
    );
    report.attempts(&attempts);
    report.expect(
        attempts.iter().all(|a| a.latency < Duration::from_secs(10)),
        "no request took 10 s or longer",
    );
    let alive = server.still_running();
    report.expect(alive, "the same server process served before, during and after");
    let (status, body) = readyz(&url).await;
    report.expect(status == 200, format!("/readyz after recovery: {status} {body}"));
    check_everything(&mut report, &postgres.url(), &config, &attempts).await?;
    server.kill();
    drop(postgres);
    Ok(report)
}

/// Scenario 2: the server killed with SIGKILL mid-load, then started again
/// on the same database and port.
pub async fn server_sigkill(timing: Timing) -> Result<Report, String> {
    let mut report = Report::new("server-sigkill");
    let binary = server_binary()?;
    let emulator = EmulatorHandle::start(EmulatorConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    let work = Workdir::new();
    let postgres = blocking(PostgresCluster::start).await?;
    let (config, url) = write_server_config(&emulator, &work, &postgres.url(), "server.yaml", |t| t)?;
    let mut server = ServerProcess::spawn(&binary, &config, &url, Duration::from_secs(30)).await?;
    let load = Load::start(&emulator, vec![url.clone()], timing.clients, CLIENT_TIMEOUT);
    tokio::time::sleep(timing.before).await;
    let before = load.issued_since(Duration::ZERO, None);
    report.expect(
        before > 0,
        format!("{before} certificates issued before the kill"),
    );

    let fault = load.elapsed();
    server.kill();
    let restarted = Instant::now();
    let mut server = ServerProcess::spawn(&binary, &config, &url, Duration::from_secs(30)).await?;
    report.say(format!(
        "SIGKILL, then `serve` again on the same database: answering /healthz after {:.2} s",
        restarted.elapsed().as_secs_f64()
    ));
    let back = load.elapsed();
    match load.first_issued_since(back, None, Duration::from_secs(30)).await {
        Some(after) => report.say(format!(
            "recovery: {:.3} s from the kill to the first certificate of the new process",
            (back + after - fault).as_secs_f64()
        )),
        None => report.expect(false, "no certificate within 30 s of the restart"),
    }
    tokio::time::sleep(timing.after).await;
    let after = load.issued_since(back, None);
    report.expect(
        after > 0,
        format!("{after} certificates issued by the new process"),
    );
    let attempts = load.stop().await;
    let (count, codes) = refused(&attempts);
    report.say(format!("refused around the kill: {count} ({codes})"));
    report.attempts(&attempts);
    report.expect(
        attempts
            .iter()
            .filter(|a| !a.issued())
            .all(|a| a.status.is_none()),
        "the only failures are requests without an answer (cut or refused connections)",
    );
    check_everything(&mut report, &postgres.url(), &config, &attempts).await?;
    server.kill();
    Ok(report)
}

/// Scenario 3: two replicas on one Postgres, one killed mid-load; the
/// other keeps issuing, and the chain they share stays whole.
pub async fn replica_sigkill(timing: Timing) -> Result<Report, String> {
    let mut report = Report::new("replica-sigkill");
    let binary = server_binary()?;
    let emulator = EmulatorHandle::start(EmulatorConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    let work = Workdir::new();
    let postgres = blocking(PostgresCluster::start).await?;
    let (config_a, url_a) = write_server_config(&emulator, &work, &postgres.url(), "a.yaml", |t| t)?;
    let (config_b, url_b) = write_server_config(&emulator, &work, &postgres.url(), "b.yaml", |t| t)?;
    let mut a = ServerProcess::spawn(&binary, &config_a, &url_a, Duration::from_secs(30)).await?;
    let mut b = ServerProcess::spawn(&binary, &config_b, &url_b, Duration::from_secs(30)).await?;
    let load = Load::start(
        &emulator,
        vec![url_a.clone(), url_b.clone()],
        timing.clients,
        CLIENT_TIMEOUT,
    );
    tokio::time::sleep(timing.before).await;
    let (by_a, by_b) = (
        load.issued_since(Duration::ZERO, Some(0)),
        load.issued_since(Duration::ZERO, Some(1)),
    );
    report.expect(
        by_a > 0 && by_b > 0,
        format!("before the kill: {by_a} by A, {by_b} by B"),
    );
    let fault = load.elapsed();
    b.kill();
    tokio::time::sleep(timing.after).await;
    let after_a = load.issued_since(fault, Some(0));
    report.expect(after_a > 0, format!("after B was killed, A issued {after_a}"));
    let attempts = load.stop().await;
    let on_a: Vec<Attempt> = attempts.iter().filter(|a| a.server == 0).cloned().collect();
    let (count_a, codes_a) = refused(&on_a);
    report.expect(count_a == 0, format!("A refused {count_a} ({codes_a})"));
    let on_b: Vec<Attempt> = attempts.iter().filter(|a| a.server == 1).cloned().collect();
    let (count_b, codes_b) = refused(&on_b);
    report.say(format!(
        "requests to B that got no certificate: {count_b} ({codes_b})"
    ));
    report.attempts(&attempts);
    report.expect(a.still_running(), "A kept running");
    check_everything(&mut report, &postgres.url(), &config_a, &attempts).await?;
    a.kill();
    Ok(report)
}
