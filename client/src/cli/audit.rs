//! `audit list|show|export|verify`: the audit trail for the security team,
//! read page by page through `GET /v1/audit`.

use std::io::Write;

use anyhow::anyhow;
use clap::{Args, Subcommand};

use talos_sso_api::AuditQuery;
use talos_sso_api::audit::{MAX_PAGE, event, outcome, record_kind};

use super::explained;
use super::format::{Format, print_data};
use super::login::{LoginMethod, authenticated};
use super::output::{AuditOutput, print_no_records, print_records, record_json};
use crate::api::ApiClient;

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
    #[arg(short, long)]
    pub cluster: Option<String>,
    /// A role granted or requested.
    #[arg(short, long)]
    pub role: Option<String>,
    // The help lists what the server can record (the API's own lists).
    #[arg(long, help = alternatives(&outcome::ALL))]
    pub outcome: Option<String>,
    #[arg(long, help = alternatives(&event::ALL))]
    pub event: Option<String>,
    /// Certificate serial (hex).
    #[arg(long)]
    pub serial: Option<String>,
    /// The client address the server recorded (e.g. 203.0.113.7).
    #[arg(long)]
    pub client_ip: Option<String>,
    /// The Talos API method of an api.call record
    /// (/machine.MachineService/Reboot), or a prefix of one ending in *
    /// (/machine.MachineService/Etcd*).
    #[arg(long)]
    pub method: Option<String>,
    /// A node an api.call record names (e.g. 10.5.0.2).
    #[arg(long)]
    pub node: Option<String>,
    #[arg(long, help = kind_help())]
    pub kind: Option<String>,
}

/// The help of `--kind`: the values the server takes, and what each keeps.
fn kind_help() -> String {
    format!(
        "{}: the certificate records of one workload kind, of any workload, or the records of people",
        alternatives(&record_kind::ALL)
    )
}

