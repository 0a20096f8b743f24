//! The command line: `login`, `status`, `logout`, `exec`, `completions`.
//! `anyhow` stops here; the library modules keep their own error types.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use serde_json::json;
use time::OffsetDateTime;

use crate::api::{ApiClient, CertificateRequest, ClusterInfo, ServerInfo};
use crate::key::ClientKey;
use crate::login::browser::{BrowserOptions, Opener, system_opener};
use crate::login::{Provider, Tokens, cache};
use crate::state::{self, LoginRecord};
use crate::talosconfig::{self, ContextEntry};

/// Log in to Talos Linux clusters with single sign-on, then use talosctl as usual.
#[derive(Debug, Parser)]
#[command(name = "talos-sso", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Log in and write a short-lived certificate into your talosconfig.
    Login(LoginArgs),
    /// Show who you are logged in as, where, with which roles, for how long.
    Status {
        /// Only this cluster (default: every cluster you logged in to).
        #[arg(long)]
        cluster: Option<String>,
        /// Text for people, JSON for scripts.
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Remove this tool's talosconfig contexts and cached logins (nothing else).
    Logout {
        /// Log out of this cluster (default: the default cluster).
        #[arg(long, conflicts_with = "all")]
        cluster: Option<String>,
        /// Log out of every cluster and forget every saved login.
        #[arg(long)]
        all: bool,
    },
    /// Make sure the certificate is valid for at least a minute (renewing it
    /// when needed), then run a command with TALOSCONFIG set to it.
    Exec {
        /// The cluster whose certificate the command uses (default: the default cluster).
        #[arg(long)]
        cluster: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
        /// The command, after `--` (e.g. `-- talosctl get members`).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Read the audit trail (auditors only): list, show, export, verify.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Block identities from new certificates at once (administrators).
    #[command(subcommand)]
    Deny(DenyCommand),
    /// Print shell completions.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum AuditOutput {
    Table,
    Json,
    Csv,
}

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

#[derive(Debug, Clone, Args)]
pub struct LoginArgs {
    /// The talos-sso server (remembered after the first login).
    #[arg(long)]
    pub server: Option<String>,
    /// Which cluster (remembered as the default; not needed when the server has one).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Ask for a Talos role (repeat for several); default: the cluster's default roles.
    #[arg(long = "role")]
    pub roles: Vec<String>,
    /// Certificate lifetime (default: the cluster's, usually 5m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Option<Duration>,
    /// Log in with a code on another device (SSH sessions, headless machines).
    #[arg(long)]
    pub device: bool,
    /// Print the login URL instead of opening a browser.
    #[arg(long)]
    pub no_browser: bool,
    /// Fixed port for the browser's redirect to http://localhost:PORT/callback.
    #[arg(long)]
    pub callback_port: Option<u16>,
    /// How long to wait for the browser.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    pub timeout: Duration,
    /// The talosconfig to write (default: $TALOSCONFIG, else ~/.talos/config).
    #[arg(long)]
    pub talosconfig: Option<PathBuf>,
    /// Context name (default: the cluster's).
    #[arg(long)]
    pub context: Option<String>,
    /// Make this the current context even when the file already has one.
    #[arg(long)]
    pub set_current: bool,
}

/// The login options `exec` needs when it has to log in again.
#[derive(Debug, Clone, Args)]
pub struct ExecLoginArgs {
    /// If a login is needed, log in with a code on another device (SSH sessions, headless machines).
    #[arg(long)]
    pub device: bool,
    /// If a login is needed, print the login URL instead of opening a browser.
    #[arg(long)]
    pub no_browser: bool,
    /// If a login is needed, the fixed port for the browser's redirect to http://localhost:PORT/callback.
    #[arg(long)]
    pub callback_port: Option<u16>,
}

pub fn default_talosconfig(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    Ok(talosconfig::resolve_path(explicit)?)
}

fn pick_cluster<'a>(wanted: Option<&str>, info: &'a ServerInfo) -> anyhow::Result<&'a ClusterInfo> {
    let names = || {
        info.clusters
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match wanted {
        Some(name) => info
            .clusters
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| anyhow!("the server has no cluster `{name}`; it has: {}", names())),
        None => match info.clusters.as_slice() {
            [only] => Ok(only),
            [] => bail!("the server offers no clusters"),
            _ => bail!(
                "the server has several clusters ({}); choose one with --cluster",
                names()
            ),
        },
    }
}

