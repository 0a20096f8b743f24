//! Saved logins in a real Secret Service (GNOME Keyring on a bus of its
//! own), read back with `secret-tool`: the refresh token is in the keyring
//! and nowhere on disk; `--token-store` moves it; `logout` removes it; a
//! keyring that stops answering is an error, never a quiet move to disk;
//! with no keyring at all the file is used, and said once.

use std::path::Path;

use talos_sso_tests::harness::{Backend, TestEnv};
use talos_sso_tests::secret_service::SecretService;
use tokio::process::Command;

use super::{Machine, finish, follow_browser_login, run_command as run, wait_for_line};

/// `args` run on `machine` with the keyring as its only token store
/// setting: whatever the CLI chooses by itself.
fn with_keyring(machine: &Machine, keyring: &SecretService, args: &[&str]) -> Command {
    let mut command = machine.command(args);
    command.env_remove("TALOS_SSO_TOKEN_STORE");
    for (name, value) in keyring.env() {
        command.env(name, value);
    }
    command
}

/// The saved login's key in the index (one login: one key).
fn saved_key(machine: &Machine) -> (String, serde_json::Value) {
    let index = std::fs::read_to_string(machine.home.path().join(".cache/talos-sso/tokens.json")).unwrap();
    let index: serde_json::Value = serde_json::from_str(&index).unwrap();
    let entries = index["entries"].as_object().unwrap();
    assert_eq!(entries.len(), 1, "{index}");
    let (key, entry) = entries.iter().next().unwrap();
    (key.clone(), entry.clone())
}

/// Whether any file under `dir` contains `needle`.
fn found_on_disk(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(found_on_disk(&path, needle));
        } else if std::fs::read(&path)
            .unwrap_or_default()
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
        {
            found.push(path.display().to_string());
        }
    }
    found
}

fn config_yaml(machine: &Machine) -> String {
    std::fs::read_to_string(machine.home.path().join(".config/talos-sso/config.yaml")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_login_lives_in_the_keyring_and_logout_takes_it_out() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let mut keyring = SecretService::start();
    let machine = Machine::new();
    let login = ["login", "--server", &env.server.base_url, "--no-browser"];
    let (code, out) =
        follow_browser_login(&env, "bob@example.com", with_keyring(&machine, &keyring, &login)).await;
    assert_eq!(code, 0, "{out}");
    assert!(config_yaml(&machine).contains("token_store: keyring"));

    // The token is in the keyring, read by another program, and not on disk.
    let (key, entry) = saved_key(&machine);
    assert_eq!(entry["store"], "keyring", "{entry}");
    assert!(entry.get("refresh_token").is_none(), "{entry}");
    let token = keyring
        .lookup(&[("service", "talos-sso"), ("username", &key)])
        .expect("the refresh token in the keyring");
    assert!(token.len() > 16, "{token}");
    assert_eq!(found_on_disk(machine.home.path(), &token), Vec::<String>::new());

    // It works: a second login is silent, with the rotated token saved back.
    env.emulator.set_auto_login(None);
    let (code, out, err) = run(with_keyring(&machine, &keyring, &["login"])).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("http"), "no browser the second time: {err}");

    // --token-store file moves it out of the keyring, keyring moves it back.
    let (code, out, err) = run(with_keyring(
        &machine,
        &keyring,
        &["login", "--token-store", "file"],
    ))
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("Moved 1 saved login(s) to the file"), "{err}");
    assert_eq!(
        keyring.lookup(&[("service", "talos-sso"), ("username", &key)]),
        None
    );
    assert_eq!(saved_key(&machine).1["store"], "file");
    let (code, out, err) = run(with_keyring(
        &machine,
        &keyring,
        &["login", "--token-store", "keyring"],
    ))
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains("Moved 1 saved login(s) to the keyring (Secret Service)"),
        "{err}"
    );
    let token = keyring
        .lookup(&[("service", "talos-sso"), ("username", &key)])
        .expect("back in the keyring");
    assert_eq!(found_on_disk(machine.home.path(), &token), Vec::<String>::new());

    // logout --all takes it out, and an item nothing indexes too.
    keyring.store(
        &[("service", "talos-sso"), ("username", "left by an older client")],
        "stray",
    );
    let (code, out, err) = run(with_keyring(&machine, &keyring, &["logout", "--all"])).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Forgot 1 saved login(s)."), "{out}");
    assert_eq!(
        keyring.lookup(&[("service", "talos-sso"), ("username", &key)]),
        None
    );
    assert_eq!(
        keyring.lookup(&[("service", "talos-sso"), ("username", "left by an older client")]),
        None
    );

    // A remembered keyring that stops answering: an error that says what to
    // do, and nothing written to disk instead.
    let (code, out) =
        follow_browser_login(&env, "bob@example.com", with_keyring(&machine, &keyring, &login)).await;
    assert_eq!(code, 0, "{out}");
    keyring.stop();
    let (code, out, err) = run(with_keyring(&machine, &keyring, &["login"])).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("your saved logins are in the keyring, which does not answer"),
        "{err}"
    );
    assert!(err.contains("--token-store file"), "{err}");
    assert_eq!(saved_key(&machine).1["store"], "keyring");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_keyring_the_first_login_uses_the_file_and_says_so_once() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let no_keyring = |args: &[&str]| {
        let mut command = machine.command(args);
        // No session bus at all (the machine's environment is cleared).
        command.env_remove("TALOS_SSO_TOKEN_STORE");
        command
    };
    let login = ["login", "--server", &env.server.base_url, "--no-browser"];
    env.emulator.set_auto_login(Some("bob@example.com"));
    let mut child = no_keyring(&login).spawn().unwrap();
    let (url, seen, _) = wait_for_line(&mut child, |line| {
        line.trim().starts_with("http").then(|| line.trim().to_owned())
    })
    .await;
    let seen = seen.join("\n");
    assert!(seen.contains("no keyring answers"), "{seen}");
    assert!(seen.contains("this is said once"), "{seen}");
    reqwest::get(&url).await.unwrap();
    let (code, out) = finish(child).await;
    assert_eq!(code, 0, "{out}");
    assert!(config_yaml(&machine).contains("token_store: file"));
    let (_, entry) = saved_key(&machine);
    assert_eq!(entry["store"], "file");
    assert!(entry["refresh_token"].is_string());
    let tokens = machine.home.path().join(".cache/talos-sso/tokens.json");
    assert_eq!(super::mode(&tokens), 0o600);

    env.emulator.set_auto_login(None);
    let (code, out, err) = run(no_keyring(&["login"])).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("no keyring answers"), "said once only: {err}");
    env.finish().await;
}
