//! The server end to end: real HTTP, a real database per test (Postgres, and
//! the same suite on SQLite), the Entra emulator, the Talos checker.

use std::collections::HashSet;
use std::sync::Arc;

use base64::Engine;
use serde_json::{Value, json};
use talos_sso::key::ClientKey;
use talos_sso_server::app::{SystemClock, open_store};
use talos_sso_server::audit::{GENESIS_HASH, StoredRecord};
use talos_sso_server::cli::Cli;
use talos_sso_server::config::Config;
use talos_sso_server::server::Server;
use talos_sso_tests::emulator::{
    CLI_CLIENT_ID, EmulatorConfig, EmulatorHandle, Faults, GROUP_ONCALL, TENANT_ID, TokenKind,
};
use talos_sso_tests::harness::{Answer, Backend, TestEnv, Workdir, config_yaml};
use talos_sso_tests::talos_checker;

use clap::Parser;

on_both_stores!(
    issues_a_certificate_talos_accepts_and_records_every_field,
    every_denial_has_its_code_one_audit_row_and_no_certificate,
    tampering_is_named_by_audit_verify,
    audit_api_answers_auditors_only_and_records_each_query,
    the_deny_list_blocks_at_once_and_every_change_is_recorded,
    a_deny_entry_with_an_expiry_blocks_until_then_and_can_be_renewed,
    a_username_is_resolved_only_through_the_login_issuers_verified_records,
);

async fn post(env: &TestEnv, base_url: &str, token: Option<&str>, body: Value) -> Answer {
    let mut request = env
        .http
        .post(format!("{base_url}/v1/certificates"))
        .header("user-agent", "talos-sso-tests/1.0")
        .header("x-talos-sso-client-version", "0.1.0-test")
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    Answer::read(request.send().await.unwrap()).await
}

fn body(csr: &str, roles: &[&str]) -> Value {
    json!({"cluster": "prod", "csr": csr, "roles": roles})
}

async fn records(env: &TestEnv) -> Vec<StoredRecord> {
    env.server.app.audit.store().page(0, 10_000).await.unwrap()
}

async fn assert_chain_intact(env: &TestEnv) {
    let check = env.server.app.audit.store().verify_chain().await.unwrap();
    assert!(check.first_broken.is_none(), "{check:?}");
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}

async fn issues_a_certificate_talos_accepts_and_records_every_field(backend: Backend) {
    let env = TestEnv::start(backend).await;
    let key = ClientKey::generate().unwrap();
    let token = env
        .emulator
        .token_for("bob@example.com", TokenKind::id())
        .unwrap();
    let answer = post(
        &env,
        &env.server.base_url,
        Some(&token),
        body(&key.csr_pem().unwrap(), &[]),
    )
    .await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let b = &answer.body;
    assert_eq!(b["roles"], json!(["os:operator"]));
    assert_eq!(
        (b["cluster"].as_str(), b["context"].as_str()),
        (Some("prod"), Some("prod"))
    );
    assert_eq!(b["endpoints"], json!(["127.0.0.1"]));
    assert_eq!(b["identity"]["username"], "bob@example.com");

    // Talos accepts it, with the roles policy granted.
    let accepted = talos_checker::handshake(
        b["ca"].as_str().unwrap(),
        b["certificate"].as_str().unwrap(),
        &key.private_key_pem(),
    )
    .unwrap();
    assert_eq!(accepted.roles, ["os:operator"]);

    // One audit row holding every field of the record (docs/audit.md).
    let rows = records(&env).await;
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    let r = &row.record;
    let claims = talos_sso_server::identity::token::unverified_claims(&token).unwrap();
    let leaf = talos_sso_server::ca::parse_certificates(b["certificate"].as_str().unwrap(), "answer")
        .unwrap()
        .remove(0);
    assert_eq!((row.seq, row.prev_hash.as_str()), (1, GENESIS_HASH));
    assert_eq!(b["audit_id"], json!(row.seq));
    assert_eq!(r.request_id, answer.request_id);
    assert_eq!(
        (r.event.as_str(), r.outcome.as_str(), r.reason_code.as_deref()),
        ("certificate.issued", "success", None)
    );
    assert_eq!(r.cluster.as_deref(), Some("prod"));
    assert_eq!(r.issuer.as_deref(), Some(env.emulator.issuer().as_str()));
    assert_eq!(r.tenant.as_deref(), claims["tid"].as_str());
    assert_eq!(r.subject.as_deref(), claims["oid"].as_str());
    assert_eq!(r.username.as_deref(), Some("bob@example.com"));
    assert!(r.identity_verified);
    assert_eq!(r.groups_evaluated, [GROUP_ONCALL]);
    assert!(r.roles_requested.is_empty());
    assert_eq!(r.roles_granted, ["os:operator"]);
    assert_eq!(r.serial.as_deref(), b["serial"].as_str());
    assert_eq!(
        r.certificate_sha256.as_deref(),
        Some(sha256_hex(&leaf.der).as_str())
    );
    let spki = der::Encode::to_der(&key.public_key_info().unwrap()).unwrap();
    assert_eq!(r.public_key_sha256.as_deref(), Some(sha256_hex(&spki).as_str()));
    assert_eq!(
        r.not_before
            .map(talos_sso_server::audit::format_micros)
            .as_deref(),
        b["not_before"].as_str()
    );
    assert_eq!(
        r.not_after.map(talos_sso_server::audit::format_micros).as_deref(),
        b["not_after"].as_str()
    );
    assert_eq!(
        r.not_after.unwrap() - r.not_before.unwrap(),
        time::Duration::minutes(10),
        "5 min skew + 5 min TTL"
    );
    assert_eq!(r.client_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(r.user_agent.as_deref(), Some("talos-sso-tests/1.0"));
    assert_eq!(r.client_version.as_deref(), Some("0.1.0-test"));
    assert_eq!(r.token_id.as_deref(), claims["uti"].as_str());
    assert_eq!(
        r.token_issued_at.map(|t| t.unix_timestamp()),
        claims["iat"].as_i64()
    );
    assert_eq!(
        row.hash,
        talos_sso_server::audit::record_hash(row.seq, r, &row.prev_hash)
    );
    let check = env.server.app.audit.store().verify_chain().await.unwrap();
    assert_eq!((check.verified, check.first_broken), (1, None));
    env.finish().await;
}

async fn every_denial_has_its_code_one_audit_row_and_no_certificate(backend: Backend) {
    let env = TestEnv::start(backend).await;
    let client_key = ClientKey::generate().unwrap();
    let csr = client_key.csr_pem().unwrap();
    let token = |user: &str| env.emulator.token_for(user, TokenKind::id()).unwrap();
    let expired = {
        env.emulator.set_clock_offset(-7200);
        let t = token("bob@example.com");
        env.emulator.set_clock_offset(0);
        t
    };
    // The CSR with one bit of its signature flipped.
    let mut tampered_der = client_key.csr_der().unwrap();
    *tampered_der.last_mut().unwrap() ^= 1;
    let tampered_csr = talos_sso_server::x509::pem_encode("CERTIFICATE REQUEST", &tampered_der);
    let foreign_audience = env
        .emulator
        .token_with("bob@example.com", TokenKind::id(), json!({"aud": "someone-else"}))
        .unwrap();

    // (token, body, expected status, expected code)
    let cases: Vec<(Option<String>, Value, u16, &str)> = vec![
        (None, body(&csr, &[]), 401, "token_missing"),
        (Some("not-a-jwt".into()), body(&csr, &[]), 401, "token_malformed"),
        (Some(expired), body(&csr, &[]), 401, "token_expired"),
        (
            Some(foreign_audience),
            body(&csr, &[]),
            401,
            "token_audience_invalid",
        ),
        (
            Some(token("dave@example.com")),
            body(&csr, &[]),
            403,
            "no_matching_rule",
        ),
        (
            Some(token("bob@example.com")),
            body(&csr, &["os:admin"]),
            403,
            "role_not_permitted",
        ),
        (
            Some(token("alice@example.com")),
            body(&csr, &[]),
            403,
            "role_required",
        ),
        (
            Some(token("bob@example.com")),
            json!({"cluster": "prod", "csr": csr, "ttl_seconds": 3600}),
            400,
            "ttl_too_long",
        ),
        (
            Some(token("bob@example.com")),
            body(&tampered_csr, &[]),
            400,
            "csr_invalid",
        ),
        (
            Some(token("bob@example.com")),
            json!({"cluster": "staging", "csr": csr}),
            404,
            "cluster_unknown",
        ),
        (
            Some(token("bob@example.com")),
            json!({"cluster": "prod"}),
            400,
            "request_invalid",
        ),
    ];
    for (i, (token, request, status, code)) in cases.iter().enumerate() {
        let answer = post(&env, &env.server.base_url, token.as_deref(), request.clone()).await;
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (*status, Some(*code)),
            "case {i}: {}",
            answer.body
        );
        assert_eq!(answer.content_type, "application/problem+json");
        assert_eq!(answer.body["request_id"], json!(answer.request_id));
        assert!(answer.body.get("certificate").is_none());
        let rows = records(&env).await;
        assert_eq!(rows.len(), i + 1, "case {i}: one row per decision");
        let last = &rows[i].record;
        assert_eq!(
            (last.event.as_str(), last.outcome.as_str()),
            ("certificate.denied", "denied")
        );
        assert_eq!(last.reason_code.as_deref(), Some(*code));
        assert_eq!(last.request_id, answer.request_id);
        assert!(last.serial.is_none() && last.roles_granted.is_empty());
    }
    let rows = records(&env).await;
    // A refused token's claimed identity is recorded, marked unverified.
    assert_eq!(rows[2].record.username.as_deref(), Some("bob@example.com"));
    assert!(!rows[2].record.identity_verified);
    assert!(rows[4].record.identity_verified);
    assert_eq!(rows[5].record.roles_requested, ["os:admin"]);
    let denial = post(
        &env,
        &env.server.base_url,
        Some(&token("bob@example.com")),
        body(&csr, &["os:admin"]),
    )
    .await;
    assert_eq!(denial.body["entitled"], json!(["os:operator"]));
    let csr_denial = post(
        &env,
        &env.server.base_url,
        Some(&token("bob@example.com")),
        body(&tampered_csr, &[]),
    )
    .await;
    assert_eq!(csr_denial.body["reason"], "csr_signature_invalid");

    // Replay: the same token mints once.
    let once = token("carol@example.com");
    let first = post(&env, &env.server.base_url, Some(&once), body(&csr, &[])).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let second = post(&env, &env.server.base_url, Some(&once), body(&csr, &[])).await;
    assert_eq!(
        (second.status, second.body["code"].as_str()),
        (401, Some("token_replayed"))
    );
    let last = records(&env).await.pop().unwrap().record;
    assert_eq!(last.reason_code.as_deref(), Some("token_replayed"));
    assert!(last.serial.is_none());

    // Group overage that Graph cannot resolve.
    env.emulator.set_faults(Faults {
        graph_unavailable: true,
        ..Default::default()
    });
    let overage = post(
        &env,
        &env.server.base_url,
        Some(&token("erin@example.com")),
        body(&csr, &[]),
    )
    .await;
    assert_eq!(
        (overage.status, overage.body["code"].as_str()),
        (403, Some("groups_overage_unresolved"))
    );
    env.emulator.set_faults(Faults::default());
    // ...and resolved once Graph is back (250 groups, one of them on-call).
    let resolved = post(
        &env,
        &env.server.base_url,
        Some(&token("erin@example.com")),
        body(&csr, &[]),
    )
    .await;
    assert_eq!(
        (resolved.status, resolved.body["roles"].clone()),
        (201, json!(["os:operator"]))
    );

    let check = env.server.app.audit.store().verify_chain().await.unwrap();
    assert!(check.first_broken.is_none());
    assert_eq!(check.verified as usize, records(&env).await.len());
    env.finish().await;
}