/// `a, b or c`: the values a filter may take, as its help says them (no
/// final full stop, like the help clap takes from doc comments).
fn alternatives(values: &[&str]) -> String {
    match values {
        [] => String::new(),
        [only] => (*only).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

impl AuditFilterArgs {
    /// The filter as `GET /v1/audit` takes it, from the first page on.
    pub(super) fn query(&self) -> AuditQuery {
        AuditQuery {
            since: self.since.clone(),
            until: self.until.clone(),
            username: self.username.clone(),
            subject: self.subject.clone(),
            cluster: self.cluster.clone(),
            role: self.role.clone(),
            outcome: self.outcome.clone(),
            event: self.event.clone(),
            serial: self.serial.clone(),
            client_ip: self.client_ip.clone(),
            method: self.method.clone(),
            node: self.node.clone(),
            kind: self.kind.clone(),
            cursor: None,
            limit: None,
        }
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
        /// A table for people (the default); JSON lines, YAML, CSV or ECS
        /// JSON lines for tools.
        #[arg(short, long, value_enum, default_value = "table")]
        output: AuditOutput,
        /// The talos-sso server (default: $TALOS_SSO_SERVER, else the one you logged in to).
        #[arg(short, long, env = "TALOS_SSO_SERVER")]
        server: Option<String>,
        #[command(flatten)]
        login: LoginMethod,
    },
    /// One record in full.
    Show {
        /// The record's sequence number (the SEQ column of `audit list`).
        #[arg(value_parser = clap::value_parser!(i64).range(1..))]
        seq: i64,
        /// JSON (the default: the record exactly, as before), YAML, or a
        /// table of its fields for people.
        #[arg(short, long, value_enum, default_value = "json")]
        output: Format,
        /// The talos-sso server (default: $TALOS_SSO_SERVER, else the one you logged in to).
        #[arg(short, long, env = "TALOS_SSO_SERVER")]
        server: Option<String>,
        #[command(flatten)]
        login: LoginMethod,
    },
    /// Every matching record, all pages, as JSON lines or CSV; with
    /// --follow, then each new record as it is committed, until stopped.
    Export {
        #[command(flatten)]
        filter: AuditFilterArgs,
        /// JSON lines (the default), ECS JSON lines (Elastic Common Schema),
        /// YAML or CSV for tools, or a table for people.
        #[arg(short, long, value_enum, default_value = "json")]
        output: AuditOutput,
        /// Keep going: print records as they are committed, reconnecting
        /// with a fresh token (and the last record's seq) when the server
        /// ends the stream, e.g. when the token expires.
        #[arg(long)]
        follow: bool,
        /// Start after this record (its seq): what a collector printed last.
        #[arg(long, value_parser = clap::value_parser!(i64).range(0..), default_value = "0")]
        cursor: i64,
        /// The talos-sso server (default: $TALOS_SSO_SERVER, else the one you logged in to).
        #[arg(short, long, env = "TALOS_SSO_SERVER")]
        server: Option<String>,
        #[command(flatten)]
        login: LoginMethod,
    },
    /// Ask the server to recompute the hash chain (and check it against its
    /// signed checkpoints); or, with --file, verify an export here, with no
    /// server and no database.
    Verify {
        /// An export (`audit export --output json`, the whole trail or from
        /// some record on, unfiltered) to verify offline.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
        /// The first record of an export that does not start at record 1
        /// (with --file): the records before it are not checked.
        #[arg(long, requires = "file", value_parser = clap::value_parser!(i64).range(1..))]
        from: Option<i64>,
        /// Checkpoint files to check the export against (with --file).
        #[arg(long = "checkpoints", requires = "file")]
        checkpoints: Vec<std::path::PathBuf>,
        /// A sentence for people (table), or the chain's status as JSON or
        /// YAML; a broken chain still exits 1.
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
        /// The server's audit public key, PEM (with --checkpoints; repeat
        /// for keys rotated out).
        #[arg(long = "public-key", requires = "checkpoints")]
        public_keys: Vec<std::path::PathBuf>,
        /// The talos-sso server (default: $TALOS_SSO_SERVER, else the one you logged in to).
        #[arg(short, long, env = "TALOS_SSO_SERVER", conflicts_with = "file")]
        server: Option<String>,
        #[command(flatten)]
        login: LoginMethod,
    },
}

/// Run `command`, printing to `out`; `terminal`: `out` is a terminal.
pub(super) async fn audit(command: AuditCommand, terminal: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    match command {
        AuditCommand::List {
            filter,
            limit,
            output,
            server,
            login,
        } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let printing = (output, terminal);
            print_matching(&api, &tokens.bearer, &filter, 0, limit, printing, out).await
        }
        AuditCommand::Export {
            filter,
            output,
            follow: true,
            cursor,
            server,
            login,
        } => {
            let printing = (output, terminal);
            super::follow::follow(server.as_deref(), &login, &filter.query(), cursor, printing, out).await
        }
        AuditCommand::Export {
            filter,
            output,
            follow: false,
            cursor,
            server,
            login,
        } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let printing = (output, terminal);
            print_matching(&api, &tokens.bearer, &filter, cursor, u64::MAX, printing, out).await
        }
        AuditCommand::Show {
            seq,
            output,
            server,
            login,
        } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let query = AuditQuery {
                cursor: Some((seq - 1).to_string()),
                limit: Some("1".to_owned()),
                ..AuditQuery::default()
            };
            let page = api.audit(&tokens.bearer, &query).await.map_err(explained)?;
            let record = page
                .records
                .into_iter()
                .find(|r| r.seq == seq)
                .ok_or_else(|| anyhow!("no audit record {seq}"))?;
            match output {
                Format::Json => writeln!(out, "{}", record_json(&record)?)?,
                Format::Yaml => print_data(Format::Yaml, &record, out)?,
                Format::Table => print_record_fields(&record, out)?,
            }
            Ok(())
        }
        AuditCommand::Verify {
            file: Some(file),
            from,
            checkpoints,
            public_keys,
            output,
            ..
        } => {
            let status = super::audit_verify::verify_export(&file, from, &checkpoints, &public_keys)?;
            if output != Format::Table {
                return super::audit_verify::report_data(&status, output, out);
            }
            if let Some(from) = from.filter(|f| *f > 1) {
                writeln!(
                    out,
                    "records 1 to {} are not in the export: they were not checked here (--from {from})",
                    from - 1
                )?;
            }
            super::audit_verify::report(&status, out)
        }
        AuditCommand::Verify {
            file: None,
            server,
            login,
            output,
            ..
        } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let chain = api.audit_verify(&tokens.bearer).await.map_err(explained)?;
            if output != Format::Table {
                return super::audit_verify::report_data(&chain, output, out);
            }
            super::audit_verify::report(&chain, out)
        }
    }
}

