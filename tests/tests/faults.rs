//! Fault injection against real processes, the short forms (the `faults`
//! binary runs them longer): a Postgres cluster of this test's own
//! restarted under load, the server killed, a replica killed, the path to
//! the database cut in the middle of a commit.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use talos_sso::key::ClientKey;
use talos_sso_server::audit::store::WRITE_TIMEOUT;
use talos_sso_server::audit::writer::RESOLVE_WITHIN;
use talos_sso_tests::emulator::TokenKind;
use talos_sso_tests::faults::scenarios::{self, Timing};
use talos_sso_tests::faults::{POSTGRES_COMMIT, TcpProxy};
use talos_sso_tests::harness::{Backend, TestEnv, admin_database_url};

fn passed(report: talos_sso_tests::faults::Report) {
    assert!(
        report.passed(),
        "{}\n{}",
        report.verdict(),
        report.lines.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_under_load_refuses_with_503_and_recovers_without_restart() {
    passed(
        scenarios::postgres_restart("fast", Timing::short())
            .await
            .unwrap(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_mid_load_restarts_on_the_same_trail() {
    passed(scenarios::server_sigkill(Timing::short()).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_load_leaves_the_other_issuing_on_one_chain() {
    passed(scenarios::replica_sigkill(Timing::short()).await.unwrap());
}

/// The identity provider answering 503, refusing connections, and
/// answering only after 11 s (the server's outbound timeout is 10 s; the
/// `faults` binary waits 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_provider_down_or_slow_keeps_cached_keys_and_bounds_every_answer() {
    passed(scenarios::identity_outage(Duration::from_secs(11)).await.unwrap());
}

/// The server's connection to Postgres is cut right after it sent COMMIT:
/// Postgres committed the record, the answer never came. When the database
/// can be asked, the record is read back and the certificate delivered;
/// when it cannot, the request is refused and, once the database is back,
/// a `certificate.undelivered` record says that the committed certificate
/// never left. Either way no record claims, unsaid, a certificate that
/// nobody received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_read_back_or_recorded_as_undelivered() {
    let upstream: std::net::SocketAddr = {
        let url = url::Url::parse(&admin_database_url()).unwrap();
        let host = url.host_str().unwrap().to_owned();
        tokio::net::lookup_host((host, url.port().unwrap_or(5432)))
            .await
            .unwrap()
            .next()
            .unwrap()
    };
    let proxy = TcpProxy::start(upstream).await.unwrap();
    let port = proxy.port;
    let env = TestEnv::start_with(Backend::Postgres, |yaml| {
        let url = url::Url::parse(&admin_database_url()).unwrap();
        let original = format!("{}:{}/", url.host_str().unwrap(), url.port().unwrap_or(5432));
        yaml.replace(&original, &format!("127.0.0.1:{port}/"))
            .replace("\", acquire_timeout", "?sslmode=disable\", acquire_timeout")
    })
    .await;
    let issue = || {
        let key = ClientKey::generate().unwrap();
        let token = env
            .emulator
            .token_for("bob@example.com", TokenKind::id())
            .unwrap();
        let request = env
            .http
            .post(format!("{}/v1/certificates", env.server.base_url))
            .bearer_auth(token)
            .json(&json!({"cluster": "prod", "csr": key.csr_pem().unwrap()}));
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let issued_rows = || async {
        let rows = env.server.app.audit.store().page(0, 100).await.unwrap();
        rows.into_iter()
            .filter(|r| r.record.event == "certificate.issued")
            .collect::<Vec<_>>()
    };
    let (status, _) = issue().await;
    assert_eq!(status, 201);

    // The database answers again at once: the commit is read back.
    proxy.cut_after(POSTGRES_COMMIT, Some(Duration::ZERO));
    let (status, body) = issue().await;
    assert_eq!(proxy.cuts(), 1, "the commit went through the proxy and was cut");
    assert_eq!(status, 201, "{body}");
    let rows = issued_rows().await;
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].record.serial.as_deref(), body["serial"].as_str());
    assert_eq!(body["audit_id"], json!(rows[1].seq));
    assert_eq!(
        env.server
            .app
            .audit
            .stats()
            .unacknowledged
            .load(Ordering::Relaxed),
        1
    );

    // The commit lands, its answer does not, and then the database is
    // unreachable for longer than the writer waits.
    proxy.cut_after(POSTGRES_COMMIT, None);
    let direct = env.database.as_ref().unwrap();
    let ((status, body), ()) = tokio::join!(issue(), async {
        while direct
            .superuser("SELECT 1 FROM audit_events WHERE seq = 3")
            .await
            .unwrap()
            == 0
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(proxy.cuts(), 2);
        proxy.down();
    });
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("audit_unavailable")),
        "{body}"
    );
    proxy.up().await.unwrap();
    let (status, body) = issue().await;
    assert_eq!(status, 201, "{body}");

    let store = env.server.app.audit.store();
    let all = store.page(0, 100).await.unwrap();
    let rows = issued_rows().await;
    assert_eq!(
        rows.len(),
        4,
        "the refused request's record was committed: {all:?}"
    );
    let unreceived = &rows[2];
    let notes: Vec<_> = all
        .iter()
        .filter(|r| r.record.event == "certificate.undelivered")
        .collect();
    assert_eq!(notes.len(), 1, "{all:?}");
    let note = &notes[0].record;
    assert_eq!(
        (
            &note.serial,
            &note.certificate_sha256,
            &note.request_id,
            &note.outcome
        ),
        (
            &unreceived.record.serial,
            &unreceived.record.certificate_sha256,
            &unreceived.record.request_id,
            &"denied".to_owned()
        )
    );
    assert_eq!(note.details["recorded_seq"], json!(unreceived.seq));
    assert!(notes[0].seq < rows[3].seq, "recorded before the next certificate");

    // A database that takes the commit and then goes silent (no reset):
    // the batch gives up waiting, reads the commit back, and answers.
    proxy.cut_after(POSTGRES_COMMIT, None);
    let started = std::time::Instant::now();
    let (status, body) = issue().await;
    let waited = started.elapsed();
    assert_eq!(proxy.cuts(), 3);
    assert_eq!(status, 201, "{body}");
    assert!(
        waited < WRITE_TIMEOUT + RESOLVE_WITHIN,
        "answered after {waited:?}, not stalled behind the silent connection"
    );
    assert_eq!(issued_rows().await.len(), 5);
    let check = store.verify_chain().await.unwrap();
    assert!(check.first_broken.is_none(), "{check:?}");
    env.finish().await;
}

/// Callers that queue behind a key-set refresh use its result: against a
/// provider slower than the timeout, four requests with unknown `kid`s
/// cost one timeout together, not one each (the refresh interval here is
/// shorter than the timeout, as `identity.jwks_min_refresh_interval`
/// allows).
#[tokio::test]
async fn requests_waiting_for_a_key_refresh_share_its_timeout() {
    use talos_sso_server::identity::provider::{IssuerKeys, ProviderSettings};
    use talos_sso_tests::emulator::{EmulatorConfig, EmulatorHandle, Faults};
    let emulator = EmulatorHandle::start(EmulatorConfig::default()).await.unwrap();
    let mut settings = ProviderSettings::new(emulator.issuer());
    settings.http_timeout = Duration::from_millis(300);
    settings.min_refresh_interval = Duration::from_millis(1);
    let provider = IssuerKeys::discover(&settings).await.unwrap();
    emulator.set_faults(Faults {
        delay: Duration::from_secs(5),
        ..Default::default()
    });
    let started = std::time::Instant::now();
    let sets = futures_join4(
        provider.keys_for("unknown-1"),
        provider.keys_for("unknown-2"),
        provider.keys_for("unknown-3"),
        provider.keys_for("unknown-4"),
    )
    .await;
    let took = started.elapsed();
    assert!(sets.iter().all(|keys| keys.get("unknown-1").is_none()));
    assert!(
        took < Duration::from_millis(800),
        "four waiters took {took:?}: each refreshed on its own"
    );
    assert_eq!(provider.refresh_counts(), (0, 1), "one refresh, failed");
    assert!(!provider.reachable());
}

async fn futures_join4<T>(
    a: impl Future<Output = T>,
    b: impl Future<Output = T>,
    c: impl Future<Output = T>,
    d: impl Future<Output = T>,
) -> [T; 4] {
    let (a, b, c, d) = tokio::join!(a, b, c, d);
    [a, b, c, d]
}

/// Fetching Graph's app token and looking the groups up share one
/// timeout: two answers just inside it each must not add up to twice it.
#[tokio::test]
async fn a_graph_lookup_takes_at_most_its_timeout_in_total() {
    use talos_sso_server::identity::graph::{GraphClient, GraphSettings};
    use talos_sso_tests::emulator::{
        EmulatorConfig, EmulatorHandle, Faults, SERVER_APP_ID, SERVER_APP_SECRET, TENANT_ID,
    };
    let emulator = EmulatorHandle::start(EmulatorConfig::default()).await.unwrap();
    let erin = emulator
        .users()
        .into_iter()
        .find(|u| u.username == "erin@example.com")
        .unwrap()
        .oid;
    let graph = GraphClient::new(GraphSettings {
        tenant_id: TENANT_ID.into(),
        client_id: SERVER_APP_ID.into(),
        client_secret: SERVER_APP_SECRET.to_owned().into(),
        authority: emulator.base_url.clone(),
        graph_url: emulator.base_url.clone(),
        cache_ttl: Duration::from_secs(60),
        http_timeout: Duration::from_millis(1000),
        extra_roots: Vec::new(),
    })
    .unwrap();
    emulator.set_faults(Faults {
        delay: Duration::from_millis(700),
        ..Default::default()
    });
    let started = std::time::Instant::now();
    let answer = graph.member_groups(&erin).await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1300), "took {took:?}: {answer:?}");
    assert!(
        answer.is_err(),
        "two 700 ms answers do not fit in 1 s: {answer:?}"
    );
}

