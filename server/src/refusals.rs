//! Refusals nobody authenticated for, kept bounded. The audit trail is
//! append-only, so a record per refused anonymous or rate-limited request
//! would let anyone fill it at line rate. Instead, per window and per
//! (client address, event, reason), the first refusal is recorded in full
//! and the rest are only counted; when the window closes, one
//! `refusals.aggregated` record carries the count and the first and last
//! time. Keys per window are capped too: past `max_keys`, further addresses
//! share one key per (event, reason) with the address `*`, so the rows a
//! window can add do not depend on how many addresses an attacker has: at
//! most two per key, `2 × (max_keys + events × reasons)`.
//!
//! Authenticated decisions never come through here: each keeps its own
//! record.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;
use time::OffsetDateTime;

use crate::audit::{AuditRecord, event, outcome};
use crate::config::RefusalConfig;

/// The address all addresses past the cap share.
pub const OTHER_ADDRESSES: &str = "*";

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    address: String,
    event: String,
    reason: String,
}

#[derive(Debug)]
struct Tally {
    /// Refusals after the recorded first one.
    further: u64,
    first_at: OffsetDateTime,
    last_at: OffsetDateTime,
    first_request_id: String,
}

/// What to do with one refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The first of its kind in this window: record it in full.
    Record,
    /// Counted; recorded with the others when the window closes.
    Counted,
}

#[derive(Debug, Default)]
struct Window {
    tallies: HashMap<Key, Tally>,
    /// Keys with an address of their own (not `*`) in this window.
    own_keys: usize,
}

#[derive(Debug)]
pub struct Refusals {
    config: RefusalConfig,
    window: Mutex<Window>,
}

impl Refusals {
    pub fn new(config: RefusalConfig) -> Self {
        Self {
            config,
            window: Mutex::new(Window::default()),
        }
    }

    pub fn window(&self) -> Duration {
        self.config.window
    }

    /// Note a refusal of `record` (event, reason code and client address
    /// already set) from the client at `address_key`.
    pub fn admit(&self, address_key: Option<&str>, record: &AuditRecord) -> Admission {
        let Ok(mut window) = self.window.lock() else {
            return Admission::Record;
        };
        let mut key = Key {
            address: address_key.unwrap_or(OTHER_ADDRESSES).to_owned(),
            event: record.event.clone(),
            reason: record.reason_code.clone().unwrap_or_default(),
        };
        let window = &mut *window;
        if key.address != OTHER_ADDRESSES && !window.tallies.contains_key(&key) {
            if window.own_keys >= self.config.max_keys {
                key.address = OTHER_ADDRESSES.to_owned();
            } else {
                window.own_keys += 1;
            }
        }
        match window.tallies.get_mut(&key) {
            Some(tally) => {
                tally.further += 1;
                tally.last_at = tally.last_at.max(record.occurred_at);
                Admission::Counted
            }
            None => {
                window.tallies.insert(
                    key,
                    Tally {
                        further: 0,
                        first_at: record.occurred_at,
                        last_at: record.occurred_at,
                        first_request_id: record.request_id.clone(),
                    },
                );
                Admission::Record
            }
        }
    }

    /// Close the window: the summary records of every key that counted
    /// refusals beyond its first, and a fresh window.
    pub fn close_window(&self, now: OffsetDateTime) -> Vec<AuditRecord> {
        let closed = match self.window.lock() {
            Ok(mut window) => std::mem::take(&mut *window),
            Err(_) => return Vec::new(),
        };
        let mut summaries: Vec<AuditRecord> = closed
            .tallies
            .into_iter()
            .filter(|(_, tally)| tally.further > 0)
            .map(|(key, tally)| {
                // Named after the refusal recorded in full, which it continues.
                let request_id = format!("{}.more", tally.first_request_id);
                let mut record =
                    AuditRecord::new(event::REFUSALS_AGGREGATED, outcome::DENIED, &request_id, now);
                record.reason_code = Some(key.reason);
                record.client_ip = Some(key.address);
                record.details = json!({
                    "event": key.event,
                    "count": tally.further,
                    "first_at": crate::audit::format_micros(tally.first_at),
                    "last_at": crate::audit::format_micros(tally.last_at),
                    "recorded_first": tally.first_request_id,
                    "window_seconds": self.config.window.as_secs(),
                });
                record
            })
            .collect();
        summaries.sort_by(|a, b| a.client_ip.cmp(&b.client_ip));
        summaries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn refusal(reason: &str, n: u32) -> AuditRecord {
        let mut r = AuditRecord::new(
            event::CERTIFICATE_DENIED,
            outcome::DENIED,
            &format!("req-{n}"),
            datetime!(2026-12-01 10:00:00 UTC) + time::Duration::seconds(n.into()),
        );
        r.reason_code = Some(reason.into());
        r
    }

    #[test]
    fn the_first_is_recorded_the_rest_counted_then_summarised() {
        let refusals = Refusals::new(RefusalConfig::default());
        assert_eq!(
            refusals.admit(Some("203.0.113.7"), &refusal("token_missing", 0)),
            Admission::Record
        );
        for n in 1..=99 {
            assert_eq!(
                refusals.admit(Some("203.0.113.7"), &refusal("token_missing", n)),
                Admission::Counted
            );
        }
        // Another reason, another address: their own first records.
        assert_eq!(
            refusals.admit(Some("203.0.113.7"), &refusal("token_malformed", 0)),
            Admission::Record
        );
        assert_eq!(
            refusals.admit(Some("198.51.100.1"), &refusal("token_missing", 0)),
            Admission::Record
        );
        let summaries = refusals.close_window(datetime!(2026-12-01 10:01:00 UTC));
        assert_eq!(summaries.len(), 1, "only keys that counted more than their first");
        let s = &summaries[0];
        assert_eq!(s.event, event::REFUSALS_AGGREGATED);
        assert_eq!(s.client_ip.as_deref(), Some("203.0.113.7"));
        assert_eq!(s.reason_code.as_deref(), Some("token_missing"));
        assert_eq!(s.details["count"], 99);
        assert_eq!(s.details["first_at"], "2026-12-01T10:00:00.000000Z");
        assert_eq!(s.details["last_at"], "2026-12-01T10:01:39.000000Z");
        assert_eq!(s.details["recorded_first"], "req-0");
        // A new window starts empty.
        assert_eq!(
            refusals.admit(Some("203.0.113.7"), &refusal("token_missing", 0)),
            Admission::Record
        );
    }

    #[test]
    fn keys_past_the_cap_share_one_address() {
        let refusals = Refusals::new(RefusalConfig {
            window: Duration::from_secs(60),
            max_keys: 3,
        });
        let mut recorded = 0;
        for a in 0..1000 {
            let address = format!("10.0.{}.{}", a / 256, a % 256);
            if refusals.admit(Some(&address), &refusal("token_missing", a)) == Admission::Record {
                recorded += 1;
            }
        }
        assert_eq!(recorded, 4, "three addresses, then one shared key");
        let summaries = refusals.close_window(datetime!(2026-12-01 10:01:00 UTC));
        assert_eq!(summaries.len(), 1);
        assert_eq!(summaries[0].client_ip.as_deref(), Some(OTHER_ADDRESSES));
        assert_eq!(summaries[0].details["count"], 996);
    }
}
