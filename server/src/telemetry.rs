//! Logging setup. Logs go to stderr; `RUST_LOG` picks the level (default
//! `info`). Nothing logged anywhere in the crate may contain tokens, keys or
//! CSRs: types holding them implement `Debug` without their contents.

use tracing_subscriber::EnvFilter;

pub fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
