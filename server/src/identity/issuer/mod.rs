//! The issuers the server trusts, each of a *kind* that knows how its
//! tokens are read.
//!
//! An [`Issuer`] is one configured issuer (`config::IssuerConfig`): its
//! provider (discovery and keys, `identity::provider`) and its
//! [`IssuerRules`], which are the checks every token shares
//! (`identity::token`) plus its [`Kind`]'s. A kind owns what differs
//! between issuers:
//! - which `iss` values it accepts: a token is routed by its (unverified)
//!   `iss` to the one issuer that accepts it, before any key work;
//! - its own checks on a verified token, and the claims that name the
//!   subject, tenant, username and token id;
//! - where groups and app roles come from (Entra: Graph for overage);
//! - what is recorded of a token that failed verification;
//! - what `check` verifies beyond discovery and keys.
//!
//! The kinds: `oidc` (any OpenID Connect provider) and `entra` (Microsoft
//! Entra ID) for people; `kubernetes`, `github-actions` and `gitlab-ci`
//! for workloads (`workload`). A new kind is a module here and one entry in
//! `KINDS`.

mod entra;
mod github_actions;
mod gitlab_ci;
mod kubernetes;
mod oidc;
pub mod workload;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;

use super::auth_error::AuthError;
use super::graph::GraphStats;
use super::jwks::KeySet;
use super::provider::{IssuerKeys, ProviderError, ProviderSettings};
use super::token::{ClaimSet, Jwt, TokenError, TokenRules, string_claim, string_list};
use super::{ClaimedIdentity, VerifiedIdentity};
use crate::config::IssuerConfig;
use talos_sso_text::clean_field;

/// Every kind of issuer, by the name `kind` takes in the configuration.
const KINDS: &[Registration] = &[
    oidc::KIND,
    entra::KIND,
    kubernetes::KIND,
    github_actions::KIND,
    gitlab_ci::KIND,
];

/// The workload kinds' schemas: the claims their rules may name.
const WORKLOAD_SCHEMAS: [&workload::Schema; 3] =
    [&kubernetes::SCHEMA, &github_actions::SCHEMA, &gitlab_ci::SCHEMA];

/// The schema of workload kind `kind`; `None` for people's kinds.
pub fn workload_schema(kind: &str) -> Option<&'static workload::Schema> {
    WORKLOAD_SCHEMAS.into_iter().find(|schema| schema.kind == kind)
}

/// Entra's tenant for personal Microsoft accounts: refused unless an Entra
/// issuer lists it in `allowed_tenants`.
pub(super) const CONSUMER_TENANT: &str = "9188040d-6c67-4c5b-b112-36a304b66dad";

/// A future a kind returns from a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How the tokens of one kind of issuer are read.
pub trait Kind: Send + Sync + std::fmt::Debug {
    /// Whether a token naming `iss` is this issuer's; the other claims are
    /// not verified yet (an Entra template is filled in with `tid`).
    fn accepts(&self, iss: &str, claims: &ClaimSet) -> bool;

    /// The kind's own checks on a token whose signature and shared checks
    /// passed, and who it is about.
    fn identify(&self, claims: &ClaimSet) -> Result<Principal, TokenError>;

    /// Whether a token whose signature and shared checks passed is an
    /// application's own (client credentials, no person behind it). Such a
    /// token's `azp`/`appid` names the application, not the CLI. None by
    /// default: a kind that cannot tell says no.
    fn application_token(&self, _claims: &ClaimSet) -> bool {
        false
    }

    /// Who a token that failed verification claims to be, for its record.
    fn claimed(&self, claims: &ClaimSet) -> ClaimedIdentity;

    /// What must be looked up before the identity is complete (Entra:
    /// groups that did not fit in the token, from Graph).
    fn complete<'a>(
        &'a self,
        verified: VerifiedIdentity,
    ) -> BoxFuture<'a, Result<VerifiedIdentity, AuthError>> {
        Box::pin(std::future::ready(Ok(verified)))
    }

    /// What `check` verifies beyond discovery and keys, one line each
    /// (Entra: the Graph credentials); an error says what failed.
    fn check(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// The counts of the kind's Graph lookups, when it makes any (Entra
    /// with `entra_graph`), for the metrics.
    fn graph_stats(&self) -> Option<Arc<GraphStats>> {
        None
    }

    /// A workload kind's schema; `None` for people's kinds.
    fn workload_schema(&self) -> Option<&'static workload::Schema> {
        None
    }
}

