//! The hash chain of the audit trail, as anyone can recompute it: the
//! canonical encoding of a record, its hash, and the check of a run of
//! records against each other and against signed checkpoints
//! ([`crate::checkpoint`]). The server writes the chain with these
//! functions, and the CLI verifies an export with them, without a server,
//! taking only the lines the server writes ([`read_record_line`]).
//!
//! Canonical encoding ([RFC 8785], the JSON Canonicalization Scheme): the
//! record as a JSON object of every field except `hash` (`seq` and
//! `prev_hash` included), absent values as `null`, times as RFC 3339 UTC
//! with exactly six fractional digits; keys sorted by their UTF-16 code
//! units, no whitespace, strings with only `"`, `\` and control characters
//! escaped, numbers in their shortest ECMAScript form. `hash` is the
//! lowercase hex SHA-256 of those bytes; `prev_hash` of the first record is
//! 64 zeros. Every number the server writes is an integer of at most 2^53 in
//! magnitude, so it reads back as itself in any JSON implementation
//! (larger ones are kept as strings). docs/audit.md specifies the same, for
//! people who implement it elsewhere.
//!
//! [RFC 8785]: https://www.rfc-editor.org/rfc/rfc8785

use std::collections::VecDeque;

use serde_json::{Value, json};

use crate::audit::{AuditRecord, BrokenLink, StoredRecord, format_micros};
use crate::canonical::{CanonicalObject, only_safe_integers};
pub use crate::canonical::{MAX_SAFE_INTEGER, canonical_json, is_safe_integer, sha256_hex};
use crate::checkpoint::Checkpoint;
pub use crate::checkpoint::CheckpointCoverage;
use crate::exact_line::{ExactLineError, OTHER_FORMS, read_exact_line};

/// `prev_hash` of the first record.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The bytes that are hashed for `record` at `seq` after `prev_hash`.
///
/// Written field by field, in the canonical order of the keys, rather than
/// by turning the record into a `serde_json::Value` and canonicalising
/// that: the server hashes every record while it holds the chain lock, and
/// the general route costs about ten times as many instructions
/// (docs/evidence/performance.md). [`canonical_encoding_by_value`] is that route,
/// kept as the definition: the tests and the `audit_encoding` fuzz target
/// check that both give the same bytes.
pub fn canonical_encoding(seq: i64, record: &AuditRecord, prev_hash: &str) -> Vec<u8> {
    if seq.unsigned_abs() > MAX_SAFE_INTEGER {
        // RFC 8785 writes it as the nearest double; the general route knows how.
        return canonical_encoding_by_value(seq, record, prev_hash);
    }
    let r = record;
    let mut out = CanonicalObject::with_capacity(1024);
    // RFC 8785 sorts keys by their UTF-16 code units; these are ASCII, so
    // by their bytes.
    out.optional("certificate_sha256", r.certificate_sha256.as_deref());
    out.optional("client_ip", r.client_ip.as_deref());
    out.optional("client_version", r.client_version.as_deref());
    out.optional("cluster", r.cluster.as_deref());
    if !out.details("details", &r.details) {
        return canonical_encoding_by_value(seq, record, prev_hash);
    }
    out.string("event", &r.event);
    out.list("groups_evaluated", &r.groups_evaluated);
    out.raw(
        "identity_verified",
        if r.identity_verified { "true" } else { "false" },
    );
    out.optional("issuer", r.issuer.as_deref());
    out.time("not_after", r.not_after);
    out.time("not_before", r.not_before);
    out.time("occurred_at", Some(r.occurred_at));
    out.string("outcome", &r.outcome);
    out.string("prev_hash", prev_hash);
    out.optional("public_key_sha256", r.public_key_sha256.as_deref());
    out.optional("reason_code", r.reason_code.as_deref());
    out.string("request_id", &r.request_id);
    out.list("roles_granted", &r.roles_granted);
    out.list("roles_requested", &r.roles_requested);
    out.raw("seq", &seq.to_string());
    out.optional("serial", r.serial.as_deref());
    out.optional("subject", r.subject.as_deref());
    out.optional("tenant", r.tenant.as_deref());
    out.optional("token_id", r.token_id.as_deref());
    out.time("token_issued_at", r.token_issued_at);
    out.optional("user_agent", r.user_agent.as_deref());
    out.optional("username", r.username.as_deref());
    out.finish()
}

