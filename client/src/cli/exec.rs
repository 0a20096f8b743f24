//! `exec`: renew the certificate when it has less than a minute left, then
//! run a command with `TALOSCONFIG` pointing at a private copy of it. Once
//! the command ran, its own status is ours; before, ours is the class of
//! what stopped it (4 a login is needed, 5 refused: see [`super::exit`]).
//!
//! With a workload's token (`--token-file`, `--github-actions`) no person
//! is there to log in again: the certificate is asked for at the start,
//! and renewed while the command runs, as `watch` renews (at two thirds of
//! its lifetime, see [`super::watch::schedule`]), each time with a token
//! read or fetched anew — a projected token's file is replaced by the
//! kubelet as it rotates. Each renewal replaces the private copy, so every
//! `talosctl` the command starts reads a valid certificate.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use time::OffsetDateTime;

use super::exit::{self, Outcome};
use super::login::{LOGIN_TIMEOUT, LoginArgs, LoginMethod, login};
use super::select::LoginSelection;
use super::status::login_status;
use super::watch::schedule::{self, Event, RenewalError, Settings, Validity, WatchEnv, Watched};
use super::workload::GitHubActionsArgs;
use crate::state::{self, LoginRecord};
use crate::talosconfig;

/// Least time left on the certificate when the command starts, in seconds.
const MIN_LEFT: u64 = 60;

