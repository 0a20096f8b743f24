//! The SQLite backend (the embedded default, one node): its private file,
//! its two pools (readers, and the one connection appends go through), its
//! SQL, `BEGIN IMMEDIATE` as the lock that serialises chain appends, how its
//! rows decode (times as text, lists as JSON), and which of its errors blame
//! the data.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sqlx::error::DatabaseError;
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::query::Query;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteError, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Connection, Row, Sqlite, Transaction};
use time::OffsetDateTime;
use tokio::sync::{Mutex, MutexGuard};

use super::batch::{BatchTx, Claim, HeadAndDenied, HeadOrDenied, Identities, head_and_denied};
use super::chain::append_in;
use super::query::{
    COLUMNS, DENY_LIST_SQL, DenyRow, HEAD_SQL, RecordRow, Statement, bound, deny_entry, deny_list_sql,
    stored_record,
};
use super::types::{Append, Appended, DenyEntry, StoreError, StoreOptions};
use crate::audit::{StoredRecord, format_micros, parse_micros};

/// The files of `migrations/sqlite`, embedded at build time; each file's
/// name gives its version and description.
pub(super) static MIGRATOR: Migrator = sqlx::migrate!("../migrations/sqlite");

/// The SQLite store: a pool for reads (and migrations), and one connection
/// of its own for the chain's appends.
///
/// Appends are serialised anyway (`BEGIN IMMEDIATE`), and one connection
/// keeps what they need warm: SQLite empties a connection's page cache
/// whenever another connection wrote since it last read, so appends taking
/// turns on a pool's connections read every index page they touch again
/// (docs/evidence/performance.md, "SQLite's cost per record"). The connection is
/// kept between batches rather than given back to its pool, which would
/// return it in a task of its own that the next batch waits for.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// Where the append connection comes from: a pool of one, holding its
    /// settings.
    appends: SqlitePool,
    /// The append connection between batches; `None` before the first and
    /// after a failure.
    held: Arc<Mutex<Option<PoolConnection<Sqlite>>>>,
}

/// The append connection, for one batch: other appends wait for it.
pub(super) struct Appender<'a>(MutexGuard<'a, Option<PoolConnection<Sqlite>>>);

impl Appender<'_> {
    pub(super) fn connection(&mut self) -> Result<&mut PoolConnection<Sqlite>, StoreError> {
        self.0
            .as_mut()
            .ok_or_else(|| StoreError::Unavailable("the append connection is gone".into()))
    }

    /// After a failure: the connection is closed, not kept.
    fn discard(&mut self) {
        if let Some(mut connection) = self.0.take() {
            connection.close_on_drop();
        }
    }
}

impl SqliteStore {
    /// The pool for reads and migrations.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// `AuditStore::append_batch` on the kept append connection.
    /// A batch that failed closes it (its transaction may not have ended
    /// cleanly), and the readers' idle connections too
    /// ([`Self::close_idle_readers`]).
    pub(super) async fn append_batch(&self, batch: &[Append]) -> Result<Vec<Appended>, StoreError> {
        let result = async {
            let mut appender = self.appender().await?;
            let result = append_in(begin_chain(appender.connection()?), batch, || ()).await;
            if result.is_err() {
                appender.discard();
            }
            result
        }
        .await;
        if result.is_err() {
            self.close_idle_readers();
        }
        result
    }

    /// The append connection: the one kept, or a new one from its pool.
    pub(super) async fn appender(&self) -> Result<Appender<'_>, StoreError> {
        let mut held = self.held.lock().await;
        if held.is_none() {
            *held = Some(self.appends.acquire().await?);
        }
        Ok(Appender(held))
    }

    /// Close the readers' idle connections (after an append failed).
    /// Connections of one process to one file share SQLite's memory-mapped
    /// WAL index: one opened while the file system was read-only leaves it
    /// read-only for every connection, new ones included, until the last
    /// connection sharing it closes. Appends fail meanwhile, and the
    /// readers, which never write, would otherwise keep it forever.
    fn close_idle_readers(&self) {
        while let Some(mut connection) = self.pool.try_acquire() {
            connection.close_on_drop();
        }
    }

    pub(super) async fn close(&self) {
        // Given back, so that closing the pool closes it.
        self.held.lock().await.take();
        self.appends.close().await;
        self.pool.close().await;
    }
}

/// Pages the append connection keeps in memory (SQLite's `cache_size`,
/// negative: in KiB): the interior pages and the recently written leaves of
/// the table and its indexes. Readers keep SQLite's default (2 MiB each).
const APPEND_CACHE_KIB: i64 = 32 * 1024;

