//! A gateway cluster at load time: people's certificates come from the
//! gateway-only CA and their talosconfig points at the gateway; a client CA
//! that Talos trusts, a serving CA that cannot vouch for a server, bad
//! method rules and failing examples are refused with a reason; a reload
//! that moves the gateway is refused; `check` shows it.

use std::path::Path;
use std::time::Duration;

use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::cluster::load_clusters;
use talos_sso_server::config::Config;
use talos_sso_tests::gateway_files::{GATEWAY_ENDPOINT_PLACEHOLDER, GatewayFiles};
use talos_sso_tests::harness::{Backend, TestEnv, Workdir, server_cli};
use talos_sso_tests::material::write_file;
use time::OffsetDateTime;

/// The harness configuration of a gateway cluster, as text, with `edit`
/// applied; without a running emulator (load-time checks read no issuer).
fn config_text(files: &GatewayFiles, extra: &str) -> String {
    let work = Workdir::new();
    let emulator_free = format!(
        r#"
listen: "127.0.0.1:0"
insecure_http: true
data_dir: "{dir}"
database: {{ url: "sqlite://{dir}/audit.db" }}
identity:
  issuer: "https://login.example.com/tenant/v2.0"
  client_id: "cli"
  audiences: ["cli"]
clusters:
  prod:
    ca: {{ cert_file: "x", key_file: "y" }}
    endpoints: ["127.0.0.1"]
    nodes: ["127.0.0.1"]
    rules:
      - {{ groups: ["oncall"], roles: [os:operator] }}
"#,
        dir = work.path().display()
    );
    files.gateway_config(&emulator_free, "127.0.0.1:50000".parse().unwrap(), extra)
}

fn load(text: &str) -> Result<talos_sso_server::cluster::Clusters, String> {
    let config = Config::from_yaml(text).map_err(|e| e.to_string())?;
    load_clusters(&config, OffsetDateTime::now_utc())
        .map(|(clusters, _)| clusters)
        .map_err(|e| e.to_string())
}

#[test]
fn a_gateway_cluster_signs_people_with_its_own_ca_and_points_them_at_the_gateway() {
    let files = GatewayFiles::new();
    let clusters = load(&config_text(&files, "")).unwrap();
    let prod = &clusters["prod"];
    let now = OffsetDateTime::now_utc();
    let gateway = prod.gateway.as_ref().unwrap();
    assert_eq!(prod.people_ca(now).signer().to_pem(), files.client_ca_pem);
    // The gateway's own certificate is signed by the cluster's ca.
    assert_eq!(prod.signing_ca(now).signer().to_pem(), files.talos_ca_pem);
    assert_eq!(prod.talosconfig_ca(), files.tls_ca_pem);
    assert_eq!(prod.talosconfig_endpoints(), [GATEWAY_ENDPOINT_PLACEHOLDER]);
    assert_eq!(prod.upstreams(), ["127.0.0.1:50000"]);
    assert_eq!(gateway.config.impersonator_ttl, Duration::from_secs(3600));
    assert_eq!(gateway.config.max_call, Duration::from_secs(12 * 3600));
}

#[test]
fn a_client_ca_talos_trusts_is_refused() {
    let files = GatewayFiles::new();
    // Accepted-CA mode, with the gateway CA also the cluster's ca: what it
    // signs would be admitted by apid directly.
    let text = config_text(&files, "").replace(
        &format!(
            "    ca: {{ cert_file: \"{}\", key_file: \"{}\" }}",
            files.talos_ca_cert.display(),
            files.talos_ca_key.display()
        ),
        &format!(
            "    ca: {{ cert_file: \"{}\", key_file: \"{}\" }}\n    talos_ca: {{ cert_file: \"{}\" }}",
            files.client_ca_cert.display(),
            files.client_ca_key.display(),
            files.talos_ca_cert.display()
        ),
    );
    let error = load(&text).unwrap_err();
    assert!(
        error.contains("gateway.client_ca is a CA Talos trusts"),
        "{error}"
    );
}

