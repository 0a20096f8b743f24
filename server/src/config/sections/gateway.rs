//! A cluster's `gateway` section: the access gateway in front of the
//! cluster's apid endpoints (its listener, the CA only it accepts, its
//! serving certificate, its per-method rules and their examples). Data only:
//! `cluster` loads the CA, `talos_api` compiles the rules, `gateway` serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::Pkcs11Source;
use crate::config::de::duration;

/// Forward the cluster's Talos API through talos-sso: people's certificates
/// are signed by `client_ca`, which Talos does not trust, so they work only
/// here; the gateway calls apid with an `os:impersonator` certificate of its
/// own, signed by the cluster's `ca`, and records every call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Where the gateway listens (mutual TLS, HTTP/2).
    pub listen: SocketAddr,
    /// The talosconfig `endpoints` people get: the gateway's address as
    /// talosctl reaches it.
    pub endpoints: Vec<String>,
    /// apid endpoints the gateway forwards to (default: the cluster's
    /// `endpoints`), tried in order.
    #[serde(default)]
    pub upstreams: Vec<String>,
    /// The CA that signs people's certificates for this cluster: in neither
    /// `machine.ca` nor `machine.acceptedCAs`, so a certificate it signs is
    /// useless at apid directly. Made with `ca client-ca`.
    pub client_ca: GatewayClientCa,
    /// The gateway's serving certificate (cert-manager's, say).
    pub tls: GatewayTls,
    /// Lifetime of the gateway's own `os:impersonator` certificate; it is
    /// renewed at half of it.
    #[serde(default = "default_impersonator_ttl", deserialize_with = "duration")]
    pub impersonator_ttl: Duration,
    /// Per-method rules on top of Talos's own role checks.
    #[serde(default)]
    pub rules: Vec<MethodRuleConfig>,
    /// Calls and what the rules must answer, checked at start and reload.
    #[serde(default)]
    pub examples: Vec<MethodExample>,
    /// Longest a call may run (`talosctl logs -f`, say) before the gateway
    /// ends it.
    #[serde(default = "default_max_call", deserialize_with = "duration")]
    pub max_call: Duration,
}

fn default_max_call() -> Duration {
    Duration::from_secs(12 * 3600)
}

fn default_impersonator_ttl() -> Duration {
    Duration::from_secs(3600)
}

/// The gateway-only CA: a certificate with its key in a file or a token.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayClientCa {
    pub cert_file: PathBuf,
    pub key_file: Option<PathBuf>,
    pub pkcs11: Option<Pkcs11Source>,
    #[serde(default)]
    pub allow_insecure_key_permissions: bool,
}

/// The gateway's serving certificate, and the CA that talosctl verifies it
/// with (the talosconfig `ca` of a gateway cluster).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_file: PathBuf,
}

/// Methods that need given roles or groups, or are refused outright.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodRuleConfig {
    /// Named in the refusal and in the audit record.
    pub name: String,
    /// Full method names (`/machine.MachineService/Reset`), or prefixes
    /// ending in `*` (`/machine.MachineService/Etcd*`).
    pub methods: Vec<String>,
    /// Roles of the certificate that satisfy the rule (any of them).
    #[serde(default)]
    pub roles: Vec<String>,
    /// Groups (as recorded when the certificate was issued) that satisfy
    /// the rule (any of them); compared case-insensitively.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Refuse these methods through the gateway, whoever calls.
    #[serde(default)]
    pub refuse: bool,
}

/// A call and what the rules must say of it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodExample {
    pub description: String,
    pub method: String,
    #[serde(default)]
    pub roles: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
    /// `allowed`, or the name of the rule that refuses it.
    pub expect: String,
}
