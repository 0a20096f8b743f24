//! The `identity` section: the login issuer and the trusted issuers, as
//! written; what each kind accepts is `identity::issuer`'s business.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::Tenancy;
use crate::config::de::duration;
use crate::config::defaults::{
    default_authority, default_graph_url, default_leeway, default_min_refresh, default_refresh_period,
    default_scopes,
};

/// The name of the login issuer, the one `identity` itself describes.
pub const LOGIN_ISSUER: &str = "login";

/// The `identity` section: the issuer people log in with (the one
/// `/v1/info` names to the CLI), and the further issuers whose tokens are
/// accepted too.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    /// `entra` or `oidc`: how the issuer's tokens are read. When not set,
    /// `entra` if `allowed_tenants` is set, else `oidc` (with a warning).
    pub kind: Option<String>,
    /// The provider's issuer, exactly as its discovery document says it. For
    /// Entra multi-tenant apps, `https://login.microsoftonline.com/{tenantid}/v2.0`.
    pub issuer: String,
    /// Discovery document URL, when it is not `{issuer}/.well-known/openid-configuration`.
    pub discovery_url: Option<String>,
    /// More accepted issuers (e.g. an Entra v1 `https://sts.windows.net/{tid}/`
    /// for v1 access tokens; Entra's public cloud adds those itself).
    #[serde(default)]
    pub additional_issuers: Vec<String>,
    /// The public client id the CLI uses.
    pub client_id: String,
    /// Accepted `aud` values. Default: the client id (ID tokens).
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Scopes the CLI asks for.
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// Which token the CLI sends: `id_token` (default; every provider) or
    /// `access_token` (a JWT access token for this server's API; then
    /// `audiences` names that API). Served by `/v1/info`.
    #[serde(default)]
    pub token: talos_sso_api::BearerToken,
    /// Entra tenants allowed (`tid`); the person is (`tid`, `oid`).
    #[serde(default)]
    pub allowed_tenants: Vec<String>,
    /// The claim naming the person (certificate CN, audit username). When
    /// set, a token without it is refused; when not, the first of
    /// `preferred_username`, `upn`, `unique_name`, a verified `email`, then
    /// the subject. A display name only: policy and the deny list match
    /// the subject.
    pub username_claim: Option<String>,
    /// Leeway on token times.
    #[serde(default = "default_leeway", deserialize_with = "duration")]
    pub leeway: Duration,
    /// Minimum time between key-set refreshes caused by unknown `kid`s
    /// (every issuer's).
    #[serde(default = "default_min_refresh", deserialize_with = "duration")]
    pub jwks_min_refresh_interval: Duration,
    /// Background refresh of discovery and keys (every issuer's).
    #[serde(default = "default_refresh_period", deserialize_with = "duration")]
    pub jwks_refresh_period: Duration,
    /// Group overage resolution through Microsoft Graph (Entra).
    pub entra_graph: Option<GraphConfig>,
    /// Further issuers whose tokens are accepted (workloads, other
    /// directories); nobody logs in with them through the CLI.
    #[serde(default)]
    pub trusted_issuers: Vec<IssuerConfig>,
    /// A PEM bundle of certificate authorities trusted, in addition to the
    /// system's trust store, for every call to an identity provider
    /// (discovery, keys, Graph): a provider behind a company CA.
    pub ca_file: Option<PathBuf>,
    /// `console.client_id` when the console is on and has a client of its
    /// own (set from the `console` section, not read here).
    #[serde(skip)]
    pub console_client_id: Option<String>,
}

impl IdentityConfig {
    /// The login issuer as one issuer among the trusted ones.
    pub fn login_issuer(&self) -> IssuerConfig {
        IssuerConfig {
            name: LOGIN_ISSUER.into(),
            kind: self
                .kind
                .clone()
                .unwrap_or_else(|| inferred_kind(&self.allowed_tenants).to_owned()),
            issuer: self.issuer.clone(),
            discovery_url: self.discovery_url.clone(),
            additional_issuers: self.additional_issuers.clone(),
            audiences: if self.audiences.is_empty() {
                vec![self.client_id.clone()]
            } else {
                self.audiences.clone()
            },
            clients: std::iter::once(self.client_id.clone())
                .chain(self.console_client_id.clone())
                .collect(),
            allowed_tenants: self.allowed_tenants.clone(),
            username_claim: self.username_claim.clone(),
            leeway: self.leeway,
            entra_graph: self.entra_graph.clone(),
            ca_file: self.ca_file.clone(),
            jwks_file: None,
            certificates_per_token: None,
        }
    }

