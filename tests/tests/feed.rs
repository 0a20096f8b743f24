//! Feeds for a SIEM, end to end on both stores: a service principal's own
//! token (client credentials from the emulator) reading and following the
//! trail, the follow stream (`GET /v1/audit/stream`) with its backlog, new
//! records from this replica and another, heartbeats, one `audit.query`
//! record per stream, its end at the token's expiry or when access goes
//! (a reload, the deny list, a deny list that cannot be read), and its cap.

use std::time::Duration;

use serde_json::{Value, json};
use talos_sso_server::app::reload::Trigger;
use talos_sso_server::audit::StoredRecord;
use talos_sso_tests::emulator::{
    OTHER_APP_CLIENT_ID, OTHER_APP_CLIENT_SECRET, SAM_OID, SERVER_APP_ID, SIEM_CLIENT_ID, SIEM_CLIENT_SECRET,
    TENANT_ID, TokenKind,
};
use talos_sso_tests::harness::{Answer, Backend, TestEnv, json_of};

on_both_stores!(
    a_follow_stream_sends_the_backlog_then_each_new_record_and_is_recorded_once,
    a_service_principal_with_the_auditor_role_reads_and_follows_and_gets_no_certificate,
    a_stream_ends_when_its_token_expires_and_streams_are_capped,
    a_stream_ends_when_its_caller_is_no_longer_an_auditor,
);

/// The test server with the SIEM collector's app role among the auditors,
/// quick heartbeats and polls, and request and idle timeouts far shorter
/// than the streams of these tests last.
async fn feed_env(backend: Backend, extra: &str) -> TestEnv {
    let extra = extra.to_owned();
    TestEnv::start_with(backend, move |yaml| feed_yaml(yaml, &extra)).await
}

fn feed_yaml(yaml: String, extra: &str) -> String {
    let yaml = yaml.replace(
        "auditors: { groups: [",
        "auditors: { app_roles: [Talos.Auditor], groups: [",
    );
    format!(
        "{yaml}\nhttp: {{ request_timeout: 1s, idle_timeout: 2s }}\n\
         audit: {{ feed: {{ heartbeat: 300ms, poll_interval: 300ms{extra} }} }}\n"
    )
}

async fn records(env: &TestEnv) -> Vec<StoredRecord> {
    env.server.app.audit.store().page(0, 10_000).await.unwrap()
}