/// A fresh ID token: silently with the cached refresh token when possible,
/// else interactively (saying why).
async fn obtain_tokens(
    provider: &Provider,
    server: &str,
    login: &LoginArgs,
    opener: Option<Opener>,
) -> anyhow::Result<Tokens> {
    let key = cache::key(server, &provider.issuer, &provider.client_id);
    let refresh_lock = cache::lock().context("locking the token cache")?;
    if let Some(refresh_token) = cache::get(&key) {
        match provider.refresh(&refresh_token).await {
            Ok(tokens) => {
                if let Some(rotated) = &tokens.refresh_token {
                    cache::put(&key, rotated, &tokens.username).context("saving the token cache")?;
                }
                return Ok(tokens);
            }
            Err(error) => {
                eprintln!(
                    "Your saved login could not be renewed ({}); logging in again.",
                    crate::display::escape(&error.to_string())
                );
            }
        }
    }
    drop(refresh_lock);
    let tokens = if login.device {
        crate::login::device::login(provider).await?
    } else {
        let opener = if login.no_browser { None } else { opener };
        let options = BrowserOptions {
            callback_port: login.callback_port,
            opener,
            timeout: login.timeout,
        };
        crate::login::browser::login(provider, &options).await?
    };
    if let Some(refresh_token) = &tokens.refresh_token {
        cache::put(&key, refresh_token, &tokens.username).context("saving the token cache")?;
    }
    Ok(tokens)
}

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

/// Log in and write the certificate; returns what was recorded.
pub async fn login(args: &LoginArgs, out: &mut dyn Write) -> anyhow::Result<LoginRecord> {
    login_with(args, Some(system_opener()), out).await
}

/// [`login`] with a chosen way of opening the browser login URL.
pub async fn login_with(
    args: &LoginArgs,
    opener: Option<Opener>,
    out: &mut dyn Write,
) -> anyhow::Result<LoginRecord> {
    let saved = state::load();
    let server = args.server.clone().or(saved.server.clone()).ok_or_else(|| {
        anyhow!("no server yet: run `talos-sso login --server https://talos-sso.example.com` once")
    })?;
    let api = ApiClient::new(&server)?;
    let info = api
        .info()
        .await
        .map_err(|e| anyhow!(crate::messages::explain(&e, "")))?;
    let cluster = pick_cluster(
        args.cluster.as_deref().or(saved.default_cluster.as_deref()),
        &info,
    )?;
    let provider = Provider::discover(&info).await?;
    let tokens = obtain_tokens(&provider, &server, args, opener).await?;

    let key = ClientKey::generate()?;
    let csr = key.csr_pem()?;
    let request = CertificateRequest {
        cluster: &cluster.name,
        csr: &csr,
        roles: &args.roles,
        ttl_seconds: args.ttl.map(|t| t.as_secs().max(1)),
    };
    let issued = api
        .request_certificate(&tokens.bearer, &request)
        .await
        .map_err(|e| anyhow!(crate::messages::explain(&e, &cluster.name)))?;

    let path = default_talosconfig(args.talosconfig.as_deref())?;
    let context = args.context.clone().unwrap_or_else(|| issued.context.clone());
    let entry = ContextEntry {
        endpoints: issued.endpoints.clone(),
        nodes: issued.nodes.clone(),
        ca_pem: issued.ca.clone(),
        crt_pem: issued.certificate.clone(),
        key_pem: key.private_key_pem().to_string(),
    };
    let written = talosconfig::upsert_context(&path, &context, &entry, args.set_current)?;
    let record = LoginRecord {
        server: server.clone(),
        context: context.clone(),
        talosconfig: path.clone(),
        username: issued.identity.username.clone(),
        roles: issued.roles.clone(),
        not_after: issued.not_after.clone(),
    };
    let chosen_explicitly = args.cluster.is_some();
    state::update(|s| {
        s.server = Some(server.clone());
        if chosen_explicitly || s.default_cluster.is_none() {
            s.default_cluster = Some(cluster.name.clone());
        }
        s.logins.insert(cluster.name.clone(), record.clone());
    })
    .context("saving the client configuration")?;

    let left = parse_time(&issued.not_after)
        .map(|t| (t - OffsetDateTime::now_utc()).whole_seconds())
        .unwrap_or(0);
    let current = written.current_context.as_deref() == Some(context.as_str());
    writeln!(out, "{}", logged_in_line(&record, &cluster.name, left, current))?;
    Ok(record)
}