/// `url` is `sqlite://<path>[?options]`; the file is created private when
/// missing.
pub(super) async fn connect(
    url: &str,
    path: &str,
    options: &StoreOptions,
) -> Result<SqliteStore, StoreError> {
    create_private_file(path.split('?').next().unwrap_or(path))?;
    let connect = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(options.max_connections.clamp(1, 4))
        .acquire_timeout(options.acquire_timeout)
        .connect_with(connect.clone())
        .await?;
    // Temporary data of a statement (the journal that undoes one statement
    // of a transaction, the role trigger's `UNION`) in memory rather than
    // in files made, written and removed for each batch: it never outlives
    // its transaction, so durability does not depend on it.
    let appends = connect
        .pragma("temp_store", "memory")
        .pragma("cache_size", (-APPEND_CACHE_KIB).to_string());
    // No ping before each batch (a round trip to the connection's worker
    // thread): a file does not hang up, and a batch that fails closes its
    // connection anyway.
    let appends = SqlitePoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .acquire_timeout(options.acquire_timeout)
        .connect_with(appends)
        .await?;
    Ok(SqliteStore {
        pool,
        appends,
        held: Arc::default(),
    })
}

/// Whether SQLite refused a statement for its data: primary result codes
/// 18 (TOOBIG), 19 (CONSTRAINT), 20 (MISMATCH) and 25 (RANGE).
pub(super) fn refuses_the_data(error: &dyn DatabaseError) -> bool {
    error
        .try_downcast_ref::<SqliteError>()
        .and_then(|error| error.code())
        .is_some_and(|code| result_code_blames_the_data(&code))
}

/// `code` is an extended result code; its low byte is the primary one.
fn result_code_blames_the_data(code: &str) -> bool {
    code.parse::<u32>()
        .is_ok_and(|code| matches!(code & 0xff, 18 | 19 | 20 | 25))
}

/// A role filter for placeholder `$n`: granted or requested. The roles
/// are JSON lists in the records; `audit_event_roles` (migration 0004)
/// holds one row per record and role, keyed by `(role, seq)`.
///
/// For a scan in `seq` order, which stops at the page's last match: a text
/// search for the quoted role in the record it has read is the cheapest
/// first sieve (most records hold none of it), that key the exact test.
/// Listing the role's records first would read all of them: hundreds of
/// milliseconds for a role most records hold.
pub(super) fn role_condition(n: usize) -> String {
    format!(
        "((instr(roles_granted, json_quote(${n})) > 0 OR instr(roles_requested, json_quote(${n})) > 0) \
         AND EXISTS (SELECT 1 FROM audit_event_roles WHERE role = ${n} AND seq = audit_events.seq))"
    )
}

/// The same filter for a query whose matches are all found, then sorted
/// (a time bound on the far side, [`Statement::matching`]): the role's records,
/// listed from that key, rather than a lookup for every record of the
/// window (a third of the trail for 30 days).
pub(super) fn role_condition_far(n: usize) -> String {
    format!("seq IN (SELECT seq FROM audit_event_roles WHERE role = ${n})")
}

/// The test that a record is an API call, written `+event` so that SQLite
/// does not seek the event's index for it: without statistics it would
/// rather read every call through that index (and sort them) than seek a
/// method or a prefix of one in the method's (measured in docs/audit.md,
/// "API calls on a large trail"), which is why that index is not partial.
pub(super) const API_CALL: &str = "+event = 'api.call'";

/// An `api.call` record's method, written as its index (migration 0009).
pub(super) const METHOD: &str = "json_extract(details, '$.method')";

/// A node filter for placeholder `$n`: a member of the record's list of
/// nodes (a list only: a node given as one text is not one of a list).
/// No index holds them; as for a role, a text search for the quoted node
/// is the cheap first sieve, the list the exact test.
pub(super) fn node_condition(n: usize) -> String {
    format!(
        "(instr(details, json_quote(${n})) > 0 AND json_type(details, '$.nodes') = 'array' \
         AND EXISTS (SELECT 1 FROM json_each(audit_events.details, '$.nodes') WHERE value = ${n}))"
    )
}

/// The test that a record is a workload's (it holds `details.workload`),
/// written as the predicate of the partial index `audit_events_workload`
/// (migration 0010), which SQLite uses only for a query that states it.
pub(super) const WORKLOAD: &str = "json_type(details, '$.workload') IS NOT NULL";

/// A kind filter for placeholder `$n`, written as the index
/// `audit_events_workload_kind` (migration 0010) holds it, which is not
/// partial: the kind alone is the whole test.
pub(super) fn kind_condition(n: usize) -> String {
    format!("json_extract(details, '$.workload.kind') = ${n}")
}

