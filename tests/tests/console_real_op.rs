//! The console's login through a real, OpenID-certified provider
//! (oidc-provider, set up as Keycloak and Dex usually are; see
//! `talos_sso_tests::real_op`), with no emulator anywhere: the server is
//! the provider's confidential web client `talos-sso-console`, its
//! registered redirect URI the console's callback, PKCE required, the
//! secret sent as `client_secret_post`. People click through in
//! `real_op`'s browser, which keeps cookies per host and sends
//! `Sec-Fetch-Site` as browsers do.
//!
//! What the emulator cannot tell: that the login asks for what a provider
//! needs to release the groups (oidc-provider, as Keycloak and Dex, gives
//! `groups` only for the `groups` scope), that the provider's authorization
//! response (with RFC 9207's `iss`) is accepted, one naming another issuer
//! or none is refused, that a changed `state` is
//! refused before the provider's code is redeemed, and that the provider's
//! refusal of a code from another login is shown, with no session.

use std::collections::HashMap;

use talos_sso_server::http::console::session::{LOGIN_COOKIE, SESSION_COOKIE};
use talos_sso_tests::real_op::{
    AUDITOR_USER, Browser, GROUP_AUDITORS, NO_GROUP_USER, ONCALL_USER, Page, RealOpEnv,
};

use super::console::console_views;

/// The sign-in page's link: `/ui` opened as if typed, then its button.
async fn sign_in(env: &RealOpEnv, browser: &Browser) -> Page {
    let page = browser.visit(&format!("{}/ui", env.server.base_url)).await;
    assert_eq!(page.status, 200, "{}", page.body);
    browser.follow(&page, "Sign in with your company account").await
}

/// The query of `url`.
fn query_of(url: &str) -> HashMap<String, String> {
    url::Url::parse(url)
        .expect("a URL")
        .query_pairs()
        .into_owned()
        .collect()
}

/// `url` with its query parameter `name` set to `value`.
fn with_param(url: &str, name: &str, value: &str) -> String {
    edit_param(url, name, Some(value))
}

/// `url` with its query parameter `name` set to `value`, or removed.
fn edit_param(url: &str, name: &str, value: Option<&str>) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .filter_map(|(k, v)| {
            let v = if k == name {
                value?.to_owned()
            } else {
                v.into_owned()
            };
            Some((k.into_owned(), v))
        })
        .collect();
    url.query_pairs_mut().clear().extend_pairs(pairs);
    url.to_string()
}

