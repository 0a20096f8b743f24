//! `audit list|show|export|verify`: the audit trail for the security team,
//! read page by page through `GET /v1/audit`.

use std::io::Write;

use anyhow::{anyhow, bail};
use clap::{Args, Subcommand};

use super::login::{ExecLoginArgs, authenticated};
use super::output::{AuditOutput, print_records, record_json};

/// Filters of `audit list` and `audit export`.
#[derive(Debug, Clone, Args)]
pub struct AuditFilterArgs {
    /// From this time: RFC 3339, or a duration back from now (7d, 12h).
    #[arg(long)]
    pub since: Option<String>,
    /// Until this time (same forms).
    #[arg(long)]
    pub until: Option<String>,
    /// Username (e.g. alice@example.com).
    #[arg(long = "user")]
    pub username: Option<String>,
    /// Subject (Entra object id).
    #[arg(long)]
    pub subject: Option<String>,
    /// Cluster name.
    #[arg(long)]
    pub cluster: Option<String>,
    /// A role granted or requested.
    #[arg(long)]
    pub role: Option<String>,
    /// success or denied.
    #[arg(long)]
    pub outcome: Option<String>,
    /// certificate.issued, certificate.denied, break_glass.issued, audit.query.
    #[arg(long)]
    pub event: Option<String>,
    /// Certificate serial (hex).
    #[arg(long)]
    pub serial: Option<String>,
}

impl AuditFilterArgs {
    fn params(&self) -> Vec<(&'static str, String)> {
        [
            ("since", &self.since),
            ("until", &self.until),
            ("username", &self.username),
            ("subject", &self.subject),
            ("cluster", &self.cluster),
            ("role", &self.role),
            ("outcome", &self.outcome),
            ("event", &self.event),
            ("serial", &self.serial),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
        .collect()
    }
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Records matching the filters, oldest first.
    List {
        #[command(flatten)]
        filter: AuditFilterArgs,
        /// At most this many records, 1 or more (follows pages as needed).
        #[arg(long, default_value = "100", value_parser = clap::value_parser!(u64).range(1..))]
        limit: u64,
        /// A table for people (the default), JSON lines or CSV for tools.
        #[arg(long, value_enum, default_value = "table")]
        output: AuditOutput,
        /// The talos-sso server (default: the one you logged in to).
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
    /// One record in full.
    Show {
        /// The record's sequence number (the SEQ column of `audit list`).
        seq: i64,
        /// The talos-sso server (default: the one you logged in to).
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
    /// Every matching record, all pages, as JSON lines or CSV.
    Export {
        #[command(flatten)]
        filter: AuditFilterArgs,
        /// JSON lines (the default) or CSV for tools, or a table for people.
        #[arg(long, value_enum, default_value = "json")]
        output: AuditOutput,
        /// The talos-sso server (default: the one you logged in to).
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
    /// Ask the server to recompute the hash chain.
    Verify {
        /// The talos-sso server (default: the one you logged in to).
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
}

pub(super) async fn audit(command: AuditCommand, out: &mut dyn Write) -> anyhow::Result<()> {
    let explain = |e: crate::api::ApiError| anyhow!(crate::messages::explain(&e, ""));
    match command {
        AuditCommand::List {
            filter,
            limit,
            output,
            server,
            login,
        } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let mut params = filter.params();
            let mut cursor = 0;
            let mut shown = 0;
            loop {
                let page_size = (limit - shown).clamp(1, 1000);
                params.retain(|(k, _)| *k != "cursor" && *k != "limit");
                params.push(("cursor", cursor.to_string()));
                params.push(("limit", page_size.to_string()));
                let page = api.audit(&tokens.bearer, &params).await.map_err(explain)?;
                print_records(&page.records, output, shown == 0, out)?;
                shown += page.records.len() as u64;
                match page.next_cursor {
                    Some(next) if shown < limit => cursor = next,
                    _ => break,
                }
            }
            Ok(())
        }
        AuditCommand::Export {
            filter,
            output,
            server,
            login,
        } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let mut cursor = 0;
            let mut first = true;
            loop {
                let mut params = filter.params();
                params.push(("cursor", cursor.to_string()));
                params.push(("limit", "1000".into()));
                let page = api.audit(&tokens.bearer, &params).await.map_err(explain)?;
                print_records(&page.records, output, first, out)?;
                first = false;
                match page.next_cursor {
                    Some(next) => cursor = next,
                    None => break,
                }
            }
            Ok(())
        }
        AuditCommand::Show { seq, server, login } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let params = [("cursor", (seq - 1).to_string()), ("limit", "1".to_owned())];
            let page = api.audit(&tokens.bearer, &params).await.map_err(explain)?;
            let record = page
                .records
                .into_iter()
                .find(|r| r.get("seq").and_then(|v| v.as_i64()) == Some(seq))
                .ok_or_else(|| anyhow!("no audit record {seq}"))?;
            writeln!(out, "{}", record_json(&record, true)?)?;
            Ok(())
        }
        AuditCommand::Verify { server, login } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let answer = api.audit_verify(&tokens.bearer).await.map_err(explain)?;
            if answer["intact"] == serde_json::Value::Bool(true) {
                writeln!(
                    out,
                    "audit chain intact: {} records verified (last seq {})",
                    crate::display::escape(&answer["verified"].to_string()),
                    crate::display::escape(&answer["last_seq"].to_string())
                )?;
                Ok(())
            } else {
                bail!(
                    "audit chain broken at record {}: {}",
                    crate::display::escape(&answer["first_broken"]["seq"].to_string()),
                    crate::display::escape(answer["first_broken"]["reason"].as_str().unwrap_or_default())
                )
            }
        }
    }
}
