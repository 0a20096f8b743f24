//! `talos-sso`: the command line. Only `--help` and `--version` exist so far.

use clap::Parser;

/// Log in to Talos Linux clusters with single sign-on.
#[derive(Debug, Parser)]
#[command(name = "talos-sso", version)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
}
