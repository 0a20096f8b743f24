//! The console's views: the trail (newest first, filtered, a cursor that
//! stays put while records arrive), one record with its place in the
//! chain, who held a role, one person, the chain status, charts, exports
//! and, for admins, the deny list. Each reads through the audit store as
//! the API does, after [`super::viewer`] and [`super::record_view`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use maud::{Markup, html};
use serde::{Deserialize, Serialize};
use serde_json::json;
use talos_sso_api::{AuditQuery, DenyRequest, StoredRecord};

use super::{Admin, Auditor, Console, Viewer, page, record_view};
use crate::app::App;
use crate::audit::store::{AuditFilter, AuditStore};
use crate::audit::{event, format_micros, outcome, text};
use crate::http::audit::filter as audit_filter;
use crate::http::caller::Caller;
use crate::http::deny;

/// Records on one page of the trail.
pub const PAGE: i64 = 50;
/// Certificates the "who held" answer reads at most.
const HELD_MAX: usize = 20_000;

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
    fn to_query(&self) -> String {
        let mut url = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in self.pairs() {
            if !value.trim().is_empty() {
                url.append_pair(name, value);
            }
        }
        url.finish()
    }

    fn pairs(&self) -> [(&'static str, &String); 10] {
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
        ]
    }
}

/// What a view records (its filter, as the API's `audit.query` records do),
/// and the key that makes it once per session.
fn view_key(view: &str, details: &serde_json::Value) -> String {
    format!("{view} {details}")
}

fn when(t: time::OffsetDateTime) -> String {
    let text = format_micros(t);
    // Seconds are enough on a page; the record page shows the full time.
    format!("{} {}", &text[..10], &text[11..19])
}

pub(super) fn invalid(
    viewer: &Viewer,
    broken: Option<&talos_sso_api::ChainStatus>,
    title: &str,
    why: &str,
) -> Response {
    page::show(
        StatusCode::UNPROCESSABLE_ENTITY,
        title,
        viewer,
        broken,
        html! { p.refusal { (why) } p { a href="/ui" { "Back to the trail" } } },
    )
}

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
            button type="submit" { "Filter" }
            a href="/ui" { "Clear" }
        }
    }
}

