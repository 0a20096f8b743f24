//! The command line: the clap tree of every command (`login`, `status`,
//! `logout`, `exec`, `audit`, `deny`, `completions`) and its dispatch; each
//! command group lives in its own module. `anyhow` stops here; the library
//! modules keep their own error types.
//!
//! - `login`: `login` and `logout`, and the fresh token every other command
//!   that reaches the server needs.
//! - `status`: what each login holds, read back from the talosconfig.
//! - `exec`: a command run with a fresh certificate.
//! - `workload`: a workload's own token instead of a person's login
//!   (`--token-file`, `--github-actions`).
//! - `watch`: certificates kept fresh in the background.
//! - `exit`: the process status of each outcome (4 a login is needed, 5
//!   refused, ...).
//! - `audit`: `audit list|show|export|verify` (auditors).
//! - `follow`: `audit export --follow`, the trail as it grows.
//! - `deny`: `deny add|remove|list` (administrators).
//! - `format`: `-o, --output` (table, JSON, YAML) for every command that
//!   prints data, and the terminal-safe JSON and YAML writers.
//! - `output`: audit records as a table, CSV, JSON lines, YAML and ECS JSON
//!   lines.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

pub mod audit;
mod audit_verify;
pub mod deny;
pub mod exec;
pub mod exit;
mod follow;
pub mod format;
pub mod login;
pub mod output;
pub mod select;
pub mod status;
pub mod watch;
pub mod workload;

use self::audit::AuditCommand;
use self::deny::DenyCommand;
use self::format::Format;
use self::login::LoginArgs;
use self::select::LoginSelection;
use crate::api::ApiError;

