//! One issuer's identity provider as the server sees it: discovery at
//! start, and a JWKS cache that refreshes when a token names an unknown
//! `kid`. What the keys verify is the issuer's business (`identity::issuer`).
//!
//! Refreshes on unknown keys are rate-limited (`min_refresh_interval`, a few
//! minutes) so a stream of tokens with made-up `kid`s cannot turn the server
//! into a load generator against the provider. A failed refresh keeps the
//! last good key set. A background task re-reads discovery and the keys
//! periodically.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use super::jwks::KeySet;

/// How the provider is reached.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    /// The issuer's name in the logs (the configured name).
    pub name: String,
    /// The configured issuer; `{tenantid}` marks Entra's multi-tenant form.
    pub issuer: String,
    /// Where the discovery document is; by default derived from the issuer
    /// (`{tenantid}` read as `organizations`).
    pub discovery_url: Option<String>,
    /// Minimum time between two refreshes caused by unknown `kid`s.
    pub min_refresh_interval: Duration,
    /// Timeout of each request to the provider.
    pub http_timeout: Duration,
    /// Authorities trusted beyond the system's (`identity.ca_file`).
    pub extra_roots: Vec<reqwest::Certificate>,
    /// The key set from this JWKS file instead of discovery (a workload
    /// issuer that cannot be reached).
    pub jwks_file: Option<std::path::PathBuf>,
}

impl ProviderSettings {
    pub fn new(issuer: impl Into<String>) -> Self {
        let issuer = issuer.into();
        Self {
            name: issuer.clone(),
            issuer,
            discovery_url: None,
            min_refresh_interval: Duration::from_secs(300),
            http_timeout: Duration::from_secs(10),
            extra_roots: Vec::new(),
            jwks_file: None,
        }
    }

    pub fn discovery_url(&self) -> String {
        self.discovery_url
            .clone()
            .unwrap_or_else(|| talos_sso_api::issuer::discovery_url(&self.issuer))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url} did not return a valid {what} document: {reason}")]
    Malformed {
        url: String,
        what: &'static str,
        reason: String,
    },
    #[error("the discovery document names issuer `{found}`, but the configuration says `{expected}`")]
    IssuerMismatch { expected: String, found: String },
}

/// What the client needs to know to log in (served by `/v1/info` later).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct ProviderMetadata {
    pub issuer: String,
    /// Empty for issuers nobody logs in with (workload issuers publish no
    /// endpoints); the login issuer must have both (`Authenticator`).
    #[serde(default)]
    pub authorization_endpoint: String,
    #[serde(default)]
    pub token_endpoint: String,
    #[serde(default)]
    pub device_authorization_endpoint: Option<String>,
    pub jwks_uri: String,
    /// RFC 9207: the provider names itself (`iss`) in every authorization
    /// answer, so one without it is not the provider's.
    #[serde(default)]
    pub authorization_response_iss_parameter_supported: bool,
}

/// One issuer's signing keys: found by discovery, cached, refreshed.
#[derive(Debug)]
pub struct IssuerKeys {
    /// The issuer's name, for the logs.
    name: String,
    http: reqwest::Client,
    /// Where discovery is read from, and the issuer it must name.
    discovery_url: String,
    /// The key set's file, for an issuer without discovery.
    jwks_file: Option<std::path::PathBuf>,
    expected_issuer: String,
    /// Re-read by the background refresher, so a moved `jwks_uri` is followed.
    metadata: RwLock<ProviderMetadata>,
    keys: RwLock<Arc<KeySet>>,
    /// When the last refresh attempt ended (successful or not); `None`
    /// until the first one after discovery. Held during a refresh, so
    /// concurrent callers wait for it and then use its result.
    last_refresh: tokio::sync::Mutex<Option<Instant>>,
    /// Whether the last attempt to fetch the key set succeeded (for
    /// `/readyz`: the cached keys still serve while the provider is down).
    last_fetch_ok: std::sync::atomic::AtomicBool,
    min_refresh_interval: Duration,
    /// When a key set was last fetched successfully (for `/readyz`).
    keys_fetched_at: std::sync::Mutex<Instant>,
    /// Refreshes that succeeded / failed (for metrics).
    refreshes_ok: std::sync::atomic::AtomicU64,
    refreshes_failed: std::sync::atomic::AtomicU64,
}

async fn fetch(http: &reqwest::Client, url: &str) -> Result<String, ProviderError> {
    let response = http
        .get(url)
        .send()
        .await
        .map_err(|e| ProviderError::Unreachable {
            url: url.to_owned(),
            reason: talos_sso_api::error::error_chain(&e.without_url()),
        })?;
    let status = response.status();
    if !status.is_success() {
        return Err(ProviderError::Status {
            url: url.to_owned(),
            status: status.as_u16(),
        });
    }
    response.text().await.map_err(|e| ProviderError::Unreachable {
        url: url.to_owned(),
        reason: talos_sso_api::error::error_chain(&e.without_url()),
    })
}

