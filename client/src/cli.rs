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
        #[arg(long)]
        cluster: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Remove this tool's talosconfig contexts and cached logins (nothing else).
    Logout {
        #[arg(long, conflicts_with = "all")]
        cluster: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// Make sure the certificate is valid for at least a minute (renewing it
    /// when needed), then run a command with TALOSCONFIG set to it.
    Exec {
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
    /// Block a person by subject (Entra object id) or username.
    Add {
        #[arg(long, required_unless_present = "user")]
        subject: Option<String>,
        #[arg(long)]
        user: Option<String>,
        /// Why (recorded in the audit trail).
        #[arg(long)]
        reason: String,
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
    /// Unblock.
    Remove {
        #[arg(long, required_unless_present = "user")]
        subject: Option<String>,
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
    /// Who is blocked.
    List {
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
        /// At most this many records (follows pages as needed).
        #[arg(long, default_value = "100")]
        limit: usize,
        #[arg(long, value_enum, default_value = "table")]
        output: AuditOutput,
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
    /// One record in full.
    Show {
        seq: i64,
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
    /// Every matching record, all pages, as JSON lines or CSV.
    Export {
        #[command(flatten)]
        filter: AuditFilterArgs,
        #[arg(long, value_enum, default_value = "json")]
        output: AuditOutput,
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        login: ExecLoginArgs,
    },
    /// Ask the server to recompute the hash chain.
    Verify {
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
    #[arg(long)]
    pub device: bool,
    #[arg(long)]
    pub no_browser: bool,
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
                eprintln!("Your saved login could not be renewed ({error}); logging in again.");
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
    writeln!(
        out,
        "Logged in to {} as {} with {}; certificate valid for {} (context `{}` in {}{}).",
        cluster.name,
        issued.identity.username,
        issued.roles.join(", "),
        human_duration(left),
        context,
        path.display(),
        match written.current_context.as_deref() {
            Some(current) if current == context => ", current",
            _ => "; use `talosctl --context` or --set-current",
        }
    )?;
    Ok(record)
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
        writeln!(out, "{}", serde_json::to_string_pretty(&json!(statuses))?)?;
        return Ok(());
    }
    if statuses.is_empty() {
        writeln!(out, "Not logged in anywhere. Run `talos-sso login`.")?;
        return Ok(());
    }
    for s in statuses {
        let state = if s.valid {
            human_duration(s.seconds_left) + " left"
        } else {
            "expired or missing; run `talos-sso login`".into()
        };
        writeln!(
            out,
            "{}: {} as {} with [{}], {} (context `{}` in {}, server {})",
            s.cluster,
            if s.valid { "logged in" } else { "not logged in" },
            s.username.as_deref().unwrap_or("?"),
            s.roles.join(", "),
            state,
            s.context,
            s.talosconfig.display(),
            s.server
        )?;
    }
    Ok(())
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
            "{name}: {} context `{}` from {}",
            if removed.is_empty() { "no" } else { "removed" },
            record.context,
            record.talosconfig.display()
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

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
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
                writeln!(out, "{}", serde_json::to_string(record)?)?;
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
                    "{:>6}  {:<27}  {:<19}  {:<24}  {:<8}  {:<24}  ROLES",
                    "SEQ", "TIME", "EVENT", "OUTCOME", "CLUSTER", "USER"
                )?;
            }
            for r in records {
                let outcome = match cell(r, "reason_code").as_str() {
                    "" => cell(r, "outcome"),
                    reason => format!("{} ({reason})", cell(r, "outcome")),
                };
                writeln!(
                    out,
                    "{:>6}  {:<27}  {:<19}  {:<24}  {:<8}  {:<24}  {}",
                    cell(r, "seq"),
                    cell(r, "occurred_at"),
                    cell(r, "event"),
                    outcome,
                    cell(r, "cluster"),
                    cell(r, "username"),
                    cell(r, "roles_granted")
                )?;
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
                shown += page.records.len();
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
            writeln!(out, "{}", serde_json::to_string_pretty(&record)?)?;
            Ok(())
        }
        AuditCommand::Verify { server, login } => {
            let (api, tokens) = authenticated(server.as_deref(), &login).await?;
            let answer = api.audit_verify(&tokens.bearer).await.map_err(explain)?;
            if answer["intact"] == serde_json::Value::Bool(true) {
                writeln!(
                    out,
                    "audit chain intact: {} records verified (last seq {})",
                    answer["verified"], answer["last_seq"]
                )?;
                Ok(())
            } else {
                bail!(
                    "audit chain broken at record {}: {}",
                    answer["first_broken"]["seq"],
                    answer["first_broken"]["reason"].as_str().unwrap_or_default()
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
                answer["entry"]["username"]
                    .as_str()
                    .or(answer["entry"]["subject"].as_str())
                    .unwrap_or("?"),
                answer["audit_id"]
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
                answer["removed"], answer["audit_id"]
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
                writeln!(
                    out,
                    "{}  {}  by {} at {}: {}",
                    entry["username"].as_str().unwrap_or("-"),
                    entry["subject"].as_str().unwrap_or("-"),
                    entry["added_by"].as_str().unwrap_or("?"),
                    entry["added_at"].as_str().unwrap_or("?"),
                    entry["reason"].as_str().unwrap_or("")
                )?;
            }
        }
    }
    Ok(())
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

    #[test]
    fn durations_read_like_a_person_would_say_them() {
        assert_eq!(human_duration(299), "4m59s");
        assert_eq!(human_duration(3725), "1h02m");
        assert_eq!(human_duration(0), "expired");
    }
}
