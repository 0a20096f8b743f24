//! The web console at `/ui`: in a real headless Chromium (Debian's, driven
//! by `tests/console/console.mjs` with Playwright's library), an auditor's
//! filter, a record's place in the chain, a non-auditor's refusal, an
//! admin's deny entry that the next `talos-sso login` meets, a tampered
//! trail's warning; over plain HTTP on both stores, the login flow's
//! checks, the security headers, CSRF, one record per view, the charts'
//! SQL and the exports; two replicas sharing one session
//! (`console_replicas.rs`); Talos API calls, filtered and per person
//! (`console_api_calls.rs`); workload logins, filtered by kind and on a
//! record's page (`console_workloads.rs`).
//!
//! A missing Chromium or `tests/console/node_modules` fails the test with
//! what to install; it is never skipped. `CONSOLE_SCREENSHOTS=<dir>` keeps
//! the screenshots there (docs/images/ holds those of docs/console.md).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reqwest::header;
use talos_sso_server::audit::store::AuditFilter;
use talos_sso_tests::console_client::{Browserless, location};
use talos_sso_tests::emulator::GROUP_SECURITY;
use talos_sso_tests::harness::{Backend, CheckpointFiles, TestEnv, TestServer};

#[path = "console_replicas.rs"]
mod replicas;

#[path = "console_api_calls.rs"]
mod api_calls;

#[path = "console_workloads.rs"]
mod workloads;

const AUDITOR: &str = "sam@example.com";
const ADMIN: &str = "alice@example.com";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A server on a port chosen first (the console's redirect URI names it),
/// the console on, checkpoints signed.
async fn start(backend: Backend, checkpoints: &CheckpointFiles) -> TestEnv {
    start_limited(backend, checkpoints, 0, 600).await
}

/// As [`start`], with the address quota (0: none) and the audit API's
/// quota per person.
async fn start_limited(
    backend: Backend,
    checkpoints: &CheckpointFiles,
    per_address: u32,
    api_per_identity: u32,
) -> TestEnv {
    let port = free_port();
    TestEnv::start_with(backend, |yaml| {
        let yaml = yaml.replace(
            "rate_limits: { per_identity_per_minute: 0, per_address_per_minute: 0 }",
            &format!(
                "rate_limits: {{ per_identity_per_minute: 0, per_address_per_minute: {per_address}, \
                 api_per_identity_per_minute: {api_per_identity} }}"
            ),
        );
        let yaml = yaml.replace(
            "listen: \"127.0.0.1:0\"",
            &format!("listen: \"127.0.0.1:{port}\""),
        );
        let yaml = checkpoints.configure(&yaml, "1h", "console-test");
        format!("{yaml}\nconsole: {{ enabled: true, public_url: \"http://127.0.0.1:{port}\" }}\n")
    })
    .await
}

/// Ask for a certificate on `prod` as `user` with `roles`: the status.
async fn certificate(env: &TestEnv, user: &str, roles: &[&str]) -> u16 {
    let token = env
        .emulator
        .token_for(user, talos_sso_tests::emulator::TokenKind::id())
        .expect("a token");
    let csr = talos_sso::key::ClientKey::generate()
        .and_then(|k| k.csr_pem())
        .expect("csr");
    env.http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .bearer_auth(token)
        .header("x-forwarded-for", "203.0.113.9")
        .header(talos_sso_api::CLIENT_VERSION_HEADER, "0.9.0-test")
        .json(&serde_json::json!({"cluster": "prod", "csr": csr, "roles": roles}))
        .send()
        .await
        .expect("an answer")
        .status()
        .as_u16()
}

fn console_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("console")
}

fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

/// Run a scenario of console.mjs; its output, after asserting it passed.
async fn browser(env: &TestEnv, shots: &Path, scenario: &str, args: &[&str]) -> String {
    browser_at(&env.server.base_url, shots, scenario, args, None).await
}