fn records_table(records: &[StoredRecord]) -> Markup {
    html! {
        table.records {
            thead { tr { th { "#" } th { "Time (UTC)" } th { "Event" } th { "Outcome" } th { "User" } th { "Cluster" } th { "Roles granted / requested" } th { "Serial" } th { "Address" } } }
            tbody {
                @for r in records {
                    @let rec = &r.record;
                    tr {
                        td { a href={ "/ui/records/" (r.seq) } { (r.seq) } }
                        td.mono { (when(rec.occurred_at)) }
                        td { (rec.event) }
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

fn urlencode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// `GET /ui`: the trail, newest first.
pub async fn trail(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    Auditor(viewer): Auditor,
    Query(filters): Query<Filters>,
) -> Response {
    let broken = app.verifications.last_status();
    let (filter, before) = match filters.parse(app.clock.now(), PAGE) {
        Ok(parsed) => parsed,
        Err(why) => return invalid(&viewer, broken.as_ref(), "Audit trail", &why),
    };
    let details = json!({"action": "list", "view": "trail", "filter": filters.query()});
    if let Err(page) = record_view(&app, &console, &viewer, &view_key("trail", &details), details).await {
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
    page::show(StatusCode::OK, "Audit trail", &viewer, broken.as_ref(), body)
}

/// `GET /ui/records/{seq}`: every field, and its place in the chain.
pub async fn record(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    Auditor(viewer): Auditor,
    Path(seq): Path<String>,
) -> Response {
    let broken = app.verifications.last_status();
    let Some(seq) = seq.parse::<i64>().ok().filter(|s| *s > 0) else {
        return invalid(
            &viewer,
            broken.as_ref(),
            "Record",
            "a record is named by its number",
        );
    };
    let details = json!({"action": "list", "view": "record", "seq": seq});
    if let Err(page) = record_view(&app, &console, &viewer, &view_key("record", &details), details).await {
        return page;
    }
    let store = app.audit.store();
    let (found, head, previous) =
        match tokio::try_join!(store.page(seq - 1, 1), store.head(), store.hash_at(seq - 1)) {
            Ok(read) => read,
            Err(_) => return page::unavailable(),
        };
    let Some(stored) = found.into_iter().find(|r| r.seq == seq) else {
        return page::show(
            StatusCode::NOT_FOUND,
            "Record",
            &viewer,
            broken.as_ref(),
            html! { p.refusal { "There is no record " (seq) " (the trail ends at " (head.0) ")." } },
        );
    };
    let checkpoint = match &app.checkpoints {
        Some(checkpoints) => checkpoints.last().await,
        None => None,
    };
    let recomputed = talos_sso_api::chain::record_hash(stored.seq, &stored.record, &stored.prev_hash);
    let hash_holds = recomputed == stored.hash;
    let expected_prev = if seq == 1 {
        Some(talos_sso_api::chain::GENESIS_HASH.to_owned())
    } else {
        previous
    };
    let links = expected_prev.as_deref() == Some(stored.prev_hash.as_str());
    let r = &stored.record;
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let time = |t: Option<time::OffsetDateTime>| t.map(format_micros).unwrap_or_default();
    let fields: Vec<(&str, String)> = vec![
        ("Time", format_micros(r.occurred_at)),
        ("Event", r.event.clone()),
        ("Outcome", r.outcome.clone()),
        ("Reason", opt(&r.reason_code)),
        ("Request id", r.request_id.clone()),
        ("Cluster", opt(&r.cluster)),
        ("Issuer", opt(&r.issuer)),
        ("Tenant", opt(&r.tenant)),
        ("Subject", opt(&r.subject)),
        ("Username", opt(&r.username)),
        ("Identity verified", r.identity_verified.to_string()),
        ("Groups evaluated", r.groups_evaluated.join(", ")),
        ("Roles requested", r.roles_requested.join(", ")),
        ("Roles granted", r.roles_granted.join(", ")),
        ("Serial", opt(&r.serial)),
        ("Certificate fingerprint (SHA-256)", opt(&r.certificate_sha256)),
        ("Public key (SHA-256)", opt(&r.public_key_sha256)),
        ("Not before", time(r.not_before)),
        ("Not after", time(r.not_after)),
        ("Client address", opt(&r.client_ip)),
        ("User agent", opt(&r.user_agent)),
        ("Client version", opt(&r.client_version)),
        ("Token id", opt(&r.token_id)),
        ("Token issued at", time(r.token_issued_at)),
    ];
    let details = serde_json::to_string_pretty(&r.details).unwrap_or_default();
    let body = html! {
        h2 { "Place in the chain" }
        dl.fields.chain {
            dt { "Record" } dd.position { "record " (seq) " of " (head.0) }
            dt { "Hash" } dd.mono.hash { (stored.hash) }
            dt { "Previous hash" } dd.mono { (stored.prev_hash) }
            dt { "Hash recomputed" } dd {
                @if hash_holds { span.outcome-success { "matches: this record is as it was written" } }
                @else { span.outcome-denied { "DIFFERS: this record was changed after it was written (recomputed " (recomputed) ")" } }
            }
            dt { "Link to record " (seq - 1) } dd {
                @if links { span.outcome-success { "the previous record's hash is this record's previous hash" } }
                @else { span.outcome-denied { "BROKEN: the previous record's hash is not this record's previous hash" } }
            }
            dt { "Signed checkpoint" } dd {
                @match &checkpoint {
                    Some(c) if c.seq >= seq => { "covered by the checkpoint at record " (c.seq) ", signed " (format_micros(c.signed_at)) " by " (c.server) }
                    Some(c) => { "after the last checkpoint (record " (c.seq) "): vouched for by the chain alone until the next" }
                    None => { "no checkpoint signed (or checkpoints are not configured)" }
                }
            }
        }
        div.pager {
            @if seq > 1 { a href={ "/ui/records/" (seq - 1) } { "Previous record" } }
            @if seq < head.0 { a href={ "/ui/records/" (seq + 1) } { "Next record" } }
        }
        h2 { "Fields" }
        dl.fields {
            @for (name, value) in &fields { dt { (name) } dd.mono { (value) } }
            dt { "Details" } dd { pre.mono { (details) } }
        }
    };
    page::show(
        StatusCode::OK,
        &format!("Record {seq}"),
        &viewer,
        broken.as_ref(),
        body,
    )
}

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
pub async fn held(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    Auditor(viewer): Auditor,
    Query(q): Query<HeldQuery>,
) -> Response {
    let broken = app.verifications.last_status();
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
        return page::show(StatusCode::OK, "Who held a role", &viewer, broken.as_ref(), body);
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
        Err(why) => return invalid(&viewer, broken.as_ref(), "Who held a role", &why),
    };
    let details = json!({"action": "list", "view": "held", "filter": filters.query()});
    if let Err(page) = record_view(&app, &console, &viewer, &view_key("held", &details), details).await {
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
    page::show(StatusCode::OK, "Who held a role", &viewer, broken.as_ref(), body)
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PersonQuery {
    pub username: String,
}

/// `GET /ui/person?username=...`: a person's certificates, addresses,
/// client versions and denials (their newest records).
pub async fn person(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    Auditor(viewer): Auditor,
    Query(q): Query<PersonQuery>,
) -> Response {
    let broken = app.verifications.last_status();
    let username = text::clean_field(q.username.trim());
    if username.is_empty() {
        return invalid(&viewer, broken.as_ref(), "Person", "name a person (`username`)");
    }
    let details = json!({"action": "list", "view": "person", "filter": {"username": username}});
    if let Err(page) = record_view(&app, &console, &viewer, &view_key("person", &details), details).await {
        return page;
    }
    let filter = AuditFilter {
        username: Some(username.clone()),
        limit: talos_sso_api::audit::MAX_PAGE,
        ..AuditFilter::default()
    };
    let records = match app.audit.store().query_newest_first(&filter, None).await {
        Ok(records) => records,
        Err(_) => return page::unavailable(),
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
    };
    page::show(
        StatusCode::OK,
        &format!("Person: {username}"),
        &viewer,
        broken.as_ref(),
        body,
    )
}

/// `GET /ui/chain`: the chain's status, verified within the last
/// [`super::REVERIFY_AFTER`] or now.
pub async fn chain(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    Auditor(viewer): Auditor,
) -> Response {
    chain_status(&app, &console, &viewer, false).await
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CsrfForm {
    pub csrf: String,
}

/// `POST /ui/chain`: verify again now (one verification at a time still).
pub async fn verify_again(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    Auditor(viewer): Auditor,
    headers: HeaderMap,
    axum::Form(form): axum::Form<CsrfForm>,
) -> Response {
    if forged(&console, &headers, &form.csrf, &viewer.session.csrf) {
        let body = html! { p.refusal { "This form did not come from this console page (CSRF); reload it and try again." } };
        return page::show(StatusCode::FORBIDDEN, "Chain status", &viewer, None, body);
    }
    chain_status(&app, &console, &viewer, true).await
}

/// The chain page: the last verification when younger than
/// [`super::REVERIFY_AFTER`] (unless asked `again`), else the running one.
async fn chain_status(app: &Arc<App>, console: &Arc<Console>, viewer: &Viewer, again: bool) -> Response {
    let details = json!({"action": "verify", "view": "chain"});
    if let Err(page) = record_view(app, console, viewer, &view_key("chain", &details), details).await {
        return page;
    }
    if !again
        && let Some((at, last)) = app.verifications.last()
        && app.clock.now() - at < super::REVERIFY_AFTER
    {
        return chain_page(viewer, &last, Some(at), None);
    }
    let mut verification = app.verify_chain();
    let finished =
        tokio::time::timeout(super::VERIFY_WAIT, verification.answer.wait_for(Option::is_some)).await;
    let status = match finished {
        Ok(Ok(answer)) => match answer.clone().flatten() {
            Some(status) => status,
            None => return page::unavailable(),
        },
        // Still running: the last verification that finished, if any.
        _ => match app.verifications.last() {
            Some((at, last)) => {
                return chain_page(viewer, &last, Some(at), Some(verification.started));
            }
            None => {
                let body = html! {
                    p.notice {
                        "The chain is being verified (started " (format_micros(verification.started)) "); a large trail takes a minute or more. "
                        a href="/ui/chain" { "Reload" } " for the answer."
                    }
                };
                return page::show(StatusCode::OK, "Chain status", viewer, None, body);
            }
        },
    };
    let at = app.verifications.last().map(|(at, _)| at);
    chain_page(viewer, &status, at, None)
}

/// The chain page for `status` (verified at `verified_at`); `running`
/// when a newer verification, started then, has not finished.
fn chain_page(
    viewer: &Viewer,
    status: &talos_sso_api::ChainStatus,
    verified_at: Option<time::OffsetDateTime>,
    running: Option<time::OffsetDateTime>,
) -> Response {
    let body = html! {
        @if let Some(started) = running {
            p.notice { "A verification started " (format_micros(started)) " is still running; this is the last one that finished. " a href="/ui/chain" { "Reload" } }
        }
        @if let Some(at) = verified_at {
            p.muted { "Verified at " span.verified-at { (format_micros(at)) } "." }
        }
        form method="post" action="/ui/chain" {
            input type="hidden" name="csrf" value=(viewer.session.csrf);
            button type="submit" { "Verify again" }
        }
        @if status.intact {
            p.ok { strong { "The chain verifies." } " " (status.verified) " records recomputed, from record 1 to " (status.last_seq) "." }
        } @else {
            p.refusal {
                strong { "VERIFICATION FAILED." } " " (status.verified) " records verified before the first broken link."
                @if let Some(link) = &status.first_broken { " Record " a href={ "/ui/records/" (link.seq) } { (link.seq) } ": " (link.reason) }
            }
        }
        h2 { "Signed checkpoints" }
        @match &status.checkpoints {
            None => { p.muted { "This server signs no checkpoints (`audit.checkpoints` is not configured): the chain alone vouches for the trail." } }
            Some(coverage) => {
                dl.fields {
                    dt { "Checkpoints matched" } dd { (coverage.matched) }
                    dt { "Last signed checkpoint covered" } dd {
                        @match &coverage.last {
                            Some(c) => { "record " a href={ "/ui/records/" (c.seq) } { (c.seq) } ", signed " (format_micros(c.signed_at)) " by " (c.server) " (key " code { (c.key_id.get(..16).unwrap_or(&c.key_id)) } ")" }
                            None => { "none yet" }
                        }
                    }
                    dt { "Records after it" } dd { (coverage.records_after_last) " (vouched for by the chain alone until the next checkpoint)" }
                }
            }
        }
    };
    page::show(StatusCode::OK, "Chain status", viewer, Some(status), body)
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ChartQuery {
    pub since: String,
    /// `hour` or `day` (default).
    pub by: String,
}

/// One bar's worth: `(bucket, series, count)`.
type Counts = Vec<(String, String, i64)>;

/// Issuances per bucket, cluster and granted role; denials per reason;
/// from `since` to before `until`.
async fn chart_counts(
    store: &AuditStore,
    since: time::OffsetDateTime,
    until: time::OffsetDateTime,
    hourly: bool,
) -> Result<(Counts, Counts), sqlx::Error> {
    // Only the chain's rows, as every read of the trail.
    let verified = store.chain_rows();
    match store {
        AuditStore::Postgres(pool) => {
            let (unit, format) = if hourly {
                ("hour", "YYYY-MM-DD HH24:00")
            } else {
                ("day", "YYYY-MM-DD")
            };
            let issued = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT to_char(date_trunc('{unit}', occurred_at AT TIME ZONE 'UTC'), '{format}'), \
                 coalesce(cluster, '-') || ' ' || role, count(*) \
                 FROM audit_events, unnest(roles_granted) AS role \
                 WHERE {verified} AND event = 'certificate.issued' AND occurred_at >= $1 AND occurred_at < $2 GROUP BY 1, 2 ORDER BY 1, 2"
            )))
            .bind(since)
            .bind(until)
            .fetch_all(pool)
            .await?;
            let denied = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT '', coalesce(reason_code, '-'), count(*) FROM audit_events \
                 WHERE {verified} AND outcome = 'denied' AND occurred_at >= $1 AND occurred_at < $2 \
                 GROUP BY 2 ORDER BY 3 DESC"
            )))
            .bind(since)
            .bind(until)
            .fetch_all(pool)
            .await?;
            Ok((issued, denied))
        }
        AuditStore::Sqlite(sqlite) => {
            let pool = sqlite.pool();
            let (length, suffix) = if hourly { (13, ":00") } else { (10, "") };
            let (since, until) = (format_micros(since), format_micros(until));
            let issued = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT replace(substr(occurred_at, 1, {length}), 'T', ' ') || '{suffix}', \
                 coalesce(cluster, '-') || ' ' || r.value, count(*) \
                 FROM audit_events, json_each(audit_events.roles_granted) AS r \
                 WHERE {verified} AND event = 'certificate.issued' AND occurred_at >= $1 AND occurred_at < $2 GROUP BY 1, 2 ORDER BY 1, 2"
            )))
            .bind(&since)
            .bind(&until)
            .fetch_all(pool)
            .await?;
            let denied = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT '', coalesce(reason_code, '-'), count(*) FROM audit_events \
                 WHERE {verified} AND outcome = 'denied' AND occurred_at >= $1 AND occurred_at < $2 \
                 GROUP BY 2 ORDER BY 3 DESC"
            )))
            .bind(&since)
            .bind(&until)
            .fetch_all(pool)
            .await?;
            Ok((issued, denied))
        }
    }
}

