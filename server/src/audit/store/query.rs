//! The statements' text, written once for both backends where it can be
//! (each backend's literals where it cannot), and how a row of
//! `audit_events` becomes a record: the record query builder, the chain's
//! head, the deny list, the name-to-subject lookup, the charts' counts.

use serde_json::Value;
use sqlx::query::Query;
use sqlx::{ColumnIndex, Database, Decode, Encode, Row, Type};
use talos_sso_api::audit::MAX_PAGE;
use time::OffsetDateTime;

use super::types::{AuditFilter, ChartWindow, DenyChange, DenyEntry, KindFilter, MethodFilter, StoreError};
use crate::audit::{AuditRecord, StoredRecord};

/// Every column of `audit_events`, in the order both backends write them.
pub(super) const COLUMNS: &str = "seq, occurred_at, request_id, event, outcome, reason_code, cluster, issuer, tenant, subject, \
     username, identity_verified, groups_evaluated, roles_requested, roles_granted, serial, certificate_sha256, \
     public_key_sha256, not_before, not_after, client_ip, user_agent, client_version, token_id, token_issued_at, \
     details, prev_hash, hash";

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
pub(super) use chain_rows;

/// Rows outside the chain, the complement of [`chain_rows!`], written as
/// a bound both databases seek from (a scan otherwise: `NOT (+seq > 0)`
/// is no index's range): the first few and how many, read at start.
pub(super) const OUTSIDE_CHAIN_SQL: &str =
    "SELECT seq, event, username FROM audit_events WHERE seq <= 0 ORDER BY seq LIMIT $1";
pub(super) const OUTSIDE_CHAIN_COUNT_SQL: &str = "SELECT count(*) FROM audit_events WHERE seq <= 0";

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
pub(super) use head_sql;

pub(super) const HEAD_SQL: &str = head_sql!();

/// The statement that reads the deny list in a batch, with the chain head,
/// from a backend's literals: `$null` is its NULL text column, `$matches`
/// its test that an entry names one of the subjects (`$1`) or usernames
/// (`$2`); its rows are those of `HeadOrDenied`.
macro_rules! deny_list_sql {
    (head_and_denied, $null:literal, $matches:expr) => {
        concat!(
            "SELECT seq, hash, ",
            $null,
            ", ",
            $null,
            " FROM (",
            $crate::audit::store::query::head_sql!(),
            ") AS head \
             UNION ALL SELECT NULL, NULL, subject, username FROM deny_list_active WHERE ",
            $matches
        )
    };
}
pub(super) use deny_list_sql;

/// The entries that block now (`deny_list_active` leaves out expired ones).
pub(super) const DENY_LIST_SQL: &str = "SELECT subject, username, reason, added_by, added_at, expires_at \
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

pub(super) const SUBJECTS_OF_POSTGRES: &str = subjects_of_sql!(
    postgres,
    issuer in "(SELECT lower(i) FROM unnest($2::text[]) AS i)",
    tenants "cardinality($3::text[]) = 0",
    tenant in "(SELECT lower(t) FROM unnest($3::text[]) AS t)"
);
pub(super) const SUBJECTS_OF_SQLITE: &str = subjects_of_sql!(
    sqlite,
    issuer in "(SELECT lower(value) FROM json_each($2))",
    tenants "json_array_length($3) = 0",
    tenant in "(SELECT lower(value) FROM json_each($3))"
);

/// A value for one placeholder of a [`Statement`]; each backend binds
/// times its own way ([`bound`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Bind {
    Text(Option<String>),
    Time(Option<OffsetDateTime>),
    Int(i64),
}

/// A statement with placeholders `$1`, `$2`, ... in the order of `binds`:
/// written once for both backends, each binding the values its own way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Statement {
    pub(super) sql: String,
    pub(super) binds: Vec<Bind>,
}

/// `statement` as a query of the database `DB`, its times written as
/// `time` writes them (Postgres takes them as they are, SQLite as text in
/// their one form).
pub(super) fn bound<'q, DB, T>(
    statement: Statement,
    time: fn(OffsetDateTime) -> T,
) -> Query<'q, DB, DB::Arguments>
where
    DB: Database,
    for<'t> Option<String>: Encode<'t, DB> + Type<DB>,
    for<'t> Option<T>: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
{
    let query = sqlx::query(sqlx::AssertSqlSafe(statement.sql));
    statement.binds.into_iter().fold(query, |query, bind| match bind {
        Bind::Text(value) => query.bind(value),
        Bind::Time(value) => query.bind(value.map(time)),
        Bind::Int(value) => query.bind(value),
    })
}

