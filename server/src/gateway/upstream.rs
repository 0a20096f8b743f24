//! The gateway's side toward apid: its own `os:impersonator` certificate
//! (a new key each time, signed by the cluster's `ca`, recorded before it
//! is used, renewed at half its life) and one HTTP/2 connection per apid
//! endpoint that every call is multiplexed on, opened again when it breaks
//! or when the certificate is renewed.

use std::sync::Arc;
use std::time::Duration;

use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use time::OffsetDateTime;
use tokio::sync::Mutex;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::rustls::pki_types::ServerName;

use super::body::ForwardBody;
use super::tls;
use crate::app::App;
use crate::audit::store::{Append, Appended};
use crate::audit::{AuditRecord, RecordExt, event, outcome};
use crate::ca::generate::{NewKeyType, generate_key};
use crate::certificate::{LeafRequest, SignedLeaf, sign_leaf};
use crate::cluster::Cluster;

/// The role that lets apid take `talos-role` metadata as the caller's roles.
pub const IMPERSONATOR: &str = "os:impersonator";

/// The CN of the gateway's certificate (Talos ignores it; people read it).
pub const GATEWAY_CN: &str = "talos-sso gateway";

/// How long a connection to apid may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the gateway cannot reach apid.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("the gateway's certificate could not be made: {0}")]
    Certificate(String),
    #[error("the gateway's certificate could not be recorded, so it is not used")]
    AuditUnavailable,
    #[error("no apid endpoint answered ({0})")]
    Unreachable(String),
}

/// The certificate in use toward apid.
#[derive(Debug)]
pub struct Identity {
    pub config: Arc<ClientConfig>,
    /// When to make the next one: half-way through its life.
    pub renew_at: OffsetDateTime,
}

/// A new gateway certificate for `cluster`, not yet recorded: the chain
/// (leaf first) and the new key as PKCS#8 PEM. The key is Ed25519, as
/// Talos's own are; Go's `crypto/tls`, which apid runs, takes it.
pub fn impersonator_certificate(
    cluster: &Cluster,
    now: OffsetDateTime,
) -> Result<(SignedLeaf, String), UpstreamError> {
    let gateway = cluster
        .gateway
        .as_ref()
        .ok_or_else(|| UpstreamError::Certificate("the cluster has no gateway".into()))?;
    let ca = cluster.signing_ca(now);
    let key =
        generate_key(NewKeyType::Ed25519, ca.rng()).map_err(|e| UpstreamError::Certificate(e.to_string()))?;
    let spki = crate::keys::Signer::public_key_info(&key.key)
        .map_err(|e| UpstreamError::Certificate(e.to_string()))?;
    let roles = [IMPERSONATOR.to_owned()];
    let leaf = LeafRequest {
        username: GATEWAY_CN,
        roles: &roles,
        ttl: gateway.config.impersonator_ttl,
        clock_skew: cluster.config.clock_skew,
    };
    let signed = sign_leaf(ca, &spki, &leaf, now).map_err(|e| UpstreamError::Certificate(e.to_string()))?;
    Ok((signed, key.pem))
}

