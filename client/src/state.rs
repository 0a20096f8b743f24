//! The client's own configuration (XDG config dir, `talos-sso/config.yaml`):
//! the server to use, the default cluster, and which talosconfig contexts
//! this client wrote, so that `status`, `exec` and `logout` find them and
//! touch nothing else.

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
}

pub fn path() -> Option<PathBuf> {
    dirs::config_dir().map(|dir| dir.join("talos-sso").join("config.yaml"))
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
