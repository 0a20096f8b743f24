//! The composition root: the running server's state, built from a
//! [`Config`]: each cluster's CA and policy, the trusted identity issuers,
//! the audit writer, the clock; and a reload applied to it (`reload`).
//!
//! Building refuses anything that would make the server unsafe or useless at
//! its first request (the domains' checks of the configuration, CA
//! material, rules, policy examples, the provider, the database), with a
//! message that names what to fix.

mod check;
mod feeds;
mod readiness;
pub mod reload;
mod store;

pub use check::check;
pub use feeds::Feeds;
pub use readiness::ReadinessCache;
pub use store::{migrate_store, open_serving_store, open_store, owner_warning, require_current_schema};

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use time::OffsetDateTime;

use crate::audit::checkpoint::Checkpoints;
use crate::audit::writer::AuditWriter;
use crate::cluster::{ClusterError, Clusters, load_clusters};
use crate::config::{Config, ConfigError};
use crate::identity::authenticator::{Authenticator, RelevantGroups};

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

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A cluster's CA or policy, or a policy example.
    #[error(transparent)]
    Clusters(ClusterError),
    #[error("identity provider: {0}")]
    Provider(String),
    #[error("audit database: {0}")]
    Database(String),
    #[error("audit checkpoints: {0}")]
    Checkpoints(String),
    #[error("console: {0}")]
    Console(String),
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
    /// A gateway's serving certificate or listener (the message names the
    /// cluster).
    #[error("{0}")]
    Gateway(String),
}

impl From<ClusterError> for StartError {
    /// A configuration error stays one, whoever found it.
    fn from(error: ClusterError) -> Self {
        match error {
            ClusterError::Config(error) => StartError::Config(error),
            other => StartError::Clusters(other),
        }
    }
}

/// What a configuration reload replaces, swapped whole: a request takes it
/// once and decides with one consistent configuration
/// ([`reload`]).
#[derive(Debug)]
pub struct Settings {
    /// The configuration being served: as the server started, with the
    /// sections a reload applies as last reloaded.
    pub config: Config,
    pub clusters: Clusters,
    pub rate_limits: Arc<crate::ratelimit::RateLimits>,
    /// The groups the clusters' rules, the auditors and the admins name.
    pub relevant_groups: RelevantGroups,
}

/// The current [`Settings`], shared with what reads them from outside a
/// request (the metrics).
#[derive(Debug, Clone)]
pub struct LiveSettings(Arc<std::sync::RwLock<Arc<Settings>>>);

impl LiveSettings {
    fn new(settings: Settings) -> Self {
        Self(Arc::new(std::sync::RwLock::new(Arc::new(settings))))
    }

    pub fn get(&self) -> Arc<Settings> {
        // Nothing panics while holding the lock: it only swaps an Arc.
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn replace(&self, settings: Settings) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(settings);
    }
}

/// Everything a request needs.
#[derive(Debug)]
pub struct App {
    settings: LiveSettings,
    pub authenticator: Authenticator,
    pub audit: AuditWriter,
    pub clock: Arc<dyn Clock>,
    /// Reloads so far ([`reload`]).
    pub reloads: Arc<reload::ReloadStats>,
    /// The last `/readyz` answer, shared by the probes and the scrapes.
    pub readiness: ReadinessCache,
    /// Unauthenticated and rate-limited refusals, counted per window.
    pub refusals: crate::refusals::Refusals,
    pub metrics: crate::metrics::Metrics,
    /// Signed checkpoints of the trail, when `audit.checkpoints` is set.
    pub checkpoints: Option<Arc<Checkpoints>>,
    /// The audit streams running (`GET /v1/audit/stream`).
    pub feeds: Feeds,
    /// The chain verification running, one at a time, and the last one.
    pub verifications: Arc<crate::audit::verification::Verifications>,
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
    /// Signs a checkpoint at each `audit.checkpoints.interval`.
    pub checkpoint_signer: Option<tokio::task::JoinHandle<()>>,
}

/// Groups any decision looks at: the rules', the auditors', the admins'.
pub fn relevant_groups(config: &Config, clusters: &Clusters) -> RelevantGroups {
    RelevantGroups::new(
        clusters
            .values()
            .flat_map(|c| c.policy.referenced_groups().map(str::to_owned))
            .chain(clusters.values().flat_map(|c| {
                c.gateway
                    .iter()
                    .flat_map(|g| g.rules.referenced_groups().map(str::to_owned))
            }))
            .chain(config.auditors.groups.iter().cloned())
            .chain(config.admins.groups.iter().cloned()),
    )
}

