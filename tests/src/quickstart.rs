//! The quick start: the whole product on one machine with no external
//! service. It starts the Entra ID emulator, makes a throwaway Talos CA,
//! starts talos-sso-server with its embedded SQLite audit store, logs in as a
//! demo user with the real `talos-sso` CLI (the emulator plays the browser
//! part), and shows the talosconfig it wrote, the roles and time left. Then
//! the security team's view: an auditor reads the trail with `talos-sso
//! audit`, and the fields that surprise a first reader are explained. Then
//! it keeps the server and emulator running and says how to log in as
//! another demo user.
//!
//! Everything the demo and the CLI it runs write stays in the demo folder:
//! each demo user gets a folder of their own there, used as HOME, XDG config
//! and cache folders and talosconfig. The person's own `~/.config`,
//! `~/.cache` and `~/.talos` are never read or written, so that a later plain
//! `talos-sso` command does not quietly act as a demo user, and one demo
//! login never replaces another's context.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use talos_sso_server::app::{StartError, SystemClock};
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::config::Config;
use talos_sso_server::server::Server;
use time::OffsetDateTime;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use crate::emulator::{
    CLI_CLIENT_ID, EmulatorConfig, EmulatorHandle, GROUP_ONCALL, GROUP_PLATFORM_ADMINS, GROUP_SECURITY,
    TENANT_ID,
};
use crate::material::write_file;

#[derive(Debug, Clone)]
pub struct QuickstartOptions {
    /// Where everything goes (recreated on each run). A relative path is
    /// taken from the current directory.
    pub dir: PathBuf,
    /// The `talos-sso` binary.
    pub client: PathBuf,
    /// Emulator and server ports (0: any free port).
    pub emulator_port: u16,
    pub server_port: u16,
    /// Stop after the demo login instead of serving until Ctrl-C.
    pub once: bool,
}

/// What the demo produced, for tests.
#[derive(Debug)]
pub struct QuickstartResult {
    /// The demo folder, absolute.
    pub dir: PathBuf,
    /// bob's talosconfig.
    pub talosconfig: PathBuf,
    pub server_url: String,
    pub emulator_url: String,
    /// The record of bob's certificate.
    pub audit_record: serde_json::Value,
}

/// The ports the quick start listens on unless told otherwise. Fixed, so
/// that the commands it prints keep working across runs.
pub const DEFAULT_EMULATOR_PORT: u16 = 8400;
pub const DEFAULT_SERVER_PORT: u16 = 8443;
/// The demo folder unless `--dir` says otherwise (from the current directory).
pub const DEFAULT_DIR: &str = "target/quickstart";

/// `quickstart --help`.
pub const USAGE: &str = "\
quickstart: all of talos-sso on this machine, with no external service: an
Entra ID emulator, a throwaway Talos CA, talos-sso-server with SQLite, a real
`talos-sso login` as a demo user and the auditor's view of the audit trail.

Usage: cargo run -p talos-sso-tests --bin quickstart [-- OPTIONS]

Options:
      --once                  stop after the demo instead of serving until Ctrl-C
      --dir PATH              the demo folder, deleted and recreated on each run; every
                              file the demo writes is in it (default: target/quickstart,
                              from the current directory)
      --emulator-port PORT    the Entra ID emulator's port (default: 8400; 0: any free port)
      --server-port PORT      talos-sso-server's port (default: 8443; 0: any free port)
  -h, --help                  print this help
";

/// The `quickstart` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuickstartArgs {
    pub dir: PathBuf,
    pub emulator_port: u16,
    pub server_port: u16,
    pub once: bool,
}

