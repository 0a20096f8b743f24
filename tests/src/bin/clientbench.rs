//! `clientbench`: what a person waits for, and what the watch costs.
//!
//! - The wall time of a silent `talos-sso login` (a cached refresh token,
//!   no browser), median of 20, against a local server with the emulator
//!   and with a real OpenID Provider (oidc-provider under Node.js).
//! - The client binary's size, and its start-up time for `--help`.
//! - `talos-sso watch` left alone for `--watch-minutes` (default 10) on
//!   five-minute certificates, against each provider: CPU time, wake-ups
//!   (times put on a CPU) and renewals, from the kernel's account of each
//!   thread (`/proc/PID/task/*/schedstat`).
//!
//! ```sh
//! cargo run --release -p talos-sso-tests --bin clientbench
//! cargo run --release -p talos-sso-tests --bin clientbench -- --client OTHER/talos-sso --watch-minutes 0
//! cargo run --release -p talos-sso-tests --bin clientbench -- --token-store keyring --watch-minutes 0
//! ```

// Measurement tooling: a broken setup should stop the run loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use talos_sso_tests::harness::{Backend, TestEnv};
use talos_sso_tests::quickstart::{QuickstartOptions, client_binary, demo_login};
use talos_sso_tests::real_op::{ONCALL_USER, RealOpEnv};
use talos_sso_tests::secret_service::SecretService;

#[derive(Debug, Parser)]
struct Args {
    /// The `talos-sso` binary to measure (default: this build's).
    #[arg(long)]
    client: Option<PathBuf>,
    /// How long each watch is left alone; 0 skips the watch.
    #[arg(long, default_value_t = 10)]
    watch_minutes: u64,
    /// Extra arguments for each silent login (e.g. `--debug`).
    #[arg(long = "login-arg", allow_hyphen_values = true)]
    login_args: Vec<String>,
    /// Where the saved logins are: `file`, or `keyring` (a GNOME Keyring
    /// of the run's own, on a private D-Bus).
    #[arg(long, default_value = "file")]
    token_store: String,
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// A person's folders, as the quick start's demo users have them.
struct Person {
    root: PathBuf,
    /// The token store's variables (`TALOS_SSO_TOKEN_STORE`, the bus).
    env: Vec<(&'static str, String)>,
}

impl Person {
    fn talosconfig(&self) -> PathBuf {
        self.root.join("talosconfig")
    }

