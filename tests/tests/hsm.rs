//! A CA key inside a PKCS#11 token (SoftHSM 2): certificates signed through
//! it that Talos and OpenSSL accept, exactly like file-backed CAs; the
//! checks at start (a key that is not the certificate's, a wrong PIN, an
//! unknown token or key, an open PIN file); what `ca inspect` reports; and a
//! token lost at run time: 503 `signing_unavailable`, recorded as a denial,
//! counted, shown by `/readyz`, and recovery when it is back.

use std::path::Path;
use std::time::Duration;

use talos_sso::key::ClientKey;
use talos_sso_server::ca::CertificateAuthority;
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::certificate::{self, LeafRequest};
use talos_sso_server::config::{CaSource, DEFAULT_CLOCK_SKEW, Pkcs11Source};
use talos_sso_server::keys::pkcs11::token_public_key;
use talos_sso_tests::emulator::TokenKind;
use talos_sso_tests::harness::{Backend, TestEnv, server_cli};
use talos_sso_tests::material::{load, write_file};
use talos_sso_tests::softhsm::{SoftHsm, TokenKey};
use talos_sso_tests::{openssl, talos_checker};
use time::OffsetDateTime;

const ROLE_SETS: [&[&str]; 3] = [
    &["os:reader"],
    &["os:operator", "os:etcd:backup"],
    &["os:admin", "os:operator", "os:reader", "os:etcd:backup"],
];

use talos_sso_tests::softhsm::intermediate_for;

/// A five-minute leaf for alice with `roles`, signed by `ca` now.
fn issue_to(
    ca: &CertificateAuthority,
    csr: &[u8],
    roles: &[String],
) -> Result<certificate::SignedLeaf, certificate::IssueError> {
    let request = LeafRequest {
        username: "alice@example.com",
        roles,
        ttl: Duration::from_secs(300),
        clock_skew: DEFAULT_CLOCK_SKEW,
    };
    certificate::issue(ca, csr, &request, OffsetDateTime::now_utc())
}

fn source(cert_file: &Path, pkcs11: &Pkcs11Source) -> CaSource {
    CaSource::Pkcs11 {
        cert_file: cert_file.to_owned(),
        pkcs11: pkcs11.clone(),
    }
}

#[test]
fn token_keys_sign_certificates_that_talos_and_openssl_accept() {
    let hsm = SoftHsm::exclusive();
    let dir = tempfile::tempdir().unwrap();
    for key in [TokenKey::Ed25519, TokenKey::EcdsaP256] {
        let token = hsm.token(dir.path(), key, "talos-ca");
        let (root, cert_file) = intermediate_for(dir.path(), &token.source);
        let ca = load(&source(&cert_file, &token.source)).unwrap_or_else(|e| panic!("{key:?}: {e}"));
        let location = ca.key_location().expect("a token key");
        assert!(
            location.starts_with(&format!("PKCS#11 token `{}` (slot ", token.label))
                && location.contains("SoftHSM project")
                && location.ends_with("key `talos-ca`"),
            "{location}"
        );
        assert_eq!(ca.trust_bundle_pem(), root.signer().to_pem());
        for role_set in ROLE_SETS {
            let roles: Vec<String> = role_set.iter().map(|r| r.to_string()).collect();
            let client = ClientKey::generate().unwrap();
            let issued = issue_to(&ca, client.csr_pem().unwrap().as_bytes(), &roles)
                .unwrap_or_else(|e| panic!("{key:?}: {e}"));
            assert_eq!(issued.leaf.raw_issuer, ca.signer().raw_subject);
            issued.leaf.verify_signed_by(ca.signer().spki()).unwrap();
            let accepted = talos_checker::handshake(
                ca.trust_bundle_pem(),
                &issued.chain_pem,
                &client.private_key_pem(),
            )
            .unwrap_or_else(|e| panic!("{key:?} {role_set:?}: {e}"));
            assert_eq!(accepted.roles, roles);
            openssl::verify_client_certificate(
                ca.trust_bundle_pem(),
                &issued.leaf.to_pem(),
                &ca.signer().to_pem(),
            )
            .unwrap_or_else(|e| panic!("{key:?}: openssl: {e}"));
        }
    }
}

