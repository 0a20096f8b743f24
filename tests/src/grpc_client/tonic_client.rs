//! The tonic client: tonic's channel over a TLS connection of its own
//! making (rustls, ring), messages as raw bytes.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes};
use futures_core::Stream;
use hyper_util::rt::TokioIo;
use rustls::RootCertStore;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use super::{CONNECT_TIMEOUT, Call, CallOutcome, MAX_MESSAGE, Mode, Received, TalosContext};
use crate::talos_checker::{certificates_from_pem, private_key_from_pem};

/// tonic over a TLS connection of its own making (rustls, ring).
#[derive(Debug, Clone)]
pub struct GrpcClient {
    channel: Channel,
}

impl GrpcClient {
    /// A client of `context`; it connects at the first call (a refused
    /// handshake shows in that call's outcome).
    pub fn connect(context: &TalosContext) -> Result<GrpcClient, String> {
        let addr = context.socket_addr()?;
        let tls = Arc::new(client_tls(context)?);
        let server_name =
            ServerName::try_from(context.host_port().0).map_err(|e| format!("{}: {e}", context.endpoint))?;
        let connector = tower::service_fn(move |_: http::Uri| {
            let tls = tls.clone();
            let server_name = server_name.clone();
            async move {
                let tcp = TcpStream::connect(addr).await?;
                // As talosctl's grpc-go does: no Nagle delay.
                tcp.set_nodelay(true)?;
                let stream = tokio_rustls::TlsConnector::from(tls)
                    .connect(server_name, tcp)
                    .await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        });
        // tonic dials `http://` (its own TLS is not used) while requests say
        // `https`, as talosctl's do.
        let origin = format!("https://{}", context.authority())
            .parse()
            .map_err(|e| format!("{e}"))?;
        let endpoint = Endpoint::from_shared(format!("http://{}", context.authority()))
            .map_err(|e| e.to_string())?
            .origin(origin)
            .connect_timeout(CONNECT_TIMEOUT);
        Ok(GrpcClient {
            channel: endpoint.connect_with_connector_lazy(connector),
        })
    }

    pub async fn call(&self, call: &Call) -> CallOutcome {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        if let Err(e) = grpc.ready().await {
            return CallOutcome::failed(14, "unavailable".into(), Some(error_chain(&e)));
        }
        let path = match http::uri::PathAndQuery::try_from(call.method.as_str()) {
            Ok(path) => path,
            Err(e) => return CallOutcome::failed(13, format!("bad method: {e}"), None),
        };
        let messages = call.requests().into_iter().map(Bytes::from).collect();
        let mut request = tonic::Request::new(Messages(messages));
        for (key, value) in &call.metadata {
            match (
                MetadataKey::from_bytes(key.as_bytes()),
                MetadataValue::try_from(value.as_str()),
            ) {
                (Ok(key), Ok(value)) => {
                    request.metadata_mut().append(key, value);
                }
                _ => return CallOutcome::failed(13, format!("bad metadata {key}"), None),
            }
        }
        let take = match call.mode {
            Mode::ServerStream { take } => take,
            _ => None,
        };
        let mut received = Received::new();
        let response = match grpc.streaming(request, path, RawCodec).await {
            Ok(response) => response,
            Err(status) => return from_status(status, Vec::new(), received),
        };
        let headers = pairs(response.metadata());
        let mut inbound = response.into_inner();
        loop {
            if take.is_some_and(|n| received.sizes.len() >= n) {
                // Dropping the stream resets it (RST_STREAM CANCEL).
                drop(inbound);
                return received.outcome(1, "cancelled by the client".into(), headers, Vec::new());
            }
            match inbound.message().await {
                Ok(Some(message)) => received.push(&message),
                Ok(None) => break,
                Err(status) => return from_status(status, headers, received),
            }
        }
        match inbound.trailers().await {
            Ok(trailers) => {
                let trailers = trailers.map(|t| pairs(&t)).unwrap_or_default();
                received.outcome(0, String::new(), headers, trailers)
            }
            Err(status) => from_status(status, headers, received),
        }
    }
}

pub(super) fn from_status(status: Status, headers: Vec<(String, String)>, received: Received) -> CallOutcome {
    let transport_error = std::error::Error::source(&status).map(error_chain);
    let mut outcome = received.outcome(
        status.code() as i32,
        status.message().to_owned(),
        headers,
        pairs(status.metadata()),
    );
    outcome.transport_error = transport_error;
    outcome
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Metadata as (key, value) pairs, without the status's own keys.
fn pairs(metadata: &MetadataMap) -> Vec<(String, String)> {
    metadata
        .clone()
        .into_headers()
        .iter()
        .filter(|(key, _)| *key != "grpc-status" && *key != "grpc-message")
        .map(|(key, value)| {
            (
                key.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect()
}

fn client_tls(context: &TalosContext) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for ca in certificates_from_pem(&context.ca_pem)? {
        roots.add(ca).map_err(|e| format!("ca: {e}"))?;
    }
    let chain = certificates_from_pem(&context.crt_pem)?;
    let key = private_key_from_pem(&context.key_pem)?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| e.to_string())?;
    tls.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tls)
}

/// The request messages, as a stream.
struct Messages(VecDeque<Bytes>);

impl Stream for Messages {
    type Item = Bytes;

    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Bytes>> {
        Poll::Ready(self.get_mut().0.pop_front())
    }
}

/// Messages as raw bytes both ways.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
