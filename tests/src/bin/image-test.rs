//! `image-test`: the server's container image, built with Podman from a
//! release archive and `deploy/Dockerfile` (the file users build, with its
//! base image replaced by one assembled here from this machine's glibc and
//! CA bundle: no image can be pulled), then run as production runs it:
//! `--version`, `ca new`, and `serve` with a mounted configuration on a
//! read-only root filesystem as uid 65532, until `/healthz` and `/readyz`
//! answer 200 (the identity provider's keys fetched, the database open, the
//! CA able to sign). Prints the image's size. Needs root and Debian's
//! `podman` and `runc`.
//!
//! ```sh
//! release/build.sh --only server
//! cargo run -p talos-sso-tests --bin image-test -- target/release-out/talos-sso-server-*.tar.gz
//! ```

// Test tooling: a broken step should stop the run loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use talos_sso_tests::emulator::{CLI_CLIENT_ID, EmulatorConfig, EmulatorHandle, GROUP_ONCALL, TENANT_ID};

/// The non-root user of distroless images, and of ours.
const NONROOT: u32 = 65532;

/// The architecture of this machine, as container platforms name it (the
/// release binary tested is this machine's).
const ARCH: &str = if cfg!(target_arch = "aarch64") {
    "arm64"
} else {
    "amd64"
};

/// How long the server may take to become ready.
const READY_LIMIT: Duration = Duration::from_secs(60);

fn main() {
    let archive = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .expect("usage: image-test talos-sso-server-VERSION-TARGET.tar.gz");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned();
    let work = tempfile::tempdir().unwrap();
    let podman = Podman::new(work.path());
    let tag = format!("{}", std::process::id());

    let (binary, version) = unpack(&archive, &work.path().join("archive"));
    // The layout the release workflow gives buildx: ARCH/talos-sso-server.
    let context = work.path().join("context");
    std::fs::create_dir_all(context.join(ARCH)).unwrap();
    std::fs::copy(&binary, context.join(ARCH).join("talos-sso-server")).unwrap();

    let base = format!("localhost/talos-sso-test-runtime:{tag}");
    podman.import_base(&binary, &work.path().join("base"), &base);
    let image = format!("localhost/talos-sso-server:test-{tag}");
    // The commit the archive's binary was built from, as it says itself.
    let revision = built_from(&binary);
    let built = Instant::now();
    podman.run_ok(&[
        "build",
        "--quiet",
        "--file",
        repo.join("deploy/Dockerfile").to_str().unwrap(),
        "--target",
        "server",
        "--build-arg",
        &format!("RUNTIME_IMAGE={base}"),
        "--build-arg",
        "SERVER_FROM=release-binary",
        "--build-arg",
        &format!("TARGETARCH={ARCH}"),
        "--build-arg",
        &format!("VERSION={version}"),
        "--build-arg",
        &format!("REVISION={revision}"),
        "--tag",
        &image,
        context.to_str().unwrap(),
    ]);
    println!(
        "built {image} from {} in {:.1} s",
        archive.display(),
        built.elapsed().as_secs_f64()
    );
    let size: u64 = podman
        .output(&["image", "inspect", "--format", "{{.Size}}", &image])
        .trim()
        .parse()
        .unwrap();
    let labels = podman.output(&["image", "inspect", "--format", "{{json .Labels}}", &image]);
    let labels: serde_json::Value = serde_json::from_str(&labels).unwrap();
    assert_eq!(
        labels["org.opencontainers.image.version"],
        version.as_str(),
        "{labels}"
    );
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        revision.as_str(),
        "{labels}"
    );
    assert_eq!(
        labels["org.opencontainers.image.licenses"], "Apache-2.0",
        "{labels}"
    );
    let user = podman.output(&["image", "inspect", "--format", "{{.Config.User}}", &image]);
    assert_eq!(user.trim(), format!("{NONROOT}:{NONROOT}"));

    // --version, as the image's own user, on a read-only root.
    let said = podman.output(&["run", "--rm", "--read-only", &image, "--version"]);
    let expected = format!("talos-sso-server {version} (commit {revision})");
    assert_eq!(said.trim(), expected);
    println!("{expected}");

    // A CA made by the image itself, into a folder it may write.
    let config_dir = work.path().join("config");
    let data_dir = work.path().join("data");
    for dir in [&config_dir, &data_dir] {
        std::fs::create_dir(dir).unwrap();
        std::os::unix::fs::chown(dir, Some(NONROOT), Some(NONROOT)).unwrap();
    }
    let config_mount = format!("{}:/etc/talos-sso", config_dir.display());
    podman.run_ok(&[
        "run",
        "--rm",
        "--read-only",
        "--volume",
        &config_mount,
        &image,
        "ca",
        "new",
        "--out-cert",
        "/etc/talos-sso/talos-ca.crt",
        "--out-key",
        "/etc/talos-sso/talos-ca.key",
    ]);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let emulator = EmulatorHandle::start(EmulatorConfig::default()).await.unwrap();
        let port = free_port();
        std::fs::write(config_dir.join("config.yaml"), config(&emulator, port)).unwrap();
        let name = format!("talos-sso-image-test-{tag}");
        let data_mount = format!("{}:/var/lib/talos-sso", data_dir.display());
        let config_mount = format!("{}:/etc/talos-sso:ro", config_dir.display());
        podman.run_ok(&[
            "run",
            "--detach",
            "--name",
            &name,
            "--read-only",
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            "--network=host",
            "--volume",
            &config_mount,
            "--volume",
            &data_mount,
            &image,
        ]);
        let server = format!("http://127.0.0.1:{port}");
        let outcome = wait_ready(&server).await;
        let logs = podman.output_lossy(&["logs", &name]);
        let top = podman.output_lossy(&["top", &name, "uid", "comm"]);
        let read_only =
            podman.output_lossy(&["inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", &name]);
        podman.run_ok(&["stop", "--time", "10", &name]);
        let exit = podman.output_lossy(&["inspect", "--format", "{{.State.ExitCode}}", &name]);
        podman.run_ok(&["rm", &name]);
        if let Err(error) = outcome {
            panic!("{error}\n--- server log ---\n{logs}");
        }
        println!("serve on a read-only root as uid {NONROOT}: /healthz and /readyz answered 200");
        assert_eq!(read_only.trim(), "true");
        assert!(
            top.lines()
                .skip(1)
                .all(|line| line.split_whitespace().next() == Some("65532")),
            "every process runs as 65532: {top}"
        );
        assert_eq!(exit.trim(), "0", "a stop is a clean exit: {logs}");
        // The audit store was made on the data volume, as the image's user.
        let store = std::fs::metadata(data_dir.join("audit.db")).expect("audit.db on the data volume");
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&store), NONROOT);
    });

    println!(
        "image size: {:.1} MiB ({size} bytes); the binary: {:.1} MiB",
        size as f64 / 1048576.0,
        std::fs::metadata(&binary).unwrap().len() as f64 / 1048576.0
    );
    podman.run_ok(&["rmi", &image, &base]);
}

