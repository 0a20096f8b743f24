//! `talos-sso watch` and `login --watch` with the real binary: renewals in
//! the background on a cluster whose certificates last six seconds, one
//! watch per talosconfig, and the end of the watch (status 4 or 5) when the
//! login is gone: refresh token revoked, logged out, deny-listed, out of
//! the group that gave the role. The same against the real provider, whose
//! refresh token is revoked at its revocation endpoint, is in
//! `a_watch_against_a_real_provider_renews_twice_then_stops_with_4_after_revocation`.

use std::time::Duration;

use talos_sso_tests::harness::{Backend, TestEnv};
use talos_sso_tests::real_op::{CLIENT_ID, ONCALL_USER, RealOpEnv};
use talos_sso_tests::talos_checker;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout};

use super::{Machine, admin_and_bob, browser_login, context_fields};

/// Certificates of six seconds (the server backdates them by its clock
/// skew allowance): the watch renews every four seconds.
pub(super) fn six_second_certificates(yaml: String) -> String {
    let edited = yaml.replace("    ttl: 5m\n", "    ttl: 6s\n");
    assert_ne!(edited, yaml, "the test configuration has a `ttl: 5m` to shorten");
    edited
}

/// A running watch: its standard output line by line, its standard error
/// collected (and passed on line by line).
pub(super) struct RunningWatch {
    pub child: Child,
    pub lines: tokio::io::Lines<BufReader<ChildStdout>>,
    err_lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    err: tokio::task::JoinHandle<String>,
}

impl RunningWatch {
    pub fn start(machine: &Machine, args: &[&str]) -> Self {
        let mut child = machine.command(args).spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut err_reader = BufReader::new(child.stderr.take().unwrap()).lines();
        let (send, err_lines) = tokio::sync::mpsc::unbounded_channel();
        let err = tokio::spawn(async move {
            let mut all = String::new();
            while let Ok(Some(line)) = err_reader.next_line().await {
                all.push_str(&line);
                all.push('\n');
                let _ = send.send(line);
            }
            all
        });
        Self {
            child,
            lines,
            err_lines,
            err,
        }
    }

    /// The next line on standard output that contains `wanted`, within
    /// 30 seconds (a renewal is due every four).
    pub async fn line_with(&mut self, wanted: &str) -> String {
        let mut seen = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match self.lines.next_line().await.unwrap() {
                    Some(line) if line.contains(wanted) => return line,
                    Some(line) => seen.push(line),
                    None => panic!("the watch ended before `{wanted}`: {seen:?}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no `{wanted}` within 30 s: {seen:?}"))
    }