/// Chart counts of whole past buckets, kept: the trail is append-only, so
/// an hour or a day that has ended keeps its counts (a record is committed
/// within seconds of its time; a bucket is kept only once it ended a
/// minute ago). The bucket in progress is counted at each view.
#[derive(Debug, Default)]
pub struct ChartCache {
    past: std::sync::Mutex<PastCounts>,
}

/// By (hourly, first bucket, cutoff), in Unix seconds: issued and denied.
type PastCounts = BTreeMap<(bool, i64, i64), (Counts, Counts)>;

/// Past windows kept at most; the cache starts over when full.
const CHART_CACHE: usize = 32;

impl ChartCache {
    /// The counts from the bucket holding `since` up to `now`.
    async fn counts(
        &self,
        store: &AuditStore,
        since: time::OffsetDateTime,
        now: time::OffsetDateTime,
        hourly: bool,
    ) -> Result<(Counts, Counts), sqlx::Error> {
        let floor = |t: time::OffsetDateTime| {
            let t = t.to_offset(time::UtcOffset::UTC);
            let t = t.replace_time(
                time::Time::from_hms(if hourly { t.hour() } else { 0 }, 0, 0).unwrap_or(time::Time::MIDNIGHT),
            );
            t.unix_timestamp()
        };
        let from = floor(since);
        let cutoff = floor(now - time::Duration::minutes(1)).max(from);
        let at = |seconds: i64| time::OffsetDateTime::from_unix_timestamp(seconds).unwrap_or(since);
        let key = (hourly, from, cutoff);
        let cached = self.lock().get(&key).cloned();
        let (mut issued, mut denied) = match cached {
            Some(past) => past,
            None => {
                let past = chart_counts(store, at(from), at(cutoff), hourly).await?;
                let mut kept = self.lock();
                if kept.len() >= CHART_CACHE {
                    kept.clear();
                }
                kept.insert(key, past.clone());
                past
            }
        };
        let far = now + time::Duration::days(1);
        let (live_issued, live_denied) = chart_counts(store, at(cutoff), far, hourly).await?;
        issued.extend(live_issued);
        let mut reasons: BTreeMap<String, i64> = BTreeMap::new();
        for (_, reason, n) in denied.drain(..).chain(live_denied) {
            *reasons.entry(reason).or_default() += n;
        }
        let mut denied: Counts = reasons.into_iter().map(|(r, n)| (String::new(), r, n)).collect();
        denied.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.1.cmp(&b.1)));
        Ok((issued, denied))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PastCounts> {
        self.past.lock().unwrap_or_else(|e| e.into_inner())
    }
}

