//! A stand-in for Talos's apid that speaks gRPC, in process: what an access
//! gateway forwards to, judged as apid judges it.
//!
//! TLS (rustls, ring) with the serving certificate the test gives, and a
//! client certificate required and verified against the roots the test
//! gives (`machine.ca` plus `machine.acceptedCAs`), with apid's extra check
//! that every non-CA certificate of the client's chain has extended key
//! usage exactly `[clientAuth]`. HTTP/2 by hyper; each method handled by
//! tonic with the messages of tests/proto/standin.proto (`proto`).
//!
//! Authorization follows Talos's authz injector and authorizer: the roles
//! are the client certificate's Subject Organization values (trimmed, empty
//! ones dropped, as `role.Parse`); only when they include `os:impersonator`
//! and the call carries `talos-role` metadata values do those values,
//! parsed the same way, replace them. The method's rule (Talos's rules map,
//! os:admin for a method without one) must share a role with them, or the
//! call gets PERMISSION_DENIED "not authorized" before its request is read.
//! An authorized method the stand-in does not have gets UNIMPLEMENTED.
//!
//! Every call is logged (`SeenCall`) before it is handled; a hook given at
//! start runs on it then, and its answer is logged too (the gateway tests
//! check there that the audit trail already holds the call). Successful
//! answers carry the header metadata `talos-standin: apid`.
//!
//! In a test (the clients are `grpc_client`'s):
//!
//! ```text
//! let (cert, key) = material::serving_certificate(talos_ca.signer(), talos_ca.key());
//! let apid = StandinApid::start(Config::new(&cert, &key, &roots_pem)).await?;
//! let context = TalosContext::from_talosconfig(&talosconfig, None)?;
//! let call = Call::unary(proto::VERSION).with("nodes", "127.0.0.1");
//! let outcome = ClientKind::Go.call(&context, &call).await;
//! let roles = outcome.decode::<proto::VersionReply>(0).roles;
//! let seen = apid.wait_for(Duration::from_secs(10), |calls| !calls.is_empty()).await;
//! ```

mod log;
mod methods;
pub mod proto;
mod tls;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use talos_sso_server::x509::ParsedCertificate;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};
use tonic::body::Body;
use tonic::{Code, Request, Status, Streaming};

pub use log::SeenCall;
use log::{CallGuard, Log};
pub use methods::percent_encode;
use methods::{Echo, Once, Ticks, answer, grpc, rollback, trailers_only, unary};
use proto::{Chunk, Count, Done, Empty, VersionReply};

pub const ADMIN: &str = "os:admin";
pub const OPERATOR: &str = "os:operator";
pub const READER: &str = "os:reader";
pub const IMPERSONATOR: &str = "os:impersonator";
pub const ETCD_BACKUP: &str = "os:etcd:backup";

/// The metadata key apid reads roles from (Talos's
/// `APIAuthzRoleMetadataKey`).
pub const ROLE_METADATA: &str = "talos-role";

/// How often Logs sends a line.
pub const LOG_INTERVAL: Duration = Duration::from_millis(50);

/// Talos's limit on one message, both ways.
pub const MAX_MESSAGE: usize = 32 * 1024 * 1024;

/// What an async hook returns: `Ok` or `Err` with what the test wants to
/// read back from the `SeenCall`.
pub type HookFuture = Pin<Box<dyn Future<Output = Result<String, String>> + Send>>;

/// Run on each call once it is logged, before it is answered.
pub type Hook = Arc<dyn Fn(SeenCall) -> HookFuture + Send + Sync>;

/// A hook from an async closure.
pub fn hook<F, Fut>(f: F) -> Hook
where
    F: Fn(SeenCall) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<String, String>> + Send + 'static,
{
    Arc::new(move |call| Box::pin(f(call)))
}

/// What the stand-in serves with.
#[derive(Clone)]
pub struct Config {
    /// Its serving certificate (then any intermediates), PEM: signed by the
    /// Talos CA, as a node's is (`material::serving_certificate`).
    pub server_cert_pem: String,
    pub server_key_pem: String,
    /// The CAs a client certificate must chain to, PEM: `machine.ca` and
    /// `machine.acceptedCAs`.
    pub client_roots_pem: String,
    pub hook: Option<Hook>,
}

// By hand: the key never goes into a log line.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("hook", &self.hook.is_some())
            .finish_non_exhaustive()
    }
}

impl Config {
    pub fn new(server_cert_pem: &str, server_key_pem: &str, client_roots_pem: &str) -> Config {
        Config {
            server_cert_pem: server_cert_pem.to_owned(),
            server_key_pem: server_key_pem.to_owned(),
            client_roots_pem: client_roots_pem.to_owned(),
            hook: None,
        }
    }

    pub fn with_hook(mut self, hook: Hook) -> Config {
        self.hook = Some(hook);
        self
    }
}

