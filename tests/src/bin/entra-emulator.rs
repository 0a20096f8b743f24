//! `entra-emulator`: run the Entra ID emulator, for the quick start, the
//! compose stack and trying the CLI by hand.
//!
//! `entra-emulator [ADDRESS] [--public-url URL]` (default 127.0.0.1:8400);
//! `EMULATOR_PUBLIC_URL` works too.

use std::net::SocketAddr;
use std::process::ExitCode;

use talos_sso_tests::emulator::{CLI_CLIENT_ID, EmulatorConfig, EmulatorHandle, TENANT_ID};

const USAGE: &str = "\
Usage: entra-emulator [ADDRESS] [--public-url URL]

Runs the Entra ID emulator (discovery, keys, browser and device login, Graph)
for the quick start, the compose stack and trying the CLI by hand.

Arguments:
  [ADDRESS]           address to listen on [default: 127.0.0.1:8400]

Options:
  --public-url URL    the base URL clients reach it at, when not the listen
                      address (also EMULATOR_PUBLIC_URL)
  -h, --help          print this help";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut address = "127.0.0.1:8400".to_owned();
    let mut public_url = std::env::var("EMULATOR_PUBLIC_URL")
        .ok()
        .filter(|u| !u.is_empty());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--public-url" => match args.next() {
                Some(url) => public_url = Some(url),
                None => {
                    eprintln!("error: --public-url needs a URL\n\n{USAGE}");
                    return ExitCode::FAILURE;
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            flag if flag.starts_with('-') => {
                eprintln!("error: unknown option `{flag}`\n\n{USAGE}");
                return ExitCode::FAILURE;
            }
            other => address = other.to_owned(),
        }
    }
    let address: SocketAddr = match address.parse() {
        Ok(address) => address,
        Err(error) => {
            eprintln!("error: address `{address}`: {error}");
            return ExitCode::FAILURE;
        }
    };
    let config = EmulatorConfig {
        public_url,
        ..Default::default()
    };
    let emulator = match EmulatorHandle::start_on(address, config).await {
        Ok(emulator) => emulator,
        Err(error) => {
            eprintln!("error: cannot listen on {address}: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "Entra ID emulator listening on {address}, reachable as {}",
        emulator.base_url
    );
    println!("  tenant    {TENANT_ID}");
    println!("  issuer    {}", emulator.issuer());
    println!("  client id {CLI_CLIENT_ID}");
    for user in emulator.users() {
        println!(
            "  user      {:<22} groups {:>3}  app roles {:?}",
            user.username,
            user.groups.len(),
            user.app_roles
        );
    }
    let _ = tokio::signal::ctrl_c().await;
    ExitCode::SUCCESS
}
