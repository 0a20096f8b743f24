//! The Entra ID emulator driven as the CLI will drive it (the `openidconnect`
//! crate over real HTTP), and the server's token verification against it:
//! discovery, key rotation, outages, the `{tenantid}` template, v1 access
//! tokens, group overage through Graph, several issuers trusted at once
//! (a second emulator instance, with keys of its own, read as plain OIDC),
//! and app roles read in the tenant that assigned them.

use std::time::Duration;

use openidconnect::core::{CoreClient, CoreDeviceAuthorizationResponse, CoreResponseType};
use openidconnect::{
    AuthenticationFlow, AuthorizationCode, ClientId, CsrfToken, IssuerUrl, Nonce, OAuth2TokenResponse,
    PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, Scope, TokenResponse,
};
use serde_json::json;
use talos_sso_server::config::{GraphConfig, IssuerConfig, LOGIN_ISSUER};
use talos_sso_server::identity::authenticator::{Authenticator, RelevantGroups};
use talos_sso_server::identity::issuer::Issuer;
use talos_sso_server::identity::provider::{IssuerKeys, ProviderError, ProviderSettings};
use talos_sso_tests::emulator::{
    CLI_CLIENT_ID, EmulatorConfig, EmulatorHandle, Faults, GROUP_ONCALL, GROUP_PLATFORM_ADMINS,
    GROUP_SECURITY, SERVER_APP_ID, SERVER_APP_SECRET, SIEM_CLIENT_ID, TENANT_ID, TokenKind,
};
use talos_sso_tests::harness::{Backend, TestEnv, Workdir, server_cli};
use talos_sso_tests::material::write_file;
use time::OffsetDateTime;

/// The CLI's own view of Entra's discovery document (with the device endpoint).
type EntraMetadata = talos_sso::login::Metadata;

fn http() -> openidconnect::reqwest::Client {
    openidconnect::reqwest::Client::builder()
        .redirect(openidconnect::reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn emulator(config: EmulatorConfig) -> EmulatorHandle {
    EmulatorHandle::start(config).await.unwrap()
}

async fn discover(emulator: &EmulatorHandle) -> EntraMetadata {
    EntraMetadata::discover_async(IssuerUrl::new(emulator.issuer()).unwrap(), &http())
        .await
        .unwrap()
}

#[tokio::test]
async fn browser_flow_with_pkce_state_nonce_and_rotating_refresh() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let metadata = discover(&emulator).await;
    let client = CoreClient::from_provider_metadata(metadata, ClientId::new(CLI_CLIENT_ID.into()), None)
        .set_redirect_uri(RedirectUrl::new("http://localhost:53682/callback".into()).unwrap());
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let (url, csrf, nonce) = client
        .authorize_url(
            AuthenticationFlow::<CoreResponseType>::AuthorizationCode,
            CsrfToken::new_random,
            Nonce::new_random,
        )
        .add_scope(Scope::new("offline_access".into()))
        .set_pkce_challenge(challenge)
        .url();
    emulator.set_auto_login(Some("bob@example.com"));

    // The browser's part: follow the authorization URL to the loopback redirect.
    let response = http().get(url.as_str()).send().await.unwrap();
    assert_eq!(response.status(), 302);
    let location = url::Url::parse(response.headers()["location"].to_str().unwrap()).unwrap();
    assert_eq!(
        (location.host_str(), location.port(), location.path()),
        (Some("localhost"), Some(53682), "/callback")
    );
    let query: std::collections::HashMap<_, _> = location.query_pairs().into_owned().collect();
    assert_eq!(query["state"], *csrf.secret());

    // A wrong verifier is refused, and the code is then spent.
    let wrong = client
        .exchange_code(AuthorizationCode::new(query["code"].clone()))
        .unwrap()
        .set_pkce_verifier(PkceCodeVerifier::new("x".repeat(43)))
        .request_async(&http())
        .await;
    assert!(format!("{:?}", wrong.unwrap_err()).contains("invalid_grant"));

    let response = http().get(url.as_str()).send().await.unwrap();
    let location = url::Url::parse(response.headers()["location"].to_str().unwrap()).unwrap();
    let code = location
        .query_pairs()
        .find(|(k, _)| k == "code")
        .unwrap()
        .1
        .into_owned();
    let tokens = client
        .exchange_code(AuthorizationCode::new(code))
        .unwrap()
        .set_pkce_verifier(verifier)
        .request_async(&http())
        .await
        .unwrap();
    let id_token = tokens.id_token().unwrap();
    let claims = id_token.claims(&client.id_token_verifier(), &nonce).unwrap();
    assert_eq!(claims.preferred_username().unwrap().as_str(), "bob@example.com");
    assert_eq!(claims.issuer().as_str(), emulator.issuer());
    // Entra backdates iat by five minutes and lets ID tokens live 65 minutes from it.
    assert_eq!((claims.expiration() - claims.issue_time()).num_seconds(), 3900);
    assert!(claims.issue_time() < chrono_now() - chrono::Duration::seconds(290));

    // Refresh: a new refresh token and ID token each time; the old refresh token is spent.
    let first_refresh = tokens.refresh_token().unwrap().clone();
    let refreshed = client
        .exchange_refresh_token(&first_refresh)
        .unwrap()
        .request_async(&http())
        .await
        .unwrap();
    assert_ne!(
        refreshed.refresh_token().unwrap().secret(),
        first_refresh.secret()
    );
    assert!(refreshed.id_token().is_some());
    let again = client
        .exchange_refresh_token(&first_refresh)
        .unwrap()
        .request_async(&http())
        .await;
    assert!(format!("{:?}", again.unwrap_err()).contains("invalid_grant"));
}

fn chrono_now() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now()
}

