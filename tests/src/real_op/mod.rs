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

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use talos_sso_server::config::Config;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::harness::{TestServer, Workdir};
use crate::material::write_file;

mod browser;
mod html;
mod server_config;

pub use browser::{Browser, Page};
pub use server_config::{ConsoleSetup, config_yaml, console_config_yaml};

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
        Browser::new(url::Url::parse(&self.issuer).expect("issuer URL"), user)
    }
}

impl Drop for RealOp {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
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

    /// Provider and server, with the server's configuration text passed
    /// through `edit` (a shorter certificate lifetime, say).
    pub async fn start_edited(token: &str, edit: impl FnOnce(String) -> String) -> Self {
        let op = RealOp::start(1, false).await;
        let work = Workdir::new();
        let yaml = edit(config_yaml(&op, &work, token));
        Self::serve(op, work, &yaml).await
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
