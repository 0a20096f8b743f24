//! The access gateway end to end: a real server with a gateway cluster in
//! front of the gRPC stand-in apid (`standin_apid`, authorizing as Talos's
//! injector does), driven by three clients nobody here wrote the transport
//! of: tonic, Go's standard library (`net/http`'s HTTP/2), and gRPC's C
//! core through Python's grpcio. Calls carry the person's roles and no
//! more; Talos's RBAC still applies; per-method rules refuse before apid
//! sees a call; mutating calls are in the trail before apid sees them and
//! none goes through without its record; read-only calls and repeated
//! refusals are counted; a deny-list entry ends running streams within 5 s
//! on every replica; cancellation reaches apid.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use talos_sso_server::audit::{StoredRecord, outcome};
use talos_sso_tests::gateway_env::{Gateway, PATIENCE, api_calls, gateway_address, method_of, version_roles};
use talos_sso_tests::grpc_client::{Call, ClientKind, TalosContext};
use talos_sso_tests::harness::Backend;
use talos_sso_tests::standin_apid::SeenCall;
use talos_sso_tests::standin_apid::proto::{self, Done};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_gets_the_person_s_roles_and_no_more() {
    let gw = Gateway::start(Backend::Sqlite, "").await;
    let (bob, answer) = gw.login("bob@example.com", &[]).await;
    assert_eq!(
        answer["ca"].as_str().unwrap(),
        gw.files.tls_ca_pem,
        "the talosconfig verifies the gateway"
    );
    let bob_p256 = gw.login_p256("bob@example.com", &[]).await;
    for client in ClientKind::ALL {
        let context = if client == ClientKind::Grpcio {
            &bob_p256
        } else {
            &bob
        };
        let plain = client.call(context, &Call::unary(proto::VERSION)).await;
        assert_eq!(version_roles(&plain), ["os:operator"], "{client:?}");
        // Asking for more through talos-role gets nothing more, and a
        // claim to be another apid (`proxyfrom`) never reaches apid.
        let forged = Call::unary(proto::VERSION)
            .with("talos-role", "os:admin")
            .with("talos-role", "os:impersonator")
            .with("proxyfrom", "10.5.0.1");
        assert_eq!(
            version_roles(&client.call(context, &forged).await),
            ["os:operator"],
            "{client:?}"
        );
        // Talos's RBAC still applies through the gateway: operators may not reset.
        let reset = client.call(context, &Call::unary(proto::RESET)).await;
        assert_eq!(
            (reset.code, reset.message.as_str()),
            (7, "not authorized"),
            "{client:?}"
        );
        let reboot = client
            .call(context, &Call::unary(proto::REBOOT).with("nodes", "10.5.0.2"))
            .await;
        assert!(reboot.ok(), "{client:?}: {reboot:?}");
        assert_eq!(reboot.decode::<Done>(0).roles, ["os:operator"]);
    }
    // apid saw the gateway's certificate, and only the person's role.
    let versions = gw.seen(proto::VERSION);
    assert_eq!(versions.len(), 6);
    for call in &versions {
        assert!(call.metadata_values("proxyfrom").is_empty(), "{call:?}");
        assert_eq!(call.certificate_roles, ["os:impersonator"]);
        assert_eq!(call.certificate_common_name.as_deref(), Some("talos-sso gateway"));
        assert_eq!(call.metadata_roles, ["os:operator"]);
    }
    // Every mutating call was in the trail when apid saw it.
    let mutating: Vec<SeenCall> = gw
        .standin
        .calls()
        .into_iter()
        .filter(|c| c.method == proto::REBOOT || c.method == proto::RESET)
        .collect();
    assert_eq!(mutating.len(), 6);
    for call in &mutating {
        assert_eq!(call.hook, Some(Ok("started".to_owned())), "{call:?}");
    }
    let records = api_calls(gw.env.server.app.audit.store()).await;
    let reboots: Vec<&StoredRecord> = records.iter().filter(|r| method_of(r) == proto::REBOOT).collect();
    assert_eq!(reboots.len(), 6, "a started and an end record each");
    for record in &reboots {
        let r = &record.record;
        assert_eq!(r.username.as_deref(), Some("bob@example.com"));
        assert_eq!(r.details["nodes"], json!(["10.5.0.2"]));
        assert_eq!(r.details["class"], "mutating");
        assert!(r.serial.is_some());
    }
    let ended: Vec<&StoredRecord> = reboots
        .iter()
        .filter(|r| r.record.outcome == outcome::SUCCESS)
        .copied()
        .collect();
    assert_eq!(ended.len(), 3);
    assert_eq!(ended[0].record.details["grpc_status"], 0);
    let resets: Vec<&StoredRecord> = records.iter().filter(|r| method_of(r) == proto::RESET).collect();
    assert_eq!(
        resets
            .iter()
            .filter(|r| r.record.outcome == outcome::FAILED && r.record.details["grpc_status"] == 7)
            .count(),
        3,
        "apid's refusal is the recorded outcome"
    );
    // "Who rebooted 10.5.0.2?" is one query of the trail, for an auditor.
    let answer: Value = gw
        .env
        .http
        .get(format!("{}/v1/audit", gw.env.server.base_url))
        .query(&[
            ("event", "api.call"),
            ("method", proto::REBOOT),
            ("node", "10.5.0.2"),
            ("since", "7d"),
        ])
        .bearer_auth(gw.token("sam@example.com"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let found = answer["records"].as_array().unwrap();
    assert_eq!(found.len(), 6, "{answer}");
    assert!(found.iter().all(|r| r["username"] == "bob@example.com"));
    // Read-only calls are counted when the minute ends, or at shutdown.
    let store = gw.env.server.app.audit.store().clone();
    let Gateway { env, standin, .. } = gw;
    env.server.stop().await;
    let counted: u64 = api_calls(&store)
        .await
        .iter()
        .filter(|r| method_of(r) == proto::VERSION)
        .map(|r| r.record.details["calls"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, 6);
    let chain = store.verify_chain().await.unwrap();
    assert!(chain.first_broken.is_none(), "{chain:?}");
    standin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_method_rules_refuse_before_apid_sees_the_call() {
    let rules = "      rules:\n        \
        - { name: no-reset-here, methods: [\"/machine.MachineService/Reset\"], refuse: true }\n        \
        - { name: reboot-needs-sre, methods: [\"/machine.MachineService/Reb*\"], groups: [sre-oncall] }\n";
    let gw = Gateway::start(Backend::Sqlite, rules).await;
    let (alice, _) = gw.login("alice@example.com", &["os:admin"]).await;
    let (bob, _) = gw.login("bob@example.com", &[]).await;
    for client in [ClientKind::Tonic, ClientKind::Go] {
        let reset = client.call(&alice, &Call::unary(proto::RESET)).await;
        assert_eq!(reset.code, 7, "{client:?}");
        assert_eq!(
            reset.message,
            "refused by talos-sso gateway rule `no-reset-here`: this method is not allowed through the gateway"
        );
        let reboot = client.call(&bob, &Call::unary(proto::REBOOT)).await;
        assert_eq!(reboot.code, 7, "{client:?}");
        assert!(
            reboot.message.contains("rule `reboot-needs-sre`"),
            "{}",
            reboot.message
        );
        // Unruled methods go through.
        assert!(client.call(&bob, &Call::unary(proto::VERSION)).await.ok());
    }
    assert!(gw.seen(proto::RESET).is_empty() && gw.seen(proto::REBOOT).is_empty());
    // The first refusal of each person and reason is recorded at once...
    let store = gw.env.server.app.audit.store().clone();
    let denied = |records: Vec<StoredRecord>| -> Vec<StoredRecord> {
        records
            .into_iter()
            .filter(|r| r.record.outcome == outcome::DENIED)
            .collect()
    };
    let at_once = denied(api_calls(&store).await);
    assert_eq!(at_once.len(), 2, "{at_once:?}");
    // ...and a refusal repeated a thousand times adds one record, not a
    // thousand: counted, and recorded when the minute ends (or at stop).
    let client = talos_sso_tests::grpc_client::GrpcClient::connect(&alice).unwrap();
    for _ in 0..1000 {
        assert_eq!(client.call(&Call::unary(proto::RESET)).await.code, 7);
    }
    assert_eq!(denied(api_calls(&store).await).len(), 2);
    let Gateway { env, standin, .. } = gw;
    env.server.stop().await;
    let refused = denied(api_calls(&store).await);
    assert_eq!(refused.len(), 4, "{refused:?}");
    let counted: u64 = refused
        .iter()
        .map(|r| r.record.details["calls"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, 1004);
    for record in &refused {
        assert_eq!(record.record.reason_code.as_deref(), Some("gateway_rule"));
        assert!(record.record.details["rule"].is_string());
    }
    standin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_list_entry_ends_running_calls_within_five_seconds_on_every_replica() {
    let gw = Gateway::start(Backend::Postgres, "").await;
    let replica = gw.env.another_server().await;
    let (bob, answer) = gw.login("bob@example.com", &[]).await;
    let bob_at_replica = bob.at(gateway_address(&replica).to_string());
    let subject = answer["identity"]["subject"].as_str().unwrap().to_owned();
    let follow = |context: TalosContext, client: ClientKind| {
        tokio::spawn(async move {
            client
                .call(&context, &Call::server_stream(proto::LOGS, None))
                .await
        })
    };
    let here = follow(bob.clone(), ClientKind::Tonic);
    let there = follow(bob_at_replica.clone(), ClientKind::Go);
    gw.standin
        .wait_for(PATIENCE, |calls| {
            calls.iter().filter(|c| c.method == proto::LOGS).count() == 2
        })
        .await
        .expect("both streams running");
    let denied_at = Instant::now();
    gw.deny(&subject).await;
    for stream in [here, there] {
        let ended = tokio::time::timeout(Duration::from_secs(5), stream)
            .await
            .expect("the stream ends within 5 s of the deny-list entry")
            .unwrap();
        assert_eq!(ended.code, 7, "{ended:?}");
        assert!(ended.message.contains("deny list"), "{}", ended.message);
        assert!(!ended.sizes.is_empty(), "the stream was running: {ended:?}");
    }
    let took = denied_at.elapsed();
    // apid sees both calls cancelled.
    gw.wait_cancelled(proto::LOGS, 2).await;
    // New connections are refused on both replicas, before apid.
    for context in [&bob, &bob_at_replica] {
        let refused = ClientKind::Tonic
            .call(context, &Call::unary(proto::VERSION))
            .await;
        assert!(!refused.ok() && refused.transport_error.is_some(), "{refused:?}");
    }
    assert!(gw.seen(proto::VERSION).is_empty());
    println!("streams ended {} ms after the deny-list entry", took.as_millis());
    replica.stop().await;
    gw.env.finish().await;
    gw.standin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_client_cancels_apid_and_no_record_means_no_call() {
    let gw = Gateway::start(Backend::Postgres, "").await;
    let (bob, _) = gw.login("bob@example.com", &[]).await;
    for client in ClientKind::ALL {
        let context = if client == ClientKind::Grpcio {
            gw.login_p256("bob@example.com", &[]).await
        } else {
            bob.clone()
        };
        let taken = client
            .call(&context, &Call::server_stream(proto::LOGS, Some(3)))
            .await;
        assert_eq!(taken.sizes.len(), 3, "{client:?}: {taken:?}");
    }
    gw.wait_cancelled(proto::LOGS, 3).await;

    // With the trail unreachable, a mutating call is not forwarded.
    let client = talos_sso_tests::grpc_client::GrpcClient::connect(&bob).unwrap();
    assert!(
        client.call(&Call::unary(proto::VERSION)).await.ok(),
        "connection admitted"
    );
    let database = gw.env.database.as_ref().unwrap();
    database.cut().await;
    let reboot = client.call(&Call::unary(proto::REBOOT)).await;
    assert_eq!(reboot.code, 14, "{reboot:?}");
    assert!(
        reboot.message.contains("audit trail is unavailable"),
        "{}",
        reboot.message
    );
    assert!(gw.seen(proto::REBOOT).is_empty(), "no record, no call");
    database.restore().await;
    let reboot = client.call(&Call::unary(proto::REBOOT)).await;
    assert!(reboot.ok(), "{reboot:?}");
    // The cancelled streams are counted when the gateway stops, each with
    // CANCELLED; the reboot has its two records.
    let store = gw.store.get().unwrap().clone();
    let Gateway { env, standin, .. } = gw;
    env.server.stop().await;
    let records = api_calls(&store).await;
    let logs: Vec<&StoredRecord> = records.iter().filter(|r| method_of(r) == proto::LOGS).collect();
    assert_eq!(
        logs.iter()
            .map(|r| r.record.details["calls"].as_u64().unwrap())
            .sum::<u64>(),
        3
    );
    assert!(
        logs.iter()
            .all(|r| r.record.details["statuses"]["1"].as_u64().is_some()),
        "{logs:?}"
    );
    let reboots: Vec<&str> = records
        .iter()
        .filter(|r| method_of(r) == proto::REBOOT)
        .map(|r| r.record.outcome.as_str())
        .collect();
    assert_eq!(reboots, [outcome::STARTED, outcome::SUCCESS]);
    if let Some(database) = &env.database {
        database.drop_now().await;
    }
    standin.shutdown().await;
}
