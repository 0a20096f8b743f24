//! Workload identity end to end: a real server trusting a Kubernetes
//! cluster, GitHub Actions and a GitLab that also signs its people's
//! tokens, with workload rules per cluster; tokens made by PyJWT in the
//! shapes each issuer documents (tests/src/workload_tokens.rs).
//!
//! Each kind is admitted by its rule and refused by a near miss, and the
//! refusal names no rule and no claim (the record does). Tokens are
//! checked as every token is (audience, expiry, signature, issuer), a
//! workload token mints up to its issuer's cap, people's and workloads'
//! rules never judge each other's tokens, and the deny list names a
//! workload subject.

use std::net::SocketAddr;

use serde_json::{Value, json};
use talos_sso::key::ClientKey;
use talos_sso_server::audit::StoredRecord;
use talos_sso_server::x509::ParsedCertificate;
use talos_sso_tests::emulator::TokenKind;
use talos_sso_tests::harness::{Answer, Backend, TestEnv, config_yaml, server_cli};
use talos_sso_tests::tls_front::TlsFront;
use talos_sso_tests::workload_tokens::{
    Alg, GITHUB_ISSUER, WorkloadIssuer, github_claims, gitlab_claims, kubernetes_claims, patched,
};

/// The audience every workload issuer here accepts.
const AUDIENCE: &str = "https://talos-sso.example.com";

/// The Kubernetes service-account issuer.
const K8S_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

on_both_stores!(
    each_kind_is_admitted_by_its_rule_and_refused_by_a_near_miss,
    a_workload_token_mints_up_to_its_cap_and_is_checked_as_every_token,
);

/// The three workload issuers, and GitHub's discovery served from here.
struct Issuers {
    k8s: WorkloadIssuer,
    github: WorkloadIssuer,
    gitlab: WorkloadIssuer,
    _discovery: tokio::task::JoinHandle<()>,
    discovery_url: String,
}

impl Issuers {
    /// GitLab's issuer is the login issuer's URL: one GitLab signs both its
    /// people's and its jobs' tokens, told apart by their audience.
    async fn start(gitlab_issuer: &str) -> Self {
        let github = WorkloadIssuer::new(GITHUB_ISSUER, Alg::Rs256);
        let (discovery_url, discovery) = serve_discovery(&github).await;
        Self {
            k8s: WorkloadIssuer::new(K8S_ISSUER, Alg::Es256),
            github,
            gitlab: WorkloadIssuer::new(gitlab_issuer, Alg::Rs256),
            _discovery: discovery,
            discovery_url,
        }
    }
}

/// GitHub's discovery document as GitHub serves it (no authorization or
/// token endpoint: nobody logs in there), and its key set.
async fn serve_discovery(github: &WorkloadIssuer) -> (String, tokio::task::JoinHandle<()>) {
    serve_discovery_at(github, None).await
}

/// `issuer`'s discovery document and key set, served over plain HTTP; the
/// document names the key set at `public` (a TLS front) when given.
async fn serve_discovery_at(
    issuer: &WorkloadIssuer,
    public: Option<(&TlsFront, &str)>,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address: SocketAddr = listener.local_addr().unwrap();
    let base = match public {
        Some((front, url)) => {
            front.forward_to(address);
            url.trim_end_matches('/').to_owned()
        }
        None => format!("http://{address}"),
    };
    let jwks = std::fs::read_to_string(&issuer.jwks_file).unwrap();
    let document = json!({
        "issuer": issuer.issuer,
        "jwks_uri": format!("{base}/.well-known/jwks"),
        "subject_types_supported": ["public", "pairwise"],
        "response_types_supported": ["id_token"],
        "claims_supported": ["sub", "aud", "exp", "iat", "iss", "jti", "nbf", "ref", "repository",
            "repository_id", "repository_owner", "environment", "job_workflow_ref", "runner_environment"],
        "id_token_signing_alg_values_supported": ["RS256"],
        "scopes_supported": ["openid"]
    })
    .to_string();
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            axum::routing::get(move || std::future::ready(document.clone())),
        )
        .route(
            "/.well-known/jwks",
            axum::routing::get(move || std::future::ready(jwks.clone())),
        );
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("{base}/.well-known/openid-configuration"), task)
}

