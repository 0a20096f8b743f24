//! `audit list --method --node`: the security team finds Talos API calls
//! (`api.call`, appended to the store as the gateway writes them) with the
//! real binary, sees each call's method and nodes in the table, and gets a
//! bad filter refused by name.

use serde_json::json;
use talos_sso_api::audit::{AuditRecord, event, outcome};
use talos_sso_tests::audit_seed::append_records;
use talos_sso_tests::harness::{Backend, TestEnv};

use super::{assert_terminal_safe, auditor};

fn call(user: &str, request_id: &str, result: &str, details: serde_json::Value) -> AuditRecord {
    let mut record = AuditRecord::new(
        event::API_CALL,
        result,
        request_id,
        time::OffsetDateTime::now_utc(),
    );
    record.username = Some(user.into());
    record.identity_verified = true;
    record.cluster = Some("prod".into());
    record.roles_granted = vec!["os:operator".into()];
    record.serial = Some("0a1b2c".into());
    record.details = details;
    record
}

fn reboot(nodes: &[&str], status: Option<i64>) -> serde_json::Value {
    let mut details =
        json!({"method": "/machine.MachineService/Reboot", "nodes": nodes, "class": "mutating", "calls": 1});
    if let Some(status) = status {
        details["grpc_status"] = json!(status);
    }
    details
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_rebooted_a_node_is_one_command() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let calls = vec![
        call(
            "bob@example.com",
            "reboot-2",
            outcome::STARTED,
            reboot(&["10.5.0.2"], None),
        ),
        call(
            "bob@example.com",
            "reboot-2",
            outcome::FAILED,
            reboot(&["10.5.0.2"], Some(14)),
        ),
        call(
            "bob@example.com",
            "reboot-3",
            outcome::SUCCESS,
            reboot(&["10.5.0.3"], Some(0)),
        ),
        call(
            "carol@example.com",
            "reads-1",
            outcome::SUCCESS,
            json!({"method": "/machine.MachineService/EtcdMemberList", "nodes": ["10.5.0.2"],
                   "class": "read", "grpc_status": 0, "calls": 12}),
        ),
        call(
            "mallory@example.com",
            "hostile-1",
            outcome::DENIED,
            json!({"method": "/machine.MachineService/Reboot\u{1b}[2K\r  forged", "nodes": ["10.5.0.2\u{202e}"],
                   "class": "mutating", "rule": "x", "calls": 1}),
        ),
    ];
    append_records(env.server.app.audit.store(), calls).await;
    let sam = auditor(&env).await;

    let who = [
        "audit",
        "list",
        "--event",
        "api.call",
        "--method",
        "/machine.MachineService/Reboot",
        "--node",
        "10.5.0.2",
        "--since",
        "7d",
    ];
    let (code, table, err) = sam.run(&who).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].ends_with("  ROLES / CALL"), "{table}");
    assert_eq!(lines.len(), 3, "the reboot's two records: {table}");
    assert!(
        lines[1].contains("  started  ") && lines[1].ends_with("  /machine.MachineService/Reboot 10.5.0.2")
    );
    assert!(
        lines[2].contains("  failed  ")
            && lines[2].ends_with("  /machine.MachineService/Reboot 10.5.0.2 gRPC 14")
    );
    let (code, json_lines, _) = sam.run(&[&who[..], &["--output", "json"]].concat()).await;
    assert_eq!(code, 0);
    let records: Vec<serde_json::Value> = json_lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 2);
    assert!(records.iter().all(|r| r["request_id"] == "reboot-2"));

    // A prefix; another event never matches.
    let (code, table, _) = sam
        .run(&["audit", "list", "--method", "/machine.MachineService/Etcd*"])
        .await;
    assert_eq!(code, 0);
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(
        table.contains("/machine.MachineService/EtcdMemberList 10.5.0.2 ×12"),
        "{table}"
    );
    let (code, none, _) = sam
        .run(&[
            "audit",
            "list",
            "--event",
            "certificate.issued",
            "--node",
            "10.5.0.2",
        ])
        .await;
    assert_eq!((code, none.lines().count()), (0, 1), "the heading alone: {none}");

    // Hostile text in a call stays one harmless row.
    let (code, table, _) = sam.run(&["audit", "list", "--user", "mallory@example.com"]).await;
    assert_eq!(code, 0);
    assert_terminal_safe(&table);
    assert_eq!(table.lines().count(), 2, "{table}");

    // Several nodes, or a method that is none, refused by name.
    let (code, _, err) = sam.run(&["audit", "list", "--node", "10.5.0.2,10.5.0.3"]).await;
    assert_ne!(code, 0);
    assert!(err.contains("`node` must be one node"), "{err}");
    let (code, _, err) = sam.run(&["audit", "list", "--method", "Reboot"]).await;
    assert_ne!(code, 0);
    assert!(err.contains("`method` must be a gRPC method"), "{err}");
    env.finish().await;
}
