//! The console's layout and the pages that explain instead of showing:
//! sign in, ask for membership, blocked, unavailable, a failed login. Every
//! value goes through maud, which escapes it.

use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::{Viewer, members_of};
use crate::config::GroupList;
use crate::http::error::in_seconds;

pub const STYLESHEET_PATH: &str = "/ui/assets/console.css";
const STYLESHEET: &str = include_str!("console.css");

/// `GET /ui/assets/console.css`.
pub async fn stylesheet() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLESHEET).into_response()
}

/// A whole page: `body` under the navigation (when someone is logged in)
/// and, when the last verification of the chain failed, a warning.
pub fn layout(
    title: &str,
    viewer: Option<&Viewer>,
    broken: Option<&talos_sso_api::ChainStatus>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · talos-sso" }
                link rel="stylesheet" href=(STYLESHEET_PATH);
            }
            body {
                header {
                    a.brand href="/ui" { "talos-sso audit" }
                    @if let Some(viewer) = viewer {
                        nav {
                            @if viewer.auditor {
                                a href="/ui" { "Trail" }
                                a href="/ui/held" { "Who held a role" }
                                a href="/ui/chain" { "Chain" }
                                a href="/ui/charts" { "Charts" }
                            }
                            @if viewer.admin { a href="/ui/deny" { "Deny list" } }
                        }
                        form.logout method="post" action="/ui/logout" {
                            span.who { (viewer.session.identity.username) }
                            input type="hidden" name="csrf" value=(viewer.session.csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                @if let Some(status) = broken.filter(|s| !s.intact) {
                    div.alarm role="alert" {
                        strong { "The audit trail does not verify." }
                        " "
                        @if let Some(link) = &status.first_broken {
                            "First broken link at record " (link.seq) ": " (link.reason)
                        }
                        " " a href="/ui/chain" { "Chain status" }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

fn answer(status: StatusCode, markup: Markup) -> Response {
    (status, Html(markup.into_string())).into_response()
}

/// The page for someone not logged in.
pub fn sign_in(here: &str) -> Response {
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("return", here)
        .finish();
    let href = format!("/ui/login?{query}");
    answer(
        StatusCode::OK,
        layout(
            "Sign in",
            None,
            None,
            html! {
                p { "The audit console is for the security team (auditors) and the platform admins." }
                p { a.button href=(href) { "Sign in with your company account" } }
            },
        ),
    )
}

/// `GET /ui/signed-out`.
pub async fn signed_out() -> Response {
    answer(
        StatusCode::OK,
        layout(
            "Signed out",
            None,
            None,
            html! { p { "You are signed out of the console. " a href="/ui/login" { "Sign in again" } } },
        ),
    )
}

/// Logged in, but not an auditor (or admin): whom to ask.
/// `viewer` is `None` at login, when no session was opened; `tenants` are
/// the login issuer's, which `list`'s app roles are read in.
pub fn membership(
    viewer: Option<&Viewer>,
    username: &str,
    what: &str,
    list: &GroupList,
    tenants: &[String],
) -> Response {
    let members = members_of(list, tenants);
    answer(
        StatusCode::FORBIDDEN,
        layout(
            "No access",
            viewer,
            None,
            html! {
                p.refusal {
                    "You (" (username) ") are not one of this server's " (what) ". "
                    "Ask for membership in "
                    @if members.is_empty() { "a group the server names in `" (what) "` (none is configured)" }
                    @for (i, member) in members.iter().enumerate() {
                        @if i > 0 { ", or " }
                        code { (member) }
                    }
                    " to " @if what == "admins" { "manage the deny list." } @else { "read the audit trail." }
                }
                p { "This refusal is recorded in the audit trail." }
            },
        ),
    )
}

/// On the deny list: no console either.
pub fn blocked(viewer: &Viewer) -> Response {
    answer(
        StatusCode::FORBIDDEN,
        layout(
            "Blocked",
            Some(viewer),
            None,
            html! { p.refusal { "You are blocked on this server (deny list); ask the platform team." } },
        ),
    )
}

/// No such console page (the console's own fallback under `/ui/`).
pub async fn not_found() -> Response {
    answer(
        StatusCode::NOT_FOUND,
        layout(
            "Not found",
            None,
            None,
            html! { p { "There is no such console page. " a href="/ui" { "The trail" } } },
        ),
    )
}

/// A view asked for from another site: nothing done, a link to do it from
/// here (`here` is this request's own path under `/ui`).
pub fn open_here(here: &str) -> Response {
    answer(
        StatusCode::OK,
        layout(
            "Open this view",
            None,
            None,
            html! {
                p { "This link came from another site, so the console did nothing with it yet." }
                p { a.button href=(here) { "Open this view" } }
            },
        ),
    )
}

/// A request of another method than a link's or a form's, from another
/// site: nothing done.
pub fn cross_site() -> Response {
    answer(
        StatusCode::FORBIDDEN,
        layout(
            "Not from here",
            None,
            None,
            html! { p.refusal { "This request came from another site, so the console did nothing with it." } },
        ),
    )
}

/// Too many requests from this address or this person: when to come back.
pub fn rate_limited(retry: std::time::Duration) -> Response {
    let seconds = retry.as_secs().max(1);
    let mut response = answer(
        StatusCode::TOO_MANY_REQUESTS,
        layout(
            "Too many requests",
            None,
            None,
            html! { p.refusal { "Too many requests; try again in " (in_seconds(seconds)) "." } },
        ),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, axum::http::HeaderValue::from(seconds));
    response
}

/// The trail cannot be read or written now.
pub fn unavailable() -> Response {
    answer(
        StatusCode::SERVICE_UNAVAILABLE,
        layout(
            "Audit trail unavailable",
            None,
            None,
            html! { p.refusal { "The audit trail cannot be read or recorded right now; nothing is shown unrecorded. Try again shortly." } },
        ),
    )
}

/// The page when the console's state (sessions, logins in progress, in
/// the trail's database) cannot be read or written: the trail's outage
/// page, the cause in the log.
pub fn state_unavailable(error: &crate::audit::store::StoreError) -> Response {
    tracing::warn!(target: "talos_sso::console", "console sessions unavailable: {error}");
    unavailable()
}

/// A login that did not work, and why.
pub fn failure(message: &str) -> Response {
    answer(
        StatusCode::FORBIDDEN,
        layout(
            "Login failed",
            None,
            None,
            html! { p.refusal { (message) } p { a href="/ui/login" { "Try again" } } },
        ),
    )
}

/// The refusal of a form that did not come from the console page `title`
/// (its CSRF token or its origin: [`super::session::forged`]).
pub fn forged(title: &str, viewer: &Viewer) -> Response {
    let body = html! { p.refusal { "This form did not come from this console page (CSRF); reload it and try again." } };
    show(StatusCode::FORBIDDEN, title, viewer, None, body)
}

/// A page of `viewer`'s with `status`.
pub fn show(
    status: StatusCode,
    title: &str,
    viewer: &Viewer,
    broken: Option<&talos_sso_api::ChainStatus>,
    body: Markup,
) -> Response {
    answer(status, layout(title, Some(viewer), broken, body))
}