/// A Kubernetes API server's discovery is served with a certificate of the
/// cluster's own CA: the issuer's `ca_file` is what reaches it, and without
/// it the server does not start, and says which issuer it could not reach.
#[tokio::test]
async fn a_kubernetes_issuer_behind_its_own_ca_is_reached_with_its_ca_file() {
    let scratch = tempfile::tempdir().unwrap();
    let (ca, cert, key) = talos_sso_tests::harness::tls_files(scratch.path());
    let front = TlsFront::bind(&cert, &key).await.unwrap();
    let k8s = WorkloadIssuer::new(K8S_ISSUER, Alg::Rs256);
    let url = front.url();
    let (discovery, _task) = serve_discovery_at(&k8s, Some((&front, &url))).await;
    let ca_file = scratch.path().join("cluster-ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let trusted = |with_ca: bool| {
        let ca = if with_ca {
            format!(", ca_file: \"{}\"", ca_file.display())
        } else {
            String::new()
        };
        format!(
            "identity:\n  trusted_issuers:\n    - {{ name: k8s-prod, kind: kubernetes, issuer: \"{K8S_ISSUER}\", \
             discovery_url: \"{discovery}\", audiences: [\"{AUDIENCE}\"]{ca} }}\n"
        )
    };
    let rules = "    workloads:\n      - { name: etcd-backup, issuer: k8s-prod, claims: { namespace: backup }, roles: [os:etcd:backup] }\n    rules:\n";

    let work = talos_sso_tests::harness::Workdir::new();
    let emulator = talos_sso_tests::emulator::EmulatorHandle::start(Default::default())
        .await
        .unwrap();
    let database = format!("sqlite://{}", work.path().join("audit.db").display());
    let yaml = config_yaml(&emulator, &work, &database)
        .replacen("identity:\n", &trusted(false), 1)
        .replacen("    rules:\n", rules, 1);
    let refused = talos_sso_server::server::Server::bind(
        talos_sso_server::config::Config::from_yaml(&yaml).unwrap(),
        std::sync::Arc::new(talos_sso_server::app::SystemClock),
    )
    .await
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(refused.contains("issuer `k8s-prod`"), "{refused}");

    let env = TestEnv::start_with_emulator(Backend::Sqlite, emulator, |yaml| {
        yaml.replacen("identity:\n", &trusted(true), 1)
            .replacen("    rules:\n", rules, 1)
    })
    .await;
    let token = k8s.sign(&kubernetes_claims(&k8s, AUDIENCE, "backup", "talos-backup"));
    let answer = ask(&env, &token, &[]).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    env.finish().await;
}

