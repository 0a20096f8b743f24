//! What the stand-in saw: one `SeenCall` per gRPC call, the handshakes it
//! refused, a bell rung at every change for bounded waits, and the guard
//! that marks a call cancelled when its handler is dropped unfinished.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

/// One call as the stand-in saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenCall {
    /// The gRPC path, `/machine.MachineService/Version`.
    pub method: String,
    /// Which TLS connection carried it: 1, 2, ... in the order accepted.
    pub connection: u64,
    /// Roles from the client certificate's Subject Organization values,
    /// parsed as Talos's `role.Parse` does (trimmed, empty ones dropped,
    /// unknown ones kept), sorted.
    pub certificate_roles: Vec<String>,
    /// The client certificate's CN (apid never reads it; the gateway's own
    /// certificate is easy to tell by it).
    pub certificate_common_name: Option<String>,
    /// Every `talos-role` metadata value, as received, in order.
    pub metadata_roles: Vec<String>,
    /// The roles apid settled on: the metadata's when the certificate holds
    /// `os:impersonator` and metadata roles were sent, else the certificate's.
    pub effective_roles: Vec<String>,
    /// Whether the method's rule admits one of the effective roles.
    pub authorized: bool,
    /// Every request header (metadata), in order, values as UTF-8 (lossy).
    pub metadata: Vec<(String, String)>,
    /// The client went away before the handler was done (a reset stream, a
    /// closed connection), as the handler noticed.
    pub cancelled: bool,
    /// The handler ran to its end (an error status it meant to send
    /// counts; a refusal too).
    pub finished: bool,
    /// What the hook said, once it ran (`None`: no hook, or not yet).
    pub hook: Option<Result<String, String>>,
}

impl SeenCall {
    /// Every value of metadata `key` (lower case), in order.
    pub fn metadata_values(&self, key: &str) -> Vec<&str> {
        self.metadata
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// The log shared by the server's tasks and the test's handle.
#[derive(Debug)]
pub(super) struct Log {
    calls: Mutex<Vec<SeenCall>>,
    refused: Mutex<Vec<String>>,
    /// Bumped at every change; waiters subscribe before they look.
    bell: watch::Sender<u64>,
}

impl Log {
    pub(super) fn new() -> Arc<Log> {
        Arc::new(Log {
            calls: Mutex::default(),
            refused: Mutex::default(),
            bell: watch::Sender::new(0),
        })
    }

    fn ring(&self) {
        self.bell.send_modify(|n| *n += 1);
    }

    pub(super) fn push(&self, call: SeenCall) -> usize {
        let index = {
            let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
            calls.push(call);
            calls.len() - 1
        };
        self.ring();
        index
    }

    pub(super) fn update(&self, index: usize, change: impl FnOnce(&mut SeenCall)) {
        if let Some(call) = self
            .calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(index)
        {
            change(call);
        }
        self.ring();
    }

    pub(super) fn refuse(&self, why: String) {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).push(why);
        self.ring();
    }

    pub(super) fn calls(&self) -> Vec<SeenCall> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn refused(&self) -> Vec<String> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Wait until `done` holds of the log, at most `timeout`; whether it did.
    pub(super) async fn wait(&self, timeout: Duration, done: impl Fn(&Log) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut bell = self.bell.subscribe();
        loop {
            if done(self) {
                return true;
            }
            // A change after `subscribe` and before this wait still wakes it.
            match tokio::time::timeout_at(deadline, bell.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return false,
            }
        }
    }
}

/// Held by a call's handler (and by its answer stream): dropped before
/// `finish`, the call is marked cancelled.
#[derive(Debug)]
pub(super) struct CallGuard {
    log: Arc<Log>,
    index: usize,
    settled: bool,
}

impl CallGuard {
    pub(super) fn new(log: Arc<Log>, index: usize) -> CallGuard {
        CallGuard {
            log,
            index,
            settled: false,
        }
    }

    /// The handler ran to its end.
    pub(super) fn finish(mut self) {
        self.settled = true;
        self.log.update(self.index, |call| call.finished = true);
    }

    /// The handler saw the client go away (its request stream broke).
    pub(super) fn cancel(mut self) {
        self.settled = true;
        self.log.update(self.index, |call| call.cancelled = true);
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.settled {
            self.log.update(self.index, |call| call.cancelled = true);
        }
    }
}
