//! The workload examples of deploy/examples run as written: each example's
//! own steps (the etcd backup's script file, the GitHub Actions steps'
//! `run` text, the GitLab job's `script` lines, read from the example
//! files, never copied), with the real `talos-sso` CLI on PATH, against a
//! real server configured with the example's own `talos-sso.yaml` (its
//! issuer, workload rule and policy examples, checked at start), a token of
//! the right shape from that issuer (`workload_tokens`), and the apid
//! stand-in as the cluster's endpoint.
//!
//! `talosctl` is tests/workload/talosctl.py: it makes the gRPC call the
//! real command makes, through the Go client (tests/go/talos-grpc) with the
//! talosconfig `talos-sso login` wrote: `etcd snapshot` calls
//! `MachineService/EtcdSnapshot` (the stand-in streams 64 KiB, written to
//! the file), `version` calls `Version`, `reboot` calls `Reboot`. The
//! stand-in authorizes each call by Talos's rules from the certificate's
//! roles, so a certificate with the wrong roles fails the step.
//!
//! What the test replaces, and only that: the server URL (the example's
//! `https://talos-sso.example.com`), where files go (the token file,
//! `BACKUP_DIR`, `HOME`), the issuer's keys (a `jwks_file` of the test's
//! key instead of the real issuer's), and the GitHub runner's token
//! endpoint (a local one, `ACTIONS_ID_TOKEN_REQUEST_URL`, that mints the
//! token for the audience the step asks for). The install step of the
//! workflow, which downloads releases, is not run: the binaries are on
//! PATH already.
//!
//! `etcd_backup` runs the CronJob's script, `ci_jobs` the GitHub Actions
//! and GitLab CI jobs' steps, `guide` loads docs/workload-identity.md's and
//! configuration.md's configuration and parses the guide's commands.

mod ci_jobs;
mod etcd_backup;
mod guide;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value as Json, json};
use serde_yaml_ng::Value;
use talos_sso_server::audit::StoredRecord;
use talos_sso_server::audit::event;
use talos_sso_server::audit::store::AuditFilter;
use talos_sso_server::ca::CertificateAuthority;
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_tests::harness::{Backend, TestEnv};
use talos_sso_tests::material::{serving_certificate, write_file};
use talos_sso_tests::standin_apid::{Config as ApidConfig, SeenCall, StandinApid};
use talos_sso_tests::workload_tokens::WorkloadIssuer;

/// Longest a whole example may take (the Go client is built on first use).
const PATIENCE: Duration = Duration::from_secs(120);

/// The server URL every example names; the test's own replaces it.
const EXAMPLE_SERVER: &str = "https://talos-sso.example.com";

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("deploy/examples")
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {value:?}"))
}

/// A cluster `prod` whose endpoint is the apid stand-in, and a server
/// configured with an example's `talos-sso.yaml`.
struct Cluster {
    env: TestEnv,
    apid: StandinApid,
    _ca_dir: tempfile::TempDir,
}

impl Cluster {
    /// The server with `fragment` (an example's `talos-sso.yaml`) merged
    /// into the test configuration: its trusted issuers (keys from
    /// `jwks_file`), `prod`'s workload rules, its policy examples.
    async fn start(fragment: &Value, jwks_file: &Path) -> Cluster {
        let ca_dir = tempfile::tempdir().unwrap();
        let now = time::OffsetDateTime::now_utc();
        let root = generate::new_root(NewKeyType::Ed25519, "talos", Duration::from_secs(86400), now).unwrap();
        let cert_file = write_file(ca_dir.path(), "talos-ca.crt", &root.cert_pem, 0o644);
        let key_file = write_file(ca_dir.path(), "talos-ca.key", &root.key_pem, 0o600);
        let ca = CertificateAuthority::from_pem(&root.cert_pem, &root.key_pem, "talos", vec![], now).unwrap();
        let (serving_cert, serving_key) = serving_certificate(ca.signer(), ca.key());
        let apid = StandinApid::start(ApidConfig::new(&serving_cert, &serving_key, &root.cert_pem))
            .await
            .unwrap();
        let endpoint = apid.addr();
        // From a file, so that `check` can read the same configuration.
        let env = TestEnv::start_from_file(Backend::Sqlite, |base| {
            merged(&base, fragment, jwks_file, endpoint, &cert_file, &key_file)
        })
        .await;
        Cluster {
            env,
            apid,
            _ca_dir: ca_dir,
        }
    }

    /// The certificate records of the trail, oldest first.
    async fn records(&self, event_name: &str) -> Vec<StoredRecord> {
        self.env
            .server
            .app
            .audit
            .store()
            .query(&AuditFilter {
                event: Some(event_name.into()),
                limit: 100,
                ..AuditFilter::default()
            })
            .await
            .unwrap()
    }

    /// The one call the stand-in saw.
    async fn the_call(&self) -> SeenCall {
        let calls = self
            .apid
            .wait_for(PATIENCE, |calls| calls.iter().any(|c| c.finished))
            .await
            .unwrap_or_else(|calls| panic!("no finished call: {calls:#?}"));
        assert_eq!(calls.len(), 1, "{calls:#?}");
        calls.into_iter().next().unwrap()
    }
}

