//! The CI jobs (deploy/examples/github-actions, deploy/examples/gitlab-ci):
//! their steps as the runners run them, with the runners' tokens.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde_json::{Value as Json, json};
use talos_sso_server::audit::event;
use talos_sso_tests::emulator::TokenKind;
use talos_sso_tests::standin_apid::proto;
use talos_sso_tests::workload_tokens::{Alg, GITHUB_ISSUER, WorkloadIssuer, github_claims, gitlab_claims};

use super::{
    Cluster, EXAMPLE_SERVER, Runner, assert_issued, example_config, examples, mapping_strings, text,
    with_server, yaml,
};

/// What the runner gives the job to ask for its token with.
const REQUEST_TOKEN: &str = "runner-request-token";

/// The GitHub runner's token endpoint: `GET ?audience=AUD` with the
/// request token as bearer answers `{"value": token}`, minted for AUD.
async fn runner_endpoint(issuer: Arc<WorkloadIssuer>, audiences: Arc<Mutex<Vec<String>>>) -> SocketAddr {
    use axum::extract::{Query, State};
    use axum::http::{HeaderMap, StatusCode};

    type Shared = (Arc<WorkloadIssuer>, Arc<Mutex<Vec<String>>>);
    async fn token(
        State((issuer, audiences)): State<Shared>,
        headers: HeaderMap,
        Query(query): Query<BTreeMap<String, String>>,
    ) -> Result<axum::Json<Json>, StatusCode> {
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if bearer != format!("bearer {REQUEST_TOKEN}")
            || query.get("api-version").map(String::as_str) != Some("2.0")
        {
            return Err(StatusCode::UNAUTHORIZED);
        }
        let audience = query.get("audience").cloned().ok_or(StatusCode::BAD_REQUEST)?;
        audiences.lock().unwrap().push(audience.clone());
        let token = tokio::task::spawn_blocking(move || {
            let claims = github_claims(
                &issuer,
                &audience,
                "org/infra",
                "refs/tags/v1.2.0",
                Some("production"),
            );
            issuer.sign(&claims)
        })
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
        Ok(axum::Json(json!({ "count": 1, "value": token })))
    }

    let app = axum::Router::new()
        .route("/token", axum::routing::get(token))
        .with_state((issuer, audiences));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// The GitHub Actions job: protected environment, `id-token: write`, its
/// steps after the install one, as the runner runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_github_actions_job_logs_in_with_the_runners_token() {
    let dir = examples().join("github-actions");
    let workflow = yaml(&dir.join("talos.yml"));
    let job = &workflow["jobs"]["talos"];
    assert_eq!(text(&job["environment"]), "production");
    assert_eq!(text(&job["permissions"]["id-token"]), "write");
    let steps = job["steps"].as_sequence().unwrap();
    let (install, steps) = steps.split_first().unwrap();
    assert!(text(&install["name"]).starts_with("Install"), "{install:?}");
    assert!(
        steps
            .iter()
            .any(|s| text(&s["run"]).contains("talos-sso login --github-actions")),
        "{steps:?}"
    );

    let issuer = Arc::new(WorkloadIssuer::new(GITHUB_ISSUER, Alg::Rs256));
    let cluster = Cluster::start(&example_config(&dir, &issuer), &issuer.jwks_file).await;
    let runner = Runner::new().await;
    let audiences = Arc::new(Mutex::new(Vec::new()));
    let endpoint = runner_endpoint(issuer.clone(), audiences.clone()).await;
    let mut vars = with_server(mapping_strings(&job["env"]), &cluster);
    vars.insert(
        "ACTIONS_ID_TOKEN_REQUEST_URL".into(),
        format!("http://{endpoint}/token?api-version=2.0"),
    );
    vars.insert("ACTIONS_ID_TOKEN_REQUEST_TOKEN".into(), REQUEST_TOKEN.into());
    for step in steps {
        let mut step_vars = vars.clone();
        step_vars.extend(mapping_strings(&step["env"]));
        let script = runner.dir.path().join("step.sh");
        std::fs::write(&script, text(&step["run"])).unwrap();
        // GitHub's `bash` shell on Linux.
        let args = [
            "--noprofile",
            "--norc",
            "-eo",
            "pipefail",
            script.to_str().unwrap(),
        ];
        let (code, out, err) = runner.run("bash", &args, &step_vars).await;
        assert_eq!(code, 0, "{}: {out}{err}", text(&step["name"]));
    }
    assert_eq!(
        *audiences.lock().unwrap(),
        [EXAMPLE_SERVER],
        "the step asks for the audience the issuer accepts"
    );

    let cn = "github-actions:org/infra";
    let call = cluster.the_call().await;
    assert_eq!(call.method, proto::VERSION);
    assert!(call.authorized, "{call:#?}");
    assert_eq!(call.certificate_common_name.as_deref(), Some(cn));
    assert_eq!(call.certificate_roles, ["os:admin"]);
    let workload = assert_issued(
        &cluster,
        cn,
        &["os:admin"],
        "github-actions",
        "github",
        "infra-deploy",
    )
    .await;
    assert_eq!(workload["claims"]["ref"], "refs/tags/v1.2.0");
    assert_eq!(workload["claims"]["environment"], "production");
    assert_eq!(workload["claims"]["repository_id"], "74");
    // The rule's ttl (10m), not the cluster's (5m).
    let issued = cluster.records(event::CERTIFICATE_ISSUED).await;
    let record = &issued[0].record;
    let lifetime = record.not_after.unwrap() - record.not_before.unwrap();
    assert_eq!(
        lifetime.whole_minutes(),
        10 + 5,
        "ttl plus the clock skew allowance: {lifetime}"
    );
    cluster.env.finish().await;
}

