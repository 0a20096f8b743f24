//! The access gateway: for each cluster with a `gateway` section, a
//! listener that ends talosctl's mutual TLS (only certificates of the
//! cluster's gateway CA pass the handshake, and only those the trail
//! recorded as issued are admitted: `admission`), and forwards every gRPC
//! call to apid over HTTP/2 with the gateway's own `os:impersonator`
//! certificate (`upstream`), the person's roles as `talos-role` (`proxy`),
//! recording each call (`crate::talos_api::calls`). Running calls of a
//! person put on the deny list end within seconds on every replica
//! (`cutoff`). Bodies pass through as they come (`body`).

mod admission;
mod body;
mod cutoff;
mod proxy;
mod tls;
mod upstream;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use time::OffsetDateTime;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::app::App;
use crate::audit::AuditRecord;
use crate::audit::store::Append;
use crate::talos_api::calls::{Call, CallEnd, Caller, ReadCalls, Refusals};
use cutoff::{DenySnapshot, LiveCalls};
use upstream::{Link, Upstream};

pub use upstream::{UpstreamError, impersonator_certificate};

/// Connections one gateway listener serves at once; more wait in the
/// kernel's backlog.
const MAX_CONNECTIONS: usize = 512;
/// Concurrent calls on one connection.
const MAX_STREAMS: u32 = 64;
/// Time a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 flow-control windows, both ways and on both sides: what one
/// call, and one connection, can have in flight (so held here, at most,
/// when the other side stops reading). 32 MiB messages still stream.
const STREAM_WINDOW: u32 = 1024 * 1024;
const CONNECTION_WINDOW: u32 = 2 * 1024 * 1024;
/// Largest header block of a call (talosctl sends well under 1 KiB).
const MAX_HEADER_LIST: u32 = 16 * 1024;
/// Time a cut-off person's connection keeps after their calls were told
/// why (trailers), before it is closed whatever the client reads.
const CUT_GRACE: Duration = Duration::from_secs(1);
/// How often counted read-only calls are recorded and the gateway's
/// certificate is checked for renewal.
const HOUSEKEEPING: Duration = Duration::from_secs(5);

/// Why the gateways could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cluster `{cluster}` gateway: {message}")]
    Tls { cluster: String, message: String },
    #[error("cluster `{cluster}` gateway: cannot listen on {address}: {error}")]
    Listen {
        cluster: String,
        address: SocketAddr,
        error: std::io::Error,
    },
}

/// One gateway cluster's running state.
#[derive(Debug)]
pub struct ServedCluster {
    pub cluster: String,
    upstream: Upstream,
    live: Arc<LiveCalls>,
    max_call: Duration,
    reads: Mutex<ReadCalls>,
    refusals: Mutex<Refusals>,
    /// The listener's TLS, with the serving files it was made from: made
    /// again when they change (cert-manager renews the certificate).
    tls: std::sync::RwLock<(Vec<u8>, Arc<tokio_rustls::rustls::ServerConfig>)>,
}

impl ServedCluster {
    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.tls.read().unwrap_or_else(|e| e.into_inner()).1.clone())
    }

    /// Load the serving certificate again when its files changed; a file
    /// that does not load keeps the running one (and says why).
    fn reload_tls(&self, app: &App) {
        let settings = app.settings();
        let Some(gateway) = settings
            .clusters
            .get(&self.cluster)
            .and_then(|c| c.gateway.as_ref())
        else {
            return;
        };
        let files = serving_files(&gateway.config.tls);
        if self.tls.read().unwrap_or_else(|e| e.into_inner()).0 == files {
            return;
        }
        match tls::listener(&gateway.config.tls, &gateway.client_ca) {
            Ok(config) => {
                *self.tls.write().unwrap_or_else(|e| e.into_inner()) = (files, Arc::new(config));
                tracing::info!(cluster = %self.cluster, "gateway serving certificate loaded again");
            }
            Err(error) => {
                tracing::warn!(cluster = %self.cluster, %error, "gateway serving certificate changed but does not load; keeping the running one");
            }
        }
    }

    /// Count a read-only call; the records of windows pushed out.
    fn reads(&self, caller: &Caller, call: &Call, end: &CallEnd, now: OffsetDateTime) -> Vec<AuditRecord> {
        self.reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(caller, call, end, now)
    }

    /// A refused call's record: the records to write now.
    fn refused(&self, record: AuditRecord, now: OffsetDateTime) -> Vec<AuditRecord> {
        self.refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(record, now)
    }

    /// The counted reads and repeated refusals whose minute ended (or all).
    fn take_reads(&self, now: OffsetDateTime, all: bool) -> Vec<AuditRecord> {
        let mut records = self
            .reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(now, all);
        records.extend(
            self.refusals
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(now, all),
        );
        records
    }
}

