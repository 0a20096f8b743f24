//! The operating system's keychain, through `keyring-core` and each
//! platform's store: Secret Service over D-Bus on Linux and the BSDs (pure
//! Rust, `zbus`), Keychain on macOS, Credential Manager on Windows.
//!
//! Every call runs on a thread of its own with a deadline: a keychain that
//! hangs (a D-Bus service that never answers, a prompt nobody sees) becomes
//! a clear error instead of a command that never ends.

use std::collections::HashMap;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use anyhow::anyhow;
use keyring_core::{CredentialStore, Entry, Error};
use zeroize::Zeroizing;

/// Where secrets are kept, by id: the keyring, or a stand-in in tests.
pub trait Vault: Send + Sync {
    fn get(&self, id: &str) -> anyhow::Result<Option<Zeroizing<String>>>;
    fn set(&self, id: &str, secret: &str) -> anyhow::Result<()>;
    /// Whether there was something to delete.
    fn delete(&self, id: &str) -> anyhow::Result<bool>;
    /// Delete every secret of talos-sso, indexed or not (`logout --all`).
    fn delete_all(&self) -> anyhow::Result<usize>;
    /// What it is, for `--debug` and messages.
    fn describe(&self) -> String;
}

/// The service name every item is filed under (the Secret Service
/// attribute `service`; the account is the saved login's key).
pub const SERVICE: &str = "talos-sso";

/// How long connecting (and one lookup) may take before the keyring is
/// taken as not answering.
const CONNECT_LIMIT: Duration = Duration::from_secs(3);

/// How long one read, write or delete may take: long enough to type a
/// password into an unlock prompt.
const OPERATION_LIMIT: Duration = Duration::from_secs(120);

/// The account a connection check looks up (never written).
const PROBE_ACCOUNT: &str = "connection check";

pub struct Keyring {
    store: Arc<CredentialStore>,
}

impl Keyring {
    /// The platform's keychain, when it answers a lookup within a few
    /// seconds.
    pub fn connect() -> anyhow::Result<Keyring> {
        let store = bounded(CONNECT_LIMIT, "connecting to the keyring", || {
            let store = platform::store()?;
            // A lookup proves the service answers, not only the bus.
            match Entry::new_in_store(&store, SERVICE, PROBE_ACCOUNT)?.get_password() {
                Ok(_) | Err(Error::NoEntry) => Ok(store),
                Err(error) => Err(error),
            }
        })?;
        Ok(Keyring { store })
    }

    fn run<T: Send + 'static>(
        &self,
        what: &str,
        id: &str,
        work: impl FnOnce(Entry) -> keyring_core::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let store = self.store.clone();
        let id = id.to_owned();
        bounded(OPERATION_LIMIT, what, move || {
            work(Entry::new_in_store(&store, SERVICE, &id)?)
        })
    }
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Vault for Keyring {
    fn get(&self, id: &str) -> anyhow::Result<Option<Zeroizing<String>>> {
        self.run("reading from the keyring", id, |entry| {
            match entry.get_password() {
                Ok(secret) => Ok(Some(Zeroizing::new(secret))),
                Err(Error::NoEntry) => Ok(None),
                Err(error) => Err(error),
            }
        })
    }

    fn set(&self, id: &str, secret: &str) -> anyhow::Result<()> {
        let secret = Zeroizing::new(secret.to_owned());
        self.run("writing to the keyring", id, move |entry| {
            entry.set_password(&secret)
        })
    }

    fn delete(&self, id: &str) -> anyhow::Result<bool> {
        self.run("deleting from the keyring", id, |entry| {
            match entry.delete_credential() {
                Ok(()) => Ok(true),
                Err(Error::NoEntry) => Ok(false),
                Err(error) => Err(error),
            }
        })
    }

    fn delete_all(&self) -> anyhow::Result<usize> {
        let store = self.store.clone();
        bounded(
            OPERATION_LIMIT,
            "clearing talos-sso from the keyring",
            move || {
                let spec = HashMap::from([("service", SERVICE)]);
                let found = match Entry::search_in_store(&store, &spec) {
                    Ok(found) => found,
                    // Stores that cannot search hold only indexed items.
                    Err(Error::NotSupportedByStore(_)) => return Ok(0),
                    Err(error) => return Err(error),
                };
                let mut deleted = 0;
                for entry in found {
                    match entry.delete_credential() {
                        Ok(()) => deleted += 1,
                        Err(Error::NoEntry) => {}
                        Err(error) => return Err(error),
                    }
                }
                Ok(deleted)
            },
        )
    }

    fn describe(&self) -> String {
        format!("the keyring ({})", platform::NAME)
    }
}

