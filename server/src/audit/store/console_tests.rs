//! The console's state on both stores: expiry, the caps and who gives way,
//! logins used once, the bound on a session's views. Postgres runs as a
//! runtime role holding only what `migrate --runtime-role` grants.

use sqlx::Connection;

use super::*;
use crate::audit::store::StoreOptions;

const MINUTE: i64 = 60_000;

fn limits(max: i64) -> SessionLimits {
    SessionLimits {
        max,
        idle_ms: 15 * MINUTE,
        lifetime_ms: 60 * MINUTE,
    }
}

/// A hex id hash of 64 characters, distinct per `name`.
fn hash(name: &str) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, name.as_bytes()))
}

async fn open(store: &AuditStore, id: &str, subject: &str, max: i64, now: i64) {
    let session = NewSession {
        id_hash: &hash(id),
        subject,
        identity: &format!("{{\"subject\":\"{subject}\"}}"),
    };
    store
        .console_open_session(session, limits(max), now)
        .await
        .unwrap();
}

async fn live(store: &AuditStore, id: &str, now: i64) -> bool {
    store
        .console_session(&hash(id), limits(100), now)
        .await
        .unwrap()
        .is_some()
}

async fn start(store: &AuditStore, id: &str, address: &str, max: i64, now: i64) {
    let login = NewLogin {
        id_hash: &hash(id),
        address,
        return_to: "/ui?user=a",
    };
    store.console_start_login(login, max, now).await.unwrap();
}

async fn count(store: &AuditStore, sql: &'static str) -> i64 {
    pooled!(store, pool => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap())
}

/// Every behaviour, against `store` (migrated).
async fn the_console_state_holds_its_bounds(store: &AuditStore) {
    let t = 1_800_000_000_000_i64;

    // Idle and lifetime: each ends a session, which is then deleted.
    open(store, "idle", "a", 100, t).await;
    assert!(live(store, "idle", t + 14 * MINUTE).await);
    assert!(live(store, "idle", t + 28 * MINUTE).await, "each use counts");
    assert!(!live(store, "idle", t + 44 * MINUTE).await, "idle 16 minutes");
    open(store, "old", "b", 100, t).await;
    for minute in (10..60).step_by(10) {
        assert!(live(store, "old", t + minute * MINUTE).await);
    }
    assert!(!live(store, "old", t + 60 * MINUTE).await, "past its lifetime");
    assert_eq!(count(store, "SELECT count(*) FROM console_sessions").await, 0);
    // An ended session left alone is swept when another opens.
    open(store, "forgotten", "c", 100, t).await;
    open(store, "next", "d", 100, t + 30 * MINUTE).await;
    assert_eq!(count(store, "SELECT count(*) FROM console_sessions").await, 1);
    store.console_close_session(&hash("next")).await.unwrap();
    assert!(!live(store, "next", t + 31 * MINUTE).await, "closed everywhere");

    // One person holds 5; their sixth ends their least recently used.
    let t = t + 2 * 60 * MINUTE;
    for n in 0..5 {
        open(store, &format!("many-{n}"), "many", 100, t + n).await;
    }
    open(store, "other", "other", 100, t).await;
    assert!(live(store, "many-0", t + 10).await, "many-0 used again");
    open(store, "many-5", "many", 100, t + 11).await;
    assert!(
        !live(store, "many-1", t + 12).await,
        "the least recently used gave way"
    );
    // Used one after another, least recently first.
    let used = ["many-0", "many-2", "many-3", "many-4", "many-5", "other"];
    for (n, id) in (12..).zip(used) {
        assert!(live(store, id, t + n).await, "{id}");
    }
    // Every place taken: the least recently used session gives way.
    open(store, "x", "x", 6, t + 20).await;
    assert!(!live(store, "many-0", t + 21).await);
    assert_eq!(count(store, "SELECT count(*) FROM console_sessions").await, 6);
    open(store, "y", "y", 3, t + 30).await;
    assert_eq!(count(store, "SELECT count(*) FROM console_sessions").await, 3);
    for id in ["x", "y", "other"] {
        assert!(live(store, id, t + 31).await, "{id}");
    }

    // Views: once each, at most 4,096 per session.
    let session = hash("x");
    assert!(!store.console_seen_view(&session, "v").await.unwrap());
    assert!(store.console_first_view(&session, "v").await.unwrap());
    assert!(!store.console_first_view(&session, "v").await.unwrap());
    assert!(store.console_seen_view(&session, "v").await.unwrap());
    for n in 0..VIEWS_PER_SESSION + 10 {
        assert!(
            store
                .console_first_view(&session, &format!("view {n}"))
                .await
                .unwrap()
        );
    }
    let held = "SELECT count(*) FROM console_views";
    assert_eq!(count(store, held).await, VIEWS_PER_SESSION);
    assert!(!store.console_first_view(&session, "view 4100").await.unwrap());
    assert!(
        !store.console_seen_view(&session, "view 0").await.unwrap(),
        "the oldest was forgotten"
    );
    assert!(store.console_seen_view(&session, "view 10").await.unwrap());
    assert!(
        !store.console_first_view(&hash("gone"), "v").await.unwrap(),
        "no session"
    );
    store.console_close_session(&session).await.unwrap();
    assert_eq!(count(store, held).await, 0, "views go with their session");

    // Logins: used once, on any replica; not after ten minutes.
    start(store, "login", "198.51.100.1", 100, t).await;
    let taken = store.console_take_login(&hash("login"), t + 1).await.unwrap();
    assert_eq!(taken.as_deref(), Some("/ui?user=a"));
    assert_eq!(
        store.console_take_login(&hash("login"), t + 2).await.unwrap(),
        None
    );
    start(store, "slow", "198.51.100.1", 100, t).await;
    let late = store
        .console_take_login(&hash("slow"), t + LOGIN_TIMEOUT_MS)
        .await;
    assert_eq!(late.unwrap(), None, "too late");
    start(store, "swept", "198.51.100.1", 100, t).await;
    start(store, "later", "198.51.100.2", 100, t + LOGIN_TIMEOUT_MS).await;
    assert_eq!(
        count(store, "SELECT count(*) FROM console_logins").await,
        1,
        "expired swept"
    );

    // A flood from one address pushes out only its own.
    let t = t + LOGIN_TIMEOUT_MS;
    for n in 0..20 {
        start(store, &format!("other {n}"), &format!("192.0.2.{n}"), 40, t).await;
    }
    for n in 0..100 {
        start(store, &format!("flood {n}"), "203.0.113.66", 40, t + n).await;
    }
    let flood = "SELECT count(*) FROM console_logins WHERE address = '203.0.113.66'";
    assert_eq!(count(store, flood).await, LOGINS_PER_ADDRESS);
    assert!(
        store
            .console_take_login(&hash("flood 99"), t + 100)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .console_take_login(&hash("flood 0"), t + 100)
            .await
            .unwrap()
            .is_none()
    );
    for n in 0..20 {
        let other = store
            .console_take_login(&hash(&format!("other {n}")), t + 100)
            .await;
        assert!(other.unwrap().is_some(), "another address's login stays");
    }
    // Full: the address holding the most gives way.
    assert_eq!(count(store, flood).await, LOGINS_PER_ADDRESS - 1);
    for n in 0..40 {
        start(
            store,
            &format!("more {n}"),
            &format!("192.0.2.{}", n % 20),
            40,
            t + 200,
        )
        .await;
    }
    assert!(count(store, flood).await < LOGINS_PER_ADDRESS - 1);
    assert!(count(store, "SELECT count(*) FROM console_logins").await <= 40);
}

