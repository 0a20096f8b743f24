//! The real `talos-sso` binary and server against a real, OpenID-certified
//! provider (oidc-provider, set up as Keycloak and Dex usually are; see
//! `talos_sso_tests::real_op`): browser and device logins, silent refresh,
//! logins within one second with tokens that carry no `jti`, a person in no
//! group, an auditor, an access token the server cannot use, and a SIEM's
//! collector with a token of its own (client credentials).

use talos_sso_tests::real_op::{AUDITOR_USER, NO_GROUP_USER, ONCALL_USER, RealOp, RealOpEnv};
use talos_sso_tests::talos_checker;

use super::{Machine, context_fields, finish, next_json_line, stdout_lines, wait_for_line};

/// `login --no-browser` (and `extra`), with `user` signing in at the
/// provider in the test's browser. Returns the exit code, stdout, stderr.
pub(super) async fn browser_login(
    env: &RealOpEnv,
    machine: &Machine,
    user: &str,
    extra: &[&str],
) -> (i32, String, String) {
    let mut args = vec!["login", "--server", &env.server.base_url, "--no-browser"];
    args.extend_from_slice(extra);
    sign_in(env, machine, user, &args).await
}

/// Run a command that opens the browser login, sign `user` in, wait for it.
async fn sign_in(env: &RealOpEnv, machine: &Machine, user: &str, args: &[&str]) -> (i32, String, String) {
    let mut child = machine.command(args).spawn().unwrap();
    let (url, _, rest) = wait_for_line(&mut child, |line| {
        line.trim().starts_with("http").then(|| line.trim().to_owned())
    })
    .await;
    assert!(url.starts_with(&format!("{}/auth?", env.op.issuer)), "{url}");
    let page = env.op.browser(user).visit(&url).await;
    assert_eq!(
        (page.status, page.body.contains("You may close this tab")),
        (200, true),
        "the loopback's page at {}: {}\nprovider log: {}",
        page.url,
        page.body,
        env.op.log()
    );
    assert!(page.url.starts_with("http://localhost:"), "{}", page.url);
    let (code, out) = finish(child).await;
    (code, out, rest.await.unwrap())
}

/// The roles of the certificate in the talosconfig's `prod` context, as
/// Talos reads them in an mTLS handshake.
fn roles(machine: &Machine) -> Vec<String> {
    let (ca, crt, key) = context_fields(&machine.talosconfig(), "prod");
    talos_checker::handshake(&ca, &crt, &key).unwrap().roles
}

