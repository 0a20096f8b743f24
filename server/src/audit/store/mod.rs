//! Where the audit trail lives: Postgres (production, shared by replicas) or
//! SQLite (the embedded default). One type, two backends, the same contract:
//!
//! - [`AuditStore::append_batch`] appends records in one transaction, after
//!   claiming each record's token id (the replay guard); a record whose token
//!   was already used is written as a `token_replayed` denial instead, one
//!   whose identity is on the deny list as an `identity_denied` denial;
//! - the chain head is read inside that transaction under a lock (Postgres:
//!   an advisory lock; SQLite: `BEGIN IMMEDIATE`), so concurrent writers on
//!   several replicas extend one chain;
//! - while the lock is held, a batch costs the same statements whatever its
//!   size: the head, the deny-list check, the token claims and the records
//!   are each one statement for the whole batch;
//! - nothing is acknowledged before the commit returns.
//!
//! This module holds what both backends share: the types, the order of the
//! checks and their outcomes, the hashing (`extend_chain`), the queries'
//! text, and the dispatch. `postgres` and `sqlite` hold each backend's
//! connection, transaction and lock, its statements, how its rows decode and
//! which of its errors blame the data. `BatchTx` is the seam between the
//! two: a backend is handed each step of a batch whole.
//!
//! `schema` says whether the embedded migrations are all applied; `roles`,
//! who may change the schema and what the server's runtime role is granted.

mod postgres;
pub mod roles;
pub mod schema;
pub mod sqlite;

pub use postgres::LockAhead;

use std::time::Duration;

use serde_json::Value;
use sqlx::postgres::PgPool;
use sqlx::{ColumnIndex, Decode, Row, Type};
use talos_sso_api::audit::MAX_PAGE;
use time::OffsetDateTime;

use super::{AuditRecord, ChainCheck, GENESIS_HASH, RecordExt, StoredRecord, chain};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the audit database is unavailable: {0}")]
    Unavailable(String),
    /// The database answered and refused a statement for its data (a
    /// constraint, a value it cannot store, a row too large): the record is
    /// at fault, not the database. Locks, conflicts, timeouts and shutdowns
    /// are [`StoreError::Unavailable`].
    #[error("the audit database refused the write: {0}")]
    Refused(String),
    /// The connection broke while the commit was under way: the records
    /// may or may not be in the database. `appended` is what they would
    /// be; [`AuditStore::holds`] tells which.
    #[error("the audit database did not acknowledge the commit: {reason}")]
    CommitUnacknowledged { reason: String, appended: Vec<Appended> },
    #[error("audit database migration failed: {0}")]
    Migration(String),
    #[error("the audit database holds an unreadable record: {0}")]
    Corrupt(String),
    /// Rows no server wrote sit outside the chain: the store refuses to
    /// migrate or serve until they are dealt with.
    #[error("{0}")]
    OutsideChain(OutsideChain),
}

/// Rows of `audit_events` outside the hash chain (`seq` 0 or below), which
/// no server writes and `audit verify` does not read: the first few, by
/// `seq`, and how many there are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutsideChain {
    pub count: i64,
    /// `(seq, event, username)`, at most [`OUTSIDE_CHAIN_NAMED`].
    pub rows: Vec<(i64, String, Option<String>)>,
}

/// How many rows outside the chain an error names.
pub const OUTSIDE_CHAIN_NAMED: i64 = 10;

impl std::fmt::Display for OutsideChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let clean = |text: &str| super::text::clean(text, super::text::FIELD_CHARS);
        let named: Vec<String> = self
            .rows
            .iter()
            .map(|(seq, event, username)| {
                let username = username
                    .as_deref()
                    .map_or_else(|| "no username".to_owned(), clean);
                format!("seq {seq} ({}, {username})", clean(event))
            })
            .collect();
        let more = self.count - self.rows.len() as i64;
        let more = if more > 0 {
            format!(", and {more} more")
        } else {
            String::new()
        };
        let rows = if self.count == 1 { "row" } else { "rows" };
        write!(
            f,
            "the audit trail holds {} {rows} outside its hash chain (seq 0 or below): {}{more}. No server writes \
             such a row and `audit verify` does not read one, so something else inserted it into the database; \
             the server neither migrates nor starts while one is there. Keep a copy of the database for the \
             investigation, remove the rows as the schema owner (docs/operations.md, \"Rows outside the chain\"), \
             then run `talos-sso-server audit verify` and start again",
            self.count,
            named.join(", ")
        )
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            sqlx::Error::Database(refusal)
                if postgres::refuses_the_data(refusal.as_ref())
                    || sqlite::refuses_the_data(refusal.as_ref()) =>
            {
                StoreError::Refused(format!(
                    "[{}] {}",
                    refusal.code().unwrap_or_default(),
                    super::text::clean(refusal.message(), super::text::FIELD_CHARS)
                ))
            }
            _ => StoreError::Unavailable(error.to_string()),
        }
    }
}

/// Longest a batch may wait for the database before its commit, and
/// again for the commit's answer: a database that stops answering (a
/// network partition without resets) fails the batch instead of stalling
/// every request behind it.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Pool settings.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    /// How long to wait for a connection before giving up (fail fast: the
    /// request is answered 503 rather than hanging).
    pub acquire_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            max_connections: 8,
            acquire_timeout: Duration::from_secs(3),
        }
    }
}

/// What the security team asks for; every field narrows the answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
    pub username: Option<String>,
    pub subject: Option<String>,
    pub cluster: Option<String>,
    /// Granted or requested.
    pub role: Option<String>,
    pub outcome: Option<String>,
    pub event: Option<String>,
    pub serial: Option<String>,
    /// The client address, as recorded.
    pub client_ip: Option<String>,
    /// Cursor: only records after this sequence number.
    pub after_seq: i64,
    pub limit: i64,
}

/// A token id to claim, and until when the claim matters.
#[derive(Debug, Clone)]
pub struct TokenClaim {
    pub token_id: String,
    pub expires_at: Option<OffsetDateTime>,
}

/// One record to append.
#[derive(Debug, Clone, Default)]
pub struct Append {
    pub record: AuditRecord,
    /// Claim this token id (replay guard); a used one turns the record into
    /// a `token_replayed` denial.
    pub claim: Option<TokenClaim>,
    /// Check the record's subject and username against the deny list; a
    /// listed identity turns the record into an `identity_denied` denial.
    pub deny_check: bool,
    /// Change the deny list in the same transaction as this record.
    pub deny_change: Option<DenyChange>,
}

/// An entry of the deny list, as the API serves it.
pub use talos_sso_api::DenyEntry;

/// A deny-list change made with its audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyChange {
    Add(DenyEntry),
    /// Remove entries matching the subject or the (lower-cased) username.
    Remove {
        subject: Option<String>,
        username: Option<String>,
    },
}

/// What happened to an [`Append`].
#[derive(Debug, Clone)]
pub enum Appended {
    Recorded(StoredRecord),
    /// The token had been used: this denial was recorded instead.
    Replayed(StoredRecord),
    /// The identity is on the deny list: this denial was recorded instead.
    Denied(StoredRecord),
}

impl Appended {
    pub fn stored(&self) -> &StoredRecord {
        match self {
            Appended::Recorded(s) | Appended::Replayed(s) | Appended::Denied(s) => s,
        }
    }
}

/// A deny_list row: subject, username, reason, added_by, added_at,
/// expires_at.
type DenyRow<Time> = (Option<String>, Option<String>, String, String, Time, Option<Time>);

fn deny_entry(
    (subject, username, reason, added_by, added_at, expires_at): DenyRow<OffsetDateTime>,
) -> DenyEntry {
    DenyEntry {
        subject,
        username,
        reason,
        added_by,
        added_at,
        expires_at,
    }
}

#[derive(Debug, Clone)]
pub enum AuditStore {
    Postgres(PgPool),
    Sqlite(sqlite::SqliteStore),
}

/// Every column of `audit_events`, in the order both backends write them.
const COLUMNS: &str = "seq, occurred_at, request_id, event, outcome, reason_code, cluster, issuer, tenant, subject, \
     username, identity_verified, groups_evaluated, roles_requested, roles_granted, serial, certificate_sha256, \
     public_key_sha256, not_before, not_after, client_ip, user_agent, client_version, token_id, token_issued_at, \
     details, prev_hash, hash";

