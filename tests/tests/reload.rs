//! Configuration reload without a restart: a changed file (and a changed
//! cluster file) is applied to the next request, recorded and counted; a
//! bad one is refused and the running configuration keeps serving; SIGHUP
//! reloads the real binary.

use std::time::{Duration, Instant};

use serde_json::Value;
use talos_sso_api::audit::event;
use talos_sso_server::app::reload::Trigger;
use talos_sso_server::audit::StoredRecord;
use talos_sso_tests::emulator::{GROUP_ONCALL, GROUP_SECURITY, TENANT_ID, TokenKind};
use talos_sso_tests::harness::{Backend, TestEnv, json_of};

/// A group of erin's, who is in too many for her token to carry them (so
/// the server asks Graph, and keeps only the groups some rule names).
const ERIN_GROUP: &str = "9a9a9a9a-0000-4000-8000-000000000007";

/// Ask for `roles` on `cluster` as `user`: the status and the error code.
async fn ask(env: &TestEnv, user: &str, cluster: &str, roles: &[&str]) -> (u16, String) {
    let token = env.emulator.token_for(user, TokenKind::id()).expect("token");
    let csr = talos_sso::key::ClientKey::generate()
        .and_then(|k| k.csr_pem())
        .expect("csr");
    let response = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .bearer_auth(token)
        .json(&serde_json::json!({"cluster": cluster, "csr": csr, "roles": roles}))
        .send()
        .await
        .expect("answer");
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    (status, body["code"].as_str().unwrap_or_default().to_owned())
}

/// The value of a metric line, e.g. `talos_sso_config_reloads_total{result="ok"}`.
fn metric(text: &str, line: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line).and_then(|rest| rest.trim().parse().ok()))
}

