//! Logging in with the identity provider: discovery, the browser flow
//! (authorization code + PKCE on a loopback redirect), the device flow, and
//! silent renewal with a cached refresh token; and the tokens a workload
//! brings instead (`workload`: a token file, GitHub Actions).
//!
//! The ID token that comes back is verified here too (signature from the
//! provider's keys, issuer, audience, expiry, and the nonce for the browser
//! flow) before it is sent to the server, which verifies it again.

pub mod browser;
pub mod cache;
pub mod device;
pub mod github_actions;
pub mod workload;

use std::time::Duration;

use openidconnect::core::{
    CoreAuthDisplay, CoreClaimName, CoreClaimType, CoreClient, CoreClientAuthMethod, CoreGrantType,
    CoreJsonWebKey, CoreJweContentEncryptionAlgorithm, CoreJweKeyManagementAlgorithm, CoreResponseMode,
    CoreResponseType, CoreSubjectIdentifierType, CoreTokenResponse,
};
use openidconnect::{
    AdditionalProviderMetadata, ClientId, DeviceAuthorizationUrl, EndpointMaybeSet, EndpointNotSet,
    EndpointSet, IssuerUrl, Nonce, OAuth2TokenResponse, ProviderMetadata, RefreshToken, TokenResponse,
};
use serde::{Deserialize, Serialize};
use talos_sso_api::error::error_chain;
use talos_sso_api::{BearerToken, ServerInfo, issuer};
use zeroize::Zeroizing;

use crate::connection::{ConnectionError, Peer};
use crate::trust::ExtraRoots;

/// What discovery says beyond the core metadata openidconnect reads.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct MoreMetadata {
    /// Entra (and RFC 8628 providers) announce the device endpoint.
    #[serde(default)]
    pub device_authorization_endpoint: Option<DeviceAuthorizationUrl>,
    /// RFC 9207: the provider names itself (`iss`) in every authorization
    /// response, so one without it is not its own.
    #[serde(default)]
    pub authorization_response_iss_parameter_supported: bool,
}
impl AdditionalProviderMetadata for MoreMetadata {}

pub type Metadata = ProviderMetadata<
    MoreMetadata,
    CoreAuthDisplay,
    CoreClientAuthMethod,
    CoreClaimName,
    CoreClaimType,
    CoreGrantType,
    CoreJweContentEncryptionAlgorithm,
    CoreJweKeyManagementAlgorithm,
    CoreJsonWebKey,
    CoreResponseMode,
    CoreResponseType,
    CoreSubjectIdentifierType,
>;

/// The client as discovery leaves it: auth URL set, token URL maybe.
pub type Client = CoreClient<
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("cannot reach the identity provider {issuer}: {reason}")]
    Discovery { issuer: String, reason: String },
    /// No answer from the provider: the address, the network or TLS.
    #[error(transparent)]
    Unreachable(ConnectionError),
    #[error("the browser login did not finish within {0:?}; run `talos-sso login` again (or use --device)")]
    Timeout(Duration),
    #[error("the login was refused by the identity provider: {0}")]
    Refused(String),
    #[error("the identity provider's answer does not check out: {0}")]
    Invalid(String),
    #[error("the device code expired before the sign-in was completed; run `talos-sso login --device` again")]
    DeviceExpired,
    #[error("the sign-in was declined on the device login page")]
    DeviceDeclined,
    #[error("this identity provider offers no device login; use the browser login")]
    NoDeviceEndpoint,
    #[error("the loopback callback failed: {0}")]
    Callback(String),
}

