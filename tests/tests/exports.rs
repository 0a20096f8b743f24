//! The console's exports against the real `talos-sso-server` binary, in a
//! process of its own so that its memory can be read from `/proc`, over a
//! seeded SQLite trail of 20,000 records (about 24 MB as JSON lines):
//!
//! - an export delivers every record, newest first, each linked to the
//!   next by its hash;
//! - seven clients that take the head of the whole export and then stop
//!   reading raise the server's peak resident memory by less than
//!   [`MAX_GROWTH_KIB`] (built whole, each export held its 24 MB);
//! - the caps per person and per replica refuse the next export, recorded;
//! - an export not taken within `console.export_timeout` is cut off, its
//!   connection closed, and the trail says how it ended; its slot is free
//!   again.

use std::time::{Duration, Instant};

use serde_json::Value;
use talos_sso_api::StoredRecord;
use talos_sso_server::audit::store::{AuditStore, StoreOptions};
use talos_sso_tests::audit_seed::seed_store;
use talos_sso_tests::console_client::Browserless;
use talos_sso_tests::emulator::{
    EmulatorConfig, EmulatorHandle, GROUP_PLATFORM_ADMINS, GROUP_SECURITY, TokenKind,
};
use talos_sso_tests::faults::{ServerProcess, server_binary, write_server_config};
use talos_sso_tests::harness::Workdir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const RECORDS: u64 = 20_000;
const AUDITOR: &str = "sam@example.com";
/// Made an auditor too here, so that two people export.
const SECOND_AUDITOR: &str = "alice@example.com";
/// The bound on the server's peak memory growth while the slow readers
/// hold their exports.
const MAX_GROWTH_KIB: u64 = 64 * 1024;
/// `console.export_timeout` of this test.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(20);

/// `Name: value kB` of `/proc/PID/status`.
fn status_kib(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
}

/// A client that asks for an export and reads only its head and the first
/// `first_bytes` of its body, then nothing.
struct SlowReader {
    stream: TcpStream,
    read: usize,
}

impl SlowReader {
    async fn open(base: &str, cookies: &str, first_bytes: usize) -> Self {
        let address = base.trim_start_matches("http://");
        let mut stream = TcpStream::connect(address).await.expect("connect");
        let request = format!(
            "GET /ui/export?format=jsonl HTTP/1.1\r\nHost: {address}\r\nCookie: {cookies}\r\n\
             Sec-Fetch-Site: same-origin\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.expect("request");
        let mut head = Vec::new();
        let mut buffer = [0u8; 4096];
        let ends = loop {
            let n = tokio::time::timeout(Duration::from_secs(60), stream.read(&mut buffer))
                .await
                .expect("the export's head within a minute")
                .expect("read");
            assert!(
                n > 0,
                "closed before the head: {}",
                String::from_utf8_lossy(&head)
            );
            head.extend_from_slice(&buffer[..n]);
            if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
        };
        let text = String::from_utf8_lossy(&head[..ends]).to_string();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains("application/x-ndjson"), "{text}");
        let mut read = head.len() - ends;
        while read < first_bytes {
            let n = stream.read(&mut buffer).await.expect("read");
            assert!(n > 0, "the export ended early");
            read += n;
        }
        Self { stream, read }
    }

    /// Read on to the end of the connection: how many bytes of body came
    /// in all.
    async fn drain(mut self) -> usize {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match tokio::time::timeout(Duration::from_secs(60), self.stream.read(&mut buffer))
                .await
                .expect("the connection ends within a minute")
            {
                Ok(0) | Err(_) => return self.read,
                Ok(n) => self.read += n,
            }
        }
    }
}

async fn seed(url: &str) {
    let store = AuditStore::connect(url, &StoreOptions::default())
        .await
        .expect("audit store");
    store.migrate().await.expect("migrations");
    seed_store(&store, RECORDS, 30, 30).await;
    store.close().await;
}

