//! gRPC clients as talosctl connects: from a talosconfig context (its first
//! endpoint, `ca`, `crt`, `key`), mutual TLS, HTTP/2, metadata of the
//! caller's choosing; each call reports what came back (status code and
//! message, header and trailer metadata, the messages, their sizes and
//! digest), so that three independent clients can be held to the same
//! answers: tonic here (`GrpcClient`), Go's standard library (`go_grpc`),
//! and gRPC's C core through Python's grpcio (`grpcio_client`).
//!
//! Messages travel as raw bytes: `CallOutcome::decode` reads them with the
//! stand-in's prost messages (`standin_apid::proto`).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::standin_apid::proto;

mod program;
mod tonic_client;

pub(crate) use program::{program_args, run_program};
pub use tonic_client::GrpcClient;

/// Talos's API port, for an endpoint written without one.
pub const TALOS_PORT: u16 = 50000;

/// The largest message a client takes (twice Talos's 32 MiB, so that the
/// limit under test is the server's or the gateway's, never the client's).
pub const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// Client streams send their bytes in messages of this much data.
pub const CHUNK: usize = 64 * 1024;

/// Messages are kept in a `CallOutcome` only up to this many bytes in all
/// (sizes and digest are always there).
pub const KEEP_MESSAGES: usize = 1024 * 1024;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and as whom to connect: a talosconfig context.
#[derive(Clone, PartialEq, Eq)]
pub struct TalosContext {
    /// `host` or `host:port` (Talos's port when none).
    pub endpoint: String,
    /// PEM: the CAs that verify the server.
    pub ca_pem: String,
    /// PEM: the client certificate, then any intermediates.
    pub crt_pem: String,
    pub key_pem: String,
}

// By hand: the key never goes into a log line.
impl std::fmt::Debug for TalosContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TalosContext")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl TalosContext {
    pub fn new(endpoint: impl Into<String>, ca_pem: &str, crt_pem: &str, key_pem: &str) -> TalosContext {
        TalosContext {
            endpoint: endpoint.into(),
            ca_pem: ca_pem.to_owned(),
            crt_pem: crt_pem.to_owned(),
            key_pem: key_pem.to_owned(),
        }
    }

    /// A context of a talosconfig file as talosctl reads it: `context`
    /// (the current one when `None`), its first endpoint, and its `ca`,
    /// `crt`, `key` (base64 of PEM).
    pub fn from_talosconfig(path: &Path, context: Option<&str>) -> Result<TalosContext, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let root: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())?;
        let name = match context {
            Some(name) => name.to_owned(),
            None => root["context"].as_str().ok_or("no current context")?.to_owned(),
        };
        let entry = &root["contexts"][name.as_str()];
        let endpoint = entry["endpoints"][0]
            .as_str()
            .ok_or_else(|| format!("context {name}: no endpoint"))?;
        let pem = |field: &str| -> Result<String, String> {
            let encoded = entry[field]
                .as_str()
                .ok_or_else(|| format!("context {name}: no {field}"))?;
            let bytes = STANDARD
                .decode(encoded.trim())
                .map_err(|e| format!("context {name}: {field}: {e}"))?;
            String::from_utf8(bytes).map_err(|e| format!("context {name}: {field}: {e}"))
        };
        Ok(TalosContext::new(
            endpoint,
            &pem("ca")?,
            &pem("crt")?,
            &pem("key")?,
        ))
    }

    /// The same identity at another endpoint.
    pub fn at(&self, endpoint: impl Into<String>) -> TalosContext {
        TalosContext {
            endpoint: endpoint.into(),
            ..self.clone()
        }
    }

    /// Host (no brackets) and port of the endpoint.
    pub fn host_port(&self) -> (String, u16) {
        let endpoint = self.endpoint.as_str();
        if let Ok(addr) = endpoint.parse::<SocketAddr>() {
            (addr.ip().to_string(), addr.port())
        } else if let Ok(ip) = endpoint.parse::<IpAddr>() {
            (ip.to_string(), TALOS_PORT)
        } else if let Some((host, port)) = endpoint.rsplit_once(':')
            && let Ok(port) = port.parse()
        {
            (host.to_owned(), port)
        } else {
            (endpoint.to_owned(), TALOS_PORT)
        }
    }

    /// `host:port`, as a URI authority and for the other clients' flags.
    pub fn authority(&self) -> String {
        match self.host_port() {
            (host, port) if host.contains(':') => format!("[{host}]:{port}"),
            (host, port) => format!("{host}:{port}"),
        }
    }

    fn socket_addr(&self) -> Result<SocketAddr, String> {
        self.authority()
            .to_socket_addrs()
            .map_err(|e| format!("{}: {e}", self.endpoint))?
            .next()
            .ok_or_else(|| format!("{}: no address", self.endpoint))
    }
}

/// How a call sends and reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// One request message, one answer.
    Unary,
    /// One request message, then the answers: `take: Some(n)` reads `n`
    /// and then cancels (resets the stream); `None` reads to the end.
    ServerStream { take: Option<usize> },
    /// `bytes` of pattern data as `Chunk` messages of `CHUNK` bytes, then
    /// the end of the request; one answer.
    ClientStream { bytes: usize },
    /// These request messages, then the end of the request; the answers
    /// to the end.
    Bidi { messages: Vec<Vec<u8>> },
}

/// One call: method, metadata, what it sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The gRPC path, `/machine.MachineService/Version`.
    pub method: String,
    /// Request metadata, in order (lower-case keys; a key may repeat).
    pub metadata: Vec<(String, String)>,
    /// The request message of `Unary` and `ServerStream` (empty: `Empty`).
    pub request: Vec<u8>,
    pub mode: Mode,
}

