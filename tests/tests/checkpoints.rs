//! Signed checkpoints of the audit trail, on Postgres and on SQLite: when
//! they are signed (start, request, interval, shutdown) and where they go
//! (file, webhook, log, metrics); and what they catch that the hash chain
//! alone cannot: a record rewritten by the database owner with every later
//! hash recomputed, and records removed from the end. A checkpoint file
//! changed after signing fails verification.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use talos_sso_api::audit::{ChainStatus, StoredRecord};
use talos_sso_api::chain::chain;
use talos_sso_api::checkpoint::{Checkpoint, CheckpointKey, read_checkpoints, trigger};
use talos_sso_tests::emulator::TokenKind;
use talos_sso_tests::harness::{Answer, Backend, CheckpointFiles, TestEnv, config_yaml, server_cli};

on_both_stores!(
    checkpoints_are_signed_at_start_on_request_at_each_interval_and_at_shutdown,
    a_record_rewritten_with_every_later_hash_recomputed_is_named,
    records_removed_from_the_end_are_named,
    a_checkpoint_changed_or_signed_by_another_key_fails_verification,
    the_server_signs_nothing_over_a_contradicted_trail,
);

async fn start(backend: Backend, files: &CheckpointFiles, interval: &str, extra: &str) -> TestEnv {
    TestEnv::start_with(backend, |yaml| {
        format!("{}{extra}", files.configure(&yaml, interval, "talos-sso-test-1"))
    })
    .await
}

fn token(env: &TestEnv, user: &str) -> String {
    env.emulator.token_for(user, TokenKind::id()).unwrap()
}

async fn issue(env: &TestEnv, count: usize) {
    for _ in 0..count {
        let (status, body) = env.issue(&token(env, "bob@example.com")).await;
        assert_eq!(status, 201, "{body}");
    }
}

/// `POST /v1/audit/checkpoint` as `user`.
async fn sign_now(env: &TestEnv, user: &str) -> Answer {
    let response = env
        .http
        .post(format!("{}/v1/audit/checkpoint", env.server.base_url))
        .bearer_auth(token(env, user))
        .send()
        .await
        .unwrap();
    Answer::read(response).await
}

async fn verify_api(env: &TestEnv) -> ChainStatus {
    let response = env
        .http
        .get(format!("{}/v1/audit/verify", env.server.base_url))
        .bearer_auth(token(env, "sam@example.com"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// `talos-sso-server audit verify` with the environment's configuration,
/// plus `extra` lines.
async fn verify_cli(env: &TestEnv, files: &CheckpointFiles, extra: &str) -> Result<String, String> {
    let yaml = config_yaml(&env.emulator, &env.work, &env.database_url);
    let path = files.path().join("server.yaml");
    std::fs::write(
        &path,
        format!("{}{extra}", files.configure(&yaml, "1h", "talos-sso-test-1")),
    )
    .unwrap();
    server_cli(&["audit", "verify", "--config", path.to_str().unwrap()]).await
}

async fn records(env: &TestEnv) -> Vec<StoredRecord> {
    env.server.app.audit.store().page(0, 10_000).await.unwrap()
}

/// Run `sql` as the database owner can: with the append-only triggers
/// out of the way.
async fn as_owner(env: &TestEnv, sql: &str) {
    match env.backend {
        Backend::Postgres => {
            let db = env.database.as_ref().unwrap();
            db.superuser(&format!(
                "ALTER TABLE audit_events DISABLE TRIGGER USER; {sql}; ALTER TABLE audit_events ENABLE TRIGGER USER;"
            ))
            .await
            .unwrap();
        }
        Backend::Sqlite => {
            use sqlx::Connection;
            let mut conn = sqlx::SqliteConnection::connect(&env.database_url).await.unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP TRIGGER IF EXISTS audit_events_no_update; DROP TRIGGER IF EXISTS audit_events_no_delete; {sql};"
            )))
            .execute(&mut conn)
            .await
            .unwrap();
        }
    }
}

