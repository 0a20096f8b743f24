//! The audit trail: one record per decision, hash-chained, append-only.
//!
//! - this module: the record, its canonical encoding and hash, and the chain
//!   check shared by both stores;
//! - `store`: Postgres and SQLite behind one type, append in batches, read back;
//! - `writer`: group commit, so that many concurrent requests share one
//!   transaction (and one fsync) while each still waits for its own commit.
//!
//! Canonical encoding: a JSON object of every field except `hash`, keys in
//! byte order, no whitespace, times as RFC 3339 UTC with exactly six
//! fractional digits, absent values as `null`. `hash` = hex SHA-256 of that
//! encoding; `prev_hash` of the first record is 64 zeros. Changing any field,
//! removing a record or reordering records breaks the chain at that point.

pub mod store;
pub mod text;
pub mod writer;

use serde::Serialize;
use serde_json::{Map, Value, json};
use time::OffsetDateTime;

/// `prev_hash` of the first record.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What happened.
pub mod event {
    pub const CERTIFICATE_ISSUED: &str = "certificate.issued";
    pub const CERTIFICATE_DENIED: &str = "certificate.denied";
    pub const BREAK_GLASS_ISSUED: &str = "break_glass.issued";
    /// An identity was added to or removed from the deny list.
    pub const DENY_ADDED: &str = "deny.added";
    pub const DENY_REMOVED: &str = "deny.removed";
    /// Someone tried to read the deny list (recorded when refused).
    pub const DENY_LISTED: &str = "deny.listed";
    /// The trail itself was read (listed, exported or verified) through the API.
    pub const AUDIT_QUERY: &str = "audit.query";
    /// The database refused a record: this one stands in for it (the
    /// request was refused).
    pub const RECORD_REFUSED: &str = "audit.record_refused";
    /// Refusals of unauthenticated or rate-limited requests from one client
    /// address, counted over a window instead of recorded one by one.
    pub const REFUSALS_AGGREGATED: &str = "refusals.aggregated";

    /// Every event a record can have (what an `event` filter may name).
    pub const ALL: [&str; 9] = [
        CERTIFICATE_ISSUED,
        CERTIFICATE_DENIED,
        BREAK_GLASS_ISSUED,
        DENY_ADDED,
        DENY_REMOVED,
        DENY_LISTED,
        AUDIT_QUERY,
        RECORD_REFUSED,
        REFUSALS_AGGREGATED,
    ];
}

pub mod outcome {
    pub const SUCCESS: &str = "success";
    pub const DENIED: &str = "denied";
    /// Every outcome (what an `outcome` filter may name).
    pub const ALL: [&str; 2] = [SUCCESS, DENIED];
}

/// One decision, before it gets its place in the chain.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditRecord {
    #[serde(with = "micros")]
    pub occurred_at: OffsetDateTime,
    pub request_id: String,
    pub event: String,
    pub outcome: String,
    /// The stable error code of a denial.
    pub reason_code: Option<String>,
    pub cluster: Option<String>,
    pub issuer: Option<String>,
    pub tenant: Option<String>,
    /// Entra `oid`, else `sub`.
    pub subject: Option<String>,
    pub username: Option<String>,
    /// False when the identity fields come from a token that failed
    /// verification (recorded for investigation, never trusted).
    pub identity_verified: bool,
    pub groups_evaluated: Vec<String>,
    pub roles_requested: Vec<String>,
    pub roles_granted: Vec<String>,
    pub serial: Option<String>,
    pub certificate_sha256: Option<String>,
    pub public_key_sha256: Option<String>,
    #[serde(with = "micros_option")]
    pub not_before: Option<OffsetDateTime>,
    #[serde(with = "micros_option")]
    pub not_after: Option<OffsetDateTime>,
    pub client_ip: Option<String>,
    pub user_agent: Option<String>,
    pub client_version: Option<String>,
    /// `uti` / `jti` of a verified token (or the claimed one of a refused
    /// token); empty when it has neither (the replay guard then keys on a
    /// hash of what the signature covers, which is not recorded).
    pub token_id: Option<String>,
    #[serde(with = "micros_option")]
    pub token_issued_at: Option<OffsetDateTime>,
    /// Event-specific facts (break-glass operator and reason, ...).
    pub details: Value,
}

