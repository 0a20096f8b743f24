//! The reload watcher: on SIGHUP, and when the configuration file or a
//! file of `clusters_dir` changes (a ConfigMap update), it has the app read
//! its configuration again ([`App::reload`] applies it, or refuses it
//! whole). Started with the server, for a configuration read from a file;
//! it ends with the app.

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

use crate::app::App;
use crate::app::reload::Trigger;
use crate::config::{Config, ConfigError, Snapshot};

/// Reload on SIGHUP, and when the configuration's files change: checked
/// every `interval` (zero: on SIGHUP only), applied once the same change
/// has been seen at two checks in a row, and only if what is then read is
/// what was seen (a file written in place is not read half-written; a
/// failure while the files moved on is not reported). A change that cannot be applied is tried again at
/// every check (a Secret that arrives after its ConfigMap, a database
/// that was away), but reported (logged, counted, recorded) once for the
/// same files and the same error. Ends with the app.
///
/// `loaded` is the state of the files the running configuration was read
/// from ([`loaded_state`], taken before its CA material was read).
pub fn spawn_watcher(app: &Arc<App>, interval: Duration, loaded: WatchState) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(app);
    tokio::spawn(async move {
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(signal) => Some(signal),
            Err(error) => {
                tracing::error!(
                    "SIGHUP cannot be received ({error}); the configuration reloads when its files change"
                );
                None
            }
        };
        let mut applied = loaded;
        let mut seen_once: Option<WatchState> = None;
        let mut reported: Option<(WatchState, String)> = None;
        loop {
            let hangup = async {
                match hangups.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            let tick = async {
                if interval.is_zero() {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(interval).await;
            };
            let trigger = tokio::select! {
                Some(()) = hangup => Trigger::Signal,
                () = tick => Trigger::FileChanged,
            };
            let Some(app) = weak.upgrade() else { return };
            let (state, read) = watch_state(&app).await;
            if trigger == Trigger::FileChanged {
                if state == applied {
                    seen_once = None;
                    continue;
                }
                if seen_once.as_ref() != Some(&state) {
                    seen_once = Some(state);
                    continue;
                }
            }
            // What was compared is what is loaded: a file written in place
            // between the two would otherwise be read half-written.
            let result = app.attempt_reload(trigger, read).await;
            match &result {
                Ok(_) => {
                    applied = state;
                    seen_once = None;
                    reported = None;
                    app.report_reload(trigger, &result).await;
                }
                Err(error) => {
                    // The CA material is read after the comparison: a failure
                    // while it was being replaced (a key read half-written)
                    // says nothing of the new files; wait for them to settle.
                    if trigger == Trigger::FileChanged && named_state(&app).await != state.named {
                        seen_once = None;
                        continue;
                    }
                    let this = (state, error.to_string());
                    // An operator's SIGHUP is always answered.
                    if trigger == Trigger::Signal || reported.as_ref() != Some(&this) {
                        app.report_reload(trigger, &result).await;
                        reported = Some(this);
                    }
                }
            }
        }
    })
}

/// What the watcher compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchState {
    /// The digest of the configuration's files (their content), as
    /// [`Config::fingerprint`] has it, or why they cannot be read.
    files: String,
    /// The files the running configuration names (CA material, accepted
    /// CAs, PIN files): their identity, size and time, so that a file
    /// replaced at the same path, or a Secret's link swapped, is seen.
    named: String,
}

/// The watcher's state of the files now, and the configuration's files as
/// read for it. Read off the runtime.
async fn watch_state(app: &App) -> (WatchState, Option<Result<Snapshot, ConfigError>>) {
    let settings = app.settings();
    let Some(source) = settings.config.source.clone() else {
        let nothing = WatchState {
            files: String::new(),
            named: String::new(),
        };
        return (nothing, None);
    };
    tokio::task::spawn_blocking(move || {
        let read = source.snapshot();
        let files = match &read {
            Ok(snapshot) => snapshot.fingerprint(),
            Err(error) => format!("unreadable: {error}"),
        };
        let named = stamps(&named_files(&settings.config));
        (WatchState { files, named }, Some(read))
    })
    .await
    .unwrap_or_else(|error| {
        let failed = WatchState {
            files: format!("unreadable: {error}"),
            named: String::new(),
        };
        (failed, None)
    })
}

/// The stamps of the files the running configuration names, now (the
/// `named` of [`WatchState`], without reading the configuration again).
async fn named_state(app: &App) -> String {
    let settings = app.settings();
    tokio::task::spawn_blocking(move || stamps(&named_files(&settings.config)))
        .await
        .unwrap_or_default()
}

/// The watcher's state for `config` as it was loaded: its files' digest,
/// and the named files as they are now (call it before reading them).
pub fn loaded_state(config: &Config) -> WatchState {
    WatchState {
        files: config.fingerprint.clone(),
        named: stamps(&named_files(config)),
    }
}

fn stamps(files: &[std::path::PathBuf]) -> String {
    use std::os::unix::fs::MetadataExt;
    let mut stamps = String::new();
    for path in files {
        let stamp = match std::fs::metadata(path) {
            Ok(m) => format!(
                "{}:{}:{}:{}.{}",
                m.dev(),
                m.ino(),
                m.len(),
                m.mtime(),
                m.mtime_nsec()
            ),
            Err(error) => format!("missing ({})", error.kind()),
        };
        stamps.push_str(&format!("\n{}={stamp}", path.display()));
    }
    stamps
}

/// Every file the clusters of `config` read.
fn named_files(config: &Config) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for cluster in config.clusters.values() {
        let ca = &cluster.ca;
        files.extend(
            [
                &ca.cert_file,
                &ca.key_file,
                &ca.secrets_bundle,
                &ca.machine_config,
            ]
            .into_iter()
            .flatten()
            .cloned(),
        );
        files.extend(ca.pkcs11.iter().map(|p| p.pin_file.clone()));
        files.extend(cluster.accepted_cas.iter().cloned());
        files.extend(
            cluster
                .talos_ca
                .as_ref()
                .and_then(|t| t.source().ok())
                .map(|s| s.path().clone()),
        );
        if let Some(next) = &cluster.next_ca {
            files.push(next.cert_file.clone());
            files.extend(next.key_file.iter().cloned());
            files.extend(next.pkcs11.iter().map(|p| p.pin_file.clone()));
        }
    }
    files.sort();
    files.dedup();
    files
}