    /// The next line on standard error that starts with `prefix` (after
    /// spaces), within 30 seconds.
    pub async fn err_line_starting(&mut self, prefix: &str) -> String {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let line = self.err_lines.recv().await.expect("standard error ended");
                if line.trim().starts_with(prefix) {
                    return line.trim().to_owned();
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no line starting with `{prefix}` within 30 s"))
    }

    /// Wait for the watch to end by itself, within 30 seconds; its status
    /// and standard error.
    pub async fn ended(mut self) -> (i32, String) {
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the watch ended within 30 s")
            .unwrap();
        (status.code().unwrap_or(-1), self.err.await.unwrap())
    }
}

/// The refresh tokens saved on `machine`, changed to ones the provider does
/// not know (revoked by an administrator), under the token store's lock so
/// that a refresh under way cannot write over the change.
fn revoke_saved_refresh_tokens(machine: &Machine) {
    let cache = machine.home.path().join(".cache/talos-sso/tokens.json");
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(cache.with_extension("json.refresh"))
        .unwrap();
    lock.lock().unwrap();
    machine.revoke_saved_refresh_tokens();
    drop(lock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_renews_in_the_background_and_stops_with_4_when_the_refresh_token_is_revoked() {
    let env = TestEnv::start_with(Backend::Sqlite, six_second_certificates).await;
    let bob = Machine::new();
    let (code, out) = browser_login(&env, &bob, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);
    let (_, first, _) = context_fields(&bob.talosconfig(), "prod");

    let mut watch = RunningWatch::start(&bob, &["watch"]);
    let watching = watch.line_with("watching prod").await;
    assert!(watching.contains("next renewal at"), "{watching}");
    let mut certificates = vec![first];
    for _ in 0..2 {
        let renewed = watch.line_with("renewed prod").await;
        assert!(
            renewed.contains("valid until") && renewed.contains("next renewal at"),
            "{renewed}"
        );
        let (ca, crt, key) = context_fields(&bob.talosconfig(), "prod");
        // Each renewal is a new certificate, which Talos accepts.
        assert!(!certificates.contains(&crt), "the same certificate again");
        let accepted = talos_checker::handshake(&ca, &crt, &key).unwrap();
        assert_eq!(accepted.roles, ["os:operator"]);
        certificates.push(crt);
    }

    // One watch per talosconfig: a second one, and `login --watch` on the
    // same file (before it logs in), refuse.
    let (code, out, err) = bob.run(&["watch"]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("another watch already keeps the logins in"), "{err}");
    assert!(err.contains("talos-sso watch, process"), "{err}");
    let (code, out, err) = bob.run(&["login", "--watch"]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("another watch already keeps the logins in"), "{err}");
    assert!(!out.contains("Logged in"), "{out}");

    // The login is gone: the watch says so and ends with 4, with no browser.
    revoke_saved_refresh_tokens(&bob);
    let (code, err) = watch.ended().await;
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("stopped keeping prod fresh:") && err.contains("Run `talos-sso login --cluster prod`"),
        "{err}"
    );
    assert!(err.contains("no login is left to keep fresh"), "{err}");
    assert!(!err.contains("http://"), "no browser login offered: {err}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_stops_with_4_on_logout_and_with_5_when_the_person_is_deny_listed() {
    let env = TestEnv::start_with(Backend::Sqlite, six_second_certificates).await;
    let (alice, bob) = admin_and_bob(&env).await;

    let mut watch = RunningWatch::start(&bob, &["watch", "--cluster", "prod"]);
    watch.line_with("renewed prod").await;
    let (code, _, err) = bob.run(&["logout"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, err) = watch.ended().await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("stopped keeping prod fresh"), "{err}");

    // Nothing to watch: status 4 at once.
    let (code, _, err) = bob.run(&["watch"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("nothing to keep fresh: no login yet"), "{err}");

    // `login --watch` logs in (by browser: the logout forgot the refresh
    // token), then keeps that login fresh.
    env.emulator.set_auto_login(Some("bob@example.com"));
    let mut watch = RunningWatch::start(&bob, &["login", "--no-browser", "--watch"]);
    let url = watch.err_line_starting("http").await;
    let page = reqwest::get(&url).await.unwrap();
    assert_eq!(page.status(), 200);
    env.emulator.set_auto_login(None);
    watch.line_with("Logged in to prod as bob@example.com").await;
    watch.line_with("renewed prod").await;

    // An administrator blocks Bob: the next renewal is refused, status 5.
    let (code, _, err) = alice
        .run(&[
            "deny",
            "add",
            "--user",
            "bob@example.com",
            "--reason",
            "laptop stolen",
        ])
        .await;
    assert_eq!(code, 0, "{err}");
    let (code, err) = watch.ended().await;
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("you are blocked from new certificates"), "{err}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_stops_with_5_when_the_person_leaves_the_group_that_gave_the_role() {
    let env = TestEnv::start_with(Backend::Sqlite, six_second_certificates).await;
    let (_alice, bob) = admin_and_bob(&env).await;
    let mut watch = RunningWatch::start(&bob, &["watch"]);
    watch.line_with("renewed prod").await;

    // Bob leaves every group: the next refresh gives a token without the
    // group, and the server refuses the renewal by policy.
    env.emulator.set_groups("bob@example.com", &[]);
    let (code, err) = watch.ended().await;
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("stopped keeping prod fresh"), "{err}");
    assert!(err.contains("ask for membership in one of"), "{err}");
    assert!(err.contains("no login is left to keep fresh"), "{err}");
    env.finish().await;
}

/// The refresh token saved on `machine`, revoked at the provider's
/// revocation endpoint (RFC 7009) as an administrator or the person's
/// sign-out would, under the token store's lock so that no refresh is
/// under way with it.
async fn revoke_at_the_provider(env: &RealOpEnv, machine: &Machine) {
    let cache = machine.home.path().join(".cache/talos-sso/tokens.json");
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(cache.with_extension("json.refresh"))
        .unwrap();
    lock.lock().unwrap();
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
    let entries = saved["entries"].as_object().unwrap();
    assert_eq!(entries.len(), 1, "one saved login");
    let refresh_token = entries.values().next().unwrap()["refresh_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let answer = reqwest::Client::new()
        .post(format!("{}/token/revocation", env.op.issuer))
        .form(&[
            ("token", refresh_token.as_str()),
            ("token_type_hint", "refresh_token"),
            ("client_id", CLIENT_ID),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(
        answer.status(),
        200,
        "revocation: {}",
        answer.text().await.unwrap()
    );
    drop(lock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_against_a_real_provider_renews_twice_then_stops_with_4_after_revocation() {
    let env = RealOpEnv::start_edited("id_token", |yaml| {
        let edited = yaml.replace(
            "    endpoints: [\"127.0.0.1\"]\n",
            "    endpoints: [\"127.0.0.1\"]\n    ttl: 6s\n",
        );
        assert_ne!(edited, yaml);
        edited
    })
    .await;
    let bob = Machine::new();
    let (code, out, err) = super::real_op::browser_login(&env, &bob, ONCALL_USER, &[]).await;
    assert_eq!(code, 0, "{out}{err}\nprovider log: {}", env.op.log());

    let mut watch = RunningWatch::start(&bob, &["watch"]);
    watch.line_with("watching prod").await;
    let mut certificates = Vec::new();
    for _ in 0..2 {
        watch.line_with("renewed prod").await;
        let (ca, crt, key) = context_fields(&bob.talosconfig(), "prod");
        assert_eq!(
            talos_checker::handshake(&ca, &crt, &key).unwrap().roles,
            ["os:operator"]
        );
        assert!(!certificates.contains(&crt), "the same certificate again");
        certificates.push(crt);
    }

    revoke_at_the_provider(&env, &bob).await;
    let (code, err) = watch.ended().await;
    assert_eq!(code, 4, "{err}\nprovider log: {}", env.op.log());
    assert!(err.contains("stopped keeping prod fresh:"), "{err}");
    assert!(err.contains("refused by the identity provider"), "{err}");
    assert!(!err.contains("http://"), "no browser login offered: {err}");
    env.finish().await;
}
