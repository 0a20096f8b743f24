//! The web console's state in the trail's database (migration 0008), so
//! that every replica serves every request and a restart signs nobody
//! out: sessions, the views each session recorded, logins in progress.
//!
//! What is stored is what the console cannot derive: rows are found by the
//! SHA-256 of the random id the browser's cookie holds (never the id), a
//! session holds who logged in (as JSON the console reads), a login in
//! progress only the page to return to and the client address. Every bound
//! the console promises is kept here, in the database, whichever replica
//! asks: at most `max` sessions (the least recently used gives way) and
//! [`SESSIONS_PER_SUBJECT`] per person, at most `max` logins in progress and
//! [`LOGINS_PER_ADDRESS`] per client address, [`VIEWS_PER_SESSION`] views
//! per session. Expired rows are deleted when met and swept whenever a
//! session or a login is added. Adding one is a transaction serialised
//! across replicas (Postgres: an advisory lock; SQLite: `BEGIN IMMEDIATE`),
//! so that two replicas never both take the last place. Times are
//! milliseconds since the Unix epoch, from the caller's clock.

use super::{AuditStore, StoreError};

/// Sessions one person may hold at once: their least recently used makes
/// room for their next.
pub const SESSIONS_PER_SUBJECT: i64 = 5;

/// Logins in progress one client address may hold: its oldest makes room
/// for its next.
pub const LOGINS_PER_ADDRESS: i64 = 16;

/// Views one session remembers having recorded; past that the oldest is
/// forgotten (its view would be recorded once more, which is harmless).
pub const VIEWS_PER_SESSION: i64 = 4096;

/// How long a login may take at the identity provider, in milliseconds.
pub const LOGIN_TIMEOUT_MS: i64 = 600_000;

/// Serialises the console's additions across replicas (Postgres); any
/// constant nobody else picks.
const CONSOLE_LOCK_KEY: i64 = 0x7461_6c6f_7343_4f4e;

/// The bounds of the sessions, from `console.*`.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// `console.max_sessions`: sessions in all, and logins in progress.
    pub max: i64,
    /// `console.session_idle`, in milliseconds.
    pub idle_ms: i64,
    /// `console.session_lifetime`, in milliseconds.
    pub lifetime_ms: i64,
}

/// A session to add.
#[derive(Debug, Clone, Copy)]
pub struct NewSession<'a> {
    /// Hex SHA-256 of the session's id.
    pub id_hash: &'a str,
    /// Whose (the cap per person counts these).
    pub subject: &'a str,
    /// Who, as the console reads it back.
    pub identity: &'a str,
}

/// A login in progress to add.
#[derive(Debug, Clone, Copy)]
pub struct NewLogin<'a> {
    /// Hex SHA-256 of the login's id.
    pub id_hash: &'a str,
    /// The client address that started it; empty when none is known.
    pub address: &'a str,
    pub return_to: &'a str,
}

/// `$body` run in a transaction `$tx` that holds the console's lock.
macro_rules! locked {
    ($store:expr, $tx:ident => $body:block) => {
        match $store {
            AuditStore::Postgres(pool) => {
                let mut $tx = pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(CONSOLE_LOCK_KEY)
                    .execute(&mut *$tx)
                    .await?;
                let result = $body;
                $tx.commit().await?;
                result
            }
            AuditStore::Sqlite(store) => {
                let mut $tx = store.pool().begin_with("BEGIN IMMEDIATE").await?;
                let result = $body;
                $tx.commit().await?;
                result
            }
        }
    };
}