/// The test that a record is a person's: a verified identity, no workload.
pub(super) const PERSON: &str = "identity_verified = 1 AND json_type(details, '$.workload') IS NULL";

pub(super) async fn records(pool: &SqlitePool, query: Statement) -> Result<Vec<StoredRecord>, StoreError> {
    let rows = bound(query, format_micros).fetch_all(pool).await?;
    rows.iter().map(stored_record).collect()
}

/// A record's hour or day as the charts name it (`YYYY-MM-DD[ HH:00]`),
/// from its time as stored (text, UTC).
pub(super) fn chart_bucket(hourly: bool) -> String {
    let (length, suffix) = if hourly { (13, ":00") } else { (10, "") };
    format!("replace(substr(occurred_at, 1, {length}), 'T', ' ') || '{suffix}'")
}

/// A record's granted roles as rows, for the charts: the row source and
/// the column naming one role.
pub(super) const GRANTED_ROLES: (&str, &str) = ("json_each(audit_events.roles_granted) AS r", "r.value");

pub(super) async fn deny_list(pool: &SqlitePool) -> Result<Vec<DenyEntry>, StoreError> {
    let rows: Vec<DenyRow<String>> = sqlx::query_as(DENY_LIST_SQL).fetch_all(pool).await?;
    rows.into_iter()
        .map(|(subject, username, reason, added_by, added_at, expires_at)| {
            let time = |column: &str, text: &str| {
                parse_micros(text).ok_or_else(|| StoreError::Corrupt(format!("deny_list.{column} `{text}`")))
            };
            let added_at = time("added_at", &added_at)?;
            let expires_at = expires_at.map(|e| time("expires_at", &e)).transpose()?;
            Ok(deny_entry((
                subject, username, reason, added_by, added_at, expires_at,
            )))
        })
        .collect()
}

/// A `BEGIN IMMEDIATE` transaction: it holds the write lock from the
/// start, so no other writer reads the same chain head.
pub(super) async fn begin_chain(
    connection: &mut PoolConnection<Sqlite>,
) -> Result<Transaction<'_, Sqlite>, StoreError> {
    Ok(connection.begin_with("BEGIN IMMEDIATE").await?)
}

/// A deny-list entry names one of the subjects (`?1`) or usernames (`?2`),
/// each bound as a JSON list.
macro_rules! deny_matches {
    () => {
        "subject IN (SELECT value FROM json_each(?1)) OR username IN (SELECT value FROM json_each(?2))"
    };
}

impl BatchTx for Transaction<'_, Sqlite> {
    async fn head(&mut self) -> Result<Option<(i64, String)>, StoreError> {
        Ok(sqlx::query_as(HEAD_SQL).fetch_optional(&mut **self).await?)
    }

    async fn head_and_denied(&mut self, checked: &Identities) -> Result<HeadAndDenied, StoreError> {
        let rows: Vec<HeadOrDenied> =
            sqlx::query_as(deny_list_sql!(head_and_denied, "NULL", deny_matches!()))
                .bind(json_list(&checked.subjects))
                .bind(json_list(&checked.usernames))
                .fetch_all(&mut **self)
                .await?;
        head_and_denied(rows)
    }

    async fn insert_claims(&mut self, distinct: &[&Claim<'_>]) -> Result<Vec<String>, StoreError> {
        let mut inserted = Vec::with_capacity(distinct.len());
        for chunk in distinct.chunks(rows_per_statement(3)) {
            let sql = format!(
                "INSERT INTO used_tokens (token_id, used_at, expires_at) VALUES {} \
                 ON CONFLICT (token_id) DO NOTHING RETURNING token_id",
                placeholder_rows(3, chunk.len())
            );
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
            for (claim, at) in chunk {
                query = query
                    .bind(&claim.token_id)
                    .bind(format_micros(*at))
                    .bind(claim.expires_at.map(format_micros));
            }
            inserted.extend(query.fetch_all(&mut **self).await?);
        }
        Ok(inserted)
    }

    async fn execute(&mut self, statement: Statement) -> Result<u64, StoreError> {
        let done = bound(statement, format_micros).execute(&mut **self).await?;
        Ok(done.rows_affected())
    }

    async fn commit(self) -> Result<(), sqlx::Error> {
        Transaction::commit(self).await
    }

    async fn insert_records(&mut self, records: &[StoredRecord]) -> Result<(), StoreError> {
        for chunk in records.chunks(rows_per_statement(RECORD_COLUMNS)) {
            let sql = format!(
                "INSERT INTO audit_events ({COLUMNS}) VALUES {}",
                placeholder_rows(RECORD_COLUMNS, chunk.len())
            );
            chunk
                .iter()
                .fold(sqlx::query(sqlx::AssertSqlSafe(sql)), bind_record)
                .execute(&mut **self)
                .await?;
        }
        Ok(())
    }
}

