//! `migrate`: the audit database schema created or upgraded, connected as
//! its owner, and the runtime role granted what it needs.

use std::io::Write;
use std::path::Path;

use crate::app::{migrate_store, open_store};
use crate::audit::store::AuditStore;

/// `migrate` with the configuration at `config`.
pub(super) async fn run(
    config: &Path,
    runtime_role: Option<&str>,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let config = super::load_config(config)?;
    let store = open_store(&config, false).await?;
    let result = migrate(&store, runtime_role, out).await;
    store.close().await;
    result
}

/// `migrate`: a runtime role is checked before anything changes, granted
/// after the schema is current.
async fn migrate(
    store: &AuditStore,
    runtime_role: Option<&str>,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    if let Some(role) = runtime_role {
        store.check_runtime_role(role).await?;
    }
    migrate_store(store).await?;
    writeln!(out, "audit database ({}) is up to date", store.kind())?;
    if let Some(role) = runtime_role {
        let grants = store.grant_runtime_role(role).await?;
        writeln!(out, "runtime role {} may:", grants.role)?;
        for line in &grants.granted {
            writeln!(out, "  {line}")?;
        }
    }
    Ok(())
}
