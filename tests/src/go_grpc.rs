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
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::grpc_client::{Call, CallOutcome, TalosContext, program_args, run_program, target_dir};

/// Longest the first build may take on 2 cores.
const BUILD_TIMEOUT: Duration = Duration::from_secs(300);

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
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("go/talos-grpc/main.go");
    let tools = target_dir().join("go-tools");
    std::fs::create_dir_all(&tools).expect("go-tools folder");
    // Built under a name of this process's own, then renamed into place:
    // two test processes may build at once, and one may be running it.
    let own = tools.join(format!("talos-grpc.{}", std::process::id()));
    let done = tools.join("talos-grpc");
    let mut child = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&own)
        .arg(&source)
        .current_dir(source.parent().expect("source folder"))
        .env("GOCACHE", tools.join("cache"))
        .env("GOPATH", tools.join("gopath"))
        .env("GOFLAGS", "-trimpath")
        .env("GOTOOLCHAIN", "local")
        .env("GO111MODULE", "off")
        .env("GOENV", "off")
        .env("CGO_ENABLED", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run go ({e}): tests/run.sh installs Debian's golang-go, \
                 or run `apt-get install golang-go`"
            )
        });
    let deadline = Instant::now() + BUILD_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for go build") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "go build {} still running after {BUILD_TIMEOUT:?}",
                source.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    assert!(status.success(), "go build {}: {stderr}", source.display());
    std::fs::rename(&own, &done).expect("move the built program into place");
    done
}