/// Make, record and return a new gateway certificate for `cluster`.
pub async fn issue_identity(app: &App, cluster: &Cluster) -> Result<Identity, UpstreamError> {
    let now = app.clock.now();
    let ca = cluster.signing_ca(now);
    let (signed, key_pem) = {
        let _turn = ca.turn_to_sign().await;
        impersonator_certificate(cluster, now)?
    };
    let roles = [IMPERSONATOR.to_owned()];
    let key_der = crate::x509::pem_blocks(&key_pem)
        .ok()
        .and_then(|blocks| blocks.into_iter().next())
        .map(|(_, der)| der)
        .ok_or_else(|| UpstreamError::Certificate("the new key could not be read back".into()))?;
    let config = tls::upstream(ca.trust_bundle_pem(), &signed.chain_pem, key_der)
        .map_err(|e| UpstreamError::Certificate(e.to_string()))?;
    let request_id = crate::random::random_hex(16).unwrap_or_else(|_| "gateway".into());
    let mut record = AuditRecord::new(
        event::GATEWAY_CERTIFICATE_ISSUED,
        outcome::SUCCESS,
        &request_id,
        now,
    );
    record.cluster = Some(cluster.name.clone());
    record.username = Some(GATEWAY_CN.into());
    record.roles_requested = roles.to_vec();
    record.set_certificate(&signed);
    record.details = serde_json::json!({ "signed_by": crate::ca::describe_name(&ca.signer().raw_subject) });
    match app
        .audit
        .append(Append {
            record,
            ..Append::default()
        })
        .await
    {
        Ok(Appended::Recorded(_)) => {}
        _ => return Err(UpstreamError::AuditUnavailable),
    }
    let life = signed.not_after - now;
    tracing::info!(cluster = %cluster.name, serial = %signed.serial_hex, not_after = %crate::ca::format_time(signed.not_after),
        "gateway certificate issued");
    Ok(Identity {
        config: Arc::new(config),
        renew_at: now + life / 2,
    })
}

/// One cluster's identity toward apid: the current certificate, shared by
/// every client connection.
#[derive(Debug)]
pub struct Upstream {
    cluster: String,
    identity: Mutex<Option<Arc<Identity>>>,
}

impl Upstream {
    pub fn new(cluster: &str) -> Self {
        Self {
            cluster: cluster.to_owned(),
            identity: Mutex::new(None),
        }
    }

    /// The certificate to connect with: made when there is none or it is
    /// due for renewal (and recorded before it is used).
    pub async fn identity(&self, app: &App) -> Result<Arc<Identity>, UpstreamError> {
        let mut identity = self.identity.lock().await;
        if let Some(current) = identity.as_ref()
            && app.clock.now() < current.renew_at
        {
            return Ok(current.clone());
        }
        let settings = app.settings();
        let cluster = settings
            .clusters
            .get(&self.cluster)
            .ok_or_else(|| UpstreamError::Unreachable("the cluster is no longer configured".into()))?;
        let fresh = Arc::new(issue_identity(app, cluster).await?);
        *identity = Some(fresh.clone());
        Ok(fresh)
    }

    /// Renew the certificate ahead of need, so that no call waits for it.
    pub async fn renew_if_due(&self, app: &App) {
        if let Err(error) = self.identity(app).await {
            tracing::warn!(cluster = %self.cluster, %error, "gateway could not renew its certificate");
        }
    }
}

/// One client connection's own HTTP/2 connection to apid: a person who
/// stops reading holds up only their own calls, and ending a person's
/// connection ends their calls at apid too (its driver is aborted, which
/// closes the connection; apid cancels what ran on it).
#[derive(Debug, Default)]
pub struct Link {
    state: Mutex<LinkState>,
}

#[derive(Debug, Default)]
struct LinkState {
    /// The connection new calls go on, and the certificate it was made with.
    current: Option<(String, SendRequest<ForwardBody>, Arc<Identity>)>,
    /// The drivers of every connection this link made.
    drivers: Vec<tokio::task::JoinHandle<()>>,
}

