//! The server's configuration: one YAML or TOML file (and, optionally, a
//! folder of cluster files, `clusters_dir`), every key overridable from the
//! environment as `TALOS_SSO__SECTION__KEY` (for example
//! `TALOS_SSO__DATABASE__URL`), unknown keys refused, secrets only from files.
//! How the file, the folder and the environment make one document is
//! `document`'s business; this module types and checks it.
//!
//! This module parses and checks shape and values; it does not open files
//! named inside the configuration (CA material, secrets) except through the
//! explicit `read_secret` helper, and it does not reach the network.
//! docs/configuration.md documents every key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use zeroize::Zeroizing;

use crate::ca::CaSource;
use crate::policy::{PolicyConfig, PolicyExample, Tenancy};

pub mod document;

use document::{ClusterFile, Format};

/// Prefix of environment overrides; `__` separates sections.
pub const ENV_PREFIX: &str = "TALOS_SSO";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration: {0}")]
    Load(String),
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error("cannot read secret file {path}: {reason}")]
    Secret { path: PathBuf, reason: String },
    /// The file is valid; an environment override is not.
    #[error("invalid configuration from the environment ({variables}): {reason}")]
    Environment { variables: String, reason: String },
}

fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(message.into())
}

/// Durations are written as `5m`, `90s`, `1h 30m`.
pub(crate) fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text).map_err(|e| serde::de::Error::custom(format!("`{text}`: {e}")))
}

fn optional_duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|text| {
            humantime::parse_duration(&text).map_err(|e| serde::de::Error::custom(format!("`{text}`: {e}")))
        })
        .transpose()
}

/// `10.0.0.0/8` or a single address `10.1.2.3`.
fn networks<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<ipnet::IpNet>, D::Error> {
    Vec::<String>::deserialize(deserializer)?
        .into_iter()
        .map(|text| {
            text.parse::<ipnet::IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| serde::de::Error::custom(format!("`{text}` is not an IP address or CIDR")))
        })
        .collect()
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// TLS certificate and key; required unless `insecure_http` is set.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Serve plain HTTP: only behind a proxy that terminates TLS.
    #[serde(default)]
    pub insecure_http: bool,
    /// Where the embedded SQLite database lives when `database` is not set.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    #[serde(default)]
    pub database: DatabaseConfig,
    pub identity: IdentityConfig,
    /// Clusters by name (the name is what `--cluster` takes): those of the
    /// file and those of `clusters_dir`.
    #[serde(default)]
    pub clusters: BTreeMap<String, ClusterConfig>,
    /// A folder of cluster files, one per cluster, named after it
    /// (`prod.yaml` is cluster `prod`); relative to the configuration file.
    #[serde(default)]
    pub clusters_dir: Option<PathBuf>,
    /// Claims -> roles examples checked at start; a failure stops the server.
    #[serde(default)]
    pub policy_examples: Vec<PolicyExample>,
    /// Who may read the audit trail.
    #[serde(default)]
    pub auditors: GroupList,
    /// Who may change the deny list.
    #[serde(default)]
    pub admins: GroupList,
    #[serde(default)]
    pub http: HttpConfig,
    /// Certificate requests per identity and per client address.
    #[serde(default)]
    pub rate_limits: crate::ratelimit::RateLimitConfig,
    #[serde(default)]
    pub audit: AuditConfig,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// The security team's web console at `/ui`.
    #[serde(default)]
    pub console: ConsoleConfig,
    /// When the configuration is read again while the server runs.
    #[serde(default)]
    pub reload: ReloadConfig,
    /// Where this configuration was read from: what a reload reads again
    /// (`None` when it was given as text).
    #[serde(skip)]
    pub source: Option<ConfigSource>,
    /// The document it was typed from (file, cluster files, environment):
    /// what a reload compares, section by section.
    #[serde(skip)]
    pub document: Document,
    /// A digest of the files it was read from; a reload is due when it
    /// changes.
    #[serde(skip)]
    pub fingerprint: String,
}

/// The document a configuration was typed from. Its Debug output is
/// withheld: it holds the environment overrides' values, and a value may
/// be a secret where the configuration was careless (a password in
/// `database.url`).
#[derive(Clone, Default, PartialEq)]
pub struct Document(pub serde_yaml_ng::Value);

impl std::ops::Deref for Document {
    type Target = serde_yaml_ng::Value;
    fn deref(&self) -> &serde_yaml_ng::Value {
        &self.0
    }
}

impl std::fmt::Debug for Document {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Document(..)")
    }
}

/// The `reload` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReloadConfig {
    /// How often the configuration file and the cluster files are checked
    /// for changes (a changed ConfigMap); `0s`: only on SIGHUP.
    #[serde(default = "default_reload_interval", deserialize_with = "duration")]
    pub interval: Duration,
}

impl Default for ReloadConfig {
    fn default() -> Self {
        Self {
            interval: default_reload_interval(),
        }
    }
}

fn default_reload_interval() -> Duration {
    Duration::from_secs(10)
}

/// A configuration file and the environment overrides it was read with.
#[derive(Clone)]
pub struct ConfigSource {
    path: PathBuf,
    overrides: Vec<(String, String)>,
}

/// Names the variables, never their values.
impl std::fmt::Debug for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.overrides.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("ConfigSource")
            .field("path", &self.path)
            .field("overrides", &names)
            .finish()
    }
}

impl ConfigSource {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read the file again, with the same overrides.
    pub fn load(&self) -> Result<Config, ConfigError> {
        self.snapshot()?.load()
    }

    /// The configuration's files as they are now, read once: what is
    /// compared and what is loaded are the same text.
    pub fn snapshot(&self) -> Result<Snapshot, ConfigError> {
        Ok(Snapshot {
            files: Files::read(&self.path, &self.overrides)?,
            source: self.clone(),
        })
    }
}

/// The configuration's files as read at one moment (see
/// [`ConfigSource::snapshot`]).
pub struct Snapshot {
    files: Files,
    source: ConfigSource,
}

/// Names the files by their digest, never their text.
impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("source", &self.source)
            .field("fingerprint", &self.fingerprint())
            .finish()
    }
}

impl Snapshot {
    /// The digest of these files (see [`Config::fingerprint`]).
    pub fn fingerprint(&self) -> String {
        self.files.fingerprint()
    }

    /// The configuration these files hold.
    pub fn load(self) -> Result<Config, ConfigError> {
        Config::from_files(&self.source.path, self.files, self.source.overrides)
    }
}

/// What a configuration is read from: the file's text and its cluster files.
struct Files {
    text: String,
    document: serde_yaml_ng::Value,
    clusters: Vec<ClusterFile>,
}

impl Files {
    fn read(path: &Path, overrides: &[(String, String)]) -> Result<Self, ConfigError> {
        let format = Format::of(path).ok_or_else(|| {
            ConfigError::Load(format!("{}: use a .yaml, .yml or .toml file", path.display()))
        })?;
        let text = crate::text_file::read(path)
            .map_err(|e| ConfigError::Load(format!("{}: {e}", path.display())))?;
        let document = document::parse(&text, format)
            .map_err(|e| ConfigError::Load(format!("{}: {e}", path.display())))?;
        let clusters = match clusters_dir(&document, overrides) {
            Some(dir) => {
                let base = path.parent().unwrap_or(Path::new("."));
                document::read_cluster_dir(&base.join(dir))?
            }
            None => Vec::new(),
        };
        Ok(Self {
            text,
            document,
            clusters,
        })
    }

    fn fingerprint(&self) -> String {
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        for (name, text) in std::iter::once(("", self.text.as_str()))
            .chain(self.clusters.iter().map(|f| (f.name.as_str(), f.text.as_str())))
        {
            // Lengths first: no two different lists of files share a digest.
            for part in [name, text] {
                digest.update(&(part.len() as u64).to_be_bytes());
                digest.update(part.as_bytes());
            }
        }
        hex::encode(digest.finish())
    }
}

/// `clusters_dir` as the environment or the document sets it.
fn clusters_dir(document: &serde_yaml_ng::Value, overrides: &[(String, String)]) -> Option<PathBuf> {
    let from_env = overrides
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(&format!("{ENV_PREFIX}__CLUSTERS_DIR")))
        .map(|(_, value)| value.clone());
    from_env
        .or_else(|| {
            document
                .get("clusters_dir")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        })
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
}

