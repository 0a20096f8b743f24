//! `--debug` against a real, OpenID-certified provider (oidc-provider):
//! a browser, a silent and a device login show their exchanges, and none
//! of the secrets the test can know (the authorization code, the refresh
//! tokens saved, the private keys written), no JWT at all (ID and access
//! tokens), and every field that carries a code or a token redacted.

use std::time::Duration;

use talos_sso_tests::real_op::{ONCALL_USER, RealOpEnv};

use super::super::{Machine, context_fields, finish, wait_for_line};

/// The refresh tokens saved on `machine` now.
fn saved_refresh_tokens(machine: &Machine) -> Vec<String> {
    let path = machine.home.path().join(".cache/talos-sso/tokens.json");
    let text = std::fs::read_to_string(path).unwrap();
    let cache: serde_json::Value = serde_json::from_str(&text).unwrap();
    cache["entries"]
        .as_object()
        .unwrap()
        .values()
        .map(|e| e["refresh_token"].as_str().unwrap().to_owned())
        .collect()
}

/// The base64 lines of the private key in `machine`'s `prod` context.
fn private_key_lines(machine: &Machine) -> Vec<String> {
    let (_, _, key) = context_fields(&machine.talosconfig(), "prod");
    key.lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_provider_login_with_debug_shows_no_secret() {
    let env = RealOpEnv::start("id_token").await;
    let server = env.server.base_url.clone();
    let mut secrets: Vec<(&str, String)> = Vec::new();

    // By browser: the authorization code is in the address the browser
    // is sent back to.
    let bob = Machine::new();
    let mut child = bob
        .command(&["--debug", "login", "--server", &server, "--no-browser"])
        .spawn()
        .unwrap();
    let (url, seen, rest) = wait_for_line(&mut child, |line| {
        line.trim().starts_with("http").then(|| line.trim().to_owned())
    })
    .await;
    let page = env.op.browser(ONCALL_USER).visit(&url).await;
    let callback = url::Url::parse(&page.url).unwrap();
    let code = callback
        .query_pairs()
        .find(|(k, _)| k == "code")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| panic!("no code in {}", page.url));
    secrets.push(("authorization code", code));
    let (status, out) = finish(child).await;
    let browser = seen.join("\n") + "\n" + &rest.await.unwrap();
    assert_eq!(status, 0, "{out}{browser}\nprovider log: {}", env.op.log());
    for token in saved_refresh_tokens(&bob) {
        secrets.push(("refresh token of the browser login", token));
    }
    for line in private_key_lines(&bob) {
        secrets.push(("private key of the browser login", line));
    }

    // Silently, by refresh (TALOS_SSO_DEBUG=1).
    let mut command = bob.command(&["login"]);
    command.env("TALOS_SSO_DEBUG", "1");
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .unwrap()
        .unwrap();
    let silent = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{silent}");
    for token in saved_refresh_tokens(&bob) {
        secrets.push(("rotated refresh token", token));
    }
    for line in private_key_lines(&bob) {
        secrets.push(("private key of the silent login", line));
    }

    // By device code.
    let carol = Machine::new();
    let mut child = carol
        .command(&["login", "--server", &server, "--device", "--debug"])
        .spawn()
        .unwrap();
    let (user_code, seen, rest) = wait_for_line(&mut child, |line| {
        let t = line.trim();
        let (a, b) = t.split_once('-')?;
        (a.len() == 4 && b.len() == 4 && t.chars().all(|c| c == '-' || c.is_ascii_uppercase()))
            .then(|| t.to_owned())
    })
    .await;
    env.op
        .browser(ONCALL_USER)
        .approve_device(&format!("{}/device", env.op.issuer), &user_code)
        .await;
    let (status, out) = finish(child).await;
    let device = seen.join("\n") + "\n" + &rest.await.unwrap();
    assert_eq!(status, 0, "{out}{device}\nprovider log: {}", env.op.log());
    for token in saved_refresh_tokens(&carol) {
        secrets.push(("refresh token of the device login", token));
    }
    for line in private_key_lines(&carol) {
        secrets.push(("private key of the device login", line));
    }

    let issuer = env.op.issuer.as_str();
    for (flow, text, grant) in [
        ("browser", &browser, "authorization_code"),
        ("silent", &silent, "refresh_token"),
        ("device", &device, "urn:ietf:params:oauth:grant-type:device_code"),
    ] {
        // Useful: discovery, the token endpoint's exchange, the certificate.
        for expected in [
            format!(
                "debug: identity provider answered 200 to GET {issuer}/.well-known/openid-configuration in "
            ),
            format!("debug: identity provider request: POST {issuer}/token with form {{grant_type={grant}"),
            format!("debug: identity provider answered 200 to POST {issuer}/token in "),
            format!("debug: server answered 201 to POST {server}/v1/certificates in "),
        ] {
            assert!(text.contains(&expected), "{flow}: `{expected}` not in:\n{text}");
        }
        // No JWT (the ID token, a JWT access token): their header starts so.
        assert!(!text.contains("eyJ"), "{flow}: a JWT in:\n{text}");
        // Each field that carries a code or a token is redacted.
        for field in [
            "code=",
            "code_verifier=",
            "refresh_token=",
            "device_code=",
            "\"device_code\":",
            "\"id_token\":",
            "\"access_token\":",
            "\"refresh_token\":",
        ] {
            for (at, _) in text.match_indices(field) {
                let after = &text[at + field.len()..];
                assert!(
                    after.starts_with("<redacted>") || after.starts_with("\"<redacted>\""),
                    "{flow}: {field} not redacted: {}",
                    &after[..after.len().min(40)]
                );
            }
        }
    }
    // The redaction above had fields to act on.
    assert!(
        browser.contains(", code=<redacted>, code_verifier=<redacted>"),
        "{browser}"
    );
    assert!(silent.contains("refresh_token=<redacted>"), "{silent}");
    assert!(device.contains("device_code=<redacted>"), "{device}");
    assert!(device.contains(r#""device_code":"<redacted>""#), "{device}");
    let all = format!("{browser}\n{silent}\n{device}");
    assert!(secrets.len() >= 6, "{secrets:?}");
    for (kind, value) in &secrets {
        assert!(value.len() >= 16, "{kind} is too short to search for");
        assert!(!all.contains(value.as_str()), "the {kind} is in the debug output");
    }
    env.finish().await;
}
