//! The audit trail: one record per decision, hash-chained, append-only.
//!
//! - this module: what the server does with a record ([`RecordExt`]), the
//!   canonical encoding and hash, and the chain check shared by both stores;
//! - `store`: one type in front of Postgres (`store::postgres`) and SQLite
//!   (`store::sqlite`): append in batches (replay guard, deny list, chain),
//!   read back, migrate;
//! - `writer`: group commit, so that many concurrent requests share one
//!   transaction (and one fsync) while each still waits for its own commit;
//! - `recorder`: what commits one decision (the writer, or the store for
//!   one-off commands);
//! - `text`: escaping and bounding every text a record holds.
//!
//! The record type itself is the API's ([`talos_sso_api::audit`]).
//!
//! Canonical encoding: a JSON object of every field except `hash`, keys in
//! byte order, no whitespace, times as RFC 3339 UTC with exactly six
//! fractional digits, absent values as `null`. `hash` = hex SHA-256 of that
//! encoding; `prev_hash` of the first record is 64 zeros. Changing any field,
//! removing a record or reordering records breaks the chain at that point.

pub mod recorder;
pub mod store;
pub mod text;
pub mod writer;

use serde_json::{Map, Value, json};

/// `prev_hash` of the first record.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The record, its events and outcomes and its time format are part of the
/// API (`GET /v1/audit` serves records as they are hashed).
pub use talos_sso_api::audit::{
    AuditRecord, BrokenLink, StoredRecord, event, format_micros, outcome, parse_micros, truncate_to_micros,
};

/// What the server does with a record beyond the API's view of it.
pub trait RecordExt: Sized {
    /// The stand-in for a record the database refused, and why it stands
    /// in: what the server itself chose, plus (when `with_identity`) who
    /// asked and from where. Without identity it holds no caller-supplied
    /// text at all, for when the identity was what the database refused.
    fn refused_by_store(&self, reason: &str, with_identity: bool) -> Self;

    /// Name the certificate this record is about.
    fn set_certificate(&mut self, issued: &crate::certificate::IssuedCertificate);

    /// The record as the stores keep it: times to microseconds, and every
    /// text field escaped and bounded ([`text`]), whatever its source, so
    /// that no record can be refused by the database or hold text that
    /// misleads whoever reads it.
    fn normalised(self) -> Self;
}

impl RecordExt for AuditRecord {
    fn refused_by_store(&self, reason: &str, with_identity: bool) -> Self {
        let mut record = Self::new(
            event::RECORD_REFUSED,
            outcome::DENIED,
            &self.request_id,
            self.occurred_at,
        );
        record.reason_code = Some("audit_record_refused".into());
        record.cluster = self.cluster.clone();
        record.identity_verified = self.identity_verified;
        if with_identity {
            record.issuer = self.issuer.clone();
            record.tenant = self.tenant.clone();
            record.subject = self.subject.clone();
            record.username = self.username.clone();
            record.client_ip = self.client_ip.clone();
        }
        record.details = json!({
            "event": self.event,
            "outcome": self.outcome,
            "reason_code": self.reason_code,
            "database_error": reason,
        });
        record
    }

    fn set_certificate(&mut self, issued: &crate::certificate::IssuedCertificate) {
        self.roles_granted = issued.roles.clone();
        self.serial = Some(issued.serial_hex.clone());
        self.certificate_sha256 = Some(issued.certificate_sha256.clone());
        self.public_key_sha256 = Some(issued.public_key_sha256.clone());
        self.not_before = Some(issued.not_before);
        self.not_after = Some(issued.not_after);
    }

    fn normalised(mut self) -> Self {
        self.occurred_at = truncate_to_micros(self.occurred_at);
        self.not_before = self.not_before.map(truncate_to_micros);
        self.not_after = self.not_after.map(truncate_to_micros);
        self.token_issued_at = self.token_issued_at.map(truncate_to_micros);
        let field = |value: &mut String| *value = text::clean_field(value);
        let optional = |value: &mut Option<String>| {
            if let Some(v) = value {
                *v = text::clean_field(v);
            }
        };
        field(&mut self.request_id);
        field(&mut self.event);
        field(&mut self.outcome);
        for value in [
            &mut self.reason_code,
            &mut self.cluster,
            &mut self.issuer,
            &mut self.tenant,
            &mut self.subject,
            &mut self.username,
            &mut self.serial,
            &mut self.certificate_sha256,
            &mut self.public_key_sha256,
            &mut self.client_ip,
            &mut self.user_agent,
            &mut self.client_version,
            &mut self.token_id,
        ] {
            optional(value);
        }
        for list in [
            &mut self.groups_evaluated,
            &mut self.roles_requested,
            &mut self.roles_granted,
        ] {
            *list = text::clean_list(list);
        }
        self.details = text::clean_json(std::mem::take(&mut self.details));
        self
    }
}

/// Sort object keys at every level (serde_json's map is ordered by key unless
/// its `preserve_order` feature is on; this does not depend on that).
fn canonical_value(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, canonical_value(v)))
                    .collect::<Map<_, _>>(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonical_value).collect()),
        other => other,
    }
}