/// The same bytes as [`canonical_encoding`], by the general route: the
/// record serialised to a JSON object with `seq` and `prev_hash` added,
/// then canonicalised by an RFC 8785 implementation. What the encoding
/// is; slower.
pub fn canonical_encoding_by_value(seq: i64, record: &AuditRecord, prev_hash: &str) -> Vec<u8> {
    let mut value = serde_json::to_value(record).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.insert("seq".into(), json!(seq));
        map.insert("prev_hash".into(), json!(prev_hash));
    }
    canonical_json(&value)
}

/// Why a line of an export is not a record the server wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("not UTF-8")]
    NotUtf8,
    /// Why the JSON reader refused it, as [`printable`] quotes a file.
    #[error("not an audit record ({0})")]
    NotARecord(String),
    #[error("record {seq} is not in the form the server writes ({OTHER_FORMS})")]
    NotServerForm { seq: i64 },
    #[error(
        "record {seq} holds a number that is not an integer of at most 2^53 - 1 in magnitude, which the server \
         never writes"
    )]
    Number { seq: i64 },
}

/// The record of one export line, `None` for an empty line.
///
/// A line is a record only when its bytes, the final `\n` aside, are
/// exactly [`StoredRecord::to_line`] of the record it reads as. JSON lets
/// one value be written many ways, and readers disagree on some of them: a
/// key given twice is the last one to serde_json and Python, the first one
/// to others, so a fake `username` placed before the real one would verify
/// here and be what another tool shows. Comparing bytes with the one form
/// the server writes refuses all of them at once, with no list of tricks
/// to keep up to date. Numbers are integers of at most 2^53 - 1 in
/// magnitude (the server keeps any other as a string): any reader writes
/// those alike, and the canonical encoding reads them exactly.
pub fn read_record_line(line: &[u8]) -> Result<Option<StoredRecord>, LineError> {
    let Some(stored) = read_exact_line(line, StoredRecord::to_line)? else {
        return Ok(None);
    };
    if !only_safe_integers(&stored.record.details) {
        return Err(LineError::Number { seq: stored.seq });
    }
    Ok(Some(stored))
}

impl From<ExactLineError<StoredRecord>> for LineError {
    fn from(error: ExactLineError<StoredRecord>) -> Self {
        match error {
            ExactLineError::NotUtf8 => LineError::NotUtf8,
            ExactLineError::NotJson(reason) => LineError::NotARecord(reason),
            ExactLineError::OtherForm(stored) => LineError::NotServerForm { seq: stored.seq },
        }
    }
}

pub fn record_hash(seq: i64, record: &AuditRecord, prev_hash: &str) -> String {
    sha256_hex(&canonical_encoding(seq, record, prev_hash))
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
    /// Checkpoints not reached yet, by `seq`.
    pending: VecDeque<Checkpoint>,
    coverage: Option<CheckpointCoverage>,
}

impl Default for ChainCheck {
    fn default() -> Self {
        Self::after(0, GENESIS_HASH)
    }
}

impl ChainCheck {
    /// A check of records from `seq + 1` on, the record at `seq` having
    /// `hash` (`0` and [`GENESIS_HASH`] for a whole trail).
    pub fn after(seq: i64, hash: &str) -> Self {
        Self {
            verified: 0,
            last_seq: seq,
            last_hash: hash.to_owned(),
            first_broken: None,
            pending: VecDeque::new(),
            coverage: None,
        }
    }

