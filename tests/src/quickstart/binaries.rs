//! Finding (and first building) the workspace's binaries next to the
//! running executable: with the features, profile and target folder that
//! built it, and without the crate variables that would rebuild them.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

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

/// The package whose binaries (`quickstart`, `faults`, ...) build the others.
const HARNESS_PACKAGE: &str = "talos-sso-tests";

/// The `talos-sso` binary next to the running executable, built first (the
/// quick start and the client benchmark drive the real CLI).
pub fn client_binary() -> Result<PathBuf, String> {
    workspace_binary("talos-sso", "talos-sso", "the talos-sso CLI")
}

/// What the quick start runs: the `talos-sso` CLI, and talos-sso-server
/// for the server-side `audit verify` its closing lines offer, next to it.
/// One cargo builds both; the CLI's path is returned.
pub fn demo_binaries() -> Result<PathBuf, String> {
    let built = workspace_binaries(
        &[
            ("talos-sso", "talos-sso"),
            ("talos-sso-server", "talos-sso-server"),
        ],
        "the talos-sso CLI and server",
    )?;
    built
        .into_iter()
        .next()
        .ok_or_else(|| "could not build talos-sso".to_owned())
}

/// The binary `bin` of the workspace package `package`, next to the running
/// executable, built first (see [`workspace_binaries`]).
pub fn workspace_binary(package: &str, bin: &str, what: &str) -> Result<PathBuf, String> {
    let mut built = workspace_binaries(&[(package, bin)], what)?;
    built.pop().ok_or_else(|| format!("could not build {bin}"))
}

/// The arguments of the `cargo build` for `binaries` (package, binary
/// name), to put them in `profile_dir` (`<target folder>/<profile>`, where
/// the running executable is) with what built the running executable:
///
/// - The harness's own package is selected too, although none of its
///   binaries is built: cargo unifies features over the packages a command
///   selects, so this resolves every shared crate exactly as `cargo run -p
///   talos-sso-tests` did, and reuses what that built. Selected alone, the
///   CLI's package turns fewer features on (serde's `rc`, serde_json's
///   `raw_value`, hyper's `server`, ...), and cargo built serde and
///   everything above it a second time for the CLI: 36 s on 2 cores at the
///   first quick start, and as much again for `cargo run -p talos-sso-server`.
/// - The same target folder and profile (`debug` is `dev`), whatever named
///   them (`--target-dir`, `--profile`, a cargo configuration file).
/// - The workspace's own manifest, so that it works from any folder.
pub fn build_arguments(binaries: &[(&str, &str)], profile_dir: &Path) -> Vec<OsString> {
    let mut arguments: Vec<OsString> = vec![
        "build".into(),
        "--manifest-path".into(),
        workspace_manifest().into(),
    ];
    if let (Some(target), Some(profile)) = (profile_dir.parent(), profile_dir.file_name()) {
        arguments.extend([
            "--target-dir".into(),
            target.as_os_str().to_owned(),
            "--profile".into(),
        ]);
        arguments.push(if profile == "debug" {
            "dev".into()
        } else {
            profile.to_owned()
        });
    }
    arguments.extend(["-p".into(), HARNESS_PACKAGE.into()]);
    for (package, _) in binaries {
        if *package != HARNESS_PACKAGE {
            arguments.extend(["-p".into(), (*package).into()]);
        }
    }
    for (_, bin) in binaries {
        arguments.extend(["--bin".into(), (*bin).into()]);
    }
    arguments
}

/// The workspace's `Cargo.toml`, one folder above this package's.
fn workspace_manifest() -> PathBuf {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR"));
    tests.parent().unwrap_or(tests).join("Cargo.toml")
}

/// The binaries `binaries` (package, binary name) of the workspace, next to
/// the running executable, built first by one `cargo build` with the same
/// profile, target folder and features (see [`build_arguments`]). It says
/// that it builds `what`, then cargo's own progress shows, so that the
/// first build (minutes) is not a silent wait.
pub fn workspace_binaries(binaries: &[(&str, &str)], what: &str) -> Result<Vec<PathBuf>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut dir = exe.parent().ok_or("no directory for the current executable")?;
    // A test binary lives in `target/<profile>/deps`; binaries one up.
    if dir.ends_with("deps") {
        dir = dir.parent().ok_or("no profile directory above deps")?;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    build.args(build_arguments(binaries, dir));
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
    let built: Vec<PathBuf> = binaries.iter().map(|(_, bin)| dir.join(bin)).collect();
    if let Some(absent) = built.iter().find(|binary| !status.success() || !binary.exists()) {
        return Err(format!("could not build {}", absent.display()));
    }
    Ok(built)
}
