//! The fault scenarios: each sets up what it breaks, breaks it under load,
//! lets it recover, checks the trail, and stops itself. Each returns a
//! [`Report`] whose verdict is pass or fail; none of them panics on a
//! broken expectation, so that every figure is still printed.

use std::path::PathBuf;
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

/// One request's answer and how long it took.
#[derive(Debug)]
struct Answer {
    status: u16,
    code: Option<String>,
    serial: Option<String>,
    took: Duration,
}

impl Answer {
    fn label(&self) -> String {
        match &self.code {
            Some(code) => format!("{} {code}", self.status),
            None => self.status.to_string(),
        }
    }
}

async fn ask(http: &reqwest::Client, url: &str, token: &str) -> Answer {
    let csr = talos_sso::key::ClientKey::generate()
        .and_then(|k| k.csr_pem())
        .expect("csr");
    let started = Instant::now();
    let response = http
        .post(format!("{url}/v1/certificates"))
        .bearer_auth(token)
        .json(&serde_json::json!({"cluster": "prod", "csr": csr}))
        .send()
        .await;
    match response {
        Ok(response) => {
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            Answer {
                status,
                code: body["code"].as_str().map(str::to_owned),
                serial: body["serial"].as_str().map(str::to_owned),
                took: started.elapsed(),
            }
        }
        Err(error) => Answer {
            status: 0,
            code: Some(format!("no answer: {error}")),
            serial: None,
            took: started.elapsed(),
        },
    }
}

/// `token` with its header's `kid` replaced: a key the server has never
/// seen (the server looks the key up before it checks the signature).
fn with_unknown_kid(token: &str, kid: &str) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (header, rest) = token.split_once('.').expect("JWT");
    let mut header: serde_json::Value =
        serde_json::from_slice(&b64.decode(header).expect("header")).expect("header JSON");
    header["kid"] = serde_json::json!(kid);
    format!("{}.{rest}", b64.encode(header.to_string()))
}