/// Every audit record of the server, oldest first.
async fn records(env: &RealOpEnv) -> Vec<talos_sso_api::audit::AuditRecord> {
    let page = env.server.app.audit.store().page(0, 10_000).await.unwrap();
    page.into_iter().map(|stored| stored.record).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_provider_browser_login_then_a_silent_refresh() {
    let env = RealOpEnv::start("id_token").await;
    let machine = Machine::new();
    let (code, out, err) = browser_login(&env, &machine, ONCALL_USER, &[]).await;
    assert_eq!(code, 0, "{out}{err}\nprovider log: {}", env.op.log());
    assert!(out.contains("Logged in to prod as bob with os:operator"), "{out}");
    assert_eq!(roles(&machine), ["os:operator"]);
    assert!(!err.contains("no refresh token"), "{err}");
    let (_, crt, _) = context_fields(&machine.talosconfig(), "prod");

    // Again, without a browser: the refresh token the provider issued for
    // `offline_access` (rotated, as it does for public clients).
    let (code, out, err) = machine.run(&["login"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("http"), "no browser the second time: {err}");
    assert!(out.contains("Logged in to prod as bob with os:operator"), "{out}");
    let (_, crt2, _) = context_fields(&machine.talosconfig(), "prod");
    assert_ne!(crt, crt2, "a new certificate");
    assert_eq!(roles(&machine), ["os:operator"]);

    let records = records(&env).await;
    let issued: Vec<_> = records
        .iter()
        .map(|r| {
            (
                r.event.as_str(),
                r.outcome.as_str(),
                r.username.as_deref(),
                r.groups_evaluated.clone(),
                r.token_id.clone(),
            )
        })
        .collect();
    let expected = (
        "certificate.issued",
        "success",
        Some("bob"),
        vec!["oncall".to_owned()],
        None,
    );
    // The provider's ID tokens carry no `jti`: the replay guard keys on
    // the token itself.
    assert_eq!(issued, [expected.clone(), expected]);
    assert_eq!(
        records[0].issuer.as_deref(),
        Some(env.op.issuer.as_str()),
        "the record names the provider"
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_provider_device_login() {
    let env = RealOpEnv::start("id_token").await;
    let machine = Machine::new();
    let mut child = machine
        .command(&["login", "--server", &env.server.base_url, "--device"])
        .spawn()
        .unwrap();
    // oidc-provider's user codes: eight letters of its base-20 alphabet, `XXXX-XXXX`.
    let (user_code, seen, rest) = wait_for_line(&mut child, |line| {
        let t = line.trim();
        let (a, b) = t.split_once('-')?;
        (a.len() == 4 && b.len() == 4 && t.chars().all(|c| c == '-' || c.is_ascii_uppercase()))
            .then(|| t.to_owned())
    })
    .await;
    let verification = format!("{}/device", env.op.issuer);
    assert!(
        seen.iter().any(|l| l.trim() == verification),
        "the CLI shows the provider's verification URI: {seen:?}"
    );
    let page = env
        .op
        .browser(ONCALL_USER)
        .approve_device(&verification, &user_code)
        .await;
    assert!(
        page.body.contains("Sign-in Success"),
        "{}: {}\nprovider log: {}",
        page.url,
        page.body,
        env.op.log()
    );
    let (code, out) = finish(child).await;
    assert_eq!(code, 0, "{out}{}", rest.await.unwrap());
    assert!(out.contains("Logged in to prod as bob with os:operator"), "{out}");
    assert_eq!(roles(&machine), ["os:operator"]);

    // The device flow's refresh token renews silently too.
    let (code, _, err) = machine.run(&["login"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("enter the code"), "{err}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_provider_logins_in_the_same_second_are_never_replays() {
    let env = RealOpEnv::start("id_token").await;
    let machine = Machine::new();
    let (code, out, err) = browser_login(&env, &machine, ONCALL_USER, &[]).await;
    assert_eq!(code, 0, "{out}{err}");
    // Back to back. A provider whose ID tokens carry no `jti` may answer a
    // refresh within the same second with the very token of the one
    // before (same claims, same `iat`), or with another: oidc-provider 8
    // puts `at_hash` into refreshed ID tokens, so its tokens differ (the
    // Entra emulator's `logins_within_one_second_work_with_tokens_that_carry_no_id`
    // makes them identical). Either way no token may reach the server twice.
    let (code, _, err) = machine.run(&["login"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = machine.run(&["login", "--ttl", "30s"]).await;
    assert_eq!(code, 0, "a second login in the same second: {err}");
    // `exec` right after `login` (30 s left: it renews).
    let (code, _, err) = machine.run(&["exec", "--", "true"]).await;
    assert_eq!(code, 0, "exec right after login: {err}");
    let records = records(&env).await;
    let outcomes: Vec<_> = records
        .iter()
        .map(|r| (r.event.as_str(), r.reason_code.as_deref()))
        .collect();
    assert_eq!(
        outcomes,
        [("certificate.issued", None); 4],
        "four certificates, no `token_replayed`"
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_provider_user_in_no_group_is_refused_with_a_sentence() {
    let env = RealOpEnv::start("id_token").await;
    let machine = Machine::new();
    let (code, out, err) = browser_login(&env, &machine, NO_GROUP_USER, &[]).await;
    assert_eq!((code, out.as_str()), (5, ""), "{err}");
    // The last line: the sentence, naming the group that would help.
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(
            "error: no group or app role of yours grants a role on cluster `prod`; ask for membership \
             in one of: group oncall (request id "
        ),
        "{err}"
    );
    assert!(!machine.talosconfig().exists(), "no certificate written");
    let records = records(&env).await;
    let denied: Vec<_> = records
        .iter()
        .map(|r| {
            (
                r.event.as_str(),
                r.reason_code.as_deref(),
                r.username.as_deref(),
                r.serial.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        denied,
        [("certificate.denied", Some("no_matching_rule"), Some("dave"), None)]
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_provider_auditor_reads_the_trail() {
    let env = RealOpEnv::start("id_token").await;
    let bob = Machine::new();
    let (code, out, err) = browser_login(&env, &bob, ONCALL_USER, &[]).await;
    assert_eq!(code, 0, "{out}{err}");
    let sam = Machine::new();
    let server = env.server.base_url.clone();
    let (code, table, err) = sign_in(
        &env,
        &sam,
        AUDITOR_USER,
        &["audit", "list", "--server", &server, "--no-browser"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(table.starts_with("   SEQ  TIME"), "{table}");
    assert_eq!(rows.len(), 1, "bob's certificate: {table}");
    assert_eq!(
        (rows[0][0], rows[0][2], rows[0][3], rows[0][5], rows[0][6]),
        ("1", "certificate.issued", "success", "bob", "os:operator"),
        "{table}"
    );
    // The query itself is recorded, as sam's.
    let queries: Vec<_> = records(&env)
        .await
        .into_iter()
        .filter(|r| r.event == "audit.query")
        .map(|r| (r.username, r.groups_evaluated))
        .collect();
    assert_eq!(queries, [(Some("sam".to_owned()), vec!["auditors".to_owned()])]);
    // Silent afterwards; bob is no auditor.
    let (code, verified, err) = sam.run(&["audit", "verify"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(verified.contains("audit chain intact"), "{verified}");
    let (code, _, err) = bob.run(&["audit", "list"]).await;
    assert_eq!(code, 5);
    assert!(
        err.contains("reading the audit trail is for the security team"),
        "{err}"
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_providers_opaque_access_token_is_named_as_such() {
    let env = RealOpEnv::start("access_token").await;
    let machine = Machine::new();
    let (code, out, err) = browser_login(&env, &machine, ONCALL_USER, &[]).await;
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.ends_with(
            "error: the identity provider's answer does not check out: the server expects the access \
             token, but the identity provider's is opaque (not a JWT): the server's operators set \
             identity.token: access_token; use id_token, or make the provider issue JWT access tokens \
             for this API\n"
        ),
        "{err}"
    );
    assert!(!machine.talosconfig().exists());
    assert_eq!(records(&env).await.len(), 0, "nothing reached the server");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_issues_no_refresh_token_is_named_at_login() {
    // oidc-provider's own rule: `offline_access` only with `prompt=consent`,
    // which the CLI does not send, so no refresh token.
    let env = RealOpEnv::start_with(RealOp::start(1, true).await, "id_token").await;
    let machine = Machine::new();
    let (code, out, err) = browser_login(&env, &machine, ONCALL_USER, &[]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains(
            "Note: the identity provider issued no refresh token (scopes asked for: openid profile email \
             groups offline_access), so the next login needs the browser again. Its operators can allow \
             refresh tokens for this client (talos-sso's docs/providers say how, provider by provider).\n"
        ),
        "{err}"
    );
    // And so it is: the next login prints the browser URL again.
    let (code, _, err) = machine.run(&["login", "--no-browser", "--timeout", "1s"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains(&format!("{}/auth?", env.op.issuer)), "{err}");
    assert!(
        err.contains("the browser login did not finish within 1s"),
        "{err}"
    );
    env.finish().await;
}

/// A SIEM's collector with the real provider's client credentials grant:
/// its RFC 9068 access token (`client_id`, `sub` the client) is verified
/// like any, makes it an auditor by its client id, follows the trail
/// through the CLI with `--token-file`, and gets no certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_providers_client_credentials_token_follows_the_trail_and_gets_no_certificate() {
    use talos_sso_tests::harness::json_of;
    use talos_sso_tests::real_op::{COLLECTOR_ID, COLLECTOR_SECRET};
    let env = RealOpEnv::start("id_token").await;
    let http = reqwest::Client::new();
    let discovery = json_of(http.get(format!("{}/.well-known/openid-configuration", env.op.issuer))).await;
    let answer = json_of(http.post(discovery["token_endpoint"].as_str().unwrap()).form(&[
        ("grant_type", "client_credentials"),
        ("client_id", COLLECTOR_ID),
        ("client_secret", COLLECTOR_SECRET),
        ("resource", "urn:talos-sso"),
        ("scope", "audit"),
    ]))
    .await;
    let token = answer["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}\nprovider log: {}", env.op.log()))
        .to_owned();
    let base = env.server.base_url.clone();

    // No certificate for an application.
    let csr = talos_sso::key::ClientKey::generate()
        .and_then(|k| k.csr_pem())
        .unwrap();
    let refused = json_of(
        http.post(format!("{base}/v1/certificates"))
            .bearer_auth(&token)
            .json(&serde_json::json!({"cluster": "prod", "csr": csr})),
    )
    .await;
    assert_eq!(refused["code"], "no_matching_rule", "{refused}");

    // The CLI follows the trail with the collector's token from a file.
    let collector = Machine::new();
    let token_file = collector.home.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let mut child = collector
        .command(&[
            "audit",
            "export",
            "--follow",
            "--server",
            &base,
            "--token-file",
            token_file.to_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    let mut lines = stdout_lines(&mut child);
    let denied = next_json_line(&mut lines).await;
    assert_eq!(
        (
            denied["event"].as_str(),
            denied["reason_code"].as_str(),
            denied["username"].as_str(),
            denied["subject"].as_str(),
            denied["identity_verified"].as_bool(),
        ),
        (
            Some("certificate.denied"),
            Some("no_matching_rule"),
            Some(COLLECTOR_ID),
            Some(COLLECTOR_ID),
            Some(true)
        )
    );
    let followed = next_json_line(&mut lines).await;
    assert_eq!(
        (followed["event"].as_str(), followed["details"]["action"].as_str()),
        (Some("audit.query"), Some("follow"))
    );
    child.kill().await.unwrap();
    env.finish().await;
}