    /// The tenants of every issuer that has some (Entra), by name: what
    /// app-role selectors are read against.
    pub fn tenancy(&self) -> Tenancy {
        Tenancy::new(
            self.issuers()
                .into_iter()
                .map(|issuer| (issuer.name, issuer.allowed_tenants)),
        )
    }

    /// Every issuer: the login issuer first.
    pub fn issuers(&self) -> Vec<IssuerConfig> {
        std::iter::once(self.login_issuer())
            .chain(self.trusted_issuers.iter().map(|trusted| IssuerConfig {
                ca_file: trusted.ca_file.clone().or_else(|| self.ca_file.clone()),
                ..trusted.clone()
            }))
            .collect()
    }

    /// The workload issuers (`kubernetes`, `github-actions`, `gitlab-ci`)
    /// by name, with their kind: what workload rules name.
    pub fn workload_kinds(&self) -> std::collections::BTreeMap<String, String> {
        self.trusted_issuers
            .iter()
            .filter(|issuer| issuer.is_workload())
            .map(|issuer| (issuer.name.clone(), issuer.kind.clone()))
            .collect()
    }
}

/// How many certificates one workload token may mint unless its issuer
/// says otherwise: enough for an hour of five-minute certificates renewed
/// early, from a projected token that rotates every 48 minutes.
pub const DEFAULT_CERTIFICATES_PER_TOKEN: u32 = 20;

/// The most `certificates_per_token` may be.
pub const MAX_CERTIFICATES_PER_TOKEN: u32 = 100;

/// One issuer whose tokens are accepted: an entry of
/// `identity.trusted_issuers`, or the login issuer built from `identity`.
/// Each has its own keys and rules (`identity::issuer`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// Names the issuer in logs and messages; unique (`login` is the
    /// login issuer's).
    pub name: String,
    /// `entra` or `oidc` (people, other directories), or a workload kind:
    /// `kubernetes`, `github-actions`, `gitlab-ci`.
    pub kind: String,
    /// Its issuer, exactly as its discovery document says it.
    pub issuer: String,
    pub discovery_url: Option<String>,
    #[serde(default)]
    pub additional_issuers: Vec<String>,
    /// Accepted `aud` values (no default: there is no client id here).
    pub audiences: Vec<String>,
    /// The login issuer's clients, `identity.client_id` and the console's
    /// own `console.client_id`: `azp`/`appid`, when present, must name one
    /// of them. Empty for a trusted issuer.
    #[serde(skip)]
    pub clients: Vec<String>,
    #[serde(default)]
    pub allowed_tenants: Vec<String>,
    pub username_claim: Option<String>,
    #[serde(default = "default_leeway", deserialize_with = "duration")]
    pub leeway: Duration,
    pub entra_graph: Option<GraphConfig>,
    /// A PEM bundle trusted for this issuer's discovery and keys instead
    /// of `identity.ca_file` (a Kubernetes API server's own CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Workload issuers: the issuer's key set as a JWKS file, read at start
    /// and at each refresh, instead of discovery (a Kubernetes cluster
    /// whose service-account issuer is not reachable from here).
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// Workload issuers: how many certificates one token may mint while it
    /// is valid (default [`DEFAULT_CERTIFICATES_PER_TOKEN`]). People's
    /// tokens mint one.
    #[serde(default)]
    pub certificates_per_token: Option<u32>,
}

impl IssuerConfig {
    /// Whether its tokens are workloads' (CI jobs, service accounts), judged
    /// by workload rules only, never by people's.
    pub fn is_workload(&self) -> bool {
        talos_sso_api::audit::workload::KINDS.contains(&self.kind.as_str())
    }

    /// How many certificates one of its tokens may mint.
    pub fn token_uses(&self) -> u32 {
        if self.is_workload() {
            self.certificates_per_token
                .unwrap_or(DEFAULT_CERTIFICATES_PER_TOKEN)
        } else {
            1
        }
    }

    /// Where this issuer is in the configuration, for messages.
    pub fn section(&self) -> String {
        if !self.clients.is_empty() {
            "identity".into()
        } else {
            format!(
                "identity.trusted_issuers[{}]",
                talos_sso_text::clean(&self.name, 64)
            )
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphConfig {
    pub tenant_id: String,
    /// The server's own app registration (with GroupMember.Read.All).
    pub client_id: String,
    pub client_secret_file: PathBuf,
    #[serde(default = "default_authority")]
    pub authority: String,
    #[serde(default = "default_graph_url")]
    pub graph_url: String,
}

/// The kind of a login issuer whose configuration does not name one: Entra
/// when it allows tenants, as before kinds were named (`identity::issuer`
/// knows the kinds; these are their names in the file).
pub fn inferred_kind(allowed_tenants: &[String]) -> &'static str {
    if allowed_tenants.is_empty() {
        "oidc"
    } else {
        "entra"
    }
}
