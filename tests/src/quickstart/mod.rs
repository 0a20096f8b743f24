//! The quick start: the whole product on one machine with no external
//! service. It starts the Entra ID emulator, makes a throwaway Talos CA and
//! talos-sso's own client CA (accepted-CA mode, as production runs), starts
//! talos-sso-server with its embedded SQLite audit store, logs in as a
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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use talos_sso_server::app::{StartError, SystemClock};
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::config::Config;
use talos_sso_server::server::Server;
use time::OffsetDateTime;

use crate::emulator::{
    CLI_CLIENT_ID, EmulatorConfig, EmulatorHandle, GROUP_ONCALL, GROUP_PLATFORM_ADMINS, GROUP_SECURITY,
    TENANT_ID,
};
use crate::material::write_file;
use crate::talos_checker;

mod args;
mod binaries;
mod demo_user;
mod follow_up;
mod notes;

pub use args::{
    DEFAULT_DIR, DEFAULT_EMULATOR_PORT, DEFAULT_SERVER_PORT, Parsed, QuickstartArgs, USAGE, parse_args,
};
pub use binaries::{
    build_arguments, client_binary, demo_binaries, is_crate_variable, workspace_binaries, workspace_binary,
};
use demo_user::make_private_dir;
pub use demo_user::{CliOutput, DemoUser, demo_login, run_cli};
use follow_up::repository_file;
pub use follow_up::{demo_user_names, follow_up, write_env_files};
pub use notes::record_notes;

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

fn say(line: &str) {
    println!("{line}");
}

fn config_text(
    emulator: &EmulatorHandle,
    dir: &Path,
    ca: &ClientCaFiles,
    talos_ca_cert: &Path,
    listen: &str,
) -> String {
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
    # Accepted-CA mode: talos-sso signs with a client-only CA of its own that
    # the nodes list in machine.acceptedCAs; the cluster CA key stays with Talos.
    ca: {{ cert_file: "{cert}", key_file: "{key}" }}
    talos_ca: {{ cert_file: "{talos_ca}" }}
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
        cert = ca.cert.display(),
        key = ca.key.display(),
        talos_ca = talos_ca_cert.display(),
    )
}

/// The files of the demo's talos-sso client CA.
struct ClientCaFiles {
    cert: PathBuf,
    key: PathBuf,
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
    let bin_dir = options
        .client
        .parent()
        .map(std::path::absolute)
        .transpose()
        .map_err(|e| format!("{}: {e}", options.client.display()))?
        .unwrap_or_default();
    write_env_files(&dir, &bin_dir)?;

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

    say("2. A throwaway Talos cluster CA (Ed25519, O=talos, like `talosctl gen secrets`): its");
    say("   certificate only, as `talos-sso-server ca talos-ca` writes it; and talos-sso's own");
    say("   client CA (`ca client-ca`), which the nodes list in machine.acceptedCAs");
    let now = OffsetDateTime::now_utc();
    let talos_ca = generate::new_root(
        NewKeyType::Ed25519,
        "talos",
        Duration::from_secs(3650 * 86400),
        now,
    )
    .map_err(|e| e.to_string())?;
    let talos_ca_cert = write_file(&dir, "talos-ca.crt", &talos_ca.cert_pem, 0o644);
    let client_ca =
        generate::new_client_ca(NewKeyType::Ed25519, "demo", Duration::from_secs(365 * 86400), now)
            .map_err(|e| e.to_string())?;
    let client_ca_files = ClientCaFiles {
        cert: write_file(&dir, "client-ca.crt", &client_ca.cert_pem, 0o644),
        key: write_file(&dir, "client-ca.key", &client_ca.key_pem, 0o600),
    };
    say(&format!(
        "   {} and {}",
        talos_ca_cert.display(),
        client_ca_files.cert.display()
    ));
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
            config_text(&emulator, &dir, &client_ca_files, &talos_ca_cert, listen),
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

    say("7. A Talos node admits bob's certificate: mutual TLS with a stand-in for apid");
    say("   (it trusts machine.ca plus machine.acceptedCAs, requires a client certificate, and reads");
    say(
        "   the roles from its Subject Organization, as apid does; the talosconfig's key signs the handshake)",
    );
    let accepted_pool = format!("{}{}", talos_ca.cert_pem, client_ca.cert_pem);
    let cluster_ca_only = talos_ca.cert_pem.clone();
    let (accepted, cut_off) = tokio::task::spawn_blocking(move || {
        (
            talos_checker::handshake(&accepted_pool, &stored.crt_pem, &stored.key_pem),
            talos_checker::handshake(&cluster_ca_only, &stored.crt_pem, &stored.key_pem),
        )
    })
    .await
    .map_err(|e| e.to_string())?;
    let accepted = accepted.map_err(|e| format!("the apid stand-in refused bob's certificate: {e}"))?;
    if cut_off.is_ok() {
        return Err("the apid stand-in admitted bob without the client CA in its pool".into());
    }
    let left = (leaf.not_after - OffsetDateTime::now_utc()).whole_seconds();
    say(&format!(
        "   accepted: roles {:?} for {}, valid until {} ({}m{:02}s left)",
        accepted.roles,
        accepted.common_name.unwrap_or_default(),
        leaf.not_after
            .format(&time::format_description::well_known::Rfc3339)
            .map_err(|e| e.to_string())?,
        left / 60,
        left % 60
    ));
    say("   With the client CA out of machine.acceptedCAs (`talos-sso-server ca patch remove`, the");
    say("   cut-off), the same certificate is refused: talos-sso is withdrawn by one patch.");

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
