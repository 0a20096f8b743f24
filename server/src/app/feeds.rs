//! The audit streams of one server (`GET /v1/audit/stream`, served by
//! `http::feed`): how many may run, and the signal that ends them all at
//! shutdown.

use std::sync::Arc;

use tokio::sync::watch;

use crate::config::FeedConfig;
use crate::slots::{Full, Slot, Slots};

/// The streams of one server: how many may run (in all and per caller,
/// fixed at start), and the signal that ends them all at shutdown.
#[derive(Debug)]
pub struct Feeds {
    slots: Arc<Slots>,
    stopping: watch::Sender<bool>,
}

impl Feeds {
    pub fn new(config: &FeedConfig) -> Self {
        Self {
            slots: Slots::new(config.max_streams, config.max_streams_per_identity),
            stopping: watch::Sender::new(false),
        }
    }

    /// Streams running now.
    pub fn running(&self) -> usize {
        self.slots.in_use()
    }

    /// A slot for a stream of `identity`, or why there is none.
    pub fn take(&self, identity: &str) -> Result<Slot, Full> {
        self.slots.take(identity)
    }

    /// Changes to `true` when the server shuts down: every stream ends.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    /// End every stream (each says `shutting_down`), and refuse new ones.
    pub fn shut_down(&self) {
        self.stopping.send_replace(true);
        self.slots.close();
    }
}