impl Default for QuickstartArgs {
    fn default() -> Self {
        Self {
            dir: PathBuf::from(DEFAULT_DIR),
            emulator_port: DEFAULT_EMULATOR_PORT,
            server_port: DEFAULT_SERVER_PORT,
            once: false,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    Help,
    Run(QuickstartArgs),
}

fn port(option: &str, value: Option<OsString>) -> Result<u16, String> {
    let range = "0 to 65535; 0: any free port";
    let value = value.ok_or_else(|| format!("{option} needs a port number ({range})"))?;
    let text = value.to_string_lossy();
    text.parse::<u16>()
        .map_err(|_| format!("{option}: `{text}` is not a port number ({range})"))
}

/// Parse the arguments after the program name. Both `--option value` and
/// `--option=value` work; the error names the option that is wrong.
pub fn parse_args(arguments: impl IntoIterator<Item = OsString>) -> Result<Parsed, String> {
    let mut parsed = QuickstartArgs::default();
    let mut arguments = arguments.into_iter();
    while let Some(argument) = arguments.next() {
        // Options are ASCII; only a value (a --dir path) may be any bytes.
        let (option, inline) = match argument.to_str() {
            Some(text) => match text.split_once('=') {
                Some((option, value)) if option.starts_with("--") => {
                    (option.to_owned(), Some(OsString::from(value)))
                }
                _ => (text.to_owned(), None),
            },
            None => {
                return Err(format!(
                    "unknown argument `{}`; see --help",
                    argument.to_string_lossy()
                ));
            }
        };
        let no_value = || match inline {
            Some(_) => Err(format!("{option} takes no value")),
            None => Ok(()),
        };
        match option.as_str() {
            "-h" | "--help" => {
                no_value()?;
                return Ok(Parsed::Help);
            }
            "--once" => {
                no_value()?;
                parsed.once = true;
            }
            "--dir" => {
                let value = inline.or_else(|| arguments.next());
                match value {
                    Some(dir) if !dir.is_empty() => parsed.dir = PathBuf::from(dir),
                    _ => return Err("--dir needs a path".into()),
                }
            }
            "--emulator-port" => parsed.emulator_port = port(&option, inline.or_else(|| arguments.next()))?,
            "--server-port" => parsed.server_port = port(&option, inline.or_else(|| arguments.next()))?,
            other => return Err(format!("unknown argument `{other}`; see --help")),
        }
    }
    if parsed.emulator_port != 0 && parsed.emulator_port == parsed.server_port {
        return Err(format!(
            "--emulator-port and --server-port are both {}; they need different ports",
            parsed.server_port
        ));
    }
    Ok(Parsed::Run(parsed))
}

fn say(line: &str) {
    println!("{line}");
}

fn config_text(emulator: &EmulatorHandle, dir: &Path, ca_cert: &Path, ca_key: &Path, listen: &str) -> String {
    format!(
        r#"# talos-sso-server configuration written by the quick start.
listen: "{listen}"
# Plain HTTP on loopback for the demo only; production uses `tls`.
insecure_http: true
data_dir: "{data}"
identity:
  kind: entra
  issuer: "{issuer}"
  client_id: "{CLI_CLIENT_ID}"
  allowed_tenants: ["{TENANT_ID}"]
clusters:
  demo:
    description: "A throwaway cluster for the quick start"
    ca: {{ cert_file: "{cert}", key_file: "{key}" }}
    endpoints: ["127.0.0.1"]
    ttl: 5m
    max_ttl: 15m
    rules:
      - {{ groups: ["{GROUP_PLATFORM_ADMINS}"], roles: [os:admin] }}
      - {{ groups: ["{GROUP_ONCALL}"], roles: [os:operator] }}
      - {{ app_roles: ["Talos.Reader"], roles: [os:reader] }}
    default_roles: [os:operator, os:reader]
policy_examples:
  - {{ description: "on-call engineers operate", cluster: demo, groups: ["{GROUP_ONCALL}"], expect_roles: [os:operator] }}
  - {{ description: "admins must ask for os:admin", cluster: demo, groups: ["{GROUP_PLATFORM_ADMINS}"], expect_denied: role_required }}
auditors: {{ groups: ["{GROUP_SECURITY}"] }}
admins: {{ groups: ["{GROUP_PLATFORM_ADMINS}"] }}
# The chain head, signed with the audit key and kept outside the database.
audit:
  checkpoints: {{ key_file: "{data}/audit-signing.key", file: "{data}/checkpoints.jsonl", interval: 1m }}
"#,
        data = dir.display(),
        issuer = emulator.issuer(),
        cert = ca_cert.display(),
        key = ca_key.display(),
    )
}

/// Whether cargo sets `name` for the crate it runs (`cargo run`, `cargo
/// test`): the package's own facts, which a nested cargo must not inherit.
/// Build scripts such as ring's declare `rerun-if-env-changed` on some of
/// them (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, ...) and cargo compares the
/// values in its own environment, so an inherited value reruns them and
/// rebuilds everything above (ring, rustls, reqwest, sqlx, openidconnect)
/// twice: once here, once more at the next ordinary cargo command. What
/// configures cargo itself (`CARGO`, `CARGO_HOME`, `CARGO_TARGET_DIR`,
/// `CARGO_BUILD_*`, `RUSTFLAGS`, `RUSTUP_*`, ...) stays.
pub fn is_crate_variable(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    matches!(
        name,
        "CARGO_MANIFEST_DIR"
            | "CARGO_MANIFEST_PATH"
            | "CARGO_MANIFEST_LINKS"
            | "CARGO_CRATE_NAME"
            | "CARGO_BIN_NAME"
            | "CARGO_PRIMARY_PACKAGE"
            | "CARGO_TARGET_TMPDIR"
            | "CARGO_RUSTC_CURRENT_DIR"
            | "OUT_DIR"
    ) || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_EXE_")
}

/// The `talos-sso` binary next to the running executable, built first (the
/// quick start and the client benchmark drive the real CLI).
pub fn client_binary() -> Result<PathBuf, String> {
    workspace_binary("talos-sso", "talos-sso", "the talos-sso CLI")
}

/// The binary `bin` of the workspace package `package`, next to the running
/// executable, built first with the same profile. It says that it builds
/// `what`, then cargo's own progress shows, so that the first build
/// (minutes) is not a silent wait.
pub fn workspace_binary(package: &str, bin: &str, what: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut dir = exe.parent().ok_or("no directory for the current executable")?;
    // A test binary lives in `target/<profile>/deps`; binaries one up.
    if dir.ends_with("deps") {
        dir = dir.parent().ok_or("no profile directory above deps")?;
    }
    let binary = dir.join(bin);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    build.args(["build", "-p", package, "--bin", bin]);
    if dir.ends_with("release") {
        build.arg("--release");
    }
    for (name, _) in std::env::vars_os() {
        if is_crate_variable(&name) {
            build.env_remove(name);
        }
    }
    eprintln!("Building {what} with cargo (minutes the first time, a second afterwards)…");
    let status = build
        .stdin(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() || !binary.exists() {
        return Err(format!("could not build {}", binary.display()));
    }
    Ok(binary)
}

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
        ]
    }

