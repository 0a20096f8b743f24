//! Whether the database's schema is the one this binary was built with:
//! every migration embedded in it (`migrations/postgres`, `migrations/sqlite`)
//! applied, successfully and unchanged, as sqlx's `_sqlx_migrations` table
//! records it. A server that does not migrate at start asks this first, so
//! that an old schema stops it with the versions named instead of failing
//! at its first insert. It only reads: the runtime role needs `SELECT` on
//! that table and nothing more.
//!
//! Migrations the database holds and this binary does not know are not a
//! fault here: during a rolling upgrade the older replicas start against the
//! newer schema, and migrations only add.

use sqlx::migrate::Migrator;

use super::{AuditStore, StoreError, postgres, sqlite};

/// An embedded migration the database has not applied as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unapplied {
    pub version: i64,
    pub description: String,
    pub state: MigrationState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationState {
    /// Not in `_sqlx_migrations` (or the table itself is missing).
    Missing,
    /// Recorded as started and not finished.
    Failed,
    /// Applied from a file whose content has changed since.
    Changed,
}

impl std::fmt::Display for Unapplied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            MigrationState::Missing => "",
            MigrationState::Failed => ", failed",
            MigrationState::Changed => ", changed since it was applied",
        };
        write!(f, "{} ({}{state})", self.version, self.description)
    }
}

/// One row of `_sqlx_migrations`: version, checksum, success.
type AppliedRow = (i64, Vec<u8>, bool);

/// The embedded migrations `applied` does not hold as they are, in order.
fn unapplied(migrator: &Migrator, applied: &[AppliedRow]) -> Vec<Unapplied> {
    migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .filter_map(|migration| {
            let state = match applied.iter().find(|(version, ..)| *version == migration.version) {
                None => MigrationState::Missing,
                Some((_, _, false)) => MigrationState::Failed,
                Some((_, checksum, true)) if checksum[..] != migration.checksum[..] => {
                    MigrationState::Changed
                }
                Some(_) => return None,
            };
            Some(Unapplied {
                version: migration.version,
                description: migration.description.to_string(),
                state,
            })
        })
        .collect()
}

impl AuditStore {
    /// Whether the database holds the table `table` (in the schema the
    /// connection uses). Reads only.
    pub(super) async fn has_table(&self, table: &str) -> Result<bool, StoreError> {
        Ok(match self {
            AuditStore::Postgres(pool) => {
                sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                    .bind(table)
                    .fetch_one(pool)
                    .await?
            }
            AuditStore::Sqlite(sqlite) => {
                sqlx::query_scalar(
                    "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = $1",
                )
                .bind(table)
                .fetch_one(sqlite.pool())
                .await?
            }
        })
    }

    /// The embedded migrations this database lacks (empty: the schema is
    /// current). Reads only.
    pub async fn unapplied_migrations(&self) -> Result<Vec<Unapplied>, StoreError> {
        let migrator = match self {
            AuditStore::Postgres(_) => &postgres::MIGRATOR,
            AuditStore::Sqlite(_) => &sqlite::MIGRATOR,
        };
        let table = migrator.table_name.as_ref();
        let applied: Vec<AppliedRow> = if self.has_table(table).await? {
            // sqlx's own name for its table, not outside text.
            let sql = format!("SELECT version, checksum, success FROM {table}");
            match self {
                AuditStore::Postgres(pool) => {
                    sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(pool).await?
                }
                AuditStore::Sqlite(sqlite) => {
                    sqlx::query_as(sqlx::AssertSqlSafe(sql))
                        .fetch_all(sqlite.pool())
                        .await?
                }
            }
        } else {
            Vec::new()
        };
        Ok(unapplied(migrator, &applied))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied_as_embedded(migrator: &Migrator) -> Vec<AppliedRow> {
        migrator
            .iter()
            .map(|m| (m.version, m.checksum.to_vec(), true))
            .collect()
    }

    #[test]
    fn every_embedded_migration_applied_unchanged_is_current() {
        for migrator in [&postgres::MIGRATOR, &sqlite::MIGRATOR] {
            assert!(migrator.iter().count() >= 3);
            assert_eq!(unapplied(migrator, &applied_as_embedded(migrator)), []);
            // A newer database (a migration this binary does not know) is current too.
            let mut newer = applied_as_embedded(migrator);
            newer.push((99_999_999, vec![1, 2, 3], true));
            assert_eq!(unapplied(migrator, &newer), []);
        }
    }

    #[test]
    fn missing_failed_and_changed_migrations_are_named_in_order() {
        let migrator = &postgres::MIGRATOR;
        let versions: Vec<i64> = migrator.iter().map(|m| m.version).collect();
        assert_eq!(
            unapplied(migrator, &[])
                .iter()
                .map(|u| (u.version, u.state))
                .collect::<Vec<_>>(),
            versions
                .iter()
                .map(|v| (*v, MigrationState::Missing))
                .collect::<Vec<_>>()
        );
        let mut applied = applied_as_embedded(migrator);
        applied[0].1[0] ^= 1;
        applied[1].2 = false;
        applied.pop();
        let found = unapplied(migrator, &applied);
        let states: Vec<_> = found.iter().map(|u| (u.version, u.state)).collect();
        let last = *versions.last().unwrap();
        assert_eq!(
            states,
            [
                (versions[0], MigrationState::Changed),
                (versions[1], MigrationState::Failed),
                (last, MigrationState::Missing)
            ]
        );
        assert_eq!(found[0].to_string(), "1 (audit, changed since it was applied)");
        assert_eq!(found[1].to_string(), "2 (deny list, failed)");
    }
}
