//! Cut-off: the deny list as the gateway last read it, and the calls
//! running through this replica. Every replica reads the shared deny list
//! each [`POLL`] and ends the running calls of whoever is on it, so that a
//! `deny add` stops a `talosctl logs -f` on every replica within seconds;
//! new calls are checked against the same copy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::audit::store::DenyEntry;

/// How often the deny list is read. A cut-off takes at most this, plus a
/// read of the list, to reach a running call.
pub const POLL: Duration = Duration::from_secs(1);

/// The status and message a cut call ends with.
pub type CutReason = (u32, String);

/// The deny list as last read, or `None` before the first read succeeded.
#[derive(Debug, Default)]
pub struct DenySnapshot {
    entries: RwLock<Option<Arc<Vec<DenyEntry>>>>,
}

impl DenySnapshot {
    pub fn replace(&self, entries: Vec<DenyEntry>) {
        *self.entries.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(entries));
    }

    /// Whether the list blocks this person: an entry for their subject, or
    /// one for their username (case-insensitive) without a subject.
    /// `None` when the list has not been read yet.
    pub fn blocks(&self, subject: Option<&str>, username: Option<&str>) -> Option<bool> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner()).clone()?;
        Some(entries.iter().any(|entry| blocks(entry, subject, username)))
    }
}

fn blocks(entry: &DenyEntry, subject: Option<&str>, username: Option<&str>) -> bool {
    match (&entry.subject, &entry.username) {
        (Some(listed), _) => Some(listed.as_str()) == subject,
        (None, Some(name)) => username.is_some_and(|u| u.to_lowercase() == name.to_lowercase()),
        (None, None) => false,
    }
}

/// The calls running through this replica, by person.
#[derive(Debug, Default)]
pub struct LiveCalls {
    next: AtomicU64,
    calls: Mutex<HashMap<u64, Live>>,
}

#[derive(Debug)]
struct Live {
    subject: Option<String>,
    username: Option<String>,
    cut: watch::Sender<Option<CutReason>>,
}

/// A running call; dropping it forgets it.
#[derive(Debug)]
pub struct LiveCall {
    id: u64,
    calls: Arc<LiveCalls>,
    cut: watch::Receiver<Option<CutReason>>,
}

impl LiveCall {
    /// Completes when the call is cut off, with why.
    pub fn cut(&self) -> impl std::future::Future<Output = CutReason> + Send + 'static {
        let mut receiver = self.cut.clone();
        async move {
            let reason = match receiver.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone(),
                Err(_) => None,
            };
            match reason {
                Some(reason) => reason,
                // The sender lives as long as the call is registered, and
                // the call holds this: never reached while it matters.
                None => std::future::pending().await,
            }
        }
    }
}

impl Drop for LiveCall {
    fn drop(&mut self) {
        self.calls
            .calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

impl LiveCalls {
    pub fn register(self: &Arc<Self>, subject: Option<&str>, username: Option<&str>) -> LiveCall {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (cut, receiver) = watch::channel(None);
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).insert(
            id,
            Live {
                subject: subject.map(str::to_owned),
                username: username.map(str::to_owned),
                cut,
            },
        );
        LiveCall {
            id,
            calls: self.clone(),
            cut: receiver,
        }
    }

    /// End every running call of someone the list blocks; how many.
    pub fn cut_denied(&self, deny: &DenySnapshot, reason: &CutReason) -> usize {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let mut cut = 0;
        for live in calls.values() {
            let blocked = deny.blocks(live.subject.as_deref(), live.username.as_deref()) == Some(true);
            if blocked && live.cut.borrow().is_none() {
                live.cut.send_replace(Some(reason.clone()));
                cut += 1;
            }
        }
        cut
    }

    /// Calls (and connections) registered now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::OffsetDateTime;

    fn entry(subject: Option<&str>, username: Option<&str>) -> DenyEntry {
        DenyEntry {
            subject: subject.map(str::to_owned),
            username: username.map(str::to_owned),
            reason: "incident".into(),
            added_by: "sec".into(),
            added_at: OffsetDateTime::UNIX_EPOCH,
            expires_at: None,
        }
    }

    #[tokio::test]
    async fn a_listed_person_s_calls_are_cut_and_no_one_else_s() {
        let calls = Arc::new(LiveCalls::default());
        let alice = calls.register(Some("sub-alice"), Some("alice@example.com"));
        let bob = calls.register(Some("sub-bob"), Some("Bob@example.com"));
        let deny = DenySnapshot::default();
        assert_eq!(deny.blocks(Some("sub-alice"), None), None, "not read yet");
        let reason = (7, "revoked".to_owned());
        deny.replace(vec![entry(Some("sub-alice"), None)]);
        assert_eq!(calls.cut_denied(&deny, &reason), 1);
        assert_eq!(alice.cut().await, reason);
        // Cut once: the next poll does not count it again.
        assert_eq!(calls.cut_denied(&deny, &reason), 0);
        let bob_cut = bob.cut();
        deny.replace(vec![entry(None, Some("bob@example.com"))]);
        assert_eq!(calls.cut_denied(&deny, &reason), 1);
        assert_eq!(bob_cut.await, reason);
        drop(alice);
        drop(bob);
        assert_eq!(calls.len(), 0);
    }
}