/// Wait until the metrics show `line` at `value` (a reload is checked for
/// every 200 ms in these tests).
async fn wait_for_metric(env: &TestEnv, line: &str, value: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = env.metrics().await;
        if metric(&text, line) == Some(value) {
            return text;
        }
        if Instant::now() > deadline {
            let last = reload_records(env).await.pop().map(|r| r.record.details);
            panic!("{line} never reached {value}; the last reload record: {last:?}\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn reload_records(env: &TestEnv) -> Vec<StoredRecord> {
    let records = env.server.app.audit.store().page(0, 1000).await.expect("trail");
    records
        .into_iter()
        .filter(|r| r.record.event == event::CONFIG_RELOADED)
        .collect()
}

fn watched(yaml: String) -> String {
    format!("{yaml}\nreload: {{ interval: 200ms }}\n")
}

on_both_stores!(a_changed_file_is_applied_recorded_and_counted);

async fn a_changed_file_is_applied_recorded_and_counted(backend: Backend) {
    let env = TestEnv::start_from_file(backend, watched).await;
    let before = env.metrics().await;
    assert_eq!(
        metric(&before, "talos_sso_config_last_reload_successful"),
        Some(1.0)
    );
    assert_eq!(
        metric(&before, "talos_sso_config_reloads_total{result=\"ok\"}"),
        Some(0.0)
    );
    assert_eq!(ask(&env, "sam@example.com", "prod", &["os:reader"]).await.0, 403);
    assert_eq!(
        ask(&env, "erin@example.com", "prod", &["os:etcd:backup"]).await.0,
        403
    );
    assert_eq!(
        ask(&env, "bob@example.com", "staging", &[]).await.1,
        "cluster_unknown"
    );

    // A rule for the security team, one for a group nothing named before
    // (so the server must keep it from Graph's answer now), a cluster in a
    // folder of cluster files, and a change that needs a restart.
    let file = env.config_file();
    let text = std::fs::read_to_string(&file).unwrap();
    let clusters = env.work.path().join("clusters.d");
    std::fs::create_dir(&clusters).unwrap();
    std::fs::write(
        clusters.join("staging.yaml"),
        format!(
            "ca: {{ cert_file: \"{}\", key_file: \"{}\" }}\nendpoints: [\"127.0.0.2\"]\n\
             rules:\n  - {{ groups: [\"{GROUP_ONCALL}\"], roles: [os:admin] }}\n",
            env.work.ca_cert.display(),
            env.work.ca_key.display()
        ),
    )
    .unwrap();
    let changed = text
        .replace(
            "      - { app_roles: [\"Talos.Reader\"], roles: [os:reader] }\n",
            &[
                "      - { app_roles: [\"Talos.Reader\"], roles: [os:reader] }\n".to_owned(),
                format!("      - {{ groups: [\"{GROUP_SECURITY}\"], roles: [os:reader] }}\n"),
                format!("      - {{ groups: [\"{ERIN_GROUP}\"], roles: [\"os:etcd:backup\"] }}\n"),
            ]
            .concat(),
        )
        .replace(
            "insecure_http: true\n",
            "insecure_http: true\nclusters_dir: clusters.d\nhttp: { body_limit: 4096 }\n",
        );
    assert_ne!(changed, text);
    std::fs::write(&file, changed).unwrap();
    let after = wait_for_metric(&env, "talos_sso_config_reloads_total{result=\"ok\"}", 1.0).await;
    assert_eq!(
        metric(&after, "talos_sso_config_last_reload_successful"),
        Some(1.0)
    );
    assert!(
        after.contains("talos_sso_ca_not_after_timestamp_seconds{cluster=\"staging\"}"),
        "{after}"
    );

    assert_eq!(ask(&env, "sam@example.com", "prod", &["os:reader"]).await.0, 201);
    assert_eq!(
        ask(&env, "erin@example.com", "prod", &["os:etcd:backup"]).await.0,
        201,
        "the group a new rule names is kept from Graph's answer"
    );
    assert_eq!(
        ask(&env, "bob@example.com", "staging", &["os:admin"]).await.0,
        201
    );
    let info = json_of(env.http.get(format!("{}/v1/info", env.server.base_url))).await;
    let names: Vec<&str> = info["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["prod", "staging"]);

    let records = reload_records(&env).await;
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0].record;
    assert_eq!(record.outcome, "success");
    let details = &record.details;
    assert_eq!(details["trigger"], "file_changed");
    assert_eq!(details["file"], file.display().to_string());
    assert_eq!(details["clusters_added"], serde_json::json!(["staging"]));
    assert_eq!(details["clusters_removed"], serde_json::json!([]));
    assert_eq!(details["clusters_changed"], serde_json::json!(["prod"]));
    assert_eq!(details["sections_changed"], serde_json::json!([]));
    assert_eq!(details["restart_required"], serde_json::json!(["http"]));
    assert_eq!(details["fingerprint"].as_str().map(str::len), Some(64));
    // The HTTP section waits for a restart: a body over the new limit is
    // still read (and refused for what it is, not for its size).
    let big = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .header("content-type", "application/json")
        .body(vec![b' '; 8192])
        .send()
        .await
        .unwrap();
    assert_ne!(big.status().as_u16(), 413);

    // A cluster file removed: the cluster goes.
    std::fs::remove_file(clusters.join("staging.yaml")).unwrap();
    wait_for_metric(&env, "talos_sso_config_reloads_total{result=\"ok\"}", 2.0).await;
    assert_eq!(
        ask(&env, "bob@example.com", "staging", &[]).await.1,
        "cluster_unknown"
    );
    let records = reload_records(&env).await;
    assert_eq!(
        records[1].record.details["clusters_removed"],
        serde_json::json!(["staging"])
    );
    env.finish().await;
}

#[tokio::test]
async fn a_bad_configuration_is_refused_and_the_running_one_keeps_serving() {
    let env = TestEnv::start_from_file(Backend::Sqlite, watched).await;
    let file = env.config_file();
    let good = std::fs::read_to_string(&file).unwrap();
    for (bad, says) in [
        (
            good.replace("    ttl: 5m\n", "    ttl: 5m\n    tll: 5m\n"),
            "unknown field `tll`",
        ),
        (
            good.replace(
                &env.work.ca_key.display().to_string(),
                "/nonexistent/talos-ca.key",
            ),
            "cluster `prod`: CA refused",
        ),
        (
            good.replace("cluster: prod,", "cluster: gone,"),
            "unknown cluster `gone`",
        ),
        // A second tenant while a rule names an app role alone: the new
        // tenant's administrators could assign it.
        (
            good.replace(
                &format!("allowed_tenants: [\"{TENANT_ID}\"]"),
                &format!("allowed_tenants: [\"{TENANT_ID}\", \"0b0b0b0b-1111-4222-8333-444444444444\"]"),
            ),
            "clusters.prod.rules[2].app_roles: app role `Talos.Reader` names no tenant",
        ),
    ] {
        let failed_before = metric(
            &env.metrics().await,
            "talos_sso_config_reloads_total{result=\"failed\"}",
        )
        .unwrap_or_default();
        std::fs::write(&file, &bad).unwrap();
        let text = wait_for_metric(
            &env,
            "talos_sso_config_reloads_total{result=\"failed\"}",
            failed_before + 1.0,
        )
        .await;
        assert_eq!(
            metric(&text, "talos_sso_config_last_reload_successful"),
            Some(0.0)
        );
        assert_eq!(
            ask(&env, "bob@example.com", "prod", &[]).await.0,
            201,
            "the running configuration keeps serving"
        );
        let records = reload_records(&env).await;
        let refused = &records.last().unwrap().record;
        assert_eq!(refused.outcome, "denied");
        assert_eq!(refused.reason_code.as_deref(), Some("config_invalid"));
        let error = refused.details["error"].as_str().unwrap();
        assert!(error.contains(says), "{error}");
        // The same bad file is retried at each check, but reported once.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let later = reload_records(&env).await;
        let same: Vec<_> = later
            .iter()
            .filter(|r| r.record.details["error"].as_str() == Some(error))
            .collect();
        assert_eq!(same.len(), 1, "{later:#?}");
    }
    // Fixed again: applied, and said so.
    std::fs::write(&file, good.replace("max_ttl: 15m", "max_ttl: 10m")).unwrap();
    let text = wait_for_metric(&env, "talos_sso_config_reloads_total{result=\"ok\"}", 1.0).await;
    assert_eq!(
        metric(&text, "talos_sso_config_last_reload_successful"),
        Some(1.0)
    );
    assert_eq!(
        env.server.app.settings().clusters["prod"].config.max_ttl,
        Duration::from_secs(600)
    );
    env.finish().await;
}

/// The watcher loads the files it compared, not the files as they are a
/// moment later: a file written in place in between (truncated, then
/// written) is not read half-written, applied or reported.
#[tokio::test]
async fn a_reload_applies_the_files_as_they_were_compared() {
    let env = TestEnv::start_from_file(Backend::Sqlite, |yaml| {
        format!("{yaml}\nreload: {{ interval: 0s }}\n")
    })
    .await;
    let file = env.config_file();
    let good = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, good.replace("max_ttl: 15m", "max_ttl: 10m")).unwrap();
    let source = env.server.app.settings().config.source.clone().unwrap();
    let compared = source.snapshot().unwrap();
    let fingerprint = compared.fingerprint();
    // Caught between the truncation and the write.
    std::fs::write(&file, "").unwrap();
    let changes = env
        .server
        .app
        .reload_from(Trigger::FileChanged, compared)
        .await
        .expect("the compared files are valid");
    assert_eq!(changes.clusters_changed, ["prod"]);
    assert_eq!(
        env.server.app.settings().clusters["prod"].config.max_ttl,
        Duration::from_secs(600)
    );
    let records = reload_records(&env).await;
    let applied = &records.last().unwrap().record;
    assert_eq!(applied.outcome, "success");
    assert_eq!(applied.details["fingerprint"], fingerprint.as_str());
    // The empty file, read now, is what a reload from the files refuses.
    let error = env.server.app.reload(Trigger::Signal).await.unwrap_err();
    assert!(error.to_string().contains("identity"), "{error}");
    env.finish().await;
}

#[tokio::test]
async fn sighup_reloads_the_running_binary() {
    use talos_sso_tests::faults::{ServerProcess, server_binary, write_server_config};
    let binary = server_binary().expect("server binary");
    let env = TestEnv::start(Backend::Sqlite).await;
    let database = format!("sqlite://{}", env.work.path().join("hup.db").display());
    // No file watching: only the signal reloads.
    let (config, base_url) = write_server_config(&env.emulator, &env.work, &database, "hup.yaml", |yaml| {
        format!("{yaml}\nreload: {{ interval: 0s }}\n")
    })
    .unwrap();
    let server = ServerProcess::spawn(&binary, &config, &base_url, Duration::from_secs(30))
        .await
        .unwrap();
    let description = |base_url: String| async move {
        let info: Value = reqwest::get(format!("{base_url}/v1/info"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        info["clusters"][0]["description"].as_str().unwrap().to_owned()
    };
    assert_eq!(description(base_url.clone()).await, "Production");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("\"Production\"", "\"Production, reloaded\""),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        description(base_url.clone()).await,
        "Production",
        "files are not watched with interval 0s"
    );
    server.hang_up().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while description(base_url.clone()).await != "Production, reloaded" {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload: {}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = server.log_text();
    assert!(log.contains("configuration reloaded"), "{log}");
    assert!(
        log.contains("trigger=\"signal\"") || log.contains("trigger=signal"),
        "{log}"
    );
    drop(server);
    env.finish().await;
}

/// Access taken away by a reload is gone at the next request; a refused
/// file changes nothing, not even what it would harmlessly have changed.
#[tokio::test]
async fn a_rule_removed_revokes_and_a_refused_file_changes_nothing_at_all() {
    let env = TestEnv::start_from_file(Backend::Sqlite, watched).await;
    let file = env.config_file();
    let good = std::fs::read_to_string(&file).unwrap();
    assert_eq!(ask(&env, "bob@example.com", "prod", &[]).await.0, 201);
    // Refused: a typo, next to a new description that must not show.
    std::fs::write(
        &file,
        good.replace("\"Production\"", "\"Renamed\"")
            .replace("    ttl: 5m\n", "    ttl: 5m\n    tll: 5m\n"),
    )
    .unwrap();
    wait_for_metric(&env, "talos_sso_config_reloads_total{result=\"failed\"}", 1.0).await;
    let info = json_of(env.http.get(format!("{}/v1/info", env.server.base_url))).await;
    assert_eq!(info["clusters"][0]["description"], "Production");
    // Applied: on-call loses prod.
    // (The policy example that says on-call operates prod goes too: it
    // would refuse the change, rightly.)
    let revoked = good
        .replace(
            &format!("      - {{ groups: [\"{GROUP_ONCALL}\"], roles: [os:operator] }}\n"),
            "",
        )
        .lines()
        .filter(|line| !line.contains("on-call operates prod"))
        .map(|line| format!("{line}\n"))
        .collect::<String>();
    assert_ne!(revoked, good);
    std::fs::write(&file, revoked).unwrap();
    wait_for_metric(&env, "talos_sso_config_reloads_total{result=\"ok\"}", 1.0).await;
    assert_eq!(
        ask(&env, "bob@example.com", "prod", &[]).await.1,
        "no_matching_rule"
    );
    env.finish().await;
}

/// A reload that cannot be recorded is not applied, and is tried again
/// until it is: the file did not change again, the database came back.
#[tokio::test]
async fn a_reload_the_trail_cannot_take_waits_for_it_and_then_applies() {
    let env = TestEnv::start_from_file(Backend::Postgres, watched).await;
    let database = env.database.as_ref().unwrap();
    let file = env.config_file();
    let good = std::fs::read_to_string(&file).unwrap();
    database.cut().await;
    std::fs::write(&file, good.replace("\"Production\"", "\"Production, reloaded\"")).unwrap();
    let text = wait_for_metric(&env, "talos_sso_config_reloads_total{result=\"failed\"}", 1.0).await;
    assert_eq!(
        metric(&text, "talos_sso_config_last_reload_successful"),
        Some(0.0)
    );
    let info = json_of(env.http.get(format!("{}/v1/info", env.server.base_url))).await;
    assert_eq!(info["clusters"][0]["description"], "Production");
    // Reported once, however often it is tried while the database is away.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let text = env.metrics().await;
    assert_eq!(
        metric(&text, "talos_sso_config_reloads_total{result=\"failed\"}"),
        Some(1.0)
    );
    database.restore().await;
    wait_for_metric(&env, "talos_sso_config_reloads_total{result=\"ok\"}", 1.0).await;
    let info = json_of(env.http.get(format!("{}/v1/info", env.server.base_url))).await;
    assert_eq!(info["clusters"][0]["description"], "Production, reloaded");
    let records = reload_records(&env).await;
    assert_eq!(
        records.len(),
        1,
        "only the applied reload is in the trail: {records:?}"
    );
    assert_eq!(records[0].record.outcome, "success");
    env.finish().await;
}

/// CA material replaced at the same path (a rotated intermediate, a Secret
/// updated) is signed with after the next check, with no change to the
/// configuration file.
#[tokio::test]
async fn a_ca_replaced_at_the_same_path_is_picked_up() {
    use talos_sso_server::ca::generate::{self, NewKeyType};
    let env = TestEnv::start_from_file(Backend::Sqlite, watched).await;
    let before = env.server.app.settings().clusters["prod"].ca.signer().der.clone();
    let rotated = generate::new_root(
        NewKeyType::Ed25519,
        "talos",
        Duration::from_secs(400 * 86400),
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    // Key first, then the certificate: the state in between (a key that
    // does not match) is refused, then the pair is applied.
    std::fs::write(&env.work.ca_key, &rotated.key_pem).unwrap();
    std::fs::write(&env.work.ca_cert, &rotated.cert_pem).unwrap();
    let text = wait_for_metric(&env, "talos_sso_config_reloads_total{result=\"ok\"}", 1.0).await;
    let after = env.server.app.settings().clusters["prod"].ca.signer().der.clone();
    assert_ne!(after, before);
    let not_after = metric(
        &text,
        "talos_sso_ca_not_after_timestamp_seconds{cluster=\"prod\"}",
    )
    .unwrap();
    let expected = time::OffsetDateTime::now_utc().unix_timestamp() as f64 + 400.0 * 86400.0;
    assert!((not_after - expected).abs() < 3600.0, "{not_after} vs {expected}");
    let (status, body) = env
        .issue(
            &env.emulator
                .token_for("bob@example.com", TokenKind::id())
                .unwrap(),
        )
        .await;
    assert_eq!(status, 201);
    assert_eq!(body["ca"].as_str().unwrap().trim(), rotated.cert_pem.trim());
    let records = reload_records(&env).await;
    let last = &records.last().unwrap().record;
    assert_eq!(last.details["clusters_changed"], serde_json::json!(["prod"]));
    env.finish().await;
}

/// SIGHUP while the server is still starting does not end it.
#[tokio::test]
async fn sighup_during_start_is_not_fatal() {
    use talos_sso_tests::faults::{server_binary, write_server_config};
    let binary = server_binary().expect("server binary");
    let env = TestEnv::start(Backend::Sqlite).await;
    let database = format!("sqlite://{}", env.work.path().join("early.db").display());
    let (config, base_url) =
        write_server_config(&env.emulator, &env.work, &database, "early.yaml", |yaml| yaml).unwrap();
    // The provider answers slowly: the server is surely still starting
    // (discovering it) when the hang-ups come.
    env.emulator.set_faults(talos_sso_tests::emulator::Faults {
        delay: Duration::from_secs(2),
        ..Default::default()
    });
    let mut child = std::process::Command::new(&binary)
        .args(["serve", "--config"])
        .arg(&config)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // As soon as the process catches SIGHUP (its handler is installed
    // before the provider is discovered and the store opened), several
    // hang-ups while it starts. Before that, SIGHUP would end any process.
    let catches_hangup = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|status| {
                let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
                u64::from_str_radix(mask.trim(), 16).ok()
            })
            .is_some_and(|mask| mask & (1 << (1 - 1)) != 0)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !catches_hangup(child.id()) {
        assert!(Instant::now() < deadline, "the server never caught SIGHUP");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        reqwest::get(format!("{base_url}/healthz")).await.is_err(),
        "the server must still be starting"
    );
    for _ in 0..5 {
        let _ = std::process::Command::new("kill")
            .args(["-HUP", &child.id().to_string()])
            .status();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    env.emulator.set_faults(Default::default());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = reqwest::get(format!("{base_url}/healthz")).await
            && response.status().is_success()
        {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the server ended during start: {status}");
        }
        assert!(Instant::now() < deadline, "the server did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    env.finish().await;
}

/// A server given its configuration as text has no file to read again: a
/// reload is refused, counted and recorded, and nothing changes.
#[tokio::test]
async fn a_server_without_a_configuration_file_refuses_to_reload() {
    use talos_sso_server::app::reload::ReloadError;
    let env = TestEnv::start(Backend::Sqlite).await;
    let refused = env.server.app.reload(Trigger::Signal).await;
    assert!(matches!(refused, Err(ReloadError::NoSource)), "{refused:?}");
    let text = env.metrics().await;
    assert_eq!(
        metric(&text, "talos_sso_config_reloads_total{result=\"failed\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, "talos_sso_config_last_reload_successful"),
        Some(0.0)
    );
    let records = reload_records(&env).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].record.details["trigger"], "signal");
    assert!(
        records[0].record.details["error"]
            .as_str()
            .unwrap()
            .contains("not started from a configuration file"),
        "{records:?}"
    );
    assert_eq!(ask(&env, "bob@example.com", "prod", &[]).await.0, 201);
    env.finish().await;
}
