//! A real, OpenID-certified OpenID Provider for the end-to-end tests:
//! panva's `oidc-provider` from npm, run with Node.js from
//! `tests/oidc-provider/` (`provider.mjs` says how it is set up: a `groups`
//! scope, opaque access tokens, ID tokens without `jti`, PKCE, a public
//! native client with a loopback redirect, refresh tokens, the device flow;
//! a confidential collector client with the client credentials grant and
//! RFC 9068 JWT access tokens; when asked, a confidential web client for
//! the server's console, whose redirect URI is the console's callback).
//!
//! This module owns starting it (a free port, a bounded wait for it to
//! serve, killed when dropped), a talos-sso server configured for it (the
//! console on, if asked), and the "browser" that clicks through its pages
//! and the console's: it keeps cookies per host as browsers do, sends
//! `Sec-Fetch-Site` as they do, follows redirects, submits forms, follows
//! links, and names the person to sign in with the `x-test-login` header
//! the provider's test interaction reads. A machine without Node.js or
//! without the npm packages fails the test with what to run; it never
//! skips it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use talos_sso_server::config::Config;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::harness::{TestServer, Workdir};
use crate::material::write_file;

/// The CLI's public client at the provider.
pub const CLIENT_ID: &str = "talos-sso-cli";
/// On call: `groups: [oncall]`, `os:operator` on `prod`.
pub const ONCALL_USER: &str = "bob";
/// In no group at all: no `groups` claim.
pub const NO_GROUP_USER: &str = "dave";
/// A SIEM's collector: a confidential client with the client credentials
/// grant, whose JWT access tokens (RFC 9068) are for the audience
/// `talos-sso`; in `auditors` by its client id.
pub const COLLECTOR_ID: &str = "siem-collector";
pub const COLLECTOR_SECRET: &str = "siem-collector-secret";
/// The console's confidential web client (registered when
/// [`Options::console_redirect`] is set); its ID tokens are for this
/// audience.
pub const CONSOLE_CLIENT_ID: &str = "talos-sso-console";
pub const CONSOLE_CLIENT_SECRET: &str = "talos-sso-console-secret";
/// In `auditors`: reads the audit trail, no role on `prod`.
pub const AUDITOR_USER: &str = "sam";
pub const GROUP_ONCALL: &str = "oncall";
pub const GROUP_AUDITORS: &str = "auditors";

/// The folder with `provider.mjs`, `package.json` and `package-lock.json`.
pub fn provider_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc-provider")
}

/// How to install what the provider needs, for the failure messages.
fn install_hint() -> String {
    format!(
        "run `npm ci` in {} (or `npm ci --prefix tests/oidc-provider` from the repository root)",
        provider_dir().display()
    )
}

