//! `gateway-bench`: what the access gateway adds to a Talos API call, on
//! loopback, against the gRPC stand-in apid, with a tonic client.
//!
//! - Unary latency, p50 and p99, through the gateway and straight to apid:
//!   a read-only method (`Version`, counted per minute) and a mutating one
//!   (`Reboot`, which waits for its record to commit before it is
//!   forwarded).
//! - Streaming throughput: `Read` (one 32 MiB message) repeated, MB/s, and
//!   the CPU time of the whole process (client, gateway, stand-in) per MB;
//!   what the gateway costs is the difference between the two paths.
//!
//! ```sh
//! cargo run --release -p talos-sso-tests --bin gateway-bench
//! cargo run --release -p talos-sso-tests --bin gateway-bench -- --postgres --calls 5000
//! ```

// Measurement tooling: a broken setup should stop the run loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use talos_sso::key::ClientKey;
use talos_sso_server::ca::CertificateAuthority;
use talos_sso_server::certificate::{LeafRequest, sign_leaf};
use talos_sso_tests::emulator::TokenKind;
use talos_sso_tests::gateway_files::GatewayFiles;
use talos_sso_tests::grpc_client::{Call, GrpcClient, TalosContext};
use talos_sso_tests::harness::{Backend, TestEnv};
use talos_sso_tests::load::percentile;
use talos_sso_tests::standin_apid::{StandinApid, proto};

#[derive(Debug, Parser)]
struct Args {
    /// Unary calls per method and path (after as many again to warm up).
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// 32 MiB reads per path.
    #[arg(long, default_value_t = 20)]
    reads: usize,
    /// The trail in Postgres (`DATABASE_URL`) rather than SQLite.
    #[arg(long)]
    postgres: bool,
}

/// CPU time of this process so far (user + system), from /proc.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // The kernel's USER_HZ, 100 on Linux.
    Duration::from_millis(ticks * 10)
}

async fn unary(client: &GrpcClient, method: &str, calls: usize) -> (f64, f64) {
    for _ in 0..calls {
        assert!(client.call(&Call::unary(method)).await.ok());
    }
    let mut took = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        let outcome = client.call(&Call::unary(method)).await;
        took.push(started.elapsed());
        assert!(outcome.ok(), "{outcome:?}");
    }
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (ms(percentile(&took, 0.50)), ms(percentile(&took, 0.99)))
}

async fn reads(client: &GrpcClient, reads: usize) -> (f64, f64) {
    assert!(client.call(&Call::server_stream(proto::READ, None)).await.ok());
    let (cpu, started) = (cpu_time(), Instant::now());
    let mut bytes = 0usize;
    for _ in 0..reads {
        let outcome = client.call(&Call::server_stream(proto::READ, None)).await;
        assert!(outcome.ok(), "{outcome:?}");
        bytes += outcome.sizes.iter().sum::<usize>();
    }
    let megabytes = bytes as f64 / 1e6;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_ms_per_mb = (cpu_time() - cpu).as_secs_f64() * 1000.0 / megabytes;
    (megabytes / seconds, cpu_ms_per_mb)
}