impl Statement {
    /// `in_chain` is the backend's [`chain_rows!`].
    pub(super) fn page(after_seq: i64, limit: i64, in_chain: &str) -> Self {
        Self {
            sql: format!(
                "SELECT {COLUMNS} FROM audit_events WHERE seq > $1 AND {in_chain} ORDER BY seq LIMIT $2"
            ),
            binds: vec![Bind::Int(after_seq), Bind::Int(limit)],
        }
    }

    /// `dialect` is the backend's SQL for the filters it writes its own
    /// way, `in_chain` its [`chain_rows!`]. Oldest first, unless `order`
    /// says otherwise.
    pub(super) fn matching(filter: &AuditFilter, dialect: &Dialect, in_chain: &str, order: Order) -> Self {
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
        // A node filter that an index serves (Postgres's GIN index) finds
        // its matches there too: walking `seq` for a node named by few
        // calls, or none, read every record.
        let far_bound = order.far_bound(filter) || (filter.node.is_some() && dialect.node_index);
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
            add(&|n| format!("occurred_at >= ${n}"), Bind::Time(Some(since)));
        }
        if let Some(until) = filter.until {
            add(&|n| format!("occurred_at < ${n}"), Bind::Time(Some(until)));
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
                add(&|n| format!("{column} = ${n}"), Bind::Text(Some(value.clone())));
            }
        }
        if let Some(role) = &filter.role {
            add(&dialect.role, Bind::Text(Some(role.clone())));
        }
        if let Some(event) = &filter.except_event {
            add(&|n| format!("event <> ${n}"), Bind::Text(Some(event.clone())));
        }
        // Only `api.call` records have a method or nodes.
        let (api_call, method) = (dialect.api_call, dialect.method);
        match &filter.method {
            Some(MethodFilter::Exact(exact)) => {
                add(
                    &|n| format!("{api_call} AND {method} = ${n}"),
                    Bind::Text(Some(exact.clone())),
                );
            }
            Some(MethodFilter::Prefix(prefix)) => {
                add(
                    &|n| format!("{api_call} AND {method} >= ${n}"),
                    Bind::Text(Some(prefix.clone())),
                );
                if let Some(end) = MethodFilter::prefix_end(prefix) {
                    add(&|n| format!("{method} < ${n}"), Bind::Text(Some(end)));
                }
            }
            None => {}
        }
        if let Some(node) = &filter.node {
            let node_condition = dialect.node;
            add(
                &|n| format!("{api_call} AND {}", node_condition(n)),
                Bind::Text(Some(node.clone())),
            );
        }
        // Only a workload's records hold `details.workload`.
        if let Some(KindFilter::Workload(kind)) = &filter.kind {
            add(&dialect.kind, Bind::Text(Some(kind.clone())));
        }
        match &filter.kind {
            Some(KindFilter::AnyWorkload) => conditions.push(dialect.workload.to_owned()),
            Some(KindFilter::Person) => conditions.push(dialect.person.to_owned()),
            Some(KindFilter::Workload(_)) | None => {}
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

/// What a backend writes its own way in the record query.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dialect {
    /// The test that placeholder `n` is a granted or requested role.
    pub(super) role: fn(usize) -> String,
    /// An `api.call` record's method as text, written as the backend's
    /// index of it (migration 0009), compared byte by byte.
    pub(super) method: &'static str,
    /// The test that placeholder `n` is one of an `api.call` record's nodes.
    pub(super) node: fn(usize) -> String,
    /// Whether an index lists each node's calls.
    pub(super) node_index: bool,
    /// The test that a record is an API call, as the method's index needs
    /// it written.
    pub(super) api_call: &'static str,
    /// The test that placeholder `n` is the kind of a workload's record,
    /// as the backend's index of it (migration 0010) needs it written.
    pub(super) kind: fn(usize) -> String,
    /// The test that a record is a workload's, of any kind.
    pub(super) workload: &'static str,
    /// The test that a record is a person's.
    pub(super) person: &'static str,
}

#[cfg(test)]
impl Dialect {
    /// Placeholder SQL for the backend's own conditions.
    pub(super) fn placeholders() -> Self {
        Self {
            role: |n| format!("role = ${n}"),
            method: "M",
            node: |n| format!("node = ${n}"),
            node_index: false,
            api_call: "A",
            kind: |n| format!("kind = ${n}"),
            workload: "W",
            person: "P",
        }
    }
}