    /// The same as a shell prefix, for the commands the demo prints.
    pub fn shell_env(&self) -> String {
        let assignments: Vec<String> = self
            .env(&self.talosconfig())
            .iter()
            .map(|(name, path)| format!("{name}={}", shell_word(&path.display().to_string())))
            .collect();
        format!("env {}", assignments.join(" "))
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
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:,@%=".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

fn make_private_dir(path: &Path) -> Result<(), String> {
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

/// What the quick start leaves in its folder so that the next run knows the
/// folder is its own to delete.
const MARKER: &str = ".talos-sso-quickstart";

/// Empty the demo folder for a new run. The folder is deleted and
/// recreated, so only one the quick start made (its marker file, or the
/// files earlier versions wrote) or an empty one is deleted: a mistyped
/// `--dir` must not cost anyone their files.
fn prepare_dir(dir: &Path) -> Result<(), String> {
    let shown = dir.display();
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            let ours = dir.join(MARKER).is_file()
                || (dir.join("server.yaml").is_file() && dir.join("talos-ca.key").is_file());
            if !ours && entries.next().is_some() {
                return Err(format!(
                    "{shown} holds files the quick start did not write, and it deletes its folder on \
                     each run; choose a new or empty folder with --dir"
                ));
            }
            std::fs::remove_dir_all(dir).map_err(|e| format!("{shown}: {e}"))?;
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(format!("{shown}: {error}")),
    }
    make_private_dir(dir)?;
    std::fs::write(
        dir.join(MARKER),
        "Written by the talos-sso quick start, which deletes this folder on its next run.\n",
    )
    .map_err(|e| format!("{shown}: {e}"))
}

/// `later - earlier` as `5m00s` (or `-5m00s`).
fn interval(earlier: OffsetDateTime, later: OffsetDateTime) -> String {
    let seconds = (later - earlier).whole_seconds();
    let sign = if seconds < 0 { "-" } else { "" };
    let seconds = seconds.abs();
    format!("{sign}{}m{:02}s", seconds / 60, seconds % 60)
}

/// The fields of an issuance record that surprise a first reader, with
/// the reason for each (docs/audit.md has them all).
pub fn record_notes(record: &serde_json::Value) -> Vec<String> {
    let time = |field: &str| {
        record[field]
            .as_str()
            .and_then(talos_sso_server::audit::parse_micros)
    };
    let mut notes = Vec::new();
    // A certificate's times are whole seconds: compare them with the
    // second the decision was made in.
    let at = time("occurred_at").map(|at| at.replace_nanosecond(0).unwrap_or(at));
    if let (Some(at), Some(not_before), Some(not_after)) = (at, time("not_before"), time("not_after")) {
        notes.push(format!(
            "not_before is {} before occurred_at: the cluster's `clock_skew` (5m by default), so that a \
             Talos node whose clock is a little behind accepts the certificate at once. not_after is \
             occurred_at + the cluster's `ttl` ({}).",
            interval(not_before, at),
            interval(at, not_after)
        ));
    }
    if let (Some(at), Some(issued)) = (at, time("token_issued_at")) {
        notes.push(format!(
            "token_issued_at is {} before occurred_at although the login was just now: the identity \
             provider backdates a token's `iat` and `nbf` (Entra ID does, by five minutes, and so does \
             its emulator here).",
            interval(issued, at)
        ));
    }
    if let Some(groups) = record["groups_evaluated"].as_array() {
        let groups: Vec<&str> = groups.iter().filter_map(|g| g.as_str()).collect();
        notes.push(format!(
            "groups_evaluated is [{}]: only the person's groups that some rule, `auditors` or `admins` \
             names; their other groups are not kept.",
            groups.join(", ")
        ));
    }
    if record["identity_verified"] == true {
        notes.push(
            "identity_verified is true: subject, username and groups come from a token the server \
             verified (a refused token's claims are kept, marked false)."
                .into(),
        );
    }
    notes.push(
        "prev_hash and hash chain each record to the one before it: `audit verify` checks them.".into(),
    );
    notes
}

/// The repository's copy of a document, for the demo to point at.
fn repository_file(relative: &str) -> PathBuf {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR"));
    tests.parent().unwrap_or(tests).join(relative)
}

/// The demo users the closing lines offer, with what they get.
const OTHER_USERS: [(&str, &str, &str); 4] = [
    ("carol", "app role Talos.Reader", "os:reader"),
    ("alice", "platform admins, asks for os:admin", "os:admin"),
    ("dave", "no group, no app role", "refused: no_matching_rule"),
    (
        "erin",
        "250 groups (overage)",
        "refused here: no Graph configured",
    ),
];

/// The closing lines: how to go on while the server and emulator run.
/// Every user keeps to their own folder, and every path is absolute, so the
/// commands work from any directory and touch none of the person's files.
pub fn follow_up(
    dir: &Path,
    client: &Path,
    server_url: &str,
    emulator_url: &str,
    config_path: &Path,
) -> Result<Vec<String>, String> {
    let client = shell_word(&client.display().to_string());
    let mut lines = vec![
        String::new(),
        "The server and the emulator keep running (Ctrl-C stops them).".to_owned(),
        format!(
            "Each demo user has their own folder in {} (HOME, XDG config and cache, talosconfig), so no \
             login replaces another's and your own ~/.config, ~/.cache and ~/.talos stay as they are.",
            dir.display()
        ),
        format!(
            "Log in as another demo user: run their command, open {emulator_url}/devicelogin, enter the \
             code it shows and pick the same user:"
        ),
    ];
    for (name, why, result) in OTHER_USERS {
        let user = DemoUser::new(dir, name)?;
        let role = if name == "alice" { " --role os:admin" } else { "" };
        lines.push(format!("  {name}@example.com ({why}) -> {result}"));
        lines.push(format!(
            "    {} {client} login --server {server_url} --device{role}",
            user.shell_env()
        ));
    }
    lines.push("  (without --device, the login URL opens a page where you pick the user)".into());
    let sam = DemoUser::new(dir, "sam")?;
    lines
        .push("Read the audit trail as sam (already logged in): audit list, show SEQ, export, verify".into());
    lines.push(format!("    {} {client} audit list", sam.shell_env()));
    lines.push("Verify the chain on the server side:".into());
    lines.push(format!(
        "    cargo run --manifest-path {} -p talos-sso-server -- audit verify --config {}",
        shell_word(&repository_file("Cargo.toml").display().to_string()),
        shell_word(&config_path.display().to_string())
    ));
    Ok(lines)
}

pub async fn run(options: QuickstartOptions) -> Result<QuickstartResult, String> {
    let dir = std::path::absolute(&options.dir).map_err(|e| format!("{}: {e}", options.dir.display()))?;
    // A quick start already running holds these ports: find out before its
    // folder is emptied, not after.
    for (what, port) in [
        ("emulator", options.emulator_port),
        ("server", options.server_port),
    ] {
        if port != 0 {
            std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
                format!(
                    "the {what} port {port} is taken ({e}): is another quick start running? \
                     Stop it, or pick other ports with --emulator-port and --server-port (0: any free port)"
                )
            })?;
        }
    }
    prepare_dir(&dir)?;
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let options = QuickstartOptions {
        dir: dir.clone(),
        ..options
    };