const PALETTE: [&str; 8] = [
    "#0b5cad", "#1a7f37", "#bf8700", "#8250df", "#cf222e", "#1b7c83", "#6e7781", "#bc4c00",
];

/// The longest window the charts draw per hour, and per day: beyond them
/// a chart is unreadable and its counting costs the server for nothing.
pub const CHART_HOURS_MAX: time::Duration = time::Duration::days(14);
pub const CHART_DAYS_MAX: time::Duration = time::Duration::days(400);

/// The segments of a bucket's bar (its series and counts), stacked up from
/// `base`: series, count, top and height.
fn stack<'a>(segments: &[(&'a str, i64)], base: f64, scale: f64) -> Vec<(&'a str, i64, f64, f64)> {
    let mut top = base;
    segments
        .iter()
        .map(|(s, n)| {
            let h = *n as f64 * scale;
            top -= h;
            (*s, *n, top, h)
        })
        .collect()
}

/// Stacked bars, one per bucket, one colour per series, as inline SVG.
fn bar_chart(counts: &Counts) -> Markup {
    // Grouped once: each bar reads its own segments, not every count.
    let mut by_bucket: BTreeMap<&str, Vec<(&str, i64)>> = BTreeMap::new();
    for (b, s, n) in counts {
        by_bucket.entry(b.as_str()).or_default().push((s.as_str(), *n));
    }
    let buckets: Vec<(&str, &Vec<(&str, i64)>)> = by_bucket.iter().map(|(b, v)| (*b, v)).collect();
    let series: BTreeSet<&str> = counts.iter().map(|(_, s, _)| s.as_str()).collect();
    let colour = |s: &str| PALETTE[series.iter().position(|x| *x == s).unwrap_or(0) % PALETTE.len()];
    let mut totals: BTreeMap<&str, i64> = BTreeMap::new();
    for (b, _, n) in counts {
        *totals.entry(b.as_str()).or_default() += n;
    }
    let max = totals.values().copied().max().unwrap_or(1).max(1) as f64;
    let (width, height, left, bottom) = (960.0_f64, 260.0_f64, 48.0_f64, 40.0_f64);
    let slot = (width - left) / buckets.len().max(1) as f64;
    let bar = (slot * 0.8).max(1.0);
    let scale = (height - bottom - 10.0) / max;
    let label_every = (buckets.len() / 12).max(1);
    html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (width) " " (height) } width=(width) height=(height) role="img" {
            line x1=(left) y1=(height - bottom) x2=(width) y2=(height - bottom) stroke="#57606a" {}
            text x="4" y="14" font-size="11" fill="#57606a" { (max as i64) }
            text x="4" y=(height - bottom) font-size="11" fill="#57606a" { "0" }
            @for (i, (bucket, segments)) in buckets.iter().enumerate() {
                @let x = left + i as f64 * slot + (slot - bar) / 2.0;
                @for (s, n, top, h) in stack(segments, height - bottom, scale) {
                    rect x=(format!("{x:.1}")) y=(format!("{top:.1}")) width=(format!("{bar:.1}")) height=(format!("{h:.1}")) fill=(colour(s)) {
                        title { (bucket) " " (s) ": " (n) }
                    }
                }
                @if i % label_every == 0 {
                    text x=(format!("{x:.1}")) y=(height - bottom + 14.0) font-size="10" fill="#57606a" { (bucket) }
                }
            }
        }
        p.legend {
            @for s in &series {
                svg xmlns="http://www.w3.org/2000/svg" width="10" height="10" { rect width="10" height="10" fill=(colour(s)) {} }
                " " (s) " "
            }
        }
    }
}

