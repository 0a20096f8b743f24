//! A real, OpenID-certified OpenID Provider for the end-to-end tests:
//! panva's `oidc-provider` from npm, run with Node.js from
//! `tests/oidc-provider/` (`provider.mjs` says how it is set up: a `groups`
//! scope, opaque access tokens, ID tokens without `jti`, PKCE, a public
//! native client with a loopback redirect, refresh tokens, the device flow;
//! a confidential collector client with the client credentials grant and
//! RFC 9068 JWT access tokens).
//!
//! This module owns starting it (a free port, a bounded wait for it to
//! serve, killed when dropped), a talos-sso server configured for it, and
//! the "browser" that clicks through its pages: it keeps the provider's
//! cookies, follows redirects, submits its forms, and names the person to
//! sign in with the `x-test-login` header the provider's test interaction
//! reads. A machine without Node.js or without the npm packages fails the
//! test with what to run; it never skips it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use talos_sso_server::config::Config;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::harness::{TestServer, Workdir};

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

impl RealOp {
    /// Start the provider; `device_interval` is the polling interval it
    /// announces for the device flow, in seconds; `strict_offline_access`
    /// keeps oidc-provider's own rule for refresh tokens (`offline_access`
    /// granted, which needs `prompt=consent`) instead of Keycloak's (always).
    pub async fn start(device_interval: u32, strict_offline_access: bool) -> Self {
        check_installed();
        let log = tempfile::NamedTempFile::new().expect("log file");
        let mut command = Command::new("node");
        command
            .arg("provider.mjs")
            .arg("--device-interval")
            .arg(device_interval.to_string());
        if strict_offline_access {
            command.arg("--strict-offline-access");
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
}

/// A person's browser, as far as the provider's pages need one: cookies
/// (for the provider's origin only), redirects, forms.
#[derive(Debug)]
pub struct Browser {
    http: reqwest::Client,
    provider: url::Url,
    user: String,
    cookies: Mutex<BTreeMap<String, String>>,
}

impl Browser {
    /// Open `url` and follow redirects (at most 20) to the page they end on.
    pub async fn visit(&self, url: &str) -> Page {
        self.go(url::Url::parse(url).expect("URL"), None).await
    }

    /// Approve the device login `user_code` from `verification_uri`: the
    /// code entered, the confirmation accepted, the sign-in done. Returns
    /// the last page.
    pub async fn approve_device(&self, verification_uri: &str, user_code: &str) -> Page {
        let mut url = url::Url::parse(verification_uri).expect("verification URI");
        url.query_pairs_mut().append_pair("user_code", user_code);
        // The provider posts the code to itself (a form a script submits),
        // then asks to confirm it.
        let posted = self.submit_form(&self.go(url, None).await).await;
        self.submit_form(&posted).await
    }

    /// Submit the first form on `page` with its hidden inputs.
    pub async fn submit_form(&self, page: &Page) -> Page {
        let (action, fields) = first_form(&page.body)
            .unwrap_or_else(|| panic!("no form on {} ({}): {}", page.url, page.status, page.body));
        let base = url::Url::parse(&page.url).expect("page URL");
        let target = base.join(&action).expect("form action");
        self.go(target, Some(fields)).await
    }

    async fn go(&self, mut url: url::Url, mut form: Option<Vec<(String, String)>>) -> Page {
        for _ in 0..20 {
            let ours = url.origin() == self.provider.origin();
            let mut request = match &form {
                Some(fields) => self.http.post(url.clone()).form(fields),
                None => self.http.get(url.clone()),
            };
            if ours {
                request = request.header("x-test-login", &self.user);
                let cookies = self.cookie_header();
                if !cookies.is_empty() {
                    request = request.header(reqwest::header::COOKIE, cookies);
                }
            }
            let response = request
                .send()
                .await
                .unwrap_or_else(|e| panic!("GET/POST {url}: {e}"));
            if ours {
                self.keep_cookies(&response);
            }
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_else(|| panic!("a redirect without Location from {url}"))
                    .to_owned();
                url = url.join(&location).expect("Location");
                // 303 (and, as browsers do, 301/302) turn a POST into a GET.
                form = None;
                continue;
            }
            let body = response.text().await.unwrap_or_default();
            return Page {
                url: url.to_string(),
                status: status.as_u16(),
                body,
            };
        }
        panic!("more than 20 redirects, the last to {url}");
    }

    fn cookie_header(&self) -> String {
        let jar = self.cookies.lock().expect("jar");
        jar.iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Keep each `Set-Cookie` (name and value; an emptied one is removed,
    /// as the provider clears cookies that way).
    fn keep_cookies(&self, response: &reqwest::Response) {
        let mut jar = self.cookies.lock().expect("jar");
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
    format!(
        r#"
listen: "127.0.0.1:0"
insecure_http: true
data_dir: "{data_dir}"
database: {{ url: "sqlite://{data_dir}/audit.db" }}
identity:
  kind: oidc
  issuer: "{issuer}"
  client_id: "{CLIENT_ID}"
  audiences: ["{CLIENT_ID}", talos-sso]
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
"#,
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
        let config = Config::from_yaml(&config_yaml(&op, &work, token)).expect("server configuration");
        let server = TestServer::start(config).await;
        Self { op, work, server }
    }

    pub async fn finish(self) {
        self.server.stop().await;
    }
}