/// [`browser`] against the server at `base`, with the browser's cookies
/// kept in `storage` between scenarios when given.
async fn browser_at(
    base: &str,
    shots: &Path,
    scenario: &str,
    args: &[&str],
    storage: Option<&Path>,
) -> String {
    assert!(
        Path::new(&chromium()).exists(),
        "the console's browser tests need Chromium at {}: `apt-get install -y chromium chromium-driver` (.ci/run does)",
        chromium()
    );
    assert!(
        console_dir().join("node_modules/playwright-core").exists(),
        "the console's browser tests need playwright-core: `npm ci --prefix tests/console` (.ci/run does)"
    );
    let mut command = tokio::process::Command::new("node");
    command
        .arg(console_dir().join("console.mjs"))
        .arg(scenario)
        .arg(base)
        .arg(shots)
        .args(args)
        .env("CHROMIUM", chromium())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(storage) = storage {
        command.env("CONSOLE_STORAGE", storage);
    }
    let run = command.output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the browser scenario ends within two minutes")
        .expect("node runs (Node.js is installed by .ci/run)");
    let out = String::from_utf8_lossy(&output.stdout).into_owned();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && out.contains("result: "),
        "{scenario}: {}\n{out}\n{err}",
        output.status
    );
    out
}

/// The CSRF token of a console page's forms.
fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token")
        .to_owned()
}

/// The console's `audit.query` records of `user`, as stored.
pub(super) async fn console_views(server: &TestServer, user: &str) -> Vec<serde_json::Value> {
    console_records(
        server,
        AuditFilter {
            username: Some(user.into()),
            ..AuditFilter::default()
        },
    )
    .await
}

/// The console's records `filter` finds (`audit.query` unless it names
/// an event): their details,
/// with their outcome, reason and username.
async fn console_records(server: &TestServer, filter: AuditFilter) -> Vec<serde_json::Value> {
    let filter = AuditFilter {
        event: filter.event.or(Some("audit.query".into())),
        limit: 1000,
        ..filter
    };
    let records = server.app.audit.store().query(&filter).await.expect("the trail");
    records
        .into_iter()
        .filter(|r| r.record.details["via"] == "console")
        .map(|r| {
            let mut details = r.record.details.clone();
            details["outcome"] = r.record.outcome.clone().into();
            details["reason_code"] = r.record.reason_code.clone().into();
            details["username"] = r.record.username.clone().into();
            details
        })
        .collect()
}

