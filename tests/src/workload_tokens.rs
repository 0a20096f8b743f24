//! Workload issuers for tests: a signing key and its JWKS file, and tokens
//! in the shapes Kubernetes, GitHub Actions and GitLab CI document, all
//! made by PyJWT (tests/workload/mint.py), a JWT implementation the server
//! does not share. tests/run.sh installs PyJWT into the test venv.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{Value, json};

use crate::grpcio_client::python;

/// The JWT algorithm of a test issuer's key.
#[derive(Debug, Clone, Copy)]
pub enum Alg {
    Rs256,
    Es256,
}

impl Alg {
    fn name(self) -> &'static str {
        match self {
            Alg::Rs256 => "RS256",
            Alg::Es256 => "ES256",
        }
    }
}

/// The issuer GitHub Actions tokens name.
pub const GITHUB_ISSUER: &str = "https://token.actions.githubusercontent.com";

/// One workload issuer: its `iss`, its key, and the JWKS file the server
/// reads (`jwks_file`).
#[derive(Debug)]
pub struct WorkloadIssuer {
    _dir: tempfile::TempDir,
    pub issuer: String,
    key: PathBuf,
    kid: String,
    alg: Alg,
    pub jwks_file: PathBuf,
}

fn mint(args: &[&str], stdin: Option<&str>) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workload/mint.py");
    let mut child = std::process::Command::new(python())
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mint.py");
    {
        use std::io::Write;
        let mut input = child.stdin.take().expect("stdin");
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .expect("write claims");
    }
    let out = child.wait_with_output().expect("mint.py");
    assert!(
        out.status.success(),
        "mint.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8").trim().to_owned()
}

impl WorkloadIssuer {
    /// A new issuer `iss` with a fresh key of `alg`.
    pub fn new(issuer: &str, alg: Alg) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let key = dir.path().join("key.pem");
        mint(&["keygen", alg.name(), key.to_str().expect("path")], None);
        let kid = format!("{}-key-1", alg.name().to_lowercase());
        let jwks_file = dir.path().join("jwks.json");
        let jwks = mint(&["jwks", key.to_str().expect("path"), &kid], None);
        std::fs::write(&jwks_file, jwks).expect("write jwks");
        Self {
            _dir: dir,
            issuer: issuer.to_owned(),
            key,
            kid,
            alg,
            jwks_file,
        }
    }

    /// `claims` signed by this issuer's key (its `iss` is not added).
    pub fn sign(&self, claims: &Value) -> String {
        mint(
            &[
                "sign",
                self.key.to_str().expect("path"),
                &self.kid,
                self.alg.name(),
            ],
            Some(&claims.to_string()),
        )
    }

    /// The times and ids every token carries: valid from a minute ago for
    /// `lifetime` seconds, with a fresh `jti`.
    pub fn base(&self, audience: &str, lifetime: i64) -> Value {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        json!({
            "iss": self.issuer,
            "aud": audience,
            "iat": now - 60,
            "nbf": now - 60,
            "exp": now - 60 + lifetime,
            "jti": uuid(),
        })
    }
}

/// A random UUID-shaped id.
pub fn uuid() -> String {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).expect("random");
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// `claims` with `patch`'s keys set (a `null` removes the key).
pub fn patched(mut claims: Value, patch: Value) -> Value {
    for (key, value) in patch.as_object().expect("an object") {
        if value.is_null() {
            claims.as_object_mut().expect("an object").remove(key);
        } else {
            claims[key] = value.clone();
        }
    }
    claims
}

/// A projected service-account token of `namespace`/`name`, as the
/// Kubernetes documentation shows one (`kubernetes.io` with the pod, the
/// node and the service account).
pub fn kubernetes_claims(issuer: &WorkloadIssuer, audience: &str, namespace: &str, name: &str) -> Value {
    patched(
        issuer.base(audience, 3600),
        json!({
            "aud": [audience],
            "sub": format!("system:serviceaccount:{namespace}:{name}"),
            "kubernetes.io": {
                "namespace": namespace,
                "node": {"name": "worker-1", "uid": uuid()},
                "pod": {"name": format!("{name}-29040480-x7k2p"), "uid": uuid()},
                "serviceaccount": {"name": name, "uid": uuid()},
                "warnafter": time::OffsetDateTime::now_utc().unix_timestamp() + 2880,
            },
        }),
    )
}