#[tokio::test]
async fn database_outage_answers_503_then_recovers_without_restart() {
    let env = TestEnv::start(Backend::Postgres).await;
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let token = || {
        env.emulator
            .token_for("bob@example.com", TokenKind::id())
            .unwrap()
    };
    assert_eq!(
        post(&env, &env.server.base_url, Some(&token()), body(&csr, &[]))
            .await
            .status,
        201
    );

    let database = env.database.as_ref().unwrap();
    database.cut().await;
    let down = post(&env, &env.server.base_url, Some(&token()), body(&csr, &[])).await;
    assert_eq!(
        (down.status, down.body["code"].as_str()),
        (503, Some("audit_unavailable")),
        "{}",
        down.body
    );
    assert!(down.body.get("certificate").is_none());
    assert!(
        !down.body["detail"].as_str().unwrap().contains("connection"),
        "no internals in 5xx: {}",
        down.body
    );
    let ready = env
        .http
        .get(format!("{}/readyz", env.server.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);

    database.restore().await;
    let back = post(&env, &env.server.base_url, Some(&token()), body(&csr, &[])).await;
    assert_eq!(back.status, 201, "{}", back.body);
    let rows = records(&env).await;
    assert_eq!(
        rows.len(),
        2,
        "nothing was recorded, or issued, while the database was down"
    );
    assert_chain_intact(&env).await;
    env.finish().await;
}

fn write_config(env: &TestEnv) -> std::path::PathBuf {
    let path = env.work.path().join("server.yaml");
    let text = talos_sso_tests::harness::config_yaml(&env.emulator, &env.work, &env.database_url);
    std::fs::write(&path, text).unwrap();
    path
}

async fn cli(args: &[&str]) -> Result<String, String> {
    talos_sso_tests::harness::server_cli(args).await
}

async fn tampering_is_named_by_audit_verify(backend: Backend) {
    let env = TestEnv::start(backend).await;
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    for user in ["bob@example.com", "carol@example.com", "dave@example.com"] {
        let token = env.emulator.token_for(user, TokenKind::id()).unwrap();
        post(&env, &env.server.base_url, Some(&token), body(&csr, &[])).await;
    }
    let config = write_config(&env);
    let config = config.to_str().unwrap();
    let ok = cli(&["audit", "verify", "--config", config]).await.unwrap();
    assert!(ok.contains("audit chain intact: 3 records verified"), "{ok}");

    // The database itself refuses changes...
    match backend {
        Backend::Postgres => {
            let db = env.database.as_ref().unwrap();
            let update = db
                .superuser("UPDATE audit_events SET username = 'mallory' WHERE seq = 2")
                .await;
            assert!(update.unwrap_err().to_string().contains("append-only"));
            assert!(
                db.superuser("DELETE FROM audit_events WHERE seq = 3")
                    .await
                    .unwrap_err()
                    .to_string()
                    .contains("append-only")
            );
            assert!(
                db.superuser("TRUNCATE audit_events")
                    .await
                    .unwrap_err()
                    .to_string()
                    .contains("append-only")
            );
            // ...unless a superuser disables the trigger, which the chain shows.
            db.superuser(
                "ALTER TABLE audit_events DISABLE TRIGGER audit_events_append_only; \
                 UPDATE audit_events SET roles_granted = ARRAY['os:admin'] WHERE seq = 2; \
                 ALTER TABLE audit_events ENABLE TRIGGER audit_events_append_only;",
            )
            .await
            .unwrap();
        }
        Backend::Sqlite => {
            let path = env.work.path().join("audit.db");
            let url = format!("sqlite://{}", path.display());
            use sqlx::Connection;
            let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
            let update = sqlx::query("UPDATE audit_events SET username = 'mallory' WHERE seq = 2")
                .execute(&mut conn)
                .await;
            assert!(update.unwrap_err().to_string().contains("append-only"));
            let delete = sqlx::query("DELETE FROM audit_events WHERE seq = 3")
                .execute(&mut conn)
                .await;
            assert!(delete.unwrap_err().to_string().contains("append-only"));
            sqlx::raw_sql(
                "DROP TRIGGER audit_events_no_update; \
                 UPDATE audit_events SET roles_granted = '[\"os:admin\"]' WHERE seq = 2;",
            )
            .execute(&mut conn)
            .await
            .unwrap();
        }
    }
    let broken = cli(&["audit", "verify", "--config", config]).await.unwrap_err();
    assert!(broken.contains("audit chain broken at record 2"), "{broken}");
    assert!(broken.contains("1 records before it verified"), "{broken}");
    env.finish().await;
}

/// `count` issuances spread over `servers`, `concurrency` at a time; returns
/// the tokens used and the serials issued.
async fn issue_many(
    env: &TestEnv,
    servers: &[String],
    count: usize,
    concurrency: usize,
) -> (Vec<String>, Vec<String>) {
    let users = ["bob@example.com", "carol@example.com"];
    let tokens: Vec<String> = (0..count)
        .map(|i| env.emulator.token_for(users[i % 2], TokenKind::id()).unwrap())
        .collect();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = Vec::new();
    for (i, token) in tokens.iter().cloned().enumerate() {
        let url = format!("{}/v1/certificates", servers[i % servers.len()]);
        let http = env.http.clone();
        let permit = semaphore.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = permit.acquire_owned().await.unwrap();
            let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
            let response = http
                .post(url)
                .bearer_auth(token)
                .json(&json!({"cluster": "prod", "csr": csr}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap();
            (status, body)
        }));
    }
    let mut serials = Vec::new();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 201, "{body}");
        serials.push(body["serial"].as_str().unwrap().to_owned());
    }
    (tokens, serials)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_postgres_issue_400_with_one_valid_chain() {
    let env = TestEnv::start(Backend::Postgres).await;
    let second = env.another_server().await;
    let servers = [env.server.base_url.clone(), second.base_url.clone()];
    let (tokens, serials) = issue_many(&env, &servers, 400, 64).await;
    assert_eq!(serials.len(), 400);
    assert_eq!(
        serials.iter().collect::<HashSet<_>>().len(),
        400,
        "unique serials"
    );
    let rows = records(&env).await;
    assert_eq!(rows.len(), 400);
    assert_eq!(
        rows.iter()
            .filter(|r| r.record.event == "certificate.issued")
            .count(),
        400
    );
    let check = env.server.app.audit.store().verify_chain().await.unwrap();
    assert_eq!((check.verified, check.first_broken), (400, None));

    // Replays, across replicas: refused and recorded, the chain still whole.
    for (i, token) in tokens.iter().take(20).enumerate() {
        let base = &servers[(i + 1) % 2];
        let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
        let answer = post(&env, base, Some(token), body(&csr, &[])).await;
        assert_eq!(answer.body["code"], "token_replayed");
    }
    let check = env.server.app.audit.store().verify_chain().await.unwrap();
    assert_eq!((check.verified, check.first_broken), (420, None));
    second.stop().await;
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_issues_400_concurrently_with_one_valid_chain() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let servers = [env.server.base_url.clone()];
    let (_, serials) = issue_many(&env, &servers, 400, 64).await;
    assert_eq!(serials.iter().collect::<HashSet<_>>().len(), 400);
    let check = env.server.app.audit.store().verify_chain().await.unwrap();
    assert_eq!((check.verified, check.first_broken), (400, None));
    let stats = env.server.app.audit.stats();
    let batches = stats.batches.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        batches < 400,
        "group commit: {batches} transactions for 400 records"
    );
    env.finish().await;
}

