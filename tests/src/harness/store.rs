//! An audit store on its own, without a server: which backend, and a
//! store migrated to a given version.

use std::path::Path;

use talos_sso_server::audit::store::{AuditStore, StoreOptions};

use super::database::TestDatabase;

/// Which audit store a test server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// A migrated audit store of its own, with no server in front: a fresh
/// Postgres database, or a SQLite file in a temporary folder (both kept as
/// long as this is).
#[derive(Debug)]
pub struct BareStore {
    pub store: AuditStore,
    /// What the store was opened with, for a server or CLI to open it too.
    pub url: String,
    pub database: Option<TestDatabase>,
    pub dir: Option<tempfile::TempDir>,
}

impl BareStore {
    pub async fn open(backend: Backend) -> Self {
        let bare = Self::open_unmigrated(backend).await;
        bare.store.migrate().await.expect("migrations");
        bare
    }

    /// As [`BareStore::open`], with no migration applied.
    pub async fn open_unmigrated(backend: Backend) -> Self {
        let (url, database, dir) = match backend {
            Backend::Postgres => {
                let database = TestDatabase::create().await;
                (database.url.clone(), Some(database), None)
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}/audit.db", dir.path().display());
                (url, None, Some(dir))
            }
        };
        let store = AuditStore::connect(&url, &StoreOptions::default())
            .await
            .expect("audit store");
        Self {
            store,
            url,
            database,
            dir,
        }
    }

    /// Close the store and drop its database.
    pub async fn close(self) {
        self.store.close().await;
        if let Some(database) = self.database {
            database.drop_now().await;
        }
    }
}

/// Apply the store's migrations from their folder up to version `last`
/// only, as a database written by an earlier schema stands.
pub async fn migrate_up_to(store: &AuditStore, last: i64) -> Result<(), sqlx::migrate::MigrateError> {
    let folder = match store {
        AuditStore::Postgres(_) => "postgres",
        AuditStore::Sqlite(_) => "sqlite",
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations")
        .join(folder);
    let all = sqlx::migrate::Migrator::new(dir).await?;
    let migrator =
        sqlx::migrate::Migrator::with_migrations(all.iter().filter(|m| m.version <= last).cloned().collect());
    match store {
        AuditStore::Postgres(pool) => migrator.run(pool).await,
        AuditStore::Sqlite(store) => migrator.run(store.pool()).await,
    }
}
