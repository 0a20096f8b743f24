//! The running server's state, built from a [`Config`]: each cluster's CA and
//! policy, the trusted identity issuers, the audit writer, the clock.
//!
//! Building refuses anything that would make the server unsafe or useless at
//! its first request (CA material, rules, policy examples, the provider,
//! the database), with a message that names what to fix.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use time::OffsetDateTime;

use crate::audit::store::{AuditStore, StoreOptions};
use crate::audit::writer::AuditWriter;
use crate::ca::{CaOptions, CaWarning, CertificateAuthority};
use crate::config::{ClusterConfig, Config, ConfigError};
use crate::identity::authenticator::Authenticator;
use crate::policy::ClusterPolicy;

/// Time, injectable: certificates are five minutes long and the edges matter.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> OffsetDateTime;
}

#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }
}

/// One cluster, ready to sign.
#[derive(Debug)]
pub struct Cluster {
    pub name: String,
    pub config: ClusterConfig,
    pub ca: CertificateAuthority,
    pub policy: ClusterPolicy,
}

impl Cluster {
    pub fn context_name(&self) -> String {
        self.config.context.clone().unwrap_or_else(|| self.name.clone())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cluster `{cluster}`: {message}")]
    Cluster { cluster: String, message: String },
    #[error("{0}")]
    PolicyExample(String),
    #[error("identity provider: {0}")]
    Provider(String),
    #[error("audit database: {0}")]
    Database(String),
    #[error("TLS certificate {} / key {}: {error}", .cert_file.display(), .key_file.display())]
    Tls {
        cert_file: std::path::PathBuf,
        key_file: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("cannot listen on {address}: {error}")]
    Listen {
        address: std::net::SocketAddr,
        error: std::io::Error,
    },
}

/// Clusters by name.
pub type Clusters = BTreeMap<String, Cluster>;

/// CA warnings with the cluster they concern.
pub type ClusterWarnings = Vec<(String, CaWarning)>;

/// Clusters with their CAs and policies, checked. Shared by `serve`,
/// `check` and `break-glass`.
pub fn load_clusters(
    config: &Config,
    now: OffsetDateTime,
) -> Result<(Clusters, ClusterWarnings), StartError> {
    let mut clusters = BTreeMap::new();
    let mut warnings = Vec::new();
    for (name, cluster_config) in &config.clusters {
        let fail = |message: String| StartError::Cluster {
            cluster: name.clone(),
            message,
        };
        let options = CaOptions {
            accepted_cas: cluster_config.accepted_cas.clone(),
            allow_insecure_key_permissions: cluster_config.ca.allow_insecure_key_permissions,
        };
        let source = cluster_config.ca.source()?;
        let ca = CertificateAuthority::load(&source, &options, now)
            .map_err(|e| fail(format!("CA refused [{}]: {e}", e.code())))?;
        warnings.extend(ca.warnings().iter().cloned().map(|w| (name.clone(), w)));
        let policy = ClusterPolicy::new(cluster_config.policy()).map_err(|e| fail(e.to_string()))?;
        clusters.insert(
            name.clone(),
            Cluster {
                name: name.clone(),
                config: cluster_config.clone(),
                ca,
                policy,
            },
        );
    }
    for example in &config.policy_examples {
        let cluster = clusters
            .get(&example.cluster)
            .ok_or_else(|| StartError::PolicyExample(format!("unknown cluster `{}`", example.cluster)))?;
        cluster
            .policy
            .check_example(example)
            .map_err(|e| StartError::PolicyExample(format!("cluster `{}`: {e}", example.cluster)))?;
    }
    Ok((clusters, warnings))
}

/// Everything a request needs.
#[derive(Debug)]
pub struct App {
    pub config: Config,
    pub clusters: Clusters,
    pub authenticator: Authenticator,
    pub audit: AuditWriter,
    pub clock: Arc<dyn Clock>,
    pub rate_limits: crate::ratelimit::RateLimits,
    /// Unauthenticated and rate-limited refusals, counted per window.
    pub refusals: crate::refusals::Refusals,
    pub metrics: crate::metrics::Metrics,
    /// The audit streams running (`GET /v1/audit/stream`).
    pub feeds: crate::http::feed::Feeds,
}

/// Tasks started with the app; [`crate::server::Server`] stops them at
/// shutdown, the audit writer last.
#[derive(Debug)]
pub struct Background {
    pub audit_writer: tokio::task::JoinHandle<()>,
    pub key_refresher: tokio::task::JoinHandle<()>,
    pub rate_limit_janitor: tokio::task::JoinHandle<()>,
    /// Closes each refusal window and records its counts.
    pub refusal_recorder: tokio::task::JoinHandle<()>,
}

/// Discover every issuer the configuration trusts and fetch their keys
/// (and Graph clients, for Entra issuers that have them).
pub async fn authenticator(
    config: &Config,
    relevant_groups: impl IntoIterator<Item = String>,
) -> Result<Authenticator, StartError> {
    Authenticator::discover(&config.identity, relevant_groups)
        .await
        .map_err(|e| StartError::Provider(e.to_string()))
}

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
        store
            .migrate()
            .await
            .map_err(|e| StartError::Database(e.to_string()))?;
    }
    Ok(store)
}

