//! The real `talos-sso` binary against a real server and the Entra emulator:
//! browser and device logins, silent refresh, talosconfig merging and
//! locking, status, exec, logout, audit, deny, and the messages people read.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use serde_yaml_ng::Value;
use talos_sso_tests::emulator::EmulatorConfig;
use talos_sso_tests::harness::{Backend, TestEnv};
use talos_sso_tests::talos_checker;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The same, against a real, certified OpenID Provider.
#[path = "cli/real_op.rs"]
mod real_op;

/// `watch`: certificates kept fresh in the background.
#[path = "cli/watch.rs"]
mod watch;

/// The exit codes scripts test: 2, 4, 5 and `exec`'s pass-through.
#[path = "cli/exit_codes.rs"]
mod exit_codes;

/// `-o json|yaml|table`, `--debug` redaction, `NO_COLOR`.
#[path = "cli/conventions.rs"]
mod conventions;

/// Saved logins in a real Secret Service, and the file store.
#[path = "cli/keyring.rs"]
mod keyring;

/// A cluster in accepted-CA mode, judged by Go's standard library.
#[path = "cli/accepted_ca.rs"]
mod accepted_ca;

/// A gateway cluster: the talosconfig points at the gateway.
#[path = "cli/gateway.rs"]
mod gateway;

/// `audit list --method --node`: Talos API calls in the trail.
#[path = "cli/api_calls.rs"]
mod api_calls;

/// `audit list --kind`: workload logins in the trail.
#[path = "cli/workloads.rs"]
mod workloads;

/// Workloads: `--token-file`, `--github-actions`, `exec` on a rotated token.
#[path = "cli/workload.rs"]
mod workload;

const BINARY: &str = env!("CARGO_BIN_EXE_talos-sso");

/// A person's machine: its own HOME, config and cache directories.
struct Machine {
    home: tempfile::TempDir,
}

impl Machine {
    fn new() -> Self {
        Self {
            home: tempfile::tempdir().unwrap(),
        }
    }

    fn talosconfig(&self) -> PathBuf {
        self.home.path().join(".talos").join("config")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BINARY);
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.home.path())
            .env("XDG_CONFIG_HOME", self.home.path().join(".config"))
            .env("XDG_CACHE_HOME", self.home.path().join(".cache"))
            // Saved logins in a file of this machine's own, never in a
            // keyring of the desktop running the tests (`keyring` tests
            // start a Secret Service of their own).
            .env("TALOS_SSO_TOKEN_STORE", "file")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Make every saved refresh token one the provider does not know, as
    /// if an administrator revoked it.
    fn revoke_saved_refresh_tokens(&self) {
        let cache = self.home.path().join(".cache/talos-sso/tokens.json");
        let text = std::fs::read_to_string(&cache).unwrap();
        let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
        for entry in json["entries"].as_object_mut().unwrap().values_mut() {
            entry["refresh_token"] = serde_json::json!("revoked-by-an-administrator");
        }
        std::fs::write(&cache, json.to_string()).unwrap();
    }

    async fn run(&self, args: &[&str]) -> (i32, String, String) {
        run_command(self.command(args)).await
    }
}

/// Run `command` to its end, within 60 seconds: its status, stdout, stderr.
async fn run_command(mut command: Command) -> (i32, String, String) {
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .unwrap()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Read the child's stderr until a line satisfies `pick`; return its value,
/// the lines so far, and a task collecting the rest of stderr.
async fn wait_for_line(
    child: &mut Child,
    pick: impl Fn(&str) -> Option<String>,
) -> (String, Vec<String>, tokio::task::JoinHandle<String>) {
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push(line.clone());
            if let Some(value) = pick(&line) {
                return value;
            }
        }
        panic!("stderr ended without the expected line: {seen:?}");
    })
    .await
    .expect("the CLI printed what was expected in time");
    let rest = tokio::spawn(async move {
        let mut rest = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            rest.push_str(&line);
            rest.push('\n');
        }
        rest
    });
    (found, seen, rest)
}

/// The child's stdout, line by line.
fn stdout_lines(child: &mut Child) -> tokio::io::Lines<BufReader<tokio::process::ChildStdout>> {
    BufReader::new(child.stdout.take().unwrap()).lines()
}

/// The next line of a command that goes on (`audit export --follow`), as
/// JSON, within 30 seconds.
async fn next_json_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> serde_json::Value {
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("a line within 30 s")
        .unwrap()
        .expect("the command goes on");
    serde_json::from_str(&line).unwrap()
}

async fn finish(child: Child) -> (i32, String) {
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

/// A browser login: the "browser" follows the printed URL; the emulator
/// signs `user` in automatically and redirects to the CLI's loopback.
async fn browser_login(env: &TestEnv, machine: &Machine, user: &str, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["login", "--server", &env.server.base_url, "--no-browser"];
    args.extend_from_slice(extra);
    follow_browser_login(env, user, machine.command(&args)).await
}

/// Alice, an administrator logged in with os:admin, and Bob, logged in with
/// his default roles; later logins are silent or need a person.
async fn admin_and_bob(env: &TestEnv) -> (Machine, Machine) {
    let alice = Machine::new();
    let (code, out) = browser_login(env, &alice, "alice@example.com", &["--role", "os:admin"]).await;
    assert_eq!(code, 0, "{out}");
    let bob = Machine::new();
    let (code, out) = browser_login(env, &bob, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);
    (alice, bob)
}

/// Run a `login --no-browser` command and play the browser for `user`.
async fn follow_browser_login(env: &TestEnv, user: &str, mut command: Command) -> (i32, String) {
    env.emulator.set_auto_login(Some(user));
    let mut child = command.spawn().unwrap();
    let (url, _, _) = wait_for_line(&mut child, |line| {
        line.trim().starts_with("http").then(|| line.trim().to_owned())
    })
    .await;
    let page = reqwest::get(&url).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("You may close this tab"));
    finish(child).await
}

fn context_fields(path: &Path, context: &str) -> (String, String, String) {
    let yaml: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let field = |name: &str| {
        let encoded = yaml["contexts"][context][name]
            .as_str()
            .unwrap_or_else(|| panic!("no {name} in {context}"));
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(encoded).unwrap()).unwrap()
    };
    (field("ca"), field("crt"), field("key"))
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_login_then_silent_refresh_write_a_talosconfig_talos_accepts() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("Logged in to prod as bob@example.com with os:operator"),
        "{out}"
    );
    let path = machine.talosconfig();
    assert_eq!((mode(&path), mode(path.parent().unwrap())), (0o600, 0o700));
    let (ca, crt, key) = context_fields(&path, "prod");
    assert_eq!(
        talos_checker::handshake(&ca, &crt, &key).unwrap().roles,
        ["os:operator"]
    );
    assert!(key.starts_with("-----BEGIN ED25519 PRIVATE KEY-----"));
    let cache = machine.home.path().join(".cache/talos-sso/tokens.json");
    assert_eq!(mode(&cache), 0o600);

    // Again, with no --server and no browser: the server is remembered and
    // the cached refresh token gives a fresh token (the server refuses replays).
    env.emulator.set_auto_login(None);
    let (code, out, err) = machine.run(&["login"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("http"), "no browser URL the second time: {err}");
    let (_, crt2, key2) = context_fields(&path, "prod");
    assert_ne!(
        (crt, key),
        (crt2.clone(), key2.clone()),
        "a new key and certificate each time"
    );
    assert_eq!(
        talos_checker::handshake(&ca, &crt2, &key2).unwrap().roles,
        ["os:operator"]
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_login_works_headless() {
    let env = TestEnv::start_full(
        Backend::Sqlite,
        EmulatorConfig {
            device_interval: 1,
            ..Default::default()
        },
        |y| y,
    )
    .await;
    let machine = Machine::new();
    let mut child = machine
        .command(&["login", "--server", &env.server.base_url, "--device"])
        .spawn()
        .unwrap();
    let (code_line, seen, _) = wait_for_line(&mut child, |line| {
        let t = line.trim();
        (t.len() == 9 && t.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()))
            .then(|| t.to_owned())
    })
    .await;
    assert!(seen.iter().any(|l| l.contains("/devicelogin")), "{seen:?}");
    assert!(env.emulator.approve_device(&code_line, "carol@example.com"));
    let (code, out) = finish(child).await;
    assert_eq!(code, 0, "{out}");
    let (ca, crt, key) = context_fields(&machine.talosconfig(), "prod");
    assert_eq!(
        talos_checker::handshake(&ca, &crt, &key).unwrap().roles,
        ["os:reader"]
    );

    // Declined on the device page: a clear message, nothing written.
    let other = Machine::new();
    let mut child = other
        .command(&["login", "--server", &env.server.base_url, "--device"])
        .spawn()
        .unwrap();
    let (code_line, _, _) = wait_for_line(&mut child, |line| {
        let t = line.trim();
        (t.len() == 9 && t.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()))
            .then(|| t.to_owned())
    })
    .await;
    assert!(env.emulator.decline_device(&code_line));
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(4));
    assert!(!other.talosconfig().exists());
    env.finish().await;
}