/// Refuse a cluster whose CA key is the audit key: a CA key is held by
/// everyone who administers the cluster, the audit key by nobody else.
pub fn refuse_ca_key_as_audit_key(clusters: &Clusters, checkpoints: &Checkpoints) -> Result<(), StartError> {
    use der::Encode;
    match clusters.values().find(|c| {
        c.cas().any(|ca| {
            ca.signer()
                .spki()
                .to_der()
                .ok()
                .map(|d| talos_sso_api::chain::sha256_hex(&d))
                == Some(checkpoints.key_id().to_owned())
        })
    }) {
        Some(cluster) => Err(StartError::Checkpoints(format!(
            "audit.checkpoints.key_file is the CA key of cluster `{}`: the audit key must be a key of \
             its own (talos-sso-server audit new-key)",
            cluster.name
        ))),
        None => Ok(()),
    }
}

/// Discover every issuer the configuration trusts and fetch their keys
/// (and Graph clients, for Entra issuers that have them).
pub async fn authenticator(config: &Config) -> Result<Authenticator, StartError> {
    Authenticator::discover(&config.identity)
        .await
        .map_err(|e| StartError::Provider(e.to_string()))
}

impl App {
    /// The verification of the whole chain running now, started when none
    /// is: one at a time on this replica, whoever asks (the API, the
    /// console), each waiting for the same answer.
    pub fn verify_chain(self: &Arc<Self>) -> crate::audit::verification::Verification {
        let app = self.clone();
        let clock = self.clock.clone();
        self.verifications
            .start_or_join(self.clock.now(), move || clock.now(), async move {
                let signed = match &app.checkpoints {
                    Some(checkpoints) => Some(checkpoints.read().await),
                    None => None,
                };
                match crate::audit::checkpoint::verify_store(app.audit.store(), signed).await {
                    Ok(status) => Some(status),
                    Err(error) => {
                        tracing::warn!(%error, "the chain could not be verified");
                        None
                    }
                }
            })
    }

