//! Saved logins: one refresh token per (server, issuer, client id), kept in
//! the operating system's keychain or, by choice, in an owner-only file, so
//! that a later login needs no browser.
//!
//! `tokens.json` in the cache folder is the index: which logins are saved,
//! for whom, and where each token is. It holds a token itself only for the
//! file store. The store is chosen once and remembered in `config.yaml`:
//! `--token-store` (or `TALOS_SSO_TOKEN_STORE`) when given; else the one
//! remembered; else the keyring when one answers, otherwise the file with
//! a one-time notice. A remembered keyring that stops answering is an
//! error, never a silent move of tokens onto the disk. Choosing another
//! store moves the saved tokens there. Windows has no file store (its
//! owner-only protection could not be tested).

pub mod keyring;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use self::keyring::{Keyring, Vault};
use crate::files;
use crate::state::{self, TokenStore};

#[derive(Default, Serialize, Deserialize)]
struct Index {
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
    username: String,
    /// Where the token is (entries written before the keyring: the file).
    #[serde(default = "file_store")]
    store: TokenStore,
    /// The token itself, for the file store only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refresh_token: Option<String>,
}

fn file_store() -> TokenStore {
    TokenStore::File
}

/// The cache key of a provider as seen through one server.
pub fn key(server: &str, issuer: &str, client_id: &str) -> String {
    format!("{server} {issuer} {client_id}")
}

/// The index file (`tokens.json` in the cache folder).
pub fn index_path() -> Option<PathBuf> {
    crate::paths::cache_dir().map(|dir| dir.join("tokens.json"))
}

/// Whether this platform offers the file store.
const FILE_STORE_ALLOWED: bool = !cfg!(windows);

/// The saved logins, in the store chosen for them.
pub struct Cache {
    index: PathBuf,
    store: TokenStore,
    /// Connected when the keyring is the store, or holds tokens to move
    /// or forget.
    keyring: Option<Box<dyn Vault>>,
}

/// What [`choose`] decided.
struct Choice {
    store: TokenStore,
    keyring: Option<Box<dyn Vault>>,
    /// Said once, when the keyring was wanted by default and none answered.
    notice: Option<String>,
}

/// Which store to use: `requested` (the flag), else `remembered`, else the
/// keyring when `connect` succeeds, else the file.
fn choose(
    requested: Option<TokenStore>,
    remembered: Option<TokenStore>,
    connect: impl FnOnce() -> anyhow::Result<Box<dyn Vault>>,
    file_allowed: bool,
    index: &Path,
) -> anyhow::Result<Choice> {
    let file = |notice| -> anyhow::Result<Choice> {
        if !file_allowed {
            bail!(
                "this platform keeps saved logins only in its keychain (Credential Manager), \
                 and it does not answer; there is no file store here"
            );
        }
        Ok(Choice {
            store: TokenStore::File,
            keyring: None,
            notice,
        })
    };
    let keyring = |keyring| Choice {
        store: TokenStore::Keyring,
        keyring: Some(keyring),
        notice: None,
    };
    match (requested, remembered) {
        (Some(TokenStore::File), _) => file(None),
        (Some(TokenStore::Keyring), _) => connect().map(keyring).map_err(|error| {
            anyhow!(
                "--token-store keyring: {error:#}. Start or unlock a keyring (a Secret Service such as \
                 GNOME Keyring or KeePassXC on Linux), or choose --token-store file"
            )
        }),
        (None, Some(TokenStore::Keyring)) => connect().map(keyring).map_err(|error| {
            anyhow!(
                "your saved logins are in the keyring, which does not answer ({error:#}). \
                 Unlock or start it, or choose --token-store file (the next login then opens the browser)"
            )
        }),
        (None, Some(TokenStore::File)) => file(None),
        (None, None) => match connect() {
            Ok(vault) => Ok(keyring(vault)),
            Err(error) => file(Some(format!(
                "Note: no keyring answers ({error:#}), so saved logins go to an owner-only file, \
                 {}. Choose with --token-store keyring|file; this is said once.",
                index.display()
            ))),
        },
    }
}

