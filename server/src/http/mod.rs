//! HTTP: the router, request ids, client addresses, limits, and the serve
//! loop shared by `serve` and the tests (`run(app, listener, shutdown)`).

pub mod error;
pub mod handlers;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::app::App;

pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The request id of the current request (from the caller when well-formed).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

fn well_formed_request_id(value: &str) -> bool {
    (8..=128).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

async fn request_id(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| well_formed_request_id(v))
        .map(str::to_owned)
        .unwrap_or_else(|| crate::audit::random_hex(16));
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

/// The client's address: the peer, or for a trusted proxy the last
/// `X-Forwarded-For` entry that is not itself a trusted proxy.
pub fn client_ip(app: &App, peer: Option<SocketAddr>, headers: &HeaderMap) -> Option<IpAddr> {
    let peer = peer?.ip();
    let trusted = |ip: &IpAddr| app.config.http.trusted_proxies.iter().any(|net| net.contains(ip));
    if !trusted(&peer) {
        return Some(peer);
    }
    let forwarded: Vec<IpAddr> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|part| part.trim().parse().ok())
        .collect();
    Some(
        forwarded
            .into_iter()
            .rev()
            .find(|ip| !trusted(ip))
            .unwrap_or(peer),
    )
}

pub fn router(app: Arc<App>) -> Router {
    let http = &app.config.http;
    Router::new()
        .route("/v1/info", get(handlers::info))
        .route("/v1/certificates", post(handlers::certificates))
        .route("/v1/audit", get(handlers::audit_list))
        .route("/v1/audit/verify", get(handlers::audit_verify))
        .route(
            "/v1/deny",
            get(handlers::deny_list)
                .post(handlers::deny_add)
                .delete(handlers::deny_remove),
        )
        .route("/healthz", get(handlers::healthz))
        .route("/readyz", get(handlers::readyz))
        .route("/metrics", get(handlers::metrics))
        .fallback(handlers::not_found)
        .layer(RequestBodyLimitLayer::new(http.body_limit))
        .layer(TimeoutLayer::with_status_code(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            http.request_timeout,
        ))
        .layer(axum::middleware::from_fn(request_id))
        .with_state(app)
}

/// Load the configured certificate and key, and keep them fresh: every
/// `reload_interval` the files' modification times are compared, and changed
/// files are loaded into the running server. A load that fails (half-written
/// files, a key that does not match) is logged and the current pair stays.
pub async fn tls_from_config(
    tls: &crate::config::TlsConfig,
) -> std::io::Result<(axum_server::tls_rustls::RustlsConfig, tokio::task::JoinHandle<()>)> {
    let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(&tls.cert_file, &tls.key_file).await?;
    let (cert, key, interval) = (tls.cert_file.clone(), tls.key_file.clone(), tls.reload_interval);
    let reloaded = config.clone();
    let task = tokio::spawn(async move {
        let stamp = || {
            let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            (modified(&cert), modified(&key))
        };
        let mut seen = stamp();
        loop {
            tokio::time::sleep(interval).await;
            let now = stamp();
            if now == seen {
                continue;
            }
            match reloaded.reload_from_pem_file(&cert, &key).await {
                Ok(()) => {
                    seen = now;
                    tracing::info!(cert = %cert.display(), "TLS certificate reloaded");
                }
                Err(error) => {
                    tracing::warn!(%error, "TLS certificate changed but could not be loaded; keeping the current one")
                }
            }
        }
    });
    Ok((config, task))
}

/// Serve until `shutdown` completes, then let in-flight requests finish.
/// `tls` is `None` only when the configuration asks for plain HTTP.
pub async fn run(
    app: Arc<App>,
    listener: std::net::TcpListener,
    tls: Option<axum_server::tls_rustls::RustlsConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = app.config.http.shutdown_grace;
    let service = router(app).into_make_service_with_connect_info::<SocketAddr>();
    listener.set_nonblocking(true)?;
    match tls {
        Some(tls) => {
            let handle = axum_server::Handle::new();
            let stopper = handle.clone();
            tokio::spawn(async move {
                shutdown.await;
                stopper.graceful_shutdown(Some(grace));
            });
            axum_server::from_tcp_rustls(listener, tls)?
                .handle(handle)
                .serve(service)
                .await
        }
        None => {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            axum::serve(listener, service)
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}

/// The peer address from connect info, when present.
pub fn peer(connect: Option<ConnectInfo<SocketAddr>>) -> Option<SocketAddr> {
    connect.map(|ConnectInfo(addr)| addr)
}

/// The app from router state (for handlers that need only it).
pub type AppState = State<Arc<App>>;
