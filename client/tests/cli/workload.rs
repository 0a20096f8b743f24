//! Workloads: `login --token-file` and `--github-actions` with tokens the
//! server's workload issuers trust (minted by the harness's PyJWT issuers,
//! whose keys the server reads from JWKS files, as a Kubernetes cluster's
//! are published), and `exec --token-file` picking up a rotated token while
//! its command runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use serde_json::json;
use talos_sso_tests::harness::{Backend, TestEnv};
use talos_sso_tests::talos_checker;
use talos_sso_tests::workload_tokens::{
    Alg, GITHUB_ISSUER, WorkloadIssuer, github_claims, kubernetes_claims,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::{Machine, assert_verifies_offline, auditor, context_fields};

const K8S_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const AUDIENCE: &str = "talos-sso";
const BACKUP_CN: &str = "kubernetes:system:serviceaccount:backup:talos-backup";

/// A server trusting a `kubernetes` and a `github-actions` issuer, with
/// one workload rule for each on `prod`.
struct WorkloadEnv {
    env: TestEnv,
    k8s: WorkloadIssuer,
    github: WorkloadIssuer,
}

async fn workload_env() -> WorkloadEnv {
    let k8s = WorkloadIssuer::new(K8S_ISSUER, Alg::Es256);
    let github = WorkloadIssuer::new(GITHUB_ISSUER, Alg::Rs256);
    let (k8s_jwks, github_jwks) = (k8s.jwks_file.display(), github.jwks_file.display());
    let issuers = format!(
        "identity:\n  trusted_issuers:\n    - {{ name: k8s, kind: kubernetes, issuer: \"{K8S_ISSUER}\", \
         jwks_file: \"{k8s_jwks}\", audiences: [{AUDIENCE}] }}\n    - {{ name: github, kind: github-actions, \
         issuer: \"{GITHUB_ISSUER}\", jwks_file: \"{github_jwks}\", audiences: [{AUDIENCE}] }}\n"
    );
    let env = TestEnv::start_with(Backend::Sqlite, move |yaml| {
        let rules = "    default_roles: [os:operator, os:reader]\n    workloads:\n      - name: etcd-backup\n        \
                     issuer: k8s\n        claims: { namespace: backup, service_account: talos-backup }\n        \
                     roles: [os:etcd:backup]\n      - name: infra-deploy\n        issuer: github\n        \
                     claims: { repository: acme/infra, ref: refs/heads/main }\n        roles: [os:reader]\n";
        let edited = yaml
            .replacen("identity:\n", &issuers, 1)
            .replacen("    default_roles: [os:operator, os:reader]\n", rules, 1);
        assert_eq!(edited.matches("trusted_issuers").count(), 1, "{edited}");
        assert!(edited.contains("workloads:"), "{edited}");
        edited
    })
    .await;
    WorkloadEnv { env, k8s, github }
}

/// A projected service-account token of `namespace`/`talos-backup` in `pod`.
fn k8s_token(issuer: &WorkloadIssuer, namespace: &str, pod: &str) -> String {
    let mut claims = kubernetes_claims(issuer, AUDIENCE, namespace, "talos-backup");
    claims["kubernetes.io"]["pod"]["name"] = json!(pod);
    issuer.sign(&claims)
}

/// Every audit record of the server, oldest first.
async fn records(env: &TestEnv) -> Vec<talos_sso_api::audit::AuditRecord> {
    let page = env.server.app.audit.store().page(0, 10_000).await.unwrap();
    page.into_iter().map(|stored| stored.record).collect()
}

/// The issued certificates' records: (pod, the token's id).
async fn issued_pods(env: &TestEnv) -> Vec<(String, String)> {
    records(env)
        .await
        .into_iter()
        .filter(|r| r.event == "certificate.issued")
        .map(|r| {
            let pod = r.details["workload"]["claims"]["pod"]
                .as_str()
                .unwrap_or_default();
            (pod.to_owned(), r.token_id.unwrap_or_default())
        })
        .collect()
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if std::fs::read(&path)
            .unwrap()
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
        {
            found.push(path);
        }
    }
    found
}

