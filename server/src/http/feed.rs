//! `GET /v1/audit/stream` (auditors): the trail as it grows, for a SIEM.
//!
//! One `audit.query` record (`action: follow`, the filter) is committed
//! when a stream starts, never one per record or heartbeat: following the
//! trail does not grow it. The answer is JSON lines
//! (`talos_sso_api::feed::StreamLine`): the records after the cursor that
//! match the filter, then each new one as it commits, a heartbeat when
//! nothing else was sent for `audit.feed.heartbeat`, and a last line saying
//! why the server ended the stream.
//!
//! A stream ends, whatever its client does, when the caller's token
//! expires (the client reconnects with a fresh token and the last cursor)
//! and as soon as the caller may no longer read the trail: a watch of its
//! own checks the running configuration (a reload that removes them from
//! `auditors`) and the deny list every poll interval, during catch-up too,
//! and ends the stream even while its client reads nothing. A client that
//! takes no line for `audit.feed.write_timeout` is cut off; the
//! connection of an ended stream is closed if its last lines are not taken
//! within that time either (`super::deadline`).
//!
//! New records are noticed at once when this replica commits them (the
//! writer publishes its head), and within `audit.feed.poll_interval` when
//! another replica does. At most `audit.feed.max_streams` streams run at
//! once on a replica, at most `audit.feed.max_streams_per_identity` of them
//! for one caller. The request timeout covers the start (authentication,
//! the record) only; the serve loop counts a stream in flight until its
//! body ends, so the idle timeout does not cut it either.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use talos_sso_api::AuditQuery;
use talos_sso_api::audit::{MAX_PAGE, format_micros};
use talos_sso_api::feed::{Heartbeat, STREAM_CONTENT_TYPE, StreamEnd, StreamLine, end};
use tokio::sync::{mpsc, watch};

use super::audit::filter;
use super::caller::Caller;
use super::deadline::SendDeadline;
use super::error::ApiError;
use super::gate::refuse;
use super::privileged::{Privilege, authorize, commit, is_member};
use super::{QueryParams, query_or_400};
use crate::app::App;
use crate::audit::event;
use crate::audit::store::AuditFilter;
use crate::config::FeedConfig;
use crate::identity::VerifiedIdentity;
use crate::identity::auth_error::AuthError;
use crate::identity::token::TokenError;
use crate::slots::{Full, Slot};
use talos_sso_text as text;

/// Lines waiting to be sent; a slow reader holds the stream back here.
const QUEUED_LINES: usize = 64;

/// How long a refused stream is told to wait.
const RETRY_STREAM: Duration = Duration::from_secs(30);

/// `GET /v1/audit/stream`.
pub async fn stream(
    State(app): State<Arc<App>>,
    caller: Caller,
    query: QueryParams<AuditQuery>,
) -> Result<Response, ApiError> {
    let query = query_or_400(query)?.map(text::clean_field);
    let details = json!({"action": "follow", "filter": query});
    let (verified, record) = authorize(&app, &caller, Privilege::Auditor, event::AUDIT_QUERY, details)
        .await?
        .into_success();
    if query.limit.is_some() {
        let error = ApiError::request_invalid("`limit` is for pages; a stream has no end", Some("limit"));
        return Err(refuse(&app, record, error).await);
    }
    let filter = match filter(&query, app.clock.now()) {
        Ok(filter) => filter,
        Err((parameter, detail)) => {
            let error = ApiError::request_invalid(detail, Some(parameter));
            return Err(refuse(&app, record, error).await);
        }
    };
    // A token past its `exp` (still within the leeway) would open a stream
    // that ends at once, and a client that reconnects with it would add a
    // record each time: it gets the refusal a client waits on instead.
    let left: Duration = (verified.expires_at - app.clock.now())
        .try_into()
        .unwrap_or(Duration::ZERO);
    if left.is_zero() {
        let error = ApiError::token(&AuthError::Token(TokenError::Expired), app.clock.now());
        return Err(refuse(&app, record, error).await);
    }
    let slot = match app.feeds.take(&verified.qualified_subject()) {
        Ok(slot) => slot,
        Err(full) => {
            let who = match full {
                Full::Identity => "you: you hold your most audit streams on this server already",
                Full::Total | Full::Closed => "every client: this server serves its most audit streams",
            };
            let error = ApiError::rate_limited(RETRY_STREAM, who);
            return Err(refuse(&app, record, error).await);
        }
    };
    commit(&app, record, None).await?;
    let (lines, queue) = mpsc::channel(QUEUED_LINES);
    let deadline = SendDeadline::unset();
    let follower = Follower {
        _slot: slot,
        app: app.clone(),
        caller: verified,
        filter,
        lines,
        ends_at: tokio::time::Instant::now() + left,
        deadline: deadline.clone(),
    };
    tokio::spawn(follower.run());
    let mut response = Body::new(Lines(queue)).into_response();
    response.extensions_mut().insert(deadline);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(STREAM_CONTENT_TYPE),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Proxies that buffer answers (nginx) would hold the lines back.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// The body of a stream: the lines its follower sends, until it drops its
/// end of the channel.
struct Lines(mpsc::Receiver<Bytes>);

impl hyper::body::Body for Lines {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|line| line.map(|bytes| Ok(hyper::body::Frame::data(bytes))))
    }
}

