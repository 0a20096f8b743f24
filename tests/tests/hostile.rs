//! Hostile input against a running server: poisoned text, extreme
//! parameters, slow and silent clients, attacker-chosen metric labels,
//! floods, forwarded addresses, and the deny list's edges. Each test names
//! the door it keeps shut (docs/security.md, threat table).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use talos_sso::key::ClientKey;
use talos_sso_server::audit::StoredRecord;
use talos_sso_server::audit::store::{Append, Appended, DenyChange, DenyEntry};
use talos_sso_server::audit::{AuditRecord, event, outcome};
use talos_sso_tests::emulator::{SAM_OID, TokenKind};
use talos_sso_tests::harness::{Backend, TestEnv};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

on_both_stores!(poisoned_requests_fail_alone_while_honest_ones_issue);

const BOB_OID: &str = "b2000000-0000-4000-8000-000000000002";
const ALICE_OID: &str = "a1000000-0000-4000-8000-000000000001";

async fn records(env: &TestEnv) -> Vec<StoredRecord> {
    env.server.app.audit.store().page(0, 100_000).await.unwrap()
}

/// A real token with its payload replaced: the signature no longer matches.
fn forged(token: &str, claims: Value) -> String {
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    parts[1] = URL_SAFE_NO_PAD.encode(claims.to_string());
    parts.join(".")
}

