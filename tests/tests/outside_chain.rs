//! Rows outside the hash chain (`seq` 0 or below), on both stores. The
//! chain starts at 1 and `audit verify` reads from there, so such a row is
//! one nothing vouches for:
//!
//! - the database refuses it (migration 0007: a constraint on Postgres, a
//!   trigger on SQLite), and every view leaves it out even when its owner
//!   has removed that guard;
//! - a trail that already holds one (written before 0007) is not read
//!   through it, and is neither migrated nor served nor verified: each
//!   refusal names the rows.

use sqlx::Row;
use talos_sso_server::audit::store::{Append, AuditFilter, AuditStore, IssuerScope, StoreError};
use talos_sso_server::audit::{AuditRecord, event, outcome};
use talos_sso_server::config::Config;
use talos_sso_tests::emulator::{EmulatorConfig, EmulatorHandle};
use talos_sso_tests::harness::{Backend, BareStore, Workdir, config_yaml, migrate_up_to, server_cli};
use time::OffsetDateTime;

on_both_stores!(
    the_database_refuses_a_row_outside_the_chain_and_the_views_leave_it_out,
    a_trail_holding_rows_outside_the_chain_is_not_read_through_them_nor_migrated_nor_served,
    a_username_resolves_through_the_scopes_issuers_and_tenants_ignoring_case,
);

/// The login issuer's `iss` in these stores' records.
const LOGIN_ISS: &str = "https://login.example/t/v2.0";

/// Every view that reads `audit_events`, and an event each one shows.
const VIEWS: [(&str, &str, &str); 10] = [
    ("issued_certificates", event::CERTIFICATE_ISSUED, outcome::SUCCESS),
    ("denied_requests", event::CERTIFICATE_DENIED, outcome::DENIED),
    ("audit_issued", event::BREAK_GLASS_ISSUED, outcome::SUCCESS),
    ("audit_denied", event::CERTIFICATE_DENIED, outcome::DENIED),
    ("audit_deny_changes", event::DENY_ADDED, outcome::SUCCESS),
    ("audit_reads", event::AUDIT_QUERY, outcome::SUCCESS),
    (
        "audit_undelivered",
        event::CERTIFICATE_UNDELIVERED,
        outcome::SUCCESS,
    ),
    ("audit_break_glass", event::BREAK_GLASS_ISSUED, outcome::SUCCESS),
    ("audit_api_calls", event::API_CALL, outcome::SUCCESS),
    // Every planted row holds a workload, for this view.
    ("audit_workloads", event::CERTIFICATE_ISSUED, outcome::SUCCESS),
];

/// An INSERT of a record at `seq` that no server wrote: verified, of the
/// login issuer, tying `username` to the subject `made-up`, and holding a
/// workload (so that `audit_workloads` would show it too).
fn planted(backend: Backend, seq: i64, event: &str, outcome: &str, username: &str) -> String {
    let (time, verified, empty, roles) = match backend {
        Backend::Postgres => ("now()", "true", "'{}'", "'{os:admin}'"),
        Backend::Sqlite => ("'2026-01-01T00:00:00.000000Z'", "1", "'[]'", "'[\"os:admin\"]'"),
    };
    format!(
        "INSERT INTO audit_events (seq, occurred_at, request_id, event, outcome, cluster, issuer, subject, \
         username, identity_verified, groups_evaluated, roles_requested, roles_granted, details, prev_hash, hash) \
         VALUES ({seq}, {time}, 'planted', '{event}', '{outcome}', 'prod', '{LOGIN_ISS}', 'made-up', \
         '{username}', {verified}, {empty}, {empty}, {roles}, '{{\"workload\": {{\"kind\": \"kubernetes\"}}}}', 'x', 'y')"
    )
}

/// Run `sql` on the store's database as the connection it has (the owner
/// on Postgres, the file on SQLite).
async fn execute(store: &AuditStore, sql: &str) -> Result<u64, sqlx::Error> {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    match store {
        AuditStore::Postgres(pool) => sqlx::raw_sql(sql).execute(pool).await.map(|r| r.rows_affected()),
        AuditStore::Sqlite(store) => sqlx::raw_sql(sql)
            .execute(store.pool())
            .await
            .map(|r| r.rows_affected()),
    }
}

async fn count(store: &AuditStore, sql: &str) -> i64 {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    match store {
        AuditStore::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        AuditStore::Sqlite(store) => sqlx::query_scalar(sql).fetch_one(store.pool()).await.unwrap(),
    }
}

