//! The bodies of a forwarded call. Frames pass through as they come (HTTP/2
//! flow control stays end to end: nothing is read ahead of what the other
//! side takes), counted; the answer's trailers are read for the call's
//! status, and the answer can be ended by the gateway (a cut-off, apid gone)
//! with trailers of its own. Whatever way an answer ends, its call is
//! finished exactly once.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// gRPC status codes the gateway uses.
pub mod status {
    pub const CANCELLED: u32 = 1;
    pub const UNKNOWN: u32 = 2;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const DEADLINE_EXCEEDED: u32 = 4;
    pub const PERMISSION_DENIED: u32 = 7;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const UNAVAILABLE: u32 = 14;
    pub const UNAUTHENTICATED: u32 = 16;
}

/// What the client sends, on its way to apid, counted.
#[derive(Debug)]
pub struct ForwardBody {
    inner: Incoming,
    bytes: Arc<AtomicU64>,
}

impl ForwardBody {
    pub fn new(inner: Incoming, bytes: Arc<AtomicU64>) -> Self {
        Self { inner, bytes }
    }
}

impl Body for ForwardBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        loop {
            let polled = Pin::new(&mut self.inner).poll_frame(cx);
            if let Poll::Ready(Some(Ok(frame))) = &polled {
                match frame.data_ref() {
                    Some(data) => {
                        self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                    }
                    // gRPC requests carry no trailers, and grpc-go (apid)
                    // answers HEADERS on an open stream by closing the
                    // whole connection: never sent on.
                    None => continue,
                }
            }
            return polled;
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Told once, with the gRPC status and message, when the answer ended.
pub type Finish = Box<dyn FnOnce(u32, Option<String>) + Send>;

/// Completes when the call must be ended by the gateway, with the status
/// and message to end it with.
pub type Cut = Pin<Box<dyn Future<Output = (u32, String)> + Send>>;

/// What goes back to the client.
pub struct ReturnBody {
    inner: Option<Incoming>,
    bytes: Arc<AtomicU64>,
    cut: Option<Cut>,
    finish: Option<Finish>,
    /// The status the answer's headers already carried (trailers-only).
    header_status: Option<(u32, Option<String>)>,
    ended: bool,
}

impl std::fmt::Debug for ReturnBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReturnBody").field("ended", &self.ended).finish()
    }
}

impl ReturnBody {
    /// apid's answer, passed through.
    pub fn forwarded(
        inner: Incoming,
        headers: &HeaderMap,
        bytes: Arc<AtomicU64>,
        cut: Cut,
        finish: Finish,
    ) -> Self {
        let mut body = Self {
            bytes,
            cut: Some(cut),
            finish: Some(finish),
            header_status: status_of(headers),
            ended: inner.is_end_stream(),
            inner: Some(inner),
        };
        if body.ended {
            // Trailers-only: apid ended the stream with its headers. The
            // client must get them with END_STREAM too (an empty DATA frame
            // ending the stream instead is an error to gRPC's C core).
            body.inner = None;
            let (status, message) = body.header_status.clone().unwrap_or((status::UNKNOWN, None));
            body.finish(status, message);
        }
        body
    }

    /// An answer of the gateway's own: its status is in the headers
    /// (trailers-only), so the body is empty.
    pub fn empty() -> Self {
        Self {
            inner: None,
            bytes: Arc::default(),
            cut: None,
            finish: None,
            header_status: None,
            ended: true,
        }
    }

    fn finish(&mut self, status: u32, message: Option<String>) {
        if let Some(finish) = self.finish.take() {
            finish(status, message);
        }
    }

    /// End the answer with trailers of the gateway's own.
    fn end_with(&mut self, status: u32, message: &str) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.inner = None;
        self.ended = true;
        self.finish(status, Some(message.to_owned()));
        Poll::Ready(Some(Ok(Frame::trailers(status_headers(status, message)))))
    }
}

impl Body for ReturnBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(cut) = self.cut.as_mut()
            && let Poll::Ready((status, message)) = cut.as_mut().poll(cx)
        {
            return self.end_with(status, &message);
        }
        let Some(inner) = self.inner.as_mut() else {
            self.ended = true;
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                } else if let Some(trailers) = frame.trailers_ref() {
                    let (status, message) = status_of(trailers).unwrap_or((status::UNKNOWN, None));
                    self.ended = true;
                    self.inner = None;
                    self.finish(status, message);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                let message = format!("talos-sso gateway: apid ended the call ({error})");
                self.end_with(status::UNAVAILABLE, &message)
            }
            Poll::Ready(None) => {
                // Ended without trailers: only a trailers-only answer may.
                let (status, message) = self.header_status.clone().unwrap_or((status::UNKNOWN, None));
                self.ended = true;
                self.inner = None;
                self.finish(status, message);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

impl Drop for ReturnBody {
    /// The client went away (or the connection broke) before the end:
    /// dropping `inner` resets the stream toward apid, which cancels there.
    fn drop(&mut self) {
        self.finish(status::CANCELLED, Some("the client cancelled the call".into()));
    }
}

/// The `grpc-status` and `grpc-message` of headers or trailers.
pub fn status_of(headers: &HeaderMap) -> Option<(u32, Option<String>)> {
    let status = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .map(|value| percent_decode(value.as_bytes()));
    Some((status, message))
}

/// Trailers (or trailers-only headers) with a status and message.
pub fn status_headers(status: u32, message: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("grpc-status", HeaderValue::from(status));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", value);
    }
    headers
}

/// gRPC's encoding of `grpc-message`: bytes outside printable ASCII, and
/// `%`, as `%XX`.
pub fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn percent_decode(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(high), Some(low)) => {
                out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_encoded_both_ways() {
        let message = "nothing to roll back: état 100%";
        let encoded = percent_encode(message);
        assert_eq!(encoded, "nothing to roll back: %C3%A9tat 100%25");
        assert_eq!(percent_decode(encoded.as_bytes()), message);
        // A stray % is kept as it is.
        assert_eq!(percent_decode(b"50% off %zz"), "50% off %zz");
        let headers = status_headers(7, message);
        assert_eq!(status_of(&headers), Some((7, Some(message.to_owned()))));
    }
}