/// Apply a deny-list change in the transaction `$tx`, each backend saying
/// how it writes a time; the number of entries it changed.
macro_rules! change_deny_list {
    ($tx:expr, $change:expr, time: $time:expr) => {{
        let done =
            match $change {
                DenyChange::Add(entry) => {
                    // An expired entry of the same identity blocks nothing
                    // and must not keep the new one out.
                    sqlx::query(
                        "DELETE FROM deny_list WHERE expires_at <= $3 \
                         AND (subject = $1 OR (subject IS NULL AND username = lower($2)))",
                    )
                    .bind(&entry.subject)
                    .bind(&entry.username)
                    .bind($time(entry.added_at))
                    .execute(&mut *$tx)
                    .await?;
                    sqlx::query(
                        "INSERT INTO deny_list (subject, username, reason, added_by, added_at, expires_at) \
                     VALUES ($1, lower($2), $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                    )
                    .bind(&entry.subject)
                    .bind(&entry.username)
                    .bind(&entry.reason)
                    .bind(&entry.added_by)
                    .bind($time(entry.added_at))
                    .bind(entry.expires_at.map($time))
                    .execute($tx)
                    .await?
                }
                DenyChange::Remove { subject, username } => sqlx::query(
                    "DELETE FROM deny_list WHERE subject = $1 OR (subject IS NULL AND username = lower($2))",
                )
                .bind(subject)
                .bind(username)
                .execute($tx)
                .await?,
            };
        Ok(done.rows_affected())
    }};
}
use change_deny_list;

/// The claims of a batch as one statement takes them (the replay guard):
/// each token id once, at its first claim, so that the statement never
/// meets the same key twice. A later claim of the same id in the batch is
/// a replay, whatever the table holds.
fn distinct_claims<'c>(
    claims: &'c [(&'c TokenClaim, OffsetDateTime)],
) -> Vec<&'c (&'c TokenClaim, OffsetDateTime)> {
    let mut seen = std::collections::HashSet::with_capacity(claims.len());
    claims
        .iter()
        .filter(|(claim, _)| seen.insert(claim.token_id.as_str()))
        .collect()
}

/// One answer per claim, in order, from the token ids the statement
/// inserted (the ones nobody had claimed): fresh for the first claim of an
/// inserted id, a replay for every other.
fn claim_answers(claims: &[(&TokenClaim, OffsetDateTime)], inserted: Vec<String>) -> Vec<bool> {
    let mut inserted: std::collections::HashSet<String> = inserted.into_iter().collect();
    claims
        .iter()
        .map(|(claim, _)| inserted.remove(&claim.token_id))
        .collect()
}

/// `$body` with `$pool` bound to the store's pool, whichever backend it is:
/// for statements both backends run alike.
macro_rules! on_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match $store {
            AuditStore::Postgres($pool) => $body,
            AuditStore::Sqlite(store) => {
                let $pool = store.pool();
                $body
            }
        }
    };
}

/// Which rows of `audit_events` a read may use, as a literal for
/// `concat!`: the rows of the hash chain, `seq` from 1 on, all that
/// `audit verify` reads. A row below (migration 0007 refuses one; an older
/// schema took one from anyone who could insert) is outside the chain and
/// nothing vouches for it, so no query shows it, counts it or resolves a
/// name through it: every query that filters, pages or counts records
/// keeps to this one test, the views of migration 0007 included
/// ([`AuditStore::chain_rows`] for text built at run time).
///
/// It tells where a row sits, not who wrote it: a record the runtime role
/// appends after the head, with the right `prev_hash` and `hash`, is in
/// the chain and verifies like the server's own (docs/security.md).
///
/// SQLite's is written `+seq > 0`: the unary `+` keeps it from SQLite's
/// indexes, which otherwise seek from whichever lower bound of `seq` comes
/// first in the statement, this one rather than a cursor's `seq > $1`, so
/// that a page far into the trail would be read from seq 1; and it could
/// prefer that range to an `event` or `occurred_at` index. Postgres takes
/// the tightest of several bounds and estimates this one from its
/// statistics (it matches every row), so it is written plainly.
macro_rules! chain_rows {
    (postgres) => {
        "seq > 0"
    };
    (sqlite) => {
        "+seq > 0"
    };
}

/// Rows outside the chain, the complement of [`chain_rows!`], written as
/// a bound both databases seek from (a scan otherwise: `NOT (+seq > 0)`
/// is no index's range): the first few and how many, read at start.
const OUTSIDE_CHAIN_SQL: &str =
    "SELECT seq, event, username FROM audit_events WHERE seq <= 0 ORDER BY seq LIMIT $1";
const OUTSIDE_CHAIN_COUNT_SQL: &str = "SELECT count(*) FROM audit_events WHERE seq <= 0";

/// The chain head, as a literal for `concat!` ([`HEAD_SQL`], and each
/// backend's `head_and_denied` statement). No [`chain_rows!`] here: the
/// head is the highest `seq`, which that test changes only on a trail
/// holding no row of the chain but some below it, and such a trail is
/// refused before it is migrated or served
/// ([`AuditStore::require_chain_only`]). Nor where a record is read by
/// its `seq` ([`AuditStore::hash_at`], [`AuditStore::holds`]): the server
/// names only records of the chain.
macro_rules! head_sql {
    () => {
        "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1"
    };
}
use head_sql;

const HEAD_SQL: &str = head_sql!();

/// The statements that read the deny list in a batch, from a backend's
/// literals: `$null` is its NULL text column, `$matches` its test that an
/// entry names one of the subjects (`$1`) or usernames (`$2`). `denied`:
/// the matching entries; `head_and_denied`: the rows of [`HeadOrDenied`].
macro_rules! deny_list_sql {
    (denied, $matches:expr) => {
        concat!("SELECT subject, username FROM deny_list_active WHERE ", $matches)
    };
    (head_and_denied, $null:literal, $matches:expr) => {
        concat!(
            "SELECT seq, hash, ",
            $null,
            ", ",
            $null,
            " FROM (",
            $crate::audit::store::head_sql!(),
            ") AS head \
             UNION ALL SELECT NULL, NULL, subject, username FROM deny_list_active WHERE ",
            $matches
        )
    };
}
use deny_list_sql;

/// The entries that block now (`deny_list_active` leaves out expired ones).
const DENY_LIST_SQL: &str = "SELECT subject, username, reason, added_by, added_at, expires_at \
     FROM deny_list_active ORDER BY added_at DESC";

/// The subjects (and their tenants) that verified records of the issuers
/// `$2` name with the username `$1`, of the tenants `$3` when any are
/// given, at most `$4` pairs: a backend's literal for `$in_list` tests
/// that the value before it is in the list (ignoring case) at a placeholder.
macro_rules! subjects_of_sql {
    ($backend:ident, issuer in $issuers:literal, tenants $any_tenant:literal, tenant in $tenants:literal) => {
        concat!(
            "SELECT DISTINCT subject, tenant FROM audit_events WHERE ",
            chain_rows!($backend),
            " AND identity_verified = true AND subject IS NOT NULL AND lower(username) = lower($1) \
             AND lower(issuer) IN ",
            $issuers,
            " AND (",
            $any_tenant,
            " OR lower(tenant) IN ",
            $tenants,
            ") ORDER BY subject, tenant LIMIT $4"
        )
    };
}

const SUBJECTS_OF_POSTGRES: &str = subjects_of_sql!(
    postgres,
    issuer in "(SELECT lower(i) FROM unnest($2::text[]) AS i)",
    tenants "cardinality($3::text[]) = 0",
    tenant in "(SELECT lower(t) FROM unnest($3::text[]) AS t)"
);
const SUBJECTS_OF_SQLITE: &str = subjects_of_sql!(
    sqlite,
    issuer in "(SELECT lower(value) FROM json_each($2))",
    tenants "json_array_length($3) = 0",
    tenant in "(SELECT lower(value) FROM json_each($3))"
);

/// Whose records may tie a username to a subject: verified records of
/// these issuers (`iss` as the records hold it, compared ignoring case as
/// issuers are told apart at load) and, when any are named, of these
/// tenants (Entra `tid`). The issuers do not imply the tenants: an Entra
/// issuer whose `iss` names no tenant (no `{tenantid}`) takes every
/// allowed tenant's tokens under that one `iss`, and a record of a tenant
/// no longer allowed must not resolve a name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IssuerScope {
    pub issuers: Vec<String>,
    pub tenants: Vec<String>,
}

