//! A fresh Postgres database per test, made through the admin connection
//! and dropped afterwards, with the stale ones of killed runs.

use sqlx::Connection;
use time::OffsetDateTime;

pub fn admin_database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

async fn admin_connection() -> sqlx::PgConnection {
    let url = admin_database_url();
    sqlx::PgConnection::connect(&url).await.unwrap_or_else(|e| {
        panic!("Postgres is needed for these tests and is not reachable at {url} ({e}); start it or set DATABASE_URL")
    })
}

/// A database of its own for one test.
#[derive(Debug)]
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    pub async fn create() -> Self {
        let mut admin = admin_connection().await;
        drop_stale_databases(&mut admin).await;
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let name = format!(
            "talos_sso_t_{now}_{}",
            talos_sso_server::random::random_hex(4).expect("random name")
        );
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("create database");
        let mut url = url::Url::parse(&admin_database_url()).expect("DATABASE_URL");
        url.set_path(&format!("/{name}"));
        Self {
            name,
            url: url.to_string(),
        }
    }

    /// This database's URL as `role` connects to it (trust authentication).
    pub fn url_as(&self, role: &str) -> String {
        let mut url = url::Url::parse(&self.url).expect("database URL");
        url.set_username(role).expect("a URL with a host");
        url.set_password(None).expect("a URL with a host");
        url.to_string()
    }

    /// Run SQL as the administrator (superuser) against this database.
    pub async fn superuser(&self, sql: &str) -> Result<u64, sqlx::Error> {
        let mut conn = sqlx::PgConnection::connect(&self.url).await?;
        let result = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut conn)
            .await?;
        Ok(result.rows_affected())
    }

    /// Refuse new connections and cut the existing ones: the database is "down".
    pub async fn cut(&self) {
        let mut admin = admin_connection().await;
        let sql = format!(
            "ALTER DATABASE {0} ALLOW_CONNECTIONS false; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{0}' AND pid <> pg_backend_pid();",
            self.name
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .expect("cut database");
    }

    pub async fn restore(&self) {
        let mut admin = admin_connection().await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS true",
            self.name
        )))
        .execute(&mut admin)
        .await
        .expect("restore database");
    }

    pub async fn drop_now(&self) {
        let mut admin = admin_connection().await;
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut admin)
        .await;
    }
}

/// Drop a role a test created, once the databases it has objects in are gone.
pub async fn drop_role(name: &str) {
    let mut admin = admin_connection().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {name}")))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("drop role {name}: {e}"));
}

/// Databases of test runs that died before cleaning up (older than an hour),
/// then the roles named after them (`<database>_<purpose>`).
async fn drop_stale_databases(admin: &mut sqlx::PgConnection) {
    let cutoff = OffsetDateTime::now_utc().unix_timestamp() - 3600;
    for (catalog, drop) in [
        (
            "SELECT datname::text FROM pg_database WHERE datname LIKE 'talos\\_sso\\_t\\_%'",
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)",
        ),
        (
            "SELECT rolname::text FROM pg_roles WHERE rolname LIKE 'talos\\_sso\\_t\\_%'",
            "DROP ROLE IF EXISTS {name}",
        ),
    ] {
        let names: Vec<String> = sqlx::query_scalar(catalog)
            .fetch_all(&mut *admin)
            .await
            .unwrap_or_default();
        for name in names {
            let created = name
                .split('_')
                .nth(3)
                .and_then(|t| t.parse::<i64>().ok())
                .unwrap_or(0);
            if created < cutoff {
                let _ = sqlx::query(sqlx::AssertSqlSafe(drop.replace("{name}", &name)))
                    .execute(&mut *admin)
                    .await;
            }
        }
    }
}