    /// `tls_not_after` reads the expiry of the TLS certificate served now
    /// (`None` with plain HTTP), for the metrics.
    pub async fn build(
        config: Config,
        clock: Arc<dyn Clock>,
        tls_not_after: Option<crate::metrics::Read<Option<i64>>>,
    ) -> Result<(Arc<Self>, Background), StartError> {
        check(&config)?;
        let (clusters, warnings) = load_clusters(&config, clock.now())?;
        for (cluster, warning) in &warnings {
            tracing::warn!(cluster = %cluster, "{warning}");
        }
        for warning in config.warnings() {
            tracing::warn!("{warning}");
        }
        let authenticator = authenticator(&config).await?;
        let key_refresher = authenticator.spawn_refreshers(config.identity.jwks_refresh_period);
        let providers: Vec<_> = authenticator
            .issuers()
            .map(|issuer| issuer.provider().clone())
            .collect();
        let store = open_serving_store(&config).await?;
        if let Some(notice) = config.unsigned_trail_notice() {
            tracing::warn!("{notice}");
        }
        let checkpoints = match &config.audit.checkpoints {
            Some(settings) => {
                let checkpoints =
                    Checkpoints::open(settings).map_err(|e| StartError::Checkpoints(e.to_string()))?;
                refuse_ca_key_as_audit_key(&clusters, &checkpoints)?;
                if checkpoints.last().await.is_none() {
                    let (seq, _) = store
                        .head()
                        .await
                        .map_err(|e| StartError::Database(e.to_string()))?;
                    if seq > 0 {
                        tracing::warn!(
                            target: "talos_sso::audit::checkpoint",
                            "the checkpoint file {} holds no checkpoint, while the trail holds {seq} records: they are \
                             signed from now on as they are, so check them against any older copy of the checkpoints \
                             (audit verify --checkpoints)",
                            checkpoints.file().display()
                        );
                    }
                }
                // The head found at start, signed: it also proves the key
                // and the file work before the first request, and that the
                // trail still holds what the file's last checkpoint signed.
                checkpoints
                    .publish(&store, talos_sso_api::checkpoint::trigger::START, clock.now())
                    .await
                    .map_err(|e| StartError::Checkpoints(e.to_string()))?;
                Some(Arc::new(checkpoints))
            }
            None => None,
        };
        tracing::info!(
            store = store.kind(),
            clusters = clusters.len(),
            "talos-sso-server ready"
        );
        let mut metrics = crate::metrics::Metrics::new();
        let (audit, audit_writer) = AuditWriter::start(store, Box::new(metrics.audit_commit_observer()));
        let rate_limits = Arc::new(crate::ratelimit::RateLimits::new(&config.rate_limits));
        let audit_stats = audit.stats().clone();
        let aged = providers.clone();
        let graph = authenticator.graph_stats();
        let reloads = Arc::new(reload::ReloadStats::started(clock.now()));
        let refusals = crate::refusals::Refusals::new(config.audit.refusals.clone());
        let feeds = Feeds::new(&config.audit.feed);
        let relevant_groups = relevant_groups(&config, &clusters);
        let settings = LiveSettings::new(Settings {
            config,
            clusters,
            rate_limits,
            relevant_groups,
        });
        let live = settings.clone();
        let ca_clock = clock.clone();
        metrics.add_sources(crate::metrics::Sources {
            audit_write_failures: Box::new(move || audit_stats.failures.load(Ordering::Relaxed)),
            jwks_refreshes: Box::new(move || {
                crate::identity::provider::total_refresh_counts(providers.iter().map(AsRef::as_ref))
            }),
            keys_age: Box::new(move || {
                aged.iter()
                    .map(|provider| (provider.issuer().to_owned(), provider.keys_age()))
                    .collect()
            }),
            graph_requests: Box::new(move || {
                graph
                    .iter()
                    .map(|stats| stats.counts())
                    .fold((0, 0), |(ok, failed), (o, f)| (ok + o, failed + f))
            }),
            checkpoints: checkpoints.as_ref().map(|c| c.stats.clone()),
            reloads: {
                let reloads = reloads.clone();
                Box::new(move || reloads.counts())
            },
            ca_not_after: Box::new(move || {
                live.get()
                    .clusters
                    .iter()
                    .map(|(name, cluster)| {
                        let ca = cluster.signing_ca(ca_clock.now());
                        (name.clone(), ca.signer().not_after().unix_timestamp())
                    })
                    .collect()
            }),
            tls_not_after,
        });
        metrics.know_clusters(settings.get().clusters.keys().map(String::as_str));
        let app = Arc::new(Self {
            settings,
            authenticator,
            audit,
            clock,
            reloads,
            readiness: Default::default(),
            refusals,
            metrics,
            checkpoints,
            feeds,
            verifications: crate::audit::verification::Verifications::new(),
        });
        // Forget idle rate-limit keys every minute; the task ends with the app.
        let weak = Arc::downgrade(&app);
        let rate_limit_janitor = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(60)).await;
                let Some(app) = weak.upgrade() else { return };
                app.settings().rate_limits.forget_idle();
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
        let checkpoint_signer = app.checkpoints.as_ref().map(|checkpoints| {
            let weak = Arc::downgrade(&app);
            let interval = checkpoints.interval();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(interval).await;
                    let Some(app) = weak.upgrade() else { return };
                    app.checkpoint_if_grown().await;
                }
            })
        });
        Ok((
            app,
            Background {
                audit_writer,
                key_refresher,
                rate_limit_janitor,
                refusal_recorder,
                checkpoint_signer,
            },
        ))
    }

    /// The settings being served: take them once per decision.
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.get()
    }

    /// Serve `settings` from now on (a reload).
    pub(crate) fn replace_settings(&self, settings: Settings) {
        self.settings.replace(settings);
    }

    /// Sign the head when the trail grew since the last checkpoint; a
    /// failure is logged and counted (`talos_sso_audit_checkpoint_failures`),
    /// and the next interval tries again.
    pub async fn checkpoint_if_grown(&self) {
        let Some(checkpoints) = &self.checkpoints else {
            return;
        };
        let trigger = talos_sso_api::checkpoint::trigger::INTERVAL;
        if let Err(error) = checkpoints
            .publish_if_grown(self.audit.store(), trigger, self.clock.now())
            .await
        {
            tracing::error!(target: "talos_sso::audit::checkpoint", "no audit checkpoint signed: {error}");
        }
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
