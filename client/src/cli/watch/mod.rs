//! `watch` (and `login --watch`): keep the certificates of saved logins
//! fresh in the background, so that plain `talosctl` keeps working with
//! five-minute certificates.
//!
//! It renews only with the saved refresh token, never by opening a browser:
//! it runs unattended (a systemd user unit, a launchd agent, a terminal
//! pane), and a login that is gone (logged out, refresh token revoked or
//! expired, deny-listed, group removed) is for the person to redo. It ends
//! with status 4 (a login is needed) or 5 (refused) when no login is left.
//!
//! One watch per talosconfig: it holds `<talosconfig>.watch` locked, and a
//! second one refuses to start. Renewals share the token store's lock with
//! `login` and `exec`, so two of them never spend one rotating refresh
//! token; the talosconfig is replaced atomically, so a `talosctl` reading
//! it at that moment reads a whole file.
//!
//! - `schedule`: when to renew, retry or stop; the loop, on an injectable
//!   clock.

pub mod schedule;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use time::OffsetDateTime;

use self::schedule::{Event, RenewalError, Settings, Validity, WatchEnv, Watched};
use super::exit::{self, Outcome};
use super::login::{LOGIN_TIMEOUT, LoginArgs, LoginMethod, login_with};
use super::select::LoginSelection;
use crate::files::{self, FileLock, TryLock};
use crate::state;
use crate::talosconfig;

#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub select: LoginSelection,
}

/// The watch's lock on `talosconfig`, or why it cannot have it.
pub fn lock_talosconfig(talosconfig: &Path) -> anyhow::Result<FileLock> {
    let note = format!("talos-sso watch, process {}\n", std::process::id());
    match files::try_lock_sidecar(talosconfig, "watch", &note)
        .with_context(|| format!("locking {} for the watch", talosconfig.display()))?
    {
        TryLock::Held(lock) => Ok(lock),
        TryLock::Busy { note } => bail!(
            "another watch already keeps the logins in {} fresh ({}); stop it first, or keep one \
             watch for that file",
            talos_sso_text::escape(&talosconfig.display().to_string()),
            talos_sso_text::bounded(note.trim(), 100)
        ),
    }
}

/// `talos-sso watch`: keep the selected logins (default: every one) fresh.
pub async fn watch(args: &WatchArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    let saved = state::load();
    let (workloads, selected): (Vec<_>, Vec<_>) = args
        .select
        .select(&saved)
        .into_iter()
        .partition(|(_, record)| record.workload);
    if selected.is_empty() {
        let error = if !workloads.is_empty() {
            // Its token is the workload's to present again, not ours.
            anyhow!(
                "nothing to keep fresh: a workload's login is renewed by `talos-sso exec --token-file` \
                 (or --github-actions), not by a watch"
            )
        } else if args.select.is_narrowed() {
            let what = args.select.describe();
            anyhow!("nothing to keep fresh: no login for {what}; run `talos-sso login` first")
        } else {
            anyhow!("nothing to keep fresh: no login yet; run `talos-sso login` first")
        };
        return Err(exit::classed(Outcome::LoginNeeded, error));
    }
    let mut locks = BTreeMap::new();
    for (_, record) in selected {
        if !locks.contains_key(&record.talosconfig) {
            let lock = lock_talosconfig(&record.talosconfig)?;
            locks.insert(record.talosconfig.clone(), lock);
        }
    }
    run(args.select.clone(), locks, out).await
}

/// `talos-sso login --watch`: log in, then keep that login fresh.
pub async fn login_then_watch(args: &LoginArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    // Refuse before the login, not after it, when a watch already runs.
    let path = super::login::default_talosconfig(args.talosconfig.as_deref())?;
    let lock = lock_talosconfig(&path)?;
    let record = super::login::login(args, out).await?;
    let cluster = state::load()
        .logins
        .into_iter()
        .find(|(_, saved)| *saved == record)
        .map(|(cluster, _)| cluster)
        .ok_or_else(|| anyhow!("the login just made is not in the client configuration"))?;
    let select = LoginSelection {
        cluster: Some(cluster),
        talosconfig: Some(record.talosconfig.clone()),
        context: Some(record.context.clone()),
    };
    run(select, BTreeMap::from([(path, lock)]), out).await
}

async fn run(
    select: LoginSelection,
    locks: BTreeMap<PathBuf, FileLock>,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let mut env = SystemEnv { select, locks, out };
    let outcome = schedule::run(&mut env, Settings::default()).await;
    let error = anyhow!("no login is left to keep fresh; run `talos-sso login`, then start the watch again");
    Err(exit::classed(outcome, error))
}

/// The watch in the real world: the wall clock, Tokio's timer, the client
/// configuration and talosconfig files, the server and the provider.
struct SystemEnv<'a> {
    select: LoginSelection,
    /// Held for as long as the watch runs, by talosconfig.
    locks: BTreeMap<PathBuf, FileLock>,
    out: &'a mut dyn Write,
}

impl SystemEnv<'_> {
    /// Whether this watch holds the lock of `talosconfig`, taking it for a
    /// file first seen now (a login made after the watch started).
    fn holds(&mut self, talosconfig: &Path) -> bool {
        if self.locks.contains_key(talosconfig) {
            return true;
        }
        match lock_talosconfig(talosconfig) {
            Ok(lock) => {
                self.locks.insert(talosconfig.to_owned(), lock);
                true
            }
            // Another watch keeps that file fresh.
            Err(_) => false,
        }
    }
}