/// Each view's definition as the database holds it, of the views that
/// read `audit_events`.
async fn view_definitions(store: &AuditStore) -> Vec<(String, String)> {
    match store {
        AuditStore::Postgres(pool) => sqlx::query(
            "SELECT viewname::text, definition FROM pg_views \
             WHERE schemaname = current_schema() AND definition LIKE '%audit_events%' ORDER BY 1",
        )
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect(),
        AuditStore::Sqlite(store) => sqlx::query(
            "SELECT name, sql FROM sqlite_master WHERE type = 'view' AND sql LIKE '%audit_events%' ORDER BY 1",
        )
        .fetch_all(store.pool())
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect(),
    }
}

/// A few records the server would write: Bob's of the login issuer.
async fn append_records(store: &AuditStore, n: usize) {
    let batch: Vec<Append> = (0..n)
        .map(|i| {
            let mut record = AuditRecord::new(
                event::CERTIFICATE_ISSUED,
                outcome::SUCCESS,
                &format!("req-{i}"),
                OffsetDateTime::now_utc(),
            );
            record.issuer = Some(LOGIN_ISS.into());
            record.subject = Some("bob-oid".into());
            record.username = Some("bob@example.com".into());
            record.identity_verified = true;
            record.cluster = Some("prod".into());
            Append {
                record,
                ..Default::default()
            }
        })
        .collect();
    store.append_batch(&batch).await.unwrap();
}

async fn the_database_refuses_a_row_outside_the_chain_and_the_views_leave_it_out(backend: Backend) {
    let bare = BareStore::open(backend).await;
    let store = &bare.store;
    append_records(store, 3).await;

    // Whoever inserts (here the owner; the runtime role in roles.rs).
    for seq in [0, -1] {
        let refused = execute(
            store,
            &planted(backend, seq, "certificate.issued", "success", "carol@example.com"),
        )
        .await
        .unwrap_err();
        let sqlx::Error::Database(refusal) = &refused else {
            panic!("{backend:?}: {refused}")
        };
        match backend {
            Backend::Postgres => assert_eq!(refusal.code().as_deref(), Some("23514"), "{refusal}"),
            Backend::Sqlite => assert!(refusal.message().contains("seq must be above 0"), "{refusal}"),
        }
    }
    if backend == Backend::Sqlite {
        // A row without a seq (SQLite would choose one) is no record either.
        let unnamed = planted(backend, 0, "certificate.issued", "success", "x")
            .replace("(seq, ", "(")
            .replace("VALUES (0, ", "VALUES (");
        let refused = execute(store, &unnamed).await.unwrap_err();
        assert!(
            refused.to_string().contains("seq must be above 0"),
            "the trigger audit_events_seq_in_chain: {refused}"
        );
    }
    assert!(store.outside_chain().await.unwrap().is_none());

    // Every view of the trail keeps to the chain with the store's own test.
    let verified = store.chain_rows();
    let definitions = view_definitions(store).await;
    let mut names: Vec<&str> = definitions.iter().map(|(name, _)| name.as_str()).collect();
    let mut expected: Vec<&str> = VIEWS.iter().map(|(view, ..)| *view).collect();
    names.sort_unstable();
    expected.sort_unstable();
    assert_eq!(names, expected, "{backend:?}");
    for (name, definition) in &definitions {
        let holds = match backend {
            Backend::Postgres => definition.contains("(audit_events.seq > 0)"),
            Backend::Sqlite => definition.contains(&format!("WHERE {verified} AND ")),
        };
        assert!(holds, "{backend:?} {name}: {definition}");
    }

    // With the guard removed by the owner, who alone may, the views still
    // show no such row.
    let unguard = match backend {
        Backend::Postgres => "ALTER TABLE audit_events DROP CONSTRAINT audit_events_seq_in_chain",
        Backend::Sqlite => "DROP TRIGGER audit_events_seq_in_chain",
    };
    execute(store, unguard).await.unwrap();
    for (seq, (_, event, outcome)) in (-(VIEWS.len() as i64)..0).zip(VIEWS) {
        execute(store, &planted(backend, seq, event, outcome, "carol@example.com"))
            .await
            .unwrap();
    }
    for (view, ..) in VIEWS {
        let all = count(store, &format!("SELECT count(*) FROM {view}")).await;
        let outside = count(store, &format!("SELECT count(*) FROM {view} WHERE seq <= 0")).await;
        assert_eq!(outside, 0, "{backend:?}: {view} shows rows outside the chain");
        if view == "issued_certificates" {
            assert_eq!(all, 3, "{backend:?}: {view}");
        }
    }
    bare.close().await;
}