/// Fail, with what to run, unless Node.js is on PATH and `node_modules`
/// holds the `oidc-provider` version `package-lock.json` pins.
fn check_installed() {
    let node = std::process::Command::new("node").arg("--version").output();
    match node {
        Ok(output) if output.status.success() => {}
        _ => panic!(
            "the real-provider tests need Node.js (`node` on PATH, version 18 or later) and its npm \
             packages: install Node.js and npm, then {}",
            install_hint()
        ),
    }
    let dir = provider_dir();
    let lock: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("package-lock.json"))
            .expect("tests/oidc-provider/package-lock.json"),
    )
    .expect("package-lock.json is JSON");
    let pinned = lock["packages"]["node_modules/oidc-provider"]["version"]
        .as_str()
        .expect("package-lock.json pins oidc-provider")
        .to_owned();
    let installed = std::fs::read_to_string(dir.join("node_modules/oidc-provider/package.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|package| package["version"].as_str().map(str::to_owned));
    match installed {
        Some(version) if version == pinned => {}
        Some(version) => panic!(
            "tests/oidc-provider/node_modules has oidc-provider {version}, package-lock.json pins {pinned}: {}",
            install_hint()
        ),
        None => panic!(
            "the npm package oidc-provider is not installed in tests/oidc-provider/node_modules: {}",
            install_hint()
        ),
    }
}

/// `path` opened for appending: stdout and stderr share the log.
fn append(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("log file")
}

/// A running provider. Dropping it kills the process (and the provider
/// exits by itself when its stdin closes, should this process die first).
#[derive(Debug)]
pub struct RealOp {
    /// `http://127.0.0.1:<port>`, as its discovery document says.
    pub issuer: String,
    child: Child,
    /// Held open: the provider exits when it closes.
    _stdin: ChildStdin,
    /// What the provider wrote to stderr, for failure messages.
    log: tempfile::NamedTempFile,
}

/// How the provider is started.
#[derive(Debug, Clone)]
pub struct Options {
    /// The polling interval it announces for the device flow, in seconds.
    pub device_interval: u32,
    /// oidc-provider's own rule for refresh tokens (`offline_access`
    /// granted, which needs `prompt=consent`) instead of Keycloak's (always).
    pub strict_offline_access: bool,
    /// The console's callback (`<public_url>/ui/callback`): the console's
    /// client ([`CONSOLE_CLIENT_ID`]) is registered with it as its only
    /// redirect URI, which the provider matches exactly.
    pub console_redirect: Option<String>,
}

impl Default for Options {
    /// As [`RealOpEnv::start`] has it: a 1 s polling interval, Keycloak's
    /// refresh tokens, no console client.
    fn default() -> Self {
        Self {
            device_interval: 1,
            strict_offline_access: false,
            console_redirect: None,
        }
    }
}

impl RealOp {
    /// Start the provider; `device_interval` and `strict_offline_access`
    /// as [`Options`] describes them.
    pub async fn start(device_interval: u32, strict_offline_access: bool) -> Self {
        Self::start_with(&Options {
            device_interval,
            strict_offline_access,
            ..Options::default()
        })
        .await
    }

    /// Start the provider as `options` say.
    pub async fn start_with(options: &Options) -> Self {
        check_installed();
        let log = tempfile::NamedTempFile::new().expect("log file");
        let mut command = Command::new("node");
        command
            .arg("provider.mjs")
            .arg("--device-interval")
            .arg(options.device_interval.to_string());
        if options.strict_offline_access {
            command.arg("--strict-offline-access");
        }
        if let Some(redirect) = &options.console_redirect {
            command.arg("--console-redirect").arg(redirect);
        }
        let mut child = command
            .current_dir(provider_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(append(log.path()))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting `node provider.mjs`: {e}; {}", install_hint()));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await;
        // The rest of stdout (oidc-provider writes some notices there) goes
        // to the log: a closed pipe would stop the provider at its next write.
        let mut rest = append(log.path());
        tokio::spawn(async move {
            use std::io::Write;
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = writeln!(rest, "{line}");
            }
        });
        let read_log = || std::fs::read_to_string(log.path()).unwrap_or_default();
        let issuer = match first {
            Ok(Ok(Some(line))) if line.starts_with("issuer http://127.0.0.1:") => {
                line.trim_start_matches("issuer ").trim().to_owned()
            }
            Ok(other) => panic!("the provider did not start ({other:?}): {}", read_log()),
            Err(_) => panic!("the provider did not start within 20 s: {}", read_log()),
        };
        Self {
            issuer,
            child,
            _stdin: stdin,
            log,
        }
    }

    /// Everything the provider logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// A browser in which `user` signs in at the provider.
    pub fn browser(&self, user: &str) -> Browser {
        Browser {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(20))
                .build()
                .expect("client"),
            provider: url::Url::parse(&self.issuer).expect("issuer URL"),
            user: user.to_owned(),
            cookies: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Drop for RealOp {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A page the browser ended on.
#[derive(Debug)]
pub struct Page {
    pub url: String,
    pub status: u16,
    pub body: String,
    /// Every URL of the navigation, the redirects followed and this page's
    /// own last: what went back and forth (the console's callback with its
    /// `code`, `state` and `iss`, say).
    pub chain: Vec<String>,
}

impl Page {
    /// The page at the end of `chain`.
    fn of(chain: &[url::Url], status: u16, body: String) -> Self {
        Self {
            url: chain.last().map(url::Url::to_string).unwrap_or_default(),
            status,
            body,
            chain: chain.iter().map(url::Url::to_string).collect(),
        }
    }
}

/// A person's browser, as far as the provider's and the console's pages
/// need one: cookies, redirects, forms, links, `Sec-Fetch-Site`.
///
/// Cookies are kept per host, as browsers keep them (RFC 6265, section
/// 8.5: cookies are not kept apart by port): the provider and the server
/// under test, both on 127.0.0.1 on different ports, each get the other's
/// cookies too, as they would from a browser, and must tell theirs by name.
/// Their `Path`, `Domain` and expiry are not kept; a cookie set empty (how
/// both clear theirs) is removed.
#[derive(Debug)]
pub struct Browser {
    http: reqwest::Client,
    provider: url::Url,
    user: String,
    /// Host, then name, then value.
    cookies: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
}

impl Browser {
    /// Open `url` as if typed, and follow redirects (at most 20) to the
    /// page they end on.
    pub async fn visit(&self, url: &str) -> Page {
        self.go(url::Url::parse(url).expect("URL"), None, None, None)
            .await
    }

    /// As [`Self::visit`], but stop at the first redirect to a URL that
    /// starts with `prefix`, without opening it: the page is that URL, with
    /// the status of the redirect and no body. How a test holds on to an
    /// authorization response (its `code`, `state`, `iss`) to replay or
    /// change it.
    pub async fn visit_until(&self, url: &str, prefix: &str) -> Page {
        self.go(url::Url::parse(url).expect("URL"), None, None, Some(prefix))
            .await
    }

    /// Follow the first link on `page` whose text contains `text`.
    pub async fn follow(&self, page: &Page, text: &str) -> Page {
        let href = link(&page.body, text).unwrap_or_else(|| {
            panic!(
                "no link \"{text}\" on {} ({}): {}",
                page.url, page.status, page.body
            )
        });
        let base = url::Url::parse(&page.url).expect("page URL");
        let target = base.join(&href).expect("link");
        self.go(target, None, Some(base.origin()), None).await
    }

    /// The cookie `name` this browser holds for `url`'s host, if any.
    pub fn cookie(&self, url: &str, name: &str) -> Option<String> {
        let host = url::Url::parse(url).ok()?.host_str()?.to_owned();
        let jar = self.cookies.lock().expect("jar");
        jar.get(&host)?.get(name).cloned()
    }

    /// Approve the device login `user_code` from `verification_uri`: the
    /// code entered, the confirmation accepted, the sign-in done. Returns
    /// the last page.
    pub async fn approve_device(&self, verification_uri: &str, user_code: &str) -> Page {
        let mut url = url::Url::parse(verification_uri).expect("verification URI");
        url.query_pairs_mut().append_pair("user_code", user_code);
        // The provider posts the code to itself (a form a script submits),
        // then asks to confirm it.
        let posted = self.submit_form(&self.go(url, None, None, None).await).await;
        self.submit_form(&posted).await
    }

    /// Submit the first form on `page` with its hidden inputs.
    pub async fn submit_form(&self, page: &Page) -> Page {
        let (action, fields) = first_form(&page.body)
            .unwrap_or_else(|| panic!("no form on {} ({}): {}", page.url, page.status, page.body));
        let base = url::Url::parse(&page.url).expect("page URL");
        let target = base.join(&action).expect("form action");
        self.go(target, Some(fields), Some(base.origin()), None).await
    }

    /// Navigate to `url` (posting `form`, if any) and follow redirects,
    /// up to one to a URL starting with `stop`; `initiator` is the origin
    /// of the page that started the navigation (a link, a form), none when
    /// typed.
    async fn go(
        &self,
        mut url: url::Url,
        mut form: Option<Vec<(String, String)>>,
        initiator: Option<url::Origin>,
        stop: Option<&str>,
    ) -> Page {
        let mut chain: Vec<url::Url> = Vec::new();
        let mut redirected = None;
        for _ in 0..20 {
            chain.push(url.clone());
            if let (Some(stop), Some(status)) = (stop, redirected)
                && url.as_str().starts_with(stop)
            {
                return Page::of(&chain, status, String::new());
            }
            let mut request = match &form {
                Some(fields) => self.http.post(url.clone()).form(fields),
                None => self.http.get(url.clone()),
            };
            request = request.header("sec-fetch-site", fetch_site(initiator.as_ref(), &chain));
            if url.origin() == self.provider.origin() {
                request = request.header("x-test-login", &self.user);
            }
            let cookies = self.cookie_header(&url);
            if !cookies.is_empty() {
                request = request.header(reqwest::header::COOKIE, cookies);
            }
            let response = request
                .send()
                .await
                .unwrap_or_else(|e| panic!("GET/POST {url}: {e}"));
            self.keep_cookies(&url, &response);
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_else(|| panic!("a redirect without Location from {url}"))
                    .to_owned();
                url = url.join(&location).expect("Location");
                redirected = Some(status.as_u16());
                // 303 (and, as browsers do, 301/302) turn a POST into a GET.
                form = None;
                continue;
            }
            let body = response.text().await.unwrap_or_default();
            return Page::of(&chain, status.as_u16(), body);
        }
        panic!("more than 20 redirects, the last to {url}");
    }

    /// The `Cookie` header for `url`: every cookie of its host.
    fn cookie_header(&self, url: &url::Url) -> String {
        let jar = self.cookies.lock().expect("jar");
        jar.get(url.host_str().unwrap_or_default())
            .into_iter()
            .flatten()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Keep each `Set-Cookie` of the answer from `url` for its host (name
    /// and value; an emptied one is removed, as the provider and the
    /// console clear cookies that way).
    fn keep_cookies(&self, url: &url::Url, response: &reqwest::Response) {
        let mut all = self.cookies.lock().expect("jar");
        let jar = all
            .entry(url.host_str().unwrap_or_default().to_owned())
            .or_default();
        for header in response.headers().get_all(reqwest::header::SET_COOKIE) {
            let Ok(text) = header.to_str() else { continue };
            let pair = text.split(';').next().unwrap_or_default();
            let Some((name, value)) = pair.split_once('=') else {
                continue;
            };
            if value.is_empty() {
                jar.remove(name.trim());
            } else {
                jar.insert(name.trim().to_owned(), value.to_owned());
            }
        }
    }
}

/// `Sec-Fetch-Site` of a navigation's request to the last URL of
/// `chain`, as the Fetch Metadata specification computes it: `none` for a
/// typed one, else the farthest any URL of the chain so far is from the
/// `initiator` (the page of the link or form). Same site is taken as same
/// scheme and host, which is what it is for the tests' hosts (an IP
/// address or `localhost` is a site of its own); no public suffix list.
fn fetch_site(initiator: Option<&url::Origin>, chain: &[url::Url]) -> &'static str {
    let Some(initiator) = initiator else {
        return "none";
    };
    let mut site = "same-origin";
    for url in chain {
        if url.origin() == *initiator {
            continue;
        }
        let same_site = match initiator {
            url::Origin::Tuple(scheme, host, _) => {
                url.scheme() == scheme && url.host_str() == Some(host.to_string().as_str())
            }
            url::Origin::Opaque(_) => false,
        };
        if !same_site {
            return "cross-site";
        }
        site = "same-site";
    }
    site
}

/// The `href` of the first `<a>` in `html` whose text contains `text`.
fn link(html: &str, text: &str) -> Option<String> {
    let mut rest = html;
    while let Some(at) = rest.find("<a ") {
        let tag = &rest[at..];
        let close = tag.find('>')?;
        let end = tag.find("</a>").unwrap_or(tag.len());
        if end > close && tag[close + 1..end].contains(text) {
            return attribute(&tag[..close], "href");
        }
        rest = &tag[close..];
    }
    None
}

/// The action and hidden inputs of the first `<form>` in `html`.
fn first_form(html: &str) -> Option<(String, Vec<(String, String)>)> {
    let start = html.find("<form")?;
    let end = html[start..].find("</form>").map_or(html.len(), |e| start + e);
    let form = &html[start..end];
    let tag_end = form.find('>')?;
    let action = attribute(&form[..tag_end], "action")?;
    let mut fields = Vec::new();
    let mut rest = &form[tag_end..];
    while let Some(at) = rest.find("<input") {
        let tag = &rest[at..];
        let close = tag.find('>').unwrap_or(tag.len());
        let input = &tag[..close];
        if attribute(input, "type").as_deref() == Some("hidden")
            && let (Some(name), Some(value)) = (attribute(input, "name"), attribute(input, "value"))
        {
            fields.push((name, value));
        }
        rest = &tag[close..];
    }
    Some((action, fields))
}

/// `name="value"` in a tag, with the HTML escapes the provider writes undone.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let needle = format!(" {name}=\"");
    let start = tag.find(&needle)? + needle.len();
    let end = tag[start..].find('"')? + start;
    Some(
        tag[start..end]
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}

/// The talos-sso server configuration for the provider: one cluster
/// `prod` where on-call operates, the auditors group and the collector read
/// the trail, and `token` (`id_token` or `access_token`) is what the CLI
/// sends.
pub fn config_yaml(op: &RealOp, work: &Workdir, token: &str) -> String {
    server_yaml(op, work, token, None)
}

/// The console as the server is to serve it: the port the server listens
/// on (browsers reach it at [`Self::public_url`]), and the file with its
/// client's secret.
#[derive(Debug)]
pub struct ConsoleSetup {
    pub port: u16,
    pub secret_file: PathBuf,
}

impl ConsoleSetup {
    /// `console.public_url`: `http://127.0.0.1:<port>`.
    pub fn public_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The console's callback: the redirect URI the provider registers.
    pub fn redirect_uri(&self) -> String {
        format!("{}/ui/callback", self.public_url())
    }
}

/// [`config_yaml`] with the console on as `console` says, logging in as
/// the confidential client [`CONSOLE_CLIENT_ID`], whose ID tokens (for
/// that audience) the server accepts as the CLI's.
pub fn console_config_yaml(op: &RealOp, work: &Workdir, token: &str, console: &ConsoleSetup) -> String {
    server_yaml(op, work, token, Some(console))
}

/// The server's configuration, with the console as `console` says (on
/// its port), or off (on any port).
fn server_yaml(op: &RealOp, work: &Workdir, token: &str, console: Option<&ConsoleSetup>) -> String {
    let port = console.map_or(0, |c| c.port);
    let console_audience = if console.is_some() {
        format!(", {CONSOLE_CLIENT_ID}")
    } else {
        String::new()
    };
    let console_section = console.map_or_else(String::new, |c| {
        format!(
            "console: {{ enabled: true, public_url: \"{}\", client_id: {CONSOLE_CLIENT_ID}, client_secret_file: \"{}\" }}\n",
            c.public_url(),
            c.secret_file.display()
        )
    });
    format!(
        r#"
listen: "127.0.0.1:{port}"
insecure_http: true
data_dir: "{data_dir}"
database: {{ url: "sqlite://{data_dir}/audit.db" }}
identity:
  kind: oidc
  issuer: "{issuer}"
  client_id: "{CLIENT_ID}"
  audiences: ["{CLIENT_ID}", talos-sso{console_audience}]
  scopes: [openid, profile, email, groups, offline_access]
  token: {token}
  username_claim: preferred_username
clusters:
  prod:
    description: "Production"
    ca: {{ cert_file: "{ca_cert}", key_file: "{ca_key}" }}
    endpoints: ["127.0.0.1"]
    nodes: ["127.0.0.1"]
    rules:
      - {{ groups: ["{GROUP_ONCALL}"], roles: [os:operator] }}
auditors: {{ groups: ["{GROUP_AUDITORS}"], client_ids: ["{COLLECTOR_ID}"] }}
rate_limits: {{ per_identity_per_minute: 0, per_address_per_minute: 0 }}
{console_section}"#,
        data_dir = work.path().display(),
        issuer = op.issuer,
        ca_cert = work.ca_cert.display(),
        ca_key = work.ca_key.display(),
    )
}

/// A talos-sso server (SQLite audit store) trusting a real provider.
#[derive(Debug)]
pub struct RealOpEnv {
    pub op: RealOp,
    pub work: Workdir,
    pub server: TestServer,
}

impl RealOpEnv {
    /// Provider and server; the CLI is to send `token`.
    pub async fn start(token: &str) -> Self {
        Self::start_with(RealOp::start(1, false).await, token).await
    }

    /// A server for a provider already started.
    pub async fn start_with(op: RealOp, token: &str) -> Self {
        let work = Workdir::new();
        let yaml = config_yaml(&op, &work, token);
        Self::serve(op, work, &yaml).await
    }

    /// Provider and server with the console on (the CLI sends ID tokens).
    /// The server's port is chosen first: the provider registers the
    /// console's callback on it as the redirect URI.
    pub async fn start_console() -> Self {
        let work = Workdir::new();
        let console = ConsoleSetup {
            port: crate::faults::free_port().expect("a free port"),
            // The server refuses a secret file others may read.
            secret_file: write_file(work.path(), "console-secret", CONSOLE_CLIENT_SECRET, 0o600),
        };
        let op = RealOp::start_with(&Options {
            console_redirect: Some(console.redirect_uri()),
            ..Options::default()
        })
        .await;
        let yaml = console_config_yaml(&op, &work, "id_token", &console);
        Self::serve(op, work, &yaml).await
    }

    async fn serve(op: RealOp, work: Workdir, yaml: &str) -> Self {
        let config = Config::from_yaml(yaml).expect("server configuration");
        let server = TestServer::start(config).await;
        Self { op, work, server }
    }

    pub async fn finish(self) {
        self.server.stop().await;
    }
}
