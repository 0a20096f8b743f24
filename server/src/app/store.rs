//! The audit store as the server opens it: connected, migrated or checked
//! to be current, its role's authority over the schema said.

use crate::audit::store::roles::SchemaAuthority;
use crate::audit::store::{AuditStore, StoreError, StoreOptions};
use crate::config::Config;

use super::StartError;

/// Open the audit store named by the configuration, migrating if asked.
pub async fn open_store(config: &Config, migrate: bool) -> Result<AuditStore, StartError> {
    let url = config.database_url()?;
    let options = StoreOptions {
        max_connections: config
            .database
            .max_connections
            .unwrap_or(StoreOptions::default().max_connections),
        acquire_timeout: config
            .database
            .acquire_timeout
            .unwrap_or(StoreOptions::default().acquire_timeout),
    };
    let store = AuditStore::connect(&url, &options)
        .await
        .map_err(|e| StartError::Database(e.to_string()))?;
    if migrate {
        migrate_store(&store).await?;
    }
    Ok(store)
}

fn database_error(error: StoreError) -> StartError {
    StartError::Database(error.to_string())
}

/// Apply the migrations, or say why the connected role may not and what to
/// run instead.
pub async fn migrate_store(store: &AuditStore) -> Result<(), StartError> {
    if let SchemaAuthority::Runtime { role, reason } =
        store.schema_authority().await.map_err(database_error)?
    {
        return Err(StartError::Database(format!(
            "role `{role}` {reason}, so it may not migrate the schema: run `talos-sso-server migrate --config <the owner's configuration> --runtime-role {role}` as the schema owner, and set `database.migrate_on_start: false` for this server"
        )));
    }
    store.migrate().await.map_err(database_error)
}

/// The store as `serve` and `break-glass` use it: migrated when
/// `database.migrate_on_start` (the default), else checked to be current,
/// so that an old schema stops the server here rather than at its first
/// insert. Either way a trail holding rows outside its hash chain is
/// refused, each named (migrating refuses it too).
pub async fn open_serving_store(config: &Config) -> Result<AuditStore, StartError> {
    let migrate = config.database.migrate_on_start.unwrap_or(true);
    let store = open_store(config, migrate).await?;
    if !migrate {
        store.require_chain_only().await.map_err(database_error)?;
        require_current_schema(&store).await?;
    }
    if let Some(warning) = owner_warning(&store).await? {
        tracing::warn!("{warning}");
    }
    Ok(store)
}

/// Refuse a schema that lacks a migration embedded in this binary, naming
/// the versions and the command that applies them.
pub async fn require_current_schema(store: &AuditStore) -> Result<(), StartError> {
    let unapplied = store.unapplied_migrations().await.map_err(database_error)?;
    if unapplied.is_empty() {
        return Ok(());
    }
    let versions: Vec<String> = unapplied.iter().map(ToString::to_string).collect();
    let command = match store.schema_authority().await.map_err(database_error)? {
        SchemaAuthority::File => "talos-sso-server migrate --config <this configuration>".to_owned(),
        SchemaAuthority::Owner { role } | SchemaAuthority::Runtime { role, .. } => {
            format!("talos-sso-server migrate --config <the owner's configuration> --runtime-role {role}")
        }
    };
    let (migrations, are) = match versions.len() {
        1 => ("migration", "is"),
        _ => ("migrations", "are"),
    };
    Err(StartError::Database(format!(
        "the schema is not current: {migrations} {} {are} not applied, and `database.migrate_on_start` is false; run `{command}` as the schema owner, then start the server again",
        versions.join(", ")
    )))
}

/// A warning when the server connects as a role that may change the schema,
/// and so could disable the append-only triggers.
pub async fn owner_warning(store: &AuditStore) -> Result<Option<String>, StartError> {
    Ok(match store.schema_authority().await.map_err(database_error)? {
        SchemaAuthority::Owner { role } => Some(format!(
            "the server connects to Postgres as `{role}`, which may change the schema and so could disable the append-only triggers of audit_events: connect as a runtime role (`talos-sso-server migrate --runtime-role`, docs/configuration.md)"
        )),
        SchemaAuthority::File | SchemaAuthority::Runtime { .. } => None,
    })
}