    /// Also check every record a checkpoint names against the hash it
    /// signed (their signatures are checked already: [`crate::checkpoint`]).
    /// A checkpoint at the starting point must sign its hash.
    pub fn with_checkpoints(mut self, mut checkpoints: Vec<Checkpoint>) -> Self {
        checkpoints.sort_by_key(|c| c.seq);
        let mut coverage = CheckpointCoverage {
            matched: 0,
            last: None,
            records_after_last: 0,
            before_first: 0,
        };
        for checkpoint in checkpoints {
            if checkpoint.seq < self.last_seq {
                coverage.before_first += 1;
            } else if checkpoint.seq == self.last_seq {
                if checkpoint.hash == self.last_hash {
                    coverage.matched += 1;
                    coverage.last = Some(checkpoint);
                } else if self.first_broken.is_none() {
                    self.first_broken = Some(mismatch(&checkpoint, coverage.last.as_ref(), self.last_seq));
                }
            } else {
                self.pending.push_back(checkpoint);
            }
        }
        self.coverage = Some(coverage);
        self
    }

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
        if let Some(reason) = broken {
            self.first_broken = Some(BrokenLink {
                seq: stored.seq,
                reason,
                checkpoint: None,
            });
            return;
        }
        self.verified += 1;
        self.last_seq = stored.seq;
        self.last_hash = stored.hash.clone();
        let Some(coverage) = self.coverage.as_mut() else {
            return;
        };
        coverage.records_after_last += 1;
        while self.pending.front().is_some_and(|c| c.seq == stored.seq) {
            let Some(checkpoint) = self.pending.pop_front() else {
                break;
            };
            if checkpoint.hash != stored.hash {
                self.first_broken = Some(mismatch(&checkpoint, coverage.last.as_ref(), stored.seq));
                return;
            }
            coverage.matched += 1;
            coverage.records_after_last = 0;
            coverage.last = Some(checkpoint);
        }
    }

    /// The end of the records: a checkpoint beyond the last one means
    /// records were removed from the end of the trail.
    pub fn finish(&mut self) {
        if self.first_broken.is_some() {
            return;
        }
        if let Some(checkpoint) = self.pending.iter().max_by_key(|c| c.seq) {
            self.first_broken = Some(BrokenLink {
                seq: self.last_seq + 1,
                reason: format!(
                    "records {} to {} are missing: the trail ends at record {}, but a checkpoint signed by {} \
                     at {} covers {} records",
                    self.last_seq + 1,
                    checkpoint.seq,
                    self.last_seq,
                    checkpoint.server,
                    format_micros(checkpoint.signed_at),
                    checkpoint.seq,
                ),
                checkpoint: Some(checkpoint.clone()),
            });
        }
    }

    /// How far checkpoints vouch for what was checked; `None` when the
    /// check had none.
    pub fn coverage(&self) -> Option<&CheckpointCoverage> {
        self.coverage.as_ref()
    }
}

impl ChainCheck {
    /// The answer of `GET /v1/audit/verify` for this finished check.
    pub fn status(&self) -> crate::audit::ChainStatus {
        crate::audit::ChainStatus {
            intact: self.first_broken.is_none(),
            verified: self.verified,
            last_seq: self.last_seq,
            first_broken: self.first_broken.clone(),
            checkpoints: self.coverage.clone(),
        }
    }

    /// Mark the check as failed because the checkpoints themselves could
    /// not be read or did not verify (a changed or forged checkpoint file),
    /// unless the chain broke first.
    pub fn fail_checkpoints(&mut self, error: &crate::checkpoint::CheckpointError) {
        if self.first_broken.is_none() {
            self.first_broken = Some(BrokenLink {
                seq: error.seq().unwrap_or(0),
                reason: format!("the checkpoints cannot be trusted: {error}"),
                checkpoint: None,
            });
        }
    }
}