/// One request to send, and what it must get.
#[derive(Clone)]
struct Shot {
    kind: &'static str,
    path: String,
    token: Option<String>,
    body: Option<String>,
    headers: Vec<(&'static str, Vec<u8>)>,
    status: u16,
    code: Option<&'static str>,
}

async fn fire(http: reqwest::Client, base: String, shot: Shot) -> (Shot, u16, Value, String) {
    let url = format!("{base}{}", shot.path);
    let mut request = match &shot.body {
        Some(body) => http.post(url).body(body.clone()),
        None => http.get(url),
    };
    if let Some(token) = &shot.token {
        request = request.bearer_auth(token);
    }
    for (name, value) in &shot.headers {
        request = request.header(*name, reqwest::header::HeaderValue::from_bytes(value).unwrap());
    }
    let answer = talos_sso_tests::harness::Answer::read(request.send().await.unwrap()).await;
    (shot, answer.status, answer.body, answer.request_id)
}

/// Issue 9 item 1: text the database refuses (NUL), terminal escapes,
/// oversize lists, sent concurrently with honest requests. Every honest
/// request gets its certificate, every poisoned one its own refusal, and
/// every request is accounted for exactly once in the trail.
async fn poisoned_requests_fail_alone_while_honest_ones_issue(backend: Backend) {
    let env = TestEnv::start(backend).await;
    let token = |user: &str| env.emulator.token_for(user, TokenKind::id()).unwrap();
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let nul_claims =
        json!({"iss": "\u{0}", "oid": "\u{0}oid", "preferred_username": "\u{0}\u{1b}[2J", "uti": "\u{0}"});
    let junk_roles: Vec<String> = (0..200).map(|i| format!("os:reader\u{0}\u{1b}[{i}m")).collect();
    let mut shots = Vec::new();
    for i in 0..40 {
        shots.push(Shot {
            kind: "honest",
            path: "/v1/certificates".into(),
            token: Some(token(["bob@example.com", "carol@example.com"][i % 2])),
            body: Some(json!({"cluster": "prod", "csr": csr}).to_string()),
            headers: vec![],
            status: 201,
            code: None,
        });
    }
    for _ in 0..6 {
        shots.push(Shot {
            kind: "nul cluster, no token",
            path: "/v1/certificates".into(),
            token: None,
            body: Some(r#"{"cluster":"\u0000","csr":""}"#.into()),
            headers: vec![],
            status: 401,
            code: Some("token_missing"),
        });
        shots.push(Shot {
            kind: "nul filter, no token",
            path: "/v1/audit?username=%00&role=%1b%5b2J".into(),
            token: None,
            body: None,
            headers: vec![],
            status: 401,
            code: Some("token_missing"),
        });
        shots.push(Shot {
            kind: "nul claims, bad signature",
            path: "/v1/certificates".into(),
            token: Some(forged(&token("bob@example.com"), nul_claims.clone())),
            body: Some(json!({"cluster": "prod", "csr": csr}).to_string()),
            headers: vec![],
            status: 401,
            // Its `iss` is a NUL: no issuer's, refused before any key work.
            code: Some("token_issuer_untrusted"),
        });
        shots.push(Shot {
            kind: "hostile headers, no token",
            path: "/v1/certificates".into(),
            token: None,
            body: Some(json!({"cluster": "prod", "csr": csr}).to_string()),
            headers: vec![
                ("user-agent", b"\xff\xfetool\t\x80".to_vec()),
                ("x-talos-sso-client-version", vec![b'9'; 4000]),
            ],
            status: 401,
            code: Some("token_missing"),
        });
        shots.push(Shot {
            kind: "nul roles, verified",
            path: "/v1/certificates".into(),
            token: Some(token("bob@example.com")),
            body: Some(json!({"cluster": "prod", "csr": csr, "roles": junk_roles}).to_string()),
            headers: vec![],
            status: 403,
            code: Some("role_not_permitted"),
        });
        shots.push(Shot {
            kind: "nul cluster, verified",
            path: "/v1/certificates".into(),
            token: Some(token("carol@example.com")),
            body: Some(json!({"cluster": "\u{0}prod\u{202e}", "csr": csr}).to_string()),
            headers: vec![],
            status: 404,
            code: Some("cluster_unknown"),
        });
    }
    // Interleave the kinds, then send all at once.
    let mut order: Vec<(usize, Shot)> = shots
        .into_iter()
        .enumerate()
        .map(|(i, s)| ((i * 7919) % 97, s))
        .collect();
    order.sort_by_key(|(key, _)| *key);
    let mut tasks = Vec::new();
    for (_, shot) in order {
        tasks.push(tokio::spawn(fire(
            env.http.clone(),
            env.server.base_url.clone(),
            shot,
        )));
    }
    let mut answers = Vec::new();
    for task in tasks {
        let (shot, status, body, request_id) = task.await.unwrap();
        assert_eq!(
            (status, body["code"].as_str()),
            (shot.status, shot.code),
            "{}: {body}",
            shot.kind
        );
        answers.push((shot, request_id));
    }
    env.server.app.record_refusals().await;
    let rows = records(&env).await;
    let by_request: HashMap<&str, Vec<&StoredRecord>> = rows.iter().fold(HashMap::new(), |mut map, r| {
        map.entry(r.record.request_id.as_str()).or_default().push(r);
        map
    });
    // Authenticated decisions: exactly one record each.
    for (shot, request_id) in answers
        .iter()
        .filter(|(s, _)| s.token.is_some() && s.status != 401)
    {
        let mine = by_request.get(request_id.as_str()).map(Vec::len).unwrap_or(0);
        assert_eq!(mine, 1, "{}: one record for {request_id}", shot.kind);
    }
    assert_eq!(
        rows.iter()
            .filter(|r| r.record.event == "certificate.issued")
            .count(),
        40
    );
    let junk = rows
        .iter()
        .find(|r| r.record.reason_code.as_deref() == Some("role_not_permitted"))
        .unwrap();
    assert_eq!(junk.record.roles_requested.len(), 65, "64 kept and a count");
    assert_eq!(junk.record.roles_requested[0], "os:reader\\u{0}\\u{1b}[0m");
    let unknown = rows
        .iter()
        .find(|r| r.record.reason_code.as_deref() == Some("cluster_unknown"))
        .unwrap();
    assert_eq!(
        unknown.record.cluster, None,
        "only configured names go in `cluster`"
    );
    assert_eq!(unknown.record.details["requested_cluster"], "\\u{0}prod\\u{202e}");
    // Refusals nobody authenticated: each one either recorded or counted.
    for (event, reason, sent) in [
        ("certificate.denied", "token_missing", 12),
        ("audit.query", "token_missing", 6),
        ("certificate.denied", "token_issuer_untrusted", 6),
    ] {
        let recorded = rows
            .iter()
            .filter(|r| r.record.event == event && r.record.reason_code.as_deref() == Some(reason))
            .count() as u64;
        let counted: u64 = rows
            .iter()
            .filter(|r| {
                r.record.event == "refusals.aggregated"
                    && r.record.details["event"] == event
                    && r.record.reason_code.as_deref() == Some(reason)
            })
            .map(|r| r.record.details["count"].as_u64().unwrap())
            .sum();
        assert_eq!(
            recorded + counted,
            sent,
            "{event} {reason}: {recorded} recorded, {counted} counted"
        );
    }
    // Nothing a terminal or the database would choke on was kept raw.
    for row in &rows {
        let text = serde_json::to_string(&row.record).unwrap();
        assert!(!text.contains("\\u0000") && !text.contains("\\u001b"), "{text}");
    }
    let check = env.server.app.audit.store().verify_chain().await.unwrap();
    assert_eq!((check.first_broken, check.verified as usize), (None, rows.len()));
    env.finish().await;
}

/// The writer's last line of defence: when the database refuses one record
/// of a batch for its content, that record alone fails (and a stand-in
/// records that it did); the rest of the batch commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_database_refuses_fails_alone() {
    let env = TestEnv::start(Backend::Postgres).await;
    let database = env.database.as_ref().unwrap();
    // A rule the sanitised records cannot break on their own: make one.
    database
        .superuser(
            "ALTER TABLE audit_events ADD CONSTRAINT no_mallory CHECK (username IS DISTINCT FROM 'mallory')",
        )
        .await
        .unwrap();
    let writer = env.server.app.audit.clone();
    let mut tasks = Vec::new();
    for i in 0..30 {
        let writer = writer.clone();
        tasks.push(tokio::spawn(async move {
            let mut record = AuditRecord::new(
                event::CERTIFICATE_DENIED,
                outcome::DENIED,
                &format!("req-{i}"),
                time::OffsetDateTime::now_utc(),
            );
            record.username = Some(if i % 10 == 3 { "mallory" } else { "someone" }.into());
            record.reason_code = Some("no_matching_rule".into());
            (
                i,
                writer
                    .append(Append {
                        record,
                        ..Default::default()
                    })
                    .await,
            )
        }));
    }
    for task in tasks {
        let (i, result) = task.await.unwrap();
        assert_eq!(result.is_ok(), i % 10 != 3, "record {i}");
    }
    let rows = records(&env).await;
    assert_eq!(rows.len(), 30, "27 records and 3 stand-ins");
    let standins: Vec<&StoredRecord> = rows
        .iter()
        .filter(|r| r.record.event == "audit.record_refused")
        .collect();
    assert_eq!(standins.len(), 3);
    assert!(
        standins[0].record.details["database_error"]
            .as_str()
            .unwrap()
            .contains("23514")
    );
    assert_eq!(standins[0].record.details["event"], "certificate.denied");
    assert!(
        env.server
            .app
            .audit
            .stats()
            .refused
            .load(std::sync::atomic::Ordering::Relaxed)
            == 3
    );
    let check = env.server.app.audit.store().verify_chain().await.unwrap();
    assert_eq!((check.first_broken, check.verified), (None, 30));
    env.finish().await;
}

async fn get_as(env: &TestEnv, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut request = env.http.get(format!("{}{path}", env.server.base_url));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("answered, not reset");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Item 2: every time and number from a query parameter is checked; none
/// can overflow, and each bad one is named.
#[tokio::test]
async fn audit_parameters_with_extreme_values_answer_400() {
    let env = TestEnv::start(Backend::Postgres).await;
    let sam = env
        .emulator
        .token_for("sam@example.com", TokenKind::id())
        .unwrap();
    // Anonymous: refused before anything is parsed, never a reset.
    let (status, body) = get_as(&env, "/v1/audit?since=100000y", None).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("token_missing")));
    let cases: &[(&str, &str, u16)] = &[
        ("since", "100000y", 400),
        ("since", "18446744073709551615s", 400),
        ("since", "-5d", 400),
        ("since", "0s", 200),
        ("since", "last-tuesday", 400),
        ("since", "10000-01-01T00:00:00Z", 400),
        ("since", "9999-12-31T23:59:59Z", 200),
        ("until", "100000y", 400),
        ("until", "-1s", 400),
        ("until", "0s", 200),
        ("until", "soon", 400),
        ("cursor", "99999999999999999999", 400),
        ("cursor", "-1", 400),
        ("cursor", "0", 200),
        ("cursor", "abc", 400),
        ("limit", "1000000", 400),
        ("limit", "-1", 400),
        ("limit", "0", 400),
        ("limit", "1e3", 400),
        ("limit", "1000", 200),
        ("outcome", "sucess", 400),
        ("outcome", "denied", 200),
        ("event", "certificate.issud", 400),
        ("event", "refusals.aggregated", 200),
    ];
    for (parameter, value, expected) in cases {
        let (status, body) = get_as(&env, &format!("/v1/audit?{parameter}={value}"), Some(&sam)).await;
        assert_eq!(status, *expected, "{parameter}={value}: {body}");
        if *expected == 400 {
            assert_eq!(body["code"], "request_invalid", "{parameter}={value}");
            assert_eq!(body["parameter"], *parameter, "{parameter}={value}");
        }
    }
    // The certificate request's TTL, at its extremes.
    let bob = env
        .emulator
        .token_for("bob@example.com", TokenKind::id())
        .unwrap();
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    for (ttl, code) in [
        (json!(u64::MAX), "ttl_too_long"),
        (json!(0), "ttl_invalid"),
        (json!(-1), "request_invalid"),
        (json!(1e300), "request_invalid"),
    ] {
        let response = env
            .http
            .post(format!("{}/v1/certificates", env.server.base_url))
            .bearer_auth(&bob)
            .body(json!({"cluster": "prod", "csr": csr, "ttl_seconds": ttl}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 400);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["code"], code, "ttl {ttl}");
    }
    env.finish().await;
}