impl App {
    pub async fn build(config: Config, clock: Arc<dyn Clock>) -> Result<(Arc<Self>, Background), StartError> {
        let (clusters, warnings) = load_clusters(&config, clock.now())?;
        for (cluster, warning) in &warnings {
            tracing::warn!(cluster = %cluster, "{warning}");
        }
        for warning in config.warnings() {
            tracing::warn!("{warning}");
        }
        // Groups any decision looks at: the rules', the auditors', the admins'.
        let relevant_groups: Vec<String> = clusters
            .values()
            .flat_map(|c| c.policy.referenced_groups().map(str::to_owned))
            .chain(config.auditors.groups.iter().cloned())
            .chain(config.admins.groups.iter().cloned())
            .collect();
        let authenticator = authenticator(&config, relevant_groups).await?;
        let key_refresher = authenticator.spawn_refreshers(config.identity.jwks_refresh_period);
        let providers: Vec<_> = authenticator
            .issuers()
            .map(|issuer| issuer.provider().clone())
            .collect();
        let store = open_store(&config, config.database.migrate_on_start.unwrap_or(true)).await?;
        tracing::info!(
            store = store.kind(),
            clusters = clusters.len(),
            "talos-sso-server ready"
        );
        let (audit, audit_writer) = AuditWriter::start(store);
        let rate_limits = crate::ratelimit::RateLimits::new(&config.rate_limits);
        let audit_stats = audit.stats().clone();
        let metrics = crate::metrics::Metrics::with_sources(crate::metrics::Sources {
            audit_write_failures: Box::new(move || audit_stats.failures.load(Ordering::Relaxed)),
            jwks_refreshes: Box::new(move || {
                crate::identity::provider::total_refresh_counts(providers.iter().map(AsRef::as_ref))
            }),
            ca_not_after: clusters
                .iter()
                .map(|(name, cluster)| (name.clone(), cluster.ca.signer().not_after().unix_timestamp()))
                .collect(),
        });
        let refusals = crate::refusals::Refusals::new(config.audit.refusals.clone());
        let config_feed = config.audit.feed.clone();
        let app = Arc::new(Self {
            config,
            clusters,
            authenticator,
            audit,
            clock,
            rate_limits,
            refusals,
            metrics,
            feeds: crate::http::feed::Feeds::new(&config_feed),
        });
        // Forget idle rate-limit keys every minute; the task ends with the app.
        let weak = Arc::downgrade(&app);
        let rate_limit_janitor = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(60)).await;
                let Some(app) = weak.upgrade() else { return };
                app.rate_limits.forget_idle();
            }
        });
        let weak = Arc::downgrade(&app);
        let window = app.refusals.window();
        let refusal_recorder = tokio::spawn(async move {
            loop {
                tokio::time::sleep(window).await;
                let Some(app) = weak.upgrade() else { return };
                app.record_refusals().await;
            }
        });
        Ok((
            app,
            Background {
                audit_writer,
                key_refresher,
                rate_limit_janitor,
                refusal_recorder,
            },
        ))
    }

    /// Close the current refusal window and record its counts (also at
    /// shutdown, so that a stopping server loses none).
    pub async fn record_refusals(&self) {
        let mut appends = tokio::task::JoinSet::new();
        for record in self.refusals.close_window(self.clock.now()) {
            let writer = self.audit.clone();
            appends.spawn(async move {
                writer
                    .append(crate::audit::store::Append {
                        record,
                        ..Default::default()
                    })
                    .await
            });
        }
        while let Some(done) = appends.join_next().await {
            if !matches!(done, Ok(Ok(_))) {
                tracing::error!("refusal counts could not be recorded");
            }
        }
    }
}