/// The `audit` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// Streams of the trail for a SIEM (`GET /v1/audit/stream`).
    #[serde(default)]
    pub feed: crate::http::feed::FeedConfig,
    /// How refusals of unauthenticated and rate-limited requests are
    /// aggregated (`crate::refusals`).
    #[serde(default)]
    pub refusals: crate::refusals::RefusalConfig,
    /// Signed checkpoints of the chain head, published outside the
    /// database (`crate::audit::checkpoint`); off when absent.
    #[serde(default)]
    pub checkpoints: Option<CheckpointConfig>,
}

/// The `audit.checkpoints` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// The Ed25519 signing key (PKCS#8 PEM, `PRIVATE KEY`), used for
    /// nothing else; not readable by others, like every key. Or `pkcs11`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The Ed25519 signing key in a PKCS#11 token instead of a file.
    #[serde(default)]
    pub pkcs11: Option<crate::ca::Pkcs11Source>,
    /// The checkpoint file: one JSON checkpoint per line, appended.
    pub file: PathBuf,
    /// How often the head is signed when the trail has grown.
    #[serde(default = "default_checkpoint_interval", deserialize_with = "duration")]
    pub interval: Duration,
    /// Where each checkpoint is also POSTed as JSON (`https://`, or
    /// `http://` to this machine only).
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// The server's name in its checkpoints; default: the host name.
    #[serde(default)]
    pub server_name: Option<String>,
    /// Public keys of earlier signing keys (PEM), whose checkpoints are
    /// still checked after a key rotation.
    #[serde(default)]
    pub previous_public_keys: Vec<PathBuf>,
}

fn default_checkpoint_interval() -> Duration {
    Duration::from_secs(60)
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8443))
}

fn default_data_dir() -> PathBuf {
    PathBuf::from("/var/lib/talos-sso")
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// How often the files are checked for changes; changed files are
    /// loaded without a restart (a failed load keeps the current ones).
    #[serde(default = "default_tls_reload", deserialize_with = "duration")]
    pub reload_interval: Duration,
}

fn default_tls_reload() -> Duration {
    Duration::from_secs(30)
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `postgres://user@host/db` or `sqlite:///path/audit.db`; empty means
    /// SQLite in `data_dir`.
    #[serde(default)]
    pub url: Option<String>,
    /// File holding the Postgres password (never in the URL or on the
    /// command line).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Pool size.
    #[serde(default)]
    pub max_connections: Option<u32>,
    /// How long a request waits for a database connection before
    /// answering 503 `audit_unavailable`.
    #[serde(default, deserialize_with = "optional_duration")]
    pub acquire_timeout: Option<Duration>,
    /// Run migrations at start (default true). When false, start only if
    /// every embedded migration is applied: a runtime role may not migrate.
    #[serde(default)]
    pub migrate_on_start: Option<bool>,
}

/// The name of the login issuer, the one `identity` itself describes.
pub const LOGIN_ISSUER: &str = "login";

/// The `identity` section: the issuer people log in with (the one
/// `/v1/info` names to the CLI), and the further issuers whose tokens are
/// accepted too.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    /// `entra` or `oidc`: how the issuer's tokens are read. When not set,
    /// `entra` if `allowed_tenants` is set, else `oidc` (with a warning).
    #[serde(default)]
    pub kind: Option<String>,
    /// The provider's issuer, exactly as its discovery document says it. For
    /// Entra multi-tenant apps, `https://login.microsoftonline.com/{tenantid}/v2.0`.
    pub issuer: String,
    /// Discovery document URL, when it is not `{issuer}/.well-known/openid-configuration`.
    #[serde(default)]
    pub discovery_url: Option<String>,
    /// More accepted issuers (e.g. an Entra v1 `https://sts.windows.net/{tid}/`
    /// for v1 access tokens; Entra's public cloud adds those itself).
    #[serde(default)]
    pub additional_issuers: Vec<String>,
    /// The public client id the CLI uses.
    pub client_id: String,
    /// Accepted `aud` values. Default: the client id (ID tokens).
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Scopes the CLI asks for.
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// Which token the CLI sends: `id_token` (default; every provider) or
    /// `access_token` (a JWT access token for this server's API; then
    /// `audiences` names that API). Served by `/v1/info`.
    #[serde(default)]
    pub token: talos_sso_api::BearerToken,
    /// Entra tenants allowed (`tid`); the person is (`tid`, `oid`).
    #[serde(default)]
    pub allowed_tenants: Vec<String>,
    /// The claim naming the person (certificate CN, audit username). When
    /// set, a token without it is refused; when not, the first of
    /// `preferred_username`, `upn`, `unique_name`, a verified `email`, then
    /// the subject. A display name only: policy and the deny list match
    /// the subject.
    #[serde(default)]
    pub username_claim: Option<String>,
    /// Leeway on token times.
    #[serde(default = "default_leeway", deserialize_with = "duration")]
    pub leeway: Duration,
    /// Minimum time between key-set refreshes caused by unknown `kid`s
    /// (every issuer's).
    #[serde(default = "default_min_refresh", deserialize_with = "duration")]
    pub jwks_min_refresh_interval: Duration,
    /// Background refresh of discovery and keys (every issuer's).
    #[serde(default = "default_refresh_period", deserialize_with = "duration")]
    pub jwks_refresh_period: Duration,
    /// Group overage resolution through Microsoft Graph (Entra).
    #[serde(default)]
    pub entra_graph: Option<GraphConfig>,
    /// Further issuers whose tokens are accepted (workloads, other
    /// directories); nobody logs in with them through the CLI.
    #[serde(default)]
    pub trusted_issuers: Vec<IssuerConfig>,
    /// A PEM bundle of certificate authorities trusted, in addition to the
    /// system's trust store, for every call to an identity provider
    /// (discovery, keys, Graph): a provider behind a company CA.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// `console.client_id` when the console is on and has a client of its
    /// own (set from the `console` section, not read here).
    #[serde(skip)]
    pub console_client_id: Option<String>,
}

impl IdentityConfig {
    /// The login issuer as one issuer among the trusted ones.
    pub fn login_issuer(&self) -> IssuerConfig {
        IssuerConfig {
            name: LOGIN_ISSUER.into(),
            kind: self
                .kind
                .clone()
                .unwrap_or_else(|| crate::identity::issuer::inferred_kind(&self.allowed_tenants).to_owned()),
            issuer: self.issuer.clone(),
            discovery_url: self.discovery_url.clone(),
            additional_issuers: self.additional_issuers.clone(),
            audiences: if self.audiences.is_empty() {
                vec![self.client_id.clone()]
            } else {
                self.audiences.clone()
            },
            clients: std::iter::once(self.client_id.clone())
                .chain(self.console_client_id.clone())
                .collect(),
            allowed_tenants: self.allowed_tenants.clone(),
            username_claim: self.username_claim.clone(),
            leeway: self.leeway,
            entra_graph: self.entra_graph.clone(),
            ca_file: self.ca_file.clone(),
        }
    }

    /// The tenants of every issuer that has some (Entra), by name: what
    /// app-role selectors are read against.
    pub fn tenancy(&self) -> Tenancy {
        Tenancy::new(
            self.issuers()
                .into_iter()
                .map(|issuer| (issuer.name, issuer.allowed_tenants)),
        )
    }

    /// Every issuer: the login issuer first.
    pub fn issuers(&self) -> Vec<IssuerConfig> {
        std::iter::once(self.login_issuer())
            .chain(self.trusted_issuers.iter().map(|trusted| IssuerConfig {
                ca_file: self.ca_file.clone(),
                ..trusted.clone()
            }))
            .collect()
    }
}

/// One issuer whose tokens are accepted: an entry of
/// `identity.trusted_issuers`, or the login issuer built from `identity`.
/// Each has its own keys and rules (`identity::issuer`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// Names the issuer in logs and messages; unique (`login` is the
    /// login issuer's).
    pub name: String,
    /// `entra` or `oidc`.
    pub kind: String,
    /// Its issuer, exactly as its discovery document says it.
    pub issuer: String,
    #[serde(default)]
    pub discovery_url: Option<String>,
    #[serde(default)]
    pub additional_issuers: Vec<String>,
    /// Accepted `aud` values (no default: there is no client id here).
    pub audiences: Vec<String>,
    /// The login issuer's clients, `identity.client_id` and the console's
    /// own `console.client_id`: `azp`/`appid`, when present, must name one
    /// of them. Empty for a trusted issuer.
    #[serde(skip)]
    pub clients: Vec<String>,
    #[serde(default)]
    pub allowed_tenants: Vec<String>,
    #[serde(default)]
    pub username_claim: Option<String>,
    #[serde(default = "default_leeway", deserialize_with = "duration")]
    pub leeway: Duration,
    #[serde(default)]
    pub entra_graph: Option<GraphConfig>,
    /// `identity.ca_file`, for every issuer alike.
    #[serde(skip)]
    pub ca_file: Option<PathBuf>,
}

