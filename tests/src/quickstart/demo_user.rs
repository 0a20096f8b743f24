//! A demo user's own folder, and the real `talos-sso` CLI run as them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use super::{QuickstartOptions, say};

/// One demo user's corner of the demo folder: the CLI runs with HOME, its
/// XDG config and cache folders and TALOSCONFIG all in here, absolute (the
/// `dirs` crate ignores a relative `XDG_CONFIG_HOME` and falls back to
/// `~/.config`).
#[derive(Debug, Clone)]
pub struct DemoUser {
    pub name: String,
    /// `<demo folder>/<name>`, absolute.
    pub root: PathBuf,
}

impl DemoUser {
    pub fn new(dir: &Path, name: &str) -> Result<Self, String> {
        let dir = std::path::absolute(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Self {
            name: name.to_owned(),
            root: dir.join(name),
        })
    }

    pub fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    pub fn talosconfig(&self) -> PathBuf {
        self.root.join("talosconfig")
    }

    /// What the CLI is run with, `talosconfig` included (usually
    /// [`Self::talosconfig`]).
    pub fn env(&self, talosconfig: &Path) -> Vec<(&'static str, PathBuf)> {
        vec![
            ("HOME", self.home()),
            ("XDG_CONFIG_HOME", self.root.join("config")),
            ("XDG_CACHE_HOME", self.root.join("cache")),
            ("TALOSCONFIG", talosconfig.to_owned()),
            // Demo logins stay in the demo folder, out of the keyring of
            // whoever runs the demo.
            ("TALOS_SSO_TOKEN_STORE", PathBuf::from("file")),
        ]
    }

    /// `<demo folder>/<name>.env`: what a shell `source`s to be this user.
    pub fn env_file(&self) -> PathBuf {
        self.root.with_file_name(format!("{}.env", self.name))
    }

    /// The environment file's text: [`Self::env`] exported, and `bin_dir`
    /// (the built CLI's folder) first on PATH.
    pub fn env_file_text(&self, bin_dir: &Path) -> String {
        let mut text = format!(
            "# The quick start's demo user {}: `source` this file in a new shell (`exit` leaves it).\n\
             # The CLI then keeps to {} (HOME, configuration, tokens, talosconfig).\n",
            self.name,
            self.root.display()
        );
        for (name, path) in self.env(&self.talosconfig()) {
            text.push_str(&format!(
                "export {name}={}\n",
                shell_word(&path.display().to_string())
            ));
        }
        text.push_str(&format!(
            "export PATH={}:\"$PATH\"\n",
            shell_word(&bin_dir.display().to_string())
        ));
        text
    }

    /// Write [`Self::env_file`] (no secret in it: paths only), and make
    /// the user's private folder it points to.
    pub fn write_env_file(&self, bin_dir: &Path) -> Result<PathBuf, String> {
        make_private_dir(&self.home())?;
        let path = self.env_file();
        std::fs::write(&path, self.env_file_text(bin_dir)).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    fn command(&self, client: &Path, talosconfig: &Path) -> Result<tokio::process::Command, String> {
        let talosconfig =
            std::path::absolute(talosconfig).map_err(|e| format!("{}: {e}", talosconfig.display()))?;
        make_private_dir(&self.home())?;
        let mut command = tokio::process::Command::new(client);
        command.envs(self.env(&talosconfig));
        // Nothing else may point the CLI back at the person's own files.
        for name in ["XDG_DATA_HOME", "XDG_STATE_HOME"] {
            command.env_remove(name);
        }
        Ok(command)
    }
}

/// A word the shell reads back unchanged.
pub(super) fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:,@%=".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

pub(super) fn make_private_dir(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// What a CLI run printed.
#[derive(Debug)]
pub struct CliOutput {
    pub stdout: String,
    pub stderr: String,
    /// The login URLs it printed, which were followed like a browser would.
    pub followed: Vec<String>,
}

/// Run the real CLI as `user` with `args`, and play their browser: every
/// login URL it prints is opened (the emulator signs in whoever
/// [`EmulatorHandle::set_auto_login`] names). Without `--no-browser` in
/// `args` the CLI would also try to open a real browser.
pub async fn run_cli(
    client: &Path,
    user: &DemoUser,
    talosconfig: &Path,
    args: &[&str],
) -> Result<CliOutput, String> {
    let mut child = user
        .command(client, talosconfig)?
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", client.display()))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let collect_stdout = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text).await;
        text
    });
    let follow = async {
        let mut lines = BufReader::new(stderr).lines();
        let (mut text, mut followed) = (String::new(), Vec::new());
        while let Ok(Some(line)) = lines.next_line().await {
            let trimmed = line.trim();
            if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
                reqwest::get(trimmed)
                    .await
                    .map_err(|e| format!("following the login URL: {e}"))?;
                followed.push(trimmed.to_owned());
            } else {
                text.push_str(&line);
                text.push('\n');
            }
        }
        Ok::<_, String>((text, followed))
    };
    let command = format!("talos-sso {}", args.join(" "));
    let (stderr, followed) = tokio::time::timeout(Duration::from_secs(60), follow)
        .await
        .map_err(|_| format!("`{command}` did not finish within a minute"))??;
    let status = child.wait().await.map_err(|e| e.to_string())?;
    let stdout = collect_stdout.await.map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("`{command}` failed: {}", stderr.trim()));
    }
    Ok(CliOutput {
        stdout,
        stderr,
        followed,
    })
}

/// Run a login with the real CLI as the demo user `user` (a folder name in
/// the demo folder), writing `talosconfig`: read the login URL it prints and
/// follow it like a browser would (the emulator signs its auto-login user in).
pub async fn demo_login(
    options: &QuickstartOptions,
    server_url: &str,
    talosconfig: &Path,
    user: &str,
) -> Result<String, String> {
    let user = DemoUser::new(&options.dir, user)?;
    let talosconfig_arg = talosconfig.display().to_string();
    let output = run_cli(
        &options.client,
        &user,
        talosconfig,
        &[
            "login",
            "--server",
            server_url,
            "--no-browser",
            "--talosconfig",
            &talosconfig_arg,
        ],
    )
    .await?;
    for url in &output.followed {
        say(&format!(
            "  the CLI asked the browser to open {}…",
            &url[..url.find('?').unwrap_or(url.len())]
        ));
    }
    Ok(output.stdout)
}