async fn a_trail_holding_rows_outside_the_chain_is_not_read_through_them_nor_migrated_nor_served(
    backend: Backend,
) {
    let bare = BareStore::open_unmigrated(backend).await;
    let (store, url) = (&bare.store, &bare.url);
    // As the schema stood before 0007, when anyone who could insert could
    // write such a row: it ties carol's username to a made-up subject.
    migrate_up_to(store, 6).await.unwrap();
    append_records(store, 3).await;
    execute(
        store,
        &planted(backend, -1, "certificate.issued", "success", "carol@example.com"),
    )
    .await
    .unwrap();

    // Not read: whatever the cursor, the name, the question.
    let everything = AuditFilter {
        after_seq: -10,
        limit: 100,
        ..Default::default()
    };
    let carol = AuditFilter {
        username: Some("carol@example.com".into()),
        ..everything.clone()
    };
    let seqs = |records: Vec<talos_sso_server::audit::StoredRecord>| {
        records.iter().map(|r| r.seq).collect::<Vec<_>>()
    };
    assert_eq!(
        seqs(store.page(-10, 100).await.unwrap()),
        [1, 2, 3],
        "{backend:?}"
    );
    assert_eq!(
        seqs(store.query(&everything).await.unwrap()),
        [1, 2, 3],
        "{backend:?}"
    );
    assert_eq!(seqs(store.query(&carol).await.unwrap()), [0; 0], "{backend:?}");
    assert_eq!(
        seqs(store.query_newest_first(&everything, None).await.unwrap()),
        [3, 2, 1],
        "{backend:?}"
    );
    let since = AuditFilter {
        since: Some(OffsetDateTime::UNIX_EPOCH),
        ..carol.clone()
    };
    assert_eq!(seqs(store.query(&since).await.unwrap()), [0; 0], "{backend:?}");
    let scope = IssuerScope {
        issuers: vec![LOGIN_ISS.into()],
        tenants: Vec::new(),
    };
    let resolved = store.subjects_of("carol@example.com", &scope, 10).await.unwrap();
    assert!(
        resolved.is_empty(),
        "{backend:?}: the planted row resolved carol's username: {resolved:?}"
    );
    // The same scope resolves a username the chain's records carry.
    assert_eq!(
        store.subjects_of("bob@example.com", &scope, 10).await.unwrap(),
        [("bob-oid".to_owned(), None)],
        "{backend:?}"
    );

    // Named wherever the trail is taken up.
    let named = "seq -1 (certificate.issued, carol@example.com)";
    let outside = store.outside_chain().await.unwrap().expect("the planted row");
    assert_eq!(outside.count, 1);
    let refused = store.migrate().await.unwrap_err();
    assert!(matches!(refused, StoreError::OutsideChain(_)), "{refused:?}");
    assert!(refused.to_string().contains(named), "{refused}");
    // Nothing was migrated (7 and every later one are left); and the
    // migration itself fails on the row, if run by other means.
    let unapplied = store.unapplied_migrations().await.unwrap();
    let left = unapplied.iter().map(|u| u.version).collect::<Vec<_>>();
    assert_eq!(left.first(), Some(&7), "{backend:?}: {left:?}");
    assert!(migrate_up_to(store, 7).await.is_err(), "{backend:?}");
    assert_eq!(store.unapplied_migrations().await.unwrap().len(), left.len());

    let emulator = EmulatorHandle::start(EmulatorConfig::default()).await.unwrap();
    let work = Workdir::new();
    for migrate_on_start in [true, false] {
        let text = config_yaml(&emulator, &work, url).replace(
            "acquire_timeout: 2s }",
            &format!("acquire_timeout: 2s, migrate_on_start: {migrate_on_start} }}"),
        );
        let config = Config::from_yaml(&text).unwrap();
        let error = talos_sso_server::app::open_serving_store(&config)
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(error.contains(named), "{backend:?} {migrate_on_start}: {error}");
        assert!(error.contains("Rows outside the chain"), "{error}");
        let file = work.path().join("config.yaml");
        std::fs::write(&file, &text).unwrap();
        let file = file.to_str().unwrap();
        for args in [
            vec!["migrate", "--config", file],
            vec!["audit", "verify", "--config", file],
        ] {
            let error = server_cli(&args).await.unwrap_err();
            assert!(error.contains(named), "{backend:?} {args:?}: {error}");
        }
    }
    bare.close().await;
}

