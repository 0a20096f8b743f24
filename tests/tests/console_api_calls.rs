//! The console's view of Talos API calls (`api.call`), over HTTP on both
//! stores: the trail filtered by method (exact or a prefix) and node, each
//! call's method, nodes and status in the table, a bad filter refused by
//! name, a person's newest calls in a section of their own (bounded, and
//! not crowding out their certificates), and hostile method and node text
//! escaped. The gateway that writes these records is tested on its own:
//! here they are appended to the store as it would write them.

use serde_json::json;
use talos_sso_server::audit::store::{Append, AuditFilter};
use talos_sso_server::audit::{AuditRecord, event, outcome};
use talos_sso_tests::console_client::Browserless;
use talos_sso_tests::harness::{Backend, CheckpointFiles};

use super::{AUDITOR, certificate, console_records, start};

const BOB: &str = "bob@example.com";

/// An `api.call` record of `user`, with `details`.
fn call(user: &str, request_id: &str, result: &str, details: serde_json::Value) -> Append {
    let mut record = AuditRecord::new(
        event::API_CALL,
        result,
        request_id,
        time::OffsetDateTime::now_utc(),
    );
    record.username = Some(user.into());
    record.subject = Some(format!("subject-of-{user}"));
    record.identity_verified = true;
    record.cluster = Some("prod".into());
    record.roles_granted = vec!["os:operator".into()];
    record.serial = Some("0a1b2c".into());
    record.client_ip = Some("203.0.113.9".into());
    record.details = details;
    Append {
        record,
        ..Append::default()
    }
}

/// The rows of the table that follows `heading` on `page`.
pub(super) fn rows_after<'a>(page: &'a str, heading: &str) -> Vec<&'a str> {
    let section = &page[page
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading}: {page}"))..];
    let body = &section[section.find("<tbody>").unwrap()..section.find("</tbody>").unwrap()];
    body.split("<tr>").skip(1).collect()
}