/// Plain-HTTP and TLS servers with short limits.
async fn slow_client_env(tls: bool) -> (TestEnv, Option<String>, tempfile::TempDir) {
    // The TLS files live in the test server's own work folder, removed with it.
    let scratch = tempfile::tempdir().unwrap();
    let (ca_pem, cert, key) = talos_sso_tests::harness::tls_files(scratch.path());
    let limits =
        "http: { header_read_timeout: 1s, request_timeout: 2s, idle_timeout: 3s, max_connections: 3 }\n";
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        let yaml = format!("{yaml}{limits}");
        if tls {
            yaml.replace(
                "insecure_http: true",
                &format!(
                    "tls: {{ cert_file: \"{}\", key_file: \"{}\" }}",
                    cert.display(),
                    key.display()
                ),
            )
        } else {
            yaml
        }
    })
    .await;
    (env, tls.then_some(ca_pem), scratch)
}

fn address(env: &TestEnv) -> String {
    env.server
        .base_url
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .to_owned()
}

/// Read until the server closes the connection; how long that took, or
/// `None` when it was still open after `limit`.
async fn closed_within(stream: &mut tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + limit).into(), stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => continue,
        }
    }
}

/// Item 3: half a request header, a silent TLS client, an idle HTTP/2
/// connection: each is closed within its configured time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_silent_clients_are_cut_off_on_plain_http() {
    let (env, _, _scratch) = slow_client_env(false).await;
    let addr = address(&env);
    let limit = Duration::from_secs(8);

    let mut half = tokio::net::TcpStream::connect(&addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let took = closed_within(&mut half, limit)
        .await
        .expect("half a header is cut off");
    assert!(took >= Duration::from_millis(800), "{took:?}");

    // A kept-alive connection that sends no next request.
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    closed_within(&mut idle, limit)
        .await
        .expect("idle keep-alive is closed");

    // HTTP/2 with prior knowledge: the preface and SETTINGS, then silence.
    let mut h2 = tokio::net::TcpStream::connect(&addr).await.unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let took = closed_within(&mut h2, limit)
        .await
        .expect("idle HTTP/2 is closed");
    assert!(
        took >= Duration::from_secs(2),
        "idle_timeout, not the head timeout: {took:?}"
    );

    // HTTP/2 PINGs move bytes but ask for nothing: the connection is idle.
    let mut pinger = tokio::net::TcpStream::connect(&addr).await.unwrap();
    pinger
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    let mut closed = false;
    while started.elapsed() < limit && !closed {
        let ping = [0u8, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        if pinger.write_all(&ping).await.is_err() {
            closed = true;
            break;
        }
        match tokio::time::timeout(Duration::from_millis(500), pinger.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed = true,
            _ => {}
        }
    }
    assert!(
        closed,
        "a connection that only pings is closed after idle_timeout"
    );

    // At the connection cap, a new client waits until a slot frees.
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut waiting = tokio::net::TcpStream::connect(&addr).await.unwrap();
    waiting
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_millis(500), waiting.read(&mut buf))
            .await
            .is_err(),
        "not served while three silent connections hold every slot"
    );
    drop(silent);
    let n = tokio::time::timeout(limit, waiting.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_silent_clients_are_cut_off_on_tls() {
    let (env, ca_pem, _scratch) = slow_client_env(true).await;
    let addr = address(&env);
    let limit = Duration::from_secs(8);

    // Connected, no ClientHello.
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    closed_within(&mut silent, limit)
        .await
        .expect("a silent TLS client is cut off");
    // Half a ClientHello.
    let mut half = tokio::net::TcpStream::connect(&addr).await.unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
        .await
        .unwrap();
    closed_within(&mut half, limit)
        .await
        .expect("half a handshake is cut off");

    // A finished handshake, then half a request header.
    let ca_pem = ca_pem.unwrap();
    let started = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut roots = rustls::RootCertStore::empty();
        for cert in talos_sso_tests::talos_checker::certificates_from_pem(&ca_pem).unwrap() {
            roots.add(cert).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let connection = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
        let socket = std::net::TcpStream::connect(&addr).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
        let mut tls = rustls::StreamOwned::new(connection, socket);
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
        let started = Instant::now();
        let mut buf = [0u8; 256];
        loop {
            match tls.read(&mut buf) {
                Ok(0) => break Some(started.elapsed()),
                Ok(_) => continue,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    break None;
                }
                Err(_) => break Some(started.elapsed()),
            }
        }
    })
    .await
    .unwrap();
    assert!(started.is_some(), "half a header over TLS is cut off");
    env.finish().await;
}

