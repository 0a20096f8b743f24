//! Workload certificates through the access gateway, as people's go: a
//! Kubernetes service account's certificate is signed by the gateway's
//! client CA, useless at apid directly, and each call it makes through the
//! gateway reaches apid with the workload's roles and is recorded under
//! the workload's subject; the deny list cuts it off by that subject.

use serde_json::json;
use talos_sso::key::ClientKey;
use talos_sso_tests::gateway_env::{Gateway, PATIENCE, api_calls, method_of, version_roles};
use talos_sso_tests::gateway_files::GATEWAY_ENDPOINT_PLACEHOLDER;
use talos_sso_tests::grpc_client::{Call, ClientKind, TalosContext};
use talos_sso_tests::harness::Backend;
use talos_sso_tests::standin_apid::proto;
use talos_sso_tests::workload_tokens::{Alg, WorkloadIssuer, kubernetes_claims};

const AUDIENCE: &str = "talos-sso";
const SUBJECT: &str = "k8s:system:serviceaccount:backup:talos-backup";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_s_calls_go_through_the_gateway_as_a_person_s() {
    let k8s = WorkloadIssuer::new("https://kubernetes.default.svc", Alg::Es256);
    let trusted = format!(
        "identity:\n  trusted_issuers:\n    - {{ name: k8s, kind: kubernetes, issuer: \"{}\", jwks_file: \"{}\", audiences: [{AUDIENCE}] }}\n",
        k8s.issuer,
        k8s.jwks_file.display()
    );
    let workloads = "    workloads:\n      - { name: inventory, issuer: k8s, claims: { namespace: backup, service_account: talos-backup }, roles: [os:reader] }\n    rules:\n";
    let gw = Gateway::start_with(Backend::Sqlite, "", |yaml| {
        yaml.replacen("identity:\n", &trusted, 1)
            .replacen("    rules:\n", workloads, 1)
    })
    .await;

    let key = ClientKey::generate().unwrap();
    let token = k8s.sign(&kubernetes_claims(&k8s, AUDIENCE, "backup", "talos-backup"));
    let response = gw
        .env
        .http
        .post(format!("{}/v1/certificates", gw.env.server.base_url))
        .bearer_auth(token)
        .json(&json!({"cluster": "prod", "csr": key.csr_pem().unwrap()}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let answer: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        (&answer["endpoints"], answer["ca"].as_str()),
        (
            &json!([GATEWAY_ENDPOINT_PLACEHOLDER]),
            Some(gw.files.tls_ca_pem.as_str())
        ),
        "the talosconfig names the gateway and verifies it"
    );
    let context = TalosContext::new(
        gw.address().to_string(),
        answer["ca"].as_str().unwrap(),
        answer["certificate"].as_str().unwrap(),
        &key.private_key_pem(),
    );

    // Through the gateway: the workload's role, and Talos's RBAC on it.
    for client in [ClientKind::Tonic, ClientKind::Go] {
        let version = client.call(&context, &Call::unary(proto::VERSION)).await;
        assert_eq!(version_roles(&version), ["os:reader"], "{client:?}");
        let reboot = client.call(&context, &Call::unary(proto::REBOOT)).await;
        assert_eq!(
            (reboot.code, reboot.message.as_str()),
            (7, "not authorized"),
            "{client:?}"
        );
    }
    let seen = gw.seen(proto::VERSION);
    assert_eq!(seen.len(), 2);
    for call in &seen {
        assert_eq!(call.certificate_roles, ["os:impersonator"]);
        assert_eq!(call.metadata_roles, ["os:reader"]);
    }
    // Every call is recorded under the workload: its subject, its CN.
    let calls = api_calls(gw.env.server.app.audit.store()).await;
    let reboots: Vec<_> = calls.iter().filter(|r| method_of(r) == proto::REBOOT).collect();
    assert!(!reboots.is_empty(), "{calls:?}");
    for record in &reboots {
        assert_eq!(record.record.subject.as_deref(), Some(SUBJECT));
        assert_eq!(
            record.record.username.as_deref(),
            Some("kubernetes:system:serviceaccount:backup:talos-backup")
        );
    }

    // At apid directly, the workload's certificate is refused.
    let direct = TalosContext::new(
        gw.standin.addr().to_string(),
        &gw.files.talos_ca_pem,
        answer["certificate"].as_str().unwrap(),
        &key.private_key_pem(),
    );
    let refused = ClientKind::Tonic
        .call(&direct, &Call::unary(proto::VERSION))
        .await;
    assert!(!refused.ok(), "{refused:?}");
    gw.standin
        .wait_for_refusals(PATIENCE, 1)
        .await
        .expect("apid refused the handshake");

    // The deny list names the service account: its next call that changes
    // a node is refused before apid sees it (the deny list is read in the
    // transaction of the call's first record; reads follow within a second).
    gw.deny(SUBJECT).await;
    let reboots_before = gw.seen(proto::REBOOT).len();
    let after = ClientKind::Tonic
        .call(&context, &Call::unary(proto::REBOOT))
        .await;
    assert_eq!(
        (after.code, after.message.as_str()),
        (
            7,
            "talos-sso gateway: you are on the deny list; ask the platform team"
        ),
        "{after:?}"
    );
    assert_eq!(
        gw.seen(proto::REBOOT).len(),
        reboots_before,
        "apid saw nothing more"
    );
    gw.env.finish().await;
    gw.standin.shutdown().await;
}
