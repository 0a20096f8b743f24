//! Logging setup. Logs go to stderr as text or JSON lines (`log.format`);
//! `RUST_LOG` picks the level (default `info`). Nothing logged anywhere in
//! the crate may contain tokens, keys or CSRs: types holding them implement
//! `Debug` without their contents, and handlers log codes, not inputs.

use tracing_subscriber::EnvFilter;

/// Colour only for a person at a terminal who did not ask for none
/// (<https://no-color.org>): log files and collectors get plain text.
pub fn use_colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Install the global subscriber once; later calls do nothing.
pub fn init_logging(format: &str) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(use_colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(!use_colour(false, None), "a pipe or a file gets no escape codes");
        assert!(!use_colour(true, Some("1".into())));
        assert!(
            use_colour(true, Some("".into())),
            "an empty NO_COLOR does not count"
        );
    }
}
