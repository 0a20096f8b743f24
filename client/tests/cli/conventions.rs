//! One set of conventions, with the real binary (`docs/cli.md`, "Output
//! formats", "--debug", "NO_COLOR"): every command that prints data takes
//! `-o json` and `-o yaml`, which parse and name the same fields; `--debug`
//! shows the HTTP exchanges and decisions of a browser, device and silent
//! login and none of their secrets; `NO_COLOR` leaves no colour.

use std::time::Duration;

use serde_json::Value as Json;
use talos_sso_tests::emulator::EmulatorConfig;
use talos_sso_tests::harness::{Backend, TestEnv};

use super::{Machine, admin_and_bob, context_fields, finish, follow_browser_login, wait_for_line};

/// `text` as JSON, or the test fails saying what it was.
fn json(text: &str, what: &str) -> Json {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"))
}

/// `text` as YAML, read into JSON's model to compare with the JSON output.
fn yaml(text: &str, what: &str) -> Json {
    serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("{what}: not YAML ({e}): {text}"))
}

/// JSON lines (`audit list|export -o json`) as one list.
fn json_lines(text: &str, what: &str) -> Json {
    Json::Array(text.lines().map(|line| json(line, what)).collect())
}

/// Fails unless `a` and `b` have the same fields at every level (values
/// may differ: a clock moved between the two runs).
fn same_fields(a: &Json, b: &Json, what: &str) {
    match (a, b) {
        (Json::Object(a), Json::Object(b)) => {
            let keys = |m: &serde_json::Map<String, Json>| m.keys().cloned().collect::<Vec<_>>();
            assert_eq!(keys(a), keys(b), "{what}");
            for (key, value) in a {
                same_fields(value, &b[key], &format!("{what}.{key}"));
            }
        }
        (Json::Array(a), Json::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{what}");
            for (a, b) in a.iter().zip(b) {
                same_fields(a, b, what);
            }
        }
        _ => {}
    }
}