const EXTRA_CONTEXTS: &str = r#"
  omni:
    endpoints: [https://omni.example.com]
    auth:
      siderov1:
        identity: alice@example.com
    cluster: omni-prod
  proxied:
    endpoints: [10.5.0.2]
    proxy-url: http://proxy.internal:3128
    some-future-key: {nested: [1, 2, 3]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_keeps_every_other_context_and_field_and_refuses_malformed_files() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let path = machine.home.path().join("custom-talosconfig");
    let fixture = std::fs::read_to_string(talos_sso_tests::material::fixture(
        "talos/talosconfig-2021-admin.yaml",
    ))
    .unwrap();
    // The 2021 talosconfig, plus contexts and fields this client does not model.
    let mut before: Value = serde_yaml_ng::from_str(&fixture).unwrap();
    let extra: Value = serde_yaml_ng::from_str(&format!("contexts:{EXTRA_CONTEXTS}")).unwrap();
    for (name, context) in extra["contexts"].as_mapping().unwrap() {
        before["contexts"]
            .as_mapping_mut()
            .unwrap()
            .insert(name.clone(), context.clone());
    }
    before
        .as_mapping_mut()
        .unwrap()
        .insert("top-level-unknown".into(), "keep-me".into());
    let original = serde_yaml_ng::to_string(&before).unwrap();
    std::fs::write(&path, &original).unwrap();

    let (code, out) = browser_login(
        &env,
        &machine,
        "bob@example.com",
        &["--talosconfig", path.to_str().unwrap()],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let after: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for context in ["no-roles", "omni", "proxied"] {
        assert_eq!(
            after["contexts"][context], before["contexts"][context],
            "context {context} unchanged in meaning"
        );
    }
    assert_eq!(after["top-level-unknown"], "keep-me");
    assert_eq!(
        after["context"], before["context"],
        "the current context is not switched"
    );
    assert!(after["contexts"].get("prod").is_some());
    assert_eq!(mode(&path), 0o600);

    // --set-current switches it.
    let (code, _, err) = machine
        .run(&["login", "--talosconfig", path.to_str().unwrap(), "--set-current"])
        .await;
    assert_eq!(code, 0, "{err}");
    let after: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(after["context"], "prod");

    // A malformed file: an error that says so, and the file byte for byte as it was.
    let broken = "context: prod\ncontexts:\n  prod: [this, is, not, a, context]\n";
    std::fs::write(&path, broken).unwrap();
    let (code, _, err) = machine
        .run(&["login", "--talosconfig", path.to_str().unwrap()])
        .await;
    assert_eq!(code, 1);
    assert!(err.contains("is not a valid talosconfig"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), broken);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_logins_on_one_file_keep_both_contexts() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);
    let path = machine.talosconfig();
    for round in 0..3 {
        let names: Vec<String> = (0..4).map(|i| format!("ctx-{round}-{i}")).collect();
        let children: Vec<_> = names
            .iter()
            .map(|name| machine.command(&["login", "--context", name]).spawn().unwrap())
            .collect();
        for child in children {
            let output = child.wait_with_output().await.unwrap();
            assert_eq!(
                output.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let yaml: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for name in &names {
            let (ca, crt, key) = context_fields(&path, name);
            assert!(yaml["contexts"].get(name.as_str()).is_some());
            talos_checker::handshake(&ca, &crt, &key).unwrap();
        }
    }
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_exec_and_logout() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let path = machine.talosconfig();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, format!("context: omni\ncontexts:{EXTRA_CONTEXTS}")).unwrap();
    // A 30-second certificate: less than the minute `exec` wants.
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &["--ttl", "30s"]).await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);

    let (_, status, _) = machine.run(&["status"]).await;
    assert!(
        status.contains("prod: logged in as bob@example.com with [os:operator]"),
        "{status}"
    );
    let (_, json, _) = machine.run(&["status", "--output", "json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json[0]["roles"], serde_json::json!(["os:operator"]));
    assert!(json[0]["seconds_left"].as_i64().unwrap() <= 30);
    let (_, crt_before, _) = context_fields(&path, "prod");

    // exec renews (silently) and runs the command with TALOSCONFIG set.
    let (code, out, err) = machine
        .run(&[
            "exec",
            "--",
            "sh",
            "-c",
            "grep -c 'context: prod' \"$TALOSCONFIG\"; exit 7",
        ])
        .await;
    assert_eq!(code, 7, "exit code passed through: {err}");
    assert_eq!(
        out.trim(),
        "1",
        "the command saw a talosconfig with the prod context current"
    );
    let (_, crt_after, _) = context_fields(&path, "prod");
    assert_ne!(crt_before, crt_after, "the certificate was renewed");
    let (_, json, _) = machine.run(&["status", "--output", "json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(json[0]["seconds_left"].as_i64().unwrap() > 60);
    // Fresh enough now: no renewal.
    let (code, _, _) = machine.run(&["exec", "--", "true"]).await;
    assert_eq!(code, 0);
    let (_, crt_again, _) = context_fields(&path, "prod");
    assert_eq!(crt_after, crt_again);

    // logout removes our context and the cached token, nothing else.
    let (code, out, _) = machine.run(&["logout"]).await;
    assert_eq!(code, 0, "{out}");
    let yaml: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(yaml["contexts"].get("prod").is_none());
    assert!(yaml["contexts"].get("omni").is_some() && yaml["contexts"].get("proxied").is_some());
    assert_eq!(yaml["context"], "omni");
    let cache = std::fs::read_to_string(machine.home.path().join(".cache/talos-sso/tokens.json")).unwrap();
    assert!(!cache.contains("refresh_token"), "{cache}");
    let (_, status, _) = machine.run(&["status"]).await;
    assert!(status.contains("Not logged in"), "{status}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_exit_codes_server_from_the_environment_version_and_login_selection() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let (code, out, _) = machine.run(&["status"]).await;
    assert_eq!(
        (code, out.trim()),
        (4, "Not logged in anywhere. Run `talos-sso login`.")
    );
    let (code, out, _) = machine.run(&["version"]).await;
    assert_eq!(code, 0);
    let client_line = format!(
        "client: talos-sso {} (API 1, commit {})",
        env!("CARGO_PKG_VERSION"),
        env!("TALOS_SSO_REVISION")
    );
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            client_line.as_str(),
            "server: none yet (pass --server or log in once)"
        ]
    );

    // TALOS_SSO_SERVER instead of --server, for login and version alike.
    let from_env = |args: &[&str]| {
        let mut command = machine.command(args);
        command.env("TALOS_SSO_SERVER", &env.server.base_url);
        command
    };
    let output = from_env(&["version"]).output().await.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stderr}");
    assert!(
        stdout.contains(&format!(
            "server: talos-sso-server {} (API 1) at {}",
            env!("CARGO_PKG_VERSION"),
            env.server.base_url
        )),
        "{stdout}"
    );
    assert!(!stderr.contains("warning"), "same API: no warning: {stderr}");
    let (code, out) =
        follow_browser_login(&env, "bob@example.com", from_env(&["login", "--no-browser"])).await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);

    let (code, out, _) = machine.run(&["status"]).await;
    assert_eq!(code, 0, "{out}");
    // Selection as in talosctl: --context and --talosconfig narrow it.
    let path = machine.talosconfig();
    for selected in [
        vec!["--context", "prod"],
        vec!["--talosconfig", path.to_str().unwrap()],
        vec!["--cluster", "prod", "--context", "prod"],
    ] {
        let mut args = vec!["status"];
        args.extend(selected.iter().copied());
        let (code, out, _) = machine.run(&args).await;
        assert_eq!(code, 0, "{selected:?}: {out}");
        assert!(out.starts_with("prod: logged in as bob@example.com"), "{out}");
    }
    let elsewhere = machine.home.path().join("elsewhere.yaml");
    let (code, out, _) = machine
        .run(&["status", "--talosconfig", elsewhere.to_str().unwrap()])
        .await;
    assert_eq!(code, 4, "{out}");
    assert_eq!(
        out.trim(),
        format!(
            "No login for talosconfig {}. Run `talos-sso login`.",
            elsewhere.display()
        )
    );
    let (code, out, _) = machine.run(&["logout", "--context", "staging"]).await;
    assert_eq!((code, out.trim()), (0, "Nothing to log out of."));
    assert!(yaml_has_context(&path, "prod"), "an unselected login is kept");
    // exec with the selected login's file and context.
    let (code, out, err) = machine
        .run(&[
            "exec",
            "--context",
            "prod",
            "--",
            "sh",
            "-c",
            "grep -c 'context: prod' \"$TALOSCONFIG\"",
        ])
        .await;
    assert_eq!((code, out.trim()), (0, "1"), "{err}");

    // The certificate gone from the file: status says so and exits 4.
    let yaml = std::fs::read_to_string(&path).unwrap();
    let mut value: Value = serde_yaml_ng::from_str(&yaml).unwrap();
    value["contexts"]["prod"]["crt"] = Value::String(String::new());
    std::fs::write(&path, serde_yaml_ng::to_string(&value).unwrap()).unwrap();
    let (code, out, _) = machine.run(&["status", "--context", "prod"]).await;
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("prod: not logged in"), "{out}");
    let (code, json, _) = machine.run(&["status", "--output", "json"]).await;
    assert_eq!(code, 4, "{json}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_and_nodes_set_with_talosctl_survive_a_login() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let path = machine.talosconfig();
    let field = |name: &str| -> Value {
        let yaml: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        yaml["contexts"]["prod"][name].clone()
    };
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);
    // The server's values in a new context.
    assert_eq!(
        field("endpoints"),
        serde_yaml_ng::from_str::<Value>("[127.0.0.1]").unwrap()
    );
    assert_eq!(
        field("nodes"),
        serde_yaml_ng::from_str::<Value>("[127.0.0.1]").unwrap()
    );
    // What `talosctl config node 10.9.9.9 10.9.9.10` writes.
    let mut yaml: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    yaml["contexts"]["prod"]["nodes"] = serde_yaml_ng::from_str("[10.9.9.9, 10.9.9.10]").unwrap();
    std::fs::write(&path, serde_yaml_ng::to_string(&yaml).unwrap()).unwrap();

    let (code, out, err) = machine.run(&["login"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "Kept the nodes you set in context `prod` (`talosctl config node`); the server's are 127.0.0.1."
        ),
        "{out}"
    );
    assert!(!out.contains("Kept the endpoints"), "{out}");
    assert_eq!(
        field("nodes"),
        serde_yaml_ng::from_str::<Value>("[10.9.9.9, 10.9.9.10]").unwrap()
    );
    assert_eq!(
        field("endpoints"),
        serde_yaml_ng::from_str::<Value>("[127.0.0.1]").unwrap()
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_within_one_second_work_with_tokens_that_carry_no_id() {
    // A provider whose ID tokens have no `jti`: a refresh within the same
    // second answers the very token it answered before.
    let env = TestEnv::start_full(
        Backend::Sqlite,
        EmulatorConfig {
            token_ids: false,
            ..Default::default()
        },
        |y| y,
    )
    .await;
    let machine = Machine::new();
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);
    let (code, _, err) = machine.run(&["login"]).await;
    assert_eq!(code, 0, "{err}");
    let same_second = || {
        env.emulator.set_faults(talos_sso_tests::emulator::Faults {
            repeat_token_time: 1,
            ..Default::default()
        })
    };
    // `login` again within the same second as the last token.
    same_second();
    let (code, _, err) = machine.run(&["login", "--ttl", "30s"]).await;
    assert_eq!(code, 0, "a second login in the same second: {err}");
    // `exec` right after `login` (30 s left, so it renews).
    same_second();
    let (code, _, err) = machine.run(&["exec", "--", "true"]).await;
    assert_eq!(code, 0, "exec right after login: {err}");
    let records = env.server.app.audit.store().page(0, 10_000).await.unwrap();
    let refused: Vec<_> = records
        .iter()
        .filter(|r| r.record.reason_code.is_some())
        .map(|r| r.record.reason_code.clone())
        .collect();
    assert!(refused.is_empty(), "no token was sent twice: {refused:?}");
    assert_eq!(records.len(), 4, "four certificates");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyboard_login_takes_the_pasted_address_of_this_login_only() {
    use tokio::io::AsyncWriteExt;
    let env = TestEnv::start(Backend::Sqlite).await;
    env.emulator.set_auto_login(Some("bob@example.com"));
    let machine = Machine::new();
    let mut command = machine.command(&["login", "--server", &env.server.base_url, "--keyboard"]);
    command.stdin(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (url, _, rest) = wait_for_line(&mut child, |line| {
        line.trim().starts_with("http").then(|| line.trim().to_owned())
    })
    .await;
    // The browser on another device: it ends on an address nothing serves.
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let answer = browser.get(&url).send().await.unwrap();
    assert!(answer.status().is_redirection(), "{}", answer.status());
    let location = answer.headers()["location"].to_str().unwrap().to_owned();
    assert!(
        location.starts_with("http://localhost:8000/callback?code="),
        "{location}"
    );
    // Someone else's link first, then something else, then the real one.
    let forged = "http://localhost:8000/callback?code=attackers&state=not-this-login";
    for line in [forged, "yes", location.as_str()] {
        stdin.write_all(format!("{line}\n").as_bytes()).await.unwrap();
    }
    let (code, out) = finish(child).await;
    let err = rest.await.unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("Logged in to prod as bob@example.com"), "{out}");
    assert!(
        err.contains("That address does not belong to this login"),
        "{err}"
    );
    assert!(err.contains("That is not the address to paste"), "{err}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_ttl_asks_for_a_certificate_that_covers_the_command_up_to_the_clusters_longest() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);
    // 5 minutes left covers a 2-minute command: nothing renewed, nothing said.
    let (code, _, err) = machine.run(&["exec", "--ttl", "2m", "--", "true"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("Asking for"), "{err}");
    // 10 minutes: renewed for 10 (prod allows 15).
    let (code, _, err) = machine.run(&["exec", "--ttl", "10m", "--", "true"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("Asking for a 10m00s certificate to cover the command."),
        "{err}"
    );
    let seconds = seconds_left(&machine).await;
    assert!((540..=600).contains(&seconds), "{seconds}");
    // An hour: prod's longest (15 minutes), said so.
    let (code, _, err) = machine.run(&["exec", "--ttl", "1h", "--", "true"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(
            "The command may need 1h00m, but prod allows certificates of at most 15m00s: asking for that."
        ),
        "{err}"
    );
    let seconds = seconds_left(&machine).await;
    assert!((840..=900).contains(&seconds), "{seconds}");
    env.finish().await;
}

async fn seconds_left(machine: &Machine) -> i64 {
    let (_, json, _) = machine.run(&["status", "--output", "json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    json[0]["seconds_left"].as_i64().unwrap()
}

fn yaml_has_context(path: &Path, context: &str) -> bool {
    let yaml: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    yaml["contexts"].get(context).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_refusals_become_sentences() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    env.emulator.set_auto_login(Some("dave@example.com"));
    let mut child = machine
        .command(&["login", "--server", &env.server.base_url, "--no-browser"])
        .spawn()
        .unwrap();
    let (url, _, rest) = wait_for_line(&mut child, |line| {
        line.trim().starts_with("http").then(|| line.trim().to_owned())
    })
    .await;
    reqwest::get(&url).await.unwrap();
    let output = child.wait_with_output().await.unwrap();
    assert_eq!(output.status.code(), Some(5));
    let err = rest.await.unwrap();
    assert!(
        err.contains("no group or app role of yours grants a role on cluster `prod`"),
        "{err}"
    );
    assert!(
        err.contains("3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a01"),
        "names the groups that would help: {err}"
    );

    // An unknown server.
    let (code, _, err) = machine.run(&["login", "--server", "http://127.0.0.1:9"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("cannot be reached"), "{err}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_planted_at_a_lock_path_is_refused_not_followed() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let cache_dir = machine.home.path().join(".cache/talos-sso");
    std::fs::create_dir_all(&cache_dir).unwrap();
    let elsewhere = machine.home.path().join("elsewhere");
    let planted = cache_dir.join("tokens.json.refresh");
    std::os::unix::fs::symlink(&elsewhere, &planted).unwrap();
    let (code, _, err) = machine
        .run(&["login", "--server", &env.server.base_url, "--no-browser"])
        .await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "locking the token store: {} is a symbolic link, which is not followed",
            planted.display()
        )),
        "{err}"
    );
    assert!(!elsewhere.exists(), "nothing created through the link");
    assert!(!machine.talosconfig().exists());
    env.finish().await;
}

#[tokio::test]
async fn completions_for_each_shell() {
    let machine = Machine::new();
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, _) = machine.run(&["completions", shell]).await;
        assert_eq!(code, 0);
        assert!(out.contains("talos-sso") && out.contains("login"), "{shell}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_and_forged_redirects_cannot_derail_a_browser_login() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    env.emulator.set_auto_login(Some("bob@example.com"));
    let mut child = machine
        .command(&["login", "--server", &env.server.base_url, "--no-browser"])
        .spawn()
        .unwrap();
    let (url, _, rest) = wait_for_line(&mut child, |line| {
        line.trim().starts_with("http").then(|| line.trim().to_owned())
    })
    .await;
    let redirect = url::Url::parse(&url)
        .unwrap()
        .query_pairs()
        .find(|(name, _)| name == "redirect_uri")
        .map(|(_, value)| value.into_owned())
        .unwrap();
    // What identity provider registrations expect.
    assert!(redirect.starts_with("http://localhost:"), "{redirect}");
    let port = url::Url::parse(&redirect).unwrap().port().unwrap();

    // A port scanner or a browser's preconnect: connected and silent, on
    // 127.0.0.1 and, where the host has it, on [::1], which the CLI holds
    // too so that no other program can take the port there.
    let mut idle = vec![TcpStream::connect(("127.0.0.1", port)).await.unwrap()];
    if std::net::TcpListener::bind(("::1", 0)).is_ok() {
        idle.push(
            TcpStream::connect(("::1", port))
                .await
                .expect("the CLI listens on [::1] too"),
        );
    }
    // Someone else's redirect: an error without this login's state.
    let mut forged = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    forged
        .write_all(
            b"GET /callback?error=access_denied&error_description=forged%20by%20someone HTTP/1.1\r\n\
              Host: localhost\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = String::new();
    forged.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    // The real redirect still goes through, at once.
    let page = tokio::time::timeout(Duration::from_secs(20), reqwest::get(&url))
        .await
        .expect("the redirect is not held up by the idle connections")
        .unwrap();
    assert_eq!(page.status(), 200);
    let (code, out) = finish(child).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Logged in to prod as bob@example.com"), "{out}");
    let err = rest.await.unwrap();
    assert!(!err.contains("forged"), "{err}");
    assert!(err.contains("Ignored a request to the callback"), "{err}");
    drop(idle);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_refresh_falls_back_to_the_browser_and_says_why() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    machine.revoke_saved_refresh_tokens();

    env.emulator.set_auto_login(Some("bob@example.com"));
    let mut child = machine.command(&["login", "--no-browser"]).spawn().unwrap();
    let (url, seen, _) = wait_for_line(&mut child, |line| {
        line.trim().starts_with("http").then(|| line.trim().to_owned())
    })
    .await;
    assert!(
        seen.iter()
            .any(|l| l.contains("Your saved login could not be renewed") && l.contains("logging in again")),
        "{seen:?}"
    );
    reqwest::get(&url).await.unwrap();
    let (code, out) = finish(child).await;
    assert_eq!(code, 0, "{out}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_browser_login_times_out_clearly() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let (code, _, err) = machine
        .run(&[
            "login",
            "--server",
            &env.server.base_url,
            "--no-browser",
            "--timeout",
            "1s",
        ])
        .await;
    assert_eq!(code, 4);
    assert!(err.contains("did not finish within 1s"), "{err}");
    assert!(err.contains("--device"), "suggests the alternative: {err}");
    assert!(!machine.talosconfig().exists());
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_produces_a_talosconfig_and_an_audit_record() {
    let scratch = tempfile::tempdir().unwrap();
    let options = talos_sso_tests::quickstart::QuickstartOptions {
        dir: scratch.path().join("quickstart"),
        client: PathBuf::from(BINARY),
        emulator_port: 0,
        server_port: 0,
        once: true,
    };
    let result = talos_sso_tests::quickstart::run(options).await.unwrap();
    assert_eq!(mode(&result.talosconfig), 0o600);
    let (ca, crt, key) = context_fields(&result.talosconfig, "demo");
    // Accepted-CA mode: the node trusts its cluster CA (the talosconfig's
    // `ca`) plus the client CA in machine.acceptedCAs, and only with both
    // admits bob.
    let client_ca = std::fs::read_to_string(result.dir.join("client-ca.crt")).unwrap();
    assert_eq!(
        talos_checker::handshake(&format!("{ca}{client_ca}"), &crt, &key)
            .unwrap()
            .roles,
        ["os:operator"]
    );
    assert!(talos_checker::handshake(&ca, &crt, &key).is_err());
    let record = &result.audit_record;
    assert_eq!(record["event"], "certificate.issued");
    assert_eq!(record["username"], "bob@example.com");
    assert_eq!(record["roles_granted"], serde_json::json!(["os:operator"]));
    assert_eq!(record["cluster"], "demo");
    assert_eq!(record["seq"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_chooses_which_token_the_cli_sends() {
    use talos_sso_tests::emulator::{CLI_CLIENT_ID, SERVER_APP_ID};
    // A provider that needs a `groups` scope, no `identity.token`: the ID
    // token, whatever the scope names (the server accepts only ID tokens).
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        yaml.replace(
            &format!(r#"audiences: ["{CLI_CLIENT_ID}", "{SERVER_APP_ID}", "api://{SERVER_APP_ID}"]"#),
            &format!(
                r#"audiences: ["{CLI_CLIENT_ID}"]
  scopes: ["openid", "profile", "offline_access", "groups"]"#
            ),
        )
    })
    .await;
    let info: serde_json::Value = reqwest::get(format!("{}/v1/info", env.server.base_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["token"], "id_token");
    let machine = Machine::new();
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    env.finish().await;

    // `identity.token: access_token`: the access token (the server accepts
    // only access tokens for its own API, not ID tokens).
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        yaml.replace(
            &format!(r#"audiences: ["{CLI_CLIENT_ID}", "{SERVER_APP_ID}", "api://{SERVER_APP_ID}"]"#),
            &format!(
                r#"audiences: ["{SERVER_APP_ID}"]
  token: access_token
  scopes: ["openid", "profile", "offline_access", "api://{SERVER_APP_ID}/talos.certificates"]"#
            ),
        )
    })
    .await;
    assert_eq!(env.config().identity.login_issuer().audiences, [SERVER_APP_ID]);
    let machine = Machine::new();
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    // And silently again, with the refreshed access token.
    env.emulator.set_auto_login(None);
    let (code, _, err) = machine.run(&["login"]).await;
    assert_eq!(code, 0, "{err}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talosconfig_env_is_used_and_the_flag_wins_over_it() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let from_env = machine.home.path().join("from-env.yaml");
    let from_flag = machine.home.path().join("from-flag.yaml");
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);
    let run_with_env = |args: &[&str]| {
        let mut command = machine.command(args);
        command.env("TALOSCONFIG", &from_env);
        command.output()
    };
    let output = run_with_env(&["login"]).await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(from_env.exists());
    let output = run_with_env(&["login", "--talosconfig", from_flag.to_str().unwrap()])
        .await
        .unwrap();
    assert!(output.status.success());
    assert!(from_flag.exists());
    context_fields(&from_flag, "prod");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_security_team_reads_the_audit_trail() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let bob = Machine::new();
    let (code, out) = browser_login(&env, &bob, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    let dave = Machine::new();
    let (code, _) = browser_login(&env, &dave, "dave@example.com", &[]).await;
    assert_eq!(code, 5, "dave has no role");

    // Sam (security group) logs in through the browser for the first query.
    let sam = Machine::new();
    env.emulator.set_auto_login(Some("sam@example.com"));
    let mut child = sam
        .command(&[
            "audit",
            "list",
            "--server",
            &env.server.base_url,
            "--no-browser",
            "--role",
            "os:operator",
        ])
        .spawn()
        .unwrap();
    let (url, _, _) = wait_for_line(&mut child, |line| {
        line.trim().starts_with("http").then(|| line.trim().to_owned())
    })
    .await;
    reqwest::get(&url).await.unwrap();
    let (code, table) = finish(child).await;
    assert_eq!(code, 0, "{table}");
    assert!(table.starts_with("   SEQ  TIME"), "{table}");
    assert!(
        table.contains("bob@example.com") && table.contains("os:operator"),
        "{table}"
    );
    assert!(!table.contains("dave@example.com"), "filtered by role: {table}");
    env.emulator.set_auto_login(None);

    // Later queries are silent (cached login, remembered server).
    let (code, csv, err) = sam
        .run(&["audit", "list", "--user", "dave@example.com", "--output", "csv"])
        .await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "seq,occurred_at,event,outcome,reason_code,cluster,username,roles_granted,serial,client_ip"
    );
    assert!(
        lines[1].contains(",certificate.denied,denied,no_matching_rule,prod,dave@example.com,"),
        "{csv}"
    );
    let (code, json, _) = sam.run(&["audit", "export", "--output", "json"]).await;
    assert_eq!(code, 0);
    let exported: Vec<serde_json::Value> = json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(exported.len() >= 4, "{json}");
    assert!(
        exported
            .iter()
            .any(|r| r["event"] == "audit.query" && r["username"] == "sam@example.com")
    );
    let (code, shown, _) = sam.run(&["audit", "show", "1"]).await;
    assert_eq!(code, 0);
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(
        (shown["seq"].as_i64(), shown["username"].as_str()),
        (Some(1), Some("bob@example.com"))
    );
    let (code, verified, _) = sam.run(&["audit", "verify"]).await;
    assert_eq!(code, 0);
    assert!(verified.contains("audit chain intact"), "{verified}");

    // Bob is not an auditor.
    let (code, _, err) = bob.run(&["audit", "list"]).await;
    assert_eq!(code, 5);
    assert!(
        err.contains("reading the audit trail is for the security team"),
        "{err}"
    );
    env.finish().await;
}

/// `exported` (an `audit export --output json`) verifies offline, by the
/// CLI (run by `auditor`) and by tests/audit-verify.py, an implementation
/// of docs/audit.md that shares no code with talos-sso.
async fn assert_verifies_offline(auditor: &Machine, exported: &str) {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export.jsonl");
    std::fs::write(&export, exported).unwrap();
    let total = exported.lines().count();
    let (code, out, err) = auditor
        .run(&["audit", "verify", "--file", export.to_str().unwrap()])
        .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("audit chain intact: {total} records verified")),
        "{out}"
    );
    let script = tokio::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/audit-verify.py"))
        .arg(&export)
        .output()
        .await
        .unwrap();
    let script_out = String::from_utf8_lossy(&script.stdout);
    assert_eq!(script.status.code(), Some(0), "{script_out}");
    assert!(
        script_out.starts_with(&format!("intact: {total} records")),
        "{script_out}"
    );
}

/// Sam (security group) logs in through the browser with a first audit
/// command; later ones are silent.
async fn auditor(env: &TestEnv) -> Machine {
    let sam = Machine::new();
    env.emulator.set_auto_login(Some("sam@example.com"));
    let mut child = sam
        .command(&[
            "audit",
            "verify",
            "--server",
            &env.server.base_url,
            "--no-browser",
        ])
        .spawn()
        .unwrap();
    let (url, _, _) = wait_for_line(&mut child, |line| {
        line.trim().starts_with("http").then(|| line.trim().to_owned())
    })
    .await;
    reqwest::get(&url).await.unwrap();
    let (code, out) = finish(child).await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);
    sam
}

fn assert_terminal_safe(text: &str) {
    let found: Vec<char> = text
        .chars()
        .filter(|c| talos_sso_text::is_unsafe(*c) && *c != '\n')
        .collect();
    assert!(found.is_empty(), "{found:?} reached the terminal: {text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_in_the_audit_trail_reaches_the_auditor_harmless() {
    let env = TestEnv::start(Backend::Sqlite).await;
    // Anyone can put text in the trail: the server records who a refused
    // token claims to be (marked unverified) and the cluster asked for.
    let username = "=HYPERLINK(\"http://evil.example/\")\u{1b}[2K\r    99  forged row\n\u{1b}[8m\u{202e}moc.elpmaxe@bob\u{2066}\u{200b}\u{9b}";
    let b64 = |text: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text);
    let claims = serde_json::json!({"preferred_username": username, "oid": "not-a-real-oid"});
    let token = format!(
        "{}.{}.c2lnbmF0dXJl",
        b64(r#"{"alg":"RS256","typ":"JWT","kid":"nope"}"#),
        b64(&claims.to_string())
    );
    let refused = reqwest::Client::new()
        .post(format!("{}/v1/certificates", env.server.base_url))
        .bearer_auth(token)
        .json(&serde_json::json!({"cluster": "prod\u{1b}[31m\r\n", "csr": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let sam = auditor(&env).await;

    // The server keeps what was sent, escaped (control and format
    // characters as `\u{..}`): the JSON export has that value exactly. The
    // client escapes again whatever a record holds (older servers, other
    // sources): see the unit tests of `display` and `cli`.
    let escaped = r#"=HYPERLINK("http://evil.example/")\u{1b}[2K\u{d}    99  forged row\u{a}\u{1b}[8m\u{202e}moc.elpmaxe@bob\u{2066}\u{200b}\u{9b}"#;
    let (code, json, err) = sam.run(&["audit", "export", "--output", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_terminal_safe(&json);
    let exported: Vec<serde_json::Value> = json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let stored = exported
        .iter()
        .find(|r| r["username"] == escaped)
        .unwrap_or_else(|| panic!("the record, exactly: {json}"));
    assert_ne!(stored["username"], username, "never the raw text");
    assert_eq!(
        stored["details"]["requested_cluster"],
        r#"prod\u{1b}[31m\u{d}\u{a}"#
    );
    let seq = stored["seq"].as_i64().unwrap().to_string();

    // The table: one line per record, nothing raw, nothing forged.
    let (code, table, err) = sam.run(&["audit", "list"]).await;
    assert_eq!(code, 0, "{err}");
    assert_terminal_safe(&table);
    let seqs: Vec<String> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
        .collect();
    // Every record so far, and this query's own record: no forged row.
    let expected: Vec<String> = (1..=exported.len() + 1).map(|n| n.to_string()).collect();
    assert_eq!(seqs, expected, "{table}");
    assert!(
        table.contains("  =HYPERLINK(\"http://evil.example/\")\\u{1b}[2K\\u{d…  "),
        "{table}"
    );

    // `show`: the record in full, as JSON, terminal-safe.
    let (code, shown, err) = sam.run(&["audit", "show", &seq]).await;
    assert_eq!(code, 0, "{err}");
    assert_terminal_safe(&shown);
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["username"], escaped);

    // CSV: the username is text to a spreadsheet, not a formula.
    let (code, csv, err) = sam.run(&["audit", "export", "--output", "csv"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        csv.contains(",\"'=HYPERLINK(\"\"http://evil.example/\"\")"),
        "{csv}"
    );
    assert!(!csv.contains(",=") && !csv.contains(",\"="), "{csv}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_blocks_and_unblocks_someone_with_the_cli() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let (alice, bob) = admin_and_bob(&env).await;

    let (code, out, err) = alice
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
    assert!(out.contains("blocked bob@example.com"), "{out}");
    let (_, listed, _) = alice.run(&["deny", "list"]).await;
    assert!(
        listed.contains("bob@example.com") && listed.contains("laptop stolen"),
        "{listed}"
    );

    // Bob's next login is refused, with a sentence saying why.
    let (code, _, err) = bob.run(&["login"]).await;
    assert_eq!(code, 5);
    assert!(err.contains("you are blocked from new certificates"), "{err}");
    // Bob cannot unblock himself.
    let (code, _, err) = bob.run(&["deny", "remove", "--user", "bob@example.com"]).await;
    assert_eq!(code, 5);
    assert!(err.contains("for administrators"), "{err}");

    let (code, out, err) = alice.run(&["deny", "remove", "--user", "bob@example.com"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("removed 1"), "{out}");
    let (code, _, err) = bob.run(&["login"]).await;
    assert_eq!(code, 0, "{err}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_works_with_a_multi_tenant_issuer() {
    let emulator_issuer = std::sync::Mutex::new(String::new());
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        // `issuer: "http://127.0.0.1:PORT/<tenant>/v2.0"` -> the `{tenantid}` template.
        let line = yaml
            .lines()
            .find(|l| l.trim_start().starts_with("issuer:"))
            .unwrap()
            .to_owned();
        let issuer = line.split('"').nth(1).unwrap().to_owned();
        let template = issuer.replace(talos_sso_tests::emulator::TENANT_ID, "{tenantid}");
        *emulator_issuer.lock().unwrap() = template.clone();
        yaml.replace(&line, &format!("  issuer: \"{template}\""))
    })
    .await;
    let template = emulator_issuer.lock().unwrap().clone();
    assert!(template.ends_with("/{tenantid}/v2.0"), "{template}");
    assert_eq!(env.config().identity.issuer, template);
    let machine = Machine::new();
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    let (ca, crt, key) = context_fields(&machine.talosconfig(), "prod");
    assert_eq!(
        talos_checker::handshake(&ca, &crt, &key).unwrap().roles,
        ["os:operator"]
    );
    env.finish().await;
}

/// A port nothing listens on, held for as long as the socket lives: bound
/// but never listening, so a connection is refused and no other test's
/// server can take the port meanwhile (a port bound and released could be).
fn refused_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = socket.local_addr().unwrap().port();
    (socket, port)
}

/// `err` is `error: {sentence} [{chain}]`: the sentence exactly, then the
/// libraries' own words for experts.
fn assert_sentence(err: &str, sentence: &str) {
    assert!(
        err.starts_with(&format!("error: {sentence} [")) && err.ends_with("]\n"),
        "expected `error: {sentence} [...]`, got: {err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_address_without_a_usable_scheme_says_how_to_write_it() {
    let machine = Machine::new();
    let (code, out, err) = machine.run(&["login", "--server", "sso.example.com:8443"]).await;
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err,
        "error: the server address `sso.example.com:8443` has no scheme: use https://HOST:PORT, \
         e.g. --server https://sso.example.com:8443\n"
    );
    // The quick start's server listens in plain HTTP on this machine.
    let (code, out, err) = machine.run(&["login", "--server", "127.0.0.1:8443"]).await;
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err,
        "error: the server address `127.0.0.1:8443` has no scheme: use https://HOST:PORT, \
         or http:// for a server on this machine, e.g. --server http://127.0.0.1:8443\n"
    );
    let (code, _, err) = machine
        .run(&["audit", "list", "--server", "ftp://sso.example.com:8443"])
        .await;
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "error: the server address `ftp://sso.example.com:8443` starts with ftp://, which talos-sso \
         does not speak: use https://HOST:PORT\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_port_is_named_by_every_command_that_reaches_the_server() {
    let machine = Machine::new();
    let (_held, port) = refused_port();
    let server = format!("https://127.0.0.1:{port}");
    let sentence = format!(
        "the talos-sso server at {server} cannot be reached: nothing listens on 127.0.0.1:{port} \
         (connection refused); is the server running, and is the port right?"
    );
    for args in [
        vec!["login", "--server", &server],
        vec!["audit", "list", "--server", &server],
        vec!["audit", "verify", "--server", &server],
        vec!["deny", "list", "--server", &server],
        vec![
            "deny",
            "add",
            "--user",
            "eve@example.com",
            "--reason",
            "test",
            "--server",
            &server,
        ],
    ] {
        let (code, _, err) = machine.run(&args).await;
        assert_eq!(code, 1, "{args:?}");
        assert_sentence(&err, &sentence);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_does_not_resolve_is_named() {
    let machine = Machine::new();
    let (code, _, err) = machine
        .run(&["login", "--server", "https://talos-sso.invalid:8443"])
        .await;
    assert_eq!(code, 1);
    assert_sentence(
        &err,
        "the talos-sso server at https://talos-sso.invalid:8443 cannot be reached: the name \
         `talos-sso.invalid` does not resolve; check its spelling, and your DNS (or VPN)",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_to_a_plain_http_server_is_named() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let server = env.server.base_url.replacen("http://", "https://", 1);
    let address = server.trim_start_matches("https://").to_owned();
    let (code, _, err) = machine.run(&["login", "--server", &server]).await;
    assert_eq!(code, 1);
    assert_sentence(
        &err,
        &format!(
            "the talos-sso server at {server} cannot be reached: the TLS handshake failed because \
             {address} answers in plain HTTP, not HTTPS; use its https:// address (plain http:// only \
             for a server on this machine)"
        ),
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_a_company_authority_needs_certificate_authority() {
    let scratch = tempfile::tempdir().unwrap();
    let (ca, cert, key) = talos_sso_tests::harness::tls_files(scratch.path());
    let tls = format!(
        "tls: {{ cert_file: \"{}\", key_file: \"{}\" }}",
        cert.display(),
        key.display()
    );
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| yaml.replace("insecure_http: true", &tls)).await;
    let server = env.server.base_url.clone();
    assert!(server.starts_with("https://"), "{server}");
    let address = server.trim_start_matches("https://").to_owned();
    let machine = Machine::new();
    let (code, _, err) = machine.run(&["login", "--server", &server]).await;
    assert_eq!(code, 1);
    assert_sentence(
        &err,
        &format!(
            "the talos-sso server at {server} cannot be reached: the TLS handshake failed because its \
             certificate is not trusted: an authority this client does not know signed it (it trusts this \
             machine's trust store and the public web authorities); if {address} has a certificate from \
             your organisation's own authority, pass its certificate (PEM): `talos-sso login \
             --certificate-authority FILE`, or add it to this machine's trust store"
        ),
    );
    assert!(!err.contains("--provider-certificate-authority"), "{err}");

    // The company CA in the system trust store (SSL_CERT_FILE names the
    // store's bundle, as for OpenSSL): no flag needed.
    let ca_file = scratch.path().join("company-ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let mut command = machine.command(&["login", "--server", &server, "--no-browser"]);
    command.env("SSL_CERT_FILE", &ca_file);
    let (code, out) = follow_browser_login(&env, "bob@example.com", command).await;
    assert_eq!(code, 0, "the system trust store is used: {out}");
    env.emulator.set_auto_login(None);
    // Given once with the flag: remembered for the server.
    let (code, _, err) = machine
        .run(&["login", "--certificate-authority", ca_file.to_str().unwrap()])
        .await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = machine.run(&["login"]).await;
    assert_eq!(code, 0, "remembered for the server: {err}");
    let (code, out, err) = machine.run(&["version"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("server: talos-sso-server"), "{out}");
    // A file that is not a certificate: named, nothing remembered from it.
    let (code, _, err) = machine
        .run(&[
            "login",
            "--certificate-authority",
            cert.with_extension("key").to_str().unwrap(),
        ])
        .await;
    assert_eq!(code, 1);
    assert!(
        err.contains("is not a PEM certificate bundle: it holds a `PRIVATE KEY` block"),
        "{err}"
    );
    let (code, _, err) = machine.run(&["login"]).await;
    assert_eq!(code, 0, "the good file is still the one remembered: {err}");
    env.finish().await;
}

/// A talos-sso server of its own that announces an identity provider on a
/// port where nothing listens: login's discovery must name that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_identity_provider_is_named() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_held, idp_port) = refused_port();
    let issuer = format!("http://127.0.0.1:{idp_port}/tenant/v2.0");
    let info = serde_json::json!({
        "server_version": "0", "api_version": 1, "issuer": issuer, "client_id": "cli",
        "scopes": ["openid"], "clusters": [{"name": "prod"}],
    })
    .to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = format!("http://{}", listener.local_addr().unwrap());
    let serving = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = vec![0u8; 4096];
            let _ = stream.read(&mut request).await;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{info}",
                info.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    });
    let machine = Machine::new();
    let (code, _, err) = machine.run(&["login", "--server", &server]).await;
    assert_eq!(code, 1);
    assert_sentence(
        &err,
        &format!(
            "the identity provider at {issuer}/.well-known/openid-configuration cannot be reached: nothing \
             listens on 127.0.0.1:{idp_port} (connection refused); is the identity provider running, and is \
             the port right? (the talos-sso server announces this address: if it is wrong, tell its operators)"
        ),
    );
    serving.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_warns_when_the_server_speaks_another_api() {
    // A server of a later release: the same shape, API 2.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let info = serde_json::json!({
        "server_version": "9.0.0", "api_version": 2, "issuer": "https://idp.example.com",
        "client_id": "cli", "scopes": ["openid"], "clusters": [],
    });
    let served = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let body = info.to_string();
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(answer.as_bytes()).await.unwrap();
        }
    });
    let machine = Machine::new();
    let (code, out, err) = machine.run(&["version", "--server", &url]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("server: talos-sso-server 9.0.0 (API 2) at {url}")),
        "{out}"
    );
    assert_eq!(
        err.trim(),
        "warning: the server speaks API 2 and this client API 1: update talos-sso"
    );
    served.abort();
}

/// `talos-sso audit verify --file` and `tests/audit-verify.py` on one
/// export: what each exited with and printed.
async fn verify_both(
    machine: &Machine,
    export: &Path,
    checkpoints: &str,
    public_key: &str,
) -> ((i32, String, String), (Option<i32>, String)) {
    let path = export.to_str().unwrap();
    let cli = machine
        .run(&[
            "audit",
            "verify",
            "--file",
            path,
            "--checkpoints",
            checkpoints,
            "--public-key",
            public_key,
        ])
        .await;
    let script = tokio::process::Command::new("python3")
        .args([
            concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/audit-verify.py"),
            path,
            "--checkpoints",
            checkpoints,
            "--public-key",
            public_key,
        ])
        .output()
        .await
        .unwrap();
    (
        cli,
        (
            script.status.code(),
            String::from_utf8_lossy(&script.stdout).into_owned(),
        ),
    )
}

/// An export verified with no server: by `talos-sso audit verify --file`,
/// and by `tests/audit-verify.py`, an implementation of docs/audit.md that
/// shares no code with talos-sso. Both accept the export as exported, and
/// both refuse it rewritten (with every later hash recomputed) or cut short.
async fn an_export_verifies_offline_with_the_cli_and_an_independent_script(backend: Backend) {
    use talos_sso_tests::harness::CheckpointFiles;
    let files = CheckpointFiles::new();
    let env = TestEnv::start_with(backend, |yaml| files.configure(&yaml, "1h", "talos-sso-test-1")).await;
    let bob = Machine::new();
    let (code, out) = browser_login(&env, &bob, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    let sam = auditor(&env).await;
    // A checkpoint over what there is now, on request.
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/audit/checkpoint", env.server.base_url))
        .bearer_auth(
            env.emulator
                .token_for("sam@example.com", talos_sso_tests::emulator::TokenKind::id())
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let signed: talos_sso_api::checkpoint::Checkpoint = answer.json().await.unwrap();
    let (code, exported, err) = sam.run(&["audit", "export", "--output", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let export = files.path().join("export.jsonl");
    std::fs::write(&export, &exported).unwrap();

    let (checkpoints, public_key) = (files.file.to_str().unwrap(), files.public_key.to_str().unwrap());
    let ((code, out, err), (script_code, script_out)) =
        verify_both(&sam, &export, checkpoints, public_key).await;
    assert_eq!(code, 0, "{out}{err}");
    let total = exported.lines().count();
    assert!(
        out.contains(&format!("audit chain intact: {total} records verified")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "newest signed checkpoint matched: the one of records 1 to {}",
            signed.seq
        )),
        "{out}"
    );
    assert_eq!(script_code, Some(0), "{script_out}");
    assert!(
        script_out.starts_with(&format!(
            "intact: {total} records (last seq {total}), 2 checkpoints matched, last at record {}",
            signed.seq
        )),
        "{script_out}"
    );

    // Record 1 (bob's certificate) rewritten, and every hash after it
    // recomputed: consistent in itself, contradicted by the checkpoint.
    let mut records: Vec<talos_sso_api::audit::StoredRecord> = exported
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    records[0].record.roles_granted = vec!["os:admin".into()];
    let mut rewritten = Vec::new();
    let (mut seq, mut hash) = (0, talos_sso_api::chain::GENESIS_HASH.to_owned());
    for stored in &records {
        let next = talos_sso_api::chain::chain(seq, &hash, stored.record.clone());
        (seq, hash) = (next.seq, next.hash.clone());
        rewritten.push(serde_json::to_string(&next).unwrap());
    }
    let tampered = files.path().join("tampered.jsonl");
    std::fs::write(&tampered, rewritten.join("\n") + "\n").unwrap();
    let ((code, _, err), (script_code, script_out)) =
        verify_both(&sam, &tampered, checkpoints, public_key).await;
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("audit chain broken at record {}", signed.seq))
            && err.contains("a record from 1 to"),
        "{err}"
    );
    assert_eq!(script_code, Some(1), "{script_out}");
    assert!(
        script_out.starts_with(&format!(
            "broken at record {}: does not have the hash its signed checkpoint",
            signed.seq
        )),
        "{script_out}"
    );

    // The newest records cut off, up to before the checkpoint's.
    let cut = files.path().join("cut.jsonl");
    let kept: Vec<&str> = exported.lines().take(signed.seq as usize - 1).collect();
    std::fs::write(&cut, kept.join("\n") + "\n").unwrap();
    let ((code, _, err), (script_code, script_out)) = verify_both(&sam, &cut, checkpoints, public_key).await;
    assert_eq!(code, 1);
    assert!(err.contains("are missing"), "{err}");
    assert_eq!(script_code, Some(1));
    assert!(script_out.contains("are missing"), "{script_out}");

    // The first record left out (as if deleted from the database): an
    // export must start at record 1, unless --from says where it starts.
    let headless = files.path().join("headless.jsonl");
    std::fs::write(
        &headless,
        exported.lines().skip(1).collect::<Vec<_>>().join("\n") + "\n",
    )
    .unwrap();
    let ((code, _, err), (script_code, script_out)) =
        verify_both(&sam, &headless, checkpoints, public_key).await;
    assert_eq!((code, script_code), (1, Some(1)), "{err}{script_out}");
    assert!(err.contains("starts at record 2, not 1"), "{err}");
    assert!(
        script_out.contains("the export starts at record 2, not 1"),
        "{script_out}"
    );
    let path = headless.to_str().unwrap();
    let (code, out, err) = sam
        .run(&[
            "audit",
            "verify",
            "--file",
            path,
            "--from",
            "2",
            "--checkpoints",
            checkpoints,
            "--public-key",
            public_key,
        ])
        .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("records 1 to 1 are not in the export: they were not checked here (--from 2)"),
        "{out}"
    );

    // A field the record type does not have, added to a covered record:
    // its typed hash would hold, the line is not the server's.
    let extended = files.path().join("extended.jsonl");
    std::fs::write(
        &extended,
        exported.replacen("\"seq\":1,", "\"seq\":1,\"approved_by\":\"ciso\",", 1),
    )
    .unwrap();
    let ((code, _, err), (_, script_out)) = verify_both(&sam, &extended, checkpoints, public_key).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("record 1 is not in the form the server writes"),
        "{err}"
    );
    assert!(
        script_out.starts_with("broken at record 0: line 1: not an audit record: its keys are not"),
        "{script_out}"
    );

    // Other texts of record 1 (which the checkpoint covers) than the one
    // the server writes: JSON readers may take them for another record (a
    // repeated key is the first one to some, the last one to others), or
    // one reader may take a text another refuses, so both refuse them,
    // whatever their hash says.
    let first = exported.lines().next().unwrap();
    let rest = &exported[first.len()..];
    let body = &first[1..first.len() - 1];
    let occurred_at = serde_json::from_str::<serde_json::Value>(first).unwrap()["occurred_at"]
        .as_str()
        .unwrap()
        .to_owned();
    let at_time = |time: String| first.replacen(&occurred_at, &time, 1);
    let with_byte = {
        let at = first.find("bob@").unwrap();
        [&first.as_bytes()[..at], b"\xff", &first.as_bytes()[at..]].concat()
    };
    let record_texts: Vec<(&str, Vec<u8>)> = [
        (
            "a fake username and event before the real ones",
            format!(r#"{{"username":"mallory@example.com","event":"deny.removed",{body}}}"#),
        ),
        (
            "a key moved",
            format!("{{{},\"seq\":1}}", body.replacen("\"seq\":1,", "", 1)),
        ),
        ("a space after each comma", first.replace(",\"", ", \"")),
        ("spaces around the object", format!(" {first} ")),
        ("a tab before the newline", format!("{first}\t")),
        ("a CR before the newline", format!("{first}\r")),
        ("a trailing copy of a field", format!("{{{body},\"seq\":1}}")),
        (
            "a trailing field the record does not have",
            format!(r#"{{{body},"approved_by":"ciso"}}"#),
        ),
        ("a letter as an escape", first.replacen("bob@", r"\u0062ob@", 1)),
        ("an escaped slash", first.replacen('/', r"\/", 1)),
        ("an absent field", first.replacen(r#""reason_code":null,"#, "", 1)),
        (
            "a number with a fraction",
            first.replacen("\"seq\":1,", "\"seq\":1.0,", 1),
        ),
        (
            "a number with an exponent",
            first.replacen("\"seq\":1,", "\"seq\":1e0,", 1),
        ),
        (
            "a time with an offset",
            at_time(occurred_at.replacen('Z', "+00:00", 1)),
        ),
        (
            "a time with a lowercase t and z",
            at_time(occurred_at.replacen('T', "t", 1).replacen('Z', "z", 1)),
        ),
        (
            "a time with a day padded with a space",
            at_time(format!("{} 1{}", &occurred_at[..8], &occurred_at[10..])),
        ),
    ]
    .into_iter()
    .map(|(what, text)| (what, text.into_bytes()))
    .chain([("a byte that is not UTF-8", with_byte)])
    .collect();
    let mut accepted = Vec::new();
    for (what, text) in record_texts {
        assert_ne!(text, first.as_bytes(), "{what}");
        let other = files.path().join("other.jsonl");
        std::fs::write(&other, [&text[..], rest.as_bytes()].concat()).unwrap();
        let ((code, _, err), (script_code, script_out)) =
            verify_both(&sam, &other, checkpoints, public_key).await;
        if code != 1 {
            accepted.push(format!("the CLI took {what}"));
        } else {
            assert!(
                [
                    "record 1 is not in the form the server writes",
                    "not an audit record (",
                    "not UTF-8",
                ]
                .iter()
                .any(|refusal| err.contains(&format!("other.jsonl, line 1: {refusal}"))),
                "{what}: {err}"
            );
        }
        if script_code != Some(1) {
            accepted.push(format!("the script took {what}"));
        } else {
            assert!(
                script_out.starts_with("broken at record 0: line 1: not an audit record"),
                "{what}: {script_out}"
            );
        }
    }

    // A number the server never writes, in the server's form otherwise:
    // no terminal prints one, so the CLI does not suggest it.
    let mut fraction: talos_sso_api::audit::StoredRecord = serde_json::from_str(first).unwrap();
    fraction.record.details = serde_json::json!({"n": 1.5});
    let other = files.path().join("other.jsonl");
    std::fs::write(&other, exported.replacen(first, &fraction.to_line(), 1)).unwrap();
    let ((code, _, err), (script_code, script_out)) =
        verify_both(&sam, &other, checkpoints, public_key).await;
    assert_eq!((code, script_code), (1, Some(1)), "{err}{script_out}");
    assert!(
        err.contains("other.jsonl, line 1: record 1 holds a number that is not an integer")
            && !err.contains("terminal"),
        "{err}"
    );
    assert!(
        script_out
            .starts_with("broken at record 0: line 1: not an audit record: the number 1.5 is not an integer"),
        "{script_out}"
    );

    // What the script quotes of a line is escaped and bounded.
    let long = "\u{202e}".repeat(10_000);
    let other = files.path().join("other.jsonl");
    std::fs::write(
        &other,
        exported.replacen(first, &format!(r#"{{"{long}":1,"{long}":2,{body}}}"#), 1),
    )
    .unwrap();
    let (_, (script_code, script_out)) = verify_both(&sam, &other, checkpoints, public_key).await;
    assert_eq!(script_code, Some(1), "{script_out}");
    assert!(
        script_out.starts_with("broken at record 0: line 1: not an audit record: the key '\\u202e")
            && script_out.contains("... is given twice")
            && script_out.len() < 300,
        "{script_out}"
    );

    // The same for the checkpoint the auditor asked for, the file's last line.
    let signed_file = std::fs::read_to_string(&files.file).unwrap();
    let last = signed_file.lines().last().unwrap();
    let line_number = signed_file.lines().count();
    let body = &last[1..last.len() - 1];
    let kind = talos_sso_api::checkpoint::CHECKPOINT_TYPE;
    let checkpoint_texts = [
        (
            "a fake seq and server before the real ones",
            format!(r#"{{"seq":1,"server":"elsewhere",{body}}}"#),
        ),
        (
            "a key moved",
            format!(
                "{{{},\"type\":\"{kind}\"}}",
                body.replacen(&format!("\"type\":\"{kind}\","), "", 1)
            ),
        ),
        ("a space after each comma", last.replace(",\"", ", \"")),
        (
            "a trailing copy of a field",
            format!("{{{body},\"seq\":{}}}", signed.seq),
        ),
    ];
    for (what, text) in checkpoint_texts {
        let other = files.path().join("other-checkpoints.jsonl");
        std::fs::write(&other, signed_file.replacen(last, &text, 1)).unwrap();
        let ((code, _, err), (script_code, script_out)) =
            verify_both(&sam, &export, other.to_str().unwrap(), public_key).await;
        let refused = format!("other-checkpoints.jsonl, line {line_number}: not a checkpoint");
        if code != 1 {
            accepted.push(format!("the CLI took the checkpoint with {what}"));
        } else {
            assert!(err.contains(&refused), "{what}: {err}");
        }
        if script_code != Some(1) {
            accepted.push(format!("the script took the checkpoint with {what}"));
        } else {
            assert!(
                script_out.starts_with("broken at record 0: ") && script_out.contains(&refused),
                "{what}: {script_out}"
            );
        }
    }
    assert!(accepted.is_empty(), "{accepted:#?}");

    // One byte of one record changed, hash left alone: both name the record.
    let changed = files.path().join("changed.jsonl");
    std::fs::write(
        &changed,
        exported.replacen("bob@example.com", "bob@example.org", 1),
    )
    .unwrap();
    let ((code, _, err), (_, script_out)) = verify_both(&sam, &changed, checkpoints, public_key).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("audit chain broken at record 1: its content does not match its hash"),
        "{err}"
    );
    assert!(
        script_out.starts_with("broken at record 1: its content does not match its hash"),
        "{script_out}"
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_verifies_offline_on_postgres() {
    an_export_verifies_offline_with_the_cli_and_an_independent_script(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_verifies_offline_on_sqlite() {
    an_export_verifies_offline_with_the_cli_and_an_independent_script(Backend::Sqlite).await;
}

/// A SIEM's collector: `audit export --follow` with a service principal's
/// token from a token file prints the records committed after it started,
/// and when the token expires, reconnects with the file's fresh token and
/// goes on after the last record it printed. `--output ecs` maps records to
/// the Elastic Common Schema.
#[tokio::test]
async fn audit_export_follow_prints_new_records_and_goes_on_with_a_fresh_token() {
    use talos_sso_tests::emulator::{SIEM_CLIENT_ID, TokenKind};
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        yaml.replace(
            "auditors: { groups: [",
            "auditors: { app_roles: [Talos.Auditor], groups: [",
        ) + "\naudit: { feed: { heartbeat: 300ms, poll_interval: 300ms } }\n"
    })
    .await;
    let owned = env;
    let env = &owned;
    let issue = |user: &str| {
        let token = env.emulator.token_for(user, TokenKind::id()).unwrap();
        async move { env.issue(&token).await.0 }
    };
    assert_eq!(issue("bob@example.com").await, 201, "the backlog");
    let collector = Machine::new();
    let token_file = collector.home.path().join("siem.token");
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let short = env
        .emulator
        .app_token_with(SIEM_CLIENT_ID, serde_json::json!({"exp": now + 4}))
        .unwrap();
    std::fs::write(&token_file, format!("{short}\n")).unwrap();
    let file = token_file.to_str().unwrap();
    let base = &env.server.base_url;

    // Without --follow, ECS: every record, mapped.
    let (code, ecs, err) = collector
        .run(&[
            "audit",
            "export",
            "--server",
            base,
            "--token-file",
            file,
            "--output",
            "ecs",
        ])
        .await;
    assert_eq!(code, 0, "{err}");
    let first: serde_json::Value = serde_json::from_str(ecs.lines().next().unwrap()).unwrap();
    assert_eq!(first["event"]["action"], "certificate.issued");
    assert_eq!(first["event"]["outcome"], "success");
    assert_eq!(first["user"]["name"], "bob@example.com");
    assert_eq!(
        first["tls"]["client"]["x509"]["subject"]["organization"],
        serde_json::json!(["os:operator"])
    );

    let mut child = collector
        .command(&[
            "audit",
            "export",
            "--follow",
            "--event",
            "certificate.issued",
            "--server",
            base,
        ])
        .env("TALOS_SSO_TOKEN_FILE", &token_file)
        .spawn()
        .unwrap();
    let mut lines = stdout_lines(&mut child);
    let mut next_record = async || next_json_line(&mut lines).await;
    let backlog = next_record().await;
    assert_eq!(backlog["username"], "bob@example.com");
    assert_eq!(issue("carol@example.com").await, 201);
    let after_start = next_record().await;
    assert_eq!(after_start["username"], "carol@example.com");

    // The short token ends the stream; the file has a fresh one by then.
    let fresh = env
        .emulator
        .app_token_with(SIEM_CLIENT_ID, serde_json::json!({}))
        .unwrap();
    std::fs::write(&token_file, fresh).unwrap();
    while time::OffsetDateTime::now_utc().unix_timestamp() <= now + 5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(issue("bob@example.com").await, 201);
    let after_reconnect = next_record().await;
    assert_eq!(after_reconnect["username"], "bob@example.com");
    assert!(
        after_reconnect["seq"].as_i64() > after_start["seq"].as_i64(),
        "nothing printed twice: {after_reconnect}"
    );
    child.kill().await.unwrap();
    let streams = env
        .server
        .app
        .audit
        .store()
        .page(0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.record.details["action"] == "follow" && r.record.outcome == "success")
        .count();
    assert_eq!(
        streams, 2,
        "one record per stream: before and after the token's expiry"
    );
    owned.finish().await;
}

/// An empty token file is said so before anything is asked of the server
/// (nothing listens at port 9), by `login` and `audit` alike.
#[tokio::test]
async fn a_token_file_without_a_token_is_refused_before_any_request() {
    let machine = Machine::new();
    let file = machine.home.path().join("token");
    std::fs::write(&file, "").unwrap();
    let file = file.to_str().unwrap();
    for command in [&["login"][..], &["audit", "list"]] {
        let mut args = command.to_vec();
        args.extend(["--server", "http://127.0.0.1:9", "--token-file", file]);
        let (code, _, err) = machine.run(&args).await;
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains(&format!(
                "the token file {file} is empty; write the bearer token into it"
            )),
            "{args:?}: {err}"
        );
    }
    assert!(!machine.talosconfig().exists());
}
