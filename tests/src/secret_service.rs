//! A real Secret Service for tests: GNOME Keyring on a D-Bus session bus of
//! its own, its login keyring created and unlocked, everything in a folder
//! of its own. Dropping it stops the bus, and the keyring daemon leaves
//! with it. Needs Debian's `dbus-daemon`, `gnome-keyring` and
//! `libsecret-tools` (`secret-tool`, the independent reader).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct SecretService {
    dir: tempfile::TempDir,
    bus: Child,
    address: String,
}

/// How long the keyring may take to come up on the bus.
const START_LIMIT: Duration = Duration::from_secs(20);

impl SecretService {
    pub fn start() -> SecretService {
        let dir = tempfile::tempdir().unwrap();
        let runtime = dir.path().join("run");
        std::fs::create_dir(&runtime).unwrap();
        let socket = runtime.join("bus");
        let mut bus = Command::new("dbus-daemon")
            .args(["--session", "--nofork", "--print-address=1"])
            .arg(format!("--address=unix:path={}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // It says it cannot raise its file limit, which tests do not need.
            .stderr(Stdio::null())
            .spawn()
            .expect("dbus-daemon (Debian's dbus-daemon package)");
        let mut address = String::new();
        BufReader::new(bus.stdout.take().unwrap())
            .read_line(&mut address)
            .unwrap();
        let address = address.trim().to_owned();
        assert!(address.starts_with("unix:"), "dbus-daemon printed {address:?}");
        let service = SecretService { dir, bus, address };
        // --unlock reads the login keyring's password on standard input and
        // creates that keyring; --daemonize returns once it has forked.
        let mut keyring = service
            .command("gnome-keyring-daemon")
            .args(["--unlock", "--components=secrets", "--daemonize"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("gnome-keyring-daemon (Debian's gnome-keyring package)");
        keyring
            .stdin
            .take()
            .unwrap()
            .write_all(b"test-keyring-password")
            .unwrap();
        assert!(keyring.wait().unwrap().success(), "gnome-keyring-daemon started");
        service.wait_until_on_the_bus();
        service
    }

    /// The variables a client needs to find this Secret Service.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("DBUS_SESSION_BUS_ADDRESS", self.address.clone())]
    }

    /// A command run against this Secret Service, with a HOME of its own.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .env("DBUS_SESSION_BUS_ADDRESS", &self.address)
            .env("HOME", self.home())
            .env("XDG_DATA_HOME", self.home().join("data"))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"));
        command
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The secret stored under these attributes, read by `secret-tool`.
    pub fn lookup(&self, attributes: &[(&str, &str)]) -> Option<String> {
        let mut command = self.command("secret-tool");
        command.arg("lookup");
        for (name, value) in attributes {
            command.args([name, value]);
        }
        let output = command
            .stderr(Stdio::null())
            .output()
            .expect("secret-tool (libsecret-tools)");
        output
            .status
            .success()
            .then(|| String::from_utf8(output.stdout).unwrap())
    }

    /// Store a secret under these attributes with `secret-tool`.
    pub fn store(&self, attributes: &[(&str, &str)], secret: &str) {
        let mut command = self.command("secret-tool");
        command.args(["store", "--label=test item"]);
        for (name, value) in attributes {
            command.args([name, value]);
        }
        let mut child = command.stdin(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(secret.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "secret-tool store");
    }

    /// Stop the bus (and with it the keyring): clients find nothing there.
    pub fn stop(&mut self) {
        let _ = self.bus.kill();
        let _ = self.bus.wait();
    }

    fn wait_until_on_the_bus(&self) {
        let started = Instant::now();
        loop {
            let output = self
                .command("dbus-send")
                .args([
                    "--session",
                    "--print-reply",
                    "--dest=org.freedesktop.DBus",
                    "/org/freedesktop/DBus",
                    "org.freedesktop.DBus.NameHasOwner",
                    "string:org.freedesktop.secrets",
                ])
                .output()
                .expect("dbus-send (Debian's dbus-bin package)");
            if String::from_utf8_lossy(&output.stdout).contains("boolean true") {
                return;
            }
            assert!(
                started.elapsed() < START_LIMIT,
                "GNOME Keyring did not take org.freedesktop.secrets within {START_LIMIT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for SecretService {
    fn drop(&mut self) {
        self.stop();
    }
}
