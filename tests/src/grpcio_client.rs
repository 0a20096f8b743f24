//! gRPC's C core as a client: tests/grpc/grpcio_client.py, Python's
//! `grpcio` with raw-bytes serializers (no generated code), so that a
//! third, independent HTTP/2 and gRPC implementation judges the answers.
//!
//! grpcio's TLS (BoringSSL through the C core) offers no Ed25519
//! signature, so its client certificate has an ECDSA P-256 key. tests/run.sh
//! installs grpcio into `<target folder>/grpcio-venv` when it is missing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::go_tls::target_dir;
use crate::grpc_client::{Call, CallOutcome, TalosContext, program_args, run_program};

/// Longest one call may take (a 32 MiB read included).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The venv's Python; a missing venv fails with how to make it.
pub fn python() -> PathBuf {
    let python = target_dir().join("grpcio-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `tests/run.sh --setup-only` (it installs grpcio there)",
        python.display()
    );
    python
}

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("grpc/grpcio_client.py")
}

/// One call by grpcio, on a channel of its own.
pub async fn call(context: &TalosContext, call: &Call) -> CallOutcome {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut command = tokio::process::Command::new(python());
    command
        .arg(script())
        .args(program_args(dir.path(), context, call));
    run_program(command, RUN_TIMEOUT).await
}