/// Which way a query reads the trail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    /// As `GET /v1/audit` serves it: a cursor moves forward.
    OldestFirst,
    /// As a console shows it: a cursor moves back, from `before_seq`
    /// (`None`: from the newest record).
    NewestFirst { before_seq: Option<i64> },
}

impl Order {
    /// Whether `filter` bounds time on the far side of the scan: `since`
    /// when reading forward, `until` when reading back.
    pub(super) fn far_bound(self, filter: &AuditFilter) -> bool {
        match self {
            Order::OldestFirst => filter.since.is_some(),
            Order::NewestFirst { .. } => filter.until.is_some(),
        }
    }
}

/// The statements of a deny-list change, in order; the last one's count of
/// rows is the number of entries the change touched. Subjects are kept as
/// they are, usernames lower-cased.
pub(super) fn deny_change(change: &DenyChange) -> Vec<Statement> {
    match change {
        DenyChange::Add(entry) => {
            let (subject, username) = (
                Bind::Text(entry.subject.clone()),
                Bind::Text(entry.username.clone()),
            );
            let added_at = Bind::Time(Some(entry.added_at));
            vec![
                // An expired entry of the same identity blocks nothing and
                // must not keep the new one out.
                Statement {
                    sql: "DELETE FROM deny_list WHERE expires_at <= $3 \
                          AND (subject = $1 OR (subject IS NULL AND username = lower($2)))"
                        .into(),
                    binds: vec![subject.clone(), username.clone(), added_at.clone()],
                },
                Statement {
                    sql: "INSERT INTO deny_list (subject, username, reason, added_by, added_at, expires_at) \
                          VALUES ($1, lower($2), $3, $4, $5, $6) ON CONFLICT DO NOTHING"
                        .into(),
                    binds: vec![
                        subject,
                        username,
                        Bind::Text(Some(entry.reason.clone())),
                        Bind::Text(Some(entry.added_by.clone())),
                        added_at,
                        Bind::Time(entry.expires_at),
                    ],
                },
            ]
        }
        DenyChange::Remove { subject, username } => vec![Statement {
            sql: "DELETE FROM deny_list WHERE subject = $1 OR (subject IS NULL AND username = lower($2))"
                .into(),
            binds: vec![Bind::Text(subject.clone()), Bind::Text(username.clone())],
        }],
    }
}

/// The charts' two counts: certificates issued per bucket, cluster and
/// granted role, then denials per reason (one bucket, `''`), within
/// `window`, of the chain's rows only. `bucket` is the backend's text of
/// a record's hour or day, `roles` its row source of the granted roles and
/// the column naming one, `in_chain` its [`chain_rows!`].
pub(super) fn chart(
    window: &ChartWindow,
    bucket: &str,
    roles: (&str, &str),
    in_chain: &str,
) -> [Statement; 2] {
    let (roles, role) = roles;
    let binds = vec![Bind::Time(Some(window.since)), Bind::Time(Some(window.until))];
    [
        Statement {
            sql: format!(
                "SELECT {bucket}, coalesce(cluster, '-') || ' ' || {role}, count(*) \
                 FROM audit_events, {roles} \
                 WHERE {in_chain} AND event = 'certificate.issued' AND occurred_at >= $1 AND occurred_at < $2 GROUP BY 1, 2 ORDER BY 1, 2"
            ),
            binds: binds.clone(),
        },
        Statement {
            sql: format!(
                "SELECT '', coalesce(reason_code, '-'), count(*) FROM audit_events \
                 WHERE {in_chain} AND outcome = 'denied' AND occurred_at >= $1 AND occurred_at < $2 \
                 GROUP BY 2 ORDER BY 3 DESC"
            ),
            binds,
        },
    ]
}

/// A deny_list row: subject, username, reason, added_by, added_at,
/// expires_at.
pub(super) type DenyRow<Time> = (Option<String>, Option<String>, String, String, Time, Option<Time>);