/// What every call of every gateway shares.
#[derive(Debug)]
pub struct Shared {
    app: Arc<App>,
    deny: DenySnapshot,
    records: RecordSink,
}

/// Records written in the background (an end, counted reads, a refusal):
/// none is lost at shutdown, the writer taking them before it drains.
#[derive(Debug, Clone)]
struct RecordSink(mpsc::UnboundedSender<AuditRecord>);

impl RecordSink {
    fn send(&self, record: AuditRecord) {
        if self.0.send(record).is_err() {
            tracing::error!("an api.call record arrived after the gateway stopped");
        }
    }
}

/// Completes once `stopping` turns true (or its sender is gone).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await.map(|_| ());
}

/// The bytes of the serving certificate and key files (what a change is
/// seen by); empty when they cannot be read.
fn serving_files(tls: &crate::config::GatewayTls) -> Vec<u8> {
    let read = |path: &std::path::Path| std::fs::read(path).unwrap_or_default();
    [read(&tls.cert_file), read(&tls.key_file)].concat()
}

/// A listener bound and ready.
struct Bound {
    served: Arc<ServedCluster>,
    listener: TcpListener,
    address: SocketAddr,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("cluster", &self.served.cluster)
            .field("address", &self.address)
            .finish()
    }
}

/// Every gateway of the configuration, bound.
#[derive(Debug)]
pub struct Gateways {
    bound: Vec<Bound>,
}

impl Gateways {
    /// Load each gateway's serving certificate and bind its listener.
    pub fn bind(app: &App) -> Result<Self, GatewayError> {
        let settings = app.settings();
        let mut bound = Vec::new();
        for cluster in settings.clusters.values() {
            let Some(gateway) = &cluster.gateway else {
                continue;
            };
            let config =
                tls::listener(&gateway.config.tls, &gateway.client_ca).map_err(|e| GatewayError::Tls {
                    cluster: cluster.name.clone(),
                    message: e.to_string(),
                })?;
            let address = gateway.config.listen;
            let listener = std::net::TcpListener::bind(address)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(TcpListener::from_std)
                .map_err(|error| GatewayError::Listen {
                    cluster: cluster.name.clone(),
                    address,
                    error,
                })?;
            let address = listener.local_addr().unwrap_or(address);
            tracing::info!(cluster = %cluster.name, address = %address, upstreams = ?cluster.upstreams(), "gateway listening");
            bound.push(Bound {
                served: Arc::new(ServedCluster {
                    cluster: cluster.name.clone(),
                    upstream: Upstream::new(&cluster.name),
                    live: Arc::default(),
                    max_call: gateway.config.max_call,
                    reads: Mutex::default(),
                    refusals: Mutex::default(),
                    tls: std::sync::RwLock::new((serving_files(&gateway.config.tls), Arc::new(config))),
                }),
                listener,
                address,
            });
        }
        Ok(Self { bound })
    }

    /// Where each gateway listens, by cluster.
    pub fn addresses(&self) -> Vec<(String, SocketAddr)> {
        self.bound
            .iter()
            .map(|b| (b.served.cluster.clone(), b.address))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.bound.is_empty()
    }

