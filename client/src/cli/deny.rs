//! `deny add|remove|list`: identities blocked from new certificates at
//! once, for administrators.

use std::io::Write;

use clap::Subcommand;
use talos_sso_api::audit::format_micros;
use talos_sso_api::{DenyEntry, DenyRequest};

use super::explained;
use super::format::{Format, print_data};
use super::login::{LoginMethod, authenticated};
use talos_sso_text::escape;

#[derive(Debug, Subcommand)]
pub enum DenyCommand {
    /// Block a person by subject (Entra object id, or the provider's `sub`).
    /// With `--user` alone, the server blocks the one subject that verified
    /// records name with that username (and refuses when there is none, or
    /// several): usernames can be changed by their owners, subjects cannot.
    Add {
        /// The subject to block (Entra object id, or the provider's `sub`).
        #[arg(long, required_unless_present = "user")]
        subject: Option<String>,
        /// The username to block (alone: the server finds its one subject).
        #[arg(long)]
        user: Option<String>,
        /// Why (recorded in the audit trail).
        #[arg(long)]
        reason: String,
        /// How long the block lasts (`8h`, `3d`); without it, until removed.
        #[arg(long = "for", value_name = "DURATION", value_parser = lasting)]
        lasting: Option<std::time::Duration>,
        /// A sentence for people (table), or the server's answer as JSON or YAML.
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
        /// The talos-sso server (default: $TALOS_SSO_SERVER, else the one you logged in to).
        #[arg(short, long, env = "TALOS_SSO_SERVER")]
        server: Option<String>,
        #[command(flatten)]
        login: LoginMethod,
    },
    /// Unblock.
    Remove {
        /// The subject to unblock.
        #[arg(long, required_unless_present = "user")]
        subject: Option<String>,
        /// The username to unblock.
        #[arg(long)]
        user: Option<String>,
        /// A sentence for people (table), or the server's answer as JSON or YAML.
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
        /// The talos-sso server (default: $TALOS_SSO_SERVER, else the one you logged in to).
        #[arg(short, long, env = "TALOS_SSO_SERVER")]
        server: Option<String>,
        #[command(flatten)]
        login: LoginMethod,
    },
    /// Who is blocked.
    List {
        /// A line per entry for people (table), or the list as JSON or YAML.
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
        /// The talos-sso server (default: $TALOS_SSO_SERVER, else the one you logged in to).
        #[arg(short, long, env = "TALOS_SSO_SERVER")]
        server: Option<String>,
        #[command(flatten)]
        login: LoginMethod,
    },
}

pub(super) async fn deny(command: DenyCommand, out: &mut dyn Write) -> anyhow::Result<()> {
    match command {
        DenyCommand::Add {
            subject,
            user,
            reason,
            lasting,
            output,
            server,
            login,
        } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let expires_at = lasting
                .map(|d| {
                    time::Duration::try_from(d)
                        .ok()
                        .and_then(|d| time::OffsetDateTime::now_utc().checked_add(d))
                        .ok_or_else(|| anyhow::anyhow!("--for is too long"))
                })
                .transpose()?;
            let entry = DenyRequest {
                subject,
                username: user,
                reason: Some(reason),
                expires_at,
            };
            let added = api.deny_add(&tokens.bearer, &entry).await.map_err(explained)?;
            if output != Format::Table {
                return print_data(output, &added, out);
            }
            let who = added.entry.username.or(added.entry.subject);
            let until = match added.entry.expires_at {
                Some(at) => format!(" until {}", format_micros(at)),
                None => String::new(),
            };
            writeln!(
                out,
                "blocked {} from new certificates{until} (audit record {})",
                escape(who.as_deref().unwrap_or("?")),
                added.audit_id
            )?;
        }
        DenyCommand::Remove {
            subject,
            user,
            output,
            server,
            login,
        } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let target = DenyRequest {
                subject,
                username: user,
                reason: None,
                expires_at: None,
            };
            let removed = api
                .deny_remove(&tokens.bearer, &target)
                .await
                .map_err(explained)?;
            if output != Format::Table {
                return print_data(output, &removed, out);
            }
            writeln!(
                out,
                "removed {} entr(ies) (audit record {})",
                removed.removed, removed.audit_id
            )?;
        }
        DenyCommand::List {
            output,
            server,
            login,
        } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let list = api.deny_list(&tokens.bearer).await.map_err(explained)?;
            if output != Format::Table {
                return print_data(output, &list, out);
            }
            if list.entries.is_empty() {
                writeln!(out, "nobody is blocked")?;
            }
            for entry in &list.entries {
                writeln!(out, "{}", deny_entry_line(entry))?;
            }
        }
    }
    Ok(())
}

/// One deny-list entry as `deny list` shows it, every field escaped: the
/// username and the reason are whatever an administrator (or a token) said.
pub(super) fn deny_entry_line(entry: &DenyEntry) -> String {
    let until = match entry.expires_at {
        Some(at) => format!(" until {}", format_micros(at)),
        None => String::new(),
    };
    format!(
        "{}  {}  by {} at {}{until}: {}",
        escape(entry.username.as_deref().unwrap_or("-")),
        escape(entry.subject.as_deref().unwrap_or("-")),
        escape(&entry.added_by),
        format_micros(entry.added_at),
        escape(&entry.reason)
    )
}

/// `--for`: a duration such as `8h` or `3d`.
fn lasting(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("`{text}` is not a duration like `8h` or `3d`: {e}"))
}
