//! The values a key takes when the file does not set it (docs/configuration.md
//! names each). Kept together so the documentation can be checked against
//! one place.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How far `not_before` is moved into the past so that a client whose clock
/// runs a little behind the node's still sees a valid certificate (Talos
/// itself allows no skew).
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

// Top-level keys.

pub(crate) fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8443))
}

pub(crate) fn default_data_dir() -> PathBuf {
    PathBuf::from("/var/lib/talos-sso")
}

// `tls`, `http`, `rate_limits`.

pub(crate) fn default_tls_reload() -> Duration {
    Duration::from_secs(30)
}

pub(crate) fn default_body_limit() -> usize {
    64 * 1024
}

pub(crate) fn default_request_timeout() -> Duration {
    Duration::from_secs(15)
}

pub(crate) fn default_grace() -> Duration {
    Duration::from_secs(20)
}

pub(crate) fn default_header_read_timeout() -> Duration {
    Duration::from_secs(10)
}

pub(crate) fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}

pub(crate) fn default_max_connections() -> usize {
    1024
}

pub(crate) fn default_h2_streams() -> u32 {
    64
}

pub(crate) fn default_per_address_connections() -> usize {
    128
}

pub(crate) fn default_per_identity() -> u32 {
    20
}

pub(crate) fn default_per_address() -> u32 {
    300
}

pub(crate) fn default_api_per_identity() -> u32 {
    600
}

// `identity`.

pub(crate) fn default_scopes() -> Vec<String> {
    ["openid", "profile", "offline_access"].map(String::from).to_vec()
}

pub(crate) fn default_leeway() -> Duration {
    Duration::from_secs(300)
}

pub(crate) fn default_min_refresh() -> Duration {
    Duration::from_secs(300)
}

pub(crate) fn default_refresh_period() -> Duration {
    Duration::from_secs(3600)
}

pub(crate) fn default_authority() -> String {
    "https://login.microsoftonline.com".into()
}

pub(crate) fn default_graph_url() -> String {
    "https://graph.microsoft.com".into()
}

// A cluster.

pub(crate) fn default_ttl() -> Duration {
    Duration::from_secs(300)
}

pub(crate) fn default_max_ttl() -> Duration {
    Duration::from_secs(900)
}

pub(crate) fn default_skew() -> Duration {
    DEFAULT_CLOCK_SKEW
}

// `audit`.

pub(crate) fn default_checkpoint_interval() -> Duration {
    Duration::from_secs(60)
}

pub(crate) fn default_max_streams() -> usize {
    16
}

pub(crate) fn default_max_streams_per_identity() -> usize {
    2
}

pub(crate) fn default_write_timeout() -> Duration {
    Duration::from_secs(30)
}

pub(crate) fn default_heartbeat() -> Duration {
    Duration::from_secs(15)
}

pub(crate) fn default_poll_interval() -> Duration {
    Duration::from_secs(5)
}

pub(crate) fn default_window() -> Duration {
    Duration::from_secs(60)
}

pub(crate) fn default_keys() -> usize {
    256
}

// `console`.

pub(crate) fn default_console_idle() -> Duration {
    Duration::from_secs(15 * 60)
}

pub(crate) fn default_console_lifetime() -> Duration {
    Duration::from_secs(3600)
}

pub(crate) fn default_console_sessions() -> usize {
    1000
}

pub(crate) fn default_export_timeout() -> Duration {
    Duration::from_secs(5 * 60)
}

pub(crate) fn default_max_exports() -> usize {
    4
}

pub(crate) fn default_max_exports_per_person() -> usize {
    1
}

// `log`, `reload`.

pub(crate) fn default_log_format() -> String {
    "text".into()
}

pub(crate) fn default_reload_interval() -> Duration {
    Duration::from_secs(10)
}
