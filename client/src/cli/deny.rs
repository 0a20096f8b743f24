//! `deny add|remove|list`: identities blocked from new certificates at
//! once, for administrators.

use std::io::Write;

use anyhow::anyhow;
use clap::Subcommand;

use super::login::{ExecLoginArgs, authenticated};

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
        /// The talos-sso server (default: the one you logged in to).
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
    /// Unblock.
    Remove {
        /// The subject to unblock.
        #[arg(long, required_unless_present = "user")]
        subject: Option<String>,
        /// The username to unblock.
        #[arg(long)]
        user: Option<String>,
        /// The talos-sso server (default: the one you logged in to).
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
    /// Who is blocked.
    List {
        /// The talos-sso server (default: the one you logged in to).
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
}

pub(super) async fn deny(command: DenyCommand, out: &mut dyn Write) -> anyhow::Result<()> {
    let explain = |e: crate::api::ApiError| anyhow!(crate::messages::explain(&e, ""));
    let target = |subject: Option<String>, user: Option<String>| -> Vec<(&'static str, String)> {
        [("subject", subject), ("username", user)]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    };
    match command {
        DenyCommand::Add {
            subject,
            user,
            reason,
            server,
            login,
        } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let body = serde_json::json!({"subject": subject, "username": user, "reason": reason});
            let answer = api
                .deny(&tokens.bearer, reqwest::Method::POST, &[], Some(body))
                .await
                .map_err(explain)?;
            writeln!(
                out,
                "blocked {} from new certificates (audit record {})",
                crate::display::escape(
                    answer["entry"]["username"]
                        .as_str()
                        .or(answer["entry"]["subject"].as_str())
                        .unwrap_or("?")
                ),
                crate::display::escape(&answer["audit_id"].to_string())
            )?;
        }
        DenyCommand::Remove {
            subject,
            user,
            server,
            login,
        } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let answer = api
                .deny(
                    &tokens.bearer,
                    reqwest::Method::DELETE,
                    &target(subject, user),
                    None,
                )
                .await
                .map_err(explain)?;
            writeln!(
                out,
                "removed {} entr(ies) (audit record {})",
                crate::display::escape(&answer["removed"].to_string()),
                crate::display::escape(&answer["audit_id"].to_string())
            )?;
        }
        DenyCommand::List { server, login } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let answer = api
                .deny(&tokens.bearer, reqwest::Method::GET, &[], None)
                .await
                .map_err(explain)?;
            let entries = answer["entries"].as_array().cloned().unwrap_or_default();
            if entries.is_empty() {
                writeln!(out, "nobody is blocked")?;
            }
            for entry in entries {
                writeln!(out, "{}", deny_entry_line(&entry))?;
            }
        }
    }
    Ok(())
}

/// One deny-list entry as `deny list` shows it, every field escaped: the
/// username and the reason are whatever an administrator (or a token) said.
pub(super) fn deny_entry_line(entry: &serde_json::Value) -> String {
    use crate::display::escape;
    format!(
        "{}  {}  by {} at {}: {}",
        escape(entry["username"].as_str().unwrap_or("-")),
        escape(entry["subject"].as_str().unwrap_or("-")),
        escape(entry["added_by"].as_str().unwrap_or("?")),
        escape(entry["added_at"].as_str().unwrap_or("?")),
        escape(entry["reason"].as_str().unwrap_or(""))
    )
}
