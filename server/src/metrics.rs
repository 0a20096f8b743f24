//! Prometheus metrics, served as OpenMetrics text on `GET /metrics` (on the
//! main port, or on `metrics.listen` alone): the build, certificates issued
//! (by cluster) and the roles they grant (by cluster and role), requests
//! denied (by cluster and reason), issuance latency, every HTTP request's
//! latency (by route template and status class), requests refused by a
//! rate limit, the audit writer's batches, identity provider key
//! refreshes and key age, Microsoft Graph lookups, signatures a CA's
//! PKCS#11 token could not make, the server's TLS certificate expiry, each
//! cluster's CA expiry, and readiness. docs/operations.md lists them.
//!
//! Labels take only configured values (cluster, role and issuer names) or
//! the server's own fixed codes, never request input: a request to a path
//! nobody configured is `route="unmatched"`, a cluster nobody configured
//! `cluster="unknown"`, so no request can add a series.
//!
//! Counters kept elsewhere as plain atomics (the audit writer, the
//! providers, Graph, the TLS files) are read at scrape time through the
//! [`Sources`] the server hands over when it builds the metrics: those
//! modules know nothing about Prometheus, and this one nothing about them.

use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A value read at each scrape.
pub type Read<T> = Box<dyn Fn() -> T + Send + Sync>;

/// The route label of a request no route matched.
pub const UNMATCHED_ROUTE: &str = "unmatched";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
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
struct HttpLabels {
    /// A route template of the router, or [`UNMATCHED_ROUTE`].
    route: String,
    status_class: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    limit: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    revision: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IssuerLabels {
    issuer: String,
}

/// What the metrics read from the rest of the server.
pub struct Sources {
    /// Audit transactions that failed so far.
    pub audit_write_failures: Read<u64>,
    /// Identity provider key set refreshes so far: (succeeded, failed).
    pub jwks_refreshes: Read<(u64, u64)>,
    /// How long ago each issuer's key set was last fetched, by the
    /// configured issuer.
    pub keys_age: Read<Vec<(String, Duration)>>,
    /// Microsoft Graph lookups so far: (succeeded, failed).
    pub graph_requests: Read<(u64, u64)>,
    /// Audit checkpoints signed, failed, refused by the webhook, and the
    /// last one's `seq` and time; `None` when none are signed.
    pub checkpoints: Option<std::sync::Arc<crate::audit::checkpoint::CheckpointStats>>,
    /// Configuration reloads so far.
    pub reloads: Read<ReloadCounts>,
    /// Each cluster's signing CA expiry (Unix time), by cluster name, as
    /// the clusters are now (a reload may change them).
    pub ca_not_after: Box<dyn Fn() -> Vec<(String, i64)> + Send + Sync>,
    /// The expiry (Unix time) of the TLS certificate the server presents
    /// now (it follows reloads); `None` with plain HTTP.
    pub tls_not_after: Option<Read<Option<i64>>>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("reloads", &(self.reloads)())
            .finish_non_exhaustive()
    }
}

/// Configuration reloads so far, as the metrics show them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReloadCounts {
    pub succeeded: u64,
    pub failed: u64,
    /// 1 when the last attempt was applied (or none was made), else 0.
    pub last_successful: i64,
    /// When a configuration was last loaded (Unix time): the start counts.
    pub last_success_at: i64,
}

