//! The browser login: authorization code with PKCE (S256) on a loopback
//! redirect `http://localhost:<port>/callback`. The URL is printed (and
//! opened unless `--no-browser`); a one-request HTTP listener on 127.0.0.1
//! takes the redirect, checks `state`, and shows a page saying the tab can be
//! closed. The code is exchanged with the PKCE verifier and the ID token's
//! nonce is checked.

use std::collections::HashMap;
use std::time::Duration;

use openidconnect::core::CoreResponseType;
use openidconnect::{
    AuthenticationFlow, AuthorizationCode, CsrfToken, Nonce, PkceCodeChallenge, RedirectUrl,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{LoginError, Provider, Tokens, error_chain, with_progress};

/// Something that shows the login URL to a person: the desktop's browser,
/// or (for the quick-start demo) an automated one.
pub type Opener = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

#[derive(Clone)]
pub struct BrowserOptions {
    /// Fixed callback port (default: a free one).
    pub callback_port: Option<u16>,
    /// Who opens the URL; `None` only prints it (`--no-browser`).
    pub opener: Option<Opener>,
    /// How long to wait for the redirect.
    pub timeout: Duration,
}

impl std::fmt::Debug for BrowserOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrowserOptions")
            .field("callback_port", &self.callback_port)
            .field("opener", &self.opener.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Open URLs with `$BROWSER`, else `xdg-open` (`open` on macOS).
pub fn system_opener() -> Opener {
    std::sync::Arc::new(open_in_browser)
}

const CLOSE_PAGE: &str = "<!doctype html><meta charset=utf-8><title>talos-sso</title>\
<body style=\"font-family:sans-serif;margin:3em\"><h1>You are logged in</h1>\
<p>talos-sso has what it needs. You may close this tab and return to your terminal.</p>";

const ERROR_PAGE: &str = "<!doctype html><meta charset=utf-8><title>talos-sso</title>\
<body style=\"font-family:sans-serif;margin:3em\"><h1>Login failed</h1>\
<p>Return to your terminal for details.</p>";

fn open_in_browser(url: &str) {
    let candidates: Vec<String> = match std::env::var("BROWSER") {
        Ok(browser) if !browser.is_empty() => vec![browser],
        _ if cfg!(target_os = "macos") => vec!["open".into()],
        _ => vec!["xdg-open".into()],
    };
    for command in candidates {
        let spawned = std::process::Command::new(&command)
            .arg(url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        if spawned.is_ok() {
            return;
        }
    }
}

/// Read one HTTP request head; return the request target (path and query).
async fn read_target(stream: &mut TcpStream) -> Result<String, String> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buffer.windows(4).any(|w| w == b"\r\n\r\n") {
        if buffer.len() > 16 * 1024 {
            return Err("request too large".into());
        }
        let read = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if read == 0 {
            break;
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    let head = String::from_utf8_lossy(&buffer);
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some("GET"), Some(target)) => Ok(target.to_owned()),
        _ => Err(format!(
            "unexpected request `{}`",
            line.chars().take(60).collect::<String>()
        )),
    }
}

async fn respond(stream: &mut TcpStream, status: &str, body: &str) {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Wait for `/callback?code=...&state=...`; other paths (favicon) get 404.
async fn wait_for_callback(listener: TcpListener, expected_state: &str) -> Result<String, LoginError> {
    loop {
        let (mut stream, _) = listener
            .accept()
            .await
            .map_err(|e| LoginError::Callback(e.to_string()))?;
        let Ok(target) = read_target(&mut stream).await else {
            respond(&mut stream, "400 Bad Request", ERROR_PAGE).await;
            continue;
        };
        let Ok(url) = url::Url::parse(&format!("http://localhost{target}")) else {
            respond(&mut stream, "400 Bad Request", ERROR_PAGE).await;
            continue;
        };
        if url.path() != "/callback" {
            respond(&mut stream, "404 Not Found", "").await;
            continue;
        }
        let query: HashMap<String, String> = url.query_pairs().into_owned().collect();
        if let Some(error) = query.get("error") {
            respond(&mut stream, "200 OK", ERROR_PAGE).await;
            let description = query.get("error_description").cloned().unwrap_or_default();
            return Err(LoginError::Refused(format!("{error}: {description}")));
        }
        // A redirect with another state is not ours (or is forged): refuse it.
        if query.get("state").map(String::as_str) != Some(expected_state) {
            respond(&mut stream, "400 Bad Request", ERROR_PAGE).await;
            return Err(LoginError::Invalid(
                "the redirect's `state` does not match this login".into(),
            ));
        }
        let Some(code) = query.get("code").cloned() else {
            respond(&mut stream, "400 Bad Request", ERROR_PAGE).await;
            return Err(LoginError::Invalid("the redirect carries no code".into()));
        };
        respond(&mut stream, "200 OK", CLOSE_PAGE).await;
        return Ok(code);
    }
}

pub async fn login(provider: &Provider, options: &BrowserOptions) -> Result<Tokens, LoginError> {
    let listener = TcpListener::bind(("127.0.0.1", options.callback_port.unwrap_or(0)))
        .await
        .map_err(|e| LoginError::Callback(format!("cannot listen on 127.0.0.1 for the redirect: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| LoginError::Callback(e.to_string()))?
        .port();
    let redirect = RedirectUrl::new(format!("http://localhost:{port}/callback"))
        .map_err(|e| LoginError::Callback(e.to_string()))?;
    let client = provider.client.clone().set_redirect_uri(redirect);
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let mut request = client
        .authorize_url(
            AuthenticationFlow::<CoreResponseType>::AuthorizationCode,
            CsrfToken::new_random,
            Nonce::new_random,
        )
        .set_pkce_challenge(challenge);
    for scope in provider.scopes() {
        request = request.add_scope(scope);
    }
    let (url, state, nonce) = request.url();

    eprintln!("Log in with your browser:\n\n    {url}\n");
    if let Some(open) = &options.opener {
        open(url.as_str());
    }
    let waited = with_progress(
        "Waiting for the login to finish in the browser (Ctrl-C to cancel).",
        tokio::time::timeout(options.timeout, wait_for_callback(listener, state.secret())),
    )
    .await;
    let code = waited.map_err(|_| LoginError::Timeout(options.timeout))??;
    let exchange = client
        .exchange_code(AuthorizationCode::new(code))
        .map_err(|e| LoginError::Invalid(e.to_string()))?;
    let response = exchange
        .set_pkce_verifier(verifier)
        .request_async(&provider.http)
        .await
        .map_err(|e| LoginError::Refused(error_chain(&e)))?;
    provider.tokens_from(&response, Some(&nonce))
}