/// `user`'s context through the gateway (a certificate from the API with
/// `role`), and one with the same key and role straight to apid (signed by
/// the Talos CA, as a long-lived talosconfig is).
async fn contexts(
    env: &TestEnv,
    files: &GatewayFiles,
    talos_ca: &CertificateAuthority,
    gateway: std::net::SocketAddr,
    upstream: std::net::SocketAddr,
    user: &str,
    role: &str,
) -> (TalosContext, TalosContext) {
    let key = ClientKey::generate().unwrap();
    let token = env.emulator.token_for(user, TokenKind::id()).unwrap();
    let answer: serde_json::Value = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .bearer_auth(token)
        .json(&json!({"cluster": "prod", "csr": key.csr_pem().unwrap(), "roles": [role], "ttl_seconds": 900}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let through = TalosContext::new(
        gateway.to_string(),
        answer["ca"].as_str().unwrap(),
        answer["certificate"].as_str().unwrap(),
        &key.private_key_pem(),
    );
    let roles = [role.to_owned()];
    let direct = sign_leaf(
        talos_ca,
        &key.public_key_info().unwrap(),
        &LeafRequest {
            username: user,
            roles: &roles,
            ttl: Duration::from_secs(3600),
            clock_skew: Duration::from_secs(60),
        },
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    let direct = TalosContext::new(
        upstream.to_string(),
        &files.talos_ca_pem,
        &direct.chain_pem,
        &key.private_key_pem(),
    );
    (through, direct)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let files = GatewayFiles::new();
    let standin = StandinApid::start(files.standin_config()).await.unwrap();
    let upstream = standin.addr();
    let backend = if args.postgres {
        Backend::Postgres
    } else {
        Backend::Sqlite
    };
    let env = TestEnv::start_with(backend, |yaml| files.gateway_config(&yaml, upstream, "")).await;
    let gateway = env.server.gateways[0].1;

    let talos_ca = CertificateAuthority::from_pem(
        &files.talos_ca_pem,
        &std::fs::read_to_string(&files.talos_ca_key).unwrap(),
        "talos",
        Vec::new(),
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    // Bob (os:operator) for the unary calls; Read is os:admin's: alice.
    let (through, direct) = contexts(
        &env,
        &files,
        &talos_ca,
        gateway,
        upstream,
        "bob@example.com",
        "os:operator",
    )
    .await;
    let (admin_through, admin_direct) = contexts(
        &env,
        &files,
        &talos_ca,
        gateway,
        upstream,
        "alice@example.com",
        "os:admin",
    )
    .await;
    let through_client = GrpcClient::connect(&through).unwrap();
    let direct_client = GrpcClient::connect(&direct).unwrap();
    println!(
        "gateway-bench: {} unary calls per row after as many to warm up, {} reads of 32 MiB, trail on {}",
        args.calls,
        args.reads,
        if args.postgres { "Postgres" } else { "SQLite" }
    );
    println!("{:<34} {:>10} {:>10}", "unary (ms)", "p50", "p99");
    let mut unary_rows = Vec::new();
    for (name, method) in [
        ("Version (read-only)", proto::VERSION),
        ("Reboot (mutating)", proto::REBOOT),
    ] {
        let direct = unary(&direct_client, method, args.calls).await;
        let through = unary(&through_client, method, args.calls).await;
        println!(
            "{:<34} {:>10.3} {:>10.3}",
            format!("{name}, direct"),
            direct.0,
            direct.1
        );
        println!(
            "{:<34} {:>10.3} {:>10.3}",
            format!("{name}, through"),
            through.0,
            through.1
        );
        println!(
            "{:<34} {:>10.3} {:>10.3}",
            format!("{name}, added"),
            through.0 - direct.0,
            through.1 - direct.1
        );
        unary_rows
            .push(json!({"method": name, "direct": [direct.0, direct.1], "through": [through.0, through.1]}));
    }
    let admin_through = GrpcClient::connect(&admin_through).unwrap();
    let admin_direct = GrpcClient::connect(&admin_direct).unwrap();
    let direct_reads = reads(&admin_direct, args.reads).await;
    let through_reads = reads(&admin_through, args.reads).await;
    println!(
        "{:<34} {:>10} {:>10}",
        "Read, 32 MiB messages", "MB/s", "CPU ms/MB"
    );
    println!(
        "{:<34} {:>10.1} {:>10.3}",
        "direct", direct_reads.0, direct_reads.1
    );
    println!(
        "{:<34} {:>10.1} {:>10.3}",
        "through", through_reads.0, through_reads.1
    );
    println!(
        "{:<34} {:>10.2} {:>10.2}",
        "through / direct",
        through_reads.0 / direct_reads.0,
        through_reads.1 / direct_reads.1
    );
    println!(
        "{}",
        json!({"unary_ms_p50_p99": unary_rows, "read_mb_s_cpu_ms_per_mb": {"direct": direct_reads, "through": through_reads}})
    );
    env.finish().await;
    standin.shutdown().await;
}