/// What a login yields.
pub struct Tokens {
    /// The token sent to the server: the one the server names in
    /// `/v1/info` (`token`).
    pub bearer: Zeroizing<String>,
    pub refresh_token: Option<Zeroizing<String>>,
    pub username: String,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// The OpenID Connect client the CLI logs in with, against the provider
/// the server names (discovered).
#[derive(Debug, Clone)]
pub struct LoginClient {
    /// Logs each exchange under `--debug` (see [`crate::debug`]).
    pub http: crate::debug::HttpClient,
    pub client: Client,
    pub device_endpoint: Option<DeviceAuthorizationUrl>,
    pub scopes: Vec<String>,
    /// Which token the server wants.
    pub token: BearerToken,
    pub issuer: String,
    pub client_id: String,
    /// Whether discovery promised `iss` in authorization responses (RFC 9207).
    pub names_itself_in_redirects: bool,
}

impl LoginClient {
    /// Discover the provider `info` names, also trusting `roots`
    /// (`login --provider-certificate-authority`).
    pub async fn discover(info: &ServerInfo, roots: Option<&ExtraRoots>) -> Result<Self, LoginError> {
        let discovery_error = |reason: String| LoginError::Discovery {
            issuer: info.issuer.clone(),
            reason,
        };
        let check = |url: &str| {
            ConnectionError::check_address(Peer::IdentityProvider, url).map_err(LoginError::Unreachable)
        };
        let http = ExtraRoots::apply(roots, openidconnect::reqwest::Client::builder())
            // Following redirects from the provider would open the client to SSRF.
            .redirect(openidconnect::reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(20))
            .build()
            .map_err(|e| discovery_error(e.to_string()))?;
        let http = crate::debug::HttpClient::new(http);
        let metadata = if issuer::is_template(&info.issuer) {
            // Entra's multi-tenant issuer is a template: discovery lives at
            // `organizations` and names the template, which openidconnect's
            // issuer check cannot match. Fetch it directly; the ID token's
            // issuer is checked against the template in `tokens_from`.
            let url = info
                .discovery_url
                .clone()
                .unwrap_or_else(|| issuer::discovery_url(&info.issuer));
            check(&url)?;
            let response = http
                .get(&url)
                .await
                .map_err(|e| unreachable(&url, &e).unwrap_or_else(|| discovery_error(e.to_string())))?;
            let metadata: Metadata = response
                .json()
                .await
                .map_err(|e| discovery_error(e.to_string()))?;
            if metadata.issuer().as_str() != info.issuer {
                return Err(discovery_error(format!(
                    "the discovery document names issuer {}, the server says {}",
                    metadata.issuer().as_str(),
                    info.issuer
                )));
            }
            let jwks_uri = metadata.jwks_uri().url().as_str().to_owned();
            let jwks = openidconnect::JsonWebKeySet::fetch_async(metadata.jwks_uri(), &http)
                .await
                .map_err(|e| {
                    unreachable(&jwks_uri, &e).unwrap_or_else(|| discovery_error(error_chain(&e)))
                })?;
            metadata.set_jwks(jwks)
        } else {
            check(&info.issuer)?;
            let issuer = IssuerUrl::new(info.issuer.clone()).map_err(|e| discovery_error(e.to_string()))?;
            Metadata::discover_async(issuer, &http).await.map_err(|e| {
                unreachable(&info.issuer, &e).unwrap_or_else(|| discovery_error(error_chain(&e)))
            })?
        };
        let device_endpoint = metadata
            .additional_metadata()
            .device_authorization_endpoint
            .clone();
        let names_itself_in_redirects = metadata
            .additional_metadata()
            .authorization_response_iss_parameter_supported;
        let client =
            CoreClient::from_provider_metadata(metadata, ClientId::new(info.client_id.clone()), None);
        Ok(Self {
            http,
            client,
            device_endpoint,
            scopes: info.scopes.clone(),
            token: info.token,
            issuer: info.issuer.clone(),
            client_id: info.client_id.clone(),
            names_itself_in_redirects,
        })
    }

    /// Verify the ID token of a token response; `nonce` for the browser flow.
    pub fn tokens_from(
        &self,
        response: &CoreTokenResponse,
        nonce: Option<&Nonce>,
    ) -> Result<Tokens, LoginError> {
        let id_token = response
            .id_token()
            .ok_or_else(|| LoginError::Invalid("no ID token in the answer".into()))?;
        let template = issuer::is_template(&self.issuer);
        // With a `{tenantid}` issuer the check below replaces openidconnect's.
        let verifier = self.client.id_token_verifier().require_issuer_match(!template);
        let claims = match nonce {
            Some(nonce) => id_token.claims(&verifier, nonce),
            // Refresh and device-code ID tokens carry no nonce.
            None => id_token.claims(&verifier, |_: Option<&Nonce>| Ok(())),
        }
        .map_err(|e| LoginError::Invalid(e.to_string()))?;
        if template {
            let tenant = token_claim(&id_token.to_string(), "tid")
                .ok_or_else(|| LoginError::Invalid("the ID token names no tenant (tid)".into()))?;
            let expected = issuer::for_tenant(&self.issuer, &tenant);
            if claims.issuer().as_str() != expected {
                return Err(LoginError::Invalid(format!(
                    "the ID token's issuer {} is not {expected}",
                    claims.issuer().as_str()
                )));
            }
        }
        let username = claims
            .preferred_username()
            .map(|u| u.as_str().to_owned())
            .or_else(|| claims.email().map(|e| e.as_str().to_owned()))
            .unwrap_or_else(|| claims.subject().as_str().to_owned());
        let bearer = match self.token {
            BearerToken::IdToken => id_token.to_string(),
            BearerToken::AccessToken => {
                let access = response.access_token().secret();
                // A JWT has three dot-separated parts; an opaque access
                // token (most providers' default) cannot be checked by the
                // server at all, so say so here rather than as its refusal.
                if access.split('.').count() != 3 {
                    return Err(LoginError::Invalid(
                        "the server expects the access token, but the identity provider's is opaque \
                         (not a JWT): the server's operators set identity.token: access_token; \
                         use id_token, or make the provider issue JWT access tokens for this API"
                            .into(),
                    ));
                }
                access.clone()
            }
        };
        Ok(Tokens {
            bearer: Zeroizing::new(bearer),
            refresh_token: response
                .refresh_token()
                .map(|r| Zeroizing::new(r.secret().clone())),
            username,
        })
    }

