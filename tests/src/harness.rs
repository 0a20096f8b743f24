//! Spawn a real talos-sso-server for a test: a fresh database (Postgres,
//! one per test, or a SQLite file), a throwaway Talos CA, the Entra
//! emulator, plain HTTP on 127.0.0.1 port 0.
//!
//! Postgres comes from `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); a missing Postgres fails the
//! test with a message saying so, it is never skipped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use talos_sso_server::app::{App, SystemClock};
use talos_sso_server::audit::store::{AuditStore, StoreOptions};
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::config::Config;
use talos_sso_server::server::Server;
use time::OffsetDateTime;

use crate::emulator::{
    CLI_CLIENT_ID, EmulatorConfig, EmulatorHandle, GROUP_ONCALL, GROUP_PLATFORM_ADMINS, GROUP_SECURITY,
    SERVER_APP_ID, SERVER_APP_SECRET, TENANT_ID,
};
use crate::material::write_file;

pub fn admin_database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

async fn admin_connection() -> sqlx::PgConnection {
    let url = admin_database_url();
    sqlx::PgConnection::connect(&url).await.unwrap_or_else(|e| {
        panic!("Postgres is needed for these tests and is not reachable at {url} ({e}); start it or set DATABASE_URL")
    })
}

/// A database of its own for one test.
#[derive(Debug)]
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    pub async fn create() -> Self {
        let mut admin = admin_connection().await;
        drop_stale_databases(&mut admin).await;
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let name = format!(
            "talos_sso_t_{now}_{}",
            talos_sso_server::random::random_hex(4).expect("random name")
        );
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("create database");
        let mut url = url::Url::parse(&admin_database_url()).expect("DATABASE_URL");
        url.set_path(&format!("/{name}"));
        Self {
            name,
            url: url.to_string(),
        }
    }

    /// This database's URL as `role` connects to it (trust authentication).
    pub fn url_as(&self, role: &str) -> String {
        let mut url = url::Url::parse(&self.url).expect("database URL");
        url.set_username(role).expect("a URL with a host");
        url.set_password(None).expect("a URL with a host");
        url.to_string()
    }

    /// Run SQL as the administrator (superuser) against this database.
    pub async fn superuser(&self, sql: &str) -> Result<u64, sqlx::Error> {
        let mut conn = sqlx::PgConnection::connect(&self.url).await?;
        let result = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut conn)
            .await?;
        Ok(result.rows_affected())
    }

    /// Refuse new connections and cut the existing ones: the database is "down".
    pub async fn cut(&self) {
        let mut admin = admin_connection().await;
        let sql = format!(
            "ALTER DATABASE {0} ALLOW_CONNECTIONS false; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{0}' AND pid <> pg_backend_pid();",
            self.name
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .expect("cut database");
    }

    pub async fn restore(&self) {
        let mut admin = admin_connection().await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS true",
            self.name
        )))
        .execute(&mut admin)
        .await
        .expect("restore database");
    }

    pub async fn drop_now(&self) {
        let mut admin = admin_connection().await;
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut admin)
        .await;
    }
}

/// Drop a role a test created, once the databases it has objects in are gone.
pub async fn drop_role(name: &str) {
    let mut admin = admin_connection().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {name}")))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("drop role {name}: {e}"));
}

/// Databases of test runs that died before cleaning up (older than an hour),
/// then the roles named after them (`<database>_<purpose>`).
async fn drop_stale_databases(admin: &mut sqlx::PgConnection) {
    let cutoff = OffsetDateTime::now_utc().unix_timestamp() - 3600;
    for (catalog, drop) in [
        (
            "SELECT datname::text FROM pg_database WHERE datname LIKE 'talos\\_sso\\_t\\_%'",
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)",
        ),
        (
            "SELECT rolname::text FROM pg_roles WHERE rolname LIKE 'talos\\_sso\\_t\\_%'",
            "DROP ROLE IF EXISTS {name}",
        ),
    ] {
        let names: Vec<String> = sqlx::query_scalar(catalog)
            .fetch_all(&mut *admin)
            .await
            .unwrap_or_default();
        for name in names {
            let created = name
                .split('_')
                .nth(3)
                .and_then(|t| t.parse::<i64>().ok())
                .unwrap_or(0);
            if created < cutoff {
                let _ = sqlx::query(sqlx::AssertSqlSafe(drop.replace("{name}", &name)))
                    .execute(&mut *admin)
                    .await;
            }
        }
    }
}