/// The SHA-256 of the first certificate in `pem`, as audit records have it.
fn fingerprint(pem: &str) -> String {
    let first = pem::parse_many(pem).unwrap().remove(0);
    hex::encode(ring::digest::digest(&ring::digest::SHA256, first.contents()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_with_a_token_file_writes_the_workloads_certificate_and_keeps_no_token() {
    let WorkloadEnv { env, k8s, .. } = workload_env().await;
    let machine = Machine::new();
    let token = k8s_token(&k8s, "backup", "backup-0");
    let file = machine.home.path().join("sa-token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let file = file.to_str().unwrap();
    let login = [
        "login",
        "--server",
        &env.server.base_url,
        "--cluster",
        "prod",
        "--token-file",
        file,
    ];
    let (code, out, err) = machine.run(&login).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("Logged in to prod as {BACKUP_CN} with os:etcd:backup")),
        "{out}"
    );
    assert!(!err.contains("http"), "no browser, no device code: {err}");
    let (ca, crt, key) = context_fields(&machine.talosconfig(), "prod");
    let accepted = talos_checker::handshake(&ca, &crt, &key).unwrap();
    assert_eq!(accepted.roles, ["os:etcd:backup"]);
    assert_eq!(accepted.common_name.as_deref(), Some(BACKUP_CN));

    // No login cache, and the token nowhere but in the file it came from.
    assert!(!machine.home.path().join(".cache/talos-sso/tokens.json").exists());
    assert_eq!(
        files_containing(machine.home.path(), &token),
        [machine.home.path().join("sa-token")]
    );

    // The same token mints another certificate (a workload's may, up to
    // its issuer's cap): both records name that token. `--debug` shows the
    // exchanges, not the token.
    let mut debug = login.to_vec();
    debug.push("--debug");
    let (code, _, err) = machine.run(&debug).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("sending the token from the token file"), "{err}");
    assert!(!err.contains(&token), "{err}");
    let issued = issued_pods(&env).await;
    assert_eq!(issued.len(), 2, "{issued:?}");
    assert!(
        issued
            .iter()
            .all(|(pod, id)| pod == "backup-0" && *id == issued[0].1 && !id.is_empty()),
        "{issued:?}"
    );

    // Its login is the workload's to renew: not a watch's, and not a
    // person's `exec` (which would put a person's certificate there).
    let (code, _, err) = machine.run(&["watch"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("a workload's login is renewed by `talos-sso exec --token-file`"),
        "{err}"
    );
    let (code, _, err) = machine.run(&["exec", "--ttl", "1h", "--", "true"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("pass its --token-file (or --github-actions) again"),
        "{err}"
    );

    // A service account no rule admits: refused (5), with the request id
    // the audit record of the refusal is found by.
    std::fs::write(file, k8s_token(&k8s, "default", "web-0")).unwrap();
    let (code, _, err) = machine.run(&login).await;
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("no workload rule of cluster `prod` admits this token"),
        "{err}"
    );
    let refused = records(&env)
        .await
        .into_iter()
        .rfind(|r| r.reason_code.as_deref() == Some("workload_not_admitted"))
        .expect("the refusal is recorded");
    assert!(
        err.contains(&format!("(request id {})", refused.request_id)),
        "{err}"
    );

    // The trail with the workload's records verifies offline, by the CLI
    // and by an implementation of docs/audit.md that shares no code with
    // talos-sso, and lists them by kind.
    let sam = auditor(&env).await;
    let (code, listed, err) = sam
        .run(&["audit", "list", "--kind", "kubernetes", "--output", "json"])
        .await;
    assert_eq!(code, 0, "{err}");
    let kinds: Vec<serde_json::Value> = listed.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(kinds.len() >= 3, "{listed}");
    assert!(
        kinds
            .iter()
            .all(|r| r["details"]["workload"]["kind"] == "kubernetes"),
        "{listed}"
    );
    let (code, exported, err) = sam.run(&["audit", "export", "--output", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(exported.contains("\"workload_not_admitted\""), "{exported}");
    assert_verifies_offline(&sam, &exported).await;
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_renews_from_the_token_file_and_picks_up_a_rotated_token() {
    let WorkloadEnv { env, k8s, .. } = workload_env().await;
    let machine = Machine::new();
    let file = machine.home.path().join("sa-token");
    std::fs::write(&file, k8s_token(&k8s, "backup", "backup-a")).unwrap();
    let stop = machine.home.path().join("stop");
    // The command waits for the test, then shows the certificate its
    // TALOSCONFIG holds by then.
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; sed -n 's/^ *crt: *//p' \"$TALOSCONFIG\"",
        stop.display()
    );
    let mut child = machine
        .command(&[
            "exec",
            "--server",
            &env.server.base_url,
            "--cluster",
            "prod",
            "--token-file",
            file.to_str().unwrap(),
            "--ttl",
            "3s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let mut next_renewal = async || {
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                seen.push(line.clone());
                if line.contains("renewed prod: valid until") {
                    return;
                }
            }
            panic!("exec ended without renewing: {seen:?}");
        })
        .await
        .expect("a renewal within 30 s");
    };
    next_renewal().await;
    let first = issued_pods(&env).await;
    assert!(first.len() >= 2, "the first certificate and a renewal: {first:?}");
    assert!(first.iter().all(|(pod, _)| pod == "backup-a"), "{first:?}");

    // The kubelet rotates the token: a new file renamed over the old one.
    let rotated = file.with_file_name("sa-token.new");
    std::fs::write(&rotated, k8s_token(&k8s, "backup", "backup-b")).unwrap();
    std::fs::rename(&rotated, &file).unwrap();
    // Renewals run one after another. A renewal under way may have read
    // the old token; once the trail shows the new one, the renewal after
    // the last one announced cannot have, and once that one is announced
    // the command's copy holds its certificate.
    let mut renewals_after = 0;
    while !issued_pods(&env).await.iter().any(|(pod, _)| pod == "backup-b") {
        assert!(
            renewals_after < 5,
            "the rotated token unused after {renewals_after} renewals"
        );
        next_renewal().await;
        renewals_after += 1;
    }
    next_renewal().await;
    std::fs::write(&stop, "").unwrap();
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));

    let pods = issued_pods(&env).await;
    let switched = pods
        .iter()
        .position(|(pod, _)| pod == "backup-b")
        .expect("the rotated token was used");
    assert!(switched >= first.len(), "{pods:?}");
    assert!(
        pods[switched..].iter().all(|(pod, _)| pod == "backup-b"),
        "never the old token again: {pods:?}"
    );
    assert_ne!(pods[switched].1, first[0].1, "another token: {pods:?}");

    // The command's TALOSCONFIG had been replaced with a certificate of
    // the new token.
    let shown = String::from_utf8(output.stdout).unwrap();
    let crt = base64::engine::general_purpose::STANDARD
        .decode(shown.trim())
        .unwrap();
    let crt = fingerprint(&String::from_utf8(crt).unwrap());
    let issued: Vec<_> = records(&env)
        .await
        .into_iter()
        .filter(|r| r.event == "certificate.issued")
        .collect();
    let position = issued
        .iter()
        .position(|r| r.certificate_sha256.as_deref() == Some(crt.as_str()))
        .expect("the command's certificate was issued");
    assert!(position >= switched, "{position} < {switched}: {pods:?}");
    assert!(!machine.home.path().join(".cache/talos-sso/tokens.json").exists());
    env.finish().await;
}