/// Item 4: metric labels take configured values only.
#[tokio::test]
async fn metric_labels_never_come_from_the_request() {
    let env = TestEnv::start(Backend::Sqlite).await;
    for cluster in ["a", "b", "\u{0}c", "prod"] {
        env.http
            .post(format!("{}/v1/certificates", env.server.base_url))
            .body(json!({"cluster": cluster, "csr": ""}).to_string())
            .send()
            .await
            .unwrap();
    }
    let text = env.metrics().await;
    let mut denied: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("talos_sso_requests_denied_total{"))
        .collect();
    denied.sort();
    assert_eq!(
        denied,
        [
            r#"talos_sso_requests_denied_total{cluster="prod",reason="token_missing"} 1"#,
            r#"talos_sso_requests_denied_total{cluster="unknown",reason="token_missing"} 3"#,
        ],
        "{text}"
    );
    assert!(!text.contains('\0'));
    env.finish().await;
}

/// Item 5: a flood of anonymous refusals adds a bounded number of rows,
/// and the audit API is rate-limited too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_flood_adds_a_bounded_number_of_records() {
    let env = TestEnv::start(Backend::Postgres).await;
    let mut tasks = Vec::new();
    // 64 at a time: one address may hold only so many connections.
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    for _ in 0..300 {
        let http = env.http.clone();
        let url = format!("{}/v1/certificates", env.server.base_url);
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let _turn = gate.acquire_owned().await.unwrap();
            http.post(url).body("{}").send().await.unwrap().status().as_u16()
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), 401);
    }
    assert_eq!(records(&env).await.len(), 1, "the first of the window only");
    env.server.app.record_refusals().await;
    let rows = records(&env).await;
    assert_eq!(rows.len(), 2);
    let summary = &rows[1].record;
    assert_eq!(summary.event, "refusals.aggregated");
    assert_eq!(summary.client_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(summary.details["count"], 299);
    assert_eq!(
        summary.details["recorded_first"],
        json!(rows[0].record.request_id)
    );
    env.finish().await;
}