/// exit code, stdout and stderr.
async fn cli_login(env: &TestEnv, user: &str) -> (i32, String, String) {
    use tokio::io::AsyncBufReadExt;
    let binary = tokio::task::spawn_blocking(talos_sso_tests::quickstart::client_binary)
        .await
        .unwrap()
        .expect("the talos-sso CLI builds");
    let home = tempfile::tempdir().unwrap();
    env.emulator.set_auto_login(Some(user));
    let mut child = tokio::process::Command::new(binary)
        .args(["login", "--server", &env.server.base_url, "--no-browser"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join(".config"))
        .env("XDG_CACHE_HOME", home.path().join(".cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut err = String::new();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            err.push_str(&line);
            err.push('\n');
            if line.trim().starts_with("http") {
                return line.trim().to_owned();
            }
        }
        panic!("the CLI printed no login URL: {err}");
    })
    .await
    .expect("a login URL in time");
    // The "browser": the emulator answers with a redirect to the CLI.
    let _ = reqwest::get(&url).await.expect("the login page");
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    while let Ok(Some(line)) = lines.next_line().await {
        err.push_str(&line);
        err.push('\n');
    }
    env.emulator.set_auto_login(None);
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        err,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser() {
    let checkpoints = CheckpointFiles::new();
    let env = start(Backend::Postgres, &checkpoints).await;
    let shots = std::env::var_os("CONSOLE_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| env.work.path().join("screenshots"));
    for _ in 0..3 {
        assert_eq!(certificate(&env, ADMIN, &["os:admin"]).await, 201);
    }
    assert_eq!(certificate(&env, "bob@example.com", &[]).await, 201);
    assert_eq!(certificate(&env, "bob@example.com", &["os:admin"]).await, 403);
    assert_eq!(certificate(&env, "dave@example.com", &[]).await, 403);
    assert_eq!(certificate(&env, "carol@example.com", &[]).await, 201);
    // A checkpoint, so that the chain page and the records name one.
    env.server.app.checkpoint_if_grown().await;

    // An auditor filters to alice's os:admin certificates and opens one.
    let out = browser(&env, &shots, "auditor", &[ADMIN, "os:admin"]).await;
    assert!(
        out.contains("ok: the filter shows alice@example.com's certificates (3)"),
        "{out}"
    );
    assert!(
        out.contains("ok: every row is alice@example.com with os:admin"),
        "{out}"
    );
    assert!(out.contains("shows its chain position: record"), "{out}");
    let views = console_views(&env.server, AUDITOR).await;
    let trail_views: Vec<_> = views
        .iter()
        .filter(|d| d["view"] == "trail" && d["filter"]["username"] == ADMIN)
        .collect();
    assert_eq!(
        trail_views.len(),
        1,
        "one record per session and filter, however often it is shown: {views:#?}"
    );
    assert_eq!(trail_views[0]["filter"]["role"], "os:admin");
    for view in ["record", "held", "person", "chain", "charts", "export"] {
        assert!(
            views.iter().any(|d| d["view"] == view),
            "the {view} view is recorded: {views:#?}"
        );
    }

    // Someone who is not an auditor: the membership page, the refusal recorded.
    let out = browser(&env, &shots, "nobody", &["dave@example.com"]).await;
    assert!(out.contains(&format!("group {GROUP_SECURITY}")), "{out}");
    let refusals = console_views(&env.server, "dave@example.com").await;
    assert!(
        refusals
            .iter()
            .any(|d| d["outcome"] == "denied" && d["reason_code"] == "not_an_auditor"),
        "{refusals:#?}"
    );

    // An admin blocks bob; bob's next login is refused.
    let out = browser(&env, &shots, "deny", &["bob@example.com", "laptop lost, SEC-42"]).await;
    assert!(
        out.contains("ok: the entry is added: Added: bob@example.com is blocked"),
        "{out}"
    );
    let (code, stdout, stderr) = cli_login(&env, "bob@example.com").await;
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("you are blocked from new certificates on this server"),
        "the CLI says why: {stderr}"
    );
    let denied = env
        .server
        .app
        .audit
        .store()
        .query(&AuditFilter {
            username: Some("bob@example.com".into()),
            event: Some("certificate.denied".into()),
            limit: 100,
            ..AuditFilter::default()
        })
        .await
        .unwrap();
    assert!(
        denied
            .iter()
            .any(|r| r.record.reason_code.as_deref() == Some("identity_denied")),
        "{denied:#?}"
    );
    let added = env
        .server
        .app
        .audit
        .store()
        .query(&AuditFilter {
            event: Some("deny.added".into()),
            limit: 10,
            ..AuditFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(added.len(), 1);
    assert_eq!(added[0].record.username.as_deref(), Some(ADMIN));
    assert_eq!(added[0].record.details["via"], "console");
    assert_eq!(added[0].record.details["reason"], "laptop lost, SEC-42");

    // A superuser rewrites a record: the console shows the warning.
    env.database
        .as_ref()
        .unwrap()
        .superuser(
            "ALTER TABLE audit_events DISABLE TRIGGER audit_events_append_only; \
             UPDATE audit_events SET roles_granted = ARRAY['os:admin'] WHERE seq = 5; \
             ALTER TABLE audit_events ENABLE TRIGGER audit_events_append_only;",
        )
        .await
        .unwrap();
    let out = browser(&env, &shots, "tampered", &[]).await;
    assert!(
        out.contains("ok: the chain page says VERIFICATION FAILED"),
        "{out}"
    );
    env.finish().await;
}

async fn console_over_http(backend: Backend) {
    let checkpoints = CheckpointFiles::new();
    let env = start(backend, &checkpoints).await;
    let base = env.server.base_url.clone();
    assert_eq!(certificate(&env, ADMIN, &["os:admin"]).await, 201);
    assert_eq!(certificate(&env, "dave@example.com", &[]).await, 403);

    // Not logged in: the sign-in page, with the headers.
    let mut anonymous = Browserless::new();
    let page = anonymous.get(&format!("{base}/ui")).await;
    assert_eq!(page.status(), 200);
    let csp = page.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.starts_with("default-src 'none';") && csp.contains("form-action 'self'"),
        "{csp}"
    );
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("Sign in with your company account")
    );

    // A callback whose state is not the login's: refused, no session.
    let mut forger = Browserless::new();
    let start_login = forger.get(&format!("{base}/ui/login")).await;
    let authorize = location(&start_login);
    let at_provider = forger.get(&format!("{authorize}&login_hint={AUDITOR}")).await;
    let callback = location(&at_provider);
    let mut forged = url::Url::parse(&callback).unwrap();
    let pairs: Vec<(String, String)> = forged
        .query_pairs()
        .map(|(k, v)| {
            let v = if k == "state" {
                "0".repeat(32)
            } else {
                v.into_owned()
            };
            (k.into_owned(), v)
        })
        .collect();
    forged.query_pairs_mut().clear().extend_pairs(pairs);
    let refused = forger.get(forged.as_str()).await;
    assert_eq!(refused.status(), 403);
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("does not belong to this login (state)")
    );
    assert!(
        !forger
            .cookies
            .iter()
            .any(|c| c.starts_with("__Host-talos-sso-console="))
    );
    // The login is used up: the right state no longer works either.
    let late = forger.get(&callback).await;
    assert_eq!(late.status(), 403);

    // An auditor.
    let mut auditor = Browserless::new();
    auditor.login(&base, AUDITOR, "/ui/chain").await;
    let chain = auditor.get(&format!("{base}/ui/chain")).await;
    assert_eq!(chain.status(), 200);
    assert!(chain.text().await.unwrap().contains("The chain verifies."));
    let charts = auditor.get(&format!("{base}/ui/charts?since=1d&by=hour")).await;
    assert_eq!(charts.status(), 200);
    let charts = charts.text().await.unwrap();
    assert!(
        charts.contains("<rect") && charts.contains("prod os:admin"),
        "{charts}"
    );
    let refusal = env
        .server
        .app
        .audit
        .store()
        .query(&AuditFilter {
            username: Some("dave@example.com".into()),
            limit: 10,
            ..AuditFilter::default()
        })
        .await
        .unwrap();
    let reason = refusal[0]
        .record
        .reason_code
        .clone()
        .expect("dave's refusal has a reason");
    assert!(
        charts.contains(&format!("<title>{reason}: 1</title>")),
        "{charts}"
    );
    // The bucket in progress is counted at each view.
    assert!(charts.contains("prod os:admin: 1</title>"), "{charts}");
    assert_eq!(certificate(&env, ADMIN, &["os:admin"]).await, 201);
    let charts = auditor.get(&format!("{base}/ui/charts?since=1d&by=hour")).await;
    let charts = charts.text().await.unwrap();
    assert!(charts.contains("prod os:admin: 2</title>"), "{charts}");
    let export = auditor
        .get(&format!("{base}/ui/export?format=jsonl&username={ADMIN}"))
        .await;
    assert_eq!(export.status(), 200);
    let lines: Vec<serde_json::Value> = export
        .text()
        .await
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["roles_granted"][0], "os:admin");
    // The client address filter: the certificates came from this machine.
    let here = auditor
        .get(&format!("{base}/ui?client_ip=127.0.0.1&event=certificate.issued"))
        .await;
    assert!(here.text().await.unwrap().contains("2 records. "));
    let elsewhere = auditor.get(&format!("{base}/ui?client_ip=203.0.113.9")).await;
    assert!(elsewhere.text().await.unwrap().contains("0 records. "));
    let bad = auditor.get(&format!("{base}/ui?event=nonsense")).await;
    assert_eq!(bad.status(), 422);
    assert!(bad.text().await.unwrap().contains("must be one of"));
    // An auditor is no admin.
    let deny = auditor.get(&format!("{base}/ui/deny")).await;
    assert_eq!(deny.status(), 403);
    assert!(deny.text().await.unwrap().contains("Ask for membership in"));

    // An admin's form without its CSRF token, or from elsewhere: refused.
    let mut admin = Browserless::new();
    admin.login(&base, ADMIN, "/ui/chain").await;
    let page = admin.get(&format!("{base}/ui/deny")).await.text().await.unwrap();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token in the form")
        .to_owned();
    let form = [("username", "dave@example.com"), ("reason", "test")];
    let forged = admin.post(&format!("{base}/ui/deny"), &form).await;
    assert_eq!(forged.status(), 403);
    for (header_name, value) in [
        ("origin", "https://evil.example"),
        ("sec-fetch-site", "cross-site"),
    ] {
        let from_elsewhere = admin
            .http
            .post(format!("{base}/ui/deny"))
            .header(header::COOKIE, admin.cookies.join("; "))
            .header(header_name, value)
            .form(&[
                ("csrf", csrf.as_str()),
                ("username", "dave@example.com"),
                ("reason", "test"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(from_elsewhere.status(), 403, "{header_name}: {value}");
    }
    assert!(env.server.app.audit.store().deny_list().await.unwrap().is_empty());
    let added = admin
        .post(
            &format!("{base}/ui/deny"),
            &[
                ("csrf", &csrf),
                ("username", "dave@example.com"),
                ("reason", "test"),
            ],
        )
        .await;
    assert_eq!(added.status(), 200);
    assert_eq!(env.server.app.audit.store().deny_list().await.unwrap().len(), 1);
    let removed = admin
        .post(
            &format!("{base}/ui/deny/remove"),
            &[("csrf", &csrf), ("username", "dave@example.com")],
        )
        .await;
    assert_eq!(removed.status(), 200);
    assert!(removed.text().await.unwrap().contains("Removed 1 entries"));
    assert!(env.server.app.audit.store().deny_list().await.unwrap().is_empty());

    // Signed out: the session is gone.
    let out = admin.post(&format!("{base}/ui/logout"), &[("csrf", &csrf)]).await;
    assert_eq!(out.status(), 303);
    let after = admin.get(&format!("{base}/ui/deny")).await;
    assert!(
        after
            .text()
            .await
            .unwrap()
            .contains("Sign in with your company account")
    );
    env.finish().await;
}

on_both_stores!(console_over_http);

/// The console under abuse: windows too long to chart, floods of logins,
/// views asked for from another site, refusals recorded as the API's.
async fn console_under_abuse(backend: Backend) {
    let checkpoints = CheckpointFiles::new();
    let env = start(backend, &checkpoints).await;
    let base = env.server.base_url.clone();
    let mut auditor = Browserless::new();
    auditor.login(&base, AUDITOR, "/ui").await;

    // Every answer under /ui carries the console's headers, those the
    // router or its layers make too; unknown console paths get a console page.
    let unknown = auditor.get(&format!("{base}/ui/no/such/page")).await;
    assert_eq!(unknown.status(), 404);
    assert!(unknown.headers().contains_key(header::CONTENT_SECURITY_POLICY));
    assert!(
        unknown
            .text()
            .await
            .unwrap()
            .contains("There is no such console page")
    );
    let wrong_method = auditor.post(&format!("{base}/ui/records/1"), &[]).await;
    assert_eq!(wrong_method.status(), 405);
    let csp = wrong_method.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap();
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    assert_eq!(wrong_method.headers()["x-frame-options"], "DENY");
    assert!(
        !unknown_headers_on_api(&env).await,
        "the API's answers are left alone"
    );
    assert!(
        !wrong_method
            .headers()
            .contains_key(header::STRICT_TRANSPORT_SECURITY),
        "no HSTS over http"
    );

    // A chart over centuries is refused at once, with why; nothing recorded.
    for (by, since) in [("hour", "0000-01-01T00:00:00Z"), ("hour", "15d"), ("day", "401d")] {
        let charts = tokio::time::timeout(
            Duration::from_secs(10),
            auditor.get(&format!("{base}/ui/charts?by={by}&since={since}")),
        )
        .await
        .expect("a chart's refusal is quick");
        assert_eq!(charts.status(), 422, "{by} since {since}");
        assert!(charts.text().await.unwrap().contains("covers at most"));
    }
    assert!(
        !console_views(&env.server, AUDITOR)
            .await
            .iter()
            .any(|d| d["view"] == "charts"),
        "a refused chart records no view"
    );
    let fortnight = auditor.get(&format!("{base}/ui/charts?by=hour&since=13d")).await;
    assert_eq!(fortnight.status(), 200);

    // The chain: a verification minutes old answers the next views; a
    // new one runs only when asked for with the form.
    let verified_at = |page: &str| {
        page.split("class=\"verified-at\">")
            .nth(1)
            .and_then(|rest| rest.split('<').next())
            .expect("the page says when the chain was verified")
            .to_owned()
    };
    let first = auditor
        .get(&format!("{base}/ui/chain"))
        .await
        .text()
        .await
        .unwrap();
    let csrf = csrf_of(&first);
    let reused = auditor
        .get(&format!("{base}/ui/chain"))
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(
        verified_at(&first),
        verified_at(&reused),
        "the last result answers"
    );
    let forged = auditor.post(&format!("{base}/ui/chain"), &[]).await;
    assert_eq!(
        forged.status(),
        403,
        "no new verification without the form's token"
    );
    let again = auditor
        .post(&format!("{base}/ui/chain"), &[("csrf", &csrf)])
        .await;
    let again = again.text().await.unwrap();
    assert!(again.contains("The chain verifies."));
    assert_ne!(
        verified_at(&first),
        verified_at(&again),
        "verified again when asked"
    );

    // Someone neither auditor nor admin gets the membership page at the
    // callback and no session: nobody's place is taken by theirs.
    let mut nobody = Browserless::new();
    let start_login = nobody.get(&format!("{base}/ui/login")).await;
    let at_provider = nobody
        .get(&format!("{}&login_hint=dave@example.com", location(&start_login)))
        .await;
    let callback = nobody.get(&location(&at_provider)).await;
    assert_eq!(callback.status(), 403);
    assert!(callback.text().await.unwrap().contains("Ask for membership in"));
    assert!(
        !nobody
            .cookies
            .iter()
            .any(|c| c.starts_with("__Host-talos-sso-console=")),
        "no session for a non-member"
    );
    assert!(
        console_views(&env.server, "dave@example.com")
            .await
            .iter()
            .any(|d| d["reason_code"] == "not_an_auditor" && d["view"] == "login"),
        "the refusal is recorded"
    );
    // A view linked from another site (or asked for with no
    // `Sec-Fetch-Site`) does nothing: a page with a link to open it here.
    for site in [Some("cross-site"), Some("same-site"), None] {
        let mut request = auditor
            .http
            .get(format!("{base}/ui/export?format=csv&username=abuse-{site:?}"))
            .header(header::COOKIE, auditor.cookies.join("; "));
        if let Some(site) = site {
            request = request.header("sec-fetch-site", site);
        }
        let page = request.send().await.unwrap();
        assert_eq!(page.status(), 200);
        let text = page.text().await.unwrap();
        assert!(
            text.contains("Open this view") && !text.contains("seq,occurred_at"),
            "{text}"
        );
    }
    assert!(
        !console_views(&env.server, AUDITOR)
            .await
            .iter()
            .any(|d| d["view"] == "export"),
        "nothing exported from another site's link"
    );
    // Nor does any other method than a form's POST: axum answers HEAD with
    // the GET handler (which would export, verify and record), OPTIONS
    // with nothing. Only the login callback, which the provider reaches
    // from its own site, is exempt.
    let recorded_before = console_views(&env.server, AUDITOR).await.len();
    for path in [
        "/ui",
        "/ui/records/1",
        "/ui/held?role=os:admin",
        "/ui/person?username=sam@example.com",
        "/ui/chain",
        "/ui/charts?since=1d&by=hour",
        "/ui/export?format=csv",
        "/ui/export?format=jsonl&username=head-export",
        "/ui/deny",
        "/ui/deny/remove",
        "/ui/login",
        "/ui/logout",
        "/ui/signed-out",
        "/ui/assets/console.css",
        "/ui/no-such-page",
    ] {
        for method in [reqwest::Method::HEAD, reqwest::Method::OPTIONS] {
            for site in [Some("cross-site"), Some("same-site"), None] {
                let mut request = auditor
                    .http
                    .request(method.clone(), format!("{base}{path}"))
                    .header(header::COOKIE, auditor.cookies.join("; "));
                if let Some(site) = site {
                    request = request.header("sec-fetch-site", site);
                }
                let answer = request.send().await.unwrap();
                let expected = if method == reqwest::Method::HEAD { 200 } else { 403 };
                assert_eq!(answer.status(), expected, "{method} {path} from {site:?}");
                assert_eq!(
                    answer.headers()[header::CONTENT_TYPE],
                    "text/html; charset=utf-8",
                    "{method} {path} from {site:?}: the console's refusal, not the view"
                );
            }
        }
    }
    assert_eq!(
        console_views(&env.server, AUDITOR).await.len(),
        recorded_before,
        "nothing recorded, exported or verified by another site's HEAD or OPTIONS"
    );
    // A person's subjects are those their verified tokens carried; what an
    // unverified token claimed under their name is listed apart.
    let mut claimed = talos_sso_server::audit::AuditRecord::new(
        "certificate.denied",
        "denied",
        "req-claimed-subject-0001",
        time::OffsetDateTime::now_utc(),
    );
    claimed.reason_code = Some("token_invalid".into());
    claimed.username = Some(AUDITOR.into());
    claimed.subject = Some("made-up-subject-of-an-anonymous-caller".into());
    claimed.identity_verified = false;
    env.server
        .app
        .audit
        .append(talos_sso_server::audit::store::Append {
            record: claimed,
            claim: None,
            deny_check: false,
            deny_change: None,
        })
        .await
        .unwrap();
    let person = auditor
        .get(&format!("{base}/ui/person?username={AUDITOR}"))
        .await
        .text()
        .await
        .unwrap();
    let subjects = person
        .split("<p>Subjects: ")
        .nth(1)
        .and_then(|rest| rest.split("</p>").next())
        .expect("the subjects line");
    assert!(
        subjects.contains(talos_sso_tests::emulator::SAM_OID),
        "{subjects}"
    );
    assert!(!subjects.contains("made-up-subject"), "{subjects}");
    assert!(
        person.contains("Claimed by unverified tokens")
            && person.contains("made-up-subject-of-an-anonymous-caller"),
        "{person}"
    );
    let typed = auditor
        .http
        .get(format!("{base}/ui/export?format=csv&username=x"))
        .header(header::COOKIE, auditor.cookies.join("; "))
        .header("sec-fetch-site", "none")
        .send()
        .await
        .unwrap();
    assert!(typed.text().await.unwrap().starts_with("seq,occurred_at"));

    // One person's logins push out only their own least recently used.
    let mut elsewhere = Vec::new();
    for _ in 0..5 {
        let mut again = Browserless::new();
        again.login(&base, AUDITOR, "/ui").await;
        elsewhere.push(again);
    }
    let first = auditor.get(&format!("{base}/ui/chain")).await;
    assert!(
        first
            .text()
            .await
            .unwrap()
            .contains("Sign in with your company account"),
        "a sixth session of one person ends their least recently used"
    );
    for mut again in elsewhere {
        let page = again.get(&format!("{base}/ui/chain")).await;
        assert!(page.text().await.unwrap().contains("The chain"));
    }

    // An auditor's deny-list form: refused and recorded as the API
    // records it, with its target; without the token, nothing recorded.
    auditor.login(&base, AUDITOR, "/ui").await;
    let page = auditor.get(&format!("{base}/ui")).await.text().await.unwrap();
    let csrf = csrf_of(&page);
    let forged = auditor
        .post(&format!("{base}/ui/deny"), &[("username", "carol@example.com")])
        .await;
    assert_eq!(forged.status(), 403);
    for (path, event) in [("/ui/deny", "deny.added"), ("/ui/deny/remove", "deny.removed")] {
        let refused = auditor
            .post(
                &format!("{base}{path}"),
                &[
                    ("csrf", &csrf),
                    ("username", "carol@example.com"),
                    ("reason", "x"),
                ],
            )
            .await;
        assert_eq!(refused.status(), 403);
        let records = console_records(
            &env.server,
            AuditFilter {
                event: Some(event.into()),
                username: Some(AUDITOR.into()),
                ..AuditFilter::default()
            },
        )
        .await;
        assert_eq!(records.len(), 1, "{event}: {records:?}");
        assert_eq!(records[0]["reason_code"], "not_an_admin");
        assert_eq!(records[0]["target_username"], "carol@example.com");
    }

    // A blocked auditor: the blocked page, the refusal recorded.
    let mut admin = Browserless::new();
    admin.login(&base, ADMIN, "/ui").await;
    let page = admin.get(&format!("{base}/ui/deny")).await.text().await.unwrap();
    let admin_csrf = csrf_of(&page);
    let added = admin
        .post(
            &format!("{base}/ui/deny"),
            &[("csrf", &admin_csrf), ("username", AUDITOR), ("reason", "test")],
        )
        .await;
    assert_eq!(added.status(), 200);
    let blocked = auditor.get(&format!("{base}/ui/held")).await;
    assert_eq!(blocked.status(), 403);
    assert!(blocked.text().await.unwrap().contains("You are blocked"));
    assert!(
        console_views(&env.server, AUDITOR)
            .await
            .iter()
            .any(|d| d["reason_code"] == "identity_denied"),
        "the blocked auditor's refusal is recorded"
    );

    env.finish().await;

    // Served over https: HSTS on the console's answers.
    let https = TestEnv::start_with(backend, |yaml| {
        format!("{yaml}\nconsole: {{ enabled: true, public_url: \"https://console.example\" }}\n")
    })
    .await;
    let page = https
        .http
        .get(format!("{}/ui", https.server.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        page.headers()[header::STRICT_TRANSPORT_SECURITY],
        "max-age=31536000"
    );
    https.finish().await;
}

/// Whether the API's own 404 carries the console's Content-Security-Policy.
async fn unknown_headers_on_api(env: &TestEnv) -> bool {
    let answer = env
        .http
        .get(format!("{}/v1/nothing", env.server.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 404);
    answer.headers().contains_key(header::CONTENT_SECURITY_POLICY)
}

on_both_stores!(console_under_abuse);

/// The API's quotas hold at the console: per client address on every
/// `/ui` request (logins included), per person on every view.
async fn console_rate_limits(backend: Backend) {
    let checkpoints = CheckpointFiles::new();
    let env = start_limited(backend, &checkpoints, 30, 4).await;
    let base = env.server.base_url.clone();

    // One person's views: past their quota, refused and recorded with who.
    let mut auditor = Browserless::new();
    auditor.login(&base, AUDITOR, "/ui").await;
    for _ in 0..4 {
        assert_eq!(auditor.get(&format!("{base}/ui/chain")).await.status(), 200);
    }
    let over = auditor.get(&format!("{base}/ui/chain")).await;
    assert_eq!(over.status(), 429);
    assert!(over.headers().contains_key(header::RETRY_AFTER));
    assert!(
        console_views(&env.server, AUDITOR)
            .await
            .iter()
            .any(|d| d["reason_code"] == "rate_limited" && d["view"] == "/ui/chain"),
        "the refusal names the person"
    );

    // A flood of logins started from one address: refused past its quota,
    // with the console's page and headers, and recorded.
    let mut flooder = Browserless::new();
    let mut started = 0;
    for _ in 0..40 {
        let login = flooder.get(&format!("{base}/ui/login")).await;
        match login.status().as_u16() {
            303 => started += 1,
            429 => {
                assert!(login.headers().contains_key(header::RETRY_AFTER));
                assert!(login.headers().contains_key(header::CONTENT_SECURITY_POLICY));
                assert!(login.text().await.unwrap().contains("Too many requests"));
            }
            other => panic!("a login answered {other}"),
        }
    }
    assert!(started <= 30 - 7, "{started} logins started past the quota");
    let callback = flooder.get(&format!("{base}/ui/callback?state=x&code=y")).await;
    assert_eq!(callback.status(), 429, "the callback counts too");
    // Counted by limit; recorded as the API's are, aggregated per address
    // (this address's first rate-limit refusal, the person's, has its own).
    let metrics = env.metrics().await;
    let counted = |limit: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("talos_sso_rate_limited_total{{limit=\"{limit}\"}} ")))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(counted("api_identity"), 1, "{metrics}");
    assert!(counted("address") >= 40 - 23, "{metrics}");
    env.finish().await;
}

on_both_stores!(console_rate_limits);