#[test]
fn concurrent_issuances_each_get_a_session_and_all_verify() {
    let hsm = SoftHsm::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let token = hsm.token(dir.path(), TokenKey::EcdsaP256, "talos-ca");
    let (_, cert_file) = intermediate_for(dir.path(), &token.source);
    let ca = load(&source(&cert_file, &token.source)).unwrap();
    let roles = vec!["os:reader".to_owned()];
    let csr = ClientKey::generate().unwrap().csr_der().unwrap();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    for _ in 0..10 {
                        let issued = issue_to(&ca, &csr, &roles).unwrap();
                        issued.leaf.verify_signed_by(ca.signer().spki()).unwrap();
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
    });
}

/// At most eight issuances sign with a token key at once (as many as the
/// sessions the key keeps); the ninth waits, without a thread, until one
/// is done. A key in a file gives turns to nobody: it never waits.
#[tokio::test]
#[allow(clippy::await_holding_lock)] // one SoftHSM test at a time, on purpose
async fn signatures_with_a_token_key_take_turns_eight_at_a_time() {
    let hsm = SoftHsm::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let token = hsm.token(dir.path(), TokenKey::Ed25519, "talos-ca");
    let (root, cert_file) = intermediate_for(dir.path(), &token.source);
    let ca = load(&source(&cert_file, &token.source)).unwrap();
    let mut turns = Vec::new();
    for _ in 0..8 {
        turns.push(ca.turn_to_sign().await.expect("a token key gives turns"));
    }
    let ninth = tokio::time::timeout(Duration::from_millis(200), ca.turn_to_sign()).await;
    assert!(ninth.is_err(), "a ninth turn while eight are taken");
    turns.pop();
    let ninth = tokio::time::timeout(Duration::from_secs(10), ca.turn_to_sign()).await;
    assert!(matches!(ninth, Ok(Some(_))), "a turn once one is given back");
    assert!(
        root.turn_to_sign().await.is_none(),
        "a key in a file takes no turn"
    );
}

#[test]
fn a_token_key_that_is_not_the_certificates_is_refused_at_start() {
    let hsm = SoftHsm::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let token = hsm.token(dir.path(), TokenKey::Ed25519, "talos-ca");
    hsm.generate(&token, TokenKey::Ed25519, "other");
    hsm.generate(&token, TokenKey::EcdsaP256, "p256");
    // The certificate is for `other`; the configuration names `talos-ca`.
    let other = Pkcs11Source {
        key_label: "other".into(),
        ..token.source.clone()
    };
    let (_, other_cert) = intermediate_for(dir.path(), &other);
    let error = load(&source(&other_cert, &token.source)).unwrap_err();
    assert_eq!(error.code(), "ca_key_mismatch", "{error}");
    let message = error.to_string();
    assert!(
        message.contains(&format!("PKCS#11 token `{}`, key `talos-ca`", token.label)),
        "{message}"
    );
    // A P-256 key under an Ed25519 certificate: refused before any signature.
    let p256 = Pkcs11Source {
        key_label: "p256".into(),
        ..token.source.clone()
    };
    let error = load(&source(&other_cert, &p256)).unwrap_err();
    assert_eq!(error.code(), "ca_key_mismatch", "{error}");
    assert!(error.to_string().contains("key `p256`"), "{error}");
}

