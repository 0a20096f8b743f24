//! `GET /ui/person`: one person's certificates, addresses, client versions
//! and denials, from their newest records, and their newest Talos API
//! calls (read apart: a gateway records many more calls than certificates,
//! and they must not push the certificates off the page).

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::Query;
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::json;
use talos_sso_api::StoredRecord;

use super::common::{ApiCall, Look, records_table, urlencode, when};
use crate::audit::store::AuditFilter;
use crate::audit::{event, outcome};
use crate::http::console::page;
use talos_sso_text as text;

/// Most API call records a person's page shows.
pub const API_CALLS: i64 = 50;

/// A person's API calls: one row per record (a call that may change a
/// node has two, `started` and how it ended; read-only calls are counted
/// per certificate, method and minute).
fn api_calls_table(calls: &[StoredRecord]) -> Markup {
    html! {
        table.records.api-calls {
            thead { tr { th { "#" } th { "Time (UTC)" } th { "Method" } th { "Nodes" } th { "Outcome" } th { "Ended" } th { "Calls" } th { "Cluster" } th { "Certificate serial" } th { "Address" } } }
            tbody {
                @for r in calls {
                    @let rec = &r.record;
                    @let call = ApiCall::of(rec);
                    tr {
                        td { a href={ "/ui/records/" (r.seq) } { (r.seq) } }
                        td.mono { (when(rec.occurred_at)) }
                        td { code.method { (call.method) } }
                        td { (call.nodes()) }
                        td class={ "outcome-" (rec.outcome) } { (rec.outcome) @if let Some(reason) = &rec.reason_code { " (" (reason) ")" } }
                        td { (call.ending()) }
                        td { (call.calls.unwrap_or(1)) }
                        td { (rec.cluster.as_deref().unwrap_or("")) }
                        td.mono { (rec.serial.as_deref().unwrap_or("")) }
                        td.mono { (rec.client_ip.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PersonQuery {
    pub username: String,
}

/// `GET /ui/person?username=...`: a person's certificates, addresses,
/// client versions and denials (their newest records).
pub async fn person(look: Look, Query(q): Query<PersonQuery>) -> Response {
    let app = &look.app;
    let username = text::clean_field(q.username.trim());
    if username.is_empty() {
        return look.invalid("Person", "name a person (`username`)");
    }
    let details = json!({"action": "list", "view": "person", "filter": {"username": username}});
    if let Err(page) = look.record("person", details).await {
        return page;
    }
    let filter = AuditFilter {
        username: Some(username.clone()),
        except_event: Some(event::API_CALL.into()),
        limit: talos_sso_api::audit::MAX_PAGE,
        ..AuditFilter::default()
    };
    let calls = AuditFilter {
        username: Some(username.clone()),
        event: Some(event::API_CALL.into()),
        limit: API_CALLS,
        ..AuditFilter::default()
    };
    let store = app.audit.store();
    let (records, calls) = match (
        store.query_newest_first(&filter, None).await,
        store.query_newest_first(&calls, None).await,
    ) {
        (Ok(records), Ok(calls)) => (records, calls),
        _ => return page::unavailable(),
    };
    let certificates: Vec<&StoredRecord> = records
        .iter()
        .filter(|r| r.record.serial.is_some() && r.record.outcome == outcome::SUCCESS)
        .collect();
    let denials: Vec<StoredRecord> = records
        .iter()
        .filter(|r| r.record.outcome == outcome::DENIED)
        .cloned()
        .collect();
    let mut addresses: BTreeMap<String, usize> = BTreeMap::new();
    let mut versions: BTreeMap<String, usize> = BTreeMap::new();
    // Only a verified token says who someone is: a refused request carries
    // whatever subject its unverified token claimed, and anyone can send
    // one under any username.
    let subjects: BTreeSet<String> = records
        .iter()
        .filter(|r| r.record.identity_verified)
        .filter_map(|r| r.record.subject.clone())
        .collect();
    let claimed: BTreeSet<String> = records
        .iter()
        .filter(|r| !r.record.identity_verified)
        .filter_map(|r| r.record.subject.clone())
        .filter(|s| !subjects.contains(s))
        .collect();
    for r in &certificates {
        *addresses
            .entry(r.record.client_ip.clone().unwrap_or_default())
            .or_default() += 1;
        *versions
            .entry(r.record.client_version.clone().unwrap_or_default())
            .or_default() += 1;
    }
    let body = html! {
        @if records.len() as i64 >= talos_sso_api::audit::MAX_PAGE {
            p.notice { "The newest " (records.len()) " records of this person are shown; " a href={ "/ui?username=" (urlencode(&username)) } { "the trail" } " has them all." }
        }
        p { "Subjects: " @for s in &subjects { code { (s) } " " } }
        @if !claimed.is_empty() {
            p.muted { "Claimed by unverified tokens (not checked; anyone can send these): " @for s in &claimed { code { (s) } " " } }
        }
        h2 { "Certificates (" (certificates.len()) ")" }
        table {
            thead { tr { th { "#" } th { "Issued (UTC)" } th { "Cluster" } th { "Roles" } th { "Serial" } th { "Valid until" } th { "Address" } th { "Client" } } }
            tbody {
                @for c in &certificates {
                    tr {
                        td { a href={ "/ui/records/" (c.seq) } { (c.seq) } }
                        td.mono { (when(c.record.occurred_at)) }
                        td { (c.record.cluster.as_deref().unwrap_or("")) }
                        td { (c.record.roles_granted.join(" ")) }
                        td.mono { (c.record.serial.as_deref().unwrap_or("")) }
                        td.mono { (c.record.not_after.map(when).unwrap_or_default()) }
                        td.mono { (c.record.client_ip.as_deref().unwrap_or("")) }
                        td { (c.record.client_version.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        h2 { "From these addresses" }
        ul { @for (a, n) in &addresses { li { code { (if a.is_empty() { "(none)" } else { a }) } " — " (n) } } }
        h2 { "With these client versions" }
        ul { @for (v, n) in &versions { li { (if v.is_empty() { "(not sent)" } else { v }) " — " (n) } } }
        h2 { "Denials (" (denials.len()) ")" }
        (records_table(&denials))
        h2 { "API calls" }
        p.muted {
            @if calls.len() as i64 >= API_CALLS { "The newest " (calls.len()) " records, newest first; " } @else { "Newest first; " }
            a href={ "/ui?event=api.call&username=" (urlencode(&username)) } { "the trail" } " has them all."
        }
        (api_calls_table(&calls))
    };
    look.show(&format!("Person: {username}"), body)
}