/// A login started from the console, stopped as the provider sends the
/// browser back: the callback URL, not yet opened.
async fn held_callback(env: &RealOpEnv, browser: &Browser) -> String {
    let base = &env.server.base_url;
    let page = browser
        .visit_until(&format!("{base}/ui/login"), &format!("{base}/ui/callback"))
        .await;
    assert_eq!(
        (page.status, page.body.as_str()),
        (303, ""),
        "stopped at the callback: {:?}\nprovider log: {}",
        page.chain,
        env.op.log()
    );
    page.url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_login_through_a_real_provider() {
    let env = RealOpEnv::start_console().await;
    let base = env.server.base_url.clone();

    // Neither on call (`groups: [oncall]`) nor in no group at all (no
    // `groups` claim) is an auditor: the membership page at the callback,
    // no session, the refusal recorded as the API records it.
    for user in [ONCALL_USER, NO_GROUP_USER] {
        let browser = env.op.browser(user);
        let page = sign_in(&env, &browser).await;
        assert!(
            page.url.starts_with(&format!("{base}/ui/callback?")),
            "{user} ends at the callback: {:?}\nprovider log: {}",
            page.chain,
            env.op.log()
        );
        assert_eq!(page.status, 403, "{user}: {}", page.body);
        assert!(
            page.body.contains("Ask for membership in")
                && page.body.contains(&format!("group {GROUP_AUDITORS}")),
            "{user}: {}",
            page.body
        );
        assert_eq!(browser.cookie(&base, SESSION_COOKIE), None, "{user}: no session");
        assert_eq!(
            browser.cookie(&base, LOGIN_COOKIE),
            None,
            "{user}: the login is over"
        );
        let refusals = console_views(&env.server, user).await;
        assert!(
            refusals.iter().any(|d| d["outcome"] == "denied"
                && d["reason_code"] == "not_an_auditor"
                && d["view"] == "login"),
            "{user}: {refusals:#?}"
        );
    }

    // The auditor: to the provider, signed in, consent given, back.
    let browser = env.op.browser(AUDITOR_USER);
    let page = sign_in(&env, &browser).await;
    let authorize = page
        .chain
        .iter()
        .find(|u| u.starts_with(&format!("{}/auth?", env.op.issuer)))
        .unwrap_or_else(|| panic!("no authorization request in {:?}", page.chain));
    let asked = query_of(authorize);
    assert_eq!(asked["redirect_uri"], format!("{base}/ui/callback"));
    // The CLI's scopes (`groups` among them, which this provider needs to
    // release the groups), less `offline_access`: no refresh token.
    assert_eq!(asked["scope"], "openid profile email groups", "{authorize}");
    let callback = page
        .chain
        .iter()
        .find(|u| u.starts_with(&format!("{base}/ui/callback?")))
        .unwrap_or_else(|| {
            panic!(
                "not back at the callback: {:?} ({}): {}\nprovider log: {}",
                page.chain,
                page.status,
                page.body,
                env.op.log()
            )
        })
        .clone();
    let answer = query_of(&callback);
    // RFC 9207: oidc-provider names itself in its authorization response.
    assert_eq!(answer.get("iss"), Some(&env.op.issuer), "{callback}");
    assert_eq!(answer.get("state"), asked.get("state"));
    // Back from another origin: the console's "open this view" page,
    // the session already there, nothing read or recorded yet.
    assert_eq!(
        (page.url.as_str(), page.status),
        (format!("{base}/ui").as_str(), 200),
        "{}",
        page.body
    );
    assert!(page.body.contains("Open this view"), "{}", page.body);
    assert!(browser.cookie(&base, SESSION_COOKIE).is_some(), "a session");
    assert!(console_views(&env.server, AUDITOR_USER).await.is_empty());
    let trail = browser.follow(&page, "Open this view").await;
    assert_eq!(trail.status, 200, "{}", trail.body);
    assert!(
        trail.body.contains("Export CSV")
            && trail
                .body
                .contains(&format!("<span class=\"who\">{AUDITOR_USER}</span>")),
        "the trail, to sam: {}",
        trail.body
    );
    // The trail shows the refusals above: only an auditor sees them.
    assert!(
        trail.body.contains("/ui/person?username=bob\">bob</a>")
            && trail.body.contains("denied (not_an_auditor)"),
        "{}",
        trail.body
    );
    let views = console_views(&env.server, AUDITOR_USER).await;
    assert_eq!(
        views
            .iter()
            .filter(|d| d["view"] == "trail" && d["outcome"] == "success")
            .count(),
        1,
        "the trail's view recorded once: {views:#?}"
    );

    // A second browser of sam's, a login held at the callback: with its
    // `state` changed, refused before the code is redeemed, and the login
    // used up, so the true answer is refused after it.
    let second = env.op.browser(AUDITOR_USER);
    let held = held_callback(&env, &second).await;
    let forged = second.visit(&with_param(&held, "state", &"0".repeat(32))).await;
    assert_eq!(forged.status, 403);
    assert!(
        forged.body.contains("does not belong to this login (state)"),
        "{}",
        forged.body
    );
    let late = second.visit(&held).await;
    assert_eq!(late.status, 403);
    assert!(late.body.contains("This login is unknown"), "{}", late.body);
    assert_eq!(second.cookie(&base, SESSION_COOKIE), None);

    // An answer that names another provider (RFC 9207's `iss`), though its
    // `state` is right: refused before the code is redeemed.
    let held = held_callback(&env, &second).await;
    let mixed_up = second
        .visit(&with_param(&held, "iss", "https://elsewhere.example"))
        .await;
    assert_eq!(mixed_up.status, 403);
    assert!(
        mixed_up
            .body
            .contains("another identity provider than this server's (iss)"),
        "{}",
        mixed_up.body
    );
    assert_eq!(second.cookie(&base, SESSION_COOKIE), None);
    // The provider says it names itself in every answer: one without `iss`
    // is refused too.
    let held = held_callback(&env, &second).await;
    let unnamed = second.visit(&edit_param(&held, "iss", None)).await;
    assert_eq!(unnamed.status, 403);
    assert!(
        unnamed.body.contains("does not name the identity provider"),
        "{}",
        unnamed.body
    );
    assert_eq!(second.cookie(&base, SESSION_COOKIE), None);

    // The code the auditor's login redeemed, given to another login in
    // progress: the provider refuses it (a code is good once, and for the
    // PKCE verifier of its own login only); the server says so and opens
    // no session.
    let other = held_callback(&env, &second).await;
    let replayed = with_param(&other, "code", &answer["code"]);
    let refused = second.visit(&replayed).await;
    assert_eq!(refused.status, 403);
    assert!(
        refused.body.contains("did not redeem the login (invalid_grant)"),
        "{}",
        refused.body
    );
    assert_eq!(second.cookie(&base, SESSION_COOKIE), None);

    env.finish().await;
}
