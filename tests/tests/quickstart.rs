//! The quick start's command line: its options, `--help`, and an error that
//! names the option for every bad value, before anything is built; and the
//! environment of the cargo it runs to build the CLI.

use std::ffi::OsString;
use std::path::PathBuf;

use talos_sso_tests::quickstart::{
    DEFAULT_DIR, DEFAULT_EMULATOR_PORT, DEFAULT_SERVER_PORT, Parsed, QuickstartArgs, is_crate_variable,
    parse_args,
};

const QUICKSTART: &str = env!("CARGO_BIN_EXE_quickstart");

fn parse(args: &[&str]) -> Result<Parsed, String> {
    parse_args(args.iter().map(OsString::from))
}

fn run_args(args: &[&str]) -> QuickstartArgs {
    match parse(args) {
        Ok(Parsed::Run(args)) => args,
        other => panic!("{args:?}: {other:?}"),
    }
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
