//! A Postgres cluster of the scenarios' own, restarted and stopped at will.

use std::path::Path;
use std::process::Command;

use super::{free_port, run};

/// Where Debian puts the Postgres 15 server programs.
pub const POSTGRES_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A Postgres cluster of its own (never the shared one): initdb in a temp
/// directory, run as the `postgres` user, on a free port, trust auth on
/// loopback, `fsync` and `synchronous_commit` on. Stopped when dropped.
#[derive(Debug)]
pub struct PostgresCluster {
    dir: tempfile::TempDir,
    pub port: u16,
}

impl PostgresCluster {
    pub fn start() -> Result<Self, String> {
        let bin = Path::new(POSTGRES_BIN);
        if !bin.join("pg_ctl").exists() {
            return Err(format!(
                "these fault scenarios need the Postgres 15 server programs in {POSTGRES_BIN} \
                 (apt-get install postgresql-15)"
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("talos-sso-faults-pg")
            .tempdir()
            .map_err(|e| e.to_string())?;
        run(Command::new("chown").arg("postgres:postgres").arg(dir.path()))
            .map_err(|e| format!("the cluster runs as user postgres, so this needs root: {e}"))?;
        let cluster = Self {
            port: free_port()?,
            dir,
        };
        cluster.as_postgres(
            "initdb",
            &[
                "-D",
                &cluster.data(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        )?;
        cluster.start_again()?;
        Ok(cluster)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn as_postgres(&self, program: &str, args: &[&str]) -> Result<String, String> {
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(Path::new(POSTGRES_BIN).join(program))
            .args(args))
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<String, String> {
        let log = self.dir.path().join("postgres.log").display().to_string();
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=on -c synchronous_commit=on",
            self.port,
            self.dir.path().display()
        );
        let data = self.data();
        let mut all = vec!["-D", &data, "-l", &log, "-o", &options];
        all.extend_from_slice(args);
        self.as_postgres("pg_ctl", &all)
    }

    /// Start (again) and wait until it accepts connections.
    pub fn start_again(&self) -> Result<(), String> {
        self.pg_ctl(&["-w", "-t", "60", "start"]).map(|_| ())
    }

    /// Restart: `mode` is `fast` (cut sessions, clean shutdown) or
    /// `immediate` (crash, recovery from the WAL at start).
    pub fn restart(&self, mode: &str) -> Result<(), String> {
        self.pg_ctl(&["-w", "-t", "60", "-m", mode, "restart"])
            .map(|_| ())
    }

    pub fn stop(&self, mode: &str) -> Result<(), String> {
        self.pg_ctl(&["-w", "-t", "60", "-m", mode, "stop"]).map(|_| ())
    }

    /// The `postgres` database of this cluster.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for PostgresCluster {
    fn drop(&mut self) {
        let _ = self.stop("immediate");
    }
}
