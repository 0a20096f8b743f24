//! The browser login: authorization code with PKCE (S256) on a loopback
//! redirect `http://localhost:<port>/callback`. The URL is printed (and
//! opened unless `--no-browser`); a small HTTP listener takes the redirect,
//! checks `state`, and shows a page saying the tab can be closed. The code is
//! exchanged with the PKCE verifier and the ID token's nonce is checked.
//!
//! The listener is on 127.0.0.1 and on [::1] at the same port (when the host
//! has IPv6 loopback): `localhost` may resolve to either, and whoever held
//! the other one would receive the code. Connections are served side by
//! side, each request head bounded in size and in time, so an idle
//! connection (a port scanner, a browser's preconnect) cannot keep the
//! redirect waiting.
//!
//! `state` is checked before anything else in the redirect: a request
//! without this login's state (a forged `?error=...`, another tab) is
//! refused and the wait goes on, so only the identity provider's redirect
//! can end the login, with a code or with its error. Then the issuer it
//! names (`iss`, RFC 9207) must be this provider's, and must be there when
//! discovery says the provider always names itself: a redirect from
//! another provider (a mix-up attack) ends the login before its code is
//! sent anywhere.

use std::collections::HashMap;
use std::time::Duration;

use openidconnect::core::CoreResponseType;
use openidconnect::{
    AuthenticationFlow, AuthorizationCode, CsrfToken, Nonce, PkceCodeChallenge, RedirectUrl,
};
use talos_sso_api::issuer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{LoginClient, LoginError, Tokens, with_progress};

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

/// Open URLs in the person's browser: `$BROWSER` where set, else the
/// platform's way (`xdg-open` and its kin, `open` on macOS, the shell on
/// Windows), through the `webbrowser` crate.
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
/// The parameters a redirect carries once at most (RFC 6749, section 3.1):
/// a second `iss` or `code` would otherwise be read instead of the first.
const ONCE_ONLY: [&str; 5] = ["state", "code", "iss", "error", "error_description"];

/// The longest issuer shown from a redirect that names another.
const MAX_ISSUER: usize = 200;

/// What a redirect of this login must carry (no `Debug`: it holds the
/// state).
#[derive(Clone)]
struct Expected {
    /// This login's `state`.
    state: String,
    /// The provider's issuer (for Entra's multi-tenant one, a template).
    issuer: String,
    /// Discovery said that every authorization response names its issuer
    /// (`authorization_response_iss_parameter_supported`).
    issuer_always_named: bool,
}

/// RFC 9207: the issuer a redirect names (`iss`) is this login's provider,
/// and a provider that promised to name itself did. A redirect may name no
/// issuer only from a provider that never promised to (Entra ID does not).
fn check_issuer(named: Option<&str>, expected: &Expected) -> Result<(), LoginError> {
    match named {
        Some(named) if issuer::matches_any_tenant(&expected.issuer, named) => Ok(()),
        Some(named) => Err(LoginError::Invalid(format!(
            "the redirect comes from issuer {}, not from {}: the login is not this provider's (RFC 9207)",
            talos_sso_text::bounded(named, MAX_ISSUER),
            expected.issuer
        ))),
        None if expected.issuer_always_named => Err(LoginError::Invalid(format!(
            "the redirect names no issuer (iss), although {} says in discovery that it always does (RFC 9207)",
            expected.issuer
        ))),
        None => Ok(()),
    }
}

