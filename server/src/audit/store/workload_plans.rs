//! Which index SQLite reads for the `kind` filter, as the store writes it:
//! one kind's records from `audit_events_workload_kind`, any workload's
//! from `audit_events_workload` (migration 0010), in trail order both
//! ways. Without statistics (the store never runs ANALYZE) SQLite's choice
//! follows from how the statement is written, which is what this pins: an
//! expression or a predicate written otherwise than in the migration is
//! no index's, and SQLite would read the whole trail instead. Postgres
//! chooses by its statistics (checked by hand with EXPLAIN ANALYZE on
//! 200,000 records: both indexes, custom and generic plans).

use sqlx::Row;

use super::query::{Order, bound};
use super::types::{AuditFilter, KindFilter};
use super::{AuditStore, StoreOptions};
use crate::audit::format_micros;

#[tokio::test]
async fn sqlite_seeks_the_workload_indexes_for_the_kind_filters() {
    let dir = std::env::temp_dir().join(format!(
        "talos-sso-plans-{}",
        crate::random::random_hex(6).unwrap()
    ));
    let url = format!("sqlite://{}/audit.db", dir.display());
    let store = AuditStore::connect(&url, &StoreOptions::default()).await.unwrap();
    store.migrate().await.unwrap();
    let AuditStore::Sqlite(sqlite) = &store else {
        panic!("a sqlite:// URL opens SQLite")
    };
    let one = KindFilter::Workload("gitlab-ci".into());
    let newest = Order::NewestFirst {
        before_seq: Some(500),
    };
    for (kind, order, index) in [
        (&one, Order::OldestFirst, "audit_events_workload_kind"),
        (&one, newest, "audit_events_workload_kind"),
        (
            &KindFilter::AnyWorkload,
            Order::OldestFirst,
            "audit_events_workload",
        ),
        (&KindFilter::AnyWorkload, newest, "audit_events_workload"),
    ] {
        let filter = AuditFilter {
            kind: Some(kind.clone()),
            after_seq: 10,
            limit: 100,
            ..AuditFilter::default()
        };
        let mut statement = store.matching_statement(&filter, order);
        statement.sql = format!("EXPLAIN QUERY PLAN {}", statement.sql);
        let plan: Vec<String> = bound(statement, format_micros)
            .fetch_all(sqlite.pool())
            .await
            .unwrap()
            .iter()
            .map(|row| row.get("detail"))
            .collect();
        assert!(
            plan.iter()
                .any(|step| step.starts_with(&format!("SEARCH audit_events USING INDEX {index} ("))),
            "{kind:?} {order:?}: {plan:?}"
        );
    }
    store.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}