/// `GET /ui/charts`: issuances per hour or day by cluster and role, and
/// denials by reason, drawn here as SVG.
pub async fn charts(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    Auditor(viewer): Auditor,
    Query(q): Query<ChartQuery>,
) -> Response {
    let broken = app.verifications.last_status();
    let hourly = q.by == "hour";
    let since_text = if q.since.trim().is_empty() {
        if hourly { "2d" } else { "30d" }.to_owned()
    } else {
        q.since.trim().to_owned()
    };
    let Some(since) = crate::http::audit::parse_when(&since_text, app.clock.now()) else {
        return invalid(
            &viewer,
            broken.as_ref(),
            "Charts",
            "`since` is not an RFC 3339 time or a duration back from now",
        );
    };
    let (longest, per) = if hourly {
        (CHART_HOURS_MAX, "hour")
    } else {
        (CHART_DAYS_MAX, "day")
    };
    if app.clock.now() - since > longest {
        return invalid(
            &viewer,
            broken.as_ref(),
            "Charts",
            &format!(
                "a chart per {per} covers at most {} days: choose a later `since`",
                longest.whole_days()
            ),
        );
    }
    let details = json!({"action": "list", "view": "charts", "filter": {"since": since_text, "by": if hourly { "hour" } else { "day" }}});
    if let Err(page) = record_view(&app, &console, &viewer, &view_key("charts", &details), details).await {
        return page;
    }
    let (issued, denied) = match console
        .charts
        .counts(app.audit.store(), since, app.clock.now(), hourly)
        .await
    {
        Ok(counts) => counts,
        Err(_) => return page::unavailable(),
    };
    let max_denied = denied.iter().map(|(_, _, n)| *n).max().unwrap_or(1).max(1) as f64;
    let body = html! {
        form.filters method="get" action="/ui/charts" {
            label { "From" input type="text" name="since" value=(since_text); }
            label { "Per" select name="by" { option value="day" selected[!hourly] { "day" } option value="hour" selected[hourly] { "hour" } } }
            button type="submit" { "Draw" }
        }
        h2 { "Certificates issued per " (if hourly { "hour" } else { "day" }) ", by cluster and role" }
        div.chart { @if issued.is_empty() { p.muted { "None in this window." } } @else { (bar_chart(&issued)) } }
        h2 { "Denials by reason" }
        div.chart {
            @if denied.is_empty() { p.muted { "None in this window." } }
            @else {
                svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 960 " (denied.len() * 24 + 8) } width="960" height=(denied.len() * 24 + 8) role="img" {
                    @for (i, (_, reason, n)) in denied.iter().enumerate() {
                        @let w = (*n as f64 / max_denied) * 600.0;
                        text x="4" y=(i * 24 + 18) font-size="12" fill="#1b1f24" { (reason) }
                        rect x="220" y=(i * 24 + 6) width=(format!("{:.1}", w.max(1.0))) height="16" fill="#cf222e" { title { (reason) ": " (n) } }
                        text x=(format!("{:.1}", 226.0 + w)) y=(i * 24 + 18) font-size="12" fill="#1b1f24" { (n) }
                    }
                }
            }
        }
    };
    page::show(StatusCode::OK, "Charts", &viewer, broken.as_ref(), body)
}