    /// A new ID token (and a rotated refresh token) without the browser.
    pub async fn refresh(&self, refresh_token: &str) -> Result<Tokens, LoginError> {
        crate::debug::note(format_args!(
            "silent login: the saved refresh token goes to the token endpoint {}",
            self.client.token_uri().map_or("(none announced)", |u| u.as_str())
        ));
        let refresh = RefreshToken::new(refresh_token.to_owned());
        let request = self
            .client
            .exchange_refresh_token(&refresh)
            .map_err(|e| LoginError::Invalid(e.to_string()))?;
        let response = request
            .request_async(&self.http)
            .await
            .map_err(|e| self.failure(&e, LoginError::Refused))?;
        let mut tokens = self.tokens_from(&response, None)?;
        // Providers that do not rotate keep the old refresh token valid.
        if tokens.refresh_token.is_none() {
            tokens.refresh_token = Some(Zeroizing::new(refresh_token.to_owned()));
        }
        Ok(tokens)
    }

    /// A failed request to the provider: a connection failure named as
    /// such (see [`crate::connection`]), else what `otherwise` makes of the
    /// error chain (the provider answered, and refused).
    pub fn failure<E: std::error::Error + 'static>(
        &self,
        error: &E,
        otherwise: impl FnOnce(String) -> LoginError,
    ) -> LoginError {
        unreachable(&self.issuer, error).unwrap_or_else(|| otherwise(error_chain(error)))
    }

    pub fn scopes(&self) -> impl Iterator<Item = openidconnect::Scope> + '_ {
        self.scopes
            .iter()
            .filter(|s| *s != "openid")
            .map(|s| openidconnect::Scope::new(s.clone()))
    }
}

/// The connection failure in `error`, when the provider gave no answer;
/// `url` is named when the error does not carry the one requested.
fn unreachable(url: &str, error: &(dyn std::error::Error + 'static)) -> Option<LoginError> {
    ConnectionError::transport(Peer::IdentityProvider, url, error).map(LoginError::Unreachable)
}

/// A string claim of a JWT whose signature was already verified.
fn token_claim(jwt: &str, name: &str) -> Option<String> {
    use base64::Engine;
    let payload = jwt.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get(name)?.as_str().map(str::to_owned)
}

/// What erases the spinner's line: the terminal's "erase line" control,
/// or, with `NO_COLOR` set (any non-empty value, <https://no-color.org>)
/// or a `dumb` terminal, blanks over the line: no escape sequence at all.
fn erase_line(no_color: bool) -> String {
    if no_color {
        format!("\r{}\r", " ".repeat(SPINNER_WIDTH))
    } else {
        "\r\x1b[2K".to_owned()
    }
}

/// The widest spinner line (`| waiting... 99999s `), in characters.
const SPINNER_WIDTH: usize = 24;

/// Whether the environment asks for plain output: `NO_COLOR` set to
/// anything non-empty, or `TERM=dumb`.
pub fn plain_terminal() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
        || std::env::var_os("TERM").is_some_and(|t| t == "dumb")
}

