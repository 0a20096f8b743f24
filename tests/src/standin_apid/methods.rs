//! What the stand-in's methods are made of: tonic's handling with Talos's
//! message limit, successful answers with the stand-in's header, statuses
//! alone (refusals, Rollback) written as grpc-go writes them, and the answer
//! streams that tell a finished call from a cancelled one.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use tonic::body::Body;
use tonic::metadata::MetadataValue;
use tonic::server::Grpc;
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

use super::MAX_MESSAGE;
use super::log::CallGuard;
use super::proto::{self, Chunk, LogLine};

/// tonic's handling of one method, with Talos's message limit.
pub(super) fn grpc<Out, In>() -> Grpc<ProstCodec<Out, In>>
where
    Out: prost::Message + Send + 'static,
    In: prost::Message + Default + Send + 'static,
{
    Grpc::new(ProstCodec::default())
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// A unary method's answer, at once.
type Ready<Out> = std::future::Ready<Result<Response<Out>, Status>>;

/// A unary method from a plain function of its request message.
pub(super) fn unary<In, Out>(
    f: impl Fn(In) -> Result<Out, Status> + Send,
) -> tower::util::ServiceFn<impl FnMut(Request<In>) -> Ready<Out>> {
    tower::service_fn(move |request: Request<In>| std::future::ready(f(request.into_inner()).map(answer)))
}

/// A successful answer, with the stand-in's header metadata.
pub(super) fn answer<T>(message: T) -> Response<T> {
    let mut response = Response::new(message);
    response
        .metadata_mut()
        .insert("talos-standin", MetadataValue::from_static("apid"));
    response
}

pub(super) fn rollback() -> http::Response<Body> {
    let mut response = trailers_only(Code::FailedPrecondition, proto::ROLLBACK_MESSAGE);
    response
        .headers_mut()
        .insert("talos-detail", http::HeaderValue::from_static("kept"));
    response
}

/// A status alone, as grpc-go (Talos) writes one: a trailers-only answer,
/// its message percent-encoded outside printable ASCII only (tonic's own
/// encoding escapes spaces too).
pub(super) fn trailers_only(code: Code, message: &str) -> http::Response<Body> {
    let mut response = http::Response::new(Body::empty());
    let headers = response.headers_mut();
    headers.insert("content-type", http::HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", http::HeaderValue::from(code as i32));
    if !message.is_empty()
        && let Ok(message) = http::HeaderValue::from_str(&percent_encode(message))
    {
        headers.insert("grpc-message", message);
    }
    response
}

/// gRPC's percent-encoding as grpc-go applies it to grpc-message: bytes
/// outside `' '..='~'`, and `%`, as `%XX`.
pub fn percent_encode(message: &str) -> String {
    message
        .bytes()
        .map(|b| match b {
            b' '..=b'~' if b != b'%' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Logs' lines: one every `LOG_INTERVAL`, never ending; the guard marks
/// the call cancelled when hyper drops the stream (the client went away).
pub(super) struct Ticks {
    pub(super) interval: tokio::time::Interval,
    pub(super) seq: u64,
    pub(super) _guard: CallGuard,
}

impl Stream for Ticks {
    type Item = Result<LogLine, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        ready!(this.interval.poll_tick(cx));
        this.seq += 1;
        Poll::Ready(Some(Ok(LogLine {
            seq: this.seq,
            text: format!("log line {}", this.seq),
        })))
    }
}

/// One message, then the end (the call finished).
pub(super) struct Once<T> {
    pub(super) item: Option<T>,
    pub(super) guard: Option<CallGuard>,
}

impl<T: Unpin> Stream for Once<T> {
    type Item = Result<T, Status>;

    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let item = this.item.take();
        if item.is_none()
            && let Some(guard) = this.guard.take()
        {
            guard.finish();
        }
        Poll::Ready(item.map(Ok))
    }
}

/// ContainerRun: each message back as it came, until the client closes its
/// side (finished) or its stream breaks (cancelled).
pub(super) struct Echo {
    pub(super) inbound: Streaming<Chunk>,
    pub(super) guard: Option<CallGuard>,
}

impl Stream for Echo {
    type Item = Result<Chunk, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match ready!(Pin::new(&mut this.inbound).poll_next(cx)) {
            Some(Ok(chunk)) => Poll::Ready(Some(Ok(chunk))),
            Some(Err(_)) => {
                if let Some(guard) = this.guard.take() {
                    guard.cancel();
                }
                Poll::Ready(None)
            }
            None => {
                if let Some(guard) = this.guard.take() {
                    guard.finish();
                }
                Poll::Ready(None)
            }
        }
    }
}