/// What `audit verify` prints for `status`: `Ok` with the lines for an
/// intact chain, `Err` with the sentence naming the break. Text from the
/// trail or the checkpoints is as found: the caller escapes it for where it
/// goes.
pub fn describe(status: &crate::audit::ChainStatus) -> Result<String, String> {
    if let Some(broken) = &status.first_broken {
        return Err(format!(
            "audit chain broken at record {}: {} ({} records before it verified)",
            broken.seq, broken.reason, status.verified
        ));
    }
    let mut text = if status.verified == 0 {
        "audit chain intact: the trail holds no records yet".to_owned()
    } else {
        format!(
            "audit chain intact: {} records verified, the newest is record {}",
            status.verified, status.last_seq
        )
    };
    match &status.checkpoints {
        None => text.push_str(
            "\nno signed checkpoints: the chain alone cannot show a trail rewritten from some record on, or its \
             newest records removed",
        ),
        Some(CheckpointCoverage {
            last: None, before_first, ..
        }) => {
            text.push_str("\nno signed checkpoint covers these records yet");
            if *before_first > 0 {
                text.push_str(&format!(
                    "\n{before_first} checkpoints name records before the first one checked, and were not used"
                ));
            }
        }
        Some(CheckpointCoverage {
            matched,
            last: Some(last),
            records_after_last,
            before_first,
        }) => {
            text.push_str(&format!(
                "\nnewest signed checkpoint matched: {}, signed by server `{}` at {} {}; {matched} checkpoint{} matched",
                covering(last.seq),
                last.server,
                format_micros(last.signed_at),
                occasion(&last.trigger),
                if *matched == 1 { "" } else { "s" },
            ));
            if *records_after_last > 0 {
                text.push_str(&format!(
                    "\n{records_after_last} records after it are not covered by a checkpoint yet"
                ));
            }
            if *before_first > 0 {
                text.push_str(&format!(
                    "\n{before_first} checkpoints name records before the first one checked, and were not used"
                ));
            }
        }
    }
    Ok(text)
}

/// What a checkpoint of the head at `seq` covers, in words.
fn covering(seq: i64) -> String {
    match seq {
        0 => "the one of the empty trail".to_owned(),
        1 => "the one of record 1".to_owned(),
        n => format!("the one of records 1 to {n}"),
    }
}

/// Why a checkpoint was signed, in words (its `trigger`).
fn occasion(trigger: &str) -> String {
    use crate::checkpoint::trigger;
    match trigger {
        trigger::INTERVAL => "on its schedule".to_owned(),
        trigger::START => "when it started".to_owned(),
        trigger::SHUTDOWN => "when it stopped".to_owned(),
        trigger::REQUEST => "at an auditor's request".to_owned(),
        trigger::COMMAND => "by `talos-sso-server audit checkpoint`".to_owned(),
        other => format!("(trigger `{other}`)"),
    }
}