    say("1. Entra ID emulator");
    let emulator = EmulatorHandle::start_on(
        ([127, 0, 0, 1], options.emulator_port).into(),
        EmulatorConfig::default(),
    )
    .await
    .map_err(|e| {
        format!(
            "cannot start the emulator on port {}: {e}; choose another with --emulator-port (0: any free port)",
            options.emulator_port
        )
    })?;
    say(&format!(
        "   {} (tenant {TENANT_ID}, issuer {})",
        emulator.base_url,
        emulator.issuer()
    ));

    say("2. A throwaway Talos CA (Ed25519, O=talos, like `talosctl gen secrets`)");
    let ca = generate::new_root(
        NewKeyType::Ed25519,
        "talos",
        Duration::from_secs(3650 * 86400),
        OffsetDateTime::now_utc(),
    )
    .map_err(|e| e.to_string())?;
    let ca_cert = write_file(&dir, "talos-ca.crt", &ca.cert_pem, 0o644);
    let ca_key = write_file(&dir, "talos-ca.key", &ca.key_pem, 0o600);
    say(&format!("   {}", ca_cert.display()));
    let (_, audit_key, audit_public) = talos_sso_server::audit::checkpoint::AuditKey::generate()?;
    write_file(&dir, "audit-signing.key", &audit_key, 0o600);
    let audit_public = write_file(&dir, "audit-signing.pub", &audit_public, 0o644);
    say(&format!(
        "   {} (signs the audit checkpoints)",
        audit_public.display()
    ));

