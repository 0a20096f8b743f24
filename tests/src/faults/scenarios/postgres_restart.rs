//! Postgres restarted (fast or immediate shutdown) under load.

use std::time::{Duration, Instant};

use super::{OneServer, Timing, blocking, check_everything, expect_issued, readyz, refused};
use crate::faults::{Attempt, PostgresCluster, Report};

/// Scenario 1: Postgres restarted (`mode`: `fast` or `immediate`) while
/// clients issue; the server process is never restarted.
pub async fn postgres_restart(mode: &str, timing: Timing) -> Result<Report, String> {
    let mut report = Report::new(&format!("postgres-restart-{mode}"));
    let postgres = blocking(PostgresCluster::start).await?;
    let OneServer {
        binary: _,
        emulator: _emulator,
        work: _work,
        database_url: _,
        config,
        url,
        mut server,
        load,
    } = OneServer::start(&timing, |_| Ok(postgres.url())).await?;
    expect_issued(&mut report, &load, Duration::ZERO, "before the restart");

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
    expect_issued(&mut report, &load, back, "after the restart");
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