/// A stand-in for the GitHub Actions runner's token endpoint: it answers
/// each request with the next of `tokens` (a job's token is new each
/// time), and hands each request's first line and `authorization` header
/// to the test.
async fn runner(tokens: Vec<String>) -> (String, tokio::sync::mpsc::UnboundedReceiver<(String, String)>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen, received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut tokens = tokens.into_iter();
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buffer = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buffer[..n]),
                }
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let request_line = head.lines().next().unwrap_or_default().to_owned();
            let authorization = head
                .lines()
                .find_map(|l| {
                    l.split_once(':')
                        .filter(|(name, _)| name.eq_ignore_ascii_case("authorization"))
                        .map(|(_, value)| value.trim().to_owned())
                })
                .unwrap_or_default();
            let body = json!({"count": 1, "value": tokens.next().unwrap_or_default()}).to_string();
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = seen.send((request_line, authorization));
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    });
    (
        format!("http://127.0.0.1:{port}/_apis/distributedtask/token/idtoken?api-version=2.0"),
        received,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_github_actions_login_and_exec_ask_the_runner_for_a_token_each_time() {
    let WorkloadEnv { env, github, .. } = workload_env().await;
    let tokens = (0..3)
        .map(|_| {
            github.sign(&github_claims(
                &github,
                AUDIENCE,
                "acme/infra",
                "refs/heads/main",
                None,
            ))
        })
        .collect();
    let (url, mut requests) = runner(tokens).await;
    let machine = Machine::new();
    let in_the_job = |args: &[&str]| {
        let mut command = machine.command(args);
        command
            .env("TALOS_SSO_SERVER", &env.server.base_url)
            .env("TALOS_SSO_AUDIENCE", AUDIENCE)
            .env("ACTIONS_ID_TOKEN_REQUEST_URL", &url)
            .env("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "runner-request-token");
        command
    };
    let (code, out, err) = super::run_command(in_the_job(&["login", "--github-actions", "--debug"])).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains("identity provider request: GET") && !err.contains("runner-request-token"),
        "the runner's exchange shown, its request token not: {err}"
    );
    assert!(!err.contains("eyJ"), "no token in the debug output: {err}");
    assert!(
        out.contains("Logged in to prod as github-actions:acme/infra with os:reader"),
        "{out}"
    );
    let (request_line, authorization) = requests.recv().await.unwrap();
    assert!(
        request_line
            .starts_with("GET /_apis/distributedtask/token/idtoken?api-version=2.0&audience=talos-sso "),
        "{request_line}"
    );
    assert_eq!(authorization, "bearer runner-request-token");
    let (ca, crt, key) = context_fields(&machine.talosconfig(), "prod");
    assert_eq!(
        talos_checker::handshake(&ca, &crt, &key).unwrap().roles,
        ["os:reader"]
    );

    // exec: a token for the first certificate, and a new one for the
    // renewal while the command runs.
    let stop = machine.home.path().join("stop");
    let script = format!("while [ ! -e '{}' ]; do sleep 0.05; done", stop.display());
    let mut child = in_the_job(&[
        "exec",
        "--github-actions",
        "--cluster",
        "prod",
        "--ttl",
        "3s",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .spawn()
    .unwrap();
    let (_, _, rest) = super::wait_for_line(&mut child, |line| {
        line.contains("renewed prod: valid until").then(String::new)
    })
    .await;
    std::fs::write(&stop, "").unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "{}", rest.await.unwrap());
    for _ in 0..2 {
        let (request_line, authorization) = requests.recv().await.unwrap();
        assert!(request_line.contains("&audience=talos-sso "), "{request_line}");
        assert_eq!(authorization, "bearer runner-request-token");
    }
    let issued = issued_pods(&env).await;
    let mut ids: Vec<&String> = issued.iter().map(|(_, id)| id).collect();
    assert!(issued.len() >= 3, "{issued:?}");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "one token per certificate: {issued:?}");
    assert!(!machine.home.path().join(".cache/talos-sso/tokens.json").exists());
    env.finish().await;
}

/// `--github-actions` outside a job allowed ID tokens, or without an
/// audience: said before anything is asked of the server (nothing listens
/// at port 9) or of the runner.
#[tokio::test]
async fn github_actions_without_the_permission_or_an_audience_is_explained() {
    let machine = Machine::new();
    let base = ["login", "--server", "http://127.0.0.1:9", "--github-actions"];
    let (code, _, err) = machine.run(&base).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--github-actions needs the audience") && err.contains("TALOS_SSO_AUDIENCE"),
        "{err}"
    );
    let mut command = machine.command(&[
        "exec",
        "--server",
        "http://127.0.0.1:9",
        "--cluster",
        "prod",
        "--github-actions",
        "--audience",
        AUDIENCE,
        "--",
        "true",
    ]);
    command.env(
        "ACTIONS_ID_TOKEN_REQUEST_URL",
        "https://runner.example/idtoken?api-version=2.0",
    );
    let (code, _, err) = super::run_command(command).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("$ACTIONS_ID_TOKEN_REQUEST_TOKEN is not set")
            && err.contains("`permissions: id-token: write`"),
        "{err}"
    );
    let file = machine.home.path().join("token");
    std::fs::write(&file, "a.b.c").unwrap();
    let mut both = base.to_vec();
    both.extend(["--audience", AUDIENCE, "--token-file", file.to_str().unwrap()]);
    let (code, _, err) = machine.run(&both).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("choose one token source"), "{err}");
    assert!(!machine.talosconfig().exists());
}