/// What `login` says when it is done. The names come from the server (and
/// the person's identity provider): escaped, like every such text shown.
fn logged_in_line(record: &LoginRecord, cluster: &str, seconds_left: i64, current: bool) -> String {
    use crate::display::escape;
    format!(
        "Logged in to {} as {} with {}; certificate valid for {} (context `{}` in {}{}).",
        escape(cluster),
        escape(&record.username),
        escape(&record.roles.join(", ")),
        human_duration(seconds_left),
        escape(&record.context),
        escape(&record.talosconfig.display().to_string()),
        if current {
            ", current"
        } else {
            "; use `talosctl --context` or --set-current"
        }
    )
}

fn parse_time(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
}

/// What `status` reports for one login.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoginStatus {
    pub cluster: String,
    pub server: String,
    pub context: String,
    pub talosconfig: PathBuf,
    pub username: Option<String>,
    pub roles: Vec<String>,
    pub not_after: Option<String>,
    pub seconds_left: i64,
    pub valid: bool,
}

/// Read the certificate actually in the talosconfig (not what we remember).
pub fn login_status(cluster: &str, record: &LoginRecord) -> LoginStatus {
    let stored = talosconfig::read_context(&record.talosconfig, &record.context)
        .ok()
        .flatten();
    let leaf = stored
        .as_ref()
        .and_then(|s| crate::certinfo::leaf_info(&s.crt_pem));
    let now = OffsetDateTime::now_utc();
    let seconds_left = leaf
        .as_ref()
        .map(|l| (l.not_after - now).whole_seconds())
        .unwrap_or(0);
    LoginStatus {
        cluster: cluster.to_owned(),
        server: record.server.clone(),
        context: record.context.clone(),
        talosconfig: record.talosconfig.clone(),
        username: leaf.as_ref().and_then(|l| l.common_name.clone()),
        roles: leaf.as_ref().map(|l| l.roles.clone()).unwrap_or_default(),
        not_after: leaf.as_ref().map(|l| {
            l.not_after
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default()
        }),
        seconds_left: seconds_left.max(0),
        valid: leaf.is_some() && seconds_left > 0,
    }
}

fn status(cluster: Option<&str>, output: Output, out: &mut dyn Write) -> anyhow::Result<()> {
    let saved = state::load();
    let statuses: Vec<LoginStatus> = saved
        .logins
        .iter()
        .filter(|(name, _)| cluster.is_none_or(|c| c == name.as_str()))
        .map(|(name, record)| login_status(name, record))
        .collect();
    if output == Output::Json {
        let text = serde_json::to_string_pretty(&json!(statuses))?;
        writeln!(out, "{}", crate::display::json(&text))?;
        return Ok(());
    }
    if statuses.is_empty() {
        writeln!(out, "Not logged in anywhere. Run `talos-sso login`.")?;
        return Ok(());
    }
    for s in statuses {
        writeln!(out, "{}", status_line(&s))?;
    }
    Ok(())
}

