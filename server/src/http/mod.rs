//! HTTP: the router, request ids, client addresses, limits, request
//! latency by route. One module per endpoint group, each extracting what
//! the request says, calling the domain and mapping its answer:
//!
//! - `certificates`: `POST /v1/certificates`, through [`crate::issuance`];
//! - `audit`: `GET /v1/audit` and `/v1/audit/verify` (auditors);
//! - `feed`: `GET /v1/audit/stream` (auditors): the trail as it grows;
//! - `deny`: `/v1/deny` (admins);
//! - `console`: the web console at `/ui` (auditors, admins), when enabled;
//! - `status`: `/v1/info`, `/healthz`, `/readyz`, `/metrics` (here, or
//!   alone on the metrics listener: [`metrics_router`]), not found;
//! - `caller`: what is known of a caller before any check;
//! - `gate`: what every API request passes once: rate limits, the token,
//!   and the recording of any refusal of it;
//! - `privileged`: auditors and admins, past the gate;
//! - `error`: problem details;
//! - `deadline`: by when an answer's body must have reached its client;
//! - `serve`: the serve loop (TLS, limits, graceful shutdown) that
//!   [`crate::server::Server`] runs.

pub mod audit;
pub mod caller;
pub mod certificates;
pub mod console;
pub mod deadline;
pub mod deny;
pub mod error;
pub mod feed;
pub mod gate;
pub mod privileged;
pub mod serve;
pub mod status;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::app::App;

pub use talos_sso_api::REQUEST_ID_HEADER;

/// The request id of the current request (from the caller when well-formed).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

fn well_formed_request_id(value: &str) -> bool {
    (8..=128).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Give the request its id, and the answer too: in the `X-Request-Id`
/// header of every answer and in the body of every error.
async fn request_id(mut request: Request, next: Next) -> Response {
    let from_caller = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| well_formed_request_id(v))
        .map(str::to_owned);
    let id = match from_caller
        .map(Ok)
        .unwrap_or_else(|| crate::random::random_hex(16))
    {
        Ok(id) => id,
        Err(error) => {
            tracing::error!(%error, "no request id; refusing the request");
            return axum::response::IntoResponse::into_response(error::ApiError::internal());
        }
    };
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).await;
    let error = response
        .extensions_mut()
        .remove::<error::ApiError>()
        .or_else(|| error::ApiError::for_plain_refusal(response.status()));
    if let Some(error) = error {
        let allow = response.headers().get(header::ALLOW).cloned();
        response = error.render(&id);
        if let Some(allow) = allow {
            response.headers_mut().insert(header::ALLOW, allow);
        }
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

/// Query parameters as axum reads them: refused ones become a 400 of ours.
pub type QueryParams<T> = Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>;

/// Query parameters, or a 400 `request_invalid` saying what is wrong with them.
pub fn query_or_400<T>(query: QueryParams<T>) -> Result<T, error::ApiError> {
    query
        .map(|q| q.0)
        .map_err(|e| error::ApiError::request_invalid(e.body_text(), None))
}

/// One `X-Forwarded-For` entry: an address, with or without a port
/// (`203.0.113.7:51234`, `[2001:db8::1]:443`, `[2001:db8::1]`), as load
/// balancers write them.
pub fn forwarded_address(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            entry
                .strip_prefix('[')
                .and_then(|e| e.strip_suffix(']'))
                .and_then(|e| e.parse::<std::net::Ipv6Addr>().ok())
                .map(IpAddr::V6)
        })
        .map(|ip| ip.to_canonical())
}

/// The client's address: the peer, or when the peer is a trusted proxy,
/// the `X-Forwarded-For` entries read from the right (each was appended by
/// the hop in front of the next): the first one that is not a trusted
/// proxy is the client. An entry that cannot be read ends the walk at the
/// last trusted hop: everything to its left was written by someone we
/// cannot vouch for.
pub fn client_ip(app: &App, peer: Option<SocketAddr>, headers: &HeaderMap) -> Option<IpAddr> {
    Some(client_address(
        &app.settings().config.http.trusted_proxies,
        peer?.ip(),
        headers,
    ))
}

/// [`client_ip`] given the trusted proxies.
pub fn client_address(trusted_proxies: &[ipnet::IpNet], peer: IpAddr, headers: &HeaderMap) -> IpAddr {
    let peer = peer.to_canonical();
    let trusted = |ip: &IpAddr| trusted_proxies.iter().any(|net| net.contains(ip));
    if !trusted(&peer) {
        return peer;
    }
    // Each entry on its own: one unreadable byte (a client's, on the left)
    // must not make the proxy's own entry on the right unreadable too.
    // `None` stands for an entry that is not text.
    let entries: Vec<Option<&str>> = headers
        .get_all("x-forwarded-for")
        .iter()
        .flat_map(|line| line.as_bytes().split(|b| *b == b','))
        .map(|entry| std::str::from_utf8(entry).ok())
        .collect();
    let mut client = peer;
    for entry in entries.into_iter().rev() {
        let Some(ip) = entry.and_then(forwarded_address) else {
            break;
        };
        client = ip;
        if !trusted(&ip) {
            break;
        }
    }
    client
}

/// Time each request, by the route template it matched (`unmatched` when
/// none did: the path itself never becomes a label) and its status class.
/// Router layers run after routing, so the template is known here.
async fn observe(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned());
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    app.metrics
        .observe_http(route.as_deref(), response.status().as_u16(), started.elapsed());
    response
}