#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub select: LoginSelection,
    #[command(flatten)]
    pub login: LoginMethod,
    #[command(flatten)]
    pub github: GitHubActionsArgs,
    /// The talos-sso server, when the login is made here (default:
    /// $TALOS_SSO_SERVER, else the login's, else the one remembered).
    #[arg(short, long, env = "TALOS_SSO_SERVER")]
    pub server: Option<String>,
    /// How long the command may run (e.g. `30m` for `talosctl
    /// upgrade-k8s`): the certificate is renewed to cover it, up to the
    /// cluster's longest (default: at least a minute left).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Option<Duration>,
    /// The command, after `--` (e.g. `-- talosctl get members`).
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub(super) async fn exec(args: &ExecArgs) -> anyhow::Result<ExitCode> {
    let workload = args.login.workload_source(&args.github)?;
    let saved = state::load();
    let (cluster, mut record) = args.select.one(&saved).map_err(|error| {
        // No cluster named and none logged in to yet: a login is needed
        // (the other failure, several logins matching, is an error).
        if args.select.cluster.is_none() && saved.default_cluster.is_none() {
            exit::classed(Outcome::LoginNeeded, error)
        } else {
            error
        }
    })?;
    let wanted_left = args.ttl.map_or(MIN_LEFT, |n| n.as_secs().max(MIN_LEFT));
    // A workload's certificate is always its token's own: the one in the
    // file may be a person's, or another token's.
    let fresh_enough = workload.is_none()
        && record.as_ref().is_some_and(|r| {
            u64::try_from(login_status(&cluster, r).seconds_left).unwrap_or(0) >= wanted_left
        });
    let mut login_args = LoginArgs {
        server: args
            .server
            .clone()
            .or(record.as_ref().map(|r| r.server.clone()))
            .or(saved.server.clone()),
        cluster: Some(cluster.clone()),
        // A workload is granted what its rule says.
        roles: match (&workload, &record) {
            (None, Some(r)) => r.roles.clone(),
            _ => Vec::new(),
        },
        ttl: args.ttl,
        method: args.login.clone(),
        github: args.github.clone(),
        timeout: LOGIN_TIMEOUT,
        talosconfig: record
            .as_ref()
            .map(|r| r.talosconfig.clone())
            .or(args.select.talosconfig.clone()),
        context: record
            .as_ref()
            .map(|r| r.context.clone())
            .or(args.select.context.clone()),
        set_current: false,
        certificate_authority: None,
        provider_certificate_authority: None,
        watch: false,
        ttl_up_to_cluster_max: true,
        silent_only: false,
    };
    if !fresh_enough {
        if workload.is_none() && record.as_ref().is_some_and(|r| r.workload) {
            let error = anyhow!(
                "the certificate of cluster `{cluster}` was a workload's and needs renewing: pass its \
                 --token-file (or --github-actions) again"
            );
            return Err(exit::classed(Outcome::LoginNeeded, error));
        }
        record = Some(login(&login_args, &mut std::io::stderr()).await?);
    }
    let record = record.ok_or_else(|| anyhow!("no login for cluster `{cluster}`"))?;
    // Renewals write where the first certificate went.
    login_args.server = Some(record.server.clone());
    login_args.talosconfig = Some(record.talosconfig.clone());
    login_args.context = Some(record.context.clone());

    // A private talosconfig holding just this context, current, for the command.
    let dir = private_temp_dir()?;
    let single = dir.join("talosconfig");
    let renewal = workload.is_some().then(|| Renewal {
        cluster: cluster.clone(),
        args: login_args,
        record: record.clone(),
        single: single.clone(),
    });
    let result = run_command(&record, &single, &args.command, renewal).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Run `command` on the certificate of `record`, copied to `single`; with
/// `renewal`, renewed while it runs.
async fn run_command(
    record: &LoginRecord,
    single: &Path,
    command: &[String],
    renewal: Option<Renewal>,
) -> anyhow::Result<ExitCode> {
    talosconfig::write_single_context(&record.talosconfig, &record.context, single)?;
    let (program, arguments) = command.split_first().ok_or_else(|| anyhow!("no command given"))?;
    let mut child = tokio::process::Command::new(program)
        .args(arguments)
        .env("TALOSCONFIG", single)
        .spawn()
        .with_context(|| format!("cannot run `{program}`"))?;
    let waited = match renewal {
        None => child.wait().await,
        Some(mut renewal) => {
            tokio::select! {
                status = child.wait() => status,
                // Renewals stopped (the token refused): the command goes
                // on with the certificate it has.
                _ = schedule::run(&mut renewal, Settings::default()) => child.wait().await,
            }
        }
    };
    let status = waited.with_context(|| format!("waiting for `{program}`"))?;
    Ok(exit_code(status))
}

/// The renewals of a workload's certificate while its command runs.
struct Renewal {
    cluster: String,
    /// The login each renewal makes: the token source, the talosconfig
    /// and context of the first one.
    args: LoginArgs,
    record: LoginRecord,
    /// The command's private copy.
    single: PathBuf,
}

impl WatchEnv for Renewal {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    async fn nap(&mut self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    fn logins(&mut self) -> Vec<Watched> {
        vec![Watched {
            cluster: self.cluster.clone(),
            validity: super::watch::validity(&self.record.talosconfig, &self.record.context),
        }]
    }

    async fn renew(&mut self, _cluster: &str) -> Result<Validity, RenewalError> {
        let validity = super::watch::renew_unattended(&self.args).await?;
        talosconfig::write_single_context(&self.record.talosconfig, &self.record.context, &self.single)
            .map_err(|error| {
                RenewalError::Transient(format!("cannot update the command's talosconfig: {error}"))
            })?;
        Ok(validity)
    }

    fn report(&mut self, event: Event) {
        // The command's standard output is its own: ours go to stderr.
        let line = match &event {
            Event::Dropped { cluster, reason } => format!(
                "stopped renewing the certificate of {}: {reason}; the command goes on until it expires",
                talos_sso_text::escape(cluster)
            ),
            _ => super::watch::event_line(&event),
        };
        eprintln!("{line}");
    }
}

fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return ExitCode::from(128u8.saturating_add(u8::try_from(signal).unwrap_or(127)));
        }
    }
    ExitCode::from(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1))
}

fn private_temp_dir() -> anyhow::Result<PathBuf> {
    let mut random = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random)
        .map_err(|_| anyhow!("randomness"))?;
    let name: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("talos-sso-exec-{name}"));
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder
        .create(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}
