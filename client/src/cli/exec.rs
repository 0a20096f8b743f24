//! `exec`: renew the certificate when it has less than a minute left, then
//! run a command with `TALOSCONFIG` pointing at a private copy of it. Once
//! the command ran, its own status is ours; before, ours is the class of
//! what stopped it (4 a login is needed, 5 refused: see [`super::exit`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow};

use super::exit::{self, Outcome};
use super::login::{LOGIN_TIMEOUT, LoginArgs, LoginMethod, login};
use super::select::LoginSelection;
use super::status::login_status;
use crate::state;
use crate::talosconfig;

/// Least time left on the certificate when the command starts, in seconds.
const MIN_LEFT: u64 = 60;

pub(super) async fn exec(
    select: &LoginSelection,
    login_args: &LoginMethod,
    needed: Option<Duration>,
    command: &[String],
) -> anyhow::Result<ExitCode> {
    let saved = state::load();
    let (cluster, mut record) = select.one(&saved).map_err(|error| {
        // No cluster named and none logged in to yet: a login is needed
        // (the other failure, several logins matching, is an error).
        if select.cluster.is_none() && saved.default_cluster.is_none() {
            exit::classed(Outcome::LoginNeeded, error)
        } else {
            error
        }
    })?;
    let wanted_left = needed.map_or(MIN_LEFT, |n| n.as_secs().max(MIN_LEFT));
    let fresh_enough = record
        .as_ref()
        .is_some_and(|r| u64::try_from(login_status(&cluster, r).seconds_left).unwrap_or(0) >= wanted_left);
    if !fresh_enough {
        let args = LoginArgs {
            server: record.as_ref().map(|r| r.server.clone()).or(saved.server.clone()),
            cluster: Some(cluster.clone()),
            roles: record.as_ref().map(|r| r.roles.clone()).unwrap_or_default(),
            ttl: needed,
            method: login_args.clone(),
            timeout: LOGIN_TIMEOUT,
            talosconfig: record
                .as_ref()
                .map(|r| r.talosconfig.clone())
                .or(select.talosconfig.clone()),
            context: record
                .as_ref()
                .map(|r| r.context.clone())
                .or(select.context.clone()),
            set_current: false,
            certificate_authority: None,
            provider_certificate_authority: None,
            watch: false,
            ttl_up_to_cluster_max: true,
            silent_only: false,
        };
        record = Some(login(&args, &mut std::io::stderr()).await?);
    }
    let record = record.ok_or_else(|| anyhow!("no login for cluster `{cluster}`"))?;

    // A private talosconfig holding just this context, current, for the command.
    let dir = private_temp_dir()?;
    let single = dir.join("talosconfig");
    let result = (|| -> anyhow::Result<ExitCode> {
        talosconfig::write_single_context(&record.talosconfig, &record.context, &single)?;
        let (program, arguments) = command.split_first().ok_or_else(|| anyhow!("no command given"))?;
        let status = std::process::Command::new(program)
            .args(arguments)
            .env("TALOSCONFIG", &single)
            .status()
            .with_context(|| format!("cannot run `{program}`"))?;
        Ok(exit_code(status))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
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
