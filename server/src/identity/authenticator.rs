//! From bearer token to a verified person with their groups: the token is
//! verified against the provider, and Entra group overage is resolved through
//! Graph, keeping only the groups some rule names.

use std::collections::BTreeSet;
use std::sync::Arc;

use time::OffsetDateTime;

use super::graph::GraphClient;
use super::provider::Provider;
use super::token::{TokenError, VerifiedToken};

#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(
        "you are in too many groups for them to fit in the token, and the server could not look them up \
         in Microsoft Graph ({0}); ask an administrator to configure identity.entra_graph, or to use app roles"
    )]
    OverageUnresolved(String),
}

impl AuthError {
    pub fn code(&self) -> &'static str {
        match self {
            AuthError::Token(e) => e.code(),
            AuthError::OverageUnresolved(_) => "groups_overage_unresolved",
        }
    }
}

#[derive(Debug)]
pub struct Authenticator {
    provider: Arc<Provider>,
    graph: Option<Arc<GraphClient>>,
    /// Lower-cased group ids that some rule names: the only ones kept.
    relevant_groups: BTreeSet<String>,
}

impl Authenticator {
    pub fn new(
        provider: Arc<Provider>,
        graph: Option<Arc<GraphClient>>,
        relevant_groups: impl IntoIterator<Item = String>,
    ) -> Self {
        let relevant_groups = relevant_groups
            .into_iter()
            .map(|g| g.to_ascii_lowercase())
            .collect();
        Self {
            provider,
            graph,
            relevant_groups,
        }
    }

    pub fn provider(&self) -> &Provider {
        &self.provider
    }

    pub async fn authenticate(&self, token: &str, now: OffsetDateTime) -> Result<VerifiedToken, AuthError> {
        let mut verified = self.provider.verify(token, now).await?;
        if verified.groups_overage {
            let Some(graph) = &self.graph else {
                return Err(AuthError::OverageUnresolved("Graph is not configured".into()));
            };
            let groups = graph
                .member_groups(&verified.subject)
                .await
                .map_err(|e| AuthError::OverageUnresolved(e.to_string()))?;
            verified.groups = groups;
        }
        verified
            .groups
            .retain(|g| self.relevant_groups.contains(&g.to_ascii_lowercase()));
        Ok(verified)
    }
}
