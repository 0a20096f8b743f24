//! `GET /ui/export?format=csv|jsonl&...`: the current filter's records,
//! newest first, at most [`EXPORT_MAX`], streamed page by page.
//!
//! An export of a large trail is over a hundred megabytes: built whole, a
//! client that never reads would keep it in memory. So the body reads one
//! page of [`EXPORT_PAGE`] records from the store only when the connection
//! has taken the last one; the export must reach its client within
//! `console.export_timeout` (past it the serve loop closes the connection);
//! and at most `console.max_exports` run at once on a replica,
//! `console.max_exports_per_person` for one person.
//!
//! Every export is recorded before its first byte (`audit.query`, `action:
//! export`, the filter), not once per session as other views are: each one
//! takes data away. One that does not reach its end (cut off at its
//! deadline, its connection closed, the trail unreadable) gets a second
//! record with the same request id saying how it ended and how many
//! records it had handed to the connection.
//!
//! CSV goes through the shared writer (`talos_sso_text::csv`, as the
//! CLI's `--output csv`): quoted as RFC 4180 needs, no cell a formula.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Query;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use talos_sso_api::StoredRecord;
use tokio::time::Instant;

use super::common::{Filters, Look};
use crate::app::App;
use crate::audit::format_micros;
use crate::audit::store::{Append, AuditFilter, StoreError};
use crate::audit::{AuditRecord, event, outcome};
use crate::http::console::{Viewer, record_now, refuse_rate};
use crate::http::deadline::SendDeadline;
use crate::slots::{Full, Slot};

/// Records one export holds at most (newest first).
pub const EXPORT_MAX: usize = 100_000;

/// Records read from the store for one chunk of an export: about 300 KB of
/// JSON lines, the most one export holds in memory at a time.
pub const EXPORT_PAGE: i64 = 250;

/// How long a person refused for too many exports is told to wait.
const RETRY_EXPORT: Duration = Duration::from_secs(30);

/// How an export that did not reach its end ended.
pub mod ended {
    /// Not taken by the client within `console.export_timeout`.
    pub const DEADLINE: &str = "deadline";
    /// The connection closed first (the client went away, or the server
    /// stopped).
    pub const CLOSED: &str = "closed";
    /// The trail could not be read.
    pub const AUDIT_UNAVAILABLE: &str = "audit_unavailable";
}

