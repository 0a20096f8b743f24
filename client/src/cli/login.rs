//! `login` and `logout`: a certificate written into the talosconfig, and
//! taken out again; and the fresh token that `audit` and `deny` need. A
//! person logs in; a workload sends its own token instead (`--token-file`,
//! `--github-actions`, see [`super::workload`]), and nothing is saved.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use time::OffsetDateTime;

use talos_sso_api::audit::parse_micros;
use talos_sso_api::{CertificateRequest, ClusterInfo, ServerInfo};

use super::select::LoginSelection;
use super::workload::GitHubActionsArgs;
use super::{explained, human_duration};
use crate::api::ApiClient;
use crate::key::ClientKey;
use crate::login::browser::{BrowserOptions, Opener, system_opener};
use crate::login::cache::Cache;
use crate::login::workload::WorkloadSource;
use crate::login::{LoginClient, Tokens, cache};
use crate::state::{self, LoginRecord, TokenStore};
use crate::talosconfig::{self, ContextEntry};
use crate::trust::{ExtraRoots, ServerTrust};

#[derive(Debug, Clone, Args)]
pub struct LoginArgs {
    /// The talos-sso server (default: $TALOS_SSO_SERVER, else the one remembered from the last login).
    #[arg(short, long, env = "TALOS_SSO_SERVER")]
    pub server: Option<String>,
    /// Which cluster (remembered as the default; not needed when the server has one).
    #[arg(short, long)]
    pub cluster: Option<String>,
    /// Ask for a Talos role (repeat for several); default: the cluster's default roles.
    #[arg(short, long = "role")]
    pub roles: Vec<String>,
    /// Certificate lifetime (default: the cluster's, usually 5m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Option<Duration>,
    #[command(flatten)]
    pub method: LoginMethod,
    #[command(flatten)]
    pub github: GitHubActionsArgs,
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
    /// Also trust the certificate authorities in this PEM file for the
    /// server (a company CA); remembered for the server.
    #[arg(long, value_name = "FILE")]
    pub certificate_authority: Option<PathBuf>,
    /// Also trust the certificate authorities in this PEM file for the
    /// identity provider the server announces; remembered for the server.
    #[arg(long, value_name = "FILE")]
    pub provider_certificate_authority: Option<PathBuf>,
    /// Then stay in the foreground and keep this login's certificate fresh,
    /// as `talos-sso watch --cluster NAME` does, until stopped.
    #[arg(long)]
    pub watch: bool,
    /// A `ttl` beyond the cluster's longest is lowered to it, and said so
    /// (`exec --ttl`), instead of being refused by the server (`login --ttl`).
    #[arg(skip)]
    pub ttl_up_to_cluster_max: bool,
    /// Only with the saved refresh token: a login that needs the person
    /// fails (with status 4) instead of opening the browser (`watch`).
    #[arg(skip)]
    pub silent_only: bool,
}

/// The extra authorities for `server`: the ones given now, else the ones
/// remembered for it.
pub(super) struct Trusted {
    pub remembered: ServerTrust,
    pub server: Option<ExtraRoots>,
    pub provider: Option<ExtraRoots>,
}

pub(super) fn trusted(
    saved: &state::ClientState,
    server: &str,
    certificate_authority: Option<&Path>,
    provider_certificate_authority: Option<&Path>,
) -> anyhow::Result<Trusted> {
    let before = saved.trust.get(server).cloned().unwrap_or_default();
    let remembered = ServerTrust {
        certificate_authority: certificate_authority
            .map(Path::to_owned)
            .or(before.certificate_authority),
        provider_certificate_authority: provider_certificate_authority
            .map(Path::to_owned)
            .or(before.provider_certificate_authority),
    };
    let load = |path: &Option<PathBuf>| path.as_deref().map(ExtraRoots::load).transpose();
    Ok(Trusted {
        server: load(&remembered.certificate_authority)?,
        provider: load(&remembered.provider_certificate_authority)?,
        remembered,
    })
}

