//! What the views share: the request every view of the trail starts from
//! ([`Look`]: the app, the console, the auditor looking, the banner of a
//! failed verification), the trail's filters as the form sends them, and
//! the pieces of page several views draw.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::Response;
use maud::{Markup, html};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use talos_sso_api::audit::{api_call, event};
use talos_sso_api::{AuditQuery, AuditRecord, ChainStatus, StoredRecord};

use super::super::{Auditor, Console, Viewer, page, record_view};
use super::workload::Workload;
use crate::app::App;
use crate::audit::format_micros;
use crate::audit::store::AuditFilter;
use crate::http::audit::filter as audit_filter;
use talos_sso_text as text;

/// An auditor's view of the trail, as every such view begins: extracted
/// before anything else of the request, so that a refusal (sign in,
/// membership, blocked) is answered before any other check.
#[derive(Debug)]
pub struct Look {
    pub app: Arc<App>,
    pub console: Arc<Console>,
    pub viewer: Viewer,
    /// The last verification, when it failed: every page says so.
    pub broken: Option<ChainStatus>,
}

impl FromRequestParts<Arc<App>> for Look {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Response> {
        let Auditor(viewer) = Auditor::from_request_parts(parts, app).await?;
        let console = parts
            .extensions
            .get::<Arc<Console>>()
            .cloned()
            .ok_or_else(page::unavailable)?;
        Ok(Self {
            app: app.clone(),
            console,
            viewer,
            broken: app.verifications.last_status(),
        })
    }
}

impl Look {
    /// Record that this view (`view`, what it shows in `details`: its
    /// filter, as the API's `audit.query` records do) was looked at, once
    /// per session and view; the page to answer instead when it could not be.
    pub async fn record(&self, view: &str, details: Value) -> Result<(), Response> {
        let key = format!("{view} {details}");
        record_view(&self.app, &self.console, &self.viewer, &key, details).await
    }

    /// A page of this view.
    pub fn show(&self, title: &str, body: Markup) -> Response {
        page::show(StatusCode::OK, title, &self.viewer, self.broken.as_ref(), body)
    }

    /// The page refusing what was asked, and why.
    pub fn invalid(&self, title: &str, why: &str) -> Response {
        let body = html! { p.refusal { (why) } p { a href="/ui" { "Back to the trail" } } };
        page::show(
            StatusCode::UNPROCESSABLE_ENTITY,
            title,
            &self.viewer,
            self.broken.as_ref(),
            body,
        )
    }
}

/// Records on one page of the trail.
pub const PAGE: i64 = 50;

/// The trail's filters, as the form sends them (empty means unset).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct Filters {
    pub since: String,
    pub until: String,
    pub username: String,
    pub subject: String,
    pub cluster: String,
    pub role: String,
    pub outcome: String,
    pub event: String,
    pub serial: String,
    pub client_ip: String,
    /// An API call's gRPC method, or a prefix of one ending in `*`.
    pub method: String,
    /// A node an API call named.
    pub node: String,
    /// A workload kind, `workload` or `person`.
    pub kind: String,
    /// Cursor: records before this `seq` (newest first).
    #[serde(skip_serializing)]
    pub before: String,
    /// Exports: `csv` or `jsonl`.
    #[serde(skip_serializing)]
    pub format: String,
}

impl Filters {
    /// As the API's query, each value cleaned as stored records are.
    pub(super) fn query(&self) -> AuditQuery {
        let some = |v: &str| {
            let v = v.trim();
            (!v.is_empty()).then(|| text::clean_field(v))
        };
        AuditQuery {
            since: some(&self.since),
            until: some(&self.until),
            username: some(&self.username),
            subject: some(&self.subject),
            cluster: some(&self.cluster),
            role: some(&self.role),
            outcome: some(&self.outcome),
            event: some(&self.event),
            serial: some(&self.serial),
            client_ip: some(&self.client_ip),
            method: some(&self.method),
            node: some(&self.node),
            kind: some(&self.kind),
            cursor: None,
            limit: None,
        }
    }

    /// The store's filter (checked as the API checks it) and the cursor.
    pub(super) fn parse(
        &self,
        now: time::OffsetDateTime,
        limit: i64,
    ) -> Result<(AuditFilter, Option<i64>), String> {
        let mut filter = audit_filter(&self.query(), now).map_err(|(_, why)| why)?;
        filter.limit = limit;
        let before = match self.before.trim() {
            "" => None,
            text => Some(
                text.parse::<i64>()
                    .ok()
                    .filter(|b| *b > 0)
                    .ok_or("the cursor must be a record number")?,
            ),
        };
        Ok((filter, before))
    }

    /// The filter as a URL query (the cursor left out).
    pub(super) fn to_query(&self) -> String {
        let mut url = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in self.pairs() {
            if !value.trim().is_empty() {
                url.append_pair(name, value);
            }
        }
        url.finish()
    }