#[tokio::test]
async fn info_health_readiness_and_request_ids() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let base = &env.server.base_url;
    let info: Value = env
        .http
        .get(format!("{base}/v1/info"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["issuer"], json!(env.emulator.issuer()));
    assert_eq!(info["clusters"][0]["name"], "prod");
    assert_eq!(info["clusters"][0]["max_ttl_seconds"], 900);
    assert_eq!(
        env.http
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let ready: Value = env
        .http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["ready"], true);

    // A well-formed caller id is kept; anything else is replaced.
    let kept = env
        .http
        .post(format!("{base}/v1/certificates"))
        .header("x-request-id", "trace-0123456789")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(kept.headers()["x-request-id"], "trace-0123456789");
    let replaced = env
        .http
        .post(format!("{base}/v1/certificates"))
        .header("x-request-id", "bad id!")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_ne!(replaced.headers()["x-request-id"], "bad id!");
    // Oversized bodies are refused before anything else.
    let huge = "x".repeat(100 * 1024);
    let too_big = env
        .http
        .post(format!("{base}/v1/certificates"))
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(too_big.status(), 413);
    let unknown = env.http.get(format!("{base}/v2/nothing")).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    env.finish().await;
}

/// The `prod-break-glass` context of a break-glass talosconfig: what the
/// Talos stand-in accepts of it, and its certificate chain (PEM).
fn break_glass_context(talosconfig: &str) -> (talos_checker::Accepted, String) {
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(talosconfig).unwrap();
    let context = &yaml["contexts"]["prod-break-glass"];
    let field = |name: &str| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(context[name].as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };
    let accepted = talos_checker::handshake(&field("ca"), &field("crt"), &field("key")).unwrap();
    (accepted, field("crt"))
}

