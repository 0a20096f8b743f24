//! The Postgres backend (production; several replicas share one database):
//! its pool, its SQL, the advisory lock that serialises chain appends, how
//! its rows decode, and which of its errors blame the data.

use serde_json::Value;
use sqlx::error::DatabaseError;
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{
    PgBindIterExt, PgConnection, PgDatabaseError, PgPool, PgPoolOptions, PgRow, PgSeverity,
};
use sqlx::{Postgres, Row};
use time::OffsetDateTime;

use super::batch::{BatchTx, Claim, HeadAndDenied, HeadOrDenied, Identities, head_and_denied};
use super::query::{
    COLUMNS, DENY_LIST_SQL, DenyRow, HEAD_SQL, RecordRow, Statement, bound, deny_entry, deny_list_sql,
    stored_record,
};
use super::types::{DenyEntry, StoreError, StoreOptions};
use crate::audit::{AuditRecord, StoredRecord};

/// Postgres advisory lock key that serialises chain appends (any constant
/// works; this one spells "talosSSO" in a way nobody else will pick);
/// [`BEGIN_CHAIN`] spells it in decimal.
#[cfg(test)]
const CHAIN_LOCK_KEY: i64 = 0x7461_6c6f_7353_534f;

/// The files of `migrations/postgres`, embedded at build time; each file's
/// name gives its version and description.
pub(super) static MIGRATOR: Migrator = sqlx::migrate!("../migrations/postgres");

pub(super) async fn connect(url: &str, options: &StoreOptions) -> Result<PgPool, StoreError> {
    Ok(PgPoolOptions::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .connect(url)
        .await?)
}

/// The group-commit writer's pool: `pool`'s database and acquire timeout,
/// at most two connections, none opened before the writer asks (from its own
/// runtime: `AuditStore::for_writer`).
///
/// No ping when a connection is handed out: sqlx already pings each one
/// as it is handed back (before it is idle again), so a second ping only
/// delayed every batch, or the lock taken ahead for it, by a round trip.
/// A connection that died while idle (Postgres restarted, the backend
/// terminated, `idle_session_timeout`) is found out by the batch's first
/// statement instead, which [`ChainTx::begin`] sends again on another.
pub(super) fn writer_pool(pool: &PgPool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .test_before_acquire(false)
        .acquire_timeout(pool.options().get_acquire_timeout())
        .connect_lazy_with((*pool.connect_options()).clone())
}

/// Whether `error`, the answer to a transaction's first statement, says
/// that the connection was dead before it was sent, rather than anything
/// about the statement: cut (an I/O error; what a crash or an immediate
/// shutdown leaves, its notice being only a warning), or ended by the
/// server with a `FATAL` error, which ends the session (57P01 when the
/// backend was terminated, 57P05 an idle session timeout; a pooler's own
/// codes).
fn connection_was_dead(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(error) => error
            .try_downcast_ref::<PgDatabaseError>()
            .is_some_and(|error| matches!(error.severity(), PgSeverity::Fatal | PgSeverity::Panic)),
        _ => false,
    }
}

/// How many connections [`ChainTx::begin`] tries: the writer's pool holds
/// two, which may both have died while idle, and then a new one. The
/// server's pool tests each connection as it hands it out.
const BEGIN_TRIES: u32 = 3;

/// SQLSTATE classes that blame the data: 22 (data exception), 23
/// (integrity constraint) and 54 (program limit, e.g. a row too large).
fn sqlstate_blames_the_data(sqlstate: &str) -> bool {
    matches!(sqlstate.get(..2), Some("22" | "23" | "54"))
}

/// Whether Postgres refused a statement for its data.
pub(super) fn refuses_the_data(error: &dyn DatabaseError) -> bool {
    let postgres = error.try_downcast_ref::<PgDatabaseError>();
    postgres.is_some_and(|error| sqlstate_blames_the_data(error.code()))
}

/// A role filter for placeholder `$n`: granted or requested. Written as
/// containment in both lists together, the form the GIN index
/// `audit_events_roles` (migration 0004) serves.
pub(super) fn role_condition(n: usize) -> String {
    format!("(roles_granted || roles_requested) @> ARRAY[${n}::text]")
}

