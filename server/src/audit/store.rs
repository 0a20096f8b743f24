//! Where the audit trail lives: Postgres (production, shared by replicas) or
//! SQLite (the embedded default). One type, two backends, the same contract:
//!
//! - [`AuditStore::append_batch`] appends records in one transaction, after
//!   claiming each record's token id (the replay guard); a record whose token
//!   was already used is written as a `token_replayed` denial instead;
//! - the chain head is read inside that transaction under a lock (Postgres:
//!   an advisory lock; SQLite: `BEGIN IMMEDIATE`), so concurrent writers on
//!   several replicas extend one chain;
//! - nothing is acknowledged before the commit returns.

use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqlSafeStr};
use time::OffsetDateTime;

use super::RecordExt;
use super::{AuditRecord, ChainCheck, GENESIS_HASH, StoredRecord, chain, format_micros, parse_micros};

/// Postgres advisory lock key that serialises chain appends (any constant
/// works; this one spells "talosSSO" in a way nobody else will pick).
const CHAIN_LOCK_KEY: i64 = 0x7461_6c6f_7353_534f;

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
    #[error("audit database migration failed: {0}")]
    Migration(String),
    #[error("the audit database holds an unreadable record: {0}")]
    Corrupt(String),
}

/// Whether a database error code says the data was refused: Postgres
/// SQLSTATE classes 22 (data exception), 23 (integrity constraint) and 54
/// (program limit, e.g. a row too large); SQLite primary result codes 18
/// (TOOBIG), 19 (CONSTRAINT), 20 (MISMATCH) and 25 (RANGE).
fn refuses_the_data(code: &str) -> bool {
    match code.parse::<u32>() {
        Ok(sqlite) if code.len() != 5 => matches!(sqlite & 0xff, 18 | 19 | 20 | 25),
        _ => matches!(code.get(..2), Some("22" | "23" | "54")),
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            sqlx::Error::Database(refusal) if refusal.code().is_some_and(|code| refuses_the_data(&code)) => {
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

/// Most records one query returns.
pub const MAX_QUERY_LIMIT: i64 = 1000;

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

/// A deny_list row: subject, username, reason, added_by, added_at.
type DenyRow<Time> = (Option<String>, Option<String>, String, String, Time);

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

#[derive(Debug, Clone)]
pub enum AuditStore {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

fn migrator(files: &[(&'static str, &'static str)]) -> Migrator {
    let migrations = files
        .iter()
        .enumerate()
        .map(|(i, (description, sql))| {
            Migration::new(
                i as i64 + 1,
                (*description).into(),
                MigrationType::Simple,
                sql.into_sql_str(),
                false,
            )
        })
        .collect();
    Migrator::with_migrations(migrations)
}

const POSTGRES_MIGRATIONS: [(&str, &str); 3] = [
    (
        "audit",
        include_str!("../../../migrations/postgres/0001_audit.sql"),
    ),
    (
        "deny list",
        include_str!("../../../migrations/postgres/0002_deny_list.sql"),
    ),
    (
        "deny by subject",
        include_str!("../../../migrations/postgres/0003_deny_by_subject.sql"),
    ),
];
const SQLITE_MIGRATIONS: [(&str, &str); 3] = [
    ("audit", include_str!("../../../migrations/sqlite/0001_audit.sql")),
    (
        "deny list",
        include_str!("../../../migrations/sqlite/0002_deny_list.sql"),
    ),
    (
        "deny by subject",
        include_str!("../../../migrations/sqlite/0003_deny_by_subject.sql"),
    ),
];

const COLUMNS: &str = "seq, occurred_at, request_id, event, outcome, reason_code, cluster, issuer, tenant, subject, \
     username, identity_verified, groups_evaluated, roles_requested, roles_granted, serial, certificate_sha256, \
     public_key_sha256, not_before, not_after, client_ip, user_agent, client_version, token_id, token_issued_at, \
     details, prev_hash, hash";

impl AuditStore {
    /// Connect to `url` (`postgres://...` or `sqlite://...`). SQLite files and
    /// their directory are created when missing.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool = PgPoolOptions::new()
                .max_connections(options.max_connections)
                .acquire_timeout(options.acquire_timeout)
                .connect(url)
                .await?;
            Ok(AuditStore::Postgres(pool))
        } else if let Some(path) = url.strip_prefix("sqlite://") {
            create_private_sqlite_file(path.split('?').next().unwrap_or(path))?;
            let connect = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(5));
            let pool = SqlitePoolOptions::new()
                .max_connections(options.max_connections.clamp(1, 4))
                .acquire_timeout(options.acquire_timeout)
                .connect_with(connect)
                .await?;
            Ok(AuditStore::Sqlite(pool))
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

    pub async fn migrate(&self) -> Result<(), StoreError> {
        let result = match self {
            AuditStore::Postgres(pool) => migrator(&POSTGRES_MIGRATIONS).run(pool).await,
            AuditStore::Sqlite(pool) => migrator(&SQLITE_MIGRATIONS).run(pool).await,
        };
        result.map_err(|e| StoreError::Migration(e.to_string()))
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            AuditStore::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(|_| ())?,
            AuditStore::Sqlite(pool) => sqlx::query("SELECT 1").execute(pool).await.map(|_| ())?,
        }
        Ok(())
    }

    pub async fn close(&self) {
        match self {
            AuditStore::Postgres(pool) => pool.close().await,
            AuditStore::Sqlite(pool) => pool.close().await,
        }
    }

    /// Append records in one transaction; see the module comment.
    pub async fn append_batch(&self, batch: &[Append]) -> Result<Vec<Appended>, StoreError> {
        match self {
            AuditStore::Postgres(pool) => append_postgres(pool, batch).await,
            AuditStore::Sqlite(pool) => append_sqlite(pool, batch).await,
        }
    }

    /// Up to `limit` records after `after_seq`, in order.
    pub async fn page(&self, after_seq: i64, limit: i64) -> Result<Vec<StoredRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM audit_events WHERE seq > $1 ORDER BY seq LIMIT $2");
        match self {
            AuditStore::Postgres(pool) => {
                let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(after_seq)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?;
                rows.iter().map(pg_record).collect()
            }
            AuditStore::Sqlite(pool) => {
                let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(after_seq)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?;
                rows.iter().map(sqlite_record).collect()
            }
        }
    }

    /// Records matching `filter`, oldest first, after `filter.after_seq`.
    pub async fn query(&self, filter: &AuditFilter) -> Result<Vec<StoredRecord>, StoreError> {
        enum Bind {
            Text(String),
            Time(OffsetDateTime),
            Int(i64),
        }
        let postgres = matches!(self, AuditStore::Postgres(_));
        let mut conditions = vec!["seq > $1".to_owned()];
        let mut binds = vec![Bind::Int(filter.after_seq)];
        let mut add = |condition: &dyn Fn(usize) -> String, bind: Bind| {
            binds.push(bind);
            conditions.push(condition(binds.len()));
        };
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
        ] {
            if let Some(value) = value {
                add(&|n| format!("{column} = ${n}"), Bind::Text(value.clone()));
            }
        }
        if let Some(role) = &filter.role {
            let condition: &dyn Fn(usize) -> String = if postgres {
                &|n| format!("(${n} = ANY(roles_granted) OR ${n} = ANY(roles_requested))")
            } else {
                &|n| {
                    format!(
                        "(EXISTS (SELECT 1 FROM json_each(roles_granted) WHERE value = ${n}) \
                         OR EXISTS (SELECT 1 FROM json_each(roles_requested) WHERE value = ${n}))"
                    )
                }
            };
            add(condition, Bind::Text(role.clone()));
        }
        binds.push(Bind::Int(filter.limit.clamp(1, MAX_QUERY_LIMIT)));
        let sql = format!(
            "SELECT {COLUMNS} FROM audit_events WHERE {} ORDER BY seq LIMIT ${}",
            conditions.join(" AND "),
            binds.len()
        );
        match self {
            AuditStore::Postgres(pool) => {
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for bind in binds {
                    query = match bind {
                        Bind::Text(v) => query.bind(v),
                        Bind::Time(v) => query.bind(v),
                        Bind::Int(v) => query.bind(v),
                    };
                }
                query.fetch_all(pool).await?.iter().map(pg_record).collect()
            }
            AuditStore::Sqlite(pool) => {
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for bind in binds {
                    query = match bind {
                        Bind::Text(v) => query.bind(v),
                        Bind::Time(v) => query.bind(format_micros(v)),
                        Bind::Int(v) => query.bind(v),
                    };
                }
                query.fetch_all(pool).await?.iter().map(sqlite_record).collect()
            }
        }
    }

    /// The deny list, newest first.
    pub async fn deny_list(&self) -> Result<Vec<DenyEntry>, StoreError> {
        let sql =
            "SELECT subject, username, reason, added_by, added_at FROM deny_list ORDER BY added_at DESC";
        match self {
            AuditStore::Postgres(pool) => {
                let rows: Vec<DenyRow<OffsetDateTime>> = sqlx::query_as(sql).fetch_all(pool).await?;
                Ok(rows
                    .into_iter()
                    .map(|(subject, username, reason, added_by, added_at)| DenyEntry {
                        subject,
                        username,
                        reason,
                        added_by,
                        added_at,
                    })
                    .collect())
            }
            AuditStore::Sqlite(pool) => {
                let rows: Vec<DenyRow<String>> = sqlx::query_as(sql).fetch_all(pool).await?;
                rows.into_iter()
                    .map(|(subject, username, reason, added_by, added_at)| {
                        let added_at = parse_micros(&added_at)
                            .ok_or_else(|| StoreError::Corrupt(format!("deny_list.added_at `{added_at}`")))?;
                        Ok(DenyEntry {
                            subject,
                            username,
                            reason,
                            added_by,
                            added_at,
                        })
                    })
                    .collect()
            }
        }
    }

    /// The subjects that verified records name with this username (case
    /// does not matter), at most `limit`: how a username is turned into the
    /// immutable identifier a deny-list entry blocks.
    pub async fn subjects_of(&self, username: &str, limit: i64) -> Result<Vec<String>, StoreError> {
        let sql = "SELECT DISTINCT subject FROM audit_events \
                   WHERE identity_verified = true AND subject IS NOT NULL AND lower(username) = lower($1) \
                   ORDER BY subject LIMIT $2";
        Ok(match self {
            AuditStore::Postgres(pool) => {
                sqlx::query_scalar(sql)
                    .bind(username)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
            AuditStore::Sqlite(pool) => {
                sqlx::query_scalar(sql)
                    .bind(username)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
        })
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

    /// Recompute the whole chain; stops at the first broken link.
    pub async fn verify_chain(&self) -> Result<ChainCheck, StoreError> {
        let mut check = ChainCheck::default();
        let mut after = 0;
        loop {
            let page = self.page(after, 1000).await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            for record in &page {
                check.feed(record);
            }
            if check.first_broken.is_some() {
                break;
            }
        }
        Ok(check)
    }
}

/// `(subject, username)` of deny-list entries that match a batch.
type DeniedPairs = Vec<(Option<String>, Option<String>)>;

/// The statements one backend runs inside the appending transaction.
/// [`extend_chain`] holds what both backends share: the order of the checks,
/// the outcomes, the hashing. The transaction was opened under the lock that
/// serialises chain appends (advisory lock, or `BEGIN IMMEDIATE`).
trait ChainTx {
    /// The last record's sequence number and hash (0 and zeros when empty).
    async fn head(&mut self) -> Result<(i64, String), StoreError>;
    /// Deny-list entries matching any of these subjects or (lower-cased) usernames.
    async fn denied(&mut self, subjects: &[String], usernames: &[String]) -> Result<DeniedPairs, StoreError>;
    /// Claim a token id; `false` when it was claimed before (a replay).
    async fn claim(&mut self, claim: &TokenClaim, at: OffsetDateTime) -> Result<bool, StoreError>;
    /// Apply a deny-list change; the number of entries it touched.
    async fn change_deny_list(&mut self, change: &DenyChange) -> Result<u64, StoreError>;
    async fn insert(&mut self, stored: &StoredRecord) -> Result<(), StoreError>;
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
/// changes, then the record on the chain.
async fn extend_chain(tx: &mut impl ChainTx, batch: &[Append]) -> Result<Vec<Appended>, StoreError> {
    let (mut seq, mut hash) = tx.head().await?;
    // Checks compare what is stored: deny entries hold cleaned text, so the
    // record is cleaned first (a subject with a zero-width space must match
    // the entry an admin wrote from the trail).
    let records: Vec<AuditRecord> = batch.iter().map(|a| a.record.clone().normalised()).collect();
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
    let mut denied = if subjects.is_empty() {
        Vec::new()
    } else {
        tx.denied(&subjects, &usernames).await?
    };
    let mut out = Vec::with_capacity(batch.len());
    for (append, mut record) in batch.iter().zip(records) {
        let mut outcome = Outcome::Recorded;
        if append.deny_check
            && denied
                .iter()
                .any(|entry| entry_blocks(entry, record.subject.as_deref(), record.username.as_deref()))
        {
            outcome = Outcome::Denied;
        }
        if let (Some(claim), Outcome::Recorded) = (&append.claim, outcome)
            && !tx.claim(claim, record.occurred_at).await?
        {
            outcome = Outcome::Replayed;
        }
        if let (Some(change), Outcome::Recorded) = (&append.deny_change, outcome) {
            let rows = tx.change_deny_list(change).await?;
            note_change(&mut record, rows);
            if !subjects.is_empty() {
                // Later records of this batch see the list as changed.
                denied = tx.denied(&subjects, &usernames).await?;
            }
        }
        // Already normalised above; `apply` only clears fields.
        let stored = chain(seq, &hash, outcome.apply(record));
        tx.insert(&stored).await?;
        seq = stored.seq;
        hash = stored.hash.clone();
        out.push(outcome.wrap(stored));
    }
    Ok(out)
}

const HEAD_SQL: &str = "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1";

async fn append_postgres(pool: &PgPool, batch: &[Append]) -> Result<Vec<Appended>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(CHAIN_LOCK_KEY)
        .execute(&mut *tx)
        .await?;
    let out = extend_chain(&mut tx, batch).await?;
    tx.commit().await?;
    Ok(out)
}

async fn append_sqlite(pool: &SqlitePool, batch: &[Append]) -> Result<Vec<Appended>, StoreError> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let out = extend_chain(&mut tx, batch).await?;
    tx.commit().await?;
    Ok(out)
}

impl ChainTx for sqlx::Transaction<'_, sqlx::Postgres> {
    async fn head(&mut self) -> Result<(i64, String), StoreError> {
        let row: Option<(i64, String)> = sqlx::query_as(HEAD_SQL).fetch_optional(&mut **self).await?;
        Ok(row.unwrap_or((0, GENESIS_HASH.to_owned())))
    }

    async fn denied(&mut self, subjects: &[String], usernames: &[String]) -> Result<DeniedPairs, StoreError> {
        Ok(sqlx::query_as(
            "SELECT subject, username FROM deny_list WHERE subject = ANY($1) OR username = ANY($2)",
        )
        .bind(subjects)
        .bind(usernames)
        .fetch_all(&mut **self)
        .await?)
    }

    async fn claim(&mut self, claim: &TokenClaim, at: OffsetDateTime) -> Result<bool, StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO used_tokens (token_id, used_at, expires_at) VALUES ($1, $2, $3) ON CONFLICT (token_id) DO NOTHING",
        )
        .bind(&claim.token_id)
        .bind(at)
        .bind(claim.expires_at)
        .execute(&mut **self)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    async fn change_deny_list(&mut self, change: &DenyChange) -> Result<u64, StoreError> {
        let done = match change {
            DenyChange::Add(entry) => sqlx::query(
                "INSERT INTO deny_list (subject, username, reason, added_by, added_at) VALUES ($1, lower($2), $3, $4, $5) ON CONFLICT DO NOTHING",
            )
            .bind(&entry.subject)
            .bind(&entry.username)
            .bind(&entry.reason)
            .bind(&entry.added_by)
            .bind(entry.added_at)
            .execute(&mut **self)
            .await?,
            DenyChange::Remove { subject, username } => {
                sqlx::query("DELETE FROM deny_list WHERE subject = $1 OR (subject IS NULL AND username = lower($2))")
                    .bind(subject)
                    .bind(username)
                    .execute(&mut **self)
                    .await?
            }
        };
        Ok(done.rows_affected())
    }

    async fn insert(&mut self, stored: &StoredRecord) -> Result<(), StoreError> {
        let r = &stored.record;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO audit_events ({COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,$23,$24,$25,$26,$27,$28)"
        )))
        .bind(stored.seq)
        .bind(r.occurred_at)
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
        .bind(&r.groups_evaluated)
        .bind(&r.roles_requested)
        .bind(&r.roles_granted)
        .bind(&r.serial)
        .bind(&r.certificate_sha256)
        .bind(&r.public_key_sha256)
        .bind(r.not_before)
        .bind(r.not_after)
        .bind(&r.client_ip)
        .bind(&r.user_agent)
        .bind(&r.client_version)
        .bind(&r.token_id)
        .bind(r.token_issued_at)
        .bind(&r.details)
        .bind(&stored.prev_hash)
        .bind(&stored.hash)
        .execute(&mut **self)
        .await?;
        Ok(())
    }
}