#[tokio::test]
async fn the_console_state_on_sqlite() {
    let dir = std::env::temp_dir().join(format!(
        "talos-sso-console-{}",
        crate::random::random_hex(6).unwrap()
    ));
    let url = format!("sqlite://{}/audit.db", dir.display());
    let store = AuditStore::connect(&url, &StoreOptions::default()).await.unwrap();
    store.migrate().await.unwrap();
    the_console_state_holds_its_bounds(&store).await;
    store.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn the_console_state_on_postgres_as_the_runtime_role() {
    let admin_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut admin = sqlx::PgConnection::connect(&admin_url).await.unwrap_or_else(|e| {
        panic!("Postgres is needed for this test and is not reachable at {admin_url} ({e}); start it or set DATABASE_URL")
    });
    let name = format!("talos_sso_console_{}", crate::random::random_hex(6).unwrap());
    let runtime = format!("{name}_app");
    for sql in [
        format!("CREATE DATABASE {name}"),
        format!("CREATE ROLE {runtime} LOGIN"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let url_as = |role: Option<&str>| {
        let mut url = url::Url::parse(&admin_url).unwrap();
        url.set_path(&format!("/{name}"));
        if let Some(role) = role {
            url.set_username(role).unwrap();
            url.set_password(None).unwrap();
        }
        url.to_string()
    };
    let owner = AuditStore::connect(&url_as(None), &StoreOptions::default())
        .await
        .unwrap();
    owner.migrate().await.unwrap();
    owner.grant_runtime_role(&runtime).await.unwrap();
    owner.close().await;
    let store = AuditStore::connect(&url_as(Some(&runtime)), &StoreOptions::default())
        .await
        .unwrap();
    the_console_state_holds_its_bounds(&store).await;
    store.close().await;
    for sql in [
        format!("DROP DATABASE {name} WITH (FORCE)"),
        format!("DROP ROLE {runtime}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .unwrap();
    }
}