impl IssuerConfig {
    /// Where this issuer is in the configuration, for messages.
    pub fn section(&self) -> String {
        if !self.clients.is_empty() {
            "identity".into()
        } else {
            format!(
                "identity.trusted_issuers[{}]",
                crate::audit::text::clean(&self.name, 64)
            )
        }
    }
}

fn default_scopes() -> Vec<String> {
    ["openid", "profile", "offline_access"].map(String::from).to_vec()
}
fn default_leeway() -> Duration {
    Duration::from_secs(300)
}
fn default_min_refresh() -> Duration {
    Duration::from_secs(300)
}
fn default_refresh_period() -> Duration {
    Duration::from_secs(3600)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphConfig {
    pub tenant_id: String,
    /// The server's own app registration (with GroupMember.Read.All).
    pub client_id: String,
    pub client_secret_file: PathBuf,
    #[serde(default = "default_authority")]
    pub authority: String,
    #[serde(default = "default_graph_url")]
    pub graph_url: String,
}

fn default_authority() -> String {
    "https://login.microsoftonline.com".into()
}
fn default_graph_url() -> String {
    "https://graph.microsoft.com".into()
}

/// A cluster's `ca` section: exactly one source.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaConfig {
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    #[serde(default)]
    pub secrets_bundle: Option<PathBuf>,
    #[serde(default)]
    pub machine_config: Option<PathBuf>,
    /// The key inside a PKCS#11 token (with `cert_file`, without `key_file`).
    #[serde(default)]
    pub pkcs11: Option<crate::ca::Pkcs11Source>,
    /// Accept a CA key file readable by group or others (loudly logged).
    #[serde(default)]
    pub allow_insecure_key_permissions: bool,
}

impl CaConfig {
    pub fn source(&self) -> Result<CaSource, ConfigError> {
        CaSource::from_parts(
            self.cert_file.as_ref(),
            self.key_file.as_ref(),
            self.secrets_bundle.as_ref(),
            self.machine_config.as_ref(),
            self.pkcs11.as_ref(),
        )
        .ok_or_else(|| {
            invalid(
                "a cluster's `ca` needs exactly one of: cert_file + key_file, cert_file + pkcs11, \
                 secrets_bundle, machine_config",
            )
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default)]
    pub description: String,
    pub ca: CaConfig,
    /// Extra trusted CA certificates during a CA rotation.
    #[serde(default)]
    pub accepted_cas: Vec<PathBuf>,
    /// talosconfig `endpoints`.
    pub endpoints: Vec<String>,
    /// talosconfig `nodes` (default: none).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// talosconfig context name (default: the cluster name).
    #[serde(default)]
    pub context: Option<String>,
    /// Default certificate lifetime.
    #[serde(default = "default_ttl", deserialize_with = "duration")]
    pub ttl: Duration,
    /// Longest lifetime a client may ask for.
    #[serde(default = "default_max_ttl", deserialize_with = "duration")]
    pub max_ttl: Duration,
    /// How far `not_before` is moved back.
    #[serde(default = "default_skew", deserialize_with = "duration")]
    pub clock_skew: Duration,
    /// Who gets which roles: see `policy` (rules match on groups, app
    /// roles, users or claims).
    #[serde(default)]
    pub rules: Vec<crate::policy::Rule>,
    /// Roles granted when the client names none.
    #[serde(default)]
    pub default_roles: Vec<String>,
    /// Allow a rule to grant `os:impersonator`.
    #[serde(default)]
    pub allow_impersonator: bool,
}

impl ClusterConfig {
    /// The cluster's rules, with the issuers' tenants they are read
    /// against (`IdentityConfig::tenancy`, of the `identity` section).
    pub fn policy(&self, tenancy: &Tenancy) -> PolicyConfig {
        PolicyConfig {
            rules: self.rules.clone(),
            default_roles: self.default_roles.clone(),
            allow_impersonator: self.allow_impersonator,
            tenancy: tenancy.clone(),
        }
    }
}

fn default_ttl() -> Duration {
    Duration::from_secs(300)
}
fn default_max_ttl() -> Duration {
    Duration::from_secs(900)
}
fn default_skew() -> Duration {
    crate::certificate::DEFAULT_CLOCK_SKEW
}

/// Who `auditors` or `admins` are: people (groups, app roles) and
/// applications (app roles, client ids), all of the login issuer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupList {
    /// Group object ids (Entra) or names; compared case-insensitively.
    #[serde(default)]
    pub groups: Vec<String>,
    /// App roles (`roles`), of a person or of an application's own token.
    /// `<tenant id>/<role>` counts the role only as that tenant assigned
    /// it; the role alone stands for the login issuer's only tenant, and is
    /// refused when it allows several (`policy::check_app_roles`).
    #[serde(default)]
    pub app_roles: Vec<String>,
    /// Client ids (`azp`/`appid`) of applications whose own tokens (client
    /// credentials) are let in, whatever their app roles; never a person.
    /// Not tied to a tenant: an application's client id is the same in
    /// every tenant that has a copy of it (docs/entra-id.md).
    #[serde(default)]
    pub client_ids: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Largest accepted request body.
    #[serde(default = "default_body_limit")]
    pub body_limit: usize,
    /// Longest a request may take.
    #[serde(default = "default_request_timeout", deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// Proxies whose `X-Forwarded-For` is believed (IPs or CIDRs).
    #[serde(default, deserialize_with = "networks")]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Time allowed for in-flight requests at shutdown.
    #[serde(default = "default_grace", deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// Time a client has for the TLS handshake and for each request's
    /// headers; an HTTP/1.1 keep-alive connection that sends no next
    /// request within it is closed.
    #[serde(default = "default_header_read_timeout", deserialize_with = "duration")]
    pub header_read_timeout: Duration,
    /// A connection on which nothing moves for this long is closed (HTTP/2
    /// included). Must be longer than `request_timeout`.
    #[serde(default = "default_idle_timeout", deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// Connections open at once; at the cap, new ones wait in the kernel's
    /// backlog until one closes.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Concurrent requests (streams) on one HTTP/2 connection.
    #[serde(default = "default_h2_streams")]
    pub http2_max_concurrent_streams: u32,
    /// Connections one client address (IPv6: /64) may hold at once; trusted
    /// proxies are exempt. Further connections are closed at once.
    #[serde(default = "default_per_address_connections")]
    pub max_connections_per_address: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            body_limit: default_body_limit(),
            request_timeout: default_request_timeout(),
            trusted_proxies: Vec::new(),
            shutdown_grace: default_grace(),
            header_read_timeout: default_header_read_timeout(),
            idle_timeout: default_idle_timeout(),
            max_connections: default_max_connections(),
            http2_max_concurrent_streams: default_h2_streams(),
            max_connections_per_address: default_per_address_connections(),
        }
    }
}

impl HttpConfig {
    fn check(&self) -> Result<(), ConfigError> {
        if self.header_read_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(invalid(
                "http.header_read_timeout and http.request_timeout must be above zero",
            ));
        }
        if self.idle_timeout <= self.request_timeout {
            return Err(invalid(format!(
                "http.idle_timeout ({:?}) must be longer than http.request_timeout ({:?}): \
                 a request in progress must not look idle",
                self.idle_timeout, self.request_timeout
            )));
        }
        if self.max_connections == 0 || self.max_connections > u32::MAX as usize {
            return Err(invalid("http.max_connections must be at least 1"));
        }
        if self.max_connections_per_address == 0 {
            return Err(invalid("http.max_connections_per_address must be at least 1"));
        }
        if self.http2_max_concurrent_streams == 0 {
            return Err(invalid("http.http2_max_concurrent_streams must be at least 1"));
        }
        Ok(())
    }
}

fn default_header_read_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_max_connections() -> usize {
    1024
}
fn default_h2_streams() -> u32 {
    64
}
fn default_per_address_connections() -> usize {
    128
}

fn default_body_limit() -> usize {
    64 * 1024
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(15)
}
fn default_grace() -> Duration {
    Duration::from_secs(20)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    #[serde(default = "default_log_format")]
    pub format: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: default_log_format(),
        }
    }
}

fn default_log_format() -> String {
    "text".into()
}

/// The `metrics` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `GET /metrics` here (plain HTTP) and only here: the main port
    /// then answers 404 for it. Unset: `/metrics` is on the main port.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
}