impl ChainTx for sqlx::Transaction<'_, sqlx::Sqlite> {
    async fn head(&mut self) -> Result<(i64, String), StoreError> {
        let row: Option<(i64, String)> = sqlx::query_as(HEAD_SQL).fetch_optional(&mut **self).await?;
        Ok(row.unwrap_or((0, GENESIS_HASH.to_owned())))
    }

    async fn denied(&mut self, subjects: &[String], usernames: &[String]) -> Result<DeniedPairs, StoreError> {
        Ok(sqlx::query_as(
            "SELECT subject, username FROM deny_list \
             WHERE subject IN (SELECT value FROM json_each(?1)) OR username IN (SELECT value FROM json_each(?2))",
        )
        .bind(json_list(subjects))
        .bind(json_list(usernames))
        .fetch_all(&mut **self)
        .await?)
    }

    async fn claim(&mut self, claim: &TokenClaim, at: OffsetDateTime) -> Result<bool, StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO used_tokens (token_id, used_at, expires_at) VALUES (?, ?, ?) ON CONFLICT (token_id) DO NOTHING",
        )
        .bind(&claim.token_id)
        .bind(format_micros(at))
        .bind(claim.expires_at.map(format_micros))
        .execute(&mut **self)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    async fn change_deny_list(&mut self, change: &DenyChange) -> Result<u64, StoreError> {
        let done = match change {
            DenyChange::Add(entry) => sqlx::query(
                "INSERT INTO deny_list (subject, username, reason, added_by, added_at) VALUES (?, lower(?), ?, ?, ?) ON CONFLICT DO NOTHING",
            )
            .bind(&entry.subject)
            .bind(&entry.username)
            .bind(&entry.reason)
            .bind(&entry.added_by)
            .bind(format_micros(entry.added_at))
            .execute(&mut **self)
            .await?,
            DenyChange::Remove { subject, username } => {
                sqlx::query("DELETE FROM deny_list WHERE subject = ? OR (subject IS NULL AND username = lower(?))")
                    .bind(subject)
                    .bind(username)
                    .execute(&mut **self)
                    .await?
            }
        };
        Ok(done.rows_affected())
    }

    async fn insert(&mut self, stored: &StoredRecord) -> Result<(), StoreError> {
        let r = &stored.record;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO audit_events ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
        )))
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
        .execute(&mut **self)
        .await?;
        Ok(())
    }
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