/// The test configuration text `base` with the example's configuration
/// merged in, `prod` signing with the test's Talos CA at `endpoint`.
fn merged(
    base: &str,
    fragment: &Value,
    jwks_file: &Path,
    endpoint: SocketAddr,
    cert_file: &Path,
    key_file: &Path,
) -> String {
    let mut config: Value = serde_yaml_ng::from_str(base).unwrap();
    let mut issuers = fragment["identity"]["trusted_issuers"].clone();
    for trusted in issuers.as_sequence_mut().unwrap() {
        trusted["jwks_file"] = Value::from(jwks_file.to_str().unwrap());
    }
    config["identity"]["trusted_issuers"] = issuers;
    let prod = &mut config["clusters"]["prod"];
    prod["workloads"] = fragment["clusters"]["prod"]["workloads"].clone();
    prod["endpoints"] = Value::Sequence(vec![Value::from(endpoint.to_string())]);
    prod["ca"] = serde_yaml_ng::from_str(&format!(
        "{{ cert_file: \"{}\", key_file: \"{}\" }}",
        cert_file.display(),
        key_file.display()
    ))
    .unwrap();
    if let Some(examples) = fragment["policy_examples"].as_sequence() {
        config["policy_examples"]
            .as_sequence_mut()
            .unwrap()
            .extend(examples.iter().cloned());
    }
    serde_yaml_ng::to_string(&config).unwrap()
}

/// An example's `talos-sso.yaml`: one trusted issuer, the one whose
/// tokens the test mints, and policy examples both ways.
fn example_config(dir: &Path, issuer: &WorkloadIssuer) -> Value {
    let fragment = yaml(&dir.join("talos-sso.yaml"));
    let issuers = fragment["identity"]["trusted_issuers"].as_sequence().unwrap();
    assert_eq!(issuers.len(), 1, "{issuers:?}");
    assert_eq!(text(&issuers[0]["issuer"]), issuer.issuer);
    let examples = fragment["policy_examples"].as_sequence().unwrap();
    let outcomes: Vec<bool> = examples.iter().map(|e| e["expect_denied"].is_null()).collect();
    assert!(
        outcomes.contains(&true) && outcomes.contains(&false),
        "an admitted and a refused example: {examples:?}"
    );
    fragment
}

/// Where the example's steps run: the real CLI and the talosctl stand-in
/// first on PATH, a home of their own.
struct Runner {
    dir: tempfile::TempDir,
    bin: PathBuf,
    home: PathBuf,
    calls: PathBuf,
}

impl Runner {
    async fn new() -> Runner {
        let cli = tokio::task::spawn_blocking(talos_sso_tests::quickstart::client_binary)
            .await
            .unwrap()
            .expect("the talos-sso CLI builds");
        let go = tokio::task::spawn_blocking(|| talos_sso_tests::go_grpc::program().to_owned())
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let home = dir.path().join("home");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        std::os::unix::fs::symlink(&cli, bin.join("talos-sso")).unwrap();
        let talosctl = Path::new(env!("CARGO_MANIFEST_DIR")).join("workload/talosctl.py");
        let wrapper = format!(
            "#!/bin/sh\nTALOS_GRPC='{}' exec '{}' '{}' \"$@\"\n",
            go.display(),
            talos_sso_tests::grpcio_client::python().display(),
            talosctl.display()
        );
        write_file(&bin, "talosctl", &wrapper, 0o755);
        let calls = dir.path().join("talosctl-calls.jsonl");
        Runner {
            dir,
            bin,
            home,
            calls,
        }
    }

    /// A folder for the example's files.
    fn scratch(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    /// Run `program args` with only `vars` (and PATH, HOME) set: exit
    /// code, stdout, stderr.
    async fn run(
        &self,
        program: &str,
        args: &[&str],
        vars: &BTreeMap<String, String>,
    ) -> (i32, String, String) {
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = tokio::process::Command::new(program)
            .args(args)
            .env_clear()
            .env("PATH", path)
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env("XDG_CACHE_HOME", self.home.join(".cache"))
            .env("TALOSCTL_CALLS", &self.calls)
            .envs(vars)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let output = tokio::time::timeout(PATIENCE, child.wait_with_output())
            .await
            .expect("the step ends in time")
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

/// A step's variables with the example's server replaced by the test's.
fn with_server(mut vars: BTreeMap<String, String>, cluster: &Cluster) -> BTreeMap<String, String> {
    let server = vars
        .get_mut("TALOS_SSO_SERVER")
        .expect("the example names its server");
    assert_eq!(server, EXAMPLE_SERVER);
    *server = cluster.env.server.base_url.clone();
    vars
}

fn mapping_strings(value: &Value) -> BTreeMap<String, String> {
    value
        .as_mapping()
        .map(|map| {
            map.iter()
                .map(|(k, v)| (text(k).to_owned(), text(v).to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The certificate record of `username`: issued with `roles`, admitted by
/// workload rule `rule` of issuer `issuer` of `kind`.
async fn assert_issued(
    cluster: &Cluster,
    username: &str,
    roles: &[&str],
    kind: &str,
    issuer: &str,
    rule: &str,
) -> Json {
    let issued = cluster.records(event::CERTIFICATE_ISSUED).await;
    let record = match issued.as_slice() {
        [one] => &one.record,
        other => panic!("one certificate: {other:#?}"),
    };
    assert_eq!(record.username.as_deref(), Some(username));
    assert_eq!(record.roles_granted, roles);
    let workload = record.details["workload"].clone();
    assert_eq!(workload["kind"], kind, "{workload:#}");
    assert_eq!(workload["issuer"], issuer, "{workload:#}");
    assert_eq!(workload["rules"], json!([rule]), "{workload:#}");
    assert_eq!(workload["token_uses_max"], 20, "{workload:#}");
    workload
}
