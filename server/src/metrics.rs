//! Prometheus metrics, served as OpenMetrics text on `GET /metrics`:
//! certificates issued (by cluster and role), requests denied (by cluster
//! and reason), issuance latency, audit write failures, identity provider key
//! refreshes, signatures a CA's PKCS#11 token could not make, and each
//! cluster's CA expiry time. Counters kept elsewhere as
//! plain atomics (the audit writer, the provider) are read at scrape time
//! through the [`Sources`] the server hands over when it builds the metrics:
//! those modules know nothing about Prometheus, and this one nothing about
//! them.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IssuedLabels {
    pub cluster: String,
    pub role: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeniedLabels {
    pub cluster: String,
    pub reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

/// What the metrics read from the rest of the server.
pub struct Sources {
    /// Audit transactions that failed so far.
    pub audit_write_failures: Box<dyn Fn() -> u64 + Send + Sync>,
    /// Identity provider key set refreshes so far: (succeeded, failed).
    pub jwks_refreshes: Box<dyn Fn() -> (u64, u64) + Send + Sync>,
    /// Audit checkpoints signed, failed, refused by the webhook, and the
    /// last one's `seq` and time; `None` when none are signed.
    pub checkpoints: Option<std::sync::Arc<crate::audit::checkpoint::CheckpointStats>>,
    /// Configuration reloads so far.
    pub reloads: std::sync::Arc<crate::reload::ReloadStats>,
    /// Each cluster's signing CA expiry (Unix time), by cluster name, as
    /// the clusters are now (a reload may change them).
    pub ca_not_after: Box<dyn Fn() -> Vec<(String, i64)> + Send + Sync>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("reloads", &self.reloads)
            .finish_non_exhaustive()
    }
}

