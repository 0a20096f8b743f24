//! A cluster's section: its CAs (`cluster_ca`), its talosconfig details,
//! its lifetimes and its rules.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{
    CaConfig, GatewayConfig, IdentityConfig, NextCaConfig, PolicyConfig, Rule, TalosCaConfig, WorkloadRule,
};
use crate::config::de::duration;
use crate::config::defaults::{default_max_ttl, default_skew, default_ttl};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default)]
    pub description: String,
    /// The CA that signs people's certificates; on a gateway cluster, only
    /// the gateway's own `os:impersonator` certificate (and break-glass).
    pub ca: CaConfig,
    /// Accepted-CA mode: the Talos cluster CA certificate (no key), for the
    /// talosconfig `ca`, when `ca` is a client-only CA of talos-sso's own
    /// that Talos lists in `machine.acceptedCAs`.
    #[serde(default)]
    pub talos_ca: Option<TalosCaConfig>,
    /// The CA that takes over from `ca` at its `signs_from` (a rotation).
    #[serde(default)]
    pub next_ca: Option<NextCaConfig>,
    /// Extra trusted CA certificates during a Talos CA rotation.
    #[serde(default)]
    pub accepted_cas: Vec<PathBuf>,
    /// talosconfig `endpoints`.
    pub endpoints: Vec<String>,
    /// talosconfig `nodes` (default: none).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// talosconfig context name (default: the cluster name).
    pub context: Option<String>,
    /// Default certificate lifetime.
    #[serde(default = "default_ttl", deserialize_with = "duration")]
    pub ttl: Duration,
    /// Longest lifetime a client may ask for.
    #[serde(default = "default_max_ttl", deserialize_with = "duration")]
    pub max_ttl: Duration,
    /// How far `not_before` is moved back.
    #[serde(default = "default_skew", deserialize_with = "duration")]
    pub clock_skew: Duration,
    /// Who gets which roles: see `policy` (rules match on groups, app
    /// roles, users or claims).
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Roles granted when the client names none.
    #[serde(default)]
    pub default_roles: Vec<String>,
    /// Allow a rule to grant `os:impersonator`.
    #[serde(default)]
    pub allow_impersonator: bool,
    /// Reach the cluster only through talos-sso's access gateway, which
    /// records every API call.
    #[serde(default)]
    pub gateway: Option<GatewayConfig>,
    /// Workload rules (`policy::workloads`): what CI jobs and service
    /// accounts may have here.
    #[serde(default)]
    pub workloads: Vec<WorkloadRule>,
}

impl ClusterConfig {
    /// The cluster's rules, with the issuers' tenants they are read
    /// against (`IdentityConfig::tenancy`, of the `identity` section).
    pub fn policy(&self, identity: &IdentityConfig) -> PolicyConfig {
        PolicyConfig {
            rules: self.rules.clone(),
            default_roles: self.default_roles.clone(),
            allow_impersonator: self.allow_impersonator,
            tenancy: identity.tenancy(),
            workloads: self.workloads.clone(),
            workload_kinds: identity.workload_kinds(),
        }
    }
}