/// A value for one placeholder of a [`RecordQuery`]; each backend binds
/// times its own way.
enum Bind {
    Text(String),
    Time(OffsetDateTime),
    Int(i64),
}

/// A `SELECT` of whole records, with placeholders `$1`, `$2`, ... in the
/// order of `binds`.
struct RecordQuery {
    sql: String,
    binds: Vec<Bind>,
}

impl RecordQuery {
    /// `in_chain` is the backend's [`chain_rows!`].
    fn page(after_seq: i64, limit: i64, in_chain: &str) -> Self {
        Self {
            sql: format!(
                "SELECT {COLUMNS} FROM audit_events WHERE seq > $1 AND {in_chain} ORDER BY seq LIMIT $2"
            ),
            binds: vec![Bind::Int(after_seq), Bind::Int(limit)],
        }
    }

    /// `role_condition(n)` is the backend's test that placeholder `n` is a
    /// granted or requested role, `in_chain` its [`chain_rows!`]. Oldest
    /// first, unless `order` says otherwise.
    fn matching(
        filter: &AuditFilter,
        role_condition: fn(usize) -> String,
        in_chain: &str,
        order: Order,
    ) -> Self {
        // `seq` follows time. With a time bound on the far side of the scan
        // (`since` when reading forward, `until` when reading back), the
        // matches sit at the other end of the trail, but the planners
        // (Postgres and SQLite) take them to be spread evenly along `seq`
        // and walk its index from the cursor, reading every record before
        // the window (600 ms and more on a million). An expression of
        // `seq` (the same order, the same cursor) is no index's key: they
        // find the matches through the indexes of the other conditions
        // instead, and sort only those; by their `seq` alone, which an
        // index may hold, so that only the page's records are read whole.
        let far_bound = order.far_bound(filter);
        let key = if far_bound { "seq + 0" } else { "seq" };
        let mut conditions = vec![format!("{key} > $1"), in_chain.to_owned()];
        let mut binds = vec![Bind::Int(filter.after_seq)];
        let mut add = |condition: &dyn Fn(usize) -> String, bind: Bind| {
            binds.push(bind);
            conditions.push(condition(binds.len()));
        };
        if let Order::NewestFirst {
            before_seq: Some(before),
        } = order
        {
            add(&|n| format!("{key} < ${n}"), Bind::Int(before));
        }
        if let Some(since) = filter.since {
            add(&|n| format!("occurred_at >= ${n}"), Bind::Time(since));
        }
        if let Some(until) = filter.until {
            add(&|n| format!("occurred_at < ${n}"), Bind::Time(until));
        }
        for (column, value) in [
            ("username", &filter.username),
            ("subject", &filter.subject),
            ("cluster", &filter.cluster),
            ("outcome", &filter.outcome),
            ("event", &filter.event),
            ("serial", &filter.serial),
            ("client_ip", &filter.client_ip),
        ] {
            if let Some(value) = value {
                add(&|n| format!("{column} = ${n}"), Bind::Text(value.clone()));
            }
        }
        if let Some(role) = &filter.role {
            add(&role_condition, Bind::Text(role.clone()));
        }
        binds.push(Bind::Int(filter.limit.clamp(1, MAX_PAGE)));
        let direction = match order {
            Order::OldestFirst => "",
            Order::NewestFirst { .. } => " DESC",
        };
        let (conditions, limit) = (conditions.join(" AND "), binds.len());
        let sql = if far_bound {
            format!(
                "SELECT {COLUMNS} FROM audit_events WHERE seq IN \
                 (SELECT seq FROM audit_events WHERE {conditions} ORDER BY {key}{direction} LIMIT ${limit}) \
                 ORDER BY seq{direction}"
            )
        } else {
            format!(
                "SELECT {COLUMNS} FROM audit_events WHERE {conditions} ORDER BY seq{direction} LIMIT ${limit}"
            )
        };
        Self { sql, binds }
    }
}

/// Which way a query reads the trail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// As `GET /v1/audit` serves it: a cursor moves forward.
    OldestFirst,
    /// As a console shows it: a cursor moves back, from `before_seq`
    /// (`None`: from the newest record).
    NewestFirst { before_seq: Option<i64> },
}

impl Order {
    /// Whether `filter` bounds time on the far side of the scan: `since`
    /// when reading forward, `until` when reading back.
    fn far_bound(self, filter: &AuditFilter) -> bool {
        match self {
            Order::OldestFirst => filter.since.is_some(),
            Order::NewestFirst { .. } => filter.until.is_some(),
        }
    }
}

