//! The workload side of `login` and `exec`: `--github-actions` and
//! `--audience` beside `--token-file`, and which token source a command
//! uses — a person's login (saved refresh token, else the browser), or a
//! workload's token ([`crate::login::workload`]), read or fetched anew for
//! each certificate and never saved.

use std::path::Path;

use anyhow::bail;
use clap::Args;

use crate::login::Tokens;
use crate::login::workload::WorkloadSource;

/// A CI job's own identity instead of a person's login.
#[derive(Debug, Clone, Default, Args)]
pub struct GitHubActionsArgs {
    /// On GitHub Actions: ask the runner for the job's ID token instead of
    /// logging in, again for each certificate (the job needs
    /// `permissions: id-token: write`).
    #[arg(long)]
    pub github_actions: bool,
    /// With --github-actions: the audience to ask the token for, the one
    /// the server's `github-actions` issuer expects.
    #[arg(long, env = "TALOS_SSO_AUDIENCE", value_name = "AUDIENCE")]
    pub audience: Option<String>,
}

/// The workload token source the command line chose, if any: `token_file`
/// or `github`; `person_flow` is whether it also asked for a person's way
/// of logging in (`--device`, `--keyboard`).
pub(super) fn source(
    token_file: Option<&Path>,
    person_flow: bool,
    github: &GitHubActionsArgs,
) -> anyhow::Result<Option<WorkloadSource>> {
    let chosen = WorkloadSource::chosen(token_file, github.github_actions, github.audience.as_deref())?;
    if chosen.is_some() && person_flow {
        bail!(
            "--device and --keyboard are ways for a person to log in; a workload's token \
             (--token-file, --github-actions) needs neither"
        );
    }
    Ok(chosen)
}

/// A workload's token, read or fetched now, as a login's tokens: no
/// refresh token, nothing to save.
pub(super) async fn tokens(source: &WorkloadSource) -> anyhow::Result<Tokens> {
    let bearer = source.token().await?;
    crate::debug::note(format_args!("sending the token from {}", source.describe()));
    Ok(Tokens {
        bearer,
        refresh_token: None,
        username: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn login_takes_a_token_file_or_github_actions() {
        let cli = Cli::try_parse_from([
            "talos-sso",
            "login",
            "--cluster",
            "prod",
            "--github-actions",
            "--audience",
            "talos-sso",
        ])
        .unwrap();
        let Command::Login(args) = cli.command else {
            panic!("{:?}", cli.command);
        };
        assert_eq!(
            source(args.method.token_file.as_deref(), false, &args.github).unwrap(),
            Some(WorkloadSource::GitHubActions {
                audience: "talos-sso".into()
            })
        );
        let cli = Cli::try_parse_from([
            "talos-sso",
            "exec",
            "--token-file",
            "/var/run/secrets/tokens/talos-sso",
            "--device",
            "--",
            "talosctl",
            "version",
        ])
        .unwrap();
        let Command::Exec(args) = cli.command else {
            panic!("{:?}", cli.command);
        };
        let error = args.login.workload_source(&args.github).unwrap_err().to_string();
        assert!(error.contains("needs neither"), "{error}");
        assert_eq!(
            source(None, false, &GitHubActionsArgs::default()).unwrap(),
            None,
            "no flag: a person's login"
        );
    }
}