/// Encodes [`Sources`] at each scrape, after the metrics kept here. The
/// registry ends the help of the metrics registered with it with a period;
/// these are written with theirs.
impl Collector for Sources {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let failures = ConstCounter::new((self.audit_write_failures)());
        failures.encode(encoder.encode_descriptor(
            "audit_write_failures",
            "Audit transactions that failed (their requests were refused).",
            None,
            MetricType::Counter,
        )?)?;
        let mut refreshes = encoder.encode_descriptor(
            "jwks_refreshes",
            "Identity provider key set refreshes, by result.",
            None,
            MetricType::Counter,
        )?;
        let (ok, failed) = (self.jwks_refreshes)();
        for (result, count) in [("ok", ok), ("failed", failed)] {
            let labels = ResultLabels {
                result: result.into(),
            };
            ConstCounter::new(count).encode(refreshes.encode_family(&labels)?)?;
        }
        if let Some(stats) = &self.checkpoints {
            encode_checkpoint_stats(stats, &mut encoder)?;
        }
        encode_reload_stats(&self.reloads, &mut encoder)?;
        let ca_not_after = (self.ca_not_after)();
        if ca_not_after.is_empty() {
            return Ok(());
        }
        let mut expiry = encoder.encode_descriptor(
            "ca_not_after_timestamp_seconds",
            "When each cluster's signing CA expires (Unix time).",
            None,
            MetricType::Gauge,
        )?;
        for (cluster, not_after) in &ca_not_after {
            let labels = ClusterLabels {
                cluster: cluster.clone(),
            };
            ConstGauge::new(*not_after).encode(expiry.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

fn encode_reload_stats(
    stats: &crate::reload::ReloadStats,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut reloads = encoder.encode_descriptor(
        "config_reloads",
        "Configuration reloads (SIGHUP or a changed file), by result.",
        None,
        MetricType::Counter,
    )?;
    for (result, count) in [("ok", &stats.succeeded), ("failed", &stats.failed)] {
        let labels = ResultLabels {
            result: result.into(),
        };
        ConstCounter::new(count.load(Relaxed)).encode(reloads.encode_family(&labels)?)?;
    }
    encode_gauges(
        encoder,
        [
            (
                "config_last_reload_successful",
                "Whether the last configuration reload was applied (1) or refused (0).",
                &stats.last_successful,
            ),
            (
                "config_last_reload_success_timestamp_seconds",
                "When a configuration was last loaded, at start or by a reload (Unix time).",
                &stats.last_success_at,
            ),
        ],
    )
}

/// Gauges without labels, read from atomics: (name, help, value).
fn encode_gauges<'a>(
    encoder: &mut DescriptorEncoder,
    gauges: impl IntoIterator<Item = (&'a str, &'a str, &'a std::sync::atomic::AtomicI64)>,
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in gauges {
        ConstGauge::new(value.load(std::sync::atomic::Ordering::Relaxed))
            .encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
    }
    Ok(())
}

fn encode_checkpoint_stats(
    stats: &crate::audit::checkpoint::CheckpointStats,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use std::sync::atomic::Ordering::Relaxed;
    for (name, help, value) in [
        (
            "audit_checkpoints_signed",
            "Audit checkpoints signed and published.",
            &stats.signed,
        ),
        (
            "audit_checkpoint_failures",
            "Audit checkpoints that could not be signed or written (the head stays unsigned until the next).",
            &stats.failures,
        ),
        (
            "audit_checkpoint_webhook_failures",
            "Audit checkpoints the webhook did not take.",
            &stats.webhook_failures,
        ),
    ] {
        ConstCounter::new(value.load(Relaxed)).encode(encoder.encode_descriptor(
            name,
            help,
            None,
            MetricType::Counter,
        )?)?;
    }
    encode_gauges(
        encoder,
        [
            (
                "audit_checkpoint_last_seq",
                "The last record the last audit checkpoint covers.",
                &stats.last_seq,
            ),
            (
                "audit_checkpoint_last_timestamp_seconds",
                "When the last audit checkpoint was signed (Unix time).",
                &stats.last_signed_at,
            ),
        ],
    )
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub issued: Family<IssuedLabels, Counter>,
    pub denied: Family<DeniedLabels, Counter>,
    pub issuance_seconds: Histogram,
    /// Signatures a cluster's PKCS#11 token could not make (each refused
    /// with `signing_unavailable`).
    pub signing_unavailable: Family<ClusterLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// What requests count, alone: for a one-off command, never scraped.
    pub fn new() -> Self {
        let issued = Family::default();
        let denied = Family::default();
        // 0.5 ms .. about 4 s.
        let issuance_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        let mut registry = Registry::with_prefix("talos_sso");
        registry.register(
            "certificates_issued",
            "Certificates issued, by cluster and role",
            issued.clone(),
        );
        registry.register(
            "requests_denied",
            "Certificate requests denied, by cluster and reason",
            denied.clone(),
        );
        registry.register(
            "issuance_seconds",
            "Time to answer a certificate request, audit commit included",
            issuance_seconds.clone(),
        );
        let signing_unavailable = Family::default();
        registry.register(
            "signing_unavailable",
            "Signatures the CA's PKCS#11 token could not make, by cluster",
            signing_unavailable.clone(),
        );
        Self {
            registry,
            issued,
            denied,
            issuance_seconds,
            signing_unavailable,
        }
    }

    /// What requests count, and what the rest of the server keeps, read at
    /// each scrape: the server's metrics.
    pub fn with_sources(sources: Sources) -> Self {
        let mut metrics = Self::new();
        metrics.registry.register_collector(Box::new(sources));
        metrics
    }

    /// The OpenMetrics text.
    pub fn render(&self) -> String {
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_kept_elsewhere_are_read_at_each_scrape() {
        let metrics = Metrics::with_sources(Sources {
            audit_write_failures: Box::new(|| 2),
            jwks_refreshes: Box::new(|| (3, 1)),
            checkpoints: None,
            reloads: std::sync::Arc::new(crate::reload::ReloadStats {
                succeeded: 4.into(),
                failed: 1.into(),
                last_successful: 0.into(),
                last_success_at: 1_700_000_000.into(),
            }),
            ca_not_after: Box::new(|| {
                vec![("prod".into(), 1_900_000_000), ("staging".into(), 1_800_000_000)]
            }),
        });
        metrics
            .issued
            .get_or_create(&IssuedLabels {
                cluster: "prod".into(),
                role: "os:reader".into(),
            })
            .inc();
        let text = metrics.render();
        assert!(
            text.starts_with(
                "# HELP talos_sso_certificates_issued Certificates issued, by cluster and role.\n\
                 # TYPE talos_sso_certificates_issued counter\n\
                 talos_sso_certificates_issued_total{cluster=\"prod\",role=\"os:reader\"} 1\n"
            ),
            "{text}"
        );
        let collected = text
            .find("# HELP talos_sso_audit_write_failures")
            .map(|at| &text[at..]);
        assert_eq!(
            collected,
            Some(
                "# HELP talos_sso_audit_write_failures Audit transactions that failed (their requests were refused).\n\
                 # TYPE talos_sso_audit_write_failures counter\n\
                 talos_sso_audit_write_failures_total 2\n\
                 # HELP talos_sso_jwks_refreshes Identity provider key set refreshes, by result.\n\
                 # TYPE talos_sso_jwks_refreshes counter\n\
                 talos_sso_jwks_refreshes_total{result=\"ok\"} 3\n\
                 talos_sso_jwks_refreshes_total{result=\"failed\"} 1\n\
                 # HELP talos_sso_config_reloads Configuration reloads (SIGHUP or a changed file), by result.\n\
                 # TYPE talos_sso_config_reloads counter\n\
                 talos_sso_config_reloads_total{result=\"ok\"} 4\n\
                 talos_sso_config_reloads_total{result=\"failed\"} 1\n\
                 # HELP talos_sso_config_last_reload_successful Whether the last configuration reload was applied (1) or refused (0).\n\
                 # TYPE talos_sso_config_last_reload_successful gauge\n\
                 talos_sso_config_last_reload_successful 0\n\
                 # HELP talos_sso_config_last_reload_success_timestamp_seconds When a configuration was last loaded, at start or by a reload (Unix time).\n\
                 # TYPE talos_sso_config_last_reload_success_timestamp_seconds gauge\n\
                 talos_sso_config_last_reload_success_timestamp_seconds 1700000000\n\
                 # HELP talos_sso_ca_not_after_timestamp_seconds When each cluster's signing CA expires (Unix time).\n\
                 # TYPE talos_sso_ca_not_after_timestamp_seconds gauge\n\
                 talos_sso_ca_not_after_timestamp_seconds{cluster=\"prod\"} 1900000000\n\
                 talos_sso_ca_not_after_timestamp_seconds{cluster=\"staging\"} 1800000000\n\
                 # EOF\n"
            ),
            "{text}"
        );
    }
}
