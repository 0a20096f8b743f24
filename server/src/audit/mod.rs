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
//! - `checkpoint`: signing the chain head and publishing it outside the
//!   database;
//! - `verification`: one verification of the whole chain at a time.
//!
//! The record type itself is the API's ([`talos_sso_api::audit`]).
//!
//! The canonical encoding, the hash and the chain check are the API's
//! ([`talos_sso_api::chain`]): the CLI checks an export with the same code.

pub mod checkpoint;
pub mod recorder;
pub mod store;
pub mod verification;
pub mod writer;

use serde_json::json;
use talos_sso_text as text;

/// The record, its events and outcomes and its time format are part of the
/// API (`GET /v1/audit` serves records as they are hashed).
pub use talos_sso_api::audit::{
    AuditRecord, BrokenLink, StoredRecord, event, format_micros, outcome, parse_micros, truncate_to_micros,
};
pub use talos_sso_api::chain::{
    ChainCheck, CheckpointCoverage, GENESIS_HASH, canonical_encoding, chain, record_hash,
};

/// What the server does with a record beyond the API's view of it.
pub trait RecordExt: Sized {
    /// The stand-in for a record the database refused, and why it stands
    /// in: what the server itself chose, plus (when `with_identity`) who
    /// asked and from where. Without identity it holds no caller-supplied
    /// text at all, for when the identity was what the database refused.
    fn refused_by_store(&self, reason: &str, with_identity: bool) -> Self;

    /// Name the certificate this record is about.
    fn set_certificate(&mut self, issued: &crate::certificate::SignedLeaf);

    /// The record as the stores keep it: times to microseconds, and every
    /// text field escaped and bounded (`talos_sso_text`), whatever its source, so
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

    fn set_certificate(&mut self, issued: &crate::certificate::SignedLeaf) {
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
        self.details = clean_details(std::mem::take(&mut self.details));
        self
    }
}

/// Every string (and object key) in a record's details cleaned, nesting
/// bounded; a number outside what the canonical encoding reads exactly
/// (RFC 8785 reads numbers as doubles: an integer beyond 2^53 would share
/// its bytes, and so its hash, with a neighbour) is kept as text, and so
/// are fractions, so that every number in a record is an integer any JSON
/// reader and any verifier writes alike (docs/audit.md, "The hash chain").
fn clean_details(value: serde_json::Value) -> serde_json::Value {
    text::clean_json(value, talos_sso_api::chain::is_safe_integer)
}