/// Log in with `args` where no person answers (`watch`, and `exec` with a
/// workload's token): the new certificate's validity, or why there is
/// none, as [`schedule`] judges it.
pub(super) async fn renew_unattended(args: &LoginArgs) -> Result<Validity, RenewalError> {
    // `login`'s own line is not what a watch says.
    let mut said = Vec::new();
    match login_with(args, None, &mut said).await {
        Ok(record) => validity(&record.talosconfig, &record.context)
            .ok_or_else(|| RenewalError::Transient("the certificate written cannot be read back".into())),
        Err(error) => {
            let reason = super::error_text(&error);
            match Outcome::of_error(&error) {
                outcome @ (Outcome::LoginNeeded | Outcome::Refused) => {
                    Err(RenewalError::Gone { outcome, reason })
                }
                Outcome::Success | Outcome::Error | Outcome::Usage => Err(RenewalError::Transient(reason)),
            }
        }
    }
}

/// The certificate of `context` in `talosconfig`.
pub(super) fn validity(talosconfig: &Path, context: &str) -> Option<Validity> {
    let stored = talosconfig::read_context(talosconfig, context).ok().flatten()?;
    let leaf = crate::certinfo::leaf_info(&stored.crt_pem)?;
    Some(Validity {
        not_before: leaf.not_before,
        not_after: leaf.not_after,
    })
}

impl WatchEnv for SystemEnv<'_> {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    async fn nap(&mut self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    fn logins(&mut self) -> Vec<Watched> {
        let saved = state::load();
        let mut logins = Vec::new();
        for (cluster, record) in self.select.select(&saved) {
            if !record.workload && self.holds(&record.talosconfig) {
                logins.push(Watched {
                    cluster: cluster.clone(),
                    validity: validity(&record.talosconfig, &record.context),
                });
            }
        }
        logins
    }

    async fn renew(&mut self, cluster: &str) -> Result<Validity, RenewalError> {
        let gone = |reason: String| RenewalError::Gone {
            outcome: Outcome::LoginNeeded,
            reason,
        };
        let Some(record) = state::load().logins.remove(cluster) else {
            return Err(gone("logged out".into()));
        };
        let args = LoginArgs {
            server: Some(record.server.clone()),
            cluster: Some(cluster.to_owned()),
            roles: record.roles.clone(),
            ttl: None,
            method: LoginMethod::default(),
            github: Default::default(),
            timeout: LOGIN_TIMEOUT,
            talosconfig: Some(record.talosconfig.clone()),
            context: Some(record.context.clone()),
            set_current: false,
            certificate_authority: None,
            provider_certificate_authority: None,
            watch: false,
            ttl_up_to_cluster_max: false,
            silent_only: true,
        };
        renew_unattended(&args).await
    }

    fn report(&mut self, event: Event) {
        let line = event_line(&event);
        // The person may have closed the terminal; the renewals go on.
        let _ = match event {
            Event::Watching { .. } | Event::Renewed { .. } => writeln!(self.out, "{line}"),
            Event::Retrying { .. } | Event::LoggedOut { .. } | Event::Dropped { .. } => {
                writeln!(std::io::stderr(), "{line}")
            }
        };
    }
}

/// An instant as the watch prints it: UTC, to the second.
fn stamp(at: OffsetDateTime) -> String {
    let at = at.replace_nanosecond(0).unwrap_or(at);
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The line the watch prints for `event`; cluster names and reasons come
/// from the configuration, the server and the provider: escaped.
pub(super) fn event_line(event: &Event) -> String {
    use talos_sso_text::escape;
    let now = stamp(OffsetDateTime::now_utc());
    match event {
        Event::Watching { cluster, next } => format!(
            "{now} watching {}: next renewal at {}",
            escape(cluster),
            stamp(*next)
        ),
        Event::Renewed {
            cluster,
            not_after,
            next,
        } => format!(
            "{now} renewed {}: valid until {}, next renewal at {}",
            escape(cluster),
            stamp(*not_after),
            stamp(*next)
        ),
        Event::Retrying { cluster, reason, at } => format!(
            "{now} could not renew {} ({reason}); trying again at {}",
            escape(cluster),
            stamp(*at)
        ),
        Event::LoggedOut { cluster } => format!(
            "{now} stopped keeping {} fresh: it was logged out",
            escape(cluster)
        ),
        Event::Dropped { cluster, reason } => format!(
            "{now} stopped keeping {c} fresh: {reason}. Run `talos-sso login --cluster {c}`.",
            c = escape(cluster)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_watch_on_one_talosconfig_is_refused_and_told_who_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let talosconfig = dir.path().join("config");
        let held = lock_talosconfig(&talosconfig).unwrap();
        let error = lock_talosconfig(&talosconfig).unwrap_err().to_string();
        assert!(
            error.contains("another watch already keeps the logins in")
                && error.contains(&format!("talos-sso watch, process {}", std::process::id())),
            "{error}"
        );
        drop(held);
        lock_talosconfig(&talosconfig).unwrap();
    }

    #[test]
    fn watch_lines_escape_what_came_from_outside() {
        let line = event_line(&Event::Dropped {
            cluster: "prod\u{1b}[2J".into(),
            reason: "refused".into(),
        });
        assert!(line.contains("prod\\u{1b}[2J"), "{line}");
        assert!(!line.contains('\u{1b}'), "{line}");
    }
}