/// A small progress indicator on stderr while `future` runs: a spinner with
/// the seconds waited on a terminal, nothing but the initial line otherwise.
pub async fn with_progress<T>(message: &str, future: impl std::future::Future<Output = T>) -> T {
    use std::io::{IsTerminal, Write};
    eprintln!("{message}");
    if !std::io::stderr().is_terminal() {
        return future.await;
    }
    let frames = ['|', '/', '-', '\\'];
    let started = std::time::Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    tokio::pin!(future);
    let mut frame = 0;
    let result = loop {
        tokio::select! {
            result = &mut future => break result,
            _ = ticker.tick() => {
                eprint!("\r{} waiting... {}s ", frames[frame % frames.len()], started.elapsed().as_secs());
                let _ = std::io::stderr().flush();
                frame += 1;
            }
        }
    };
    eprint!("{}", erase_line(plain_terminal()));
    result
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    use crate::connection::test_peers::refused_port;

    #[test]
    fn without_colour_the_spinner_is_erased_with_blanks_not_a_control() {
        let plain = erase_line(true);
        assert!(!plain.contains('\x1b'), "{plain:?}");
        assert!(plain.starts_with('\r') && plain.ends_with('\r'));
        assert!(plain.len() - 2 >= "| waiting... 99999s ".len());
        assert_eq!(erase_line(false), "\r\x1b[2K");
    }

    fn info(issuer: String) -> ServerInfo {
        ServerInfo {
            server_version: "0".into(),
            api_version: 1,
            issuer,
            discovery_url: None,
            client_id: "cli".into(),
            scopes: vec!["openid".into(), "offline_access".into()],
            token: Default::default(),
            clusters: vec![],
        }
    }

    /// A provider that serves discovery and an empty key set, and names a
    /// token endpoint on `token_port`. Returns its issuer.
    async fn provider_with_token_endpoint_on(token_port: u16) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let discovery = serde_json::json!({
            "issuer": base,
            "authorization_endpoint": format!("{base}/authorize"),
            "token_endpoint": format!("http://127.0.0.1:{token_port}/token"),
            "jwks_uri": format!("{base}/keys"),
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
        })
        .to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = vec![0u8; 4096];
                let read = stream.read(&mut request).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&request[..read]);
                let body = if request.starts_with("GET /.well-known/openid-configuration ") {
                    discovery.clone()
                } else {
                    r#"{"keys": []}"#.to_owned()
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        base
    }

    #[tokio::test]
    async fn an_unreachable_discovery_endpoint_is_named() {
        let (_held, port) = refused_port();
        let Err(error) =
            LoginClient::discover(&info(format!("http://127.0.0.1:{port}/tenant/v2.0")), None).await
        else {
            panic!("discovery worked on a closed port");
        };
        let text = error.to_string();
        assert!(
            text.starts_with(&format!(
                "the identity provider at http://127.0.0.1:{port}/tenant/v2.0/.well-known/openid-configuration \
                 cannot be reached: nothing listens on 127.0.0.1:{port} (connection refused); is the identity \
                 provider running, and is the port right? (the talos-sso server announces this address: if it \
                 is wrong, tell its operators) [Request failed: "
            )),
            "{text}"
        );
    }

    #[tokio::test]
    async fn an_issuer_without_a_scheme_is_named() {
        let Err(error) = LoginClient::discover(&info("login.example.com/tenant/v2.0".into()), None).await
        else {
            panic!("discovery worked without a scheme");
        };
        assert_eq!(
            error.to_string(),
            "the identity provider address `login.example.com/tenant/v2.0` that the talos-sso server announces \
             has no scheme: it must be an https:// URL; tell the server's operators"
        );
    }

    #[tokio::test]
    async fn an_unresolvable_provider_is_named() {
        let Err(error) =
            LoginClient::discover(&info("https://login.talos-sso.invalid/tenant/v2.0".into()), None).await
        else {
            panic!("discovery worked on an .invalid name");
        };
        let text = error.to_string();
        assert!(
            text.starts_with(
                "the identity provider at https://login.talos-sso.invalid/tenant/v2.0/.well-known/openid-configuration \
                 cannot be reached: the name `login.talos-sso.invalid` does not resolve; check its spelling, and \
                 your DNS (or VPN) (the talos-sso server announces this address: if it is wrong, tell its operators) ["
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn an_unreachable_token_endpoint_is_named() {
        let (_held_token_port, token_port) = refused_port();
        let issuer = provider_with_token_endpoint_on(token_port).await;
        let provider = LoginClient::discover(&info(issuer), None).await.unwrap();
        let text = provider.refresh("a refresh token").await.unwrap_err().to_string();
        assert!(
            text.starts_with(&format!(
                "the identity provider at http://127.0.0.1:{token_port}/token cannot be reached: nothing listens \
                 on 127.0.0.1:{token_port} (connection refused); is the identity provider running, and is the \
                 port right?"
            )),
            "{text}"
        );
    }
}