impl Cache {
    /// The saved logins in the store chosen as the module says; the choice
    /// remembered, tokens in another store moved into it.
    pub fn open(requested: Option<TokenStore>) -> anyhow::Result<Cache> {
        let index = index_path().ok_or_else(|| anyhow!("no cache folder (HOME is not set)"))?;
        let remembered = state::load().token_store;
        let choice = choose(requested, remembered, connect_keyring, FILE_STORE_ALLOWED, &index)?;
        if let Some(notice) = &choice.notice {
            eprintln!("{notice}");
        }
        if remembered != Some(choice.store) {
            state::update(|s| s.token_store = Some(choice.store))
                .context("saving the client configuration")?;
        }
        let mut cache = Cache {
            index,
            store: choice.store,
            keyring: choice.keyring,
        };
        let moved = cache.move_into_store(connect_keyring)?;
        if moved > 0 {
            eprintln!("Moved {moved} saved login(s) to {}.", cache.describe());
        }
        Ok(cache)
    }

    /// Every saved login, wherever it is, for `logout` (nothing chosen or
    /// remembered; the keyring connected only when it holds some).
    pub fn for_logout(everything: bool) -> anyhow::Result<Cache> {
        let index = index_path().ok_or_else(|| anyhow!("no cache folder (HOME is not set)"))?;
        let in_keyring = load(&index)
            .entries
            .values()
            .any(|e| e.store == TokenStore::Keyring);
        let keyring = if in_keyring {
            Some(connect_keyring().context("removing saved logins from the keyring")?)
        } else if everything {
            // Unindexed items too, when a keyring answers.
            connect_keyring().ok()
        } else {
            None
        };
        Ok(Cache {
            index,
            store: state::load().token_store.unwrap_or(TokenStore::File),
            keyring,
        })
    }

    /// Where tokens go, for messages and `--debug`.
    pub fn describe(&self) -> String {
        match (&self.store, &self.keyring) {
            (TokenStore::Keyring, Some(vault)) => vault.describe(),
            _ => format!("the file {}", self.index.display()),
        }
    }

    /// Hold the store's lock: a refresh done under it cannot race another
    /// process using (and, with rotating refresh tokens, spending) the same
    /// token, whichever store holds it.
    pub fn lock(&self) -> std::io::Result<files::FileLock> {
        files::ensure_parent(&self.index)?;
        files::lock_sidecar(&self.index, "refresh")
    }

    /// The saved refresh token for `key`. A token the store cannot give
    /// back counts as none (the person logs in again), and is said.
    pub fn get(&self, key: &str) -> Option<Zeroizing<String>> {
        let entry = load(&self.index).entries.get(key)?.clone();
        match entry.store {
            TokenStore::File => entry.refresh_token.map(Zeroizing::new),
            TokenStore::Keyring => {
                let vault = self.keyring.as_ref()?;
                match vault.get(key) {
                    Ok(token) => token,
                    Err(error) => {
                        eprintln!("The saved login could not be read ({error:#}).");
                        None
                    }
                }
            }
        }
    }

    /// Save `refresh_token` for `key` in the chosen store.
    pub fn put(&self, key: &str, refresh_token: &str, username: &str) -> anyhow::Result<()> {
        let entry = match (self.store, &self.keyring) {
            (TokenStore::Keyring, Some(vault)) => {
                vault.set(key, refresh_token)?;
                Entry {
                    username: username.to_owned(),
                    store: TokenStore::Keyring,
                    refresh_token: None,
                }
            }
            (TokenStore::Keyring, None) => bail!("the keyring is not connected"),
            (TokenStore::File, _) => Entry {
                username: username.to_owned(),
                store: TokenStore::File,
                refresh_token: Some(refresh_token.to_owned()),
            },
        };
        let mut before = None;
        self.update(|index| before = index.entries.insert(key.to_owned(), entry))?;
        // A token left behind in the keyring would outlive its index entry.
        if let Some(Entry {
            store: TokenStore::Keyring,
            ..
        }) = before
            && self.store == TokenStore::File
            && let Some(vault) = &self.keyring
        {
            vault.delete(key)?;
        }
        Ok(())
    }