/// `args` run by `machine` with `-o json` and then `-o yaml`: both must
/// succeed and parse, with the same fields; returns them.
async fn both_formats(machine: &Machine, args: &[&str], lines: bool) -> (Json, Json) {
    let what = args.join(" ");
    let mut outputs = Vec::new();
    for format in ["json", "yaml"] {
        let mut full = args.to_vec();
        full.extend(["-o", format]);
        let (code, out, err) = machine.run(&full).await;
        assert_eq!(code, 0, "{what} -o {format}: {out}{err}");
        outputs.push(out);
    }
    let from_json = if lines {
        json_lines(&outputs[0], &what)
    } else {
        json(&outputs[0], &what)
    };
    let from_yaml = yaml(&outputs[1], &what);
    same_fields(&from_json, &from_yaml, &what);
    (from_json, from_yaml)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_data_command_prints_json_and_yaml_that_parse() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let (alice, _bob) = admin_and_bob(&env).await;
    let server = env.server.base_url.as_str();

    // status: the login, the same in both.
    let (status, status_yaml) = both_formats(&alice, &["status"], false).await;
    assert_eq!(status[0]["cluster"], "prod", "{status}");
    assert_eq!(status[0]["username"], "alice@example.com");
    assert_eq!(status[0]["roles"], serde_json::json!(["os:admin"]));
    assert_eq!(status[0]["valid"], true);
    assert_eq!(status_yaml[0]["username"], "alice@example.com");
    // The old spelling still works and is the table.
    let (code, text, _) = alice.run(&["status", "--output", "text"]).await;
    assert_eq!(code, 0);
    assert!(
        text.starts_with("prod: logged in as alice@example.com with [os:admin]"),
        "{text}"
    );
    let (_, table, _) = alice.run(&["status", "-o", "table"]).await;
    assert_eq!(table, text);

    // version, with and without a server.
    let (version, version_yaml) = both_formats(&alice, &["version"], false).await;
    assert_eq!(version, version_yaml);
    assert_eq!(version["client"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(version["client"]["commit"], env!("TALOS_SSO_REVISION"));
    assert_eq!(version["server"]["url"], server);
    assert_eq!(version["server"]["api_version"], 1);
    let (nowhere, _) = both_formats(&Machine::new(), &["version"], false).await;
    assert_eq!(nowhere["server"], Json::Null, "{nowhere}");

    // deny add, list, remove (an administrator).
    let carol = "c3000000-0000-4000-8000-000000000003";
    let dave = "d4000000-0000-4000-8000-000000000004";
    let mut added = Vec::new();
    for (format, subject, user) in [
        ("json", carol, "carol@example.com"),
        ("yaml", dave, "dave@example.com"),
    ] {
        let (code, out, err) = alice
            .run(&[
                "deny",
                "add",
                "--subject",
                subject,
                "--user",
                user,
                "--reason",
                "lost laptop",
                "-o",
                format,
            ])
            .await;
        assert_eq!(code, 0, "{err}");
        added.push(if format == "json" {
            json(&out, "deny add")
        } else {
            yaml(&out, "deny add")
        });
    }
    same_fields(&added[0], &added[1], "deny add");
    assert_eq!(added[0]["entry"]["username"], "carol@example.com");
    assert_eq!(added[1]["entry"]["reason"], "lost laptop");
    assert!(added[1]["audit_id"].as_i64().unwrap() > added[0]["audit_id"].as_i64().unwrap());
    let (list, list_yaml) = both_formats(&alice, &["deny", "list"], false).await;
    assert_eq!(list, list_yaml);
    assert_eq!(list["entries"].as_array().unwrap().len(), 2, "{list}");
    let (_, table, _) = alice.run(&["deny", "list", "-o", "table"]).await;
    assert!(
        table.contains("carol@example.com") && table.contains("lost laptop"),
        "{table}"
    );
    let (code, out, err) = alice
        .run(&["deny", "remove", "--subject", carol, "-o", "yaml"])
        .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(yaml(&out, "deny remove")["removed"], 1, "{out}");
    let (code, out, err) = alice
        .run(&["deny", "remove", "--subject", dave, "-o", "json"])
        .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out, "deny remove")["removed"], 1, "{out}");

    // audit list, show, export, verify (an auditor, logged in once by browser).
    let sam = Machine::new();
    let (code, out) = follow_browser_login(
        &env,
        "sam@example.com",
        sam.command(&[
            "audit",
            "list",
            "--server",
            server,
            "--no-browser",
            "--limit",
            "1",
        ]),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    env.emulator.set_auto_login(None);
    let (listed, listed_yaml) = both_formats(&sam, &["audit", "list", "--limit", "3"], true).await;
    assert_eq!(
        listed, listed_yaml,
        "the first three records, whatever came after"
    );
    assert_eq!(listed[0]["seq"], 1);
    assert_eq!(listed[0]["username"], "alice@example.com");
    let (shown, shown_yaml) = both_formats(&sam, &["audit", "show", "1"], false).await;
    assert_eq!(shown, shown_yaml);
    assert_eq!(shown, listed[0]);
    let (_, table, _) = sam.run(&["audit", "show", "1", "-o", "table"]).await;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("username") && l.ends_with("  alice@example.com")),
        "{table}"
    );
    let (exported, exported_yaml) =
        both_formats(&sam, &["audit", "export", "--event", "deny.added"], true).await;
    assert_eq!(exported, exported_yaml);
    assert_eq!(exported.as_array().unwrap().len(), 2, "{exported}");
    // Nothing matched: still a list in YAML.
    let (code, out, _) = sam
        .run(&["audit", "export", "--user", "nobody@example.com", "-o", "yaml"])
        .await;
    assert_eq!((code, yaml(&out, "empty export")), (0, serde_json::json!([])));
    let (verified, _) = both_formats(&sam, &["audit", "verify"], false).await;
    assert_eq!(verified["intact"], true, "{verified}");
    assert!(verified["last_seq"].as_i64().unwrap() >= 6, "{verified}");
    env.finish().await;
}