impl AuditStore {
    /// Connect to `url` (`postgres://...` or `sqlite://...`). SQLite files and
    /// their directory are created when missing.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(AuditStore::Postgres(postgres::connect(url, options).await?))
        } else if let Some(path) = url.strip_prefix("sqlite://") {
            Ok(AuditStore::Sqlite(sqlite::connect(url, path, options).await?))
        } else {
            Err(StoreError::Unavailable(
                "database URL must start with postgres:// or sqlite://".into(),
            ))
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            AuditStore::Postgres(_) => "postgres",
            AuditStore::Sqlite(_) => "sqlite",
        }
    }

    /// Apply the migrations this database has not seen yet; refused, with
    /// each named, while the trail holds rows outside its chain.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.require_chain_only().await?;
        let result = match self {
            AuditStore::Postgres(pool) => postgres::MIGRATOR.run(pool).await,
            AuditStore::Sqlite(store) => sqlite::MIGRATOR.run(store.pool()).await,
        };
        result.map_err(|e| StoreError::Migration(e.to_string()))
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        on_pool!(self, pool => sqlx::query("SELECT 1").execute(pool).await.map(|_| ())?);
        Ok(())
    }

    /// The store the group-commit writer appends through, on the runtime
    /// it runs on (`writer.rs`): for Postgres a pool of its own, to the
    /// same database with the same acquire timeout and at most two
    /// connections (a batch, and the next
    /// one's lock taken ahead), opened lazily from that runtime so that it
    /// is the one watching their sockets; SQLite's appends already have a
    /// connection, and a thread, of their own.
    pub(crate) fn for_writer(&self) -> AuditStore {
        match self {
            AuditStore::Postgres(pool) => AuditStore::Postgres(postgres::writer_pool(pool)),
            AuditStore::Sqlite(store) => AuditStore::Sqlite(store.clone()),
        }
    }

    /// Close what [`Self::for_writer`] opened (the writer's Postgres pool;
    /// the SQLite store is shared and stays open).
    pub(crate) async fn close_for_writer(&self) {
        if let AuditStore::Postgres(pool) = self {
            pool.close().await;
        }
    }

    pub async fn close(&self) {
        match self {
            AuditStore::Postgres(pool) => pool.close().await,
            AuditStore::Sqlite(store) => store.close().await,
        }
    }

    /// Append records in one transaction; see the module comment. A
    /// database that stops answering fails the batch after
    /// [`WRITE_TIMEOUT`] (before the commit: nothing was written; during
    /// it: [`StoreError::CommitUnacknowledged`]).
    ///
    /// The connection of a batch that failed is closed, not put back: its
    /// transaction may not have ended cleanly (SQLite that ran out of disk
    /// leaves the driver believing a transaction is still open, and every
    /// later batch on that connection would fail). SQLite keeps its append
    /// connection between batches ([`sqlite::SqliteStore::append_batch`]).
    pub async fn append_batch(&self, batch: &[Append]) -> Result<Vec<Appended>, StoreError> {
        self.append_batch_ahead(batch, None, || false).await.0
    }

    /// [`Self::append_batch`] for a writer that batches continuously: the
    /// batch runs in the transaction `ahead` began, when there is one, and
    /// when `more_waiting` says, as the commit is sent, that records are
    /// waiting, Postgres takes the next batch's lock ahead
    /// ([`LockAhead`]), returned for that batch. A batch that fails drops
    /// both. SQLite has one append connection and takes no lock ahead.
    pub async fn append_batch_ahead(
        &self,
        batch: &[Append],
        ahead: Option<LockAhead>,
        more_waiting: impl FnOnce() -> bool,
    ) -> (Result<Vec<Appended>, StoreError>, Option<LockAhead>) {
        match self {
            AuditStore::Postgres(pool) => {
                let mut next = None;
                let begin = async {
                    if let Some(ahead) = ahead
                        && let Some(tx) = ahead.take().await
                    {
                        return Ok(tx);
                    }
                    // None taken ahead, or it failed and began nothing (its
                    // connection broke, or none was to be had).
                    postgres::ChainTx::begin(pool).await
                };
                let result = append_in(begin, batch, || {
                    if more_waiting() {
                        next = Some(LockAhead::start(pool));
                    }
                })
                .await;
                if result.is_err() {
                    // Closed, freeing the lock for the retries and the read-back.
                    next = None;
                }
                (result, next)
            }
            AuditStore::Sqlite(store) => (store.append_batch(batch).await, None),
        }
    }

    /// Whether the chain holds `record` at its place (same `seq`, same
    /// hash): how a commit that was not acknowledged is resolved. Read
    /// under the chain lock, so that a transaction still committing on a
    /// connection this server lost has finished, one way or the other,
    /// before the answer is given.
    pub async fn holds(&self, record: &StoredRecord) -> Result<bool, StoreError> {
        const HASH_AT_SEQ: &str = "SELECT hash FROM audit_events WHERE seq = $1";
        let hash: Option<String> = match self {
            AuditStore::Postgres(pool) => {
                // A `ChainTx`: given up while it waits for the lock (the
                // caller's deadline), its connection is closed, never
                // handed back to the pool to be granted the lock there.
                let mut tx = postgres::ChainTx::begin(pool).await?;
                let hash = sqlx::query_scalar(HASH_AT_SEQ)
                    .bind(record.seq)
                    .fetch_optional(tx.connection())
                    .await?;
                tx.rollback().await?;
                hash
            }
            AuditStore::Sqlite(store) => {
                let mut appender = store.appender().await?;
                let mut tx = sqlite::begin_chain(appender.connection()?).await?;
                let hash = sqlx::query_scalar(HASH_AT_SEQ)
                    .bind(record.seq)
                    .fetch_optional(&mut *tx)
                    .await?;
                tx.rollback().await?;
                hash
            }
        };
        Ok(hash.as_deref() == Some(record.hash.as_str()))
    }

    /// Up to `limit` records after `after_seq`, in order.
    pub async fn page(&self, after_seq: i64, limit: i64) -> Result<Vec<StoredRecord>, StoreError> {
        self.records(RecordQuery::page(after_seq, limit, self.chain_rows()))
            .await
    }

    /// This backend's [`chain_rows!`]: the test that keeps a read of
    /// `audit_events` to the rows of the chain, for statements built at
    /// run time.
    pub fn chain_rows(&self) -> &'static str {
        match self {
            AuditStore::Postgres(_) => chain_rows!(postgres),
            AuditStore::Sqlite(_) => chain_rows!(sqlite),
        }
    }

    /// Records matching `filter`, oldest first, after `filter.after_seq`.
    pub async fn query(&self, filter: &AuditFilter) -> Result<Vec<StoredRecord>, StoreError> {
        self.matching(filter, Order::OldestFirst).await
    }

    /// Records matching `filter`, newest first, before `before_seq` (from
    /// the newest when `None`) and after `filter.after_seq`: the order in
    /// which a console pages back through the trail.
    pub async fn query_newest_first(
        &self,
        filter: &AuditFilter,
        before_seq: Option<i64>,
    ) -> Result<Vec<StoredRecord>, StoreError> {
        self.matching(filter, Order::NewestFirst { before_seq }).await
    }

    async fn matching(&self, filter: &AuditFilter, order: Order) -> Result<Vec<StoredRecord>, StoreError> {
        let role_condition = match self {
            AuditStore::Postgres(_) => postgres::role_condition,
            AuditStore::Sqlite(_) if order.far_bound(filter) => sqlite::role_condition_far,
            AuditStore::Sqlite(_) => sqlite::role_condition,
        };
        self.records(RecordQuery::matching(
            filter,
            role_condition,
            self.chain_rows(),
            order,
        ))
        .await
    }

    async fn records(&self, query: RecordQuery) -> Result<Vec<StoredRecord>, StoreError> {
        match self {
            AuditStore::Postgres(pool) => postgres::records(pool, query).await,
            AuditStore::Sqlite(store) => sqlite::records(store.pool(), query).await,
        }
    }

    /// The deny list, newest first.
    pub async fn deny_list(&self) -> Result<Vec<DenyEntry>, StoreError> {
        match self {
            AuditStore::Postgres(pool) => postgres::deny_list(pool).await,
            AuditStore::Sqlite(store) => sqlite::deny_list(store.pool()).await,
        }
    }

    /// The subjects that verified records of `scope` name with this
    /// username (case does not matter), as at most `limit` (subject,
    /// tenant) pairs ordered by subject: how a username is turned into the
    /// immutable identifier a deny-list entry blocks. Records of other
    /// issuers, and unverified ones, say nothing here: a name they claim
    /// is not their subject's to take. An Entra `oid` is per tenant, so a
    /// subject comes with the one tenant of its records (none for an
    /// issuer without tenants).
    pub async fn subjects_of(
        &self,
        username: &str,
        scope: &IssuerScope,
        limit: i64,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        Ok(match self {
            AuditStore::Postgres(pool) => {
                sqlx::query_as(SUBJECTS_OF_POSTGRES)
                    .bind(username)
                    .bind(&scope.issuers)
                    .bind(&scope.tenants)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
            AuditStore::Sqlite(store) => {
                sqlx::query_as(SUBJECTS_OF_SQLITE)
                    .bind(username)
                    .bind(sqlite::json_list(&scope.issuers))
                    .bind(sqlite::json_list(&scope.tenants))
                    .bind(limit)
                    .fetch_all(store.pool())
                    .await?
            }
        })
    }

    /// The rows outside the hash chain, if there are any (`None` too when
    /// the trail's table does not exist yet). Reads only: `seq <= 0` is a
    /// range of the table's key, so an intact trail answers at once.
    pub async fn outside_chain(&self) -> Result<Option<OutsideChain>, StoreError> {
        if !self.has_table("audit_events").await? {
            return Ok(None);
        }
        let count: i64 = on_pool!(self, pool => sqlx::query_scalar(OUTSIDE_CHAIN_COUNT_SQL)
            .fetch_one(pool)
            .await?);
        if count == 0 {
            return Ok(None);
        }
        let rows = on_pool!(self, pool => sqlx::query_as(OUTSIDE_CHAIN_SQL)
            .bind(OUTSIDE_CHAIN_NAMED)
            .fetch_all(pool)
            .await?);
        Ok(Some(OutsideChain { count, rows }))
    }

    /// Refuse a trail holding rows outside the chain, naming them: before
    /// migrating (whose constraint would fail on them without saying
    /// which) and before serving.
    pub async fn require_chain_only(&self) -> Result<(), StoreError> {
        match self.outside_chain().await? {
            Some(outside) => Err(StoreError::OutsideChain(outside)),
            None => Ok(()),
        }
    }

    /// Whether the deny list blocks this subject (or, for entries without
    /// a subject, this username).
    pub async fn is_denied(&self, subject: &str, username: &str) -> Result<bool, StoreError> {
        let entries = self.deny_list().await?;
        let (subject, username) = (
            super::text::clean_field(subject),
            super::text::clean_field(username),
        );
        Ok(entries.iter().any(|e| {
            entry_blocks(
                &(e.subject.clone(), e.username.clone()),
                Some(&subject),
                Some(&username),
            )
        }))
    }

    /// The last record's `seq` and hash, as committed now; `(0,`
    /// [`GENESIS_HASH`]`)` for an empty trail. What a checkpoint signs.
    pub async fn head(&self) -> Result<(i64, String), StoreError> {
        let head: Option<(i64, String)> =
            on_pool!(self, pool => sqlx::query_as(HEAD_SQL).fetch_optional(pool).await?);
        Ok(head.unwrap_or_else(|| (0, GENESIS_HASH.to_owned())))
    }

    /// The hash of the record at `seq`, if there is one.
    pub async fn hash_at(&self, seq: i64) -> Result<Option<String>, StoreError> {
        on_pool!(self, pool => Ok(sqlx::query_scalar("SELECT hash FROM audit_events WHERE seq = $1")
            .bind(seq)
            .fetch_optional(pool)
            .await?))
    }

    /// Recompute the whole chain; stops at the first broken link.
    pub async fn verify_chain(&self) -> Result<ChainCheck, StoreError> {
        self.verify_chain_against(None).await
    }

    /// Recompute the whole chain and, when `checkpoints` are given (their
    /// signatures checked), check each record they name against the hash
    /// they signed, and that none names a record past the end.
    pub async fn verify_chain_against(
        &self,
        checkpoints: Option<Vec<talos_sso_api::checkpoint::Checkpoint>>,
    ) -> Result<ChainCheck, StoreError> {
        let mut check = ChainCheck::default();
        if let Some(checkpoints) = checkpoints {
            check = check.with_checkpoints(checkpoints);
        }
        let mut after = 0;
        loop {
            let page = self.page(after, MAX_PAGE).await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            for record in &page {
                check.feed(record);
            }
            if check.first_broken.is_some() {
                break;
            }
        }
        check.finish();
        Ok(check)
    }
}

