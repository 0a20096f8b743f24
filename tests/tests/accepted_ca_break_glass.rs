//! Break-glass on a cluster in accepted-CA mode: the talosconfig trusts the
//! Talos CA, its certificate is signed by the talos-sso client CA and
//! admitted by apid only while Talos lists that CA in `machine.acceptedCAs`,
//! and the command and the record say which CA signed.

use std::time::Duration;

use base64::Engine;
use talos_sso_server::ca::generate::{NewKeyType, new_client_ca};
use talos_sso_tests::harness::{Backend, TestEnv};
use talos_sso_tests::material::write_file;
use talos_sso_tests::talos_checker;
use time::OffsetDateTime;

#[tokio::test]
async fn break_glass_in_accepted_ca_mode_says_which_ca_signed() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let client_ca = new_client_ca(
        NewKeyType::Ed25519,
        "prod",
        Duration::from_secs(30 * 86400),
        OffsetDateTime::now_utc(),
    )
    .unwrap();
    let dir = env.work.path();
    let client_cert = write_file(dir, "client-ca.crt", &client_ca.cert_pem, 0o644);
    let client_key = write_file(dir, "client-ca.key", &client_ca.key_pem, 0o600);
    let talos_ca_pem = std::fs::read_to_string(&env.work.ca_cert).unwrap();
    let talos_ca = write_file(dir, "talos-ca-only.crt", &talos_ca_pem, 0o644);

    let text = talos_sso_tests::harness::config_yaml(&env.emulator, &env.work, &env.database_url);
    let cluster_ca = format!(
        "ca: {{ cert_file: \"{}\", key_file: \"{}\" }}",
        env.work.ca_cert.display(),
        env.work.ca_key.display()
    );
    assert!(
        text.contains(&cluster_ca),
        "the test configuration changed: {text}"
    );
    let accepted = format!(
        "ca: {{ cert_file: \"{}\", key_file: \"{}\" }}\n    talos_ca: {{ cert_file: \"{}\" }}",
        client_cert.display(),
        client_key.display(),
        talos_ca.display()
    );
    let config = dir.join("accepted.yaml");
    std::fs::write(&config, text.replace(&cluster_ca, &accepted)).unwrap();
    let config = config.to_str().unwrap();

    let check = talos_sso_tests::harness::server_cli(&["check", "--config", config])
        .await
        .unwrap();
    assert!(check.contains("cluster prod: accepted-ca mode"), "{check}");

    let out = dir.join("break-glass.yaml");
    let done = talos_sso_tests::harness::break_glass_admin(config, "Entra outage INC-4712", &out)
        .await
        .unwrap();
    let fingerprint = client_ca.cert.sha256_fingerprint();
    assert!(
        done.contains(&format!(
            "signed by CN=talos-sso client CA {},OU=prod,O=talos-sso (sha256 {fingerprint}), accepted-ca mode",
            // The day it was made: its not_before is backdated five minutes.
            &talos_sso_server::ca::format_time(client_ca.cert.not_before() + time::Duration::minutes(5))[..10]
        )),
        "{done}"
    );

    let yaml: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let field = |name: &str| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(yaml["contexts"]["prod-break-glass"][name].as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };
    // talosctl verifies apid with the Talos CA, never with the client CA.
    assert_eq!(field("ca"), talos_ca_pem);
    let leaf = talos_sso_server::ca::parse_certificates(&field("crt"), "crt").unwrap();
    assert_eq!(leaf.len(), 1, "a client CA's leaf travels alone");
    leaf[0].verify_signed_by(client_ca.cert.spki()).unwrap();

    // apid admits it while Talos accepts the client CA, and not after the cut-off.
    let pool = format!("{talos_ca_pem}{}", client_ca.cert_pem);
    let admitted = talos_checker::handshake(&pool, &field("crt"), &field("key")).unwrap();
    assert_eq!(admitted.roles, ["os:admin"]);
    assert!(talos_checker::handshake(&talos_ca_pem, &field("crt"), &field("key")).is_err());

    let rows = env.server.app.audit.store().page(0, 10_000).await.unwrap();
    let record = &rows.last().unwrap().record;
    assert_eq!(record.event, "break_glass.issued");
    assert_eq!(record.details["trust_mode"], "accepted-ca");
    assert!(
        record.details["signed_by"]
            .as_str()
            .unwrap()
            .contains(&fingerprint),
        "{:?}",
        record.details
    );
    env.finish().await;
}