/// The server's configuration with the workload issuers and rules added.
fn with_workloads(yaml: String, issuers: &Issuers, github_cap: u32) -> String {
    let trusted = format!(
        r#"identity:
  trusted_issuers:
    - {{ name: k8s-prod, kind: kubernetes, issuer: "{k8s}", jwks_file: "{k8s_jwks}", audiences: ["{AUDIENCE}"] }}
    - {{ name: github, kind: github-actions, issuer: "{GITHUB_ISSUER}", discovery_url: "{discovery}", audiences: ["{AUDIENCE}"], certificates_per_token: {github_cap} }}
    - {{ name: gitlab, kind: gitlab-ci, issuer: "{gitlab}", jwks_file: "{gitlab_jwks}", audiences: ["{AUDIENCE}"] }}
"#,
        k8s = issuers.k8s.issuer,
        k8s_jwks = issuers.k8s.jwks_file.display(),
        discovery = issuers.discovery_url,
        gitlab = issuers.gitlab.issuer,
        gitlab_jwks = issuers.gitlab.jwks_file.display(),
    );
    let workloads = r#"    workloads:
      - { name: etcd-backup, issuer: k8s-prod, claims: { namespace: backup, service_account: talos-backup }, roles: [os:etcd:backup] }
      - { name: infra-release, issuer: github, claims: { repository: org/infra, environment: production, ref: "refs/tags/v*" }, roles: [os:admin], ttl: 10m }
      - { name: gitlab-deploy, issuer: gitlab, claims: { project_id: "20", ref_protected: "true" }, roles: [os:operator] }
    rules:
      - { claims: { repository: org/infra }, roles: [os:reader] }
"#;
    let examples = r#"policy_examples:
  - { description: "releases of org/infra administer prod", cluster: prod, issuer: github, claims: { repository: org/infra, environment: production, ref: refs/tags/v1.4.0 }, expect_roles: [os:admin] }
  - { description: "a branch of org/infra gets nothing", cluster: prod, issuer: github, claims: { repository: org/infra, environment: production, ref: refs/heads/main }, expect_denied: workload_not_admitted }
"#;
    yaml.replacen("identity:\n", &trusted, 1)
        .replacen("    rules:\n", workloads, 1)
        .replacen("policy_examples:\n", examples, 1)
}

async fn start(backend: Backend, github_cap: u32) -> (TestEnv, Issuers) {
    let emulator = talos_sso_tests::emulator::EmulatorHandle::start(Default::default())
        .await
        .unwrap();
    let issuers = Issuers::start(&emulator.issuer()).await;
    let env = TestEnv::start_with_emulator(backend, emulator, |yaml| {
        with_workloads(yaml, &issuers, github_cap)
    })
    .await;
    (env, issuers)
}

async fn ask(env: &TestEnv, token: &str, roles: &[&str]) -> Answer {
    ask_for(env, token, json!({"roles": roles})).await
}

/// A certificate request with `fields` (roles, ttl_seconds) for cluster
/// `prod` and a fresh key.
async fn ask_for(env: &TestEnv, token: &str, mut fields: Value) -> Answer {
    fields["cluster"] = json!("prod");
    fields["csr"] = json!(ClientKey::generate().unwrap().csr_pem().unwrap());
    let request = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .bearer_auth(token)
        .json(&fields);
    Answer::read(request.send().await.unwrap()).await
}

async fn record_of(env: &TestEnv, answer: &Answer) -> StoredRecord {
    let request_id = answer.body["request_id"].as_str().map(str::to_owned);
    let records = env.server.app.audit.store().page(0, 10_000).await.unwrap();
    match request_id {
        Some(id) => records.into_iter().rfind(|r| r.record.request_id == id),
        None => records
            .into_iter()
            .rfind(|r| Some(r.seq) == answer.body["audit_id"].as_i64()),
    }
    .expect("the answer's record")
}

/// The CN and the lifetime of an issued certificate.
fn certificate_of(answer: &Answer) -> (String, i64) {
    let pem = answer.body["certificate"].as_str().unwrap();
    let der = talos_sso_tests::talos_checker::certificates_from_pem(pem)
        .unwrap()
        .remove(0);
    let cert = ParsedCertificate::from_der(&der).unwrap();
    let lifetime = (cert.not_after() - cert.not_before()).whole_seconds();
    (cert.subject_common_name().unwrap(), lifetime)
}

/// A refusal's answer says its code and request id, never a rule's name,
/// a claim's name or a value of the token.
fn assert_teaches_nothing(answer: &Answer, words: &[&str]) {
    let text = answer.body.to_string();
    for word in words {
        assert!(!text.contains(word), "`{word}` in the answer: {text}");
    }
    assert!(answer.body["request_id"].is_string(), "{text}");
}