/// A row of `audit_events` as one backend returns it: each backend reads
/// the columns it stores its own way (times, lists, JSON).
trait RecordRow: Row {
    fn time(&self, column: &str) -> Result<Option<OffsetDateTime>, StoreError>;
    fn list(&self, column: &str) -> Result<Vec<String>, StoreError>;
    fn details(&self) -> Result<Value, StoreError>;
}

/// The record in a row of `audit_events` ([`COLUMNS`]).
fn stored_record<R>(row: &R) -> Result<StoredRecord, StoreError>
where
    R: RecordRow,
    &'static str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let record = AuditRecord {
        occurred_at: row
            .time("occurred_at")?
            .ok_or_else(|| StoreError::Corrupt("occurred_at is empty".into()))?,
        request_id: row.try_get("request_id")?,
        event: row.try_get("event")?,
        outcome: row.try_get("outcome")?,
        reason_code: row.try_get("reason_code")?,
        cluster: row.try_get("cluster")?,
        issuer: row.try_get("issuer")?,
        tenant: row.try_get("tenant")?,
        subject: row.try_get("subject")?,
        username: row.try_get("username")?,
        identity_verified: row.try_get("identity_verified")?,
        groups_evaluated: row.list("groups_evaluated")?,
        roles_requested: row.list("roles_requested")?,
        roles_granted: row.list("roles_granted")?,
        serial: row.try_get("serial")?,
        certificate_sha256: row.try_get("certificate_sha256")?,
        public_key_sha256: row.try_get("public_key_sha256")?,
        not_before: row.time("not_before")?,
        not_after: row.time("not_after")?,
        client_ip: row.try_get("client_ip")?,
        user_agent: row.try_get("user_agent")?,
        client_version: row.try_get("client_version")?,
        token_id: row.try_get("token_id")?,
        token_issued_at: row.time("token_issued_at")?,
        details: row.details()?,
    };
    Ok(StoredRecord {
        seq: row.try_get("seq")?,
        record,
        prev_hash: row.try_get("prev_hash")?,
        hash: row.try_get("hash")?,
    })
}

/// `(subject, username)` of deny-list entries that match a batch.
type DeniedPairs = Vec<(Option<String>, Option<String>)>;

/// A row of a backend's `head_and_denied` statement: the chain head as
/// `(seq, hash, NULL, NULL)`, or a matching deny-list entry as
/// `(NULL, NULL, subject, username)`.
type HeadOrDenied = (Option<i64>, Option<String>, Option<String>, Option<String>);

/// The head and the deny-list entries from the rows of [`HeadOrDenied`].
fn head_and_denied(rows: Vec<HeadOrDenied>) -> Result<(Option<(i64, String)>, DeniedPairs), StoreError> {
    let mut head = None;
    let mut denied = Vec::new();
    for row in rows {
        match row {
            (Some(seq), Some(hash), None, None) if head.is_none() => head = Some((seq, hash)),
            (None, None, subject, username) => denied.push((subject, username)),
            (seq, ..) => {
                return Err(StoreError::Corrupt(format!(
                    "the chain head query answered an unexpected row (seq {seq:?})"
                )));
            }
        }
    }
    Ok((head, denied))
}

/// One backend's side of appending a batch, inside the transaction it
/// opened under the lock that serialises chain appends. Each method is
/// handed a step of the batch whole and writes it with one statement (one
/// round trip while the lock is held, whatever the batch's size);
/// [`extend_chain`] decides what is written.
trait BatchTx {
    /// The last record's sequence number and hash; `None` when the trail is empty.
    async fn head(&mut self) -> Result<Option<(i64, String)>, StoreError>;
    /// The last record's sequence number and hash (`None` when the trail
    /// is empty), and the deny-list entries matching any of these subjects
    /// or (lower-cased) usernames: what every batch reads first, in one
    /// statement (rows of [`HeadOrDenied`]), since each statement is a
    /// round trip made while the chain's lock is held.
    async fn head_and_denied(
        &mut self,
        subjects: &[String],
        usernames: &[String],
    ) -> Result<(Option<(i64, String)>, DeniedPairs), StoreError>;
    /// Deny-list entries matching any of these subjects or (lower-cased) usernames.
    async fn denied(&mut self, subjects: &[String], usernames: &[String]) -> Result<DeniedPairs, StoreError>;
    /// Claim these token ids, each used at its time, in order: one answer
    /// per claim, `false` when the id was claimed before (a replay),
    /// earlier in this list included.
    async fn claim_tokens(
        &mut self,
        claims: &[(&TokenClaim, OffsetDateTime)],
    ) -> Result<Vec<bool>, StoreError>;
    /// Apply a deny-list change; the number of entries it touched.
    async fn change_deny_list(&mut self, change: &DenyChange) -> Result<u64, StoreError>;
    /// Write the batch's records, already chained, in order.
    async fn insert_records(&mut self, records: &[StoredRecord]) -> Result<(), StoreError>;
    /// Commit: the lock is freed, the batch is durable.
    async fn commit(self) -> Result<(), sqlx::Error>;
}

/// Whether a deny-list entry `(subject, username)` blocks `record`. Entries
/// match on the subject, which the person cannot change; an entry with no
/// subject (written before subjects were required) matches the lower-cased
/// username.
fn entry_blocks(
    entry: &(Option<String>, Option<String>),
    subject: Option<&str>,
    username: Option<&str>,
) -> bool {
    match entry {
        (Some(listed), _) => Some(listed.as_str()) == subject,
        (None, Some(name)) => username.is_some_and(|u| u.to_lowercase() == *name),
        (None, None) => false,
    }
}

/// Append `batch` in order inside `tx`: deny list (read once for the batch,
/// and again after any change to it in the batch), replay guard, deny-list
/// changes, then the records on the chain.
///
/// The batch is taken in runs that end with a record changing the deny
/// list: every record of a run sees the same list, so a run's token claims
/// go to the backend together, before the run's change is applied.
/// The batch in `tx`, which holds the chain lock, then the commit;
/// `before_commit` runs when the records are written and the `COMMIT` is
/// about to be sent (where the next batch's lock is taken ahead).
async fn append_in<Tx: BatchTx>(
    begin: impl Future<Output = Result<Tx, StoreError>>,
    batch: &[Append],
    before_commit: impl FnOnce(),
) -> Result<Vec<Appended>, StoreError> {
    let silent = || StoreError::Unavailable(format!("no answer within {WRITE_TIMEOUT:?}"));
    // Dropped on a timeout: the connection goes, the transaction with it.
    let (tx, out) = tokio::time::timeout(WRITE_TIMEOUT, async {
        let mut tx = begin.await?;
        let out = extend_chain(&mut tx, batch).await?;
        Ok::<_, StoreError>((tx, out))
    })
    .await
    .map_err(|_| silent())??;
    before_commit();
    let committed = tokio::time::timeout(WRITE_TIMEOUT, tx.commit())
        .await
        .unwrap_or_else(|_| Err(sqlx::Error::Io(std::io::Error::other(silent().to_string()))));
    match committed {
        Ok(()) => Ok(out),
        // The database answered: it did not commit.
        Err(error @ sqlx::Error::Database(_)) => Err(error.into()),
        // No answer (connection cut, I/O error): the commit may have
        // happened, only reading it back can tell.
        Err(error) => Err(StoreError::CommitUnacknowledged {
            reason: error.to_string(),
            appended: out,
        }),
    }
}