/// `$body` with `$pool` the store's pool, whichever backend it is.
macro_rules! pooled {
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

const SWEEP_LOGINS: &str = "DELETE FROM console_logins WHERE started_ms <= $1";
const LOGINS_OF: &str = "SELECT count(*) FROM console_logins WHERE address = $1";
const LOGINS: &str = "SELECT count(*) FROM console_logins";
const HOLDING_MOST: &str =
    "SELECT address FROM console_logins GROUP BY address ORDER BY count(*) DESC, address LIMIT 1";
const OLDEST_LOGIN_OF: &str = "DELETE FROM console_logins WHERE id_hash = \
     (SELECT id_hash FROM console_logins WHERE address = $1 ORDER BY started_ms, id_hash LIMIT 1)";
const ADD_LOGIN: &str =
    "INSERT INTO console_logins (id_hash, address, return_to, started_ms) VALUES ($1, $2, $3, $4)";
const TAKE_LOGIN: &str = "DELETE FROM console_logins WHERE id_hash = $1 RETURNING return_to, started_ms";

const SWEEP_SESSIONS: &str = "DELETE FROM console_sessions WHERE last_seen_ms <= $1 OR started_ms <= $2";
const ADD_SESSION: &str = "INSERT INTO console_sessions (id_hash, subject, identity, started_ms, last_seen_ms) \
     VALUES ($1, $2, $3, $4, $4)";
/// The person's sessions but the new one (`$2`) and their `$3` most
/// recently used, deleted.
const TRIM_SUBJECT: &str = "DELETE FROM console_sessions WHERE subject = $1 AND id_hash <> $2 \
     AND id_hash NOT IN (SELECT id_hash FROM console_sessions WHERE subject = $1 AND id_hash <> $2 \
     ORDER BY last_seen_ms DESC, id_hash LIMIT $3)";
/// Every session but the new one (`$1`) and the `$2` most recently used,
/// deleted.
const TRIM_ALL: &str = "DELETE FROM console_sessions WHERE id_hash <> $1 \
     AND id_hash NOT IN (SELECT id_hash FROM console_sessions WHERE id_hash <> $1 \
     ORDER BY last_seen_ms DESC, id_hash LIMIT $2)";
/// A live session, touched (its last use never goes back, whichever
/// replica's clock is behind).
const TOUCH_SESSION: &str = "UPDATE console_sessions \
     SET last_seen_ms = CASE WHEN last_seen_ms < $2 THEN $2 ELSE last_seen_ms END \
     WHERE id_hash = $1 AND last_seen_ms > $3 AND started_ms > $4 RETURNING identity";
const CLOSE_SESSION: &str = "DELETE FROM console_sessions WHERE id_hash = $1";

/// A view noted for a live session unless it was already: its ordinal.
const ADD_VIEW: &str = "INSERT INTO console_views (session_hash, view_hash, ordinal) \
     SELECT $1, $2, coalesce((SELECT max(ordinal) FROM console_views WHERE session_hash = $1), 0) + 1 \
     WHERE EXISTS (SELECT 1 FROM console_sessions WHERE id_hash = $1) \
     ON CONFLICT DO NOTHING RETURNING ordinal";
const TRIM_VIEWS: &str = "DELETE FROM console_views WHERE session_hash = $1 AND ordinal <= $2";
const SEEN_VIEW: &str = "SELECT count(*) FROM console_views WHERE session_hash = $1 AND view_hash = $2";

impl AuditStore {
    /// Add a login in progress. Room is made first among its address's own
    /// (at most [`LOGINS_PER_ADDRESS`]); when all `max` places are taken,
    /// the address holding the most gives up its oldest: a flood evicts the
    /// flooder's. Expired logins are swept first.
    pub async fn console_start_login(
        &self,
        login: NewLogin<'_>,
        max: i64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let max = max.max(1);
        locked!(self, tx => {
            sqlx::query(SWEEP_LOGINS)
                .bind(now_ms.saturating_sub(LOGIN_TIMEOUT_MS))
                .execute(&mut *tx)
                .await?;
            let own: i64 = sqlx::query_scalar(LOGINS_OF)
                .bind(login.address)
                .fetch_one(&mut *tx)
                .await?;
            let giver = if own >= LOGINS_PER_ADDRESS.min(max) {
                Some(login.address.to_owned())
            } else if sqlx::query_scalar::<_, i64>(LOGINS).fetch_one(&mut *tx).await? >= max {
                sqlx::query_scalar(HOLDING_MOST).fetch_optional(&mut *tx).await?
            } else {
                None
            };
            if let Some(giver) = giver {
                sqlx::query(OLDEST_LOGIN_OF).bind(giver).execute(&mut *tx).await?;
            }
            sqlx::query(ADD_LOGIN)
                .bind(login.id_hash)
                .bind(login.address)
                .bind(login.return_to)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
        });
        Ok(())
    }

    /// The login in progress under `id_hash`, taken out (used once, on
    /// whichever replica): its page to return to, unless it expired.
    pub async fn console_take_login(&self, id_hash: &str, now_ms: i64) -> Result<Option<String>, StoreError> {
        let taken: Option<(String, i64)> = pooled!(self, pool => sqlx::query_as(TAKE_LOGIN)
            .bind(id_hash)
            .fetch_optional(pool)
            .await?);
        Ok(taken
            .filter(|(_, started)| now_ms.saturating_sub(*started) < LOGIN_TIMEOUT_MS)
            .map(|(return_to, _)| return_to))
    }

    /// Add a session. Room is made among the person's own first (at most
    /// [`SESSIONS_PER_SUBJECT`]); when every place is taken, the session
    /// least recently used gives way. Ended sessions are swept first.
    pub async fn console_open_session(
        &self,
        session: NewSession<'_>,
        limits: SessionLimits,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        locked!(self, tx => {
            sqlx::query(SWEEP_SESSIONS)
                .bind(now_ms.saturating_sub(limits.idle_ms))
                .bind(now_ms.saturating_sub(limits.lifetime_ms))
                .execute(&mut *tx)
                .await?;
            sqlx::query(ADD_SESSION)
                .bind(session.id_hash)
                .bind(session.subject)
                .bind(session.identity)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            sqlx::query(TRIM_SUBJECT)
                .bind(session.subject)
                .bind(session.id_hash)
                .bind(SESSIONS_PER_SUBJECT - 1)
                .execute(&mut *tx)
                .await?;
            sqlx::query(TRIM_ALL)
                .bind(session.id_hash)
                .bind(limits.max.max(1) - 1)
                .execute(&mut *tx)
                .await?;
        });
        Ok(())
    }

    /// The identity of the session under `id_hash`, when it has not ended;
    /// this counts as its use. An ended one is deleted.
    pub async fn console_session(
        &self,
        id_hash: &str,
        limits: SessionLimits,
        now_ms: i64,
    ) -> Result<Option<String>, StoreError> {
        let identity: Option<String> = pooled!(self, pool => sqlx::query_scalar(TOUCH_SESSION)
            .bind(id_hash)
            .bind(now_ms)
            .bind(now_ms.saturating_sub(limits.idle_ms))
            .bind(now_ms.saturating_sub(limits.lifetime_ms))
            .fetch_optional(pool)
            .await?);
        if identity.is_none() {
            self.console_close_session(id_hash).await?;
        }
        Ok(identity)
    }

    /// End the session under `id_hash`, with its views.
    pub async fn console_close_session(&self, id_hash: &str) -> Result<(), StoreError> {
        pooled!(self, pool => sqlx::query(CLOSE_SESSION).bind(id_hash).execute(pool).await.map(|_| ())?);
        Ok(())
    }

    /// Note that session `session_hash` recorded view `view_hash` (after
    /// its record was committed): false when it had been already (or the
    /// session is gone). Past
    /// [`VIEWS_PER_SESSION`], the session's oldest are forgotten.
    pub async fn console_first_view(&self, session_hash: &str, view_hash: &str) -> Result<bool, StoreError> {
        let ordinal: Option<i64> = pooled!(self, pool => sqlx::query_scalar(ADD_VIEW)
            .bind(session_hash)
            .bind(view_hash)
            .fetch_optional(pool)
            .await?);
        let Some(ordinal) = ordinal else {
            return Ok(false);
        };
        if ordinal > VIEWS_PER_SESSION {
            pooled!(self, pool => sqlx::query(TRIM_VIEWS)
                .bind(session_hash)
                .bind(ordinal - VIEWS_PER_SESSION)
                .execute(pool)
                .await
                .map(|_| ())?);
        }
        Ok(true)
    }

    /// Whether session `session_hash` noted view `view_hash`.
    pub async fn console_seen_view(&self, session_hash: &str, view_hash: &str) -> Result<bool, StoreError> {
        let seen: i64 = pooled!(self, pool => sqlx::query_scalar(SEEN_VIEW)
            .bind(session_hash)
            .bind(view_hash)
            .fetch_one(pool)
            .await?);
        Ok(seen > 0)
    }
}

#[cfg(test)]
#[path = "console_tests.rs"]
mod tests;
