//! The Postgres backend (production; several replicas share one database):
//! its pool, its SQL, the advisory lock that serialises chain appends, how
//! its rows decode, and which of its errors blame the data.

use serde_json::Value;
use sqlx::error::DatabaseError;
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgDatabaseError, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, Postgres, Row, Transaction};
use time::OffsetDateTime;

use super::{
    BatchTx, Bind, COLUMNS, DENY_LIST_SQL, DeniedPairs, DenyChange, DenyEntry, HEAD_SQL, RecordQuery,
    RecordRow, StoreError, StoreOptions, TokenClaim, bind_record, change_deny_list, claim_tokens, deny_entry,
    stored_record,
};
use crate::audit::StoredRecord;

/// Postgres advisory lock key that serialises chain appends (any constant
/// works; this one spells "talosSSO" in a way nobody else will pick).
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

pub(super) async fn records(pool: &PgPool, query: RecordQuery) -> Result<Vec<StoredRecord>, StoreError> {
    let mut select = sqlx::query(sqlx::AssertSqlSafe(query.sql));
    for bind in query.binds {
        select = match bind {
            Bind::Text(v) => select.bind(v),
            Bind::Time(v) => select.bind(v),
            Bind::Int(v) => select.bind(v),
        };
    }
    select.fetch_all(pool).await?.iter().map(stored_record).collect()
}

pub(super) async fn deny_list(pool: &PgPool) -> Result<Vec<DenyEntry>, StoreError> {
    let rows: Vec<super::DenyRow<OffsetDateTime>> = sqlx::query_as(DENY_LIST_SQL).fetch_all(pool).await?;
    Ok(rows.into_iter().map(deny_entry).collect())
}

/// A transaction holding the advisory lock: replicas extend one chain.
pub(super) async fn begin_chain(
    connection: &mut PoolConnection<Postgres>,
) -> Result<Transaction<'_, Postgres>, StoreError> {
    let mut tx = connection.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(CHAIN_LOCK_KEY)
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

impl BatchTx for Transaction<'_, Postgres> {
    async fn head(&mut self) -> Result<Option<(i64, String)>, StoreError> {
        Ok(sqlx::query_as(HEAD_SQL).fetch_optional(&mut **self).await?)
    }

    async fn denied(&mut self, subjects: &[String], usernames: &[String]) -> Result<DeniedPairs, StoreError> {
        Ok(sqlx::query_as(
            "SELECT subject, username FROM deny_list_active WHERE subject = ANY($1) OR username = ANY($2)",
        )
        .bind(subjects)
        .bind(usernames)
        .fetch_all(&mut **self)
        .await?)
    }

    async fn claim_tokens(
        &mut self,
        claims: &[(&TokenClaim, OffsetDateTime)],
    ) -> Result<Vec<bool>, StoreError> {
        claim_tokens!(&mut **self, claims, time: |t| t)
    }

    async fn change_deny_list(&mut self, change: &DenyChange) -> Result<u64, StoreError> {
        change_deny_list!(&mut **self, change, time: |t| t)
    }

    async fn insert_records(&mut self, records: &[StoredRecord]) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO audit_events ({COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,$23,$24,$25,$26,$27,$28)"
        );
        for stored in records {
            let query = sqlx::query(sqlx::AssertSqlSafe(sql.as_str()));
            bind_record!(query, stored, time: |t| t, list: |l| l, json: |j| j)
                .execute(&mut **self)
                .await?;
        }
        Ok(())
    }
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
