//! `GET /ui/held`: who held a role, on a cluster, between two times: the
//! people whose certificates granted it, with those certificates.

use std::collections::BTreeMap;

use axum::extract::Query;
use axum::response::Response;
use maud::html;
use serde::Deserialize;
use serde_json::json;
use talos_sso_api::StoredRecord;

use super::common::{Filters, Look, urlencode, when};
use crate::audit::event;
use crate::http::console::page;
use talos_sso_text as text;

/// Certificates the "who held" answer reads at most.
const HELD_MAX: usize = 20_000;

/// The "who held a role" question.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct HeldQuery {
    pub role: String,
    pub cluster: String,
    pub since: String,
    pub until: String,
}

/// `GET /ui/held`: the people who got a certificate with `role` on
/// `cluster` between two times, with those certificates.
pub async fn held(look: Look, Query(q): Query<HeldQuery>) -> Response {
    let app = &look.app;
    let form = html! {
        form.filters method="get" action="/ui/held" {
            label { "Role" input type="text" name="role" value=(q.role) placeholder="os:admin"; }
            label { "Cluster" input type="text" name="cluster" value=(q.cluster) placeholder="prod"; }
            label { "From" input type="text" name="since" value=(q.since) placeholder="7d or RFC 3339"; }
            label { "Until" input type="text" name="until" value=(q.until) placeholder="now"; }
            button type="submit" { "Who held it" }
        }
    };
    if q.role.trim().is_empty() {
        let body = html! { (form) p.muted { "Name a role (and a cluster and times) to list the people whose certificates granted it." } };
        return look.show("Who held a role", body);
    }
    let filters = Filters {
        role: q.role.clone(),
        cluster: q.cluster.clone(),
        since: q.since.clone(),
        until: q.until.clone(),
        event: event::CERTIFICATE_ISSUED.into(),
        ..Filters::default()
    };
    let (mut filter, _) = match filters.parse(app.clock.now(), talos_sso_api::audit::MAX_PAGE) {
        Ok(parsed) => parsed,
        Err(why) => return look.invalid("Who held a role", &why),
    };
    let details = json!({"action": "list", "view": "held", "filter": filters.query()});
    if let Err(page) = look.record("held", details).await {
        return page;
    }
    let role = text::clean_field(q.role.trim());
    let mut people: BTreeMap<String, (String, Vec<StoredRecord>)> = BTreeMap::new();
    let mut read = 0;
    loop {
        let page_records = match app.audit.store().query(&filter).await {
            Ok(records) => records,
            Err(_) => return page::unavailable(),
        };
        read += page_records.len();
        let full = page_records.len() as i64 >= filter.limit;
        if let Some(last) = page_records.last() {
            filter.after_seq = last.seq;
        }
        for r in page_records {
            // Requested is not held: only what the certificate granted.
            if !r.record.roles_granted.contains(&role) {
                continue;
            }
            let key = r.record.subject.clone().unwrap_or_default();
            let entry = people
                .entry(key)
                .or_insert_with(|| (r.record.username.clone().unwrap_or_default(), Vec::new()));
            entry.1.push(r);
        }
        if !full || read >= HELD_MAX {
            break;
        }
    }
    let body = html! {
        (form)
        @if read >= HELD_MAX { p.notice { "Only the first " (HELD_MAX) " certificates of this window were read; narrow it." } }
        p.muted { (people.len()) (if people.len() == 1 { " person" } else { " people" }) " held " code { (role) } @if !q.cluster.trim().is_empty() { " on " code { (q.cluster.trim()) } } "." }
        table.held {
            thead { tr { th { "Person" } th { "Subject" } th { "Certificates" } } }
            tbody {
                @for (subject, (username, certificates)) in &people {
                    tr {
                        td { a href={ "/ui/person?username=" (urlencode(username)) } { (username) } }
                        td.mono { (subject) }
                        td {
                            table {
                                @for c in certificates {
                                    tr {
                                        td { a href={ "/ui/records/" (c.seq) } { (c.seq) } }
                                        td.mono { (c.record.not_before.map(when).unwrap_or_default()) " → " (c.record.not_after.map(when).unwrap_or_default()) }
                                        td { (c.record.cluster.as_deref().unwrap_or("")) }
                                        td.mono { (c.record.serial.as_deref().unwrap_or("")) }
                                        td.mono { (c.record.client_ip.as_deref().unwrap_or("")) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    look.show("Who held a role", body)
}
