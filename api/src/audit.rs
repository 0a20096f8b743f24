//! The audit trail on the wire: a record as `GET /v1/audit` serves it (and
//! as the server hashes it), the events and outcomes it can name, the query
//! parameters, and the answer of `GET /v1/audit/verify`.
//!
//! Times are RFC 3339 UTC with exactly six fractional digits: the one text
//! form of a time in records, which the hash covers.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use time::OffsetDateTime;

pub use crate::time_text::{format_micros, micros, micros_option, parse_micros, truncate_to_micros};

/// What happened.
pub mod event {
    pub const CERTIFICATE_ISSUED: &str = "certificate.issued";
    pub const CERTIFICATE_DENIED: &str = "certificate.denied";
    pub const BREAK_GLASS_ISSUED: &str = "break_glass.issued";
    /// A certificate whose `certificate.issued` (or `break_glass.issued`)
    /// record was committed, but whose commit the server never saw
    /// acknowledged (the connection to the database broke in the middle of
    /// the commit): the request was refused with `audit_unavailable`, so the
    /// certificate never left the server. Names the record it corrects.
    pub const CERTIFICATE_UNDELIVERED: &str = "certificate.undelivered";
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
    /// The server read its configuration again: what changed (`success`),
    /// or why the new one was refused and the running one kept (`denied`).
    pub const CONFIG_RELOADED: &str = "config.reloaded";
    /// A Talos API call through the gateway (`details`: see
    /// [`crate::audit::api_call`]): a call that may change a node is
    /// recorded before it is forwarded (outcome `started`) and again when
    /// it ends; read-only calls are recorded when they end, counted per
    /// certificate, method and minute.
    pub const API_CALL: &str = "api.call";
    /// The gateway signed itself an `os:impersonator` certificate for its
    /// connections to apid.
    pub const GATEWAY_CERTIFICATE_ISSUED: &str = "gateway.certificate_issued";

    /// Every event a record can have (what an `event` filter may name).
    pub const ALL: [&str; 13] = [
        CERTIFICATE_ISSUED,
        CERTIFICATE_DENIED,
        BREAK_GLASS_ISSUED,
        CERTIFICATE_UNDELIVERED,
        DENY_ADDED,
        DENY_REMOVED,
        DENY_LISTED,
        AUDIT_QUERY,
        RECORD_REFUSED,
        REFUSALS_AGGREGATED,
        CONFIG_RELOADED,
        API_CALL,
        GATEWAY_CERTIFICATE_ISSUED,
    ];
}

/// How it ended.
pub mod outcome {
    pub const SUCCESS: &str = "success";
    pub const DENIED: &str = "denied";
    /// An API call admitted by the gateway and about to be forwarded; its
    /// end is a second record.
    pub const STARTED: &str = "started";
    /// An API call that was forwarded and ended with a gRPC status other
    /// than OK (the node refused it, or it failed on the way).
    pub const FAILED: &str = "failed";
    /// Every outcome (what an `outcome` filter may name).
    pub const ALL: [&str; 4] = [SUCCESS, DENIED, STARTED, FAILED];
}

/// The `details` of an `api.call` record, by key.
pub mod api_call {
    /// The full gRPC method, `/machine.MachineService/Reboot`.
    pub const METHOD: &str = "method";
    /// The nodes the call targets (talosctl's `nodes` / `node` metadata),
    /// or the upstream endpoint that served it when it named none.
    pub const NODES: &str = "nodes";
    /// `mutating` or `sensitive` (recorded before it is forwarded), or
    /// `read`.
    pub const CLASS: &str = "class";
    /// The gRPC status code it ended with (absent on a `started` record).
    pub const GRPC_STATUS: &str = "grpc_status";
    pub const GRPC_MESSAGE: &str = "grpc_message";
    pub const DURATION_MS: &str = "duration_ms";
    /// Bytes of gRPC messages from the client and to it.
    pub const BYTES_IN: &str = "bytes_in";
    pub const BYTES_OUT: &str = "bytes_out";
    /// How many calls the record counts (1, or more for read-only calls
    /// counted over a minute).
    pub const CALLS: &str = "calls";
    /// The gateway rule that refused the call.
    pub const RULE: &str = "rule";
    pub const CLASS_MUTATING: &str = "mutating";
    pub const CLASS_READ: &str = "read";
    /// A read that may return secrets (COSI state reads by an admin):
    /// recorded before it is forwarded, as a mutating call is.
    pub const CLASS_SENSITIVE: &str = "sensitive";
}

/// What a workload's certificate record (issued or refused) holds under
/// `details.workload`.
pub mod workload {
    /// The object under `details` itself.
    pub const KEY: &str = "workload";
    /// The issuer's kind: one of [`KINDS`].
    pub const KIND: &str = "kind";
    /// The configured name of the issuer that verified the token.
    pub const ISSUER: &str = "issuer";
    /// The workload rules that admitted it (issued).
    pub const RULES: &str = "rules";
    /// The token's claims that rules can name, as the token had them.
    pub const CLAIMS: &str = "claims";
    /// Each workload rule of the token's issuer that did not admit it, and
    /// the claims it missed (refused): `[{rule, claims: [...]}]`.
    pub const MISSES: &str = "misses";
    /// How many certificates one token of its issuer may mint (each is a
    /// record with the token's `token_id`).
    pub const TOKEN_USES_MAX: &str = "token_uses_max";
    pub const KUBERNETES: &str = "kubernetes";
    pub const GITHUB_ACTIONS: &str = "github-actions";
    pub const GITLAB_CI: &str = "gitlab-ci";
    /// Every workload kind.
    pub const KINDS: [&str; 3] = [KUBERNETES, GITHUB_ACTIONS, GITLAB_CI];
}

/// One decision, before it gets its place in the chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
}

