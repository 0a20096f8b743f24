//! `talos-sso-server serve` as a child process that can be killed, and
//! the operator's `audit verify` against its configuration.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, run};
use crate::emulator::EmulatorHandle;
use crate::harness::{Workdir, config_yaml};

/// The `talos-sso-server` binary, built first when missing or stale (once
/// per process: the scenarios of one test run share it).
pub fn server_binary() -> Result<PathBuf, String> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            crate::quickstart::workspace_binary("talos-sso-server", "talos-sso-server", "talos-sso-server")
        })
        .clone()
}

/// The test configuration (see [`config_yaml`]) on a fixed port, written
/// to `name` in the work directory; returns the file and the server's URL.
pub fn write_server_config(
    emulator: &EmulatorHandle,
    work: &Workdir,
    database_url: &str,
    name: &str,
    edit: impl FnOnce(String) -> String,
) -> Result<(PathBuf, String), String> {
    let port = free_port()?;
    let text = config_yaml(emulator, work, database_url).replace(
        "listen: \"127.0.0.1:0\"",
        &format!("listen: \"127.0.0.1:{port}\""),
    );
    let path = work.path().join(name);
    std::fs::write(&path, edit(text)).map_err(|e| e.to_string())?;
    Ok((path, format!("http://127.0.0.1:{port}")))
}

/// `talos-sso-server serve --config FILE` as a child process; its output
/// goes to `FILE.log`. Killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    child: Option<Child>,
    pub base_url: String,
    pub config: PathBuf,
    pub log: PathBuf,
}

impl ServerProcess {
    /// Spawn and wait until `/healthz` answers (at most `ready_within`).
    pub async fn spawn(
        binary: &Path,
        config: &Path,
        base_url: &str,
        ready_within: Duration,
    ) -> Result<Self, String> {
        let log = config.with_extension("log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        let mut server = Self {
            child: Some(child),
            base_url: base_url.to_owned(),
            config: config.to_owned(),
            log,
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + ready_within;
        loop {
            if let Ok(response) = http.get(format!("{base_url}/healthz")).send().await
                && response.status().is_success()
            {
                return Ok(server);
            }
            if let Some(child) = server.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "the server exited ({status}) before answering: {}",
                    server.log_text()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the server did not answer /healthz within {ready_within:?}: {}",
                    server.log_text()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: no shutdown path runs, in-flight requests are cut.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is alive (not exited, not killed).
    pub fn still_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGHUP, as `kill -HUP` sends it: the server reads its configuration
    /// again.
    pub fn hang_up(&self) -> Result<(), String> {
        let pid = self.child.as_ref().ok_or("the server is not running")?.id();
        run(Command::new("kill").args(["-HUP", &pid.to_string()])).map(|_| ())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `talos-sso-server audit verify --config FILE`, the command an operator
/// runs: its output, or why it failed.
pub fn audit_verify(binary: &Path, config: &Path) -> Result<String, String> {
    run(Command::new(binary)
        .args(["audit", "verify", "--config"])
        .arg(config))
}