/// The trail's records after `after`.
async fn records_since(
    database_url: &str,
    after: i64,
) -> Result<Vec<talos_sso_server::audit::StoredRecord>, String> {
    let store = talos_sso_server::audit::store::AuditStore::connect(database_url, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let records = store.page(after, 10_000).await.map_err(|e| e.to_string());
    store.close().await;
    records
}

/// The server's outbound timeout to the identity provider and to Graph
/// (`identity::provider`, `identity::issuer::entra`): fixed at 10 s.
pub const OUTBOUND_TIMEOUT: Duration = Duration::from_secs(10);

/// Scenarios 4 and 5: the identity provider (keys, token endpoint, Graph)
/// answering 503, refusing connections, and answering only after `slow`;
/// for a person whose keys are cached, for a token naming an unknown key,
/// and for a person whose groups must come from Graph (overage).
pub async fn identity_outage(slow: Duration) -> Result<Report, String> {
    use crate::emulator::{Faults, TokenKind};
    let mut report = Report::new("identity-provider-outage");
    let binary = server_binary()?;
    let port = super::free_port()?;
    // One overage user per phase: Graph answers are cached for a minute,
    // so a person resolved before the outage would still get through.
    let mut users = crate::emulator::demo_users();
    for n in 0..3 {
        let mut user = crate::emulator::TestUser::new(
            &format!("c3000000-0000-4000-8000-00000000000{n}"),
            &format!("overage-{n}@example.com"),
            "Overage User",
            &[crate::emulator::GROUP_ONCALL],
            &[],
        );
        user.overage = true;
        users.push(user);
    }
    let emulator = EmulatorHandle::start(EmulatorConfig {
        public_url: Some(format!("http://127.0.0.1:{port}")),
        users,
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    let proxy = super::TcpProxy::start_on(port, emulator.address).await?;
    let work = Workdir::new();
    let database_url = format!("sqlite://{}", work.path().join("audit.db").display());
    let (config, url) = write_server_config(&emulator, &work, &database_url, "server.yaml", |t| {
        // Every unknown-kid probe below may refresh (the default is 5 min).
        t.replacen("identity:\n", "identity:\n  jwks_min_refresh_interval: 1s\n", 1)
    })?;
    let mut server = ServerProcess::spawn(&binary, &config, &url, Duration::from_secs(30)).await?;
    let http = reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT * 2)
        .build()
        .map_err(|e| e.to_string())?;
    let token = |user: &str| emulator.token_for(user, TokenKind::id()).expect("token");
    let bound = OUTBOUND_TIMEOUT + Duration::from_secs(1);
    let mut longest = Duration::ZERO;

    let bob = ask(&http, &url, &token("bob@example.com")).await;
    let erin = ask(&http, &url, &token("erin@example.com")).await;
    report.expect(
        bob.status == 201 && erin.status == 201,
        format!(
            "provider up: bob {}, erin (overage, groups from Graph) {}",
            bob.label(),
            erin.label()
        ),
    );

    let phases: [(&str, Faults, bool); 3] = [
        (
            "keys and Graph answer 503",
            Faults {
                jwks_unavailable: true,
                graph_unavailable: true,
                ..Default::default()
            },
            false,
        ),
        ("connections refused", Faults::default(), true),
        (
            "every answer after the delay",
            Faults {
                delay: slow,
                ..Default::default()
            },
            false,
        ),
    ];
    for (n, (name, faults, refuse)) in phases.into_iter().enumerate() {
        let name = if faults.delay.is_zero() {
            name.to_owned()
        } else {
            format!("{name} ({:.0} s)", slow.as_secs_f64())
        };
        // Let the previous phase's refresh attempt age past the interval.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let seq_before = records_since(&database_url, 0).await?.last().map_or(0, |r| r.seq);
        emulator.set_faults(faults);
        if refuse {
            proxy.down();
        }
        // At once and together: a cached key, two unknown kids, an overage user.
        let tokens = [
            token("bob@example.com"),
            with_unknown_kid(&token("carol@example.com"), &format!("unknown-{n}-a")),
            with_unknown_kid(&token("carol@example.com"), &format!("unknown-{n}-b")),
            token(&format!("overage-{n}@example.com")),
        ];
        let (cached, unknown_a, unknown_b, overage) = tokio::join!(
            ask(&http, &url, &tokens[0]),
            ask(&http, &url, &tokens[1]),
            ask(&http, &url, &tokens[2]),
            ask(&http, &url, &tokens[3]),
        );
        let (ready_status, ready_body) = readyz(&url).await;
        report.expect(
            ready_body.contains("\"identity_provider_reachable\":false"),
            format!("{name}: /readyz says the provider is unreachable"),
        );
        emulator.set_faults(Faults::default());
        if refuse {
            proxy.up().await?;
        }
        report.say(format!(
            "{name}: cached key {} in {:.2} s; unknown kids {} in {:.2} s and {} in {:.2} s; \
             overage user {} in {:.2} s; /readyz {ready_status} {ready_body}",
            cached.label(),
            cached.took.as_secs_f64(),
            unknown_a.label(),
            unknown_a.took.as_secs_f64(),
            unknown_b.label(),
            unknown_b.took.as_secs_f64(),
            overage.label(),
            overage.took.as_secs_f64(),
        ));
        report.expect(
            cached.status == 201,
            format!("{name}: the cached key keeps working"),
        );
        report.expect(
            [&unknown_a, &unknown_b]
                .iter()
                .all(|a| a.label() == "401 token_key_unknown"),
            format!("{name}: unknown kids are refused with 401 token_key_unknown"),
        );
        report.expect(
            overage.label() == "403 groups_overage_unresolved",
            format!("{name}: the overage user is refused with 403 groups_overage_unresolved"),
        );
        for answer in [&cached, &unknown_a, &unknown_b, &overage] {
            longest = longest.max(answer.took);
        }
        report.expect(
            [&cached, &unknown_a, &unknown_b, &overage]
                .iter()
                .all(|a| a.took <= bound),
            format!("{name}: every answer within the outbound timeout (+1 s): {bound:?}"),
        );
        let records = records_since(&database_url, seq_before).await?;
        let issued: Vec<_> = records
            .iter()
            .filter(|r| r.record.event == "certificate.issued")
            .collect();
        let overage_rows: Vec<_> = records
            .iter()
            .filter(|r| r.record.username.as_deref() == Some(format!("overage-{n}@example.com").as_str()))
            .collect();
        report.expect(
            issued.len() == 1 && issued[0].record.serial == cached.serial,
            format!(
                "{name}: one certificate issued (the cached key's), {} records",
                records.len()
            ),
        );
        report.expect(
            overage_rows.len() == 1
                && overage_rows[0].record.event == "certificate.denied"
                && overage_rows[0].record.reason_code.as_deref() == Some("groups_overage_unresolved"),
            format!(
                "{name}: one audit record for the overage user, a denial: {:?}",
                records
                    .iter()
                    .map(|r| (r.seq, &r.record.event, &r.record.reason_code, &r.record.username))
                    .collect::<Vec<_>>()
            ),
        );
    }
    report.say(format!(
        "longest answer during the outages: {:.2} s (outbound timeout {:?})",
        longest.as_secs_f64(),
        OUTBOUND_TIMEOUT
    ));

    // Back: a rotated key is fetched, Graph answers again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let rotated = emulator.rotate_keys().ok_or("no spare key")?;
    let bob = ask(&http, &url, &token("bob@example.com")).await;
    let erin = ask(&http, &url, &token("overage-0@example.com")).await;
    report.expect(
        bob.status == 201 && erin.status == 201,
        format!(
            "provider back: a token under the new key {rotated} {}, erin {}",
            bob.label(),
            erin.label()
        ),
    );
    let (ready_status, _) = readyz(&url).await;
    report.expect(
        ready_status == 200,
        format!("/readyz after recovery: {ready_status}"),
    );
    report.expect(server.still_running(), "the same server process throughout");
    let verify = {
        let (binary, config) = (binary.clone(), config.clone());
        blocking(move || audit_verify(&binary, &config)).await
    };
    match verify {
        Ok(text) => report.expect(
            text.contains("audit chain intact"),
            format!("`audit verify`: {}", text.trim()),
        ),
        Err(error) => report.expect(false, format!("`audit verify`: {error}")),
    }
    server.kill();
    Ok(report)
}

/// A small tmpfs mounted for one scenario, unmounted when dropped.
struct Tmpfs {
    path: std::path::PathBuf,
}

impl Tmpfs {
    fn mount(path: &std::path::Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(path).map_err(|e| e.to_string())?;
        super::run(
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
        super::run(
            std::process::Command::new("mount")
                .args(["-o", &format!("remount,{mode}")])
                .arg(&self.path),
        )
        .map(|_| ())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = super::run(std::process::Command::new("umount").arg("-l").arg(&self.path));
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
    match load
        .first_issued_since(freed, None, Duration::from_secs(30))
        .await
    {
        Some(after) => report.say(format!(
            "space back: the first request sent afterwards was issued {:.3} s later",
            after.as_secs_f64()
        )),
        None => {
            let log = server.log_text();
            let last = last_audit_lines(&log);
            report.expect(
                false,
                format!("no certificate within 30 s of space coming back; the server says: {last:?}"),
            )
        }
    }

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
    match load
        .first_issued_since(writable, None, Duration::from_secs(30))
        .await
    {
        Some(after) => report.say(format!(
            "writable again: the first request sent afterwards was issued {:.3} s later",
            after.as_secs_f64()
        )),
        None => {
            let log = server.log_text();
            let last = last_audit_lines(&log);
            report.expect(
                false,
                format!("no certificate within 30 s of the remount read-write; the server says: {last:?}"),
            )
        }
    }
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