impl Link {
    /// A connection to apid ready for a call, and the endpoint it goes to:
    /// a new one when there is none, it closed, or the certificate was
    /// renewed (calls running on the old one finish there).
    pub async fn connection(
        &self,
        app: &App,
        upstream: &Upstream,
    ) -> Result<(String, SendRequest<ForwardBody>), UpstreamError> {
        let identity = upstream.identity(app).await?;
        let mut state = self.state.lock().await;
        if let Some((endpoint, sender, made_with)) = &state.current
            && Arc::ptr_eq(made_with, &identity)
            && !sender.is_closed()
            && sender.is_ready()
        {
            return Ok((endpoint.clone(), sender.clone()));
        }
        let settings = app.settings();
        let cluster = settings
            .clusters
            .get(&upstream.cluster)
            .ok_or_else(|| UpstreamError::Unreachable("the cluster is no longer configured".into()))?;
        let mut failures = Vec::new();
        for endpoint in cluster.upstreams() {
            match connect(endpoint, &identity.config).await {
                Ok((sender, driver)) => {
                    state.drivers.retain(|d| !d.is_finished());
                    state.drivers.push(driver);
                    state.current = Some((endpoint.clone(), sender.clone(), identity));
                    return Ok((endpoint.clone(), sender));
                }
                Err(error) => {
                    tracing::warn!(cluster = %upstream.cluster, endpoint = %endpoint, %error, "apid endpoint unreachable");
                    failures.push(format!("{endpoint}: {error}"));
                }
            }
        }
        Err(UpstreamError::Unreachable(failures.join("; ")))
    }

    /// Close every connection to apid this link made.
    pub fn close(&self) {
        if let Ok(mut state) = self.state.try_lock() {
            state.current = None;
            for driver in state.drivers.drain(..) {
                driver.abort();
            }
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for driver in self.state.get_mut().drivers.drain(..) {
            driver.abort();
        }
    }
}

/// `host:port` (an IPv6 address in brackets), with Talos's port when none is
/// given.
fn host_and_port(endpoint: &str) -> (String, u16) {
    let endpoint = endpoint.trim_start_matches("https://");
    if let Ok(address) = endpoint.parse::<std::net::SocketAddr>() {
        return (address.ip().to_string(), address.port());
    }
    if let Ok(ip) = endpoint.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
        return (ip.to_string(), 50000);
    }
    match endpoint.rsplit_once(':') {
        Some((host, port)) => match port.parse() {
            Ok(port) => (host.to_owned(), port),
            Err(_) => (endpoint.to_owned(), 50000),
        },
        None => (endpoint.to_owned(), 50000),
    }
}

/// The host part of an endpoint (what a call that names no node targets).
pub fn endpoint_host(endpoint: &str) -> String {
    host_and_port(endpoint).0
}

async fn connect(
    endpoint: &str,
    config: &Arc<ClientConfig>,
) -> Result<(SendRequest<ForwardBody>, tokio::task::JoinHandle<()>), String> {
    let (host, port) = host_and_port(endpoint);
    let server_name = ServerName::try_from(host.clone()).map_err(|e| e.to_string())?;
    let opened = tokio::time::timeout(CONNECT_TIMEOUT, async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        let stream = connector
            .connect(server_name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err("apid did not agree to HTTP/2".to_owned());
        }
        // No HTTP/2 pings: grpc-go (apid) answers pings more often than
        // every 5 minutes on a quiet connection with GOAWAY too_many_pings.
        // The windows bound what one client connection can hold here.
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(super::STREAM_WINDOW)
            .initial_connection_window_size(super::CONNECTION_WINDOW)
            .max_frame_size(256 * 1024)
            .max_header_list_size(super::MAX_HEADER_LIST)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP/2: {e}"))?;
        let driver = tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "apid connection ended");
            }
        });
        Ok((sender, driver))
    })
    .await;
    opened.unwrap_or_else(|_| Err(format!("no answer within {} s", CONNECT_TIMEOUT.as_secs())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_read_as_talosctl_reads_them() {
        assert_eq!(host_and_port("10.5.0.2"), ("10.5.0.2".into(), 50000));
        assert_eq!(host_and_port("10.5.0.2:50001"), ("10.5.0.2".into(), 50001));
        assert_eq!(host_and_port("[fd00::2]:50000"), ("fd00::2".into(), 50000));
        assert_eq!(host_and_port("fd00::2"), ("fd00::2".into(), 50000));
        assert_eq!(host_and_port("cp.example.com"), ("cp.example.com".into(), 50000));
        assert_eq!(
            host_and_port("https://cp.example.com:443"),
            ("cp.example.com".into(), 443)
        );
    }
}
