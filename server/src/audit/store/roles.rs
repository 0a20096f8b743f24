//! Who may do what to the Postgres schema. Two roles: the **owner** runs
//! the migrations and owns every table, view and trigger; the **runtime
//! role** the server connects as may only read and append. An owner can
//! `ALTER TABLE audit_events DISABLE TRIGGER ...`, so a server running as
//! the owner makes the append-only triggers a promise; as the runtime role
//! they hold.
//!
//! [`AuditStore::grant_runtime_role`] gives the runtime role exactly what
//! the server uses, and checks afterwards that it holds nothing more:
//!
//! - `SELECT, INSERT` on `audit_events` and `used_tokens` (appends, the
//!   replay guard's `INSERT ... ON CONFLICT DO NOTHING`);
//! - `SELECT, INSERT, DELETE` on `deny_list`;
//! - the web console's state (`console::*`): `SELECT, INSERT, UPDATE,
//!   DELETE` on `console_sessions` (a session's last use is updated),
//!   `SELECT, INSERT, DELETE` on `console_views` and `console_logins`;
//! - `SELECT` on sqlx's `_sqlx_migrations` (the schema check at start) and
//!   on every view of the schema, found when the grant runs: run it again
//!   after each upgrade and the new views are readable too.
//!
//! A table a future migration adds gets nothing until it is named here.
//!
//! SQLite has no roles: whoever may write the file may do anything to it,
//! so its permissions (0600, the server's own user) are the boundary.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::postgres::PgPool;

use super::{AuditStore, StoreError, postgres};
use talos_sso_text as text;

/// The tables the server writes, and what it does to each.
const TABLE_GRANTS: [(&str, &[&str]); 6] = [
    ("audit_events", &["SELECT", "INSERT"]),
    ("used_tokens", &["SELECT", "INSERT"]),
    ("deny_list", &["SELECT", "INSERT", "DELETE"]),
    ("console_sessions", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
    ("console_views", &["SELECT", "INSERT", "DELETE"]),
    ("console_logins", &["SELECT", "INSERT", "DELETE"]),
];

/// Every privilege a table can carry (before Postgres 17's `MAINTAIN`,
/// which is checked when the server has it).
const TABLE_PRIVILEGES: [&str; 7] = [
    "SELECT",
    "INSERT",
    "UPDATE",
    "DELETE",
    "TRUNCATE",
    "REFERENCES",
    "TRIGGER",
];

/// Serialises concurrent grants (two migration jobs at once) on one
/// database; any constant nobody else picks.
const GRANT_LOCK_KEY: i64 = 0x7461_6c6f_7352_4f4c;

/// Longest role name Postgres keeps (NAMEDATALEN - 1).
const MAX_ROLE_NAME_BYTES: usize = 63;

/// One table's owner, as the grant checks it: the table, its owner (none:
/// it is missing), whether the connected role has the owner's rights,
/// whether the runtime role does.
type OwnerRow = (String, Option<String>, Option<bool>, Option<bool>);

/// What the connected role may do to the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaAuthority {
    /// SQLite: the file's permissions decide.
    File,
    /// May change the schema (owns it, or is a superuser): it can also
    /// disable the append-only triggers.
    Owner { role: String },
    /// May not change the schema, for `reason`.
    Runtime { role: String, reason: String },
}