/// The record at `seq` does not have the hash `checkpoint` signed: some
/// record after the previous matched checkpoint was changed, and every
/// hash after it recomputed (otherwise the chain itself would break).
fn mismatch(checkpoint: &Checkpoint, previous: Option<&Checkpoint>, seq: i64) -> BrokenLink {
    let from = previous.map_or(1, |p| p.seq + 1);
    BrokenLink {
        seq,
        reason: format!(
            "record {seq} does not have the hash the checkpoint signed by {} at {} gives it: a record from {from} \
             to {seq} was changed after that checkpoint was signed, and the hashes after it recomputed",
            checkpoint.server,
            format_micros(checkpoint.signed_at),
        ),
        checkpoint: Some(checkpoint.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{event, outcome};
    use crate::checkpoint::{CHECKPOINT_TYPE, trigger};
    use time::OffsetDateTime;
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

    fn trail(n: u32) -> Vec<StoredRecord> {
        let mut stored: Vec<StoredRecord> = Vec::new();
        for i in 0..n {
            let (seq, hash) = stored
                .last()
                .map_or((0, GENESIS_HASH.to_owned()), |s| (s.seq, s.hash.clone()));
            stored.push(chain(seq, &hash, record(i)));
        }
        stored
    }

    fn check(records: &[StoredRecord], checkpoints: Option<Vec<Checkpoint>>) -> ChainCheck {
        let mut c = ChainCheck::default();
        if let Some(checkpoints) = checkpoints {
            c = c.with_checkpoints(checkpoints);
        }
        records.iter().for_each(|r| c.feed(r));
        c.finish();
        c
    }

    /// A checkpoint as the chain check sees it (signatures are checked
    /// when the file is read, in `checkpoint`).
    fn checkpoint_of(record: &StoredRecord) -> Checkpoint {
        Checkpoint {
            kind: CHECKPOINT_TYPE.into(),
            server: "talos-sso-1".into(),
            seq: record.seq,
            hash: record.hash.clone(),
            signed_at: datetime!(2026-11-29 10:05 UTC),
            trigger: trigger::INTERVAL.into(),
            key_id: "k".into(),
            signature: String::new(),
        }
    }

    /// `audit verify`'s text says what its numbers are: an empty trail as
    /// such, the newest record, and which records the newest checkpoint
    /// covers, by which server and on what occasion.
    #[test]
    fn the_report_names_what_its_numbers_are() {
        let empty = crate::audit::ChainStatus {
            intact: true,
            verified: 0,
            last_seq: 0,
            first_broken: None,
            checkpoints: None,
        };
        let text = describe(&empty).unwrap();
        assert!(
            text.starts_with("audit chain intact: the trail holds no records yet\n"),
            "{text}"
        );
        let mut status = crate::audit::ChainStatus {
            verified: 8,
            last_seq: 8,
            checkpoints: Some(CheckpointCoverage {
                matched: 2,
                last: Some(Checkpoint {
                    seq: 6,
                    ..checkpoint_of(&trail(1)[0])
                }),
                records_after_last: 2,
                before_first: 0,
            }),
            ..empty.clone()
        };
        assert_eq!(
            describe(&status).unwrap(),
            "audit chain intact: 8 records verified, the newest is record 8\n\
             newest signed checkpoint matched: the one of records 1 to 6, signed by server `talos-sso-1` \
             at 2026-11-29T10:05:00.000000Z on its schedule; 2 checkpoints matched\n\
             2 records after it are not covered by a checkpoint yet"
        );
        if let Some(CheckpointCoverage { last: Some(last), .. }) = status.checkpoints.as_mut() {
            last.seq = 0;
            last.trigger = trigger::START.into();
        }
        let text = describe(&status).unwrap();
        assert!(
            text.contains("the one of the empty trail, signed by server `talos-sso-1` at 2026-11-29T10:05:00.000000Z when it started"),
            "{text}"
        );
    }

    /// A record with every field set from `n`: awkward text (quotes,
    /// backslashes, control characters, text beyond ASCII and beyond the
    /// Basic Multilingual Plane), absent and present values, times with
    /// offsets, details of every JSON kind.
    fn varied(n: u64) -> AuditRecord {
        const TEXT: [&str; 10] = [
            "",
            "plain",
            "quote \" and backslash \\",
            "\u{0}\u{1}\u{8}\u{9}\u{a}\u{b}\u{c}\u{d}\u{1f}\u{7f}",
            "ünïcødé ✓",
            "\u{1f600} astral",
            "slash / and <html>",
            "\u{2028}\u{2029}\u{feff}",
            "c3000000-0000-4000-8000-000000000003",
            "https://login.microsoftonline.com/t/v2.0",
        ];
        let pick = |k: u64| TEXT[((n / 3u64.pow((k % 7) as u32) + k) % 10) as usize].to_owned();
        let some = |k: u64| ((n >> (k % 13)) & 1 == 1).then(|| pick(k));
        let at = OffsetDateTime::from_unix_timestamp_nanos(
            1_700_000_000_123_456_789 + i128::from(n) * 987_654_321_987,
        )
        .unwrap();
        let offset = time::UtcOffset::from_whole_seconds(((n % 48) as i32 - 24) * 1800).unwrap();
        let mut r = AuditRecord::new(&pick(1), &pick(2), &pick(3), at.to_offset(offset));
        r.reason_code = some(4);
        r.cluster = some(5);
        r.issuer = some(6);
        r.tenant = some(7);
        r.subject = some(8);
        r.username = some(9);
        r.identity_verified = n.is_multiple_of(2);
        r.groups_evaluated = (0..n % 4).map(|k| pick(k + 10)).collect();
        r.roles_requested = (0..n % 3).map(|k| pick(k + 11)).collect();
        r.roles_granted = (0..n % 5).map(|k| pick(k + 12)).collect();
        r.serial = some(13);
        r.certificate_sha256 = some(14);
        r.public_key_sha256 = some(15);
        r.not_before = (!n.is_multiple_of(3)).then_some(at);
        r.not_after = (!n.is_multiple_of(5)).then(|| at + time::Duration::minutes(5));
        r.client_ip = some(16);
        r.user_agent = some(17);
        r.client_version = some(18);
        r.token_id = some(19);
        r.token_issued_at = (!n.is_multiple_of(7)).then(|| at.to_offset(offset));
        r.details = match n % 6 {
            0 => json!({}),
            1 => json!({"zeta": 1, "alpha": {"b": 2.5, "a": -0.0}, "\u{1f600}": [true, null], "\u{e9}": "x"}),
            2 => json!({"count": 9_007_199_254_740_991_i64, "big": 1e300, "small": 1e-7, "text": pick(20)}),
            3 => json!([pick(21), 1, {"b": null, "a": [[]]}]),
            4 => json!(pick(22)),
            _ => json!(null),
        };
        r
    }

    #[test]
    fn the_direct_encoding_is_the_canonical_json_of_the_record() {
        for n in 0..2_000u64 {
            let record = varied(n);
            let seq = [1, 7, 1 << 40, MAX_SAFE_INTEGER as i64, -5, 0][(n % 6) as usize] + n as i64 % 3;
            let prev = if n.is_multiple_of(2) {
                GENESIS_HASH.to_owned()
            } else {
                pick_hash(n)
            };
            assert_eq!(
                String::from_utf8(canonical_encoding(seq, &record, &prev)).unwrap(),
                String::from_utf8(canonical_encoding_by_value(seq, &record, &prev)).unwrap(),
                "record {n}"
            );
        }
        // Beyond 2^53 a number is written as the double nearest to it.
        let record = varied(1);
        let seq = MAX_SAFE_INTEGER as i64 + 2;
        assert_eq!(
            canonical_encoding(seq, &record, GENESIS_HASH),
            canonical_encoding_by_value(seq, &record, GENESIS_HASH)
        );
    }

    fn pick_hash(n: u64) -> String {
        sha256_hex(&n.to_be_bytes())
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

    /// The record of docs/audit.md ("A record"), written by an earlier
    /// release whose encoding sorted keys by byte and used serde_json's
    /// number form: RFC 8785 gives the same bytes for every record the
    /// server writes (ASCII keys, integers), so its hash still holds.
    #[test]
    fn the_hash_of_a_record_written_before_rfc_8785_still_holds() {
        let text = r#"{"seq":1,"occurred_at":"2026-12-01T10:26:10.879455Z","request_id":"67f5316605316e69bc79cb85af12b429","event":"certificate.issued","outcome":"success","reason_code":null,"cluster":"demo","issuer":"http://127.0.0.1:8400/5b1a0c2e-7d3f-4e8a-9b6c-1f2e3d4c5b6a/v2.0","tenant":"5b1a0c2e-7d3f-4e8a-9b6c-1f2e3d4c5b6a","subject":"b2000000-0000-4000-8000-000000000002","username":"bob@example.com","identity_verified":true,"groups_evaluated":["3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a02"],"roles_requested":[],"roles_granted":["os:operator"],"serial":"6896cf96ffdb782fd30c2e3b42bd0d31","certificate_sha256":"828ac87938cd28cc495f89e7a5a0808a2a8e98c5ee883168fec1d6fb1beb9380","public_key_sha256":"6cbd194e856482a6e2f780051d90fcb405afe459992bf1bde81fec985f0210bf","not_before":"2026-12-01T10:21:10.000000Z","not_after":"2026-12-01T10:31:10.000000Z","client_ip":"127.0.0.1","user_agent":"talos-sso/0.1.0","client_version":"0.1.0","token_id":"mEffh1CcBrQ5ZGlHjCJ50Q","token_issued_at":"2026-12-01T10:21:10.000000Z","details":{},"prev_hash":"0000000000000000000000000000000000000000000000000000000000000000","hash":"828e9b2eb5542a732ce732d0c72c21a7a9b559191f66c6cf681101b984ac7a61"}"#;
        let stored: StoredRecord = serde_json::from_str(text).unwrap();
        assert_eq!(
            record_hash(stored.seq, &stored.record, &stored.prev_hash),
            stored.hash
        );
        // It is also the line the server writes for it today.
        assert_eq!(read_record_line(text.as_bytes()), Ok(Some(stored)));
    }

    /// Other texts of the line of `stored`, each of which serde_json
    /// reads as a record (with the hostile ones, not `stored` itself), and
    /// which the server never writes.
    fn other_texts(line: &str) -> Vec<(&'static str, String)> {
        let body = &line[1..line.len() - 1];
        vec![
            (
                "a fake username and event before the real ones",
                format!(r#"{{"username":"mallory@example.com","event":"deny.removed",{body}}}"#),
            ),
            (
                "a key moved",
                format!("{{{},\"seq\":1}}", body.replacen(r#""seq":1,"#, "", 1)),
            ),
            ("a space after each comma", line.replace(r#",""#, r#", ""#)),
            ("spaces around the object", format!(" {line} ")),
            ("a tab before the newline", format!("{line}\t")),
            ("a CR before the newline", format!("{line}\r")),
            (
                "a trailing copy of a field",
                format!(r#"{{{body},"username":"bob@example.com"}}"#),
            ),
            (
                "a trailing field the record does not have",
                format!(r#"{{{body},"approved_by":"ciso"}}"#),
            ),
            ("a letter as an escape", line.replacen("bob@", r"\u0062ob@", 1)),
            ("an escaped slash", line.replacen("os:admin", r"os:\/admin", 1)),
            (
                "a time with an offset",
                line.replacen(
                    "2026-11-29T10:00:00.123456Z",
                    "2026-11-29T11:00:00.123456+01:00",
                    1,
                ),
            ),
            (
                "details keys out of order",
                line.replacen(
                    r#"{"alpha":{"a":1,"b":2},"zeta":1}"#,
                    r#"{"zeta":1,"alpha":{"a":1,"b":2}}"#,
                    1,
                ),
            ),
            (
                "a number with a fraction",
                line.replacen(r#""zeta":1"#, r#""zeta":1.0"#, 1),
            ),
            (
                "a number with an exponent",
                line.replacen(r#""zeta":1"#, r#""zeta":1e0"#, 1),
            ),
            ("a negative zero", line.replacen(r#""zeta":1"#, r#""zeta":-0"#, 1)),
            ("an absent field", line.replacen(r#""client_ip":null,"#, "", 1)),
        ]
    }

    fn stored_for_lines() -> StoredRecord {
        let mut r = record(1);
        r.username = Some("bob@example.com".into());
        chain(0, GENESIS_HASH, r)
    }

    #[test]
    fn only_the_line_the_server_writes_reads_as_a_record() {
        let stored = stored_for_lines();
        let line = stored.to_line();
        assert!(
            line.starts_with(r#"{"seq":1,"occurred_at":"2026-11-29T10:00:00.123456Z","#),
            "{line}"
        );
        assert_eq!(
            read_record_line(format!("{line}\n").as_bytes()),
            Ok(Some(stored.clone()))
        );
        // The last line of a file may lack its newline; an empty line is no record.
        assert_eq!(read_record_line(line.as_bytes()), Ok(Some(stored.clone())));
        assert_eq!(read_record_line(b"\n"), Ok(None));
        assert_eq!(read_record_line(b""), Ok(None));
        assert_eq!(read_record_line(b"\xff\n"), Err(LineError::NotUtf8));

        let mut texts = other_texts(&line);
        texts.push(("a line of spaces", "  ".into()));
        texts.push(("a CR LF line", "\r".into()));
        let read: Vec<&str> = texts
            .iter()
            .filter(|(what, text)| {
                assert_ne!(text, &line, "{what}");
                read_record_line(format!("{text}\n").as_bytes()).is_ok()
            })
            .map(|(what, _)| *what)
            .collect();
        assert!(read.is_empty(), "read as a record: {read:?}");
        // Why the text matters: the line with a fake username and event
        // placed first is this intact record to a reader that keeps the
        // last of two keys (as serde_json's Value and Python do), while one
        // that keeps the first shows the fake username and event.
        let (_, forged) = &texts[0];
        let last_wins: Value = serde_json::from_str(forged).unwrap();
        let taken: StoredRecord = serde_json::from_value(last_wins).unwrap();
        assert_eq!(taken, stored);
        let numbers = line.replacen(r#""zeta":1"#, r#""zeta":1.0"#, 1);
        assert_eq!(
            read_record_line(numbers.as_bytes()),
            Err(LineError::Number { seq: 1 })
        );
        let beyond = line.replacen(r#""zeta":1"#, r#""zeta":9007199254740992"#, 1);
        assert_eq!(
            read_record_line(beyond.as_bytes()),
            Err(LineError::Number { seq: 1 })
        );
        // What an error quotes of a line (here the reader's message, which
        // quotes the time) reaches no terminal raw, and is bounded.
        let hostile = format!("\\u001b[2J\u{202e}{}", "9".repeat(100_000));
        let hostile = line.replacen("2026-11-29T10:00:00.123456Z", &hostile, 1);
        match read_record_line(hostile.as_bytes()) {
            Err(LineError::NotARecord(reason)) => assert!(
                reason.starts_with("`\\u{1b}[2J\\u{202e}999")
                    && !reason.contains('\u{1b}')
                    && reason.chars().count() < 200,
                "{reason:?}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn keys_sort_by_utf16_and_numbers_take_their_shortest_form() {
        let mut r = record(1);
        // U+1F600 sorts after U+FF61 by UTF-8 bytes, before it by UTF-16
        // code units (a surrogate pair, D83D DE00).
        r.details = json!({"\u{1F600}": 1, "\u{FF61}": 2, "big": 9_007_199_254_740_991_u64, "f": 1e21});
        let text = String::from_utf8(canonical_encoding(1, &r, GENESIS_HASH)).unwrap();
        assert!(
            text.contains(
                "\"details\":{\"big\":9007199254740991,\"f\":1e+21,\"\u{1F600}\":1,\"\u{FF61}\":2}"
            ),
            "{text}"
        );
    }

    #[test]
    fn checkpoints_catch_a_rewritten_record_and_a_cut_tail() {
        let stored = trail(10);
        let signed = vec![checkpoint_of(&stored[3]), checkpoint_of(&stored[6])];
        let good = check(&stored, Some(signed.clone()));
        assert_eq!((good.verified, &good.first_broken), (10, &None));
        let coverage = good.coverage().unwrap();
        assert_eq!(
            (
                coverage.matched,
                coverage.last.as_ref().map(|c| c.seq),
                coverage.records_after_last
            ),
            (2, Some(7), 3)
        );

        // Record 6 rewritten and every hash from it recomputed: the chain
        // alone is intact, the checkpoint of record 7 is not matched.
        let mut rewritten = stored[..5].to_vec();
        for original in &stored[5..] {
            let mut r = original.record.clone();
            if original.seq == 6 {
                r.roles_granted = vec!["os:reader".into()];
            }
            let last = rewritten.last().unwrap();
            rewritten.push(chain(last.seq, &last.hash.clone(), r));
        }
        assert_eq!(check(&rewritten, None).first_broken, None);
        let broken = check(&rewritten, Some(signed.clone())).first_broken.unwrap();
        assert_eq!(
            (broken.seq, broken.checkpoint.as_ref().map(|c| c.seq)),
            (7, Some(7))
        );
        assert!(
            broken.reason.contains("a record from 5 to 7 was changed"),
            "{}",
            broken.reason
        );

        // The newest four records removed: only the checkpoint shows it.
        assert_eq!(check(&stored[..6], None).first_broken, None);
        let broken = check(&stored[..6], Some(signed)).first_broken.unwrap();
        assert_eq!(broken.seq, 7);
        assert!(
            broken.reason.starts_with("records 7 to 7 are missing"),
            "{}",
            broken.reason
        );

        // An export that starts later: earlier checkpoints are counted, not checked.
        let mut later = ChainCheck::after(stored[4].seq, &stored[4].hash).with_checkpoints(vec![
            checkpoint_of(&stored[1]),
            checkpoint_of(&stored[4]),
            checkpoint_of(&stored[8]),
        ]);
        stored[5..].iter().for_each(|r| later.feed(r));
        later.finish();
        let coverage = later.coverage().unwrap();
        assert_eq!(
            (&later.first_broken, coverage.matched, coverage.before_first),
            (&None, 2, 1)
        );
    }
}