/// The platform's store and its name: one `cfg` per platform.
#[cfg(any(
    target_os = "linux",
    target_os = "freebsd",
    target_os = "openbsd",
    target_os = "netbsd"
))]
mod platform {
    use super::*;
    pub const NAME: &str = "Secret Service";
    pub fn store() -> keyring_core::Result<Arc<CredentialStore>> {
        zbus_secret_service_keyring_store::Store::new().map(|store| store as Arc<CredentialStore>)
    }
}

#[cfg(target_os = "macos")]
mod platform {
    use super::*;
    pub const NAME: &str = "macOS Keychain";
    pub fn store() -> keyring_core::Result<Arc<CredentialStore>> {
        apple_native_keyring_store::keychain::Store::new().map(|store| store as Arc<CredentialStore>)
    }
}

#[cfg(windows)]
mod platform {
    use super::*;
    pub const NAME: &str = "Windows Credential Manager";
    pub fn store() -> keyring_core::Result<Arc<CredentialStore>> {
        windows_native_keyring_store::Store::new().map(|store| store as Arc<CredentialStore>)
    }
}

#[cfg(not(any(
    target_os = "linux",
    target_os = "freebsd",
    target_os = "openbsd",
    target_os = "netbsd",
    target_os = "macos",
    windows
)))]
mod platform {
    use super::*;
    pub const NAME: &str = "none on this platform";
    pub fn store() -> keyring_core::Result<Arc<CredentialStore>> {
        Err(Error::NotSupportedByStore("no keyring on this platform".into()))
    }
}

/// `work` on a thread of its own, waited for at most `limit`. A call that
/// overruns is left to finish on its own; the command goes on without it.
fn bounded<T: Send + 'static>(
    limit: Duration,
    what: &str,
    work: impl FnOnce() -> keyring_core::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let (answer, answered) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("keyring".into())
        .spawn(move || {
            let _ = answer.send(work());
        })
        .map_err(|error| anyhow!("{what}: {error}"))?;
    match answered.recv_timeout(limit) {
        Ok(Ok(value)) => Ok(value),
        // The message of a keyring error never holds the secret; it comes
        // from another process (over D-Bus), so it is escaped and bounded.
        Ok(Err(error)) => Err(anyhow!(
            "{what}: {}",
            talos_sso_text::bounded(&error.to_string(), 300)
        )),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(anyhow!(
            "{what}: no answer within {}",
            humantime::format_duration(limit)
        )),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(anyhow!("{what}: the call ended without an answer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_that_overruns_its_limit_is_an_error_naming_the_wait() {
        let error = bounded(Duration::from_millis(50), "reading from the keyring", || {
            std::thread::sleep(Duration::from_secs(2));
            Ok(())
        })
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "reading from the keyring: no answer within 50ms"
        );
    }

    #[test]
    fn a_keyring_error_is_said_with_what_was_being_done() {
        let error = bounded(
            Duration::from_secs(5),
            "writing to the keyring",
            || -> keyring_core::Result<()> { Err(Error::NoStorageAccess("locked".into())) },
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("writing to the keyring: Couldn't access platform storage"),
            "{error}"
        );
    }

    #[test]
    fn a_keyring_error_reaches_the_terminal_escaped() {
        let error = bounded(
            Duration::from_secs(5),
            "reading from the keyring",
            || -> keyring_core::Result<()> {
                Err(Error::PlatformFailure("locked \u{1b}[2J by the service".into()))
            },
        )
        .unwrap_err()
        .to_string();
        assert!(!error.contains('\u{1b}'), "{error}");
        assert!(error.contains("locked"), "{error}");
    }
}
