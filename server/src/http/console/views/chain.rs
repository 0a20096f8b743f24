//! `GET /ui/chain`: the chain's status, from the last verification when it
//! is recent, else from one run now; `POST /ui/chain` runs one again.

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::html;
use serde::Deserialize;
use serde_json::json;

use super::common::Look;
use crate::audit::format_micros;
use crate::http::console::{REVERIFY_AFTER, VERIFY_WAIT, Viewer, page, session};

/// `GET /ui/chain`: the chain's status, verified within the last
/// [`REVERIFY_AFTER`] or now.
pub async fn chain(look: Look) -> Response {
    chain_status(&look, false).await
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CsrfForm {
    pub csrf: String,
}

/// `POST /ui/chain`: verify again now (one verification at a time still).
pub async fn verify_again(
    look: Look,
    headers: HeaderMap,
    axum::Form(form): axum::Form<CsrfForm>,
) -> Response {
    if session::forged(
        &look.console.origin,
        &headers,
        &form.csrf,
        &look.viewer.session.csrf,
    ) {
        return page::forged("Chain status", &look.viewer);
    }
    chain_status(&look, true).await
}

/// The chain page: the last verification when younger than
/// [`REVERIFY_AFTER`] (unless asked `again`), else the running one.
async fn chain_status(look: &Look, again: bool) -> Response {
    let (app, viewer) = (&look.app, &look.viewer);
    if let Err(page) = look
        .record("chain", json!({"action": "verify", "view": "chain"}))
        .await
    {
        return page;
    }
    if !again
        && let Some((at, last)) = app.verifications.last()
        && app.clock.now() - at < REVERIFY_AFTER
    {
        return chain_page(viewer, &last, Some(at), None);
    }
    let mut verification = app.verify_chain();
    let finished = tokio::time::timeout(VERIFY_WAIT, verification.answer.wait_for(Option::is_some)).await;
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