async fn api_calls_in_the_console(backend: Backend) {
    let checkpoints = CheckpointFiles::new();
    let env = start(backend, &checkpoints).await;
    let base = env.server.base_url.clone();
    assert_eq!(certificate(&env, BOB, &[]).await, 201);
    let reboot = json!({"method": "/machine.MachineService/Reboot", "nodes": ["10.5.0.2"], "class": "mutating", "calls": 1});
    let mut rebooted = reboot.clone();
    rebooted["grpc_status"] = json!(0);
    rebooted["duration_ms"] = json!(812);
    let mut calls = vec![
        call(BOB, "reboot-1", outcome::STARTED, reboot),
        call(BOB, "reboot-1", outcome::SUCCESS, rebooted),
        call(
            BOB,
            "etcd-1",
            outcome::DENIED,
            json!({"method": "/machine.MachineService/EtcdRemoveMemberByID", "nodes": ["10.5.0.3"],
                   "class": "mutating", "rule": "destructive-needs-os:admin", "calls": 1}),
        ),
        call(
            "carol@example.com",
            "hostile-1",
            outcome::FAILED,
            json!({"method": "/x.Y/<script>alert(1)</script>", "nodes": ["\"><img src=x onerror=alert(1)>", 7],
                   "class": "read", "grpc_status": 14, "grpc_message": "<b>down</b>", "calls": 7}),
        ),
    ];
    calls[2].record.reason_code = Some("role_not_permitted".into());
    // More read-only calls of bob's than his page shows.
    for i in 0..55 {
        calls.push(call(
            BOB,
            &format!("read-{i}"),
            outcome::SUCCESS,
            json!({"method": "/cosi.resource.State/List", "nodes": ["10.5.0.4"], "class": "read",
                   "grpc_status": 0, "calls": 3}),
        ));
    }
    let store = env.server.app.audit.store();
    let appended = store.append_batch(&calls).await.unwrap();
    let newest_call = appended.last().unwrap().stored().seq;

    let mut auditor = Browserless::new();
    auditor.login(&base, AUDITOR, "/ui").await;
    let page = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    };

    // By node: the reboot's two records, its method, nodes and status.
    let (status, by_node) = page(
        auditor
            .get(&format!("{base}/ui?event=api.call&node=10.5.0.2"))
            .await,
    )
    .await;
    assert_eq!(status, 200);
    let rows = rows_after(&by_node, "<table class=\"records\">");
    assert_eq!(rows.len(), 2, "{by_node}");
    assert!(
        rows.iter()
            .all(|r| r.contains("/machine.MachineService/Reboot") && r.contains("10.5.0.2"))
    );
    assert!(
        rows[0].contains("gRPC 0") && rows[0].contains("outcome-success"),
        "{}",
        rows[0]
    );
    assert!(rows[1].contains("outcome-started"), "{}", rows[1]);
    assert!(
        by_node.contains("value=\"10.5.0.2\""),
        "the form keeps the filter"
    );

    // By a method prefix: the refused etcd call and the rule.
    let (status, etcd) = page(
        auditor
            .get(&format!("{base}/ui?method=%2Fmachine.MachineService%2FEtcd%2A"))
            .await,
    )
    .await;
    assert_eq!(status, 200);
    let rows = rows_after(&etcd, "<table class=\"records\">");
    assert_eq!(rows.len(), 1, "{etcd}");
    assert!(rows[0].contains("EtcdRemoveMemberByID") && rows[0].contains("destructive-needs-os:admin"));
    assert!(rows[0].contains("denied (role_not_permitted)"), "{}", rows[0]);

    // A method that is not one: refused, naming the parameter.
    let (status, refused) = page(auditor.get(&format!("{base}/ui?method=Reboot")).await).await;
    assert_eq!(status, 422);
    assert!(refused.contains("`method` must be a gRPC method"), "{refused}");

    // Hostile text is text.
    let (status, hostile) = page(
        auditor
            .get(&format!("{base}/ui?username=carol%40example.com"))
            .await,
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        hostile.contains("/x.Y/&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{hostile}"
    );
    assert!(
        hostile.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"),
        "{hostile}"
    );
    assert!(
        hostile.contains("&lt;b&gt;down&lt;/b&gt;") && hostile.contains("×7"),
        "{hostile}"
    );
    for raw in ["<script>", "<img", "<b>down"] {
        assert!(!hostile.contains(raw), "{raw} in {hostile}");
    }

    // Bob's page: his certificate, and his newest calls, bounded.
    let (status, person) = page(
        auditor
            .get(&format!("{base}/ui/person?username=bob%40example.com"))
            .await,
    )
    .await;
    assert_eq!(status, 200);
    assert!(person.contains("Certificates (1)"), "{person}");
    let rows = rows_after(&person, "<h2>API calls</h2>");
    assert_eq!(rows.len(), 50, "{person}");
    assert!(
        rows[0].contains(&format!("/ui/records/{newest_call}\"")),
        "newest first: {}",
        rows[0]
    );
    assert!(rows.iter().all(|r| r.contains("/cosi.resource.State/List")));
    assert!(person.contains("The newest 50 records"), "{person}");
    assert!(
        person.contains("href=\"/ui?event=api.call&amp;username=bob%40example.com\""),
        "{person}"
    );
    // The calls are not denials of his, nor in the certificates' table.
    let denials = person.find("Denials (").unwrap();
    assert!(person[denials..].starts_with("Denials (0)"), "{person}");

    // The views were recorded with the filters as given.
    let recorded = console_records(
        &env.server,
        AuditFilter {
            username: Some(AUDITOR.into()),
            ..AuditFilter::default()
        },
    )
    .await;
    assert!(
        recorded
            .iter()
            .any(|d| d["filter"]["node"] == "10.5.0.2" && d["filter"]["event"] == "api.call"),
        "{recorded:?}"
    );
    assert!(
        recorded
            .iter()
            .any(|d| d["filter"]["method"] == "/machine.MachineService/Etcd*"),
        "{recorded:?}"
    );
    env.finish().await;
}

on_both_stores!(api_calls_in_the_console);
