//! Two replicas of the console sharing one Postgres database, as the
//! Kubernetes base runs them (no affinity): in a real Chromium, a person
//! logs in through replica A and goes on on replica B with the same
//! cookie (both listen on 127.0.0.1, on two ports: a cookie is the
//! host's, whatever the port, so the `__Host-` cookie stays as it is);
//! B restarts and the session is still there; signing out on B signs out
//! on A. Without a browser: a login started on A is found on B and is
//! then used up on both, a deny entry an admin adds on B blocks a session
//! on A at its next request, and a database that is down gets the
//! console's outage page on both.

use std::time::Duration;

use talos_sso_tests::console_client::{Browserless, location};
use talos_sso_tests::harness::{Backend, TestEnv, TestServer};

use super::{ADMIN, AUDITOR, browser_at, certificate, console_views, csrf_of, free_port};

/// The console on, at `http://127.0.0.1:{port}`, listening there.
fn console_on(yaml: String, port: u16) -> String {
    let yaml = yaml.replace(
        "listen: \"127.0.0.1:0\"",
        &format!("listen: \"127.0.0.1:{port}\""),
    );
    format!("{yaml}\nconsole: {{ enabled: true, public_url: \"http://127.0.0.1:{port}\" }}\n")
}

/// Another replica of `env`'s server, on the same database, at `port`.
async fn replica(env: &TestEnv, port: u16) -> TestServer {
    let mut config = env.config();
    config.listen = format!("127.0.0.1:{port}").parse().expect("an address");
    config.console.public_url = Some(format!("http://127.0.0.1:{port}"));
    TestServer::start(config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_replica_serves_a_console_session_and_a_restart_keeps_it() {
    let env = TestEnv::start_with(Backend::Postgres, |yaml| console_on(yaml, free_port())).await;
    let port_b = free_port();
    let b = replica(&env, port_b).await;
    let (a_url, b_url) = (env.server.base_url.clone(), b.base_url.clone());
    let shots = env.work.path().join("screenshots");
    let storage = env.work.path().join("browser-cookies.json");
    assert_eq!(certificate(&env, ADMIN, &["os:admin"]).await, 201);

    // Logged in through A, the same session on B.
    let out = browser_at(
        &a_url,
        &shots,
        "replicasLogin",
        &[&b_url, AUDITOR],
        Some(&storage),
    )
    .await;
    assert!(
        out.contains(&format!("ok: the same session on the other replica {b_url}")),
        "{out}"
    );
    let views = console_views(&env.server, AUDITOR).await;
    let trail = views.iter().filter(|d| d["view"] == "trail").count();
    assert_eq!(
        trail, 1,
        "one record per session and view, whichever replica shows it: {views:#?}"
    );

    // B restarts: the session is still there; signed out on B, signed
    // out on A.
    b.stop().await;
    let b = replica(&env, port_b).await;
    assert_eq!(b.base_url, b_url);
    let out = browser_at(
        &a_url,
        &shots,
        "replicasLogout",
        &[&b_url, AUDITOR],
        Some(&storage),
    )
    .await;
    assert!(out.contains(&format!("ok: still signed in on {b_url}")), "{out}");
    assert!(out.contains(&format!("ok: and signed out on {a_url}")), "{out}");

    // A login started on A is B's to finish (B redeems the code with its
    // own redirect URI, which the provider refuses: past the login's
    // lookup), and used once: A no longer knows it.
    let mut person = Browserless::new();
    let start = person.get(&format!("{a_url}/ui/login")).await;
    let at_provider = person
        .get(&format!("{}&login_hint={AUDITOR}", location(&start)))
        .await;
    let callback = location(&at_provider);
    assert!(
        callback.starts_with(&format!("{a_url}/ui/callback?")),
        "{callback}"
    );
    let on_b = callback.replacen(&a_url, &b_url, 1);
    let mut replayed = Browserless {
        http: person.http.clone(),
        cookies: person.cookies.clone(),
    };
    let finished = person.get(&on_b).await;
    let text = finished.text().await.unwrap();
    assert!(
        text.contains("did not redeem the login") && text.contains("AADSTS70002"),
        "B found the login started on A: {text}"
    );
    let again = replayed.get(&callback).await;
    assert_eq!(again.status(), 403);
    let text = again.text().await.unwrap();
    assert!(text.contains("was used already"), "{text}");

    // An admin on B blocks the auditor: A refuses the auditor's session
    // at its next request.
    let mut auditor = Browserless::new();
    auditor.login(&a_url, AUDITOR, "/ui").await;
    assert_eq!(auditor.get(&format!("{a_url}/ui")).await.status(), 200);
    // The database holds the SHA-256 of the cookie's id, never the id.
    let id = auditor
        .cookies
        .iter()
        .find_map(|c| c.strip_prefix("__Host-talos-sso-console="))
        .expect("a session cookie")
        .to_owned();
    let pool = sqlx::PgPool::connect(&env.database_url).await.unwrap();
    let held: Vec<String> = sqlx::query_scalar("SELECT id_hash FROM console_sessions")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    let hash = hex::encode(ring::digest::digest(&ring::digest::SHA256, id.as_bytes()));
    assert!(held.contains(&hash) && !held.contains(&id), "{held:?}");
    let mut admin = Browserless::new();
    admin.login(&b_url, ADMIN, "/ui/deny").await;
    let page = admin.get(&format!("{b_url}/ui/deny")).await.text().await.unwrap();
    let form = [
        ("csrf", csrf_of(&page)),
        ("username", AUDITOR.to_owned()),
        ("reason", "replicas".to_owned()),
    ];
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(admin.post(&format!("{b_url}/ui/deny"), &form).await.status(), 200);
    let blocked = auditor.get(&format!("{a_url}/ui")).await;
    assert_eq!(blocked.status(), 403);
    assert!(
        blocked
            .text()
            .await
            .unwrap()
            .contains("You are blocked on this server")
    );

    // The database down: the outage page, on either replica.
    let database = env.database.as_ref().expect("Postgres");
    database.cut().await;
    for base in [&a_url, &b_url] {
        let page = tokio::time::timeout(Duration::from_secs(20), auditor.get(&format!("{base}/ui")))
            .await
            .expect("an answer while the database is down");
        assert_eq!(page.status(), 503, "{base}");
        let text = page.text().await.unwrap();
        assert!(text.contains("Audit trail unavailable"), "{base}: {text}");
        let login = Browserless::new().get(&format!("{base}/ui/login")).await.status();
        assert_eq!(login, 503, "{base}: a login cannot start");
    }
    database.restore().await;
    b.stop().await;
    env.finish().await;
}
