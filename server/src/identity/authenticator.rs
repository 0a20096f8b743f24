//! From bearer token to a verified person with their groups, over every
//! issuer the server trusts: the login issuer (`identity`) and the trusted
//! issuers (`identity.trusted_issuers`).
//!
//! A token goes to the one issuer whose rules accept its (unverified)
//! `iss` (and, when a people's issuer and a workload issuer share it, its
//! `aud`), before any key work; a token whose `iss` no issuer accepts is
//! refused at once (`token_issuer_untrusted`), one without a readable
//! payload goes to the login issuer, whose checks refuse it (its signature
//! first). The issuer verifies it with its own keys
//! and rules, its kind completes what the token could not carry (Entra
//! group overage), and only the groups some rule names are kept.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use super::auth_error::AuthError;
use super::issuer::{Issuer, IssuerError};
use super::token::{ClaimSet, Jwt, TokenError, string_claim, unverified_claims};
use super::{ClaimedIdentity, VerifiedIdentity};
use crate::config::IdentityConfig;

/// The groups decisions look at (the rules', the auditors', the admins'),
/// lower-cased: the only groups kept of a person's. Part of the settings a
/// reload replaces, so that one request filters with the groups of the
/// rules it is decided by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelevantGroups(Arc<BTreeSet<String>>);

impl RelevantGroups {
    pub fn new(groups: impl IntoIterator<Item = String>) -> Self {
        Self(Arc::new(
            groups.into_iter().map(|g| g.to_ascii_lowercase()).collect(),
        ))
    }

    fn contains(&self, group: &str) -> bool {
        self.0.contains(&group.to_ascii_lowercase())
    }
}

/// Every trusted issuer.
#[derive(Debug)]
pub struct Authenticator {
    /// The issuer people log in with (`/v1/info` names it to the CLI).
    login: Issuer,
    /// Further issuers whose tokens are accepted.
    trusted: Vec<Issuer>,
}

impl Authenticator {
    pub fn new(login: Issuer, trusted: Vec<Issuer>) -> Self {
        Self { login, trusted }
    }

    /// Discover every issuer `identity` configures and fetch their keys.
    pub async fn discover(identity: &IdentityConfig) -> Result<Self, IssuerError> {
        let min_refresh = identity.jwks_min_refresh_interval;
        let login = Issuer::discover(&identity.login_issuer(), min_refresh).await?;
        let metadata = login.provider().metadata();
        if metadata.authorization_endpoint.is_empty() || metadata.token_endpoint.is_empty() {
            return Err(IssuerError::Kind {
                name: crate::config::LOGIN_ISSUER.into(),
                reason: format!(
                    "the discovery document of {} names no authorization_endpoint or token_endpoint: \
                     people cannot log in with it",
                    metadata.issuer
                ),
            });
        }
        let mut trusted = Vec::with_capacity(identity.trusted_issuers.len());
        for config in &identity.trusted_issuers {
            trusted.push(Issuer::discover(config, min_refresh).await?);
        }
        Ok(Self::new(login, trusted))
    }

    /// The login issuer first, then the trusted ones.
    pub fn issuers(&self) -> impl Iterator<Item = &Issuer> {
        std::iter::once(&self.login).chain(&self.trusted)
    }

    pub fn login(&self) -> &Issuer {
        &self.login
    }

    /// The issuer whose rules accept these (unverified) claims: of those
    /// that accept its `iss`, the one for its `aud`, else the first. `None`
    /// when no issuer accepts its `iss`.
    fn route_claims(&self, claims: &ClaimSet) -> Option<&Issuer> {
        let mut accepting = self.issuers().filter(|issuer| issuer.rules().accepts(claims));
        let first = accepting.next()?;
        Some(
            std::iter::once(first)
                .chain(accepting)
                .find(|issuer| issuer.rules().for_audience(claims))
                .unwrap_or(first),
        )
    }

