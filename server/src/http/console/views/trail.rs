//! `GET /ui`: the trail, newest first, filtered, with a cursor that stays
//! put while records arrive.

use axum::extract::Query;
use axum::response::Response;
use maud::{Markup, html};
use serde_json::json;

use super::common::{Filters, Look, PAGE, records_table};
use crate::audit::{event, outcome};
use crate::http::console::page;
use talos_sso_api::audit::record_kind;

fn filter_form(filters: &Filters) -> Markup {
    let text_input = |name: &str, label: &str, value: &str, hint: &str| {
        html! { label { (label) input type="text" name=(name) value=(value) placeholder=(hint); } }
    };
    let select = |name: &str, label: &str, value: &str, options: &[&str]| {
        html! {
            label { (label)
                select name=(name) {
                    option value="" { "any" }
                    @for o in options { option value=(o) selected[*o == value] { (o) } }
                }
            }
        }
    };
    html! {
        form.filters method="get" action="/ui" {
            (text_input("since", "From", &filters.since, "7d or 2026-11-24T00:00:00Z"))
            (text_input("until", "Until", &filters.until, "RFC 3339 or duration"))
            (text_input("username", "User", &filters.username, "alice@example.com"))
            (text_input("subject", "Subject", &filters.subject, "object id"))
            (text_input("cluster", "Cluster", &filters.cluster, "prod"))
            (text_input("role", "Role (requested or granted)", &filters.role, "os:admin"))
            (select("outcome", "Outcome", &filters.outcome, &outcome::ALL))
            (select("event", "Event", &filters.event, &event::ALL))
            (text_input("serial", "Serial", &filters.serial, "hex"))
            (text_input("client_ip", "Client address", &filters.client_ip, "203.0.113.7"))
            (text_input("method", "API method (api.call)", &filters.method, "/machine.MachineService/Reboot or …/Etcd*"))
            (text_input("node", "Node (api.call)", &filters.node, "10.5.0.2"))
            (select("kind", "Kind (workload or person)", &filters.kind, &record_kind::ALL))
            button type="submit" { "Filter" }
            a href="/ui" { "Clear" }
        }
    }
}

/// `GET /ui`: the trail, newest first.
pub async fn trail(look: Look, Query(filters): Query<Filters>) -> Response {
    let app = &look.app;
    let (filter, before) = match filters.parse(app.clock.now(), PAGE) {
        Ok(parsed) => parsed,
        Err(why) => return look.invalid("Audit trail", &why),
    };
    let details = json!({"action": "list", "view": "trail", "filter": filters.query()});
    if let Err(page) = look.record("trail", details).await {
        return page;
    }
    let records = match app.audit.store().query_newest_first(&filter, before).await {
        Ok(records) => records,
        Err(_) => return page::unavailable(),
    };
    let query = filters.to_query();
    let older = (records.len() as i64 >= PAGE)
        .then(|| records.last().map(|r| r.seq))
        .flatten();
    let body = html! {
        (filter_form(&filters))
        p.muted {
            (records.len()) (if records.len() == 1 { " record" } else { " records" })
            @if let Some(b) = before { ", before record " (b) }
            ". "
            a href={ "/ui/export?format=csv&" (query) } { "Export CSV" } " · "
            a href={ "/ui/export?format=jsonl&" (query) } { "Export JSON lines" }
        }
        (records_table(&records))
        div.pager {
            @if before.is_some() { a href={ "/ui?" (query) } { "Newest" } }
            @if let Some(seq) = older { a href={ "/ui?" (query) "&before=" (seq) } { "Older" } }
        }
    };
    look.show("Audit trail", body)
}