/// Give record `seq` another username and recompute every hash from it on,
/// as someone who owns the table and read docs/audit.md would.
async fn rewrite_from(env: &TestEnv, seq: i64) {
    let all = records(env).await;
    let mut previous = all.iter().find(|r| r.seq == seq - 1).cloned().unwrap();
    let mut statements = Vec::new();
    for stored in all.iter().filter(|r| r.seq >= seq) {
        let mut record = stored.record.clone();
        if stored.seq == seq {
            record.username = Some("mallory@example.com".into());
        }
        let rewritten = chain(previous.seq, &previous.hash, record);
        statements.push(format!(
            "UPDATE audit_events SET username = {}, prev_hash = '{}', hash = '{}' WHERE seq = {}",
            rewritten
                .record
                .username
                .as_deref()
                .map_or("NULL".to_owned(), |u| format!("'{u}'")),
            rewritten.prev_hash,
            rewritten.hash,
            rewritten.seq
        ));
        previous = rewritten;
    }
    as_owner(env, &statements.join("; ")).await;
}

async fn checkpoints_are_signed_at_start_on_request_at_each_interval_and_at_shutdown(backend: Backend) {
    // A webhook that keeps what it is sent.
    let received: Arc<Mutex<Vec<Checkpoint>>> = Arc::default();
    let kept = received.clone();
    let hook = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(checkpoint): axum::Json<Checkpoint>| {
            let kept = kept.clone();
            async move { kept.lock().unwrap().push(checkpoint) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, hook).await });

    let files = CheckpointFiles::new();
    let env = start(
        backend,
        &files,
        "1s",
        &format!("    webhook_url: \"{hook_url}\"\n"),
    )
    .await;
    let at_start = files.read();
    assert_eq!(at_start.len(), 1, "{at_start:?}");
    assert_eq!(
        (
            at_start[0].trigger.as_str(),
            at_start[0].seq,
            at_start[0].hash.as_str()
        ),
        (trigger::START, 0, talos_sso_api::chain::GENESIS_HASH)
    );
    assert_eq!(at_start[0].server, "talos-sso-test-1");

    issue(&env, 2).await;
    // On request: the request's own record (an `audit.query`) is covered.
    let signed = sign_now(&env, "sam@example.com").await;
    assert_eq!(signed.status, 200, "{:?}", signed.body);
    let signed: Checkpoint = serde_json::from_value(signed.body).unwrap();
    assert_eq!((signed.seq, signed.trigger.as_str()), (3, trigger::REQUEST));
    let third = &records(&env).await[2];
    assert_eq!(
        (third.record.event.as_str(), &third.hash),
        ("audit.query", &signed.hash)
    );
    let refused = sign_now(&env, "bob@example.com").await;
    assert_eq!((refused.status, refused.code()), (403, Some("not_an_auditor")));

    // At the interval: the refusal's record (4) gets covered...
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !files
        .read()
        .iter()
        .any(|c| c.trigger == trigger::INTERVAL && c.seq == 4)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no interval checkpoint: {:?}",
            files.read()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ...and an idle trail gets no more lines.
    let before = files.read().len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(files.read().len(), before, "{:?}", files.read());

    let metrics = env.metrics().await;
    assert!(
        metrics.contains("talos_sso_audit_checkpoint_last_seq 4"),
        "{metrics}"
    );
    assert!(
        metrics.contains("talos_sso_audit_checkpoint_failures_total 0"),
        "{metrics}"
    );

    // At shutdown: the head as the server leaves it.
    let head = records(&env).await.last().cloned().unwrap();
    let TestEnv { server, database, .. } = env;
    server.stop().await;
    let all = files.read();
    let last = all.last().unwrap();
    assert_eq!(
        (last.trigger.as_str(), last.seq, &last.hash),
        (trigger::SHUTDOWN, head.seq, &head.hash)
    );

    // Every line verifies with the public key, and the webhook got each.
    let key =
        CheckpointKey::from_pem(&std::fs::read_to_string(&files.public_key).unwrap(), "public key").unwrap();
    let file = std::fs::read_to_string(&files.file).unwrap();
    assert_eq!(read_checkpoints(file.as_bytes(), "file", &[key]).unwrap(), all);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while received.lock().unwrap().len() < all.len() {
        assert!(tokio::time::Instant::now() < deadline, "the webhook missed some");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut got = received.lock().unwrap().clone();
    got.sort_by_key(|c| (c.seq, c.signed_at));
    assert_eq!(got, all);
    if let Some(db) = database {
        db.drop_now().await;
    }
}