async fn each_kind_is_admitted_by_its_rule_and_refused_by_a_near_miss(backend: Backend) {
    let (env, issuers) = start(backend, 20).await;
    let (k8s, github, gitlab) = (&issuers.k8s, &issuers.github, &issuers.gitlab);

    // Kubernetes: the backup service account gets etcd backups.
    let backup = ask(&env, &backup_token(k8s), &[]).await;
    assert_eq!(backup.status, 201, "{}", backup.body);
    assert_eq!(backup.body["roles"], json!(["os:etcd:backup"]));
    // Its lifetime is the cluster's ttl (plus the clock-skew allowance
    // every certificate has before now).
    let (cn, cluster_lifetime) = certificate_of(&backup);
    assert_eq!(cn, "kubernetes:system:serviceaccount:backup:talos-backup");
    let record = record_of(&env, &backup).await.record;
    assert_eq!(
        record.subject.as_deref(),
        Some("k8s-prod:system:serviceaccount:backup:talos-backup"),
        "the issuer's name, then the service account"
    );
    assert_eq!(record.details["workload"]["kind"], "kubernetes");
    assert_eq!(record.details["workload"]["rules"], json!(["etcd-backup"]));
    assert_eq!(record.details["workload"]["claims"]["namespace"], "backup");
    // Another namespace's account of the same name: nothing, and the
    // answer does not say why; the record does.
    let elsewhere = ask(
        &env,
        &k8s.sign(&kubernetes_claims(k8s, AUDIENCE, "default", "talos-backup")),
        &[],
    )
    .await;
    assert_eq!(
        (elsewhere.status, elsewhere.code()),
        (403, Some("workload_not_admitted")),
        "{}",
        elsewhere.body
    );
    assert_teaches_nothing(
        &elsewhere,
        &["etcd-backup", "namespace", "backup", "talos-backup"],
    );
    let refused = record_of(&env, &elsewhere).await.record;
    assert_eq!(refused.reason_code.as_deref(), Some("workload_not_admitted"));
    assert_eq!(
        refused.details["workload"]["misses"],
        json!([{"rule": "etcd-backup", "claims": ["namespace"]}])
    );

    // GitHub: a release of org/infra from the production environment
    // administers prod, for the rule's ten minutes.
    let release = github_claims(
        github,
        AUDIENCE,
        "org/infra",
        "refs/tags/v1.4.0",
        Some("production"),
    );
    let admitted = ask(&env, &github.sign(&release), &[]).await;
    assert_eq!(admitted.status, 201, "{}", admitted.body);
    assert_eq!(admitted.body["roles"], json!(["os:admin"]));
    let (cn, lifetime) = certificate_of(&admitted);
    assert_eq!(cn, "github-actions:org/infra");
    assert_eq!(
        lifetime - cluster_lifetime,
        600 - 300,
        "the rule's ttl, not the cluster's"
    );
    let facts = record_of(&env, &admitted).await.record.details["workload"].clone();
    assert_eq!(
        (
            &facts["claims"]["environment"],
            &facts["claims"]["ref"],
            &facts["token_uses_max"]
        ),
        (&json!("production"), &json!("refs/tags/v1.4.0"), &json!(20))
    );
    for (near_miss, missed) in [
        (
            github_claims(
                github,
                AUDIENCE,
                "org/infra-fork",
                "refs/tags/v1.4.0",
                Some("production"),
            ),
            "repository",
        ),
        (
            github_claims(
                github,
                AUDIENCE,
                "org/infra",
                "refs/heads/main",
                Some("production"),
            ),
            "ref",
        ),
        (
            github_claims(github, AUDIENCE, "org/infra", "refs/tags/v1.4.0", Some("staging")),
            "environment",
        ),
        (
            github_claims(github, AUDIENCE, "org/infra", "refs/tags/v1.4.0", None),
            "environment",
        ),
    ] {
        let answer = ask(&env, &github.sign(&near_miss), &[]).await;
        assert_eq!(
            answer.code(),
            Some("workload_not_admitted"),
            "{missed}: {}",
            answer.body
        );
        assert_teaches_nothing(&answer, &["infra-release", missed, "org/infra", "production"]);
        let misses = record_of(&env, &answer).await.record.details["workload"]["misses"].clone();
        assert_eq!(misses, json!([{"rule": "infra-release", "claims": [missed]}]));
    }
    // A role the rule does not grant is refused as for people.
    let more = ask(
        &env,
        &github.sign(&github_claims(
            github,
            AUDIENCE,
            "org/infra",
            "refs/tags/v2",
            Some("production"),
        )),
        &["os:etcd:backup"],
    )
    .await;
    assert_eq!(more.code(), Some("role_not_permitted"), "{}", more.body);
    // The rule's lifetime is also the longest it grants.
    let longer = ask_for(
        &env,
        &github.sign(&release_again(github)),
        json!({"ttl_seconds": 601}),
    )
    .await;
    assert_eq!(longer.code(), Some("ttl_too_long"), "{}", longer.body);
    assert_eq!(longer.body["max_ttl_seconds"], 600);

    // GitLab, whose issuer is also the people's: a protected ref deploys,
    // an unprotected one does not.
    let protected = gitlab_claims(
        gitlab,
        AUDIENCE,
        "group/infra",
        "main",
        true,
        Some(("production", true)),
    );
    let deploy = ask(&env, &gitlab.sign(&protected), &[]).await;
    assert_eq!(deploy.status, 201, "{}", deploy.body);
    assert_eq!(certificate_of(&deploy).0, "gitlab-ci:group/infra");
    assert_eq!(deploy.body["roles"], json!(["os:operator"]));
    let unprotected = gitlab_claims(gitlab, AUDIENCE, "group/infra", "feature", false, None);
    let answer = ask(&env, &gitlab.sign(&unprotected), &[]).await;
    assert_eq!(answer.code(), Some("workload_not_admitted"), "{}", answer.body);
    let misses = record_of(&env, &answer).await.record.details["workload"]["misses"].clone();
    assert_eq!(
        misses,
        json!([{"rule": "gitlab-deploy", "claims": ["ref_protected"]}])
    );

    // A token of one kind shaped like another's: a GitLab token carrying
    // GitHub's claims is judged by GitLab's rules only.
    let disguised = patched(
        gitlab_claims(gitlab, AUDIENCE, "group/other", "main", true, None),
        json!({"project_id": "21", "repository": "org/infra", "environment": "production", "ref": "refs/tags/v1.4.0"}),
    );
    let answer = ask(&env, &gitlab.sign(&disguised), &[]).await;
    assert_eq!(answer.code(), Some("workload_not_admitted"), "{}", answer.body);
    // A job of the same GitLab asking for the people's audience is no
    // person, whoever signed it: refused before any rule.
    let job_as_person = env
        .emulator
        .token_with(
            "bob@example.com",
            TokenKind::id(),
            json!({"pipeline_id": "574", "job_id": "302", "project_path": "group/infra",
                   "repository": "org/infra", "groups": []}),
        )
        .unwrap();
    let answer = ask(&env, &job_as_person, &[]).await;
    assert_eq!(answer.code(), Some("token_audience_invalid"), "{}", answer.body);

    // People's rules never judge a workload: the people's rule naming
    // `repository: org/infra` grants this GitHub token nothing (it is
    // refused for the workload rule it missed), ...
    let branch = github_claims(
        github,
        AUDIENCE,
        "org/infra",
        "refs/heads/main",
        Some("production"),
    );
    assert_eq!(
        ask(&env, &github.sign(&branch), &[]).await.code(),
        Some("workload_not_admitted")
    );
    // ... and workload rules never judge a person: a person of the login
    // issuer (GitLab's issuer too) carrying a job's claims gets what
    // people's rules give, here the reader role of the rule on
    // `repository`, never the workload rules' roles.
    let person = env
        .emulator
        .token_with(
            "bob@example.com",
            TokenKind::id(),
            json!({"repository": "org/infra", "environment": "production", "ref": "refs/tags/v1.4.0",
                   "project_path": "group/infra", "ref_protected": "true", "groups": []}),
        )
        .unwrap();
    let answer = ask(&env, &person, &[]).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    assert_eq!(answer.body["roles"], json!(["os:reader"]));
    assert!(
        record_of(&env, &answer)
            .await
            .record
            .details
            .get("workload")
            .is_none()
    );
    let answer = ask(&env, &person, &["os:admin"]).await;
    assert_eq!(answer.code(), Some("role_not_permitted"), "{}", answer.body);

    // The deny list names a workload by its subject: the repository's or
    // project's id, which a rename or a move keeps.
    let moved = gitlab_claims(gitlab, AUDIENCE, "group/infra-moved", "main", true, None);
    let answer = ask(&env, &gitlab.sign(&moved), &[]).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    assert_eq!(certificate_of(&answer).0, "gitlab-ci:group/infra-moved");
    let subject = record_of(&env, &answer).await.record.subject;
    assert_eq!(subject.as_deref(), Some("gitlab:project_id:20"));
    let admin = env
        .emulator
        .token_with("alice@example.com", TokenKind::id(), json!({}))
        .unwrap();
    for subject in ["github:repository_id:74", "gitlab:project_id:20"] {
        let denied = env
            .http
            .post(format!("{}/v1/deny", env.server.base_url))
            .bearer_auth(&admin)
            .json(&json!({"subject": subject, "reason": "INC-42 leaked workflow"}))
            .send()
            .await
            .unwrap();
        assert_eq!(denied.status(), 201, "{}", denied.text().await.unwrap());
    }
    let answer = ask(&env, &github.sign(&release_again(github)), &[]).await;
    assert_eq!(answer.code(), Some("identity_denied"), "{}", answer.body);
    for path in ["group/infra", "group/infra-moved"] {
        let job = gitlab_claims(gitlab, AUDIENCE, path, "main", true, None);
        let answer = ask(&env, &gitlab.sign(&job), &[]).await;
        assert_eq!(answer.code(), Some("identity_denied"), "{path}: {}", answer.body);
    }
    // Other workloads are not.
    let backup = ask(&env, &backup_token(k8s), &[]).await;
    assert_eq!(backup.status, 201, "{}", backup.body);
    let check = env.server.app.audit.store().verify_chain().await.unwrap();
    assert_eq!(check.first_broken, None);
    env.finish().await;
}