/// The identity provider's refusal as the person reads it: its words,
/// escaped and bounded (they travel through the browser's address bar).
fn provider_error(error: &str, description: &str) -> String {
    let error = talos_sso_text::bounded(error, MAX_ERROR);
    match talos_sso_text::bounded(description, MAX_ERROR_DESCRIPTION) {
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
    // On its own thread: a text-mode browser would hold the terminal until
    // it exits, and the login must go on waiting for the redirect.
    let url = url.to_owned();
    let _ = std::thread::Builder::new().name("browser".into()).spawn(move || {
        // The URL is also printed; a browser that cannot be opened
        // leaves the person to open it by hand.
        let _ = webbrowser::open(&url);
    });
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
async fn serve(mut stream: TcpStream, expected: &Expected, timeout: Duration) -> Verdict {
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
    let verdict = redirect_verdict(&url, expected);
    let (status, page) = match &verdict {
        Verdict::NotOurs => ("400 Bad Request", NOT_OURS_PAGE),
        Verdict::Finished(Ok(_)) => ("200 OK", CLOSE_PAGE),
        Verdict::Finished(Err(LoginError::Refused(_))) => ("200 OK", ERROR_PAGE),
        Verdict::Finished(Err(_)) | Verdict::Ignored => ("400 Bad Request", ERROR_PAGE),
    };
    respond(&mut stream, status, page).await;
    verdict
}

/// What the identity provider's redirect to `/callback` says, whether it
/// reached the loopback listener or was pasted (`--keyboard`). Only a
/// redirect carrying this login's state comes from the identity provider:
/// anything else, error or not, is refused and the login goes on waiting,
/// so that a forged request (or a pasted link someone sent) cannot end it.
/// One with this login's state but another issuer ends it with an error.
fn redirect_verdict(url: &url::Url, expected: &Expected) -> Verdict {
    let mut query: HashMap<String, String> = HashMap::new();
    let mut repeated = None;
    for (name, value) in url.query_pairs().into_owned() {
        if query.contains_key(&name) && ONCE_ONLY.contains(&name.as_str()) {
            repeated.get_or_insert(name.clone());
        }
        query.insert(name, value);
    }
    if repeated.as_deref() == Some("state")
        || !same_secret(query.get("state").map(String::as_str), &expected.state)
    {
        return Verdict::NotOurs;
    }
    if let Some(name) = repeated {
        return Verdict::Finished(Err(LoginError::Invalid(format!(
            "the redirect carries its {name} parameter twice"
        ))));
    }
    if let Err(error) = check_issuer(query.get("iss").map(String::as_str), expected) {
        return Verdict::Finished(Err(error));
    }
    if let Some(error) = query.get("error") {
        let description = query.get("error_description").cloned().unwrap_or_default();
        return Verdict::Finished(Err(LoginError::Refused(provider_error(error, &description))));
    }
    match query.get("code") {
        Some(code) => Verdict::Finished(Ok(code.clone())),
        None => Verdict::Finished(Err(LoginError::Invalid("the redirect carries no code".into()))),
    }
}

/// Wait for `/callback?code=...&state=...`; other paths (favicon) get 404.
/// Each connection is served by its own task, each request head read
/// within `request_timeout`; the first redirect with this login's state
/// ends the wait (and the connections still open are dropped).
async fn wait_for_callback(
    listener: Loopback,
    expected: Expected,
    request_timeout: Duration,
) -> Result<String, LoginError> {
    let expected = std::sync::Arc::new(expected);
    let mut connections = tokio::task::JoinSet::new();
    let mut told_not_ours = false;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(stream) => {
                    let expected = expected.clone();
                    connections.spawn(async move { serve(stream, &expected, request_timeout).await });
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

/// The listening sockets of the callback: 127.0.0.1, and [::1] on the same
/// port when the host has IPv6 loopback. The redirect names `localhost`
/// (identity providers register it so), which the browser may resolve to
/// ::1 first: left free, [::1]:port could be taken by another local program,
/// which would then receive the authorization code.
#[derive(Debug)]
struct Loopback {
    v4: TcpListener,
    v6: Option<TcpListener>,
    port: u16,
}

impl Loopback {
    async fn accept(&self) -> std::io::Result<TcpStream> {
        let (stream, _) = match &self.v6 {
            Some(v6) => tokio::select! {
                accepted = self.v4.accept() => accepted,
                accepted = v6.accept() => accepted,
            },
            None => self.v4.accept().await,
        }?;
        Ok(stream)
    }
}

/// Random ports tried before giving up when [::1] has each one taken.
const BIND_ATTEMPTS: usize = 16;

/// Why a port could not be had on both loopback addresses.
#[derive(Debug)]
enum BindError {
    V4 {
        port: u16,
        error: std::io::Error,
    },
    /// Someone else listens on [::1] at this port.
    V6Taken {
        port: u16,
    },
    V6 {
        port: u16,
        error: std::io::Error,
    },
}

impl From<BindError> for LoginError {
    fn from(error: BindError) -> Self {
        LoginError::Callback(match error {
            BindError::V4 { port: 0, error } => {
                format!("cannot listen on 127.0.0.1 for the redirect: {error}")
            }
            BindError::V4 { port, error } => {
                format!("cannot listen on 127.0.0.1:{port} for the redirect: {error}")
            }
            BindError::V6Taken { port } => format!(
                "port {port} is already in use on [::1] by another program, which would receive \
                 the redirect to http://localhost:{port}; choose another --callback-port"
            ),
            BindError::V6 { port, error } => {
                format!("cannot listen on [::1]:{port} for the redirect: {error}")
            }
        })
    }
}

/// The host has no IPv6 loopback (no ::1, or no IPv6 at all): 127.0.0.1 is
/// then the only address `localhost` can reach.
fn no_ipv6_loopback(error: &std::io::Error) -> bool {
    #[cfg(unix)]
    if error.raw_os_error() == Some(libc::EAFNOSUPPORT) {
        return true;
    }
    error.kind() == std::io::ErrorKind::AddrNotAvailable
}

/// `port` (0: any) on 127.0.0.1, then the same port on [::1].
async fn bind_pair(port: u16) -> Result<Loopback, BindError> {
    let v4 = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
        .await
        .map_err(|error| BindError::V4 { port, error })?;
    let port = v4
        .local_addr()
        .map_err(|error| BindError::V4 { port, error })?
        .port();
    match TcpListener::bind((std::net::Ipv6Addr::LOCALHOST, port)).await {
        Ok(v6) => Ok(Loopback {
            v4,
            v6: Some(v6),
            port,
        }),
        Err(error) if no_ipv6_loopback(&error) => Ok(Loopback { v4, v6: None, port }),
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => Err(BindError::V6Taken { port }),
        Err(error) => Err(BindError::V6 { port, error }),
    }
}

/// The first of `ports` (0: a random one) free on both loopback addresses;
/// one taken on [::1] is passed over for the next.
async fn bind_first_free(ports: impl IntoIterator<Item = u16>) -> Result<Loopback, LoginError> {
    let mut tried = 0;
    for port in ports {
        tried += 1;
        match bind_pair(port).await {
            Ok(loopback) => return Ok(loopback),
            Err(BindError::V6Taken { .. }) => continue,
            Err(other) => return Err(other.into()),
        }
    }
    Err(LoginError::Callback(format!(
        "found no port free on both 127.0.0.1 and [::1] in {tried} tries; use --callback-port"
    )))
}

/// The callback's listeners: on `fixed` (which must be free on both
/// addresses), else on a random port.
async fn bind_loopback(fixed: Option<u16>) -> Result<Loopback, LoginError> {
    match fixed {
        Some(port) => Ok(bind_pair(port).await?),
        None => bind_first_free(std::iter::repeat_n(0, BIND_ATTEMPTS)).await,
    }
}

/// One authorization request: the URL to visit and what checks its answer.
struct Authorization {
    client: super::Client,
    url: url::Url,
    state: CsrfToken,
    nonce: Nonce,
    verifier: openidconnect::PkceCodeVerifier,
}

fn authorize(provider: &LoginClient, port: u16) -> Result<Authorization, LoginError> {
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
    Ok(Authorization {
        client,
        url,
        state,
        nonce,
        verifier,
    })
}

impl Authorization {
    /// What this request's redirect must carry.
    fn expected(&self, provider: &LoginClient) -> Expected {
        Expected {
            state: self.state.secret().clone(),
            issuer: provider.issuer.clone(),
            issuer_always_named: provider.names_itself_in_redirects,
        }
    }

    /// Exchange the code (with the PKCE verifier) and check the ID token.
    async fn finish(self, provider: &LoginClient, code: String) -> Result<Tokens, LoginError> {
        let exchange = self
            .client
            .exchange_code(AuthorizationCode::new(code))
            .map_err(|e| LoginError::Invalid(e.to_string()))?;
        let response = exchange
            .set_pkce_verifier(self.verifier)
            .request_async(&provider.http)
            .await
            .map_err(|e| provider.failure(&e, LoginError::Refused))?;
        provider.tokens_from(&response, Some(&self.nonce))
    }
}

pub async fn login(provider: &LoginClient, options: &BrowserOptions) -> Result<Tokens, LoginError> {
    let listener = bind_loopback(options.callback_port).await?;
    let authorization = authorize(provider, listener.port)?;
    let url = authorization.url.clone();
    eprintln!("Log in with your browser:\n\n    {url}\n");
    if let Some(open) = &options.opener {
        open(url.as_str());
    }
    let waited = with_progress(
        "Waiting for the login to finish in the browser (Ctrl-C to cancel).",
        tokio::time::timeout(
            options.timeout,
            wait_for_callback(listener, authorization.expected(provider), REQUEST_TIMEOUT),
        ),
    )
    .await;
    let code = waited.map_err(|_| LoginError::Timeout(options.timeout))??;
    authorization.finish(provider, code).await
}

/// The port in the keyboard flow's redirect when none is chosen. Nothing
/// listens there: the browser (on any machine) fails to load the page, and
/// its address bar holds the answer to paste.
pub const KEYBOARD_PORT: u16 = 8000;

/// How many pasted lines that are not this login's redirect are tolerated.
const KEYBOARD_ATTEMPTS: usize = 3;

/// The browser flow without a listener, for machines where neither a
/// loopback redirect nor the device flow can work (SSH sessions where
/// Conditional Access blocks device codes): the URL is printed, the person
/// logs in on any device, and pastes back the address the browser ended on
/// (`http://localhost:8000/callback?code=...&state=...`). The state is
/// checked as for the listener, so a pasted link from someone else is
/// refused.
pub async fn keyboard_login(
    provider: &LoginClient,
    port: Option<u16>,
    timeout: Duration,
    input: &mut (dyn tokio::io::AsyncBufRead + Unpin + Send),
) -> Result<Tokens, LoginError> {
    use tokio::io::AsyncBufReadExt;
    let port = port.unwrap_or(KEYBOARD_PORT);
    let authorization = authorize(provider, port)?;
    eprintln!(
        "Open this URL in a browser on any device and log in:\n\n    {}\n\n\
         The browser then fails to load http://localhost:{port}/callback: that is expected.\n\
         Copy the whole address from its address bar and paste it here.",
        authorization.url
    );
    let expected = authorization.expected(provider);
    let code = tokio::time::timeout(timeout, async {
        let mut line = String::new();
        for _ in 0..KEYBOARD_ATTEMPTS {
            line.clear();
            eprint!("Address: ");
            if input
                .read_line(&mut line)
                .await
                .map_err(|e| LoginError::Callback(e.to_string()))?
                == 0
            {
                return Err(LoginError::Callback(
                    "the input ended before an address was pasted".into(),
                ));
            }
            let pasted = line.trim();
            let verdict = match url::Url::parse(pasted) {
                Ok(url) if url.path() == "/callback" => redirect_verdict(&url, &expected),
                _ => Verdict::Ignored,
            };
            match verdict {
                Verdict::Finished(result) => return result,
                Verdict::NotOurs => eprintln!(
                    "That address does not belong to this login (its state differs): paste the address \
                     the browser shows after the login above."
                ),
                Verdict::Ignored => eprintln!(
                    "That is not the address to paste: it starts with http://localhost:{port}/callback?"
                ),
            }
        }
        Err(LoginError::Callback(format!(
            "no address of this login was pasted in {KEYBOARD_ATTEMPTS} tries"
        )))
    })
    .await
    .map_err(|_| LoginError::Timeout(timeout))??;
    authorization.finish(provider, code).await
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

    const ISSUER: &str = "https://idp.example/tenant";

    /// A login with `state`, at a provider that does not promise `iss`.
    fn expecting(state: &str) -> Expected {
        Expected {
            state: state.into(),
            issuer: ISSUER.into(),
            issuer_always_named: false,
        }
    }

    async fn waiting(state: &'static str) -> (u16, tokio::task::JoinHandle<Result<String, LoginError>>) {
        waiting_for(expecting(state)).await
    }

    async fn waiting_for(expected: Expected) -> (u16, tokio::task::JoinHandle<Result<String, LoginError>>) {
        let listener = bind_loopback(None).await.unwrap();
        let port = listener.port;
        (
            port,
            tokio::spawn(wait_for_callback(listener, expected, Duration::from_millis(300))),
        )
    }

    /// RFC 9207: a redirect naming this provider is taken, with or without
    /// a promise; one naming another provider, or none where the provider
    /// promised, ends the login with an error and no code, its page saying
    /// the login failed.
    #[tokio::test]
    async fn a_redirect_naming_another_issuer_ends_the_login_without_its_code() {
        let promised = Expected {
            issuer_always_named: true,
            ..expecting("s")
        };
        for expected in [expecting("s"), promised.clone()] {
            let (port, login) = waiting_for(expected).await;
            let answer = get(
                port,
                "/callback?code=c&state=s&iss=https%3A%2F%2Fidp.example%2Ftenant",
            )
            .await;
            assert!(answer.contains("You may close this tab"), "{answer}");
            assert_eq!(login.await.unwrap().unwrap(), "c");
        }
        for (expected, target, says) in [
            (
                expecting("s"),
                "/callback?code=c&state=s&iss=https%3A%2F%2Fevil.example%2Ftenant%1B%5B2K",
                "issuer https://evil.example/tenant\\u{1b}[2K, not from https://idp.example/tenant",
            ),
            (
                promised.clone(),
                "/callback?code=c&state=s&iss=https%3A%2F%2Fidp.example%2Ftenant%2F",
                "issuer https://idp.example/tenant/, not from",
            ),
            (
                promised.clone(),
                "/callback?code=c&state=s",
                "names no issuer (iss)",
            ),
            // An error from another provider is not this provider's refusal.
            (
                expecting("s"),
                "/callback?error=access_denied&state=s&iss=https%3A%2F%2Fevil.example",
                "issuer https://evil.example, not from",
            ),
        ] {
            let (port, login) = waiting_for(expected).await;
            let answer = get(port, target).await;
            assert!(answer.starts_with("HTTP/1.1 400"), "{target}: {answer}");
            assert!(answer.contains("Login failed"), "{answer}");
            let Err(LoginError::Invalid(text)) = login.await.unwrap() else {
                panic!("{target}: the login ends with an error");
            };
            assert!(text.contains(says), "{target}: {text}");
            assert!(!text.chars().any(talos_sso_text::is_unsafe), "{text:?}");
        }
    }

    /// A parameter given twice is not read either way: a repeated state is
    /// not this login's, and any other repeated parameter ends it.
    #[tokio::test]
    async fn a_redirect_that_repeats_a_parameter_is_not_read() {
        let (port, login) = waiting("s").await;
        let answer = get(port, "/callback?code=c&state=x&state=s").await;
        assert!(answer.contains("Not this login"), "{answer}");
        let answer = get(
            port,
            "/callback?code=c&state=s&iss=https%3A%2F%2Fevil.example&iss=https%3A%2F%2Fidp.example%2Ftenant",
        )
        .await;
        assert!(answer.contains("Login failed"), "{answer}");
        let Err(LoginError::Invalid(text)) = login.await.unwrap() else {
            panic!("a repeated iss ends the login");
        };
        assert_eq!(text, "the redirect carries its iss parameter twice");
        let (port, login) = waiting("s").await;
        get(port, "/callback?code=a&code=b&state=s").await;
        assert!(matches!(login.await.unwrap(), Err(LoginError::Invalid(_))));
    }

    /// Entra's multi-tenant issuer is a template: a redirect may name it
    /// with any one tenant filled in, and nothing else.
    #[test]
    fn a_template_issuer_is_named_with_a_tenant_filled_in() {
        let expected = Expected {
            issuer: "https://login.microsoftonline.com/{tenantid}/v2.0".into(),
            issuer_always_named: true,
            ..expecting("s")
        };
        assert!(check_issuer(Some("https://login.microsoftonline.com/t1/v2.0"), &expected).is_ok());
        assert!(check_issuer(Some("https://evil.example/t1/v2.0"), &expected).is_err());
        assert!(check_issuer(None, &expected).is_err());
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
        assert!(!text.chars().any(talos_sso_text::is_unsafe), "{text:?}");
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

    /// Whether this host has IPv6 loopback; the tests below check the
    /// dual-stack listener where it has, the 127.0.0.1 fallback where not.
    fn host_has_ipv6_loopback() -> bool {
        match std::net::TcpListener::bind((std::net::Ipv6Addr::LOCALHOST, 0)) {
            Ok(_) => true,
            Err(e) if no_ipv6_loopback(&e) => false,
            Err(e) => panic!("probing [::1]: {e}"),
        }
    }

    #[tokio::test]
    async fn the_callback_listens_on_both_loopback_addresses_on_one_port() {
        let loopback = bind_loopback(None).await.unwrap();
        let port = loopback.port;
        assert_eq!(loopback.v4.local_addr().unwrap().port(), port);
        if host_has_ipv6_loopback() {
            let v6 = loopback.v6.as_ref().expect("[::1] is bound too");
            assert_eq!(v6.local_addr().unwrap().port(), port);
        } else {
            assert!(loopback.v6.is_none());
        }
        let login = tokio::spawn(wait_for_callback(loopback, expecting("s"), REQUEST_TIMEOUT));
        // Whichever address `localhost` gives the browser, the redirect is ours.
        if host_has_ipv6_loopback() {
            let mut stream = TcpStream::connect((std::net::Ipv6Addr::LOCALHOST, port))
                .await
                .unwrap();
            stream
                .write_all(b"GET /callback?code=via-v6&state=s HTTP/1.1\r\n\r\n")
                .await
                .unwrap();
            assert_eq!(login.await.unwrap().unwrap(), "via-v6");
        } else {
            assert_eq!(
                get(port, "/callback?code=via-v4&state=s").await.lines().next(),
                Some("HTTP/1.1 200 OK")
            );
            assert_eq!(login.await.unwrap().unwrap(), "via-v4");
        }
    }

    #[tokio::test]
    async fn a_port_someone_holds_on_ipv6_loopback_is_never_used() {
        if !host_has_ipv6_loopback() {
            // Nobody can hold a port on an address the host does not have.
            assert!(bind_loopback(None).await.unwrap().v6.is_none());
            return;
        }
        // Another program on [::1] at a port that is free on 127.0.0.1.
        let (squatter, port) = loop {
            let squatter = std::net::TcpListener::bind((std::net::Ipv6Addr::LOCALHOST, 0)).unwrap();
            let port = squatter.local_addr().unwrap().port();
            if std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).is_ok() {
                break (squatter, port);
            }
        };
        // A random port: that one is passed over for another.
        let loopback = bind_first_free([port, 0]).await.unwrap();
        assert_ne!(loopback.port, port);
        assert!(loopback.v6.is_some());
        drop(loopback);
        // A fixed port: a clear refusal, and 127.0.0.1:port is let go again.
        let error = bind_loopback(Some(port)).await.unwrap_err().to_string();
        assert!(
            error.contains(&format!(
                "port {port} is already in use on [::1] by another program"
            )),
            "{error}"
        );
        assert!(error.contains("--callback-port"), "{error}");
        assert!(std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).is_ok());
        // Every try taken: an error, not a half-bound listener.
        let error = bind_first_free([port, port]).await.unwrap_err().to_string();
        assert!(error.contains("no port free on both"), "{error}");
        drop(squatter);
    }

    #[test]
    fn a_host_without_ipv6_loopback_falls_back_to_127_0_0_1() {
        #[cfg(unix)]
        for missing in [libc::EADDRNOTAVAIL, libc::EAFNOSUPPORT] {
            assert!(no_ipv6_loopback(&std::io::Error::from_raw_os_error(missing)));
        }
        assert!(no_ipv6_loopback(&std::io::ErrorKind::AddrNotAvailable.into()));
        assert!(!no_ipv6_loopback(&std::io::ErrorKind::AddrInUse.into()));
        assert!(!no_ipv6_loopback(&std::io::ErrorKind::PermissionDenied.into()));
    }

    #[tokio::test]
    async fn a_fixed_port_taken_on_127_0_0_1_says_so() {
        let taken = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let error = bind_loopback(Some(port)).await.unwrap_err().to_string();
        assert!(
            error.contains(&format!("cannot listen on 127.0.0.1:{port} for the redirect")),
            "{error}"
        );
    }

    #[test]
    fn states_compare_whole() {
        assert!(same_secret(Some("abc"), "abc"));
        for other in [None, Some(""), Some("ab"), Some("abd"), Some("abcd")] {
            assert!(!same_secret(other, "abc"), "{other:?}");
        }
    }
}
