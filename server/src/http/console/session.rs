//! Console sessions and logins in progress, kept in the database
//! ([`crate::audit::store::console`]) so that any replica serves any
//! request and a restart signs nobody out. The browser holds a random id
//! (256 bits) in a `__Host-` cookie (Secure, HttpOnly, SameSite=Lax); the
//! database holds its SHA-256, never the id. What can be derived from the
//! id is not stored at all: a session's CSRF token, a login's `state`,
//! `nonce` and PKCE verifier are each the SHA-256 of the id under a label
//! of its own, so the database holds no secret of a login and a login is
//! used once (its row is deleted at the callback, on whichever replica).
//! A form's CSRF token is checked here ([`forged`]) with where the form
//! came from.

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;

use super::kept;
use crate::app::App;
use crate::audit::store::StoreError;
use crate::audit::store::console::{LOGIN_TIMEOUT_MS, NewLogin, NewSession, SessionLimits};
use crate::identity::VerifiedIdentity;
use crate::random::random_hex;

/// The session cookie.
pub const SESSION_COOKIE: &str = "__Host-talos-sso-console";
/// The cookie of a login in progress.
pub const LOGIN_COOKIE: &str = "__Host-talos-sso-login";
/// How long a login may take at the identity provider.
pub const LOGIN_TIMEOUT: Duration = Duration::from_millis(LOGIN_TIMEOUT_MS.unsigned_abs());

/// A login sent to the identity provider, waiting for its answer: all but
/// the page to return to derived from its id.
#[derive(Debug, Clone)]
pub struct PendingLogin {
    pub state: String,
    pub nonce: String,
    pub verifier: String,
    /// The console page to return to (a path under `/ui`).
    pub return_to: String,
}

impl PendingLogin {
    fn of(id: &str, return_to: String) -> Self {
        Self {
            state: derived("login state", id),
            nonce: derived("login nonce", id),
            verifier: derived("login verifier", id),
            return_to,
        }
    }
}

/// A person logged in to the console, as each request sees them.
#[derive(Debug, Clone)]
pub struct Session {
    /// Who logged in, as the ID token the server verified says (its
    /// groups as at login); whether they are an auditor or admin is
    /// decided from them at every request, under the configuration of the
    /// moment.
    pub identity: Arc<VerifiedIdentity>,
    /// Sent back with every form; a POST without it is refused.
    pub csrf: String,
}

/// Why the console's state could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no randomness")]
    Random,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Hex SHA-256 of `label`, a zero byte and `id`.
fn derived(label: &str, id: &str) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [label.as_bytes(), &[0], id.as_bytes()] {
        context.update(part);
    }
    hex::encode(context.finish())
}

/// What the database finds a session or login by: the id's SHA-256, for
/// an id as the server makes them (64 hex digits); anything else a cookie
/// holds finds nothing, without asking the database.
fn id_hash(id: &str) -> Option<String> {
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| hex::encode(ring::digest::digest(&ring::digest::SHA256, id.as_bytes())))
}

