//! `quickstart`: the whole product end to end on this machine, no external
//! service (see `talos_sso_tests::quickstart`). Run from the repository:
//!
//! ```sh
//! cargo run -p talos-sso-tests --bin quickstart            # keeps running
//! cargo run -p talos-sso-tests --bin quickstart -- --once  # demo, then exit
//! cargo run -p talos-sso-tests --bin quickstart -- --help  # every option
//! ```

use std::process::ExitCode;

use talos_sso_tests::quickstart::{Parsed, QuickstartOptions, USAGE, demo_binaries, parse_args, run};

fn main() -> ExitCode {
    // Checked before the CLI is built: a typo should not cost a build.
    let args = match parse_args(std::env::args_os().skip(1)) {
        Ok(Parsed::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(args)) => args,
        Err(error) => {
            eprintln!("error: {error}");
            // 2, like other command-line tools, for a command line that is wrong.
            return ExitCode::from(2);
        }
    };
    let client = match demo_binaries() {
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
        dir: args.dir,
        client,
        emulator_port: args.emulator_port,
        server_port: args.server_port,
        once: args.once,
    };
    match runtime.block_on(run(options)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
