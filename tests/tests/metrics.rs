//! The metrics as an operator reads them from a running server: what each
//! counts, that no request can add a label value, and the metrics on a
//! listener of their own (`metrics.listen`). The TLS expiry is checked with
//! the TLS reload (`server::serves_tls_from_the_configured_certificate`),
//! rate-limit refusals with the limits
//! (`server::rate_limits_apply_per_address_and_per_identity`).

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Value, json};
use talos_sso::key::ClientKey;
use talos_sso_server::app::SystemClock;
use talos_sso_server::config::Config;
use talos_sso_server::server::Server;
use talos_sso_tests::emulator::{Faults, TokenKind};
use talos_sso_tests::harness::{Backend, TestEnv, config_yaml};

/// The lines of `text` that start with `prefix`, sorted.
fn lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut found: Vec<&str> = text.lines().filter(|l| l.starts_with(prefix)).collect();
    found.sort_unstable();
    found
}

/// The value of the one sample `name` (with its labels, as written).
fn sample(text: &str, name: &str) -> f64 {
    let prefix = format!("{name} ");
    let values: Vec<f64> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(values.len(), 1, "{name} in\n{text}");
    values[0]
}

/// `POST /v1/certificates` with `token` and `body`: the status and code.
async fn request(env: &TestEnv, token: &str, body: Value) -> (u16, Value) {
    let response = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

fn csr() -> String {
    ClientKey::generate().unwrap().csr_pem().unwrap()
}

#[tokio::test]
async fn a_certificate_counts_once_and_each_role_it_grants_once() {
    let env = TestEnv::start(Backend::Sqlite).await;
    // Bob is on call (os:operator) and, in these tokens, a reader by app
    // role too: both are his default roles.
    for _ in 0..2 {
        let token = env
            .emulator
            .token_with(
                "bob@example.com",
                TokenKind::id(),
                json!({"roles": ["Talos.Reader"]}),
            )
            .unwrap();
        let (status, body) = request(&env, &token, json!({"cluster": "prod", "csr": csr()})).await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["roles"], json!(["os:operator", "os:reader"]));
    }
    // A cluster nobody configured is counted as `unknown`, never by name.
    let token = env
        .emulator
        .token_for("bob@example.com", TokenKind::id())
        .unwrap();
    let (status, body) = request(&env, &token, json!({"cluster": "prod-typo", "csr": csr()})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("cluster_unknown")),
        "{body}"
    );

    let text = env.metrics().await;
    assert_eq!(
        lines(&text, "talos_sso_certificates_issued"),
        [r#"talos_sso_certificates_issued_total{cluster="prod"} 2"#],
        "{text}"
    );
    assert_eq!(
        lines(&text, "talos_sso_role_grants"),
        [
            r#"talos_sso_role_grants_total{cluster="prod",role="os:operator"} 2"#,
            r#"talos_sso_role_grants_total{cluster="prod",role="os:reader"} 2"#,
        ],
        "{text}"
    );
    assert_eq!(
        lines(&text, "talos_sso_requests_denied"),
        [r#"talos_sso_requests_denied_total{cluster="unknown",reason="cluster_unknown"} 1"#],
        "{text}"
    );
    assert!(!text.contains("prod-typo"), "{text}");
    assert_eq!(sample(&text, "talos_sso_issuance_duration_seconds_count"), 3.0);
    assert_eq!(
        sample(
            &text,
            r#"talos_sso_http_request_duration_seconds_count{route="/v1/certificates",status_class="2xx"}"#
        ),
        2.0
    );
    assert_eq!(
        sample(
            &text,
            r#"talos_sso_http_request_duration_seconds_count{route="/v1/certificates",status_class="4xx"}"#
        ),
        1.0
    );
    // Every record went through a batch, and each batch was timed.
    let stored = env.server.app.audit.store().page(0, 100).await.unwrap().len();
    assert_eq!(stored, 3);
    assert_eq!(sample(&text, "talos_sso_audit_batch_records_sum"), 3.0);
    let batches = sample(&text, "talos_sso_audit_batch_records_count");
    assert!((1.0..=3.0).contains(&batches), "{text}");
    assert_eq!(
        sample(&text, "talos_sso_audit_commit_duration_seconds_count"),
        batches
    );
    // The readiness checks, the build, the provider's keys.
    assert_eq!(sample(&text, "talos_sso_ready"), 1.0);
    assert!(
        text.contains(&format!(
            "talos_sso_build_info{{version=\"{}\",revision=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION"),
            talos_sso_server::REVISION
        )),
        "{text}"
    );
    let age = sample(
        &text,
        &format!(
            "talos_sso_identity_provider_keys_age_seconds{{issuer=\"{}\"}}",
            env.emulator.issuer()
        ),
    );
    assert!((0.0..60.0).contains(&age), "{text}");
    assert_eq!(
        lines(&text, "talos_sso_graph_requests"),
        [
            r#"talos_sso_graph_requests_total{result="failed"} 0"#,
            r#"talos_sso_graph_requests_total{result="ok"} 0"#,
        ],
        "{text}"
    );
    env.finish().await;
}