impl Call {
    pub fn unary(method: &str) -> Call {
        Call::new(method, Mode::Unary)
    }

    pub fn server_stream(method: &str, take: Option<usize>) -> Call {
        Call::new(method, Mode::ServerStream { take })
    }

    pub fn client_stream(method: &str, bytes: usize) -> Call {
        Call::new(method, Mode::ClientStream { bytes })
    }

    pub fn bidi(method: &str, messages: Vec<Vec<u8>>) -> Call {
        Call::new(method, Mode::Bidi { messages })
    }

    fn new(method: &str, mode: Mode) -> Call {
        Call {
            method: method.to_owned(),
            metadata: Vec::new(),
            request: Vec::new(),
            mode,
        }
    }

    /// With one more metadata value.
    pub fn with(mut self, key: &str, value: &str) -> Call {
        self.metadata.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The request messages, encoded.
    pub fn requests(&self) -> Vec<Vec<u8>> {
        match &self.mode {
            Mode::Unary | Mode::ServerStream { .. } => vec![self.request.clone()],
            Mode::ClientStream { bytes } => (0..*bytes)
                .step_by(CHUNK)
                .map(|offset| {
                    let data = proto::pattern(offset, CHUNK.min(bytes - offset));
                    prost::Message::encode_to_vec(&proto::Chunk { data })
                })
                .collect(),
            Mode::Bidi { messages } => messages.clone(),
        }
    }
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOutcome {
    /// The gRPC status code: from `grpc-status`, or the client's own when
    /// none arrived (1 CANCELLED after a `take`; a refused handshake gives
    /// UNAVAILABLE or UNKNOWN, or -1 from the Go client).
    pub code: i32,
    /// The status message, percent-decoded.
    pub message: String,
    /// `grpc-message` as it was on the wire (the Go client only).
    pub message_raw: Option<String>,
    /// Header metadata, as the client exposes it.
    pub headers: Vec<(String, String)>,
    /// Trailer metadata (all of a trailers-only answer), as the client
    /// exposes it, without `grpc-status` and `grpc-message`.
    pub trailers: Vec<(String, String)>,
    /// The size of each message received.
    pub sizes: Vec<usize>,
    /// The messages, when they are `KEEP_MESSAGES` bytes or fewer in all.
    pub messages: Vec<Vec<u8>>,
    /// Hex SHA-256 of all messages, one after the other.
    pub sha256: String,
    /// Why the call failed below gRPC (TLS, connection), when the client
    /// says so.
    pub transport_error: Option<String>,
}

impl CallOutcome {
    pub fn ok(&self) -> bool {
        self.code == 0
    }

    /// Message `index`, decoded.
    pub fn decode<M: prost::Message + Default>(&self, index: usize) -> M {
        let bytes = self
            .messages
            .get(index)
            .unwrap_or_else(|| panic!("no message {index} kept in {self:?}"));
        M::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("message {index}: {e}"))
    }

    /// The first value of trailer `key`.
    pub fn trailer(&self, key: &str) -> Option<&str> {
        first(&self.trailers, key)
    }

    /// The first value of header `key`.
    pub fn header(&self, key: &str) -> Option<&str> {
        first(&self.headers, key)
    }

    fn failed(code: i32, message: String, transport_error: Option<String>) -> CallOutcome {
        CallOutcome {
            code,
            message,
            message_raw: None,
            headers: Vec::new(),
            trailers: Vec::new(),
            sizes: Vec::new(),
            messages: Vec::new(),
            sha256: Received::new().sha256(),
            transport_error,
        }
    }
}

fn first<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Hex SHA-256 of `bytes` (what `CallOutcome::sha256` holds of the
/// messages one expects).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}

/// Messages as they arrive: sizes, digest, and the messages while small.
struct Received {
    sizes: Vec<usize>,
    total: usize,
    messages: Vec<Vec<u8>>,
    digest: ring::digest::Context,
}

impl Received {
    fn new() -> Received {
        Received {
            sizes: Vec::new(),
            total: 0,
            messages: Vec::new(),
            digest: ring::digest::Context::new(&ring::digest::SHA256),
        }
    }

    fn push(&mut self, message: &[u8]) {
        self.sizes.push(message.len());
        self.total += message.len();
        self.digest.update(message);
        if self.total <= KEEP_MESSAGES {
            self.messages.push(message.to_vec());
        } else {
            self.messages.clear();
        }
    }

    fn sha256(&self) -> String {
        hex::encode(self.digest.clone().finish())
    }

    fn outcome(
        self,
        code: i32,
        message: String,
        headers: Vec<(String, String)>,
        trailers: Vec<(String, String)>,
    ) -> CallOutcome {
        CallOutcome {
            code,
            message,
            message_raw: None,
            headers,
            trailers,
            sha256: self.sha256(),
            sizes: self.sizes,
            messages: self.messages,
            transport_error: None,
        }
    }
}

/// Which client makes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    Tonic,
    Go,
    Grpcio,
}

impl ClientKind {
    pub const ALL: [ClientKind; 3] = [ClientKind::Tonic, ClientKind::Go, ClientKind::Grpcio];

    /// One call by this client, on a connection of its own.
    pub async fn call(self, context: &TalosContext, call: &Call) -> CallOutcome {
        match self {
            ClientKind::Tonic => match GrpcClient::connect(context) {
                Ok(client) => client.call(call).await,
                Err(e) => CallOutcome::failed(14, "unavailable".into(), Some(e)),
            },
            ClientKind::Go => crate::go_grpc::call(context, call).await,
            ClientKind::Grpcio => crate::grpcio_client::call(context, call).await,
        }
    }
}
