//! Applying a configuration read again while the server runs (when to read
//! it, on SIGHUP or a changed file, is the watcher's business:
//! `server::reload_watch`). The app swaps in what may change while it runs:
//! the clusters (CA material, rules, endpoints, lifetimes), the policy
//! examples, the auditors, the admins and the rate limits. The rest (listener, TLS, database, identity provider, HTTP
//! limits, audit, log) takes a restart: a change there is applied to
//! nothing and said so, in the log and in the record.
//!
//! A new configuration is checked as at start (the domains' checks, CA
//! material, rules, policy examples) before anything changes. One that fails is refused, logged,
//! counted, and the running one keeps serving. Every attempt is an audit
//! record (`config.reloaded`) committed before the new configuration
//! serves: what changed, never who changed it (that is outside what the
//! server can know).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use serde_json::json;
use serde_yaml_ng::Value;
use talos_sso_api::audit::{AuditRecord, event, outcome};

use super::{App, Settings};
use crate::cluster::{ClusterError, Clusters, load_clusters};
use crate::config::{Config, ConfigError, ConfigSource, Snapshot};

/// What made the server read its configuration again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP.
    Signal,
    /// The file or a cluster file changed.
    FileChanged,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Signal => "signal",
            Trigger::FileChanged => "file_changed",
        }
    }
}

/// The sections a reload applies besides the clusters (which are compared
/// one by one); every other section takes a restart.
const RELOADED_BESIDES_CLUSTERS: [&str; 4] = ["policy_examples", "auditors", "admins", "rate_limits"];

/// Every section a reload applies.
pub const RELOADED_SECTIONS: [&str; 6] = [
    "clusters",
    "clusters_dir",
    RELOADED_BESIDES_CLUSTERS[0],
    RELOADED_BESIDES_CLUSTERS[1],
    RELOADED_BESIDES_CLUSTERS[2],
    RELOADED_BESIDES_CLUSTERS[3],
];

/// Reloads so far, for the metrics.
#[derive(Debug, Default)]
pub struct ReloadStats {
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    /// 1 when the last attempt was applied (or none was made), else 0.
    pub last_successful: AtomicI64,
    /// When a configuration was last loaded (Unix time): the start counts.
    pub last_success_at: AtomicI64,
}

impl ReloadStats {
    pub fn started(at: time::OffsetDateTime) -> Self {
        Self {
            last_successful: AtomicI64::new(1),
            last_success_at: AtomicI64::new(at.unix_timestamp()),
            ..Self::default()
        }
    }