/// Who a verified token is about, as its issuer's kind reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant, for kinds that have tenants (Entra `tid`).
    pub tenant: Option<String>,
    /// What names the person or workload for good (Entra `oid`, else `sub`).
    pub subject: String,
    pub username: String,
    /// The token's own id (`uti`, `jti`), when it has one.
    pub token_id: Option<String>,
    pub groups: Vec<String>,
    pub app_roles: Vec<String>,
    /// For an application's own token (client credentials): its client id
    /// (`azp`/`appid`). `None` for a person.
    pub application: Option<String>,
    /// For a workload's token: its kind and the claims rules match. `None`
    /// for a person or an application.
    pub workload: Option<workload::Workload>,
}

/// One kind, as the configuration names it.
struct Registration {
    name: &'static str,
    /// Every `iss` an issuer so configured accepts (templates filled in),
    /// or what is wrong with its configuration. Pure: run at load.
    accepted_issuers: fn(&IssuerConfig) -> Result<Vec<String>, String>,
    /// The kind, ready to read tokens; may read files the configuration names.
    build: fn(&IssuerConfig) -> Result<Box<dyn Kind>, String>,
}

fn registration(kind: &str) -> Result<&'static Registration, String> {
    KINDS.iter().find(|k| k.name == kind).ok_or_else(|| {
        let known: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
        format!(
            "unknown kind `{}`; the kinds are {}",
            clean_field(kind),
            known.join(", ")
        )
    })
}

/// Every `iss` the issuer `config` describes accepts, templates filled in
/// with each allowed tenant: what the `issuer` of its tokens' records
/// holds (up to case, as issuers are told apart at load). Pure.
pub fn accepted_issuers(config: &IssuerConfig) -> Result<Vec<String>, String> {
    (registration(&config.kind)?.accepted_issuers)(config)
}

/// Check the configured issuers at load (their names are the
/// configuration's business): kinds, each kind's own rules, and that a
/// token belongs to exactly one issuer: no `iss` is accepted by two,
/// except by a people's issuer and a workload issuer with no audience in
/// common (GitLab signs both people's and jobs' tokens), which a token's
/// `aud` then tells apart.
pub fn validate(issuers: &[IssuerConfig]) -> Result<(), String> {
    let mut accepted: Vec<(String, &IssuerConfig)> = Vec::new();
    for config in issuers {
        let section = config.section();
        let kind = registration(&config.kind).map_err(|e| format!("{section}.kind: {e}"))?;
        if config.audiences.is_empty() {
            return Err(format!("{section}.audiences: name at least one accepted `aud`"));
        }
        for iss in (kind.accepted_issuers)(config).map_err(|e| format!("{section}: {e}"))? {
            let clash = accepted.iter().find(|(seen, owner)| {
                owner.name != config.name && seen.eq_ignore_ascii_case(&iss) && !apart(owner, config)
            });
            if let Some((_, owner)) = clash {
                let how = if owner.is_workload() != config.is_workload() {
                    "give each its own audiences (a token's `aud` says which it is for)"
                } else {
                    "configure each issuer once"
                };
                return Err(format!(
                    "{} and {section} both accept tokens of issuer `{iss}`: {how}",
                    owner.section()
                ));
            }
            accepted.push((iss, config));
        }
    }
    Ok(())
}

/// Whether two issuers of the same `iss` are told apart by their tokens'
/// audiences: one people's and one workload's, no audience in common.
fn apart(one: &IssuerConfig, other: &IssuerConfig) -> bool {
    one.is_workload() != other.is_workload() && !one.audiences.iter().any(|aud| other.audiences.contains(aud))
}

/// Everything one issuer requires of a token, and how its kind reads it.
/// Pure: the keys and the clock are parameters.
#[derive(Debug)]
pub struct IssuerRules {
    /// The issuer's configured name.
    name: String,
    token: TokenRules,
    kind: Box<dyn Kind>,
}