/// One stream's task: reads the trail after its cursor and sends what
/// matches, while a watch of its own checks that the caller may still read
/// it. Ends when the reader goes away or stops reading, the token expires,
/// the caller's rights end, the trail cannot be read or the server shuts
/// down.
struct Follower {
    /// Counted among the stream slots until the task ends; declared before
    /// `lines`, so that it is free again before the reader sees the end.
    _slot: Slot,
    app: Arc<App>,
    /// Who opened the stream, as authenticated then: checked again while
    /// it runs.
    caller: VerifiedIdentity,
    filter: AuditFilter,
    lines: mpsc::Sender<Bytes>,
    ends_at: tokio::time::Instant,
    /// The answer's send deadline: none while the stream runs, set when it
    /// ends so that a client that no longer reads loses the connection.
    deadline: SendDeadline,
}

/// Why a follower stops.
enum Stop {
    /// The reader went away, or took no line for the write timeout:
    /// nobody to tell, and its connection is closed at once.
    Gone,
    /// Ended by the server, saying why in a last line.
    Ended(&'static str),
}

impl Follower {
    async fn run(mut self) {
        let feed = self.app.settings().config.audit.feed.clone();
        let stop = {
            let watch = Watch {
                app: &self.app,
                caller: &self.caller,
                ends_at: self.ends_at,
                poll_interval: feed.poll_interval,
            };
            let mut follow = Follow {
                app: &self.app,
                caller: &self.caller,
                filter: &mut self.filter,
                lines: &self.lines,
                write_timeout: feed.write_timeout,
            };
            tokio::select! {
                stop = watch.run() => stop,
                stop = follow.run(&feed) => stop,
            }
        };
        let mut cut_at = tokio::time::Instant::now();
        if let Stop::Ended(reason) = stop {
            let line = StreamLine::End(StreamEnd {
                end: reason.to_owned(),
                cursor: self.filter.after_seq,
            });
            if send(&self.lines, &line, feed.write_timeout).await.is_ok() {
                // The lines still queued get as long again to be taken.
                cut_at = tokio::time::Instant::now() + feed.write_timeout;
            }
        }
        // Past it, the serve loop closes the connection, whatever the
        // client does; a body that ends first is not held to it.
        self.deadline.set(cut_at);
    }
}

/// What a stream's watch needs: the caller's rights are checked on a timer
/// of its own, so that a stream ends whatever its client does.
struct Watch<'a> {
    app: &'a App,
    caller: &'a VerifiedIdentity,
    ends_at: tokio::time::Instant,
    poll_interval: Duration,
}

impl Watch<'_> {
    async fn run(&self) -> Stop {
        let mut stopping = self.app.feeds.stopping();
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.poll_interval) => {}
                () = tokio::time::sleep_until(self.ends_at) => return Stop::Ended(end::TOKEN_EXPIRED),
                _ = stopping.wait_for(|stop| *stop) => return Stop::Ended(end::SHUTTING_DOWN),
            }
            if let Err(stop) = still_an_auditor(self.app, self.caller) {
                return stop;
            }
            if let Err(stop) = self.not_denied().await {
                return stop;
            }
        }
    }

    /// Whether the caller is off the deny list; a list that cannot be read
    /// ends the stream too.
    async fn not_denied(&self) -> Result<(), Stop> {
        let caller = self.caller;
        match self
            .app
            .audit
            .store()
            .is_denied(&caller.subject, &caller.username)
            .await
        {
            Ok(false) => Ok(()),
            Ok(true) => {
                tracing::info!("an audit stream ended: its caller is on the deny list");
                Err(Stop::Ended(end::ACCESS_REVOKED))
            }
            Err(error) => {
                tracing::warn!(%error, "an audit stream could not read the deny list; ending it");
                Err(Stop::Ended(end::AUDIT_UNAVAILABLE))
            }
        }
    }
}