/// The GitLab CI job: its `id_tokens` token for the audience it names, its
/// `script` lines in one shell as the runner runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gitlab_ci_job_logs_in_with_its_id_token() {
    let dir = examples().join("gitlab-ci");
    let pipeline = yaml(&dir.join(".gitlab-ci.yml"));
    let job = &pipeline["reboot-node"];
    assert_eq!(text(&job["environment"]["name"]), "production");
    let audience = text(&job["id_tokens"]["TALOS_SSO_TOKEN"]["aud"]);
    let lines = |key: &str| -> String {
        job[key]
            .as_sequence()
            .unwrap()
            .iter()
            .map(text)
            .collect::<Vec<_>>()
            .join("\n")
    };

    let issuer = WorkloadIssuer::new("https://gitlab.example.com", Alg::Es256);
    let cluster = Cluster::start(&example_config(&dir, &issuer), &issuer.jwks_file).await;
    let runner = Runner::new().await;
    let mut vars = with_server(mapping_strings(&job["variables"]), &cluster);
    let token = issuer.sign(&gitlab_job_claims(&issuer, audience));
    vars.insert("TALOS_SSO_TOKEN".into(), token.clone());
    // The runner's shell: bash, stopping at the first failing line.
    let args = ["--noprofile", "--norc", "-eo", "pipefail", "-c"];
    let script = lines("script");
    let (code, out, err) = runner
        .run("bash", &[&args[..], &[script.as_str()]].concat(), &vars)
        .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        !out.contains(&token) && !err.contains(&token),
        "the token is never shown"
    );
    let talosconfig = runner.home.join(".talos/config");
    assert!(talosconfig.exists());
    let after = lines("after_script");
    let (code, out, err) = runner
        .run("bash", &[&args[..], &[after.as_str()]].concat(), &vars)
        .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(!talosconfig.exists(), "after_script removes the certificate");

    let cn = "gitlab-ci:platform/talos";
    let call = cluster.the_call().await;
    assert_eq!(call.method, proto::REBOOT);
    assert!(call.authorized, "{call:#?}");
    assert_eq!(call.certificate_common_name.as_deref(), Some(cn));
    assert_eq!(call.certificate_roles, ["os:operator"]);
    assert_eq!(call.metadata_values("node"), ["cp-01.prod.internal"]);
    let workload = assert_issued(
        &cluster,
        cn,
        &["os:operator"],
        "gitlab-ci",
        "gitlab",
        "talos-maintenance",
    )
    .await;
    assert_eq!(workload["claims"]["environment_protected"], "true");
    assert_eq!(workload["claims"]["ref_protected"], "true");
    let recorded: Vec<Json> = std::fs::read_to_string(&runner.calls)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0]["code"], 0);

    // The deny list names the project, as the guide says: the same job
    // with a new token gets no certificate.
    let admin = cluster
        .env
        .emulator
        .token_for("alice@example.com", TokenKind::id())
        .unwrap();
    let response = cluster
        .env
        .http
        .post(format!("{}/v1/deny", cluster.env.server.base_url))
        .bearer_auth(admin)
        .json(&json!({"subject": "gitlab:project_id:20", "reason": "leaked pipeline"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201, "{:?}", response.text().await);
    vars.insert(
        "TALOS_SSO_TOKEN".into(),
        issuer.sign(&gitlab_job_claims(&issuer, audience)),
    );
    let (code, out, err) = runner
        .run("bash", &[&args[..], &[script.as_str()]].concat(), &vars)
        .await;
    assert_eq!(code, 5, "a refusal: {out}{err}");
    let denied = cluster.records(event::CERTIFICATE_DENIED).await;
    let [refusal] = denied.as_slice() else {
        panic!("one refusal: {denied:#?}");
    };
    assert_eq!(refusal.record.reason_code.as_deref(), Some("identity_denied"));
    assert_eq!(refusal.record.subject.as_deref(), Some("gitlab:project_id:20"));
    assert_eq!(cluster.apid.calls().len(), 1, "no second call");
    cluster.env.finish().await;
}

/// A token of the GitLab job, with a `jti` of its own.
fn gitlab_job_claims(issuer: &WorkloadIssuer, audience: &str) -> Json {
    gitlab_claims(
        issuer,
        audience,
        "platform/talos",
        "main",
        true,
        Some(("production", true)),
    )
}