/// The API, and the console when `console` is given. `/metrics` is here
/// unless `metrics.listen` gives it a listener of its own.
pub fn router(app: Arc<App>, console: Option<Arc<console::Console>>) -> Router {
    let settings = app.settings();
    let http = &settings.config.http;
    let mut routes = Router::new()
        .route("/v1/info", get(status::info))
        .route("/v1/certificates", post(certificates::issue))
        .route("/v1/audit", get(audit::list))
        .route("/v1/audit/verify", get(audit::verify))
        .route("/v1/audit/checkpoint", post(audit::checkpoint))
        .route(talos_sso_api::feed::STREAM_PATH, get(feed::stream))
        .route("/v1/deny", get(deny::list).post(deny::add).delete(deny::remove))
        .route("/healthz", get(status::healthz))
        .route("/readyz", get(status::readyz));
    if settings.config.metrics.listen.is_none() {
        routes = routes.route(METRICS_PATH, get(status::metrics));
    }
    if let Some(console) = &console {
        routes = routes.merge(console::router(app.clone(), console.clone()));
    }
    let routes = routes
        .fallback(status::not_found)
        .layer(RequestBodyLimitLayer::new(http.body_limit))
        .layer(TimeoutLayer::with_status_code(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            http.request_timeout,
        ))
        .layer(axum::middleware::from_fn(request_id))
        .layer(axum::middleware::from_fn_with_state(app.clone(), observe));
    match console {
        // Outermost: the console's headers on whatever answers under `/ui`.
        Some(console) => routes.layer(axum::middleware::from_fn_with_state(
            console,
            console::security_headers,
        )),
        None => routes,
    }
    .with_state(app)
}

/// Where the metrics are served.
pub const METRICS_PATH: &str = "/metrics";

/// The metrics listener's (`metrics.listen`): `GET /metrics`, nothing else.
pub fn metrics_router(app: Arc<App>) -> Router {
    Router::new()
        .route(METRICS_PATH, get(status::metrics))
        .fallback(status::not_found)
        .layer(TimeoutLayer::with_status_code(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            app.settings().config.http.request_timeout,
        ))
        .layer(axum::middleware::from_fn(request_id))
        .layer(axum::middleware::from_fn_with_state(app.clone(), observe))
        .with_state(app)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(trusted: &[&str], peer: &str, forwarded: &[&[u8]]) -> String {
        let trusted: Vec<ipnet::IpNet> = trusted.iter().map(|t| t.parse().unwrap()).collect();
        let mut headers = HeaderMap::new();
        for line in forwarded {
            headers.append("x-forwarded-for", HeaderValue::from_bytes(line).unwrap());
        }
        client_address(&trusted, peer.parse().unwrap(), &headers).to_string()
    }

    #[test]
    fn forwarded_entries_may_carry_ports() {
        for (entry, ip) in [
            ("203.0.113.7", "203.0.113.7"),
            (" 203.0.113.7:51234 ", "203.0.113.7"),
            ("[2001:db8::1]:443", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("2001:db8::1", "2001:db8::1"),
            ("::ffff:203.0.113.7", "203.0.113.7"),
        ] {
            assert_eq!(
                forwarded_address(entry).map(|a| a.to_string()).as_deref(),
                Some(ip),
                "{entry}"
            );
        }
        for bad in [
            "",
            "unknown",
            "203.0.113.7:",
            "[2001:db8::1",
            "203.0.113.7:99999",
            "_hidden",
        ] {
            assert_eq!(forwarded_address(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_client_is_the_first_untrusted_entry_from_the_right() {
        let lb = ["10.0.0.0/8"];
        // Not a trusted peer: its header means nothing.
        assert_eq!(address(&lb, "198.51.100.9", &[b"203.0.113.7"]), "198.51.100.9");
        // The load balancer appended the client, with its port.
        assert_eq!(
            address(&lb, "10.0.0.5", &[b"6.6.6.6, 203.0.113.7:51234"]),
            "203.0.113.7",
            "the attacker's entry to the left is not taken"
        );
        assert_eq!(
            address(&lb, "10.0.0.5", &[b"6.6.6.6, [2001:db8::1]:443"]),
            "2001:db8::1"
        );
        // Several proxies, several header lines.
        assert_eq!(
            address(&lb, "10.0.0.5", &[b"6.6.6.6, 203.0.113.7", b"10.1.1.1"]),
            "203.0.113.7"
        );
        // An entry that cannot be read stops the walk at the last trusted hop.
        assert_eq!(address(&lb, "10.0.0.5", &[b"6.6.6.6, garbage"]), "10.0.0.5");
        assert_eq!(
            address(&lb, "10.0.0.5", &[b"6.6.6.6, junk, 10.2.2.2"]),
            "10.2.2.2"
        );
        assert_eq!(address(&lb, "10.0.0.5", &[b"6.6.6.6", b"\xff\xfe"]), "10.0.0.5");
        // A client's non-text entry does not hide the entry the proxy added.
        assert_eq!(address(&lb, "10.0.0.5", &[b"\xe9, 203.0.113.7"]), "203.0.113.7");
        assert_eq!(
            address(&lb, "10.0.0.5", &[b"203.0.113.9, \xe9, 10.1.1.1"]),
            "10.1.1.1"
        );
        // Only trusted hops: the leftmost of them.
        assert_eq!(address(&lb, "10.0.0.5", &[b"10.3.3.3"]), "10.3.3.3");
        assert_eq!(address(&lb, "10.0.0.5", &[]), "10.0.0.5");
    }
}
