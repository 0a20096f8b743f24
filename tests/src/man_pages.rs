//! The CLI's manual pages, made from its clap definitions (`docs/man`):
//! one page for `talos-sso` and one per command and subcommand, so that
//! `man talos-sso-login` says what `talos-sso login --help` says. The
//! committed pages are checked against a fresh generation by the tests
//! (`man_pages::`), so a flag added without regenerating them fails CI.

use std::path::Path;

use clap::CommandFactory;

/// The folder, under the repository, that holds the committed pages.
pub const DIR: &str = "docs/man";

/// Write every page of `talos-sso` into `dir` (created if missing).
pub fn generate(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    // The version alone, not the commit `--version` adds: the committed
    // pages would otherwise be stale after every commit.
    let command = talos_sso::cli::Cli::command().version(env!("CARGO_PKG_VERSION"));
    clap_mangen::generate_to(command, dir)
}