/// A projected token of the backup service account the etcd-backup rule
/// admits.
fn backup_token(k8s: &WorkloadIssuer) -> String {
    k8s.sign(&kubernetes_claims(k8s, AUDIENCE, "backup", "talos-backup"))
}

fn release_again(github: &WorkloadIssuer) -> Value {
    github_claims(
        github,
        AUDIENCE,
        "org/infra",
        "refs/tags/v1.4.1",
        Some("production"),
    )
}

async fn a_workload_token_mints_up_to_its_cap_and_is_checked_as_every_token(backend: Backend) {
    let (env, issuers) = start(backend, 2).await;
    let github = &issuers.github;
    let token = github.sign(&release_again(github));
    for n in 1..=2 {
        let answer = ask(&env, &token, &[]).await;
        assert_eq!(answer.status, 201, "use {n}: {}", answer.body);
    }
    let third = ask(&env, &token, &[]).await;
    assert_eq!(third.code(), Some("token_replayed"), "{}", third.body);
    // Kubernetes keeps its default cap: a second certificate from one
    // projected token is fine.
    let k8s = &issuers.k8s;
    let projected = k8s.sign(&kubernetes_claims(k8s, AUDIENCE, "backup", "talos-backup"));
    for _ in 0..2 {
        assert_eq!(ask(&env, &projected, &[]).await.status, 201);
    }
    // A token without `jti` (older Kubernetes) is told by what its
    // signature covers.
    let without_id = k8s.sign(&patched(
        kubernetes_claims(k8s, AUDIENCE, "backup", "talos-backup"),
        json!({"jti": null}),
    ));
    assert_eq!(ask(&env, &without_id, &[]).await.status, 201);

    let release = release_again(github);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    for (claims, code) in [
        (
            patched(release.clone(), json!({"aud": "https://elsewhere.example"})),
            "token_audience_invalid",
        ),
        (
            patched(release.clone(), json!({"aud": null})),
            "token_audience_invalid",
        ),
        (
            patched(
                release.clone(),
                json!({"exp": now - 3600, "iat": now - 4000, "nbf": now - 4000}),
            ),
            "token_expired",
        ),
        (
            patched(release.clone(), json!({"repository": null})),
            "token_subject_missing",
        ),
        (
            patched(release.clone(), json!({"iss": "https://token.actions.example"})),
            "token_issuer_untrusted",
        ),
    ] {
        let answer = ask(&env, &github.sign(&claims), &[]).await;
        assert_eq!(answer.code(), Some(code), "{claims}: {}", answer.body);
    }
    // Unsigned, and signed by another key under GitHub's key id.
    let signed = github.sign(&release);
    let (input, _) = signed.rsplit_once('.').unwrap();
    let (_, payload) = input.split_once('.').unwrap();
    use base64::Engine;
    let none = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#);
    let unsigned = ask(&env, &format!("{none}.{payload}."), &[]).await;
    assert_eq!(
        unsigned.code(),
        Some("token_algorithm_not_allowed"),
        "{}",
        unsigned.body
    );
    let impostor = WorkloadIssuer::new(GITHUB_ISSUER, Alg::Rs256);
    let forged = ask(&env, &impostor.sign(&release), &[]).await;
    assert_eq!(forged.code(), Some("token_signature_invalid"), "{}", forged.body);
    // A Kubernetes token presented to GitHub's issuer (its `iss`): refused
    // for the subject GitHub's kind requires, never judged as Kubernetes.
    let k8s_shaped = github.sign(&patched(
        kubernetes_claims(k8s, AUDIENCE, "backup", "talos-backup"),
        json!({"iss": GITHUB_ISSUER}),
    ));
    assert_eq!(
        ask(&env, &k8s_shaped, &[]).await.code(),
        Some("token_subject_missing")
    );
    // A projected token whose `sub` and `kubernetes.io` name different
    // service accounts is no token of that cluster's.
    let mismatched = k8s.sign(&patched(
        kubernetes_claims(k8s, AUDIENCE, "default", "builder"),
        json!({"sub": "system:serviceaccount:backup:talos-backup"}),
    ));
    assert_eq!(ask(&env, &mismatched, &[]).await.code(), Some("token_malformed"));

    // `check` reaches each workload issuer and lists what each rule admits.
    let text = with_workloads(
        config_yaml(&env.emulator, &env.work, &env.database_url),
        &issuers,
        2,
    );
    let path = env.work.path().join("workloads.yaml");
    std::fs::write(&path, text).unwrap();
    let out = server_cli(&["check", "--config", path.to_str().unwrap()])
        .await
        .unwrap_or_else(|e| e);
    for line in [
        format!("trusted issuer k8s-prod: {K8S_ISSUER} answers (key file, 1 signing keys"),
        format!("trusted issuer github: {GITHUB_ISSUER} answers (discovery, 1 signing keys"),
        "cluster prod: workload rule etcd-backup: k8s-prod tokens with namespace=backup, \
         service_account=talos-backup get os:etcd:backup"
            .into(),
        "cluster prod: workload rule infra-release: github tokens with environment=production, \
         ref=refs/tags/v*, repository=org/infra get os:admin for 600s"
            .into(),
        "policy examples: 4 passed".into(),
    ] {
        assert!(out.contains(&line), "`{line}` not in:\n{out}");
    }
    env.finish().await;
}