#[test]
fn a_wrong_pin_an_unknown_token_or_key_and_an_open_pin_file_are_named() {
    let hsm = SoftHsm::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let token = hsm.token(dir.path(), TokenKey::Ed25519, "talos-ca");
    let (_, cert_file) = intermediate_for(dir.path(), &token.source);
    let refusal = |pkcs11: Pkcs11Source| {
        let error = load(&source(&cert_file, &pkcs11)).unwrap_err();
        (error.code(), error.to_string())
    };

    let wrong_pin = write_file(dir.path(), "wrong.pin", "0000\n", 0o600);
    let (code, message) = refusal(Pkcs11Source {
        pin_file: wrong_pin.clone(),
        ..token.source.clone()
    });
    assert_eq!(code, "ca_pkcs11_pin_incorrect");
    assert!(message.contains("CKR_PIN_INCORRECT"), "{message}");
    assert!(message.contains(&format!("token `{}`", token.label)), "{message}");
    assert!(message.contains(&wrong_pin.display().to_string()), "{message}");

    let (code, message) = refusal(Pkcs11Source {
        token_label: "no-such-token".into(),
        ..token.source.clone()
    });
    assert_eq!(code, "ca_pkcs11_token_unknown");
    assert!(
        message.contains("no PKCS#11 token labelled `no-such-token`"),
        "{message}"
    );
    assert!(
        message.contains(&format!("`{}`", token.label)),
        "lists the tokens present: {message}"
    );

    let (code, message) = refusal(Pkcs11Source {
        key_label: "no-such-key".into(),
        ..token.source.clone()
    });
    assert_eq!(code, "ca_pkcs11_key_unknown");
    assert!(
        message.contains("no private key labelled `no-such-key`"),
        "{message}"
    );

    let open_pin = write_file(dir.path(), "open.pin", "2468-talos\n", 0o644);
    let (code, _) = refusal(Pkcs11Source {
        pin_file: open_pin,
        ..token.source.clone()
    });
    assert_eq!(code, "ca_key_permissions");

    let (code, message) = refusal(Pkcs11Source {
        module: dir.path().join("missing.so"),
        ..token.source.clone()
    });
    assert_eq!(code, "ca_pkcs11_module");
    assert!(message.contains("missing.so"), "{message}");
}

#[tokio::test]
#[allow(clippy::await_holding_lock)] // one SoftHSM test at a time, on purpose
async fn ca_inspect_reports_the_token_and_key_found() {
    let hsm = SoftHsm::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let token = hsm.token(dir.path(), TokenKey::EcdsaP256, "talos-ca");
    let (_, cert_file) = intermediate_for(dir.path(), &token.source);
    let cert = cert_file.display().to_string();
    let module = token.source.module.display().to_string();
    let pin = token.source.pin_file.display().to_string();
    let args = |pin: &str| {
        vec![
            "ca".to_owned(),
            "inspect".to_owned(),
            "--cert-file".to_owned(),
            cert.clone(),
            "--pkcs11-module".to_owned(),
            module.clone(),
            "--pkcs11-token-label".to_owned(),
            token.label.clone(),
            "--pkcs11-key-label".to_owned(),
            "talos-ca".to_owned(),
            "--pkcs11-pin-file".to_owned(),
            pin.to_owned(),
        ]
    };
    let ok = args(&pin);
    let out = server_cli(&ok.iter().map(String::as_str).collect::<Vec<_>>())
        .await
        .unwrap();
    assert!(
        out.contains(&format!("key:         PKCS#11 token `{}` (slot ", token.label)),
        "{out}"
    );
    assert!(
        out.contains("SoftHSM project") && out.contains("key `talos-ca`"),
        "{out}"
    );
    assert!(out.contains("key type:    ECDSA P-256"), "{out}");
    assert!(out.contains("mode:        intermediate"), "{out}");

    let wrong = write_file(dir.path(), "wrong.pin", "1111\n", 0o600)
        .display()
        .to_string();
    let bad = args(&wrong);
    let error = server_cli(&bad.iter().map(String::as_str).collect::<Vec<_>>())
        .await
        .unwrap_err();
    assert!(
        error.contains("[ca_pkcs11_pin_incorrect]") && error.contains("CKR_PIN_INCORRECT"),
        "{error}"
    );
}

