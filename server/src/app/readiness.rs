//! The last readiness answer, kept with the app so that the probes
//! (`/readyz`) and the scrapes (`/metrics`) share it; what ready means is
//! `http::status`'s business.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use talos_sso_api::Readiness;

/// The last readiness answer. `/readyz` and `/metrics` answer anyone, so the
/// checks behind them (a database round trip, a signature by each PKCS#11
/// token) run at most once per `http::status::READINESS_FRESH_FOR` and one at a time,
/// whatever the request rate: a flood of probes neither takes the
/// database's connections from issuance nor the token's sessions from
/// signing. A token that hangs is not asked again until it has answered.
#[derive(Debug, Default)]
pub struct ReadinessCache {
    /// When the last answer was given, and what it was.
    pub(crate) last: tokio::sync::Mutex<Option<(std::time::Instant, Readiness)>>,
    /// A token's probe signature is running (it may hang): not asked again.
    pub(crate) signing_probe_running: Arc<AtomicBool>,
}
