//! `talos-sso`: parse arguments, run the command, report errors plainly
//! and end with the status of the outcome (`cli::exit`).

use std::process::ExitCode;

use clap::Parser;
use talos_sso::cli::{self, Cli};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(code) => code,
        // `talos-sso audit export | head`: the reader has had enough.
        Err(error) if cli::closed_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", cli::error_text(&error));
            cli::failure_status(&error)
        }
    }
}
