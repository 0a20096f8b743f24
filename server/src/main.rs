//! `talos-sso-server`: parse arguments, set up logging, run the command.

use std::process::ExitCode;

use clap::Parser;
use talos_sso_server::cli::{self, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli::run(cli, &mut std::io::stdout()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
