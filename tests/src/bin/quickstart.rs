//! `quickstart`: the whole product end to end on this machine, no external
//! service (see `talos_sso_tests::quickstart`). Run from the repository:
//!
//! ```sh
//! cargo run -p talos-sso-tests --bin quickstart            # keeps running
//! cargo run -p talos-sso-tests --bin quickstart -- --once  # demo, then exit
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use talos_sso_tests::quickstart::{QuickstartOptions, client_binary, run};

fn main() -> ExitCode {
    let mut once = false;
    let mut dir = PathBuf::from("target/quickstart");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--once" => once = true,
            "--dir" => match args.next() {
                Some(value) => dir = PathBuf::from(value),
                None => {
                    eprintln!("--dir needs a path");
                    return ExitCode::FAILURE;
                }
            },
            other => {
                eprintln!("unknown argument {other}; use --once and --dir PATH");
                return ExitCode::FAILURE;
            }
        }
    }
    let client = match client_binary() {
        Ok(client) => client,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let options = QuickstartOptions {
        dir,
        client,
        emulator_port: 8400,
        server_port: 8443,
        once,
    };
    match runtime.block_on(run(options)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