/// Which audit store a test server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// A migrated audit store of its own, with no server in front: a fresh
/// Postgres database, or a SQLite file in a temporary folder (both kept as
/// long as this is).
#[derive(Debug)]
pub struct BareStore {
    pub store: AuditStore,
    /// What the store was opened with, for a server or CLI to open it too.
    pub url: String,
    pub database: Option<TestDatabase>,
    pub dir: Option<tempfile::TempDir>,
}

impl BareStore {
    pub async fn open(backend: Backend) -> Self {
        let bare = Self::open_unmigrated(backend).await;
        bare.store.migrate().await.expect("migrations");
        bare
    }

    /// As [`BareStore::open`], with no migration applied.
    pub async fn open_unmigrated(backend: Backend) -> Self {
        let (url, database, dir) = match backend {
            Backend::Postgres => {
                let database = TestDatabase::create().await;
                (database.url.clone(), Some(database), None)
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}/audit.db", dir.path().display());
                (url, None, Some(dir))
            }
        };
        let store = AuditStore::connect(&url, &StoreOptions::default())
            .await
            .expect("audit store");
        Self {
            store,
            url,
            database,
            dir,
        }
    }

    /// Close the store and drop its database.
    pub async fn close(self) {
        self.store.close().await;
        if let Some(database) = self.database {
            database.drop_now().await;
        }
    }
}

