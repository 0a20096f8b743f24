//! The gRPC apid stand-in and the three gRPC clients against each other,
//! directly: each client (tonic, Go's standard library, grpcio) with a
//! client certificate signed here by a throwaway Talos CA gets the answers
//! apid would give, the stand-in sees what each one sent, and a
//! certificate from another CA never gets past the handshake.

use std::time::Duration;

use ring::rand::SystemRandom;
use talos_sso_server::ca::CertificateAuthority;
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::certificate::{self, LeafRequest};
use talos_sso_server::keys::Signer;
use talos_sso_tests::grpc_client::{Call, CallOutcome, ClientKind, GrpcClient, TalosContext, sha256_hex};
use talos_sso_tests::material;
use talos_sso_tests::standin_apid::proto::{self, Count, Done, LogLine, VersionReply};
use talos_sso_tests::standin_apid::{Config, SeenCall, StandinApid, hook};
use time::OffsetDateTime;

/// Longest the stand-in may take to notice what a client did.
const NOTICE: Duration = Duration::from_secs(10);

/// A Talos cluster's CA and one node's apid, serving with a certificate
/// that CA signed and admitting clients of that CA only.
struct Node {
    ca: CertificateAuthority,
    ca_pem: String,
    apid: StandinApid,
}

impl Node {
    async fn start() -> Node {
        Node::start_with(|config| config).await
    }

    async fn start_with(adjust: impl FnOnce(Config) -> Config) -> Node {
        let ca = material::fresh_ca(NewKeyType::Ed25519);
        let ca_pem = ca.signer().to_pem();
        let (cert, key) = material::serving_certificate(ca.signer(), ca.key());
        let apid = StandinApid::start(adjust(Config::new(&cert, &key, &ca_pem)))
            .await
            .expect("start the stand-in");
        Node { ca, ca_pem, apid }
    }

    /// A talosconfig context for `kind` with a certificate of `roles` from
    /// `signer` (this node's CA unless another is given).
    fn context(&self, kind: ClientKind, roles: &[&str]) -> TalosContext {
        self.context_from(&self.ca, kind, roles)
    }

    fn context_from(&self, signer: &CertificateAuthority, kind: ClientKind, roles: &[&str]) -> TalosContext {
        let (crt, key) = client_certificate(signer, roles, key_type(kind));
        TalosContext::new(self.apid.addr().to_string(), &self.ca_pem, &crt, &key)
    }

    /// The one call the stand-in saw with metadata `x-test: <marker>`.
    fn seen(&self, marker: &str) -> SeenCall {
        let calls: Vec<SeenCall> = self
            .apid
            .calls()
            .into_iter()
            .filter(|call| call.metadata_values("x-test") == [marker])
            .collect();
        assert_eq!(calls.len(), 1, "calls marked {marker}: {calls:#?}");
        calls.into_iter().next().expect("one call")
    }
}

/// grpcio's TLS offers no Ed25519 signature; the others use the key
/// `talos-sso login` makes.
fn key_type(kind: ClientKind) -> NewKeyType {
    match kind {
        ClientKind::Grpcio => NewKeyType::EcdsaP256,
        ClientKind::Tonic | ClientKind::Go => NewKeyType::Ed25519,
    }
}

/// A five-minute Talos client certificate (chain PEM, key PEM), as
/// talos-sso issues it.
fn client_certificate(ca: &CertificateAuthority, roles: &[&str], key_type: NewKeyType) -> (String, String) {
    let key = generate::generate_key(key_type, &SystemRandom::new()).expect("key");
    let spki = key.key.public_key_info().expect("public key");
    let roles: Vec<String> = roles.iter().map(|r| r.to_string()).collect();
    let request = LeafRequest {
        username: "alice@example.com",
        roles: &roles,
        ttl: Duration::from_secs(300),
        clock_skew: Duration::from_secs(60),
    };
    let leaf = certificate::sign_leaf(ca, &spki, &request, OffsetDateTime::now_utc()).expect("sign");
    (leaf.chain_pem, key.pem)
}