/// Whether the running configuration (reloaded since the stream started,
/// perhaps) still makes `caller` an auditor.
fn still_an_auditor(app: &App, caller: &VerifiedIdentity) -> Result<(), Stop> {
    let settings = app.settings();
    if is_member(
        &settings.config.auditors,
        &settings.config.identity.allowed_tenants,
        caller,
    ) {
        return Ok(());
    }
    tracing::info!("an audit stream ended: its caller is no longer among the auditors");
    Err(Stop::Ended(end::ACCESS_REVOKED))
}

/// What a stream's reading and sending needs (its watch ends it at the
/// token's expiry).
struct Follow<'a> {
    app: &'a App,
    caller: &'a VerifiedIdentity,
    filter: &'a mut AuditFilter,
    lines: &'a mpsc::Sender<Bytes>,
    write_timeout: Duration,
}

impl Follow<'_> {
    async fn run(&mut self, feed: &FeedConfig) -> Stop {
        let mut committed = self.app.audit.committed();
        let mut last_sent = tokio::time::Instant::now();
        loop {
            if let Err(stop) = self.send_new(&mut committed, &mut last_sent).await {
                return stop;
            }
            let heartbeat_at = last_sent + feed.heartbeat;
            let wake_at = heartbeat_at.min(tokio::time::Instant::now() + feed.poll_interval);
            tokio::select! {
                changed = committed.changed() => {
                    if changed.is_err() {
                        return Stop::Ended(end::SHUTTING_DOWN);
                    }
                }
                () = tokio::time::sleep_until(wake_at) => {}
                () = self.lines.closed() => return Stop::Gone,
            }
            if tokio::time::Instant::now() >= heartbeat_at {
                let line = StreamLine::Heartbeat(Heartbeat {
                    heartbeat: format_micros(self.app.clock.now()),
                    cursor: self.filter.after_seq,
                });
                if let Err(stop) = send(self.lines, &line, self.write_timeout).await {
                    return stop;
                }
                last_sent = tokio::time::Instant::now();
            }
        }
    }

    /// Send every matching record after the cursor, page by page, and move
    /// the cursor past what was read: to the last record sent, or, when the
    /// trail has no more, to the head this replica had committed before
    /// the read (every record up to it was committed, and so was read).
    async fn send_new(
        &mut self,
        committed: &mut watch::Receiver<i64>,
        last_sent: &mut tokio::time::Instant,
    ) -> Result<(), Stop> {
        loop {
            // Before each page, as a reload may have changed the auditors.
            still_an_auditor(self.app, self.caller)?;
            let head = *committed.borrow_and_update();
            let page = AuditFilter {
                limit: MAX_PAGE,
                ..self.filter.clone()
            };
            let records = match self.app.audit.store().query(&page).await {
                Ok(records) => records,
                Err(error) => {
                    tracing::warn!(%error, "an audit stream could not read the trail; ending it");
                    return Err(Stop::Ended(end::AUDIT_UNAVAILABLE));
                }
            };
            let full = records.len() as i64 >= page.limit;
            for record in records {
                let seq = record.seq;
                send(
                    self.lines,
                    &StreamLine::Record(Box::new(record)),
                    self.write_timeout,
                )
                .await?;
                self.filter.after_seq = seq;
                *last_sent = tokio::time::Instant::now();
            }
            if !full {
                self.filter.after_seq = self.filter.after_seq.max(head);
                return Ok(());
            }
        }
    }
}

/// Queue `line` for the client, waiting at most `write_timeout` for room:
/// a client that takes nothing for that long is cut off.
async fn send(lines: &mpsc::Sender<Bytes>, line: &StreamLine, write_timeout: Duration) -> Result<(), Stop> {
    match tokio::time::timeout(write_timeout, lines.send(Bytes::from(line.to_line()))).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(Stop::Gone),
        Err(_) => {
            tracing::info!("an audit stream ended: its client took no line for the write timeout");
            Err(Stop::Gone)
        }
    }
}
