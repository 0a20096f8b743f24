//! Go's standard library as a judge of the certificates talos-sso makes:
//! `tests/go/talos-tls` stands in for apid and talosctl with `crypto/tls`
//! and `crypto/x509`, the code Talos itself runs, where `talos_checker` is
//! a stand-in written for these tests with rustls.
//!
//! The program is built once per test process with the Go on PATH (Debian's
//! `golang-go`, which tests/run.sh installs), standard library only and
//! offline, into `<target folder>/go-tools/`. Each call runs it as a child
//! process, and every wait on it is bounded.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

/// Longest a first build may take (the standard library's TLS packages
/// compile into an empty cache in well under a minute on 2 cores).
const BUILD_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest one `verify` or `talosctl` run, or apid's start, may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// Which extended key usage `verify` asks the chain for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Client,
    Server,
}

impl Usage {
    fn flag(self) -> &'static str {
        match self {
            Usage::Client => "client",
            Usage::Server => "server",
        }
    }
}

/// `<target folder>`: the test executable is in `<target>/<profile>/deps`.
pub(crate) fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut dir = exe.parent().expect("its folder");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("the profile folder");
    }
    dir.parent().expect("the target folder").to_owned()
}

/// The built program, once per process.
pub fn program() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(build)
}

fn build() -> PathBuf {
    go_build("talos-tls")
}

/// Build `tests/go/NAME/main.go` (standard library only, no module) into
/// the target folder's `go-tools/NAME`, and return its path. Built under a
/// name of this process's own, then renamed into place: two test processes
/// may build at once, and one may be running it.
pub fn go_build(name: &str) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("go")
        .join(name)
        .join("main.go");
    let tools = target_dir().join("go-tools");
    std::fs::create_dir_all(&tools).expect("go-tools folder");
    let own = tools.join(format!("{name}.{}", std::process::id()));
    let done = tools.join(name);
    let mut command = Command::new("go");
    command
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
        .env("CGO_ENABLED", "0");
    let output = run_bounded(command, BUILD_TIMEOUT).unwrap_or_else(|e| {
        panic!(
            "cannot build {}: {e}\n(Go is needed: tests/run.sh installs Debian's golang-go, \
             or run `apt-get install golang-go`)",
            source.display()
        )
    });
    assert!(
        output.status.success(),
        "go build {}: {}{}",
        source.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::rename(&own, &done).expect("move the built program into place");
    done
}

/// Run `command` to its end within `timeout`, killing it otherwise.
fn run_bounded(mut command: Command, timeout: Duration) -> Result<Output, String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", command.get_program()))?;
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{:?} still running after {timeout:?}",
                command.get_program()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    })
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write temp file");
    path
}

/// `Ok` with stdout, or `Err` with everything the program said.
fn outcome(output: Output) -> Result<String, String> {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{}", String::from_utf8_lossy(&output.stderr))
            .trim()
            .to_owned())
    }
}

/// `x509.Certificate.Verify` of the first certificate of `chain_pem`, with
/// the others as intermediates, against the CAs of `roots_pem`, for
/// `usage`. `Err` carries Go's error.
pub fn verify(roots_pem: &str, chain_pem: &str, usage: Usage) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut command = Command::new(program());
    command
        .arg("verify")
        .arg("-roots")
        .arg(write(dir.path(), "roots.pem", roots_pem))
        .arg("-chain")
        .arg(write(dir.path(), "chain.pem", chain_pem))
        .args(["-usage", usage.flag()]);
    let stdout = outcome(run_bounded(command, RUN_TIMEOUT)?)?;
    if stdout.trim() == "ok" {
        Ok(())
    } else {
        Err(format!("unexpected output: {stdout}"))
    }
}

