//! A login to a cluster in accepted-CA mode, judged by Go's standard
//! library (`talos_sso_tests::go_tls`): the talosconfig trusts the Talos CA
//! alone, and Go's talosctl stand-in with its `ca`, `crt` and `key` reaches
//! a node whose apid lists the client CA in `machine.acceptedCAs`, with the
//! person's roles, and is refused by one that does not.

use talos_sso_tests::go_tls::{self, Apid};
use talos_sso_tests::harness::{Backend, TestEnv, server_cli};

use super::{Machine, browser_login, context_fields};

/// The test configuration's `ca:` line of cluster `prod` replaced by the
/// client-only CA in `client_ca` (cert, key), with `talos_ca` naming the
/// Talos CA certificate the line named.
fn in_accepted_ca_mode(yaml: &str, client_ca: (&str, &str)) -> String {
    yaml.lines()
        .map(|line| {
            if !line.trim_start().starts_with("ca: {") {
                return line.to_owned();
            }
            let talos_ca_cert = line.split('"').nth(1).expect("the ca line names a cert_file");
            format!(
                "    ca: {{ cert_file: \"{}\", key_file: \"{}\" }}\n    talos_ca: {{ cert_file: \"{talos_ca_cert}\" }}",
                client_ca.0, client_ca.1
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_in_accepted_ca_mode_reaches_nodes_that_list_the_client_ca() {
    let files = tempfile::tempdir().unwrap();
    let cert = files.path().join("client-ca.crt").display().to_string();
    let key = files.path().join("client-ca.key").display().to_string();
    let made = server_cli(&[
        "ca",
        "client-ca",
        "--cluster",
        "prod",
        "--out-cert",
        &cert,
        "--out-key",
        &key,
    ])
    .await
    .unwrap();
    assert!(made.contains("ca patch add"), "{made}");
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| in_accepted_ca_mode(&yaml, (&cert, &key))).await;
    let talos_ca = std::fs::read_to_string(&env.work.ca_cert).unwrap();
    let client_ca = std::fs::read_to_string(&cert).unwrap();

    let machine = Machine::new();
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    let (ca, crt, key_pem) = context_fields(&machine.talosconfig(), "prod");
    assert_eq!(ca, talos_ca, "the talosconfig trusts the Talos CA alone");

    let (node_cert, node_key) =
        go_tls::server_certificate_from_pem(&talos_ca, &std::fs::read_to_string(&env.work.ca_key).unwrap());
    let listed = Apid::start(&node_cert, &node_key, &format!("{talos_ca}{client_ca}"));
    assert_eq!(
        go_tls::talosctl(listed.addr(), &ca, &crt, &key_pem).unwrap(),
        "os:operator"
    );

    let unlisted = Apid::start(&node_cert, &node_key, &talos_ca);
    let refused = go_tls::talosctl(unlisted.addr(), &ca, &crt, &key_pem).unwrap_err();
    assert!(refused.contains("reading apid's answer"), "{refused}");
    let logged = unlisted.next_log_line().unwrap();
    assert!(
        logged.contains("refused: tls: client didn't provide a certificate"),
        "{logged}"
    );
    env.finish().await;
}
