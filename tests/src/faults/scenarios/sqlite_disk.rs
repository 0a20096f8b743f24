//! The SQLite audit store's disk full: issuance refused, nothing lost,
//! and issuing again once there is room.

use std::time::{Duration, Instant};

use super::{OneServer, Timing, blocking, check_everything, refused};
use crate::faults::{Attempt, Load, Report, ServerProcess};

/// A small tmpfs mounted for one scenario, unmounted when dropped.
struct Tmpfs {
    path: std::path::PathBuf,
}

impl Tmpfs {
    fn mount(path: &std::path::Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(path).map_err(|e| e.to_string())?;
        crate::faults::run(
            std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(path),
        )
        .map_err(|e| format!("this scenario mounts a tmpfs, which needs root: {e}"))?;
        Ok(Self {
            path: path.to_owned(),
        })
    }

    fn remount(&self, mode: &str) -> Result<(), String> {
        crate::faults::run(
            std::process::Command::new("mount")
                .args(["-o", &format!("remount,{mode}")])
                .arg(&self.path),
        )
        .map(|_| ())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = crate::faults::run(std::process::Command::new("umount").arg("-l").arg(&self.path));
    }
}

/// Fill the file system under `dir` until it refuses more; the filler.
fn fill(dir: &std::path::Path) -> Result<std::path::PathBuf, String> {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).map_err(|e| e.to_string())?;
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) if error.raw_os_error() == Some(28) => break,
            Err(error) => return Err(format!("filling {}: {error}", path.display())),
        }
    }
    // Byte by byte to the last one.
    while file.write(&[0]).is_ok_and(|n| n == 1) {}
    let _ = file.sync_all();
    Ok(path)
}

/// Scenario 6: the SQLite store on a file system that fills up, then on
/// one remounted read-only, each under load: refused with 503, nothing
/// issued without its record, and issuing again once space (or write
/// access) returns, without a restart.
pub async fn sqlite_disk(timing: Timing) -> Result<Report, String> {
    let mut report = Report::new("sqlite-disk");
    let mut mounted = None;
    let OneServer {
        binary,
        emulator: _emulator,
        work: _work,
        database_url,
        config,
        url,
        mut server,
        load,
    } = OneServer::start(&timing, |work| {
        let tmpfs = Tmpfs::mount(&work.path().join("disk"), "16m")?;
        let url = format!("sqlite://{}", tmpfs.path.join("audit.db").display());
        mounted = Some(tmpfs);
        Ok(url)
    })
    .await?;
    let tmpfs = mounted.ok_or("the tmpfs was not mounted")?;

    // Full.
    let full_at = load.elapsed();
    let filler = blocking({
        let dir = tmpfs.path.clone();
        move || fill(&dir)
    })
    .await?;
    report.say("tmpfs of 16 MiB filled to the last byte");
    let refused_full = wait_for_refusal(&load, full_at, Duration::from_secs(20)).await;
    report.expect(refused_full, "issuance is refused once the disk is full");
    tokio::time::sleep(timing.after).await;
    std::fs::remove_file(&filler).map_err(|e| e.to_string())?;
    let freed = load.elapsed();
    expect_issued_again(
        &mut report,
        &load,
        &server,
        freed,
        "space back",
        "space coming back",
    )
    .await;

    // Read-only: a file system with files open for writing cannot be
    // remounted read-only (EBUSY), so the server is stopped (SIGKILL),
    // the file system remounted read-only, and the server started on it.
    tokio::time::sleep(timing.before).await;
    server.kill();
    let ro_at = load.elapsed();
    tmpfs.remount("ro")?;
    report.say("server killed, tmpfs remounted read-only, server started again on it");
    match ServerProcess::spawn(&binary, &config, &url, Duration::from_secs(30)).await {
        Ok(started) => {
            server = started;
            let refused_ro = wait_for_refusal(&load, ro_at, Duration::from_secs(20)).await;
            report.expect(refused_ro, "issuance is refused on a read-only file system");
        }
        Err(error) => report.say(format!(
            "the server does not start on a read-only file system: {error}"
        )),
    }
    tokio::time::sleep(timing.after).await;
    tmpfs.remount("rw")?;
    let writable = load.elapsed();
    if !server.still_running() {
        server = ServerProcess::spawn(&binary, &config, &url, Duration::from_secs(30)).await?;
        report.say("server started again once the file system was writable");
    }
    expect_issued_again(
        &mut report,
        &load,
        &server,
        writable,
        "writable again",
        "the remount read-write",
    )
    .await;
    tokio::time::sleep(timing.after).await;
    let attempts = load.stop().await;
    for (name, from, to) in [("disk full", full_at, freed), ("read-only", ro_at, writable)] {
        let during: Vec<Attempt> = attempts
            .iter()
            .filter(|a| a.sent >= from && a.sent < to)
            .cloned()
            .collect();
        let (count, codes) = refused(&during);
        report.say(format!(
            "{name}: {} requests, refused {count} ({codes})",
            during.len()
        ));
        // Read-only: the server was killed and started again meanwhile.
        let restarted = name == "read-only";
        report.expect(
            during
                .iter()
                .filter(|a| !a.issued())
                .all(|a| a.label() == "503 audit_unavailable" || (restarted && a.status.is_none())),
            format!("{name}: every refusal is 503 audit_unavailable (or, while restarting, no answer)"),
        );
    }
    report.attempts(&attempts);
    report.expect(
        server.still_running(),
        "the server started on the read-only file system recovered without another restart",
    );
    check_everything(&mut report, &database_url, &config, &attempts).await?;
    server.kill();
    drop(tmpfs);
    Ok(report)
}

/// That a request sent after `since`, when `event` gave the store room
/// again, is issued within 30 s: how long it took under `label`, or the
/// failure with what the server last said about the trail.
async fn expect_issued_again(
    report: &mut Report,
    load: &Load,
    server: &ServerProcess,
    since: Duration,
    label: &str,
    event: &str,
) {
    match load
        .first_issued_since(since, None, Duration::from_secs(30))
        .await
    {
        Some(after) => report.say(format!(
            "{label}: the first request sent afterwards was issued {:.3} s later",
            after.as_secs_f64()
        )),
        None => {
            let log = server.log_text();
            let last = last_audit_lines(&log);
            report.expect(
                false,
                format!("no certificate within 30 s of {event}; the server says: {last:?}"),
            )
        }
    }
}

/// The server's last two log lines about the audit trail, newest first:
/// what it says when it does not recover.
fn last_audit_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("audit"))
        .rev()
        .take(2)
        .collect()
}

/// Wait until a request sent after `since` was refused.
async fn wait_for_refusal(load: &Load, since: Duration, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if load.refused_since(since) > 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}