/// The `console` section: the web console at `/ui` (docs/console.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve `/ui`. Off unless set.
    #[serde(default)]
    pub enabled: bool,
    /// The server's address as browsers reach it (`https://sso.example.com`);
    /// the redirect URI registered with the identity provider is this
    /// followed by `/ui/callback`. Required when `enabled`.
    #[serde(default)]
    pub public_url: Option<String>,
    /// The client id the console logs in with; default `identity.client_id`
    /// (the CLI's public client, with the console's redirect URI added).
    #[serde(default)]
    pub client_id: Option<String>,
    /// A file holding the client secret, for a confidential (web)
    /// registration; none for a public client (PKCE alone).
    #[serde(default)]
    pub client_secret_file: Option<PathBuf>,
    /// A session ends after this long without a request.
    #[serde(default = "default_console_idle", deserialize_with = "duration")]
    pub session_idle: Duration,
    /// A session ends this long after login, whatever happens (group changes at
    /// the provider reach the console at the next login).
    #[serde(default = "default_console_lifetime", deserialize_with = "duration")]
    pub session_lifetime: Duration,
    /// Sessions held at once, the oldest going first when a new one needs
    /// room; as many logins in progress are held apart.
    #[serde(default = "default_console_sessions")]
    pub max_sessions: usize,
    /// An export must reach its client within this long, or it is cut off
    /// (and the trail says so): a client that reads slowly or not at all
    /// cannot hold the export's memory and slot.
    #[serde(default = "default_export_timeout", deserialize_with = "duration")]
    pub export_timeout: Duration,
    /// Exports running at once on this replica.
    #[serde(default = "default_max_exports")]
    pub max_exports: usize,
    /// Exports one person may run at once on this replica.
    #[serde(default = "default_max_exports_per_person")]
    pub max_exports_per_person: usize,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            public_url: None,
            client_id: None,
            client_secret_file: None,
            session_idle: default_console_idle(),
            session_lifetime: default_console_lifetime(),
            max_sessions: default_console_sessions(),
            export_timeout: default_export_timeout(),
            max_exports: default_max_exports(),
            max_exports_per_person: default_max_exports_per_person(),
        }
    }
}

fn default_console_idle() -> Duration {
    Duration::from_secs(15 * 60)
}
fn default_console_lifetime() -> Duration {
    Duration::from_secs(3600)
}
fn default_console_sessions() -> usize {
    1000
}
fn default_export_timeout() -> Duration {
    Duration::from_secs(5 * 60)
}
fn default_max_exports() -> usize {
    4
}
fn default_max_exports_per_person() -> usize {
    1
}

/// Whether `url` is https, or http to this machine only.
fn secure_or_loopback(url: &url::Url) -> bool {
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    url.scheme() == "https" || (url.scheme() == "http" && loopback)
}

impl ConsoleConfig {
    fn check(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        let Some(public_url) = &self.public_url else {
            return Err(invalid(
                "console.public_url is required when console.enabled is set (the redirect URI is it plus /ui/callback)",
            ));
        };
        let url = url::Url::parse(public_url).map_err(|e| invalid(format!("console.public_url: {e}")))?;
        if !secure_or_loopback(&url) || url.query().is_some() || url.fragment().is_some() {
            return Err(invalid(
                "console.public_url must be https:// (http:// only to this machine), without query or fragment",
            ));
        }
        if self.max_sessions == 0 || self.session_idle.is_zero() || self.session_lifetime.is_zero() {
            return Err(invalid(
                "console.max_sessions, session_idle and session_lifetime must be above zero",
            ));
        }
        if self.max_exports == 0 || self.max_exports_per_person == 0 || self.export_timeout.is_zero() {
            return Err(invalid(
                "console.max_exports, max_exports_per_person and export_timeout must be above zero",
            ));
        }
        Ok(())
    }

    /// `<public_url>/ui/callback`.
    pub fn redirect_uri(&self) -> Option<String> {
        self.public_url
            .as_deref()
            .map(|u| format!("{}/ui/callback", u.trim_end_matches('/')))
    }
}

/// The override variables an error message points at: those whose last
/// key segment the message names, else all of them (sorted).
fn culprits(names: &[String], message: &str) -> String {
    let mut named: Vec<&String> = names
        .iter()
        .filter(|name| {
            name.rsplit("__")
                .next()
                .is_some_and(|key| message.contains(&format!("`{}`", key.to_lowercase())))
        })
        .collect();
    if named.is_empty() {
        named = names.iter().collect();
    }
    named.sort();
    named.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
}