/// Graph down: people in too many groups are refused with
/// `groups_overage_unresolved`, nothing is issued, and each refusal is an
/// authenticated decision with its own record (their tokens were valid),
/// not one counted away among the anonymous refusals of their address.
#[tokio::test]
async fn graph_down_refuses_each_overage_user_with_a_record_of_their_own() {
    use talos_sso_tests::emulator::{EmulatorConfig, Faults, GROUP_ONCALL, TestUser, demo_users};
    let mut users = demo_users();
    let mut olive = TestUser::new(
        "c3000000-0000-4000-8000-0000000000aa",
        "olive@example.com",
        "Olive Overage",
        &[GROUP_ONCALL],
        &[],
    );
    olive.overage = true;
    users.push(olive);
    let env = TestEnv::start_full(
        Backend::Sqlite,
        EmulatorConfig {
            users,
            ..Default::default()
        },
        |yaml| yaml,
    )
    .await;
    env.emulator.set_faults(Faults {
        graph_unavailable: true,
        ..Default::default()
    });
    for user in ["erin@example.com", "olive@example.com", "erin@example.com"] {
        let token = env.emulator.token_for(user, TokenKind::id()).unwrap();
        let (status, body) = env.issue(&token).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (403, Some("groups_overage_unresolved")),
            "{body}"
        );
        assert!(body.get("certificate").is_none());
    }
    let rows = env.server.app.audit.store().page(0, 100).await.unwrap();
    let denials: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.record.event.as_str(),
                r.record.reason_code.as_deref(),
                r.record.username.as_deref(),
                r.record.identity_verified,
            )
        })
        .collect();
    let denied = |user| {
        (
            "certificate.denied",
            Some("groups_overage_unresolved"),
            Some(user),
            true,
        )
    };
    assert_eq!(
        denials,
        vec![
            denied("erin@example.com"),
            denied("olive@example.com"),
            denied("erin@example.com")
        ]
    );
    env.finish().await;
}
