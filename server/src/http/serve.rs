//! The serve loop: one path for TLS and plain HTTP, on hyper-util's
//! HTTP/1.1 + HTTP/2 server, with the limits a listener facing the network
//! needs, so that slow or idle clients cannot hold the server:
//!
//! - at most `max_connections` connections at once; at the cap the server
//!   stops accepting until one ends (the kernel's backlog holds the rest);
//! - the TLS handshake and every request head must arrive within
//!   `header_read_timeout` (for HTTP/1.1 this also ends a keep-alive
//!   connection that sends no next request);
//! - a connection with no request for `idle_timeout` is closed (HTTP/2
//!   included, which has no head timeout of its own; PINGs and other
//!   frames that ask for nothing do not count);
//! - at most `max_connections_per_address` of them from one client address
//!   (IPv6: /64; trusted proxies exempt): further ones are closed at once;
//! - HTTP/2: at most `http2_max_concurrent_streams` streams per connection,
//!   and hyper's defences against reset floods;
//! - a request counts as in flight until its answer's body has been sent,
//!   so that a long answer (an audit stream) does not look idle, while the
//!   request timeout covers only the handler, up to the answer's head;
//! - an answer's body must be sent by its deadline (`super::deadline`):
//!   `idle_timeout` after its head unless its handler set another; past
//!   it, the connection is closed, so that a client that stops reading
//!   cannot keep an answer (and its memory) alive;
//! - at shutdown, no new connections; audit streams are told to end; open
//!   connections finish their requests within `shutdown_grace`, then the
//!   remaining ones are closed.
//!
//! The TLS certificate and key are reloaded when their files change; the
//! metrics read the expiry of the one presented now.
//!
//! The same loop serves the API and, when `metrics.listen` is set, the
//! metrics listener (plain HTTP), each with its own router and limits.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore, watch};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tower::ServiceExt;

use super::deadline::SendDeadline;
use crate::app::App;
use crate::config::{HttpConfig, TlsConfig};

/// The server's TLS certificate and key, swapped in place when the files
/// change; each new connection takes the current pair.
#[derive(Debug, Clone)]
pub(crate) struct TlsFiles {
    current: Arc<RwLock<Served>>,
}

/// What the server presents now.
#[derive(Debug)]
struct Served {
    config: Arc<ServerConfig>,
    /// The leaf certificate's expiry (Unix time), for the metrics; `None`
    /// when it does not read as DER (rustls does not read it itself).
    not_after: Option<i64>,
}

impl TlsFiles {
    fn current(&self) -> std::sync::RwLockReadGuard<'_, Served> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current().config.clone())
    }

    /// When the certificate presented now expires (Unix time).
    pub(crate) fn not_after(&self) -> Option<i64> {
        self.current().not_after
    }
}

/// The rustls configuration for a PEM certificate chain and key (also the
/// tests' TLS front for other services).
pub fn load_tls(cert: &Path, key: &Path) -> io::Result<ServerConfig> {
    load_served(cert, key).map(|(config, _)| config)
}

/// [`load_tls`], and when the chain's first certificate expires.
fn load_served(cert: &Path, key: &Path) -> io::Result<(ServerConfig, Option<i64>)> {
    let bad = |what: &Path, e: &dyn std::fmt::Display| {
        io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", what.display()))
    };
    let chain: Vec<CertificateDer<'static>> = pem_file(cert)?
        .into_iter()
        .filter(|(label, _)| label == "CERTIFICATE")
        .map(|(_, der)| CertificateDer::from(der))
        .collect();
    let Some(leaf) = chain.first() else {
        return Err(bad(cert, &"no CERTIFICATE block"));
    };
    let not_after = leaf_not_after(leaf);
    // The first private key, in whichever form rustls takes.
    let key_der = pem_file(key)?
        .into_iter()
        .find_map(|(label, der)| match label.as_str() {
            "PRIVATE KEY" => Some(PrivateKeyDer::Pkcs8(der.into())),
            "RSA PRIVATE KEY" => Some(PrivateKeyDer::Pkcs1(der.into())),
            "EC PRIVATE KEY" => Some(PrivateKeyDer::Sec1(der.into())),
            _ => None,
        })
        .ok_or_else(|| bad(key, &"no private key block"))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(cert, &e))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| bad(key, &e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((config, not_after))
}

/// The PEM blocks of a file, read as every other PEM file is
/// ([`crate::x509::pem_blocks`]).
fn pem_file(path: &Path) -> io::Result<Vec<(String, Vec<u8>)>> {
    let text = crate::text_file::read(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    crate::x509::pem_blocks(&text)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))
}