#[tokio::test]
async fn the_audit_and_deny_apis_are_rate_limited() {
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        yaml.replace(
            "rate_limits: { per_identity_per_minute: 0, per_address_per_minute: 0 }",
            "rate_limits: { per_identity_per_minute: 0, per_address_per_minute: 0, api_per_identity_per_minute: 3 }",
        )
    })
    .await;
    let sam = env
        .emulator
        .token_for("sam@example.com", TokenKind::id())
        .unwrap();
    for _ in 0..3 {
        assert_eq!(get_as(&env, "/v1/audit", Some(&sam)).await.0, 200);
    }
    let (status, body) = get_as(&env, "/v1/audit/verify", Some(&sam)).await;
    assert_eq!((status, body["code"].as_str()), (429, Some("rate_limited")));
    let alice = env
        .emulator
        .token_for("alice@example.com", TokenKind::id())
        .unwrap();
    for _ in 0..3 {
        assert_eq!(get_as(&env, "/v1/deny", Some(&alice)).await.0, 200);
    }
    assert_eq!(get_as(&env, "/v1/deny", Some(&alice)).await.0, 429);
    env.finish().await;
}

/// Item 6: behind a trusted proxy, the client is the entry the proxy
/// appended, port or not; IPv6 clients share a quota per /64.
#[tokio::test]
async fn forwarded_addresses_with_ports_and_ipv6_networks_are_limited() {
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        yaml.replace(
            "rate_limits: { per_identity_per_minute: 0, per_address_per_minute: 0 }",
            "rate_limits: { per_identity_per_minute: 0, per_address_per_minute: 2 }\nhttp: { trusted_proxies: [127.0.0.1] }",
        )
    })
    .await;
    let send = |forwarded: &'static str| {
        let http = env.http.clone();
        let url = format!("{}/v1/certificates", env.server.base_url);
        async move {
            http.post(url)
                .header("x-forwarded-for", forwarded)
                .body("{}")
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // The spoofed entry on the left changes every time; the client is the
    // one the proxy appended, with its port.
    assert_eq!(send("1.1.1.1, 203.0.113.7:51234").await, 401);
    assert_eq!(send("2.2.2.2, 203.0.113.7:40000").await, 401);
    assert_eq!(send("3.3.3.3, 203.0.113.7:40001").await, 429);
    // One /64, many addresses: one quota.
    assert_eq!(send("[2001:db8:1:2::1]:443").await, 401);
    assert_eq!(send("2001:db8:1:2::2").await, 401);
    assert_eq!(send("[2001:db8:1:2:ffff::3]:1").await, 429);
    assert_eq!(send("2001:db8:1:3::1").await, 401, "another /64");
    let rows = records(&env).await;
    assert_eq!(rows[0].record.client_ip.as_deref(), Some("203.0.113.7"));
    env.finish().await;
}