async fn extend_chain(tx: &mut impl BatchTx, batch: &[Append]) -> Result<Vec<Appended>, StoreError> {
    // Checks compare what is stored: deny entries hold cleaned text, so the
    // record is cleaned first (a subject with a zero-width space must match
    // the entry an admin wrote from the trail).
    let mut records: Vec<AuditRecord> = batch.iter().map(|a| a.record.clone().normalised()).collect();
    let (subjects, usernames): (Vec<String>, Vec<String>) = batch
        .iter()
        .zip(&records)
        .filter(|(a, _)| a.deny_check)
        .map(|(_, r)| {
            (
                r.subject.clone().unwrap_or_default(),
                r.username.clone().unwrap_or_default().to_lowercase(),
            )
        })
        .unzip();
    // Records that check no identity (one-off commands' records) read the
    // head alone: they are also what is written to a schema older than the
    // deny list's view (migrations/sqlite/0006).
    let (head, mut denied) = if subjects.is_empty() {
        (tx.head().await?, Vec::new())
    } else {
        tx.head_and_denied(&subjects, &usernames).await?
    };
    let (seq, hash) = head.unwrap_or((0, GENESIS_HASH.to_owned()));
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut start = 0;
    while start < batch.len() {
        let end = batch[start..]
            .iter()
            .position(|a| a.deny_change.is_some())
            .map_or(batch.len(), |changer| start + changer + 1);
        for (append, record) in batch[start..end].iter().zip(&records[start..end]) {
            let blocked = append.deny_check
                && denied
                    .iter()
                    .any(|entry| entry_blocks(entry, record.subject.as_deref(), record.username.as_deref()));
            outcomes.push(if blocked {
                Outcome::Denied
            } else {
                Outcome::Recorded
            });
        }
        let claiming: Vec<(usize, &TokenClaim)> = (start..end)
            .filter_map(|i| match (&batch[i].claim, outcomes[i]) {
                (Some(claim), Outcome::Recorded) => Some((i, claim)),
                _ => None,
            })
            .collect();
        if !claiming.is_empty() {
            let claims: Vec<(&TokenClaim, OffsetDateTime)> = claiming
                .iter()
                .map(|&(i, claim)| (claim, records[i].occurred_at))
                .collect();
            let fresh = tx.claim_tokens(&claims).await?;
            if fresh.len() != claims.len() {
                return Err(StoreError::Unavailable(format!(
                    "the store answered {} of {} token claims",
                    fresh.len(),
                    claims.len()
                )));
            }
            for ((i, _), fresh) in claiming.into_iter().zip(fresh) {
                if !fresh {
                    outcomes[i] = Outcome::Replayed;
                }
            }
        }
        let last = end - 1;
        if let (Some(change), Outcome::Recorded) = (&batch[last].deny_change, outcomes[last]) {
            let rows = tx.change_deny_list(change).await?;
            note_change(&mut records[last], rows);
            if !subjects.is_empty() {
                // Later records of this batch see the list as changed.
                denied = tx.denied(&subjects, &usernames).await?;
            }
        }
        start = end;
    }
    let mut stored = Vec::with_capacity(records.len());
    let (mut seq, mut hash) = (seq, hash);
    for (record, outcome) in records.into_iter().zip(&outcomes) {
        // Already normalised above; `apply` only clears fields.
        let next = chain(seq, &hash, outcome.apply(record));
        seq = next.seq;
        hash = next.hash.clone();
        stored.push(next);
    }
    tx.insert_records(&stored).await?;
    Ok(stored
        .into_iter()
        .zip(outcomes)
        .map(|(s, outcome)| outcome.wrap(s))
        .collect())
}

/// What the in-transaction checks decided for one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Recorded,
    Replayed,
    Denied,
}

impl Outcome {
    fn apply(self, record: AuditRecord) -> AuditRecord {
        match self {
            Outcome::Recorded => record,
            Outcome::Replayed => record.into_denial("token_replayed"),
            Outcome::Denied => record.into_denial("identity_denied"),
        }
    }

    fn wrap(self, stored: StoredRecord) -> Appended {
        match self {
            Outcome::Recorded => Appended::Recorded(stored),
            Outcome::Replayed => Appended::Replayed(stored),
            Outcome::Denied => Appended::Denied(stored),
        }
    }
}