/// The certificates of the PEM bundle at `path` (`identity.ca_file`), each
/// checked to be a certificate; an error names the file and what is wrong.
pub fn extra_roots(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, String> {
    let shown = path.display();
    let text = crate::text_file::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let blocks = pem::parse_many(text.as_bytes()).map_err(|e| format!("{shown} is not PEM: {e}"))?;
    if blocks.is_empty() {
        return Err(format!("{shown} holds no PEM certificate"));
    }
    blocks
        .iter()
        .enumerate()
        .map(|(index, block)| {
            if block.tag() != "CERTIFICATE" {
                return Err(format!(
                    "{shown} holds a `{}` block",
                    talos_sso_text::clean(block.tag(), 64)
                ));
            }
            <x509_cert::Certificate as der::Decode>::from_der(block.contents())
                .map_err(|e| format!("{shown}: certificate {} does not parse: {e}", index + 1))?;
            reqwest::Certificate::from_der(block.contents()).map_err(|e| e.to_string())
        })
        .collect()
}

/// Largest JWKS file read (a key set is a few KiB).
const MAX_JWKS_FILE: u64 = 1024 * 1024;

/// The key set in the JWKS file at `path` (`jwks_file`).
fn read_keys(path: &std::path::Path) -> Result<KeySet, ProviderError> {
    let url = format!("file {}", path.display());
    let unreadable = |reason: String| ProviderError::Unreachable {
        url: url.clone(),
        reason,
    };
    let size = std::fs::metadata(path)
        .map_err(|e| unreadable(e.to_string()))?
        .len();
    if size > MAX_JWKS_FILE {
        return Err(unreadable(format!(
            "{size} bytes; a key set is at most {MAX_JWKS_FILE}"
        )));
    }
    let text = crate::text_file::read(path).map_err(|e| unreadable(e.to_string()))?;
    KeySet::from_json(&text).map_err(|e| ProviderError::Malformed {
        url: url.clone(),
        what: "JWKS",
        reason: e.to_string(),
    })
}

/// `builder`, also trusting `roots`.
pub fn with_roots(builder: reqwest::ClientBuilder, roots: &[reqwest::Certificate]) -> reqwest::ClientBuilder {
    roots.iter().fold(builder, |builder, root| {
        builder.add_root_certificate(root.clone())
    })
}

impl IssuerKeys {
    /// Fetch the discovery document and the key set. Fails when either is
    /// unavailable or malformed, or the issuer is not the configured one.
    pub async fn discover(settings: &ProviderSettings) -> Result<Self, ProviderError> {
        let http = with_roots(reqwest::Client::builder(), &settings.extra_roots)
            .timeout(settings.http_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ProviderError::Unreachable {
                url: settings.issuer.clone(),
                reason: e.to_string(),
            })?;
        let discovery_url = settings.discovery_url();
        let (metadata, keys) = match &settings.jwks_file {
            Some(path) => {
                let metadata = ProviderMetadata {
                    issuer: settings.issuer.clone(),
                    authorization_endpoint: String::new(),
                    token_endpoint: String::new(),
                    device_authorization_endpoint: None,
                    jwks_uri: format!("file {}", path.display()),
                    authorization_response_iss_parameter_supported: false,
                };
                (metadata, read_keys(path)?)
            }
            None => {
                let metadata = Self::fetch_metadata(&http, &discovery_url, &settings.issuer).await?;
                let keys = Self::fetch_keys(&http, &metadata.jwks_uri).await?;
                (metadata, keys)
            }
        };
        tracing::info!(name = %settings.name, issuer = %metadata.issuer, keys = keys.len(), "identity provider discovered");
        Ok(Self {
            name: settings.name.clone(),
            http,
            discovery_url,
            jwks_file: settings.jwks_file.clone(),
            expected_issuer: settings.issuer.clone(),
            metadata: RwLock::new(metadata),
            keys: RwLock::new(Arc::new(keys)),
            last_refresh: tokio::sync::Mutex::new(None),
            last_fetch_ok: std::sync::atomic::AtomicBool::new(true),
            min_refresh_interval: settings.min_refresh_interval,
            keys_fetched_at: std::sync::Mutex::new(Instant::now()),
            refreshes_ok: Default::default(),
            refreshes_failed: Default::default(),
        })
    }

    async fn fetch_metadata(
        http: &reqwest::Client,
        url: &str,
        expected_issuer: &str,
    ) -> Result<ProviderMetadata, ProviderError> {
        let text = fetch(http, url).await?;
        let metadata: ProviderMetadata =
            serde_json::from_str(&text).map_err(|e| ProviderError::Malformed {
                url: url.to_owned(),
                what: "discovery",
                reason: e.to_string(),
            })?;
        if metadata.issuer != expected_issuer {
            return Err(ProviderError::IssuerMismatch {
                expected: expected_issuer.to_owned(),
                found: metadata.issuer,
            });
        }
        Ok(metadata)
    }

    /// Read the discovery document again; on any failure the previous one
    /// stays in use.
    pub async fn rediscover(&self) -> Result<(), ProviderError> {
        if self.jwks_file.is_some() {
            return Ok(());
        }
        let metadata = Self::fetch_metadata(&self.http, &self.discovery_url, &self.expected_issuer).await?;
        match self.metadata.write() {
            Ok(mut guard) => *guard = metadata,
            Err(poisoned) => *poisoned.into_inner() = metadata,
        }
        Ok(())
    }

    async fn fetch_keys(http: &reqwest::Client, url: &str) -> Result<KeySet, ProviderError> {
        let text = fetch(http, url).await?;
        KeySet::from_json(&text).map_err(|e| ProviderError::Malformed {
            url: url.to_owned(),
            what: "JWKS",
            reason: e.to_string(),
        })
    }

    pub fn metadata(&self) -> ProviderMetadata {
        self.metadata
            .read()
            .map(|m| m.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    /// The configured issuer (an Entra template stays a template).
    pub fn issuer(&self) -> &str {
        &self.expected_issuer
    }

    /// Key-set refreshes so far: (succeeded, failed).
    pub fn refresh_counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.refreshes_ok.load(Relaxed),
            self.refreshes_failed.load(Relaxed),
        )
    }

    /// Whether the last attempt to fetch the key set succeeded.
    pub fn reachable(&self) -> bool {
        self.last_fetch_ok.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many usable keys the current key set holds.
    pub fn key_count(&self) -> usize {
        self.current_keys().len()
    }

    /// How long ago the key set was last fetched successfully.
    pub fn keys_age(&self) -> Duration {
        self.keys_fetched_at
            .lock()
            .map(|at| at.elapsed())
            .unwrap_or(Duration::MAX)
    }

    fn current_keys(&self) -> Arc<KeySet> {
        self.keys
            .read()
            .map(|k| k.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    /// Fetch the key set now. On failure the previous set stays in use.
    pub async fn refresh_keys(&self) -> Result<usize, ProviderError> {
        let mut last = self.last_refresh.lock().await;
        let result = self.fetch_and_store().await;
        *last = Some(Instant::now());
        result
    }

    /// Whether the keys come from a file rather than discovery.
    pub fn from_file(&self) -> bool {
        self.jwks_file.is_some()
    }

    async fn fetch_and_store(&self) -> Result<usize, ProviderError> {
        let fetched = match &self.jwks_file {
            Some(path) => read_keys(path),
            None => Self::fetch_keys(&self.http, &self.metadata().jwks_uri).await,
        };
        match fetched {
            Ok(keys) => {
                let count = keys.len();
                match self.keys.write() {
                    Ok(mut guard) => *guard = Arc::new(keys),
                    Err(poisoned) => *poisoned.into_inner() = Arc::new(keys),
                }
                if let Ok(mut at) = self.keys_fetched_at.lock() {
                    *at = Instant::now();
                }
                self.refreshes_ok
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.last_fetch_ok
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(name = %self.name, keys = count, "identity provider keys refreshed");
                Ok(count)
            }
            Err(error) => {
                self.refreshes_failed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.last_fetch_ok
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(name = %self.name, %error, "identity provider keys could not be refreshed; keeping the last good set");
                Err(error)
            }
        }
    }

    /// Refresh unless an attempt ended within `min_refresh_interval`, or
    /// ended while this caller waited for it: callers that queue behind a
    /// refresh use its result instead of each starting one of their own
    /// (against a slow provider that would cost every waiter a full
    /// timeout, one after the other).
    async fn refresh_if_allowed(&self) {
        let asked = Instant::now();
        let mut last = self.last_refresh.lock().await;
        if last.is_some_and(|at| at >= asked || at.elapsed() < self.min_refresh_interval) {
            return;
        }
        let _ = self.fetch_and_store().await;
        *last = Some(Instant::now());
    }

    /// The current key set, for a token signed with `kid`: when the set
    /// lacks it, one (rate-limited) refresh first, then whatever set is
    /// current afterwards.
    pub async fn keys_for(&self, kid: &str) -> Arc<KeySet> {
        let keys = self.current_keys();
        if keys.get(kid).is_some() {
            return keys;
        }
        self.refresh_if_allowed().await;
        self.current_keys()
    }

    /// Re-read discovery and refresh the keys every `period`, for as long
    /// as the provider exists.
    pub fn refresh_periodically(
        self: &Arc<Self>,
        period: Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        let provider = Arc::downgrade(self);
        async move {
            let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
            loop {
                ticker.tick().await;
                let Some(provider) = provider.upgrade() else {
                    return;
                };
                if let Err(error) = provider.rediscover().await {
                    tracing::warn!(name = %provider.name, %error, "identity provider discovery failed; keeping the last good document");
                }
                let _ = provider.refresh_keys().await;
            }
        }
    }

    /// [`IssuerKeys::refresh_periodically`] on a task of its own, until the
    /// returned task is aborted.
    pub fn spawn_refresher(self: &Arc<Self>, period: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.refresh_periodically(period))
    }
}

/// Key-set refreshes so far over several providers: (succeeded, failed).
pub fn total_refresh_counts<'a>(providers: impl Iterator<Item = &'a IssuerKeys>) -> (u64, u64) {
    providers
        .map(IssuerKeys::refresh_counts)
        .fold((0, 0), |(ok, failed), (o, f)| (ok + o, failed + f))
}