/// How to log in, for `login` and for the commands that log in again when
/// they have to (`exec`, `audit`, `deny`).
#[derive(Debug, Clone, Default, Args)]
pub struct LoginMethod {
    /// When logging in, use a code on another device (SSH sessions, headless machines).
    #[arg(long, conflicts_with = "keyboard")]
    pub device: bool,
    /// When logging in, print the login URL and read back the address the
    /// browser ends on, pasted (headless machines where the device flow is blocked).
    #[arg(long)]
    pub keyboard: bool,
    /// When logging in, print the login URL instead of opening a browser.
    #[arg(long)]
    pub no_browser: bool,
    /// When logging in, the fixed port for the browser's redirect to
    /// http://localhost:PORT/callback (with --keyboard: 8000 unless given).
    #[arg(long)]
    pub callback_port: Option<u16>,
    /// Send the bearer token in this file instead of logging in: a
    /// workload's token for `login` and `exec` (a Kubernetes projected
    /// service-account token, read again for each certificate), a service
    /// principal's own token for `audit` and `deny` (read again at each
    /// reconnection of `--follow`). Never saved.
    #[arg(long, env = "TALOS_SSO_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Where saved logins (refresh tokens) are kept: the operating system's
    /// keyring, or an owner-only file (not on Windows). Remembered; default:
    /// the keyring when one answers at the first login, else the file.
    #[arg(long, env = "TALOS_SSO_TOKEN_STORE", value_name = "STORE")]
    pub token_store: Option<TokenStore>,
}

impl LoginMethod {
    /// The workload token source chosen instead of a person's login, if any.
    pub(super) fn workload_source(
        &self,
        github: &GitHubActionsArgs,
    ) -> anyhow::Result<Option<WorkloadSource>> {
        super::workload::source(self.token_file.as_deref(), self.device || self.keyboard, github)
    }
}

/// How long a command that logs in again waits for the browser.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(300);

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

/// How a command may obtain a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interaction {
    /// The saved refresh token, else the person logs in (browser, device
    /// or keyboard).
    Allowed,
    /// The saved refresh token only (`watch`).
    SilentOnly,
}

/// A fresh ID token: silently with the cached refresh token when possible,
/// else interactively (saying why) when `interaction` allows.
async fn obtain_tokens(
    provider: &LoginClient,
    server: &str,
    login: &LoginMethod,
    timeout: Duration,
    opener: Option<Opener>,
    interaction: Interaction,
) -> anyhow::Result<Tokens> {
    let key = cache::key(server, &provider.issuer, &provider.client_id);
    let cache = Cache::open(login.token_store)?;
    let refresh_lock = cache.lock().context("locking the token store")?;
    crate::debug::note(format_args!("token store: {}", cache.describe()));
    let saved = cache.get(&key);
    if interaction == Interaction::SilentOnly {
        let Some(refresh_token) = saved else {
            let error = anyhow!(
                "no saved login for {}: run `talos-sso login` once",
                talos_sso_text::escape(server)
            );
            return Err(super::exit::classed(super::exit::Outcome::LoginNeeded, error));
        };
        // A refusal by the provider is a `LoginError::Refused` in the
        // chain: status 4, as for any refresh token refused or revoked.
        return refresh(provider, &cache, &key, &refresh_token)
            .await
            .context("renewing with the saved refresh token");
    }
    if let Some(refresh_token) = saved {
        match refresh(provider, &cache, &key, &refresh_token).await {
            Ok(tokens) => return Ok(tokens),
            Err(error) => {
                eprintln!(
                    "Your saved login could not be renewed ({}); logging in again.",
                    talos_sso_text::escape(&error.to_string())
                );
            }
        }
    } else {
        crate::debug::note(format_args!(
            "no saved refresh token for this server and provider"
        ));
    }
    drop(refresh_lock);
    let flow = match (login.device, login.keyboard) {
        (true, _) => "device code (--device)",
        (_, true) => "keyboard, the redirect pasted (--keyboard)",
        _ => "browser, PKCE on a loopback redirect",
    };
    crate::debug::note(format_args!("logging in interactively by {flow}"));
    let tokens = if login.device {
        crate::login::device::login(provider).await?
    } else if login.keyboard {
        let mut input = tokio::io::BufReader::new(tokio::io::stdin());
        crate::login::browser::keyboard_login(provider, login.callback_port, timeout, &mut input).await?
    } else {
        let opener = if login.no_browser { None } else { opener };
        let options = BrowserOptions {
            callback_port: login.callback_port,
            opener,
            timeout,
        };
        crate::login::browser::login(provider, &options).await?
    };
    match &tokens.refresh_token {
        Some(refresh_token) => cache
            .put(&key, refresh_token, &tokens.username)
            .context("saving the login")?,
        // Otherwise every later login opens the browser again, and nobody
        // would know why.
        None => eprintln!("{}", no_refresh_token(provider)),
    }
    cache.remember_token(&key, &tokens.bearer)?;
    Ok(tokens)
}

