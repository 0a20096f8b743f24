//! `GET /v1/info`: what the CLI needs to log in and to pick a cluster.

use serde::{Deserialize, Serialize};

/// `GET /v1/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    pub server_version: String,
    pub api_version: u32,
    /// The issuer people log in with; may be a template ([`crate::issuer`]).
    pub issuer: String,
    #[serde(default)]
    pub discovery_url: Option<String>,
    /// The public client id the CLI logs in as.
    pub client_id: String,
    pub scopes: Vec<String>,
    /// Which of the provider's tokens the CLI sends. A server of a release
    /// before this field expects the ID token.
    #[serde(default)]
    pub token: BearerToken,
    pub clusters: Vec<ClusterInfo>,
}

/// Which token from the identity provider's answer the CLI sends to the
/// server as its bearer token: configured on the server
/// (`identity.token`), never guessed from scope names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BearerToken {
    /// The ID token, audience the CLI's client id: works with every OpenID
    /// Provider (opaque access tokens included).
    #[default]
    IdToken,
    /// The access token, for providers that issue JWT access tokens for
    /// the server's own API (Entra with an exposed API scope, Okta's
    /// authorization servers).
    AccessToken,
}

impl BearerToken {
    /// The name as configured and served.
    pub fn as_str(self) -> &'static str {
        match self {
            BearerToken::IdToken => "id_token",
            BearerToken::AccessToken => "access_token",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub default_ttl_seconds: u64,
    #[serde(default)]
    pub max_ttl_seconds: u64,
}

/// `GET /readyz`: ready when the database answers and the identity
/// providers' keys are fresh. `identity_provider_reachable` says whether
/// the last fetch of every provider's keys succeeded; it does not make the
/// server unready, since the cached keys keep serving.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub ready: bool,
    pub database: bool,
    pub identity_provider_keys_fresh: bool,
    #[serde(default = "reachable_when_not_said")]
    pub identity_provider_reachable: bool,
    pub clusters: usize,
    /// Every cluster's CA can sign (a key in a PKCS#11 token signed a probe).
    #[serde(default = "reachable_when_not_said")]
    pub signing: bool,
    /// How Talos trusts each cluster's certificates, by cluster name:
    /// `cluster-ca`, `intermediate` or `accepted-ca` (empty from servers
    /// that did not say).
    #[serde(default)]
    pub trust_modes: std::collections::BTreeMap<String, String>,
}

/// Servers before `identity_provider_reachable` (and `signing`) did not say.
fn reachable_when_not_said() -> bool {
    true
}