    say("3. talos-sso-server with the embedded SQLite audit store");
    let config_path = dir.join("server.yaml");
    let write_config = |listen: &str| {
        std::fs::write(
            &config_path,
            config_text(&emulator, &dir, &ca_cert, &ca_key, listen),
        )
        .map_err(|e| e.to_string())
    };
    write_config(&format!("127.0.0.1:{}", options.server_port))?;
    let config = Config::load_with_env(&config_path, []).map_err(|e| e.to_string())?;
    let server = Server::bind(config, Arc::new(SystemClock))
        .await
        .map_err(|e| match e {
            StartError::Listen { error, .. } => format!(
                "cannot listen on port {}: {error}; choose another with --server-port (0: any free port)",
                options.server_port
            ),
            other => other.to_string(),
        })?;
    let address = server.local_addr();
    if address.port() != options.server_port {
        // Port 0: the file names the port the system chose.
        write_config(&address.to_string())?;
    }
    let server_url = server.url();
    let trail = server.app().audit.store().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    say(&format!(
        "   {server_url} (config {}, audit {})",
        config_path.display(),
        dir.join("audit.db").display()
    ));

    let bob = DemoUser::new(&dir, "bob")?;
    say("4. `talos-sso login` as bob@example.com (on-call group: os:operator)");
    say(&format!(
        "   as a person on their own machine: HOME, XDG config and cache, talosconfig in {}",
        bob.root.display()
    ));
    let talosconfig = bob.talosconfig();
    emulator.set_auto_login(Some("bob@example.com"));
    let login_output = demo_login(&options, &server_url, &talosconfig, &bob.name).await;
    emulator.set_auto_login(None);
    say(&format!("   {}", login_output?.trim()));

