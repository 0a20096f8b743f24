//! The browser login: authorization code with PKCE (S256) on a loopback
//! redirect `http://localhost:<port>/callback`. The URL is printed (and
//! opened unless `--no-browser`); a small HTTP listener on 127.0.0.1 takes
//! the redirect, checks `state`, and shows a page saying the tab can be
//! closed. Connections are served side by side, each request head bounded
//! in size and in time, so an idle connection (a port scanner, a browser's
//! preconnect) cannot keep the redirect waiting. The code is exchanged with the PKCE verifier and the ID token's
//! nonce is checked.
//!
//! `state` is checked before anything else in the redirect: a request
//! without this login's state (a forged `?error=...`, another tab) is
//! refused and the wait goes on, so only the identity provider's redirect
//! can end the login, with a code or with its error.

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

const NOT_OURS_PAGE: &str = "<!doctype html><meta charset=utf-8><title>talos-sso</title>\
<body style=\"font-family:sans-serif;margin:3em\"><h1>Not this login</h1>\
<p>This request does not belong to the login talos-sso is waiting for.</p>";

/// The longest `error` and `error_description` shown from a redirect.
const MAX_ERROR: usize = 100;
const MAX_ERROR_DESCRIPTION: usize = 500;

/// The identity provider's refusal as the person reads it: its words,
/// escaped and bounded (they travel through the browser's address bar).
fn provider_error(error: &str, description: &str) -> String {
    let error = crate::display::bounded(error, MAX_ERROR);
    match crate::display::bounded(description, MAX_ERROR_DESCRIPTION) {
        description if description.is_empty() => error,
        description => format!("{error}: {description}"),
    }
}

/// Compare the redirect's state with ours in time independent of where
/// they differ, so that many tries cannot learn it piece by piece.
fn same_secret(given: Option<&str>, expected: &str) -> bool {
    let Some(given) = given else { return false };
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}

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

/// How long one connection may take to send its request head. Connections
/// are served side by side, so a silent one (a port scanner, a browser's
/// preconnect) never holds up the redirect; this only closes it in the end.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The most read of one request head: a redirect with a code and a state
/// is a few kilobytes.
const MAX_REQUEST_HEAD: usize = 16 * 1024;

