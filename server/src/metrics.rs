//! Prometheus metrics, served as OpenMetrics text on `GET /metrics`:
//! certificates issued (by cluster and role), requests denied (by cluster
//! and reason), issuance latency, audit write failures, identity provider key
//! refreshes, and each cluster's CA expiry time. Counters kept elsewhere as
//! plain atomics (the audit writer, the provider) are brought up to date at
//! scrape time, so those modules know nothing about Prometheus.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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

#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    pub issued: Family<IssuedLabels, Counter>,
    pub denied: Family<DeniedLabels, Counter>,
    pub issuance_seconds: Histogram,
    audit_write_failures: Counter,
    jwks_refreshes: Family<ResultLabels, Counter>,
    ca_not_after: Family<ClusterLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let metrics = Self {
            registry: Mutex::new(Registry::with_prefix("talos_sso")),
            issued: Family::default(),
            denied: Family::default(),
            // 0.5 ms .. about 4 s.
            issuance_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            audit_write_failures: Counter::default(),
            jwks_refreshes: Family::default(),
            ca_not_after: Family::default(),
        };
        if let Ok(mut registry) = metrics.registry.lock() {
            registry.register(
                "certificates_issued",
                "Certificates issued, by cluster and role",
                metrics.issued.clone(),
            );
            registry.register(
                "requests_denied",
                "Certificate requests denied, by cluster and reason",
                metrics.denied.clone(),
            );
            registry.register(
                "issuance_seconds",
                "Time to answer a certificate request, audit commit included",
                metrics.issuance_seconds.clone(),
            );
            registry.register(
                "audit_write_failures",
                "Audit transactions that failed (their requests were refused)",
                metrics.audit_write_failures.clone(),
            );
            registry.register(
                "jwks_refreshes",
                "Identity provider key set refreshes, by result",
                metrics.jwks_refreshes.clone(),
            );
            registry.register(
                "ca_not_after_timestamp_seconds",
                "When each cluster's signing CA expires (Unix time)",
                metrics.ca_not_after.clone(),
            );
        }
        metrics
    }

    /// Bring the counters kept elsewhere up to date, then encode.
    pub fn render(&self, app: &crate::app::App) -> String {
        let failures = app
            .audit
            .stats()
            .failures
            .load(std::sync::atomic::Ordering::Relaxed);
        catch_up(&self.audit_write_failures, failures);
        let (ok, failed) = app.authenticator.refresh_counts();
        catch_up(
            &self
                .jwks_refreshes
                .get_or_create(&ResultLabels { result: "ok".into() }),
            ok,
        );
        catch_up(
            &self.jwks_refreshes.get_or_create(&ResultLabels {
                result: "failed".into(),
            }),
            failed,
        );
        for (name, cluster) in &app.clusters {
            let not_after = cluster.ca.signer().not_after().unix_timestamp();
            self.ca_not_after
                .get_or_create(&ClusterLabels {
                    cluster: name.clone(),
                })
                .set(not_after);
        }
        let mut text = String::new();
        if let Ok(registry) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        }
        text
    }
}

/// Counters only go up: add what the source counted since the last scrape.
fn catch_up(counter: &Counter, total: u64) {
    let seen = counter.get();
    if total > seen {
        counter.inc_by(total - seen);
    }
}