fn deny_entry(subject: &str) -> DenyEntry {
    DenyEntry {
        subject: Some(subject.into()),
        username: None,
        reason: "test".into(),
        added_by: "test".into(),
        added_at: time::OffsetDateTime::now_utc(),
        expires_at: None,
    }
}

/// Item 7: a deny-list change and an issuance in one transaction; the
/// issuance after the change is refused.
#[tokio::test]
async fn a_deny_change_applies_to_the_rest_of_its_batch() {
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let env = TestEnv::start(backend).await;
        let store = env.server.app.audit.store();
        let now = time::OffsetDateTime::now_utc();
        let mut added = AuditRecord::new(event::DENY_ADDED, outcome::SUCCESS, "r-add", now);
        added.subject = Some(ALICE_OID.into());
        let mut issued = AuditRecord::new(event::CERTIFICATE_ISSUED, outcome::SUCCESS, "r-issue", now);
        issued.subject = Some(BOB_OID.into());
        issued.serial = Some("01".into());
        let results = store
            .append_batch(&[
                Append {
                    record: added,
                    deny_change: Some(DenyChange::Add(deny_entry(BOB_OID))),
                    ..Default::default()
                },
                Append {
                    record: issued,
                    deny_check: true,
                    ..Default::default()
                },
            ])
            .await
            .unwrap();
        assert!(matches!(results[0], Appended::Recorded(_)));
        assert!(
            matches!(&results[1], Appended::Denied(s) if s.record.reason_code.as_deref() == Some("identity_denied")),
            "{backend:?}: {:?}",
            results[1]
        );
        env.finish().await;
    }
}