/// A record in the chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredRecord {
    pub seq: i64,
    #[serde(flatten)]
    pub record: AuditRecord,
    pub prev_hash: String,
    pub hash: String,
}

impl StoredRecord {
    /// The record as one line of an export, without the newline: the
    /// compact JSON of this type, keys in the order of its fields,
    /// `details` with its keys sorted, strings with only `"`, `\` and
    /// control characters escaped. The one text of a record that an
    /// offline verification accepts (the chain's `read_record_line`):
    /// any other text of the same JSON value (a key repeated or moved, an
    /// escape, whitespace) could be read differently by another reader,
    /// and is refused.
    pub fn to_line(&self) -> String {
        // Serialising a record cannot fail: every key is a string and a
        // `Value` holds no non-finite number.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// One page of `GET /v1/audit`, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditPage {
    pub records: Vec<StoredRecord>,
    /// Pass as `cursor` for the next page; absent on the last one.
    pub next_cursor: Option<i64>,
}

/// The query parameters of `GET /v1/audit`, as sent. The server checks
/// each (and refuses a bad one naming the parameter) once the caller is
/// known to be an auditor; the `audit.query` record keeps them as sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// RFC 3339 time, or a duration back from now (`7d`, `12h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Granted or requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// One of [`outcome::ALL`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// One of [`event::ALL`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// The client address a record names, as recorded (`203.0.113.7`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ip: Option<String>,
    /// The gRPC method of an `api.call` record, exactly
    /// (`/machine.MachineService/Reboot`), or a prefix of one ending in `*`
    /// (`/machine.MachineService/Etcd*`). No other event matches it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// One node an `api.call` record names in `details.nodes`, exactly
    /// (`10.5.0.2`). No other event matches it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The `next_cursor` of the previous page (a sequence number, 0 or more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Records per page, 1 to [`MAX_PAGE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
}

impl AuditQuery {
    /// The same query with every parameter passed through `f`.
    pub fn map(&self, f: impl Fn(&str) -> String) -> Self {
        let each = |v: &Option<String>| v.as_deref().map(&f);
        Self {
            since: each(&self.since),
            until: each(&self.until),
            username: each(&self.username),
            subject: each(&self.subject),
            cluster: each(&self.cluster),
            role: each(&self.role),
            outcome: each(&self.outcome),
            event: each(&self.event),
            serial: each(&self.serial),
            client_ip: each(&self.client_ip),
            method: each(&self.method),
            node: each(&self.node),
            cursor: each(&self.cursor),
            limit: each(&self.limit),
        }
    }
}

/// Largest page of `GET /v1/audit`.
pub const MAX_PAGE: i64 = 1000;

/// Records per page when `limit` is not given.
pub const DEFAULT_PAGE: i64 = 100;

/// `GET /v1/audit/verify`: the hash chain recomputed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainStatus {
    pub intact: bool,
    /// Records checked and found good, from the first.
    pub verified: u64,
    pub last_seq: i64,
    pub first_broken: Option<BrokenLink>,
    /// How far signed checkpoints vouch for the chain; absent when the
    /// server signs none (`audit.checkpoints` not configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<crate::checkpoint::CheckpointCoverage>,
}

/// Where the chain breaks, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokenLink {
    pub seq: i64,
    pub reason: String,
    /// The signed checkpoint the trail contradicts, when that is how the
    /// break was found (a record rewritten with every later hash
    /// recomputed, or records removed from the end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::checkpoint::Checkpoint>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_record_reads_back_as_it_was_served() {
        let mut record = AuditRecord::new(
            event::CERTIFICATE_ISSUED,
            outcome::SUCCESS,
            "req-1",
            OffsetDateTime::from_unix_timestamp_nanos(1_700_000_000_123_456_789).unwrap(),
        );
        record.not_after = Some(record.occurred_at + time::Duration::minutes(5));
        record.roles_granted = vec!["os:reader".into()];
        let stored = StoredRecord {
            seq: 7,
            record,
            prev_hash: "0".repeat(64),
            hash: "f".repeat(64),
        };
        let text = serde_json::to_string(&stored).unwrap();
        assert!(
            text.contains(r#""occurred_at":"2023-11-14T22:13:20.123456Z""#),
            "{text}"
        );
        let back: StoredRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back, stored);
    }

    /// Found by fuzzing (`fuzz/regressions/audit_encoding/`): serde_json's
    /// default float parsing may be one unit in the last place off, so a
    /// float in `details` read back (from `GET /v1/audit`, or from the
    /// SQLite store, which keeps `details` as text) was another number, and
    /// the record's hash no longer matched: a false "changed after it was
    /// written". The `float_roundtrip` feature parses floats exactly.
    #[test]
    fn a_float_in_details_reads_back_exactly() {
        let mut record = AuditRecord::new(
            event::AUDIT_QUERY,
            outcome::SUCCESS,
            "r",
            OffsetDateTime::UNIX_EPOCH,
        );
        record.details = json!({"x": 3.632_698_987_798_045_4e276, "y": -2.386_515_182_878_852_3e32});
        let text = serde_json::to_string(&record.details).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back.to_string(), text);
        assert_eq!(back["x"].as_f64(), Some(3.632_698_987_798_045_4e276));
    }

    #[test]
    fn a_denial_names_no_certificate() {
        let mut record = AuditRecord::new(
            event::CERTIFICATE_ISSUED,
            outcome::SUCCESS,
            "r",
            OffsetDateTime::UNIX_EPOCH,
        );
        record.serial = Some("01".into());
        let denied = record.into_denial("token_replayed");
        assert_eq!(denied.event, event::CERTIFICATE_DENIED);
        assert_eq!(denied.outcome, outcome::DENIED);
        assert_eq!(denied.serial, None);
    }
}