/// A GitHub Actions token of a job of `repository` at `git_ref` in
/// `environment` (`None`: no environment), as GitHub documents one.
pub fn github_claims(
    issuer: &WorkloadIssuer,
    audience: &str,
    repository: &str,
    git_ref: &str,
    environment: Option<&str>,
) -> Value {
    let owner = repository.split('/').next().unwrap_or_default();
    let sub = match environment {
        Some(env) => format!("repo:{repository}:environment:{env}"),
        None => format!("repo:{repository}:ref:{git_ref}"),
    };
    let ref_type = if git_ref.starts_with("refs/tags/") {
        "tag"
    } else {
        "branch"
    };
    let mut claims = patched(
        issuer.base(audience, 300),
        json!({
            "sub": sub,
            "ref": git_ref,
            "ref_type": ref_type,
            "ref_protected": "true",
            "sha": "d6cd1e2bd19e03a81132a23b2025920577f84e37",
            "repository": repository,
            "repository_id": "74",
            "repository_owner": owner,
            "repository_owner_id": "65",
            "repository_visibility": "private",
            "run_id": "6950123456",
            "run_number": "10",
            "run_attempt": "1",
            "runner_environment": "github-hosted",
            "actor": "octocat",
            "actor_id": "12",
            "workflow": "deploy",
            "workflow_ref": format!("{repository}/.github/workflows/deploy.yml@{git_ref}"),
            "workflow_sha": "d6cd1e2bd19e03a81132a23b2025920577f84e37",
            "job_workflow_ref": format!("{repository}/.github/workflows/deploy.yml@{git_ref}"),
            "job_workflow_sha": "d6cd1e2bd19e03a81132a23b2025920577f84e37",
            "event_name": "push",
            "head_ref": "",
            "base_ref": "",
        }),
    );
    if let Some(env) = environment {
        claims["environment"] = json!(env);
    }
    claims
}

/// A GitLab CI `id_tokens` token of a job of `project` on `git_ref`
/// (a branch name, as GitLab writes `ref`), as GitLab documents one.
pub fn gitlab_claims(
    issuer: &WorkloadIssuer,
    audience: &str,
    project: &str,
    git_ref: &str,
    ref_protected: bool,
    environment: Option<(&str, bool)>,
) -> Value {
    let namespace = project.rsplit_once('/').map(|(ns, _)| ns).unwrap_or_default();
    let mut claims = patched(
        issuer.base(audience, 3600),
        json!({
            "sub": format!("project_path:{project}:ref_type:branch:ref:{git_ref}"),
            "namespace_id": "72",
            "namespace_path": namespace,
            "project_id": "20",
            "project_path": project,
            "user_id": "1",
            "user_login": "sample-user",
            "user_email": "sample-user@example.com",
            "pipeline_id": "574",
            "pipeline_source": "push",
            "job_id": "302",
            "ref": git_ref,
            "ref_type": "branch",
            "ref_path": format!("refs/heads/{git_ref}"),
            "ref_protected": ref_protected.to_string(),
            "runner_id": 1,
            "runner_environment": "gitlab-hosted",
            "sha": "714a629c0b401fdce83e847fc9589983fc6f46bc",
            "project_visibility": "private",
            "ci_config_ref_uri": format!("gitlab.example.com/{project}//.gitlab-ci.yml@refs/heads/{git_ref}"),
            "ci_config_sha": "714a629c0b401fdce83e847fc9589983fc6f46bc",
        }),
    );
    if let Some((env, protected)) = environment {
        claims["environment"] = json!(env);
        claims["environment_protected"] = json!(protected.to_string());
        claims["deployment_tier"] = json!("production");
        claims["environment_action"] = json!("start");
    }
    claims
}
