//! `GET /ui/records/{seq}`: one record, every field, and its place in the
//! chain (its hash recomputed, its link to the previous record, the
//! signed checkpoint that covers it).

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use maud::html;
use serde_json::json;

use super::common::Look;
use super::workload::Workload;
use crate::audit::format_micros;
use crate::http::console::page;

/// `GET /ui/records/{seq}`: every field, and its place in the chain.
pub async fn record(look: Look, Path(seq): Path<String>) -> Response {
    let app = &look.app;
    let Some(seq) = seq.parse::<i64>().ok().filter(|s| *s > 0) else {
        return look.invalid("Record", "a record is named by its number");
    };
    let details = json!({"action": "list", "view": "record", "seq": seq});
    if let Err(page) = look.record("record", details).await {
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
            &look.viewer,
            look.broken.as_ref(),
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
        @if let Some(workload) = Workload::of(r) { (workload.section()) }
        h2 { "Fields" }
        dl.fields {
            @for (name, value) in &fields { dt { (name) } dd.mono { (value) } }
            dt { "Details" } dd { pre.mono { (details) } }
        }
    };
    look.show(&format!("Record {seq}"), body)
}