/// A CSV field: quoted when it must be, and never read as a formula by a
/// spreadsheet (a leading `=`, `+`, `-`, `@` gets a `'`).
fn csv_field(value: &str) -> String {
    let value = if value.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{value}")
    } else {
        value.to_owned()
    };
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value
    }
}

pub(super) const CSV_HEADER: &str = "seq,occurred_at,event,outcome,reason_code,cluster,issuer,subject,username,identity_verified,\
     roles_requested,roles_granted,serial,certificate_sha256,not_before,not_after,client_ip,user_agent,client_version,\
     request_id,details,prev_hash,hash";

pub(super) fn csv_line(r: &StoredRecord) -> String {
    let rec = &r.record;
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let time = |t: Option<time::OffsetDateTime>| t.map(format_micros).unwrap_or_default();
    [
        r.seq.to_string(),
        format_micros(rec.occurred_at),
        rec.event.clone(),
        rec.outcome.clone(),
        opt(&rec.reason_code),
        opt(&rec.cluster),
        opt(&rec.issuer),
        opt(&rec.subject),
        opt(&rec.username),
        rec.identity_verified.to_string(),
        rec.roles_requested.join(" "),
        rec.roles_granted.join(" "),
        opt(&rec.serial),
        opt(&rec.certificate_sha256),
        time(rec.not_before),
        time(rec.not_after),
        opt(&rec.client_ip),
        opt(&rec.user_agent),
        opt(&rec.client_version),
        rec.request_id.clone(),
        rec.details.to_string(),
        r.prev_hash.clone(),
        r.hash.clone(),
    ]
    .iter()
    .map(|f| csv_field(f))
    .collect::<Vec<_>>()
    .join(",")
}