/// Say in the record how many deny-list entries the change touched.
fn note_change(record: &mut AuditRecord, rows: u64) {
    if let serde_json::Value::Object(details) = &mut record.details {
        details.insert("entries_changed".into(), serde_json::json!(rows));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use sqlx::SqlSafeStr;
    use sqlx::migrate::{Migration, MigrationType, Migrator};

    use super::*;
    use crate::audit::{event, outcome};

    /// The migrations as releases before `sqlx::migrate!` embedded them:
    /// version = position + 1, descriptions written by hand.
    fn migrator_as_released(sql: [&'static str; 3]) -> Migrator {
        let descriptions = ["audit", "deny list", "deny by subject"];
        Migrator::with_migrations(
            (1..)
                .zip(descriptions.into_iter().zip(sql))
                .map(|(version, (description, sql))| {
                    Migration::new(
                        version,
                        description.into(),
                        MigrationType::Simple,
                        sql.into_sql_str(),
                        false,
                    )
                })
                .collect(),
        )
    }

    fn released_postgres() -> Migrator {
        migrator_as_released([
            include_str!("../../../../migrations/postgres/0001_audit.sql"),
            include_str!("../../../../migrations/postgres/0002_deny_list.sql"),
            include_str!("../../../../migrations/postgres/0003_deny_by_subject.sql"),
        ])
    }

    fn released_sqlite() -> Migrator {
        migrator_as_released([
            include_str!("../../../../migrations/sqlite/0001_audit.sql"),
            include_str!("../../../../migrations/sqlite/0002_deny_list.sql"),
            include_str!("../../../../migrations/sqlite/0003_deny_by_subject.sql"),
        ])
    }

    #[test]
    fn every_migration_file_is_embedded_and_both_backends_have_the_same_versions() {
        for (folder, migrator) in [("postgres", &postgres::MIGRATOR), ("sqlite", &sqlite::MIGRATOR)] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../migrations")
                .join(folder);
            let mut files: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(".sql"))
                .collect();
            files.sort();
            let embedded: Vec<String> = migrator
                .iter()
                .map(|m| format!("{:04}_{}.sql", m.version, m.description.replace(' ', "_")))
                .collect();
            // A file `sqlx::migrate!` would not read (a misnamed one) is
            // missing here.
            assert_eq!(
                embedded, files,
                "migrations/{folder} differs from what the server embedded"
            );
        }
        let versions = |migrator: &Migrator| migrator.iter().map(|m| m.version).collect::<Vec<_>>();
        assert_eq!(versions(&postgres::MIGRATOR), versions(&sqlite::MIGRATOR));
    }

    /// SHA-384 of each released migration (`sha384sum migrations/*/*.sql`),
    /// as databases already hold them: sqlx refuses to start on a database
    /// whose applied migration has another checksum, so a released file
    /// must never change. A new migration is a new file, added here.
    const RELEASED: [(&str, i64, &str); 14] = [
        (
            "postgres",
            1,
            "42e68ee1a2af941f380bb0393dfdecc8801fc40ea7553d11a7ee97f6905e4ceaa440bf08912c73b7ddb92a0e036e139b",
        ),
        (
            "postgres",
            2,
            "7a4677f534e51753df874489d3758897b62d373296d26a0a9c9a4667d551388c807b8daba510c018a10f85bdc7d76f15",
        ),
        (
            "postgres",
            3,
            "35d405881a73908be9da9a953e689b062095079ef356572cad41e1993d27326ed7dcdf43a11ee23144dd8b23ce1dae7d",
        ),
        (
            "postgres",
            4,
            "262342d27681cd4d940e0ed73de7387443bf45b5f151d3967085aaf4572886460273eb35a3dc20b5da5950fad29862f4",
        ),
        (
            "sqlite",
            1,
            "a02634cc71f4b5b805f22b2a14d25fdadfad0023d7cb2118bab1ab578f6af037703582c6b6ed281a50ea2e6cfa51e4ef",
        ),
        (
            "sqlite",
            2,
            "b0bd56df499edfc6c8f0d1c488434e62a353dd0368abd0eb52b1c25737ff32b59e65d8953b52bbbf2993b98662d72b48",
        ),
        (
            "sqlite",
            3,
            "35d405881a73908be9da9a953e689b062095079ef356572cad41e1993d27326ed7dcdf43a11ee23144dd8b23ce1dae7d",
        ),
        (
            "sqlite",
            4,
            "d0c1958f8a177869e6c7434a0a35dfd8523cc149bba2c4d44c56e7ad3fd7587ff55f11c551474db83cd94d683570ad17",
        ),
        (
            "postgres",
            5,
            "68f2d938f7ee3646e0afedc87c314aa7b514f60cbfa54b5c4548bcd12a8ef3646d2971539784bacd8cb2443f31f710df",
        ),
        (
            "sqlite",
            5,
            "68f2d938f7ee3646e0afedc87c314aa7b514f60cbfa54b5c4548bcd12a8ef3646d2971539784bacd8cb2443f31f710df",
        ),
        (
            "postgres",
            6,
            "0dcf15585f3a14164938ad776d3611b3753fa26967ee51d3995778cbc0781d295cc227c197dd9ce2b7c2bd9c87f11e31",
        ),
        (
            "sqlite",
            6,
            "b3485fca8200df27130789c5267f4202228e6b66d88c01149c48fdbd27f6ffb9f4ec7501d4c6f28d88006d97d4326ee1",
        ),
        (
            "postgres",
            7,
            "7209c2286baed99e11062399326982e0c49d5eb3f1cb45c592695bc75a9a57ecca069a268077e303c075a84ab9cc895a",
        ),
        (
            "sqlite",
            7,
            "9408c5ed9d5c14d7a70e0a57365e8cd44e7094719fea1dfd979fc57274650f5f3d8655b1606b17d3e0d488aa362b84a6",
        ),
    ];

    #[test]
    fn released_migrations_keep_their_checksums() {
        for (folder, version, checksum) in RELEASED {
            let migrator = if folder == "postgres" {
                &postgres::MIGRATOR
            } else {
                &sqlite::MIGRATOR
            };
            let embedded = migrator
                .iter()
                .find(|m| m.version == version)
                .unwrap_or_else(|| panic!("migrations/{folder}: version {version} is gone"));
            assert_eq!(
                hex::encode(&*embedded.checksum),
                checksum,
                "migrations/{folder} version {version} was changed after its release"
            );
        }
    }

    #[test]
    fn the_embedded_migrations_read_like_the_ones_earlier_releases_built() {
        let key = |m: &Migration| {
            (
                m.version,
                m.description.to_string(),
                m.migration_type,
                m.checksum.to_vec(),
                m.no_tx,
            )
        };
        for (released, current) in [
            (released_postgres(), &postgres::MIGRATOR),
            (released_sqlite(), &sqlite::MIGRATOR),
        ] {
            let released: Vec<_> = released.iter().map(key).collect();
            let current: Vec<_> = current.iter().take(released.len()).map(key).collect();
            assert_eq!(current, released);
        }
    }

    #[tokio::test]
    async fn a_sqlite_database_migrated_by_earlier_releases_migrates_again() {
        let dir = std::env::temp_dir().join(format!(
            "talos-sso-migrate-{}",
            crate::random::random_hex(6).unwrap()
        ));
        let url = format!("sqlite://{}/audit.db", dir.display());
        let store = AuditStore::connect(&url, &StoreOptions::default()).await.unwrap();
        let AuditStore::Sqlite(sqlite) = &store else {
            panic!("{url} is not SQLite")
        };
        let pool = sqlite.pool();
        released_sqlite().run(pool).await.unwrap();
        store.migrate().await.unwrap();
        assert_eq!(store.verify_chain().await.unwrap().verified, 0);
        store.close().await;
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_postgres_database_migrated_by_earlier_releases_migrates_again() {
        use sqlx::Connection;
        let admin_url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let mut admin = sqlx::PgConnection::connect(&admin_url).await.unwrap_or_else(|e| {
            panic!("Postgres is needed for this test and is not reachable at {admin_url} ({e}); start it or set DATABASE_URL")
        });
        let name = format!("talos_sso_migrate_{}", crate::random::random_hex(6).unwrap());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
        let mut url = url::Url::parse(&admin_url).unwrap();
        url.set_path(&format!("/{name}"));
        let store = AuditStore::connect(url.as_str(), &StoreOptions::default())
            .await
            .unwrap();
        let AuditStore::Postgres(pool) = &store else {
            panic!("{url} is not Postgres")
        };
        released_postgres().run(pool).await.unwrap();
        store.migrate().await.unwrap();
        assert_eq!(store.verify_chain().await.unwrap().verified, 0);
        store.close().await;
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
    }

    #[test]
    fn only_a_time_bound_at_the_far_end_orders_by_an_expression_of_seq() {
        let role = |n: usize| format!("role = ${n}");
        let at = Some(OffsetDateTime::UNIX_EPOCH);
        let since = AuditFilter {
            since: at,
            ..Default::default()
        };
        let until = AuditFilter {
            until: at,
            ..Default::default()
        };
        let newest = Order::NewestFirst { before_seq: Some(9) };
        let sql = |filter: &AuditFilter, order| RecordQuery::matching(filter, role, "V", order).sql;
        let tail = |sql: String| sql[sql.find(" WHERE ").unwrap_or(0)..].to_owned();
        assert_eq!(
            tail(sql(&since, Order::OldestFirst)),
            " WHERE seq IN (SELECT seq FROM audit_events WHERE seq + 0 > $1 AND V AND occurred_at >= $2 \
             ORDER BY seq + 0 LIMIT $3) ORDER BY seq"
        );
        assert_eq!(
            tail(sql(&until, Order::OldestFirst)),
            " WHERE seq > $1 AND V AND occurred_at < $2 ORDER BY seq LIMIT $3"
        );
        assert_eq!(
            tail(sql(&until, newest)),
            " WHERE seq IN (SELECT seq FROM audit_events WHERE seq + 0 > $1 AND V AND seq + 0 < $2 \
             AND occurred_at < $3 ORDER BY seq + 0 DESC LIMIT $4) ORDER BY seq DESC"
        );
        assert_eq!(
            tail(sql(&since, newest)),
            " WHERE seq > $1 AND V AND seq < $2 AND occurred_at >= $3 ORDER BY seq DESC LIMIT $4"
        );
    }

    #[test]
    fn every_query_of_records_keeps_to_the_rows_of_the_chain() {
        for (in_chain, subjects) in [
            (chain_rows!(postgres), SUBJECTS_OF_POSTGRES),
            (chain_rows!(sqlite), SUBJECTS_OF_SQLITE),
        ] {
            let role = |n: usize| format!("role = ${n}");
            let filter = AuditFilter {
                since: Some(OffsetDateTime::UNIX_EPOCH),
                ..Default::default()
            };
            let statements = [
                subjects.to_owned(),
                RecordQuery::page(0, 1, in_chain).sql,
                RecordQuery::matching(&AuditFilter::default(), role, in_chain, Order::OldestFirst).sql,
                RecordQuery::matching(&filter, role, in_chain, Order::OldestFirst).sql,
                RecordQuery::matching(&filter, role, in_chain, Order::NewestFirst { before_seq: None }).sql,
            ];
            for sql in statements {
                assert!(
                    sql.contains(&format!(" WHERE {in_chain} "))
                        || sql.contains(&format!(" AND {in_chain} "))
                        || sql.ends_with(&format!(" AND {in_chain}")),
                    "{sql}"
                );
            }
        }
        // The same test as the rows a constraint admits, written so that
        // SQLite never seeks from it; its complement is a range both seek.
        assert_eq!(chain_rows!(postgres), "seq > 0");
        assert_eq!(chain_rows!(sqlite), "+seq > 0");
        assert!(
            OUTSIDE_CHAIN_SQL.contains(" WHERE seq <= 0 ")
                && OUTSIDE_CHAIN_COUNT_SQL.ends_with(" WHERE seq <= 0")
        );
    }

    #[test]
    fn rows_outside_the_chain_are_named_with_what_to_do() {
        let outside = OutsideChain {
            count: 12,
            rows: vec![
                (-1, "certificate.issued".into(), Some("carol@example.com".into())),
                (0, "deny.added\u{1b}".into(), None),
            ],
        };
        let text = outside.to_string();
        assert!(
            text.starts_with(
                "the audit trail holds 12 rows outside its hash chain (seq 0 or below): seq -1 \
                 (certificate.issued, carol@example.com), seq 0 (deny.added\\u{1b}, no username), and 10 more."
            ),
            "{text}"
        );
        assert!(
            text.contains("docs/operations.md, \"Rows outside the chain\""),
            "{text}"
        );
        let one = OutsideChain {
            count: 1,
            rows: outside.rows[..1].to_vec(),
        };
        assert!(
            one.to_string().starts_with("the audit trail holds 1 row outside"),
            "{one}"
        );
    }

    /// A backend in memory that notes each call it gets.
    #[derive(Default)]
    struct Recorder {
        used: HashSet<String>,
        deny_list: DeniedPairs,
        calls: Vec<String>,
        records: Vec<StoredRecord>,
        /// Answer one token claim fewer than asked.
        short_of_answers: bool,
    }

    impl Recorder {
        fn listed(&self, subjects: &[String]) -> DeniedPairs {
            self.deny_list
                .iter()
                .filter(|(subject, _)| subject.as_ref().is_some_and(|s| subjects.contains(s)))
                .cloned()
                .collect()
        }
    }

    impl BatchTx for Recorder {
        async fn head(&mut self) -> Result<Option<(i64, String)>, StoreError> {
            self.calls.push("head".into());
            Ok(self.records.last().map(|r| (r.seq, r.hash.clone())))
        }

        async fn head_and_denied(
            &mut self,
            subjects: &[String],
            _: &[String],
        ) -> Result<(Option<(i64, String)>, DeniedPairs), StoreError> {
            self.calls.push("head and denied".into());
            let head = self.records.last().map(|r| (r.seq, r.hash.clone()));
            Ok((head, self.listed(subjects)))
        }

        async fn denied(&mut self, subjects: &[String], _: &[String]) -> Result<DeniedPairs, StoreError> {
            self.calls.push("denied".into());
            Ok(self.listed(subjects))
        }

        async fn claim_tokens(
            &mut self,
            claims: &[(&TokenClaim, OffsetDateTime)],
        ) -> Result<Vec<bool>, StoreError> {
            let ids: Vec<&str> = claims.iter().map(|(c, _)| c.token_id.as_str()).collect();
            self.calls.push(format!("claim {}", ids.join(",")));
            let mut fresh: Vec<bool> = ids
                .into_iter()
                .map(|id| self.used.insert(id.to_owned()))
                .collect();
            if self.short_of_answers {
                fresh.pop();
            }
            Ok(fresh)
        }

        async fn change_deny_list(&mut self, change: &DenyChange) -> Result<u64, StoreError> {
            self.calls.push("change".into());
            if let DenyChange::Add(entry) = change {
                self.deny_list
                    .push((entry.subject.clone(), entry.username.clone()));
            }
            Ok(1)
        }

        async fn insert_records(&mut self, records: &[StoredRecord]) -> Result<(), StoreError> {
            self.calls.push(format!("insert {}", records.len()));
            self.records.extend_from_slice(records);
            Ok(())
        }

        async fn commit(self) -> Result<(), sqlx::Error> {
            Ok(())
        }
    }

    fn kinds(appended: &[Appended]) -> Vec<&'static str> {
        appended
            .iter()
            .map(|a| match a {
                Appended::Recorded(_) => "recorded",
                Appended::Replayed(_) => "replayed",
                Appended::Denied(_) => "denied",
            })
            .collect()
    }

    fn issuance(subject: &str, token_id: &str) -> Append {
        let mut record = AuditRecord::new(
            event::CERTIFICATE_ISSUED,
            outcome::SUCCESS,
            token_id,
            OffsetDateTime::UNIX_EPOCH,
        );
        record.subject = Some(subject.into());
        record.serial = Some("01".into());
        Append {
            record,
            claim: Some(TokenClaim {
                token_id: token_id.into(),
                expires_at: None,
            }),
            deny_check: true,
            deny_change: None,
        }
    }

    fn deny(subject: &str, token_id: &str) -> Append {
        let mut append = issuance("admin", token_id);
        append.record.event = event::DENY_ADDED.into();
        append.deny_change = Some(DenyChange::Add(DenyEntry {
            subject: Some(subject.into()),
            username: None,
            reason: "investigation".into(),
            added_by: "admin".into(),
            added_at: OffsetDateTime::UNIX_EPOCH,
            expires_at: None,
        }));
        append
    }

    #[tokio::test]
    async fn a_batch_reaches_the_backend_a_run_of_claims_and_one_insert_at_a_time() {
        let mut backend = Recorder::default();
        let batch = [
            issuance("alice", "t1"),
            issuance("alice", "t1"),
            deny("bob", "t2"),
            issuance("bob", "t3"),
            issuance("carol", "t4"),
        ];
        let appended = extend_chain(&mut backend, &batch).await.unwrap();
        let kinds = kinds(&appended);
        assert_eq!(kinds, ["recorded", "replayed", "recorded", "denied", "recorded"]);
        assert_eq!(
            backend.calls,
            [
                "head and denied",
                "claim t1,t1,t2",
                "change",
                "denied",
                "claim t4",
                "insert 5"
            ]
        );
        // A denied record claims nothing.
        assert!(!backend.used.contains("t3"));
        assert_eq!(appended[2].stored().record.details["entries_changed"], 1);
        let mut check = ChainCheck::default();
        backend.records.iter().for_each(|r| check.feed(r));
        assert_eq!((check.verified, check.first_broken), (5, None));

        // The next batch goes on from the head.
        let appended = extend_chain(&mut backend, &[issuance("carol", "t5")])
            .await
            .unwrap();
        assert_eq!(appended[0].stored().seq, 6);
    }

    #[tokio::test]
    async fn a_token_named_first_by_a_blocked_record_is_fresh_for_the_next_allowed_one() {
        let mut backend = Recorder {
            deny_list: vec![(Some("mallet".into()), None)],
            ..Default::default()
        };
        let batch = [
            issuance("mallet", "t1"),
            issuance("alice", "t1"),
            issuance("alice", "t1"),
            issuance("mallet", "t2"),
        ];
        let appended = extend_chain(&mut backend, &batch).await.unwrap();
        let kinds = kinds(&appended);
        // The blocked record's token is fresh for the next allowed one.
        assert_eq!(kinds, ["denied", "recorded", "replayed", "denied"]);
        assert_eq!(backend.calls, ["head and denied", "claim t1,t1", "insert 4"]);
        assert!(!backend.used.contains("t2"));
    }

    #[test]
    fn a_token_claimed_twice_in_one_batch_is_sent_once_and_fresh_at_most_once() {
        let claim = |id: &str| TokenClaim {
            token_id: id.into(),
            expires_at: None,
        };
        let (a, b, c) = (claim("a"), claim("b"), claim("c"));
        let at = OffsetDateTime::UNIX_EPOCH;
        let claims = [(&a, at), (&b, at), (&a, at), (&c, at), (&c, at)];
        let sent: Vec<&str> = distinct_claims(&claims)
            .iter()
            .map(|(claim, _)| claim.token_id.as_str())
            .collect();
        assert_eq!(sent, ["a", "b", "c"]);
        // `b` was claimed before the batch: the statement inserted `c` and `a`.
        assert_eq!(
            claim_answers(&claims, vec!["c".into(), "a".into()]),
            [true, false, false, true, false]
        );
    }

    #[tokio::test]
    async fn a_batch_that_checks_no_identity_reads_the_head_alone() {
        let mut backend = Recorder::default();
        let unchecked = Append {
            deny_check: false,
            ..issuance("alice", "t1")
        };
        extend_chain(&mut backend, &[unchecked]).await.unwrap();
        assert_eq!(backend.calls, ["head", "claim t1", "insert 1"]);
    }

    #[test]
    fn the_head_and_the_deny_entries_are_told_apart_by_their_columns() {
        let entry = |s: &str| (None, None, Some(s.to_owned()), None);
        let head = (Some(7), Some("h7".to_owned()), None, None);
        let (found, denied) = head_and_denied(vec![entry("a"), head.clone(), entry("b")]).unwrap();
        assert_eq!(found, Some((7, "h7".to_owned())));
        assert_eq!(
            denied,
            [(Some("a".to_owned()), None), (Some("b".to_owned()), None)]
        );
        // An empty trail: no head row.
        assert_eq!(head_and_denied(vec![entry("a")]).unwrap().0, None);
        // Two heads, or a row that is neither, is not an answer to trust.
        assert!(head_and_denied(vec![head.clone(), head]).is_err());
        assert!(head_and_denied(vec![(Some(1), None, Some("a".into()), None)]).is_err());
    }

    #[tokio::test]
    async fn a_backend_that_answers_too_few_claims_fails_the_batch() {
        let mut backend = Recorder {
            short_of_answers: true,
            ..Default::default()
        };
        let result = extend_chain(&mut backend, &[issuance("alice", "t1"), issuance("bob", "t2")]).await;
        assert!(matches!(result, Err(StoreError::Unavailable(_))), "{result:?}");
        assert!(backend.records.is_empty());
    }
}
