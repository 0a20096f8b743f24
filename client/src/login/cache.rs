//! The refresh-token cache: one entry per (server, issuer, client id) in a
//! 0600 JSON file under the XDG cache directory, so a later login needs no
//! browser. The file path always works on headless machines (no keyring).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::files;

#[derive(Default, Serialize, Deserialize)]
struct CacheFile {
    #[serde(default)]
    entries: BTreeMap<String, Entry>,
    /// SHA-256 of the last token obtained, per key: a provider whose tokens
    /// carry no id answers a refresh within the same second with the very
    /// same token, which the server takes only once.
    #[serde(default)]
    last_tokens: BTreeMap<String, String>,
}

#[derive(Clone, Serialize, Deserialize)]
struct Entry {
    refresh_token: String,
    username: String,
}

/// The cache key of a provider as seen through one server.
pub fn key(server: &str, issuer: &str, client_id: &str) -> String {
    format!("{server} {issuer} {client_id}")
}

pub fn path() -> Option<PathBuf> {
    dirs::cache_dir().map(|dir| dir.join("talos-sso").join("tokens.json"))
}

fn load(path: &std::path::Path) -> CacheFile {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

/// Hold the cache's lock: a refresh done under it cannot race another
/// process using (and, with rotating refresh tokens, spending) the same token.
pub fn lock() -> std::io::Result<Option<files::FileLock>> {
    let Some(path) = path() else { return Ok(None) };
    files::ensure_parent(&path)?;
    files::lock_sidecar(&path, "refresh").map(Some)
}

fn update(change: impl FnOnce(&mut CacheFile)) -> std::io::Result<()> {
    let Some(path) = path() else { return Ok(()) };
    files::ensure_parent(&path)?;
    let _lock = files::lock(&path)?;
    let mut cache = load(&path);
    change(&mut cache);
    let text = serde_json::to_vec_pretty(&cache).map_err(std::io::Error::other)?;
    files::write_atomic(&path, &text)
}

/// The cached refresh token for `key`.
pub fn get(key: &str) -> Option<zeroize::Zeroizing<String>> {
    let path = path()?;
    load(&path)
        .entries
        .get(key)
        .map(|e| zeroize::Zeroizing::new(e.refresh_token.clone()))
}

pub fn put(key: &str, refresh_token: &str, username: &str) -> std::io::Result<()> {
    update(|cache| {
        cache.entries.insert(
            key.to_owned(),
            Entry {
                refresh_token: refresh_token.to_owned(),
                username: username.to_owned(),
            },
        );
    })
}

fn fingerprint(token: &str) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()))
}

/// Whether `token` is the one last obtained for `key` (see
/// [`remember_token`]).
pub fn is_last_token(key: &str, token: &str) -> bool {
    path().is_some_and(|path| load(&path).last_tokens.get(key) == Some(&fingerprint(token)))
}

/// Remember (a hash of) the token just obtained for `key`.
pub fn remember_token(key: &str, token: &str) -> std::io::Result<()> {
    update(|cache| {
        cache.last_tokens.insert(key.to_owned(), fingerprint(token));
    })
}

/// Forget every token cached for `server` (all of them with `None`).
pub fn forget(server: Option<&str>) -> std::io::Result<usize> {
    let mut removed = 0;
    update(|cache| {
        let before = cache.entries.len();
        match server {
            Some(server) => {
                let prefix = format!("{server} ");
                cache.entries.retain(|k, _| !k.starts_with(&prefix));
                cache.last_tokens.retain(|k, _| !k.starts_with(&prefix));
            }
            None => {
                cache.entries.clear();
                cache.last_tokens.clear();
            }
        }
        removed = before - cache.entries.len();
    })?;
    Ok(removed)
}
