//! Fault injection against real processes: a Postgres cluster of its own
//! that can be restarted at will, `talos-sso-server serve` as a child process
//! that can be killed, a load of clients issuing continuously while the
//! fault happens, and the check of the audit trail afterwards.
//!
//! The scenarios are in [`scenarios`]: the test binary runs the short
//! ones (`tests/faults.rs`), the `faults` binary any of them, longer.

use std::process::{Command, Stdio};

pub mod scenarios;

mod load;
mod postgres;
mod proxy;
mod report;
mod server;
mod trail;

pub use load::{Attempt, LOAD_USERS, Load};
pub use postgres::{POSTGRES_BIN, PostgresCluster};
pub use proxy::{POSTGRES_COMMIT, TcpProxy};
pub use report::Report;
pub use server::{ServerProcess, audit_verify, server_binary, write_server_config};
pub use trail::{TrailCheck, check_trail};

/// A mutex's guard even when a panicking holder poisoned it: the load's
/// log and the proxy's state stay readable for the report.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A free TCP port on 127.0.0.1 (free when asked; the caller binds it soon).
pub fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

pub(crate) fn run(command: &mut Command) -> Result<String, String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{command:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(format!("{command:?} failed ({}): {text}", output.status))
    }
}