impl Config {
    /// Read `path` (YAML or TOML by extension), the cluster files of its
    /// `clusters_dir`, and apply environment overrides.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with_env(path, std::env::vars())
    }

    /// As [`Config::load`], with the environment given (tests).
    pub fn load_with_env(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let overrides = document::overrides(env);
        let files = Files::read(path, &overrides)?;
        Self::from_files(path, files, overrides)
    }

    fn from_files(path: &Path, files: Files, overrides: Vec<(String, String)>) -> Result<Self, ConfigError> {
        let mut config = Self::typed(files.document.clone(), &files.clusters, &overrides)?;
        config.fingerprint = files.fingerprint();
        config.source = Some(ConfigSource {
            path: std::path::absolute(path).unwrap_or_else(|_| path.to_owned()),
            overrides,
        });
        Ok(config)
    }

    /// As [`Config::load_with_env`], for the text of a file in `format`
    /// (YAML or TOML) already read: the whole loader but the file system,
    /// so `clusters_dir` is refused here.
    pub fn from_text_with_env(
        text: &str,
        format: config::FileFormat,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let format = match format {
            config::FileFormat::Toml => Format::Toml,
            _ => Format::Yaml,
        };
        let overrides = document::overrides(env);
        let parsed = document::parse(text, format).map_err(ConfigError::Load)?;
        if clusters_dir(&parsed, &overrides).is_some() {
            return Err(invalid(
                "clusters_dir is read next to a configuration file: load the file instead of its text",
            ));
        }
        Self::typed(parsed, &[], &overrides)
    }

    /// The document (with its cluster files) typed and checked, the
    /// overrides applied; a mistake the overrides make is blamed on them.
    fn typed(
        mut document: serde_yaml_ng::Value,
        cluster_files: &[ClusterFile],
        overrides: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        document::merge_clusters(&mut document, cluster_files)?;
        let parse = |document: serde_yaml_ng::Value| {
            let mut config: Config = config::Config::try_from(&document)
                .map_err(|e| ConfigError::Load(e.to_string()))?
                .try_deserialize()
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
            config.validate()?;
            config.link_sections();
            config.document = Document(document);
            Ok::<_, ConfigError>(config)
        };
        if overrides.is_empty() {
            return parse(document);
        }
        let from_file = document.clone();
        document::apply_overrides(&mut document, overrides)?;
        let names = overrides.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        match parse(document) {
            Ok(config) => Ok(config),
            // Blame the environment when the file alone is fine, or fails
            // for another reason than the combination does.
            Err(error) => match parse(from_file) {
                Err(file_error) if file_error.to_string() == error.to_string() => Err(error),
                _ => Err(ConfigError::Environment {
                    variables: culprits(&names, &error.to_string()),
                    reason: match error {
                        ConfigError::Invalid(reason) | ConfigError::Load(reason) => reason,
                        other => other.to_string(),
                    },
                }),
            },
        }
    }

    /// Parse from a string (tests and `check`).
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let mut config: Config =
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if config.clusters_dir.is_some() {
            return Err(invalid(
                "clusters_dir is read next to a configuration file: load the file instead of its text",
            ));
        }
        config.validate()?;
        config.link_sections();
        config.document = Document(document::parse(text, Format::Yaml).map_err(ConfigError::Invalid)?);
        Ok(config)
    }

    /// What one section tells another, once both are read: a console with
    /// a client of its own logs in through the login issuer, so the ID
    /// tokens it redeems may name that client.
    fn link_sections(&mut self) {
        self.identity.console_client_id = self
            .console
            .enabled
            .then(|| self.console.client_id.clone())
            .flatten();
    }

    /// Checks that need more than one key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tls.is_none() && !self.insecure_http {
            return Err(invalid(
                "set `tls` (cert_file, key_file), or `insecure_http: true` behind a TLS proxy",
            ));
        }
        if self.clusters.is_empty() {
            return Err(invalid("no clusters configured"));
        }
        self.http.check()?;
        if let Some(checkpoints) = &self.audit.checkpoints {
            if checkpoints.key_file.is_some() == checkpoints.pkcs11.is_some() {
                return Err(invalid(
                    "audit.checkpoints needs exactly one of key_file and pkcs11 (the audit signing key)",
                ));
            }
            if checkpoints.interval < Duration::from_secs(1) {
                return Err(invalid("audit.checkpoints.interval must be at least 1s"));
            }
            if let Some(url) = &checkpoints.webhook_url {
                let url = url::Url::parse(url)
                    .map_err(|e| invalid(format!("audit.checkpoints.webhook_url: {e}")))?;
                if !secure_or_loopback(&url) {
                    return Err(invalid(
                        "audit.checkpoints.webhook_url must be https:// (http:// only to this machine)",
                    ));
                }
            }
        }
        self.audit.feed.check().map_err(invalid)?;
        self.console.check()?;
        if self.audit.refusals.window.is_zero() {
            return Err(invalid("audit.refusals.window must be above zero"));
        }
        if self
            .metrics
            .listen
            .is_some_and(|m| m == self.listen && m.port() != 0)
        {
            return Err(invalid(
                "metrics.listen is the same address as listen: give the metrics a port of their own",
            ));
        }
        for (name, cluster) in &self.clusters {
            if !valid_name(name) {
                return Err(invalid(format!(
                    "cluster name `{name}`: use letters, digits, `-`, `_`, `.`"
                )));
            }
            cluster.ca.source()?;
            if cluster.endpoints.is_empty() {
                return Err(invalid(format!("cluster `{name}` has no endpoints")));
            }
            if cluster.ttl.is_zero() || cluster.ttl > cluster.max_ttl {
                return Err(invalid(format!(
                    "cluster `{name}`: ttl must be above zero and at most max_ttl"
                )));
            }
        }
        for example in &self.policy_examples {
            if !self.clusters.contains_key(&example.cluster) {
                return Err(invalid(format!(
                    "policy example names unknown cluster `{}`",
                    example.cluster
                )));
            }
        }
        self.validate_issuers()?;
        self.validate_app_roles()?;
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(invalid("log.format is `text` or `json`"));
        }
        Ok(())
    }

    /// Issuer names are unique and usable as keys; the rest is each
    /// issuer's kind's business (`identity::issuer::validate`).
    fn validate_issuers(&self) -> Result<(), ConfigError> {
        let issuers = self.identity.issuers();
        for (index, issuer) in issuers.iter().enumerate() {
            if !valid_name(&issuer.name) {
                return Err(invalid(format!(
                    "{}.name: use letters, digits, `-`, `_`, `.`",
                    issuer.section()
                )));
            }
            if issuers[..index].iter().any(|other| other.name == issuer.name) {
                return Err(invalid(format!(
                    "two issuers are named `{}` (`{LOGIN_ISSUER}` names the issuer of `identity` itself)",
                    issuer.name
                )));
            }
        }
        // A rule names issuers by these names.
        for (cluster, config) in &self.clusters {
            for (index, rule) in config.rules.iter().enumerate() {
                if let Some(unknown) = rule
                    .issuers
                    .iter()
                    .find(|name| !issuers.iter().any(|i| &i.name == *name))
                {
                    let names: Vec<&str> = issuers.iter().map(|i| i.name.as_str()).collect();
                    return Err(invalid(format!(
                        "clusters.{cluster}.rules[{index}] names issuer `{}`, which is not configured; issuers: {}",
                        crate::audit::text::clean(unknown, 64),
                        names.join(", ")
                    )));
                }
            }
        }
        crate::identity::issuer::validate(&issuers).map_err(invalid)
    }

    /// App roles count only in the tenant that assigned them: with several
    /// allowed tenants, each app-role selector names its tenant
    /// (`policy::check_app_roles`). `auditors` and `admins` are of the login
    /// issuer. A rule's are checked with the rest of the rule, when its
    /// cluster's policy is built (`app::load_clusters`).
    fn validate_app_roles(&self) -> Result<(), ConfigError> {
        let tenancy = self.identity.tenancy();
        for (section, list) in [("auditors", &self.auditors), ("admins", &self.admins)] {
            crate::policy::check_app_roles(&list.app_roles, &[LOGIN_ISSUER], &tenancy)
                .map_err(|e| invalid(format!("{section}.app_roles: {e}")))?;
        }
        Ok(())
    }

    /// What is valid but should be said explicitly: logged at start and
    /// printed by `check`.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.identity.kind.is_none() {
            let kind = self.identity.login_issuer().kind;
            let because = if self.identity.allowed_tenants.is_empty() {
                "is not set"
            } else {
                "is set"
            };
            warnings.push(format!(
                "identity.kind is not set, so it is taken as `{kind}` because identity.allowed_tenants {because}; \
                 add the line `kind: {kind}` to the `identity` section (TOML: `kind = \"{kind}\"`) to say so"
            ));
        }
        warnings
    }

    /// Said by `check` and at start when the trail is not signed: a choice
    /// (homelab, evaluation), not a mistake, so not one of [`Self::warnings`].
    pub fn unsigned_trail_notice(&self) -> Option<&'static str> {
        self.audit.checkpoints.is_none().then_some(
            "audit.checkpoints is not set: the audit trail is not signed, so whoever can write the database can \
             rewrite it, or cut its end, unseen (docs/audit.md, \"Signed checkpoints\")",
        )
    }

    /// Database URL with the password from `password_file`, or SQLite in
    /// the data directory.
    pub fn database_url(&self) -> Result<Zeroizing<String>, ConfigError> {
        let Some(url) = &self.database.url else {
            return Ok(Zeroizing::new(format!(
                "sqlite://{}",
                self.data_dir.join("audit.db").display()
            )));
        };
        let Some(password_file) = &self.database.password_file else {
            return Ok(Zeroizing::new(url.clone()));
        };
        let password = read_secret(password_file)?;
        let mut parsed = url::Url::parse(url).map_err(|e| invalid(format!("database.url: {e}")))?;
        parsed
            .set_password(Some(password.trim()))
            .map_err(|_| invalid("database.url cannot carry a password"))?;
        Ok(Zeroizing::new(parsed.to_string()))
    }
}

