//! The access gateway end to end: a real server with a gateway cluster in
//! front of the gRPC stand-in apid (`standin_apid`, authorizing as Talos's
//! injector does), driven by three clients nobody here wrote the transport
//! of: tonic, Go's standard library (`net/http`'s HTTP/2), and gRPC's C
//! core through Python's grpcio. Calls carry the person's roles and no
//! more; Talos's RBAC still applies; per-method rules refuse before apid
//! sees a call; mutating calls are in the trail before apid sees them and
//! none goes through without its record; read-only calls are counted; a
//! deny-list entry ends running streams within 5 s on every replica;
//! cancellation, trailers, status codes and 32 MiB messages pass through;
//! certificates from elsewhere are refused.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use talos_sso::key::ClientKey;
use talos_sso_server::audit::store::{AuditFilter, AuditStore};
use talos_sso_server::audit::{StoredRecord, event, outcome};
use talos_sso_tests::emulator::TokenKind;
use talos_sso_tests::gateway_files::GatewayFiles;
use talos_sso_tests::grpc_client::{Call, CallOutcome, ClientKind, TalosContext, sha256_hex};
use talos_sso_tests::harness::{Backend, TestEnv, TestServer};
use talos_sso_tests::standin_apid::proto::{self, Count, Done, VersionReply};
use talos_sso_tests::standin_apid::{self, SeenCall, StandinApid};

/// Long enough for any call here on a loaded machine; never waited out
/// when things work.
const PATIENCE: Duration = Duration::from_secs(30);

/// A gateway cluster: its files, the stand-in apid, the server.
struct Gateway {
    files: GatewayFiles,
    standin: StandinApid,
    env: TestEnv,
    /// The trail, for the stand-in's hook (set once the server runs).
    store: Arc<OnceLock<AuditStore>>,
}

impl Gateway {
    async fn start(backend: Backend, extra: &str) -> Gateway {
        let files = GatewayFiles::new();
        let store: Arc<OnceLock<AuditStore>> = Arc::default();
        let hook_store = store.clone();
        // On every call apid sees: is the call's record already in the
        // trail? (`Ok` names what was found.)
        let hook = standin_apid::hook(move |call: SeenCall| {
            let store = hook_store.clone();
            async move {
                let store = store.get().ok_or("no store yet")?.clone();
                let request_id = call
                    .metadata_values("talos-sso-request-id")
                    .first()
                    .map(|v| (*v).to_owned())
                    .ok_or("no talos-sso-request-id")?;
                let found = api_calls(&store).await;
                found
                    .iter()
                    .find(|r| r.record.request_id == request_id)
                    .map(|r| r.record.outcome.clone())
                    .ok_or_else(|| format!("no record of {request_id} yet"))
            }
        });
        let standin = StandinApid::start(
            standin_apid::Config::new(&files.node_cert_pem, &files.node_key_pem, &files.talos_ca_pem)
                .with_hook(hook),
        )
        .await
        .expect("stand-in apid");
        let upstream = standin.addr();
        let env = TestEnv::start_with(backend, |yaml| files.gateway_config(&yaml, upstream, extra)).await;
        let _ = store.set(env.server.app.audit.store().clone());
        Gateway {
            files,
            standin,
            env,
            store,
        }
    }

    fn address(&self) -> SocketAddr {
        gateway_address(&self.env.server)
    }

    fn token(&self, user: &str) -> String {
        self.env.emulator.token_for(user, TokenKind::id()).expect("token")
    }

    /// A certificate for `user` through the API, for an Ed25519 key of the
    /// CLI's kind: the context to reach the gateway with.
    async fn login(&self, user: &str, roles: &[&str]) -> (TalosContext, Value) {
        let key = ClientKey::generate().expect("key");
        let csr = key.csr_pem().expect("csr");
        let answer = self.certificate(user, roles, &csr).await;
        let context = TalosContext::new(
            self.address().to_string(),
            answer["ca"].as_str().unwrap(),
            answer["certificate"].as_str().unwrap(),
            &key.private_key_pem(),
        );
        (context, answer)
    }

