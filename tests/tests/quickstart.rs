//! The quick start as a newcomer meets it: the real `quickstart` binary run
//! the way README.md says, from the repository with relative paths, on a
//! machine whose home folder must come out of it untouched; its command
//! line; the environment of the cargo it runs to build the CLI; and the
//! commands it prints for later.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use talos_sso_tests::quickstart::{
    DEFAULT_DIR, DEFAULT_EMULATOR_PORT, DEFAULT_SERVER_PORT, DemoUser, Parsed, QuickstartArgs,
    QuickstartOptions, build_arguments, demo_user_names, follow_up, is_crate_variable, parse_args,
};

const QUICKSTART: &str = env!("CARGO_BIN_EXE_quickstart");

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// Everything under `dir`, for assertions and their messages.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.is_symlink() {
                pending.push(path.clone());
            }
            found.push(path);
        }
    }
    found.sort();
    found
}

fn parse(args: &[&str]) -> Result<Parsed, String> {
    parse_args(args.iter().map(OsString::from))
}

fn run_args(args: &[&str]) -> QuickstartArgs {
    match parse(args) {
        Ok(Parsed::Run(args)) => args,
        other => panic!("{args:?}: {other:?}"),
    }
}

/// README.md's first command, non-interactive (`-- --once`), run from the
/// repository with a relative `--dir`, as someone whose HOME is an empty
/// folder and who has no XDG variables set: the demo succeeds, its files
/// (the demo users' configuration, tokens and talosconfigs included) are all
/// in the demo folder, every path it prints is absolute, and HOME is still
/// empty. Ports 0 and a folder of its own keep it clear of a quick start
/// the developer may have running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_leaves_the_home_folder_untouched() {
    let home = tempfile::tempdir().unwrap();
    let real_home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    // cargo and rustup (for the CLI the quick start builds) keep their
    // own homes: they are not the demo's to move.
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| real_home.join(".cargo"));
    let rustup_home = std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| real_home.join(".rustup"));
    let relative = format!("target/quickstart-home-test-{}", std::process::id());
    let demo = repository().join(&relative);

    let mut command = tokio::process::Command::new(QUICKSTART);
    command
        .current_dir(repository())
        .args(["--once", "--dir", &relative])
        .args(["--emulator-port", "0", "--server-port", "0"])
        .env("HOME", home.path())
        .env("CARGO_HOME", &cargo_home)
        .env("RUSTUP_HOME", &rustup_home)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for name in [
        "XDG_CONFIG_HOME",
        "XDG_CACHE_HOME",
        "XDG_DATA_HOME",
        "XDG_STATE_HOME",
        "TALOSCONFIG",
    ] {
        command.env_remove(name);
    }
    // The first run builds the CLI: minutes on a small machine.
    let output = tokio::time::timeout(Duration::from_secs(1800), command.output())
        .await
        .expect("the quick start finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // It says what it builds, then cargo's own progress shows.
    assert!(
        stderr.starts_with("Building the talos-sso CLI and server with cargo") && stderr.contains("Finished"),
        "{stderr}"
    );

    assert_eq!(tree(home.path()), Vec::<PathBuf>::new(), "{stdout}");

    let demo = demo.canonicalize().unwrap();
    let files = tree(&demo);
    for expected in [
        "bob/config/talos-sso/config.yaml",
        "bob/cache/talos-sso/tokens.json",
        "bob/talosconfig",
        "sam/config/talos-sso/config.yaml",
        "sam/cache/talos-sso/tokens.json",
        "server.yaml",
        "audit.db",
    ] {
        assert!(files.contains(&demo.join(expected)), "{expected} in {files:?}");
    }
    let bob = std::fs::read_to_string(demo.join("bob/config/talos-sso/config.yaml")).unwrap();
    assert!(
        bob.contains(&demo.join("bob/talosconfig").display().to_string()),
        "{bob}"
    );

    assert!(
        stdout.contains("as bob@example.com with os:operator; certificate valid for"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "context `demo` in {}",
            demo.join("bob/talosconfig").display()
        )),
        "{stdout}"
    );
    // The auditor's view, for real, and what it means.
    for expected in [
        "$ talos-sso audit list",
        "$ talos-sso audit show 1",
        "$ talos-sso audit verify",
        "audit chain intact: 4 records verified, the newest is record 4",
        "\"event\": \"certificate.issued\"",
        "not_before is 5m00s before occurred_at: the cluster's `clock_skew`",
        "token_issued_at is 5m",
        "groups_evaluated is [3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a02]",
    ] {
        assert!(stdout.contains(expected), "{expected} in {stdout}");
    }
    // It ends with bob's certificate admitted over mutual TLS by the apid
    // stand-in, with the roles Talos reads and the time left; the server
    // never had the cluster CA key.
    let admitted = stdout
        .lines()
        .skip_while(|line| !line.starts_with("7. A Talos node admits bob's certificate"))
        .find(|line| line.trim_start().starts_with("accepted:"))
        .unwrap_or_else(|| panic!("the handshake's result in {stdout}"));
    assert!(
        admitted.contains(r#"accepted: roles ["os:operator"] for bob@example.com, valid until "#)
            && admitted.ends_with("s left)"),
        "{admitted}"
    );
    // In accepted-CA mode: and refused once the client CA is out of the pool.
    assert!(
        stdout.contains("cut-off), the same certificate is refused"),
        "{stdout}"
    );
    assert!(files.contains(&demo.join("client-ca.key")) && !files.contains(&demo.join("talos-ca.key")));

    // Each demo user's environment file works as printed: `source` it in a
    // shell that has nothing else, and the CLI on its PATH reads that
    // user's own login.
    for name in demo_user_names() {
        assert!(
            files.contains(&demo.join(format!("{name}.env"))),
            "{name}.env in {files:?}"
        );
    }
    let status = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            ". '{}' && talos-sso status",
            demo.join("bob.env").display()
        ))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{shown} {}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        shown.contains("logged in as bob@example.com with [os:operator]")
            && shown.contains(&demo.join("bob/talosconfig").display().to_string()),
        "{shown}"
    );

    // The server binary the closing lines name was built next to the CLI,
    // and verifies the demo's trail from the store itself.
    let built = Path::new(QUICKSTART).parent().unwrap();
    let verify = std::process::Command::new(built.join("talos-sso-server"))
        .args(["audit", "verify", "--config"])
        .arg(demo.join("server.yaml"))
        .output()
        .unwrap();
    let verified = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success(),
        "{verified} {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(
        verified.contains("audit chain intact: 4 records verified"),
        "{verified}"
    );

    // Every path it prints is absolute.
    let relative_paths: Vec<&str> = stdout
        .split(|c: char| c.is_whitespace() || "()`,:".contains(c))
        .filter(|word| word.starts_with(&relative) || word.starts_with("target/"))
        .collect();
    assert!(relative_paths.is_empty(), "{relative_paths:?} in {stdout}");

    std::fs::remove_dir_all(&demo).unwrap();
}

