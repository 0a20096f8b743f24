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
//! What both backends share is written once: `types` (what callers ask
//! and get), `query` (the statements' text, the record query builder, how
//! rows decode), `batch` (a batch's steps inside its transaction),
//! `chain` (the order of the checks, their outcomes, the hashing, a
//! batch's deadline and commit) and `dispatch` (the one type callers hold,
//! verification, which errors blame the data). Imports among them point
//! one way: `dispatch` over the backends over `chain` over `batch` over
//! `query` over `types`.
//! `postgres` and `sqlite` hold each backend's connection, transaction and
//! lock, its own statements, how its rows decode and which of its errors
//! blame the data. `BatchTx` is the seam between the two: a backend is
//! handed each step of a batch whole.
//!
//! The dispatch is an enum, `AuditStore { Postgres, Sqlite }`, matched in
//! each method, rather than a trait object or a generic over sqlx's
//! `Database`: the backends differ in more than their SQL (SQLite's single
//! append connection, Postgres's lock taken ahead, how each decodes
//! times and lists), so a trait would be as long as the matches, and sqlx's
//! generic bounds would spread to every caller. Statements that are the
//! same on both are data ([`query::Statement`], values as [`query::Bind`])
//! that each backend binds its own way, which is how a deny-list change is
//! written once for both.
//!
//! `schema` says whether the embedded migrations are all applied; `roles`,
//! who may change the schema and what the server's runtime role is granted;
//! `console`, the web console's sessions and logins in progress, kept in
//! the same database so that every replica shares them.

mod batch;
mod chain;
pub mod console;
mod dispatch;
mod postgres;
mod query;
pub mod roles;
pub mod schema;
pub mod sqlite;
mod types;
#[cfg(test)]
mod workload_plans;