pub(super) fn deny_entry(
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

/// A row of `audit_events` as one backend returns it: each backend reads
/// the columns it stores its own way (times, lists, JSON).
pub(super) trait RecordRow: Row {
    fn time(&self, column: &str) -> Result<Option<OffsetDateTime>, StoreError>;
    fn list(&self, column: &str) -> Result<Vec<String>, StoreError>;
    fn details(&self) -> Result<Value, StoreError>;
}

/// The record in a row of `audit_events` ([`COLUMNS`]).
pub(super) fn stored_record<R>(row: &R) -> Result<StoredRecord, StoreError>
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_and_node_filters_keep_to_api_calls() {
        let filter = |method: Option<MethodFilter>, node: Option<&str>| AuditFilter {
            method,
            node: node.map(Into::into),
            except_event: Some("x".into()),
            ..Default::default()
        };
        let sql = |filter: &AuditFilter| {
            let statement = Statement::matching(filter, &Dialect::placeholders(), "V", Order::OldestFirst);
            let sql = statement.sql;
            (
                sql[sql.find(" WHERE ").unwrap_or(0)..].to_owned(),
                statement.binds,
            )
        };
        let (exact, binds) = sql(&filter(
            Some(MethodFilter::Exact("/a.B/C".into())),
            Some("10.5.0.2"),
        ));
        assert_eq!(
            exact,
            " WHERE seq > $1 AND V AND event <> $2 AND A AND M = $3 AND A AND node = $4 ORDER BY seq LIMIT $5"
        );
        assert_eq!(binds[2], Bind::Text(Some("/a.B/C".into())));
        let (prefix, binds) = sql(&filter(Some(MethodFilter::Prefix("/a.B/Etcd".into())), None));
        assert_eq!(
            prefix,
            " WHERE seq > $1 AND V AND event <> $2 AND A AND M >= $3 AND M < $4 ORDER BY seq LIMIT $5"
        );
        assert_eq!(binds[3], Bind::Text(Some("/a.B/Etce".into())));
        // A node an index serves: its matches are found there, then sorted.
        let indexed = Dialect {
            node_index: true,
            ..Dialect::placeholders()
        };
        let node = Statement::matching(&filter(None, Some("n")), &indexed, "V", Order::OldestFirst).sql;
        assert!(
            node.ends_with(
                " WHERE seq IN (SELECT seq FROM audit_events WHERE seq + 0 > $1 AND V AND event <> $2 \
                 AND A AND node = $3 ORDER BY seq + 0 LIMIT $4) ORDER BY seq"
            ),
            "{node}"
        );
    }

    #[test]
    fn kind_filters_write_each_backends_workload_tests() {
        let sql = |kind: KindFilter| {
            let filter = AuditFilter {
                kind: Some(kind),
                ..Default::default()
            };
            let statement = Statement::matching(&filter, &Dialect::placeholders(), "V", Order::OldestFirst);
            let sql = statement.sql;
            (
                sql[sql.find(" WHERE ").unwrap_or(0)..].to_owned(),
                statement.binds,
            )
        };
        let (one, binds) = sql(KindFilter::Workload("gitlab-ci".into()));
        assert_eq!(one, " WHERE seq > $1 AND V AND kind = $2 ORDER BY seq LIMIT $3");
        assert_eq!(binds[1], Bind::Text(Some("gitlab-ci".into())));
        let (any, binds) = sql(KindFilter::AnyWorkload);
        assert_eq!(any, " WHERE seq > $1 AND V AND W ORDER BY seq LIMIT $2");
        assert_eq!(binds.len(), 2);
        let (person, _) = sql(KindFilter::Person);
        assert_eq!(person, " WHERE seq > $1 AND V AND P ORDER BY seq LIMIT $2");
    }

    #[test]
    fn a_prefix_ends_before_the_first_text_it_does_not_start() {
        assert_eq!(MethodFilter::prefix_end("/a/Etcd").as_deref(), Some("/a/Etce"));
        assert_eq!(MethodFilter::prefix_end("/").as_deref(), Some("0"));
        assert_eq!(
            MethodFilter::prefix_end("a\u{d7ff}").as_deref(),
            Some("a\u{e000}")
        );
        assert_eq!(MethodFilter::prefix_end("a\u{10ffff}").as_deref(), Some("b"));
        assert_eq!(MethodFilter::prefix_end("\u{10ffff}\u{10ffff}"), None);
        // Every text that starts with the prefix sorts below the end, byte
        // by byte, and the end does not start with it.
        for (prefix, text) in [
            ("/a/Etcd", "/a/Etcd\u{10ffff}zz"),
            ("a\u{10ffff}", "a\u{10ffff}\u{10ffff}"),
        ] {
            let end = MethodFilter::prefix_end(prefix).unwrap();
            assert!(text.as_bytes() < end.as_bytes() && !end.starts_with(prefix));
        }
    }
}