    say("5. What the talosconfig holds (as Talos reads it)");
    let stored = talos_sso::talosconfig::read_context(&talosconfig, "demo")
        .map_err(|e| e.to_string())?
        .ok_or("no `demo` context in the talosconfig")?;
    let leaf = talos_sso::certinfo::leaf_info(&stored.crt_pem).ok_or("no certificate in the talosconfig")?;
    let left = (leaf.not_after - OffsetDateTime::now_utc()).whole_seconds();
    say(&format!(
        "   {}: context `demo`, roles {:?}, user {}, {}m{:02}s left",
        talosconfig.display(),
        leaf.roles,
        leaf.common_name.unwrap_or_default(),
        left / 60,
        left % 60
    ));

    // bob's decision is the newest record until the auditor's queries.
    let records = trail.page(0, 100).await.map_err(|e| e.to_string())?;
    let last = records.last().ok_or("no audit record")?;
    let audit_record = serde_json::to_value(last).map_err(|e| e.to_string())?;
    let seq = last.seq.to_string();

    say("6. The security team reads the audit trail: sam@example.com, in the group that `auditors` names");
    let sam = DemoUser::new(&dir, "sam")?;
    say(&format!(
        "   sam's HOME, XDG folders and talosconfig: {}",
        sam.root.display()
    ));
    emulator.set_auto_login(Some("sam@example.com"));
    let auditor = async {
        let mut outputs = Vec::new();
        for args in [
            vec!["audit", "list", "--server", server_url.as_str(), "--no-browser"],
            vec!["audit", "show", seq.as_str(), "--no-browser"],
            vec!["audit", "verify", "--no-browser"],
        ] {
            let output = run_cli(&options.client, &sam, &sam.talosconfig(), &args).await?;
            outputs.push((args.join(" "), output));
        }
        Ok::<_, String>(outputs)
    }
    .await;
    emulator.set_auto_login(None);
    for (command, output) in auditor? {
        say(&format!("   $ talos-sso {command}"));
        if !output.followed.is_empty() {
            say("   (sam logs in first: the CLI opens the login page, where the emulator signs sam in)");
        }
        for line in output.stdout.lines() {
            say(&format!("   {line}"));
        }
    }
    say("   (each of sam's reads is recorded too, as an `audit.query` record: verify counts them,");
    say("   the list above was taken before them)");
    say(&format!(
        "   Reading record {seq} (every field: {}):",
        repository_file("docs/audit.md").display()
    ));
    for note in record_notes(&audit_record) {
        say(&format!("   - {note}"));
    }

    let result = QuickstartResult {
        dir: dir.clone(),
        talosconfig: talosconfig.clone(),
        server_url: server_url.clone(),
        emulator_url: emulator.base_url.clone(),
        audit_record,
    };
    if options.once {
        let _ = stop.send(());
        let _ = server.await;
        return Ok(result);
    }

    for line in follow_up(
        &dir,
        &options.client,
        &server_url,
        &emulator.base_url,
        &config_path,
    )? {
        say(&line);
    }
    let _ = tokio::signal::ctrl_c().await;
    let _ = stop.send(());
    let _ = server.await;
    Ok(result)
}
