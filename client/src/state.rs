//! The client's own configuration (XDG config dir, `talos-sso/config.yaml`):
//! the server to use, the default cluster, and which talosconfig contexts
//! this client wrote, so that `status`, `exec` and `logout` find them and
//! touch nothing else; and where saved logins are kept.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::files;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClientState {
    #[serde(default)]
    pub server: Option<String>,
    #[serde(default)]
    pub default_cluster: Option<String>,
    /// Logins by cluster name.
    #[serde(default)]
    pub logins: BTreeMap<String, LoginRecord>,
    /// Certificate authorities trusted for each server (and its identity
    /// provider) beyond the system's, by server address.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub trust: BTreeMap<String, crate::trust::ServerTrust>,
    /// Where refresh tokens are kept: chosen at the first login (the
    /// keyring when one answers) or with `--token-store`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_store: Option<TokenStore>,
}

/// Where the refresh tokens of saved logins are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TokenStore {
    /// The operating system's keychain: Secret Service (GNOME Keyring,
    /// KWallet, KeePassXC) on Linux, Keychain on macOS, Credential Manager
    /// on Windows.
    Keyring,
    /// An owner-only (0600) file in the cache folder (not on Windows).
    File,
}

impl TokenStore {
    pub fn name(self) -> &'static str {
        match self {
            TokenStore::Keyring => "keyring",
            TokenStore::File => "file",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LoginRecord {
    pub server: String,
    pub context: String,
    pub talosconfig: PathBuf,
    pub username: String,
    pub roles: Vec<String>,
    /// RFC 3339.
    pub not_after: String,
    /// The server's `endpoints` and `nodes` as last written into the
    /// context: a value in the file that differs from these is the
    /// person's own and the next login keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets_written: Option<crate::talosconfig::Targets>,
    /// Made with a workload's token (`--token-file`, `--github-actions`):
    /// renewed only with such a token again, never by `watch` or a
    /// person's login, which would put a person's certificate in the
    /// workload's context.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub workload: bool,
}

pub fn path() -> Option<PathBuf> {
    crate::paths::config_dir().map(|dir| dir.join("config.yaml"))
}

pub fn load() -> ClientState {
    path()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| serde_yaml_ng::from_str(&text).ok())
        .unwrap_or_default()
}

/// Read-modify-write under the file's lock.
pub fn update(change: impl FnOnce(&mut ClientState)) -> std::io::Result<ClientState> {
    let Some(path) = path() else {
        return Err(std::io::Error::other("no configuration directory (HOME unset)"));
    };
    files::ensure_parent(&path)?;
    let _lock = files::lock(&path)?;
    let mut state: ClientState = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_yaml_ng::from_str(&text).ok())
        .unwrap_or_default();
    change(&mut state);
    let text = serde_yaml_ng::to_string(&state).map_err(std::io::Error::other)?;
    files::write_atomic(&path, text.as_bytes())?;
    Ok(state)
}