/// The `audit.query` records of exports, newest first, through the API.
async fn export_records(http: &reqwest::Client, base: &str, token: &str) -> Vec<Value> {
    let page: Value = http
        .get(format!("{base}/v1/audit?event=audit.query&limit=1000&since=1h"))
        .bearer_auth(token)
        .send()
        .await
        .expect("the trail")
        .json()
        .await
        .expect("JSON");
    page["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| r["details"]["view"] == "export")
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_stream_in_bounded_memory_and_time_and_are_capped() {
    let binary = server_binary().expect("the server binary");
    let emulator = EmulatorHandle::start(EmulatorConfig::default())
        .await
        .expect("emulator");
    let work = Workdir::new();
    let url = format!("sqlite://{}", work.path().join("audit.db").display());
    seed(&url).await;
    let (config, base) = write_server_config(&emulator, &work, &url, "exports.yaml", |yaml| {
        let port = yaml
            .split("listen: \"127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("the port")
            .to_owned();
        let yaml = yaml.replace(
            &format!("auditors: {{ groups: [\"{GROUP_SECURITY}\"] }}"),
            &format!("auditors: {{ groups: [\"{GROUP_SECURITY}\", \"{GROUP_PLATFORM_ADMINS}\"] }}"),
        );
        format!(
            "{yaml}\nconsole: {{ enabled: true, public_url: \"http://127.0.0.1:{port}\", \
             export_timeout: {}s, max_exports: 7, max_exports_per_person: 4 }}\n",
            EXPORT_TIMEOUT.as_secs()
        )
    })
    .expect("configuration");
    let server = ServerProcess::spawn(&binary, &config, &base, Duration::from_secs(60))
        .await
        .expect("the server starts");
    let pid = server.pid().expect("its pid");
    let token = emulator.token_for(AUDITOR, TokenKind::id()).expect("a token");
    let http = reqwest::Client::new();

    let mut sam = Browserless::new();
    sam.login(&base, AUDITOR, "/ui").await;
    let mut alice = Browserless::new();
    alice.login(&base, SECOND_AUDITOR, "/ui").await;

    // A whole export: every record, newest first, each linked to the next.
    let whole = sam.get(&format!("{base}/ui/export?format=jsonl")).await;
    assert_eq!(whole.status(), 200);
    let whole = whole.text().await.expect("the export");
    let records: Vec<StoredRecord> = whole
        .lines()
        .map(|line| serde_json::from_str(line).expect("a stored record"))
        .collect();
    let newest = records.first().expect("records").seq;
    assert!(
        newest > RECORDS as i64,
        "the seeded trail and the export's own record"
    );
    assert_eq!(records.len() as i64, newest, "every record");
    for pair in records.windows(2) {
        assert_eq!(pair[1].seq, pair[0].seq - 1, "newest first, none missing");
        assert_eq!(pair[0].prev_hash, pair[1].hash, "record {}", pair[0].seq);
    }
    let full_length = whole.len();
    assert!(full_length > 20 * 1024 * 1024, "{full_length} bytes");

    // Seven exports taken by clients that then stop reading.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak (root)");
    let before = status_kib(pid, "VmRSS:");
    let (sam_cookies, alice_cookies) = (sam.cookies.join("; "), alice.cookies.join("; "));
    let opened = Instant::now();
    let mut readers = Vec::new();
    for cookies in [&sam_cookies; 4].into_iter().chain([&alice_cookies; 3]) {
        readers.push(SlowReader::open(&base, cookies, 256 * 1024).await);
    }
    let peak = status_kib(pid, "VmHWM:");
    let growth = peak.saturating_sub(before);
    println!("slow readers: 7; resident before {before} KiB, peak after {peak} KiB (+{growth} KiB)");
    assert!(
        growth < MAX_GROWTH_KIB,
        "seven stalled exports raised the server's peak memory by {growth} KiB"
    );

    // The caps: sam holds four (their share), and the replica seven (all).
    // (Refusals over a rate are recorded aggregated, per window.)
    for who in [&mut sam, &mut alice] {
        let refused = who.get(&format!("{base}/ui/export?format=csv")).await;
        assert_eq!(refused.status(), 429);
        assert!(refused.headers().contains_key("retry-after"));
    }
    // Past the deadline, each stalled export is cut off and recorded.
    let wait_until = opened + EXPORT_TIMEOUT + Duration::from_secs(60);
    let ended = loop {
        let ended: Vec<Value> = export_records(&http, &base, &token)
            .await
            .into_iter()
            .filter(|r| r["details"]["ended"].is_string())
            .collect();
        if ended.len() >= 7 {
            break ended;
        }
        assert!(
            Instant::now() < wait_until,
            "the stalled exports were not cut off: {ended:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(opened.elapsed() >= EXPORT_TIMEOUT, "not before the deadline");
    for record in &ended {
        assert_eq!(record["details"]["ended"], "deadline", "{record}");
        assert!(record["details"]["export_record"].as_i64().unwrap() > 0);
        assert!(record["details"]["records_handed"].as_u64().unwrap() < newest as u64);
    }
    for reader in readers {
        let got = reader.drain().await;
        assert!(
            got < full_length,
            "a cut export is incomplete: {got} of {full_length} bytes"
        );
    }
    // Their slots are free again.
    let again = sam.get(&format!("{base}/ui/export?format=jsonl")).await;
    assert_eq!(again.status(), 200);
    assert!(again.text().await.unwrap().len() >= full_length);
}