    /// A certificate for a P-256 key and CSR made by OpenSSL (grpcio's TLS
    /// signs with no Ed25519 key).
    async fn login_p256(&self, user: &str, roles: &[&str]) -> TalosContext {
        let dir = tempfile::tempdir().unwrap();
        let (key, csr) = (dir.path().join("key.pem"), dir.path().join("csr.pem"));
        let status = std::process::Command::new("openssl")
            .args([
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
            ])
            .args(["-subj", "/CN=grpcio", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&csr)
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        let answer = self
            .certificate(user, roles, &std::fs::read_to_string(&csr).unwrap())
            .await;
        TalosContext::new(
            self.address().to_string(),
            answer["ca"].as_str().unwrap(),
            answer["certificate"].as_str().unwrap(),
            &std::fs::read_to_string(&key).unwrap(),
        )
    }

    async fn certificate(&self, user: &str, roles: &[&str], csr: &str) -> Value {
        let response = self
            .env
            .http
            .post(format!("{}/v1/certificates", self.env.server.base_url))
            .bearer_auth(self.token(user))
            .json(&json!({"cluster": "prod", "csr": csr, "roles": roles}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        response.json().await.unwrap()
    }

    /// The stand-in's calls of `method`.
    fn seen(&self, method: &str) -> Vec<SeenCall> {
        self.standin
            .calls()
            .into_iter()
            .filter(|c| c.method == method)
            .collect()
    }

    async fn deny(&self, subject: &str) {
        let response = self
            .env
            .http
            .post(format!("{}/v1/deny", self.env.server.base_url))
            .bearer_auth(self.token("alice@example.com"))
            .json(&json!({"subject": subject, "reason": "incident 42"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{:?}", response.text().await);
    }
}

fn gateway_address(server: &TestServer) -> SocketAddr {
    server
        .gateways
        .iter()
        .find(|(cluster, _)| cluster == "prod")
        .map(|(_, address)| *address)
        .expect("a gateway for prod")
}

/// Every `api.call` record, oldest first.
async fn api_calls(store: &AuditStore) -> Vec<StoredRecord> {
    store
        .query(&AuditFilter {
            event: Some(event::API_CALL.into()),
            limit: 1000,
            ..AuditFilter::default()
        })
        .await
        .expect("trail")
}

fn method_of(record: &StoredRecord) -> &str {
    record.record.details["method"].as_str().unwrap_or_default()
}

fn version_roles(outcome: &CallOutcome) -> Vec<String> {
    assert!(outcome.ok(), "{outcome:?}");
    outcome.decode::<VersionReply>(0).roles
}

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
async fn streams_trailers_and_large_messages_pass_through_intact() {
    let gw = Gateway::start(Backend::Sqlite, "").await;
    let (alice, _) = gw.login("alice@example.com", &["os:admin"]).await;
    let alice_p256 = gw.login_p256("alice@example.com", &["os:admin"]).await;
    let expected_read = sha256_hex(&proto::read_message());
    for client in ClientKind::ALL {
        let context = if client == ClientKind::Grpcio {
            &alice_p256
        } else {
            &alice
        };
        // 32 MiB in one message.
        let read = client
            .call(context, &Call::server_stream(proto::READ, None))
            .await;
        assert!(read.ok(), "{client:?}: {:?}", read.transport_error);
        assert_eq!(read.sizes, [proto::read_message().len()], "{client:?}");
        assert_eq!(read.sha256, expected_read, "{client:?}");
        // A client stream of 5 MiB.
        let recover = client
            .call(
                context,
                &Call::client_stream(proto::ETCD_RECOVER, 5 * 1024 * 1024),
            )
            .await;
        assert_eq!(recover.decode::<Count>(0).bytes, 5 * 1024 * 1024, "{client:?}");
        // Both ways at once.
        let messages: Vec<Vec<u8>> = (1..4usize)
            .map(|i| {
                prost::Message::encode_to_vec(&proto::Chunk {
                    data: proto::pattern(i, 1000 * i),
                })
            })
            .collect();
        let echo = client
            .call(context, &Call::bidi(proto::CONTAINER_RUN, messages.clone()))
            .await;
        assert!(echo.ok(), "{client:?}: {echo:?}");
        assert_eq!(echo.messages, messages, "{client:?}");
        // A status, its non-ASCII message and a trailer of apid's own.
        let rollback = client.call(context, &Call::unary(proto::ROLLBACK)).await;
        assert_eq!(rollback.code, 9, "{client:?}");
        assert_eq!(rollback.message, "nothing to roll back: état", "{client:?}");
        assert_eq!(rollback.trailer("talos-detail"), Some("kept"), "{client:?}");
    }
    // More nodes than a record names is refused before apid.
    let mut many = Call::unary(proto::VERSION);
    for i in 0..33 {
        many = many.with("nodes", &format!("10.5.0.{i}"));
    }
    let refused = ClientKind::Tonic.call(&alice, &many).await;
    assert_eq!(refused.code, 3, "{refused:?}");
    // An admin's COSI reads may return secrets: in the trail before apid
    // sees them; an operator's are counted as reads.
    let (bob, _) = gw.login("bob@example.com", &[]).await;
    ClientKind::Tonic
        .call(&alice, &Call::unary("/cosi.resource.State/Get"))
        .await;
    ClientKind::Tonic
        .call(&bob, &Call::unary("/cosi.resource.State/Get"))
        .await;
    let cosi = gw.seen("/cosi.resource.State/Get");
    assert_eq!(cosi.len(), 2, "{cosi:?}");
    assert_eq!(cosi[0].hook, Some(Ok("started".to_owned())), "{cosi:?}");
    assert!(matches!(cosi[1].hook, Some(Err(_))), "{cosi:?}");
    let records = api_calls(gw.env.server.app.audit.store()).await;
    let read_end = records
        .iter()
        .find(|r| method_of(r) == proto::READ && r.record.outcome == outcome::SUCCESS)
        .expect("Read's end record");
    assert!(read_end.record.details["bytes_out"].as_u64().unwrap() >= 32 * 1024 * 1024 - 64);
    let recover_end = records
        .iter()
        .find(|r| method_of(r) == proto::ETCD_RECOVER && r.record.outcome == outcome::SUCCESS)
        .expect("EtcdRecover's end record");
    assert!(recover_end.record.details["bytes_in"].as_u64().unwrap() >= 5 * 1024 * 1024);
    let rollback_end = records
        .iter()
        .find(|r| method_of(r) == proto::ROLLBACK && r.record.outcome == outcome::FAILED)
        .expect("Rollback's end record");
    assert_eq!(rollback_end.record.details["grpc_status"], 9);
    assert_eq!(
        rollback_end.record.details["grpc_message"],
        "nothing to roll back: état"
    );
    gw.env.finish().await;
    gw.standin.shutdown().await;
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
    gw.standin
        .wait_for(PATIENCE, |calls| {
            calls
                .iter()
                .filter(|c| c.method == proto::LOGS && c.cancelled)
                .count()
                == 2
        })
        .await
        .expect("apid's streams cancelled");
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
    gw.standin
        .wait_for(PATIENCE, |calls| {
            calls
                .iter()
                .filter(|c| c.method == proto::LOGS && c.cancelled)
                .count()
                == 3
        })
        .await
        .expect("apid saw each stream cancelled");

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_from_elsewhere_never_reach_apid() {
    let gw = Gateway::start(Backend::Sqlite, "").await;
    let (bob, answer) = gw.login("bob@example.com", &[]).await;
    // The login's certificate is useless at apid directly.
    let direct = TalosContext::new(
        gw.standin.addr().to_string(),
        &gw.files.talos_ca_pem,
        answer["certificate"].as_str().unwrap(),
        &bob.key_pem,
    );
    for client in [ClientKind::Tonic, ClientKind::Go] {
        let refused = client.call(&direct, &Call::unary(proto::VERSION)).await;
        assert!(!refused.ok(), "{client:?}: {refused:?}");
    }
    gw.standin
        .wait_for_refusals(PATIENCE, 2)
        .await
        .expect("apid refused both handshakes");
    assert!(gw.standin.calls().is_empty());

    // A certificate signed by the Talos CA (a long-lived admin talosconfig)
    // is not the gateway's to admit; nor is an expired one of its own CA,
    // nor one its CA signed that the trail never recorded.
    let key = ClientKey::generate().unwrap();
    let talos_ca = talos_sso_server::ca::CertificateAuthority::from_pem(
        &gw.files.talos_ca_pem,
        &std::fs::read_to_string(&gw.files.talos_ca_key).unwrap(),
        "talos",
        Vec::new(),
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    let gateway_ca = talos_sso_server::ca::CertificateAuthority::load(
        &talos_sso_server::config::CaSource::Files {
            cert_file: gw.files.client_ca_cert.clone(),
            key_file: gw.files.client_ca_key.clone(),
        },
        &talos_sso_server::ca::CaOptions {
            talos_ca: Some(talos_sso_server::config::TalosCaSource::CertFile(
                gw.files.tls_ca.clone(),
            )),
            ..Default::default()
        },
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    let sign = |ca: &talos_sso_server::ca::CertificateAuthority, at: time::OffsetDateTime| {
        let roles = ["os:admin".to_owned()];
        let request = talos_sso_server::certificate::LeafRequest {
            username: "mallory",
            roles: &roles,
            ttl: Duration::from_secs(300),
            clock_skew: Duration::ZERO,
        };
        talos_sso_server::certificate::sign_leaf(ca, &key.public_key_info().unwrap(), &request, at)
            .unwrap()
            .chain_pem
    };
    let now = time::OffsetDateTime::now_utc();
    let cases = [
        ("Talos CA", sign(&talos_ca, now)),
        ("expired", sign(&gateway_ca, now - time::Duration::hours(1))),
        ("never recorded", sign(&gateway_ca, now)),
    ];
    for (what, crt) in cases {
        let context = TalosContext::new(
            gw.address().to_string(),
            &gw.files.tls_ca_pem,
            &crt,
            &key.private_key_pem(),
        );
        for client in [ClientKind::Tonic, ClientKind::Go] {
            let refused = client.call(&context, &Call::unary(proto::VERSION)).await;
            // Refused at the connection (the handshake, or admission right
            // after it), never by a call the gateway let start.
            assert!(
                !refused.ok()
                    && refused.transport_error.is_some()
                    && !refused.message.contains("talos-sso gateway"),
                "{what} via {client:?}: {refused:?}"
            );
        }
    }
    assert!(gw.standin.calls().is_empty(), "nothing reached apid");
    // The gateway's own certificate is in the trail.
    let issued = gw
        .env
        .server
        .app
        .audit
        .store()
        .query(&AuditFilter {
            event: Some(event::GATEWAY_CERTIFICATE_ISSUED.into()),
            limit: 10,
            ..AuditFilter::default()
        })
        .await
        .unwrap();
    assert!(!issued.is_empty());
    assert_eq!(issued[0].record.roles_granted, ["os:impersonator"]);
    gw.env.finish().await;
    gw.standin.shutdown().await;
}

/// The serving certificate as `openssl s_client` receives it from `address`.
fn served_certificate(address: SocketAddr) -> String {
    let output = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &address.to_string(),
            "-servername",
            "127.0.0.1",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let begin = text.find("-----BEGIN CERTIFICATE-----").unwrap_or(0);
    let end = text
        .find("-----END CERTIFICATE-----")
        .map_or(0, |at| at + "-----END CERTIFICATE-----".len());
    text[begin..end].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_serving_certificate_is_served_without_a_restart() {
    let gw = Gateway::start(Backend::Sqlite, "").await;
    let address = gw.address();
    let before = tokio::task::spawn_blocking(move || served_certificate(address))
        .await
        .unwrap();
    assert_eq!(
        before.trim(),
        std::fs::read_to_string(&gw.files.tls_cert).unwrap().trim()
    );
    // cert-manager writes a new certificate and key.
    let renewed = GatewayFiles::new();
    std::fs::copy(&renewed.tls_cert, &gw.files.tls_cert).unwrap();
    std::fs::copy(&renewed.tls_key, &gw.files.tls_key).unwrap();
    let expected = std::fs::read_to_string(&renewed.tls_cert).unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let served = tokio::task::spawn_blocking(move || served_certificate(address))
            .await
            .unwrap();
        if served.trim() == expected.trim() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was not served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    gw.env.finish().await;
    gw.standin.shutdown().await;
}

/// The wall clock, moved ahead by a number of seconds.
#[derive(Debug, Default)]
struct SteppedClock {
    ahead: std::sync::atomic::AtomicI64,
}

impl talos_sso_server::app::Clock for SteppedClock {
    fn now(&self) -> time::OffsetDateTime {
        time::OffsetDateTime::now_utc()
            + time::Duration::seconds(self.ahead.load(std::sync::atomic::Ordering::SeqCst))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_starts_no_call_but_ends_no_running_one() {
    let gw = Gateway::start(Backend::Sqlite, "").await;
    // A replica whose clock can be moved past the certificate's end.
    let clock = Arc::new(SteppedClock::default());
    let replica = TestServer::start_with_clock(gw.env.config(), clock.clone()).await;
    let (bob, answer) = gw.login("bob@example.com", &[]).await;
    let bob = bob.at(gateway_address(&replica).to_string());
    let client = talos_sso_tests::grpc_client::GrpcClient::connect(&bob).unwrap();
    assert!(client.call(&Call::unary(proto::VERSION)).await.ok());
    let stream = {
        let client = client.clone();
        tokio::spawn(async move { client.call(&Call::server_stream(proto::LOGS, Some(40))).await })
    };
    gw.standin
        .wait_for(PATIENCE, |calls| calls.iter().any(|c| c.method == proto::LOGS))
        .await
        .expect("the stream runs");
    let not_after = time::OffsetDateTime::parse(
        answer["not_after"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let past_the_end = (not_after - time::OffsetDateTime::now_utc()).whole_seconds() + 60;
    clock
        .ahead
        .store(past_the_end, std::sync::atomic::Ordering::SeqCst);
    // A new call on the same connection is refused...
    let refused = client.call(&Call::unary(proto::VERSION)).await;
    assert_eq!(refused.code, 16, "{refused:?}");
    assert!(
        refused.message.contains("certificate has expired"),
        "{}",
        refused.message
    );
    // ...while the stream that started before runs to the end the client chose.
    let ran = stream.await.unwrap();
    assert_eq!(ran.sizes.len(), 40, "{ran:?}");
    assert_eq!(
        gw.seen(proto::VERSION).len(),
        1,
        "the refused call never reached apid"
    );
    replica.stop().await;
    gw.env.finish().await;
    gw.standin.shutdown().await;
}