/// `GET /ui/deny` (admins): the list, a form to add, a button per entry to
/// remove.
pub async fn deny_list(State(app): State<Arc<App>>, Admin(viewer): Admin) -> Response {
    deny_page(&app, &viewer, None).await
}

async fn deny_page(app: &App, viewer: &Viewer, message: Option<Result<String, String>>) -> Response {
    let entries = match app.audit.store().deny_list().await {
        Ok(entries) => entries,
        Err(_) => return page::unavailable(),
    };
    let csrf = &viewer.session.csrf;
    let body = html! {
        @match &message {
            Some(Ok(done)) => { p.ok { (done) } }
            Some(Err(why)) => { p.refusal { (why) } }
            None => {}
        }
        p.muted { "An entry blocks a subject from new certificates at once; each change is recorded in the trail." }
        form.filters method="post" action="/ui/deny" {
            input type="hidden" name="csrf" value=(csrf);
            label { "Username" input type="text" name="username" placeholder="dave@example.com"; }
            label { "or subject" input type="text" name="subject" placeholder="object id"; }
            label { "Reason" input type="text" name="reason" required placeholder="laptop stolen, ticket SEC-123"; }
            label { "For" input type="text" name="expires" placeholder="8h, 3d; empty: until removed"; }
            button type="submit" { "Add to the deny list" }
        }
        table.deny {
            thead { tr { th { "Subject" } th { "Username" } th { "Reason" } th { "Added by" } th { "Added (UTC)" } th { "Until (UTC)" } th {} } }
            tbody {
                @for e in &entries {
                    tr {
                        td.mono { (e.subject.as_deref().unwrap_or("")) }
                        td { (e.username.as_deref().unwrap_or("")) }
                        td { (e.reason) }
                        td { (e.added_by) }
                        td.mono { (when(e.added_at)) }
                        td.mono { @match e.expires_at { Some(at) => (when(at)), None => "removed by hand" } }
                        td {
                            form method="post" action="/ui/deny/remove" {
                                input type="hidden" name="csrf" value=(csrf);
                                @if let Some(subject) = &e.subject { input type="hidden" name="subject" value=(subject); }
                                @else if let Some(username) = &e.username { input type="hidden" name="username" value=(username); }
                                button type="submit" { "Remove" }
                            }
                        }
                    }
                }
            }
        }
    };
    let status = match &message {
        Some(Err(_)) => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::OK,
    };
    page::show(
        status,
        "Deny list",
        viewer,
        app.verifications.last_status().as_ref(),
        body,
    )
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct DenyForm {
    pub csrf: String,
    pub subject: String,
    pub username: String,
    pub reason: String,
    /// How long the entry lasts (`8h`, `3d`); empty: until removed.
    pub expires: String,
}

impl DenyForm {
    /// The request the form asks for, the expiry counted from `now`.
    fn request(&self, now: time::OffsetDateTime) -> Result<DenyRequest, crate::http::error::ApiError> {
        let some = |v: &str| (!v.trim().is_empty()).then(|| v.trim().to_owned());
        let expires_at = match some(&self.expires) {
            None => None,
            Some(text) => {
                let lasts = humantime::parse_duration(&text)
                    .ok()
                    .and_then(|d| time::Duration::try_from(d).ok())
                    .ok_or_else(|| {
                        crate::http::error::ApiError::request_invalid(
                            format!(
                                "`{}` is not a duration: write it like `8h` or `3d`",
                                text::clean_field(&text)
                            ),
                            None,
                        )
                    })?;
                now.checked_add(lasts)
            }
        };
        Ok(DenyRequest {
            subject: some(&self.subject),
            username: some(&self.username),
            reason: some(&self.reason),
            expires_at,
        })
    }
}

/// The CSRF token and where the form came from: a POST from anywhere else
/// is refused before anything is done. Browsers say where with
/// `Sec-Fetch-Site`; `Origin` is `null` under `Referrer-Policy:
/// no-referrer`, so only another site's origin there counts against it.
pub(super) fn forged(console: &Console, headers: &HeaderMap, csrf: &str, session_csrf: &str) -> bool {
    let site_ok = headers
        .get("sec-fetch-site")
        .is_none_or(|site| site.as_bytes() == b"same-origin");
    let origin_ok = headers
        .get(header::ORIGIN)
        .is_none_or(|o| o.as_bytes() == b"null" || o.as_bytes() == console.origin.as_bytes());
    !site_ok || !origin_ok || !super::session::same_secret(csrf, session_csrf)
}

/// Whether a deny-list form came from the console (its CSRF token and
/// origin): `None`, or the page saying it did not.
pub(super) fn refused_form(
    console: &Console,
    headers: &HeaderMap,
    viewer: &Viewer,
    csrf: &str,
) -> Option<Response> {
    if forged(console, headers, csrf, &viewer.session.csrf) {
        return Some(page::show(
            StatusCode::FORBIDDEN,
            "Deny list",
            viewer,
            None,
            html! { p.refusal { "This form did not come from this console page (CSRF); reload it and try again." } },
        ));
    }
    None
}

/// The record of an admin's change, authorized (committed with it).
fn admin_record(
    app: &App,
    viewer: &Viewer,
    event: &str,
    details: serde_json::Value,
) -> crate::audit::AuditRecord {
    let mut record = viewer.caller.record(app, event);
    super::with_identity(&mut record, &viewer.session.identity);
    record.outcome = outcome::SUCCESS.into();
    record.details = details;
    record
}

/// What a deny-list form asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Add,
    Remove,
}