/// `/readyz` once its last answer (reused for a moment) has gone stale.
async fn readiness(env: &TestEnv) -> (u16, serde_json::Value) {
    tokio::time::sleep(talos_sso_server::http::status::READINESS_FRESH_FOR * 2).await;
    let response = env
        .http
        .get(format!("{}/readyz", env.server.base_url))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// A request waits for its turn to sign: with every turn of the cluster's
/// token key taken, it is not answered until one is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // one SoftHSM test at a time, on purpose
async fn an_issuance_waits_for_its_turn_to_sign() {
    let hsm = SoftHsm::exclusive();
    let keep = tempfile::tempdir().unwrap();
    let token = hsm.token(keep.path(), TokenKey::Ed25519, "talos-ca");
    let (_, cert_file) = intermediate_for(keep.path(), &token.source);
    let ca_line = talos_sso_tests::softhsm::ca_line(&cert_file, &token.source);
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        talos_sso_tests::softhsm::with_ca_line(&yaml, &ca_line)
    })
    .await;
    let settings = env.server.app.settings();
    let ca = &settings.clusters["prod"].ca;
    let mut turns = Vec::new();
    for _ in 0..8 {
        turns.push(ca.turn_to_sign().await.unwrap());
    }
    let token_for = env
        .emulator
        .token_for("bob@example.com", TokenKind::id())
        .unwrap();
    {
        let request = env.issue(&token_for);
        tokio::pin!(request);
        let early = tokio::time::timeout(Duration::from_millis(500), &mut request).await;
        assert!(early.is_err(), "answered without a turn: {early:?}");
        turns.clear();
        let (status, body) = request.await;
        assert_eq!(status, 201, "{body}");
    }
    drop(turns);
    drop(settings);
    env.finish().await;
}

// On a multi-thread runtime, as the server runs: each signature (and each
// failed one) waits on the token inside `block_in_place` there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // one SoftHSM test at a time, on purpose
async fn a_token_lost_at_run_time_answers_signing_unavailable_and_recovers() {
    let hsm = SoftHsm::exclusive();
    let keep = tempfile::tempdir().unwrap();
    let token = hsm.token(keep.path(), TokenKey::Ed25519, "talos-ca");
    let (_, cert_file) = intermediate_for(keep.path(), &token.source);
    let ca_line = talos_sso_tests::softhsm::ca_line(&cert_file, &token.source);
    let config_file = keep.path().join("config.yaml");
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        let yaml = talos_sso_tests::softhsm::with_ca_line(&yaml, &ca_line);
        std::fs::write(&config_file, &yaml).unwrap();
        yaml
    })
    .await;
    // `check` opens the same token and says what it found.
    let checked = server_cli(&["check", "--config", config_file.to_str().unwrap()])
        .await
        .unwrap();
    assert!(
        checked.contains(&format!(
            "cluster prod: key in PKCS#11 token `{}` (slot ",
            token.label
        )),
        "{checked}"
    );
    let token_for = |user: &str| env.emulator.token_for(user, TokenKind::id()).unwrap();
    let (status, body) = env.issue(&token_for("bob@example.com")).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(readiness(&env).await.0, 200);

    // The token's folder leaves SoftHSM's token directory: the pooled
    // sessions fail, and the re-initialized module no longer lists it.
    let away = token.remove();
    let (status, body) = env.issue(&token_for("bob@example.com")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("signing_unavailable")),
        "{body}"
    );
    let (status, ready) = readiness(&env).await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["signing"], false, "{ready}");
    assert_eq!(ready["database"], true, "{ready}");
    // Signed by an intermediate under the Talos root.
    assert_eq!(
        ready["trust_modes"],
        serde_json::json!({"prod": "intermediate"}),
        "{ready}"
    );
    let metrics = env.metrics().await;
    assert!(
        metrics.contains("talos_sso_signing_unavailable_total{cluster=\"prod\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("talos_sso_requests_denied_total{cluster=\"prod\",reason=\"signing_unavailable\"} 1\n"),
        "{metrics}"
    );
    // Recorded as a denial, and nothing as issued but the first certificate.
    let records = env.server.app.audit.store().page(0, 100).await.unwrap();
    let issued = records
        .iter()
        .filter(|r| r.record.event == "certificate.issued")
        .count();
    assert_eq!(issued, 1);
    let last = records.last().unwrap();
    assert_eq!(last.record.event, "certificate.denied");
    assert_eq!(last.record.reason_code.as_deref(), Some("signing_unavailable"));
    assert_eq!(last.record.outcome, "denied");

    token.restore(&away);
    let (status, ready) = readiness(&env).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["signing"], true, "{ready}");
    let (status, body) = env.issue(&token_for("bob@example.com")).await;
    assert_eq!(status, 201, "{body}");
    env.finish().await;
}

