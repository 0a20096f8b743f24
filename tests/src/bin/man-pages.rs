//! `man-pages [DIR]`: write the CLI's manual pages into DIR (default
//! `docs/man`, run from the repository's root), after a change to its
//! commands or flags:
//!
//! ```sh
//! cargo run -p talos-sso-tests --bin man-pages
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from(talos_sso_tests::man_pages::DIR), PathBuf::from);
    match talos_sso_tests::man_pages::generate(&dir) {
        Ok(()) => {
            println!("manual pages written to {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("cannot write the manual pages to {}: {error}", dir.display());
            ExitCode::FAILURE
        }
    }
}
