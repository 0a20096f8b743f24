//! The owner / runtime role split on real Postgres: a fresh database, an
//! owner role that migrates and grants (`migrate --runtime-role`), a
//! runtime role the server connects as with `migrate_on_start: false`.
//! The runtime role serves every request and is refused every change to
//! the trail's schema and rows; the refusals are the database's own
//! (SQLSTATE 42501). The roles have random names and are dropped at the end.

use clap::Parser;
use serde_json::json;
use sqlx::Connection;
use talos_sso::key::ClientKey;
use talos_sso_server::cli::{Cli, run};
use talos_sso_server::config::Config;
use talos_sso_server::server::Server;
use talos_sso_tests::emulator::{EmulatorConfig, EmulatorHandle, TokenKind};
use talos_sso_tests::harness::{Answer, TestDatabase, TestServer, Workdir, config_yaml, drop_role};

/// A database owned by a fresh owner role, a fresh runtime role, and the
/// emulator and files a server needs.
struct Split {
    database: TestDatabase,
    owner: String,
    runtime: String,
    emulator: EmulatorHandle,
    work: Workdir,
}

impl Split {
    /// The database and the roles' names; the roles do not exist yet.
    async fn names() -> Self {
        let database = TestDatabase::create().await;
        Self {
            owner: format!("{}_owner", database.name),
            runtime: format!("{}_app", database.name),
            database,
            emulator: EmulatorHandle::start(EmulatorConfig::default()).await.unwrap(),
            work: Workdir::new(),
        }
    }

    async fn create() -> Self {
        let split = Self::names().await;
        // As the compose role script does: the owner owns the database (so
        // it may create in its public schema), the runtime role only logs in.
        split
            .database
            .superuser(&format!(
                "CREATE ROLE {0} LOGIN; CREATE ROLE {1} LOGIN; ALTER DATABASE {2} OWNER TO {0};",
                split.owner, split.runtime, split.database.name
            ))
            .await
            .unwrap();
        split
    }

    /// A server configuration connecting as `role`; `migrate_on_start` as given.
    fn config_text(&self, role: &str, migrate_on_start: bool) -> String {
        let url = self.database.url_as(role);
        config_yaml(&self.emulator, &self.work, &url).replace(
            "acquire_timeout: 2s }",
            &format!("acquire_timeout: 2s, migrate_on_start: {migrate_on_start} }}"),
        )
    }

    /// The configuration for `role` as a file, for the command line.
    fn config_file(&self, role: &str, migrate_on_start: bool) -> String {
        let path = self.work.path().join(format!("{role}.yaml"));
        std::fs::write(&path, self.config_text(role, migrate_on_start)).unwrap();
        path.to_str().unwrap().to_owned()
    }

    async fn migrate(&self, runtime_role: &str) -> Result<String, String> {
        let owner = self.config_file(&self.owner, true);
        cli(&["migrate", "--config", &owner, "--runtime-role", runtime_role]).await
    }

    /// A connection as `role`.
    async fn connect(&self, role: &str) -> sqlx::PgConnection {
        sqlx::PgConnection::connect(&self.database.url_as(role))
            .await
            .unwrap()
    }

    async fn drop(self, extra_roles: &[&str]) {
        self.database.drop_now().await;
        let mut roles = vec![self.owner.as_str(), self.runtime.as_str()];
        roles.extend_from_slice(extra_roles);
        for role in roles {
            drop_role(role).await;
        }
    }
}

async fn cli(args: &[&str]) -> Result<String, String> {
    let cli = Cli::try_parse_from(std::iter::once("talos-sso-server").chain(args.iter().copied())).unwrap();
    let mut out = Vec::new();
    let result = run(cli, &mut out).await;
    let text = String::from_utf8(out).unwrap();
    result.map(|_| text.clone()).map_err(|e| format!("{text}{e:#}"))
}

/// The versions of the embedded Postgres migrations, from their files.
fn migration_versions() -> Vec<i64> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations/postgres");
    let mut versions: Vec<i64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.split_once('_')?.0.parse().ok()
        })
        .collect();
    versions.sort();
    assert!(versions.len() >= 3, "{versions:?}");
    versions
}

/// Run `sql` and return the SQLSTATE of its refusal (it must be refused).
async fn refusal(connection: &mut sqlx::PgConnection, sql: &str) -> (String, String) {
    match sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut *connection)
        .await
    {
        Ok(_) => panic!("the runtime role was allowed: {sql}"),
        Err(sqlx::Error::Database(error)) => (
            error.code().unwrap_or_default().into_owned(),
            error.message().to_owned(),
        ),
        Err(other) => panic!("{sql}: {other}"),
    }
}