/// The test that a record is an API call: the predicate of the partial
/// indexes of migration 0009, which a query must state for them to serve.
pub(super) const API_CALL: &str = "event = 'api.call'";

/// An `api.call` record's method as its index holds it (migration 0009):
/// compared byte by byte, so that a prefix is a range.
pub(super) const METHOD: &str = "(details->>'method') COLLATE \"C\"";

/// A node filter for placeholder `$n`: a member of the record's list of
/// nodes, as the GIN index `audit_events_api_nodes` (migration 0009) serves.
pub(super) fn node_condition(n: usize) -> String {
    format!("details->'nodes' @> jsonb_build_array(${n}::text)")
}

/// The test that a record is a workload's (it holds `details.workload`):
/// the predicate of the partial indexes of migration 0010, which a query
/// must state for them to serve.
pub(super) const WORKLOAD: &str = "details ? 'workload'";

/// A kind filter for placeholder `$n`: the record is a workload's of that
/// kind, as the index `audit_events_workload_kind` (migration 0010) holds
/// it: compared as JSON, so that a kind that is not a string (`7`) is not
/// the text `'7'` (SQLite's `json_extract` keeps the two apart too).
pub(super) fn kind_condition(n: usize) -> String {
    format!("{WORKLOAD} AND details->'workload'->'kind' = to_jsonb(${n}::text)")
}

/// The test that a record is a person's: a verified identity, no workload.
pub(super) const PERSON: &str = "identity_verified AND NOT (details ? 'workload')";

pub(super) async fn records(pool: &PgPool, query: Statement) -> Result<Vec<StoredRecord>, StoreError> {
    let rows = bound(query, std::convert::identity).fetch_all(pool).await?;
    rows.iter().map(stored_record).collect()
}

/// A record's hour or day as the charts name it (`YYYY-MM-DD[ HH:00]`, UTC).
pub(super) fn chart_bucket(hourly: bool) -> String {
    let (unit, format) = if hourly {
        ("hour", "YYYY-MM-DD HH24:00")
    } else {
        ("day", "YYYY-MM-DD")
    };
    format!("to_char(date_trunc('{unit}', occurred_at AT TIME ZONE 'UTC'), '{format}')")
}

/// A record's granted roles as rows, for the charts: the row source and
/// the column naming one role.
pub(super) const GRANTED_ROLES: (&str, &str) = ("unnest(roles_granted) AS role", "role");

pub(super) async fn deny_list(pool: &PgPool) -> Result<Vec<DenyEntry>, StoreError> {
    let rows: Vec<DenyRow<OffsetDateTime>> = sqlx::query_as(DENY_LIST_SQL).fetch_all(pool).await?;
    Ok(rows.into_iter().map(deny_entry).collect())
}

/// A batch's transaction: a pooled connection on which [`BEGIN_CHAIN`] was
/// sent, so that it holds the chain's lock, and which this type alone ends.
/// It is not a `sqlx::Transaction` because it is opened in one task (a
/// [`LockAhead`]) and carried on in another; a transaction that did not
/// commit (an error, a timeout, a lock ahead nobody took) closes its
/// connection when dropped, which ends the transaction and frees the lock
/// at once, rather than going back to the pool with either still open.
pub(super) struct ChainTx {
    connection: PoolConnection<Postgres>,
    open: bool,
}

