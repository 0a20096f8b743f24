//! The access gateway at its edges: streams of every kind, trailers,
//! statuses and 32 MiB messages through three clients (tonic, Go's
//! `net/http`, grpcio); certificates from elsewhere, expired or never
//! recorded refused at the connection; an expired certificate starting no
//! call but ending no running one; a renewed serving certificate served
//! without a restart.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use talos_sso::key::ClientKey;
use talos_sso_server::audit::store::AuditFilter;
use talos_sso_server::audit::{event, outcome};
use talos_sso_tests::gateway_env::{Gateway, PATIENCE, api_calls, gateway_address, method_of};
use talos_sso_tests::gateway_files::GatewayFiles;
use talos_sso_tests::grpc_client::{Call, ClientKind, TalosContext, sha256_hex};
use talos_sso_tests::harness::{Backend, TestServer};
use talos_sso_tests::standin_apid::proto::{self, Count};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_ends_at_max_call_and_an_unreachable_apid_is_said() {
    let gw = Gateway::start(Backend::Sqlite, "      max_call: 2s\n").await;
    let (bob, _) = gw.login("bob@example.com", &[]).await;
    // Logs never ends by itself: max_call ends it, at apid too.
    let started = Instant::now();
    let ended = ClientKind::Tonic
        .call(&bob, &Call::server_stream(proto::LOGS, None))
        .await;
    assert!(!ended.ok() && !ended.sizes.is_empty(), "{ended:?}");
    assert!(
        started.elapsed() < PATIENCE,
        "ended after {:?}",
        started.elapsed()
    );
    gw.wait_cancelled(proto::LOGS, 1).await;
    // With apid gone, a call is refused as such, and recorded.
    let Gateway { env, standin, .. } = gw;
    standin.shutdown().await;
    let refused = ClientKind::Tonic.call(&bob, &Call::unary(proto::VERSION)).await;
    assert_eq!(refused.code, 14, "{refused:?}");
    assert!(
        refused.message.contains("no apid endpoint answered"),
        "{}",
        refused.message
    );
    // Written in the background: all of it is in once the server stopped.
    let store = env.server.app.audit.store().clone();
    env.server.stop().await;
    let records = api_calls(&store).await;
    assert!(
        records
            .iter()
            .any(|r| r.record.reason_code.as_deref() == Some("upstream_unavailable")),
        "{records:?}"
    );
}