/// The records `filter` matches after the record `cursor`, oldest first,
/// at most `limit` of them: page after page, each printed as it comes (the
/// heading once), in `output`'s form, for a terminal or not.
async fn print_matching(
    api: &ApiClient,
    token: &str,
    filter: &AuditFilterArgs,
    mut cursor: i64,
    limit: u64,
    (output, terminal): (AuditOutput, bool),
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut shown = 0;
    let mut first = true;
    loop {
        let page_size = (limit - shown).clamp(1, MAX_PAGE.unsigned_abs());
        let query = AuditQuery {
            cursor: Some(cursor.to_string()),
            limit: Some(page_size.to_string()),
            ..filter.query()
        };
        let page = api.audit(token, &query).await.map_err(explained)?;
        print_records(&page.records, output, first, terminal, out)?;
        first = false;
        shown += page.records.len() as u64;
        match page.next_cursor {
            Some(next) if shown < limit => cursor = next,
            _ if shown == 0 => return print_no_records(output, out),
            _ => return Ok(()),
        }
    }
}

/// Longest value of a field in `audit show --output table`, in characters
/// (the whole record is in its JSON and YAML).
const FIELD_VALUE_CHARS: usize = 400;

/// One record as `audit show --output table` shows it: a field per line,
/// named as in its JSON, each value escaped and bounded; lists joined by
/// spaces, objects (`details`) as compact JSON.
fn print_record_fields(record: &talos_sso_api::StoredRecord, out: &mut dyn Write) -> anyhow::Result<()> {
    let serde_json::Value::Object(fields) = serde_json::to_value(record)? else {
        anyhow::bail!("a record is not a JSON object");
    };
    let width = fields.keys().map(String::len).max().unwrap_or(0);
    for (name, value) in &fields {
        let text = match value {
            serde_json::Value::Null => "-".to_owned(),
            serde_json::Value::String(text) => text.clone(),
            serde_json::Value::Array(items) if items.iter().all(serde_json::Value::is_string) => items
                .iter()
                .filter_map(serde_json::Value::as_str)
                .collect::<Vec<_>>()
                .join(" "),
            other => other.to_string(),
        };
        let name = talos_sso_text::escape(name);
        writeln!(
            out,
            "{name:<width$}  {}",
            talos_sso_text::bounded(&text, FIELD_VALUE_CHARS)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn the_filter_help_names_every_event_outcome_and_kind() {
        let mut cli = Cli::command();
        cli.build();
        let list = cli
            .find_subcommand("audit")
            .and_then(|audit| audit.find_subcommand("list"))
            .unwrap();
        let help = |id: &str| {
            let arg = list.get_arguments().find(|a| a.get_id() == id).unwrap();
            arg.get_help().unwrap().to_string()
        };
        assert_eq!(help("outcome"), "success, denied, started or failed");
        let events = help("event");
        for name in event::ALL {
            assert!(events.contains(name), "{name} missing from: {events}");
        }
        assert!(
            events.ends_with(", api.call or gateway.certificate_issued"),
            "{events}"
        );
        assert_eq!(
            help("kind"),
            "kubernetes, github-actions, gitlab-ci, workload or person: the certificate records of one \
             workload kind, of any workload, or the records of people"
        );
    }

    #[test]
    fn the_filter_flags_become_the_query_the_server_reads() {
        let cli = Cli::try_parse_from([
            "talos-sso",
            "audit",
            "export",
            "--since",
            "7d",
            "--until",
            "1h",
            "--user",
            "alice@example.com",
            "--event",
            "deny.added",
            "--outcome",
            "success",
            "--method",
            "/machine.MachineService/Etcd*",
            "--node",
            "10.5.0.2",
            "--kind",
            "github-actions",
        ])
        .unwrap();
        let Command::Audit(AuditCommand::Export { filter, .. }) = cli.command else {
            panic!("audit export");
        };
        assert_eq!(
            filter.query(),
            AuditQuery {
                since: Some("7d".into()),
                until: Some("1h".into()),
                username: Some("alice@example.com".into()),
                event: Some("deny.added".into()),
                outcome: Some("success".into()),
                method: Some("/machine.MachineService/Etcd*".into()),
                node: Some("10.5.0.2".into()),
                kind: Some("github-actions".into()),
                ..AuditQuery::default()
            }
        );
    }
}