/// What [`AuditStore::grant_runtime_role`] granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeGrants {
    pub role: String,
    /// `PRIVILEGES on OBJECTS`, one line each.
    pub granted: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    #[error(
        "SQLite has no roles: the database file's permissions are the boundary (only the server's user may read or write it)"
    )]
    NoRoles,
    #[error("`{0}` is not a role name: 1 to 63 bytes, no control characters; nothing was changed")]
    InvalidName(String),
    #[error(
        "role `{0}` does not exist: create it first (`CREATE ROLE {0} LOGIN PASSWORD '...'`, as a role allowed to create roles), then run `talos-sso-server migrate --runtime-role {0}` again; nothing was changed"
    )]
    Unknown(String),
    #[error(
        "role `{role}` {why}: the server's runtime role must be a role of its own, holding only what `migrate --runtime-role` grants; nothing was changed"
    )]
    TooPowerful { role: String, why: String },
    #[error("table {0} is missing: the schema is not migrated")]
    Missing(String),
    #[error(
        "{table} belongs to `{owner}`, not to `{current}`: run `talos-sso-server migrate --runtime-role` as the role that owns the schema"
    )]
    NotOwner {
        table: String,
        owner: String,
        current: String,
    },
    #[error(
        "role `{role}` could also {excess}, which the server must not: revoke it (it comes from PUBLIC, or from a role `{role}` is a member of), then run `talos-sso-server migrate --runtime-role {role}` again; nothing was changed"
    )]
    Excess { role: String, excess: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for RoleError {
    fn from(error: sqlx::Error) -> Self {
        RoleError::Store(error.into())
    }
}

/// The role name as it may appear in a message.
fn shown(role: &str) -> String {
    text::clean(role, MAX_ROLE_NAME_BYTES + 1)
}

fn check_name(role: &str) -> Result<(), RoleError> {
    if role.is_empty() || role.len() > MAX_ROLE_NAME_BYTES || role.chars().any(char::is_control) {
        return Err(RoleError::InvalidName(shown(role)));
    }
    Ok(())
}

/// The privileges `role` holds beyond `expected` (object -> privileges),
/// one phrase per object: `held` is every (object, privilege) it holds in
/// the schema. Reading another view or table is no threat to the trail;
/// any other privilege on an object the server does not write is.
fn excess(held: &[(String, String)], expected: &BTreeMap<String, BTreeSet<&str>>) -> Vec<String> {
    let mut extra: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (object, privilege) in held {
        let allowed = match expected.get(object) {
            Some(privileges) => privileges.contains(privilege.as_str()),
            None => privilege == "SELECT",
        };
        if !allowed {
            extra.entry(object).or_default().push(privilege);
        }
    }
    extra
        .into_iter()
        .map(|(object, privileges)| format!("{} {object}", privileges.join(", ")))
        .collect()
}

impl AuditStore {
    /// What the role this store connects as may do to the schema.
    pub async fn schema_authority(&self) -> Result<SchemaAuthority, StoreError> {
        let AuditStore::Postgres(pool) = self else {
            return Ok(SchemaAuthority::File);
        };
        let (role, superuser, schema, may_create, owns_audit): (
            String,
            bool,
            Option<String>,
            Option<bool>,
            Option<bool>,
        ) = sqlx::query_as(
            "SELECT current_user::text, r.rolsuper, current_schema()::text, \
                    has_schema_privilege(current_schema(), 'CREATE'), \
                    (SELECT pg_has_role(current_user, c.relowner, 'USAGE') \
                     FROM pg_class c WHERE c.oid = to_regclass('audit_events')) \
             FROM pg_roles r WHERE r.rolname = current_user",
        )
        .fetch_one(pool)
        .await?;
        let runtime = |reason: String| SchemaAuthority::Runtime {
            role: shown(&role),
            reason,
        };
        Ok(match (superuser, schema, may_create, owns_audit) {
            (true, ..) | (_, Some(_), _, Some(true)) | (_, Some(_), Some(true), None) => {
                SchemaAuthority::Owner { role: shown(&role) }
            }
            (_, None, ..) => runtime("has no schema on its search_path".into()),
            (_, Some(_), _, Some(false)) => runtime("does not own the table audit_events".into()),
            (_, Some(schema), ..) => runtime(format!("may not create objects in schema {}", shown(&schema))),
        })
    }

    /// Refuse a runtime role that does not exist or would be more than a
    /// runtime role (the owner itself, a superuser, a member of the owner).
    /// Reads only: `migrate --runtime-role` asks this before it migrates.
    pub async fn check_runtime_role(&self, role: &str) -> Result<(), RoleError> {
        let AuditStore::Postgres(pool) = self else {
            return Err(RoleError::NoRoles);
        };
        runtime_role(pool, role).await.map(|_| ())
    }

    /// Grant `role` exactly what the server needs at run time (see the
    /// module comment), revoking what this role granted it before, and
    /// check that it holds nothing more; all in one transaction, so a
    /// refusal changes nothing. Run as the schema owner, after migrating.
    pub async fn grant_runtime_role(&self, role: &str) -> Result<RuntimeGrants, RoleError> {
        let AuditStore::Postgres(pool) = self else {
            return Err(RoleError::NoRoles);
        };
        let quoted = runtime_role(pool, role).await?;
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(GRANT_LOCK_KEY)
            .execute(&mut *tx)
            .await?;

        let migrations_table = postgres::MIGRATOR.table_name.to_string();
        let mut expected: BTreeMap<String, BTreeSet<&str>> = TABLE_GRANTS
            .iter()
            .map(|(table, privileges)| ((*table).to_owned(), privileges.iter().copied().collect()))
            .collect();
        expected.insert(migrations_table.clone(), BTreeSet::from(["SELECT"]));

        // Ours to grant: every table is the connected role's.
        let tables: Vec<String> = expected.keys().cloned().collect();
        let owners: Vec<OwnerRow> = sqlx::query_as(
            "SELECT t, pg_get_userbyid(c.relowner)::text, pg_has_role(current_user, c.relowner, 'USAGE'), \
                    pg_has_role($2, c.relowner, 'MEMBER') \
             FROM unnest($1::text[]) AS t LEFT JOIN pg_class c ON c.oid = to_regclass(t)",
        )
        .bind(&tables)
        .bind(role)
        .fetch_all(&mut *tx)
        .await?;
        for (table, owner, ours, runtime_is_owner) in owners {
            let owner = owner.ok_or_else(|| RoleError::Missing(table.clone()))?;
            if runtime_is_owner == Some(true) {
                return Err(RoleError::TooPowerful {
                    role: shown(role),
                    why: format!("is a member of `{}`, which owns {table}", shown(&owner)),
                });
            }
            if ours != Some(true) {
                let current: String = sqlx::query_scalar("SELECT current_user::text")
                    .fetch_one(&mut *tx)
                    .await?;
                return Err(RoleError::NotOwner {
                    table,
                    owner: shown(&owner),
                    current: shown(&current),
                });
            }
        }

        let schema: String = sqlx::query_scalar("SELECT quote_ident(current_schema())")
            .fetch_one(&mut *tx)
            .await?;
        let mut statements = vec![
            format!("REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {quoted}"),
            format!("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM {quoted}"),
        ];
        let has_usage: bool =
            sqlx::query_scalar("SELECT has_schema_privilege($1, current_schema(), 'USAGE')")
                .bind(role)
                .fetch_one(&mut *tx)
                .await?;
        if !has_usage {
            statements.push(format!("GRANT USAGE ON SCHEMA {schema} TO {quoted}"));
        }
        let mut granted = Vec::new();
        for (table, privileges) in TABLE_GRANTS {
            let privileges = privileges.join(", ");
            statements.push(format!("GRANT {privileges} ON {table} TO {quoted}"));
            granted.push(format!("{privileges} on {table}"));
        }
        statements.push(format!("GRANT SELECT ON {migrations_table} TO {quoted}"));
        granted.push(format!("SELECT on {migrations_table}"));
        // Every view of the schema the connected role owns, whatever its
        // name: views added by later migrations are covered by re-running.
        let views: Vec<String> = sqlx::query_scalar(
            "SELECT c.oid::regclass::text FROM pg_class c \
             WHERE c.relnamespace = to_regnamespace(quote_ident(current_schema())) \
               AND c.relkind IN ('v', 'm') AND pg_has_role(current_user, c.relowner, 'USAGE') \
             ORDER BY 1",
        )
        .fetch_all(&mut *tx)
        .await?;
        for view in &views {
            statements.push(format!("GRANT SELECT ON {view} TO {quoted}"));
            expected.insert(view.clone(), BTreeSet::from(["SELECT"]));
        }
        if !views.is_empty() {
            granted.push(format!("SELECT on {}", views.join(", ")));
        }
        for statement in statements {
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .execute(&mut *tx)
                .await?;
        }

        // What the role holds now, from whatever source: directly, through
        // PUBLIC, or through any role it is a member of (with or without
        // INHERIT, since it may `SET ROLE` to it).
        let maintain: bool =
            sqlx::query_scalar("SELECT current_setting('server_version_num')::int >= 170000")
                .fetch_one(&mut *tx)
                .await?;
        let mut privileges: Vec<&str> = TABLE_PRIVILEGES.to_vec();
        if maintain {
            privileges.push("MAINTAIN");
        }
        let held: Vec<(String, String)> = sqlx::query_as(
            "SELECT DISTINCT c.oid::regclass::text, p.privilege \
             FROM pg_class c CROSS JOIN unnest($2::text[]) AS p(privilege) CROSS JOIN pg_roles r \
             WHERE c.relnamespace = to_regnamespace(quote_ident(current_schema())) \
               AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND pg_has_role($1, r.oid, 'MEMBER') \
               AND has_table_privilege(r.oid, c.oid, p.privilege) \
             ORDER BY 1, 2",
        )
        .bind(role)
        .bind(&privileges)
        .fetch_all(&mut *tx)
        .await?;
        let mut extra = excess(&held, &expected);
        let (schema_create, database_create): (bool, bool) = sqlx::query_as(
            "SELECT coalesce(bool_or(has_schema_privilege(r.oid, current_schema(), 'CREATE')), false), \
                    coalesce(bool_or(has_database_privilege(r.oid, current_database(), 'CREATE')), false) \
             FROM pg_roles r WHERE pg_has_role($1, r.oid, 'MEMBER')",
        )
        .bind(role)
        .fetch_one(&mut *tx)
        .await?;
        if schema_create {
            extra.push(format!(
                "CREATE objects in schema {schema} (PUBLIC may, by default, before Postgres 15: `REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC`)"
            ));
        }
        if database_create {
            extra.push("CREATE schemas in this database".into());
        }
        if !extra.is_empty() {
            return Err(RoleError::Excess {
                role: shown(role),
                excess: extra.join("; "),
            });
        }
        tx.commit().await?;
        Ok(RuntimeGrants {
            role: shown(role),
            granted,
        })
    }
}

/// `role`, checked to exist and to be no more than a runtime role; its
/// name quoted for SQL by the server itself.
async fn runtime_role(pool: &PgPool, role: &str) -> Result<String, RoleError> {
    check_name(role)?;
    let found: Option<(String, bool, bool, bool, bool)> = sqlx::query_as(
        "SELECT quote_ident(rolname), rolsuper, rolcreaterole, rolname = current_user, \
                pg_has_role(rolname, current_user, 'MEMBER') \
         FROM pg_roles WHERE rolname = $1",
    )
    .bind(role)
    .fetch_optional(pool)
    .await?;
    let Some((quoted, superuser, create_role, is_current, member_of_current)) = found else {
        return Err(RoleError::Unknown(shown(role)));
    };
    let why = if is_current {
        "is the role this command connects as: connect as the schema owner and name the server's role"
    } else if superuser {
        "is a superuser"
    } else if create_role {
        "has CREATEROLE (it could make itself a member of the owner)"
    } else if member_of_current {
        "is a member of the role this command connects as, the schema owner"
    } else {
        return Ok(quoted);
    };
    Err(RoleError::TooPowerful {
        role: shown(role),
        why: why.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected() -> BTreeMap<String, BTreeSet<&'static str>> {
        TABLE_GRANTS
            .iter()
            .map(|(t, p)| ((*t).to_owned(), p.iter().copied().collect()))
            .collect()
    }

    fn held(rows: &[(&str, &str)]) -> Vec<(String, String)> {
        rows.iter()
            .map(|(o, p)| ((*o).to_owned(), (*p).to_owned()))
            .collect()
    }

    #[test]
    fn exactly_the_grants_is_no_excess() {
        let rows = held(&[
            ("audit_events", "INSERT"),
            ("audit_events", "SELECT"),
            ("deny_list", "DELETE"),
            ("issued_certificates", "SELECT"),
        ]);
        assert!(excess(&rows, &expected()).is_empty());
    }

    #[test]
    fn every_write_beyond_the_grants_is_named_per_object() {
        let rows = held(&[
            ("audit_events", "SELECT"),
            ("audit_events", "UPDATE"),
            ("audit_events", "TRUNCATE"),
            ("used_tokens", "DELETE"),
            ("issued_certificates", "INSERT"),
            ("someone_elses", "SELECT"),
            ("someone_elses", "TRIGGER"),
        ]);
        assert_eq!(
            excess(&rows, &expected()),
            [
                "UPDATE, TRUNCATE audit_events",
                "INSERT issued_certificates",
                "TRIGGER someone_elses",
                "DELETE used_tokens"
            ]
        );
    }

    #[test]
    fn role_names_are_bounded_and_printable() {
        assert!(check_name("talos_sso_app").is_ok());
        assert!(check_name("Mixed Case \"quoted\"").is_ok());
        for bad in ["", "a\u{0}b", "line\nbreak", &"x".repeat(64)] {
            let error = check_name(bad).unwrap_err().to_string();
            assert!(error.contains("is not a role name"), "{error}");
            assert!(!error.contains('\n') && !error.contains('\u{0}'), "{error}");
        }
    }
}