/// Read one HTTP request head; return the request target (path and query).
async fn read_target(stream: &mut TcpStream) -> Result<String, String> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buffer.windows(4).any(|w| w == b"\r\n\r\n") {
        let room = MAX_REQUEST_HEAD.saturating_sub(buffer.len()).min(chunk.len());
        if room == 0 {
            return Err("request too large".into());
        }
        let read = stream.read(&mut chunk[..room]).await.map_err(|e| e.to_string())?;
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

/// What one connection to the loopback listener came to.
#[derive(Debug)]
enum Verdict {
    /// Not the redirect: another path (favicon), a malformed, oversized or
    /// silent request.
    Ignored,
    /// A callback without this login's state.
    NotOurs,
    /// The identity provider's redirect: the code, or its refusal.
    Finished(Result<String, LoginError>),
}

/// Serve one connection: at most one request head, read within `timeout`.
async fn serve(mut stream: TcpStream, expected_state: &str, timeout: Duration) -> Verdict {
    let target = match tokio::time::timeout(timeout, read_target(&mut stream)).await {
        Ok(Ok(target)) => target,
        Ok(Err(_)) => {
            respond(&mut stream, "400 Bad Request", ERROR_PAGE).await;
            return Verdict::Ignored;
        }
        // Silent for too long: closed without an answer.
        Err(_) => return Verdict::Ignored,
    };
    let Ok(url) = url::Url::parse(&format!("http://localhost{target}")) else {
        respond(&mut stream, "400 Bad Request", ERROR_PAGE).await;
        return Verdict::Ignored;
    };
    if url.path() != "/callback" {
        respond(&mut stream, "404 Not Found", "").await;
        return Verdict::Ignored;
    }
    let query: HashMap<String, String> = url.query_pairs().into_owned().collect();
    // Only a redirect carrying this login's state comes from the identity
    // provider: anything else, error or not, is refused and the login
    // goes on waiting, so that a forged request cannot end it.
    if !same_secret(query.get("state").map(String::as_str), expected_state) {
        respond(&mut stream, "400 Bad Request", NOT_OURS_PAGE).await;
        return Verdict::NotOurs;
    }
    if let Some(error) = query.get("error") {
        respond(&mut stream, "200 OK", ERROR_PAGE).await;
        let description = query.get("error_description").cloned().unwrap_or_default();
        return Verdict::Finished(Err(LoginError::Refused(provider_error(error, &description))));
    }
    let Some(code) = query.get("code").cloned() else {
        respond(&mut stream, "400 Bad Request", ERROR_PAGE).await;
        return Verdict::Finished(Err(LoginError::Invalid("the redirect carries no code".into())));
    };
    respond(&mut stream, "200 OK", CLOSE_PAGE).await;
    Verdict::Finished(Ok(code))
}

/// Wait for `/callback?code=...&state=...`; other paths (favicon) get 404.
/// Each connection is served by its own task, each request head read
/// within `request_timeout`; the first redirect with this login's state
/// ends the wait (and the connections still open are dropped).
async fn wait_for_callback(
    listener: TcpListener,
    expected_state: String,
    request_timeout: Duration,
) -> Result<String, LoginError> {
    let expected_state: std::sync::Arc<str> = expected_state.into();
    let mut connections = tokio::task::JoinSet::new();
    let mut told_not_ours = false;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let state = expected_state.clone();
                    connections.spawn(async move { serve(stream, &state, request_timeout).await });
                }
                // Out of file descriptors, a connection reset before it was
                // accepted: that one is lost, the wait goes on (not in a spin).
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            Some(served) = connections.join_next() => match served {
                Ok(Verdict::Finished(result)) => return result,
                Ok(Verdict::NotOurs) if !told_not_ours => {
                    eprintln!("Ignored a request to the callback that does not belong to this login.");
                    told_not_ours = true;
                }
                _ => {}
            },
        }
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
        tokio::time::timeout(
            options.timeout,
            wait_for_callback(listener, state.secret().clone(), REQUEST_TIMEOUT),
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(port: u16, target: &str) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let request = format!("GET {target} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    async fn waiting(state: &'static str) -> (u16, tokio::task::JoinHandle<Result<String, LoginError>>) {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        (
            port,
            tokio::spawn(wait_for_callback(
                listener,
                state.into(),
                Duration::from_millis(300),
            )),
        )
    }

    #[tokio::test]
    async fn a_redirect_without_this_logins_state_cannot_end_it() {
        let (port, login) = waiting("our-state").await;
        for forged in [
            "/callback?error=access_denied&error_description=forged",
            "/callback?error=access_denied&error_description=forged&state=not-ours",
            "/callback?error=access_denied&state=",
            "/callback?code=attackers-code&state=our-stat",
            "/callback?code=attackers-code&state=our-state-and-more",
            "/callback?code=attackers-code",
        ] {
            let answer = get(port, forged).await;
            assert!(answer.starts_with("HTTP/1.1 400"), "{forged}: {answer}");
            assert!(answer.contains("Not this login"), "{answer}");
        }
        let answer = get(port, "/callback?code=the-code&state=our-state").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("You may close this tab"), "{answer}");
        assert_eq!(login.await.unwrap().unwrap(), "the-code");
    }

    #[tokio::test]
    async fn the_providers_own_error_ends_the_login_escaped_and_bounded() {
        let (port, login) = waiting("our-state").await;
        let description = format!("%1B%5B31m%E2%80%AEdenied%0D%0A{}", "x".repeat(5000));
        let answer = get(
            port,
            &format!("/callback?state=our-state&error=access_denied%1B%5B2K&error_description={description}"),
        )
        .await;
        assert!(answer.contains("Login failed"), "{answer}");
        let Err(LoginError::Refused(text)) = login.await.unwrap() else {
            panic!("the provider's error ends the login");
        };
        assert!(!text.chars().any(crate::display::is_unsafe), "{text:?}");
        assert!(
            text.starts_with("access_denied\\u{1b}[2K: \\u{1b}[31m\\u{202e}denied\\u{d}\\u{a}xxx"),
            "{text}"
        );
        assert!(text.ends_with("x…"), "{text}");
        assert!(
            text.chars().count() <= MAX_ERROR + 2 + MAX_ERROR_DESCRIPTION,
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_silent_connection_does_not_hold_up_the_redirect() {
        let (port, login) = waiting("our-state").await;
        // Connected and silent; connected with half a request.
        let _silent = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut half = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        half.write_all(b"GET /callback?code=x&state=our-state HTTP/1.1\r\n")
            .await
            .unwrap();
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            get(port, "/callback?code=the-code&state=our-state"),
        )
        .await
        .expect("the redirect is served while the others are silent");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert_eq!(login.await.unwrap().unwrap(), "the-code");
    }

    #[tokio::test]
    async fn silent_and_oversized_requests_are_closed_and_the_wait_goes_on() {
        let (port, login) = waiting("our-state").await;
        // Closed (without an answer) once the request timeout has passed.
        let mut silent = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut answer))
            .await
            .expect("a silent connection is closed")
            .unwrap();
        assert!(answer.is_empty());
        // A head that never ends is read up to the bound, then refused (the
        // answer may be lost to a reset, as the rest is left unread).
        let mut endless = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let huge = format!("GET /callback?code={}", "a".repeat(MAX_REQUEST_HEAD));
        endless.write_all(huge.as_bytes()).await.unwrap();
        let mut answer = String::new();
        match tokio::time::timeout(Duration::from_secs(5), endless.read_to_string(&mut answer))
            .await
            .expect("an oversized request is refused at once")
        {
            Ok(_) => assert!(answer.starts_with("HTTP/1.1 400"), "{answer}"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
        assert!(!login.is_finished());
        let answer = get(port, "/callback?code=the-code&state=our-state").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert_eq!(login.await.unwrap().unwrap(), "the-code");
    }

    #[test]
    fn states_compare_whole() {
        assert!(same_secret(Some("abc"), "abc"));
        for other in [None, Some(""), Some("ab"), Some("abd"), Some("abcd")] {
            assert!(!same_secret(other, "abc"), "{other:?}");
        }
    }
}
