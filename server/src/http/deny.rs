//! `/v1/deny` (admins): list, add and remove deny-list entries. An entry
//! blocks a subject at once: the next issuance checks it in the transaction
//! that would commit the certificate. Every change is recorded with the
//! change itself, in one transaction.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use talos_sso_api::{DenyAdded, DenyEntry, DenyList, DenyRemoved, DenyRequest, ErrorCode};

use super::caller::Caller;
use super::error::ApiError;
use super::gate::refuse;
use super::privileged::{Privilege, authorize, commit};
use super::{QueryParams, query_or_400};
use crate::app::App;
use crate::audit::store::{DenyChange, IssuerScope};
use crate::audit::{AuditRecord, event};
use crate::identity::VerifiedIdentity;
use talos_sso_text as text;
use time::OffsetDateTime;

/// The subject and username a request names, cleaned; at least one.
pub(super) fn target(request: &DenyRequest) -> Result<(Option<String>, Option<String>), ApiError> {
    let clean = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(text::clean_field)
    };
    let (subject, username) = (clean(&request.subject), clean(&request.username));
    if subject.is_none() && username.is_none() {
        return Err(ApiError::request_invalid(
            "name a `subject` or a `username`",
            None,
        ));
    }
    Ok((subject, username.map(|u| u.to_lowercase())))
}

/// The number of entries a committed change touched.
fn entries_changed(details: &Value) -> u64 {
    details["entries_changed"].as_u64().unwrap_or_default()
}

/// `GET /v1/deny`.
pub async fn list(State(app): State<Arc<App>>, caller: Caller) -> Result<Json<DenyList>, ApiError> {
    // Only a refusal is recorded: reading the list changes nothing.
    authorize(&app, &caller, Privilege::Admin, event::DENY_LISTED, json!({})).await?;
    let entries = app.audit.store().deny_list().await?;
    Ok(Json(DenyList { entries }))
}

/// `POST /v1/deny`: block an identity from new certificates, at once.
pub async fn add(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: Bytes,
) -> Result<(StatusCode, Json<DenyAdded>), ApiError> {
    let request: DenyRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::request_invalid(format!("not a deny request: {e}"), None))?;
    let addition = addition(&request)?;
    let details = addition_details(&addition);
    let (verified, record) = authorize(&app, &caller, Privilege::Admin, event::DENY_ADDED, details)
        .await?
        .into_success();
    let added = add_entry(&app, &verified, record, addition).await?;
    tracing::warn!(request_id = %caller.request_id, by = %text::clean_field(&verified.username), "deny list entry added");
    Ok((StatusCode::CREATED, Json(added)))
}

/// What an addition asks for, cleaned: a target and a reason are
/// required, an expiry is optional.
#[derive(Debug, Clone)]
pub(super) struct Addition {
    pub subject: Option<String>,
    pub username: Option<String>,
    pub reason: String,
    pub expires_at: Option<OffsetDateTime>,
}

/// The longest an entry may be set to last: beyond it, leave the expiry
/// out.
const LONGEST_EXPIRY: time::Duration = time::Duration::days(3650);

pub(super) fn addition(request: &DenyRequest) -> Result<Addition, ApiError> {
    let (subject, username) = target(request)?;
    let reason = request
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .ok_or_else(|| ApiError::request_invalid("a `reason` is required", None))?;
    Ok(Addition {
        subject,
        username,
        reason: reason.to_owned(),
        expires_at: request.expires_at,
    })
}

/// The details of an addition's record, before its subject is resolved.
pub(super) fn addition_details(addition: &Addition) -> Value {
    json!({
        "target_subject": addition.subject,
        "target_username": addition.username,
        "reason": addition.reason,
        "expires_at": addition.expires_at.map(talos_sso_api::audit::format_micros),
    })
}

/// Add the entry `record` (an authorized `deny.added`) asks for, committed
/// with its record; a refusal after authorization is recorded too.
pub(super) async fn add_entry(
    app: &App,
    verified: &VerifiedIdentity,
    mut record: AuditRecord,
    addition: Addition,
) -> Result<DenyAdded, ApiError> {
    let Addition {
        subject,
        username,
        reason,
        expires_at,
    } = addition;
    // Checked against the record's time: the one the entry is added at.
    if let Some(expires_at) = expires_at
        && (expires_at <= record.occurred_at || expires_at > record.occurred_at + LONGEST_EXPIRY)
    {
        let error = ApiError::request_invalid(
            "`expires_at` must be in the future and at most ten years ahead (leave it out for no expiry)",
            None,
        );
        return Err(refuse(app, record, error).await);
    }
    let subject = match (subject, &username) {
        (Some(subject), _) => subject,
        (None, Some(username)) => match subject_of(app, username).await {
            Ok(subject) => subject,
            Err(error) => return Err(refuse(app, record, error).await),
        },
        (None, None) => return Err(ApiError::internal()),
    };
    if let Value::Object(details) = &mut record.details {
        details.insert("target_subject".into(), json!(subject));
    }
    let entry = DenyEntry {
        subject: Some(subject),
        username,
        reason: text::clean(&reason, text::REASON_CHARS),
        added_by: verified.username.clone(),
        added_at: record.occurred_at,
        expires_at: expires_at.map(talos_sso_api::audit::truncate_to_micros),
    };
    let stored = commit(app, record, Some(DenyChange::Add(entry.clone()))).await?;
    if entries_changed(&stored.record.details) == 0 {
        // Recorded as tried; nothing changed, and the caller must know.
        return Err(ApiError::new(
            ErrorCode::AlreadyDenied { audit_id: stored.seq },
            "this subject is already on the deny list; nothing was changed",
        ));
    }
    Ok(DenyAdded {
        entry,
        audit_id: stored.seq,
    })
}

