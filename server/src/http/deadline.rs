//! When an answer's body must have reached its client. A client that stops
//! reading leaves hyper unable to write, so nothing inside the body is
//! polled again and no timer there can fire: the serve loop keeps these
//! deadlines per connection and closes the connection once one passes
//! with its body still unsent, which drops the body (and whatever it
//! holds) at once.
//!
//! Every answer has one: `http.idle_timeout` from its head, unless its
//! handler attached a [`SendDeadline`] of its own to the response (the
//! console's exports: `console.export_timeout`; the audit streams: none
//! while they run, a short one once their follower ends).

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

/// A deadline for one answer's body, shared by its handler (which may move
/// it) and the serve loop (which enforces it). Attach it to the response's
/// extensions.
#[derive(Debug, Clone, Default)]
pub struct SendDeadline(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    /// `None`: no deadline (yet).
    at: Mutex<Option<Instant>>,
    /// The connection's wake-up, once the serve loop holds this deadline:
    /// moving the deadline must reach a loop asleep on the old one.
    connection: Mutex<Option<Arc<Notify>>>,
}

impl SendDeadline {
    /// The body must be sent by `at`.
    pub fn at(at: Instant) -> Self {
        let deadline = Self::default();
        deadline.set(at);
        deadline
    }

    /// No deadline until [`SendDeadline::set`] gives one.
    pub fn unset() -> Self {
        Self::default()
    }

    /// The body must be sent by `at` (earlier or later than before).
    pub fn set(&self, at: Instant) {
        *self.0.at.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
        if let Some(connection) = self
            .0
            .connection
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            connection.notify_one();
        }
    }

    /// When the body must be sent by, if it must.
    pub fn get(&self) -> Option<Instant> {
        *self.0.at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wake `connection` whenever the deadline moves from now on.
    pub(crate) fn watch_from(&self, connection: Arc<Notify>) {
        *self.0.connection.lock().unwrap_or_else(|e| e.into_inner()) = Some(connection);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn moving_a_deadline_wakes_the_connection_that_holds_it() {
        let deadline = SendDeadline::unset();
        assert_eq!(deadline.get(), None);
        let connection = Arc::new(Notify::new());
        deadline.watch_from(connection.clone());
        let at = Instant::now() + Duration::from_secs(1);
        deadline.clone().set(at);
        assert_eq!(deadline.get(), Some(at));
        // The wake-up is kept for a loop that was not waiting yet.
        tokio::time::timeout(Duration::from_secs(5), connection.notified())
            .await
            .expect("woken");
    }
}