/// `POST /ui/deny`: add an entry (recorded, as `POST /v1/deny` records it).
pub async fn deny_add(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    caller: Caller,
    headers: HeaderMap,
    axum::Form(form): axum::Form<DenyForm>,
) -> Response {
    deny_form(&app, &console, caller, &headers, form, Change::Add).await
}

/// `POST /ui/deny/remove`: remove entries (recorded).
pub async fn deny_remove(
    State(app): State<Arc<App>>,
    Extension(console): Extension<Arc<Console>>,
    caller: Caller,
    headers: HeaderMap,
    axum::Form(form): axum::Form<DenyForm>,
) -> Response {
    deny_form(&app, &console, caller, &headers, form, Change::Remove).await
}

/// A deny-list form: an admin's change; anyone else's refusal recorded as
/// the API records it, `deny.added` or `deny.removed` with the target.
async fn deny_form(
    app: &App,
    console: &Console,
    caller: Caller,
    headers: &HeaderMap,
    form: DenyForm,
    change: Change,
) -> Response {
    let request = form.request(app.clock.now());
    let (event, mut details) =
        match change {
            Change::Add => (
                event::DENY_ADDED,
                request
                    .as_ref()
                    .ok()
                    .and_then(|r| deny::addition(r).ok())
                    .map(|a| deny::addition_details(&a)),
            ),
            Change::Remove => (
                event::DENY_REMOVED,
                request.as_ref().ok().and_then(|r| deny::target(r).ok()).map(
                    |(subject, username)| json!({"target_subject": subject, "target_username": username}),
                ),
            ),
        };
    let details = details.get_or_insert_with(|| {
        let some = |v: &str| (!v.trim().is_empty()).then(|| text::clean_field(v.trim()));
        json!({"target_subject": some(&form.subject), "target_username": some(&form.username)})
    });
    details["via"] = "console".into();
    let refusal = super::Refusal::Action {
        event,
        details: details.clone(),
        csrf: &form.csrf,
    };
    match super::viewer(
        app,
        console,
        headers,
        caller,
        super::Need::Admin,
        "/ui/deny",
        refusal,
    )
    .await
    {
        Ok(viewer) => deny_change(app, console, viewer, headers, form, change).await,
        Err(page) => page,
    }
}

async fn deny_change(
    app: &App,
    console: &Console,
    viewer: Viewer,
    headers: &HeaderMap,
    form: DenyForm,
    change: Change,
) -> Response {
    if let Some(page) = refused_form(console, headers, &viewer, &form.csrf) {
        return page;
    }
    let by = text::clean_field(&viewer.session.identity.username);
    let message = match change {
        Change::Add => match form
            .request(app.clock.now())
            .and_then(|request| deny::addition(&request))
        {
            Err(error) => Err(error.detail),
            Ok(addition) => {
                let mut details = deny::addition_details(&addition);
                details["via"] = "console".into();
                let record = admin_record(app, &viewer, event::DENY_ADDED, details);
                deny::add_entry(app, &viewer.session.identity, record, addition)
                    .await
                    .map(|added| {
                        tracing::warn!(request_id = %viewer.caller.request_id, by = %by, "deny list entry added");
                        let who = added.entry.username.or(added.entry.subject).unwrap_or_default();
                        format!("Added: {who} is blocked (audit record {}).", added.audit_id)
                    })
                    .map_err(|error| error.detail)
            }
        },
        Change::Remove => match form
            .request(app.clock.now())
            .and_then(|request| deny::target(&request))
        {
            Err(error) => Err(error.detail),
            Ok((subject, username)) => {
                let details =
                    json!({"target_subject": subject, "target_username": username, "via": "console"});
                let record = admin_record(app, &viewer, event::DENY_REMOVED, details);
                deny::remove_entries(app, record, subject, username)
                    .await
                    .map(|removed| {
                        tracing::warn!(request_id = %viewer.caller.request_id, by = %by, "deny list entry removed");
                        format!("Removed {} entries (audit record {}).", removed.removed, removed.audit_id)
                    })
                    .map_err(|error| error.detail)
            }
        },
    };
    deny_page(app, &viewer, Some(message)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_and_never_formulas() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(csv_field("-1"), "'-1");
        assert_eq!(csv_field("line\nbreak"), "\"line\nbreak\"");
    }

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
