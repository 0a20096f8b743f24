// The source revision of a build, shared by the build scripts of the server
// and the CLI (`include!`d: build scripts cannot share a crate of the
// workspace without building it first).

use std::path::{Path, PathBuf};
use std::process::Command;

/// What `git ARGS` prints, trimmed; `None` when git is missing or fails.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    Some(text.trim().to_owned()).filter(|t| !t.is_empty())
}

/// Watch the git file `name` (`HEAD`, a ref, `packed-refs`) when it exists:
/// a missing file would make cargo run this script at every build.
fn watch_git_file(name: &str) {
    let Some(path) = git(&["rev-parse", "--git-path", name]) else {
        return;
    };
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let path = match manifest {
        Some(dir) if Path::new(&path).is_relative() => dir.join(path),
        _ => PathBuf::from(path),
    };
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn revision() -> String {
    println!("cargo:rerun-if-env-changed=TALOS_SSO_REVISION");
    if let Some(given) = std::env::var("TALOS_SSO_REVISION")
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
    {
        return given;
    }
    let Some(head) = git(&["rev-parse", "HEAD"]) else {
        return "unknown".into();
    };
    // A new commit moves the branch's ref (or HEAD itself when detached);
    // `git pack-refs` moves refs into packed-refs.
    watch_git_file("HEAD");
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch_git_file(&branch);
    }
    watch_git_file("packed-refs");
    head
}

/// Give the crate `TALOS_SSO_REVISION`: the variable when the builder sets
/// it (a build from a tarball, the release script), else `git rev-parse
/// HEAD`, else `unknown`; only characters a metric label and a version
/// line may hold. A build never fails for want of git.
fn emit_revision() {
    let revision: String = revision()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.+".contains(*c))
        .take(64)
        .collect();
    let revision = if revision.is_empty() {
        "unknown".into()
    } else {
        revision
    };
    println!("cargo:rustc-env=TALOS_SSO_REVISION={revision}");
    // What `--version` prints after the program's name.
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=TALOS_SSO_VERSION_LINE={version} (commit {revision})");
}