async fn a_record_rewritten_with_every_later_hash_recomputed_is_named(backend: Backend) {
    let files = CheckpointFiles::new();
    let env = start(backend, &files, "1h", "").await;
    issue(&env, 5).await;
    assert_eq!(sign_now(&env, "sam@example.com").await.status, 200); // covers 1..=6
    issue(&env, 2).await;
    let intact = verify_cli(&env, &files, "").await.unwrap();
    assert!(
        intact.contains("audit chain intact: 8 records verified, the newest is record 8"),
        "{intact}"
    );
    assert!(
        intact.contains("newest signed checkpoint matched: the one of records 1 to 6, signed by server `"),
        "{intact}"
    );
    assert!(
        intact.contains("2 records after it are not covered by a checkpoint yet"),
        "{intact}"
    );

    rewrite_from(&env, 3).await;
    // The chain alone cannot tell...
    let alone = env.server.app.audit.store().verify_chain().await.unwrap();
    assert_eq!((alone.verified, alone.first_broken), (8, None));
    // ...the checkpoint of record 6 can.
    let broken = verify_cli(&env, &files, "").await.unwrap_err();
    assert!(broken.contains("audit chain broken at record 6"), "{broken}");
    assert!(
        broken.contains("signed by talos-sso-test-1") && broken.contains("a record from 1 to 6 was changed"),
        "{broken}"
    );
    let status = verify_api(&env).await;
    let link = status.first_broken.unwrap();
    assert!(!status.intact);
    assert_eq!(
        (link.seq, link.checkpoint.map(|c| (c.seq, c.trigger))),
        (6, Some((6, trigger::REQUEST.into())))
    );
    env.finish().await;
}

async fn records_removed_from_the_end_are_named(backend: Backend) {
    let files = CheckpointFiles::new();
    let env = start(backend, &files, "1h", "").await;
    issue(&env, 3).await;
    assert_eq!(sign_now(&env, "sam@example.com").await.status, 200); // covers 1..=4
    as_owner(&env, "DELETE FROM audit_events WHERE seq >= 3").await;

    let alone = env.server.app.audit.store().verify_chain().await.unwrap();
    assert_eq!((alone.verified, alone.first_broken), (2, None));
    let broken = verify_cli(&env, &files, "").await.unwrap_err();
    assert!(
        broken.contains(
            "audit chain broken at record 3: records 3 to 4 are missing: the trail ends at record 2"
        ),
        "{broken}"
    );
    // Through the API, whose own record takes seq 3 again: record 4,
    // which the checkpoint covers, is still missing.
    let status = verify_api(&env).await;
    let link = status.first_broken.unwrap();
    assert_eq!(link.seq, 4);
    assert!(
        link.reason.starts_with("records 4 to 4 are missing"),
        "{}",
        link.reason
    );
    env.finish().await;
}