#[tokio::test]
async fn device_flow_with_openidconnect() {
    let emulator = emulator(EmulatorConfig {
        device_interval: 1,
        ..Default::default()
    })
    .await;
    let metadata = discover(&emulator).await;
    let device_url = metadata
        .additional_metadata()
        .device_authorization_endpoint
        .clone()
        .expect("the emulator announces its device endpoint");
    let client = CoreClient::from_provider_metadata(metadata, ClientId::new(CLI_CLIENT_ID.into()), None)
        .set_device_authorization_url(device_url);
    let details: CoreDeviceAuthorizationResponse = client
        .exchange_device_code()
        .add_scope(Scope::new("offline_access".into()))
        .request_async(&http())
        .await
        .unwrap();
    assert_eq!(
        details.verification_uri().as_str(),
        format!("{}/devicelogin", emulator.base_url)
    );
    assert_eq!(details.interval(), Duration::from_secs(1));
    assert_eq!(details.user_code().secret().len(), 9);
    assert!(emulator.approve_device(details.user_code().secret(), "carol@example.com"));
    let tokens = client
        .exchange_device_access_token(&details)
        .unwrap()
        .request_async(&http(), tokio::time::sleep, Some(Duration::from_secs(20)))
        .await
        .unwrap();
    let id_token = tokens.id_token().unwrap();
    // Device-code ID tokens carry no nonce.
    let claims = id_token.claims(&client.id_token_verifier(), |nonce: Option<&Nonce>| match nonce {
        None => Ok(()),
        Some(_) => Err("unexpected nonce".to_owned()),
    });
    assert_eq!(
        claims.unwrap().preferred_username().unwrap().as_str(),
        "carol@example.com"
    );
    assert!(tokens.refresh_token().is_some());
}