    /// Whether a token routed to a people's issuer is a workload's of the
    /// same `iss` (a GitLab job asking for the people's audience): it
    /// carries a claim only that workload kind's tokens carry.
    fn workload_posing_as_person(&self, chosen: &Issuer, claims: &ClaimSet) -> bool {
        chosen.rules().workload_schema().is_none()
            && self.issuers().any(|issuer| {
                issuer.rules().accepts(claims)
                    && issuer
                        .rules()
                        .workload_schema()
                        .is_some_and(|schema| schema.marks(claims))
            })
    }

    /// The issuer a token goes to: [`Authenticator::route_claims`], the
    /// login issuer for claims that cannot be read.
    fn route(&self, claims: Option<&ClaimSet>) -> Result<&Issuer, TokenError> {
        let Some(claims) = claims else {
            return Ok(&self.login);
        };
        let chosen = self
            .route_claims(claims)
            .ok_or_else(|| match string_claim(claims, "iss") {
                Some(iss) => TokenError::IssuerUntrusted(talos_sso_text::clean(iss, 200)),
                None => TokenError::Malformed("no iss"),
            })?;
        if self.workload_posing_as_person(chosen, claims) {
            return Err(TokenError::WrongAudience);
        }
        Ok(chosen)
    }

    /// Verify `token` and complete who it names (groups from Graph on
    /// overage), keeping only the `relevant` groups.
    pub async fn authenticate(
        &self,
        token: &str,
        now: OffsetDateTime,
        relevant: &RelevantGroups,
    ) -> Result<VerifiedIdentity, AuthError> {
        let jwt = Jwt::parse(token)?;
        let issuer = self.route(jwt.unverified_claims())?;
        let verified = issuer.verify_parsed(jwt, now).await?;
        let mut verified = issuer.rules().complete(verified).await?;
        verified.groups.retain(|g| relevant.contains(g));
        Ok(verified)
    }

    /// Who a token that failed verification claims to be, read by the
    /// issuer it names (the login issuer when none accepts it).
    pub fn claimed(&self, token: &str) -> Option<ClaimedIdentity> {
        let claims = unverified_claims(token)?;
        let issuer = self.route_claims(&claims).unwrap_or(&self.login);
        Some(issuer.rules().claimed(&claims))
    }

    /// Age of the login issuer's key set (for `/readyz`). Only the login
    /// issuer's: a trusted issuer whose keys went stale refuses its own
    /// tokens (and its refreshes fail in the log), but must not take the
    /// server out of rotation for the people who log in.
    pub fn keys_age(&self) -> Duration {
        self.login().provider().keys_age()
    }

    /// The counts of every issuer's Graph lookups (issuers without Graph
    /// have none).
    pub fn graph_stats(&self) -> Vec<std::sync::Arc<super::graph::GraphStats>> {
        self.issuers()
            .filter_map(|issuer| issuer.rules().graph_stats())
            .collect()
    }

    /// Whether every issuer's last key-set fetch succeeded.
    pub fn providers_reachable(&self) -> bool {
        self.issuers().all(|issuer| issuer.provider().reachable())
    }

    /// Re-read each issuer's discovery and keys every `period`, each on its
    /// own task, until the returned task is aborted.
    pub fn spawn_refreshers(&self, period: Duration) -> tokio::task::JoinHandle<()> {
        let mut refreshers = tokio::task::JoinSet::new();
        for issuer in self.issuers() {
            refreshers.spawn(issuer.provider().refresh_periodically(period));
        }
        // Dropping the set (when this task is aborted) aborts every refresher.
        tokio::spawn(async move { while refreshers.join_next().await.is_some() {} })
    }

    /// What `check` prints of every issuer, or the first failure.
    pub async fn check(&self) -> Result<Vec<String>, String> {
        let mut lines = Vec::new();
        for issuer in self.issuers() {
            lines.extend(issuer.check().await?);
        }
        Ok(lines)
    }
}
