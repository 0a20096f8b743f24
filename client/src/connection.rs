//! Why a connection failed, said so that the person can fix it.
//!
//! Every way the client reaches the talos-sso server or the identity
//! provider ends here when the request does not get an answer: the address
//! has no or an unknown scheme, the TLS handshake fails (plain HTTP on the
//! other end, a certificate this client does not trust), nothing listens on
//! the port, the name does not resolve, or the answer does not come in time.
//! [`classify`] reads the cause from the error's `source()` chain;
//! [`ConnectionError`] turns it into one sentence that names the cause and
//! the fix, and keeps the original chain at its end for experts.
//!
//! The chain is walked by type where the type is ours to name
//! (`reqwest::Error`, `std::io::Error` kinds, `url::ParseError`). hyper-util's
//! connect errors and rustls's errors are reqwest's internals, not
//! dependencies of this crate, so those are recognised by their text; the
//! tests drive the real stack, so a change of wording upstream fails them.

use std::error::Error;
use std::io::ErrorKind;

/// Who the client was trying to reach: it decides whose address is wrong
/// and who can fix it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// The talos-sso server (`--server`, or the one remembered).
    Server,
    /// The identity provider, whose addresses the talos-sso server and the
    /// provider's discovery document announce.
    IdentityProvider,
}

/// What was wrong with a certificate the TLS handshake refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateProblem {
    /// Signed by an authority this client does not trust.
    UnknownIssuer,
    /// A CA certificate presented as the server's own: self-signed, as
    /// `openssl req -x509` makes them.
    SelfSigned,
    Expired,
    NotYetValid,
    /// Issued for other names than the one in the address.
    WrongName,
    /// Anything else rustls refused, in its words.
    Other(String),
}

/// Why a connection failed, as far as the error chain tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// `127.0.0.1:8443`, `sso.example.com:8443`: no `scheme://` at all.
    NoScheme,
    /// A scheme other than `https` and `http` (e.g. `ftp`).
    UnsupportedScheme(String),
    /// Not a URL for another reason (the URL parser's words).
    InvalidUrl(String),
    /// `http://` to a host that is not this machine: the bearer token (or
    /// the authorization code) would cross the network in clear.
    PlainHttpToRemote,
    /// The TLS handshake read plain HTTP: the other end does not speak TLS.
    PlainHttp,
    /// The TLS handshake refused the peer's certificate.
    Certificate(CertificateProblem),
    /// The TLS handshake failed otherwise.
    Tls,
    /// Nothing listens on the port.
    Refused,
    /// The host name does not resolve.
    NameNotResolved,
    /// No answer in time.
    TimedOut,
    /// None of the above: only the chain says what happened.
    Other,
}

impl Cause {
    /// Whether the address itself is at fault (nothing was sent).
    pub fn is_address(&self) -> bool {
        matches!(
            self,
            Cause::NoScheme | Cause::UnsupportedScheme(_) | Cause::InvalidUrl(_) | Cause::PlainHttpToRemote
        )
    }
}

/// A failed connection: whom, where, why, and the libraries' own words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.sentence())]
pub struct ConnectionError {
    pub peer: Peer,
    /// The address as given (the server's) or as requested (the provider's).
    pub url: String,
    pub cause: Cause,
    /// The error chain on one line, short; empty when the address was
    /// refused before any request.
    pub chain: String,
}

/// The longest chain kept at the end of a message: enough for an expert to
/// search for, short enough to stay on a line or two.
const CHAIN_LIMIT: usize = 300;

impl ConnectionError {
    /// Check an address before any request is made, so that a missing or
    /// unknown scheme is named as such (reqwest only says "builder error").
    pub fn check_address(peer: Peer, address: &str) -> Result<url::Url, ConnectionError> {
        let refuse = |cause| ConnectionError {
            peer,
            url: address.to_owned(),
            cause,
            chain: String::new(),
        };
        // `sso.example.com:8443` parses as scheme `sso.example.com`: without
        // `://` there is no scheme the person meant to give.
        if !address.contains("://") {
            return Err(refuse(Cause::NoScheme));
        }
        let url = url::Url::parse(address).map_err(|e| refuse(Cause::InvalidUrl(e.to_string())))?;
        match url.scheme() {
            "https" | "http" => {}
            other => return Err(refuse(Cause::UnsupportedScheme(other.to_owned()))),
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(refuse(Cause::InvalidUrl("no host".into())));
        }
        // Plain HTTP only where nothing crosses a network: the quick start
        // and tests on this machine.
        if url.scheme() == "http" && !is_loopback_host(url.host()) {
            return Err(refuse(Cause::PlainHttpToRemote));
        }
        Ok(url)
    }