/// What a login says when the provider gave no refresh token.
fn no_refresh_token(provider: &LoginClient) -> String {
    format!(
        "Note: the identity provider issued no refresh token (scopes asked for: {}), so the next login \
         needs the browser again. Its operators can allow refresh tokens for this client \
         (talos-sso's docs/providers say how, provider by provider).",
        talos_sso_text::bounded(&provider.scopes.join(" "), SERVER_VALUES_CHARS)
    )
}

/// How long to wait before asking again for a token that came back
/// identical to the last one: past the provider's current second, whatever
/// its clock's offset from ours.
const SAME_SECOND_WAIT: Duration = Duration::from_millis(1100);

/// A silent refresh that never yields the token obtained last time.
///
/// Providers whose tokens carry no unique id (`jti`) answer two refreshes in
/// the same second with byte-identical ID tokens (same claims, same `iat`),
/// and the server lets one token mint one certificate: `login` twice in a
/// row, or `exec` right after `login`, would be refused as a replay. Such
/// a token is recognised by its hash and asked for again after the second
/// has passed.
async fn refresh(
    provider: &LoginClient,
    cache: &Cache,
    key: &str,
    refresh_token: &str,
) -> anyhow::Result<Tokens> {
    let once = |refresh_token: zeroize::Zeroizing<String>| async move {
        let tokens = provider.refresh(&refresh_token).await?;
        if let Some(rotated) = &tokens.refresh_token {
            cache
                .put(key, rotated, &tokens.username)
                .context("saving the login")?;
        }
        anyhow::Ok(tokens)
    };
    let mut tokens = once(zeroize::Zeroizing::new(refresh_token.to_owned())).await?;
    if cache.is_last_token(key, &tokens.bearer) {
        tokio::time::sleep(SAME_SECOND_WAIT).await;
        let next = tokens
            .refresh_token
            .clone()
            .unwrap_or_else(|| zeroize::Zeroizing::new(refresh_token.to_owned()));
        tokens = once(next).await?;
        if cache.is_last_token(key, &tokens.bearer) {
            bail!("the identity provider answered a refresh with the token it had already issued");
        }
    }
    cache.remember_token(key, &tokens.bearer)?;
    Ok(tokens)
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
    let workload = args.method.workload_source(&args.github)?;
    if workload.is_some() && (args.watch || args.silent_only) {
        bail!(
            "a watch renews a person's login with its saved refresh token; a workload keeps its \
             certificate fresh with `talos-sso exec --token-file` (or --github-actions)"
        );
    }
    // The workload's token first: a file that holds none is said before
    // anything is asked of the server.
    let workload_tokens = match &workload {
        Some(source) => Some(super::workload::tokens(source).await?),
        None => None,
    };
    let saved = state::load();
    let server = args.server.clone().or(saved.server.clone()).ok_or_else(|| {
        anyhow!("no server yet: run `talos-sso login --server https://talos-sso.example.com` once")
    })?;
    let trust = trusted(
        &saved,
        &server,
        args.certificate_authority.as_deref(),
        args.provider_certificate_authority.as_deref(),
    )?;
    let api = ApiClient::trusting(&server, trust.server.as_ref())?;
    let info = api.info().await.map_err(explained)?;
    let cluster = pick_cluster(
        args.cluster.as_deref().or(saved.default_cluster.as_deref()),
        &info,
    )?;
    let tokens = match workload_tokens {
        Some(tokens) => tokens,
        None => {
            let provider = LoginClient::discover(&info, trust.provider.as_ref()).await?;
            let interaction = if args.silent_only {
                Interaction::SilentOnly
            } else {
                Interaction::Allowed
            };
            obtain_tokens(
                &provider,
                &server,
                &args.method,
                args.timeout,
                opener,
                interaction,
            )
            .await?
        }
    };

    let key = ClientKey::generate()?;
    let csr = key.csr_pem()?;
    let mut ttl_seconds = args.ttl.map(|t| t.as_secs().max(1));
    if args.ttl_up_to_cluster_max
        && let Some(wanted) = ttl_seconds
        && cluster.max_ttl_seconds > 0
    {
        let granted = wanted.min(cluster.max_ttl_seconds);
        writeln!(out, "{}", ttl_line(&cluster.name, wanted, granted))?;
        ttl_seconds = Some(granted);
    }
    let request = CertificateRequest {
        cluster: cluster.name.clone(),
        csr,
        roles: args.roles.clone(),
        ttl_seconds,
    };
    let issued = api
        .request_certificate(&tokens.bearer, &request)
        .await
        .map_err(|e| super::exit::explained(&e, &cluster.name))?;

    let path = default_talosconfig(args.talosconfig.as_deref())?;
    let context = args.context.clone().unwrap_or_else(|| issued.context.clone());
    let entry = ContextEntry {
        endpoints: issued.endpoints.clone(),
        nodes: issued.nodes.clone(),
        ca_pem: issued.ca.clone(),
        crt_pem: issued.certificate.clone(),
        key_pem: key.private_key_pem().to_string(),
    };
    // What this client wrote into that very context last time, if it did.
    let last_written = saved
        .logins
        .values()
        .find(|r| r.context == context && r.talosconfig == path)
        .and_then(|r| r.targets_written.clone());
    let written =
        talosconfig::upsert_context(&path, &context, &entry, last_written.as_ref(), args.set_current)?;
    crate::debug::note(format_args!("wrote context `{context}` into {}", path.display()));
    for (kept, field, servers) in [
        (written.kept_endpoints, "endpoints", &issued.endpoints),
        (written.kept_nodes, "nodes", &issued.nodes),
    ] {
        if kept {
            writeln!(out, "{}", kept_line(field, &context, servers))?;
        }
    }
    let record = LoginRecord {
        server: server.clone(),
        context: context.clone(),
        talosconfig: path.clone(),
        username: issued.identity.username.clone(),
        roles: issued.roles.clone(),
        not_after: issued.not_after.clone(),
        targets_written: Some(talosconfig::Targets {
            endpoints: issued.endpoints.clone(),
            nodes: issued.nodes.clone(),
        }),
        workload: workload.is_some(),
    };
    let chosen_explicitly = args.cluster.is_some();
    state::update(|s| {
        s.server = Some(server.clone());
        if trust.remembered == ServerTrust::default() {
            s.trust.remove(&server);
        } else {
            s.trust.insert(server.clone(), trust.remembered.clone());
        }
        if chosen_explicitly || s.default_cluster.is_none() {
            s.default_cluster = Some(cluster.name.clone());
        }
        s.logins.insert(cluster.name.clone(), record.clone());
    })
    .context("saving the client configuration")?;

    let left = parse_micros(&issued.not_after)
        .map(|t| (t - OffsetDateTime::now_utc()).whole_seconds())
        .unwrap_or(0);
    let current = written.current_context.as_deref() == Some(context.as_str());
    writeln!(out, "{}", logged_in_line(&record, &cluster.name, left, current))?;
    Ok(record)
}