/// What `--debug` must never show: the identity provider's secrets of
/// every login so far (the emulator's record), the refresh tokens saved
/// and the private keys of the certificates written.
fn secrets_never_shown(env: &TestEnv, machines: &[&Machine]) -> Vec<(String, String)> {
    let mut secrets: Vec<(String, String)> = env
        .emulator
        .secrets()
        .into_iter()
        // State, nonce and challenge are in the login URL printed for the
        // person to open (not by --debug); the rest never leaves the flow.
        .filter(|s| !matches!(s.kind, "state" | "nonce" | "code_challenge"))
        .flat_map(|s| {
            let mut values = vec![(s.kind.to_owned(), s.value.clone())];
            // A JWT's signature alone would do as proof it leaked.
            if let Some(signature) = s.value.split('.').nth(2) {
                values.push((format!("{} signature", s.kind), signature.to_owned()));
            }
            values
        })
        .collect();
    for machine in machines {
        let (_, _, key) = context_fields(&machine.talosconfig(), "prod");
        for line in key.lines().filter(|l| !l.starts_with("-----")) {
            secrets.push(("private key".into(), line.to_owned()));
        }
        let cache = machine.home.path().join(".cache/talos-sso/tokens.json");
        if let Ok(text) = std::fs::read_to_string(cache) {
            for entry in json(&text, "token cache")["entries"]
                .as_object()
                .unwrap()
                .values()
            {
                secrets.push((
                    "saved refresh token".into(),
                    entry["refresh_token"].as_str().unwrap().to_owned(),
                ));
            }
        }
    }
    secrets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_shows_browser_device_and_silent_logins_and_no_secret() {
    let env = TestEnv::start_full(
        Backend::Sqlite,
        EmulatorConfig {
            device_interval: 1,
            ..Default::default()
        },
        |y| y,
    )
    .await;
    let server = env.server.base_url.as_str();
    let token_endpoint = format!(
        "{}/oauth2/v2.0/token",
        env.emulator.issuer().trim_end_matches("/v2.0")
    );

    // By browser, with --debug.
    let bob = Machine::new();
    env.emulator.set_auto_login(Some("bob@example.com"));
    let mut child = bob
        .command(&["--debug", "login", "--server", server, "--no-browser"])
        .spawn()
        .unwrap();
    let (url, seen, rest) = wait_for_line(&mut child, |line| {
        line.trim().starts_with("http").then(|| line.trim().to_owned())
    })
    .await;
    reqwest::get(&url).await.unwrap();
    let (code, out) = finish(child).await;
    assert_eq!(code, 0, "{out}");
    let browser = seen.join("\n") + "\n" + &rest.await.unwrap();
    env.emulator.set_auto_login(None);

    // Silently, by refresh, with TALOS_SSO_DEBUG=1 instead of the flag.
    let mut command = bob.command(&["login"]);
    command.env("TALOS_SSO_DEBUG", "1");
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .unwrap()
        .unwrap();
    let silent = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{silent}");

    // By device code, with --debug after the subcommand (a global flag).
    let carol = Machine::new();
    let mut child = carol
        .command(&["login", "--server", server, "--device", "--debug"])
        .spawn()
        .unwrap();
    let (user_code, seen, rest) = wait_for_line(&mut child, |line| {
        let t = line.trim();
        (t.len() == 9 && t.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()))
            .then(|| t.to_owned())
    })
    .await;
    assert!(env.emulator.approve_device(&user_code, "carol@example.com"));
    let (code, out) = finish(child).await;
    assert_eq!(code, 0, "{out}");
    let device = seen.join("\n") + "\n" + &rest.await.unwrap();

    // Useful: the exchanges and the decisions of each flow.
    for (flow, text, expected) in [
        (
            "browser",
            &browser,
            vec![
                format!("debug: server request: GET {server}/v1/info"),
                format!("debug: server answered 200 to GET {server}/v1/info in "),
                format!("debug: token store: the file {}", bob.home.path().join(".cache/talos-sso/tokens.json").display()),
                "debug: no saved refresh token for this server and provider".into(),
                "debug: logging in interactively by browser, PKCE on a loopback redirect".into(),
                format!("debug: identity provider request: POST {token_endpoint} with form {{grant_type=authorization_code"),
                "code=<redacted>".into(),
                "code_verifier=<redacted>".into(),
                format!("debug: identity provider answered 200 to POST {token_endpoint} in "),
                r#""id_token":"<redacted>""#.into(),
                r#""refresh_token":"<redacted>""#.into(),
                "debug: asking for a certificate for cluster prod with the cluster's default roles for the cluster's default lifetime".into(),
                r#""csr":"<redacted>""#.into(),
                format!("debug: server answered 201 to POST {server}/v1/certificates in "),
                format!("debug: wrote context `prod` into {}", bob.talosconfig().display()),
            ],
        ),
        (
            "silent",
            &silent,
            vec![
                format!("debug: silent login: the saved refresh token goes to the token endpoint {token_endpoint}"),
                format!("debug: identity provider request: POST {token_endpoint} with form {{grant_type=refresh_token"),
                "refresh_token=<redacted>".into(),
                format!("debug: identity provider answered 200 to POST {token_endpoint} in "),
            ],
        ),
        (
            "device",
            &device,
            vec![
                "debug: device login: the code is asked for at ".into(),
                "debug: logging in interactively by device code (--device)".into(),
                format!("debug: identity provider request: POST {token_endpoint} with form {{grant_type=urn:ietf:params:oauth:grant-type:device_code"),
                "device_code=<redacted>".into(),
                r#""device_code":"<redacted>""#.into(),
            ],
        ),
    ] {
        for line in expected {
            assert!(text.contains(&line), "{flow}: `{line}` not in:\n{text}");
        }
        assert!(!text.to_lowercase().contains("authorization: bearer"), "{flow}:\n{text}");
        assert!(!text.to_lowercase().contains("cookie"), "{flow}:\n{text}");
    }
    assert!(!silent.contains("interactively"), "{silent}");

    // And nothing secret, in any of them.
    let secrets = secrets_never_shown(&env, &[&bob, &carol]);
    for kind in [
        "id_token",
        "access_token",
        "refresh_token",
        "authorization_code",
        "code_verifier",
        "device_code",
        "private key",
        "saved refresh token",
    ] {
        assert!(secrets.iter().any(|(k, _)| k == kind), "the test knows no {kind}");
    }
    let all = format!("{browser}\n{silent}\n{device}");
    for (kind, value) in &secrets {
        assert!(value.len() >= 16, "{kind} is too short to search for: {value}");
        assert!(!all.contains(value.as_str()), "the {kind} is in the debug output");
    }
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_color_leaves_no_colour_in_any_output() {
    let machine = Machine::new();
    const SGR: &str = "\u{1b}[";
    // Help and usage errors are the only coloured output (clap's); forced
    // colour shows they would be caught.
    for (args, stream) in [
        (&["--help"][..], "stdout"),
        (&["login", "--no-such-flag"], "stderr"),
    ] {
        for no_color in [None, Some("1")] {
            let mut command = machine.command(args);
            command.env("CLICOLOR_FORCE", "1");
            if let Some(value) = no_color {
                command.env("NO_COLOR", value);
            }
            let output = command.output().await.unwrap();
            let text = String::from_utf8_lossy(if stream == "stdout" {
                &output.stdout
            } else {
                &output.stderr
            })
            .into_owned();
            assert!(!text.is_empty(), "{args:?}");
            assert_eq!(
                text.contains(SGR),
                no_color.is_none(),
                "{args:?} NO_COLOR={no_color:?}: {text:?}"
            );
        }
    }
    // The commands' own output has none, with or without NO_COLOR.
    for args in [
        &["status"][..],
        &["status", "-o", "yaml"],
        &["version", "-o", "json"],
        &["version"],
    ] {
        let mut command = machine.command(args);
        command.env("NO_COLOR", "1");
        let output = command.output().await.unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!text.contains('\u{1b}'), "{args:?}: {text:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_names_an_exchange_that_got_no_answer() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = format!("http://127.0.0.1:{port}");
    let (code, _, err) = Machine::new()
        .run(&["version", "--debug", "--server", &server])
        .await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("debug: server request: GET {server}/v1/info\n")),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "debug: server did not answer GET {server}/v1/info after "
        )),
        "{err}"
    );
    // Without --debug: the error alone.
    let (_, _, err) = Machine::new().run(&["version", "--server", &server]).await;
    assert!(!err.contains("debug:"), "{err}");
}

/// `--debug` against a real OpenID Provider.
#[path = "debug_real_op.rs"]
mod real_op;
