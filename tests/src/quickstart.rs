//! The quick start: the whole product on one machine with no external
//! service. It starts the Entra ID emulator, makes a throwaway Talos CA,
//! starts talos-sso-server with its embedded SQLite audit store, logs in as a
//! demo user with the real `talos-sso` CLI (the emulator plays the browser
//! part), and shows the talosconfig it wrote, the roles and time left, and
//! the audit record. Then it keeps the server and emulator running and says
//! how to log in as another demo user.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use talos_sso_server::app::{App, SystemClock};
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::config::Config;
use time::OffsetDateTime;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::emulator::{
    CLI_CLIENT_ID, EmulatorConfig, EmulatorHandle, GROUP_ONCALL, GROUP_PLATFORM_ADMINS, GROUP_SECURITY,
    TENANT_ID,
};
use crate::material::write_file;

#[derive(Debug, Clone)]
pub struct QuickstartOptions {
    /// Where everything goes (recreated on each run).
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
    pub talosconfig: PathBuf,
    pub server_url: String,
    pub emulator_url: String,
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
Entra ID emulator, a throwaway Talos CA, talos-sso-server with SQLite and a
real `talos-sso login` as a demo user.

Usage: cargo run -p talos-sso-tests --bin quickstart [-- OPTIONS]

Options:
      --once                  stop after the demo instead of serving until Ctrl-C
      --dir PATH              the demo folder, deleted and recreated on each run
                              (default: target/quickstart)
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
/// quick start and the client benchmark drive the real CLI). cargo's own
/// progress shows, so that the first build (minutes) is not a silent wait.
pub fn client_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe.parent().ok_or("no directory for the current executable")?;
    let client = dir.join("talos-sso");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    build.args(["build", "-p", "talos-sso", "--bin", "talos-sso"]);
    if dir.ends_with("release") {
        build.arg("--release");
    }
    for (name, _) in std::env::vars_os() {
        if is_crate_variable(&name) {
            build.env_remove(name);
        }
    }
    eprintln!("Building the talos-sso CLI with cargo (minutes the first time, a second afterwards)…");
    let status = build
        .stdin(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() || !client.exists() {
        return Err(format!("could not build {}", client.display()));
    }
    Ok(client)
}

/// Run a login with the real CLI: read the login URL it prints and follow it
/// like a browser would (the emulator signs its auto-login user in).
pub async fn demo_login(
    options: &QuickstartOptions,
    server_url: &str,
    talosconfig: &Path,
    user: &str,
) -> Result<String, String> {
    let mut child = tokio::process::Command::new(&options.client)
        .args(["login", "--server", server_url, "--no-browser", "--talosconfig"])
        .arg(talosconfig)
        .env("XDG_CONFIG_HOME", options.dir.join(format!("{user}/config")))
        .env("XDG_CACHE_HOME", options.dir.join(format!("{user}/cache")))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", options.client.display()))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let url = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim().starts_with("http") {
                return Some(line.trim().to_owned());
            }
        }
        None
    })
    .await
    .map_err(|_| "the CLI printed no login URL".to_owned())?
    .ok_or("the CLI printed no login URL")?;
    say(&format!(
        "  the CLI asked the browser to open {}…",
        &url[..url.find('?').unwrap_or(url.len())]
    ));
    reqwest::get(&url).await.map_err(|e| e.to_string())?;
    let output = child.wait_with_output().await.map_err(|e| e.to_string())?;
    let mut rest = String::new();
    while let Ok(Some(line)) = lines.next_line().await {
        rest.push_str(&line);
        rest.push('\n');
    }
    if !output.status.success() {
        return Err(format!("login failed: {rest}"));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

pub async fn run(options: QuickstartOptions) -> Result<QuickstartResult, String> {
    let _ = std::fs::remove_dir_all(&options.dir);
    std::fs::create_dir_all(&options.dir).map_err(|e| format!("{}: {e}", options.dir.display()))?;
    let dir = options.dir.canonicalize().map_err(|e| e.to_string())?;

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

    say("3. talos-sso-server with the embedded SQLite audit store");
    let listener = std::net::TcpListener::bind(("127.0.0.1", options.server_port)).map_err(|e| {
        format!(
            "cannot listen on port {}: {e}; choose another with --server-port (0: any free port)",
            options.server_port
        )
    })?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let server_url = format!("http://{address}");
    let config_path = dir.join("server.yaml");
    std::fs::write(
        &config_path,
        config_text(&emulator, &dir, &ca_cert, &ca_key, &address.to_string()),
    )
    .map_err(|e| e.to_string())?;
    let config = Config::load_with_env(&config_path, []).map_err(|e| e.to_string())?;
    let (app, background) = App::build(config, Arc::new(SystemClock))
        .await
        .map_err(|e| e.to_string())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = app.clone();
    let server = tokio::spawn(async move {
        let _ = talos_sso_server::http::run(served, listener, None, async move {
            let _ = stopped.await;
        })
        .await;
        background.key_refresher.abort();
        background.rate_limit_janitor.abort();
        background.refusal_recorder.abort();
    });
    say(&format!(
        "   {server_url} (config {}, audit {})",
        config_path.display(),
        dir.join("audit.db").display()
    ));

    say("4. `talos-sso login` as bob@example.com (on-call group: os:operator)");
    let talosconfig = dir.join("talosconfig");
    emulator.set_auto_login(Some("bob@example.com"));
    let login_output = demo_login(&options, &server_url, &talosconfig, "bob").await?;
    emulator.set_auto_login(None);
    say(&format!("   {}", login_output.trim()));

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

    say("6. The audit record of that decision");
    let records = app.audit.store().page(0, 100).await.map_err(|e| e.to_string())?;
    let last = records.last().ok_or("no audit record")?;
    let audit_record = serde_json::to_value(last).map_err(|e| e.to_string())?;
    for line in serde_json::to_string_pretty(&audit_record)
        .map_err(|e| e.to_string())?
        .lines()
    {
        say(&format!("   {line}"));
    }
    let check = app
        .audit
        .store()
        .verify_chain()
        .await
        .map_err(|e| e.to_string())?;
    say(&format!(
        "   hash chain: {} record(s) verified, intact: {}",
        check.verified,
        check.first_broken.is_none()
    ));

    let result = QuickstartResult {
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

    let client = options.client.display();
    say("");
    say("The server and the emulator keep running (Ctrl-C stops them). Log in as another demo user:");
    say(&format!(
        "  XDG_CONFIG_HOME={0}/carol/config XDG_CACHE_HOME={0}/carol/cache {client} login --server {server_url} --talosconfig {1} --device",
        dir.display(),
        talosconfig.display()
    ));
    say(&format!(
        "  then open {}/devicelogin, enter the code it shows and pick:",
        emulator.base_url
    ));
    say("    carol@example.com  app role Talos.Reader        -> os:reader");
    say("    alice@example.com  platform admins (add --role os:admin) -> os:admin");
    say("    dave@example.com   no group, no app role         -> refused: no_matching_rule");
    say("    erin@example.com   250 groups (overage)          -> refused here: no Graph configured");
    say("  (without --device, the login URL opens a page where you pick the user)");
    say(&format!(
        "  Verify the audit chain: cargo run -p talos-sso-server -- audit verify --config {}",
        config_path.display()
    ));
    let _ = tokio::signal::ctrl_c().await;
    let _ = stop.send(());
    let _ = server.await;
    Ok(result)
}
