//! talosctl's transport in Go's standard library: tests/go/talos-grpc
//! speaks gRPC over `net/http`'s HTTP/2 client with `crypto/tls`, the
//! stack talosctl's grpc-go sits on, with the talosconfig's key (Ed25519 as
//! `talos-sso login` writes it) and `ca` as its only roots.
//!
//! Built once per test process with the Go on PATH (Debian's `golang-go`,
//! which tests/run.sh installs), standard library only and offline, into
//! `<target folder>/go-tools/`; each call runs it as a child process and
//! reads its one JSON line (`grpc_client::CallOutcome`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::grpc_client::{Call, CallOutcome, TalosContext, program_args, run_program};

/// Longest one call may take (a 32 MiB read included).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// One call by the Go client, on a connection of its own.
pub async fn call(context: &TalosContext, call: &Call) -> CallOutcome {
    let program = tokio::task::spawn_blocking(|| program().to_owned())
        .await
        .expect("the Go build");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut command = tokio::process::Command::new(program);
    command.args(program_args(dir.path(), context, call));
    run_program(command, RUN_TIMEOUT).await
}

/// The built program, once per process.
pub fn program() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(build)
}

fn build() -> PathBuf {
    crate::go_tls::go_build("talos-grpc")
}
