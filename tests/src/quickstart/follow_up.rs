//! The closing lines: how to go on as another demo user.

use std::path::{Path, PathBuf};

use super::demo_user::DemoUser;
use super::demo_user::shell_word;

/// The repository's copy of a document, for the demo to point at.
pub(super) fn repository_file(relative: &str) -> PathBuf {
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

/// Every demo user the quick start names: bob and sam, then [`OTHER_USERS`].
pub fn demo_user_names() -> impl Iterator<Item = &'static str> {
    ["bob", "sam"]
        .into_iter()
        .chain(OTHER_USERS.iter().map(|(name, _, _)| *name))
}

/// Write every demo user's environment file in `dir`
/// ([`DemoUser::env_file`]), with `bin_dir` (the CLI's folder) on PATH.
pub fn write_env_files(dir: &Path, bin_dir: &Path) -> Result<(), String> {
    for name in demo_user_names() {
        DemoUser::new(dir, name)?.write_env_file(bin_dir)?;
    }
    Ok(())
}

/// talos-sso-server next to the CLI (the quick start builds both), if it
/// is there.
fn server_binary(client: &Path) -> Option<PathBuf> {
    Some(client.with_file_name("talos-sso-server")).filter(|path| path.is_file())
}

/// The closing lines: how to go on while the server and emulator run.
/// Every user keeps to their own folder, through the environment file
/// [`write_env_files`] wrote, and every path is absolute, so the commands
/// work from any directory and touch none of the person's files.
pub fn follow_up(
    dir: &Path,
    client: &Path,
    server_url: &str,
    emulator_url: &str,
    config_path: &Path,
) -> Result<Vec<String>, String> {
    let source = |name: &str| -> Result<String, String> {
        let file = DemoUser::new(dir, name)?.env_file();
        Ok(format!("source {} &&", shell_word(&file.display().to_string())))
    };
    let mut lines = vec![
        String::new(),
        "The server and the emulator keep running (Ctrl-C stops them).".to_owned(),
        format!(
            "Each demo user has a folder in {} (HOME, XDG config and cache, talosconfig) and an \
             environment file, NAME.env, that points the CLI there and puts it on PATH: source it in a \
             new shell (`exit` leaves it). No login replaces another's, and your own ~/.config, \
             ~/.cache and ~/.talos stay as they are.",
            dir.display()
        ),
        "Log in as another demo user:".to_owned(),
    ];
    for (name, why, result) in OTHER_USERS {
        let role = if name == "alice" { " --role os:admin" } else { "" };
        lines.push(format!("  {name}@example.com ({why}) -> {result}"));
        lines.push(format!(
            "    {} talos-sso login --server {server_url} --device{role}",
            source(name)?
        ));
    }
    lines.push(format!(
        "  The login prints a code: open {emulator_url}/devicelogin, enter it and pick the same user; \
         or approve it without a browser (carol's, here):"
    ));
    lines.push(format!(
        "    curl -d user_code=CODE -d user=carol@example.com {emulator_url}/devicelogin"
    ));
    lines.push("  (without --device, the login URL opens a page where you pick the user)".into());
    lines.push("bob's talosconfig, as Talos and talosctl would use it:".into());
    lines.push(format!("    {} talos-sso status", source("bob")?));
    lines
        .push("Read the audit trail as sam (already logged in): audit list, show SEQ, export, verify".into());
    lines.push(format!("    {} talos-sso audit list", source("sam")?));
    lines.push("Verify the chain on the server side, from the audit store itself:".into());
    let config = shell_word(&config_path.display().to_string());
    lines.push(match server_binary(client) {
        Some(server) => format!(
            "    {} audit verify --config {config}",
            shell_word(&server.display().to_string())
        ),
        None => format!(
            "    cargo run --manifest-path {} -p talos-sso-server -- audit verify --config {config}",
            shell_word(&repository_file("Cargo.toml").display().to_string())
        ),
    });
    Ok(lines)
}
