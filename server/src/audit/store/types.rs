//! The audit store's vocabulary: what callers ask of it (filters, appends,
//! deny-list changes, chart windows), what it answers, and how it fails.

use std::time::Duration;

use time::OffsetDateTime;

use crate::audit::{AuditRecord, StoredRecord};
use talos_sso_text::{FIELD_CHARS, clean};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the audit database is unavailable: {0}")]
    Unavailable(String),
    /// The database answered and refused a statement for its data (a
    /// constraint, a value it cannot store, a row too large): the record is
    /// at fault, not the database. Locks, conflicts, timeouts and shutdowns
    /// are [`StoreError::Unavailable`].
    #[error("the audit database refused the write: {0}")]
    Refused(String),
    /// The connection broke while the commit was under way: the records
    /// may or may not be in the database. `appended` is what they would
    /// be; [`AuditStore::holds`] tells which.
    #[error("the audit database did not acknowledge the commit: {reason}")]
    CommitUnacknowledged { reason: String, appended: Vec<Appended> },
    #[error("audit database migration failed: {0}")]
    Migration(String),
    #[error("the audit database holds an unreadable record: {0}")]
    Corrupt(String),
    /// Rows no server wrote sit outside the chain: the store refuses to
    /// migrate or serve until they are dealt with.
    #[error("{0}")]
    OutsideChain(OutsideChain),
}

/// Rows of `audit_events` outside the hash chain (`seq` 0 or below), which
/// no server writes and `audit verify` does not read: the first few, by
/// `seq`, and how many there are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutsideChain {
    pub count: i64,
    /// `(seq, event, username)`, at most [`OUTSIDE_CHAIN_NAMED`].
    pub rows: Vec<(i64, String, Option<String>)>,
}

/// How many rows outside the chain an error names.
pub const OUTSIDE_CHAIN_NAMED: i64 = 10;

impl std::fmt::Display for OutsideChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let clean = |text: &str| clean(text, FIELD_CHARS);
        let named: Vec<String> = self
            .rows
            .iter()
            .map(|(seq, event, username)| {
                let username = username
                    .as_deref()
                    .map_or_else(|| "no username".to_owned(), clean);
                format!("seq {seq} ({}, {username})", clean(event))
            })
            .collect();
        let more = self.count - self.rows.len() as i64;
        let more = if more > 0 {
            format!(", and {more} more")
        } else {
            String::new()
        };
        let rows = if self.count == 1 { "row" } else { "rows" };
        write!(
            f,
            "the audit trail holds {} {rows} outside its hash chain (seq 0 or below): {}{more}. No server writes \
             such a row and `audit verify` does not read one, so something else inserted it into the database; \
             the server neither migrates nor starts while one is there. Keep a copy of the database for the \
             investigation, remove the rows as the schema owner (docs/operations.md, \"Rows outside the chain\"), \
             then run `talos-sso-server audit verify` and start again",
            self.count,
            named.join(", ")
        )
    }
}

/// Longest a batch may wait for the database before its commit, and
/// again for the commit's answer: a database that stops answering (a
/// network partition without resets) fails the batch instead of stalling
/// every request behind it.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Pool settings.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    /// How long to wait for a connection before giving up (fail fast: the
    /// request is answered 503 rather than hanging).
    pub acquire_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            max_connections: 8,
            acquire_timeout: Duration::from_secs(3),
        }
    }
}

/// What the security team asks for; every field narrows the answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
    pub username: Option<String>,
    pub subject: Option<String>,
    pub cluster: Option<String>,
    /// Granted or requested.
    pub role: Option<String>,
    pub outcome: Option<String>,
    pub event: Option<String>,
    pub serial: Option<String>,
    /// The client address, as recorded.
    pub client_ip: Option<String>,
    /// The gRPC method of an `api.call` record (other events never match).
    pub method: Option<MethodFilter>,
    /// A node an `api.call` record names in `details.nodes` (other events
    /// never match).
    pub node: Option<String>,
    /// Leave out the records of this event (for a view that shows them
    /// apart, such as a person's API calls; the API has no such filter).
    pub except_event: Option<String>,
    /// Cursor: only records after this sequence number.
    pub after_seq: i64,
    pub limit: i64,
}

/// Which gRPC methods an `api.call` record may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MethodFilter {
    /// This method exactly.
    Exact(String),
    /// Every method that starts with this text (non-empty).
    Prefix(String),
}

impl MethodFilter {
    /// The first text after every text that starts with `prefix`, in byte
    /// order (how both stores compare here): `prefix` with its last
    /// character replaced by the next one (UTF-8 keeps code point order in
    /// its bytes); `None` when no text follows them all (a prefix of
    /// U+10FFFF alone).
    pub fn prefix_end(prefix: &str) -> Option<String> {
        let mut chars: Vec<char> = prefix.chars().collect();
        while let Some(last) = chars.pop() {
            let next = (u32::from(last) + 1..=0x10_FFFF).find_map(char::from_u32);
            if let Some(next) = next {
                chars.push(next);
                return Some(chars.into_iter().collect());
            }
        }
        None
    }
}

/// A token id to claim, and until when the claim matters.
#[derive(Debug, Clone)]
pub struct TokenClaim {
    pub token_id: String,
    pub expires_at: Option<OffsetDateTime>,
    /// How many times the token may be claimed: 1 for people's tokens; a
    /// workload's token mints up to its issuer's `certificates_per_token`.
    pub uses: u32,
}

/// One record to append.
#[derive(Debug, Clone, Default)]
pub struct Append {
    pub record: AuditRecord,
    /// Claim this token id (replay guard); a used one turns the record into
    /// a `token_replayed` denial.
    pub claim: Option<TokenClaim>,
    /// Check the record's subject and username against the deny list; a
    /// listed identity turns the record into an `identity_denied` denial.
    pub deny_check: bool,
    /// Change the deny list in the same transaction as this record.
    pub deny_change: Option<DenyChange>,
}

/// An entry of the deny list, as the API serves it.
pub use talos_sso_api::DenyEntry;

/// A deny-list change made with its audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyChange {
    Add(DenyEntry),
    /// Remove entries matching the subject or the (lower-cased) username.
    Remove {
        subject: Option<String>,
        username: Option<String>,
    },
}

/// What happened to an [`Append`].
#[derive(Debug, Clone)]
pub enum Appended {
    Recorded(StoredRecord),
    /// The token had been used: this denial was recorded instead.
    Replayed(StoredRecord),
    /// The identity is on the deny list: this denial was recorded instead.
    Denied(StoredRecord),
}

impl Appended {
    pub fn stored(&self) -> &StoredRecord {
        match self {
            Appended::Recorded(s) | Appended::Replayed(s) | Appended::Denied(s) => s,
        }
    }
}

/// Whose records may tie a username to a subject: verified records of
/// these issuers (`iss` as the records hold it, compared ignoring case as
/// issuers are told apart at load) and, when any are named, of these
/// tenants (Entra `tid`). The issuers do not imply the tenants: an Entra
/// issuer whose `iss` names no tenant (no `{tenantid}`) takes every
/// allowed tenant's tokens under that one `iss`, and a record of a tenant
/// no longer allowed must not resolve a name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IssuerScope {
    pub issuers: Vec<String>,
    pub tenants: Vec<String>,
}

/// The window a chart counts: records from `since` to before `until`, in
/// buckets of an hour (`hourly`) or a day (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChartWindow {
    pub since: OffsetDateTime,
    pub until: OffsetDateTime,
    pub hourly: bool,
}

/// A chart's counts: `(bucket, series, count)`.
pub type ChartCounts = Vec<(String, String, i64)>;