/// Apply the store's migrations from their folder up to version `last`
/// only, as a database written by an earlier schema stands.
pub async fn migrate_up_to(store: &AuditStore, last: i64) -> Result<(), sqlx::migrate::MigrateError> {
    let folder = match store {
        AuditStore::Postgres(_) => "postgres",
        AuditStore::Sqlite(_) => "sqlite",
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations")
        .join(folder);
    let all = sqlx::migrate::Migrator::new(dir).await?;
    let migrator =
        sqlx::migrate::Migrator::with_migrations(all.iter().filter(|m| m.version <= last).cloned().collect());
    match store {
        AuditStore::Postgres(pool) => migrator.run(pool).await,
        AuditStore::Sqlite(store) => migrator.run(store.pool()).await,
    }
}

/// Throwaway files of one test server: CA, secrets, SQLite database.
#[derive(Debug)]
pub struct Workdir {
    pub dir: tempfile::TempDir,
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub graph_secret: PathBuf,
}

impl Workdir {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = generate::new_root(
            NewKeyType::Ed25519,
            "talos",
            Duration::from_secs(3650 * 86400),
            OffsetDateTime::now_utc(),
        )
        .expect("CA");
        let ca_cert = write_file(dir.path(), "talos-ca.crt", &ca.cert_pem, 0o644);
        let ca_key = write_file(dir.path(), "talos-ca.key", &ca.key_pem, 0o600);
        let graph_secret = write_file(dir.path(), "graph-secret", SERVER_APP_SECRET, 0o600);
        Self {
            dir,
            ca_cert,
            ca_key,
            graph_secret,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for Workdir {
    fn default() -> Self {
        Self::new()
    }
}

/// A serving certificate for 127.0.0.1 (ECDSA P-256, PKCS#8 `PRIVATE KEY`
/// as rustls reads it) and the CA that signed it, in `dir`. Returns
/// (CA PEM, certificate path, key path).
pub fn tls_files(dir: &Path) -> (String, PathBuf, PathBuf) {
    use talos_sso_server::keys::Signer;
    use talos_sso_server::x509::{self, CertificateTemplate, oid};
    let now = OffsetDateTime::now_utc();
    let root = generate::new_root(
        NewKeyType::EcdsaP256,
        "talos-sso test TLS",
        Duration::from_secs(86400),
        now,
    )
    .expect("CA");
    let ca = talos_sso_server::ca::CertificateAuthority::from_pem(
        &root.cert_pem,
        &root.key_pem,
        "tls CA",
        vec![],
        now,
    )
    .expect("load CA");
    let rng = ring::rand::SystemRandom::new();
    let key = generate::generate_key(NewKeyType::EcdsaP256, &rng).expect("key");
    let spki = der::Encode::to_der(&key.key.public_key_info().expect("spki")).expect("spki der");
    let subject = x509::encode_name(&[(oid::COMMON_NAME, "localhost")]).expect("name");
    let san = x509_cert::ext::pkix::SubjectAltName(vec![x509_cert::ext::pkix::name::GeneralName::IpAddress(
        der::asn1::OctetString::new(vec![127, 0, 0, 1]).expect("ip"),
    )]);
    let template = CertificateTemplate {
        serial: &[9, 9, 9],
        issuer: &ca.signer().raw_subject,
        subject: &subject,
        subject_public_key_info: &spki,
        not_before: now - time::Duration::minutes(5),
        not_after: now + time::Duration::hours(2),
        extensions: vec![
            x509::extension(oid::SUBJECT_ALT_NAME, false, &san).expect("san"),
            x509::extension(
                oid::EXT_KEY_USAGE,
                false,
                &x509_cert::ext::pkix::ExtendedKeyUsage(vec![oid::KP_SERVER_AUTH]),
            )
            .expect("eku"),
        ],
    };
    let cert = x509::sign_certificate(&template, ca.key()).expect("sign");
    let cert_path = write_file(dir, "tls.crt", &x509::pem_encode("CERTIFICATE", &cert), 0o644);
    let key_path = write_file(dir, "tls.key", &key.pem, 0o600);
    (root.cert_pem, cert_path, key_path)
}

/// The test configuration: one cluster `prod` with the demo rules.
pub fn config_yaml(emulator: &EmulatorHandle, work: &Workdir, database_url: &str) -> String {
    format!(
        r#"
listen: "127.0.0.1:0"
insecure_http: true
data_dir: "{data_dir}"
database: {{ url: "{database_url}", acquire_timeout: 2s }}
identity:
  issuer: "{issuer}"
  additional_issuers: ["{issuer_v1}"]
  client_id: "{CLI_CLIENT_ID}"
  audiences: ["{CLI_CLIENT_ID}", "{SERVER_APP_ID}", "api://{SERVER_APP_ID}"]
  allowed_tenants: ["{TENANT_ID}"]
  entra_graph:
    tenant_id: "{TENANT_ID}"
    client_id: "{SERVER_APP_ID}"
    client_secret_file: "{secret}"
    authority: "{base}"
    graph_url: "{base}"
clusters:
  prod:
    description: "Production"
    ca: {{ cert_file: "{ca_cert}", key_file: "{ca_key}" }}
    endpoints: ["127.0.0.1"]
    nodes: ["127.0.0.1"]
    ttl: 5m
    max_ttl: 15m
    rules:
      - {{ groups: ["{GROUP_PLATFORM_ADMINS}"], roles: [os:admin] }}
      - {{ groups: ["{GROUP_ONCALL}"], roles: [os:operator] }}
      - {{ app_roles: ["Talos.Reader"], roles: [os:reader] }}
    default_roles: [os:operator, os:reader]
policy_examples:
  - {{ description: "on-call operates prod", cluster: prod, groups: ["{GROUP_ONCALL}"], expect_roles: [os:operator] }}
  - {{ description: "admins must ask for admin", cluster: prod, groups: ["{GROUP_PLATFORM_ADMINS}"], expect_denied: role_required }}
auditors: {{ groups: ["{GROUP_SECURITY}"] }}
admins: {{ groups: ["{GROUP_PLATFORM_ADMINS}"] }}
# Off here: the concurrency tests and the load generator send hundreds of
# requests per user; `rate_limits_apply_per_address_and_per_identity` turns them on.
rate_limits: {{ per_identity_per_minute: 0, per_address_per_minute: 0 }}
"#,
        data_dir = work.path().display(),
        issuer = emulator.issuer(),
        issuer_v1 = emulator.issuer_v1(),
        secret = work.graph_secret.display(),
        base = emulator.base_url,
        ca_cert = work.ca_cert.display(),
        ca_key = work.ca_key.display(),
    )
}

/// Send `request` and read its answer as JSON (for calls to the identity
/// providers, whose answers the tests take apart themselves).
pub async fn json_of(request: reqwest::RequestBuilder) -> serde_json::Value {
    request
        .send()
        .await
        .expect("an answer")
        .json()
        .await
        .expect("a JSON answer")
}

/// An HTTP answer as the tests read it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// The JSON body; `Null` when the body is not JSON.
    pub body: serde_json::Value,
    /// `X-Request-Id`, empty when absent.
    pub request_id: String,
    /// `Content-Type`, empty when absent.
    pub content_type: String,
}

impl Answer {
    pub async fn read(response: reqwest::Response) -> Self {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default()
        };
        let (request_id, content_type) = (header("x-request-id"), header("content-type"));
        Self {
            status: response.status().as_u16(),
            body: response.json().await.unwrap_or(serde_json::Value::Null),
            request_id,
            content_type,
        }
    }

    /// The problem's `code`, if any.
    pub fn code(&self) -> Option<&str> {
        self.body["code"].as_str()
    }
}

/// A running server.
#[derive(Debug)]
pub struct TestServer {
    pub base_url: String,
    /// `http://` and the metrics listener's address, when `metrics.listen`
    /// is set.
    pub metrics_url: Option<String>,
    pub app: Arc<App>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(config: Config) -> Self {
        let server = Server::bind(config, Arc::new(SystemClock))
            .await
            .expect("server starts");
        let base_url = server.url();
        let metrics_url = server.metrics_addr().map(|address| format!("http://{address}"));
        let app = server.app().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        Self {
            base_url,
            metrics_url,
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

/// An audit signing key, its public key and a checkpoint file, in a folder
/// of their own: what `audit.checkpoints` needs.
#[derive(Debug)]
pub struct CheckpointFiles {
    dir: tempfile::TempDir,
    pub key: PathBuf,
    pub public_key: PathBuf,
    pub file: PathBuf,
}

impl Default for CheckpointFiles {
    fn default() -> Self {
        Self::new()
    }
}

impl CheckpointFiles {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (_, private_pem, public_pem) =
            talos_sso_server::audit::checkpoint::AuditKey::generate().expect("audit key");
        let key = write_file(dir.path(), "audit-signing.key", &private_pem, 0o600);
        let public_key = write_file(dir.path(), "audit-signing.pub", &public_pem, 0o644);
        let file = dir.path().join("checkpoints.jsonl");
        Self {
            dir,
            key,
            public_key,
            file,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `yaml` with an `audit.checkpoints` section using these files, signed
    /// every `interval` by a server named `server_name`.
    pub fn configure(&self, yaml: &str, interval: &str, server_name: &str) -> String {
        format!(
            "{yaml}\naudit:\n  checkpoints:\n    key_file: \"{}\"\n    file: \"{}\"\n    interval: {interval}\n    \
             server_name: {server_name}\n",
            self.key.display(),
            self.file.display()
        )
    }

    /// The checkpoints in the file, in order, read as they are (no
    /// signature checked).
    pub fn read(&self) -> Vec<talos_sso_api::checkpoint::Checkpoint> {
        std::fs::read_to_string(&self.file)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("a checkpoint line"))
            .collect()
    }
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
