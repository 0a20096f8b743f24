//! Logging setup. Logs go to stderr as text or JSON lines (`log.format`);
//! `RUST_LOG` picks the level (default `info`). Nothing logged anywhere in
//! the crate may contain tokens, keys or CSRs: types holding them implement
//! `Debug` without their contents, and handlers log codes, not inputs.

use tracing_subscriber::EnvFilter;

/// Install the global subscriber once; later calls do nothing.
pub fn init_logging(format: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
