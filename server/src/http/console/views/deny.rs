//! `GET /ui/deny` (admins): the deny list, a form to add an entry, a
//! button per entry to remove it; each change recorded with the trail as
//! `POST /v1/deny` records it, and anyone else's attempt refused and
//! recorded as the API records it.

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;
use serde_json::json;
use talos_sso_api::DenyRequest;

use super::common::when;
use crate::app::App;
use crate::audit::{event, outcome};
use crate::http::caller::Caller;
use crate::http::console::{Admin, Console, Need, Refusal, Viewer, page, session, viewer as console_viewer};
use crate::http::deny;
use talos_sso_text as text;

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

/// Whether a deny-list form came from the console (its CSRF token and
/// origin): `None`, or the page saying it did not.
pub fn refused_form(console: &Console, headers: &HeaderMap, viewer: &Viewer, csrf: &str) -> Option<Response> {
    session::forged(&console.origin, headers, csrf, &viewer.session.csrf)
        .then(|| page::forged("Deny list", viewer))
}

/// The record of an admin's change, authorized (committed with it).
fn admin_record(
    app: &App,
    viewer: &Viewer,
    event: &str,
    details: serde_json::Value,
) -> crate::audit::AuditRecord {
    let mut record = viewer.record(app, event, details);
    record.outcome = outcome::SUCCESS.into();
    record
}

/// What a deny-list form asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Add,
    Remove,
}

/// A deny-list form as posted: the request's caller and headers, and
/// what the form holds.
#[derive(Debug)]
pub struct DenyPost {
    app: Arc<App>,
    console: Arc<Console>,
    caller: Caller,
    headers: HeaderMap,
    form: DenyForm,
}

impl FromRequest<Arc<App>> for DenyPost {
    type Rejection = Response;

    async fn from_request(request: Request, app: &Arc<App>) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let console = parts
            .extensions
            .get::<Arc<Console>>()
            .cloned()
            .ok_or_else(page::unavailable)?;
        let caller = Caller::from_request_parts(&mut parts, app)
            .await
            .map_err(IntoResponse::into_response)?;
        let headers = parts.headers.clone();
        let axum::Form(form) = axum::Form::<DenyForm>::from_request(Request::from_parts(parts, body), app)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self {
            app: app.clone(),
            console,
            caller,
            headers,
            form,
        })
    }
}

/// `POST /ui/deny`: add an entry (recorded, as `POST /v1/deny` records it).
pub async fn deny_add(post: DenyPost) -> Response {
    deny_form(post, Change::Add).await
}

/// `POST /ui/deny/remove`: remove entries (recorded).
pub async fn deny_remove(post: DenyPost) -> Response {
    deny_form(post, Change::Remove).await
}

/// A deny-list form: an admin's change; anyone else's refusal recorded as
/// the API records it, `deny.added` or `deny.removed` with the target.
async fn deny_form(post: DenyPost, change: Change) -> Response {
    let DenyPost {
        app,
        console,
        caller,
        headers,
        form,
    } = post;
    let (app, console, headers) = (app.as_ref(), console.as_ref(), &headers);
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
    let refusal = Refusal::Action {
        event,
        details: details.clone(),
        csrf: &form.csrf,
    };
    match console_viewer(app, console, headers, caller, Need::Admin, "/ui/deny", refusal).await {
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
