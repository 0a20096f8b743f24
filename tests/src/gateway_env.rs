//! A gateway cluster running for a test: its files (`gateway_files`), the
//! gRPC stand-in apid with a hook that looks each call up in the trail, and
//! a real server whose cluster `prod` has a gateway in front of it; ways
//! to log in (Ed25519 as the CLI makes keys, P-256 for grpcio), to read the
//! trail's API calls, and to put someone on the deny list.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};
use talos_sso::key::ClientKey;
use talos_sso_server::audit::store::{AuditFilter, AuditStore};
use talos_sso_server::audit::{StoredRecord, event};

use crate::emulator::TokenKind;
use crate::gateway_files::GatewayFiles;
use crate::grpc_client::{CallOutcome, TalosContext};
use crate::harness::{Backend, TestEnv, TestServer};
use crate::standin_apid::proto::VersionReply;
use crate::standin_apid::{self, SeenCall, StandinApid};

/// Long enough for any call here on a loaded machine; never waited out
/// when things work.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A gateway cluster: its files, the stand-in apid, the server.
#[derive(Debug)]
pub struct Gateway {
    pub files: GatewayFiles,
    pub standin: StandinApid,
    pub env: TestEnv,
    /// The trail, for the stand-in's hook (set once the server runs).
    pub store: Arc<OnceLock<AuditStore>>,
}

impl Gateway {
    pub async fn start(backend: Backend, extra: &str) -> Gateway {
        Self::start_with(backend, extra, |yaml| yaml).await
    }

    /// As [`Gateway::start`], the configuration then passed through `edit`.
    pub async fn start_with(backend: Backend, extra: &str, edit: impl FnOnce(String) -> String) -> Gateway {
        let files = GatewayFiles::new();
        let store: Arc<OnceLock<AuditStore>> = Arc::default();
        let hook_store = store.clone();
        // On every call apid sees: is the call's record already in the
        // trail? (`Ok` names what was found.)
        let hook = standin_apid::hook(move |call: SeenCall| {
            let store = hook_store.clone();
            async move {
                let store = store.get().ok_or("no store yet")?.clone();
                let request_id = call
                    .metadata_values("talos-sso-request-id")
                    .first()
                    .map(|v| (*v).to_owned())
                    .ok_or("no talos-sso-request-id")?;
                let found = api_calls(&store).await;
                found
                    .iter()
                    .find(|r| r.record.request_id == request_id)
                    .map(|r| r.record.outcome.clone())
                    .ok_or_else(|| format!("no record of {request_id} yet"))
            }
        });
        let standin = StandinApid::start(files.standin_config().with_hook(hook))
            .await
            .expect("stand-in apid");
        let upstream = standin.addr();
        let env =
            TestEnv::start_with(backend, |yaml| edit(files.gateway_config(&yaml, upstream, extra))).await;
        let _ = store.set(env.server.app.audit.store().clone());
        Gateway {
            files,
            standin,
            env,
            store,
        }
    }

    pub fn address(&self) -> SocketAddr {
        gateway_address(&self.env.server)
    }

    pub fn token(&self, user: &str) -> String {
        self.env.emulator.token_for(user, TokenKind::id()).expect("token")
    }

    /// A certificate for `user` through the API, for an Ed25519 key of the
    /// CLI's kind: the context to reach the gateway with.
    pub async fn login(&self, user: &str, roles: &[&str]) -> (TalosContext, Value) {
        let key = ClientKey::generate().expect("key");
        let csr = key.csr_pem().expect("csr");
        let answer = self.certificate(user, roles, &csr).await;
        let context = TalosContext::new(
            self.address().to_string(),
            answer["ca"].as_str().unwrap(),
            answer["certificate"].as_str().unwrap(),
            &key.private_key_pem(),
        );
        (context, answer)
    }

    /// A certificate for a P-256 key and CSR made by OpenSSL (grpcio's TLS
    /// signs with no Ed25519 key).
    pub async fn login_p256(&self, user: &str, roles: &[&str]) -> TalosContext {
        let dir = tempfile::tempdir().unwrap();
        let (key, csr) = (dir.path().join("key.pem"), dir.path().join("csr.pem"));
        let status = std::process::Command::new("openssl")
            .args([
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
            ])
            .args(["-subj", "/CN=grpcio", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&csr)
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        let answer = self
            .certificate(user, roles, &std::fs::read_to_string(&csr).unwrap())
            .await;
        TalosContext::new(
            self.address().to_string(),
            answer["ca"].as_str().unwrap(),
            answer["certificate"].as_str().unwrap(),
            &std::fs::read_to_string(&key).unwrap(),
        )
    }

    pub async fn certificate(&self, user: &str, roles: &[&str], csr: &str) -> Value {
        let response = self
            .env
            .http
            .post(format!("{}/v1/certificates", self.env.server.base_url))
            .bearer_auth(self.token(user))
            .json(&json!({"cluster": "prod", "csr": csr, "roles": roles}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        response.json().await.unwrap()
    }

    /// Wait until apid saw `count` calls of `method` cancelled.
    pub async fn wait_cancelled(&self, method: &str, count: usize) {
        let cancelled =
            |calls: &[SeenCall]| calls.iter().filter(|c| c.method == method && c.cancelled).count();
        let seen = self
            .standin
            .wait_for(PATIENCE, |calls| cancelled(calls) == count)
            .await;
        assert!(
            seen.is_ok(),
            "apid saw {count} {method} calls cancelled: {seen:?}"
        );
    }

    /// The stand-in's calls of `method`.
    pub fn seen(&self, method: &str) -> Vec<SeenCall> {
        self.standin
            .calls()
            .into_iter()
            .filter(|c| c.method == method)
            .collect()
    }

    pub async fn deny(&self, subject: &str) {
        let response = self
            .env
            .http
            .post(format!("{}/v1/deny", self.env.server.base_url))
            .bearer_auth(self.token("alice@example.com"))
            .json(&json!({"subject": subject, "reason": "incident 42"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{:?}", response.text().await);
    }
}

pub fn gateway_address(server: &TestServer) -> SocketAddr {
    server
        .gateways
        .iter()
        .find(|(cluster, _)| cluster == "prod")
        .map(|(_, address)| *address)
        .expect("a gateway for prod")
}

/// Every `api.call` record, oldest first.
pub async fn api_calls(store: &AuditStore) -> Vec<StoredRecord> {
    store
        .query(&AuditFilter {
            event: Some(event::API_CALL.into()),
            limit: 1000,
            ..AuditFilter::default()
        })
        .await
        .expect("trail")
}

pub fn method_of(record: &StoredRecord) -> &str {
    record.record.details["method"].as_str().unwrap_or_default()
}

/// The roles apid settled on, from a successful `Version`.
pub fn version_roles(outcome: &CallOutcome) -> Vec<String> {
    assert!(outcome.ok(), "{outcome:?}");
    outcome.decode::<VersionReply>(0).roles
}