impl ChainTx {
    /// A connection from `pool`, then the chain's lock, waited for as long
    /// as another transaction holds it. A pooled connection found dead by
    /// `BEGIN` is closed and another tried, [`BEGIN_TRIES`] in all: a
    /// `BEGIN` writes nothing, and a dead session holds no lock, so
    /// sending it again cannot write anything twice.
    pub(super) async fn begin(pool: &PgPool) -> Result<Self, StoreError> {
        let mut tries = BEGIN_TRIES;
        loop {
            let mut tx = Self {
                connection: pool.acquire().await?,
                // Closed if dropped from here on, half-begun included.
                open: true,
            };
            match sqlx::raw_sql(BEGIN_CHAIN).execute(&mut *tx.connection).await {
                Ok(_) => return Ok(tx),
                Err(error) if tries > 1 && connection_was_dead(&error) => {
                    tracing::info!(%error, "audit store: a pooled connection was dead; beginning on another");
                    tries -= 1;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    pub(super) fn connection(&mut self) -> &mut PgConnection {
        &mut self.connection
    }

    /// End it without writing (a read under the lock); the lock is freed.
    pub(super) async fn rollback(mut self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("ROLLBACK").execute(self.connection()).await?;
        self.open = false;
        Ok(())
    }
}

impl Drop for ChainTx {
    fn drop(&mut self) {
        if self.open {
            self.connection.close_on_drop();
        }
    }
}

/// The next batch's transaction, begun while the current batch commits:
/// the pool hands out a connection and Postgres queues the lock request
/// behind the current transaction while its `COMMIT` is on the way, so the
/// next batch starts with the lock already granted instead of spending two
/// round trips after the commit (the writer's cycle is what sets the pace
/// under load: docs/evidence/performance.md). The lock is granted only once the
/// current transaction has ended, so the next batch still reads the head
/// that commit left. Dropped untaken, it closes its connection, which
/// frees the lock: a lock ahead is only ever taken by the very next batch,
/// and dropped when the batch before it fails (the retries and the
/// read-back that follow a failure need the lock themselves).
pub struct LockAhead(tokio::task::JoinHandle<Result<ChainTx, StoreError>>);

impl LockAhead {
    pub(super) fn start(pool: &PgPool) -> Self {
        let pool = pool.clone();
        Self(tokio::spawn(async move { ChainTx::begin(&pool).await }))
    }

    /// The transaction, once its lock is granted; `None` when it failed
    /// (no connection, or it broke while waiting), having begun nothing.
    pub(super) async fn take(mut self) -> Option<ChainTx> {
        (&mut self.0).await.ok()?.ok()
    }
}

impl Drop for LockAhead {
    /// Stops the task if it is still waiting; a transaction it already
    /// began is dropped with the task's output, which closes it.
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl std::fmt::Debug for LockAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LockAhead")
    }
}

/// `BEGIN`, then the chain's lock, sent together: one round trip. Under
/// `READ COMMITTED` each statement takes its own snapshot, so the head read
/// next (a statement of its own) sees every commit made before the lock
/// was granted. Said explicitly: under a database's or role's default of
/// `REPEATABLE READ` or `SERIALIZABLE`, the snapshot would be taken as the
/// lock is requested, which a lock taken ahead always is before the commit
/// it waits for, and the head read would be stale.
///
/// The transaction's backend may sit idle for 15 s at most (three times
/// [`super::WRITE_TIMEOUT`], after which this server has given the
/// transaction up in any case: a batch sends its statements back to back,
/// and a lock taken ahead is taken by the very next batch) before Postgres
/// ends it, and the lock with it: a server cut off from the
/// database without either side seeing the connection close (a network
/// partition) would otherwise leave the lock held by an orphan until TCP
/// keepalive noticed, hours by default, and every replica's batch would
/// time out meanwhile. Set in the same message, so it costs no round trip.
const BEGIN_CHAIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; \
     SET LOCAL idle_in_transaction_session_timeout = '15s'; \
     SELECT pg_advisory_xact_lock(8386103207072584527)";

/// A deny-list entry names one of the subjects (`$1`) or usernames (`$2`),
/// each bound as an array.
macro_rules! deny_matches {
    () => {
        "subject = ANY($1) OR username = ANY($2)"
    };
}

impl BatchTx for ChainTx {
    async fn head(&mut self) -> Result<Option<(i64, String)>, StoreError> {
        Ok(sqlx::query_as(HEAD_SQL).fetch_optional(self.connection()).await?)
    }

    async fn head_and_denied(&mut self, checked: &Identities) -> Result<HeadAndDenied, StoreError> {
        let rows: Vec<HeadOrDenied> =
            sqlx::query_as(deny_list_sql!(head_and_denied, "NULL::text", deny_matches!()))
                .bind(&checked.subjects)
                .bind(&checked.usernames)
                .fetch_all(self.connection())
                .await?;
        head_and_denied(rows)
    }

    async fn insert_claims(&mut self, distinct: &[&Claim<'_>]) -> Result<Vec<String>, StoreError> {
        let inserted = sqlx::query_scalar(
            "INSERT INTO used_tokens (token_id, used_at, expires_at) \
             SELECT * FROM UNNEST($1::text[], $2::timestamptz[], $3::timestamptz[]) \
             ON CONFLICT (token_id) DO NOTHING RETURNING token_id",
        )
        .bind(distinct.iter().map(|(claim, _)| &claim.token_id).bind_iter())
        .bind(distinct.iter().map(|(_, at)| *at).bind_iter())
        .bind(distinct.iter().map(|(claim, _)| claim.expires_at).bind_iter())
        .fetch_all(self.connection())
        .await?;
        Ok(inserted)
    }

    async fn execute(&mut self, statement: Statement) -> Result<u64, StoreError> {
        let done = bound(statement, std::convert::identity)
            .execute(self.connection())
            .await?;
        Ok(done.rows_affected())
    }

    async fn commit(mut self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("COMMIT").execute(self.connection()).await?;
        self.open = false;
        Ok(())
    }

    async fn insert_records(&mut self, records: &[StoredRecord]) -> Result<(), StoreError> {
        let groups = FlatLists::of(records, |r| &r.groups_evaluated);
        let requested = FlatLists::of(records, |r| &r.roles_requested);
        let granted = FlatLists::of(records, |r| &r.roles_granted);
        // Each column as one array, in the order of `INSERT_RECORDS`.
        macro_rules! column {
            ($value:expr) => {
                records.iter().map($value).bind_iter()
            };
        }
        sqlx::query(sqlx::AssertSqlSafe(INSERT_RECORDS.as_str()))
            .bind(column!(|s| s.seq))
            .bind(column!(|s| s.record.occurred_at))
            .bind(column!(|s| &s.record.request_id))
            .bind(column!(|s| &s.record.event))
            .bind(column!(|s| &s.record.outcome))
            .bind(column!(|s| &s.record.reason_code))
            .bind(column!(|s| &s.record.cluster))
            .bind(column!(|s| &s.record.issuer))
            .bind(column!(|s| &s.record.tenant))
            .bind(column!(|s| &s.record.subject))
            .bind(column!(|s| &s.record.username))
            .bind(column!(|s| s.record.identity_verified))
            .bind(groups.items)
            .bind(groups.from)
            .bind(groups.to)
            .bind(requested.items)
            .bind(requested.from)
            .bind(requested.to)
            .bind(granted.items)
            .bind(granted.from)
            .bind(granted.to)
            .bind(column!(|s| &s.record.serial))
            .bind(column!(|s| &s.record.certificate_sha256))
            .bind(column!(|s| &s.record.public_key_sha256))
            .bind(column!(|s| s.record.not_before))
            .bind(column!(|s| s.record.not_after))
            .bind(column!(|s| &s.record.client_ip))
            .bind(column!(|s| &s.record.user_agent))
            .bind(column!(|s| &s.record.client_version))
            .bind(column!(|s| &s.record.token_id))
            .bind(column!(|s| s.record.token_issued_at))
            .bind(column!(|s| &s.record.details))
            .bind(column!(|s| &s.prev_hash))
            .bind(column!(|s| &s.hash))
            .execute(self.connection())
            .await?;
        Ok(())
    }
}

/// A batch's records in one statement: each column is bound as one array
/// and `UNNEST` turns the arrays back into rows, so that the statement's
/// text (and its prepared plan) is the same whatever the batch's size.
/// The three list columns cannot be arrays of arrays (Postgres arrays are
/// rectangular): each is bound as the concatenation of every record's
/// list, and each row takes its slice of it, `[from:to]` (empty when
/// `from > to`). Placeholders, in order: `seq` ... `identity_verified`
/// ($1 to $12), each list's items, from and to ($13 to $21), `serial` ...
/// `hash` ($22 to $34).
static INSERT_RECORDS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "INSERT INTO audit_events ({COLUMNS}) \
         SELECT seq, occurred_at, request_id, event, outcome, reason_code, cluster, issuer, tenant, subject, \
           username, identity_verified, ($13::text[])[groups_from:groups_to], \
           ($16::text[])[requested_from:requested_to], ($19::text[])[granted_from:granted_to], serial, \
           certificate_sha256, public_key_sha256, not_before, not_after, client_ip, user_agent, client_version, \
           token_id, token_issued_at, details, prev_hash, hash \
         FROM UNNEST($1::int8[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], \
           $8::text[], $9::text[], $10::text[], $11::text[], $12::bool[], $14::int4[], $15::int4[], $17::int4[], \
           $18::int4[], $20::int4[], $21::int4[], $22::text[], $23::text[], $24::text[], $25::timestamptz[], \
           $26::timestamptz[], $27::text[], $28::text[], $29::text[], $30::text[], $31::timestamptz[], \
           $32::jsonb[], $33::text[], $34::text[]) \
         AS batch (seq, occurred_at, request_id, event, outcome, reason_code, cluster, issuer, tenant, subject, \
           username, identity_verified, groups_from, groups_to, requested_from, requested_to, granted_from, \
           granted_to, serial, certificate_sha256, public_key_sha256, not_before, not_after, client_ip, \
           user_agent, client_version, token_id, token_issued_at, details, prev_hash, hash)"
    )
});

/// One list column of a batch, flattened: every record's items in order,
/// and where each record's run starts and ends in them (1-based, inclusive).
struct FlatLists<'a> {
    items: Vec<&'a String>,
    from: Vec<i32>,
    to: Vec<i32>,
}