/// Longest list of the server's values shown in one line, in characters.
const SERVER_VALUES_CHARS: usize = 300;

/// What `login` says when it kept the person's `endpoints` or `nodes`
/// (`field`) in `context`; `servers` are the server's values, escaped and
/// bounded like everything the server sends.
pub(super) fn kept_line(field: &str, context: &str, servers: &[String]) -> String {
    let command = field.trim_end_matches('s');
    format!(
        "Kept the {field} you set in context `{}` (`talosctl config {command}`); the server's are {}.",
        talos_sso_text::bounded(context, SERVER_VALUES_CHARS),
        talos_sso_text::bounded(&servers.join(", "), SERVER_VALUES_CHARS)
    )
}

/// What `exec --ttl` says about the certificate it asks for.
pub(super) fn ttl_line(cluster: &str, wanted: u64, granted: u64) -> String {
    let cluster = talos_sso_text::escape(cluster);
    let show = |s: u64| human_duration(i64::try_from(s).unwrap_or(i64::MAX));
    if granted >= wanted {
        format!("Asking for a {} certificate to cover the command.", show(wanted))
    } else {
        format!(
            "The command may need {}, but {cluster} allows certificates of at most {}: asking for that. \
             Talos checks the certificate when talosctl connects, so a connection made after it expires \
             (talosctl reconnecting to a rebooted node) is refused: run `talos-sso exec` again then.",
            show(wanted),
            show(granted)
        )
    }
}