fn leaf_not_after(leaf: &[u8]) -> Option<i64> {
    let certificate = <x509_cert::Certificate as der::Decode>::from_der(leaf).ok()?;
    let not_after = certificate.tbs_certificate().validity().not_after;
    i64::try_from(not_after.to_unix_duration().as_secs()).ok()
}

fn served(cert: &Path, key: &Path) -> io::Result<Served> {
    let (config, not_after) = load_served(cert, key)?;
    if not_after.is_none() {
        tracing::warn!(cert = %cert.display(), "the TLS certificate does not read as DER: its expiry is not in the metrics");
    }
    Ok(Served {
        config: Arc::new(config),
        not_after,
    })
}

/// Load the configured certificate and key, and keep them fresh: every
/// `reload_interval` the files' modification times are compared, and changed
/// files are loaded into the running server. A load that fails (half-written
/// files, a key that does not match) is logged and the current pair stays.
pub(crate) async fn tls_from_config(tls: &TlsConfig) -> io::Result<(TlsFiles, tokio::task::JoinHandle<()>)> {
    let files = TlsFiles {
        current: Arc::new(RwLock::new(served(&tls.cert_file, &tls.key_file)?)),
    };
    let (cert, key, interval): (PathBuf, PathBuf, Duration) =
        (tls.cert_file.clone(), tls.key_file.clone(), tls.reload_interval);
    let reloaded = files.clone();
    let task = tokio::spawn(async move {
        let stamp = || {
            let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            (modified(&cert), modified(&key))
        };
        let mut seen = stamp();
        loop {
            tokio::time::sleep(interval).await;
            let now = stamp();
            if now == seen {
                continue;
            }
            match served(&cert, &key) {
                Ok(pair) => {
                    match reloaded.current.write() {
                        Ok(mut current) => *current = pair,
                        Err(poisoned) => *poisoned.into_inner() = pair,
                    }
                    seen = now;
                    tracing::info!(cert = %cert.display(), "TLS certificate reloaded");
                }
                Err(error) => {
                    tracing::warn!(%error, "TLS certificate changed but could not be loaded; keeping the current one")
                }
            }
        }
    });
    Ok((files, task))
}

/// A connection's requests: how many are in flight, and when the last one
/// started or finished. Idle means no request for `idle_timeout`, whatever
/// else moves: HTTP/2 PINGs or window updates keep bytes flowing without
/// asking for anything, and must not keep a connection (and its slot).
#[derive(Debug)]
struct Activity {
    opened: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// The send deadlines of the answers whose bodies are being sent, by
    /// request number.
    answers: Mutex<HashMap<u64, SendDeadline>>,
    next_request: AtomicU64,
    /// Wakes the connection's loop when a deadline is added or moved.
    wake: Arc<Notify>,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            answers: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(0),
            wake: Arc::new(Notify::new()),
        })
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// How long the connection has had no request, zero while one runs.
    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        let now = self.opened.elapsed();
        now.saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }

    fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.touch();
        InFlight {
            activity: self.clone(),
            request: self.next_request.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, HashMap<u64, SendDeadline>> {
        self.answers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The earliest deadline of the answers being sent.
    fn next_deadline(&self) -> Option<tokio::time::Instant> {
        self.answers().values().filter_map(SendDeadline::get).min()
    }
}

/// One request in flight; counted out when dropped (answered or abandoned).
struct InFlight {
    activity: Arc<Activity>,
    request: u64,
}

impl InFlight {
    /// Its answer's body must be sent by `deadline`.
    fn send_by(&self, deadline: SendDeadline) {
        deadline.watch_from(self.activity.wake.clone());
        self.activity.answers().insert(self.request, deadline);
        self.activity.wake.notify_one();
    }
}

/// An answer's body that keeps its request in flight until it is sent (or
/// dropped with the connection).
struct InFlightBody {
    body: axum::body::Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for InFlightBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.activity.answers().remove(&self.request);
        self.activity.touch();
        self.activity.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Open connections per client address (IPv6: per /64), so that one host
/// cannot take every slot. Trusted proxies are not limited: every client
/// behind them shares their address.
#[derive(Debug, Default)]
struct PerAddress {
    open: std::sync::Mutex<HashMap<String, usize>>,
}

/// A slot of one address, given back when dropped.
struct AddressSlot(Arc<PerAddress>, Option<String>);

impl PerAddress {
    fn take(self: &Arc<Self>, key: Option<String>, limit: usize) -> Option<AddressSlot> {
        let Some(key) = key else {
            return Some(AddressSlot(self.clone(), None));
        };
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(key.clone()).or_insert(0);
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(AddressSlot(self.clone(), Some(key)))
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        if let Some(key) = &self.1 {
            let mut open = self.0.open.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(count) = open.get_mut(key) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    open.remove(key);
                }
            }
        }
    }
}

