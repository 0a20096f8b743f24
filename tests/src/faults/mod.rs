//! Fault injection against real processes: a Postgres cluster of its own
//! that can be restarted at will, `talos-sso-server serve` as a child process
//! that can be killed, a load of clients issuing continuously while the
//! fault happens, and the check of the audit trail afterwards.
//!
//! The scenarios are in [`scenarios`]: the test binary runs the short
//! ones (`tests/faults.rs`), the `faults` binary any of them, longer.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use talos_sso::key::ClientKey;
use talos_sso_server::audit::StoredRecord;
use talos_sso_server::audit::store::{AuditStore, StoreOptions};

pub mod scenarios;

use crate::emulator::{EmulatorHandle, TokenKind};
use crate::harness::{Workdir, config_yaml};

/// Where Debian puts the Postgres 15 server programs.
pub const POSTGRES_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A free TCP port on 127.0.0.1 (free when asked; the caller binds it soon).
pub fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

pub(crate) fn run(command: &mut Command) -> Result<String, String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{command:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(format!("{command:?} failed ({}): {text}", output.status))
    }
}

/// A Postgres cluster of its own (never the shared one): initdb in a temp
/// directory, run as the `postgres` user, on a free port, trust auth on
/// loopback, `fsync` and `synchronous_commit` on. Stopped when dropped.
#[derive(Debug)]
pub struct PostgresCluster {
    dir: tempfile::TempDir,
    pub port: u16,
}

