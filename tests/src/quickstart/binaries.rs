//! Finding (and first building) the workspace's binaries next to the
//! running executable, without the crate variables that would rebuild them.

use std::ffi::OsStr;
use std::path::PathBuf;

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