/// Milliseconds since the Unix epoch, by the app's clock.
fn now_ms(app: &App) -> i64 {
    i64::try_from(app.clock.now().unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// The console's sessions and logins in progress, with their bounds
/// (`console.*`); the rows are the database's.
#[derive(Debug)]
pub struct Sessions {
    limits: SessionLimits,
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl Sessions {
    pub fn new(max: usize, idle: Duration, lifetime: Duration) -> Self {
        Self {
            limits: SessionLimits {
                max: i64::try_from(max.max(1)).unwrap_or(i64::MAX),
                idle_ms: millis(idle),
                lifetime_ms: millis(lifetime),
            },
        }
    }

    /// A new login in progress from `address`: its id (for
    /// [`LOGIN_COOKIE`]) and what the authorization request carries.
    pub async fn start_login(
        &self,
        app: &App,
        return_to: String,
        address: Option<String>,
    ) -> Result<(String, PendingLogin), SessionError> {
        let id = random_hex(32).map_err(|_| SessionError::Random)?;
        let hash = id_hash(&id).ok_or(SessionError::Random)?;
        let login = NewLogin {
            id_hash: &hash,
            address: address.as_deref().unwrap_or_default(),
            return_to: &return_to,
        };
        app.audit
            .store()
            .console_start_login(login, self.limits.max, now_ms(app))
            .await?;
        let pending = PendingLogin::of(&id, return_to);
        Ok((id, pending))
    }

    /// The login in progress under `id`, taken out: it is used once.
    pub async fn take_login(&self, app: &App, id: &str) -> Result<Option<PendingLogin>, StoreError> {
        let Some(hash) = id_hash(id) else {
            return Ok(None);
        };
        let return_to = app.audit.store().console_take_login(&hash, now_ms(app)).await?;
        Ok(return_to.map(|return_to| PendingLogin::of(id, return_to)))
    }

    /// A session for `identity`: its id, for [`SESSION_COOKIE`].
    pub async fn open(&self, app: &App, identity: &VerifiedIdentity) -> Result<String, SessionError> {
        let id = random_hex(32).map_err(|_| SessionError::Random)?;
        let hash = id_hash(&id).ok_or(SessionError::Random)?;
        let session = NewSession {
            id_hash: &hash,
            subject: &identity.qualified_subject(),
            identity: &kept::keep(identity),
        };
        app.audit
            .store()
            .console_open_session(session, self.limits, now_ms(app))
            .await?;
        Ok(id)
    }

    /// The session under `id`, when it has not ended; this request counts
    /// as activity.
    pub async fn get(&self, app: &App, id: &str) -> Result<Option<Session>, StoreError> {
        let Some(hash) = id_hash(id) else {
            return Ok(None);
        };
        let store = app.audit.store();
        let Some(text) = store.console_session(&hash, self.limits, now_ms(app)).await? else {
            return Ok(None);
        };
        let Some(identity) = kept::restore(&text) else {
            // Not a session this server wrote: ended.
            store.console_close_session(&hash).await?;
            return Ok(None);
        };
        Ok(Some(Session {
            identity: Arc::new(identity),
            csrf: derived("csrf", id),
        }))
    }

    /// Whether session `id` recorded `view` already. The database holds
    /// a hash of the view under the session's id, not the view.
    pub async fn recorded(&self, app: &App, id: &str, view: &str) -> Result<bool, StoreError> {
        match id_hash(id) {
            Some(hash) => {
                app.audit
                    .store()
                    .console_seen_view(&hash, &derived(id, view))
                    .await
            }
            None => Ok(false),
        }
    }

    /// Note that session `id` recorded `view`, once its record is
    /// committed: a view is never marked recorded before it is (a note
    /// that fails only records the view again, which is harmless).
    pub async fn note_recorded(&self, app: &App, id: &str, view: &str) {
        let Some(hash) = id_hash(id) else {
            return;
        };
        if let Err(error) = app
            .audit
            .store()
            .console_first_view(&hash, &derived(id, view))
            .await
        {
            tracing::warn!(target: "talos_sso::console", "a recorded view was not noted: {error}");
        }
    }

    /// End the session under `id`, on every replica.
    pub async fn close(&self, app: &App, id: &str) -> Result<(), StoreError> {
        match id_hash(id) {
            Some(hash) => app.audit.store().console_close_session(&hash).await,
            None => Ok(()),
        }
    }
}

/// The value of cookie `name` in the request, if sent once.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut found = headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|line| line.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(n, _)| *n == name)
        .map(|(_, v)| v);
    let first = found.next()?;
    // Two cookies of one name: one may have been planted; trust neither.
    found.next().is_none().then_some(first)
}

/// A `Set-Cookie` value for `name`: host-only, whole site, Secure,
/// HttpOnly, SameSite=Lax (the identity provider's redirect back is a
/// top-level navigation from another site); `None` clears it.
pub fn set_cookie(name: &str, value: Option<&str>, max_age: Duration) -> String {
    match value {
        Some(value) => format!(
            "{name}={value}; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age={}",
            max_age.as_secs()
        ),
        None => format!("{name}=; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age=0"),
    }
}

/// Whether a form is forged: its CSRF token is not the session's
/// (`session_csrf`), or it came from elsewhere than the console at
/// `origin`; a POST that is refused before anything is done. Browsers say
/// where with `Sec-Fetch-Site`; `Origin` is `null` under `Referrer-Policy:
/// no-referrer`, so only another site's origin there counts against it.
pub fn forged(origin: &str, headers: &HeaderMap, csrf: &str, session_csrf: &str) -> bool {
    let site_ok = headers
        .get("sec-fetch-site")
        .is_none_or(|site| site.as_bytes() == b"same-origin");
    let origin_ok = headers
        .get(axum::http::header::ORIGIN)
        .is_none_or(|o| o.as_bytes() == b"null" || o.as_bytes() == origin.as_bytes());
    !site_ok || !origin_ok || !same_secret(csrf, session_csrf)
}

/// Equal without telling by how much they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    let differing = a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    a.len() == b.len() && differing == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn what_is_derived_from_an_id_is_its_own_and_reveals_nothing_of_it() {
        let id = "ab".repeat(32);
        let login = PendingLogin::of(&id, "/ui".into());
        assert_eq!(
            login.verifier.len(),
            64,
            "a PKCE verifier of 43 to 128 characters"
        );
        let values = [&login.state, &login.nonce, &login.verifier, &derived("csrf", &id)];
        for (n, value) in values.iter().enumerate() {
            assert!(!value.contains(&id));
            assert_ne!(
                Some((*value).clone()),
                id_hash(&id),
                "the database's key is none of them"
            );
            assert!(values[n + 1..].iter().all(|other| other != value));
        }
        assert_eq!(PendingLogin::of(&id, "/ui".into()).state, login.state);
        assert_ne!(
            PendingLogin::of(&"cd".repeat(32), "/ui".into()).state,
            login.state
        );
        // Only ids as the server makes them are looked up.
        assert!(id_hash(&id).is_some());
        for hostile in ["", "ab", &"zz".repeat(32), &"ab".repeat(33)] {
            assert!(id_hash(hostile).is_none(), "{hostile}");
        }
    }

    #[test]
    fn a_cookie_sent_twice_is_trusted_in_neither_copy() {
        let mut headers = HeaderMap::new();
        headers.append("cookie", HeaderValue::from_static("a=1; __Host-x=abc"));
        assert_eq!(cookie(&headers, "__Host-x"), Some("abc"));
        headers.append("cookie", HeaderValue::from_static("__Host-x=planted"));
        assert_eq!(cookie(&headers, "__Host-x"), None);
        assert!(same_secret("abc", "abc") && !same_secret("abc", "abd") && !same_secret("abc", "ab"));
    }
}
