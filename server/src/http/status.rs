//! What the server says about itself: `/v1/info` (what the CLI needs to log
//! in), `/healthz`, `/readyz`, `/metrics`, and the answer to unknown paths.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use talos_sso_api::{API_VERSION, ClusterInfo, ErrorCode, Readiness, ServerInfo};

use super::error::ApiError;
use crate::app::App;

/// Provider keys older than this make the server not ready.
const KEYS_STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such endpoint")
}

/// How long a readiness answer is reused.
pub const READINESS_FRESH_FOR: Duration = Duration::from_millis(500);

/// How long a token's probe signature is waited for.
const SIGNING_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Ready when the database answers, the provider's keys are fresh and every
/// CA can sign. A CA key in a PKCS#11 token signs a probe, off the runtime
/// (the call blocks on the HSM); that also reopens a module that failed.
/// `/readyz` answers with it, and `talos_sso_ready` is it at each scrape.
async fn readiness(app: &Arc<App>) -> Readiness {
    // Callers queue here while one of them checks: all get its answer.
    let mut last = app.readiness.last.lock().await;
    if let Some((at, readiness)) = last.as_ref()
        && at.elapsed() < READINESS_FRESH_FOR
    {
        return readiness.clone();
    }
    let readiness = check_readiness(app).await;
    *last = Some((std::time::Instant::now(), readiness.clone()));
    readiness
}

async fn check_readiness(app: &Arc<App>) -> Readiness {
    let database = app.audit.store().ping().await.is_ok();
    let keys_fresh = app.authenticator.keys_age() < KEYS_STALE_AFTER;
    let settings = app.settings();
    let signing = if settings
        .clusters
        .values()
        .flat_map(|c| c.cas())
        .any(|ca| ca.key_location().is_some())
    {
        probe_signing(&app.readiness.signing_probe_running, &settings).await
    } else {
        true
    };
    Readiness {
        ready: database && keys_fresh && signing,
        database,
        identity_provider_keys_fresh: keys_fresh,
        identity_provider_reachable: app.authenticator.providers_reachable(),
        clusters: settings.clusters.len(),
        signing,
        trust_modes: settings
            .clusters
            .iter()
            .map(|(name, cluster)| (name.clone(), cluster.mode().as_str().to_owned()))
            .collect(),
    }
}

/// Every token signs a probe, on a blocking thread, waited for a bounded
/// time; while an earlier probe has not come back, the answer is "cannot
/// sign" without asking again.
async fn probe_signing(running: &Arc<AtomicBool>, settings: &Arc<crate::app::Settings>) -> bool {
    if running.swap(true, Ordering::AcqRel) {
        return false;
    }
    /// Clears the flag however the probe ends.
    struct Running(Arc<AtomicBool>);
    impl Drop for Running {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Release);
        }
    }
    let signers = Arc::clone(settings);
    let running = Running(Arc::clone(running));
    let probe = tokio::task::spawn_blocking(move || {
        let _running = running;
        signers
            .clusters
            .values()
            .flat_map(|c| c.cas())
            .all(|ca| ca.signing_available())
    });
    matches!(
        tokio::time::timeout(SIGNING_PROBE_TIMEOUT, probe).await,
        Ok(Ok(true))
    )
}

pub async fn readyz(State(app): State<Arc<App>>) -> (StatusCode, Json<Readiness>) {
    let readiness = readiness(&app).await;
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(readiness))
}

/// Prometheus metrics, with the readiness checks run first: OpenMetrics
/// when the scraper asks for it, else the classic text format
/// ([`crate::metrics::negotiate`]).
pub async fn metrics(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
) -> impl axum::response::IntoResponse {
    app.metrics.set_ready(readiness(&app).await.ready);
    let exposition = crate::metrics::negotiate(
        headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    (
        [
            (header::CONTENT_TYPE, exposition.content_type()),
            // The answer depends on it: a cache must not give one scraper's
            // text to another.
            (header::VARY, "accept"),
        ],
        app.metrics.render_as(exposition),
    )
}

pub async fn info(State(app): State<Arc<App>>) -> Json<ServerInfo> {
    let settings = app.settings();
    let identity = &settings.config.identity;
    let clusters = settings
        .clusters
        .values()
        .map(|c| ClusterInfo {
            name: c.name.clone(),
            description: c.config.description.clone(),
            default_ttl_seconds: c.config.ttl.as_secs(),
            max_ttl_seconds: c.config.max_ttl.as_secs(),
        })
        .collect();
    Json(ServerInfo {
        server_version: crate::VERSION.into(),
        api_version: API_VERSION,
        issuer: identity.issuer.clone(),
        discovery_url: identity.discovery_url.clone(),
        client_id: identity.client_id.clone(),
        scopes: identity.scopes.clone(),
        token: identity.token,
        clusters,
    })
}