    fn command(&self, client: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(client);
        command
            .args(args)
            .env("HOME", self.root.join("home"))
            .env("XDG_CONFIG_HOME", self.root.join("config"))
            .env("XDG_CACHE_HOME", self.root.join("cache"))
            .env("TALOSCONFIG", self.talosconfig())
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null());
        command
    }
}

/// 20 silent logins, each in a new second (`pause`), so that a provider
/// whose tokens carry no id never answers with the token of the run before
/// (the CLI would then wait for the next second, which is not what is
/// measured here).
fn silent_logins(client: &Path, person: &Person, extra: &[String], pause: Duration) -> Duration {
    let mut samples = Vec::new();
    for _ in 0..20 {
        std::thread::sleep(pause);
        let mut args = vec!["login", "--no-browser"];
        args.extend(extra.iter().map(String::as_str));
        let started = Instant::now();
        let output = person.command(client, &args).output().unwrap();
        samples.push(started.elapsed());
        assert!(
            output.status.success(),
            "silent login failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    median(samples)
}

/// What the kernel counted for a process so far: time on a CPU and times
/// it was put on one (wake-ups), summed over its threads
/// (`/proc/PID/task/*/schedstat`), and its CPU time in clock ticks from
/// `/proc/PID/stat`, which also counts threads that have ended.
#[derive(Debug, Clone, Copy, Default)]
struct Account {
    on_cpu: Duration,
    wakeups: u64,
    ticks: u64,
    threads: usize,
}

impl Account {
    fn of(pid: u32) -> Self {
        let mut account = Account::default();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let text = std::fs::read_to_string(task.unwrap().path().join("schedstat")).unwrap();
            let fields: Vec<u64> = text.split_whitespace().map(|f| f.parse().unwrap()).collect();
            account.on_cpu += Duration::from_nanos(fields[0]);
            account.wakeups += fields[2];
            account.threads += 1;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // After the command name in parentheses: utime and stime are the
        // 12th and 13th fields.
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        account.ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        account
    }

    fn since(self, start: Account) -> Account {
        Account {
            on_cpu: self.on_cpu.saturating_sub(start.on_cpu),
            wakeups: self.wakeups - start.wakeups,
            ticks: self.ticks - start.ticks,
            threads: self.threads,
        }
    }
}

/// A `talos-sso watch` left alone until [`RunningWatch::stop`].
struct RunningWatch {
    child: std::process::Child,
    started: Account,
    renewals: std::thread::JoinHandle<usize>,
}

impl RunningWatch {
    fn start(client: &Path, person: &Person) -> Self {
        let mut child = person
            .command(client, &["watch"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (started, watching) = std::sync::mpsc::channel();
        let renewals = std::thread::spawn(move || {
            let mut renewals = 0;
            for line in stdout.lines() {
                let line = line.unwrap();
                if line.contains(" watching ") {
                    let _ = started.send(());
                }
                if line.contains(" renewed ") {
                    renewals += 1;
                }
            }
            renewals
        });
        watching
            .recv_timeout(Duration::from_secs(30))
            .expect("the watch started");
        let started = Account::of(child.id());
        Self {
            child,
            started,
            renewals,
        }
    }

    /// The start-up's account, and the account since.
    fn stop(mut self) -> (Account, Account, usize) {
        let now = Account::of(self.child.id());
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        (
            self.started,
            now.since(self.started),
            self.renewals.join().unwrap(),
        )
    }
}

fn report_watch(provider: &str, minutes: u64, (start, idle, renewals): (Account, Account, usize)) {
    let per = |x: f64| x / renewals.max(1) as f64;
    println!(
        "watch on {provider}: start-up {:.1} ms on CPU, {} wake-ups; then {minutes} idle minutes: \
         {renewals} renewals, {:.1} ms on CPU ({:.1} ms a renewal; {} clock ticks by /proc/PID/stat), \
         {} wake-ups ({:.1} a renewal), {} thread(s)",
        ms(start.on_cpu),
        start.wakeups,
        ms(idle.on_cpu),
        per(ms(idle.on_cpu)),
        idle.ticks,
        idle.wakeups,
        per(idle.wakeups as f64),
        idle.threads
    );
}

/// Log `user` in at the real provider by browser, with the test browser.
async fn real_op_login(env: &RealOpEnv, client: &Path, person: &Person, user: &str) {
    let mut child = tokio::process::Command::from(person.command(
        client,
        &["login", "--server", &env.server.base_url, "--no-browser"],
    ))
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stderr.take().unwrap()));
    let url = loop {
        let line = lines.next_line().await.unwrap().expect("the login URL");
        if line.trim().starts_with("http") {
            break line.trim().to_owned();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    env.op.browser(user).visit(&url).await;
    assert!(
        child.wait().await.unwrap().success(),
        "browser login at the provider"
    );
}

fn person(dir: &Path, name: &str, keyring: Option<&SecretService>) -> Person {
    let root = dir.join(name);
    std::fs::create_dir_all(root.join("home")).unwrap();
    let mut env = vec![("TALOS_SSO_TOKEN_STORE", "file".to_owned())];
    if let Some(keyring) = keyring {
        env = keyring.env();
        env.push(("TALOS_SSO_TOKEN_STORE", "keyring".to_owned()));
    }
    Person { root, env }
}

fn main() {
    let args = Args::parse();
    let client = args
        .client
        .clone()
        .unwrap_or_else(|| client_binary().expect("client binary"));
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
        // The folders demo_login gives bob.
        let keyring = match args.token_store.as_str() {
            "file" => None,
            "keyring" => Some(SecretService::start()),
            other => panic!("--token-store {other}: keyring or file"),
        };
        let bob = person(dir.path(), "bob", keyring.as_ref());
        env.emulator.set_auto_login(Some("bob@example.com"));
        demo_login(&options, &env.server.base_url, &bob.talosconfig(), "bob")
            .await
            .expect("first login");
        env.emulator.set_auto_login(None);
        let (client2, bob2, extra) = (client.clone(), bob, args.login_args.clone());
        let (emulator_login, bob) = tokio::task::spawn_blocking(move || {
            (silent_logins(&client2, &bob2, &extra, Duration::ZERO), bob2)
        })
        .await
        .unwrap();

        let op_env = RealOpEnv::start("id_token").await;
        let op_bob = person(dir.path(), "op-bob", keyring.as_ref());
        real_op_login(&op_env, &client, &op_bob, ONCALL_USER).await;
        let (client2, extra) = (client.clone(), args.login_args.clone());
        let (op_login, op_bob) = tokio::task::spawn_blocking(move || {
            let pause = Duration::from_millis(1100);
            (silent_logins(&client2, &op_bob, &extra, pause), op_bob)
        })
        .await
        .unwrap();

        let mut helps = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            let status = Command::new(&client)
                .arg("--help")
                .stdout(Stdio::null())
                .status()
                .unwrap();
            helps.push(started.elapsed());
            assert!(status.success());
        }
        let size = std::fs::metadata(&client).unwrap().len();
        println!("client: {}", client.display());
        println!("token store: {}", args.token_store);
        println!(
            "silent login (cached refresh token) with the emulator, median of 20: {:.1} ms",
            ms(emulator_login)
        );
        println!(
            "silent login (cached refresh token) with oidc-provider, median of 20: {:.1} ms",
            ms(op_login)
        );
        println!("binary size: {:.1} MiB ({size} bytes)", size as f64 / 1048576.0);
        println!("start-up for --help, median of 20: {:.2} ms", ms(median(helps)));

        if args.watch_minutes > 0 {
            let emulator_watch = RunningWatch::start(&client, &bob);
            let op_watch = RunningWatch::start(&client, &op_bob);
            tokio::time::sleep(Duration::from_secs(60 * args.watch_minutes)).await;
            report_watch("the emulator", args.watch_minutes, emulator_watch.stop());
            report_watch("oidc-provider", args.watch_minutes, op_watch.stop());
        }
        op_env.finish().await;
        env.finish().await;
    });
}