/// The SQLite database holds the trail, the deny list and the replay
/// guard: its directory is created 0700 and the file 0600 when missing,
/// whatever the umask. SQLite gives its `-wal` and `-shm` files the
/// database file's mode.
fn create_private_sqlite_file(path: &str) -> Result<(), StoreError> {
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

fn json_list(items: &[String]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".into())
}

fn pg_record(row: &PgRow) -> Result<StoredRecord, StoreError> {
    let record = AuditRecord {
        occurred_at: row.try_get("occurred_at")?,
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
        groups_evaluated: row.try_get("groups_evaluated")?,
        roles_requested: row.try_get("roles_requested")?,
        roles_granted: row.try_get("roles_granted")?,
        serial: row.try_get("serial")?,
        certificate_sha256: row.try_get("certificate_sha256")?,
        public_key_sha256: row.try_get("public_key_sha256")?,
        not_before: row.try_get("not_before")?,
        not_after: row.try_get("not_after")?,
        client_ip: row.try_get("client_ip")?,
        user_agent: row.try_get("user_agent")?,
        client_version: row.try_get("client_version")?,
        token_id: row.try_get("token_id")?,
        token_issued_at: row.try_get("token_issued_at")?,
        details: row.try_get("details")?,
    };
    Ok(StoredRecord {
        seq: row.try_get("seq")?,
        record,
        prev_hash: row.try_get("prev_hash")?,
        hash: row.try_get("hash")?,
    })
}

fn sqlite_time(row: &SqliteRow, column: &str) -> Result<Option<OffsetDateTime>, StoreError> {
    let text: Option<String> = row.try_get(column)?;
    text.map(|t| {
        parse_micros(&t).ok_or_else(|| StoreError::Corrupt(format!("{column}: `{t}` is not a time")))
    })
    .transpose()
}

fn sqlite_list(row: &SqliteRow, column: &str) -> Result<Vec<String>, StoreError> {
    let text: String = row.try_get(column)?;
    serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(format!("{column}: {e}")))
}