/// `GET /ui/export`.
pub async fn export(look: Look, Query(filters): Query<Filters>) -> Response {
    let (app, viewer) = (&look.app, &look.viewer);
    let csv = match filters.format.as_str() {
        "csv" => true,
        "jsonl" => false,
        _ => return look.invalid("Export", "`format` must be csv or jsonl"),
    };
    let (filter, before) = match filters.parse(app.clock.now(), EXPORT_PAGE) {
        Ok(parsed) => parsed,
        Err(why) => return look.invalid("Export", &why),
    };
    let slot = match look
        .console
        .exports
        .take(&viewer.session.identity.qualified_subject())
    {
        Ok(slot) => slot,
        Err(full) => return refuse_full(app, viewer, full).await,
    };
    let timeout = look.console.export_timeout;
    let details = json!({
        "action": "export", "view": "export", "format": filters.format, "filter": filters.query(),
        "timeout_seconds": timeout.as_secs(),
    });
    let started = match record_now(app, viewer, details).await {
        Ok(stored) => stored,
        Err(page) => return page,
    };
    let deadline = Instant::now() + timeout;
    let mut end_record = started.record.clone();
    end_record.details =
        json!({"action": "export", "view": "export", "via": "console", "export_record": started.seq});
    let body = ExportBody {
        app: app.clone(),
        filter,
        before,
        csv_header: csv,
        csv,
        handed: 0,
        reading: None,
        progress: Progress::Running,
        unfinished: Some(Unfinished {
            record: end_record,
            deadline,
        }),
        _slot: slot,
    };
    let (kind, name) = if csv {
        ("text/csv; charset=utf-8", "audit.csv")
    } else {
        ("application/x-ndjson", "audit.jsonl")
    };
    let mut response = (
        [
            (header::CONTENT_TYPE, kind.to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        Body::new(body),
    )
        .into_response();
    response.extensions_mut().insert(SendDeadline::at(deadline));
    response
}

/// The refusal of an export over a cap, recorded as a rate-limit refusal.
async fn refuse_full(app: &App, viewer: &Viewer, full: Full) -> Response {
    let who = match full {
        Full::Identity => "you: your exports already running on this server are your most",
        Full::Total | Full::Closed => "every person: this server runs its most exports at once",
    };
    let details = json!({"via": "console", "view": "export", "action": "export"});
    let record = viewer.record(app, event::AUDIT_QUERY, details);
    refuse_rate(app, record, RETRY_EXPORT, who).await
}

/// What is recorded when an export does not reach its end.
struct Unfinished {
    /// The second record (the first one's request id, caller and identity).
    record: AuditRecord,
    deadline: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    Running,
    /// Every record was handed over: the next poll ends the body.
    LastPage,
    /// The trail could not be read: the body ends in an error, which
    /// leaves the answer visibly incomplete (no last chunk).
    Failed,
}

type PageRead = Pin<Box<dyn Future<Output = Result<Vec<StoredRecord>, StoreError>> + Send>>;

/// The body of an export: one page read at a time, when the connection
/// asks for more.
struct ExportBody {
    app: Arc<App>,
    filter: AuditFilter,
    /// Cursor: the next page holds records before this `seq`.
    before: Option<i64>,
    /// The CSV header is still to be sent.
    csv_header: bool,
    csv: bool,
    /// Records handed to the connection so far.
    handed: usize,
    reading: Option<PageRead>,
    progress: Progress,
    /// `None` once the export reached its end.
    unfinished: Option<Unfinished>,
    /// Counted among the exports until the body is dropped.
    _slot: Slot,
}

/// An export ended by the trail being unreadable.
#[derive(Debug, thiserror::Error)]
#[error("the audit trail could not be read; the export is incomplete")]
struct ExportInterrupted;

/// A column of the CSV export: its heading (the name of the record's
/// field) and its value in a record, side by side so that neither can
/// drift from the other.
type Column = (&'static str, fn(&StoredRecord) -> String);

/// An optional value as a cell: empty when absent.
fn opt(value: &Option<String>) -> String {
    value.clone().unwrap_or_default()
}

/// An optional time as a cell, in its one text form.
fn time(value: Option<time::OffsetDateTime>) -> String {
    value.map(format_micros).unwrap_or_default()
}

/// The CSV export's columns, in order.
const CSV_COLUMNS: [Column; 23] = [
    ("seq", |r| r.seq.to_string()),
    ("occurred_at", |r| format_micros(r.record.occurred_at)),
    ("event", |r| r.record.event.clone()),
    ("outcome", |r| r.record.outcome.clone()),
    ("reason_code", |r| opt(&r.record.reason_code)),
    ("cluster", |r| opt(&r.record.cluster)),
    ("issuer", |r| opt(&r.record.issuer)),
    ("subject", |r| opt(&r.record.subject)),
    ("username", |r| opt(&r.record.username)),
    ("identity_verified", |r| r.record.identity_verified.to_string()),
    ("roles_requested", |r| r.record.roles_requested.join(" ")),
    ("roles_granted", |r| r.record.roles_granted.join(" ")),
    ("serial", |r| opt(&r.record.serial)),
    ("certificate_sha256", |r| opt(&r.record.certificate_sha256)),
    ("not_before", |r| time(r.record.not_before)),
    ("not_after", |r| time(r.record.not_after)),
    ("client_ip", |r| opt(&r.record.client_ip)),
    ("user_agent", |r| opt(&r.record.user_agent)),
    ("client_version", |r| opt(&r.record.client_version)),
    ("request_id", |r| r.record.request_id.clone()),
    ("details", |r| r.record.details.to_string()),
    ("prev_hash", |r| r.prev_hash.clone()),
    ("hash", |r| r.hash.clone()),
];

/// `records` as CSV rows.
fn csv_chunk(records: &[StoredRecord]) -> Result<Vec<u8>, talos_sso_text::csv::Error> {
    let mut rows = talos_sso_text::csv::Rows::new();
    for r in records {
        rows.push(CSV_COLUMNS.iter().map(|(_, value)| value(r)))?;
    }
    rows.into_bytes()
}

/// The CSV export's first line.
fn csv_header() -> Result<Vec<u8>, talos_sso_text::csv::Error> {
    let mut rows = talos_sso_text::csv::Rows::new();
    rows.push(CSV_COLUMNS.map(|(heading, _)| heading))?;
    rows.into_bytes()
}

impl ExportBody {
    fn chunk(&self, records: &[StoredRecord]) -> Result<Bytes, ExportInterrupted> {
        if self.csv {
            // Written to memory, which does not fail.
            return csv_chunk(records).map(Bytes::from).map_err(|_| ExportInterrupted);
        }
        let mut out = String::with_capacity(records.len() * 1300);
        for r in records {
            out.push_str(&r.to_line());
            out.push('\n');
        }
        Ok(Bytes::from(out))
    }
}

impl hyper::body::Body for ExportBody {
    type Data = Bytes;
    type Error = ExportInterrupted;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.csv_header {
            this.csv_header = false;
            let header = csv_header().map(|h| hyper::body::Frame::data(Bytes::from(h)));
            return Poll::Ready(Some(header.map_err(|_| ExportInterrupted)));
        }
        match this.progress {
            Progress::Running => {}
            Progress::LastPage => {
                this.unfinished = None;
                return Poll::Ready(None);
            }
            Progress::Failed => return Poll::Ready(None),
        }
        let limit = EXPORT_PAGE.min(i64::try_from(EXPORT_MAX - this.handed).unwrap_or(EXPORT_PAGE));
        if limit <= 0 {
            this.unfinished = None;
            return Poll::Ready(None);
        }
        let reading = this.reading.get_or_insert_with(|| {
            let app = this.app.clone();
            let filter = AuditFilter {
                limit,
                ..this.filter.clone()
            };
            let before = this.before;
            Box::pin(async move { app.audit.store().query_newest_first(&filter, before).await })
        });
        let records = match reading.as_mut().poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(read) => read,
        };
        this.reading = None;
        let records = match records {
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(%error, "an export could not read the trail; ending it");
                this.progress = Progress::Failed;
                return Poll::Ready(Some(Err(ExportInterrupted)));
            }
        };
        if (records.len() as i64) < limit {
            this.progress = Progress::LastPage;
        }
        this.before = records.last().map(|r| r.seq);
        this.handed += records.len();
        if records.is_empty() {
            this.unfinished = None;
            return Poll::Ready(None);
        }
        Poll::Ready(Some(this.chunk(&records).map(hyper::body::Frame::data)))
    }
}