pub use dispatch::AuditStore;
pub use postgres::LockAhead;
pub use types::{
    Append, Appended, AuditFilter, ChartCounts, ChartWindow, DenyChange, DenyEntry, IssuerScope, KindFilter,
    MethodFilter, OUTSIDE_CHAIN_NAMED, OutsideChain, StoreError, StoreOptions, TokenClaim, WRITE_TIMEOUT,
};

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use sqlx::SqlSafeStr;
    use sqlx::migrate::{Migration, MigrationType, Migrator};

    use time::OffsetDateTime;

    use super::batch::*;
    use super::chain::*;
    use super::query::*;
    use super::*;
    use crate::audit::{AuditRecord, ChainCheck, StoredRecord, event, outcome};

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
    const RELEASED: [(&str, i64, &str); 20] = [
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
        (
            "postgres",
            8,
            "3aac293072df41c691d91884998b9c00d69712c3388527545d82625a87ba989f73532489a918d6f740836aff2aa635c4",
        ),
        (
            "sqlite",
            8,
            "18b08ab1f3f6eb579fefcef5fac4210863119ada2d2aa278ccf48a7dfeb572db8e88f7db57e068c9d7a1cb9ba3e6b65d",
        ),
        (
            "postgres",
            9,
            "c293778c1840cd0a12a7406cab2a425851ded4b46fcc4bca97849ae85541e794d25067a9819a8ba345a04cc2faa249dc",
        ),
        (
            "sqlite",
            9,
            "a1ff04c5e574402a355104d5d00701b840647e8adea3a3737d5090f3701b72d39684c4a6ff0ce5bd95f9fba4c4b1ea9a",
        ),
        (
            "postgres",
            10,
            "8416caa7632b8d1357509d67392a9147ca9edcac1d60be0989aacc1186958c02c586daf1f3e8d74d2a69f21d28aa8d0b",
        ),
        (
            "sqlite",
            10,
            "12caee082d301629d42f8b31658481e348fb856e8b968e9ced9ff111a61e18bcbfeb66600a35370589f8589c2c4ffc4d",
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

    /// A deny-list entry stored by an earlier release still blocks the
    /// identity it names: what the server stores is compared in its stored
    /// form, so the set of characters escaped when storing
    /// (`talos_sso_text::is_unsafe_to_keep`) must not grow without a
    /// migration. Characters only a terminal needs escaped (the soft
    /// hyphen here) are kept as they are.
    #[tokio::test]
    async fn an_entry_stored_by_an_earlier_release_still_blocks() {
        let dir = std::env::temp_dir().join(format!(
            "talos-sso-escaping-{}",
            crate::random::random_hex(6).unwrap()
        ));
        let url = format!("sqlite://{}/audit.db", dir.display());
        let store = AuditStore::connect(&url, &StoreOptions::default()).await.unwrap();
        store.migrate().await.unwrap();
        // A workload subject holds whatever its branch name holds.
        let subject = "repo:org/app:ref:refs/heads/fix\u{ad}1";
        let now = OffsetDateTime::now_utc();
        // The entry as the previous release stored it: its cleaning left
        // the soft hyphen as it was.
        let mut added = AuditRecord::new(event::DENY_ADDED, outcome::SUCCESS, "req-deny", now);
        added.username = Some("admin".into());
        let mut entry = Append {
            record: added,
            ..Default::default()
        };
        entry.deny_change = Some(DenyChange::Add(DenyEntry {
            subject: Some(subject.into()),
            username: None,
            reason: "stolen workload token".into(),
            added_by: "admin".into(),
            added_at: now,
            expires_at: None,
        }));
        store.append_batch(&[entry]).await.unwrap();
        let mut record = AuditRecord::new(event::CERTIFICATE_ISSUED, outcome::SUCCESS, "req-issue", now);
        record.subject = Some(subject.into());
        record.username = Some("ci".into());
        record.identity_verified = true;
        let issuance = Append {
            record,
            deny_check: true,
            ..Default::default()
        };
        let appended = store.append_batch(&[issuance]).await.unwrap();
        let is_denied = store.is_denied(subject, "ci").await.unwrap();
        store.close().await;
        std::fs::remove_dir_all(dir).unwrap();
        assert!(is_denied, "the privileged check no longer sees the entry");
        assert!(
            matches!(appended[0], Appended::Denied(_)),
            "the issuance was recorded, not refused: {:?}",
            appended[0].stored().record.outcome
        );
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
        let role = Dialect::placeholders();
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
        let sql = |filter: &AuditFilter, order| Statement::matching(filter, &role, "V", order).sql;
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
            let role = Dialect::placeholders();
            let filter = AuditFilter {
                since: Some(OffsetDateTime::UNIX_EPOCH),
                ..Default::default()
            };
            let statements = [
                subjects.to_owned(),
                Statement::page(0, 1, in_chain).sql,
                Statement::matching(&AuditFilter::default(), &role, in_chain, Order::OldestFirst).sql,
                Statement::matching(&filter, &role, in_chain, Order::OldestFirst).sql,
                Statement::matching(&filter, &role, in_chain, Order::NewestFirst { before_seq: None }).sql,
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

        async fn head_and_denied(&mut self, checked: &Identities) -> Result<HeadAndDenied, StoreError> {
            self.calls.push("head and denied".into());
            let head = self.records.last().map(|r| (r.seq, r.hash.clone()));
            Ok((head, self.listed(&checked.subjects)))
        }

        async fn denied(&mut self, checked: &Identities) -> Result<DeniedPairs, StoreError> {
            self.calls.push("denied".into());
            Ok(self.listed(&checked.subjects))
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

        /// A deny-list change's statements: noted once (its last), an
        /// entry added kept.
        async fn execute(&mut self, statement: Statement) -> Result<u64, StoreError> {
            if statement.sql.starts_with("INSERT INTO deny_list") {
                if let [Bind::Text(subject), Bind::Text(username), ..] = statement.binds.as_slice() {
                    self.deny_list.push((subject.clone(), username.clone()));
                }
            } else if statement.sql.starts_with("DELETE") && statement.sql.contains("expires_at") {
                // The first statement of an addition: expired entries.
                return Ok(0);
            }
            self.calls.push("change".into());
            Ok(1)
        }

        async fn insert_claims(&mut self, _: &[&Claim<'_>]) -> Result<Vec<String>, StoreError> {
            unreachable!("claim_tokens above answers for this backend")
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
                uses: 1,
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
            uses: 1,
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