impl PostgresCluster {
    pub fn start() -> Result<Self, String> {
        let bin = Path::new(POSTGRES_BIN);
        if !bin.join("pg_ctl").exists() {
            return Err(format!(
                "these fault scenarios need the Postgres 15 server programs in {POSTGRES_BIN} \
                 (apt-get install postgresql-15)"
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("talos-sso-faults-pg")
            .tempdir()
            .map_err(|e| e.to_string())?;
        run(Command::new("chown").arg("postgres:postgres").arg(dir.path()))
            .map_err(|e| format!("the cluster runs as user postgres, so this needs root: {e}"))?;
        let cluster = Self {
            port: free_port()?,
            dir,
        };
        cluster.as_postgres(
            "initdb",
            &[
                "-D",
                &cluster.data(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        )?;
        cluster.start_again()?;
        Ok(cluster)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn as_postgres(&self, program: &str, args: &[&str]) -> Result<String, String> {
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(Path::new(POSTGRES_BIN).join(program))
            .args(args))
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<String, String> {
        let log = self.dir.path().join("postgres.log").display().to_string();
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=on -c synchronous_commit=on",
            self.port,
            self.dir.path().display()
        );
        let data = self.data();
        let mut all = vec!["-D", &data, "-l", &log, "-o", &options];
        all.extend_from_slice(args);
        self.as_postgres("pg_ctl", &all)
    }

    /// Start (again) and wait until it accepts connections.
    pub fn start_again(&self) -> Result<(), String> {
        self.pg_ctl(&["-w", "-t", "60", "start"]).map(|_| ())
    }

    /// Restart: `mode` is `fast` (cut sessions, clean shutdown) or
    /// `immediate` (crash, recovery from the WAL at start).
    pub fn restart(&self, mode: &str) -> Result<(), String> {
        self.pg_ctl(&["-w", "-t", "60", "-m", mode, "restart"])
            .map(|_| ())
    }

    pub fn stop(&self, mode: &str) -> Result<(), String> {
        self.pg_ctl(&["-w", "-t", "60", "-m", mode, "stop"]).map(|_| ())
    }

    /// The `postgres` database of this cluster.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for PostgresCluster {
    fn drop(&mut self) {
        let _ = self.stop("immediate");
    }
}

/// The `talos-sso-server` binary, built first when missing or stale (once
/// per process: the scenarios of one test run share it).
pub fn server_binary() -> Result<PathBuf, String> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            crate::quickstart::workspace_binary("talos-sso-server", "talos-sso-server", "talos-sso-server")
        })
        .clone()
}

/// The test configuration (see [`config_yaml`]) on a fixed port, written
/// to `name` in the work directory; returns the file and the server's URL.
pub fn write_server_config(
    emulator: &EmulatorHandle,
    work: &Workdir,
    database_url: &str,
    name: &str,
    edit: impl FnOnce(String) -> String,
) -> Result<(PathBuf, String), String> {
    let port = free_port()?;
    let text = config_yaml(emulator, work, database_url).replace(
        "listen: \"127.0.0.1:0\"",
        &format!("listen: \"127.0.0.1:{port}\""),
    );
    let path = work.path().join(name);
    std::fs::write(&path, edit(text)).map_err(|e| e.to_string())?;
    Ok((path, format!("http://127.0.0.1:{port}")))
}

/// `talos-sso-server serve --config FILE` as a child process; its output
/// goes to `FILE.log`. Killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    child: Option<Child>,
    pub base_url: String,
    pub config: PathBuf,
    pub log: PathBuf,
}

impl ServerProcess {
    /// Spawn and wait until `/healthz` answers (at most `ready_within`).
    pub async fn spawn(
        binary: &Path,
        config: &Path,
        base_url: &str,
        ready_within: Duration,
    ) -> Result<Self, String> {
        let log = config.with_extension("log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        let mut server = Self {
            child: Some(child),
            base_url: base_url.to_owned(),
            config: config.to_owned(),
            log,
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + ready_within;
        loop {
            if let Ok(response) = http.get(format!("{base_url}/healthz")).send().await
                && response.status().is_success()
            {
                return Ok(server);
            }
            if let Some(child) = server.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "the server exited ({status}) before answering: {}",
                    server.log_text()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the server did not answer /healthz within {ready_within:?}: {}",
                    server.log_text()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: no shutdown path runs, in-flight requests are cut.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is alive (not exited, not killed).
    pub fn still_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGHUP, as `kill -HUP` sends it: the server reads its configuration
    /// again.
    pub fn hang_up(&self) -> Result<(), String> {
        let pid = self.child.as_ref().ok_or("the server is not running")?.id();
        run(Command::new("kill").args(["-HUP", &pid.to_string()])).map(|_| ())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `talos-sso-server audit verify --config FILE`, the command an operator
/// runs: its output, or why it failed.
pub fn audit_verify(binary: &Path, config: &Path) -> Result<String, String> {
    run(Command::new(binary)
        .args(["audit", "verify", "--config"])
        .arg(config))
}

/// One request of the load, as the client saw it.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// Which of the load's servers it went to.
    pub server: usize,
    /// When it was sent, since the load started.
    pub sent: Duration,
    pub latency: Duration,
    /// `None`: no HTTP answer (connection refused or cut, timeout).
    pub status: Option<u16>,
    /// The problem's `code` of a refusal, or the transport error's kind.
    pub code: Option<String>,
    /// The certificate received (201 only).
    pub serial: Option<String>,
    pub certificate_sha256: Option<String>,
    /// SHA-256 of the CSR's public key: names the attempt in the trail
    /// whether or not an answer came back.
    pub public_key_sha256: String,
}

impl Attempt {
    pub fn issued(&self) -> bool {
        self.status == Some(201) && self.serial.is_some()
    }

    /// `201`, `503 audit_unavailable`, `no answer (connect)`, ...
    pub fn label(&self) -> String {
        match (self.status, &self.code) {
            (Some(status), Some(code)) => format!("{status} {code}"),
            (Some(status), None) => status.to_string(),
            (None, Some(kind)) => format!("no answer ({kind})"),
            (None, None) => "no answer".into(),
        }
    }
}

/// Users the load takes turns with (both on-call: `os:operator`).
pub const LOAD_USERS: [&str; 2] = ["bob@example.com", "carol@example.com"];

/// Clients issuing continuously, each a fresh token and a fresh key per
/// request, against `servers` in turn, until stopped.
#[derive(Debug)]
pub struct Load {
    stop: Arc<AtomicBool>,
    started: Instant,
    log: Arc<Mutex<Vec<Attempt>>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn pem_to_der(pem: &str) -> Option<Vec<u8>> {
    talos_sso_server::x509::pem_blocks(pem)
        .ok()?
        .into_iter()
        .next()
        .map(|(_, der)| der)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex_lower(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn transport_kind(error: &reqwest::Error) -> &'static str {
    if error.is_timeout() {
        "timeout"
    } else if error.is_connect() {
        "connect"
    } else {
        "cut"
    }
}

impl Load {
    /// `workers` clients; each request has `timeout` to be answered.
    pub fn start(emulator: &EmulatorHandle, servers: Vec<String>, workers: usize, timeout: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .expect("HTTP client");
        let handles = (0..workers)
            .map(|worker| {
                let (stop, http, emulator, servers, log) = (
                    stop.clone(),
                    http.clone(),
                    emulator.clone(),
                    servers.clone(),
                    log.clone(),
                );
                tokio::spawn(async move {
                    let mut n = worker;
                    while !stop.load(Ordering::Relaxed) {
                        let server = n % servers.len();
                        let token = emulator
                            .token_for(LOAD_USERS[n % LOAD_USERS.len()], TokenKind::id())
                            .expect("token");
                        n += workers;
                        let key = ClientKey::generate().expect("key");
                        let spki = der::Encode::to_der(&key.public_key_info().expect("spki")).expect("der");
                        let csr = key.csr_pem().expect("csr");
                        let sent = started.elapsed();
                        let t0 = Instant::now();
                        let answer = http
                            .post(format!("{}/v1/certificates", servers[server]))
                            .bearer_auth(token)
                            .json(&json!({"cluster": "prod", "csr": csr}))
                            .send()
                            .await;
                        let mut attempt = Attempt {
                            server,
                            sent,
                            latency: Duration::ZERO,
                            status: None,
                            code: None,
                            serial: None,
                            certificate_sha256: None,
                            public_key_sha256: sha256_hex(&spki),
                        };
                        match answer {
                            Ok(response) => {
                                attempt.status = Some(response.status().as_u16());
                                match response.json::<Value>().await {
                                    Ok(body) => {
                                        attempt.code = body["code"].as_str().map(str::to_owned);
                                        attempt.serial = body["serial"].as_str().map(str::to_owned);
                                        attempt.certificate_sha256 = body["certificate"]
                                            .as_str()
                                            .and_then(pem_to_der)
                                            .map(|der| sha256_hex(&der));
                                    }
                                    // The answer was cut after its status line.
                                    Err(error) => {
                                        attempt.status = None;
                                        attempt.code = Some(transport_kind(&error).into());
                                    }
                                }
                            }
                            Err(error) => {
                                attempt.code = Some(transport_kind(&error).into());
                                // A refused connection comes back at once; do
                                // not spin while a server is down.
                                if error.is_connect() {
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
                            }
                        }
                        attempt.latency = t0.elapsed();
                        lock(&log).push(attempt);
                    }
                })
            })
            .collect();
        Self {
            stop,
            started,
            log,
            workers: handles,
        }
    }

    /// Time since the load started (the clock of [`Attempt::sent`]).
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Attempts answered 201 so far that were sent at or after `since`
    /// (by server `server`, or any: `None`).
    pub fn issued_since(&self, since: Duration, server: Option<usize>) -> usize {
        lock(&self.log)
            .iter()
            .filter(|a| a.sent >= since && a.issued() && server.is_none_or(|s| a.server == s))
            .count()
    }

    /// Requests sent at or after `since` that got no certificate.
    pub fn refused_since(&self, since: Duration) -> usize {
        lock(&self.log)
            .iter()
            .filter(|a| a.sent >= since && !a.issued())
            .count()
    }

    /// Wait (at most `within`) until `count` requests of server `server`
    /// (any: `None`) were answered 201; whether they were.
    pub async fn wait_issued(&self, server: Option<usize>, count: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.issued_since(Duration::ZERO, server) < count {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Wait (at most `within`) for a 201 to a request sent at or after
    /// `since`; how long after `since` that request was answered.
    pub async fn first_issued_since(
        &self,
        since: Duration,
        server: Option<usize>,
        within: Duration,
    ) -> Option<Duration> {
        let deadline = Instant::now() + within;
        loop {
            let first = lock(&self.log)
                .iter()
                .filter(|a| a.sent >= since && a.issued() && server.is_none_or(|s| a.server == s))
                .map(|a| a.sent + a.latency - since)
                .min();
            if first.is_some() {
                return first;
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stop the clients; every attempt, in the order sent.
    pub async fn stop(self) -> Vec<Attempt> {
        self.stop.store(true, Ordering::Relaxed);
        for worker in self.workers {
            let _ = worker.await;
        }
        let mut all = std::mem::take(&mut *lock(&self.log));
        all.sort_by_key(|a| a.sent);
        all
    }
}

/// What the trail says about the certificates of a load.
#[derive(Debug, Default)]
pub struct TrailCheck {
    pub records: usize,
    /// `certificate.issued` rows.
    pub issued_rows: usize,
    /// Certificates the clients received, each matched to its one row.
    pub delivered: usize,
    /// Rows naming a certificate whose answer never reached its client,
    /// with what that client saw (the server died after the commit, or
    /// the commit's answer was lost).
    pub recorded_not_delivered: Vec<(String, String)>,
    /// Broken invariants; empty when the trail is right.
    pub problems: Vec<String>,
}

async fn all_records(store: &AuditStore) -> Result<Vec<StoredRecord>, String> {
    let mut out: Vec<StoredRecord> = Vec::new();
    loop {
        let after = out.last().map_or(0, |r| r.seq);
        let page = store.page(after, 1000).await.map_err(|e| e.to_string())?;
        if page.is_empty() {
            return Ok(out);
        }
        out.extend(page);
    }
}

/// Every certificate a client received has exactly one `certificate.issued`
/// row naming it (serial, certificate and key fingerprints); every such row
/// belongs to a request of the load; no serial appears twice.
pub async fn check_trail(database_url: &str, attempts: &[Attempt]) -> Result<TrailCheck, String> {
    let store = AuditStore::connect(database_url, &StoreOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let records = all_records(&store).await?;
    store.close().await;
    let mut check = TrailCheck {
        records: records.len(),
        ..Default::default()
    };
    let issued: Vec<&StoredRecord> = records
        .iter()
        .filter(|r| r.record.event == "certificate.issued")
        .collect();
    check.issued_rows = issued.len();
    let mut by_serial: HashMap<&str, Vec<&StoredRecord>> = HashMap::new();
    for row in &issued {
        by_serial
            .entry(row.record.serial.as_deref().unwrap_or_default())
            .or_default()
            .push(row);
    }
    let by_key: HashMap<&str, &Attempt> = attempts
        .iter()
        .map(|a| (a.public_key_sha256.as_str(), a))
        .collect();
    for attempt in attempts.iter().filter(|a| a.issued()) {
        let serial = attempt.serial.as_deref().unwrap_or_default();
        match by_serial.get(serial).map(Vec::as_slice) {
            Some([row]) => {
                let r = &row.record;
                if r.outcome != "success"
                    || r.certificate_sha256 != attempt.certificate_sha256
                    || r.public_key_sha256.as_deref() != Some(attempt.public_key_sha256.as_str())
                {
                    check.problems.push(format!(
                        "serial {serial}: the row names another certificate or key"
                    ));
                } else {
                    check.delivered += 1;
                }
            }
            Some(rows) => check.problems.push(format!(
                "serial {serial} received once, recorded {} times",
                rows.len()
            )),
            None => check
                .problems
                .push(format!("serial {serial} was received without an audit row")),
        }
    }
    for row in &issued {
        let key = row.record.public_key_sha256.as_deref().unwrap_or_default();
        match by_key.get(key) {
            Some(attempt) if attempt.issued() => {}
            Some(attempt) => check
                .recorded_not_delivered
                .push((row.record.serial.clone().unwrap_or_default(), attempt.label())),
            None => check
                .problems
                .push(format!("seq {}: an issued row for a key no client sent", row.seq)),
        }
    }
    Ok(check)
}

/// One scenario's outcome: figures as lines, and a verdict.
#[derive(Debug, Default)]
pub struct Report {
    pub name: String,
    pub lines: Vec<String>,
    pub failures: Vec<String>,
}

impl Report {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Default::default()
        }
    }

    pub fn say(&mut self, line: impl Into<String>) {
        let line = line.into();
        eprintln!("[{}] {line}", self.name);
        self.lines.push(line);
    }

    /// Record a broken expectation (the scenario fails, and goes on).
    pub fn expect(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        if ok {
            self.say(format!("ok: {what}"));
        } else {
            self.say(format!("FAILED: {what}"));
            self.failures.push(what);
        }
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    pub fn verdict(&self) -> String {
        if self.passed() {
            format!("{}: PASS", self.name)
        } else {
            format!("{}: FAIL ({})", self.name, self.failures.join("; "))
        }
    }

    /// Counts by answer, longest latency, and the trail check's figures.
    pub fn attempts(&mut self, attempts: &[Attempt]) {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for attempt in attempts {
            *counts.entry(attempt.label()).or_default() += 1;
        }
        let longest = attempts.iter().map(|a| a.latency).max().unwrap_or_default();
        self.say(format!(
            "{} requests: {}; longest answer {:.2} s",
            attempts.len(),
            counts
                .iter()
                .map(|(label, n)| format!("{n} × {label}"))
                .collect::<Vec<_>>()
                .join(", "),
            longest.as_secs_f64()
        ));
    }

    pub fn trail(&mut self, check: &TrailCheck, verify: &Result<String, String>) {
        self.say(format!(
            "trail: {} records, {} certificate.issued rows, {} received certificates each matched to one row",
            check.records, check.issued_rows, check.delivered
        ));
        for (serial, seen) in &check.recorded_not_delivered {
            self.say(format!(
                "recorded, not delivered: serial {serial} (the client saw: {seen})"
            ));
        }
        for problem in &check.problems {
            self.expect(false, problem.clone());
        }
        self.expect(
            check.problems.is_empty(),
            "every received certificate has exactly one row, every row a request",
        );
        match verify {
            Ok(text) => self.expect(
                text.contains("audit chain intact"),
                format!("`audit verify`: {}", text.trim()),
            ),
            Err(error) => self.expect(false, format!("`audit verify` failed: {error}")),
        }
    }
}

/// A TCP proxy in front of a service, to break the path to it: `down`
/// (connections refused, open ones cut), `up` again on the same port, or
/// cut one connection right after the client sent a given message (the
/// server got it, its answer never arrives).
#[derive(Debug)]
pub struct TcpProxy {
    pub port: u16,
    target: std::net::SocketAddr,
    state: Arc<Mutex<ProxyState>>,
    accept: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct ProxyState {
    connections: Vec<tokio::task::AbortHandle>,
    /// Cut the first connection whose client sends these bytes: after
    /// the given time, or never (stalled until [`TcpProxy::down`]).
    cut_after: Option<(Vec<u8>, Option<Duration>)>,
    /// Connections cut that way so far.
    cuts: u64,
}

impl TcpProxy {
    pub async fn start(target: std::net::SocketAddr) -> Result<Self, String> {
        Self::start_on(0, target).await
    }

    /// On a given port (0: any free one).
    pub async fn start_on(port: u16, target: std::net::SocketAddr) -> Result<Self, String> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let proxy = Self {
            port,
            target,
            state: Arc::default(),
            accept: Mutex::new(None),
        };
        proxy.serve(listener);
        Ok(proxy)
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let (state, target) = (self.state.clone(), self.target);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let state_for_pipe = state.clone();
                let pipe = tokio::spawn(async move {
                    if let Ok(upstream) = tokio::net::TcpStream::connect(target).await {
                        pipe(client, upstream, state_for_pipe).await;
                    }
                });
                lock(&state).connections.push(pipe.abort_handle());
            }
        });
        *lock(&self.accept) = Some(task);
    }

    /// Refuse new connections and cut the open ones.
    pub fn down(&self) {
        if let Some(task) = lock(&self.accept).take() {
            task.abort();
        }
        for connection in lock(&self.state).connections.drain(..) {
            connection.abort();
        }
    }

    /// Accept again, on the same port.
    pub async fn up(&self) -> Result<(), String> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .map_err(|e| e.to_string())?;
        self.serve(listener);
        Ok(())
    }

    /// Cut the next connection whose client sends `message`: the service
    /// gets it, its answers no longer reach the client, and the connection
    /// closes after `close_after` (`None`: it stays silent until
    /// [`TcpProxy::down`]).
    pub fn cut_after(&self, message: &[u8], close_after: Option<Duration>) {
        lock(&self.state).cut_after = Some((message.to_vec(), close_after));
    }

    pub fn cuts(&self) -> u64 {
        lock(&self.state).cuts
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.down();
    }
}

async fn pipe(client: tokio::net::TcpStream, upstream: tokio::net::TcpStream, state: Arc<Mutex<ProxyState>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    // Set when the connection is cut: the service's answers are dropped.
    let muted = Arc::new(AtomicBool::new(false));
    let mute = muted.clone();
    let down = tokio::spawn(async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = match upstream_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !mute.load(Ordering::SeqCst) && client_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
        }
        if !mute.load(Ordering::SeqCst) {
            let _ = client_write.shutdown().await;
        } else {
            // Silent, not closed: the client waits for its answer.
            std::future::pending::<()>().await;
        }
    });
    // `down` cuts this half too.
    lock(&state).connections.push(down.abort_handle());
    let mut buffer = vec![0u8; 64 * 1024];
    // The end of the previous read, so a message split over two reads matches.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = match client_read.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let wanted = lock(&state).cut_after.clone();
        if let Some((message, close_after)) = wanted {
            let mut seen = std::mem::take(&mut tail);
            seen.extend_from_slice(&buffer[..n]);
            if seen.windows(message.len()).any(|w| w == message.as_slice()) {
                let armed = {
                    let mut s = lock(&state);
                    let armed = s.cut_after.take().is_some();
                    s.cuts += u64::from(armed);
                    armed
                };
                if armed {
                    muted.store(true, Ordering::SeqCst);
                    let _ = upstream_write.write_all(&buffer[..n]).await;
                    match close_after {
                        Some(after) => tokio::time::sleep(after).await,
                        None => std::future::pending::<()>().await,
                    }
                    down.abort();
                    return;
                }
            }
            let keep = message.len().saturating_sub(1).min(seen.len());
            tail = seen[seen.len() - keep..].to_vec();
        }
        if upstream_write.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = upstream_write.shutdown().await;
    let _ = down.await;
}

/// The simple-query message sqlx sends to commit a transaction.
pub const POSTGRES_COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