#[tokio::test]
async fn break_glass_writes_a_talosconfig_and_an_audit_record() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let config = write_config(&env);
    let config = config.to_str().unwrap();
    let out = env.work.path().join("break-glass.yaml");
    let out_str = out.to_str().unwrap();

    let no_reason = cli(&[
        "break-glass",
        "--config",
        config,
        "--cluster",
        "prod",
        "--role",
        "os:admin",
        "--reason",
        "  ",
        "--out",
        out_str,
    ])
    .await;
    assert!(no_reason.unwrap_err().contains("a reason is required"));
    let too_long = cli(&[
        "break-glass",
        "--config",
        config,
        "--cluster",
        "prod",
        "--role",
        "os:admin",
        "--ttl",
        "1h",
        "--reason",
        "IdP down",
        "--out",
        out_str,
    ])
    .await;
    assert!(too_long.unwrap_err().contains("max_ttl"));
    let not_grantable = cli(&[
        "break-glass",
        "--config",
        config,
        "--cluster",
        "prod",
        "--role",
        "os:impersonator",
        "--reason",
        "IdP down",
        "--out",
        out_str,
    ])
    .await
    .unwrap_err();
    assert!(
        not_grantable.contains("no rule of cluster `prod` grants `os:impersonator`"),
        "{not_grantable}"
    );
    assert!(!out.exists());

    let done = talos_sso_tests::harness::break_glass_admin(config, "Entra outage INC-4711", &out)
        .await
        .unwrap();
    assert!(done.contains("context prod-break-glass"), "{done}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let (accepted, _) = break_glass_context(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(accepted.roles, ["os:admin"]);

    let rows = records(&env).await;
    let last = &rows.last().unwrap().record;
    assert_eq!(last.event, "break_glass.issued");
    assert_eq!(last.details["reason"], "Entra outage INC-4711");
    assert!(last.details["operator"].is_string() && last.details["host"].is_string());
    // Who ran it comes from the kernel, not from `$USER`.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(last.details["uid"], uid);
    assert_eq!(last.roles_granted, ["os:admin"]);
    assert!(last.username.as_deref().unwrap().starts_with("break-glass:"));

    // `--out -`: the talosconfig alone on standard output, its record
    // committed first, no file made.
    let printed = cli(&[
        "break-glass",
        "--config",
        config,
        "--cluster",
        "prod",
        "--role",
        "os:operator",
        "--reason",
        "Entra outage INC-4712",
        "--out",
        "-",
    ])
    .await
    .unwrap();
    assert!(!std::path::Path::new("-").exists(), "no file named `-`");
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&printed).unwrap();
    let keys: Vec<&str> = yaml
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(keys, ["context", "contexts"], "{printed}");
    assert_eq!(yaml["context"], "prod-break-glass");
    let (accepted, crt) = break_glass_context(&printed);
    assert_eq!(accepted.roles, ["os:operator"]);
    let after = records(&env).await;
    assert_eq!(after.len(), rows.len() + 1);
    let last = &after.last().unwrap().record;
    assert_eq!(
        (last.event.as_str(), last.details["reason"].as_str()),
        ("break_glass.issued", Some("Entra outage INC-4712"))
    );
    let leaf = talos_sso_server::ca::parse_certificates(&crt, "break-glass")
        .unwrap()
        .remove(0);
    assert_eq!(
        last.certificate_sha256.as_deref(),
        Some(sha256_hex(&leaf.der).as_str()),
        "the record names the certificate printed"
    );
    assert_chain_intact(&env).await;
    env.finish().await;
}

/// The binary as `kubectl exec` runs it in the image (no shell, read-only
/// root): `--out -` puts the talosconfig alone on standard output and
/// what is said about it on standard error; `--version` answers.
#[tokio::test]
async fn the_binary_prints_break_glass_on_stdout_and_its_version() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let config = write_config(&env);
    let binary = talos_sso_tests::faults::server_binary().unwrap();
    let version = tokio::process::Command::new(&binary)
        .arg("--version")
        .output()
        .await
        .unwrap();
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout),
        format!(
            "talos-sso-server {} (commit {})\n",
            env!("CARGO_PKG_VERSION"),
            talos_sso_server::REVISION
        )
    );
    let output = tokio::process::Command::new(&binary)
        .args(["break-glass", "--config", config.to_str().unwrap()])
        .args(["--cluster", "prod", "--role", "os:operator", "--ttl", "5m"])
        .args(["--reason", "Entra outage INC-4713", "--out", "-"])
        .current_dir(env.work.path())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(!env.work.path().join("-").exists());
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&stdout).unwrap();
    assert_eq!(yaml["context"], "prod-break-glass", "{stdout}");
    let context = &yaml["contexts"]["prod-break-glass"];
    assert!(
        ["ca", "crt", "key"].iter().all(|k| context[*k].is_string()),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .all(|l| !l.contains("wrote") && !l.contains("audit record")),
        "{stdout}"
    );
    assert!(
        stderr.contains("wrote the talosconfig to standard output (context prod-break-glass)"),
        "{stderr}"
    );
    let last = records(&env).await.pop().unwrap();
    assert_eq!(last.record.event, "break_glass.issued");
    assert!(stderr.contains(&format!("audit record {}", last.seq)), "{stderr}");
    env.finish().await;
}