/// What `login` says when it is done. The names come from the server (and
/// the person's identity provider): escaped, like every such text shown.
pub(super) fn logged_in_line(
    record: &LoginRecord,
    cluster: &str,
    seconds_left: i64,
    current: bool,
) -> String {
    use talos_sso_text::escape;
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

pub(super) fn logout(select: &LoginSelection, all: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let saved = state::load();
    // Nothing named: the default cluster's login.
    let default_only = LoginSelection {
        cluster: saved.default_cluster.clone(),
        ..Default::default()
    };
    let select = if all || select.is_narrowed() {
        select
    } else {
        &default_only
    };
    let chosen: Vec<(String, LoginRecord)> = select
        .select(&saved)
        .into_iter()
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
            talos_sso_text::escape(name),
            if removed.is_empty() { "no" } else { "removed" },
            talos_sso_text::escape(&record.context),
            talos_sso_text::escape(&record.talosconfig.display().to_string())
        )?;
    }
    let remaining = state::update(|s| {
        for (name, _) in &chosen {
            s.logins.remove(name);
        }
    })?;
    // Tokens are per server: forget them once no login on that server is left.
    let cache = Cache::for_logout(all)?;
    let mut forgotten = 0;
    if all {
        forgotten = cache.forget(None)?;
    } else {
        for (_, record) in &chosen {
            if !remaining.logins.values().any(|r| r.server == record.server) {
                forgotten += cache.forget(Some(&record.server))?;
            }
        }
    }
    writeln!(out, "Forgot {forgotten} saved login(s).")?;
    Ok(())
}

/// The server and a fresh token for commands that are not `login`.
pub(super) async fn authenticated(
    server: Option<&str>,
    login: &LoginMethod,
) -> anyhow::Result<(ApiClient, Tokens)> {
    let saved = state::load();
    let server = server
        .map(str::to_owned)
        .or(saved.server.clone())
        .ok_or_else(|| {
            let error = anyhow!("no server yet: pass --server or run `talos-sso login --server ...` once");
            super::exit::classed(super::exit::Outcome::LoginNeeded, error)
        })?;
    let trust = trusted(&saved, &server, None, None)?;
    let api = ApiClient::trusting(&server, trust.server.as_ref())?;
    if let Some(path) = &login.token_file {
        let source = WorkloadSource::File(path.clone());
        return Ok((api, super::workload::tokens(&source).await?));
    }
    let info = api.info().await.map_err(explained)?;
    let provider = LoginClient::discover(&info, trust.provider.as_ref()).await?;
    let tokens = obtain_tokens(
        &provider,
        &server,
        login,
        LOGIN_TIMEOUT,
        Some(system_opener()),
        Interaction::Allowed,
    )
    .await?;
    // Remember the server, as `login` does.
    state::update(|s| s.server = Some(server.clone())).context("saving the client configuration")?;
    Ok((api, tokens))
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
            token: Default::default(),
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
}