/// One login as `status` shows it; the names are the certificate's and the
/// server's, escaped.
fn status_line(s: &LoginStatus) -> String {
    use crate::display::escape;
    let state = if s.valid {
        human_duration(s.seconds_left) + " left"
    } else {
        "expired or missing; run `talos-sso login`".into()
    };
    format!(
        "{}: {} as {} with [{}], {} (context `{}` in {}, server {})",
        escape(&s.cluster),
        if s.valid { "logged in" } else { "not logged in" },
        escape(s.username.as_deref().unwrap_or("?")),
        escape(&s.roles.join(", ")),
        state,
        escape(&s.context),
        escape(&s.talosconfig.display().to_string()),
        escape(&s.server)
    )
}

fn logout(cluster: Option<&str>, all: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let saved = state::load();
    let target = if all {
        None
    } else {
        cluster.map(str::to_owned).or(saved.default_cluster.clone())
    };
    let chosen: Vec<(String, LoginRecord)> = saved
        .logins
        .iter()
        .filter(|(name, _)| target.as_ref().is_none_or(|t| t == *name))
        .map(|(n, r)| (n.clone(), r.clone()))
        .collect();
    if chosen.is_empty() {
        writeln!(out, "Nothing to log out of.")?;
        return Ok(());
    }
    for (name, record) in &chosen {
        let removed =
            talosconfig::remove_contexts(&record.talosconfig, std::slice::from_ref(&record.context))?;
        writeln!(
            out,
            "{}: {} context `{}` from {}",
            crate::display::escape(name),
            if removed.is_empty() { "no" } else { "removed" },
            crate::display::escape(&record.context),
            crate::display::escape(&record.talosconfig.display().to_string())
        )?;
    }
    let remaining = state::update(|s| {
        for (name, _) in &chosen {
            s.logins.remove(name);
        }
    })?;
    // Tokens are per server: forget them once no login on that server is left.
    let mut forgotten = 0;
    if all {
        forgotten = cache::forget(None)?;
    } else {
        for (_, record) in &chosen {
            if !remaining.logins.values().any(|r| r.server == record.server) {
                forgotten += cache::forget(Some(&record.server))?;
            }
        }
    }
    writeln!(out, "Forgot {forgotten} saved login(s).")?;
    Ok(())
}