/// A verified record of `issuer` and `tenant` naming `subject` with
/// `username`, as the server writes one.
fn login(issuer: &str, tenant: Option<&str>, subject: &str, username: &str) -> Append {
    let mut record = AuditRecord::new(
        event::CERTIFICATE_ISSUED,
        outcome::SUCCESS,
        subject,
        OffsetDateTime::now_utc(),
    );
    record.issuer = Some(issuer.into());
    record.tenant = tenant.map(str::to_owned);
    record.subject = Some(subject.into());
    record.username = Some(username.into());
    record.identity_verified = true;
    Append {
        record,
        ..Default::default()
    }
}

/// `subjects_of`, the store's half of `deny add --user`: the scope's
/// issuers and tenants are compared ignoring case, a tenant outside the
/// scope resolves nothing, and at most `limit` pairs come back, by subject.
async fn a_username_resolves_through_the_scopes_issuers_and_tenants_ignoring_case(backend: Backend) {
    let bare = BareStore::open(backend).await;
    let store = &bare.store;
    store
        .append_batch(&[
            login(LOGIN_ISS, Some("tenant-a"), "erin-a", "erin@example.com"),
            login(LOGIN_ISS, Some("tenant-b"), "erin-b", "Erin@Example.com"),
            login(
                &LOGIN_ISS.to_uppercase(),
                Some("TENANT-A"),
                "frank-a",
                "frank@example.com",
            ),
            login(LOGIN_ISS, Some("tenant-a"), "gus-1", "gus@example.com"),
            login(LOGIN_ISS, Some("tenant-a"), "gus-2", "gus@example.com"),
            login(LOGIN_ISS, Some("tenant-a"), "gus-3", "gus@example.com"),
        ])
        .await
        .unwrap();
    let scope = |issuer: &str, tenants: &[&str]| IssuerScope {
        issuers: vec![issuer.into()],
        tenants: tenants.iter().map(|t| (*t).to_owned()).collect(),
    };
    let pair = |subject: &str, tenant: &str| (subject.to_owned(), Some(tenant.to_owned()));
    let of = |username: &'static str, scope: IssuerScope, limit: i64| async move {
        store.subjects_of(username, &scope, limit).await.unwrap()
    };

    // Tenant B is not allowed: its record does not make erin ambiguous.
    assert_eq!(
        of("ERIN@example.com", scope(LOGIN_ISS, &["tenant-a"]), 10).await,
        [pair("erin-a", "tenant-a")],
        "{backend:?}"
    );
    assert_eq!(
        of(
            "erin@example.com",
            scope(LOGIN_ISS, &["tenant-a", "tenant-b"]),
            10
        )
        .await,
        [pair("erin-a", "tenant-a"), pair("erin-b", "tenant-b")],
        "{backend:?}"
    );
    assert_eq!(
        of("erin@example.com", scope(LOGIN_ISS, &["tenant-c"]), 10).await,
        [],
        "{backend:?}"
    );
    // Issuer and tenant in another case, on either side.
    assert_eq!(
        of("frank@example.com", scope(LOGIN_ISS, &["tenant-a"]), 10).await,
        [pair("frank-a", "TENANT-A")],
        "{backend:?}"
    );
    assert_eq!(
        of(
            "erin@example.com",
            scope(&LOGIN_ISS.to_uppercase(), &["TENANT-A"]),
            10
        )
        .await,
        [pair("erin-a", "tenant-a")],
        "{backend:?}"
    );
    assert_eq!(
        of(
            "erin@example.com",
            scope("https://other.example/v2.0", &["tenant-a"]),
            10
        )
        .await,
        [],
        "{backend:?}"
    );
    // Cut at the limit, the first subjects kept.
    assert_eq!(
        of("gus@example.com", scope(LOGIN_ISS, &["tenant-a"]), 2).await,
        [pair("gus-1", "tenant-a"), pair("gus-2", "tenant-a")],
        "{backend:?}"
    );
    bare.close().await;
}