/// A client as talosctl connects to `addr` with a talosconfig context's
/// `ca`, `crt` and `key`: `Ok` carries the line apid answered (the roles it
/// read, comma-separated), `Err` Go's error.
pub fn talosctl(addr: SocketAddr, ca_pem: &str, crt_pem: &str, key_pem: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut command = Command::new(program());
    command
        .arg("talosctl")
        .arg("-endpoint")
        .arg(addr.to_string())
        .arg("-ca")
        .arg(write(dir.path(), "ca.pem", ca_pem))
        .arg("-crt")
        .arg(write(dir.path(), "crt.pem", crt_pem))
        .arg("-key")
        .arg(write(dir.path(), "key.pem", key_pem))
        .args(["-timeout", "10s"]);
    outcome(run_bounded(command, RUN_TIMEOUT)?).map(|line| line.trim_end().to_owned())
}

/// What the apid stand-in logged, and a bell rung at each new line.
type Log = Arc<(Mutex<Vec<String>>, Condvar)>;

/// The apid stand-in, serving until dropped.
#[derive(Debug)]
pub struct Apid {
    child: Child,
    addr: SocketAddr,
    log: Log,
    /// Log lines already handed out by [`Apid::next_log_line`].
    read: Mutex<usize>,
    _files: tempfile::TempDir,
}

impl Apid {
    /// Serve with `server_cert_pem` / `server_key_pem`, admitting clients
    /// whose certificates chain to a CA of `client_ca_pem` (`machine.ca`
    /// plus `machine.acceptedCAs`, PEM, one or more).
    pub fn start(server_cert_pem: &str, server_key_pem: &str, client_ca_pem: &str) -> Apid {
        let files = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new(program())
            .arg("apid")
            .args(["-listen", "127.0.0.1:0"])
            .arg("-cert")
            .arg(write(files.path(), "server.crt", server_cert_pem))
            .arg("-key")
            .arg(write(files.path(), "server.key", server_key_pem))
            .arg("-client-ca")
            .arg(write(files.path(), "client-ca.pem", client_ca_pem))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the apid stand-in");
        let log: Log = Arc::default();
        let stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let (lines, bell) = &*sink;
                lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                bell.notify_all();
            }
        });
        let (sender, address) = std::sync::mpsc::channel();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        std::thread::spawn(move || {
            let mut lines = stdout.lines();
            let _ = sender.send(lines.next());
            // Read on, so that nothing it prints later can block it.
            for _ in lines {}
        });
        let mut apid = Apid {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            log,
            read: Mutex::new(0),
            _files: files,
        };
        let first = address.recv_timeout(RUN_TIMEOUT);
        match first {
            Ok(Some(Ok(line))) if line.parse::<SocketAddr>().is_ok() => {
                apid.addr = line.parse().expect("checked");
                apid
            }
            other => panic!(
                "the apid stand-in printed no address ({other:?}): {:?}",
                apid.log_so_far()
            ),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn log_so_far(&self) -> Vec<String> {
        self.log.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The next line apid logged (`admitted: <subject>` or `refused:
    /// <Go's error>`, one per connection), waiting for it up to 10 seconds.
    pub fn next_log_line(&self) -> Option<String> {
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        let (lines, bell) = &*self.log;
        let lines = lines.lock().unwrap_or_else(|e| e.into_inner());
        let (lines, _) = bell
            .wait_timeout_while(lines, Duration::from_secs(10), |lines| lines.len() <= *read)
            .unwrap_or_else(|e| e.into_inner());
        let line = lines.get(*read).cloned();
        if line.is_some() {
            *read += 1;
        }
        line
    }
}

impl Drop for Apid {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// [`serving_certificate`](crate::material::serving_certificate) signed by the CA of `ca_cert_pem` / `ca_key_pem`
/// (a Talos cluster CA from its files).
pub fn server_certificate_from_pem(ca_cert_pem: &str, ca_key_pem: &str) -> (String, String) {
    let ca = talos_sso_server::ca::CertificateAuthority::from_pem(
        ca_cert_pem,
        ca_key_pem,
        "Talos CA",
        Vec::new(),
        OffsetDateTime::now_utc(),
    )
    .expect("load the CA");
    crate::material::serving_certificate(ca.signer(), ca.key())
}