/// A token of the application's own, through the client credentials grant.
async fn client_credentials(env: &TestEnv, client_id: &str, secret: &str) -> String {
    let answer = json_of(
        env.http
            .post(format!("{}/{TENANT_ID}/oauth2/v2.0/token", env.emulator.base_url))
            .form(&[
                ("grant_type", "client_credentials"),
                ("client_id", client_id),
                ("client_secret", secret),
                ("scope", &format!("api://{SERVER_APP_ID}/.default")),
            ]),
    )
    .await;
    answer["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_owned()
}

/// An open stream, read line by line.
struct Stream {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Stream {
    /// Open `GET /v1/audit/stream?query` on `base`; the error answer when
    /// it is refused.
    async fn open(env: &TestEnv, base: &str, token: &str, query: &str) -> Result<Self, Answer> {
        let response = reqwest::Client::new()
            .get(format!("{base}/v1/audit/stream?{query}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let _ = env;
        if response.status() != 200 {
            return Err(Answer::read(response).await);
        }
        assert_eq!(
            response.headers()["content-type"],
            "application/x-ndjson",
            "the stream's media type"
        );
        Ok(Self {
            response,
            buffer: Vec::new(),
        })
    }

    /// The next line, `None` at the end of the stream.
    async fn line(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.response.chunk())
                .await
                .expect("a line within 30 s")
                .unwrap()?;
            self.buffer.extend_from_slice(&chunk);
        }
    }

    /// The last line, read through to the end of the stream, which must
    /// come within 30 s (heartbeats keep a stream that does not end going).
    async fn last(&mut self) -> Value {
        let read = async {
            let mut last = None;
            while let Some(line) = self.line().await {
                last = Some(line);
            }
            last.expect("a stream ends with a line saying why")
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("the stream ends within 30 s")
    }

    /// Lines until a record with `event` (and `username`, when given); the
    /// records and the number of heartbeats read on the way.
    async fn until(&mut self, event: &str, username: Option<&str>) -> (Vec<Value>, usize) {
        let (mut seen, mut heartbeats) = (Vec::new(), 0);
        loop {
            let line = self.line().await.expect("the stream goes on");
            if line.get("heartbeat").is_some() {
                heartbeats += 1;
                continue;
            }
            assert!(line.get("end").is_none(), "ended early: {line}");
            let done = line["event"] == event && username.is_none_or(|u| line["username"] == u);
            seen.push(line);
            if done {
                return (seen, heartbeats);
            }
        }
    }
}

fn follow_records(all: &[StoredRecord]) -> Vec<&StoredRecord> {
    all.iter()
        .filter(|r| r.record.event == "audit.query" && r.record.details["action"] == "follow")
        .filter(|r| r.record.outcome == "success")
        .collect()
}

async fn a_follow_stream_sends_the_backlog_then_each_new_record_and_is_recorded_once(backend: Backend) {
    let env = feed_env(backend, "").await;
    let token = |user: &str| env.emulator.token_for(user, TokenKind::id()).unwrap();
    let (status, _) = env.issue(&token("bob@example.com")).await;
    assert_eq!(status, 201);
    let (status, _) = env.issue(&token("dave@example.com")).await;
    assert_eq!(status, 403);
    let base = env.server.base_url.clone();
    let sam = token("sam@example.com");
    let mut stream = Stream::open(&env, &base, &sam, "cursor=0").await.unwrap();

    // The backlog first: both decisions, then the stream's own record.
    let (backlog, _) = stream.until("audit.query", Some("sam@example.com")).await;
    let events: Vec<&str> = backlog.iter().map(|r| r["event"].as_str().unwrap()).collect();
    assert_eq!(
        events,
        ["certificate.issued", "certificate.denied", "audit.query"]
    );
    assert_eq!(backlog[2]["details"]["action"], "follow");

    // Quiet for longer than the request and idle timeouts: heartbeats keep
    // the stream, which is cut by neither.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, _) = env.issue(&token("carol@example.com")).await;
    assert_eq!(status, 201);
    let (new, heartbeats) = stream
        .until("certificate.issued", Some("carol@example.com"))
        .await;
    assert!(heartbeats >= 3, "{heartbeats} heartbeats in 2.5 s at 300 ms");
    assert_eq!(new.len(), 1, "{new:?}");

    // A record another replica commits arrives through the poll.
    let replica = env.another_server().await;
    let (status, _) = env
        .http
        .get(format!("{}/v1/audit?limit=1", replica.base_url))
        .bearer_auth(token("bob@example.com"))
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .unwrap();
    assert_eq!(status, 403);
    let (from_replica, _) = stream.until("audit.query", Some("bob@example.com")).await;
    assert_eq!(from_replica.len(), 1);
    assert_eq!(from_replica[0]["reason_code"], "not_an_auditor");

    // What the stream sent is the trail, record for record, hashes included.
    let all = records(&env).await;
    let streamed: Vec<Value> = backlog.into_iter().chain(new).chain(from_replica).collect();
    for line in &streamed {
        let seq = line["seq"].as_i64().unwrap();
        let stored = all.iter().find(|r| r.seq == seq).unwrap();
        assert_eq!(line, &serde_json::to_value(stored).unwrap());
    }
    let seqs: Vec<i64> = streamed.iter().map(|r| r["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // One `audit.query` for the whole stream, whatever flowed through it.
    let follows = follow_records(&all);
    assert_eq!(follows.len(), 1, "{follows:?}");
    assert_eq!(follows[0].record.details["filter"], json!({"cursor": "0"}));
    assert_eq!(follows[0].record.outcome, "success");

    // A filter applies to the backlog and to new records; a cursor skips.
    let issued_seq = all
        .iter()
        .find(|r| r.record.event == "certificate.issued")
        .unwrap()
        .seq;
    let mut filtered = Stream::open(
        &env,
        &base,
        &sam,
        &format!("event=certificate.issued&cursor={issued_seq}"),
    )
    .await
    .unwrap();
    let (status, _) = env.issue(&token("alice@example.com")).await;
    assert_eq!(status, 403, "alice must ask for admin");
    let (status, _) = env.issue(&token("bob@example.com")).await;
    assert_eq!(status, 201);
    let (only, _) = filtered
        .until("certificate.issued", Some("bob@example.com"))
        .await;
    let users: Vec<&str> = only.iter().map(|r| r["username"].as_str().unwrap()).collect();
    assert_eq!(users, ["carol@example.com", "bob@example.com"]);
    // Bad filters are refused as `GET /v1/audit` refuses them, and recorded.
    for (query, parameter) in [
        ("event=nope", "event"),
        ("limit=5", "limit"),
        ("cursor=-1", "cursor"),
    ] {
        let refused = Stream::open(&env, &base, &sam, query).await.err().unwrap();
        assert_eq!(
            (refused.status, refused.code(), refused.body["parameter"].as_str()),
            (400, Some("request_invalid"), Some(parameter))
        );
    }
    let all = records(&env).await;
    assert_eq!(follow_records(&all).len(), 2, "one per stream that started");
    let refused = all
        .iter()
        .filter(|r| r.record.event == "audit.query" && r.record.outcome == "denied")
        .filter(|r| r.record.reason_code.as_deref() == Some("request_invalid"))
        .count();
    assert_eq!(refused, 3);
    drop((stream, filtered));
    replica.stop().await;
    env.finish().await;
}

async fn a_service_principal_with_the_auditor_role_reads_and_follows_and_gets_no_certificate(
    backend: Backend,
) {
    let env = feed_env(backend, "").await;
    let base = env.server.base_url.clone();
    let siem = client_credentials(&env, SIEM_CLIENT_ID, SIEM_CLIENT_SECRET).await;
    let other = client_credentials(&env, OTHER_APP_CLIENT_ID, OTHER_APP_CLIENT_SECRET).await;
    let read = |token: String| {
        let http = env.http.clone();
        let url = format!("{base}/v1/audit");
        async move { Answer::read(http.get(url).bearer_auth(token).send().await.unwrap()).await }
    };

    // The collector reads a page, recorded under its client id.
    let page = read(siem.clone()).await;
    assert_eq!(page.status, 200, "{:?}", page.body);
    let last = records(&env).await.pop().unwrap().record;
    assert_eq!(
        (
            last.event.as_str(),
            last.outcome.as_str(),
            last.username.as_deref(),
            last.subject.as_deref(),
            last.identity_verified,
        ),
        (
            "audit.query",
            "success",
            Some(SIEM_CLIENT_ID),
            Some("5e1e5e1e-0000-4000-8000-0000000005a1"),
            true
        )
    );
    // ...and follows.
    let mut stream = Stream::open(&env, &base, &siem, "cursor=0").await.unwrap();
    let (listed, _) = stream.until("audit.query", Some(SIEM_CLIENT_ID)).await;
    assert_eq!(listed.last().unwrap()["details"]["action"], "list");
    let (followed, _) = stream.until("audit.query", Some(SIEM_CLIENT_ID)).await;
    assert_eq!(followed.last().unwrap()["details"]["action"], "follow");

    // An application without the auditor role is refused and recorded.
    let refused = read(other.clone()).await;
    assert_eq!((refused.status, refused.code()), (403, Some("not_an_auditor")));
    let refused = Stream::open(&env, &base, &other, "").await.err().unwrap();
    assert_eq!((refused.status, refused.code()), (403, Some("not_an_auditor")));
    let (denials, _) = stream.until("audit.query", Some(OTHER_APP_CLIENT_ID)).await;
    let denial = denials.last().unwrap();
    assert_eq!(
        (denial["outcome"].as_str(), denial["reason_code"].as_str()),
        (Some("denied"), Some("not_an_auditor"))
    );

    // No certificate for an application: not for the collector, not for the
    // one whose app role (`Talos.Reader`) grants people `os:reader`.
    for (token, client_id) in [(&siem, SIEM_CLIENT_ID), (&other, OTHER_APP_CLIENT_ID)] {
        let (status, body) = env.issue(token).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (403, Some("no_matching_rule")),
            "{body}"
        );
        let (denied, _) = stream.until("certificate.denied", Some(client_id)).await;
        let denied = denied.last().unwrap();
        assert_eq!(denied["reason_code"], "no_matching_rule");
        assert!(denied["serial"].is_null());
    }
    assert!(
        !records(&env)
            .await
            .iter()
            .any(|r| r.record.event == "certificate.issued"),
        "nothing was issued"
    );

    // An application's token is verified like any: audience, tenant, time.
    for (patch, code) in [
        (json!({"aud": "api://someone-else"}), "token_audience_invalid"),
        (
            json!({"tid": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"}),
            "token_tenant_not_allowed",
        ),
        (json!({"exp": 1_000_000_000}), "token_expired"),
    ] {
        let forged = env.emulator.app_token_with(SIEM_CLIENT_ID, patch).unwrap();
        let answer = read(forged).await;
        assert_eq!((answer.status, answer.code()), (401, Some(code)));
    }
    // A person's token from another client is still refused (`azp`).
    let elsewhere = env
        .emulator
        .token_with(
            "sam@example.com",
            TokenKind::Access { version: 2 },
            json!({"azp": SIEM_CLIENT_ID}),
        )
        .unwrap();
    let answer = read(elsewhere).await;
    assert_eq!(
        (answer.status, answer.code()),
        (401, Some("token_client_invalid"))
    );
    drop(stream);
    env.finish().await;
}

async fn a_stream_ends_when_its_token_expires_and_streams_are_capped(backend: Backend) {
    let env = feed_env(backend, ", max_streams: 1").await;
    let base = env.server.base_url.clone();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let short = env
        .emulator
        .app_token_with(SIEM_CLIENT_ID, json!({"exp": now + 3}))
        .unwrap();
    let mut stream = Stream::open(&env, &base, &short, "cursor=0").await.unwrap();
    stream.until("audit.query", Some(SIEM_CLIENT_ID)).await;

    // A token past its `exp` but within the leeway reads pages, yet opens no
    // stream that would end at once: it is refused, and recorded.
    let lapsed = env
        .emulator
        .app_token_with(SIEM_CLIENT_ID, json!({"exp": now - 10}))
        .unwrap();
    let refused = Stream::open(&env, &base, &lapsed, "").await.err().unwrap();
    assert_eq!((refused.status, refused.code()), (401, Some("token_expired")));
    let page = env
        .http
        .get(format!("{base}/v1/audit?limit=1"))
        .bearer_auth(&lapsed)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);

    // One stream at a time here: the second is refused while it runs.
    let siem = client_credentials(&env, SIEM_CLIENT_ID, SIEM_CLIENT_SECRET).await;
    let refused = Stream::open(&env, &base, &siem, "").await.err().unwrap();
    assert_eq!((refused.status, refused.code()), (429, Some("rate_limited")));

    // The stream ends at the token's expiry, saying so, with the cursor to
    // go on from.
    let last = stream.last().await;
    assert_eq!(last["end"], "token_expired", "{last}");
    let head = records(&env).await.last().unwrap().seq;
    assert!(last["cursor"].as_i64().unwrap() <= head);
    assert!(time::OffsetDateTime::now_utc().unix_timestamp() >= now + 3);

    // Its slot is free again: a fresh token goes on from the cursor.
    let cursor = last["cursor"].as_i64().unwrap();
    let mut again = Stream::open(&env, &base, &siem, &format!("cursor={cursor}"))
        .await
        .unwrap();
    let (seen, _) = again.until("audit.query", Some(SIEM_CLIENT_ID)).await;
    assert!(seen.iter().all(|r| r["seq"].as_i64().unwrap() > cursor));
    assert_eq!(
        seen.last().unwrap()["details"]["filter"]["cursor"],
        cursor.to_string()
    );
    drop(again);

    // A server that shuts down ends its streams, saying so, rather than
    // holding its shutdown until they are cut.
    let replica = env.another_server().await;
    let mut on_replica = Stream::open(&env, &replica.base_url, &siem, "").await.unwrap();
    on_replica.until("audit.query", Some(SIEM_CLIENT_ID)).await;
    let stopping = tokio::spawn(replica.stop());
    assert_eq!(on_replica.last().await["end"], "shutting_down");
    stopping.await.unwrap();
    env.finish().await;
}

/// Access taken away while a stream runs ends it: an auditor the reloaded
/// configuration no longer names at the stream's next read, a deny-listed
/// one within a poll interval. Each reconnection is refused, saying why;
/// the other auditors' streams go on.
async fn a_stream_ends_when_its_caller_is_no_longer_an_auditor(backend: Backend) {
    let env = TestEnv::start_from_file(backend, |yaml| feed_yaml(yaml, "")).await;
    let base = env.server.base_url.clone();
    let sam = env
        .emulator
        .token_for("sam@example.com", TokenKind::id())
        .unwrap();
    let siem = client_credentials(&env, SIEM_CLIENT_ID, SIEM_CLIENT_SECRET).await;
    let mut sams = Stream::open(&env, &base, &sam, "").await.unwrap();
    sams.until("audit.query", Some("sam@example.com")).await;
    let mut siems = Stream::open(&env, &base, &siem, "").await.unwrap();
    siems.until("audit.query", Some(SIEM_CLIENT_ID)).await;

    // The collector's app role is taken out of `auditors`.
    let file = env.config_file();
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("app_roles: [Talos.Auditor], ", "")).unwrap();
    env.server.app.reload(Trigger::Signal).await.unwrap();
    let last = siems.last().await;
    assert_eq!(last["end"], "access_revoked", "{last}");
    let refused = Stream::open(&env, &base, &siem, "").await.err().unwrap();
    assert_eq!((refused.status, refused.code()), (403, Some("not_an_auditor")));
    // Sam's stream goes on: the reload's record reaches it.
    sams.until("config.reloaded", None).await;

    // Sam is put on the deny list.
    deny_sam(&env, "investigation INC-9").await;
    let last = sams.last().await;
    assert_eq!(last["end"], "access_revoked", "{last}");
    let refused = Stream::open(&env, &base, &sam, "").await.err().unwrap();
    assert_eq!((refused.status, refused.code()), (403, Some("identity_denied")));
    env.finish().await;
}

/// An admin (alice) puts sam on the deny list.
async fn deny_sam(env: &TestEnv, reason: &str) {
    let alice = env
        .emulator
        .token_for("alice@example.com", TokenKind::id())
        .unwrap();
    let added = env
        .http
        .post(format!("{}/v1/deny", env.server.base_url))
        .bearer_auth(alice)
        .json(&json!({"subject": SAM_OID, "reason": reason}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
}

/// A deny list that cannot be read ends the stream (`audit_unavailable`)
/// rather than letting it go on unchecked.
#[tokio::test]
async fn a_stream_whose_deny_list_cannot_be_read_ends() {
    let env = feed_env(Backend::Sqlite, "").await;
    let siem = client_credentials(&env, SIEM_CLIENT_ID, SIEM_CLIENT_SECRET).await;
    let mut stream = Stream::open(&env, &env.server.base_url, &siem, "").await.unwrap();
    stream.until("audit.query", Some(SIEM_CLIENT_ID)).await;
    let talos_sso_server::audit::store::AuditStore::Sqlite(sqlite) = env.server.app.audit.store() else {
        panic!("a SQLite store")
    };
    let pool = sqlite.pool();
    // The file's owner drops the view the deny list is read through; the
    // trail itself stays readable.
    sqlx::raw_sql("DROP VIEW deny_list_active")
        .execute(pool)
        .await
        .unwrap();
    let last = stream.last().await;
    assert_eq!(last["end"], "audit_unavailable", "{last}");
    env.finish().await;
}

/// A stream whose client takes the answer's head and then reads nothing,
/// over a connection with a small receive buffer: once the backlog has
/// filled the buffers on the way, the server can send it nothing more.
async fn stalled_stream(base: &str, token: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address: std::net::SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(address).await.unwrap();
    let request = format!(
        "GET /v1/audit/stream?cursor=0 HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut byte))
            .await
            .expect("the stream's head within 30 s")
            .unwrap();
        assert_eq!(n, 1, "closed before the head: {}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stream
}

/// Wait until the server runs `count` streams, for at most `within`.
async fn until_running(env: &TestEnv, count: usize, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    while env.server.app.feeds.running() != count {
        assert!(
            std::time::Instant::now() < deadline,
            "{} streams still run, not {count}, after {within:?}",
            env.server.app.feeds.running()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Streams a client no longer reads end whatever it does: at the deny
/// list's next check (the stream frozen in its backlog, where it sends
/// nothing and so never looked again), and after `write_timeout` without
/// a line taken. One caller holds at most `max_streams_per_identity`;
/// others still get theirs.
#[tokio::test]
async fn stalled_streams_end_on_the_deny_list_and_the_write_timeout_and_callers_are_capped() {
    let env = feed_env(Backend::Sqlite, ", max_streams: 4, write_timeout: 25s").await;
    let base = env.server.base_url.clone();
    // A backlog of 15,000 records (about 15 MB of lines): more than the
    // buffers between the server and a client that does not read.
    talos_sso_tests::audit_seed::seed_store(env.server.app.audit.store(), 15_000, 3, 10).await;
    let sam = env
        .emulator
        .token_for("sam@example.com", TokenKind::id())
        .unwrap();
    let siem = client_credentials(&env, SIEM_CLIENT_ID, SIEM_CLIENT_SECRET).await;

    // One caller, two streams at most; another caller still gets one.
    let first = stalled_stream(&base, &siem).await;
    let second = stalled_stream(&base, &siem).await;
    let refused = Stream::open(&env, &base, &siem, "").await.err().unwrap();
    assert_eq!((refused.status, refused.code()), (429, Some("rate_limited")));
    assert!(
        refused.body["detail"].as_str().unwrap().contains("you"),
        "{:?}",
        refused.body
    );
    let frozen = stalled_stream(&base, &sam).await;
    assert_eq!(env.server.app.feeds.running(), 3);

    // Sam is put on the deny list: the frozen stream ends within a poll
    // interval or two (300 ms here), long before the write timeout.
    deny_sam(&env, "investigation INC-10").await;
    until_running(&env, 2, Duration::from_secs(10)).await;
    drop(frozen);

    // The collector's two streams take no line: cut after the write
    // timeout, and their slots are free again.
    until_running(&env, 0, Duration::from_secs(60)).await;
    drop((first, second));
    let mut again = Stream::open(&env, &base, &siem, "").await.unwrap();
    assert_eq!(again.line().await.unwrap()["seq"], 1);
    drop(again);
    env.finish().await;
}
