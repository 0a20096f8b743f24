//! Caps on long answers that hold memory or a database reader while they
//! run (the console's exports, the audit streams): at most so many at once
//! on this replica, and so many per person, so that one auditor (or one
//! stolen session or token) cannot take them all. Memory is per process,
//! so the caps are per replica.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The slots of one kind of answer.
#[derive(Debug)]
pub struct Slots {
    total: usize,
    per_identity: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_identity: HashMap<String, usize>,
    /// No more slots are given (shutdown).
    closed: bool,
}

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Every slot of this replica is taken.
    Total,
    /// This identity holds its share.
    Identity,
    /// The server is shutting down.
    Closed,
}

impl Slots {
    /// `total` slots, at most `per_identity` of them for one identity.
    pub fn new(total: usize, per_identity: usize) -> Arc<Self> {
        Arc::new(Self {
            total,
            per_identity,
            held: Mutex::new(Held::default()),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for `identity` (a qualified subject), given back when the
    /// [`Slot`] is dropped.
    pub fn take(self: &Arc<Self>, identity: &str) -> Result<Slot, Full> {
        let mut held = self.held();
        if held.closed {
            return Err(Full::Closed);
        }
        let mine = held.by_identity.get(identity).copied().unwrap_or(0);
        if mine >= self.per_identity {
            return Err(Full::Identity);
        }
        if held.total >= self.total {
            return Err(Full::Total);
        }
        held.total += 1;
        held.by_identity.insert(identity.to_owned(), mine + 1);
        Ok(Slot {
            slots: self.clone(),
            identity: identity.to_owned(),
        })
    }

    /// Give no more slots.
    pub fn close(&self) {
        self.held().closed = true;
    }

    /// Slots taken now.
    pub fn in_use(&self) -> usize {
        self.held().total
    }
}

/// A slot taken; given back when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    identity: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.held();
        held.total = held.total.saturating_sub(1);
        if let Some(count) = held.by_identity.get_mut(&self.identity) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.by_identity.remove(&self.identity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_identity_gets_its_share_and_the_replica_its_total() {
        let slots = Slots::new(3, 2);
        let a1 = slots.take("a").expect("first");
        let _a2 = slots.take("a").expect("second");
        assert_eq!(slots.take("a").unwrap_err(), Full::Identity);
        let _b1 = slots.take("b").expect("another identity");
        assert_eq!(slots.take("c").unwrap_err(), Full::Total);
        drop(a1);
        assert_eq!(slots.in_use(), 2);
        let _c1 = slots.take("c").expect("a slot given back is free again");
        slots.close();
        assert_eq!(slots.take("d").unwrap_err(), Full::Closed);
    }
}
