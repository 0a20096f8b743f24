//! The CA tools of accepted-CA mode, run as an operator runs them:
//! `ca client-ca` makes the client-only CA, `ca talos-ca` writes the Talos
//! cluster CA certificate alone (leaving any key behind), and `ca inspect`
//! with `--talos-ca-*` says what the server would make of them, refusing a
//! source that carries a key.

use std::os::unix::fs::PermissionsExt;

use base64::Engine;
use talos_sso_server::ca::parse_certificates;
use talos_sso_tests::material::{fixture, read_fixture};

/// `talos-sso-server ARGS`, in this process
/// ([`talos_sso_tests::harness::server_cli`]), from a synchronous test.
fn server(args: &[&str]) -> Result<String, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(talos_sso_tests::harness::server_cli(args))
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn the_ca_tools_make_and_check_an_accepted_ca_setup() {
    let dir = tempfile::tempdir().unwrap();
    let client_cert = dir.path().join("prod-client-ca.crt");
    let client_key = dir.path().join("prod-client-ca.key");
    let made = server(&[
        "ca",
        "client-ca",
        "--cluster",
        "prod",
        "--out-cert",
        path(&client_cert),
        "--out-key",
        path(&client_key),
    ])
    .unwrap();
    assert!(made.contains("OU=prod,O=talos-sso"), "{made}");
    assert!(
        made.contains("ca patch add --ca-cert"),
        "the next step is named: {made}"
    );
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&client_key), mode(&client_cert)), (0o600, 0o644));
    let again = server(&[
        "ca",
        "client-ca",
        "--cluster",
        "prod",
        "--out-cert",
        path(&client_cert),
        "--out-key",
        path(&dir.path().join("other.key")),
    ])
    .unwrap_err();
    assert!(
        again.contains("already exists; refusing to overwrite it"),
        "{again}"
    );

    // The Talos CA certificate from an administrator's talosconfig: its
    // `ca`, and nothing of its key.
    let talosconfig = fixture("talos/talosconfig-2021-admin.yaml");
    let talos_ca = dir.path().join("talos-ca.crt");
    server(&[
        "ca",
        "talos-ca",
        "--talosconfig",
        path(&talosconfig),
        "--out-cert",
        path(&talos_ca),
    ])
    .unwrap();
    let written = std::fs::read_to_string(&talos_ca).unwrap();
    assert!(!written.contains("PRIVATE KEY"));
    let yaml: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read_fixture("talos/talosconfig-2021-admin.yaml")).unwrap();
    let current = yaml["context"].as_str().unwrap();
    let expected = base64::engine::general_purpose::STANDARD
        .decode(yaml["contexts"][current]["ca"].as_str().unwrap())
        .unwrap();
    assert_eq!(
        parse_certificates(&written, "written").unwrap()[0].der,
        parse_certificates(std::str::from_utf8(&expected).unwrap(), "fixture").unwrap()[0].der
    );
    // From a control plane's machine config, whose CA key stays behind.
    let from_config = dir.path().join("talos-ca-from-config.crt");
    server(&[
        "ca",
        "talos-ca",
        "--machine-config",
        path(&fixture("talos/controlplane-v1.12.yaml")),
        "--out-cert",
        path(&from_config),
    ])
    .unwrap();
    assert!(
        !std::fs::read_to_string(&from_config)
            .unwrap()
            .contains("PRIVATE KEY")
    );

    // What the server would make of them.
    let client = ["--cert-file", path(&client_cert), "--key-file", path(&client_key)];
    let inspect = |extra: &[&str]| {
        let args: Vec<&str> = ["ca", "inspect"]
            .into_iter()
            .chain(client)
            .chain(extra.iter().copied())
            .collect();
        server(&args)
    };
    let alone = inspect(&[]).unwrap_err();
    assert!(alone.contains("ca_client_only_without_talos_ca"), "{alone}");
    let accepted = inspect(&["--talos-ca-cert-file", path(&talos_ca)]).unwrap();
    assert!(accepted.contains("mode:        accepted-ca"), "{accepted}");
    assert!(accepted.contains("subject:     O=talos"), "{accepted}");
    let cluster_key = inspect(&[
        "--talos-ca-machine-config",
        path(&fixture("talos/controlplane-v1.12.yaml")),
    ])
    .unwrap_err();
    assert!(cluster_key.contains("talos_ca_key_present"), "{cluster_key}");
    let client_key_in_config = inspect(&["--talos-ca-talosconfig", path(&talosconfig)]).unwrap_err();
    assert!(
        client_key_in_config.contains("talos_ca_client_key_present"),
        "{client_key_in_config}"
    );

    // talos_ca must be the cluster CA: not the client CA, nor another
    // client-only CA, with which talosctl could not verify apid.
    let itself = inspect(&["--talos-ca-cert-file", path(&client_cert)]).unwrap_err();
    assert!(itself.contains("talos_ca_is_signer"), "{itself}");
    let other = dir.path().join("other-client-ca.crt");
    server(&[
        "ca",
        "client-ca",
        "--cluster",
        "staging",
        "--out-cert",
        path(&other),
        "--out-key",
        path(&dir.path().join("other-client-ca.key")),
    ])
    .unwrap();
    let client_only = inspect(&["--talos-ca-cert-file", path(&other)]).unwrap_err();
    assert!(client_only.contains("talos_ca_client_only"), "{client_only}");

    // `ca patch add` lists only a client-only CA in acceptedCAs: the Talos
    // CA (or any CA that can vouch for a server) is refused.
    let server_ca = server(&["ca", "patch", "add", "--ca-cert", path(&talos_ca)]).unwrap_err();
    assert!(server_ca.contains("can vouch for servers"), "{server_ca}");
    let client_ok = server(&["ca", "patch", "add", "--ca-cert", path(&client_cert)]).unwrap();
    assert!(client_ok.contains("== append form"), "{client_ok}");

    // The names `ca patch` lists come from a node's config: a control
    // sequence or a bidirectional override in a listed CA's subject reaches
    // the terminal escaped.
    let hostile = talos_sso_server::ca::generate::new_client_ca(
        talos_sso_server::ca::generate::NewKeyType::Ed25519,
        "evil\u{1b}[2J\u{202e}",
        std::time::Duration::from_secs(86400),
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    let current = dir.path().join("node.yaml");
    std::fs::write(
        &current,
        format!(
            "version: v1alpha1\nmachine:\n  acceptedCAs:\n    - crt: {}\n",
            base64::engine::general_purpose::STANDARD.encode(&hostile.cert_pem)
        ),
    )
    .unwrap();
    let listed = server(&[
        "ca",
        "patch",
        "add",
        "--ca-cert",
        path(&client_cert),
        "--current",
        path(&current),
    ])
    .unwrap();
    assert!(
        !listed.contains('\u{1b}') && !listed.contains('\u{202e}'),
        "{listed:?}"
    );
    assert!(listed.contains("OU=evil"), "{listed}");

    // The Talos CA itself as the signer of an accepted-CA cluster: it can
    // vouch for servers, so it is refused.
    let bundle = fixture("talos/secrets-bundle.yaml");
    let private_bundle = dir.path().join("secrets.yaml");
    std::fs::copy(&bundle, &private_bundle).unwrap();
    std::fs::set_permissions(&private_bundle, std::fs::Permissions::from_mode(0o600)).unwrap();
    let root_as_client_ca = server(&[
        "ca",
        "inspect",
        "--secrets-bundle",
        path(&private_bundle),
        "--talos-ca-cert-file",
        path(&talos_ca),
    ])
    .unwrap_err();
    assert!(
        root_as_client_ca.contains("ca_not_client_only"),
        "{root_as_client_ca}"
    );
}