#[tokio::test]
async fn the_runtime_role_serves_and_may_not_change_the_trail() {
    let split = Split::create().await;
    let granted = split.migrate(&split.runtime).await.unwrap();
    assert!(
        granted.contains("audit database (postgres) is up to date"),
        "{granted}"
    );
    for line in [
        format!("runtime role {} may:", split.runtime),
        "  SELECT, INSERT on audit_events".into(),
        "  SELECT, INSERT on used_tokens".into(),
        "  SELECT, INSERT, DELETE on deny_list".into(),
        "  SELECT on _sqlx_migrations".into(),
    ] {
        assert!(granted.lines().any(|l| l == line), "{line:?} in {granted}");
    }
    let views = granted
        .lines()
        .find(|l| l.starts_with("  SELECT on ") && l.contains("issued_certificates"));
    assert!(views.is_some_and(|l| l.contains("denied_requests")), "{granted}");
    // Idempotent: the same grants again (as after an upgrade).
    assert_eq!(split.migrate(&split.runtime).await.unwrap(), granted);

    // `check` as the runtime role: the schema is current, no owner warning;
    // as the owner, the warning.
    let runtime_config = split.config_file(&split.runtime, false);
    let checked = cli(&["check", "--config", &runtime_config]).await.unwrap();
    assert!(checked.contains("audit database: schema current"), "{checked}");
    assert!(!checked.contains("may change the schema"), "{checked}");
    let owner_config = split.config_file(&split.owner, true);
    let checked = cli(&["check", "--config", &owner_config]).await.unwrap();
    assert!(
        checked.contains(&format!(
            "warning: audit database: the server connects to Postgres as `{}`, which may change the schema",
            split.owner
        )),
        "{checked}"
    );

    // The server as the runtime role: issue, deny and allow again, read and verify.
    let config = Config::from_yaml(&split.config_text(&split.runtime, false)).unwrap();
    let server = TestServer::start(config).await;
    let http = reqwest::Client::new();
    let base = &server.base_url;
    let token = |user: &str| split.emulator.token_for(user, TokenKind::id()).unwrap();
    let issue = |user: &str| {
        let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
        http.post(format!("{base}/v1/certificates"))
            .bearer_auth(token(user))
            .json(&json!({"cluster": "prod", "csr": csr}))
            .send()
    };
    let issued = Answer::read(issue("bob@example.com").await.unwrap()).await;
    assert_eq!(issued.status, 201, "{}", issued.body);
    let added = Answer::read(
        http.post(format!("{base}/v1/deny"))
            .bearer_auth(token("alice@example.com"))
            .json(&json!({"username": "bob@example.com", "reason": "laptop stolen"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(added.status, 201, "{}", added.body);
    let blocked = Answer::read(issue("bob@example.com").await.unwrap()).await;
    assert_eq!((blocked.status, blocked.code()), (403, Some("identity_denied")));
    let removed = Answer::read(
        http.delete(format!("{base}/v1/deny?username=bob@example.com"))
            .bearer_auth(token("alice@example.com"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((removed.status, removed.body["removed"].clone()), (200, json!(1)));
    let again = Answer::read(issue("bob@example.com").await.unwrap()).await;
    assert_eq!(again.status, 201, "{}", again.body);
    let read = |path: &str| {
        http.get(format!("{base}{path}"))
            .bearer_auth(token("sam@example.com"))
            .send()
    };
    let trail = Answer::read(read("/v1/audit").await.unwrap()).await;
    let events: Vec<&str> = trail.body["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        [
            "certificate.issued",
            "deny.added",
            "certificate.denied",
            "deny.removed",
            "certificate.issued"
        ],
        "{}",
        trail.body
    );
    let verified = Answer::read(read("/v1/audit/verify").await.unwrap()).await;
    // Each read is itself recorded (audit.query), the listing's and this one's.
    assert_eq!(
        (verified.body["intact"].clone(), verified.body["verified"].clone()),
        (json!(true), json!(7)),
        "{}",
        verified.body
    );

    // The runtime role reads the views...
    let mut runtime = split.connect(&split.runtime).await;
    let issued_count: i64 = sqlx::query_scalar("SELECT count(*) FROM issued_certificates")
        .fetch_one(&mut runtime)
        .await
        .unwrap();
    assert_eq!(issued_count, 2);
    // ...and may change neither the schema nor a row of the trail.
    let mut refused = Vec::new();
    for sql in [
        "ALTER TABLE audit_events DISABLE TRIGGER ALL",
        "ALTER TABLE audit_events DISABLE TRIGGER audit_events_append_only",
        "DROP TRIGGER audit_events_append_only ON audit_events",
        "DROP TABLE audit_events",
        "UPDATE audit_events SET roles_granted = ARRAY['os:admin'] WHERE seq = 1",
        "DELETE FROM audit_events WHERE seq = 5",
        "TRUNCATE audit_events",
        "UPDATE used_tokens SET token_id = 'reused'",
        "DELETE FROM used_tokens",
        "UPDATE deny_list SET reason = 'edited'",
        "CREATE TABLE planted (x int)",
        "CREATE FUNCTION planted() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "INSERT INTO issued_certificates (seq) VALUES (99)",
        "CREATE TRIGGER planted BEFORE INSERT ON audit_events FOR EACH ROW EXECUTE FUNCTION audit_events_refuse_change()",
    ] {
        let (code, message) = refusal(&mut runtime, sql).await;
        eprintln!("refused [{code}] {message}: {sql}");
        assert_eq!(code, "42501", "{sql}: {message}");
        refused.push(sql);
    }
    assert_eq!(refused.len(), 14);
    // It may insert, but not a row outside the hash chain (seq 0 or below),
    // which `audit verify` would not read: the constraint of migration 7.
    for seq in [0, -1] {
        let planted = format!(
            "INSERT INTO audit_events (seq, occurred_at, request_id, event, outcome, issuer, subject, username, \
             identity_verified, groups_evaluated, roles_requested, roles_granted, details, prev_hash, hash) \
             VALUES ({seq}, now(), 'planted', 'certificate.issued', 'success', 'https://login.example', \
             'made-up', 'carol@example.com', true, '{{}}', '{{}}', '{{}}', '{{}}', 'x', 'y')"
        );
        let (code, message) = refusal(&mut runtime, &planted).await;
        assert_eq!(code, "23514", "seq {seq}: {message}");
        assert!(message.contains("audit_events_seq_in_chain"), "{message}");
    }
    // Nothing changed: the trail still verifies, with the same records.
    let after = Answer::read(read("/v1/audit/verify").await.unwrap()).await;
    assert_eq!(after.body["intact"], true, "{}", after.body);
    assert_eq!(after.body["verified"], 8, "{}", after.body);

    drop(runtime);
    let store = server.app.audit.store().clone();
    server.stop().await;
    store.close().await;
    split.drop(&[]).await;
}

#[tokio::test]
async fn a_server_that_may_not_migrate_says_what_to_run() {
    let split = Split::create().await;
    let command = format!(
        "run `talos-sso-server migrate --config <the owner's configuration> --runtime-role {}` as the schema owner",
        split.runtime
    );
    // Not migrated, and told not to: the missing versions and the command.
    let config = Config::from_yaml(&split.config_text(&split.runtime, false)).unwrap();
    let error = Server::bind(config, std::sync::Arc::new(talos_sso_server::app::SystemClock))
        .await
        .unwrap_err()
        .to_string();
    let versions = migration_versions();
    assert!(
        error.starts_with("audit database: the schema is not current: migrations 1 (audit), 2 (deny list),"),
        "{error}"
    );
    for version in &versions {
        assert!(error.contains(&format!(" {version} (")), "{version}: {error}");
    }
    assert!(
        error.contains("are not applied, and `database.migrate_on_start` is false"),
        "{error}"
    );
    assert!(error.contains(&command), "{error}");
    // Told to migrate, as a role that may not: run migrate as the owner instead.
    let config = Config::from_yaml(&split.config_text(&split.runtime, true)).unwrap();
    let error = Server::bind(config, std::sync::Arc::new(talos_sso_server::app::SystemClock))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        format!(
            "audit database: role `{}` may not create objects in schema public, so it may not migrate the schema: {command}, and set `database.migrate_on_start: false` for this server",
            split.runtime
        )
    );
    // The same once the owner has migrated: the runtime role owns nothing.
    split.migrate(&split.runtime).await.unwrap();
    let config = Config::from_yaml(&split.config_text(&split.runtime, true)).unwrap();
    let error = Server::bind(config, std::sync::Arc::new(talos_sso_server::app::SystemClock))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("does not own the table audit_events, so it may not migrate the schema"),
        "{error}"
    );
    // A schema that lost its newest migration is named by that version alone.
    let newest = *versions.last().unwrap();
    split
        .database
        .superuser(&format!("DELETE FROM _sqlx_migrations WHERE version = {newest}"))
        .await
        .unwrap();
    let runtime_config = split.config_file(&split.runtime, false);
    let error = cli(&["check", "--config", &runtime_config]).await.unwrap_err();
    assert!(
        error.contains(&format!("the schema is not current: migration {newest} (")),
        "{error}"
    );
    assert!(error.contains("is not applied"), "{error}");

    // SQLite: no roles; the same refusal names the plain command.
    let sqlite = format!("sqlite://{}", split.work.path().join("fresh.db").display());
    let text = config_yaml(&split.emulator, &split.work, &sqlite).replace(
        "acquire_timeout: 2s }",
        "acquire_timeout: 2s, migrate_on_start: false }",
    );
    let error = Server::bind(
        Config::from_yaml(&text).unwrap(),
        std::sync::Arc::new(talos_sso_server::app::SystemClock),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("run `talos-sso-server migrate --config <this configuration>` as the schema owner"),
        "{error}"
    );
    // Once migrated, the same configuration starts.
    let sqlite_config = split.work.path().join("sqlite.yaml");
    std::fs::write(&sqlite_config, &text).unwrap();
    cli(&["migrate", "--config", sqlite_config.to_str().unwrap()])
        .await
        .unwrap();
    let server = TestServer::start(Config::from_yaml(&text).unwrap()).await;
    let store = server.app.audit.store().clone();
    assert_eq!(store.unapplied_migrations().await.unwrap(), []);
    server.stop().await;
    store.close().await;
    split.drop(&[]).await;
}

#[tokio::test]
async fn the_runtime_role_flag_refuses_a_role_that_is_missing_or_more_than_a_runtime_role() {
    let split = Split::create().await;
    let audit_exists = || async {
        let mut owner = split.connect(&split.owner).await;
        sqlx::query_scalar::<_, bool>("SELECT to_regclass('audit_events') IS NOT NULL")
            .fetch_one(&mut owner)
            .await
            .unwrap()
    };
    let unknown = format!("{}_nobody", split.database.name);
    let error = split.migrate(&unknown).await.unwrap_err();
    assert_eq!(
        error,
        format!(
            "role `{unknown}` does not exist: create it first (`CREATE ROLE {unknown} LOGIN PASSWORD '...'`, as a role allowed to create roles), then run `talos-sso-server migrate --runtime-role {unknown}` again; nothing was changed"
        )
    );
    assert!(!audit_exists().await, "a refused role changes nothing");
    let error = split.migrate(&split.owner).await.unwrap_err();
    assert!(
        error.contains("is the role this command connects as: connect as the schema owner"),
        "{error}"
    );
    let error = split.migrate("postgres").await.unwrap_err();
    assert!(error.contains("role `postgres` is a superuser"), "{error}");
    let member = format!("{}_member", split.database.name);
    split
        .database
        .superuser(&format!("CREATE ROLE {member} LOGIN IN ROLE {}", split.owner))
        .await
        .unwrap();
    let error = split.migrate(&member).await.unwrap_err();
    assert!(
        error.contains("is a member of the role this command connects as"),
        "{error}"
    );
    assert!(!audit_exists().await, "a refused role changes nothing");

    // Granted more than it needs, by PUBLIC: named, and the grants stay as they were.
    split.migrate(&split.runtime).await.unwrap();
    let mut owner = split.connect(&split.owner).await;
    sqlx::raw_sql("GRANT UPDATE ON used_tokens TO PUBLIC; GRANT TRUNCATE ON audit_events TO PUBLIC")
        .execute(&mut owner)
        .await
        .unwrap();
    let error = split.migrate(&split.runtime).await.unwrap_err();
    assert!(
        error.contains(&format!(
            "role `{}` could also TRUNCATE audit_events; UPDATE used_tokens, which the server must not",
            split.runtime
        )),
        "{error}"
    );
    let still: bool = sqlx::query_scalar("SELECT has_table_privilege($1, 'deny_list', 'DELETE')")
        .bind(&split.runtime)
        .fetch_one(&mut owner)
        .await
        .unwrap();
    assert!(still);
    sqlx::raw_sql("REVOKE UPDATE ON used_tokens FROM PUBLIC; REVOKE TRUNCATE ON audit_events FROM PUBLIC")
        .execute(&mut owner)
        .await
        .unwrap();
    // Through a role it may `SET ROLE` to, even without inheriting from it.
    let editor = format!("{}_editor", split.database.name);
    split
        .database
        .superuser(&format!(
            "CREATE ROLE {editor} NOLOGIN; ALTER ROLE {runtime} NOINHERIT; GRANT {editor} TO {runtime}; \
             GRANT DELETE ON audit_events TO {editor};",
            runtime = split.runtime
        ))
        .await
        .unwrap();
    let error = split.migrate(&split.runtime).await.unwrap_err();
    assert!(error.contains("could also DELETE audit_events"), "{error}");
    split
        .database
        .superuser(&format!(
            "REVOKE {editor} FROM {}; DROP OWNED BY {editor}; DROP ROLE {editor}",
            split.runtime
        ))
        .await
        .unwrap();

    // A view the grant has never heard of (a later migration's) is readable
    // once migrate runs again; what the role was given before and no longer
    // needs is taken back.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE VIEW audit_recent AS SELECT seq, occurred_at FROM audit_events; \
         GRANT UPDATE ON deny_list TO {}",
        split.runtime
    )))
    .execute(&mut owner)
    .await
    .unwrap();
    let granted = split.migrate(&split.runtime).await.unwrap();
    assert!(
        granted
            .lines()
            .any(|l| l.starts_with("  SELECT on ") && l.contains("audit_recent")),
        "{granted}"
    );
    let mut runtime = split.connect(&split.runtime).await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_recent")
        .fetch_one(&mut runtime)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    let (code, _) = refusal(&mut runtime, "UPDATE deny_list SET reason = 'edited'").await;
    assert_eq!(code, "42501");

    // SQLite has no roles.
    let sqlite = format!("sqlite://{}", split.work.path().join("audit.db").display());
    let path = split.work.path().join("sqlite.yaml");
    std::fs::write(&path, config_yaml(&split.emulator, &split.work, &sqlite)).unwrap();
    let error = cli(&[
        "migrate",
        "--config",
        path.to_str().unwrap(),
        "--runtime-role",
        "app",
    ])
    .await
    .unwrap_err();
    assert!(
        error.starts_with("SQLite has no roles: the database file's permissions are the boundary"),
        "{error}"
    );
    drop((owner, runtime));
    split.drop(&[&member]).await;
}

#[tokio::test]
async fn the_compose_role_script_makes_the_roles_migrate_expects() {
    let split = Split::names().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/compose/postgres-roles.sh");
    let owner_password =
        talos_sso_tests::material::write_file(split.work.path(), "owner-pw", "owner's\n", 0o600);
    let runtime_password =
        talos_sso_tests::material::write_file(split.work.path(), "app-pw", "app pw\n", 0o600);
    let admin = url::Url::parse(&split.database.url).unwrap();
    let run_script = || {
        std::process::Command::new("sh")
            .arg(script)
            .env("PGHOST", admin.host_str().unwrap())
            .env("PGPORT", admin.port().unwrap_or(5432).to_string())
            .env("PGUSER", admin.username())
            .env("PGPASSWORD", admin.password().unwrap_or_default())
            .env("PGDATABASE", &split.database.name)
            .env("TALOS_SSO_OWNER_ROLE", &split.owner)
            .env("TALOS_SSO_RUNTIME_ROLE", &split.runtime)
            .env("TALOS_SSO_OWNER_PASSWORD_FILE", &owner_password)
            .env("TALOS_SSO_RUNTIME_PASSWORD_FILE", &runtime_password)
            .output()
            .expect("sh and psql")
    };
    // Twice: the second run finds the roles and sets their passwords again.
    for _ in 0..2 {
        let output = run_script();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let mut admin_connection = sqlx::PgConnection::connect(&split.database.url).await.unwrap();
    let roles: Vec<(String, bool, bool, bool, bool)> = sqlx::query_as(
        "SELECT rolname::text, rolsuper, rolcreaterole, rolinherit, rolpassword LIKE 'SCRAM-SHA-256$%' \
         FROM pg_authid WHERE rolname = ANY($1) ORDER BY rolname",
    )
    .bind([&split.runtime, &split.owner])
    .fetch_all(&mut admin_connection)
    .await
    .unwrap();
    assert_eq!(
        roles,
        [
            (split.runtime.clone(), false, false, false, true),
            (split.owner.clone(), false, false, true, true)
        ]
    );
    let database_owner: String = sqlx::query_scalar(
        "SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = current_database()",
    )
    .fetch_one(&mut admin_connection)
    .await
    .unwrap();
    assert_eq!(database_owner, split.owner);
    drop(admin_connection);
    // What the script made is what `migrate --runtime-role` needs.
    let granted = split.migrate(&split.runtime).await.unwrap();
    assert!(
        granted.contains(&format!("runtime role {} may:", split.runtime)),
        "{granted}"
    );

    // A missing password file stops it before it connects.
    std::fs::remove_file(&runtime_password).unwrap();
    let output = run_script();
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("is missing or empty"), "{error}");
    split.drop(&[]).await;
}
