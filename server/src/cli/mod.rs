//! The `talos-sso-server` command line: `serve`, `check`, `migrate`,
//! `audit verify|checkpoint|public-key|new-key`, `break-glass`, and the CA tools (`ca inspect`,
//! `ca intermediate`, `ca new`). One file per command group: `serve`,
//! `check`, `migrate`, `audit`, `break_glass`, `ca`; `files` writes what
//! the commands make.
//!
//! `anyhow` stops here: commands turn domain errors into a message and an
//! exit status; the domain modules keep their own error enums.

mod audit;
mod break_glass;
mod ca;
mod ca_patch;
mod check;
mod files;
mod migrate;
mod serve;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand};
use time::OffsetDateTime;

use crate::config::Config;

pub use audit::AuditCommand;
pub use ca::{CaCommand, CaSourceArgs, KeyTypeArg, NewCaOutput, TokenKeyTypeArg};
pub use files::write_new_files;

#[derive(Debug, Parser)]
#[command(
    name = "talos-sso-server",
    version = crate::VERSION_LINE,
    about = "Short-lived Talos client certificates for people who log in with single sign-on"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the API.
    Serve {
        /// The configuration file (YAML or TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Validate the configuration, CA material and policy examples; exit
    /// non-zero with the reasons when something is wrong.
    Check {
        /// The configuration file (YAML or TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Create or upgrade the audit database schema, connected as its owner.
    Migrate {
        /// The configuration file (YAML or TOML); its database role owns the schema.
        #[arg(long)]
        config: PathBuf,
        /// The Postgres role the server runs as: granted exactly what it
        /// needs (SELECT and INSERT; DELETE on deny_list; SELECT on every
        /// view) and checked to hold nothing more. Run again after every
        /// upgrade.
        #[arg(long, value_name = "ROLE")]
        runtime_role: Option<String>,
    },
    /// Work with the audit trail.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Issue a certificate without the identity provider (it is down) and
    /// write a talosconfig; recorded in the audit trail with the operator,
    /// host and reason.
    BreakGlass {
        /// The server's configuration file (YAML or TOML).
        #[arg(long)]
        config: PathBuf,
        /// The cluster to issue for, as named in the configuration.
        #[arg(long)]
        cluster: String,
        /// Talos role to grant (repeat for several).
        #[arg(long = "role", required = true)]
        roles: Vec<String>,
        /// Certificate lifetime, at most the cluster's max_ttl.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "15m")]
        ttl: Duration,
        /// Why the identity provider cannot be used (required; recorded).
        #[arg(long)]
        reason: String,
        /// Where to write the talosconfig (must not exist; mode 0600), or
        /// `-` for standard output (then nothing else goes there: in a
        /// container, `kubectl exec ... --out - > file`).
        #[arg(long)]
        out: PathBuf,
    },
    /// Work with Talos CA material.
    #[command(subcommand)]
    Ca(Box<CaCommand>),
}

/// A configuration error as the operator reads it: prefixed with the file,
/// unless the file is fine and an environment override is not.
fn config_error_message(path: &Path, error: &crate::config::ConfigError) -> String {
    match error {
        crate::config::ConfigError::Environment { .. } => error.to_string(),
        _ => format!("{}: {error}", path.display()),
    }
}

fn load_config(path: &Path) -> anyhow::Result<Config> {
    let config = Config::load_checked(path, crate::app::check)
        .map_err(|e| anyhow::anyhow!(config_error_message(path, &e)))?;
    crate::telemetry::init_logging(&config.log.format);
    Ok(config)
}

/// Run a command; the returned error is printed by `main` and exits 1.
pub async fn run(cli: Cli, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let now = OffsetDateTime::now_utc();
    if let Command::Ca(_) = &cli.command {
        crate::telemetry::init_logging("text");
    }
    match cli.command {
        Command::Serve { config } => serve::run(&config).await,
        Command::Check { config } => check::run(&config, now, out).await,
        Command::Migrate { config, runtime_role } => {
            migrate::run(&config, runtime_role.as_deref(), out).await
        }
        Command::Audit(command) => audit::run(command, out).await,
        Command::BreakGlass {
            config,
            cluster,
            roles,
            ttl,
            reason,
            out: path,
        } => {
            let request = crate::break_glass::BreakGlassRequest {
                cluster: &cluster,
                roles: &roles,
                ttl,
                reason: &reason,
                out: &path,
            };
            break_glass::run(&config, &request, out).await
        }
        Command::Ca(command) => ca::run(*command, now, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Subcommands and arguments under `command` that have no help text.
    fn undocumented(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if id != "help" && id != "version" && arg.get_help().is_none() {
                missing.push(format!("{path} --{id}"));
            }
        }
        for sub in command.get_subcommands() {
            let sub_path = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none() && sub.get_name() != "help" {
                missing.push(sub_path.clone());
            }
            undocumented(sub, &sub_path, missing);
        }
    }

    #[test]
    fn every_command_and_flag_has_help() {
        let mut missing = Vec::new();
        undocumented(&Cli::command(), "talos-sso-server", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }

    #[test]
    fn an_override_typo_is_not_blamed_on_the_file() {
        let path = Path::new("good.yaml");
        let typo = crate::config::ConfigError::Environment {
            variables: "TALOS_SSO__CLUSTERS__PROD__MAXTTL".into(),
            reason: "unknown field `maxttl`".into(),
        };
        let message = config_error_message(path, &typo);
        assert!(!message.contains("good.yaml"), "{message}");
        assert!(message.contains("TALOS_SSO__CLUSTERS__PROD__MAXTTL"), "{message}");
        let file = crate::config::ConfigError::Invalid("unknown field `maxttl`".into());
        assert!(config_error_message(path, &file).starts_with("good.yaml: "));
    }

    #[test]
    fn break_glass_needs_a_reason_on_the_command_line() {
        let parsed = Cli::try_parse_from([
            "talos-sso-server",
            "break-glass",
            "--config",
            "c.yaml",
            "--cluster",
            "prod",
            "--role",
            "os:reader",
            "--out",
            "o.yaml",
        ]);
        let error = parsed.unwrap_err().to_string();
        assert!(error.contains("--reason"), "{error}");
    }
}