/// The bytes that are hashed for a record at `seq` after `prev_hash`.
pub fn canonical_encoding(seq: i64, record: &AuditRecord, prev_hash: &str) -> Vec<u8> {
    let mut value = serde_json::to_value(record).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.insert("seq".into(), json!(seq));
        map.insert("prev_hash".into(), json!(prev_hash));
    }
    serde_json::to_vec(&canonical_value(value)).unwrap_or_default()
}

pub fn record_hash(seq: i64, record: &AuditRecord, prev_hash: &str) -> String {
    hex::encode(ring::digest::digest(
        &ring::digest::SHA256,
        &canonical_encoding(seq, record, prev_hash),
    ))
}

/// Place a record after (`prev_seq`, `prev_hash`).
pub fn chain(prev_seq: i64, prev_hash: &str, record: AuditRecord) -> StoredRecord {
    let seq = prev_seq + 1;
    let hash = record_hash(seq, &record, prev_hash);
    StoredRecord {
        seq,
        record,
        prev_hash: prev_hash.to_owned(),
        hash,
    }
}

/// Where a chain check stands after some records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainCheck {
    pub verified: u64,
    pub last_seq: i64,
    pub last_hash: String,
    pub first_broken: Option<BrokenLink>,
}

impl Default for ChainCheck {
    fn default() -> Self {
        Self {
            verified: 0,
            last_seq: 0,
            last_hash: GENESIS_HASH.into(),
            first_broken: None,
        }
    }
}

impl ChainCheck {
    /// Check the next record; stops counting at the first broken link.
    pub fn feed(&mut self, stored: &StoredRecord) {
        if self.first_broken.is_some() {
            return;
        }
        let broken = if stored.seq != self.last_seq + 1 {
            Some(format!(
                "expected record {} next, found {}: records are missing",
                self.last_seq + 1,
                stored.seq
            ))
        } else if stored.prev_hash != self.last_hash {
            Some("its prev_hash is not the hash of the record before it".to_owned())
        } else if record_hash(stored.seq, &stored.record, &stored.prev_hash) != stored.hash {
            Some("its content does not match its hash: it was changed after it was written".to_owned())
        } else {
            None
        };
        match broken {
            Some(reason) => {
                self.first_broken = Some(BrokenLink {
                    seq: stored.seq,
                    reason,
                })
            }
            None => {
                self.verified += 1;
                self.last_seq = stored.seq;
                self.last_hash = stored.hash.clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn record(n: u32) -> AuditRecord {
        let mut r = AuditRecord::new(
            event::CERTIFICATE_ISSUED,
            outcome::SUCCESS,
            &format!("req-{n}"),
            datetime!(2026-11-29 10:00:00.123456789 UTC),
        );
        r.cluster = Some("prod".into());
        r.roles_granted = vec!["os:admin".into()];
        r.details = json!({"zeta": 1, "alpha": {"b": 2, "a": 1}});
        r
    }

    #[test]
    fn canonical_encoding_is_sorted_compact_and_microsecond() {
        let text = String::from_utf8(canonical_encoding(7, &record(1), GENESIS_HASH)).unwrap();
        assert!(text.starts_with(r#"{"certificate_sha256":null,"client_ip":null,"client_version":null,"cluster":"prod","details":{"alpha":{"a":1,"b":2},"zeta":1},"event":"certificate.issued""#), "{text}");
        assert!(
            text.contains(r#""occurred_at":"2026-11-29T10:00:00.123456Z""#),
            "{text}"
        );
        assert!(text.contains(r#""seq":7"#) && !text.contains(' '));
    }

    #[test]
    fn the_chain_names_the_first_broken_record() {
        let mut stored = Vec::new();
        let (mut seq, mut hash) = (0, GENESIS_HASH.to_owned());
        for n in 0..5 {
            let s = chain(seq, &hash, record(n));
            seq = s.seq;
            hash = s.hash.clone();
            stored.push(s);
        }
        let check = |records: &[StoredRecord]| {
            let mut c = ChainCheck::default();
            records.iter().for_each(|r| c.feed(r));
            c
        };
        assert_eq!(check(&stored).verified, 5);
        assert!(check(&stored).first_broken.is_none());

        let mut tampered = stored.clone();
        tampered[2].record.roles_granted = vec!["os:reader".into()];
        let c = check(&tampered);
        assert_eq!((c.verified, c.first_broken.unwrap().seq), (2, 3));

        let mut missing = stored.clone();
        missing.remove(1);
        assert_eq!(check(&missing).first_broken.unwrap().seq, 3);

        let mut rehashed = stored.clone();
        rehashed[3].record.username = Some("mallory".into());
        rehashed[3].hash = record_hash(4, &rehashed[3].record, &rehashed[3].prev_hash);
        // Re-hashing the changed record breaks the link to the next one.
        assert_eq!(check(&rehashed).first_broken.unwrap().seq, 5);
    }

    #[test]
    fn a_replay_denial_names_no_certificate() {
        let mut r = record(1);
        r.serial = Some("01".into());
        r.certificate_sha256 = Some("aa".into());
        let denied = r.into_denial("token_replayed");
        assert_eq!(
            (denied.event.as_str(), denied.reason_code.as_deref()),
            ("certificate.denied", Some("token_replayed"))
        );
        assert!(
            denied.serial.is_none() && denied.certificate_sha256.is_none() && denied.roles_granted.is_empty()
        );
    }
}