async fn exec(
    cluster: Option<&str>,
    login_args: &ExecLoginArgs,
    command: &[String],
) -> anyhow::Result<ExitCode> {
    let saved = state::load();
    let cluster = cluster
        .map(str::to_owned)
        .or(saved.default_cluster.clone())
        .ok_or_else(|| anyhow!("no cluster yet: run `talos-sso login` first"))?;
    let mut record = saved.logins.get(&cluster).cloned();
    let fresh_enough = record
        .as_ref()
        .is_some_and(|r| login_status(&cluster, r).seconds_left >= 60);
    if !fresh_enough {
        let args = LoginArgs {
            server: record.as_ref().map(|r| r.server.clone()).or(saved.server.clone()),
            cluster: Some(cluster.clone()),
            roles: record.as_ref().map(|r| r.roles.clone()).unwrap_or_default(),
            ttl: None,
            device: login_args.device,
            no_browser: login_args.no_browser,
            callback_port: login_args.callback_port,
            timeout: Duration::from_secs(300),
            talosconfig: record.as_ref().map(|r| r.talosconfig.clone()),
            context: record.as_ref().map(|r| r.context.clone()),
            set_current: false,
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

/// The server and a fresh token for commands that are not `login`.
async fn authenticated(server: Option<&str>, login: &ExecLoginArgs) -> anyhow::Result<(ApiClient, Tokens)> {
    let saved = state::load();
    let server = server
        .map(str::to_owned)
        .or(saved.server)
        .ok_or_else(|| anyhow!("no server yet: pass --server or run `talos-sso login --server ...` once"))?;
    let api = ApiClient::new(&server)?;
    let info = api
        .info()
        .await
        .map_err(|e| anyhow!(crate::messages::explain(&e, "")))?;
    let provider = Provider::discover(&info).await?;
    let args = LoginArgs {
        server: Some(server.clone()),
        cluster: None,
        roles: vec![],
        ttl: None,
        device: login.device,
        no_browser: login.no_browser,
        callback_port: login.callback_port,
        timeout: Duration::from_secs(300),
        talosconfig: None,
        context: None,
        set_current: false,
    };
    let tokens = obtain_tokens(&provider, &server, &args, Some(system_opener())).await?;
    // Remember the server, as `login` does.
    state::update(|s| s.server = Some(server.clone())).context("saving the client configuration")?;
    Ok((api, tokens))
}

const AUDIT_COLUMNS: [&str; 10] = [
    "seq",
    "occurred_at",
    "event",
    "outcome",
    "reason_code",
    "cluster",
    "username",
    "roles_granted",
    "serial",
    "client_ip",
];

fn cell(record: &serde_json::Map<String, serde_json::Value>, column: &str) -> String {
    match record.get(column) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        Some(serde_json::Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// One CSV field. A value that starts like a formula (`=`, `+`, `-`, `@`,
/// TAB, CR) would be run by a spreadsheet opening the export, so it gets a
/// leading `'` (OWASP's advice) and is read as text; then the usual quoting.
fn csv_field(text: &str) -> String {
    let text = if text.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{text}")
    } else {
        text.to_owned()
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// The table's columns: heading, then the narrowest and the widest the
/// column may be (in characters). The widest bound keeps one long value
/// (which the server may have taken from anyone) from pushing the other
/// columns off screen; the full value is in the JSON and CSV outputs.
const TABLE_COLUMNS: [(&str, usize, usize); 7] = [
    ("SEQ", 6, 12),
    ("TIME", 27, 32),
    ("EVENT", 19, 24),
    ("OUTCOME", 24, 40),
    ("CLUSTER", 8, 24),
    ("USER", 24, 48),
    ("ROLES", 0, 64),
];

/// One table line: each value escaped (see [`crate::display`]) and cut to
/// its column's widest, padded to its narrowest; SEQ aligned right.
fn table_line(cells: [&str; 7]) -> String {
    let mut line = String::new();
    for (index, ((_, narrowest, widest), text)) in TABLE_COLUMNS.iter().zip(cells).enumerate() {
        let text = crate::display::bounded(text, *widest);
        if index == 0 {
            line.push_str(&format!("{text:>narrowest$}"));
        } else if index == TABLE_COLUMNS.len() - 1 {
            line.push_str("  ");
            line.push_str(&text);
        } else {
            line.push_str(&format!("  {text:<narrowest$}"));
        }
    }
    line
}

/// A record as JSON, on one line or pretty, terminal-safe (see
/// [`crate::display::json`]) and still exactly the record.
fn record_json(record: &serde_json::Map<String, serde_json::Value>, pretty: bool) -> anyhow::Result<String> {
    let text = if pretty {
        serde_json::to_string_pretty(record)?
    } else {
        serde_json::to_string(record)?
    };
    Ok(crate::display::json(&text))
}

fn print_records(
    records: &[serde_json::Map<String, serde_json::Value>],
    output: AuditOutput,
    header: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match output {
        AuditOutput::Json => {
            for record in records {
                writeln!(out, "{}", record_json(record, false)?)?;
            }
        }
        AuditOutput::Csv => {
            if header {
                writeln!(out, "{}", AUDIT_COLUMNS.join(","))?;
            }
            for record in records {
                let row: Vec<String> = AUDIT_COLUMNS
                    .iter()
                    .map(|c| csv_field(&cell(record, c)))
                    .collect();
                writeln!(out, "{}", row.join(","))?;
            }
        }
        AuditOutput::Table => {
            if header {
                writeln!(
                    out,
                    "{}",
                    table_line(TABLE_COLUMNS.map(|(heading, _, _)| heading))
                )?;
            }
            for r in records {
                let outcome = match cell(r, "reason_code").as_str() {
                    "" => cell(r, "outcome"),
                    reason => format!("{} ({reason})", cell(r, "outcome")),
                };
                let cells = [
                    cell(r, "seq"),
                    cell(r, "occurred_at"),
                    cell(r, "event"),
                    outcome,
                    cell(r, "cluster"),
                    cell(r, "username"),
                    cell(r, "roles_granted"),
                ];
                writeln!(out, "{}", table_line(cells.each_ref().map(String::as_str)))?;
            }
        }
    }
    Ok(())
}

async fn audit(command: AuditCommand, out: &mut dyn Write) -> anyhow::Result<()> {
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

async fn deny(command: DenyCommand, out: &mut dyn Write) -> anyhow::Result<()> {
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
fn deny_entry_line(entry: &serde_json::Value) -> String {
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

/// An error as the person reads it: the whole chain on one line, escaped,
/// since server problem details and identity provider answers end up in it.
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

pub fn error_text(error: &anyhow::Error) -> String {
    crate::display::escape(&format!("{error:#}"))
}

/// Run a command; `Ok` carries the exit code (for `exec`, the child's).
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout();
    match cli.command {
        Command::Login(args) => login(&args, &mut out).await.map(|_| ExitCode::SUCCESS),
        Command::Status { cluster, output } => {
            status(cluster.as_deref(), output, &mut out).map(|_| ExitCode::SUCCESS)
        }
        Command::Logout { cluster, all } => {
            logout(cluster.as_deref(), all, &mut out).map(|_| ExitCode::SUCCESS)
        }
        Command::Exec {
            cluster,
            login,
            command,
        } => exec(cluster.as_deref(), &login, &command).await,
        Command::Audit(command) => audit(command, &mut out).await.map(|_| ExitCode::SUCCESS),
        Command::Deny(command) => deny(command, &mut out).await.map(|_| ExitCode::SUCCESS),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "talos-sso", &mut out);
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(names: &[&str]) -> ServerInfo {
        ServerInfo {
            server_version: "0".into(),
            api_version: 1,
            issuer: "https://idp".into(),
            discovery_url: None,
            client_id: "cli".into(),
            scopes: vec![],
            clusters: names
                .iter()
                .map(|n| ClusterInfo {
                    name: (*n).into(),
                    description: String::new(),
                    default_ttl_seconds: 300,
                    max_ttl_seconds: 900,
                })
                .collect(),
        }
    }

    #[test]
    fn one_cluster_is_chosen_for_you_several_need_a_name() {
        assert_eq!(pick_cluster(None, &info(&["prod"])).unwrap().name, "prod");
        let several = info(&["lab", "prod"]);
        let error = pick_cluster(None, &several).unwrap_err().to_string();
        assert!(
            error.contains("several clusters (lab, prod); choose one with --cluster"),
            "{error}"
        );
        assert_eq!(pick_cluster(Some("lab"), &several).unwrap().name, "lab");
        let error = pick_cluster(Some("staging"), &several).unwrap_err().to_string();
        assert!(
            error.contains("no cluster `staging`; it has: lab, prod"),
            "{error}"
        );
        assert!(pick_cluster(None, &info(&[])).is_err());
    }

    fn record(fields: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        fields.as_object().unwrap().clone()
    }

    fn render(records: &[serde_json::Map<String, serde_json::Value>], output: AuditOutput) -> String {
        let mut out = Vec::new();
        print_records(records, output, true, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// A username that tries to erase its own row, forge another, hide text
    /// and recolour the terminal.
    const FORGED: &str = "mallory@example.com\u{1b}[2K\r     7  2026-01-01T00:00:00.000000Z  \
        certificate.issued  success  prod  bob@example.com\n\u{1b}[8m\u{202e}moc.elpmaxe@eve\u{2066}\
        \u{200b}\u{feff}\u{9b}31m\u{7f}\t\u{85}\u{2028}";

    fn hostile_record() -> serde_json::Map<String, serde_json::Value> {
        record(json!({
            "seq": 6,
            "occurred_at": "2026-01-01T00:00:00.000000Z",
            "event": "certificate.denied",
            "outcome": "denied",
            "reason_code": "no_matching_rule\u{1b}]8;;http://evil\u{7}",
            "cluster": "prod\r\n",
            "username": FORGED,
            "user_agent": "curl\u{1b}[1A",
            "roles_granted": ["os:admin\u{202e}", 5],
            "details": {"note": "\u{1b}c\u{2069}"},
        }))
    }

    fn ordinary_record() -> serde_json::Map<String, serde_json::Value> {
        record(json!({
            "seq": 7,
            "occurred_at": "2026-01-01T00:00:01.000000Z",
            "event": "certificate.issued",
            "outcome": "success",
            "reason_code": null,
            "cluster": "prod",
            "username": "bob@example.com",
            "roles_granted": ["os:operator"],
        }))
    }

    fn no_hostile_characters(text: &str) {
        let found: Vec<char> = text
            .chars()
            .filter(|c| crate::display::is_unsafe(*c) && *c != '\n')
            .collect();
        assert!(found.is_empty(), "{found:?} in {text:?}");
    }

    #[test]
    fn record_text_cannot_forge_recolour_or_hide_table_rows() {
        let table = render(&[hostile_record(), ordinary_record()], AuditOutput::Table);
        no_hostile_characters(&table);
        let lines: Vec<&str> = table.split('\n').collect();
        assert_eq!(lines.len(), 4, "a heading, two rows, the final newline: {table}");
        assert_eq!(lines[3], "");
        let row = lines[1];
        assert!(row.starts_with("     6  "), "{row}");
        assert!(row.contains("  prod\\u{d}\\u{a}  "), "{row}");
        assert!(row.contains("mallory@example.com\\u{1b}[2K\\u{d}"), "{row}");
        assert!(
            row.contains("  denied (no_matching_rule\\u{1b}]8;;http:…  "),
            "{row}"
        );
        assert!(row.ends_with("  os:admin\\u{202e}"), "{row}");
        assert!(lines[2].starts_with("     7  "), "{table}");
    }

    #[test]
    fn one_long_value_cannot_push_the_other_columns_off_screen() {
        let long = "c".repeat(10_000);
        let mut huge = ordinary_record();
        huge.insert("cluster".into(), json!(long));
        huge.insert("username".into(), json!(format!("{long}@example.com")));
        let table = render(&[huge.clone(), ordinary_record()], AuditOutput::Table);
        let lines: Vec<&str> = table.lines().collect();
        let widest: usize = TABLE_COLUMNS.iter().map(|(_, _, widest)| widest).sum::<usize>() + 2 * 6;
        for line in &lines {
            assert!(line.chars().count() <= widest, "{line}");
        }
        let cut_cluster = format!("  {}…  ", "c".repeat(23));
        let cut_user = format!("  {}…  ", "c".repeat(47));
        assert!(lines[1].contains(&cut_cluster), "{}", lines[1]);
        assert!(lines[1].contains(&cut_user), "{}", lines[1]);
        assert!(lines[1].ends_with("  os:operator"), "{}", lines[1]);
        // Ordinary values keep the layout they always had.
        assert_eq!(
            lines[0],
            format!(
                "{:>6}  {:<27}  {:<19}  {:<24}  {:<8}  {:<24}  ROLES",
                "SEQ", "TIME", "EVENT", "OUTCOME", "CLUSTER", "USER"
            )
        );
        assert_eq!(
            lines[2],
            format!(
                "{:>6}  {:<27}  {:<19}  {:<24}  {:<8}  {:<24}  {}",
                7,
                "2026-01-01T00:00:01.000000Z",
                "certificate.issued",
                "success",
                "prod",
                "bob@example.com",
                "os:operator"
            )
        );
        // JSON and CSV keep the whole value.
        let exported = render(std::slice::from_ref(&huge), AuditOutput::Json);
        let back: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(exported.trim_end()).unwrap();
        assert_eq!(back, huge);
        let csv = render(std::slice::from_ref(&huge), AuditOutput::Csv);
        assert_eq!(parse_csv(&csv)[1][5], long);
    }

    /// RFC 4180 as a spreadsheet reads it: quoted fields may hold commas,
    /// doubled quotes and line breaks.
    fn parse_csv(text: &str) -> Vec<Vec<String>> {
        let mut rows = Vec::new();
        let mut row = Vec::new();
        let mut field = String::new();
        let mut chars = text.chars().peekable();
        let mut quoted = false;
        while let Some(c) = chars.next() {
            match (quoted, c) {
                (true, '"') if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                (true, '"') => quoted = false,
                (true, c) => field.push(c),
                (false, '"') if field.is_empty() => quoted = true,
                (false, ',') => row.push(std::mem::take(&mut field)),
                (false, '\n') => {
                    row.push(std::mem::take(&mut field));
                    rows.push(std::mem::take(&mut row));
                }
                (false, c) => field.push(c),
            }
        }
        assert!(
            !quoted && field.is_empty() && row.is_empty(),
            "unterminated: {text:?}"
        );
        rows
    }

    #[test]
    fn csv_cells_cannot_become_formulas_and_quoting_stays_right() {
        let values = [
            "=HYPERLINK(\"http://evil.example/\",\"details\")",
            "=1+1",
            "+1+1",
            "-2+3",
            "@SUM(A1:A9)",
            "\tcmd",
            "\r=1",
            "a,b",
            "say \"hi\"",
            "two\nlines",
            "bob@example.com",
            "",
        ];
        let records: Vec<_> = values
            .iter()
            .map(|v| {
                let mut r = ordinary_record();
                r.insert("username".into(), json!(v));
                r.insert("cluster".into(), json!(v));
                r
            })
            .collect();
        let csv = render(&records, AuditOutput::Csv);
        let rows = parse_csv(&csv);
        assert_eq!(rows.len(), values.len() + 1, "{csv}");
        assert_eq!(rows[0], AUDIT_COLUMNS);
        for (value, row) in values.iter().zip(&rows[1..]) {
            assert_eq!(row.len(), AUDIT_COLUMNS.len(), "{row:?}");
            let formula = value.starts_with(['=', '+', '-', '@', '\t', '\r']);
            let expected = if formula {
                format!("'{value}")
            } else {
                value.to_string()
            };
            assert_eq!(row[5], expected, "cluster");
            assert_eq!(row[6], expected, "username");
            assert!(
                !row.iter().any(|f| f.starts_with(['=', '+', '@', '\t', '\r'])),
                "{row:?}"
            );
        }
        assert_eq!(csv_field("=1+1"), "'=1+1");
        assert_eq!(csv_field("=a,\"b\""), "\"'=a,\"\"b\"\"\"");
        assert_eq!(csv_field("\r\n=1"), "\"'\r\n=1\"");
        assert_eq!(csv_field("plain"), "plain");
    }

    #[test]
    fn json_output_is_exactly_the_record_and_terminal_safe() {
        let records = [hostile_record(), ordinary_record()];
        let lines = render(&records, AuditOutput::Json);
        no_hostile_characters(&lines);
        let back: Vec<serde_json::Map<String, serde_json::Value>> =
            lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(back, records);
        // `audit show`: the same, pretty.
        let shown = record_json(&records[0], true).unwrap();
        no_hostile_characters(&shown);
        let back: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&shown).unwrap();
        assert_eq!(back, records[0]);
        assert!(
            shown.contains(r#""username": "mallory@example.com\u001b[2K\r"#),
            "{shown}"
        );
        assert!(
            shown.contains(r"\u202emoc.elpmaxe@eve\u2066\u200b\ufeff\u009b31m\u007f\t\u0085\u2028"),
            "{shown}"
        );
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
        let entry = json!({
            "username": hostile, "subject": hostile, "added_by": hostile,
            "added_at": hostile, "reason": hostile,
        });
        let error = anyhow!("problem {hostile}").context(format!("while {hostile}"));
        for line in [
            logged_in_line(&record, hostile, 100, true),
            status_line(&status),
            deny_entry_line(&entry),
            error_text(&error),
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

    #[test]
    fn durations_read_like_a_person_would_say_them() {
        assert_eq!(human_duration(299), "4m59s");
        assert_eq!(human_duration(3725), "1h02m");
        assert_eq!(human_duration(0), "expired");
    }
}