/// The running stand-in, serving on 127.0.0.1 until `shutdown` or drop.
#[derive(Debug)]
pub struct StandinApid {
    addr: SocketAddr,
    log: Arc<Log>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl StandinApid {
    /// Listen on a free port of 127.0.0.1 and serve on the current runtime.
    pub async fn start(config: Config) -> Result<StandinApid, String> {
        let tls = Arc::new(tls::server_config(&config)?);
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let log = Log::new();
        let (stop, stopped) = oneshot::channel();
        let shared = Arc::new(Shared {
            log: log.clone(),
            hook: config.hook,
        });
        let task = tokio::spawn(accept_loop(listener, tls, shared, stopped));
        Ok(StandinApid {
            addr,
            log,
            stop: Some(stop),
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every call seen so far, in the order they arrived.
    pub fn calls(&self) -> Vec<SeenCall> {
        self.log.calls()
    }

    /// Why each refused TLS handshake failed (rustls's words), in order.
    pub fn refused_handshakes(&self) -> Vec<String> {
        self.log.refused()
    }

    /// Wait until `done` holds of the calls, at most `timeout`: `Ok` with
    /// the calls then, `Err` with the calls as they were at the deadline.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[SeenCall]) -> bool,
    ) -> Result<Vec<SeenCall>, Vec<SeenCall>> {
        let log = &self.log;
        if log.wait(timeout, |log| done(&log.calls())).await {
            Ok(log.calls())
        } else {
            Err(log.calls())
        }
    }

    /// Wait until at least `count` handshakes were refused, at most
    /// `timeout`: `Ok` with why, or `Err` with the refusals so far.
    pub async fn wait_for_refusals(
        &self,
        timeout: Duration,
        count: usize,
    ) -> Result<Vec<String>, Vec<String>> {
        let log = &self.log;
        if log.wait(timeout, |log| log.refused().len() >= count).await {
            Ok(log.refused())
        } else {
            Err(log.refused())
        }
    }

    /// Stop listening and end every connection (open streams included).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for StandinApid {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

struct Shared {
    log: Arc<Log>,
    hook: Option<Hook>,
}

async fn accept_loop(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut connections = JoinSet::new();
    let mut accepted_count = 0;
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => {
                if let Ok((tcp, _)) = accepted {
                    // As gRPC servers do (grpc-go sets it on every
                    // connection): no Nagle delay on small answers.
                    let _ = tcp.set_nodelay(true);
                    accepted_count += 1;
                    let serve = serve_connection(tcp, accepted_count, acceptor.clone(), shared.clone());
                    connections.spawn(serve);
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // Open streams (Logs never ends) would hold a graceful shutdown forever.
    connections.shutdown().await;
}

/// The client's identity as apid reads it, once per connection.
struct Peer {
    connection: u64,
    roles: BTreeSet<String>,
    common_name: Option<String>,
}

async fn serve_connection(
    tcp: TcpStream,
    connection: u64,
    acceptor: tokio_rustls::TlsAcceptor,
    shared: Arc<Shared>,
) {
    let tls = match acceptor.accept(tcp).await {
        Ok(tls) => tls,
        Err(e) => {
            shared.log.refuse(e.to_string());
            return;
        }
    };
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|der| ParsedCertificate::from_der(der).ok());
    let Some(leaf) = leaf else {
        shared
            .log
            .refuse("no client certificate after the handshake".into());
        return;
    };
    let peer = Arc::new(Peer {
        connection,
        roles: parse_roles(leaf.subject_organizations().iter().map(String::as_str)),
        common_name: leaf.subject_common_name(),
    });
    let service = hyper::service::service_fn(move |request| {
        let shared = shared.clone();
        let peer = peer.clone();
        async move { Ok::<_, Infallible>(handle(shared, peer, request).await) }
    });
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // Wide windows: Read's 32 MiB should not crawl.
    http2
        .initial_stream_window_size(4 * 1024 * 1024)
        .initial_connection_window_size(8 * 1024 * 1024);
    let _ = http2.serve_connection(TokioIo::new(tls), service).await;
}

/// Talos's `role.Parse`: values trimmed, empty ones dropped, unknown ones
/// kept (they match no rule).
pub fn parse_roles<'a>(values: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    values
        .into_iter()
        .map(str::trim)
        .filter(|role| !role.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The injector: the metadata's roles replace the certificate's only for an
/// impersonator that sent some.
pub fn effective_roles(certificate: &BTreeSet<String>, metadata: &[String]) -> BTreeSet<String> {
    if certificate.contains(IMPERSONATOR) && !metadata.is_empty() {
        parse_roles(metadata.iter().map(String::as_str))
    } else {
        certificate.clone()
    }
}

/// Talos's rules for the stand-in's methods; any other method falls back
/// to os:admin, as apid's authorizer does.
pub fn allowed_roles(method: &str) -> &'static [&'static str] {
    match method {
        proto::VERSION | proto::LOGS => &[ADMIN, OPERATOR, READER],
        proto::REBOOT => &[ADMIN, OPERATOR],
        proto::ETCD_SNAPSHOT => &[ADMIN, OPERATOR, ETCD_BACKUP],
        _ => &[ADMIN],
    }
}

async fn handle(
    shared: Arc<Shared>,
    peer: Arc<Peer>,
    request: http::Request<Incoming>,
) -> http::Response<Body> {
    let method = request.uri().path().to_owned();
    let header_text = |value: &http::HeaderValue| String::from_utf8_lossy(value.as_bytes()).into_owned();
    let metadata_roles: Vec<String> = request
        .headers()
        .get_all(ROLE_METADATA)
        .iter()
        .map(header_text)
        .collect();
    let effective = effective_roles(&peer.roles, &metadata_roles);
    let authorized = allowed_roles(&method)
        .iter()
        .any(|role| effective.contains(*role));
    let call = SeenCall {
        method: method.clone(),
        connection: peer.connection,
        certificate_roles: peer.roles.iter().cloned().collect(),
        certificate_common_name: peer.common_name.clone(),
        metadata_roles,
        effective_roles: effective.iter().cloned().collect(),
        authorized,
        metadata: request
            .headers()
            .iter()
            .map(|(key, value)| (key.as_str().to_owned(), header_text(value)))
            .collect(),
        cancelled: false,
        finished: false,
        hook: None,
    };
    let index = shared.log.push(call.clone());
    let guard = CallGuard::new(shared.log.clone(), index);
    if let Some(hook) = &shared.hook {
        let said = hook(call).await;
        shared.log.update(index, |call| call.hook = Some(said));
    }
    if !authorized {
        guard.finish();
        return trailers_only(Code::PermissionDenied, "not authorized");
    }
    let roles: Vec<String> = effective.into_iter().collect();
    let response = match method.as_str() {
        proto::VERSION => {
            let reply = VersionReply {
                roles,
                certificate_roles: peer.roles.iter().cloned().collect(),
            };
            grpc()
                .unary(unary(move |_: Empty| Ok(reply.clone())), request)
                .await
        }
        proto::REBOOT | proto::RESET => {
            let action = if method == proto::REBOOT {
                "reboot"
            } else {
                "reset"
            };
            let reply = Done {
                action: action.into(),
                roles,
            };
            grpc()
                .unary(unary(move |_: Empty| Ok(reply.clone())), request)
                .await
        }
        proto::ROLLBACK => rollback(),
        proto::LOGS => {
            let mut guard = Some(guard);
            let service = tower::service_fn(move |_: Request<Empty>| {
                let stream = guard.take().map(|guard| Ticks {
                    interval: tokio::time::interval(LOG_INTERVAL),
                    seq: 0,
                    _guard: guard,
                });
                async move { stream.map(answer).ok_or_else(|| Status::internal("called twice")) }
            });
            return grpc().server_streaming(service, request).await;
        }
        proto::READ | proto::ETCD_SNAPSHOT => {
            let len = if method == proto::READ {
                proto::READ_DATA_LEN
            } else {
                proto::SNAPSHOT_DATA_LEN
            };
            let mut guard = Some(guard);
            let service = tower::service_fn(move |_: Request<Empty>| {
                let stream = guard.take().map(|guard| Once {
                    item: Some(Chunk {
                        data: proto::pattern(0, len),
                    }),
                    guard: Some(guard),
                });
                async move { stream.map(answer).ok_or_else(|| Status::internal("called twice")) }
            });
            return grpc().server_streaming(service, request).await;
        }
        proto::ETCD_RECOVER => {
            let mut guard = Some(guard);
            let service = tower::service_fn(move |request: Request<Streaming<Chunk>>| {
                let guard = guard.take();
                async move {
                    let mut inbound = request.into_inner();
                    let mut count = Count::default();
                    loop {
                        match inbound.message().await {
                            Ok(Some(chunk)) => {
                                count.bytes += chunk.data.len() as u64;
                                count.messages += 1;
                            }
                            Ok(None) => break,
                            Err(status) => {
                                if let Some(guard) = guard {
                                    guard.cancel();
                                }
                                return Err(status);
                            }
                        }
                    }
                    if let Some(guard) = guard {
                        guard.finish();
                    }
                    Ok(answer(count))
                }
            });
            return grpc().client_streaming(service, request).await;
        }
        proto::CONTAINER_RUN => {
            let mut guard = Some(guard);
            let service = tower::service_fn(move |request: Request<Streaming<Chunk>>| {
                let stream = guard.take().map(|guard| Echo {
                    inbound: request.into_inner(),
                    guard: Some(guard),
                });
                async move { stream.map(answer).ok_or_else(|| Status::internal("called twice")) }
            });
            return grpc().streaming(service, request).await;
        }
        _ => trailers_only(Code::Unimplemented, ""),
    };
    guard.finish();
    response
}
