//! A login to a gateway cluster with the real CLI: the talosconfig's
//! context points at the gateway and trusts its serving CA, and talosctl's
//! stand-ins (tonic, and Go's standard library) reach apid through it with
//! that talosconfig and the person's roles; the same certificate is refused
//! by apid directly. The security team finds the call with `audit list
//! --event api.call --node`, and the exported trail, API calls included,
//! verifies with the CLI and with the independent script.

use serde_yaml_ng::Value;
use talos_sso_tests::gateway_files::{GATEWAY_ENDPOINT_PLACEHOLDER, GatewayFiles};
use talos_sso_tests::grpc_client::{Call, ClientKind, TalosContext};
use talos_sso_tests::harness::{Backend, TestEnv};
use talos_sso_tests::standin_apid::StandinApid;
use talos_sso_tests::standin_apid::proto::{self, VersionReply};

use super::{Machine, assert_verifies_offline, auditor, browser_login, context_fields};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_to_a_gateway_cluster_reaches_apid_through_the_gateway_only() {
    let files = GatewayFiles::new();
    let standin = StandinApid::start(files.standin_config()).await.unwrap();
    let upstream = standin.addr();
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| files.gateway_config(&yaml, upstream, "")).await;
    let gateway = env.server.gateways[0].1;

    let machine = Machine::new();
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    let talosconfig = machine.talosconfig();
    let yaml: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&talosconfig).unwrap()).unwrap();
    assert_eq!(
        yaml["contexts"]["prod"]["endpoints"],
        serde_yaml_ng::to_value([GATEWAY_ENDPOINT_PLACEHOLDER]).unwrap(),
        "the context's endpoints are the gateway's"
    );
    let (ca, crt, key) = context_fields(&talosconfig, "prod");
    assert_eq!(ca, files.tls_ca_pem, "the context's ca verifies the gateway");

    // The configured endpoint's port is a placeholder: dial where the
    // gateway listens, verifying the name the talosconfig gives.
    let context = TalosContext::from_talosconfig(&talosconfig, Some("prod"))
        .unwrap()
        .at(gateway.to_string());
    for client in [ClientKind::Tonic, ClientKind::Go] {
        let version = client.call(&context, &Call::unary(proto::VERSION)).await;
        assert!(version.ok(), "{client:?}: {version:?}");
        assert_eq!(
            version.decode::<VersionReply>(0).roles,
            ["os:operator"],
            "{client:?}"
        );
    }
    // Straight to apid, the same certificate is refused at the handshake.
    let direct = TalosContext::new(upstream.to_string(), &files.talos_ca_pem, &crt, &key);
    let refused = ClientKind::Go.call(&direct, &Call::unary(proto::VERSION)).await;
    assert!(!refused.ok(), "{refused:?}");
    let refusals = standin
        .wait_for_refusals(std::time::Duration::from_secs(30), 1)
        .await
        .expect("apid refused the handshake");
    // Go's client may dial again after a refused handshake: every dial is
    // refused, and apid sees no call from it (below).
    assert!(
        refusals.iter().all(|r| r.contains("peer sent no certificates")),
        "{refusals:?}"
    );
    assert_eq!(
        standin
            .calls()
            .iter()
            .filter(|c| c.method == proto::VERSION)
            .count(),
        2,
        "apid saw the gateway's two calls and nothing else"
    );
    // A reboot of 10.5.0.2, found by the security team with one command.
    let reboot = ClientKind::Go
        .call(&context, &Call::unary(proto::REBOOT).with("nodes", "10.5.0.2"))
        .await;
    assert!(reboot.ok(), "{reboot:?}");
    let sam = auditor(&env).await;
    let (code, out, err) = sam
        .run(&[
            "audit", "list", "--event", "api.call", "--node", "10.5.0.2", "--output", "json",
        ])
        .await;
    assert_eq!(code, 0, "{err}");
    let found: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let outcomes: Vec<&str> = found.iter().map(|r| r["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["started", "success"], "{out}");
    assert!(
        found
            .iter()
            .all(|r| r["details"]["method"] == proto::REBOOT && r["username"] == "bob@example.com")
    );
    // The trail with its API calls verifies offline, by the CLI and by an
    // implementation of docs/audit.md that shares no code with talos-sso.
    let (code, exported, err) = sam.run(&["audit", "export", "--output", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(exported.contains("\"event\":\"gateway.certificate_issued\""));
    assert_verifies_offline(&sam, &exported).await;
    env.finish().await;
    standin.shutdown().await;
}
