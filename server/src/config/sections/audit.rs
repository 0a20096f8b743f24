//! The `audit` section: the feeds, the refusal windows and the signed
//! checkpoints.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::Pkcs11Source;
use crate::config::de::duration;
use crate::config::defaults::{
    default_checkpoint_interval, default_heartbeat, default_keys, default_max_streams,
    default_max_streams_per_identity, default_poll_interval, default_window, default_write_timeout,
};

/// The `audit` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// Streams of the trail for a SIEM (`GET /v1/audit/stream`).
    #[serde(default)]
    pub feed: FeedConfig,
    /// How refusals of unauthenticated and rate-limited requests are
    /// aggregated (`crate::refusals`).
    #[serde(default)]
    pub refusals: RefusalConfig,
    /// Signed checkpoints of the chain head, published outside the
    /// database (`crate::audit::checkpoint`); off when absent.
    pub checkpoints: Option<CheckpointConfig>,
}

/// The `audit.checkpoints` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// The Ed25519 signing key (PKCS#8 PEM, `PRIVATE KEY`), used for
    /// nothing else; not readable by others, like every key. Or `pkcs11`.
    pub key_file: Option<PathBuf>,
    /// The Ed25519 signing key in a PKCS#11 token instead of a file.
    pub pkcs11: Option<Pkcs11Source>,
    /// The checkpoint file: one JSON checkpoint per line, appended.
    pub file: PathBuf,
    /// How often the head is signed when the trail has grown.
    #[serde(default = "default_checkpoint_interval", deserialize_with = "duration")]
    pub interval: Duration,
    /// Where each checkpoint is also POSTed as JSON (`https://`, or
    /// `http://` to this machine only).
    pub webhook_url: Option<String>,
    /// The server's name in its checkpoints; default: the host name.
    pub server_name: Option<String>,
    /// Public keys of earlier signing keys (PEM), whose checkpoints are
    /// still checked after a key rotation.
    #[serde(default)]
    pub previous_public_keys: Vec<PathBuf>,
}

/// The `audit.feed` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedConfig {
    /// Streams served at once by one replica; further ones are refused
    /// (`rate_limited`).
    #[serde(default = "default_max_streams")]
    pub max_streams: usize,
    /// Streams one caller may hold at once on one replica, so that one
    /// service principal cannot take every slot.
    #[serde(default = "default_max_streams_per_identity")]
    pub max_streams_per_identity: usize,
    /// A client that takes no line for this long is cut off.
    #[serde(default = "default_write_timeout", deserialize_with = "duration")]
    pub write_timeout: Duration,
    /// A heartbeat line after this long without any other, so that
    /// proxies do not close a quiet stream.
    #[serde(default = "default_heartbeat", deserialize_with = "duration")]
    pub heartbeat: Duration,
    /// How often a stream looks for records that other replicas committed
    /// (this replica's own wake it at once).
    #[serde(default = "default_poll_interval", deserialize_with = "duration")]
    pub poll_interval: Duration,
}

impl Default for FeedConfig {
    fn default() -> Self {
        Self {
            max_streams: default_max_streams(),
            max_streams_per_identity: default_max_streams_per_identity(),
            write_timeout: default_write_timeout(),
            heartbeat: default_heartbeat(),
            poll_interval: default_poll_interval(),
        }
    }
}

/// The `audit.refusals` section of the configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalConfig {
    /// How long one window lasts; at its end the counts are recorded.
    #[serde(default = "default_window", deserialize_with = "duration")]
    pub window: Duration,
    /// (client address, event, reason) keys tracked one by one per window
    /// (an IPv6 address is its /64 network).
    #[serde(default = "default_keys")]
    pub max_keys: usize,
}

impl Default for RefusalConfig {
    fn default() -> Self {
        Self {
            window: default_window(),
            max_keys: default_keys(),
        }
    }
}