    /// Serve until `stopping` turns true; then running calls get `grace`
    /// to end, and every record is handed to the audit writer.
    pub async fn run(self, app: Arc<App>, stopping: watch::Receiver<bool>, grace: Duration) {
        if self.bound.is_empty() {
            return;
        }
        let (sender, receiver) = mpsc::unbounded_channel();
        let recorder = tokio::spawn(record_loop(app.clone(), receiver));
        let shared = Arc::new(Shared {
            app,
            deny: DenySnapshot::default(),
            records: RecordSink(sender),
        });
        let served: Vec<Arc<ServedCluster>> = self.bound.iter().map(|b| b.served.clone()).collect();
        let housekeeping = tokio::spawn(housekeeping(shared.clone(), served.clone(), stopping.clone()));
        let mut listeners = JoinSet::new();
        for bound in self.bound {
            listeners.spawn(accept_loop(shared.clone(), bound, stopping.clone(), grace));
        }
        while listeners.join_next().await.is_some() {}
        let _ = housekeeping.await;
        let now = shared.app.clock.now();
        for cluster in &served {
            for record in cluster.take_reads(now, true) {
                shared.records.send(record);
            }
        }
        drop(served);
        drop(shared);
        let _ = recorder.await;
    }
}

/// Append each record as it comes, concurrently (the writer groups them);
/// ends once every sender is gone and every append has returned.
async fn record_loop(app: Arc<App>, mut receiver: mpsc::UnboundedReceiver<AuditRecord>) {
    let mut appends = JoinSet::new();
    loop {
        tokio::select! {
            record = receiver.recv() => match record {
                Some(record) => {
                    let app = app.clone();
                    appends.spawn(append_with_retries(app, record));
                }
                None => break,
            },
            Some(_) = appends.join_next(), if !appends.is_empty() => {}
        }
    }
    while appends.join_next().await.is_some() {}
}

/// How long a record written after the fact (an end, counted reads) is
/// tried again while the audit database is away.
const RECORD_RETRIES_FOR: Duration = Duration::from_secs(120);

/// Append `record`, trying again each second while the database is away
/// (the call already happened: its record must not be dropped at the first
/// failure), for at most [`RECORD_RETRIES_FOR`].
async fn append_with_retries(app: Arc<App>, record: AuditRecord) {
    let deadline = tokio::time::Instant::now() + RECORD_RETRIES_FOR;
    loop {
        let append = Append {
            record: record.clone(),
            ..Append::default()
        };
        match app.audit.append(append).await {
            Ok(_) => return,
            Err(error) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(request_id = %record.request_id, %error, "api.call record not written yet; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(error) => {
                tracing::error!(request_id = %record.request_id, %error, "an api.call record could not be written");
                return;
            }
        }
    }
}

