//! How the server serves: TLS, HTTP limits, the metrics listener, the
//! rate limits and the web console.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::config::de::{duration, networks};
use crate::config::defaults::{
    default_api_per_identity, default_body_limit, default_console_idle, default_console_lifetime,
    default_console_sessions, default_export_timeout, default_grace, default_h2_streams,
    default_header_read_timeout, default_idle_timeout, default_max_connections, default_max_exports,
    default_max_exports_per_person, default_per_address, default_per_address_connections,
    default_per_identity, default_request_timeout, default_tls_reload,
};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// How often the files are checked for changes; changed files are
    /// loaded without a restart (a failed load keeps the current ones).
    #[serde(default = "default_tls_reload", deserialize_with = "duration")]
    pub reload_interval: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Largest accepted request body.
    #[serde(default = "default_body_limit")]
    pub body_limit: usize,
    /// Longest a request may take.
    #[serde(default = "default_request_timeout", deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// Proxies whose `X-Forwarded-For` is believed (IPs or CIDRs).
    #[serde(default, deserialize_with = "networks")]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Time allowed for in-flight requests at shutdown.
    #[serde(default = "default_grace", deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// Time a client has for the TLS handshake and for each request's
    /// headers; an HTTP/1.1 keep-alive connection that sends no next
    /// request within it is closed.
    #[serde(default = "default_header_read_timeout", deserialize_with = "duration")]
    pub header_read_timeout: Duration,
    /// A connection on which nothing moves for this long is closed (HTTP/2
    /// included). Must be longer than `request_timeout`.
    #[serde(default = "default_idle_timeout", deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// Connections open at once; at the cap, new ones wait in the kernel's
    /// backlog until one closes.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Concurrent requests (streams) on one HTTP/2 connection.
    #[serde(default = "default_h2_streams")]
    pub http2_max_concurrent_streams: u32,
    /// Connections one client address (IPv6: /64) may hold at once; trusted
    /// proxies are exempt. Further connections are closed at once.
    #[serde(default = "default_per_address_connections")]
    pub max_connections_per_address: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            body_limit: default_body_limit(),
            request_timeout: default_request_timeout(),
            trusted_proxies: Vec::new(),
            shutdown_grace: default_grace(),
            header_read_timeout: default_header_read_timeout(),
            idle_timeout: default_idle_timeout(),
            max_connections: default_max_connections(),
            http2_max_concurrent_streams: default_h2_streams(),
            max_connections_per_address: default_per_address_connections(),
        }
    }
}

/// The `metrics` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `GET /metrics` here (plain HTTP) and only here: the main port
    /// then answers 404 for it. Unset: `/metrics` is on the main port.
    pub listen: Option<SocketAddr>,
}

/// The `rate_limits` section of the configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Certificate requests one person may make per minute (bursts up to this).
    #[serde(default = "default_per_identity")]
    pub per_identity_per_minute: u32,
    /// Requests (certificates, audit, deny list) one client address may
    /// make per minute.
    #[serde(default = "default_per_address")]
    pub per_address_per_minute: u32,
    /// Audit and deny-list requests one person may make per minute (an
    /// export reads one page per request).
    #[serde(default = "default_api_per_identity")]
    pub api_per_identity_per_minute: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            per_identity_per_minute: default_per_identity(),
            per_address_per_minute: default_per_address(),
            api_per_identity_per_minute: default_api_per_identity(),
        }
    }
}

/// The `console` section: the web console at `/ui` (docs/console.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve `/ui`. Off unless set.
    #[serde(default)]
    pub enabled: bool,
    /// The server's address as browsers reach it (`https://sso.example.com`);
    /// the redirect URI registered with the identity provider is this
    /// followed by `/ui/callback`. Required when `enabled`.
    pub public_url: Option<String>,
    /// The client id the console logs in with; default `identity.client_id`
    /// (the CLI's public client, with the console's redirect URI added).
    pub client_id: Option<String>,
    /// A file holding the client secret, for a confidential (web)
    /// registration; none for a public client (PKCE alone).
    pub client_secret_file: Option<PathBuf>,
    /// A session ends after this long without a request.
    #[serde(default = "default_console_idle", deserialize_with = "duration")]
    pub session_idle: Duration,
    /// A session ends this long after login, whatever happens (group changes at
    /// the provider reach the console at the next login).
    #[serde(default = "default_console_lifetime", deserialize_with = "duration")]
    pub session_lifetime: Duration,
    /// Sessions held at once, the oldest going first when a new one needs
    /// room; as many logins in progress are held apart.
    #[serde(default = "default_console_sessions")]
    pub max_sessions: usize,
    /// An export must reach its client within this long, or it is cut off
    /// (and the trail says so): a client that reads slowly or not at all
    /// cannot hold the export's memory and slot.
    #[serde(default = "default_export_timeout", deserialize_with = "duration")]
    pub export_timeout: Duration,
    /// Exports running at once on this replica.
    #[serde(default = "default_max_exports")]
    pub max_exports: usize,
    /// Exports one person may run at once on this replica.
    #[serde(default = "default_max_exports_per_person")]
    pub max_exports_per_person: usize,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            public_url: None,
            client_id: None,
            client_secret_file: None,
            session_idle: default_console_idle(),
            session_lifetime: default_console_lifetime(),
            max_sessions: default_console_sessions(),
            export_timeout: default_export_timeout(),
            max_exports: default_max_exports(),
            max_exports_per_person: default_max_exports_per_person(),
        }
    }
}

impl ConsoleConfig {
    /// `<public_url>/ui/callback`.
    pub fn redirect_uri(&self) -> Option<String> {
        self.public_url
            .as_deref()
            .map(|u| format!("{}/ui/callback", u.trim_end_matches('/')))
    }
}
