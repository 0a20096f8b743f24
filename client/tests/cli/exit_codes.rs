//! The exit codes scripts test (`docs/cli.md`, "Exit codes"), with the real
//! binary: 2 for a command line clap does not understand, 4 when a login is
//! needed, 5 when the server refuses by policy or deny list, and `exec`
//! passing its command's own status once the command ran.

use talos_sso_tests::harness::{Backend, TestEnv};

use super::{Machine, admin_and_bob, browser_login};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_line_clap_does_not_understand_exits_2() {
    let machine = Machine::new();
    for args in [
        &["exec"][..],
        &["frobnicate"],
        &["login", "--no-such-flag"],
        &["audit", "list", "--limit", "0"],
        &["exec", "--ttl", "soon", "--", "true"],
    ] {
        let (code, out, err) = machine.run(args).await;
        assert_eq!((code, out.as_str()), (2, ""), "{args:?}: {err}");
        assert!(
            err.starts_with("error:") && err.contains("--help"),
            "{args:?}: {err}"
        );
    }
    let (code, out, _) = machine.run(&["--help"]).await;
    assert_eq!(code, 0, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_needs_a_login_without_one_exits_4() {
    let machine = Machine::new();
    let marker = machine.home.path().join("ran");
    let marker_arg = marker.to_str().unwrap();
    for (args, said) in [
        (&["exec", "--", "touch", marker_arg][..], "not logged in yet"),
        (&["status"], "Not logged in anywhere"),
        (&["audit", "list"], "no server yet"),
        (&["deny", "list"], "no server yet"),
    ] {
        let (code, out, err) = machine.run(args).await;
        assert_eq!(code, 4, "{args:?}: {out}{err}");
        assert!(out.contains(said) || err.contains(said), "{args:?}: {out}{err}");
    }
    assert!(!marker.exists(), "exec ran nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_token_the_provider_refuses_leaves_a_login_needed_4() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let machine = Machine::new();
    let (code, out) = browser_login(&env, &machine, "bob@example.com", &[]).await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);
    machine.revoke_saved_refresh_tokens();

    // Nobody finishes the browser login it falls back to.
    let (code, _, err) = machine.run(&["login", "--no-browser", "--timeout", "1s"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("Your saved login could not be renewed"), "{err}");
    assert!(err.contains("did not finish within 1s"), "{err}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_and_deny_list_refusals_exit_5_and_exec_runs_nothing() {
    let env = TestEnv::start(Backend::Sqlite).await;
    // Dave: no rule grants him anything.
    let dave = Machine::new();
    let (code, _) = browser_login(&env, &dave, "dave@example.com", &[]).await;
    assert_eq!(code, 5, "no_matching_rule");
    let (alice, bob) = admin_and_bob(&env).await;

    // A role bob may not have (a silent login, refused by policy).
    let (code, _, err) = bob.run(&["login", "--role", "os:admin"]).await;
    assert_eq!(code, 5, "role_not_permitted: {err}");
    assert!(err.contains("you may not have os:admin"), "{err}");
    // Not an auditor, not an administrator.
    let (code, _, err) = bob.run(&["audit", "list"]).await;
    assert_eq!(code, 5, "not_an_auditor: {err}");
    let (code, _, err) = bob.run(&["deny", "list"]).await;
    assert_eq!(code, 5, "not_an_admin: {err}");

    // Deny-listed: exec cannot renew, so runs nothing, and says why with 5.
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
    let marker = bob.home.path().join("ran");
    let touch = format!("touch {}; exit 3", marker.display());
    let (code, _, err) = bob.run(&["exec", "--ttl", "10m", "--", "sh", "-c", &touch]).await;
    assert_eq!(code, 5, "identity_denied: {err}");
    assert!(err.contains("you are blocked from new certificates"), "{err}");
    assert!(!marker.exists(), "the command did not run");

    // Unblocked: exec runs the command and passes its own status, even 4 or 5.
    let (code, _, err) = alice.run(&["deny", "remove", "--user", "bob@example.com"]).await;
    assert_eq!(code, 0, "{err}");
    for status in [3, 4, 5, 0] {
        let (code, _, err) = bob
            .run(&["exec", "--", "sh", "-c", &format!("exit {status}")])
            .await;
        assert_eq!(code, status, "{err}");
    }
    let (code, _, err) = bob.run(&["exec", "--", "sh", "-c", "kill -TERM $$"]).await;
    assert_eq!(code, 128 + 15, "killed by SIGTERM: {err}");
    env.finish().await;
}
