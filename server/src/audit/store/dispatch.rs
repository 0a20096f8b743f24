//! The store as callers see it: one type over the two backends, each
//! method handing its work to the backend it holds.

use sqlx::FromRow;
use sqlx::postgres::{PgPool, PgRow};
use sqlx::sqlite::SqliteRow;
use talos_sso_api::audit::MAX_PAGE;

use super::batch::entry_blocks;
use super::chain::append_in;
use super::query::{
    self, Dialect, HEAD_SQL, OUTSIDE_CHAIN_COUNT_SQL, OUTSIDE_CHAIN_SQL, Order, SUBJECTS_OF_POSTGRES,
    SUBJECTS_OF_SQLITE, Statement, bound, chain_rows,
};
use super::types::{
    Append, Appended, AuditFilter, ChartCounts, ChartWindow, DenyEntry, IssuerScope, OUTSIDE_CHAIN_NAMED,
    OutsideChain, StoreError, StoreOptions,
};
use super::{LockAhead, postgres, sqlite};
use crate::audit::{ChainCheck, GENESIS_HASH, StoredRecord, format_micros};
use talos_sso_text::{FIELD_CHARS, clean, clean_field};

#[derive(Debug, Clone)]
pub enum AuditStore {
    Postgres(PgPool),
    Sqlite(sqlite::SqliteStore),
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
        self.records(Statement::page(after_seq, limit, self.chain_rows()))
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
        self.records(self.matching_statement(filter, order)).await
    }

    /// The statement that reads the records of `filter` in `order`.
    pub(super) fn matching_statement(&self, filter: &AuditFilter, order: Order) -> Statement {
        let dialect = match self {
            AuditStore::Postgres(_) => Dialect {
                role: postgres::role_condition,
                method: postgres::METHOD,
                node: postgres::node_condition,
                node_index: true,
                api_call: postgres::API_CALL,
                kind: postgres::kind_condition,
                workload: postgres::WORKLOAD,
                person: postgres::PERSON,
            },
            AuditStore::Sqlite(_) => Dialect {
                role: if order.far_bound(filter) {
                    sqlite::role_condition_far
                } else {
                    sqlite::role_condition
                },
                method: sqlite::METHOD,
                node: sqlite::node_condition,
                node_index: false,
                api_call: sqlite::API_CALL,
                kind: sqlite::kind_condition,
                workload: sqlite::WORKLOAD,
                person: sqlite::PERSON,
            },
        };
        Statement::matching(filter, &dialect, self.chain_rows(), order)
    }

    async fn records(&self, query: Statement) -> Result<Vec<StoredRecord>, StoreError> {
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
        let (subject, username) = (clean_field(subject), clean_field(username));
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

    /// The counts the console's charts draw for `window`: certificates
    /// issued per bucket, cluster and granted role, and denials per reason.
    pub async fn chart(&self, window: &ChartWindow) -> Result<(ChartCounts, ChartCounts), StoreError> {
        let [issued, denied] = match self {
            AuditStore::Postgres(_) => query::chart(
                window,
                &postgres::chart_bucket(window.hourly),
                postgres::GRANTED_ROLES,
                self.chain_rows(),
            ),
            AuditStore::Sqlite(_) => query::chart(
                window,
                &sqlite::chart_bucket(window.hourly),
                sqlite::GRANTED_ROLES,
                self.chain_rows(),
            ),
        };
        Ok((self.rows_as(issued).await?, self.rows_as(denied).await?))
    }

    /// The rows `statement` reads, each as an `O`.
    async fn rows_as<O>(&self, statement: Statement) -> Result<Vec<O>, StoreError>
    where
        O: Send + Unpin + for<'r> FromRow<'r, PgRow> + for<'r> FromRow<'r, SqliteRow>,
    {
        let rows: Result<Vec<O>, sqlx::Error> = match self {
            AuditStore::Postgres(pool) => {
                let rows = bound(statement, std::convert::identity).fetch_all(pool).await?;
                rows.iter().map(O::from_row).collect()
            }
            AuditStore::Sqlite(store) => {
                let rows = bound(statement, format_micros).fetch_all(store.pool()).await?;
                rows.iter().map(O::from_row).collect()
            }
        };
        Ok(rows?)
    }
}

/// A database error as the store reports it: refused for its data when
/// the backend that answered says the data is at fault, else unavailable.
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
                    clean(refusal.message(), FIELD_CHARS)
                ))
            }
            _ => StoreError::Unavailable(error.to_string()),
        }
    }
}