async fn poll(emulator: &EmulatorHandle, device_code: &str) -> (u16, serde_json::Value) {
    let response = http()
        .post(format!("{}/{TENANT_ID}/oauth2/v2.0/token", emulator.base_url))
        .form(&[
            ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
            ("client_id", CLI_CLIENT_ID),
            ("device_code", device_code),
        ])
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

async fn start_device(emulator: &EmulatorHandle) -> serde_json::Value {
    http()
        .post(format!(
            "{}/{TENANT_ID}/oauth2/v2.0/devicecode",
            emulator.base_url
        ))
        .form(&[
            ("client_id", CLI_CLIENT_ID),
            ("scope", "openid profile offline_access"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn device_flow_answers_pending_slow_down_declined_and_expired() {
    let emulator = emulator(EmulatorConfig {
        device_interval: 60,
        ..Default::default()
    })
    .await;
    let started = start_device(&emulator).await;
    for field in [
        "device_code",
        "user_code",
        "verification_uri",
        "expires_in",
        "interval",
        "message",
    ] {
        assert!(started.get(field).is_some(), "missing {field}: {started}");
    }
    let device_code = started["device_code"].as_str().unwrap();
    let (status, body) = poll(&emulator, device_code).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("authorization_pending"))
    );
    let (_, body) = poll(&emulator, device_code).await;
    assert_eq!(body["error"], "slow_down");

    let declined = start_device(&emulator).await;
    assert!(emulator.decline_device(declined["user_code"].as_str().unwrap()));
    let (_, body) = poll(&emulator, declined["device_code"].as_str().unwrap()).await;
    assert_eq!(body["error"], "authorization_declined");

    let short = emulator_with_expiry().await;
    let started = start_device(&short).await;
    let (_, body) = poll(&short, started["device_code"].as_str().unwrap()).await;
    assert_eq!(body["error"], "expired_token");
}

async fn emulator_with_expiry() -> EmulatorHandle {
    emulator(EmulatorConfig {
        device_expires_in: Duration::ZERO,
        ..Default::default()
    })
    .await
}

/// The emulator as the login issuer: Entra, its v2 and v1 issuers, the
/// audiences of ID tokens and of access tokens for the server's API.
fn entra(emulator: &EmulatorHandle) -> IssuerConfig {
    IssuerConfig {
        name: LOGIN_ISSUER.into(),
        kind: "entra".into(),
        issuer: emulator.issuer(),
        discovery_url: None,
        additional_issuers: vec![emulator.issuer_v1()],
        audiences: vec![
            CLI_CLIENT_ID.into(),
            SERVER_APP_ID.into(),
            format!("api://{SERVER_APP_ID}"),
        ],
        clients: vec![CLI_CLIENT_ID.into()],
        allowed_tenants: vec![TENANT_ID.into()],
        username_claim: None,
        leeway: Duration::from_secs(300),
        entra_graph: None,
        ca_file: None,
        jwks_file: None,
        certificates_per_token: None,
    }
}

async fn trust(config: &IssuerConfig) -> Issuer {
    Issuer::discover(config, Duration::from_secs(300)).await.unwrap()
}

async fn issuer(emulator: &EmulatorHandle) -> Issuer {
    trust(&entra(emulator)).await
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

#[tokio::test]
async fn server_verifies_emulator_tokens_and_follows_key_rotation() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let issuer = issuer(&emulator).await;
    assert_eq!(issuer.provider().metadata().issuer, emulator.issuer());
    let token = emulator.token_for("alice@example.com", TokenKind::id()).unwrap();
    let verified = issuer.verify(&token, now()).await.unwrap();
    assert_eq!(verified.subject, "a1000000-0000-4000-8000-000000000001");
    assert_eq!(verified.tenant.as_deref(), Some(TENANT_ID));
    assert_eq!(verified.groups, [GROUP_PLATFORM_ADMINS]);
    let fetches = emulator.counters().jwks;

    // A key added after the server cached the set: one refresh, then accepted.
    emulator.rotate_keys().unwrap();
    let rotated = emulator.token_for("alice@example.com", TokenKind::id()).unwrap();
    issuer.verify(&rotated, now()).await.unwrap();
    assert_eq!(emulator.counters().jwks, fetches + 1);
    issuer.verify(&rotated, now()).await.unwrap();
    assert_eq!(emulator.counters().jwks, fetches + 1, "known keys need no fetch");

    // Another new key within the rate limit: no fetch, refused...
    emulator.rotate_keys().unwrap();
    let rotated_again = emulator.token_for("alice@example.com", TokenKind::id()).unwrap();
    let refused = issuer.verify(&rotated_again, now()).await.unwrap_err();
    assert_eq!(refused.code(), "token_key_unknown");
    assert_eq!(emulator.counters().jwks, fetches + 1);
    // ...until the periodic refresh picks it up, with no restart.
    issuer.provider().refresh_keys().await.unwrap();
    issuer.verify(&rotated_again, now()).await.unwrap();

    // The emulator's clock moved two hours on: its tokens are expired.
    emulator.set_clock_offset(-7200);
    let old = emulator.token_for("alice@example.com", TokenKind::id()).unwrap();
    assert_eq!(
        issuer.verify(&old, now()).await.unwrap_err().code(),
        "token_expired"
    );
}

#[tokio::test]
async fn jwks_outage_keeps_the_last_good_key_set() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let issuer = issuer(&emulator).await;
    let token = emulator.token_for("bob@example.com", TokenKind::id()).unwrap();
    emulator.set_faults(Faults {
        jwks_unavailable: true,
        ..Default::default()
    });
    assert!(matches!(
        issuer.provider().refresh_keys().await,
        Err(ProviderError::Status { status: 503, .. })
    ));
    issuer.verify(&token, now()).await.unwrap();
    emulator.set_faults(Faults {
        malformed_documents: true,
        ..Default::default()
    });
    assert!(matches!(
        issuer.provider().refresh_keys().await,
        Err(ProviderError::Malformed { .. })
    ));
    issuer.verify(&token, now()).await.unwrap();
}

#[tokio::test]
async fn background_refresh_picks_up_new_keys_without_a_request() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let issuer = issuer(&emulator).await;
    // Use up the on-demand refresh, so only the background task can help next.
    emulator.rotate_keys().unwrap();
    issuer
        .verify(
            &emulator.token_for("bob@example.com", TokenKind::id()).unwrap(),
            now(),
        )
        .await
        .unwrap();
    emulator.rotate_keys().unwrap();
    let token = emulator.token_for("bob@example.com", TokenKind::id()).unwrap();
    assert_eq!(
        issuer.verify(&token, now()).await.unwrap_err().code(),
        "token_key_unknown"
    );

    let discoveries = emulator.counters().discovery;
    let refresher = issuer.provider().spawn_refresher(Duration::from_millis(100));
    // Wait, bounded, for a refresher run to bring the new key in.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut result = issuer.verify(&token, now()).await;
    while result.is_err() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        result = issuer.verify(&token, now()).await;
    }
    refresher.abort();
    result.unwrap();
    assert!(
        emulator.counters().discovery > discoveries,
        "discovery is read again too"
    );
}

