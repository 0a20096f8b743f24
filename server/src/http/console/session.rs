//! Console sessions: held in memory, bounded in number, each ended after
//! a short idle time and a fixed lifetime, found by a random id carried in
//! a `__Host-` cookie (Secure, HttpOnly, SameSite=Lax). A login in
//! progress (its `state`, PKCE verifier and `nonce`) is held apart, bounded
//! on its own, under a cookie of its own until the identity provider sends
//! the browser back. A form's CSRF token is kept with its session, and
//! checked here ([`forged`]) with where the form came from.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;

use crate::identity::VerifiedIdentity;
use crate::random::{RandomError, random_hex};

/// The session cookie.
pub const SESSION_COOKIE: &str = "__Host-talos-sso-console";
/// The cookie of a login in progress.
pub const LOGIN_COOKIE: &str = "__Host-talos-sso-login";
/// How long a login may take at the identity provider.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(600);

/// A login sent to the identity provider, waiting for its answer.
#[derive(Debug, Clone)]
pub struct PendingLogin {
    pub state: String,
    pub nonce: String,
    pub verifier: String,
    /// The console page to return to (a path under `/ui`).
    pub return_to: String,
    /// The client address that started it ([`crate::ratelimit::address_key`]):
    /// room is made among one address's logins before anyone else's.
    address: Option<String>,
    started: Instant,
}

/// Logins in progress one client address may hold: its oldest makes room
/// for its next, so a flood from one address pushes out only its own.
pub const LOGINS_PER_ADDRESS: usize = 16;

/// A person logged in to the console, as each request sees them: cheap to
/// hand out (the identity is shared, not copied).
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

/// A session as held: what requests see, and what only the holder keeps.
#[derive(Debug)]
struct Held {
    session: Session,
    /// The views already recorded in the trail in this session (one
    /// `audit.query` record per view and filter, not per request).
    recorded: Recorded,
    started: Instant,
    last_seen: Instant,
}

/// Views recorded in one session, bounded: a hash of each (not its text),
/// at most [`RECORDED_MAX`]; past that the oldest is forgotten (its view
/// would be recorded once more, which is harmless).
#[derive(Debug, Default)]
struct Recorded {
    seen: HashSet<u64>,
    order: VecDeque<u64>,
    hasher: std::hash::RandomState,
}

/// Views one session remembers having recorded.
pub const RECORDED_MAX: usize = 4096;

impl Recorded {
    fn key(&self, view: &str) -> u64 {
        self.hasher.hash_one(view)
    }

    /// False when `view` was recorded already.
    fn insert(&mut self, view: &str) -> bool {
        let key = self.key(view);
        if !self.seen.insert(key) {
            return false;
        }
        self.order.push_back(key);
        while self.order.len() > RECORDED_MAX {
            if let Some(oldest) = self.order.pop_front() {
                self.seen.remove(&oldest);
            }
        }
        true
    }