fn encode_results(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    (ok, failed): (u64, u64),
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (result, count) in [("ok", ok), ("failed", failed)] {
        let labels = ResultLabels {
            result: result.into(),
        };
        ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
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
        encode_results(
            &mut encoder,
            "jwks_refreshes",
            "Identity provider key set refreshes, by result.",
            (self.jwks_refreshes)(),
        )?;
        let ages = (self.keys_age)();
        if !ages.is_empty() {
            let mut family = encoder.encode_descriptor(
                "identity_provider_keys_age_seconds",
                "Seconds since each identity provider's key set was last fetched successfully, by configured issuer.",
                None,
                MetricType::Gauge,
            )?;
            for (issuer, age) in ages {
                let labels = IssuerLabels { issuer };
                ConstGauge::new(age.as_secs_f64()).encode(family.encode_family(&labels)?)?;
            }
        }
        encode_results(
            &mut encoder,
            "graph_requests",
            "Microsoft Graph group lookups (token group overage), by result.",
            (self.graph_requests)(),
        )?;
        if let Some(stats) = &self.checkpoints {
            encode_checkpoint_stats(stats, &mut encoder)?;
        }
        encode_reload_counts((self.reloads)(), &mut encoder)?;
        if let Some(not_after) = self.tls_not_after.as_ref().and_then(|read| read()) {
            ConstGauge::new(not_after).encode(encoder.encode_descriptor(
                "tls_certificate_not_after_timestamp_seconds",
                "When the TLS certificate the server presents expires (Unix time).",
                None,
                MetricType::Gauge,
            )?)?;
        }
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

fn encode_reload_counts(
    counts: ReloadCounts,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    encode_results(
        encoder,
        "config_reloads",
        "Configuration reloads (SIGHUP or a changed file), by result.",
        (counts.succeeded, counts.failed),
    )?;
    for (name, help, value) in [
        (
            "config_last_reload_successful",
            "Whether the last configuration reload was applied (1) or refused (0).",
            counts.last_successful,
        ),
        (
            "config_last_reload_success_timestamp_seconds",
            "When a configuration was last loaded, at start or by a reload (Unix time).",
            counts.last_success_at,
        ),
    ] {
        ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
    }
    Ok(())
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

/// Buckets of every latency: 0.5 ms doubling to about 16 s (past the
/// default request timeout of 15 s).
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// `2xx` and so on; the classes are fixed, whatever the code.
fn status_class(status: u16) -> &'static str {
    match status / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// One per certificate issued, by cluster.
    certificates_issued: Family<ClusterLabels, Counter>,
    /// One per role of each certificate issued, by cluster and role.
    role_grants: Family<RoleLabels, Counter>,
    pub denied: Family<DeniedLabels, Counter>,
    pub issuance_duration: Histogram,
    /// Signatures a cluster's PKCS#11 token could not make (each refused
    /// with `signing_unavailable`).
    pub signing_unavailable: Family<ClusterLabels, Counter>,
    http_requests: Family<HttpLabels, Histogram, fn() -> Histogram>,
    rate_limited: Family<LimitLabels, Counter>,
    audit_batch_records: Histogram,
    audit_commit_duration: Histogram,
    /// The `/readyz` checks, set by the scrape that renders it.
    ready: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// What requests count, alone: for a one-off command, never scraped.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("talos_sso");
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: crate::VERSION,
                revision: crate::REVISION,
            })
            .set(1);
        registry.register(
            "build_info",
            "The running server's version and source revision (always 1)",
            build,
        );
        let certificates_issued = Family::default();
        registry.register(
            "certificates_issued",
            "Certificates issued, by cluster",
            certificates_issued.clone(),
        );
        let role_grants = Family::default();
        registry.register(
            "role_grants",
            "Roles granted in issued certificates (one per role of each certificate), by cluster and role",
            role_grants.clone(),
        );
        let denied = Family::default();
        registry.register(
            "requests_denied",
            "Certificate requests denied, by cluster and reason",
            denied.clone(),
        );
        let issuance_duration = latency();
        registry.register(
            "issuance_duration_seconds",
            "Time to answer a certificate request, audit commit included",
            issuance_duration.clone(),
        );
        let signing_unavailable = Family::default();
        registry.register(
            "signing_unavailable",
            "Signatures the CA's PKCS#11 token could not make, by cluster",
            signing_unavailable.clone(),
        );
        let http_requests = Family::new_with_constructor(latency as fn() -> Histogram);
        registry.register(
            "http_request_duration_seconds",
            "Time from a request to its answer's head, by route template and status class",
            http_requests.clone(),
        );
        let rate_limited = Family::default();
        registry.register(
            "rate_limited",
            "Requests refused by a rate limit, by limit",
            rate_limited.clone(),
        );
        let audit_batch_records = Histogram::new(exponential_buckets(
            1.0,
            2.0,
            crate::audit::writer::MAX_BATCH.ilog2() as u16 + 1,
        ));
        registry.register(
            "audit_batch_records",
            "Records per audit batch transaction (group commit)",
            audit_batch_records.clone(),
        );
        let audit_commit_duration = latency();
        registry.register(
            "audit_commit_duration_seconds",
            "Time of one audit batch transaction, committed or not",
            audit_commit_duration.clone(),
        );
        let ready = Gauge::default();
        registry.register(
            "ready",
            "Whether the /readyz checks pass (1) or not (0), at the time of the scrape",
            ready.clone(),
        );
        Self {
            registry,
            certificates_issued,
            role_grants,
            denied,
            issuance_duration,
            signing_unavailable,
            http_requests,
            rate_limited,
            audit_batch_records,
            audit_commit_duration,
            ready,
        }
    }

    /// Add what the rest of the server keeps, read at each scrape: the
    /// server's metrics.
    pub fn add_sources(&mut self, sources: Sources) {
        self.registry.register_collector(Box::new(sources));
    }

    /// One certificate issued on `cluster` (a configured name) with `roles`.
    pub fn count_issued(&self, cluster: &str, roles: &[String]) {
        self.certificates_issued
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_owned(),
            })
            .inc();
        for role in roles {
            let labels = RoleLabels {
                cluster: cluster.to_owned(),
                role: role.clone(),
            };
            self.role_grants.get_or_create(&labels).inc();
        }
    }

    /// One HTTP request answered with `status` after `elapsed`; `route` is
    /// the router's template it matched, `None` when none did.
    pub fn observe_http(&self, route: Option<&str>, status: u16, elapsed: Duration) {
        let labels = HttpLabels {
            route: route.unwrap_or(UNMATCHED_ROUTE).to_owned(),
            status_class: status_class(status),
        };
        self.http_requests
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// One request refused by the rate limit `limit` (`address`,
    /// `identity`, `api_identity`).
    pub fn count_rate_limited(&self, limit: &'static str) {
        self.rate_limited.get_or_create(&LimitLabels { limit }).inc();
    }

    /// What the audit writer calls after each batch transaction: its
    /// records and how long it took.
    pub fn audit_commit_observer(&self) -> impl Fn(usize, Duration) + Send + Sync + 'static {
        let (records, duration) = (
            self.audit_batch_records.clone(),
            self.audit_commit_duration.clone(),
        );
        move |count, took| {
            records.observe(count as f64);
            duration.observe(took.as_secs_f64());
        }
    }

    /// The result of the readiness checks, for the scrape that follows.
    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Give each configured cluster its per-cluster series at zero, so that
    /// a dashboard or an alert sees "none yet" rather than no series at all
    /// (which also reads as a renamed metric). At start and at each reload.
    pub fn know_clusters<'a>(&self, clusters: impl IntoIterator<Item = &'a str>) {
        for cluster in clusters {
            let labels = ClusterLabels {
                cluster: cluster.to_owned(),
            };
            drop(self.certificates_issued.get_or_create(&labels));
            drop(self.signing_unavailable.get_or_create(&labels));
        }
    }

    /// The text `exposition` asks for.
    pub fn render_as(&self, exposition: Exposition) -> String {
        match exposition {
            Exposition::OpenMetrics => self.render(),
            Exposition::Classic => self.render_classic(),
        }
    }

    /// The OpenMetrics text.
    pub fn render(&self) -> String {
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }

    /// The classic Prometheus text format (0.0.4), for readers that know no
    /// OpenMetrics (promtool, older scrapers).
    pub fn render_classic(&self) -> String {
        let mut text = String::new();
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
        text
    }
}