    /// The failure `error` while reaching `url`. For the identity provider
    /// the URL reqwest requested (an endpoint from discovery) is shown when
    /// the chain carries it, since that is the address that failed.
    pub fn from_error(peer: Peer, url: &str, error: &(dyn Error + 'static)) -> Self {
        let requested = match peer {
            Peer::Server => None,
            Peer::IdentityProvider => find_reqwest(error).and_then(reqwest::Error::url).map(|u| {
                let mut u = u.clone();
                u.set_query(None);
                u.set_fragment(None);
                u.to_string()
            }),
        };
        let url = requested.unwrap_or_else(|| url.to_owned());
        let mut cause = classify(error);
        // reqwest reads `sso.example.com:8443` as the scheme
        // `sso.example.com`: the address check names it better.
        if cause.is_address()
            && let Err(checked) = Self::check_address(peer, &url)
        {
            cause = checked.cause;
        }
        Self {
            peer,
            url,
            cause,
            chain: chain(error),
        }
    }

    /// The connection failure in `error`'s chain, if it is one: a request
    /// that got no answer, as opposed to an answer the peer gave.
    pub fn transport(peer: Peer, url: &str, error: &(dyn Error + 'static)) -> Option<Self> {
        let failed = find_reqwest(error)?;
        let transport = failed.is_connect()
            || failed.is_timeout()
            || failed.is_builder()
            || failed.is_request()
            || failed.is_body();
        transport.then(|| Self::from_error(peer, url, error))
    }

    fn host(&self) -> String {
        url::Url::parse(&self.url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_else(|| self.url.clone())
    }

    /// `HOST:PORT`, with the scheme's port when the address names none.
    fn host_port(&self) -> String {
        match url::Url::parse(&self.url) {
            Ok(u) => match (u.host_str(), u.port_or_known_default()) {
                (Some(host), Some(port)) => format!("{host}:{port}"),
                (Some(host), None) => host.to_owned(),
                _ => self.url.clone(),
            },
            Err(_) => self.url.clone(),
        }
    }

    /// The sentence a person reads: cause, then what to do, then the chain.
    pub fn sentence(&self) -> String {
        let url = &self.url;
        let message = if self.cause.is_address() {
            self.address_sentence()
        } else {
            let (who, fix_elsewhere) = match self.peer {
                Peer::Server => ("the talos-sso server", ""),
                Peer::IdentityProvider => (
                    "the identity provider",
                    " (the talos-sso server announces this address: if it is wrong, tell its operators)",
                ),
            };
            let hp = self.host_port();
            let why = match &self.cause {
                Cause::PlainHttp => format!(
                    "the TLS handshake failed because {hp} answers in plain HTTP, not HTTPS; \
                     use its https:// address (plain http:// only for a server on this machine){fix_elsewhere}"
                ),
                Cause::Certificate(problem) => {
                    let problem = match problem {
                        CertificateProblem::UnknownIssuer => format!(
                            "its certificate is not trusted: an authority this client does not know signed it \
                             (it trusts this machine's trust store and the public web authorities); if {hp} \
                             has a certificate from your organisation's own authority, {}",
                            self.trust_fix()
                        ),
                        CertificateProblem::SelfSigned => format!(
                            "its certificate is not trusted: it signed itself (this client trusts this \
                             machine's trust store and the public web authorities); {hp} needs a certificate \
                             from an authority, or {}",
                            self.trust_fix()
                        ),
                        CertificateProblem::Expired => format!(
                            "its certificate has expired (or this machine's clock is wrong); \
                             renew the certificate of {hp}, or fix the clock"
                        ),
                        CertificateProblem::NotYetValid => format!(
                            "its certificate is not valid yet (or this machine's clock is wrong); \
                             check the clock, or the certificate of {hp}"
                        ),
                        CertificateProblem::WrongName => format!(
                            "its certificate is not valid for the name `{}`; \
                             use the name the certificate was issued for",
                            self.host()
                        ),
                        CertificateProblem::Other(why) => {
                            format!("its certificate was refused ({why}); check the certificate of {hp}")
                        }
                    };
                    format!("the TLS handshake failed because {problem}{fix_elsewhere}")
                }
                Cause::Tls => format!(
                    "the TLS handshake with {hp} failed; check that this is its HTTPS address and port{fix_elsewhere}"
                ),
                Cause::Refused => format!(
                    "nothing listens on {hp} (connection refused); is {} running, and is the port right?{fix_elsewhere}",
                    match self.peer {
                        Peer::Server => "the server",
                        Peer::IdentityProvider => "the identity provider",
                    }
                ),
                Cause::NameNotResolved => format!(
                    "the name `{}` does not resolve; check its spelling, and your DNS (or VPN){fix_elsewhere}",
                    self.host()
                ),
                Cause::TimedOut => format!(
                    "{hp} did not answer in time; {} or the network is slow, or a firewall drops the traffic: \
                     try again, and check the address",
                    match self.peer {
                        Peer::Server => "the server",
                        Peer::IdentityProvider => "the identity provider",
                    }
                ),
                Cause::Other => match self.peer {
                    Peer::Server => "is it running, and is --server right?".to_owned(),
                    Peer::IdentityProvider => {
                        format!("is it up, and can this machine reach it?{fix_elsewhere}")
                    }
                },
                Cause::NoScheme
                | Cause::UnsupportedScheme(_)
                | Cause::InvalidUrl(_)
                | Cause::PlainHttpToRemote => String::new(),
            };
            format!("{who} at {url} cannot be reached: {why}")
        };
        if self.chain.is_empty() {
            message
        } else {
            format!("{message} [{}]", self.chain)
        }
    }

    /// How to trust an authority for this peer.
    fn trust_fix(&self) -> &'static str {
        match self.peer {
            Peer::Server => {
                "pass its certificate (PEM): `talos-sso login --certificate-authority FILE`, \
                 or add it to this machine's trust store"
            }
            Peer::IdentityProvider => {
                "pass its certificate (PEM): `talos-sso login --provider-certificate-authority FILE`, \
                 or add it to this machine's trust store"
            }
        }
    }

    fn address_sentence(&self) -> String {
        let address = &self.url;
        let problem = match &self.cause {
            Cause::NoScheme => "has no scheme".to_owned(),
            Cause::UnsupportedScheme(scheme) => {
                format!("starts with {scheme}://, which talos-sso does not speak")
            }
            Cause::InvalidUrl(why) => format!("is not a URL ({why})"),
            Cause::PlainHttpToRemote => "is plain http:// to another machine, so the sign-in token \
                 would cross the network unencrypted; http:// is accepted only for localhost, 127.0.0.0/8 and [::1]"
                .to_owned(),
            _ => "cannot be used".to_owned(),
        };
        match self.peer {
            Peer::Server => {
                let example = match self.cause {
                    // The quick start serves plain HTTP on this machine.
                    Cause::NoScheme if is_loopback(address) => {
                        format!(", or http:// for a server on this machine, e.g. --server http://{address}")
                    }
                    Cause::NoScheme => format!(", e.g. --server https://{address}"),
                    _ => String::new(),
                };
                format!("the server address `{address}` {problem}: use https://HOST:PORT{example}")
            }
            Peer::IdentityProvider => format!(
                "the identity provider address `{address}` that the talos-sso server announces {problem}: \
                 it must be an https:// URL; tell the server's operators"
            ),
        }
    }
}

/// Whether `address` (`HOST[:PORT]`, no scheme) names this machine:
/// `localhost`, 127.0.0.0/8 or `[::1]`.
fn is_loopback(address: &str) -> bool {
    url::Url::parse(&format!("http://{address}")).is_ok_and(|url| is_loopback_host(url.host()))
}

/// Whether a URL's host is this machine (see [`is_loopback`]).
fn is_loopback_host(host: Option<url::Host<&str>>) -> bool {
    match host {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// The reqwest error in the chain, boxed or not (oauth2 keeps it boxed).
fn find_reqwest<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a reqwest::Error> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<reqwest::Error>() {
            return Some(found);
        }
        if let Some(found) = e.downcast_ref::<Box<reqwest::Error>>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

/// Every text of the chain, innermost included. An `io::Error` that wraps
/// another error (rustls's) shows that error's text but not as its source,
/// so it is read through `get_ref`.
fn texts(error: &(dyn Error + 'static)) -> Vec<String> {
    let mut texts = Vec::new();
    let mut current = Some(error);
    while let Some(e) = current {
        texts.push(e.to_string());
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            texts.push(inner.to_string());
        }
        current = e.source();
    }
    texts
}

/// The cause of `error`, read from its `source()` chain.
pub fn classify(error: &(dyn Error + 'static)) -> Cause {
    let mut builder = false;
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(failed) = e
            .downcast_ref::<reqwest::Error>()
            .or_else(|| e.downcast_ref::<Box<reqwest::Error>>().map(|b| &**b))
        {
            builder |= failed.is_builder();
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.kind() {
                ErrorKind::ConnectionRefused => return Cause::Refused,
                ErrorKind::TimedOut => return Cause::TimedOut,
                _ => {}
            }
        }
        if let Some(parse) = e.downcast_ref::<url::ParseError>() {
            return match parse {
                url::ParseError::RelativeUrlWithoutBase => Cause::NoScheme,
                other => Cause::InvalidUrl(other.to_string()),
            };
        }
        current = e.source();
    }
    if find_reqwest(error).is_some_and(reqwest::Error::is_timeout) {
        return Cause::TimedOut;
    }
    let texts = texts(error);
    let any = |test: &dyn Fn(&str) -> bool| texts.iter().any(|t| test(t));
    // hyper-util names the resolver's failure "dns error"; std's own text
    // covers a resolver error reached some other way.
    if any(&|t| t == "dns error" || t.starts_with("failed to lookup address information")) {
        return Cause::NameNotResolved;
    }
    if let Some(text) = texts.iter().find(|t| t.starts_with("invalid peer certificate")) {
        return Cause::Certificate(certificate_problem(text));
    }
    // rustls reads the first bytes of an HTTP answer ("HTTP/1.1 400") as a
    // TLS record of no known content type.
    if any(&|t| t.contains("InvalidContentType")) {
        return Cause::PlainHttp;
    }
    if any(&|t| {
        t.starts_with("received corrupt message")
            || t.starts_with("received fatal alert")
            || t.starts_with("peer is incompatible")
            || t.starts_with("peer misbehaved")
            || t.starts_with("received unexpected")
            || t == "tls handshake eof"
    }) {
        return Cause::Tls;
    }
    if any(&|t| t == "URL scheme is not allowed") {
        return Cause::UnsupportedScheme(
            find_reqwest(error)
                .and_then(reqwest::Error::url)
                .map(|u| u.scheme().to_owned())
                .unwrap_or_default(),
        );
    }
    if builder {
        return Cause::InvalidUrl("not a URL this client can request".into());
    }
    Cause::Other
}

/// rustls's `invalid peer certificate: ...`, in the words the fix needs.
fn certificate_problem(text: &str) -> CertificateProblem {
    let detail = text
        .trim_start_matches("invalid peer certificate")
        .trim_start_matches(": ");
    if detail.contains("UnknownIssuer") {
        CertificateProblem::UnknownIssuer
    } else if detail.contains("CaUsedAsEndEntity") {
        CertificateProblem::SelfSigned
    } else if detail.contains("Expired") || detail.starts_with("certificate expired") {
        CertificateProblem::Expired
    } else if detail.contains("NotValidYet") || detail.starts_with("certificate not valid yet") {
        CertificateProblem::NotYetValid
    } else if detail.contains("NotValidForName") || detail.starts_with("certificate not valid for name") {
        CertificateProblem::WrongName
    } else {
        CertificateProblem::Other(detail.to_owned())
    }
}

/// The chain on one line, without repeats and without the URL reqwest
/// appends (the sentence names it already), cut to [`CHAIN_LIMIT`].
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut text = String::new();
    let mut current = Some(error);
    while let Some(e) = current {
        let mut part = e.to_string();
        if let Some(url) = e
            .downcast_ref::<reqwest::Error>()
            .or_else(|| e.downcast_ref::<Box<reqwest::Error>>().map(|b| &**b))
            .and_then(reqwest::Error::url)
        {
            part = part.replace(&format!(" for url ({url})"), "");
        }
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        current = e.source();
    }
    if text.chars().count() > CHAIN_LIMIT {
        text = text.chars().take(CHAIN_LIMIT - 1).collect::<String>() + "…";
    }
    text
}

/// Peers that fail in the ways this module names, for the tests of every
/// module that reaches a server.
#[cfg(test)]
pub(crate) mod test_peers {
    /// A port nothing listens on, held while the socket lives: bound but
    /// never listening, so connections are refused and no other test's peer
    /// can take the port meanwhile.
    pub fn refused_port() -> (tokio::net::TcpSocket, u16) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = socket.local_addr().unwrap().port();
        (socket, port)
    }

    /// A peer that reads a request and sends `answer` (raw HTTP/1.1 bytes)
    /// on every connection; abort the task to stop it.
    pub async fn answering_peer(answer: &'static [u8]) -> (u16, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let serving = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut buffer = [0u8; 1024];
                let _ = stream.read(&mut buffer).await;
                let _ = stream.write_all(answer).await;
            }
        });
        (port, serving)
    }

    /// A peer that accepts connections and never answers; abort the task
    /// to close them.
    pub async fn silent_peer() -> (u16, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                open.push(stream);
            }
        });
        (port, held)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    use super::test_peers::{answering_peer, refused_port, silent_peer};

    async fn failure(url: &str, timeout: Duration) -> reqwest::Error {
        reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .unwrap()
            .get(url)
            .send()
            .await
            .unwrap_err()
    }

    fn server_error(url: &str, error: &reqwest::Error) -> ConnectionError {
        ConnectionError::transport(Peer::Server, url, error).unwrap()
    }

    #[tokio::test]
    async fn a_refused_port_is_named() {
        let (_held, port) = refused_port();
        let url = format!("https://127.0.0.1:{port}");
        let error = failure(&url, Duration::from_secs(10)).await;
        assert_eq!(classify(&error), Cause::Refused, "{error:?}");
        let message = server_error(&url, &error).to_string();
        assert!(
            message.starts_with(&format!(
                "the talos-sso server at {url} cannot be reached: nothing listens on {} (connection refused); \
                 is the server running, and is the port right? [error sending request: ",
                url.trim_start_matches("https://")
            )),
            "{message}"
        );
        assert!(
            message.ends_with("Connection refused (os error 111)]"),
            "{message}"
        );
        assert!(!message.contains("for url"), "the URL is named once: {message}");
    }

    #[tokio::test]
    async fn plain_http_on_a_tls_address_is_named() {
        let (port, serving) =
            answering_peer(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await;
        let url = format!("https://127.0.0.1:{port}");
        let error = failure(&url, Duration::from_secs(10)).await;
        assert_eq!(classify(&error), Cause::PlainHttp, "{error:?}");
        assert!(server_error(&url, &error).to_string().contains(&format!(
            "cannot be reached: the TLS handshake failed because 127.0.0.1:{port} answers in plain HTTP, not HTTPS; \
             use its https:// address (plain http:// only for a server on this machine) ["
        )));
        serving.abort();
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_named() {
        let url = "https://talos-sso.invalid:8443";
        let error = failure(url, Duration::from_secs(10)).await;
        assert_eq!(classify(&error), Cause::NameNotResolved, "{error:?}");
        assert!(
            server_error(url, &error).to_string().starts_with(
                "the talos-sso server at https://talos-sso.invalid:8443 cannot be reached: \
                 the name `talos-sso.invalid` does not resolve; check its spelling, and your DNS (or VPN) [error sending request: "
            )
        );
    }

    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let (port, held) = silent_peer().await;
        // The sentence is checked through the API client (`api`).
        let error = failure(&format!("https://127.0.0.1:{port}"), Duration::from_millis(300)).await;
        assert_eq!(classify(&error), Cause::TimedOut, "{error:?}");
        held.abort();
    }

    #[tokio::test]
    async fn addresses_reqwest_cannot_request_are_named_too() {
        // The provider's addresses reach reqwest unchecked: its builder
        // errors must still say what is wrong.
        let error = failure("127.0.0.1:8443", Duration::from_secs(1)).await;
        assert_eq!(classify(&error), Cause::NoScheme, "{error:?}");
        let error = failure("ftp://127.0.0.1:8443/", Duration::from_secs(1)).await;
        assert_eq!(
            classify(&error),
            Cause::UnsupportedScheme("ftp".into()),
            "{error:?}"
        );
        assert_eq!(
            ConnectionError::from_error(Peer::IdentityProvider, "ftp://127.0.0.1:8443/", &error).to_string(),
            "the identity provider address `ftp://127.0.0.1:8443/` that the talos-sso server announces starts with \
             ftp://, which talos-sso does not speak: it must be an https:// URL; tell the server's operators \
             [builder error: URL scheme is not allowed]"
        );
    }

    #[test]
    fn server_addresses_are_checked_before_any_request() {
        let refused = |address: &str| {
            ConnectionError::check_address(Peer::Server, address)
                .unwrap_err()
                .to_string()
        };
        for address in ["sso.example.com:8443", "10.0.0.1:8443", "localhost.example.com"] {
            assert_eq!(
                refused(address),
                format!(
                    "the server address `{address}` has no scheme: use https://HOST:PORT, e.g. --server https://{address}"
                )
            );
        }
        // The quick start's server listens in plain HTTP on this machine.
        for address in [
            "127.0.0.1:8443",
            "127.0.0.2:8443",
            "localhost",
            "LOCALHOST:8443",
            "[::1]:8443",
        ] {
            assert_eq!(
                refused(address),
                format!(
                    "the server address `{address}` has no scheme: use https://HOST:PORT, or http:// for a server \
                     on this machine, e.g. --server http://{address}"
                )
            );
        }
        assert_eq!(
            refused("ftp://sso.example.com:8443"),
            "the server address `ftp://sso.example.com:8443` starts with ftp://, which talos-sso does not speak: \
             use https://HOST:PORT"
        );
        assert_eq!(
            refused("https://"),
            "the server address `https://` is not a URL (empty host): use https://HOST:PORT"
        );
        for good in [
            "https://sso.example.com:8443",
            "http://127.0.0.1:8443/",
            "http://127.9.9.9/",
            "http://localhost:8080",
            "http://[::1]:8443",
            "HTTPS://[::1]:8443",
        ] {
            assert!(
                ConnectionError::check_address(Peer::Server, good).is_ok(),
                "{good}"
            );
        }
    }

    #[test]
    fn plain_http_is_refused_to_any_other_machine() {
        for address in [
            "http://sso.example.com",
            "http://10.0.0.1:8443",
            "http://[fe80::1]:8443",
            "http://localhost.example.com",
            "http://0.0.0.0:8443",
        ] {
            let server = ConnectionError::check_address(Peer::Server, address).unwrap_err();
            assert_eq!(server.cause, Cause::PlainHttpToRemote, "{address}");
            assert_eq!(
                server.to_string(),
                format!(
                    "the server address `{address}` is plain http:// to another machine, so the sign-in token \
                     would cross the network unencrypted; http:// is accepted only for localhost, 127.0.0.0/8 \
                     and [::1]: use https://HOST:PORT"
                )
            );
            let provider = ConnectionError::check_address(Peer::IdentityProvider, address).unwrap_err();
            assert_eq!(provider.cause, Cause::PlainHttpToRemote, "{address}");
            assert!(
                provider.to_string().contains("tell the server's operators"),
                "{provider}"
            );
        }
    }

    #[test]
    fn certificate_problems_are_told_apart() {
        let cases = [
            (
                "invalid peer certificate: UnknownIssuer",
                CertificateProblem::UnknownIssuer,
            ),
            (
                "invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))",
                CertificateProblem::SelfSigned,
            ),
            (
                "invalid peer certificate: certificate expired: verification time 2 (UNIX), but certificate is \
                 not valid after 1 (1 seconds ago)",
                CertificateProblem::Expired,
            ),
            ("invalid peer certificate: Expired", CertificateProblem::Expired),
            (
                "invalid peer certificate: NotValidYet",
                CertificateProblem::NotYetValid,
            ),
            (
                "invalid peer certificate: certificate not valid for name \"sso.example.com\"; certificate is \
                 only valid for localhost",
                CertificateProblem::WrongName,
            ),
            (
                "invalid peer certificate: BadSignature",
                CertificateProblem::Other("BadSignature".into()),
            ),
        ];
        for (text, expected) in cases {
            let error = std::io::Error::new(ErrorKind::InvalidData, text);
            assert_eq!(classify(&error), Cause::Certificate(expected), "{text}");
        }
        let wrong_name = ConnectionError {
            peer: Peer::Server,
            url: "https://sso.example.com:8443".into(),
            cause: Cause::Certificate(CertificateProblem::WrongName),
            chain: String::new(),
        };
        assert_eq!(
            wrong_name.to_string(),
            "the talos-sso server at https://sso.example.com:8443 cannot be reached: the TLS handshake failed \
             because its certificate is not valid for the name `sso.example.com`; use the name the certificate \
             was issued for"
        );
    }

    #[test]
    fn the_chain_stays_short() {
        let long = std::io::Error::other("x".repeat(1000));
        let text = chain(&long);
        assert_eq!(text.chars().count(), CHAIN_LIMIT);
        assert!(text.ends_with('…'));
    }
}