    /// Whether `token` is the one last obtained for `key` (see
    /// [`Self::remember_token`]).
    pub fn is_last_token(&self, key: &str, token: &str) -> bool {
        load(&self.index).last_tokens.get(key) == Some(&fingerprint(token))
    }

    /// Remember (a hash of) the token just obtained for `key`.
    pub fn remember_token(&self, key: &str, token: &str) -> anyhow::Result<()> {
        self.update(|index| {
            index.last_tokens.insert(key.to_owned(), fingerprint(token));
        })
    }

    /// Forget every token saved for `server` (all of them with `None`),
    /// from whichever store holds it; returns how many logins.
    pub fn forget(&self, server: Option<&str>) -> anyhow::Result<usize> {
        let prefix = server.map(|server| format!("{server} "));
        let matches = |key: &str| prefix.as_deref().is_none_or(|prefix| key.starts_with(prefix));
        let index = load(&self.index);
        let chosen: Vec<(&String, &Entry)> = index.entries.iter().filter(|(k, _)| matches(k)).collect();
        for (key, entry) in &chosen {
            if entry.store == TokenStore::Keyring {
                let vault = self
                    .keyring
                    .as_ref()
                    .ok_or_else(|| anyhow!("the keyring holding the saved login does not answer"))?;
                vault.delete(key)?;
            }
        }
        if server.is_none()
            && let Some(vault) = &self.keyring
        {
            vault.delete_all()?;
        }
        let removed = chosen.len();
        self.update(|index| {
            index.entries.retain(|k, _| !matches(k));
            index.last_tokens.retain(|k, _| !matches(k));
        })?;
        Ok(removed)
    }

    /// Move every token not in the chosen store into it; returns how many.
    /// Tokens in a keyring that does not answer stay where they are.
    fn move_into_store(
        &mut self,
        connect: impl FnOnce() -> anyhow::Result<Box<dyn Vault>>,
    ) -> anyhow::Result<usize> {
        let _lock = self.lock().context("locking the token store")?;
        let index = load(&self.index);
        let strays: Vec<(String, Entry)> = index
            .entries
            .into_iter()
            .filter(|(_, entry)| entry.store != self.store)
            .collect();
        if strays.is_empty() {
            return Ok(0);
        }
        if self.keyring.is_none() {
            match connect() {
                Ok(vault) => self.keyring = Some(vault),
                Err(_) => return Ok(0),
            }
        }
        let mut moved = 0;
        for (key, entry) in strays {
            let token = match entry.store {
                TokenStore::File => entry.refresh_token.clone().map(Zeroizing::new),
                TokenStore::Keyring => match &self.keyring {
                    Some(vault) => vault.get(&key)?,
                    None => None,
                },
            };
            let Some(token) = token else { continue };
            // Writes it into the chosen store and takes it out of the other.
            self.put(&key, &token, &entry.username)?;
            moved += 1;
        }
        Ok(moved)
    }

    fn update(&self, change: impl FnOnce(&mut Index)) -> anyhow::Result<()> {
        files::ensure_parent(&self.index).context("saving the token index")?;
        let _lock = files::lock(&self.index).context("saving the token index")?;
        let mut index = load(&self.index);
        change(&mut index);
        let text = serde_json::to_vec_pretty(&index).map_err(std::io::Error::other)?;
        files::write_atomic(&self.index, &text).context("saving the token index")
    }
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

fn connect_keyring() -> anyhow::Result<Box<dyn Vault>> {
    Ok(Box::new(Keyring::connect()?))
}

fn load(path: &Path) -> Index {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

fn fingerprint(token: &str) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()))
}