#[tokio::test]
async fn serves_tls_from_the_configured_certificate() {
    let scratch = tempfile::tempdir().unwrap();
    let (ca_pem, cert, key) = talos_sso_tests::harness::tls_files(scratch.path());
    let tls = format!(
        "tls: {{ cert_file: \"{}\", key_file: \"{}\", reload_interval: 100ms }}",
        cert.display(),
        key.display()
    );
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| yaml.replace("insecure_http: true", &tls)).await;
    assert!(env.server.base_url.starts_with("https://"));
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    let info: Value = client
        .get(format!("{}/v1/info", env.server.base_url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["api_version"], 1);
    // Plain HTTP to the TLS port gets nowhere.
    let plain = env
        .http
        .get(env.server.base_url.replace("https://", "http://") + "/healthz")
        .send()
        .await;
    assert!(plain.map(|r| !r.status().is_success()).unwrap_or(true));
    // The metrics name the expiry of the certificate served.
    let tls_not_after = |client: &reqwest::Client| {
        let (client, url) = (client.clone(), format!("{}/metrics", env.server.base_url));
        async move {
            let text = client.get(url).send().await.unwrap().text().await.unwrap();
            let name = "talos_sso_tls_certificate_not_after_timestamp_seconds ";
            let value = text.lines().find_map(|l| l.strip_prefix(name));
            value
                .unwrap_or_else(|| panic!("no {name}in\n{text}"))
                .parse::<i64>()
                .unwrap()
        }
    };
    let file_not_after = || {
        let pem = std::fs::read_to_string(&cert).unwrap();
        let leaf = talos_sso_server::ca::parse_certificates(&pem, "tls")
            .unwrap()
            .remove(0);
        leaf.not_after().unix_timestamp()
    };
    let first = file_not_after();
    assert_eq!(tls_not_after(&client).await, first);
    // A renewed certificate (from another CA) is picked up without a
    // restart. Made a second later at least, its expiry is a later second.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (new_ca_pem, _, _) = talos_sso_tests::harness::tls_files(scratch.path());
    let second = file_not_after();
    assert!(second > first);
    let renewed = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(new_ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut served_new = false;
    while !served_new && std::time::Instant::now() < deadline {
        served_new = renewed
            .get(format!("{}/healthz", env.server.base_url))
            .send()
            .await
            .is_ok();
        if !served_new {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    assert!(served_new, "the new certificate is served");
    assert_eq!(
        tls_not_after(&renewed).await,
        second,
        "the metrics follow the reload"
    );
    // A new connection from a client that trusts only the old CA fails now
    // (the first client's kept-alive connection would still work).
    let old_ca_only = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    assert!(
        old_ca_only
            .get(format!("{}/healthz", env.server.base_url))
            .send()
            .await
            .is_err(),
        "the old CA no longer matches"
    );
    env.finish().await;
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let env = TestEnv::start(Backend::Sqlite).await;
    // Erin's groups come from Graph, which is slow today: her request is in
    // flight when the server is told to stop.
    env.emulator.set_faults(Faults {
        delay: std::time::Duration::from_millis(800),
        ..Default::default()
    });
    let token = env
        .emulator
        .token_for("erin@example.com", TokenKind::id())
        .unwrap();
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let url = format!("{}/v1/certificates", env.server.base_url);
    let http = env.http.clone();
    let in_flight = tokio::spawn(async move {
        http.post(url)
            .bearer_auth(token)
            .json(&json!({"cluster": "prod", "csr": csr}))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    // Wait (bounded) until the request has reached Graph: it is in flight.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while env.emulator.counters().graph_member_objects == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        env.emulator.counters().graph_member_objects,
        1,
        "the request is in flight"
    );
    let TestEnv {
        server,
        work: _work,
        emulator: _emulator,
        ..
    } = env;
    let app = server.app.clone();
    server.stop().await;
    assert_eq!(
        in_flight.await.unwrap(),
        201,
        "the request that was in flight completed"
    );
    let rows = app.audit.store().page(0, 10).await.unwrap();
    assert_eq!(rows.len(), 1, "and its audit record was written");
}

/// The order of a stop matters: the refusals counted since the last window
/// are recorded while the audit writer still takes records, and the writer
/// drains before `run_until_stopped` returns, so the counts are in the trail
/// once the server has stopped.
#[tokio::test]
async fn a_stop_records_the_refusal_counts_before_the_writer_drains() {
    let emulator = EmulatorHandle::start(EmulatorConfig::default()).await.unwrap();
    let work = Workdir::new();
    let database_url = format!("sqlite://{}", work.path().join("audit.db").display());
    let config = Config::from_yaml(&config_yaml(&emulator, &work, &database_url)).unwrap();
    // No handle on the app is kept here, as in `serve`: the stop drains the writer.
    let server = Server::bind(config.clone(), Arc::new(SystemClock)).await.unwrap();
    let url = format!("{}/v1/certificates", server.url());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();
    for _ in 0..4 {
        let refused = http
            .post(&url)
            .json(&json!({"cluster": "prod", "csr": "not a CSR"}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 401);
    }
    stop.send(()).unwrap();
    running.await.unwrap();
    let store = open_store(&config, false).await.unwrap();
    let rows = store.page(0, 100).await.unwrap();
    store.close().await;
    let trail: Vec<(&str, Option<&str>)> = rows
        .iter()
        .map(|r| (r.record.event.as_str(), r.record.reason_code.as_deref()))
        .collect();
    assert_eq!(
        trail,
        [
            ("certificate.denied", Some("token_missing")),
            ("refusals.aggregated", Some("token_missing")),
        ],
        "the first refusal in full, then the count of the others"
    );
    assert_eq!(rows[1].record.details["count"], 3);
}

#[tokio::test]
async fn rate_limits_apply_per_address_and_per_identity() {
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        yaml.replace(
            "rate_limits: { per_identity_per_minute: 0, per_address_per_minute: 0 }",
            "rate_limits: { per_identity_per_minute: 2, per_address_per_minute: 5 }",
        )
    })
    .await;
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let token = |user: &str| env.emulator.token_for(user, TokenKind::id()).unwrap();
    for _ in 0..2 {
        assert_eq!(
            post(
                &env,
                &env.server.base_url,
                Some(&token("bob@example.com")),
                body(&csr, &[])
            )
            .await
            .status,
            201
        );
    }
    let limited = post(
        &env,
        &env.server.base_url,
        Some(&token("bob@example.com")),
        body(&csr, &[]),
    )
    .await;
    assert_eq!(
        (limited.status, limited.body["code"].as_str()),
        (429, Some("rate_limited")),
        "{}",
        limited.body
    );
    assert!(limited.body["retry_after_seconds"].as_u64().unwrap() >= 1);
    let last = records(&env).await.pop().unwrap().record;
    assert_eq!(
        (last.reason_code.as_deref(), last.username.as_deref()),
        (Some("rate_limited"), Some("bob@example.com"))
    );
    assert!(last.identity_verified);
    // Another person has a quota of their own...
    for _ in 0..2 {
        assert_eq!(
            post(
                &env,
                &env.server.base_url,
                Some(&token("carol@example.com")),
                body(&csr, &[])
            )
            .await
            .status,
            201
        );
    }
    // ...but the address has used its 5 requests.
    let by_address = post(
        &env,
        &env.server.base_url,
        Some(&token("alice@example.com")),
        body(&csr, &["os:admin"]),
    )
    .await;
    assert_eq!(
        (by_address.status, by_address.body["code"].as_str()),
        (429, Some("rate_limited"))
    );
    assert!(
        by_address.body["detail"]
            .as_str()
            .unwrap()
            .contains("this address")
    );
    // Rate-limited refusals are counted, not recorded one by one: bob's
    // was the first of its kind from this address in this window.
    let before = records(&env).await.len();
    let raw = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .bearer_auth(token("carol@example.com"))
        .body(body(&csr, &[]).to_string())
        .send()
        .await
        .unwrap();
    assert!(raw.headers().get("retry-after").is_some());
    assert_eq!(records(&env).await.len(), before);
    env.server.app.record_refusals().await;
    let summary = records(&env).await.pop().unwrap().record;
    assert_eq!(
        (summary.event.as_str(), summary.reason_code.as_deref()),
        ("refusals.aggregated", Some("rate_limited"))
    );
    assert_eq!(summary.details["count"], 2, "alice's and carol's");
    // Each refusal is counted by the limit that made it.
    let text = env.metrics().await;
    let mut limited: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("talos_sso_rate_limited_total"))
        .collect();
    limited.sort_unstable();
    assert_eq!(
        limited,
        [
            r#"talos_sso_rate_limited_total{limit="address"} 2"#,
            r#"talos_sso_rate_limited_total{limit="identity"} 1"#,
        ],
        "{text}"
    );
    assert_chain_intact(&env).await;
    env.finish().await;
}

async fn audit_api_answers_auditors_only_and_records_each_query(backend: Backend) {
    let env = TestEnv::start(backend).await;
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let token = |user: &str| env.emulator.token_for(user, TokenKind::id()).unwrap();
    post(
        &env,
        &env.server.base_url,
        Some(&token("bob@example.com")),
        body(&csr, &[]),
    )
    .await;
    post(
        &env,
        &env.server.base_url,
        Some(&token("alice@example.com")),
        body(&csr, &["os:admin"]),
    )
    .await;
    post(
        &env,
        &env.server.base_url,
        Some(&token("dave@example.com")),
        body(&csr, &[]),
    )
    .await;
    let get = |path: String, user: &str| {
        let http = env.http.clone();
        let bearer = token(user);
        async move {
            let response = http.get(path).bearer_auth(bearer).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let base = &env.server.base_url;

    // Not an auditor: refused, and the attempt is recorded.
    let (status, refused) = get(format!("{base}/v1/audit"), "bob@example.com").await;
    assert_eq!((status, refused["code"].as_str()), (403, Some("not_an_auditor")));
    let last = records(&env).await.pop().unwrap().record;
    assert_eq!(
        (last.event.as_str(), last.outcome.as_str()),
        ("audit.query", "denied")
    );

    // Who had os:admin on prod in the last day?
    let (status, admins) = get(
        format!("{base}/v1/audit?since=1d&cluster=prod&role=os:admin&outcome=success"),
        "sam@example.com",
    )
    .await;
    assert_eq!(status, 200, "{admins}");
    let found = admins["records"].as_array().unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0]["username"], "alice@example.com");
    assert_eq!(found[0]["roles_granted"], json!(["os:admin"]));
    // Denials, by user; and time windows that match nothing.
    let (_, dave) = get(
        format!("{base}/v1/audit?username=dave@example.com&outcome=denied"),
        "sam@example.com",
    )
    .await;
    assert_eq!(dave["records"][0]["reason_code"], "no_matching_rule");
    let (_, future) = get(
        format!("{base}/v1/audit?since=2099-01-01T00:00:00Z"),
        "sam@example.com",
    )
    .await;
    assert!(future["records"].as_array().unwrap().is_empty());
    // Pages: a cursor continues where the last page stopped.
    let (_, first) = get(format!("{base}/v1/audit?limit=2"), "sam@example.com").await;
    assert_eq!(first["records"].as_array().unwrap().len(), 2);
    let cursor = first["next_cursor"].as_i64().unwrap();
    let (_, second) = get(
        format!("{base}/v1/audit?limit=2&cursor={cursor}"),
        "sam@example.com",
    )
    .await;
    assert_eq!(second["records"][0]["seq"].as_i64().unwrap(), cursor + 1);
    // Each query is itself on the record, with its filter.
    let queries = records(&env)
        .await
        .into_iter()
        .filter(|r| r.record.event == "audit.query")
        .count();
    assert_eq!(queries, 6);
    let last = records(&env).await.pop().unwrap().record;
    assert_eq!(
        (last.username.as_deref(), last.details["filter"]["limit"].as_str()),
        (Some("sam@example.com"), Some("2"))
    );
    // Bad input is refused.
    let (status, bad) = get(format!("{base}/v1/audit?since=last-tuesday"), "sam@example.com").await;
    assert_eq!((status, bad["code"].as_str()), (400, Some("request_invalid")));
    let (status, verify) = get(format!("{base}/v1/audit/verify"), "sam@example.com").await;
    assert_eq!((status, verify["intact"].clone()), (200, json!(true)), "{verify}");
    env.finish().await;
}

async fn the_deny_list_blocks_at_once_and_every_change_is_recorded(backend: Backend) {
    let env = TestEnv::start(backend).await;
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let token = |user: &str| env.emulator.token_for(user, TokenKind::id()).unwrap();
    let base = &env.server.base_url;
    let send = |method: reqwest::Method, path: String, user: &str, body: Option<Value>| {
        let mut request = env.http.request(method, path).bearer_auth(token(user));
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };

    // Bob has logged in before: the trail knows his subject.
    let before = post(&env, base, Some(&token("bob@example.com")), body(&csr, &[])).await;
    assert_eq!(before.status, 201, "{}", before.body);
    // Alice (platform admins) blocks Bob by username, any case: the entry
    // names the subject that username belongs to.
    let (status, added) = send(
        reqwest::Method::POST,
        format!("{base}/v1/deny"),
        "alice@example.com",
        Some(json!({"username": "Bob@Example.com", "reason": "laptop stolen, INC-42"})),
    )
    .await;
    assert_eq!(status, 201, "{added}");
    let change = records(&env).await.pop().unwrap().record;
    assert_eq!(
        (change.event.as_str(), change.username.as_deref()),
        ("deny.added", Some("alice@example.com"))
    );
    assert_eq!(change.details["target_username"], "bob@example.com");
    assert_eq!(
        change.details["target_subject"],
        "b2000000-0000-4000-8000-000000000002"
    );
    assert_eq!(change.details["entries_changed"], 1);

    // Bob's group still grants os:operator, but nothing is issued.
    let blocked = post(&env, base, Some(&token("bob@example.com")), body(&csr, &[])).await;
    assert_eq!(
        (blocked.status, blocked.body["code"].as_str()),
        (403, Some("identity_denied")),
        "{}",
        blocked.body
    );
    assert!(blocked.body.get("certificate").is_none());
    let last = records(&env).await.pop().unwrap().record;
    assert_eq!(
        (last.reason_code.as_deref(), last.serial.as_deref()),
        (Some("identity_denied"), None)
    );

    let (_, listed) = send(
        reqwest::Method::GET,
        format!("{base}/v1/deny"),
        "alice@example.com",
        None,
    )
    .await;
    assert_eq!(listed["entries"][0]["username"], "bob@example.com");
    assert_eq!(listed["entries"][0]["added_by"], "alice@example.com");
    // Only admins may look or change, and a reason is required.
    let (status, refused) = send(
        reqwest::Method::GET,
        format!("{base}/v1/deny"),
        "bob@example.com",
        None,
    )
    .await;
    assert_eq!((status, refused["code"].as_str()), (403, Some("not_an_admin")));
    let (status, _) = send(
        reqwest::Method::POST,
        format!("{base}/v1/deny"),
        "alice@example.com",
        Some(json!({"username": "carol@example.com"})),
    )
    .await;
    assert_eq!(status, 400);

    // Removed: Bob gets certificates again.
    let (status, removed) = send(
        reqwest::Method::DELETE,
        format!("{base}/v1/deny?username=bob@example.com"),
        "alice@example.com",
        None,
    )
    .await;
    assert_eq!((status, removed["removed"].clone()), (200, json!(1)));
    assert_eq!(records(&env).await.pop().unwrap().record.event, "deny.removed");
    let again = post(&env, base, Some(&token("bob@example.com")), body(&csr, &[])).await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_chain_intact(&env).await;
    env.finish().await;
}

#[tokio::test]
async fn metrics_count_decisions_latency_and_ca_expiry() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let token = |user: &str| env.emulator.token_for(user, TokenKind::id()).unwrap();
    assert_eq!(
        post(
            &env,
            &env.server.base_url,
            Some(&token("bob@example.com")),
            body(&csr, &[])
        )
        .await
        .status,
        201
    );
    assert_eq!(
        post(
            &env,
            &env.server.base_url,
            Some(&token("dave@example.com")),
            body(&csr, &[])
        )
        .await
        .status,
        403
    );
    let response = env
        .http
        .get(format!("{}/metrics", env.server.base_url))
        .send()
        .await
        .unwrap();
    // Asked for `*/*` (reqwest's default): the classic text format.
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = response.text().await.unwrap();
    for expected in [
        r#"talos_sso_certificates_issued_total{cluster="prod"} 1"#,
        r#"talos_sso_role_grants_total{cluster="prod",role="os:operator"} 1"#,
        r#"talos_sso_requests_denied_total{cluster="prod",reason="no_matching_rule"} 1"#,
        "talos_sso_issuance_duration_seconds_count 2",
        "talos_sso_audit_write_failures_total 0",
        r#"talos_sso_ca_not_after_timestamp_seconds{cluster="prod"} "#,
        "# TYPE talos_sso_certificates_issued_total counter",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    // A key refresh shows up as it happens.
    env.emulator.rotate_keys().unwrap();
    assert_eq!(
        post(
            &env,
            &env.server.base_url,
            Some(&token("bob@example.com")),
            body(&csr, &[])
        )
        .await
        .status,
        201
    );
    let text = env
        .http
        .get(format!("{}/metrics", env.server.base_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"talos_sso_jwks_refreshes_total{result="ok"} 1"#),
        "{text}"
    );
    env.finish().await;
}

#[tokio::test]
async fn check_and_migrate_report_what_they_find() {
    let env = TestEnv::start(Backend::Postgres).await;
    let config = write_config(&env);
    let config_str = config.to_str().unwrap();
    let ok = cli(&["check", "--config", config_str]).await.unwrap();
    assert!(ok.contains("cluster prod: cluster-ca mode, CA O=talos ("), "{ok}");
    // Neither accepted-CA mode's line nor a rotation's.
    assert!(
        !ok.contains("talosconfigs verify apid with") && !ok.contains("next CA"),
        "{ok}"
    );
    assert!(
        ok.contains("policy examples: 2 passed") && ok.contains("audit database: reachable"),
        "{ok}"
    );
    // The identity provider and Graph, as `serve` will meet them.
    assert!(
        ok.contains(&format!(
            "identity provider: {} answers (discovery, 2 signing keys from",
            env.emulator.issuer()
        )),
        "{ok}"
    );
    assert!(
        ok.contains("Microsoft Graph: the server's credentials are accepted"),
        "{ok}"
    );
    let original = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        original.replace(&env.emulator.issuer(), "http://127.0.0.1:9/nowhere/v2.0"),
    )
    .unwrap();
    let no_idp = cli(&["check", "--config", config_str]).await.unwrap_err();
    assert!(
        no_idp.contains("identity provider") && no_idp.contains("127.0.0.1:9"),
        "{no_idp}"
    );
    std::fs::write(&config, original.clone()).unwrap();
    std::fs::write(&env.work.graph_secret, "a wrong secret").unwrap();
    let bad_graph = cli(&["check", "--config", config_str]).await.unwrap_err();
    assert!(
        bad_graph.contains("Microsoft Graph (identity.entra_graph): Graph refused the server's credentials"),
        "{bad_graph}"
    );
    std::fs::write(
        &env.work.graph_secret,
        talos_sso_tests::emulator::SERVER_APP_SECRET,
    )
    .unwrap();

    // `serve` refuses a bad configuration before it takes the port: with
    // the port held by someone else, the CA is what it complains about.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let broken_ca = original
        .replace(
            "listen: \"127.0.0.1:0\"",
            &format!("listen: \"127.0.0.1:{port}\""),
        )
        .replace(&env.work.ca_key.display().to_string(), "/nonexistent/ca.key");
    std::fs::write(&config, broken_ca).unwrap();
    let refused = cli(&["serve", "--config", config_str]).await.unwrap_err();
    assert!(refused.contains("CA refused"), "{refused}");
    assert!(!refused.contains("cannot listen"), "{refused}");
    drop(held);
    std::fs::write(&config, original).unwrap();

    let migrated = cli(&["migrate", "--config", config_str]).await.unwrap();
    assert!(
        migrated.contains("audit database (postgres) is up to date"),
        "{migrated}"
    );

    // A policy example the rules contradict stops `check` (and `serve`) with both outcomes named.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("expect_denied: role_required", "expect_roles: [os:admin]");
    std::fs::write(&config, text).unwrap();
    let failed = cli(&["check", "--config", config_str]).await.unwrap_err();
    assert!(
        failed.contains("policy example `admins must ask for admin` expected roles [os:admin] but got denial `role_required`"),
        "{failed}"
    );
    // An unreachable database is named.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace(&env.database_url, "postgres://postgres@127.0.0.1:9/none");
    std::fs::write(
        &config,
        text.replace("expect_roles: [os:admin]", "expect_denied: role_required"),
    )
    .unwrap();
    let unreachable = cli(&["check", "--config", config_str]).await.unwrap_err();
    assert!(unreachable.contains("audit database"), "{unreachable}");
    env.finish().await;
}

#[tokio::test]
async fn ca_new_and_intermediate_write_private_files_and_refuse_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let made = cli(&[
        "ca",
        "new",
        "--out-cert",
        &path("root.crt"),
        "--out-key",
        &path("root.key"),
        "--key-type",
        "ecdsa-p256",
    ])
    .await
    .unwrap();
    assert!(made.contains("key type:    ECDSA P-256"), "{made}");
    use std::os::unix::fs::PermissionsExt;
    let mode = |name: &str| {
        std::fs::metadata(dir.path().join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!((mode("root.key"), mode("root.crt")), (0o600, 0o644));
    // Never overwrite.
    let again = cli(&[
        "ca",
        "new",
        "--out-cert",
        &path("root.crt"),
        "--out-key",
        &path("other.key"),
    ])
    .await
    .unwrap_err();
    assert!(
        again.contains("already exists; refusing to overwrite it"),
        "{again}"
    );
    assert!(!dir.path().join("other.key").exists());

    let inter = cli(&[
        "ca",
        "intermediate",
        "--cert-file",
        &path("root.crt"),
        "--key-file",
        &path("root.key"),
        "--validity",
        "30d",
        "--out-cert",
        &path("inter.crt"),
        "--out-key",
        &path("inter.key"),
    ])
    .await
    .unwrap();
    assert!(
        inter.contains("intermediate, then the Talos root") && inter.contains("days left:   29"),
        "{inter}"
    );
    let inspected = cli(&[
        "ca",
        "inspect",
        "--cert-file",
        &path("inter.crt"),
        "--key-file",
        &path("inter.key"),
    ])
    .await
    .unwrap();
    assert!(
        inspected.contains("mode:        intermediate; Talos root:"),
        "{inspected}"
    );
    // An intermediate cannot make another one (path length 0).
    let nested = cli(&[
        "ca",
        "intermediate",
        "--cert-file",
        &path("inter.crt"),
        "--key-file",
        &path("inter.key"),
        "--validity",
        "1d",
        "--out-cert",
        &path("nested.crt"),
        "--out-key",
        &path("nested.key"),
    ])
    .await
    .unwrap_err();
    assert!(nested.contains("needs the Talos root CA material"), "{nested}");
    // Two sources at once are refused by the argument parser itself.
    let both = Cli::try_parse_from([
        "talos-sso-server",
        "ca",
        "inspect",
        "--cert-file",
        "a",
        "--key-file",
        "b",
        "--secrets-bundle",
        "c",
    ]);
    assert!(both.is_err());
}

/// An entry added for a while blocks until then, shows its expiry, drops
/// out of the list when it ends, and the identity can be blocked again.
async fn a_deny_entry_with_an_expiry_blocks_until_then_and_can_be_renewed(backend: Backend) {
    let env = TestEnv::start(backend).await;
    let base = &env.server.base_url;
    let token = |user: &str| env.emulator.token_for(user, TokenKind::id()).unwrap();
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let add = |expires_at: time::OffsetDateTime| {
        let request = env
            .http
            .post(format!("{base}/v1/deny"))
            .bearer_auth(token("alice@example.com"))
            .json(&json!({
                "subject": "b2000000-0000-4000-8000-000000000002",
                "reason": "investigation INC-7",
                "expires_at": talos_sso_api::audit::format_micros(expires_at),
            }));
        async move {
            let response = request.send().await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    let list = || async {
        env.http
            .get(format!("{base}/v1/deny"))
            .bearer_auth(token("alice@example.com"))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    // In the past, or too far ahead: refused, and recorded as such.
    let now = time::OffsetDateTime::now_utc();
    for wrong in [now - time::Duration::minutes(1), now + time::Duration::days(4000)] {
        let (status, refused) = add(wrong).await;
        assert_eq!(
            (status, refused["code"].as_str()),
            (400, Some("request_invalid")),
            "{refused}"
        );
    }
    assert_eq!(list().await["entries"], json!([]));

    let until = time::OffsetDateTime::now_utc() + time::Duration::seconds(3);
    let (status, added) = add(until).await;
    assert_eq!(status, 201, "{added}");
    let expected = talos_sso_api::audit::format_micros(talos_sso_api::audit::truncate_to_micros(until));
    assert_eq!(added["entry"]["expires_at"], expected);
    let record = records(&env).await.pop().unwrap().record;
    assert_eq!(
        (record.event.as_str(), record.details["expires_at"].as_str()),
        ("deny.added", Some(expected.as_str()))
    );
    assert_eq!(list().await["entries"][0]["expires_at"], expected);
    let blocked = post(&env, base, Some(&token("bob@example.com")), body(&csr, &[])).await;
    assert_eq!(blocked.body["code"], "identity_denied", "{}", blocked.body);

    // Ended: it blocks nothing and is no longer listed.
    let left = until - time::OffsetDateTime::now_utc();
    tokio::time::sleep(
        std::time::Duration::try_from(left).unwrap_or_default() + std::time::Duration::from_millis(200),
    )
    .await;
    let after = post(&env, base, Some(&token("bob@example.com")), body(&csr, &[])).await;
    assert_eq!(after.status, 201, "{}", after.body);
    assert_eq!(list().await["entries"], json!([]));
    // The ended entry does not keep a new one out.
    let (status, again) = add(time::OffsetDateTime::now_utc() + time::Duration::hours(8)).await;
    assert_eq!(status, 201, "{again}");
    let blocked = post(&env, base, Some(&token("bob@example.com")), body(&csr, &[])).await;
    assert_eq!(blocked.body["code"], "identity_denied", "{}", blocked.body);
    env.finish().await;
}

/// `deny add --user` names a subject only through verified records of the
/// login issuer: another trusted issuer's tokens, and tokens that failed
/// verification, may claim any username, and must not decide whom an entry
/// blocks.
async fn a_username_is_resolved_only_through_the_login_issuers_verified_records(backend: Backend) {
    // A second directory, trusted as plain OpenID Connect (a workload
    // issuer): it names its subjects with whatever username it likes.
    let ci = EmulatorHandle::start(EmulatorConfig {
        alternate_keys: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let trusted = format!(
        "identity:\n  kind: entra\n  trusted_issuers:\n    - {{ name: ci, kind: oidc, issuer: \"{}\", audiences: [\"{CLI_CLIENT_ID}\"] }}\n",
        ci.issuer()
    );
    let env = TestEnv::start_with(backend, |yaml| yaml.replace("identity:\n", &trusted)).await;
    let base = &env.server.base_url;
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let login = |user: &str, patch: Value| env.emulator.token_with(user, TokenKind::id(), patch).unwrap();
    let deny_by_name = |username: &str| {
        let request = env
            .http
            .post(format!("{base}/v1/deny"))
            .bearer_auth(login("alice@example.com", json!({})))
            .json(&json!({"username": username, "reason": "INC-9"}));
        async move { Answer::read(request.send().await.unwrap()).await }
    };

    // Before Carol ever logs in, her username is claimed twice: by the
    // trusted issuer's verified token (refused a certificate, but recorded
    // as verified), and by a token of the login issuer that fails
    // verification (expired) naming another subject.
    let squatter = ci.token_for("carol@example.com", TokenKind::id()).unwrap();
    let claimed = post(&env, base, Some(&squatter), body(&csr, &[])).await;
    assert_eq!(claimed.status, 403, "{}", claimed.body);
    let forged = login(
        "carol@example.com",
        json!({"oid": "c3000000-0000-4000-8000-0000000000ff", "exp": 1_000_000_000}),
    );
    assert_eq!(post(&env, base, Some(&forged), body(&csr, &[])).await.status, 401);
    let claims: Vec<(bool, Option<String>, Option<String>)> = records(&env)
        .await
        .into_iter()
        .filter(|r| r.record.username.as_deref() == Some("carol@example.com"))
        .map(|r| (r.record.identity_verified, r.record.issuer, r.record.subject))
        .collect();
    assert_eq!(claims.len(), 2, "{claims:?}");
    assert!(
        claims.contains(&(true, Some(ci.issuer()), claims[0].2.clone())),
        "{claims:?}"
    );
    assert!(
        claims.contains(&(
            false,
            Some(env.emulator.issuer()),
            Some("c3000000-0000-4000-8000-0000000000ff".into())
        )),
        "{claims:?}"
    );
    // Neither names Carol: her subject is unknown, nothing is added.
    let unknown = deny_by_name("Carol@Example.com").await;
    assert_eq!(
        (unknown.status, unknown.code()),
        (400, Some("subject_required")),
        "{}",
        unknown.body
    );
    assert!(env.server.app.audit.store().deny_list().await.unwrap().is_empty());

    // Once she has logged in, her username is hers.
    let carol = post(
        &env,
        base,
        Some(&login("carol@example.com", json!({}))),
        body(&csr, &[]),
    )
    .await;
    assert_eq!(carol.status, 201, "{}", carol.body);
    let added = deny_by_name("carol@example.com").await;
    assert_eq!(added.status, 201, "{}", added.body);
    assert_eq!(
        added.body["entry"]["subject"],
        "c3000000-0000-4000-8000-000000000003"
    );
    let blocked = post(
        &env,
        base,
        Some(&login("carol@example.com", json!({}))),
        body(&csr, &[]),
    )
    .await;
    assert_eq!((blocked.status, blocked.code()), (403, Some("identity_denied")));

    // Two subjects of the login issuer with one username: the admin is
    // asked which, each named with its tenant, and nothing is added.
    let dave = login("dave@example.com", json!({}));
    let other_dave = login(
        "dave@example.com",
        json!({"oid": "d4000000-0000-4000-8000-0000000000ff"}),
    );
    for token in [&dave, &other_dave] {
        let answer = post(&env, base, Some(token), body(&csr, &[])).await;
        assert!(answer.status == 201 || answer.status == 403, "{}", answer.body);
    }
    let ambiguous = deny_by_name("dave@example.com").await;
    assert_eq!(
        (ambiguous.status, ambiguous.code()),
        (409, Some("subject_ambiguous")),
        "{}",
        ambiguous.body
    );
    assert_eq!(
        ambiguous.body["subjects"],
        json!([
            "d4000000-0000-4000-8000-000000000004",
            "d4000000-0000-4000-8000-0000000000ff"
        ]),
        "{}",
        ambiguous.body
    );
    let detail = ambiguous.body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(&format!(
            "d4000000-0000-4000-8000-000000000004 (tenant {TENANT_ID})"
        )),
        "{detail}"
    );
    assert_eq!(env.server.app.audit.store().deny_list().await.unwrap().len(), 1);

    // More subjects than the answer lists, with long names: the list is
    // cut at ten, and the detail, cut at its limit, still begins with what
    // to do.
    for i in 0..9 {
        let long = format!("d5{i:02}{}", "0".repeat(196));
        let token = login("dave@example.com", json!({"oid": long}));
        let answer = post(&env, base, Some(&token), body(&csr, &[])).await;
        assert!(answer.status == 201 || answer.status == 403, "{}", answer.body);
    }
    let cut = deny_by_name("dave@example.com").await;
    assert_eq!(
        (cut.status, cut.code()),
        (409, Some("subject_ambiguous")),
        "{}",
        cut.body
    );
    let subjects = cut.body["subjects"].as_array().cloned().unwrap_or_default();
    assert_eq!(subjects.len(), 10, "{}", cut.body);
    assert_eq!(subjects[0], "d4000000-0000-4000-8000-000000000004");
    let detail = cut.body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with(
            "`dave@example.com` has been used by at least 10 different subjects of the login issuer; \
             name the `subject` to block. Candidates: d4000000-0000-4000-8000-000000000004 (tenant "
        ),
        "{detail}"
    );
    // Cut: the limit's characters and the mark, not the tenth subject.
    assert_eq!(
        detail.chars().count(),
        talos_sso_text::REASON_CHARS + 1,
        "{detail}"
    );
    assert!(detail.ends_with('…'), "{detail}");
    assert!(!detail.contains("d507"), "{detail}");
    assert_eq!(env.server.app.audit.store().deny_list().await.unwrap().len(), 1);
    assert_chain_intact(&env).await;
    env.finish().await;
}
