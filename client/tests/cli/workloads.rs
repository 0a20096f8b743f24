//! `audit list --kind`: the security team lists a workload kind's
//! certificate records, any workload's, or the people's, with the real
//! binary against the API (records appended to the store as the server
//! writes a workload's), and gets a kind that is none refused by name.

use serde_json::json;
use talos_sso_api::audit::{AuditRecord, event, outcome};
use talos_sso_tests::audit_seed::append_records;
use talos_sso_tests::harness::{Backend, TestEnv};

use super::auditor;

fn workload(name: &str, request_id: &str, kind: &str) -> AuditRecord {
    let mut record = AuditRecord::new(
        event::CERTIFICATE_ISSUED,
        outcome::SUCCESS,
        request_id,
        time::OffsetDateTime::now_utc(),
    );
    record.username = Some(name.into());
    record.subject = Some(name.into());
    record.identity_verified = true;
    record.cluster = Some("prod".into());
    record.roles_granted = vec!["os:reader".into()];
    record.details = json!({"workload": {"kind": kind, "issuer": kind, "rules": ["ci"],
                                         "claims": {"sub": name}, "token_use": 1, "token_uses_max": 1}});
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_kind_any_workload_or_people_is_one_flag() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let records = vec![
        workload("repo:acme/infra:ref:refs/heads/main", "gha-1", "github-actions"),
        workload("system:serviceaccount:ci:builder", "k8s-1", "kubernetes"),
        workload("repo:acme/web:ref:refs/heads/main", "gha-2", "github-actions"),
    ];
    append_records(env.server.app.audit.store(), records).await;
    let sam = auditor(&env).await;
    let ids = |lines: &str| -> Vec<String> {
        lines
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["request_id"].to_string())
            .collect()
    };

    let (code, github, err) = sam
        .run(&["audit", "list", "--kind", "github-actions", "--output", "json"])
        .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(ids(&github), ["\"gha-1\"", "\"gha-2\""]);
    let (code, any, _) = sam
        .run(&["audit", "list", "--kind", "workload", "--output", "json"])
        .await;
    assert_eq!(code, 0);
    assert_eq!(ids(&any), ["\"gha-1\"", "\"k8s-1\"", "\"gha-2\""]);
    // People: sam's own reads of the trail, never a workload's record.
    let (code, people, _) = sam
        .run(&["audit", "list", "--kind", "person", "--output", "json"])
        .await;
    assert_eq!(code, 0);
    let people: Vec<serde_json::Value> = people.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!people.is_empty());
    assert!(
        people
            .iter()
            .all(|r| r["details"].get("workload").is_none() && r["identity_verified"] == true),
        "{people:?}"
    );

    // A kind that is none, refused by name with the values it may take.
    let (code, _, err) = sam.run(&["audit", "list", "--kind", "github"]).await;
    assert_ne!(code, 0);
    assert!(
        err.contains("`kind` must be one of: kubernetes, github-actions, gitlab-ci, workload, person"),
        "{err}"
    );
    env.finish().await;
}
