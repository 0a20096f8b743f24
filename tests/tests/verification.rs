//! One verification of the whole chain at a time on a replica: eight
//! auditors asking `GET /v1/audit/verify` at once over a trail of 20,000
//! records share one run (each used to read the whole trail, slowing every
//! issuance), and each gets its answer. It prints how long the eight took
//! and how long certificates took while they ran (`--nocapture`): figures
//! of a debug build, for comparison only.

use talos_sso_tests::audit_seed::seed_store;
use talos_sso_tests::emulator::TokenKind;
use talos_sso_tests::harness::{Backend, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_verifications_share_one_run() {
    let env = TestEnv::start(Backend::Sqlite).await;
    seed_store(env.server.app.audit.store(), 20_000, 8, 10).await;
    let token = env
        .emulator
        .token_for("sam@example.com", TokenKind::id())
        .unwrap();
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = std::time::Instant::now();
    let mut asks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let request = env
            .http
            .get(format!("{}/v1/audit/verify", env.server.base_url))
            .bearer_auth(&token);
        let finished = finished.clone();
        asks.spawn(async move {
            let answer = request.send().await.unwrap();
            assert_eq!(answer.status(), 200);
            let answer = answer.json::<serde_json::Value>().await.unwrap();
            finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            answer
        });
    }
    // Certificates asked for one after another while they run.
    let mut issuance = Vec::new();
    while finished.load(std::sync::atomic::Ordering::SeqCst) < 8 && issuance.len() < 500 {
        let bob = env
            .emulator
            .token_for("bob@example.com", TokenKind::id())
            .unwrap();
        let at = std::time::Instant::now();
        let (status, _) = env.issue(&bob).await;
        assert_eq!(status, 201);
        issuance.push(at.elapsed());
    }
    let answers = asks.join_all().await;
    let all_done = started.elapsed();
    issuance.sort();
    let median = issuance.get(issuance.len() / 2).copied().unwrap_or_default();
    println!(
        "8 verifications of 20,000 records: {all_done:.2?} in all; {} certificates meanwhile, median {median:.2?}, slowest {:.2?}",
        issuance.len(),
        issuance.last().copied().unwrap_or_default()
    );
    for answer in &answers {
        assert_eq!(answer["intact"], true, "{answer}");
        assert!(answer["verified"].as_u64().unwrap() >= 20_000, "{answer}");
    }
    let runs = env.server.app.verifications.started();
    // Without the guard each request reads the trail itself: eight runs.
    assert!(runs < 8, "{runs} verifications for 8 requests asked at once");
    env.finish().await;
}