/// The two texts `/metrics` can answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// OpenMetrics 1.0.0, for a scraper that asks for it (Prometheus does).
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4: what every reader of the
    /// text format takes, promtool included.
    Classic,
}

impl Exposition {
    /// The `Content-Type` of this text.
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Exposition::Classic => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// The text for the `Accept` header values of a scrape, as Prometheus's own
/// client libraries choose it: the media ranges by quality, highest first
/// (in their order for equal quality); the first that is OpenMetrics
/// (version 1.0.0, 0.0.1 or none given) or `text/plain` decides. A range
/// with `q=0` is not acceptable and is passed over. Anything else,
/// `*/*` or no `Accept` at all, gets the classic format: OpenMetrics names
/// a counter's family without `_total`, which a reader that did not ask
/// for it takes for a family with no help and no type.
pub fn negotiate<'a>(accept: impl IntoIterator<Item = &'a str>) -> Exposition {
    accept
        .into_iter()
        .flat_map(|value| value.split(','))
        .filter_map(media_range)
        .filter_map(|(quality, exposition)| Some((quality, exposition?)))
        // The highest quality; of equal ones, the first the scraper gave
        // (`min_by` keeps the first of equal elements).
        .min_by(|a, b| b.0.total_cmp(&a.0))
        .map_or(Exposition::Classic, |(_, exposition)| exposition)
}