/// The server binary and the version, from `talos-sso-server-VERSION-TARGET.tar.gz`.
fn unpack(archive: &Path, into: &Path) -> (PathBuf, String) {
    std::fs::create_dir_all(into).unwrap();
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .status()
        .unwrap();
    assert!(status.success(), "unpacking {}", archive.display());
    let folder = std::fs::read_dir(into).unwrap().next().unwrap().unwrap();
    let name = folder.file_name().to_string_lossy().into_owned();
    let version = name
        .strip_prefix("talos-sso-server-")
        .and_then(|rest| rest.split('-').next())
        .unwrap_or_else(|| panic!("{name} is not talos-sso-server-VERSION-TARGET"))
        .to_owned();
    (folder.path().join("talos-sso-server"), version)
}

/// The commit in `BINARY --version` (`talos-sso-server VERSION (commit SHA)`).
fn built_from(binary: &Path) -> String {
    let output = Command::new(binary).arg("--version").output().unwrap();
    let said = String::from_utf8(output.stdout).unwrap();
    said.trim()
        .strip_suffix(')')
        .and_then(|rest| rest.rsplit_once("(commit "))
        .map(|(_, commit)| commit.to_owned())
        .unwrap_or_else(|| panic!("{} --version says {said:?}", binary.display()))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A configuration as an operator would mount it: SQLite under the data
/// volume, the emulator as the identity provider, the CA the image made.
fn config(emulator: &EmulatorHandle, port: u16) -> String {
    format!(
        r#"listen: "127.0.0.1:{port}"
insecure_http: true
data_dir: /var/lib/talos-sso
identity:
  kind: entra
  issuer: "{issuer}"
  client_id: "{CLI_CLIENT_ID}"
  allowed_tenants: ["{TENANT_ID}"]
clusters:
  prod:
    ca: {{ cert_file: /etc/talos-sso/talos-ca.crt, key_file: /etc/talos-sso/talos-ca.key }}
    endpoints: ["127.0.0.1"]
    rules:
      - {{ groups: ["{GROUP_ONCALL}"], roles: [os:operator] }}
"#,
        issuer = emulator.issuer(),
    )
}

/// Until `/healthz` and `/readyz` both answer 200, within [`READY_LIMIT`].
async fn wait_ready(server: &str) -> Result<(), String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let started = Instant::now();
    let mut last = String::from("no answer yet");
    while started.elapsed() < READY_LIMIT {
        let mut all = true;
        for path in ["/healthz", "/readyz"] {
            match http.get(format!("{server}{path}")).send().await {
                Ok(answer) if answer.status() == 200 => {}
                Ok(answer) => {
                    all = false;
                    last = format!(
                        "{path}: {} {}",
                        answer.status(),
                        answer.text().await.unwrap_or_default()
                    );
                }
                Err(error) => {
                    all = false;
                    last = format!("{path}: {error}");
                }
            }
        }
        if all {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("not ready within {READY_LIMIT:?}; last: {last}"))
}

/// Podman with a configuration of this run's own: runc, cgroupfs, and no
/// default ulimits (which an unprivileged sandbox cannot raise).
struct Podman {
    config: PathBuf,
}

impl Podman {
    fn new(work: &Path) -> Self {
        let config = work.join("containers.conf");
        std::fs::write(
            &config,
            "[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\n",
        )
        .unwrap();
        Self { config }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("podman");
        command.env("CONTAINERS_CONF", &self.config).args(args);
        command
    }

    fn run_ok(&self, args: &[&str]) {
        let status = self
            .command(args)
            .stdout(Stdio::null())
            .status()
            .expect("podman (Debian's podman and runc packages)");
        assert!(status.success(), "podman {}", args.join(" "));
    }

    fn output(&self, args: &[&str]) -> String {
        let output = self.command(args).output().expect("podman");
        assert!(
            output.status.success(),
            "podman {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    fn output_lossy(&self, args: &[&str]) -> String {
        let output = self.command(args).output().expect("podman");
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
    }

    /// A stand-in for distroless/cc: the shared libraries `binary` needs,
    /// this machine's CA bundle, `/etc/passwd` with the nonroot user, and
    /// a writable `/tmp`; imported as `tag`.
    fn import_base(&self, binary: &Path, root: &Path, tag: &str) {
        let ldd = Command::new("ldd").arg(binary).output().unwrap();
        assert!(ldd.status.success(), "ldd {}", binary.display());
        let libraries: Vec<PathBuf> = String::from_utf8(ldd.stdout)
            .unwrap()
            .split_whitespace()
            .filter(|word| word.starts_with('/'))
            .map(PathBuf::from)
            .collect();
        assert!(!libraries.is_empty(), "a dynamically linked binary");
        for library in libraries {
            let inside = root.join(library.strip_prefix("/").unwrap());
            std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
            std::fs::copy(&library, &inside).unwrap();
        }
        let certs = root.join("etc/ssl/certs");
        std::fs::create_dir_all(&certs).unwrap();
        std::fs::copy(
            "/etc/ssl/certs/ca-certificates.crt",
            certs.join("ca-certificates.crt"),
        )
        .unwrap();
        std::fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
        )
        .unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n").unwrap();
        let home = root.join("home/nonroot");
        std::fs::create_dir_all(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(NONROOT), Some(NONROOT)).unwrap();
        let tmp = root.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
        let mut tar = Command::new("tar")
            .args(["--numeric-owner", "-C"])
            .arg(root)
            .args(["-cf", "-", "."])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let imported = self
            .command(&["import", "--quiet", "-", tag])
            .stdin(tar.stdout.take().unwrap())
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(tar.wait().unwrap().success(), "tar of the base");
        assert!(imported.success(), "podman import");
    }
}