#[test]
fn the_command_line_has_defaults_and_every_option() {
    assert_eq!(
        run_args(&[]),
        QuickstartArgs {
            dir: PathBuf::from(DEFAULT_DIR),
            emulator_port: DEFAULT_EMULATOR_PORT,
            server_port: DEFAULT_SERVER_PORT,
            once: false,
        }
    );
    assert_eq!(
        (DEFAULT_DIR, DEFAULT_EMULATOR_PORT, DEFAULT_SERVER_PORT),
        ("target/quickstart", 8400, 8443)
    );
    let expected = QuickstartArgs {
        dir: PathBuf::from("elsewhere/demo"),
        emulator_port: 0,
        server_port: 9443,
        once: true,
    };
    assert_eq!(
        run_args(&[
            "--emulator-port",
            "0",
            "--server-port",
            "9443",
            "--dir",
            "elsewhere/demo",
            "--once"
        ]),
        expected
    );
    assert_eq!(
        run_args(&[
            "--once",
            "--emulator-port=0",
            "--server-port=9443",
            "--dir=elsewhere/demo"
        ]),
        expected
    );
    // Both ports 0 is fine: each gets a free one.
    assert_eq!(
        run_args(&["--emulator-port", "0", "--server-port", "0"]).server_port,
        0
    );
    assert_eq!(run_args(&["--server-port", "65535"]).server_port, 65535);
    assert_eq!(parse(&["--help"]), Ok(Parsed::Help));
    assert_eq!(parse(&["--once", "-h"]), Ok(Parsed::Help));
}

#[test]
fn a_bad_value_is_refused_with_the_option_named() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--server-port", "abc"],
            "--server-port: `abc` is not a port number (0 to 65535; 0: any free port)",
        ),
        (
            &["--server-port", "65536"],
            "--server-port: `65536` is not a port number",
        ),
        (
            &["--emulator-port", "-1"],
            "--emulator-port: `-1` is not a port number",
        ),
        (
            &["--emulator-port=8400x"],
            "--emulator-port: `8400x` is not a port number",
        ),
        (
            &["--emulator-port", ""],
            "--emulator-port: `` is not a port number",
        ),
        (&["--server-port"], "--server-port needs a port number"),
        (&["--emulator-port"], "--emulator-port needs a port number"),
        (&["--dir"], "--dir needs a path"),
        (&["--dir="], "--dir needs a path"),
        (&["--once=yes"], "--once takes no value"),
        (&["--help=me"], "--help takes no value"),
        (&["--port", "1"], "unknown argument `--port`; see --help"),
        (&["once"], "unknown argument `once`; see --help"),
        (
            &["--emulator-port", "9000", "--server-port", "9000"],
            "--emulator-port and --server-port are both 9000; they need different ports",
        ),
        (&["--server-port", "8400"], "are both 8400"),
    ];
    for (args, expected) in cases {
        let message = parse(args).unwrap_err();
        assert!(message.contains(expected), "{args:?}: {message}");
    }
}

