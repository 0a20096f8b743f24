//! `check`: the configuration, CA material, policy examples, audit
//! database and identity issuers, as `serve` would meet them at start.

use std::io::Write;
use std::path::Path;

use time::OffsetDateTime;

use crate::app::{open_store, owner_warning, require_current_schema};
use crate::cluster::load_clusters;

/// `check`: what is wrong is an error; what is fine, and the warnings, are
/// written to `out`.
pub(super) async fn run(
    config: &Path,
    now: OffsetDateTime,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let config = super::load_config(config)?;
    let (clusters, warnings) = load_clusters(&config, now)?;
    for (name, cluster) in &clusters {
        // The CA that signs now: after next_ca's date, the next one.
        let signing = cluster.signing_ca(now);
        writeln!(
            out,
            "cluster {name}: {} mode, CA {} ({} days left), {} rules",
            cluster.mode(),
            crate::ca::describe_name(&signing.signer().raw_subject),
            signing.summary(now).days_left,
            cluster.config.rules.len()
        )?;
        if let Some(token) = signing.key_location() {
            writeln!(out, "cluster {name}: key in {token}")?;
        }
        if cluster.mode() == crate::ca::TrustMode::AcceptedCa {
            let trusted = crate::ca::parse_certificates(cluster.ca.trust_bundle_pem(), "trust bundle")?;
            let names: Vec<String> = trusted
                .iter()
                .map(|c| crate::ca::describe_name(&c.raw_subject))
                .collect();
            writeln!(
                out,
                "cluster {name}: talosconfigs verify apid with {}; Talos must list the CA in machine.acceptedCAs \
                 (talos-sso-server ca patch)",
                names.join(", ")
            )?;
        }
        if let Some(gateway) = &cluster.gateway {
            writeln!(
                out,
                "cluster {name}: gateway on {} for {}, forwarding to {}; people's certificates signed by {} \
                 ({} days left), which Talos must not trust; {} method rules, {} examples passed",
                gateway.config.listen,
                gateway.config.endpoints.join(", "),
                cluster.upstreams().join(", "),
                crate::ca::describe_name(&gateway.client_ca.signer().raw_subject),
                gateway.client_ca.summary(now).days_left,
                gateway.config.rules.len(),
                gateway.config.examples.len()
            )?;
            for rule in &gateway.config.rules {
                let who = if rule.refuse {
                    "refused through the gateway".to_owned()
                } else {
                    let mut who = Vec::new();
                    if !rule.roles.is_empty() {
                        who.push(format!("roles {}", rule.roles.join(", ")));
                    }
                    if !rule.groups.is_empty() {
                        who.push(format!("groups {}", rule.groups.join(", ")));
                    }
                    format!("only for {}", who.join(" or "))
                };
                writeln!(
                    out,
                    "cluster {name}: gateway rule {}: {} {who}",
                    rule.name,
                    rule.methods.join(", ")
                )?;
            }
        }
        for line in cluster.policy.workloads.describe() {
            writeln!(out, "cluster {name}: {line}")?;
        }
        if let Some(next) = &cluster.next_ca {
            writeln!(
                out,
                "cluster {name}: next CA {} ({} days left) signs from {}{}",
                crate::ca::describe_name(&next.ca.signer().raw_subject),
                next.ca.summary(now).days_left,
                crate::ca::format_time(next.signs_from),
                if now >= next.signs_from { " (now)" } else { "" }
            )?;
        }
    }
    writeln!(out, "policy examples: {} passed", config.policy_examples.len())?;
    for (cluster, warning) in &warnings {
        writeln!(out, "warning: cluster {cluster}: {warning}")?;
    }
    for warning in config.warnings() {
        writeln!(out, "warning: {warning}")?;
    }
    match &config.audit.checkpoints {
        None => writeln!(
            out,
            "note: {}",
            config.unsigned_trail_notice().unwrap_or_default()
        )?,
        Some(settings) => {
            let keys = crate::audit::checkpoint::configured_keys(settings)?;
            writeln!(
                out,
                "audit checkpoints: signed every {} with key {}, appended to {}",
                humantime::format_duration(settings.interval),
                keys[0].key_id,
                settings.file.display()
            )?;
        }
    }
    let store = open_store(&config, false).await?;
    store
        .ping()
        .await
        .map_err(|e| anyhow::anyhow!("audit database: {e}"))?;
    writeln!(out, "audit database: reachable")?;
    if config.database.migrate_on_start == Some(false) {
        require_current_schema(&store).await?;
        writeln!(out, "audit database: schema current")?;
    }
    if let Some(warning) = owner_warning(&store).await? {
        writeln!(out, "warning: audit database: {warning}")?;
    }
    // The identity issuers, as `serve` will meet them at start.
    let authenticator = crate::app::authenticator(&config).await?;
    for line in authenticator.check().await.map_err(anyhow::Error::msg)? {
        writeln!(out, "{line}")?;
    }
    Ok(())
}
