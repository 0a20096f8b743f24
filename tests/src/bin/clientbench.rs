//! `clientbench`: what a person waits for. The wall time of `talos-sso login`
//! with a cached refresh token (no browser) against a local server and the
//! emulator, median of 20 runs; the client binary's size; its start-up time
//! for `--help`, median of 20 runs.
//!
//! ```sh
//! cargo run --release -p talos-sso-tests --bin clientbench
//! ```

// Measurement tooling: a broken setup should stop the run loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::time::{Duration, Instant};

use talos_sso_tests::harness::{Backend, TestEnv};
use talos_sso_tests::quickstart::{QuickstartOptions, client_binary, demo_login};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let client = client_binary().expect("client binary");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let env = TestEnv::start(Backend::Sqlite).await;
        let dir = tempfile::tempdir().unwrap();
        let options = QuickstartOptions {
            dir: dir.path().to_owned(),
            client: client.clone(),
            emulator_port: 0,
            server_port: 0,
            once: true,
        };
        let talosconfig = dir.path().join("talosconfig");
        env.emulator.set_auto_login(Some("bob@example.com"));
        demo_login(&options, &env.server.base_url, &talosconfig, "bob")
            .await
            .expect("first login");
        env.emulator.set_auto_login(None);

        let mut logins = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            let status = tokio::process::Command::new(&client)
                .args(["login", "--no-browser", "--talosconfig"])
                .arg(&talosconfig)
                .env("XDG_CONFIG_HOME", dir.path().join("bob/config"))
                .env("XDG_CACHE_HOME", dir.path().join("bob/cache"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .await
                .unwrap();
            logins.push(started.elapsed());
            assert!(status.success(), "silent login failed");
        }
        let mut helps = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            let status = std::process::Command::new(&client)
                .arg("--help")
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            helps.push(started.elapsed());
            assert!(status.success());
        }
        let size = std::fs::metadata(&client).unwrap().len();
        println!("client: {}", client.display());
        println!(
            "login with a cached refresh token, median of 20: {:.1} ms",
            median(logins).as_secs_f64() * 1000.0
        );
        println!("binary size: {:.1} MiB ({size} bytes)", size as f64 / 1048576.0);
        println!(
            "start-up for --help, median of 20: {:.2} ms",
            median(helps).as_secs_f64() * 1000.0
        );
        env.finish().await;
    });
}
