//! The load: clients issuing continuously while a fault happens, and
//! what each of their requests saw.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use talos_sso::key::ClientKey;

use super::lock;
use crate::emulator::{EmulatorHandle, TokenKind};

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