/// `call` by `kind`, marked so that the stand-in's record of it can be found.
async fn marked(kind: ClientKind, context: &TalosContext, call: Call, marker: &str) -> CallOutcome {
    kind.call(context, &call.with("x-test", marker).with("nodes", "127.0.0.1"))
        .await
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

#[tokio::test]
async fn each_client_gets_its_certificates_roles_from_version() {
    let node = Node::start().await;
    for kind in ClientKind::ALL {
        let context = node.context(kind, &["os:reader", "os:operator"]);
        let marker = format!("{kind:?}-version");
        let outcome = marked(kind, &context, Call::unary(proto::VERSION), &marker).await;
        assert!(outcome.ok(), "{kind:?}: {outcome:#?}");
        let reply: VersionReply = outcome.decode(0);
        assert_eq!(reply.roles, strings(&["os:operator", "os:reader"]), "{kind:?}");
        assert_eq!(reply.certificate_roles, reply.roles, "{kind:?}");
        assert_eq!(
            outcome.header("talos-standin"),
            Some("apid"),
            "{kind:?}: {outcome:#?}"
        );

        let seen = node.seen(&marker);
        assert!(seen.authorized && seen.finished && !seen.cancelled, "{seen:#?}");
        assert_eq!(seen.method, proto::VERSION);
        assert_eq!(seen.certificate_common_name.as_deref(), Some("alice@example.com"));
        assert_eq!(
            seen.metadata_values("nodes"),
            ["127.0.0.1"],
            "{kind:?}: {seen:#?}"
        );
        assert_eq!(
            seen.metadata_values("content-type"),
            ["application/grpc"],
            "{kind:?}"
        );
        assert!(seen.metadata_roles.is_empty());
    }
}

#[tokio::test]
async fn a_reader_is_refused_what_its_role_does_not_allow() {
    let node = Node::start().await;
    for kind in ClientKind::ALL {
        let reader = node.context(kind, &["os:reader"]);
        let marker = format!("{kind:?}-reboot");
        let outcome = marked(kind, &reader, Call::unary(proto::REBOOT), &marker).await;
        assert_eq!(
            (outcome.code, outcome.message.as_str()),
            (7, "not authorized"),
            "{kind:?}: {outcome:#?}"
        );
        // Trailers-only, as grpc-go writes a status alone.
        assert!(
            outcome.sizes.is_empty() && outcome.headers.is_empty(),
            "{outcome:#?}"
        );
        if kind == ClientKind::Go {
            assert_eq!(outcome.message_raw.as_deref(), Some("not authorized"));
        }
        let seen = node.seen(&marker);
        assert!(!seen.authorized && seen.finished, "{seen:#?}");
        assert_eq!(seen.effective_roles, ["os:reader"]);

        // An operator may reboot, not reset.
        let operator = node.context(kind, &["os:operator"]);
        let outcome = kind.call(&operator, &Call::unary(proto::REBOOT)).await;
        assert!(outcome.ok(), "{kind:?}: {outcome:#?}");
        let done: Done = outcome.decode(0);
        assert_eq!(
            (done.action.as_str(), done.roles),
            ("reboot", strings(&["os:operator"]))
        );
        let outcome = kind.call(&operator, &Call::unary(proto::RESET)).await;
        assert_eq!(
            (outcome.code, outcome.message.as_str()),
            (7, "not authorized"),
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn an_impersonators_metadata_roles_replace_its_certificates() {
    let node = Node::start().await;
    for kind in ClientKind::ALL {
        let impersonator = node.context(kind, &["os:impersonator"]);
        let as_reader = Call::unary(proto::VERSION).with("talos-role", "os:reader");
        let marker = format!("{kind:?}-as-reader");
        let outcome = marked(kind, &impersonator, as_reader, &marker).await;
        assert!(outcome.ok(), "{kind:?}: {outcome:#?}");
        let reply: VersionReply = outcome.decode(0);
        assert_eq!(reply.roles, ["os:reader"]);
        assert_eq!(reply.certificate_roles, ["os:impersonator"]);
        let seen = node.seen(&marker);
        assert_eq!(seen.metadata_roles, ["os:reader"]);
        assert_eq!(seen.effective_roles, ["os:reader"]);

        // As a reader it may not reboot.
        let reboot = Call::unary(proto::REBOOT).with("talos-role", "os:reader");
        let outcome = kind.call(&impersonator, &reboot).await;
        assert_eq!(outcome.code, 7, "{kind:?}: {outcome:#?}");

        // Several values, trimmed; unknown ones kept but matching nothing.
        let several = Call::unary(proto::VERSION)
            .with("talos-role", " os:operator ")
            .with("talos-role", "os:future");
        let outcome = kind.call(&impersonator, &several).await;
        let reply: VersionReply = outcome.decode(0);
        assert_eq!(reply.roles, ["os:future", "os:operator"], "{kind:?}");

        // Without metadata roles it is only an impersonator: no Version.
        let outcome = kind.call(&impersonator, &Call::unary(proto::VERSION)).await;
        assert_eq!(
            (outcome.code, outcome.message.as_str()),
            (7, "not authorized"),
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn a_non_impersonators_metadata_roles_are_ignored() {
    let node = Node::start().await;
    for kind in ClientKind::ALL {
        let reader = node.context(kind, &["os:reader"]);
        let as_admin = Call::unary(proto::VERSION).with("talos-role", "os:admin");
        let marker = format!("{kind:?}-as-admin");
        let outcome = marked(kind, &reader, as_admin, &marker).await;
        let reply: VersionReply = outcome.decode(0);
        assert_eq!(reply.roles, ["os:reader"], "{kind:?}");
        let seen = node.seen(&marker);
        assert_eq!(
            (seen.metadata_roles, seen.effective_roles),
            (strings(&["os:admin"]), strings(&["os:reader"]))
        );

        let reset = Call::unary(proto::RESET).with("talos-role", "os:admin");
        let outcome = kind.call(&reader, &reset).await;
        assert_eq!(
            (outcome.code, outcome.message.as_str()),
            (7, "not authorized"),
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn thirty_two_mebibytes_arrive_intact() {
    let node = Node::start().await;
    let expected = proto::read_message();
    assert!(expected.len() < 32 * 1024 * 1024 && expected.len() > proto::READ_DATA_LEN);
    let digest = sha256_hex(&expected);
    for kind in ClientKind::ALL {
        let admin = node.context(kind, &["os:admin"]);
        let outcome = kind.call(&admin, &Call::server_stream(proto::READ, None)).await;
        assert!(outcome.ok(), "{kind:?}: {:?} {}", outcome.code, outcome.message);
        assert_eq!(outcome.sizes, [expected.len()], "{kind:?}");
        assert_eq!(outcome.sha256, digest, "{kind:?}");
    }
}

#[tokio::test]
async fn a_client_stream_is_counted() {
    let node = Node::start().await;
    let bytes = 1_000_007;
    for kind in ClientKind::ALL {
        let admin = node.context(kind, &["os:admin"]);
        let outcome = kind
            .call(&admin, &Call::client_stream(proto::ETCD_RECOVER, bytes))
            .await;
        assert!(outcome.ok(), "{kind:?}: {outcome:#?}");
        let count: Count = outcome.decode(0);
        assert_eq!((count.bytes, count.messages), (bytes as u64, 16), "{kind:?}");
    }
}

#[tokio::test]
async fn messages_are_echoed_both_ways() {
    let node = Node::start().await;
    let messages: Vec<Vec<u8>> = (0..5usize)
        .map(|i| {
            prost::Message::encode_to_vec(&proto::Chunk {
                data: proto::pattern(i, 100 * i),
            })
        })
        .collect();
    for kind in ClientKind::ALL {
        let admin = node.context(kind, &["os:admin"]);
        let outcome = kind
            .call(&admin, &Call::bidi(proto::CONTAINER_RUN, messages.clone()))
            .await;
        assert!(outcome.ok(), "{kind:?}: {outcome:#?}");
        assert_eq!(outcome.messages, messages, "{kind:?}");
    }
}

#[tokio::test]
async fn rollbacks_status_message_and_trailer_arrive_intact() {
    let node = Node::start().await;
    for kind in ClientKind::ALL {
        let admin = node.context(kind, &["os:admin"]);
        let outcome = kind.call(&admin, &Call::unary(proto::ROLLBACK)).await;
        assert_eq!(outcome.code, 9, "{kind:?}: {outcome:#?}");
        assert_eq!(outcome.message, proto::ROLLBACK_MESSAGE, "{kind:?}");
        assert_eq!(
            outcome.trailer("talos-detail"),
            Some("kept"),
            "{kind:?}: {outcome:#?}"
        );
        if kind == ClientKind::Go {
            // Percent-encoded on the wire, as gRPC's spec wants.
            assert_eq!(
                outcome.message_raw.as_deref(),
                Some("nothing to roll back: %C3%A9tat")
            );
        }
    }
}

#[tokio::test]
async fn a_cancelled_logs_stream_is_seen_as_cancelled() {
    let node = Node::start().await;
    for kind in ClientKind::ALL {
        let reader = node.context(kind, &["os:reader"]);
        let marker = format!("{kind:?}-logs");
        let outcome = marked(kind, &reader, Call::server_stream(proto::LOGS, Some(3)), &marker).await;
        assert_eq!(outcome.code, 1, "{kind:?}: {outcome:#?}");
        let seqs: Vec<u64> = (0..3).map(|i| outcome.decode::<LogLine>(i).seq).collect();
        assert_eq!(seqs, [1, 2, 3], "{kind:?}");
        let calls = node
            .apid
            .wait_for(NOTICE, |calls| {
                calls
                    .iter()
                    .any(|call| call.metadata_values("x-test") == [marker.as_str()] && call.cancelled)
            })
            .await;
        if let Err(calls) = calls {
            panic!("{kind:?}: the stand-in did not see the stream cancelled: {calls:#?}");
        }
        assert!(!node.seen(&marker).finished);
    }

    // The reset stream alone, its connection still open, is enough.
    let client = GrpcClient::connect(&node.context(ClientKind::Tonic, &["os:reader"])).expect("client");
    let logs = Call::server_stream(proto::LOGS, Some(2)).with("x-test", "kept-open");
    assert_eq!(client.call(&logs).await.code, 1);
    let calls = node
        .apid
        .wait_for(NOTICE, |calls| {
            calls
                .iter()
                .any(|call| call.metadata_values("x-test") == ["kept-open"] && call.cancelled)
        })
        .await;
    assert!(calls.is_ok(), "{calls:#?}");
    let version = Call::unary(proto::VERSION).with("x-test", "after");
    assert!(client.call(&version).await.ok());
    assert_eq!(node.seen("after").connection, node.seen("kept-open").connection);
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused_at_the_handshake() {
    let node = Node::start().await;
    // Named `O=talos` too, as every Talos CA is: only the signature differs.
    let namesake = material::fresh_ca(NewKeyType::Ed25519);
    // Named otherwise: Go sends no certificate the server did not ask for.
    let now = OffsetDateTime::now_utc();
    let other = generate::new_root(NewKeyType::Ed25519, "elsewhere", Duration::from_secs(3600), now)
        .expect("another CA");
    let other = CertificateAuthority::from_pem(&other.cert_pem, &other.key_pem, "other", Vec::new(), now)
        .expect("load it");
    let mut refusals = 0;
    for stranger in [&namesake, &other] {
        for kind in ClientKind::ALL {
            let context = node.context_from(stranger, kind, &["os:admin"]);
            let outcome = kind.call(&context, &Call::unary(proto::VERSION)).await;
            // No gRPC status: the client's own word for a broken transport.
            assert!([2, 14].contains(&outcome.code), "{kind:?}: {outcome:#?}");
            assert!(
                outcome.transport_error.is_some() && outcome.sizes.is_empty(),
                "{kind:?}: {outcome:#?}"
            );
            refusals += 1;
            let refused = node.apid.wait_for_refusals(NOTICE, refusals).await;
            let refused = refused.unwrap_or_else(|so_far| panic!("{kind:?}: refusals {so_far:?}"));
            let why = refused.last().expect("a refusal");
            assert!(
                why.starts_with("invalid peer certificate: ") || why.starts_with("peer sent no certificates"),
                "{kind:?}: {refused:?} {outcome:#?}"
            );
        }
    }
    assert!(node.apid.calls().is_empty(), "{:#?}", node.apid.calls());
}

#[tokio::test]
async fn a_method_without_a_rule_is_for_admins_and_unimplemented() {
    let node = Node::start().await;
    let unknown = Call::unary("/machine.MachineService/NoSuchMethod");
    let reader = node.context(ClientKind::Tonic, &["os:reader"]);
    let outcome = ClientKind::Tonic.call(&reader, &unknown).await;
    assert_eq!((outcome.code, outcome.message.as_str()), (7, "not authorized"));
    let admin = node.context(ClientKind::Tonic, &["os:admin"]);
    let outcome = ClientKind::Tonic.call(&admin, &unknown).await;
    assert_eq!(outcome.code, 12, "{outcome:#?}");
}

#[tokio::test]
async fn the_hook_runs_before_the_answer_and_its_word_is_kept() {
    let node = Node::start_with(|config| {
        config.with_hook(hook(|call: SeenCall| async move {
            match call.metadata_values("talos-sso-request-id").as_slice() {
                [id] => Ok(format!("record {id}")),
                other => Err(format!("request ids {other:?}")),
            }
        }))
    })
    .await;
    let client = GrpcClient::connect(&node.context(ClientKind::Tonic, &["os:reader"])).expect("client");
    let outcome = client
        .call(&Call::unary(proto::VERSION).with("talos-sso-request-id", "r-1"))
        .await;
    assert!(outcome.ok(), "{outcome:#?}");
    // Refused calls run it too; no wait: it ran before the answer left.
    let outcome = client.call(&Call::unary(proto::RESET)).await;
    assert_eq!(outcome.code, 7);
    let hooks: Vec<_> = node.apid.calls().into_iter().map(|call| call.hook).collect();
    assert_eq!(
        hooks,
        [
            Some(Ok("record r-1".to_owned())),
            Some(Err("request ids []".to_owned()))
        ]
    );
}

#[tokio::test]
async fn the_clients_read_a_talosconfig_as_the_cli_writes_it() {
    let node = Node::start().await;
    let (crt, key) = client_certificate(&node.ca, &["os:reader"], NewKeyType::Ed25519);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("talosconfig");
    let entry = talos_sso::talosconfig::ContextEntry {
        endpoints: vec![node.apid.addr().to_string()],
        nodes: vec!["127.0.0.1".into()],
        ca_pem: node.ca_pem.clone(),
        crt_pem: crt,
        key_pem: key,
    };
    talos_sso::talosconfig::upsert_context(&path, "prod", &entry, None, true).expect("write the talosconfig");
    let context = TalosContext::from_talosconfig(&path, None).expect("read the talosconfig");
    assert_eq!(context.endpoint, node.apid.addr().to_string());
    for kind in [ClientKind::Tonic, ClientKind::Go] {
        let outcome = kind.call(&context, &Call::unary(proto::VERSION)).await;
        assert_eq!(outcome.decode::<VersionReply>(0).roles, ["os:reader"], "{kind:?}");
    }
}

#[tokio::test]
async fn shutdown_ends_open_streams() {
    let node = Node::start().await;
    let client = GrpcClient::connect(&node.context(ClientKind::Tonic, &["os:reader"])).expect("client");
    let logs = tokio::spawn(async move { client.call(&Call::server_stream(proto::LOGS, None)).await });
    let started = node
        .apid
        .wait_for(NOTICE, |calls| {
            calls.iter().any(|call| call.method == proto::LOGS)
        })
        .await;
    assert!(started.is_ok(), "{started:?}");
    tokio::time::timeout(NOTICE, node.apid.shutdown())
        .await
        .expect("shutdown within the bound");
    let outcome = tokio::time::timeout(NOTICE, logs)
        .await
        .expect("the stream ends")
        .expect("the task");
    assert!(!outcome.ok(), "{outcome:#?}");
}