/// Names of clusters and issuers: they become keys, labels and log fields.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// Read a secret from a file, refusing files readable by group or others.
pub fn read_secret(path: &Path) -> Result<Zeroizing<String>, ConfigError> {
    let error = |reason: String| ConfigError::Secret {
        path: path.to_owned(),
        reason,
    };
    if let Err(too_open) = crate::secret_file::check(path).map_err(|e| error(e.to_string()))? {
        return Err(error(format!(
            "readable by group or others (mode {:04o}); chmod 600 it",
            too_open.mode
        )));
    }
    let text = crate::text_file::read(path).map_err(|e| error(e.to_string()))?;
    Ok(Zeroizing::new(text.trim_end_matches(['\n', '\r']).to_owned()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The least configuration that loads (other modules' tests start
    /// from it too).
    pub(crate) const MINIMAL: &str = r#"
insecure_http: true
identity:
  issuer: "https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0"
  client_id: "11111111-2222-3333-4444-555555555555"
  allowed_tenants: ["72f988bf-86f1-41af-91ab-2d7cd011db47"]
clusters:
  prod:
    ca: { secrets_bundle: /etc/talos-sso/prod-secrets.yaml }
    endpoints: [cp-01.example.internal]
    rules:
      - { groups: ["g-admins"], roles: [os:admin] }
"#;

    #[test]
    fn audit_checkpoints_take_one_key_a_sane_interval_and_an_encrypted_webhook() {
        let with = |section: &str| {
            Config::from_yaml(&format!("{MINIMAL}\naudit:\n  checkpoints: {{ {section} }}\n"))
        };
        let file = "file: /var/lib/talos-sso/checkpoints.jsonl";
        let token = "pkcs11: { module: /m.so, token_label: t, key_label: k, pin_file: /p }";
        let loaded = with(&format!("key_file: /k, {file}")).unwrap();
        let checkpoints = loaded.audit.checkpoints.unwrap();
        assert_eq!(
            (checkpoints.interval, checkpoints.key_file),
            (Duration::from_secs(60), Some(PathBuf::from("/k")))
        );
        assert!(
            with(&format!("{token}, {file}"))
                .unwrap()
                .audit
                .checkpoints
                .unwrap()
                .pkcs11
                .is_some()
        );
        assert!(
            with(&format!(
                "{token}, {file}, webhook_url: \"http://127.0.0.1:9/hook\""
            ))
            .is_ok()
        );
        for (section, refused) in [
            (file.to_owned(), "exactly one of key_file and pkcs11"),
            (
                format!("key_file: /k, {token}, {file}"),
                "exactly one of key_file and pkcs11",
            ),
            (format!("key_file: /k, {file}, interval: 500ms"), "at least 1s"),
            (
                format!("key_file: /k, {file}, webhook_url: \"http://siem.example.com/hook\""),
                "must be https://",
            ),
            (
                format!("key_file: /k, {file}, webhook_url: \"not a url\""),
                "webhook_url",
            ),
        ] {
            let error = with(&section).unwrap_err().to_string();
            assert!(error.contains(refused), "{section}: {error}");
        }
        // Off unless configured, and then said.
        assert!(
            Config::from_yaml(MINIMAL)
                .unwrap()
                .unsigned_trail_notice()
                .is_some()
        );
        assert!(
            with(&format!("key_file: /k, {file}"))
                .unwrap()
                .unsigned_trail_notice()
                .is_none()
        );
    }

    #[test]
    fn a_ca_key_in_a_pkcs11_token_is_a_source_of_its_own() {
        let pkcs11 = "cert_file: /etc/talos-sso/intermediate.crt, pkcs11: { module: /usr/lib/softhsm/libsofthsm2.so, \
                      token_label: talos-ca, key_label: talos-sso-intermediate, pin_file: /etc/talos-sso/talos-ca.pin }";
        let config =
            Config::from_yaml(&MINIMAL.replace("secrets_bundle: /etc/talos-sso/prod-secrets.yaml", pkcs11))
                .unwrap();
        let source = config.clusters["prod"].ca.source().unwrap();
        let CaSource::Pkcs11 { cert_file, pkcs11 } = source else {
            panic!("{source:?}");
        };
        assert_eq!(cert_file, PathBuf::from("/etc/talos-sso/intermediate.crt"));
        assert_eq!(
            (pkcs11.token_label.as_str(), pkcs11.key_label.as_str()),
            ("talos-ca", "talos-sso-intermediate")
        );
        assert_eq!(pkcs11.pin_file, PathBuf::from("/etc/talos-sso/talos-ca.pin"));
        // A key file and a token at once, a token without the certificate,
        // and an unknown key in `pkcs11` are refused.
        let both = pkcs11_yaml_with(&format!("key_file: /k, {}", pkcs11_text()));
        assert!(
            Config::from_yaml(&both)
                .unwrap_err()
                .to_string()
                .contains("exactly one")
        );
        let no_cert =
            pkcs11_yaml_with(&pkcs11_text().replace("cert_file: /etc/talos-sso/intermediate.crt, ", ""));
        assert!(
            Config::from_yaml(&no_cert)
                .unwrap_err()
                .to_string()
                .contains("exactly one")
        );
        let typo = pkcs11_yaml_with(&pkcs11_text().replace("pin_file", "pin"));
        assert!(Config::from_yaml(&typo).is_err());
    }

    fn pkcs11_text() -> String {
        "cert_file: /etc/talos-sso/intermediate.crt, pkcs11: { module: /m.so, token_label: t, key_label: k, pin_file: /p }"
            .into()
    }

    fn pkcs11_yaml_with(ca: &str) -> String {
        MINIMAL.replace("secrets_bundle: /etc/talos-sso/prod-secrets.yaml", ca)
    }

    #[test]
    fn the_console_needs_a_public_url_browsers_reach_safely() {
        let with = |section: &str| Config::from_yaml(&format!("{MINIMAL}\nconsole: {{ {section} }}\n"));
        let off = Config::from_yaml(MINIMAL).unwrap().console;
        assert!(!off.enabled && off.redirect_uri().is_none());
        let on = with("enabled: true, public_url: \"https://sso.example.com/\"")
            .unwrap()
            .console;
        assert_eq!(
            on.redirect_uri().as_deref(),
            Some("https://sso.example.com/ui/callback")
        );
        assert_eq!(
            (on.session_idle, on.session_lifetime, on.max_sessions),
            (Duration::from_secs(900), Duration::from_secs(3600), 1000)
        );
        assert!(with("enabled: true, public_url: \"http://127.0.0.1:8443\"").is_ok());
        // A console client of its own is one the login issuer's ID tokens
        // may name (`azp`); only while the console is on.
        let cli = "11111111-2222-3333-4444-555555555555";
        let clients = |section: &str| with(section).unwrap().identity.login_issuer().clients;
        assert_eq!(
            clients("enabled: true, public_url: \"https://a.example\", client_id: console-web"),
            [cli, "console-web"]
        );
        assert_eq!(clients("enabled: true, public_url: \"https://a.example\""), [cli]);
        assert_eq!(clients("enabled: false, client_id: console-web"), [cli]);
        for (section, says) in [
            ("enabled: true", "console.public_url is required"),
            (
                "enabled: true, public_url: \"http://sso.example.com\"",
                "must be https://",
            ),
            (
                "enabled: true, public_url: \"https://sso.example.com/?x=1\"",
                "without query",
            ),
            ("enabled: true, public_url: \"not a url\"", "console.public_url"),
            (
                "enabled: true, public_url: \"https://a.example\", max_sessions: 0",
                "above zero",
            ),
        ] {
            let error = with(section).unwrap_err().to_string();
            assert!(error.contains(says), "{section}: {error}");
        }
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let config = Config::from_yaml(MINIMAL).unwrap();
        let prod = &config.clusters["prod"];
        assert_eq!(prod.ttl, Duration::from_secs(300));
        assert_eq!(prod.max_ttl, Duration::from_secs(900));
        assert_eq!(prod.policy(&config.identity.tenancy()).rules.len(), 1);
        let login = config.identity.login_issuer();
        assert_eq!(login.audiences, ["11111111-2222-3333-4444-555555555555"]);
        assert_eq!(
            login.kind, "entra",
            "allowed_tenants makes it Entra, as before kinds"
        );
        assert_eq!(
            *config.database_url().unwrap(),
            "sqlite:///var/lib/talos-sso/audit.db"
        );
        assert_eq!(config.identity.token, talos_sso_api::BearerToken::IdToken);
        let access =
            Config::from_yaml(&MINIMAL.replace("identity:\n", "identity:\n  token: access_token\n")).unwrap();
        assert_eq!(access.identity.token, talos_sso_api::BearerToken::AccessToken);
    }

    #[test]
    fn mistakes_are_refused_with_the_key_named() {
        let cases = [
            (
                MINIMAL.replace("insecure_http: true", "insecure_htp: true"),
                "insecure_htp",
            ),
            (
                MINIMAL.replace("insecure_http: true", "insecure_http: false"),
                "tls",
            ),
            (
                MINIMAL
                    .replace("ttl_unused", "x")
                    .replace("endpoints: [cp-01.example.internal]", "endpoints: []"),
                "no endpoints",
            ),
            (
                MINIMAL.replace(
                    "{ groups: [\"g-admins\"], roles: [os:admin] }",
                    "{ groupz: [x], roles: [os:admin] }",
                ),
                "groupz",
            ),
            (
                MINIMAL.replace(
                    "secrets_bundle: /etc/talos-sso/prod-secrets.yaml",
                    "secrets_bundle: a, machine_config: b",
                ),
                "exactly one",
            ),
            (
                MINIMAL.replace("    rules:", "    ttl: 20m\n    rules:"),
                "ttl must be",
            ),
            (
                MINIMAL.replace("    rules:", "    ttl: five minutes\n    rules:"),
                "five minutes",
            ),
            (
                MINIMAL.replace("identity:\n", "identity:\n  token: access\n"),
                "unknown variant `access`, expected `id_token` or `access_token`",
            ),
        ];
        for (text, expected) in cases {
            let error = Config::from_yaml(&text).unwrap_err().to_string();
            assert!(error.contains(expected), "expected {expected:?} in {error}");
        }
    }

    #[test]
    fn a_missing_kind_is_inferred_and_the_line_to_add_is_named() {
        let config = Config::from_yaml(MINIMAL).unwrap();
        let warnings = config.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("taken as `entra` because identity.allowed_tenants is set")
                && warnings[0].contains("add the line `kind: entra` to the `identity` section"),
            "{warnings:?}"
        );
        let explicit =
            Config::from_yaml(&MINIMAL.replace("identity:\n", "identity:\n  kind: entra\n")).unwrap();
        assert!(explicit.warnings().is_empty());
        let generic = MINIMAL
            .replace(
                "  allowed_tenants: [\"72f988bf-86f1-41af-91ab-2d7cd011db47\"]\n",
                "",
            )
            .replace(
                "login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0",
                "idp.example.com",
            );
        let generic = Config::from_yaml(&generic).unwrap();
        assert_eq!(generic.identity.login_issuer().kind, "oidc");
        assert!(generic.warnings()[0].contains("add the line `kind: oidc`"));
    }

    #[test]
    fn app_roles_name_their_tenant_when_several_are_allowed() {
        const HOME: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
        const PARTNER: &str = "0b0b0b0b-1111-4222-8333-444444444444";
        let two = MINIMAL
            .replace(
                &format!("login.microsoftonline.com/{HOME}/v2.0"),
                "login.microsoftonline.com/{tenantid}/v2.0",
            )
            .replace(
                &format!("allowed_tenants: [\"{HOME}\"]"),
                &format!("allowed_tenants: [\"{HOME}\", \"{PARTNER}\"]"),
            );
        let with = |base: &str, extra: &str| Config::from_yaml(&format!("{base}{extra}"));
        let refused = |extra: &str| with(&two, extra).unwrap_err().to_string();
        // A rule's are checked with the rest of the rule, when its
        // cluster's policy is built (`app::load_clusters` says where).
        let rule_refused = |config: Config| {
            crate::policy::ClusterPolicy::new(config.clusters["prod"].policy(&config.identity.tenancy()))
                .unwrap_err()
                .to_string()
        };
        let error = refused("auditors: { app_roles: [Talos.Auditor] }\n");
        assert!(
            error.starts_with(
                "invalid configuration: auditors.app_roles: app role `Talos.Auditor` names no tenant, \
                 but issuer `login` allows several"
            ) && error.contains(&format!("`{HOME}/Talos.Auditor`")),
            "{error}"
        );
        assert!(
            refused("admins: { app_roles: [Talos.Admin] }\n")
                .starts_with("invalid configuration: admins.app_roles: ")
        );
        let error = rule_refused(
            with(
                &two,
                "      - { app_roles: [Talos.Reader], roles: [os:reader] }\n",
            )
            .unwrap(),
        );
        assert!(
            error.starts_with("rule 1: app role `Talos.Reader` names no tenant"),
            "{error}"
        );
        let error = rule_refused(
            with(
                &two,
                &format!("      - {{ app_roles: [\"{PARTNER}x/Talos.Reader\"], roles: [os:reader] }}\n"),
            )
            .unwrap(),
        );
        assert!(error.contains("which issuer `login` does not allow"), "{error}");
        // Pinned, it loads, and the rules are read against both tenants.
        let pinned = with(
            &two,
            &format!(
                "      - {{ app_roles: [\"{PARTNER}/Talos.Reader\"], roles: [os:reader] }}\n\
                 auditors: {{ app_roles: [\"{HOME}/Talos.Auditor\"], client_ids: [siem] }}\n\
                 admins: {{ app_roles: [\"{}/Talos.Admin\"] }}\n",
                HOME.to_uppercase()
            ),
        )
        .unwrap();
        let tenancy = pinned.identity.tenancy();
        let both = [HOME.to_owned(), PARTNER.to_owned()];
        assert_eq!(tenancy.tenants(LOGIN_ISSUER), Some(&both[..]));
        assert_eq!(pinned.clusters["prod"].policy(&tenancy).tenancy, tenancy);
        crate::policy::ClusterPolicy::new(pinned.clusters["prod"].policy(&tenancy)).unwrap();
        // One tenant: the role alone is that tenant's.
        let single = with(MINIMAL, "auditors: { app_roles: [Talos.Auditor] }\n").unwrap();
        assert_eq!(single.identity.tenancy().home(LOGIN_ISSUER), Some(HOME));
        // A trusted issuer without tenants: a tenant in its rule is refused.
        let ci = format!(
            "{}      - {{ app_roles: [\"{HOME}/Talos.Reader\"], roles: [os:reader], issuers: [ci] }}\n",
            MINIMAL.replace(
                "identity:\n",
                "identity:\n  trusted_issuers:\n    - { name: ci, kind: oidc, issuer: \"https://ci.example.com\", audiences: [talos-sso] }\n"
            )
        );
        let error = rule_refused(Config::from_yaml(&ci).unwrap());
        assert!(
            error.starts_with("rule 1: app role")
                && error.contains("but issuer `ci` has no tenants: write the role alone, `Talos.Reader`"),
            "{error}"
        );
    }

    #[test]
    fn audit_feeds_and_application_auditors_are_configured_and_checked() {
        let config = Config::from_yaml(&format!(
            "{MINIMAL}auditors: {{ app_roles: [Talos.Auditor], client_ids: [siem] }}\n{}",
            "audit: { feed: { max_streams: 2, heartbeat: 5s, poll_interval: 1s } }\n"
        ))
        .unwrap();
        assert_eq!(config.auditors.client_ids, ["siem"]);
        assert_eq!(config.audit.feed.max_streams, 2);
        assert_eq!(config.audit.feed.heartbeat, Duration::from_secs(5));
        let defaults = Config::from_yaml(MINIMAL).unwrap().audit.feed;
        assert_eq!(
            (defaults.max_streams, defaults.heartbeat, defaults.poll_interval),
            (16, Duration::from_secs(15), Duration::from_secs(5))
        );
        assert_eq!(
            (defaults.max_streams_per_identity, defaults.write_timeout),
            (2, Duration::from_secs(30))
        );
        for (feed, expected) in [
            (
                "max_streams: 0",
                "audit.feed.max_streams and audit.feed.max_streams_per_identity must be at least 1",
            ),
            (
                "max_streams_per_identity: 0",
                "max_streams_per_identity must be at least 1",
            ),
            ("heartbeat: 0s", "must be above zero"),
            ("write_timeout: 0s", "must be above zero"),
            ("poll_interval: 0s", "must be above zero"),
            ("streams: 3", "unknown field `streams`"),
        ] {
            let text = format!("{MINIMAL}audit: {{ feed: {{ {feed} }} }}\n");
            let error = Config::from_yaml(&text).unwrap_err().to_string();
            assert!(
                error.contains(expected),
                "{feed}: expected {expected:?} in {error}"
            );
        }
    }

    /// `MINIMAL` with one trusted issuer, written as `entry` (YAML flow map).
    fn with_trusted(entry: &str) -> String {
        MINIMAL.replace(
            "identity:\n",
            &format!("identity:\n  trusted_issuers:\n    - {entry}\n"),
        )
    }

    #[test]
    fn trusted_issuers_are_checked_at_load() {
        let config = Config::from_yaml(&with_trusted(
            r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com", audiences: [talos-sso], username_claim: sub }"#,
        ))
        .unwrap();
        let issuers = config.identity.issuers();
        assert_eq!(
            issuers.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            ["login", "ci"]
        );
        assert_eq!(
            issuers[1].clients,
            Vec::<String>::new(),
            "only the login issuer checks azp/appid"
        );
        assert_eq!(issuers[1].section(), "identity.trusted_issuers[ci]");

        let cases = [
            (
                r#"{ name: login, kind: oidc, issuer: "https://ci.example.com", audiences: [a] }"#,
                "two issuers are named `login`",
            ),
            (
                r#"{ name: "c i", kind: oidc, issuer: "https://ci.example.com", audiences: [a] }"#,
                "identity.trusted_issuers[c i].name",
            ),
            (
                r#"{ name: ci, kind: saml, issuer: "https://ci.example.com", audiences: [a] }"#,
                "identity.trusted_issuers[ci].kind: unknown kind `saml`; the kinds are oidc, entra",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com", audiences: [] }"#,
                "identity.trusted_issuers[ci].audiences",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com" }"#,
                "audiences",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com", audiences: [a], client_id: x }"#,
                "client_id",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com", audiences: [a], allowed_tenants: [t] }"#,
                "`allowed_tenants` is for Entra issuers",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://login.microsoftonline.com/{tenantid}/v2.0", audiences: [a] }"#,
                "is an Entra multi-tenant issuer",
            ),
            (
                r#"{ name: ci, kind: entra, issuer: "https://login.microsoftonline.com/t2/v2.0", audiences: [a] }"#,
                "identity.trusted_issuers[ci]: an Entra issuer needs `allowed_tenants`",
            ),
            // The same issuer twice, whatever the kind or the form.
            (
                r#"{ name: ci, kind: oidc, issuer: "https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0", audiences: [a] }"#,
                "identity and identity.trusted_issuers[ci] both accept tokens of issuer \
                 `https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0`",
            ),
            (
                r#"{ name: ci, kind: entra, issuer: "https://login.microsoftonline.com/{tenantid}/v2.0", audiences: [a], allowed_tenants: ["72F988BF-86F1-41AF-91AB-2D7CD011DB47"] }"#,
                "both accept tokens of issuer",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com", audiences: [a], additional_issuers: ["https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/"] }"#,
                "both accept tokens of issuer `https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/`",
            ),
        ];
        for (entry, expected) in cases {
            let error = Config::from_yaml(&with_trusted(entry)).unwrap_err().to_string();
            assert!(error.contains(expected), "expected {expected:?} in {error}");
        }
        // A template needs tenants, as it always did.
        let template = MINIMAL
            .replace(
                "  allowed_tenants: [\"72f988bf-86f1-41af-91ab-2d7cd011db47\"]\n",
                "",
            )
            .replace("72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0", "{tenantid}/v2.0");
        let error = Config::from_yaml(&template).unwrap_err().to_string();
        assert!(error.contains("`allowed_tenants`"), "{error}");
    }

    #[test]
    fn environment_overrides_file_values_and_toml_works() {
        let dir = tempfile_dir();
        let yaml = dir.join("config.yaml");
        std::fs::write(&yaml, MINIMAL).unwrap();
        let env = [
            (
                "TALOS_SSO__DATABASE__URL".to_owned(),
                "postgres://talos_sso@db/talos_sso".to_owned(),
            ),
            ("TALOS_SSO__LISTEN".to_owned(), "127.0.0.1:9443".to_owned()),
            ("TALOS_SSO__IDENTITY__AUDIENCES".to_owned(), "a,b".to_owned()),
            ("UNRELATED".to_owned(), "x".to_owned()),
        ];
        let config = Config::load_with_env(&yaml, env).unwrap();
        assert_eq!(
            config.database.url.as_deref(),
            Some("postgres://talos_sso@db/talos_sso")
        );
        assert_eq!(config.listen, "127.0.0.1:9443".parse().unwrap());
        assert_eq!(config.identity.login_issuer().audiences, ["a", "b"]);

        // A typo in an override is blamed on the variable, not the file.
        let unknown = [
            ("TALOS_SSO__DATABASE__URLL".to_owned(), "x".to_owned()),
            ("TALOS_SSO__LISTEN".to_owned(), "127.0.0.1:9443".to_owned()),
        ];
        let error = Config::load_with_env(&yaml, unknown).unwrap_err();
        assert!(matches!(error, ConfigError::Environment { .. }), "{error:?}");
        let error = error.to_string();
        assert!(
            error.starts_with("invalid configuration from the environment (TALOS_SSO__DATABASE__URLL): "),
            "{error}"
        );
        assert!(error.contains("urll"), "{error}");
        let bad_value = [("TALOS_SSO__CLUSTERS__PROD__TTL".to_owned(), "soon".to_owned())];
        let error = Config::load_with_env(&yaml, bad_value).unwrap_err().to_string();
        assert!(
            error.contains("from the environment (TALOS_SSO__CLUSTERS__PROD__TTL)"),
            "{error}"
        );
        // A mistake in the file stays the file's, overrides or not.
        let broken = dir.join("broken.yaml");
        std::fs::write(
            &broken,
            MINIMAL.replace("    rules:", "    maxttl: 5m\n    rules:"),
        )
        .unwrap();
        let env = [("TALOS_SSO__LISTEN".to_owned(), "127.0.0.1:9443".to_owned())];
        let error = Config::load_with_env(&broken, env).unwrap_err();
        assert!(matches!(error, ConfigError::Invalid(_)), "{error:?}");

        let toml = dir.join("config.toml");
        std::fs::write(
            &toml,
            r#"
insecure_http = true
[identity]
issuer = "https://idp.example.com"
client_id = "cli"
[clusters.lab]
endpoints = ["10.0.0.2"]
ca = { cert_file = "/ca.crt", key_file = "/ca.key" }
rules = [ { users = ["alice"], roles = ["os:reader"] } ]
"#,
        )
        .unwrap();
        let config = Config::load_with_env(&toml, []).unwrap();
        assert_eq!(config.clusters["lab"].endpoints, ["10.0.0.2"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn overrides_reach_capitalised_clusters_and_lists_and_cluster_files_join() {
        let dir = tempfile_dir();
        let yaml = dir.join("config.yaml");
        std::fs::write(
            &yaml,
            MINIMAL.replace("  prod:\n", "  Prod:\n").replace(
                "insecure_http: true\n",
                "insecure_http: true\nclusters_dir: clusters.d\nauditors: { groups: [a] }\n",
            ),
        )
        .unwrap();
        std::fs::create_dir(dir.join("clusters.d")).unwrap();
        std::fs::write(
            dir.join("clusters.d/lab.toml"),
            "endpoints = [\"10.0.0.2\"]\nca = { cert_file = \"/ca.crt\", key_file = \"/ca.key\" }\n",
        )
        .unwrap();
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let config = Config::load_with_env(
            &yaml,
            env(&[
                ("TALOS_SSO__CLUSTERS__PROD__TTL", "10m"),
                ("TALOS_SSO__CLUSTERS__PROD__ENDPOINTS", "cp-1,cp-2"),
                ("TALOS_SSO__CLUSTERS__LAB__NODES", "[n-1, n-2]"),
                ("TALOS_SSO__AUDITORS__GROUPS", "g-1, g-2"),
                ("TALOS_SSO__ADMINS__GROUPS", "[g-3]"),
                ("TALOS_SSO__DATABASE__MAX_CONNECTIONS", "4"),
            ]),
        )
        .unwrap();
        let prod = &config.clusters["Prod"];
        assert_eq!(prod.ttl, Duration::from_secs(600));
        assert_eq!(prod.endpoints, ["cp-1", "cp-2"]);
        assert_eq!(config.clusters["lab"].nodes, ["n-1", "n-2"]);
        assert_eq!(config.auditors.groups, ["g-1", "g-2"]);
        assert_eq!(config.admins.groups, ["g-3"]);
        assert_eq!(config.database.max_connections, Some(4));
        assert_eq!(config.fingerprint.len(), 64);
        // A list key the file does not set takes the `[a, b]` form; a plain
        // value there is a mistake, named with its variable.
        let error = Config::load_with_env(
            &yaml,
            env(&[("TALOS_SSO__CLUSTERS__LAB__DEFAULT_ROLES", "os:reader")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.starts_with(
                "invalid configuration from the environment (TALOS_SSO__CLUSTERS__LAB__DEFAULT_ROLES)"
            ),
            "{error}"
        );
        // The folder moves with the environment too, and a change in it
        // changes the fingerprint a reload watches.
        let fingerprint = config.fingerprint.clone();
        std::fs::write(
            dir.join("clusters.d/lab.toml"),
            "endpoints = [\"10.0.0.3\"]\nca = { cert_file = \"/ca.crt\", key_file = \"/ca.key\" }\n",
        )
        .unwrap();
        let source = config.source.clone().unwrap();
        let snapshot = source.snapshot().unwrap();
        assert_ne!(snapshot.fingerprint(), fingerprint);
        assert_eq!(source.load().unwrap().clusters["lab"].endpoints, ["10.0.0.3"]);
        // A snapshot loads what it read, whatever the files hold since.
        std::fs::write(
            dir.join("clusters.d/lab.toml"),
            "endpoints = [\"10.0.0.4\"]\nca = { cert_file = \"/ca.crt\", key_file = \"/ca.key\" }\n",
        )
        .unwrap();
        let loaded = snapshot.load().unwrap();
        assert_eq!(loaded.clusters["lab"].endpoints, ["10.0.0.3"]);
        assert_ne!(loaded.fingerprint, source.snapshot().unwrap().fingerprint());
        std::fs::create_dir(dir.join("elsewhere")).unwrap();
        let moved = Config::load_with_env(&yaml, env(&[("TALOS_SSO__CLUSTERS_DIR", "elsewhere")])).unwrap();
        assert!(!moved.clusters.contains_key("lab"));
        // Text alone has no folder to read clusters from.
        let error = Config::from_yaml(&format!("{MINIMAL}clusters_dir: /etc\n"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("clusters_dir is read next to a configuration file"),
            "{error}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn secrets_come_from_private_files_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile_dir();
        let secret = dir.join("db-password");
        std::fs::write(&secret, "s3cret\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            read_secret(&secret)
                .unwrap_err()
                .to_string()
                .contains("chmod 600")
        );
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut config = Config::from_yaml(MINIMAL).unwrap();
        config.database.url = Some("postgres://talos_sso@db:5432/talos_sso".into());
        config.database.password_file = Some(secret);
        assert_eq!(
            *config.database_url().unwrap(),
            "postgres://talos_sso:s3cret@db:5432/talos_sso"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "talos-sso-config-test-{}",
            crate::random::random_hex(8).unwrap()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