fn connection_builder(http: &HttpConfig) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(http.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(http.http2_max_concurrent_streams)
        .max_header_list_size(64 * 1024);
    builder
}

/// Serve `router` until `shutdown` completes, then let open connections
/// finish their requests for up to `shutdown_grace` and close those still
/// open after it: when this returns, no connection holds the app. `tls` is
/// `None` for plain HTTP (`insecure_http`, the metrics listener).
pub(crate) async fn run(
    app: Arc<App>,
    router: Router,
    listener: tokio::net::TcpListener,
    tls: Option<TlsFiles>,
    shutdown: impl Future<Output = ()>,
) {
    let http = Arc::new(app.settings().config.http.clone());
    let builder = Arc::new(connection_builder(&http));
    let slots = Arc::new(Semaphore::new(http.max_connections));
    let per_address = Arc::new(PerAddress::default());
    let (stop, stopping) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        // Forget the connections that ended: the set holds the open ones.
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait, don't spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let ip = peer.ip().to_canonical();
        let key = (!http.trusted_proxies.iter().any(|net| net.contains(&ip)))
            .then(|| crate::ratelimit::address_key(ip));
        let Some(address_slot) = per_address.take(key, http.max_connections_per_address) else {
            // Closed at once: this address holds its share of connections.
            drop(stream);
            continue;
        };
        let connection = Connection {
            builder: builder.clone(),
            router: router.clone(),
            http: http.clone(),
            stopping: stopping.clone(),
            peer,
        };
        let acceptor = tls.as_ref().map(TlsFiles::acceptor);
        connections.spawn(async move {
            let _slots = (permit, address_slot);
            connection.serve(stream, acceptor).await;
        });
    }
    drop(listener);
    app.feeds.shut_down();
    let _ = stop.send(true);
    let all = u32::try_from(http.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(http.shutdown_grace, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace over; closing the remaining connections");
    }
    connections.shutdown().await;
}

/// One accepted connection and what it needs.
struct Connection {
    builder: Arc<Builder<TokioExecutor>>,
    router: Router,
    http: Arc<HttpConfig>,
    stopping: watch::Receiver<bool>,
    peer: SocketAddr,
}

impl Connection {
    async fn serve(self, stream: TcpStream, acceptor: Option<tokio_rustls::TlsAcceptor>) {
        let _ = stream.set_nodelay(true);
        match acceptor {
            None => self.drive(stream).await,
            Some(acceptor) => {
                let handshake = tokio::time::timeout(self.http.header_read_timeout, acceptor.accept(stream));
                let Ok(Ok(stream)) = handshake.await else {
                    return;
                };
                self.drive(stream).await;
            }
        }
    }

    async fn drive<I>(mut self, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Activity::new();
        let (router, peer, requests) = (self.router.clone(), self.peer, activity.clone());
        let send_timeout = self.http.idle_timeout;
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            let router = router.clone();
            let in_flight = requests.start();
            async move {
                let mut response = router
                    .oneshot(request)
                    .await
                    .unwrap_or_else(|never| match never {});
                let deadline = response
                    .extensions_mut()
                    .remove::<SendDeadline>()
                    .unwrap_or_else(|| SendDeadline::at(tokio::time::Instant::now() + send_timeout));
                in_flight.send_by(deadline);
                let response = response.map(|body| InFlightBody {
                    body,
                    _in_flight: in_flight,
                });
                Ok::<_, Infallible>(response)
            }
        });
        let connection = self.builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let idle_timeout = self.http.idle_timeout;
        loop {
            let now = tokio::time::Instant::now();
            let deadline = activity.next_deadline();
            if deadline.is_some_and(|at| at <= now) {
                // An answer was not taken in time: its client reads too
                // slowly or not at all. Closing drops the body.
                tracing::info!(peer = %self.peer, "an answer was not sent by its deadline; closing the connection");
                return;
            }
            let wait = idle_timeout.saturating_sub(activity.idle_for());
            if wait.is_zero() {
                // Nothing moved for the whole idle timeout (and no request
                // can run that long: see `HttpConfig::check`): close.
                return;
            }
            let wake_at = deadline.map_or(now + wait, |at| at.min(now + wait));
            tokio::select! {
                _ = connection.as_mut() => return,
                () = tokio::time::sleep_until(wake_at) => {}
                () = activity.wake.notified() => {}
                _ = self.stopping.wait_for(|stop| *stop) => break,
            }
        }
        connection.as_mut().graceful_shutdown();
        let _ = connection.await;
    }
}