async fn a_checkpoint_changed_or_signed_by_another_key_fails_verification(backend: Backend) {
    let files = CheckpointFiles::new();
    let env = start(backend, &files, "1h", "").await;
    issue(&env, 2).await;
    assert_eq!(sign_now(&env, "sam@example.com").await.status, 200);
    assert!(verify_cli(&env, &files, "").await.is_ok());
    let original = std::fs::read_to_string(&files.file).unwrap();

    // A signed line edited to claim fewer records.
    let edited = original.replace(r#""seq":3,"#, r#""seq":2,"#);
    assert_ne!(edited, original);
    std::fs::write(&files.file, &edited).unwrap();
    let broken = verify_cli(&env, &files, "").await.unwrap_err();
    assert!(
        broken.contains("the checkpoints cannot be trusted")
            && broken.contains("line 2: the signature of the checkpoint of record 2 does not verify"),
        "{broken}"
    );
    let status = verify_api(&env).await;
    assert!(!status.intact && status.first_broken.unwrap().reason.contains("does not verify"));

    // A line signed with a key the server does not have.
    let other = CheckpointFiles::new();
    let stranger = talos_sso_server::audit::checkpoint::AuditKey::load(&other.key).unwrap();
    let forged = stranger
        .sign(
            "talos-sso-test-1",
            3,
            &"00".repeat(32),
            time::OffsetDateTime::now_utc(),
            "interval",
        )
        .unwrap();
    std::fs::write(&files.file, format!("{original}{}\n", forged.to_line())).unwrap();
    let broken = verify_cli(&env, &files, "").await.unwrap_err();
    assert!(broken.contains("is not one of the public keys given"), "{broken}");

    // After a key rotation, the old key's checkpoints still verify when its
    // public key is listed.
    std::fs::write(&files.file, format!("{original}{}\n", forged.to_line())).unwrap();
    let previous = format!("    previous_public_keys: [\"{}\"]\n", other.public_key.display());
    let broken = verify_cli(&env, &files, &previous).await.unwrap_err();
    assert!(
        broken.contains("record 3 does not have the hash the checkpoint"),
        "{broken}"
    );
    env.finish().await;
}

/// The structured log carries each checkpoint, so that log shipping keeps
/// a copy outside the server: `audit checkpoint` run as a command, with
/// JSON logs.
#[tokio::test]
async fn the_log_carries_each_checkpoint() {
    let files = CheckpointFiles::new();
    let env = start(Backend::Sqlite, &files, "1h", "").await;
    issue(&env, 1).await;
    let yaml = config_yaml(&env.emulator, &env.work, &env.database_url);
    let path = files.path().join("server.yaml");
    std::fs::write(
        &path,
        format!(
            "{}log: {{ format: json }}\n",
            files.configure(&yaml, "1h", "talos-sso-test-1")
        ),
    )
    .unwrap();
    let binary = talos_sso_tests::faults::server_binary().unwrap();
    let output = tokio::process::Command::new(binary)
        .args(["audit", "checkpoint", "--config", path.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stdout.starts_with("checkpoint signed: record 1 ("), "{stdout}");
    let logged: serde_json::Value = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["fields"]["message"] == "audit checkpoint signed")
        .unwrap_or_else(|| panic!("no checkpoint in the log: {stderr}"));
    let in_log: Checkpoint = serde_json::from_str(logged["fields"]["checkpoint"].as_str().unwrap()).unwrap();
    assert_eq!(Some(&in_log), files.read().last());
    assert_eq!((in_log.seq, in_log.trigger.as_str()), (1, trigger::COMMAND));
    env.finish().await;
}

/// `audit new-key` writes a key OpenSSL reads (PKCS#8 v1) and the public
/// key OpenSSL derives from it; a key OpenSSL made is an audit key too.
#[tokio::test]
async fn audit_keys_are_made_and_read_like_openssl_makes_and_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = (dir.path().join("audit.key"), dir.path().join("audit.pub"));
    let args = [
        "audit",
        "new-key",
        "--out-key",
        key.to_str().unwrap(),
        "--out-public",
        public.to_str().unwrap(),
    ];
    let made = server_cli(&args).await.unwrap();
    assert!(made.contains("(mode 0600)"), "{made}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(server_cli(&args).await.unwrap_err().contains("already exists"));
    let derived = std::process::Command::new("openssl")
        .args(["pkey", "-in", key.to_str().unwrap(), "-pubout"])
        .output()
        .unwrap();
    assert!(
        derived.status.success(),
        "{}",
        String::from_utf8_lossy(&derived.stderr)
    );
    assert_eq!(
        String::from_utf8(derived.stdout).unwrap(),
        std::fs::read_to_string(&public).unwrap()
    );

    let openssl_key = dir.path().join("openssl.key");
    let status = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "ed25519",
            "-out",
            openssl_key.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::set_permissions(&openssl_key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let loaded = talos_sso_server::audit::checkpoint::AuditKey::load(&openssl_key).unwrap();
    let checkpoint = loaded
        .sign(
            "s",
            1,
            &"ab".repeat(32),
            time::OffsetDateTime::now_utc(),
            "command",
        )
        .unwrap();
    // OpenSSL checks the signature over the documented bytes.
    let (message, signature) = (dir.path().join("message"), dir.path().join("signature"));
    std::fs::write(&message, checkpoint.signed_bytes()).unwrap();
    std::fs::write(&signature, hex::decode(&checkpoint.signature).unwrap()).unwrap();
    let verified = std::process::Command::new("openssl")
        .args([
            "pkeyutl",
            "-verify",
            "-inkey",
            openssl_key.to_str().unwrap(),
            "-rawin",
            "-in",
        ])
        .arg(&message)
        .arg("-sigfile")
        .arg(&signature)
        .output()
        .unwrap();
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stdout)
    );
}