#[tokio::test]
async fn discovery_refuses_bad_documents_wrong_issuers_and_slow_providers() {
    let emulator = emulator(EmulatorConfig::default()).await;
    emulator.set_faults(Faults {
        malformed_documents: true,
        ..Default::default()
    });
    let error = IssuerKeys::discover(&ProviderSettings::new(emulator.issuer()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            ProviderError::Malformed {
                what: "discovery",
                ..
            }
        ),
        "{error}"
    );

    emulator.set_faults(Faults::default());
    let mut settings = ProviderSettings::new(format!("{}/", emulator.issuer()));
    settings.discovery_url = Some(format!("{}/.well-known/openid-configuration", emulator.issuer()));
    let error = IssuerKeys::discover(&settings).await.unwrap_err();
    assert!(matches!(error, ProviderError::IssuerMismatch { .. }), "{error}");

    emulator.set_faults(Faults {
        jwks_unavailable: true,
        ..Default::default()
    });
    let error = IssuerKeys::discover(&ProviderSettings::new(emulator.issuer()))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ProviderError::Status { status: 503, .. }),
        "{error}"
    );

    emulator.set_faults(Faults {
        delay: Duration::from_secs(3),
        ..Default::default()
    });
    let mut settings = ProviderSettings::new(emulator.issuer());
    settings.http_timeout = Duration::from_millis(300);
    let error = IssuerKeys::discover(&settings).await.unwrap_err();
    assert!(matches!(error, ProviderError::Unreachable { .. }), "{error}");
}