    fn pairs(&self) -> [(&'static str, &String); 13] {
        [
            ("since", &self.since),
            ("until", &self.until),
            ("username", &self.username),
            ("subject", &self.subject),
            ("cluster", &self.cluster),
            ("role", &self.role),
            ("outcome", &self.outcome),
            ("event", &self.event),
            ("serial", &self.serial),
            ("client_ip", &self.client_ip),
            ("method", &self.method),
            ("node", &self.node),
            ("kind", &self.kind),
        ]
    }
}

/// A time on a page: seconds are enough; the record page shows the full time.
pub(super) fn when(t: time::OffsetDateTime) -> String {
    let text = format_micros(t);
    format!("{} {}", &text[..10], &text[11..19])
}

pub(super) fn records_table(records: &[StoredRecord]) -> Markup {
    html! {
        table.records {
            thead { tr { th { "#" } th { "Time (UTC)" } th { "Event" } th { "Outcome" } th { "User" } th { "Cluster" } th { "Roles granted / requested" } th { "Serial" } th { "Address" } } }
            tbody {
                @for r in records {
                    @let rec = &r.record;
                    tr {
                        td { a href={ "/ui/records/" (r.seq) } { (r.seq) } }
                        td.mono { (when(rec.occurred_at)) }
                        td {
                            (rec.event)
                            @if rec.event == event::API_CALL { br; (api_call_summary(rec)) }
                            @if let Some(workload) = Workload::of(rec) { br; (workload.summary()) }
                        }
                        td class={ "outcome-" (rec.outcome) } { (rec.outcome) @if let Some(reason) = &rec.reason_code { " (" (reason) ")" } }
                        td {
                            @if let Some(user) = &rec.username {
                                a href={ "/ui/person?username=" (urlencode(user)) } { (user) }
                                @if !rec.identity_verified { " " span.muted { "(unverified)" } }
                            }
                        }
                        td { (rec.cluster.as_deref().unwrap_or("")) }
                        td { (rec.roles_granted.join(" ")) @if !rec.roles_requested.is_empty() { span.muted { " / " (rec.roles_requested.join(" ")) } } }
                        td.mono { (rec.serial.as_deref().unwrap_or("")) }
                        td.mono { (rec.client_ip.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    }
}

/// Most nodes a page lists for one API call (the record has them all).
const NODES_SHOWN: usize = 8;

/// The facts of an `api.call` record a page shows, read from its
/// `details` as whatever JSON they are (only strings and whole numbers
/// are shown; maud escapes them).
pub(super) struct ApiCall<'a> {
    pub method: &'a str,
    /// The nodes shown, and how many more the record names.
    pub nodes: (Vec<&'a str>, usize),
    pub grpc_status: Option<i64>,
    pub grpc_message: Option<&'a str>,
    pub calls: Option<i64>,
    pub rule: Option<&'a str>,
}

impl<'a> ApiCall<'a> {
    pub fn of(record: &'a AuditRecord) -> Self {
        let details = &record.details;
        let text = |key: &str| details.get(key).and_then(Value::as_str);
        let nodes: Vec<&str> = details
            .get(api_call::NODES)
            .and_then(Value::as_array)
            .map(|nodes| nodes.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let more = nodes.len().saturating_sub(NODES_SHOWN);
        Self {
            method: text(api_call::METHOD).unwrap_or(""),
            nodes: (nodes.into_iter().take(NODES_SHOWN).collect(), more),
            grpc_status: details.get(api_call::GRPC_STATUS).and_then(Value::as_i64),
            grpc_message: text(api_call::GRPC_MESSAGE),
            calls: details.get(api_call::CALLS).and_then(Value::as_i64),
            rule: text(api_call::RULE),
        }
    }

    pub fn nodes(&self) -> Markup {
        let (shown, more) = &self.nodes;
        html! {
            @for (i, node) in shown.iter().enumerate() { @if i > 0 { ", " } code { (node) } }
            @if *more > 0 { " … " (more) " more" }
        }
    }

    /// How it ended: the gRPC status (and message), or the rule that
    /// refused it.
    pub fn ending(&self) -> Markup {
        html! {
            @if let Some(status) = self.grpc_status { "gRPC " (status) }
            @if let Some(message) = self.grpc_message { " " span.muted { (message) } }
            @if let Some(rule) = self.rule { @if self.grpc_status.is_some() { " " } "rule " code { (rule) } }
        }
    }
}

/// An API call in one cell: method, nodes, how it ended, how many calls.
fn api_call_summary(record: &AuditRecord) -> Markup {
    let call = ApiCall::of(record);
    html! {
        code.method { (call.method) }
        @if !call.nodes.0.is_empty() { " on " (call.nodes()) }
        " " span.muted { (call.ending()) @if let Some(n) = call.calls.filter(|n| *n > 1) { " ×" (n) } }
    }
}

pub(super) fn urlencode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_query_leaves_out_the_cursor_and_empty_fields() {
        let filters = Filters {
            username: "sam@example.com".into(),
            role: "os:admin".into(),
            before: "42".into(),
            ..Filters::default()
        };
        assert_eq!(filters.to_query(), "username=sam%40example.com&role=os%3Aadmin");
        let now = time::macros::datetime!(2026-12-01 12:00 UTC);
        let (filter, before) = filters.parse(now, PAGE).unwrap();
        assert_eq!(before, Some(42));
        assert_eq!(filter.role.as_deref(), Some("os:admin"));
        assert_eq!(filter.limit, PAGE);
        let bad = Filters {
            before: "x".into(),
            ..Filters::default()
        };
        assert!(bad.parse(now, PAGE).is_err());
        let bad = Filters {
            event: "nonsense".into(),
            ..Filters::default()
        };
        assert!(bad.parse(now, PAGE).unwrap_err().contains("one of"));
    }
}
