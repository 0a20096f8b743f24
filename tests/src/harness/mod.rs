//! Spawn a real talos-sso-server for a test: a fresh database (Postgres,
//! one per test, or a SQLite file), a throwaway Talos CA, the Entra
//! emulator, plain HTTP on 127.0.0.1 port 0.
//!
//! Postgres comes from `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); a missing Postgres fails the
//! test with a message saying so, it is never skipped.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use talos_sso_server::app::{App, Clock, SystemClock};
use talos_sso_server::config::Config;
use talos_sso_server::server::Server;

use crate::emulator::{EmulatorConfig, EmulatorHandle};

mod answer;
mod checkpoint;
mod database;
mod store;
mod workdir;

pub use answer::{Answer, json_of};
pub use checkpoint::CheckpointFiles;
pub use database::{TestDatabase, admin_database_url, drop_role};
pub use store::{Backend, BareStore, migrate_up_to};
pub use workdir::{Workdir, config_yaml, tls_files};

/// A running server.
#[derive(Debug)]
pub struct TestServer {
    pub base_url: String,
    /// `http://` and the metrics listener's address, when `metrics.listen`
    /// is set.
    pub metrics_url: Option<String>,
    /// Each gateway cluster's listener.
    pub gateways: Vec<(String, std::net::SocketAddr)>,
    pub app: Arc<App>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(config: Config) -> Self {
        Self::start_with_clock(config, Arc::new(SystemClock)).await
    }

    /// Start with the server's time from `clock` (a time that moves on
    /// without waiting for it).
    pub async fn start_with_clock(config: Config, clock: Arc<dyn Clock>) -> Self {
        let server = Server::bind(config, clock).await.expect("server starts");
        let base_url = server.url();
        let metrics_url = server.metrics_addr().map(|address| format!("http://{address}"));
        let gateways = server.gateway_addrs();
        let app = server.app().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        Self {
            base_url,
            metrics_url,
            gateways,
            app,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Shut down as `serve` does at SIGTERM: stop accepting, finish
    /// in-flight requests, record the refusal counts. The audit writer stays
    /// with [`Self::app`], so that the trail can still be read.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// A whole test environment: emulator, files, database, server.
#[derive(Debug)]
pub struct TestEnv {
    pub emulator: EmulatorHandle,
    pub work: Workdir,
    pub backend: Backend,
    pub database: Option<TestDatabase>,
    pub database_url: String,
    pub server: TestServer,
    pub http: reqwest::Client,
}

impl TestEnv {
    pub async fn start(backend: Backend) -> Self {
        Self::start_with(backend, |yaml| yaml).await
    }

    /// Start with the configuration text passed through `edit`.
    pub async fn start_with(backend: Backend, edit: impl FnOnce(String) -> String) -> Self {
        Self::start_full(backend, EmulatorConfig::default(), edit).await
    }

    /// Start with an emulator configured as given.
    pub async fn start_full(
        backend: Backend,
        emulator: EmulatorConfig,
        edit: impl FnOnce(String) -> String,
    ) -> Self {
        let emulator = EmulatorHandle::start(emulator).await.expect("emulator");
        Self::start_with_emulator(backend, emulator, edit).await
    }

    /// Start with an emulator already running (behind a TLS front, say).
    pub async fn start_with_emulator(
        backend: Backend,
        emulator: EmulatorHandle,
        edit: impl FnOnce(String) -> String,
    ) -> Self {
        Self::start_inner(backend, emulator, edit, None).await
    }

    /// Start from a configuration file, `config.yaml` in the work folder,
    /// as `serve --config` does: the server reloads it when it changes.
    /// [`Self::config_file`] is its path.
    pub async fn start_from_file(backend: Backend, edit: impl FnOnce(String) -> String) -> Self {
        let emulator = EmulatorHandle::start(EmulatorConfig::default())
            .await
            .expect("emulator");
        Self::start_inner(backend, emulator, edit, Some("config.yaml")).await
    }

    /// The configuration file of [`Self::start_from_file`].
    pub fn config_file(&self) -> PathBuf {
        self.work.path().join("config.yaml")
    }

    async fn start_inner(
        backend: Backend,
        emulator: EmulatorHandle,
        edit: impl FnOnce(String) -> String,
        file: Option<&str>,
    ) -> Self {
        let work = Workdir::new();
        let (database, database_url) = match backend {
            Backend::Postgres => {
                let db = TestDatabase::create().await;
                let url = db.url.clone();
                (Some(db), url)
            }
            Backend::Sqlite => (
                None,
                format!("sqlite://{}", work.path().join("audit.db").display()),
            ),
        };
        let text = edit(config_yaml(&emulator, &work, &database_url));
        let config = match file {
            Some(name) => {
                let path = work.path().join(name);
                std::fs::write(&path, &text).expect("config file");
                Config::load_with_env(&path, []).expect("test config")
            }
            None => Config::from_yaml(&text).expect("test config"),
        };
        let server = TestServer::start(config).await;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client");
        Self {
            emulator,
            work,
            backend,
            database,
            database_url,
            server,
            http,
        }
    }

    pub fn config(&self) -> Config {
        self.server.app.settings().config.clone()
    }

    /// What `GET /metrics` answers (on the metrics listener when
    /// `metrics.listen` is set).
    pub async fn metrics(&self) -> String {
        let base = self.server.metrics_url.as_ref().unwrap_or(&self.server.base_url);
        let response = self.http.get(format!("{base}/metrics")).send().await;
        response.expect("metrics").text().await.expect("metrics text")
    }

    /// Ask the server for a certificate on `prod` with `token` and a fresh
    /// key: the status and the JSON body.
    pub async fn issue(&self, token: &str) -> (u16, serde_json::Value) {
        let csr = talos_sso::key::ClientKey::generate()
            .and_then(|k| k.csr_pem())
            .expect("csr");
        let response = self
            .http
            .post(format!("{}/v1/certificates", self.server.base_url))
            .bearer_auth(token)
            .json(&serde_json::json!({"cluster": "prod", "csr": csr}))
            .send()
            .await
            .expect("answer");
        (
            response.status().as_u16(),
            response.json().await.unwrap_or(serde_json::Value::Null),
        )
    }

    /// A second server on the same database (replicas).
    pub async fn another_server(&self) -> TestServer {
        TestServer::start(self.config()).await
    }

    pub async fn finish(self) {
        self.server.stop().await;
        if let Some(db) = &self.database {
            db.drop_now().await;
        }
    }
}

/// `talos-sso-server break-glass` for `os:admin` on cluster `prod`, ten
/// minutes, with `reason`, the talosconfig written to `out`.
pub async fn break_glass_admin(config: &str, reason: &str, out: &std::path::Path) -> Result<String, String> {
    server_cli(&[
        "break-glass",
        "--config",
        config,
        "--cluster",
        "prod",
        "--role",
        "os:admin",
        "--ttl",
        "10m",
        "--reason",
        reason,
        "--out",
        out.to_str().expect("a UTF-8 path"),
    ])
    .await
}

/// Run `talos-sso-server ARGS` in this process: what it printed, or that
/// followed by the error.
pub async fn server_cli(args: &[&str]) -> Result<String, String> {
    use clap::Parser;
    let cli = talos_sso_server::cli::Cli::try_parse_from(
        std::iter::once("talos-sso-server").chain(args.iter().copied()),
    )
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let result = talos_sso_server::cli::run(cli, &mut out).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    result.map(|_| text.clone()).map_err(|e| format!("{text}{e:#}"))
}