impl IssuerRules {
    /// The rules `config` describes (it passed [`validate`]).
    pub fn new(config: &IssuerConfig) -> Result<Self, String> {
        let kind = (registration(&config.kind)?.build)(config)?;
        Ok(Self {
            name: config.name.clone(),
            token: TokenRules {
                audiences: config.audiences.clone(),
                clients: config.clients.clone(),
                leeway: config.leeway,
            },
            kind,
        })
    }

    /// Whether `claims` (not verified) name this issuer.
    pub fn accepts(&self, claims: &ClaimSet) -> bool {
        string_claim(claims, "iss").is_some_and(|iss| self.kind.accepts(iss, claims))
    }

    /// The workload kind's schema; `None` for a people's issuer.
    pub fn workload_schema(&self) -> Option<&'static workload::Schema> {
        self.kind.workload_schema()
    }

    /// Whether `claims` (not verified) name one of this issuer's audiences:
    /// what tells a people's issuer and a workload issuer of the same `iss`
    /// apart.
    pub fn for_audience(&self, claims: &ClaimSet) -> bool {
        string_list(claims, "aud")
            .iter()
            .any(|aud| self.token.audiences.contains(aud))
    }

    /// Verify `token` with `keys` at `now`: the shared checks, then the kind's.
    pub fn verify(
        &self,
        token: &str,
        keys: &KeySet,
        now: OffsetDateTime,
    ) -> Result<VerifiedIdentity, TokenError> {
        self.check(Jwt::parse(token)?, keys, now)
    }

    fn check(
        &self,
        jwt: Jwt<'_>,
        keys: &KeySet,
        now: OffsetDateTime,
    ) -> Result<VerifiedIdentity, TokenError> {
        let signed = jwt.verify(
            keys,
            &self.token,
            &|iss, claims| self.kind.accepts(iss, claims),
            &|claims| self.kind.application_token(claims),
            now,
        )?;
        let principal = self.kind.identify(&signed.claims)?;
        Ok(VerifiedIdentity::new(&self.name, signed, principal))
    }

    /// Who a token that failed verification claims to be.
    pub fn claimed(&self, claims: &ClaimSet) -> ClaimedIdentity {
        self.kind.claimed(claims)
    }

    /// Look up what the token could not carry (see [`Kind::complete`]).
    pub async fn complete(&self, verified: VerifiedIdentity) -> Result<VerifiedIdentity, AuthError> {
        self.kind.complete(verified).await
    }

    /// See [`Kind::graph_stats`].
    pub fn graph_stats(&self) -> Option<Arc<GraphStats>> {
        self.kind.graph_stats()
    }
}

/// An issuer that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    #[error("issuer `{name}`: {source}")]
    Provider {
        name: String,
        #[source]
        source: ProviderError,
    },
    #[error("issuer `{name}`: {reason}")]
    Kind { name: String, reason: String },
}

/// One trusted issuer: its rules and its provider's keys.
#[derive(Debug)]
pub struct Issuer {
    name: String,
    rules: IssuerRules,
    provider: Arc<IssuerKeys>,
}

impl Issuer {
    /// Discover the provider `config` names and fetch its keys.
    pub async fn discover(
        config: &IssuerConfig,
        min_refresh_interval: Duration,
    ) -> Result<Self, IssuerError> {
        let mut settings = ProviderSettings::new(config.issuer.clone());
        settings.name = config.name.clone();
        settings.discovery_url = config.discovery_url.clone();
        settings.min_refresh_interval = min_refresh_interval;
        settings.jwks_file = config.jwks_file.clone();
        if let Some(path) = &config.ca_file {
            settings.extra_roots =
                super::provider::extra_roots(path).map_err(|reason| IssuerError::Kind {
                    name: config.name.clone(),
                    reason: format!("identity.ca_file: {reason}"),
                })?;
        }
        let provider = IssuerKeys::discover(&settings)
            .await
            .map_err(|source| IssuerError::Provider {
                name: config.name.clone(),
                source,
            })?;
        Self::new(config, Arc::new(provider))
    }

    /// The issuer `config` describes, with keys from `provider`.
    pub fn new(config: &IssuerConfig, provider: Arc<IssuerKeys>) -> Result<Self, IssuerError> {
        let rules = IssuerRules::new(config).map_err(|reason| IssuerError::Kind {
            name: config.name.clone(),
            reason,
        })?;
        Ok(Self {
            name: config.name.clone(),
            rules,
            provider,
        })
    }