#[tokio::test]
#[allow(clippy::await_holding_lock)] // one SoftHSM test at a time, on purpose
async fn ca_intermediate_for_token_certifies_a_key_made_inside_the_token() {
    let hsm = SoftHsm::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let token = hsm.token(dir.path(), TokenKey::EcdsaP256, "talos-sso-intermediate");
    let root = generate::new_root(
        NewKeyType::Ed25519,
        "talos",
        Duration::from_secs(3650 * 86400),
        OffsetDateTime::now_utc(),
    )
    .unwrap();
    let root_cert = write_file(dir.path(), "root.crt", &root.cert_pem, 0o644);
    let root_key = write_file(dir.path(), "root.key", &root.key_pem, 0o600);
    let out = dir.path().join("intermediate.crt");
    let path = |p: &Path| p.display().to_string();
    let module = path(&token.source.module);
    let args = [
        "ca",
        "intermediate-for-token",
        "--cert-file",
        &path(&root_cert),
        "--key-file",
        &path(&root_key),
        "--validity",
        "90d",
        "--token-module",
        &module,
        "--token-label",
        &token.label,
        "--token-key-label",
        "talos-sso-intermediate",
        "--out-cert",
        &path(&out),
    ];
    let printed = server_cli(&args).await.unwrap();
    assert!(printed.contains("key `talos-sso-intermediate`"), "{printed}");
    // The certificate carries the token's public key, signed by the root;
    // the server then signs with the token and Talos accepts the leaves.
    let ca = load(&source(&out, &token.source)).unwrap();
    assert!(ca.is_intermediate());
    assert_eq!(ca.root().der, root.cert.der);
    assert_eq!(ca.signer().spki(), &token_public_key(&token.source).unwrap());
    let client = ClientKey::generate().unwrap();
    let roles = vec!["os:reader".to_owned()];
    let issued = issue_to(&ca, &client.csr_der().unwrap(), &roles).unwrap();
    let accepted = talos_checker::handshake(
        ca.trust_bundle_pem(),
        &issued.chain_pem,
        &client.private_key_pem(),
    )
    .unwrap();
    assert_eq!(accepted.roles, roles);
    // Never over an existing file.
    let again = server_cli(&args).await.unwrap_err();
    assert!(again.contains("already exists"), "{again}");

    // The key made by the command itself, inside the token: the whole flow
    // without a private key on disk.
    let made = dir.path().join("made-here.crt");
    let pin_file = path(&token.source.pin_file);
    let mut generate: Vec<&str> = args[..args.len() - 4].to_vec();
    let made_path = path(&made);
    generate.extend([
        "--token-key-label",
        "made-here",
        "--generate",
        "ed25519",
        "--token-pin-file",
        &pin_file,
        "--out-cert",
        &made_path,
    ]);
    let printed = server_cli(&generate).await.unwrap();
    assert!(printed.contains("key `made-here`"), "{printed}");
    let made_source = Pkcs11Source {
        key_label: "made-here".into(),
        ..token.source.clone()
    };
    let ca = load(&source(&made, &made_source)).unwrap();
    assert_eq!(ca.signer().spki(), &token_public_key(&made_source).unwrap());
    let issued = issue_to(&ca, &client.csr_der().unwrap(), &roles).unwrap();
    issued.leaf.verify_signed_by(ca.signer().spki()).unwrap();
    // The private key is sensitive and was never extractable.
    let listed = std::process::Command::new("pkcs11-tool")
        .args([
            "--module",
            &module,
            "--token-label",
            &token.label,
            "--login",
            "--pin",
        ])
        .arg(std::fs::read_to_string(&token.source.pin_file).unwrap().trim())
        .args(["--list-objects", "--type", "privkey", "--label", "made-here"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains("sensitive") && listed.contains("never extractable"),
        "{listed}"
    );
    // A label already taken is refused, naming it.
    std::fs::remove_file(&made).unwrap();
    let taken = server_cli(&generate).await.unwrap_err();
    assert!(
        taken.contains("already holds a key labelled `made-here`"),
        "{taken}"
    );
}

/// The audit checkpoint key can live in a token too: the server signs its
/// checkpoints there, and they verify with the token's public key, which
/// OpenSSL reads; a P-256 key is refused as an audit key.
#[tokio::test]
#[allow(clippy::await_holding_lock)] // one SoftHSM test at a time, on purpose
async fn the_audit_checkpoint_key_can_live_in_a_token() {
    use talos_sso_api::checkpoint::{CheckpointKey, read_checkpoints};
    use talos_sso_server::audit::checkpoint::AuditKey;
    let hsm = SoftHsm::exclusive();
    let keep = tempfile::tempdir().unwrap();
    let token = hsm.token(keep.path(), TokenKey::Ed25519, "audit-signing");
    let key = AuditKey::load_pkcs11(&token.source).unwrap();
    let public_pem = write_file(keep.path(), "audit.pub", &key.public_pem(), 0o644);
    let derived = std::process::Command::new("openssl")
        .args(["pkey", "-pubin", "-in", public_pem.to_str().unwrap(), "-noout"])
        .status()
        .unwrap();
    assert!(derived.success(), "OpenSSL reads the token's public key");

    let file = keep.path().join("checkpoints.jsonl");
    let pkcs11 = format!(
        "\naudit:\n  checkpoints:\n    file: \"{}\"\n    server_name: hsm-test\n    pkcs11: {{ module: \"{}\", token_label: \"{}\", key_label: audit-signing, pin_file: \"{}\" }}\n",
        file.display(),
        token.source.module.display(),
        token.label,
        token.source.pin_file.display()
    );
    let config_file = keep.path().join("config.yaml");
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        let yaml = format!("{yaml}{pkcs11}");
        std::fs::write(&config_file, &yaml).unwrap();
        yaml
    })
    .await;
    // What the auditors are given: the public key as the server reads it.
    let printed = server_cli(&["audit", "public-key", "--config", config_file.to_str().unwrap()])
        .await
        .unwrap();
    assert_eq!(printed, key.public_pem());
    let (status, _) = env
        .issue(
            &env.emulator
                .token_for("bob@example.com", TokenKind::id())
                .unwrap(),
        )
        .await;
    assert_eq!(status, 201);
    let answer = env
        .http
        .post(format!("{}/v1/audit/checkpoint", env.server.base_url))
        .bearer_auth(
            env.emulator
                .token_for("sam@example.com", TokenKind::id())
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let public = CheckpointKey::from_pem(&std::fs::read_to_string(&public_pem).unwrap(), "public").unwrap();
    let lines = std::fs::read_to_string(&file).unwrap();
    let signed = read_checkpoints(lines.as_bytes(), "file", &[public]).unwrap();
    assert_eq!(
        signed
            .iter()
            .map(|c| (c.seq, c.trigger.as_str()))
            .collect::<Vec<_>>(),
        [(0, "start"), (2, "request")]
    );
    env.finish().await;

    let p256 = hsm.token(keep.path(), TokenKey::EcdsaP256, "not-ed25519");
    let error = AuditKey::load_pkcs11(&p256.source).unwrap_err().to_string();
    assert!(error.contains("the key is not Ed25519"), "{error}");
}