impl<'a> FlatLists<'a> {
    fn of(records: &'a [StoredRecord], list: fn(&AuditRecord) -> &Vec<String>) -> Self {
        let mut flat = Self {
            items: Vec::new(),
            from: Vec::with_capacity(records.len()),
            to: Vec::with_capacity(records.len()),
        };
        for stored in records {
            let list = list(&stored.record);
            flat.from.push(position(flat.items.len() + 1));
            flat.items.extend(list);
            flat.to.push(position(flat.items.len()));
        }
        flat
    }
}

/// A position in a bound array: Postgres subscripts are `int4`. One past
/// that cannot be wrong silently: an array that long cannot be bound.
fn position(index: usize) -> i32 {
    i32::try_from(index).unwrap_or(i32::MAX)
}

impl RecordRow for PgRow {
    fn time(&self, column: &str) -> Result<Option<OffsetDateTime>, StoreError> {
        Ok(self.try_get(column)?)
    }

    fn list(&self, column: &str) -> Result<Vec<String>, StoreError> {
        Ok(self.try_get(column)?)
    }

    fn details(&self) -> Result<Value, StoreError> {
        Ok(self.try_get("details")?)
    }
}

#[cfg(test)]
mod tests {
    use super::sqlstate_blames_the_data;

    #[test]
    fn a_batch_begins_by_taking_the_chain_lock() {
        assert_eq!(
            super::BEGIN_CHAIN,
            format!(
                "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = '{}s'; \
                 SELECT pg_advisory_xact_lock({})",
                (3 * super::super::WRITE_TIMEOUT).as_secs(),
                super::CHAIN_LOCK_KEY
            )
        );
    }

    #[test]
    fn only_data_errors_are_the_records_fault() {
        // Invalid text, a check constraint, a unique violation, a row too large.
        for code in ["22021", "22P05", "23514", "23505", "54000"] {
            assert!(sqlstate_blames_the_data(code), "{code}");
        }
        // Serialisation, deadlock, shutdown, cancel, missing table, too many connections.
        for code in ["40001", "40P01", "57P01", "57014", "42P01", "53300"] {
            assert!(!sqlstate_blames_the_data(code), "{code}");
        }
    }
}