    fn remove(&mut self, view: &str) {
        let key = self.key(view);
        if self.seen.remove(&key) {
            self.order.retain(|k| *k != key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seen.len()
    }
}

/// Sessions one person may hold at once (browsers, machines): their
/// least recently used makes room for their next, so nobody's logins push
/// out anyone else's.
pub const SESSIONS_PER_SUBJECT: usize = 5;

/// Every session and login in progress, each kind bounded on its own: a
/// flood of logins started (anyone can start one) never pushes out the
/// sessions of people signed in.
pub struct Sessions {
    active: Mutex<HashMap<String, Held>>,
    logins: Mutex<HashMap<String, PendingLogin>>,
    max: usize,
    idle: Duration,
    lifetime: Duration,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

fn locked<V>(map: &Mutex<HashMap<String, V>>) -> std::sync::MutexGuard<'_, HashMap<String, V>> {
    map.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sessions {
    pub fn new(max: usize, idle: Duration, lifetime: Duration) -> Self {
        Self {
            active: Mutex::new(HashMap::new()),
            logins: Mutex::new(HashMap::new()),
            max: max.max(1),
            idle,
            lifetime,
        }
    }

    fn session_live(&self, session: &Held, now: Instant) -> bool {
        now.duration_since(session.last_seen) < self.idle
            && now.duration_since(session.started) < self.lifetime
    }

    /// A new login in progress from `address`: its id (for
    /// [`LOGIN_COOKIE`]) and what the authorization request carries. Room
    /// is made first among `address`'s own (at most
    /// [`LOGINS_PER_ADDRESS`]); when every place is taken, the address
    /// holding the most gives up its oldest: a flood evicts the flooder's.
    pub fn start_login(
        &self,
        return_to: String,
        address: Option<String>,
    ) -> Result<(String, PendingLogin), RandomError> {
        let now = Instant::now();
        let pending = PendingLogin {
            state: random_hex(16)?,
            nonce: random_hex(16)?,
            verifier: random_hex(32)?,
            return_to,
            address,
            started: now,
        };
        let id = random_hex(32)?;
        let mut logins = locked(&self.logins);
        logins.retain(|_, p| now.duration_since(p.started) < LOGIN_TIMEOUT);
        let own = logins.values().filter(|p| p.address == pending.address).count();
        let giver = if own >= LOGINS_PER_ADDRESS.min(self.max) {
            Some(pending.address.clone())
        } else if logins.len() >= self.max {
            let mut held: HashMap<&Option<String>, usize> = HashMap::new();
            for p in logins.values() {
                *held.entry(&p.address).or_default() += 1;
            }
            held.into_iter()
                .max_by_key(|(_, n)| *n)
                .map(|(address, _)| address.clone())
        } else {
            None
        };
        if let Some(giver) = giver
            && let Some(oldest) = logins
                .iter()
                .filter(|(_, p)| p.address == giver)
                .min_by_key(|(_, p)| p.started)
                .map(|(id, _)| id.clone())
        {
            logins.remove(&oldest);
        }
        logins.insert(id.clone(), pending.clone());
        Ok((id, pending))
    }

    /// The login in progress under `id`, taken out: it is used once.
    pub fn take_login(&self, id: &str) -> Option<PendingLogin> {
        locked(&self.logins)
            .remove(id)
            .filter(|p| p.started.elapsed() < LOGIN_TIMEOUT)
    }

    /// A session for `identity`: its id, for [`SESSION_COOKIE`]. Room is
    /// made among the person's own first (at most
    /// [`SESSIONS_PER_SUBJECT`]); when every place is taken, the session
    /// least recently used gives way, not the oldest.
    pub fn open(&self, identity: VerifiedIdentity) -> Result<String, RandomError> {
        let now = Instant::now();
        let subject = identity.qualified_subject();
        let session = Held {
            session: Session {
                identity: Arc::new(identity),
                csrf: random_hex(32)?,
            },
            recorded: Recorded::default(),
            started: now,
            last_seen: now,
        };
        let id = random_hex(32)?;
        let mut active = locked(&self.active);
        active.retain(|_, s| self.session_live(s, now));
        let own = |s: &Held| s.session.identity.qualified_subject() == subject;
        let theirs = active.values().filter(|s| own(s)).count();
        let unused = if theirs >= SESSIONS_PER_SUBJECT {
            active
                .iter()
                .filter(|(_, s)| own(s))
                .min_by_key(|(_, s)| s.last_seen)
        } else if active.len() >= self.max {
            active.iter().min_by_key(|(_, s)| s.last_seen)
        } else {
            None
        }
        .map(|(id, _)| id.clone());
        if let Some(unused) = unused {
            active.remove(&unused);
        }
        active.insert(id.clone(), session);
        Ok(id)
    }

    /// The session under `id`, when it has not ended; this request counts
    /// as activity.
    pub fn get(&self, id: &str) -> Option<Session> {
        let now = Instant::now();
        let mut active = locked(&self.active);
        match active.get_mut(id) {
            Some(session) if self.session_live(session, now) => {
                session.last_seen = now;
                Some(session.session.clone())
            }
            Some(_) => {
                active.remove(id);
                None
            }
            None => None,
        }
    }

    /// Note that `view` was recorded for session `id`; false when it had
    /// been already (or the session is gone).
    pub fn first_view(&self, id: &str, view: &str) -> bool {
        locked(&self.active)
            .get_mut(id)
            .is_some_and(|session| session.recorded.insert(view))
    }

    /// Forget that `view` was recorded (its record could not be written).
    pub fn unrecord(&self, id: &str, view: &str) {
        if let Some(session) = locked(&self.active).get_mut(id) {
            session.recorded.remove(view);
        }
    }

    pub fn close(&self, id: &str) {
        locked(&self.active).remove(id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        locked(&self.active).len()
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

    fn identity() -> VerifiedIdentity {
        VerifiedIdentity {
            issuer_name: crate::config::LOGIN_ISSUER.into(),
            issuer: "https://login.example/t/v2.0".into(),
            tenant: None,
            subject: "oid-1".into(),
            username: "sam@example.com".into(),
            groups: vec![],
            app_roles: vec![],
            token_id: None,
            signed_sha256: "00".repeat(32),
            issued_at: None,
            expires_at: time::OffsetDateTime::UNIX_EPOCH,
            claims: Default::default(),
            application: None,
        }
    }

    #[test]
    fn sessions_are_bounded_and_a_login_is_used_once() {
        let sessions = Sessions::new(2, Duration::from_secs(60), Duration::from_secs(600));
        let (login, pending) = sessions.start_login("/ui".into(), None).unwrap();
        assert_eq!(pending.verifier.len(), 64);
        assert!(sessions.take_login(&login).is_some());
        assert!(sessions.take_login(&login).is_none(), "a login is taken once");
        let a = sessions.open(identity()).unwrap();
        let b = sessions.open(identity()).unwrap();
        let c = sessions.open(identity()).unwrap();
        assert_eq!(sessions.len(), 2);
        assert!(sessions.get(&a).is_none(), "the least recently used made room");
        assert!(sessions.get(&b).is_some() && sessions.get(&c).is_some());
        // A session id is never a login in progress.
        assert!(sessions.take_login(&b).is_none());
        assert!(sessions.get(&b).is_some());
        assert!(sessions.first_view(&b, "trail?x"));
        assert!(!sessions.first_view(&b, "trail?x"));
        sessions.unrecord(&b, "trail?x");
        assert!(sessions.first_view(&b, "trail?x"));
        // A flood of logins started pushes out logins, never sessions.
        for _ in 0..10 {
            sessions.start_login("/ui".into(), None).unwrap();
        }
        assert!(sessions.get(&b).is_some() && sessions.get(&c).is_some());
    }

    #[test]
    fn a_flood_of_logins_from_one_address_pushes_out_only_its_own() {
        let sessions = Sessions::new(40, Duration::from_secs(60), Duration::from_secs(600));
        let mine = |n: usize| Some(format!("198.51.100.{n}"));
        let others: Vec<String> = (0..20)
            .map(|n| sessions.start_login("/ui".into(), mine(n)).unwrap().0)
            .collect();
        for _ in 0..1000 {
            sessions
                .start_login("/ui".into(), Some("203.0.113.66".into()))
                .unwrap();
        }
        let flood = locked(&sessions.logins)
            .values()
            .filter(|p| p.address.as_deref() == Some("203.0.113.66"))
            .count();
        assert_eq!(flood, LOGINS_PER_ADDRESS);
        for id in &others {
            assert!(sessions.take_login(id).is_some(), "another address's login stays");
        }
        // Full of many addresses' logins: the one holding most gives way.
        for n in 0..40 {
            sessions.start_login("/ui".into(), mine(100 + n % 20)).unwrap();
        }
        let flood = locked(&sessions.logins)
            .values()
            .filter(|p| p.address.as_deref() == Some("203.0.113.66"))
            .count();
        assert!(flood < LOGINS_PER_ADDRESS, "{flood}");
        assert!(locked(&sessions.logins).len() <= 40);
    }

    fn someone(subject: &str) -> VerifiedIdentity {
        VerifiedIdentity {
            subject: subject.into(),
            ..identity()
        }
    }

    #[test]
    fn the_least_recently_used_session_makes_room_and_each_person_holds_few() {
        let sessions = Sessions::new(3, Duration::from_secs(60), Duration::from_secs(600));
        let a = sessions.open(someone("a")).unwrap();
        let b = sessions.open(someone("b")).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        assert!(sessions.get(&a).is_some(), "a is used again");
        let c = sessions.open(someone("c")).unwrap();
        let d = sessions.open(someone("d")).unwrap();
        assert!(sessions.get(&b).is_none(), "b was used least recently");
        assert!(sessions.get(&a).is_some() && sessions.get(&c).is_some() && sessions.get(&d).is_some());

        // One person's many logins push out only their own sessions.
        let sessions = Sessions::new(100, Duration::from_secs(60), Duration::from_secs(600));
        let others: Vec<String> = (0..20)
            .map(|n| sessions.open(someone(&format!("other-{n}"))).unwrap())
            .collect();
        let first = sessions.open(someone("many")).unwrap();
        for _ in 0..200 {
            sessions.open(someone("many")).unwrap();
        }
        assert_eq!(sessions.len(), 20 + SESSIONS_PER_SUBJECT);
        assert!(sessions.get(&first).is_none());
        assert!(others.iter().all(|id| sessions.get(id).is_some()));
    }

    #[test]
    fn a_session_remembers_a_bounded_number_of_views() {
        let sessions = Sessions::new(2, Duration::from_secs(60), Duration::from_secs(600));
        let id = sessions.open(identity()).unwrap();
        for n in 0..RECORDED_MAX + 100 {
            assert!(sessions.first_view(&id, &format!("trail {n}")));
        }
        let held = |f: &dyn Fn(&Held)| f(&locked(&sessions.active)[&id]);
        held(&|h| assert_eq!(h.recorded.len(), RECORDED_MAX));
        assert!(!sessions.first_view(&id, &format!("trail {}", RECORDED_MAX + 99)));
        assert!(sessions.first_view(&id, "trail 0"), "the oldest was forgotten");
        // What a request gets shares the identity instead of copying it.
        let (a, b) = (sessions.get(&id).unwrap(), sessions.get(&id).unwrap());
        assert!(Arc::ptr_eq(&a.identity, &b.identity));
    }

    #[test]
    fn idle_sessions_end() {
        let sessions = Sessions::new(10, Duration::from_millis(30), Duration::from_secs(600));
        let id = sessions.open(identity()).unwrap();
        assert!(sessions.get(&id).is_some());
        std::thread::sleep(Duration::from_millis(60));
        assert!(sessions.get(&id).is_none());
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