/// The columns of [`COLUMNS`].
const RECORD_COLUMNS: usize = 28;

/// Most placeholders SQLite takes in one statement (its
/// `SQLITE_MAX_VARIABLE_NUMBER`, as the bundled library is built).
const MAX_VARIABLES: usize = 32_766;

/// Most rows of `columns` values one multi-row `INSERT` may carry: the
/// writer's batches ([`crate::audit::writer::MAX_BATCH`]) always fit in
/// one statement per table; larger batches of other callers are split.
fn rows_per_statement(columns: usize) -> usize {
    (MAX_VARIABLES / columns).max(1)
}

/// `(?,?,?),(?,?,?)` for `rows` rows of `columns` values.
fn placeholder_rows(columns: usize, rows: usize) -> String {
    let row = format!("({})", vec!["?"; columns].join(","));
    vec![row; rows].join(",")
}

/// Bind the values of one stored record, in the order of [`COLUMNS`]:
/// times as text in their one form, lists and details as JSON text.
fn bind_record<'q>(
    query: Query<'q, Sqlite, SqliteArguments>,
    stored: &StoredRecord,
) -> Query<'q, Sqlite, SqliteArguments> {
    let r = &stored.record;
    query
        .bind(stored.seq)
        .bind(format_micros(r.occurred_at))
        .bind(&r.request_id)
        .bind(&r.event)
        .bind(&r.outcome)
        .bind(&r.reason_code)
        .bind(&r.cluster)
        .bind(&r.issuer)
        .bind(&r.tenant)
        .bind(&r.subject)
        .bind(&r.username)
        .bind(r.identity_verified)
        .bind(json_list(&r.groups_evaluated))
        .bind(json_list(&r.roles_requested))
        .bind(json_list(&r.roles_granted))
        .bind(&r.serial)
        .bind(&r.certificate_sha256)
        .bind(&r.public_key_sha256)
        .bind(r.not_before.map(format_micros))
        .bind(r.not_after.map(format_micros))
        .bind(&r.client_ip)
        .bind(&r.user_agent)
        .bind(&r.client_version)
        .bind(&r.token_id)
        .bind(r.token_issued_at.map(format_micros))
        .bind(r.details.to_string())
        .bind(&stored.prev_hash)
        .bind(&stored.hash)
}

/// The SQLite database holds the trail, the deny list and the replay
/// guard: its directory is created 0700 and the file 0600 when missing,
/// whatever the umask. SQLite gives its `-wal` and `-shm` files the
/// database file's mode.
fn create_private_file(path: &str) -> Result<(), StoreError> {
    let path = std::path::Path::new(path);
    let fail =
        |p: &std::path::Path, e: std::io::Error| StoreError::Unavailable(format!("{}: {e}", p.display()));
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir).map_err(|e| fail(dir, e))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(fail(path, e)),
    }
}

/// Lists are stored as JSON arrays of strings.
pub(super) fn json_list(items: &[String]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".into())
}

impl RecordRow for SqliteRow {
    // Each column must read back in exactly the form the server writes:
    // the hash covers the decoded record, so another text of the same
    // value (a time with an offset, a JSON object with a duplicate key)
    // would keep the hash while SQL comparisons and readers of the table
    // see something else.
    fn time(&self, column: &str) -> Result<Option<OffsetDateTime>, StoreError> {
        let text: Option<String> = self.try_get(column)?;
        text.map(|t| {
            parse_micros(&t)
                .filter(|parsed| format_micros(*parsed) == t)
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("{column}: `{}` is not a time in its one form", clean(&t)))
                })
        })
        .transpose()
    }

    fn list(&self, column: &str) -> Result<Vec<String>, StoreError> {
        let text: String = self.try_get(column)?;
        let list: Vec<String> =
            serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(format!("{column}: {e}")))?;
        if json_list(&list) != text {
            return Err(StoreError::Corrupt(format!(
                "{column}: not in the form the server writes"
            )));
        }
        Ok(list)
    }

    fn details(&self) -> Result<Value, StoreError> {
        let text: String = self.try_get("details")?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(format!("details: {e}")))?;
        if serde_json::to_string(&value).ok().as_deref() != Some(text.as_str()) {
            return Err(StoreError::Corrupt(
                "details: not in the form the server writes (a duplicate key, spaces, another number form)"
                    .into(),
            ));
        }
        Ok(value)
    }
}

