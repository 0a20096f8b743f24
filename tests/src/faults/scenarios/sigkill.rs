//! A server process killed with SIGKILL under load: the only server,
//! or one of two replicas sharing the database.

use std::time::{Duration, Instant};

use super::{CLIENT_TIMEOUT, OneServer, Timing, WARM, blocking, check_everything, expect_issued, refused};
use crate::emulator::{EmulatorConfig, EmulatorHandle};
use crate::faults::{
    Attempt, Load, PostgresCluster, Report, ServerProcess, server_binary, write_server_config,
};
use crate::harness::Workdir;

/// Scenario 2: the server killed with SIGKILL mid-load, then started again
/// on the same database and port.
pub async fn server_sigkill(timing: Timing) -> Result<Report, String> {
    let mut report = Report::new("server-sigkill");
    let postgres = blocking(PostgresCluster::start).await?;
    let OneServer {
        binary,
        emulator: _emulator,
        work: _work,
        database_url: _,
        config,
        url,
        mut server,
        load,
    } = OneServer::start(&timing, |_| Ok(postgres.url())).await?;
    expect_issued(&mut report, &load, Duration::ZERO, "before the kill");

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
    expect_issued(&mut report, &load, back, "by the new process");
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
    load.wait_issued(Some(0), WARM, Duration::from_secs(30)).await;
    load.wait_issued(Some(1), WARM, Duration::from_secs(30)).await;
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