    /// The counts now, as the metrics read them.
    pub fn counts(&self) -> crate::metrics::ReloadCounts {
        crate::metrics::ReloadCounts {
            succeeded: self.succeeded.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            last_successful: self.last_successful.load(Ordering::Relaxed),
            last_success_at: self.last_success_at.load(Ordering::Relaxed),
        }
    }
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub clusters_added: Vec<String>,
    pub clusters_removed: Vec<String>,
    /// Clusters whose configuration, signing CA certificate or trusted CA
    /// bundle changed.
    pub clusters_changed: Vec<String>,
    /// Reloaded sections besides the clusters that changed.
    pub sections_changed: Vec<String>,
    /// Sections that changed in the file but take a restart.
    pub restart_required: Vec<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.clusters_added.is_empty()
            && self.clusters_removed.is_empty()
            && self.clusters_changed.is_empty()
            && self.sections_changed.is_empty()
    }
}

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the server was not started from a configuration file: nothing to read again")]
    NoSource,
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Start(#[from] super::StartError),
    #[error("{0}")]
    Clusters(#[from] ClusterError),
    #[error("the reload could not be recorded in the audit trail, so it is not applied: {0}")]
    Audit(String),
    #[error("reading the configuration stopped before it ended: {0}")]
    Interrupted(String),
}

impl App {
    /// Read the configuration again and apply what may change while the
    /// server runs; refused as a whole, with the running configuration
    /// kept, when any of it fails. Every attempt is recorded and counted.
    pub async fn reload(&self, trigger: Trigger) -> Result<Changes, ReloadError> {
        let result = self.attempt_reload(trigger, None).await;
        self.report_reload(trigger, &result).await;
        result
    }

    /// As [`App::reload`], from the files as `snapshot` read them, whatever
    /// they hold now.
    pub async fn reload_from(&self, trigger: Trigger, snapshot: Snapshot) -> Result<Changes, ReloadError> {
        let result = self.attempt_reload(trigger, Some(Ok(snapshot))).await;
        self.report_reload(trigger, &result).await;
        result
    }

    /// Read and apply the configuration; nothing is logged or counted (but
    /// an applied configuration is recorded before it serves). From the
    /// files as `read` has them, or as they are now.
    pub(crate) async fn attempt_reload(
        &self,
        trigger: Trigger,
        read: Option<Result<Snapshot, ConfigError>>,
    ) -> Result<Changes, ReloadError> {
        let current = self.settings();
        match &current.config.source {
            Some(source) => self.try_reload(&current, source, trigger, read).await,
            None => Err(ReloadError::NoSource),
        }
    }

    /// Log and count the outcome of a reload; a refusal is recorded too.
    pub(crate) async fn report_reload(&self, trigger: Trigger, result: &Result<Changes, ReloadError>) {
        let stats = &self.reloads;
        match result {
            Ok(changes) => {
                stats.succeeded.fetch_add(1, Ordering::Relaxed);
                stats.last_successful.store(1, Ordering::Relaxed);
                stats
                    .last_success_at
                    .store(self.clock.now().unix_timestamp(), Ordering::Relaxed);
                tracing::info!(
                    trigger = trigger.as_str(),
                    clusters_added = ?changes.clusters_added,
                    clusters_removed = ?changes.clusters_removed,
                    clusters_changed = ?changes.clusters_changed,
                    sections_changed = ?changes.sections_changed,
                    "configuration reloaded"
                );
                if !changes.restart_required.is_empty() {
                    tracing::warn!(
                        sections = ?changes.restart_required,
                        "these sections changed but are read only at start: restart the server to apply them"
                    );
                }
            }
            Err(error) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                stats.last_successful.store(0, Ordering::Relaxed);
                tracing::error!(
                    trigger = trigger.as_str(),
                    "configuration not reloaded, the running one keeps serving: {error}"
                );
                if !matches!(error, ReloadError::Audit(_)) {
                    self.record_refused_reload(trigger, error).await;
                }
            }
        }
    }

    async fn try_reload(
        &self,
        current: &Settings,
        source: &ConfigSource,
        trigger: Trigger,
        read: Option<Result<Snapshot, ConfigError>>,
    ) -> Result<Changes, ReloadError> {
        // Files, CA material and PKCS#11 logins block: off the runtime.
        let (source, now) = (source.clone(), self.clock.now());
        let (new, clusters, warnings) = tokio::task::spawn_blocking(move || {
            let new = read.unwrap_or_else(|| source.snapshot())?.load()?;
            // As at start, whatever check the configuration was loaded with.
            super::check(&new)?;
            let (clusters, warnings) = load_clusters(&new, now)?;
            Ok::<_, ReloadError>((new, clusters, warnings))
        })
        .await
        .map_err(|e| ReloadError::Interrupted(e.to_string()))??;
        if let Some(checkpoints) = &self.checkpoints {
            super::refuse_ca_key_as_audit_key(&clusters, checkpoints)?;
        }
        refuse_gateway_listener_change(current, &clusters)?;
        let changes = changes(&current.config, current, &new, &clusters);
        let applied = applied_config(&current.config, new);
        let rate_limits = if changes.sections_changed.iter().any(|s| s == "rate_limits") {
            Arc::new(crate::ratelimit::RateLimits::new(&applied.rate_limits))
        } else {
            current.rate_limits.clone()
        };
        self.record_reload(trigger, &applied, &changes).await?;
        for (cluster, warning) in &warnings {
            tracing::warn!(cluster = %cluster, "{warning}");
        }
        self.metrics.know_clusters(clusters.keys().map(String::as_str));
        let relevant_groups = super::relevant_groups(&applied, &clusters);
        self.replace_settings(Settings {
            config: applied,
            clusters,
            rate_limits,
            relevant_groups,
        });
        Ok(changes)
    }

    async fn record_reload(
        &self,
        trigger: Trigger,
        config: &Config,
        changes: &Changes,
    ) -> Result<(), ReloadError> {
        let mut record = self.reload_record(trigger, outcome::SUCCESS, config.source.as_ref());
        record.details["fingerprint"] = json!(config.fingerprint);
        record.details["clusters_added"] = json!(changes.clusters_added);
        record.details["clusters_removed"] = json!(changes.clusters_removed);
        record.details["clusters_changed"] = json!(changes.clusters_changed);
        record.details["sections_changed"] = json!(changes.sections_changed);
        record.details["restart_required"] = json!(changes.restart_required);
        self.audit
            .append(crate::audit::store::Append {
                record,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| ReloadError::Audit(e.to_string()))
    }

    async fn record_refused_reload(&self, trigger: Trigger, error: &ReloadError) {
        let current = self.settings();
        let mut record = self.reload_record(trigger, outcome::DENIED, current.config.source.as_ref());
        record.reason_code = Some("config_invalid".into());
        record.details["error"] = json!(error.to_string());
        let appended = self
            .audit
            .append(crate::audit::store::Append {
                record,
                ..Default::default()
            })
            .await;
        if let Err(error) = appended {
            tracing::error!("the refused reload could not be recorded: {error}");
        }
    }

    fn reload_record(&self, trigger: Trigger, outcome: &str, source: Option<&ConfigSource>) -> AuditRecord {
        // The record's id ties its log lines to it, like a request's.
        let request_id = crate::random::random_hex(16).unwrap_or_else(|_| "config-reload".into());
        let mut record = AuditRecord::new(event::CONFIG_RELOADED, outcome, &request_id, self.clock.now());
        record.identity_verified = false;
        record.details = json!({
            "trigger": trigger.as_str(),
            "file": source.map(|s| s.path().display().to_string()),
        });
        record
    }
}

/// `new` as it is applied over `running`: its reloaded sections, and
/// `running`'s for everything else (those take a restart).
fn applied_config(running: &Config, new: Config) -> Config {
    let mut applied = running.clone();
    applied.clusters = new.clusters;
    applied.clusters_dir = new.clusters_dir;
    applied.policy_examples = new.policy_examples;
    applied.auditors = new.auditors;
    applied.admins = new.admins;
    applied.rate_limits = new.rate_limits;
    applied.document = crate::config::Document(section_swapped(&running.document, &new.document));
    applied.fingerprint = new.fingerprint;
    applied
}

/// `running`'s document with the reloaded sections taken from `new`, so
/// that the next reload compares against what is served.
fn section_swapped(running: &Value, new: &Value) -> Value {
    let mut document = running.clone();
    if let Value::Mapping(map) = &mut document {
        for section in RELOADED_SECTIONS {
            let key = Value::String(section.into());
            match new.get(section) {
                Some(value) => {
                    map.insert(key, value.clone());
                }
                None => {
                    map.remove(&key);
                }
            }
        }
    }
    document
}

/// A gateway's listener, serving certificate and client CA are bound at
/// start: a reload that adds, removes or moves one, or changes the CA whose
/// certificates it admits, is refused (people would get certificates the
/// running gateway does not accept). Its rules, upstreams and examples
/// reload.
fn refuse_gateway_listener_change(current: &Settings, new: &Clusters) -> Result<(), ReloadError> {
    let names: BTreeSet<&String> = current.clusters.keys().chain(new.keys()).collect();
    for name in names {
        let before = current.clusters.get(name).and_then(|c| c.gateway.as_ref());
        let after = new.get(name).and_then(|c| c.gateway.as_ref());
        let bound = |g: &crate::cluster::ClusterGateway| {
            (
                g.config.listen,
                g.config.tls.clone(),
                g.client_ca.signer().der.clone(),
            )
        };
        let same = match (before, after) {
            (None, None) => true,
            (Some(before), Some(after)) => {
                let (listen, tls, ca) = bound(before);
                let (new_listen, new_tls, new_ca) = bound(after);
                listen == new_listen
                    && ca == new_ca
                    && (tls.cert_file, tls.key_file, tls.ca_file)
                        == (new_tls.cert_file, new_tls.key_file, new_tls.ca_file)
            }
            _ => false,
        };
        if !same {
            return Err(ReloadError::Config(ConfigError::Invalid(format!(
                "cluster `{name}`: the gateway's listener, serving certificate or client CA changed; \
                 these are read at start only: restart the server to apply them"
            ))));
        }
    }
    Ok(())
}

/// What changed between the running configuration and the new one.
fn changes(running: &Config, current: &Settings, new: &Config, clusters: &Clusters) -> Changes {
    let before: BTreeSet<&String> = current.clusters.keys().collect();
    let after: BTreeSet<&String> = clusters.keys().collect();
    let cluster_document =
        |config: &Config, name: &str| config.document.get("clusters").and_then(|c| c.get(name)).cloned();
    let clusters_changed = before
        .intersection(&after)
        .filter(|name| {
            let (old, new_cluster) = (&current.clusters[name.as_str()], &clusters[name.as_str()]);
            cluster_document(running, name) != cluster_document(new, name)
                || old.ca.signer().der != new_cluster.ca.signer().der
                || old.next_ca.as_ref().map(|n| &n.ca.signer().der)
                    != new_cluster.next_ca.as_ref().map(|n| &n.ca.signer().der)
                || old.ca.trust_bundle_pem() != new_cluster.ca.trust_bundle_pem()
        })
        .map(|name| name.to_string())
        .collect();
    let sections_changed = RELOADED_BESIDES_CLUSTERS
        .into_iter()
        .filter(|section| running.document.get(section) != new.document.get(section))
        .map(str::to_owned)
        .collect();
    let keys = |document: &Value| -> BTreeSet<String> {
        document
            .as_mapping()
            .map(|m| m.keys().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let restart_required = keys(&running.document)
        .union(&keys(&new.document))
        .filter(|section| !RELOADED_SECTIONS.contains(&section.as_str()))
        .filter(|section| running.document.get(section.as_str()) != new.document.get(section.as_str()))
        .cloned()
        .collect();
    Changes {
        clusters_added: after.difference(&before).map(|n| n.to_string()).collect(),
        clusters_removed: before.difference(&after).map(|n| n.to_string()).collect(),
        clusters_changed,
        sections_changed,
        restart_required,
    }
}