/// A server without `audit.checkpoints` says so: `verify` reports no
/// coverage and the CLI says what that leaves open; a checkpoint asked for
/// is refused with its own code, and the refusal recorded.
#[tokio::test]
async fn a_server_without_checkpoints_says_so() {
    let env = TestEnv::start(Backend::Sqlite).await;
    issue(&env, 1).await;
    let refused = sign_now(&env, "sam@example.com").await;
    assert_eq!(
        (refused.status, refused.code()),
        (404, Some("checkpoints_not_configured"))
    );
    let last = records(&env).await.pop().unwrap();
    assert_eq!(
        (last.record.event.as_str(), last.record.reason_code.as_deref()),
        ("audit.query", Some("checkpoints_not_configured"))
    );
    let status = verify_api(&env).await;
    assert!(status.intact && status.checkpoints.is_none(), "{status:?}");
    let text = talos_sso_api::chain::describe(&status).unwrap();
    assert!(
        text.contains("no signed checkpoints: the chain alone cannot show"),
        "{text}"
    );
    env.finish().await;
}

/// The server never signs over a trail that no longer holds what its
/// last checkpoint signed: at start it refuses to start, at run time it
/// refuses to sign (counted). A checkpoint file cut short while written,
/// or an audit key that is a CA key, stop it at start too.
async fn the_server_signs_nothing_over_a_contradicted_trail(backend: Backend) {
    let files = CheckpointFiles::new();
    let env = start(backend, &files, "1h", "").await;
    issue(&env, 3).await;
    assert_eq!(sign_now(&env, "sam@example.com").await.status, 200); // covers 1..=4
    rewrite_from(&env, 2).await;
    // At run time: refused, counted, nothing appended.
    let lines = files.read().len();
    let refused = sign_now(&env, "sam@example.com").await;
    assert_eq!((refused.status, refused.code()), (503, Some("audit_unavailable")));
    assert_eq!(files.read().len(), lines);
    assert!(
        env.metrics()
            .await
            .contains("talos_sso_audit_checkpoint_failures_total 1"),
        "{}",
        env.metrics().await
    );
    // At start: refused, naming the checkpoint.
    let config = env.config();
    let error =
        talos_sso_server::server::Server::bind(config.clone(), Arc::new(talos_sso_server::app::SystemClock))
            .await
            .unwrap_err()
            .to_string();
    assert!(
        error.contains(
            "the audit trail contradicts the last checkpoint (record 4, signed by talos-sso-test-1"
        ),
        "{error}"
    );

    // A last line cut short (a crash while it was written).
    let text = std::fs::read_to_string(&files.file).unwrap();
    std::fs::write(&files.file, &text[..text.len() - 10]).unwrap();
    let error =
        talos_sso_server::server::Server::bind(config.clone(), Arc::new(talos_sso_server::app::SystemClock))
            .await
            .unwrap_err()
            .to_string();
    assert!(error.contains("its last line is cut short at byte"), "{error}");

    // The CA key as the audit key.
    let mut with_ca_key = config;
    let ca_key = std::fs::read_to_string(&env.work.ca_key).unwrap();
    let pkcs8 = ca_key.replace("ED25519 PRIVATE KEY", "PRIVATE KEY");
    let key_path = files.path().join("ca-as-audit.key");
    std::fs::write(&key_path, pkcs8).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let checkpoints = with_ca_key.audit.checkpoints.as_mut().unwrap();
    checkpoints.key_file = Some(key_path);
    checkpoints.file = files.path().join("fresh.jsonl");
    let error =
        talos_sso_server::server::Server::bind(with_ca_key, Arc::new(talos_sso_server::app::SystemClock))
            .await
            .unwrap_err()
            .to_string();
    assert!(
        error.contains("audit.checkpoints.key_file is the CA key of cluster `prod`"),
        "{error}"
    );
    env.finish().await;
}