impl Default for AuditRecord {
    fn default() -> Self {
        Self::new("", "", "", OffsetDateTime::UNIX_EPOCH)
    }
}

impl AuditRecord {
    /// An empty record of `event` at `at` (microsecond precision, as stored).
    pub fn new(event: &str, outcome: &str, request_id: &str, at: OffsetDateTime) -> Self {
        Self {
            occurred_at: truncate_to_micros(at),
            request_id: request_id.to_owned(),
            event: event.to_owned(),
            outcome: outcome.to_owned(),
            reason_code: None,
            cluster: None,
            issuer: None,
            tenant: None,
            subject: None,
            username: None,
            identity_verified: false,
            groups_evaluated: Vec::new(),
            roles_requested: Vec::new(),
            roles_granted: Vec::new(),
            serial: None,
            certificate_sha256: None,
            public_key_sha256: None,
            not_before: None,
            not_after: None,
            client_ip: None,
            user_agent: None,
            client_version: None,
            token_id: None,
            token_issued_at: None,
            details: json!({}),
        }
    }

    /// The record written instead of an action refused at commit time
    /// (`token_replayed`, `identity_denied`): an issuance becomes a
    /// `certificate.denied` that names no certificate (it was never sent);
    /// other events keep their name with outcome `denied`.
    pub fn into_denial(mut self, reason: &str) -> Self {
        if self.event == event::CERTIFICATE_ISSUED {
            self.event = event::CERTIFICATE_DENIED.into();
        }
        self.outcome = outcome::DENIED.into();
        self.reason_code = Some(reason.into());
        self.roles_granted.clear();
        self.serial = None;
        self.certificate_sha256 = None;
        self.public_key_sha256 = None;
        self.not_before = None;
        self.not_after = None;
        self
    }

    /// The stand-in for a record the database refused, and why it stands
    /// in: what the server itself chose, plus (when `with_identity`) who
    /// asked and from where. Without identity it holds no caller-supplied
    /// text at all, for when the identity was what the database refused.
    pub fn refused_by_store(&self, reason: &str, with_identity: bool) -> Self {
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

    /// Name the certificate this record is about.
    pub fn set_certificate(&mut self, issued: &crate::certificate::IssuedCertificate) {
        self.roles_granted = issued.roles.clone();
        self.serial = Some(issued.serial_hex.clone());
        self.certificate_sha256 = Some(issued.certificate_sha256.clone());
        self.public_key_sha256 = Some(issued.public_key_sha256.clone());
        self.not_before = Some(issued.not_before);
        self.not_after = Some(issued.not_after);
    }

    /// The record as the stores keep it: times to microseconds, and every
    /// text field escaped and bounded ([`text`]), whatever its source, so
    /// that no record can be refused by the database or hold text that
    /// misleads whoever reads it.
    pub fn normalised(mut self) -> Self {
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

/// A record in the chain.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredRecord {
    pub seq: i64,
    #[serde(flatten)]
    pub record: AuditRecord,
    pub prev_hash: String,
    pub hash: String,
}

pub fn truncate_to_micros(t: OffsetDateTime) -> OffsetDateTime {
    let micros = t.microsecond();
    t.replace_nanosecond(micros * 1000).unwrap_or(t)
}

/// RFC 3339 UTC with six fractional digits: the one text form of a time.
pub fn format_micros(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

pub fn parse_micros(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
}

mod micros {
    use serde::Serializer;
    use time::OffsetDateTime;
    pub fn serialize<S: Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_micros(*t))
    }
}

mod micros_option {
    use serde::Serializer;
    use time::OffsetDateTime;
    pub fn serialize<S: Serializer>(t: &Option<OffsetDateTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&super::format_micros(*t)),
            None => s.serialize_none(),
        }
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenLink {
    pub seq: i64,
    pub reason: String,
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

/// The system's random number generator failed: nothing that needs a
/// random value may go on with a predictable one instead.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the system random number generator failed")]
pub struct RandomError;

/// Random lowercase hex (request ids, test names).
pub fn random_hex(bytes: usize) -> Result<String, RandomError> {
    let mut buf = vec![0u8; bytes];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut buf).map_err(|_| RandomError)?;
    Ok(hex::encode(buf))
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