/// Item 7: deny-listed admins and auditors lose their privileges too.
#[tokio::test]
async fn deny_listed_admins_and_auditors_are_refused() {
    let env = TestEnv::start(Backend::Postgres).await;
    let token = |user: &str| env.emulator.token_for(user, TokenKind::id()).unwrap();
    let base = env.server.base_url.clone();
    let add = |subject: &str| {
        let (http, url, bearer) = (
            env.http.clone(),
            format!("{base}/v1/deny"),
            token("alice@example.com"),
        );
        let body = json!({"subject": subject, "reason": "investigation"}).to_string();
        async move {
            http.post(url)
                .bearer_auth(bearer)
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // A username that no verified record names cannot be blocked: its
    // subject is unknown, and the name itself blocks nothing.
    let by_name = env
        .http
        .post(format!("{base}/v1/deny"))
        .bearer_auth(token("alice@example.com"))
        .body(json!({"username": "nobody-yet@example.com", "reason": "x"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(by_name.status().as_u16(), 400);
    assert_eq!(by_name.json::<Value>().await.unwrap()["code"], "subject_required");
    assert_eq!(add(SAM_OID).await, 201);
    let (status, body) = get_as(&env, "/v1/audit", Some(&token("sam@example.com"))).await;
    assert_eq!((status, body["code"].as_str()), (403, Some("identity_denied")));
    let (status, _) = get_as(&env, "/v1/audit/verify", Some(&token("sam@example.com"))).await;
    assert_eq!(status, 403);

    assert_eq!(add(ALICE_OID).await, 201);
    let removal = env
        .http
        .delete(format!("{base}/v1/deny?subject={ALICE_OID}"))
        .bearer_auth(token("alice@example.com"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        removal.status().as_u16(),
        403,
        "a blocked admin cannot unblock themselves"
    );
    let entries = env.server.app.audit.store().deny_list().await.unwrap();
    assert_eq!(entries.len(), 2, "both entries stay");
    assert_eq!(
        get_as(&env, "/v1/deny", Some(&token("alice@example.com")))
            .await
            .0,
        403
    );
    env.finish().await;
}

/// Item 11: the SQLite database (trail, deny list, replay guard) is private
/// whatever the umask: directory 0700, file 0600, and its WAL files follow.
#[tokio::test]
async fn the_sqlite_database_is_created_private() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("state").join("talos-sso");
    let url = format!("sqlite://{}", dir.join("audit.db").display());
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        let start = yaml.find("sqlite://").unwrap();
        let end = start + yaml[start..].find('"').unwrap();
        format!("{}{url}{}", &yaml[..start], &yaml[end..])
    })
    .await;
    let bob = env
        .emulator
        .token_for("bob@example.com", TokenKind::id())
        .unwrap();
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let issued = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .bearer_auth(bob)
        .body(json!({"cluster": "prod", "csr": csr}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(issued.status().as_u16(), 201);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    assert!(dir.join("audit.db-wal").exists(), "WAL mode");
    env.finish().await;
}

/// Item 3, per address: one host cannot take every connection slot.
#[tokio::test]
async fn one_address_holds_at_most_its_share_of_connections() {
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        format!("{yaml}http: {{ max_connections_per_address: 2 }}\n")
    })
    .await;
    let addr = address(&env);
    let first = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let _second = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let took = closed_within(&mut third, Duration::from_secs(2)).await;
    assert!(
        took.is_some(),
        "the third connection from one address is closed at once"
    );
    drop(first);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = tokio::net::TcpStream::connect(&addr).await.unwrap();
    again
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), again.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "a freed slot is usable again"
    );
    env.finish().await;
}

/// Review findings on the deny list: two entries may carry one username
/// label; adding a listed subject again says so; a subject the provider
/// writes with invisible characters is blocked by what the trail shows.
#[tokio::test]
async fn deny_entries_are_per_subject_and_match_what_the_trail_shows() {
    let env = TestEnv::start(Backend::Postgres).await;
    let alice = env
        .emulator
        .token_for("alice@example.com", TokenKind::id())
        .unwrap();
    let add = |body: Value| {
        let (http, url, bearer) = (
            env.http.clone(),
            format!("{}/v1/deny", env.server.base_url),
            alice.clone(),
        );
        async move {
            let response = http
                .post(url)
                .bearer_auth(bearer)
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let carol_oid = "c3000000-0000-4000-8000-000000000003";
    assert_eq!(
        add(json!({"subject": BOB_OID, "username": "mallory", "reason": "r"}))
            .await
            .0,
        201
    );
    assert_eq!(
        add(json!({"subject": carol_oid, "username": "mallory", "reason": "r"}))
            .await
            .0,
        201
    );
    let (status, again) = add(json!({"subject": carol_oid, "reason": "r"})).await;
    assert_eq!((status, again["code"].as_str()), (409, Some("already_denied")));
    assert_eq!(env.server.app.audit.store().deny_list().await.unwrap().len(), 2);
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let carol = env
        .emulator
        .token_for("carol@example.com", TokenKind::id())
        .unwrap();
    let refused = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .bearer_auth(carol)
        .body(json!({"cluster": "prod", "csr": csr}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 403, "the second entry blocks too");

    // A subject with a zero-width space, as the trail shows it.
    let odd = env
        .emulator
        .token_with(
            "bob@example.com",
            TokenKind::id(),
            json!({"oid": "odd-oid\u{200b}"}),
        )
        .unwrap();
    assert_eq!(
        add(json!({"subject": "odd-oid\\u{200b}", "reason": "r"})).await.0,
        201
    );
    let blocked = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .bearer_auth(odd)
        .body(json!({"cluster": "prod", "csr": csr}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(blocked.status().as_u16(), 403);
    env.finish().await;
}

/// Review finding: an anonymous refusal could store ~37 KB. A record
/// nobody vouched for keeps a few short roles, and every field is bounded.
#[tokio::test]
async fn a_record_nobody_vouched_for_stays_small() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let roles: Vec<String> = (0..64).map(|_| "𝔸".repeat(250)).collect();
    let status = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .header("user-agent", "u".repeat(4000))
        .body(json!({"cluster": "prod", "csr": "x".repeat(1000), "roles": roles}).to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(status, 401);
    let rows = records(&env).await;
    let record = &rows.last().unwrap().record;
    assert_eq!(record.roles_requested.len(), 9, "8 kept and a count");
    assert!(record.roles_requested.iter().all(|r| r.chars().count() <= 129));
    let size = serde_json::to_string(record).unwrap().len();
    assert!(size < 8 * 1024, "{size} bytes");
    env.finish().await;
}