    pub fn rules(&self) -> &IssuerRules {
        &self.rules
    }

    pub fn provider(&self) -> &Arc<IssuerKeys> {
        &self.provider
    }

    /// Verify a bearer token with this issuer's keys and rules (groups not
    /// looked up: see [`IssuerRules::complete`]).
    pub async fn verify(&self, token: &str, now: OffsetDateTime) -> Result<VerifiedIdentity, TokenError> {
        self.verify_parsed(Jwt::parse(token)?, now).await
    }

    /// As [`Issuer::verify`], for a token already taken apart. An unknown
    /// `kid` refreshes the key set first (rate-limited).
    pub(super) async fn verify_parsed(
        &self,
        jwt: Jwt<'_>,
        now: OffsetDateTime,
    ) -> Result<VerifiedIdentity, TokenError> {
        let keys = self.provider.keys_for(jwt.kid()).await;
        self.rules.check(jwt, &keys, now)
    }

    /// What `check` prints of this issuer: its discovery, its keys, and
    /// what its kind verifies beyond them.
    pub async fn check(&self) -> Result<Vec<String>, String> {
        let metadata = self.provider.metadata();
        let who = if self.name == crate::config::LOGIN_ISSUER {
            "identity provider".to_owned()
        } else {
            format!("trusted issuer {}", self.name)
        };
        let how = if self.provider.from_file() {
            "key file"
        } else {
            "discovery"
        };
        let mut lines = vec![format!(
            "{who}: {} answers ({how}, {} signing keys from {})",
            metadata.issuer,
            self.provider.key_count(),
            metadata.jwks_uri
        )];
        lines.extend(self.rules.kind.check().await?);
        Ok(lines)
    }
}

/// A claim as text for the record of a refused token: cleaned, since
/// nobody vouched for it.
fn claim_text(claims: &ClaimSet, name: &str) -> Option<String> {
    claims.get(name).and_then(Value::as_str).map(clean_field)
}

/// Who a verified token is about, once its kind has found the subject (and
/// the tenant): the username, the token id (`uti`, else `jti`), the groups
/// and app roles of its claims. An application (`application`, its client
/// id) has no username claim: its client id is its name.
fn principal(
    claims: &ClaimSet,
    tenant: Option<&str>,
    subject: &str,
    username_claim: Option<&str>,
    application: Option<&str>,
) -> Result<Principal, TokenError> {
    let username = match application {
        Some(client_id) => client_id.to_owned(),
        None => username(claims, username_claim, subject)?,
    };
    Ok(Principal {
        tenant: tenant.map(str::to_owned),
        username,
        subject: subject.to_owned(),
        token_id: string_claim(claims, "uti")
            .or_else(|| string_claim(claims, "jti"))
            .map(str::to_owned),
        groups: string_list(claims, "groups"),
        app_roles: string_list(claims, "roles"),
        application: application.map(str::to_owned),
        workload: None,
    })
}

/// The token id a refused token claims, for its record.
fn claimed_token_id(claims: &ClaimSet) -> Option<String> {
    claim_text(claims, "uti").or_else(|| claim_text(claims, "jti"))
}

fn claimed_username(claims: &ClaimSet) -> Option<String> {
    ["preferred_username", "upn", "email"]
        .iter()
        .find_map(|name| claim_text(claims, name))
}

/// The username of a verified token. With `configured`, that claim or a
/// refusal; otherwise the first of `preferred_username`, `upn`,
/// `unique_name`, `email`, then the subject. `email` counts only with
/// `email_verified: true`.
fn username(claims: &ClaimSet, configured: Option<&str>, subject: &str) -> Result<String, TokenError> {
    let usable = |name: &str| {
        let email_ok = name != "email" || claims.get("email_verified").and_then(Value::as_bool) == Some(true);
        string_claim(claims, name).filter(|_| email_ok)
    };
    Ok(match configured {
        Some(name) => usable(name)
            .ok_or_else(|| TokenError::UsernameMissing(name.chars().take(64).collect()))?
            .to_owned(),
        None => ["preferred_username", "upn", "unique_name", "email"]
            .iter()
            .find_map(|name| usable(name))
            .unwrap_or(subject)
            .to_owned(),
    })
}