/// The deny list read and applied each [`cutoff::POLL`]; read-only calls
/// recorded and the gateway certificates renewed each [`HOUSEKEEPING`].
async fn housekeeping(
    shared: Arc<Shared>,
    served: Vec<Arc<ServedCluster>>,
    mut stopping: watch::Receiver<bool>,
) {
    let reason = (
        body::status::PERMISSION_DENIED,
        "talos-sso gateway: access revoked (you were put on the deny list); this call was ended".to_owned(),
    );
    let mut last_housekeeping = tokio::time::Instant::now() - HOUSEKEEPING;
    loop {
        match shared.app.audit.store().deny_list().await {
            Ok(entries) => {
                shared.deny.replace(entries);
                for cluster in &served {
                    let cut = cluster.live.cut_denied(&shared.deny, &reason);
                    if cut > 0 {
                        tracing::warn!(cluster = %cluster.cluster, calls = cut, "running calls cut off (deny list)");
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "gateway could not read the deny list"),
        }
        if last_housekeeping.elapsed() >= HOUSEKEEPING {
            last_housekeeping = tokio::time::Instant::now();
            let now = shared.app.clock.now();
            for cluster in &served {
                for record in cluster.take_reads(now, false) {
                    shared.records.send(record);
                }
                cluster.upstream.renew_if_due(&shared.app).await;
                cluster.reload_tls(&shared.app);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(cutoff::POLL) => {}
            () = stopped(&mut stopping) => return,
        }
    }
}

async fn accept_loop(
    shared: Arc<Shared>,
    bound: Bound,
    mut stopping: watch::Receiver<bool>,
    grace: Duration,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        tokio::select! {
            accepted = bound.listener.accept() => {
                let Ok((stream, peer)) = accepted else { continue };
                let (shared, served, acceptor, stopping) =
                    (shared.clone(), bound.served.clone(), bound.served.acceptor(), stopping.clone());
                connections.spawn(async move {
                    serve_connection(shared, served, stream, peer, acceptor, stopping).await;
                    drop(slot);
                });
            }
            () = stopped(&mut stopping) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(bound.listener);
    // Running calls get the grace period, then are dropped (which cancels
    // them at apid and records them as cancelled).
    let drained =
        tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        connections.shutdown().await;
    }
}

async fn serve_connection(
    shared: Arc<Shared>,
    served: Arc<ServedCluster>,
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    mut stopping: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await else {
        // Another CA's certificate, an expired one, none, or no TLS: the
        // handshake said so to the client.
        tracing::debug!(peer = %peer, cluster = %served.cluster, "gateway handshake refused");
        return;
    };
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| leaf.as_ref().to_vec());
    let Some(leaf) = leaf else {
        return;
    };
    let client_ip = peer.ip().to_string();
    let caller = match admission::admit(shared.app.audit.store(), &served.cluster, &leaf, &client_ip).await {
        Ok(caller) => Arc::new(caller),
        Err(refusal) => {
            tracing::warn!(peer = %peer, cluster = %served.cluster, code = refusal.code(), "gateway connection refused: {refusal}");
            return;
        }
    };
    // Admitted once: a person on the deny list gets no connection.
    if shared
        .deny
        .blocks(caller.subject.as_deref(), caller.username.as_deref())
        == Some(true)
    {
        tracing::info!(peer = %peer, cluster = %served.cluster, "gateway connection refused: on the deny list");
        return;
    }
    // This connection's own way to apid, and its place among the running
    // ones: a deny-list entry closes it, with the calls on it at apid.
    let link = Arc::new(Link::default());
    let watched = served
        .live
        .register(caller.subject.as_deref(), caller.username.as_deref());
    let service = {
        let (shared, served, caller, link) = (shared.clone(), served.clone(), caller.clone(), link.clone());
        hyper::service::service_fn(move |request| {
            let (shared, served, caller, link) =
                (shared.clone(), served.clone(), caller.clone(), link.clone());
            async move {
                Ok::<_, std::convert::Infallible>(proxy::call(shared, served, caller, link, request).await)
            }
        })
    };
    let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(256 * 1024)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_send_buf_size(STREAM_WINDOW as usize)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20))
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    // No connection outlives `max_call`: every call on it ends by then,
    // whether or not its client reads.
    let lifetime = tokio::time::sleep(served.max_call);
    tokio::pin!(lifetime);
    let cut = watched.cut();
    tokio::pin!(cut);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = stopped(&mut stopping) => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
        _ = &mut cut => {
            // The calls' own cut-off sends each its trailers; then the
            // connection goes, with its connections to apid.
            let _ = tokio::time::timeout(CUT_GRACE, connection.as_mut()).await;
            tracing::info!(peer = %peer, cluster = %served.cluster, "gateway connection closed (deny list)");
        }
        () = &mut lifetime => {
            tracing::info!(peer = %peer, cluster = %served.cluster, "gateway connection closed (max_call)");
        }
    }
    link.close();
}