/// One media range of an `Accept` value: its quality and the text it
/// names, `None` for an unacceptable range (`q=0`, a quality that does not
/// parse, an OpenMetrics version this server does not write).
fn media_range(range: &str) -> Option<(f32, Option<Exposition>)> {
    let mut parts = range.split(';');
    let media_type = parts.next()?.trim();
    let mut quality = 1.0_f32;
    let mut version = None;
    for parameter in parts {
        let Some((name, value)) = parameter.split_once('=') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim().trim_matches('"'));
        if name.eq_ignore_ascii_case("q") {
            quality = value.parse().ok().filter(|q: &f32| (0.0..=1.0).contains(q))?;
        } else if name.eq_ignore_ascii_case("version") {
            version = Some(value);
        }
    }
    if quality <= 0.0 {
        return None;
    }
    let exposition = if media_type.eq_ignore_ascii_case("application/openmetrics-text") {
        matches!(version, None | Some("1.0.0" | "0.0.1")).then_some(Exposition::OpenMetrics)
    } else if media_type.eq_ignore_ascii_case("text/plain") {
        Some(Exposition::Classic)
    } else {
        None
    };
    Some((quality, exposition))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources() -> Sources {
        Sources {
            audit_write_failures: Box::new(|| 2),
            jwks_refreshes: Box::new(|| (3, 1)),
            keys_age: Box::new(|| vec![("https://idp.example/v2.0".into(), Duration::from_millis(61_500))]),
            graph_requests: Box::new(|| (5, 4)),
            checkpoints: None,
            reloads: Box::new(|| ReloadCounts {
                succeeded: 4,
                failed: 1,
                last_successful: 0,
                last_success_at: 1_700_000_000,
            }),
            ca_not_after: Box::new(|| {
                vec![("prod".into(), 1_900_000_000), ("staging".into(), 1_800_000_000)]
            }),
            tls_not_after: Some(Box::new(|| Some(1_700_000_000))),
        }
    }

    /// The lines of `text` that start with `prefix`, sorted (a family
    /// writes its series in no particular order).
    fn lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        let mut found: Vec<&str> = text.lines().filter(|l| l.starts_with(prefix)).collect();
        found.sort_unstable();
        found
    }

    #[test]
    fn values_kept_elsewhere_are_read_at_each_scrape() {
        let mut metrics = Metrics::new();
        metrics.add_sources(sources());
        let text = metrics.render();
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
                 # HELP talos_sso_identity_provider_keys_age_seconds Seconds since each identity provider's key set was last fetched successfully, by configured issuer.\n\
                 # TYPE talos_sso_identity_provider_keys_age_seconds gauge\n\
                 talos_sso_identity_provider_keys_age_seconds{issuer=\"https://idp.example/v2.0\"} 61.5\n\
                 # HELP talos_sso_graph_requests Microsoft Graph group lookups (token group overage), by result.\n\
                 # TYPE talos_sso_graph_requests counter\n\
                 talos_sso_graph_requests_total{result=\"ok\"} 5\n\
                 talos_sso_graph_requests_total{result=\"failed\"} 4\n\
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
                 # HELP talos_sso_tls_certificate_not_after_timestamp_seconds When the TLS certificate the server presents expires (Unix time).\n\
                 # TYPE talos_sso_tls_certificate_not_after_timestamp_seconds gauge\n\
                 talos_sso_tls_certificate_not_after_timestamp_seconds 1700000000\n\
                 # HELP talos_sso_ca_not_after_timestamp_seconds When each cluster's signing CA expires (Unix time).\n\
                 # TYPE talos_sso_ca_not_after_timestamp_seconds gauge\n\
                 talos_sso_ca_not_after_timestamp_seconds{cluster=\"prod\"} 1900000000\n\
                 talos_sso_ca_not_after_timestamp_seconds{cluster=\"staging\"} 1800000000\n\
                 # EOF\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn plain_http_has_no_tls_expiry() {
        let mut metrics = Metrics::new();
        metrics.add_sources(Sources {
            tls_not_after: None,
            ..sources()
        });
        let text = metrics.render();
        assert!(!text.contains("tls_certificate"), "{text}");
        let mut metrics = Metrics::new();
        metrics.add_sources(Sources {
            tls_not_after: Some(Box::new(|| None)),
            ..sources()
        });
        assert!(!metrics.render().contains("tls_certificate"));
    }

    #[test]
    fn the_build_comes_first() {
        let text = Metrics::new().render();
        let expected = format!(
            "# HELP talos_sso_build_info The running server's version and source revision (always 1).\n\
             # TYPE talos_sso_build_info gauge\n\
             talos_sso_build_info{{version=\"{}\",revision=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION"),
            crate::REVISION
        );
        assert!(text.starts_with(&expected), "{text}");
        assert!(!crate::REVISION.is_empty());
    }

    #[test]
    fn a_certificate_counts_once_and_each_of_its_roles_once() {
        let metrics = Metrics::new();
        let roles = ["os:reader".to_owned(), "os:etcd:backup".to_owned()];
        metrics.count_issued("prod", &roles);
        metrics.count_issued("prod", &roles);
        metrics.count_issued("staging", &roles[..1]);
        let text = metrics.render();
        assert_eq!(
            lines(&text, "talos_sso_certificates_issued"),
            [
                "talos_sso_certificates_issued_total{cluster=\"prod\"} 2",
                "talos_sso_certificates_issued_total{cluster=\"staging\"} 1",
            ],
            "{text}"
        );
        assert_eq!(
            lines(&text, "talos_sso_role_grants"),
            [
                "talos_sso_role_grants_total{cluster=\"prod\",role=\"os:etcd:backup\"} 2",
                "talos_sso_role_grants_total{cluster=\"prod\",role=\"os:reader\"} 2",
                "talos_sso_role_grants_total{cluster=\"staging\",role=\"os:reader\"} 1",
            ],
            "{text}"
        );
        assert!(
            text.contains(
                "# HELP talos_sso_certificates_issued Certificates issued, by cluster.\n\
                 # TYPE talos_sso_certificates_issued counter\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn requests_are_timed_by_route_template_and_status_class() {
        let metrics = Metrics::new();
        metrics.observe_http(Some("/v1/certificates"), 201, Duration::from_millis(3));
        metrics.observe_http(Some("/v1/certificates"), 403, Duration::from_millis(1));
        metrics.observe_http(None, 404, Duration::from_micros(100));
        metrics.observe_http(None, 404, Duration::from_micros(100));
        metrics.observe_http(Some("/readyz"), 503, Duration::from_secs(20));
        metrics.observe_http(Some("/healthz"), 101, Duration::ZERO);
        let text = metrics.render();
        assert_eq!(
            lines(&text, "talos_sso_http_request_duration_seconds_count"),
            [
                "talos_sso_http_request_duration_seconds_count{route=\"/healthz\",status_class=\"1xx\"} 1",
                "talos_sso_http_request_duration_seconds_count{route=\"/readyz\",status_class=\"5xx\"} 1",
                "talos_sso_http_request_duration_seconds_count{route=\"/v1/certificates\",status_class=\"2xx\"} 1",
                "talos_sso_http_request_duration_seconds_count{route=\"/v1/certificates\",status_class=\"4xx\"} 1",
                "talos_sso_http_request_duration_seconds_count{route=\"unmatched\",status_class=\"4xx\"} 2",
            ],
            "{text}"
        );
        // 3 ms falls in the bucket up to 4 ms; 20 s only in +Inf.
        assert!(
            text.contains(
                "talos_sso_http_request_duration_seconds_bucket{le=\"0.004\",route=\"/v1/certificates\",status_class=\"2xx\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "talos_sso_http_request_duration_seconds_bucket{le=\"16.384\",route=\"/readyz\",status_class=\"5xx\"} 0\n\
                 talos_sso_http_request_duration_seconds_bucket{le=\"+Inf\",route=\"/readyz\",status_class=\"5xx\"} 1\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn rate_limits_audit_batches_and_readiness() {
        let metrics = Metrics::new();
        metrics.count_rate_limited("address");
        metrics.count_rate_limited("address");
        metrics.count_rate_limited("api_identity");
        let observe = metrics.audit_commit_observer();
        observe(1, Duration::from_millis(2));
        observe(256, Duration::from_millis(40));
        let text = metrics.render();
        assert!(text.contains("talos_sso_ready 0\n"), "{text}");
        assert_eq!(
            lines(&text, "talos_sso_rate_limited"),
            [
                "talos_sso_rate_limited_total{limit=\"address\"} 2",
                "talos_sso_rate_limited_total{limit=\"api_identity\"} 1",
            ],
            "{text}"
        );
        for expected in [
            "talos_sso_audit_batch_records_sum 257.0\n",
            "talos_sso_audit_batch_records_count 2\n",
            "talos_sso_audit_batch_records_bucket{le=\"1.0\"} 1\n",
            "talos_sso_audit_batch_records_bucket{le=\"128.0\"} 1\n",
            "talos_sso_audit_batch_records_bucket{le=\"256.0\"} 2\n",
            "talos_sso_audit_commit_duration_seconds_count 2\n",
            "talos_sso_audit_commit_duration_seconds_bucket{le=\"0.002\"} 1\n",
            "talos_sso_audit_commit_duration_seconds_bucket{le=\"0.064\"} 2\n",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        metrics.set_ready(true);
        assert!(metrics.render().contains("talos_sso_ready 1\n"));
    }

    #[test]
    fn openmetrics_goes_only_to_a_scraper_that_asks_for_it() {
        use Exposition::{Classic, OpenMetrics};
        let prometheus_2 = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;\
                            q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let prometheus_3 = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8,\
                            application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=1.0.0;\
                            escaping=allow-utf-8;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1";
        for (accept, expected) in [
            (&[][..], Classic),
            (&[""], Classic),
            (&["*/*"], Classic),
            (&["text/plain"], Classic),
            (&["text/plain; version=0.0.4"], Classic),
            (&["application/json"], Classic),
            (&[prometheus_2], OpenMetrics),
            (&[prometheus_3], OpenMetrics),
            (&["application/openmetrics-text"], OpenMetrics),
            (&["Application/OpenMetrics-Text; Version=\"1.0.0\""], OpenMetrics),
            (&["application/openmetrics-text;version=0.0.1"], OpenMetrics),
            // A version this server does not write is not what was asked for.
            (&["application/openmetrics-text;version=2.0.0"], Classic),
            // q=0: "not acceptable"; a quality that does not parse, likewise.
            (&["application/openmetrics-text;q=0"], Classic),
            (&["application/openmetrics-text;q=0.0, */*"], Classic),
            (&["application/openmetrics-text;q=high"], Classic),
            (&["application/openmetrics-text;q=2"], Classic),
            // The higher quality wins; equal ones go by their order.
            (
                &["text/plain;q=0.5, application/openmetrics-text;q=0.9"],
                OpenMetrics,
            ),
            (&["text/plain, application/openmetrics-text;q=0.5"], Classic),
            (
                &["application/openmetrics-text;q=0.5,text/plain;q=0.5"],
                OpenMetrics,
            ),
            (&["text/plain;q=0.5,application/openmetrics-text;q=0.5"], Classic),
            (&["*/*, application/openmetrics-text;q=0.1"], OpenMetrics),
            // Several Accept headers are one list.
            (&["application/json", "application/openmetrics-text"], OpenMetrics),
        ] {
            assert_eq!(negotiate(accept.iter().copied()), expected, "{accept:?}");
        }
        assert_eq!(Classic.content_type(), "text/plain; version=0.0.4; charset=utf-8");
        assert_eq!(
            OpenMetrics.content_type(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
    }

    /// The classic text names a counter's family with its `_total`, as its
    /// readers (promtool, older scrapers) expect: every sample then has the
    /// help and type of its family.
    #[test]
    fn the_classic_text_gives_every_sample_the_help_and_type_of_its_family() {
        let mut metrics = Metrics::new();
        metrics.add_sources(sources());
        metrics.count_issued("prod", &["os:reader".to_owned()]);
        metrics.observe_http(Some("/v1/certificates"), 201, Duration::from_millis(3));
        let text = metrics.render_as(Exposition::Classic);
        assert!(
            text.contains(
                "# HELP talos_sso_certificates_issued_total Certificates issued, by cluster.\n\
                 # TYPE talos_sso_certificates_issued_total counter\n\
                 talos_sso_certificates_issued_total{cluster=\"prod\"} 1\n"
            ),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
        let mut typed = std::collections::HashMap::new();
        for line in text.lines() {
            if let Some(declaration) = line.strip_prefix("# TYPE ") {
                let (family, kind) = declaration.split_once(' ').unwrap();
                typed.insert(family.to_owned(), kind.to_owned());
            } else if !line.starts_with('#') {
                let name = &line[..line.find(['{', ' ']).unwrap()];
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| {
                        name.strip_suffix(suffix)
                            .filter(|f| typed.get(*f).is_some_and(|k| k == "histogram"))
                    })
                    .unwrap_or(name);
                assert!(typed.contains_key(family), "{name} has no TYPE line in\n{text}");
                assert!(text.contains(&format!("# HELP {family} ")), "{name} has no HELP");
            }
        }
    }
}