#[test]
fn a_client_only_serving_ca_and_a_server_ca_as_client_ca_are_refused() {
    let files = GatewayFiles::new();
    // The talosconfig `ca` must verify the gateway: a client-only CA cannot.
    let other = generate::new_client_ca(
        NewKeyType::Ed25519,
        "other",
        Duration::from_secs(86400),
        OffsetDateTime::now_utc(),
    )
    .unwrap();
    let client_only = write_file(files.path(), "client-only.crt", &other.cert_pem, 0o644);
    let text = config_text(&files, "").replace(
        &format!("ca_file: \"{}\"", files.tls_ca.display()),
        &format!("ca_file: \"{}\"", client_only.display()),
    );
    let error = load(&text).unwrap_err();
    assert!(
        error.contains("gateway.client_ca refused [talos_ca_client_only]"),
        "{error}"
    );
    // A CA that can vouch for servers cannot be the gateway's client CA.
    let text = config_text(&files, "").replace(
        &format!(
            "client_ca: {{ cert_file: \"{}\", key_file: \"{}\" }}",
            files.client_ca_cert.display(),
            files.client_ca_key.display()
        ),
        &format!(
            "client_ca: {{ cert_file: \"{}\", key_file: \"{}\" }}",
            files.talos_ca_cert.display(),
            files.talos_ca_key.display()
        ),
    );
    let error = load(&text).unwrap_err();
    assert!(
        error.contains("gateway.client_ca refused [ca_not_client_only]"),
        "{error}"
    );
}