fn clean(text: &str) -> String {
    talos_sso_text::clean(text, talos_sso_text::FIELD_CHARS)
}

#[cfg(test)]
mod tests {
    use super::result_code_blames_the_data;

    /// A store in a new SQLite file, not migrated, and its directory.
    async fn new_store() -> (std::path::PathBuf, super::super::AuditStore) {
        let dir = std::env::temp_dir().join(format!(
            "talos-sso-sqlite-{}",
            crate::random::random_hex(6).unwrap()
        ));
        let url = format!("sqlite://{}/audit.db", dir.display());
        let store = super::super::AuditStore::connect(&url, &super::StoreOptions::default())
            .await
            .unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn appends_go_through_one_connection_set_for_them() {
        let (dir, store) = new_store().await;
        let super::super::AuditStore::Sqlite(sqlite) = &store else {
            panic!("a sqlite:// URL opens SQLite")
        };
        assert_eq!(sqlite.appends.options().get_max_connections(), 1);
        let pragma = |pool: &super::SqlitePool, name: &'static str| {
            let pool = pool.clone();
            async move {
                let value: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("PRAGMA {name}")))
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                value
            }
        };
        let appends = &sqlite.appends;
        assert_eq!(pragma(appends, "temp_store").await, 2, "temp_store = MEMORY");
        assert_eq!(pragma(appends, "cache_size").await, -super::APPEND_CACHE_KIB);
        // Durability is the same on every connection: each commit synced.
        for pool in [appends, sqlite.pool()] {
            assert_eq!(pragma(pool, "synchronous").await, 2, "synchronous = FULL");
        }
        // The WAL is copied back every 1,000 pages (4 MiB), SQLite's default:
        // a larger WAL fills a small disk by itself, and a full disk then
        // refuses the commit that would have checkpointed it.
        for pool in [appends, sqlite.pool()] {
            assert_eq!(pragma(pool, "wal_autocheckpoint").await, 1000);
        }
        // Readers keep SQLite's default cache.
        assert_eq!(pragma(sqlite.pool(), "cache_size").await, -2000);
        // Kept between batches: never idle in its pool, never a second one.
        store.migrate().await.unwrap();
        for _ in 0..2 {
            store
                .append_batch(&[super::super::Append::default()])
                .await
                .unwrap();
            // Long enough for a connection given back to be idle again.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            assert_eq!((sqlite.appends.size(), sqlite.appends.num_idle()), (1, 0));
        }
        store.close().await;
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn an_append_that_fails_closes_the_idle_readers() {
        let (dir, store) = new_store().await;
        let super::super::AuditStore::Sqlite(sqlite) = &store else {
            panic!("a sqlite:// URL opens SQLite")
        };
        sqlx::query("SELECT 1").execute(sqlite.pool()).await.unwrap();
        // A connection goes back to the pool in a task of its own.
        for _ in 0..100 {
            if sqlite.pool().num_idle() > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(sqlite.pool().num_idle() > 0);
        // Not migrated: there is no table to append to.
        let failed = store.append_batch(&[super::super::Append::default()]).await;
        assert!(failed.is_err(), "{failed:?}");
        assert_eq!(sqlite.pool().num_idle(), 0, "the idle readers are closed");
        assert!(
            sqlite.held.lock().await.is_none(),
            "the append connection is not kept"
        );
        // The readers open again when asked.
        sqlx::query("SELECT 1").execute(sqlite.pool()).await.unwrap();
        store.close().await;
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_batch_statement_has_a_placeholder_for_each_column_of_each_row() {
        assert_eq!(super::COLUMNS.split(',').count(), super::RECORD_COLUMNS);
        assert_eq!(super::placeholder_rows(3, 2), "(?,?,?),(?,?,?)");
        // The writer's largest batch is one statement.
        let rows = super::rows_per_statement(super::RECORD_COLUMNS);
        assert!(rows >= crate::audit::writer::MAX_BATCH, "{rows}");
        assert!(rows * super::RECORD_COLUMNS <= super::MAX_VARIABLES);
    }

    #[test]
    fn only_data_errors_are_the_records_fault() {
        // Constraint (and its extended codes), too big, mismatch, range.
        for code in ["19", "2067", "275", "18", "20", "25"] {
            assert!(result_code_blames_the_data(code), "{code}");
        }
        // Busy, locked, I/O, full, no memory, read-only.
        for code in ["5", "6", "10", "13", "7", "8", "517"] {
            assert!(!result_code_blames_the_data(code), "{code}");
        }
    }
}