/// `/readyz`'s checks at each scrape: the database gone, not ready.
#[tokio::test]
async fn readiness_is_evaluated_at_each_scrape() {
    let env = TestEnv::start(Backend::Sqlite).await;
    assert_eq!(sample(&env.metrics().await, "talos_sso_ready"), 1.0);
    env.server.app.audit.store().close().await;
    // The answer is reused for a moment (so that probes cannot flood the
    // database): wait it out.
    tokio::time::sleep(talos_sso_server::http::status::READINESS_FRESH_FOR * 2).await;
    let readyz = env
        .http
        .get(format!("{}/readyz", env.server.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(readyz.status(), 503);
    assert_eq!(sample(&env.metrics().await, "talos_sso_ready"), 0.0);
    env.finish().await;
}

#[tokio::test]
async fn graph_lookups_are_counted_by_result() {
    let env = TestEnv::start(Backend::Sqlite).await;
    // Erin is in too many groups for her token: they come from Graph.
    let erin = || {
        env.emulator
            .token_for("erin@example.com", TokenKind::id())
            .unwrap()
    };
    env.emulator.set_faults(Faults {
        graph_unavailable: true,
        ..Default::default()
    });
    let (status, body) = request(&env, &erin(), json!({"cluster": "prod", "csr": csr()})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("groups_overage_unresolved"))
    );
    env.emulator.set_faults(Faults::default());
    let (status, _) = request(&env, &erin(), json!({"cluster": "prod", "csr": csr()})).await;
    assert_eq!(status, 201);
    // Her groups are cached now: no third lookup.
    let (status, _) = request(&env, &erin(), json!({"cluster": "prod", "csr": csr()})).await;
    assert_eq!(status, 201);
    let text = env.metrics().await;
    assert_eq!(
        lines(&text, "talos_sso_graph_requests"),
        [
            r#"talos_sso_graph_requests_total{result="failed"} 1"#,
            r#"talos_sso_graph_requests_total{result="ok"} 1"#,
        ],
        "{text}"
    );
    assert_eq!(
        env.emulator.counters().graph_member_objects,
        2,
        "the cached answer asked nobody"
    );
    env.finish().await;
}

/// Whatever path, method or query a request names, the route label is one
/// of the router's templates or `unmatched`.
#[tokio::test]
async fn requests_to_unknown_paths_add_no_route_label() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let base = &env.server.base_url;
    let marker = format!("x{}", talos_sso_server::random::random_hex(8).unwrap());
    let unknown = [
        format!("{base}/{marker}"),
        format!("{base}/v1/{marker}"),
        format!("{base}/v1/certificates/{marker}"),
        format!("{base}/%7B{marker}%7D"),
        format!("{base}/v1/audit/{marker}/../x"),
        format!("{base}/metrics/{marker}"),
    ];
    for url in &unknown {
        let answer = env.http.get(url).send().await.unwrap();
        assert_eq!(answer.status(), 404, "{url}");
    }
    let posted = env
        .http
        .post(format!("{base}/{marker}?route={marker}"))
        .body(marker.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 404);
    // A known path with a method it does not take is that route's.
    let deleted = env.http.delete(format!("{base}/v1/info")).send().await.unwrap();
    assert_eq!(deleted.status(), 405);
    let info = env
        .http
        .get(format!("{base}/v1/info?{marker}=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(info.status(), 200);

    let text = env.metrics().await;
    assert!(!text.contains(&marker), "{text}");
    let routes: BTreeSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("talos_sso_http_request_duration_seconds_count{"))
        .filter_map(|l| l.split("route=\"").nth(1)?.split('"').next())
        .collect();
    let templates = [
        "/v1/info",
        "/v1/certificates",
        "/v1/audit",
        "/v1/audit/verify",
        "/v1/audit/checkpoint",
        talos_sso_api::feed::STREAM_PATH,
        "/v1/deny",
        "/healthz",
        "/readyz",
        "/metrics",
        "unmatched",
    ];
    assert!(routes.iter().all(|r| templates.contains(r)), "{routes:?}");
    assert_eq!(
        sample(
            &text,
            r#"talos_sso_http_request_duration_seconds_count{route="unmatched",status_class="4xx"}"#
        ),
        (unknown.len() + 1) as f64
    );
    assert_eq!(
        lines(
            &text,
            r#"talos_sso_http_request_duration_seconds_count{route="/v1/info""#
        ),
        [
            r#"talos_sso_http_request_duration_seconds_count{route="/v1/info",status_class="2xx"} 1"#,
            r#"talos_sso_http_request_duration_seconds_count{route="/v1/info",status_class="4xx"} 1"#,
        ],
        "{text}"
    );
    env.finish().await;
}

/// The expiry with TLS, and after a reload:
/// `server::serves_tls_from_the_configured_certificate`.
#[tokio::test]
async fn plain_http_has_no_tls_expiry() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let text = env.metrics().await;
    assert!(!text.contains("talos_sso_tls_certificate"), "{text}");
    env.finish().await;
}