impl Drop for ExportBody {
    fn drop(&mut self) {
        let Some(unfinished) = self.unfinished.take() else {
            return;
        };
        let how = if self.progress == Progress::Failed {
            ended::AUDIT_UNAVAILABLE
        } else if Instant::now() >= unfinished.deadline {
            ended::DEADLINE
        } else {
            ended::CLOSED
        };
        let mut record = unfinished.record;
        record.occurred_at = self.app.clock.now();
        record.outcome = outcome::SUCCESS.into();
        if let serde_json::Value::Object(details) = &mut record.details {
            details.insert("ended".into(), how.into());
            details.insert("records_handed".into(), self.handed.into());
        }
        let app = self.app.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                ended = how,
                "an export ended early and could not be recorded: no runtime"
            );
            return;
        };
        tracing::info!(
            ended = how,
            records = self.handed,
            "an export ended before its last record"
        );
        runtime.spawn(async move {
            let append = Append {
                record,
                claim: None,
                deny_check: false,
                deny_change: None,
            };
            if let Err(error) = app.audit.append(append).await {
                tracing::error!(%error, "the early end of an export could not be recorded");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_csv_header_names_every_column_and_cells_are_never_formulas() {
        let header = String::from_utf8(csv_header().unwrap()).unwrap();
        assert_eq!(
            header,
            "seq,occurred_at,event,outcome,reason_code,cluster,issuer,subject,username,identity_verified,\
             roles_requested,roles_granted,serial,certificate_sha256,not_before,not_after,client_ip,user_agent,\
             client_version,request_id,details,prev_hash,hash\n"
        );
        let mut stored = StoredRecord {
            seq: 3,
            record: AuditRecord::default(),
            prev_hash: "0".repeat(64),
            hash: "f".repeat(64),
        };
        stored.record.username = Some("=HYPERLINK(\"x\")".into());
        stored.record.cluster = Some("a,b".into());
        let line = String::from_utf8(csv_chunk(&[stored]).unwrap()).unwrap();
        assert!(line.contains(",\"a,b\","), "{line}");
        assert!(line.contains(",\"'=HYPERLINK(\"\"x\"\")\","), "{line}");
        assert!(line.ends_with('\n') && line.lines().count() == 1, "{line}");
    }
}
