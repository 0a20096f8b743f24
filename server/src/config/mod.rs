//! The server's configuration as plain data: one YAML or TOML file (and,
//! optionally, a folder of cluster files, `clusters_dir`), every key
//! overridable from the environment as `TALOS_SSO__SECTION__KEY` (for
//! example `TALOS_SSO__DATABASE__URL`), unknown keys refused, secrets only
//! from files. How the file, the folder and the environment make one
//! document is `document`'s business; `source` reads them, `sections` types
//! them, `validate` checks what needs nothing but the file.
//!
//! The bottom of the crate: it imports nothing of it but the utilities
//! (`secret_file`, `text_file`) and the shared text escaping
//! (`talos-sso-text`). Checks that need a domain's knowledge
//! (issuer kinds, app roles, rules) belong to that domain and run from
//! `app::check`, given to the loader as a [`Check`] so that a mistake an
//! override makes is blamed on the override. It does not open files named
//! inside the configuration (CA material, secrets) except through
//! `database_url`, and it does not reach the network. docs/configuration.md
//! documents every key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use defaults::{default_data_dir, default_listen};

mod de;
mod defaults;
pub mod document;
mod sections;
mod source;
mod validate;

pub use defaults::DEFAULT_CLOCK_SKEW;
pub use sections::*;
pub use source::{ConfigSource, Snapshot};

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

impl From<crate::secret_file::SecretError> for ConfigError {
    fn from(error: crate::secret_file::SecretError) -> Self {
        ConfigError::Secret {
            path: error.path,
            reason: error.reason,
        }
    }
}

fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(message.into())
}

/// A check of a typed configuration that needs more than the file's own
/// rules (`app::check`: issuer kinds, app roles). The loader runs it on
/// every document it types, with and without the environment's overrides,
/// so that a mistake an override makes is blamed on the override.
pub type Check = fn(&Config) -> Result<(), ConfigError>;

/// The check of a configuration loaded without one: nothing beyond the
/// file's own rules.
fn no_check(_: &Config) -> Result<(), ConfigError> {
    Ok(())
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// TLS certificate and key; required unless `insecure_http` is set.
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
    pub rate_limits: RateLimitConfig,
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

#[cfg(test)]
pub(crate) mod tests;