/// Log in to Talos Linux clusters with single sign-on, then use talosctl as usual.
#[derive(Debug, Parser)]
#[command(name = "talos-sso", version = crate::VERSION_LINE, propagate_version = true)]
pub struct Cli {
    /// Write the HTTP exchanges with the server and the identity provider,
    /// and the decisions taken, to standard error; tokens, codes, keys and
    /// cookies are redacted. Also TALOS_SSO_DEBUG=1.
    // Any value but an empty one, 0, false, no, off turns it on.
    #[arg(long, global = true, env = "TALOS_SSO_DEBUG", value_parser = clap::builder::FalseyValueParser::new())]
    pub debug: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Log in and write a short-lived certificate into your talosconfig.
    Login(LoginArgs),
    /// Show who you are logged in as, where, with which roles, for how long
    /// (default: every login). Exits 4 when a login shown is expired or
    /// missing, or none is found.
    Status {
        #[command(flatten)]
        select: LoginSelection,
        /// A line per login for people (table, also spelled text), or JSON
        /// or YAML for scripts.
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// Remove this tool's talosconfig contexts and cached logins (nothing
    /// else); default: the default cluster's login.
    Logout {
        #[command(flatten)]
        select: LoginSelection,
        /// Log out of every cluster and forget every saved login.
        #[arg(long, conflicts_with_all = ["cluster", "talosconfig", "context"])]
        all: bool,
    },
    /// Keep the certificates of your logins fresh in the background (default:
    /// every login), renewing each at two thirds of its lifetime with the
    /// saved refresh token; never opens a browser. Ends with status 4 (or 5)
    /// once no login is left (logged out, refresh refused, denied).
    Watch(watch::WatchArgs),
    /// Make sure the certificate is valid for at least a minute (renewing it
    /// when needed), then run a command with TALOSCONFIG set to it
    /// (default: the default cluster's login). With a workload's token
    /// (--token-file, --github-actions) the certificate is also renewed
    /// while the command runs, from a token read or fetched anew.
    Exec(exec::ExecArgs),
    /// Read the audit trail (auditors only): list, show, export, verify.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Block identities from new certificates at once (administrators).
    #[command(subcommand)]
    Deny(DenyCommand),
    /// Print this client's version and the server's, and warn when their
    /// API versions differ.
    Version {
        /// The talos-sso server (default: $TALOS_SSO_SERVER, else the one you logged in to).
        #[arg(short, long, env = "TALOS_SSO_SERVER")]
        server: Option<String>,
        /// Two lines for people (table), or JSON or YAML for scripts.
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// Print shell completions.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Whether the command stopped because its output pipe was closed
/// (`talos-sso audit export | head`): the reader has had enough, which is
/// not an error.
pub fn closed_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// A server error as the sentence [`crate::messages`] makes of it, for a
/// command that names no cluster; it keeps its exit status (see [`exit`]).
fn explained(error: ApiError) -> anyhow::Error {
    exit::explained(&error, "")
}

/// The process status of a command that failed with `error`: its class
/// (see [`exit`]).
pub fn failure_status(error: &anyhow::Error) -> ExitCode {
    exit::Outcome::of_error(error).into()
}

/// Longest error line shown, in characters.
const ERROR_CHARS: usize = 2000;

/// An error as the person reads it: the whole chain on one line, escaped and
/// bounded, since server problem details and identity provider answers end
/// up in it.
pub fn error_text(error: &anyhow::Error) -> String {
    talos_sso_text::bounded(&format!("{error:#}"), ERROR_CHARS)
}

/// Run a command; `Ok` carries the exit code (for `exec`, the child's).
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    crate::debug::enable(cli.debug);
    crate::debug::note(format_args!(
        "talos-sso {} (API {}), debug output on",
        env!("CARGO_PKG_VERSION"),
        talos_sso_api::API_VERSION
    ));
    let mut out = std::io::stdout();
    match cli.command {
        Command::Login(args) if args.watch => watch::login_then_watch(&args, &mut out).await,
        Command::Login(args) => login::login(&args, &mut out).await.map(|_| ExitCode::SUCCESS),
        Command::Watch(args) => watch::watch(&args, &mut out).await,
        Command::Status { select, output } => status::status(&select, output, &mut out).map(|all_valid| {
            if all_valid {
                ExitCode::SUCCESS
            } else {
                exit::Outcome::LoginNeeded.into()
            }
        }),
        Command::Logout { select, all } => login::logout(&select, all, &mut out).map(|_| ExitCode::SUCCESS),
        Command::Exec(args) => exec::exec(&args).await,
        Command::Version { server, output } => status::version(server.as_deref(), output, &mut out).await,
        Command::Audit(command) => {
            let terminal = std::io::IsTerminal::is_terminal(&out);
            audit::audit(command, terminal, &mut out)
                .await
                .map(|_| ExitCode::SUCCESS)
        }
        Command::Deny(command) => deny::deny(command, &mut out).await.map(|_| ExitCode::SUCCESS),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "talos-sso", &mut out);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Time left, as people read it (`4m59s`, `1h02m`, `expired`).
fn human_duration(seconds: i64) -> String {
    if seconds <= 0 {
        return "expired".into();
    }
    let (m, s) = (seconds / 60, seconds % 60);
    if m >= 60 {
        format!("{}h{:02}m", m / 60, m % 60)
    } else {
        format!("{m}m{s:02}s")
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use anyhow::anyhow;

    use super::deny::deny_entry_line;
    use super::login::{kept_line, logged_in_line, ttl_line};
    use super::status::{LoginStatus, status_line};
    use super::*;
    use crate::state::LoginRecord;

    /// Fails when `text` holds a character that must not reach a terminal
    /// as it is (line breaks between lines aside).
    pub(super) fn no_hostile_characters(text: &str) {
        let found: Vec<char> = text
            .chars()
            .filter(|c| talos_sso_text::is_unsafe(*c) && *c != '\n')
            .collect();
        assert!(found.is_empty(), "{found:?} in {text:?}");
    }

    #[test]
    fn a_record_number_below_one_is_refused() {
        for seq in ["0", "-1", "-9223372036854775808"] {
            assert!(
                Cli::try_parse_from(["talos-sso", "audit", "show", seq]).is_err(),
                "{seq}"
            );
        }
        assert!(Cli::try_parse_from(["talos-sso", "audit", "show", "1"]).is_ok());
    }

    #[test]
    fn an_error_line_is_escaped_and_bounded() {
        let detail = format!("\u{1b}[2J{}", "d".repeat(100_000));
        let shown = error_text(&anyhow::anyhow!(detail));
        assert!(
            shown.starts_with("\\u{1b}[2J") && shown.ends_with('…'),
            "{}",
            &shown[..40]
        );
        assert!(shown.chars().count() <= ERROR_CHARS);
    }

    #[test]
    fn other_outputs_escape_what_the_server_sent() {
        let hostile = "eve\u{1b}[2K\r\u{202e}";
        let shown = "eve\\u{1b}[2K\\u{d}\\u{202e}";
        let record = LoginRecord {
            server: format!("https://sso.example.com/{hostile}"),
            context: format!("prod{hostile}"),
            talosconfig: PathBuf::from(format!("/home/eve/{hostile}")),
            username: hostile.into(),
            roles: vec![format!("os:admin{hostile}")],
            not_after: String::new(),
            targets_written: None,
            workload: false,
        };
        let status = LoginStatus {
            cluster: hostile.into(),
            server: record.server.clone(),
            context: record.context.clone(),
            talosconfig: record.talosconfig.clone(),
            username: Some(hostile.into()),
            roles: record.roles.clone(),
            not_after: None,
            seconds_left: 100,
            valid: true,
        };
        let entry = talos_sso_api::DenyEntry {
            username: Some(hostile.into()),
            subject: Some(hostile.into()),
            added_by: hostile.into(),
            added_at: time::OffsetDateTime::UNIX_EPOCH,
            expires_at: None,
            reason: hostile.into(),
        };
        let error = anyhow!("problem {hostile}").context(format!("while {hostile}"));
        for line in [
            logged_in_line(&record, hostile, 100, true),
            status_line(&status),
            deny_entry_line(&entry),
            error_text(&error),
            kept_line("nodes", hostile, &[hostile.to_owned()]),
            ttl_line(hostile, 3600, 900),
        ] {
            no_hostile_characters(&line);
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains(shown), "{line}");
        }
        assert_eq!(
            logged_in_line(&record, "prod", 299, false),
            format!(
                "Logged in to prod as {shown} with os:admin{shown}; certificate valid for 4m59s \
                 (context `prod{shown}` in /home/eve/{shown}; use `talosctl --context` or --set-current)."
            )
        );
        assert_eq!(error_text(&error), format!("while {shown}: problem {shown}"));
        let many: Vec<String> = (0..1000)
            .map(|n| format!("10.0.{}.{}", n / 256, n % 256))
            .collect();
        let kept = kept_line("endpoints", "prod", &many);
        assert!(
            kept.starts_with("Kept the endpoints you set in context `prod` (`talosctl config endpoint`)"),
            "{kept}"
        );
        assert!(kept.chars().count() < 500 && kept.ends_with("…."), "{kept}");
    }

    /// Every subcommand and argument under `command` without a help text,
    /// by its path (`audit list --server`); clap's own help and version
    /// are not ours to document.
    fn missing_help(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                let name = arg
                    .get_long()
                    .map(|long| format!("--{long}"))
                    .unwrap_or_else(|| format!("<{id}>"));
                missing.push(format!("{path} {name}"));
            }
        }
        for sub in command.get_subcommands() {
            if sub.get_name() == "help" {
                continue;
            }
            let sub_path = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none() && sub.get_long_about().is_none() {
                missing.push(sub_path.clone());
            }
            missing_help(sub, &sub_path, missing);
        }
    }

    #[test]
    fn debug_is_a_global_flag() {
        for line in [
            &["talos-sso", "--debug", "status"][..],
            &["talos-sso", "status", "--debug"],
            &["talos-sso", "audit", "list", "--debug"],
        ] {
            assert!(Cli::try_parse_from(line).unwrap().debug, "{line:?}");
        }
    }

    #[test]
    fn a_closed_output_pipe_is_not_an_error() {
        let pipe = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(closed_pipe(&pipe.context("writing a record")));
        let other = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        assert!(!closed_pipe(&other));
        assert!(!closed_pipe(&anyhow::anyhow!("the server refused")));
    }

    #[test]
    fn an_audit_limit_of_zero_is_refused_not_rounded_up() {
        use clap::Parser;
        let zero = Cli::try_parse_from(["talos-sso", "audit", "list", "--limit", "0"]);
        assert!(zero.unwrap_err().to_string().contains("--limit"));
        assert!(Cli::try_parse_from(["talos-sso", "audit", "list", "--limit", "1"]).is_ok());
    }

    /// The common options have the short flags their neighbours use
    /// (`-s` server, `-c` cluster, `-r` role), and no two options of one
    /// command share a short flag (clap's own consistency check).
    #[test]
    fn the_common_options_have_short_flags() {
        use clap::Parser;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "talos-sso",
            "login",
            "-s",
            "https://sso.example",
            "-c",
            "prod",
            "-r",
            "os:reader",
            "-r",
            "os:etcd:backup",
        ])
        .unwrap();
        let Command::Login(args) = cli.command else {
            panic!("{:?}", cli.command);
        };
        assert_eq!(args.server.as_deref(), Some("https://sso.example"));
        assert_eq!(args.cluster.as_deref(), Some("prod"));
        assert_eq!(args.roles, ["os:reader", "os:etcd:backup"]);
        for line in [
            &["talos-sso", "status", "-c", "prod"][..],
            &["talos-sso", "exec", "-c", "prod", "--", "true"],
            &[
                "talos-sso",
                "audit",
                "list",
                "-s",
                "https://sso.example",
                "-c",
                "prod",
                "-r",
                "os:admin",
            ],
            &["talos-sso", "deny", "list", "-s", "https://sso.example"],
        ] {
            assert!(Cli::try_parse_from(line).is_ok(), "{line:?}");
        }
    }

    #[test]
    fn every_subcommand_flag_and_argument_has_help() {
        let mut command = Cli::command();
        command.build();
        assert!(command.get_about().is_some(), "talos-sso itself has no about");
        let mut missing = Vec::new();
        missing_help(&command, "talos-sso", &mut missing);
        assert!(
            missing.is_empty(),
            "no help text for:\n  {}",
            missing.join("\n  ")
        );
    }
}