/// Whose records may resolve a username: the login issuer's, the one
/// people log in with (`identity`), by every `iss` it accepts now, and of
/// its allowed tenants (Entra; none for an OpenID Connect issuer).
///
/// A trusted issuer (`identity.trusted_issuers`) names its own subjects
/// with usernames it chooses: one that claimed a person's username before
/// that person first logged in would otherwise own it here, and the entry
/// would block the claimant while the person kept getting certificates.
/// Unverified records hold whatever a refused token claimed.
///
/// An Entra login issuer with one tenant is scoped to it. With several,
/// each tenant's subject with that username is a candidate of its own
/// (`oid` values are per tenant): several answer `subject_ambiguous`,
/// listing the subjects with their tenants, and the admin names the one
/// to block.
fn login_scope(app: &App) -> Result<IssuerScope, ApiError> {
    let login = app.settings().config.identity.login_issuer();
    let issuers = crate::identity::issuer::accepted_issuers(&login).map_err(|reason| {
        // Checked when the configuration was loaded: not expected here.
        tracing::error!("the login issuer's accepted issuers: {reason}");
        ApiError::internal()
    })?;
    Ok(IssuerScope {
        issuers,
        tenants: login.allowed_tenants,
    })
}

/// How many (subject, tenant) pairs a username's resolution reads at most,
/// and so the most subjects a `subject_ambiguous` answer lists (an Entra
/// `oid` has one tenant, so a pair is a subject).
const CANDIDATES: i64 = 10;

/// The one subject that verified records of the login issuer name with
/// `username` ([`login_scope`]). A deny entry blocks a subject, never a
/// username (its owner can change it), so a username is resolved once,
/// here, or refused when that is not certain.
async fn subject_of(app: &App, username: &str) -> Result<String, ApiError> {
    let scope = login_scope(app)?;
    let mut candidates = app
        .audit
        .store()
        .subjects_of(username, &scope, CANDIDATES)
        .await?;
    if candidates.len() == 1
        && let Some((one, _)) = candidates.pop()
    {
        return Ok(one);
    }
    if candidates.is_empty() {
        return Err(ApiError::new(
            ErrorCode::SubjectRequired,
            format!(
                "no verified record of the login issuer names `{username}`, so its subject is unknown; name \
                 the `subject` to block (Entra object id, or the provider's `sub`): a username can be changed \
                 by its owner, and other issuers' or unverified records do not tie it to anyone"
            ),
        ));
    }
    let count = match candidates.len() {
        n if n as i64 >= CANDIDATES => format!("at least {n}"),
        n => n.to_string(),
    };
    let described: Vec<String> = candidates
        .iter()
        .map(|(subject, tenant)| match tenant {
            None => subject.clone(),
            Some(tenant) => format!("{subject} (tenant {tenant})"),
        })
        .collect();
    // What to do comes before the list: the detail is cut at
    // `REASON_CHARS`, and long subjects could fill it.
    Err(ApiError::new(
        ErrorCode::SubjectAmbiguous {
            subjects: candidates.into_iter().map(|(subject, _)| subject).collect(),
        },
        format!(
            "`{username}` has been used by {count} different subjects of the login issuer; name the \
             `subject` to block. Candidates: {}",
            described.join(", ")
        ),
    ))
}

/// `DELETE /v1/deny?subject=...` or `?username=...`.
pub async fn remove(
    State(app): State<Arc<App>>,
    caller: Caller,
    query: QueryParams<DenyRequest>,
) -> Result<Json<DenyRemoved>, ApiError> {
    let request = query_or_400(query)?;
    let (subject, username) = target(&request)?;
    let details = json!({"target_subject": subject, "target_username": username});
    let (verified, record) = authorize(&app, &caller, Privilege::Admin, event::DENY_REMOVED, details)
        .await?
        .into_success();
    let removed = remove_entries(&app, record, subject, username).await?;
    tracing::warn!(request_id = %caller.request_id, by = %text::clean_field(&verified.username), "deny list entry removed");
    Ok(Json(removed))
}

/// Remove the entries `record` (an authorized `deny.removed`) names,
/// committed with its record.
pub(super) async fn remove_entries(
    app: &App,
    mut record: AuditRecord,
    subject: Option<String>,
    username: Option<String>,
) -> Result<DenyRemoved, ApiError> {
    // A username names the subject verified records tie it to (entries
    // block subjects), and entries added with that username alone.
    let subject = match (subject, &username) {
        (Some(subject), _) => Some(subject),
        (None, Some(name)) => match subject_of(app, name).await {
            Ok(subject) => Some(subject),
            Err(error) if error.error == ErrorCode::SubjectRequired => None,
            Err(error) => return Err(refuse(app, record, error).await),
        },
        (None, None) => None,
    };
    if let (Value::Object(details), Some(subject)) = (&mut record.details, &subject) {
        details.insert("target_subject".into(), json!(subject));
    }
    let stored = commit(app, record, Some(DenyChange::Remove { subject, username })).await?;
    Ok(DenyRemoved {
        removed: entries_changed(&stored.record.details),
        audit_id: stored.seq,
    })
}