fn sqlite_record(row: &SqliteRow) -> Result<StoredRecord, StoreError> {
    let details: String = row.try_get("details")?;
    let record = AuditRecord {
        occurred_at: sqlite_time(row, "occurred_at")?
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
        groups_evaluated: sqlite_list(row, "groups_evaluated")?,
        roles_requested: sqlite_list(row, "roles_requested")?,
        roles_granted: sqlite_list(row, "roles_granted")?,
        serial: row.try_get("serial")?,
        certificate_sha256: row.try_get("certificate_sha256")?,
        public_key_sha256: row.try_get("public_key_sha256")?,
        not_before: sqlite_time(row, "not_before")?,
        not_after: sqlite_time(row, "not_after")?,
        client_ip: row.try_get("client_ip")?,
        user_agent: row.try_get("user_agent")?,
        client_version: row.try_get("client_version")?,
        token_id: row.try_get("token_id")?,
        token_issued_at: sqlite_time(row, "token_issued_at")?,
        details: serde_json::from_str::<Value>(&details)
            .map_err(|e| StoreError::Corrupt(format!("details: {e}")))?,
    };
    Ok(StoredRecord {
        seq: row.try_get("seq")?,
        record,
        prev_hash: row.try_get("prev_hash")?,
        hash: row.try_get("hash")?,
    })
}

#[cfg(test)]
mod tests {
    use super::refuses_the_data;

    #[test]
    fn only_data_errors_are_the_records_fault() {
        // Postgres: invalid text, a check constraint, a row too large.
        for code in ["22021", "22P05", "23514", "23505", "54000"] {
            assert!(refuses_the_data(code), "{code}");
        }
        // Postgres: serialisation, deadlock, shutdown, cancel, missing table.
        for code in ["40001", "40P01", "57P01", "57014", "42P01", "53300"] {
            assert!(!refuses_the_data(code), "{code}");
        }
        // SQLite: constraint (and its extended codes), too big, mismatch.
        for code in ["19", "2067", "275", "18", "20"] {
            assert!(refuses_the_data(code), "{code}");
        }
        // SQLite: busy, locked, I/O, full, read-only.
        for code in ["5", "6", "10", "13", "8", "517"] {
            assert!(!refuses_the_data(code), "{code}");
        }
    }
}
