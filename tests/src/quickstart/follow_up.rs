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