#[tokio::test]
async fn multi_tenant_template_and_v1_access_tokens() {
    let emulator = emulator(EmulatorConfig {
        access_token_version: 1,
        ..Default::default()
    })
    .await;
    // The v1 document names the v1 issuer; `organizations` names the template.
    let v1: serde_json::Value = http()
        .get(format!(
            "{}/{TENANT_ID}/.well-known/openid-configuration",
            emulator.base_url
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v1["issuer"], json!(emulator.issuer_v1()));
    let organizations: serde_json::Value = http()
        .get(format!(
            "{}/organizations/.well-known/openid-configuration",
            emulator.base_url
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        organizations["issuer"],
        json!(format!("{}/sts/{{tenantid}}/", emulator.base_url))
    );
    let template = format!("{}/{{tenantid}}/v2.0", emulator.base_url);
    let template_config = IssuerConfig {
        issuer: template.clone(),
        ..entra(&emulator)
    };
    let issuer = trust(&template_config).await;
    assert_eq!(issuer.provider().metadata().issuer, template);
    let id = emulator.token_for("bob@example.com", TokenKind::id()).unwrap();
    issuer.verify(&id, now()).await.unwrap();

    // v1 access token: iss sts form, aud api://..., appid = the CLI.
    let access = emulator
        .token_for("bob@example.com", TokenKind::Access { version: 1 })
        .unwrap();
    let verified = issuer.verify(&access, now()).await.unwrap();
    assert_eq!(verified.username, "bob@example.com", "falls back to upn");
    assert_eq!(verified.claims["ver"], "1.0");

    // The template only stands for allowed tenants.
    let other = IssuerConfig {
        allowed_tenants: vec!["aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into()],
        ..template_config
    };
    let strict = trust(&other).await;
    assert_eq!(
        strict.verify(&id, now()).await.unwrap_err().code(),
        "token_issuer_invalid"
    );

    // Issued to another client.
    let foreign = emulator
        .token_with(
            "bob@example.com",
            TokenKind::Access { version: 1 },
            serde_json::json!({"appid": "someone-else"}),
        )
        .unwrap();
    assert_eq!(
        issuer.verify(&foreign, now()).await.unwrap_err().code(),
        "token_client_invalid"
    );
}

/// The emulator as the login issuer, with Graph for overage; the secret is
/// written into `work`.
fn entra_with_graph(emulator: &EmulatorHandle, work: &Workdir, secret: &str) -> IssuerConfig {
    let secret_file = write_file(work.path(), "graph-secret-under-test", secret, 0o600);
    IssuerConfig {
        entra_graph: Some(GraphConfig {
            tenant_id: TENANT_ID.into(),
            client_id: SERVER_APP_ID.into(),
            client_secret_file: secret_file,
            authority: emulator.base_url.clone(),
            graph_url: emulator.base_url.clone(),
        }),
        ..entra(emulator)
    }
}

#[tokio::test]
async fn group_overage_is_resolved_through_graph_or_denied() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let work = Workdir::new();
    let relevant = RelevantGroups::new([GROUP_ONCALL.to_owned(), GROUP_PLATFORM_ADMINS.to_owned()]);
    let token = emulator.token_for("erin@example.com", TokenKind::id()).unwrap();
    let claims = talos_sso_server::identity::token::unverified_claims(&token).unwrap();
    assert!(claims.get("groups").is_none() && claims.contains_key("_claim_names"));

    let without_graph = Authenticator::new(issuer(&emulator).await, vec![]);
    let error = without_graph
        .authenticate(&token, now(), &relevant)
        .await
        .unwrap_err();
    assert_eq!(error.code(), "groups_overage_unresolved");
    assert!(error.to_string().contains("Graph is not configured"), "{error}");

    let graph = entra_with_graph(&emulator, &work, SERVER_APP_SECRET);
    let with_graph = Authenticator::new(trust(&graph).await, vec![]);
    let verified = with_graph.authenticate(&token, now(), &relevant).await.unwrap();
    // 250 groups in Graph; only the one a rule names is kept.
    assert_eq!(verified.groups, [GROUP_ONCALL]);
    with_graph
        .authenticate(
            &emulator.token_for("erin@example.com", TokenKind::id()).unwrap(),
            now(),
            &relevant,
        )
        .await
        .unwrap();
    let counters = emulator.counters();
    assert_eq!(counters.graph_member_objects, 1, "cached per user");
    assert_eq!(
        counters.token_claim_source, 0,
        "the URL in the token is never fetched"
    );

    let wrong_secret = entra_with_graph(&emulator, &work, "not-the-secret");
    let error = Authenticator::new(trust(&wrong_secret).await, vec![])
        .authenticate(&token, now(), &relevant)
        .await
        .unwrap_err();
    assert_eq!(error.code(), "groups_overage_unresolved");

    emulator.set_faults(Faults {
        graph_unavailable: true,
        ..Default::default()
    });
    let fresh = entra_with_graph(&emulator, &work, SERVER_APP_SECRET);
    let error = Authenticator::new(trust(&fresh).await, vec![])
        .authenticate(&token, now(), &relevant)
        .await
        .unwrap_err();
    assert_eq!(error.code(), "groups_overage_unresolved");
    assert!(error.to_string().contains("503"), "{error}");
}

#[tokio::test]
async fn people_pick_an_account_on_a_page_when_not_automatic() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let url = format!(
        "{}/{TENANT_ID}/oauth2/v2.0/authorize?client_id={CLI_CLIENT_ID}&response_type=code&redirect_uri=http%3A%2F%2Flocalhost%3A1%2Fcallback&code_challenge=abc&code_challenge_method=S256&state=s",
        emulator.base_url
    );
    let page = http().get(&url).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(
        html.contains("alice@example.com") && html.contains("login_hint=bob%40example.com"),
        "{html}"
    );
    // PKCE is mandatory, and redirects go to loopback only.
    let plain = url.replace("code_challenge_method=S256", "code_challenge_method=plain");
    let response = http().get(&plain).send().await.unwrap();
    assert!(
        response.headers()["location"]
            .to_str()
            .unwrap()
            .contains("error=invalid_request")
    );
    let evil = url.replace("http%3A%2F%2Flocalhost%3A1", "https%3A%2F%2Fevil.example");
    assert_eq!(http().get(&evil).send().await.unwrap().status(), 400);
}

/// Ask the test server for a certificate on `prod` with `token`.
async fn issue(env: &TestEnv, token: &str) -> (u16, serde_json::Value) {
    env.issue(token).await
}

#[tokio::test]
async fn the_server_trusts_an_entra_and_an_oidc_issuer_at_once() {
    // A second directory with keys of its own, trusted as plain OpenID
    // Connect: `sub` names people, no tenants, usernames from `name`.
    let ci = emulator(EmulatorConfig {
        alternate_keys: true,
        ..Default::default()
    })
    .await;
    let trusted = format!(
        "identity:\n  kind: entra\n  trusted_issuers:\n    - {{ name: ci, kind: oidc, issuer: \"{}\", audiences: [\"{CLI_CLIENT_ID}\"], username_claim: name }}\n",
        ci.issuer()
    );
    // A rule judges the login issuer's tokens unless it names others.
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        yaml.replace("identity:\n", &trusted).replace(
            ", roles: [os:operator] }",
            ", roles: [os:operator], issuers: [login, ci] }",
        )
    })
    .await;
    let entra = &env.emulator;
    assert!(env.config().warnings().is_empty(), "the kind is named");

    // One certificate from each, each token verified with its own issuer's
    // keys and read by its own kind.
    let (status, body) = issue(
        &env,
        &entra.token_for("bob@example.com", TokenKind::id()).unwrap(),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        body["identity"],
        json!({"issuer": entra.issuer(), "tenant": TENANT_ID,
            "subject": "b2000000-0000-4000-8000-000000000002", "username": "bob@example.com"})
    );
    let from_ci = ci.token_for("bob@example.com", TokenKind::id()).unwrap();
    let sub = talos_sso_server::identity::token::unverified_claims(&from_ci).unwrap()["sub"].clone();
    let (status, body) = issue(&env, &from_ci).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        body["identity"],
        json!({"issuer": ci.issuer(), "tenant": null, "subject": sub, "username": "Bob Oncall"})
    );
    assert_eq!(
        body["roles"],
        json!(["os:operator"]),
        "the groups it asserts count"
    );
    // ...for the rules that name it only: the admins' group id, asserted by
    // the trusted issuer, is not the login issuer's group.
    let (status, body) = issue(&env, &ci.token_for("alice@example.com", TokenKind::id()).unwrap()).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("no_matching_rule")),
        "{body}"
    );
    // A rule naming an issuer that is not configured is refused at load.
    let mut mistaken = env.config();
    if let Some(prod) = mistaken.clusters.get_mut("prod") {
        prod.rules[0].issuers = vec!["cj".into()];
    }
    let refused = mistaken.validate().unwrap_err();
    assert!(
        refused.to_string().contains(
            "clusters.prod.rules[0] names issuer `cj`, which is not configured; issuers: login, ci"
        ),
        "{refused}"
    );
    // Auditors and admins are people of the login issuer: the same groups
    // asserted by the trusted issuer make nobody an auditor.
    let auditor_from_ci = ci.token_for("sam@example.com", TokenKind::id()).unwrap();
    let response = env
        .http
        .get(format!("{}/v1/audit", env.server.base_url))
        .bearer_auth(&auditor_from_ci)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["code"], "not_an_auditor");
    let auditor = entra.token_for("sam@example.com", TokenKind::id()).unwrap();
    let response = env
        .http
        .get(format!("{}/v1/audit", env.server.base_url))
        .bearer_auth(&auditor)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        200,
        "the same person from the login issuer"
    );
    // Each issuer's own rules: tenants are Entra's business only.
    let foreign_tenant = json!({"tid": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"});
    let (status, body) = issue(
        &env,
        &ci.token_with("bob@example.com", TokenKind::id(), foreign_tenant.clone())
            .unwrap(),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = issue(
        &env,
        &entra
            .token_with("bob@example.com", TokenKind::id(), foreign_tenant)
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (401, Some("token_tenant_not_allowed"))
    );

    // Signed by one issuer's key, claiming the other's `iss`: the issuer it
    // names looks for the key (one refresh of its own key set), and refuses.
    let (ci_fetches, entra_fetches) = (ci.counters().jwks, entra.counters().jwks);
    let (status, body) = issue(
        &env,
        &entra
            .token_with("bob@example.com", TokenKind::id(), json!({"iss": ci.issuer()}))
            .unwrap(),
    )
    .await;
    assert_eq!((status, body["code"].as_str()), (401, Some("token_key_unknown")));
    assert_eq!(
        (ci.counters().jwks, entra.counters().jwks),
        (ci_fetches + 1, entra_fetches)
    );
    let (status, body) = issue(
        &env,
        &ci.token_with("bob@example.com", TokenKind::id(), json!({"iss": entra.issuer()}))
            .unwrap(),
    )
    .await;
    assert_eq!((status, body["code"].as_str()), (401, Some("token_key_unknown")));
    assert_eq!(entra.counters().jwks, entra_fetches + 1);

    // An issuer nobody configured: refused with its own code, before any
    // key work.
    let (status, body) = issue(
        &env,
        &entra
            .token_with(
                "bob@example.com",
                TokenKind::id(),
                json!({"iss": "https://unlisted.example/v2.0"}),
            )
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (401, Some("token_issuer_untrusted"))
    );

    // Records keep the token's `iss`; a refused token is read by the kind
    // of the issuer it names.
    let rows = env.server.app.audit.store().page(0, 100).await.unwrap();
    let issued: Vec<_> = rows
        .iter()
        .filter(|r| r.record.event == "certificate.issued")
        .map(|r| (r.record.issuer.clone(), r.record.tenant.clone()))
        .collect();
    assert_eq!(
        issued,
        [
            (Some(entra.issuer()), Some(TENANT_ID.to_owned())),
            (Some(ci.issuer()), None),
            (Some(ci.issuer()), None),
        ]
    );
    let cross = rows
        .iter()
        .find(|r| r.record.reason_code.as_deref() == Some("token_key_unknown"))
        .unwrap();
    assert_eq!(
        (
            cross.record.issuer.as_deref(),
            cross.record.tenant.as_deref(),
            cross.record.subject.as_deref()
        ),
        (Some(ci.issuer().as_str()), None, sub.as_str()),
        "claimed as the OIDC issuer it names reads it"
    );
    assert!(!cross.record.identity_verified);

    // `check` and `/readyz` see both issuers.
    let lines = env.server.app.authenticator.check().await.unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("trusted issuer ci: {} answers", ci.issuer()))),
        "{lines:?}"
    );
    let ready = env
        .http
        .get(format!("{}/readyz", env.server.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let ready: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(
        ready["trust_modes"],
        serde_json::json!({"prod": "cluster-ca"}),
        "{ready}"
    );
    env.finish().await;
}

#[tokio::test]
async fn a_provider_behind_a_company_authority_needs_identity_ca_file() {
    use std::sync::Arc;
    use talos_sso_server::app::SystemClock;
    use talos_sso_server::config::Config;
    use talos_sso_server::server::Server;
    use talos_sso_tests::tls_front::TlsFront;
    // The emulator (provider and Graph) behind TLS from a private CA.
    let scratch = tempfile::tempdir().unwrap();
    let (ca, cert, key) = talos_sso_tests::harness::tls_files(scratch.path());
    let front = TlsFront::bind(&cert, &key).await.unwrap();
    let emulator = emulator(EmulatorConfig {
        public_url: Some(front.url()),
        ..Default::default()
    })
    .await;
    front.forward_to(emulator.address);
    let ca_file = write_file(scratch.path(), "company-ca.pem", &ca, 0o644);

    let with_ca_file = |yaml: String, file: &std::path::Path| {
        yaml.replace(
            "identity:\n",
            &format!("identity:\n  ca_file: \"{}\"\n", file.display()),
        )
    };
    let start_error = |yaml: String| async move {
        Server::bind(Config::from_yaml(&yaml).unwrap(), Arc::new(SystemClock))
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let work = Workdir::new();
    let database = format!("sqlite://{}", work.path().join("audit.db").display());
    let yaml = talos_sso_tests::harness::config_yaml(&emulator, &work, &database);

    // Without it: the server does not start, and says why.
    let error = start_error(yaml.clone()).await;
    assert!(
        error.contains(&front.url()) && error.contains("certificate"),
        "{error}"
    );
    // A file that is not a certificate bundle is named at start.
    let error = start_error(with_ca_file(yaml, &key)).await;
    assert!(
        error.contains("identity.ca_file") && error.contains("PRIVATE KEY"),
        "{error}"
    );

    // With `identity.ca_file`: discovery, keys and Graph (erin's overage)
    // all go through the company CA.
    let env =
        TestEnv::start_with_emulator(Backend::Sqlite, emulator, |yaml| with_ca_file(yaml, &ca_file)).await;
    for user in ["bob@example.com", "erin@example.com"] {
        let token = env.emulator.token_for(user, TokenKind::id()).unwrap();
        let (status, body) = issue(&env, &token).await;
        assert_eq!(status, 201, "{user}: {body}");
    }
    assert!(
        env.emulator.counters().graph_member_objects >= 1,
        "Graph was asked"
    );
    env.finish().await;
}

/// A second tenant of the login issuer, whose administrators assign the
/// app's roles on their own copy of the app.
const PARTNER_TENANT: &str = "0b0b0b0b-1111-4222-8333-444444444444";

/// `yaml` with `from` replaced by `to`, which must be there.
fn replaced(yaml: &str, from: &str, to: &str) -> String {
    assert!(yaml.contains(from), "`{from}` is not in the configuration");
    yaml.replace(from, to)
}

/// The test configuration with the partner tenant allowed too (the login
/// issuer as Entra's multi-tenant template), and `Talos.Reader` (rule),
/// `Talos.Auditor` (auditors) and `Talos.Admin` (admins) pinned to the
/// home tenant.
fn two_tenants(yaml: String) -> String {
    let role = |r: &str| format!("\"{TENANT_ID}/{r}\"");
    let yaml = replaced(&yaml, &format!("/{TENANT_ID}/v2.0\""), "/{tenantid}/v2.0\"");
    let yaml = replaced(
        &yaml,
        &format!("allowed_tenants: [\"{TENANT_ID}\"]"),
        &format!("allowed_tenants: [\"{TENANT_ID}\", \"{PARTNER_TENANT}\"]"),
    );
    let yaml = replaced(
        &yaml,
        "app_roles: [\"Talos.Reader\"]",
        &format!("app_roles: [{}]", role("Talos.Reader")),
    );
    let yaml = replaced(
        &yaml,
        &format!("auditors: {{ groups: [\"{GROUP_SECURITY}\"] }}"),
        &format!(
            "auditors: {{ groups: [\"{GROUP_SECURITY}\"], app_roles: [{}] }}",
            role("Talos.Auditor")
        ),
    );
    replaced(
        &yaml,
        &format!("admins: {{ groups: [\"{GROUP_PLATFORM_ADMINS}\"] }}"),
        &format!(
            "admins: {{ groups: [\"{GROUP_PLATFORM_ADMINS}\"], app_roles: [{}] }}",
            role("Talos.Admin")
        ),
    )
}

#[tokio::test]
async fn an_app_role_counts_only_in_the_tenant_that_assigned_it() {
    let env = TestEnv::start_from_file(Backend::Sqlite, two_tenants).await;
    let entra = &env.emulator;
    // The same person and role values, assigned in either tenant.
    let token = |tenant: &str, user: &str, roles: &[&str]| {
        entra
            .token_with(
                user,
                TokenKind::id(),
                json!({"tid": tenant, "iss": format!("{}/{tenant}/v2.0", entra.base_url), "roles": roles}),
            )
            .unwrap()
    };
    let get = |path: &str, token: String| {
        let request = env
            .http
            .get(format!("{}{path}", env.server.base_url))
            .bearer_auth(token);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            (status, body["code"].as_str().map(str::to_owned))
        }
    };

    // A certificate by app role: the home tenant's assignment only.
    let (status, body) = issue(&env, &token(TENANT_ID, "carol@example.com", &["Talos.Reader"])).await;
    assert_eq!((status, &body["roles"]), (201, &json!(["os:reader"])), "{body}");
    let (status, body) = issue(
        &env,
        &token(PARTNER_TENANT, "carol@example.com", &["Talos.Reader"]),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("no_matching_rule")),
        "{body}"
    );
    assert!(
        body.to_string()
            .contains(&format!("app role Talos.Reader in tenant {TENANT_ID}")),
        "what would help names the tenant: {body}"
    );

    // Auditors and admins by app role, people and applications alike.
    let auditor = |tenant| token(tenant, "dave@example.com", &["Talos.Auditor"]);
    let admin = |tenant| token(tenant, "dave@example.com", &["Talos.Admin"]);
    assert_eq!(get("/v1/audit", auditor(TENANT_ID)).await, (200, None));
    assert_eq!(
        get("/v1/audit", auditor(PARTNER_TENANT)).await,
        (403, Some("not_an_auditor".into()))
    );
    assert_eq!(get("/v1/deny", admin(TENANT_ID)).await, (200, None));
    assert_eq!(
        get("/v1/deny", admin(PARTNER_TENANT)).await,
        (403, Some("not_an_admin".into()))
    );
    let collector = |tenant: &str| {
        entra
            .app_token_with(
                SIEM_CLIENT_ID,
                json!({"tid": tenant, "iss": format!("{}/{tenant}/v2.0", entra.base_url)}),
            )
            .unwrap()
    };
    assert_eq!(get("/v1/audit", collector(TENANT_ID)).await, (200, None));
    assert_eq!(
        get("/v1/audit", collector(PARTNER_TENANT)).await,
        (403, Some("not_an_auditor".into()))
    );

    // A role alone, with two tenants allowed: refused by a reload (the
    // running configuration keeps serving), by `check`, and at start.
    let file = env.config_file();
    let pinned = std::fs::read_to_string(&file).unwrap();
    let says =
        "auditors.app_roles: app role `Talos.Auditor` names no tenant, but issuer `login` allows several";
    let spelling = format!("`{TENANT_ID}/Talos.Auditor`");
    std::fs::write(
        &file,
        replaced(
            &pinned,
            &format!("\"{TENANT_ID}/Talos.Auditor\""),
            "\"Talos.Auditor\"",
        ),
    )
    .unwrap();
    let refused = env
        .server
        .app
        .reload(talos_sso_server::app::reload::Trigger::Signal)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains(says) && refused.contains(&spelling), "{refused}");
    assert_eq!(
        get("/v1/audit", auditor(PARTNER_TENANT)).await,
        (403, Some("not_an_auditor".into()))
    );
    assert_eq!(get("/v1/audit", auditor(TENANT_ID)).await, (200, None));
    let path = file.to_str().unwrap();
    let checked = server_cli(&["check", "--config", path]).await.unwrap_err();
    assert!(checked.contains(says), "{checked}");
    let started = server_cli(&["serve", "--config", path]).await.unwrap_err();
    assert!(started.contains(says), "{started}");
    // A rule's role alone too, by `check` and at start (the rule is
    // checked with the cluster's policy, after `auditors` and `admins`).
    let unpinned = replaced(
        &pinned,
        &format!("app_roles: [\"{TENANT_ID}/Talos.Reader\"]"),
        "app_roles: [\"Talos.Reader\"]",
    );
    std::fs::write(&file, unpinned).unwrap();
    let says = "clusters.prod.rules[2].app_roles: app role `Talos.Reader` names no tenant, but issuer `login` allows several";
    let spelling = format!("`{TENANT_ID}/Talos.Reader`");
    let checked = server_cli(&["check", "--config", path]).await.unwrap_err();
    assert!(checked.contains(says) && checked.contains(&spelling), "{checked}");
    let started = server_cli(&["serve", "--config", path]).await.unwrap_err();
    assert!(started.contains(says) && started.contains(&spelling), "{started}");
    env.finish().await;
}
