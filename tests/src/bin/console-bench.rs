//! `console-bench`: how long each console page takes, over HTTP, on a
//! large trail (made by `seed-audit`). A real server on that database with
//! the console on, the Entra emulator for the login; an auditor signs in,
//! then each page is fetched `--repeat` times in turn, the body read whole,
//! and its p50, p95 and slowest are printed as a table (docs/evidence/performance.md,
//! "Console"). The first fetch of each page writes its `audit.query`
//! record, as it would for a person.
//!
//! ```sh
//! cargo run --release -p talos-sso-tests --bin console-bench -- \
//!     --database postgres://postgres@127.0.0.1:5432/audit_big --repeat 20
//! ```
//! Options: `--repeat N` (20), `--chain yes` to time the full chain
//! verification too (`/ui/chain`, reloaded until it has the answer). The database gains the
//! console's own records (a few dozen).

// A command-line tool: a broken setup should stop the run loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::time::{Duration, Instant};

use talos_sso_server::audit::store::AuditFilter;
use talos_sso_server::config::Config;
use talos_sso_tests::console_client::Browserless;
use talos_sso_tests::emulator::{EmulatorConfig, EmulatorHandle};
use talos_sso_tests::harness::{TestServer, Workdir, config_yaml};
use talos_sso_tests::load::percentile;

struct Options {
    database: String,
    repeat: usize,
    chain: bool,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        database: String::new(),
        repeat: 20,
        chain: false,
    };
    for (flag, value) in talos_sso_tests::load::flag_pairs()? {
        match flag.as_str() {
            "--database" => options.database = value,
            "--repeat" => options.repeat = value.parse().map_err(|_| "--repeat takes a number")?,
            "--chain" => options.chain = value == "yes",
            other => return Err(format!("unknown option {other}")),
        }
    }
    if options.database.is_empty() {
        return Err("--database URL is required (a trail made by seed-audit)".into());
    }
    Ok(options)
}

fn enc(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

fn main() {
    let options = options().unwrap_or_else(|e| {
        eprintln!("console-bench: {e}");
        std::process::exit(2);
    });
    let runtime = talos_sso_tests::load::runtime().unwrap();
    runtime.block_on(run(options));
}

async fn run(options: Options) {
    let emulator = EmulatorHandle::start(EmulatorConfig::default())
        .await
        .expect("emulator");
    let work = Workdir::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let yaml = config_yaml(&emulator, &work, &options.database)
        .replace(
            "listen: \"127.0.0.1:0\"",
            &format!("listen: \"127.0.0.1:{port}\""),
        )
        .replace("acquire_timeout: 2s", "acquire_timeout: 10s");
    let yaml = format!("{yaml}\nconsole: {{ enabled: true, public_url: \"http://127.0.0.1:{port}\" }}\n");
    let server = TestServer::start(Config::from_yaml(&yaml).expect("config")).await;
    let base = server.base_url.clone();
    let store = server.app.audit.store();
    let (last_seq, _) = store.head().await.expect("the trail");
    // The people, serial, cluster and address asked about come from the trail.
    let sample = store
        .query_newest_first(
            &AuditFilter {
                event: Some("certificate.issued".into()),
                role: Some("os:admin".into()),
                limit: 1,
                ..AuditFilter::default()
            },
            None,
        )
        .await
        .expect("the trail")
        .pop()
        .expect("an os:admin certificate in the trail");
    let user = enc(sample.record.username.as_deref().unwrap_or_default());
    let serial = sample.record.serial.clone().unwrap_or_default();
    let cluster = enc(sample.record.cluster.as_deref().unwrap_or_default());
    let address = sample.record.client_ip.clone().unwrap_or_default();
    let middle = last_seq / 2;
    println!(
        "trail: {last_seq} records; asking about {user}, serial {serial}, cluster {cluster}, address {address}"
    );

    let mut browser = Browserless::new();
    browser.login(&base, "sam@example.com", "/ui").await;
    let pages: Vec<(&str, String)> = vec![
        ("trail, no filter", "/ui".into()),
        ("trail, user U", format!("/ui?username={user}")),
        (
            "trail, user U, role os:admin",
            format!("/ui?username={user}&role=os%3Aadmin"),
        ),
        (
            "trail, cluster C, role os:admin, since 7d",
            format!("/ui?cluster={cluster}&role=os%3Aadmin&since=7d"),
        ),
        (
            "trail, outcome denied, since 7d",
            "/ui?outcome=denied&since=7d".into(),
        ),
        ("trail, event deny.added", "/ui?event=deny.added".into()),
        (
            "trail, event certificate.denied, since 30d",
            "/ui?event=certificate.denied&since=30d".into(),
        ),
        ("trail, serial S", format!("/ui?serial={serial}")),
        ("trail, client address A", format!("/ui?client_ip={address}")),
        ("trail, older page far back", format!("/ui?before={middle}")),
        (
            "trail, older page far back, role os:admin",
            format!("/ui?role=os%3Aadmin&before={middle}"),
        ),
        (
            "record (full detail, chain position)",
            format!("/ui/records/{}", sample.seq),
        ),
        ("person U", format!("/ui/person?username={user}")),
        (
            "who held os:admin on C, last 24 h",
            format!("/ui/held?role=os%3Aadmin&cluster={cluster}&since=24h"),
        ),
        ("charts, per hour, 2 days", "/ui/charts?since=2d&by=hour".into()),
        ("charts, per day, 30 days", "/ui/charts?since=30d".into()),
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); pages.len()];
    for _ in 0..options.repeat {
        for (i, (name, path)) in pages.iter().enumerate() {
            let started = Instant::now();
            let response = browser.get(&format!("{base}{path}")).await;
            let status = response.status();
            let body = response.text().await.expect("a page");
            times[i].push(started.elapsed());
            assert!(status.is_success(), "{name}: {status}\n{body}");
            assert!(
                !body.contains("Sign in with your company account"),
                "{name}: signed out"
            );
        }
    }
    println!("\n| page | p50 ms | p95 ms | slowest ms |\n|---|---:|---:|---:|");
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
    for (i, (name, _)) in pages.iter().enumerate() {
        let mut sorted = times[i].clone();
        sorted.sort();
        println!(
            "| {name} | {} | {} | {} |",
            ms(percentile(&sorted, 0.5)),
            ms(percentile(&sorted, 0.95)),
            ms(*sorted.last().unwrap())
        );
    }
    if options.chain {
        // The page answers within seconds; a long verification runs on and
        // the page says so: poll until it has the answer.
        let started = Instant::now();
        let (mut first, mut polls) = (None, 0);
        let verdict = loop {
            let asked = Instant::now();
            let body = browser
                .get(&format!("{base}/ui/chain"))
                .await
                .text()
                .await
                .expect("the chain page");
            first.get_or_insert(asked.elapsed());
            polls += 1;
            if body.contains("The chain verifies.") && !body.contains("is still running") {
                break "intact";
            }
            if body.contains("VERIFICATION FAILED.") && !body.contains("is still running") {
                break "NOT intact";
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        println!(
            "\nchain verification: {verdict} after {} ms ({polls} loads of /ui/chain; the first answered in {} ms)",
            ms(started.elapsed()),
            ms(first.unwrap_or_default())
        );
    }
    server.stop().await;
}
