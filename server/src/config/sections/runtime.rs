//! What the process runs with: the database, the log format, and when the
//! configuration is read again.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use zeroize::Zeroizing;

use crate::config::de::{duration, optional_duration};
use crate::config::defaults::{default_log_format, default_reload_interval};
use crate::config::{Config, ConfigError, invalid};
use crate::secret_file::read_secret;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `postgres://user@host/db` or `sqlite:///path/audit.db`; empty means
    /// SQLite in `data_dir`.
    pub url: Option<String>,
    /// File holding the Postgres password (never in the URL or on the
    /// command line).
    pub password_file: Option<PathBuf>,
    /// Pool size.
    pub max_connections: Option<u32>,
    /// How long a request waits for a database connection before
    /// answering 503 `audit_unavailable`.
    #[serde(default, deserialize_with = "optional_duration")]
    pub acquire_timeout: Option<Duration>,
    /// Run migrations at start (default true). When false, start only if
    /// every embedded migration is applied: a runtime role may not migrate.
    pub migrate_on_start: Option<bool>,
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

impl Config {
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