/// The binary itself: `--help` lists every option and a bad value exits 2
/// naming it, both before any build starts.
#[test]
fn the_binary_answers_help_and_bad_values_before_building_anything() {
    let help = std::process::Command::new(QUICKSTART)
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    for option in [
        "--once",
        "--dir PATH",
        "--emulator-port PORT",
        "--server-port PORT",
        "--help",
    ] {
        assert!(text.contains(option), "{option} in {text}");
    }
    assert!(text.contains("0: any free port"), "{text}");
    assert!(
        help.stderr.is_empty(),
        "nothing built: {:?}",
        String::from_utf8_lossy(&help.stderr)
    );

    let bad = std::process::Command::new(QUICKSTART)
        .args(["--once", "--emulator-port", "eighty"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let message = String::from_utf8(bad.stderr).unwrap();
    assert_eq!(
        message,
        "error: --emulator-port: `eighty` is not a port number (0 to 65535; 0: any free port)\n"
    );
}

/// The nested `cargo build` of the CLI drops what cargo set for the
/// running quick start (so that build scripts see the same environment as
/// in any other cargo command) and keeps what configures cargo.
#[test]
fn the_nested_build_drops_only_what_cargo_sets_for_the_running_crate() {
    for dropped in [
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_MANIFEST_LINKS",
        "CARGO_PKG_NAME",
        "CARGO_PKG_VERSION",
        "CARGO_PKG_VERSION_MAJOR",
        "CARGO_PKG_VERSION_PRE",
        "CARGO_PKG_AUTHORS",
        "CARGO_PKG_DESCRIPTION",
        "CARGO_PKG_README",
        "CARGO_PKG_RUST_VERSION",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_BIN_EXE_quickstart",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ] {
        assert!(is_crate_variable(dropped.as_ref()), "{dropped} is dropped");
    }
    for kept in [
        "CARGO",
        "CARGO_HOME",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_JOBS",
        "CARGO_INCREMENTAL",
        "CARGO_PROFILE_DEV_DEBUG",
        "CARGO_REGISTRIES_CRATES_IO_PROTOCOL",
        "CARGO_NET_OFFLINE",
        "CARGO_TERM_COLOR",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
        "PATH",
        "HOME",
        "LD_LIBRARY_PATH",
    ] {
        assert!(!is_crate_variable(kept.as_ref()), "{kept} is kept");
    }
}

/// The commands printed for later: one folder per demo user (HOME, XDG
/// config and cache, talosconfig) behind a short environment file to
/// `source`, all absolute, none shared, so that carol's login cannot
/// replace bob's `demo` context or anyone's own; a device login approved
/// without a browser; the server-side verify with the binary already built.
#[test]
fn the_commands_for_later_keep_each_user_in_their_own_folder() {
    let dir = Path::new("/srv/demo dir/quickstart");
    let built = tempfile::tempdir().unwrap();
    let client = built.path().join("talos-sso");
    let lines = || {
        follow_up(
            dir,
            &client,
            "http://127.0.0.1:8443",
            "http://127.0.0.1:8400",
            &dir.join("server.yaml"),
        )
        .unwrap()
    };
    // Without talos-sso-server next to the CLI: cargo builds and runs it.
    let text = lines().join("\n");
    assert!(
        text.contains("-p talos-sso-server -- audit verify --config '/srv/demo dir/quickstart/server.yaml'"),
        "{text}"
    );
    // With it (as the quick start builds it): that binary, no cargo.
    std::fs::write(built.path().join("talos-sso-server"), "").unwrap();
    let lines = lines();
    let text = lines.join("\n");
    assert!(
        text.contains(&format!(
            "\n    {}/talos-sso-server audit verify --config '/srv/demo dir/quickstart/server.yaml'",
            built.path().display()
        )),
        "{text}"
    );
    assert!(!text.contains("cargo"), "{text}");
    assert!(text.contains("http://127.0.0.1:8400/devicelogin"), "{text}");
    assert!(
        text.contains("curl -d user_code=CODE -d user=carol@example.com http://127.0.0.1:8400/devicelogin"),
        "{text}"
    );
    assert!(text.contains("Ctrl-C"), "{text}");
    // Each user's line sources that user's own file (and no other's).
    for user in ["carol", "alice", "dave", "erin"] {
        let command = lines
            .iter()
            .find(|l| l.contains(&format!("/{user}.env")))
            .unwrap_or_else(|| panic!("{user} in {text}"));
        assert_eq!(
            command.trim(),
            format!(
                "source '/srv/demo dir/quickstart/{user}.env' && talos-sso login --server http://127.0.0.1:8443 --device{}",
                if user == "alice" { " --role os:admin" } else { "" }
            )
        );
    }
    for (user, command) in [("sam", "audit list"), ("bob", "status")] {
        assert!(
            text.contains(&format!(
                "    source '/srv/demo dir/quickstart/{user}.env' && talos-sso {command}\n"
            )),
            "{user} in {text}"
        );
    }
    // Nothing is relative: every word that names a file starts at the root.
    let plain = follow_up(
        Path::new("/srv/quickstart"),
        &client,
        "http://127.0.0.1:8443",
        "http://127.0.0.1:8400",
        Path::new("/srv/quickstart/server.yaml"),
    )
    .unwrap()
    .join("\n");
    for word in plain
        .split_whitespace()
        .filter(|w| w.contains('/') && !w.contains("://"))
    {
        let path = word.split_once('=').map_or(word, |(_, value)| value);
        assert!(
            path.starts_with('/') || path.starts_with("~/"),
            "{word} in {plain}"
        );
    }
}

/// A demo user's environment file, sourced by a shell that has nothing
/// else: it sets exactly the user's folders (a path with a space and a
/// quote comes back unchanged) and puts the CLI's folder first on PATH.
#[test]
fn an_environment_file_sets_the_users_folders_and_the_cli_on_path() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("demo dir's");
    let bin = scratch.path().join("tar get/debug");
    let carol = DemoUser::new(&dir, "carol").unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let file = carol.write_env_file(&bin).unwrap();
    assert_eq!(file, dir.join("carol.env"));
    assert!(carol.home().is_dir());
    let output = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(r#". "$1" && printf '%s\n' "$HOME" "$XDG_CONFIG_HOME" "$XDG_CACHE_HOME" "$TALOSCONFIG" "$TALOS_SSO_TOKEN_STORE" "$PATH""#)
        .arg("sh")
        .arg(&file)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let root = dir.join("carol");
    let expected = [
        root.join("home").display().to_string(),
        root.join("config").display().to_string(),
        root.join("cache").display().to_string(),
        root.join("talosconfig").display().to_string(),
        "file".to_owned(),
        format!("{}:/usr/bin:/bin", bin.display()),
    ];
    assert_eq!(
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .collect::<Vec<_>>(),
        expected
    );
}

/// The nested build of the binaries selects the quick start's own package
/// too, so that cargo resolves the shared crates' features as for the
/// running binary and reuses its build (selected alone, the CLI's package
/// rebuilt serde and what sits above it), in the same target folder and
/// profile, from the workspace's manifest.
#[test]
fn the_nested_build_reuses_the_running_binarys_build() {
    let arguments = |profile_dir: &str| -> Vec<String> {
        build_arguments(
            &[
                ("talos-sso", "talos-sso"),
                ("talos-sso-server", "talos-sso-server"),
            ],
            Path::new(profile_dir),
        )
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect()
    };
    let manifest = repository().join("Cargo.toml").display().to_string();
    assert_eq!(
        arguments("/t/target/debug"),
        [
            "build",
            "--manifest-path",
            &manifest,
            "--target-dir",
            "/t/target",
            "--profile",
            "dev",
            "-p",
            "talos-sso-tests",
            "-p",
            "talos-sso",
            "-p",
            "talos-sso-server",
            "--bin",
            "talos-sso",
            "--bin",
            "talos-sso-server",
        ]
    );
    let release = arguments("/t/target/release");
    assert!(
        release.windows(2).any(|w| w == ["--profile", "release"]),
        "{release:?}"
    );
}

/// The demo folder is deleted on each run, so a folder the quick start did
/// not make is refused, before anything starts, and left as it was.
#[tokio::test]
async fn a_folder_the_quick_start_did_not_make_is_never_deleted() {
    let scratch = tempfile::tempdir().unwrap();
    let precious = scratch.path().join("notes.txt");
    std::fs::write(&precious, "mine").unwrap();
    let options = QuickstartOptions {
        dir: scratch.path().to_owned(),
        client: PathBuf::from("/nonexistent/talos-sso"),
        emulator_port: 0,
        server_port: 0,
        once: true,
    };
    let error = talos_sso_tests::quickstart::run(options).await.unwrap_err();
    assert!(
        error.contains("holds files the quick start did not write") && error.contains("--dir"),
        "{error}"
    );
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "mine");
}
