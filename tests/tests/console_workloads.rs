//! The console's view of workload logins, over HTTP on both stores: the
//! trail filtered by kind (one kind, any workload, people), each
//! workload's kind and issuer in the table, a record's page with the
//! workload's rules or misses and claims (hostile claims escaped), a bad
//! kind refused by name, and the filter recorded as given. The records are
//! appended as the server writes a workload's certificate records.

use serde_json::json;
use talos_sso_server::audit::store::{Append, AuditFilter};
use talos_sso_server::audit::{AuditRecord, event, outcome};
use talos_sso_tests::console_client::Browserless;
use talos_sso_tests::harness::{Backend, CheckpointFiles};

use super::api_calls::rows_after;
use super::{AUDITOR, certificate, console_records, start};

/// A workload's certificate record, named `name`, with `workload` as its
/// `details.workload`.
fn workload(name: &str, request_id: &str, result: &str, workload: serde_json::Value) -> Append {
    let event = if result == outcome::SUCCESS {
        event::CERTIFICATE_ISSUED
    } else {
        event::CERTIFICATE_DENIED
    };
    let mut record = AuditRecord::new(event, result, request_id, time::OffsetDateTime::now_utc());
    record.username = Some(name.into());
    record.subject = Some(name.into());
    record.identity_verified = true;
    record.cluster = Some("prod".into());
    record.details = json!({ "workload": workload });
    Append {
        record,
        ..Append::default()
    }
}

async fn workloads_in_the_console(backend: Backend) {
    let checkpoints = CheckpointFiles::new();
    let env = start(backend, &checkpoints).await;
    let base = env.server.base_url.clone();
    assert_eq!(certificate(&env, "bob@example.com", &[]).await, 201);
    let mut records = vec![
        workload(
            "repo:acme/infra:ref:refs/heads/main",
            "gha-1",
            outcome::SUCCESS,
            json!({"kind": "github-actions", "issuer": "github", "rules": ["deploy-prod"],
                   "claims": {"repository": "acme/<script>alert(1)</script>", "run_attempt": 2},
                   "token_uses_max": 1}),
        ),
        workload(
            "system:serviceaccount:ci:builder",
            "k8s-1",
            outcome::DENIED,
            json!({"kind": "kubernetes", "issuer": "in-cluster",
                   "misses": [{"rule": "builders", "claims": ["kubernetes.io/namespace"]}],
                   "claims": {"sub": "system:serviceaccount:ci:builder"},
                   "token_uses_max": 3}),
        ),
    ];
    records[1].record.reason_code = Some("workload_not_admitted".into());
    let store = env.server.app.audit.store();
    let appended = store.append_batch(&records).await.unwrap();
    let github = appended[0].stored().seq;

    let mut auditor = Browserless::new();
    auditor.login(&base, AUDITOR, "/ui").await;
    let page = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    };

    // One kind: its record, its kind and issuer; the form keeps the choice.
    let (status, one) = page(auditor.get(&format!("{base}/ui?kind=github-actions")).await).await;
    assert_eq!(status, 200);
    let rows = rows_after(&one, "<table class=\"records\">");
    assert_eq!(rows.len(), 1, "{one}");
    assert!(
        rows[0].contains("workload <code>github-actions</code> via <code>github</code>"),
        "{}",
        rows[0]
    );
    assert!(
        one.contains("<option value=\"github-actions\" selected>github-actions</option>"),
        "{one}"
    );

    // Any workload: both, the refusal with its reason.
    let (status, any) = page(auditor.get(&format!("{base}/ui?kind=workload")).await).await;
    assert_eq!(status, 200);
    let rows = rows_after(&any, "<table class=\"records\">");
    assert_eq!(rows.len(), 2, "{any}");
    assert!(rows[0].contains("denied (workload_not_admitted)") && rows[0].contains("kubernetes"));

    // People: bob's certificate, and no workload.
    let (status, people) = page(
        auditor
            .get(&format!("{base}/ui?kind=person&event=certificate.issued"))
            .await,
    )
    .await;
    assert_eq!(status, 200);
    let rows = rows_after(&people, "<table class=\"records\">");
    assert_eq!(rows.len(), 1, "{people}");
    assert!(rows[0].contains("bob@example.com") && !rows[0].contains("workload"));

    // A kind that is not one: refused, naming the parameter.
    let (status, refused) = page(auditor.get(&format!("{base}/ui?kind=github")).await).await;
    assert_eq!(status, 422);
    assert!(refused.contains("`kind` must be one of"), "{refused}");

    // The record's page: the workload's facts, hostile text as text.
    let (status, record) = page(auditor.get(&format!("{base}/ui/records/{github}")).await).await;
    assert_eq!(status, 200);
    assert!(record.contains("<h2>Workload</h2>"), "{record}");
    assert!(record.contains("<code>deploy-prod</code>"), "{record}");
    assert!(
        record.contains("acme/&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{record}"
    );
    assert!(!record.contains("<script>alert"), "{record}");
    assert!(
        record.contains("Certificates per token</dt><dd>up to 1"),
        "{record}"
    );
    let (_, refusal) = page(
        auditor
            .get(&format!("{base}/ui/records/{}", appended[1].stored().seq))
            .await,
    )
    .await;
    assert!(
        refusal.contains("rule <code>builders</code>: kubernetes.io/namespace"),
        "{refusal}"
    );

    // The views were recorded with the kind as given.
    let recorded = console_records(
        &env.server,
        AuditFilter {
            username: Some(AUDITOR.into()),
            ..AuditFilter::default()
        },
    )
    .await;
    assert!(
        recorded.iter().any(|d| d["filter"]["kind"] == "github-actions"),
        "{recorded:?}"
    );
    env.finish().await;
}

on_both_stores!(workloads_in_the_console);
