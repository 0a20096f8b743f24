//! Entra group overage: when a person is in too many groups, Entra leaves
//! `groups` out of the token and points at Graph instead. We ask Graph
//! ourselves, with the server's own client credentials, at a URL we build:
//! the URL inside the token is never fetched (it is attacker-influenced data
//! as far as this server is concerned until proven otherwise).
//!
//! Answers are cached briefly per user, and so is the app token. Each
//! lookup that goes to Graph is counted, succeeded or failed
//! ([`GraphStats`], read by the metrics).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;
use zeroize::Zeroizing;

/// How to reach Graph for one tenant.
#[derive(Clone)]
pub struct GraphSettings {
    pub tenant_id: String,
    pub client_id: String,
    pub client_secret: Zeroizing<String>,
    /// Token authority, `https://login.microsoftonline.com` by default.
    pub authority: String,
    /// Graph base URL, `https://graph.microsoft.com` by default.
    pub graph_url: String,
    /// How long a user's groups are reused.
    pub cache_ttl: Duration,
    pub http_timeout: Duration,
    /// Authorities trusted beyond the system's (`identity.ca_file`).
    pub extra_roots: Vec<reqwest::Certificate>,
}

impl std::fmt::Debug for GraphSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphSettings")
            .field("tenant_id", &self.tenant_id)
            .field("client_id", &self.client_id)
            .field("client_secret", &"<redacted>")
            .field("authority", &self.authority)
            .field("graph_url", &self.graph_url)
            .finish()
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum GraphError {
    #[error("Graph is unreachable: {0}")]
    Unreachable(String),
    #[error("Graph refused the server's credentials (HTTP {0})")]
    Unauthorized(u16),
    #[error("Graph answered HTTP {0}")]
    Status(u16),
    #[error("Graph returned an unreadable answer: {0}")]
    Malformed(String),
    #[error("the token's oid is not an object id")]
    BadObjectId,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    expires_in: u64,
}

#[derive(Deserialize)]
struct MemberObjects {
    value: Vec<String>,
}

/// Group lookups that went to Graph (the cached ones did not), by result.
#[derive(Debug, Default)]
pub struct GraphStats {
    ok: AtomicU64,
    failed: AtomicU64,
}

impl GraphStats {
    /// (succeeded, failed) so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

#[derive(Debug)]
pub struct GraphClient {
    http: reqwest::Client,
    settings: GraphSettings,
    app_token: tokio::sync::Mutex<Option<(Zeroizing<String>, Instant)>>,
    memberships: Mutex<HashMap<String, (Vec<String>, Instant)>>,
    stats: Arc<GraphStats>,
}

impl GraphClient {
    pub fn new(settings: GraphSettings) -> Result<Self, GraphError> {
        let http = super::provider::with_roots(reqwest::Client::builder(), &settings.extra_roots)
            .timeout(settings.http_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| GraphError::Unreachable(e.to_string()))?;
        Ok(Self {
            http,
            settings,
            app_token: tokio::sync::Mutex::new(None),
            memberships: Mutex::new(HashMap::new()),
            stats: Arc::default(),
        })
    }

    /// Shared, so that metrics can read them at each scrape.
    pub fn stats(&self) -> &Arc<GraphStats> {
        &self.stats
    }

    async fn app_token(&self) -> Result<Zeroizing<String>, GraphError> {
        let mut cached = self.app_token.lock().await;
        if let Some((token, expires)) = cached.as_ref()
            && Instant::now() < *expires
        {
            return Ok(token.clone());
        }
        let url = format!(
            "{}/{}/oauth2/v2.0/token",
            self.settings.authority.trim_end_matches('/'),
            self.settings.tenant_id
        );
        let scope = format!("{}/.default", self.settings.graph_url.trim_end_matches('/'));
        let form = [
            ("grant_type", "client_credentials"),
            ("client_id", self.settings.client_id.as_str()),
            ("client_secret", self.settings.client_secret.as_str()),
            ("scope", scope.as_str()),
        ];
        let response = self
            .http
            .post(&url)
            .form(&form)
            .send()
            .await
            .map_err(|e| GraphError::Unreachable(talos_sso_api::error::error_chain(&e.without_url())))?;
        let status = response.status();
        if status.as_u16() == 400 || status.as_u16() == 401 {
            return Err(GraphError::Unauthorized(status.as_u16()));
        }
        if !status.is_success() {
            return Err(GraphError::Status(status.as_u16()));
        }
        let body: TokenResponse = response
            .json()
            .await
            .map_err(|e| GraphError::Malformed(e.without_url().to_string()))?;
        // Renew a minute early so a token never expires mid-request.
        let lifetime = Duration::from_secs(body.expires_in.max(120) - 60);
        let token = Zeroizing::new(body.access_token);
        *cached = Some((token.clone(), Instant::now() + lifetime));
        Ok(token)
    }

    /// Ask for an app token with the configured credentials: what `check`
    /// runs so that a wrong secret shows before the first overage does.
    pub async fn check_credentials(&self) -> Result<(), GraphError> {
        self.app_token().await.map(|_| ())
    }

    /// Every group `oid` is a member of (transitively), from Graph. The
    /// app token (when it must be fetched) and the lookup share one
    /// `http_timeout`: two slow answers in a row must not add up to more
    /// than the request may take.
    pub async fn member_groups(&self, oid: &str) -> Result<Vec<String>, GraphError> {
        if !crate::guid::is_guid(oid) {
            return Err(GraphError::BadObjectId);
        }
        let now = Instant::now();
        if let Ok(cache) = self.memberships.lock()
            && let Some((groups, at)) = cache.get(oid)
            && now.duration_since(*at) < self.settings.cache_ttl
        {
            return Ok(groups.clone());
        }
        let within = self.settings.http_timeout;
        let looked_up = tokio::time::timeout(within, self.fetch_member_groups(oid, now))
            .await
            .unwrap_or_else(|_| Err(GraphError::Unreachable(format!("no answer within {within:?}"))));
        let counter = match &looked_up {
            Ok(_) => &self.stats.ok,
            Err(_) => &self.stats.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        looked_up
    }

    /// Ask Graph (`oid` is an object id, not in the cache at `now`).
    async fn fetch_member_groups(&self, oid: &str, now: Instant) -> Result<Vec<String>, GraphError> {
        let token = self.app_token().await?;
        let url = format!(
            "{}/v1.0/users/{oid}/getMemberObjects",
            self.settings.graph_url.trim_end_matches('/')
        );
        let response = self
            .http
            .post(&url)
            .bearer_auth(token.as_str())
            .json(&serde_json::json!({"securityEnabledOnly": false}))
            .send()
            .await
            .map_err(|e| GraphError::Unreachable(talos_sso_api::error::error_chain(&e.without_url())))?;
        let status = response.status();
        if status.as_u16() == 401 || status.as_u16() == 403 {
            // The cached app token may have been revoked: fetch a new one next time.
            *self.app_token.lock().await = None;
            return Err(GraphError::Unauthorized(status.as_u16()));
        }
        if !status.is_success() {
            return Err(GraphError::Status(status.as_u16()));
        }
        let body: MemberObjects = response
            .json()
            .await
            .map_err(|e| GraphError::Malformed(e.without_url().to_string()))?;
        if let Ok(mut cache) = self.memberships.lock() {
            cache.retain(|_, (_, at)| now.duration_since(*at) < self.settings.cache_ttl);
            cache.insert(oid.to_owned(), (body.value.clone(), now));
        }
        Ok(body.value)
    }
}