#[test]
fn bad_rules_and_failing_examples_stop_the_load() {
    let files = GatewayFiles::new();
    let rules = "      rules:\n        - { name: reset-sre, methods: [\"/machine.MachineService/Reset\"], groups: [sre] }\n";
    assert!(load(&config_text(&files, rules)).is_ok());
    let error = load(&config_text(
        &files,
        "      rules:\n        - { name: broken, methods: [\"Reset\"], roles: [os:admin] }\n",
    ))
    .unwrap_err();
    assert!(error.contains("gateway rule `broken`"), "{error}");
    let examples = format!(
        "{rules}      examples:\n        - {{ description: \"admins reset\", method: \"/machine.MachineService/Reset\", \
         roles: [os:admin], expect: allowed }}\n"
    );
    let error = load(&config_text(&files, &examples)).unwrap_err();
    assert!(
        error.contains("gateway example `admins reset` (/machine.MachineService/Reset) expected allowed but was refused by rule `reset-sre`"),
        "{error}"
    );
    let error = load(&config_text(&files, "      listen_on: x\n")).unwrap_err();
    assert!(error.contains("listen_on"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_shows_the_gateway_and_its_rules() {
    let files = GatewayFiles::new();
    let rules = "      rules:\n        - { name: no-upgrade, methods: [\"/machine.MachineService/Upgrade\"], refuse: true }\n        \
                 - { name: etcd-admins, methods: [\"/machine.MachineService/Etcd*\"], roles: [os:admin], groups: [sre] }\n";
    let path = write_file(files.path(), "config.yaml", &config_text(&files, rules), 0o600);
    let out = server_cli(&["check", "--config", &path.display().to_string()])
        .await
        .unwrap_or_else(|e| e);
    assert!(
        out.contains(
            "cluster prod: gateway on 127.0.0.1:0 for 127.0.0.1:50000, forwarding to 127.0.0.1:50000"
        ),
        "{out}"
    );
    assert!(
        out.contains("which Talos must not trust; 2 method rules"),
        "{out}"
    );
    assert!(
        out.contains("gateway rule no-upgrade: /machine.MachineService/Upgrade refused through the gateway"),
        "{out}"
    );
    assert!(
        out.contains(
            "gateway rule etcd-admins: /machine.MachineService/Etcd* only for roles os:admin or groups sre"
        ),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_moves_the_gateway_is_refused_and_rules_reload() {
    let files = GatewayFiles::new();
    let env = TestEnv::start_from_file(Backend::Sqlite, |yaml| {
        files.gateway_config(&yaml, "127.0.0.1:50000".parse().unwrap(), "")
    })
    .await;
    let file = env.config_file();
    let text = std::fs::read_to_string(&file).unwrap();
    let write = |path: &Path, text: &str| std::fs::write(path, text).unwrap();
    // Rules reload.
    write(
        &file,
        &text.replace(
            "      tls:",
            "      rules:\n        - { name: no-reset, methods: [\"/machine.MachineService/Reset\"], refuse: true }\n      tls:",
        ),
    );
    let changes = env
        .server
        .app
        .reload(talos_sso_server::app::reload::Trigger::Signal)
        .await
        .unwrap();
    assert_eq!(changes.clusters_changed, ["prod"]);
    // A new listener does not.
    write(
        &file,
        &text.replace("listen: \"127.0.0.1:0\"", "listen: \"127.0.0.1:1\""),
    );
    let error = env
        .server
        .app
        .reload(talos_sso_server::app::reload::Trigger::Signal)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("the gateway's listener, serving certificate or client CA changed"),
        "{error}"
    );
    env.finish().await;
}

/// The gateway's own certificate, as Go's `crypto/tls` (apid) takes it: in
/// cluster-CA mode (signed by `machine.ca`) and in accepted-CA mode (signed
/// by talos-sso's CA in `machine.acceptedCAs`), its Ed25519 key is accepted
/// and apid reads `os:impersonator` from it.
#[test]
fn go_s_apid_admits_the_gateway_s_own_certificate_in_both_modes() {
    use talos_sso_tests::go_tls::{self, Apid};
    let files = GatewayFiles::new();
    let accepted = generate::new_client_ca(
        NewKeyType::EcdsaP256,
        "prod",
        Duration::from_secs(86400),
        OffsetDateTime::now_utc() - time::Duration::hours(1),
    )
    .unwrap();
    let accepted_cert = write_file(files.path(), "accepted.crt", &accepted.cert_pem, 0o644);
    let accepted_key = write_file(files.path(), "accepted.key", &accepted.key_pem, 0o600);
    let cluster_ca_line = format!(
        "    ca: {{ cert_file: \"{}\", key_file: \"{}\" }}",
        files.talos_ca_cert.display(),
        files.talos_ca_key.display()
    );
    let accepted_mode = config_text(&files, "").replace(
        &cluster_ca_line,
        &format!(
            "    ca: {{ cert_file: \"{}\", key_file: \"{}\" }}\n    talos_ca: {{ cert_file: \"{}\" }}",
            accepted_cert.display(),
            accepted_key.display(),
            files.talos_ca_cert.display()
        ),
    );
    for (mode, text, pool) in [
        ("cluster-ca", config_text(&files, ""), files.talos_ca_pem.clone()),
        (
            "accepted-ca",
            accepted_mode,
            format!("{}{}", files.talos_ca_pem, accepted.cert_pem),
        ),
    ] {
        let clusters = load(&text).unwrap();
        let (signed, key_pem) =
            talos_sso_server::gateway::impersonator_certificate(&clusters["prod"], OffsetDateTime::now_utc())
                .unwrap();
        let apid = Apid::start(&files.node_cert_pem, &files.node_key_pem, &pool);
        let roles = go_tls::talosctl(apid.addr(), &files.talos_ca_pem, &signed.chain_pem, &key_pem);
        assert_eq!(roles.as_deref(), Ok("os:impersonator"), "{mode}");
        // apid without the CA in its pool refuses it.
        if mode == "accepted-ca" {
            let unlisted = Apid::start(&files.node_cert_pem, &files.node_key_pem, &files.talos_ca_pem);
            assert!(
                go_tls::talosctl(unlisted.addr(), &files.talos_ca_pem, &signed.chain_pem, &key_pem).is_err()
            );
        }
    }
}