/// SQLite keeps times, lists and details as text: another text of the
/// same value (a time with an offset, a duplicate key) keeps the hash while
/// SQL and readers of the table see something else. Such a row is refused
/// as corrupt, and verify fails.
#[tokio::test]
async fn sqlite_rows_in_another_text_form_are_refused() {
    let env = TestEnv::start(Backend::Sqlite).await;
    issue(&env, 2).await;
    let store = env.server.app.audit.store();
    for (tamper, expected, undo) in [
        (
            "UPDATE audit_events SET occurred_at = replace(occurred_at, 'Z', '+00:00') WHERE seq = 1",
            "occurred_at",
            "UPDATE audit_events SET occurred_at = replace(occurred_at, '+00:00', 'Z') WHERE seq = 1",
        ),
        (
            "UPDATE audit_events SET details = '{\"reason\":\"x\",\"reason\":\"y\"}' WHERE seq = 2",
            "details: not in the form the server writes",
            "UPDATE audit_events SET details = '{}' WHERE seq = 2",
        ),
    ] {
        as_owner(&env, tamper).await;
        let error = store.verify_chain().await.unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
        as_owner(&env, undo).await;
        assert_eq!(store.verify_chain().await.unwrap().first_broken, None);
    }
    env.finish().await;
}

/// A webhook that refuses checkpoints is counted, never fatal; and
/// `audit verify --checkpoints FILE` checks copies kept elsewhere: a
/// rewritten trail is caught by a copy even when the configured file was
/// emptied.
#[tokio::test]
async fn a_refusing_webhook_is_counted_and_copies_of_the_checkpoints_are_checked() {
    let refusing = axum::Router::new().route(
        "/hook",
        axum::routing::post(|| async { axum::http::StatusCode::SERVICE_UNAVAILABLE }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, refusing).await });
    let files = CheckpointFiles::new();
    let env = start(
        Backend::Sqlite,
        &files,
        "1h",
        &format!("    webhook_url: \"{hook_url}\"\n"),
    )
    .await;
    issue(&env, 2).await;
    assert_eq!(sign_now(&env, "sam@example.com").await.status, 200);
    // The start and the request checkpoint were both refused by the webhook.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !env
        .metrics()
        .await
        .contains("talos_sso_audit_checkpoint_webhook_failures_total 2")
    {
        assert!(tokio::time::Instant::now() < deadline, "{}", env.metrics().await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(files.read().len(), 2, "the file holds both all the same");

    let copy = files.path().join("copy.jsonl");
    std::fs::copy(&files.file, &copy).unwrap();
    rewrite_from(&env, 2).await;
    std::fs::write(&files.file, "").unwrap();
    assert!(
        verify_cli(&env, &files, "")
            .await
            .unwrap()
            .contains("audit chain intact")
    );
    let yaml = config_yaml(&env.emulator, &env.work, &env.database_url);
    let path = files.path().join("with-copy.yaml");
    std::fs::write(&path, files.configure(&yaml, "1h", "talos-sso-test-1")).unwrap();
    let broken = server_cli(&[
        "audit",
        "verify",
        "--config",
        path.to_str().unwrap(),
        "--checkpoints",
        copy.to_str().unwrap(),
    ])
    .await
    .unwrap_err();
    assert!(broken.contains("audit chain broken at record 3"), "{broken}");
    env.finish().await;
}