#[tokio::test]
async fn metrics_listen_serves_the_metrics_alone_and_the_main_port_not_at_all() {
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        format!("{yaml}metrics: {{ listen: \"127.0.0.1:0\" }}\n")
    })
    .await;
    let metrics_url = env.server.metrics_url.clone().expect("a metrics listener");
    assert_ne!(metrics_url, env.server.base_url);
    let get = |url: String| {
        let http = env.http.clone();
        async move { http.get(url).send().await.unwrap() }
    };
    // reqwest asks for `*/*`: the classic text format.
    let scraped = get(format!("{metrics_url}/metrics")).await;
    assert_eq!(scraped.status(), 200);
    assert_eq!(
        scraped.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = scraped.text().await.unwrap();
    assert!(
        text.contains("talos_sso_build_info{") && !text.contains("# EOF"),
        "{text}"
    );
    // A scraper that asks for OpenMetrics gets it.
    let scraped = env
        .http
        .get(format!("{metrics_url}/metrics"))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap();
    assert_eq!(
        scraped.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = scraped.text().await.unwrap();
    assert!(
        text.contains("talos_sso_build_info{") && text.ends_with("# EOF\n"),
        "{text}"
    );
    // Only /metrics there, and GET only.
    for path in ["/v1/info", "/healthz", "/readyz", "/metrics/x"] {
        assert_eq!(get(format!("{metrics_url}{path}")).await.status(), 404, "{path}");
    }
    let posted = env
        .http
        .post(format!("{metrics_url}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 405);
    // The main port serves the API, and no metrics.
    assert_eq!(
        get(format!("{}/healthz", env.server.base_url)).await.status(),
        200
    );
    let main = get(format!("{}/metrics", env.server.base_url)).await;
    assert_eq!(main.status(), 404);
    let problem: Value = main.json().await.unwrap();
    assert_eq!(problem["code"], "not_found");
    let text = env.metrics().await;
    assert!(
        text.contains(
            "talos_sso_http_request_duration_seconds_count{route=\"/metrics\",status_class=\"2xx\"} 2\n"
        ),
        "{text}"
    );
    // Gone with the server.
    let address = metrics_url.trim_start_matches("http://").to_owned();
    env.finish().await;
    assert!(tokio::net::TcpStream::connect(&address).await.is_err());
}

#[tokio::test]
async fn metrics_listen_comes_from_the_file_or_the_environment_and_is_checked() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let yaml = config_yaml(&env.emulator, &env.work, &env.database_url);
    let file = env.work.path().join("server.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let variable = (
        "TALOS_SSO__METRICS__LISTEN".to_owned(),
        "127.0.0.1:9464".to_owned(),
    );
    let config = Config::load_with_env(&file, [variable]).unwrap();
    assert_eq!(config.metrics.listen, Some("127.0.0.1:9464".parse().unwrap()));
    let unset = Config::load_with_env(&file, []).unwrap();
    assert_eq!(unset.metrics.listen, None);
    let unknown = Config::from_yaml(&format!("{yaml}metrics: {{ port: 9464 }}\n"))
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("unknown field `port`"), "{unknown}");
    let same = Config::from_yaml(&format!(
        "{}metrics: {{ listen: \"127.0.0.1:8443\" }}\n",
        yaml.replace("listen: \"127.0.0.1:0\"", "listen: \"127.0.0.1:8443\"")
    ))
    .unwrap_err()
    .to_string();
    assert!(
        same.contains("metrics.listen is the same address as listen"),
        "{same}"
    );

    // A metrics address someone else holds stops the start, named.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let config = Config::from_yaml(&format!("{yaml}metrics: {{ listen: \"{address}\" }}\n")).unwrap();
    let error = Server::bind(config, Arc::new(SystemClock))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(&format!("cannot listen on {address}: ")),
        "{error}"
    );
    env.finish().await;
}
