//! The `api.call` records of the trail: who called which method on which
//! nodes, and how it ended. A mutating call gets a `started` record before
//! it is forwarded and an end record after; read-only calls are counted per
//! certificate, method and minute ([`ReadCalls`]) and recorded when the
//! minute ends, so that `talosctl dashboard`'s polling adds a bounded number
//! of records.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use time::OffsetDateTime;

use super::methods::MethodClass;
use crate::audit::{AuditRecord, event, outcome};
use talos_sso_api::audit::api_call as key;

/// Nodes a record names at most; a call naming more says how many more.
pub const MAX_NODES: usize = 32;
/// Longest method name or node kept (longer ones are cut).
pub const MAX_NAME: usize = 256;

/// Who called, as the gateway admitted them: from the certificate and the
/// record of its issuance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub cluster: String,
    pub issuer: Option<String>,
    pub tenant: Option<String>,
    pub subject: Option<String>,
    pub username: Option<String>,
    /// The client certificate's serial (hex, as recorded at issuance).
    pub serial: String,
    pub roles: Vec<String>,
    pub groups: Vec<String>,
    pub not_after: OffsetDateTime,
    pub client_ip: String,
}

/// What was called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub request_id: String,
    pub method: String,
    pub nodes: Vec<String>,
    pub class: MethodClass,
}

/// How a forwarded call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallEnd {
    /// The gRPC status (1, CANCELLED, when the client went away).
    pub grpc_status: u32,
    pub grpc_message: Option<String>,
    pub duration: Duration,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// gRPC's OK.
pub const GRPC_OK: u32 = 0;

impl Call {
    /// The method as recorded: printable ASCII, bounded.
    pub fn new(request_id: &str, method: &str, nodes: Vec<String>, class: MethodClass) -> Self {
        Self {
            request_id: request_id.to_owned(),
            method: bounded(method),
            nodes: nodes.iter().take(MAX_NODES).map(|n| bounded(n)).collect(),
            class,
        }
    }
}

fn bounded(text: &str) -> String {
    text.chars().take(MAX_NAME).collect()
}

fn base(caller: &Caller, call: &Call, outcome: &str, at: OffsetDateTime) -> AuditRecord {
    let mut record = AuditRecord::new(event::API_CALL, outcome, &call.request_id, at);
    record.cluster = Some(caller.cluster.clone());
    record.issuer = caller.issuer.clone();
    record.tenant = caller.tenant.clone();
    record.subject = caller.subject.clone();
    record.username = caller.username.clone();
    // The identity was verified when the certificate was issued, and the
    // certificate at the handshake.
    record.identity_verified = true;
    record.roles_granted = caller.roles.clone();
    record.serial = Some(caller.serial.clone());
    record.not_after = Some(caller.not_after);
    record.client_ip = Some(caller.client_ip.clone());
    record.details = json!({
        key::METHOD: call.method,
        key::NODES: call.nodes,
        key::CLASS: call.class.as_str(),
        key::CALLS: 1,
    });
    record
}

fn set(record: &mut AuditRecord, name: &str, value: Value) {
    if let Value::Object(details) = &mut record.details {
        details.insert(name.to_owned(), value);
    }
}

/// The record of a mutating call, committed before it is forwarded.
pub fn started(caller: &Caller, call: &Call, at: OffsetDateTime) -> AuditRecord {
    base(caller, call, outcome::STARTED, at)
}

/// The record of a call refused by the gateway (`reason`: its code;
/// `rule`: the per-method rule, when one refused it).
pub fn denied(
    caller: &Caller,
    call: &Call,
    reason: &str,
    rule: Option<&str>,
    at: OffsetDateTime,
) -> AuditRecord {
    let mut record = base(caller, call, outcome::DENIED, at);
    record.reason_code = Some(reason.to_owned());
    if let Some(rule) = rule {
        set(&mut record, key::RULE, json!(rule));
    }
    record
}

/// The record of a forwarded call that ended.
pub fn ended(caller: &Caller, call: &Call, end: &CallEnd, at: OffsetDateTime) -> AuditRecord {
    let result = if end.grpc_status == GRPC_OK {
        outcome::SUCCESS
    } else {
        outcome::FAILED
    };
    let mut record = base(caller, call, result, at);
    set_end(&mut record, end);
    record
}

fn set_end(record: &mut AuditRecord, end: &CallEnd) {
    set(record, key::GRPC_STATUS, json!(end.grpc_status));
    if let Some(message) = &end.grpc_message {
        set(record, key::GRPC_MESSAGE, json!(bounded(message)));
    }
    let millis = u64::try_from(end.duration.as_millis()).unwrap_or(u64::MAX);
    set(record, key::DURATION_MS, json!(millis));
    set(record, key::BYTES_IN, json!(end.bytes_in));
    set(record, key::BYTES_OUT, json!(end.bytes_out));
}

/// A counting window's key: its minute (Unix time / 60), then what it
/// counts by (certificate serial, and method or reason).
type WindowKey = (i64, String, String);

/// The windows whose minute ended before `now` (or every one, `all`),
/// taken out of `windows`.
fn due<V>(windows: &mut BTreeMap<WindowKey, V>, now: OffsetDateTime, all: bool) -> BTreeMap<WindowKey, V> {
    if all {
        return std::mem::take(windows);
    }
    let current = now.unix_timestamp().div_euclid(60);
    let keep = windows.split_off(&(current, String::new(), String::new()));
    std::mem::replace(windows, keep)
}

/// The oldest windows past [`MAX_WINDOWS`], taken out to be recorded early.
fn over_bound<V>(windows: &mut BTreeMap<WindowKey, V>) -> Vec<(WindowKey, V)> {
    let mut out = Vec::new();
    while windows.len() > MAX_WINDOWS {
        out.extend(windows.pop_first());
    }
    out
}

/// Read-only calls that ended, counted per certificate, method and minute.
#[derive(Debug, Default)]
pub struct ReadCalls {
    windows: BTreeMap<WindowKey, Window>,
}

/// Windows held at most; past it, the oldest are recorded early.
pub const MAX_WINDOWS: usize = 10_000;

#[derive(Debug)]
struct Window {
    caller: Caller,
    call: Call,
    nodes: BTreeSet<String>,
    calls: u64,
    failed: u64,
    statuses: BTreeMap<u32, u64>,
    last_failure: Option<(u32, Option<String>)>,
    duration: Duration,
    bytes_in: u64,
    bytes_out: u64,
}

impl ReadCalls {
    /// Count a read-only call that ended at `at`. Returns the records of
    /// windows pushed out by the bound.
    pub fn add(
        &mut self,
        caller: &Caller,
        call: &Call,
        end: &CallEnd,
        at: OffsetDateTime,
    ) -> Vec<AuditRecord> {
        let minute = at.unix_timestamp().div_euclid(60);
        let window = self
            .windows
            .entry((minute, caller.serial.clone(), call.method.clone()))
            .or_insert_with(|| Window {
                caller: caller.clone(),
                call: call.clone(),
                nodes: BTreeSet::new(),
                calls: 0,
                failed: 0,
                statuses: BTreeMap::new(),
                last_failure: None,
                duration: Duration::ZERO,
                bytes_in: 0,
                bytes_out: 0,
            });
        for node in &call.nodes {
            if window.nodes.len() < MAX_NODES {
                window.nodes.insert(node.clone());
            }
        }
        window.calls += 1;
        *window.statuses.entry(end.grpc_status).or_default() += 1;
        if end.grpc_status != GRPC_OK {
            window.failed += 1;
            window.last_failure = Some((end.grpc_status, end.grpc_message.clone()));
        }
        window.duration = window.duration.saturating_add(end.duration);
        window.bytes_in = window.bytes_in.saturating_add(end.bytes_in);
        window.bytes_out = window.bytes_out.saturating_add(end.bytes_out);
        over_bound(&mut self.windows)
            .into_iter()
            .map(|(key, window)| window.into_record(key.0, at))
            .collect()
    }

    /// The records of the windows whose minute ended before `now`, or of
    /// every window (`all`, at shutdown).
    pub fn take(&mut self, now: OffsetDateTime, all: bool) -> Vec<AuditRecord> {
        due(&mut self.windows, now, all)
            .into_iter()
            .map(|(key, window)| window.into_record(key.0, now))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}

impl Window {
    fn into_record(self, minute: i64, at: OffsetDateTime) -> AuditRecord {
        let result = if self.failed == 0 {
            outcome::SUCCESS
        } else {
            outcome::FAILED
        };
        let call = Call {
            nodes: self.nodes.into_iter().collect(),
            ..self.call
        };
        let mut record = base(&self.caller, &call, result, at);
        let (status, message) = self.last_failure.unwrap_or((GRPC_OK, None));
        set_end(
            &mut record,
            &CallEnd {
                grpc_status: status,
                grpc_message: message,
                duration: self.duration,
                bytes_in: self.bytes_in,
                bytes_out: self.bytes_out,
            },
        );
        set(&mut record, key::CALLS, json!(self.calls));
        let statuses: serde_json::Map<String, Value> = self
            .statuses
            .into_iter()
            .map(|(status, count)| (status.to_string(), json!(count)))
            .collect();
        set(&mut record, "statuses", Value::Object(statuses));
        let start = OffsetDateTime::from_unix_timestamp(minute * 60).unwrap_or(OffsetDateTime::UNIX_EPOCH);
        set(
            &mut record,
            "window_start",
            json!(talos_sso_api::audit::format_micros(start)),
        );
        record
    }
}

/// Calls the gateway refused, by certificate, reason and minute: the first
/// of each is recorded at once, the rest counted into one record when the
/// minute ends, so that a client repeating a refused call (cheap: nothing
/// is forwarded) adds a bounded number of records.
#[derive(Debug, Default)]
pub struct Refusals {
    windows: BTreeMap<WindowKey, (AuditRecord, u64)>,
}

impl Refusals {
    /// The record to write now (the first refusal of its kind this
    /// minute), or `None` when it is counted. Also the records of windows
    /// pushed out by the bound.
    pub fn add(&mut self, record: AuditRecord, at: OffsetDateTime) -> Vec<AuditRecord> {
        let minute = at.unix_timestamp().div_euclid(60);
        let key = (
            minute,
            record.serial.clone().unwrap_or_default(),
            record.reason_code.clone().unwrap_or_default(),
        );
        if let Some((_, more)) = self.windows.get_mut(&key) {
            *more += 1;
            return Vec::new();
        }
        let mut out = vec![record.clone()];
        self.windows.insert(key, (record, 0));
        out.extend(
            over_bound(&mut self.windows)
                .into_iter()
                .filter_map(|(_, window)| repeated(window, at)),
        );
        out
    }

    /// The counts of the windows whose minute ended before `now`, or of
    /// every window (`all`, at shutdown), as records.
    pub fn take(&mut self, now: OffsetDateTime, all: bool) -> Vec<AuditRecord> {
        due(&mut self.windows, now, all)
            .into_values()
            .filter_map(|window| repeated(window, now))
            .collect()
    }
}

/// The record of the refusals after the first of a window, if any.
fn repeated((first, more): (AuditRecord, u64), at: OffsetDateTime) -> Option<AuditRecord> {
    if more == 0 {
        return None;
    }
    let mut record = first.clone();
    record.occurred_at = at;
    set(&mut record, key::CALLS, json!(more));
    set(&mut record, "repeats", json!(first.request_id));
    Some(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(serial: &str) -> Caller {
        Caller {
            cluster: "prod".into(),
            issuer: Some("login".into()),
            tenant: None,
            subject: Some("sub-1".into()),
            username: Some("alice@example.com".into()),
            serial: serial.into(),
            roles: vec!["os:reader".into()],
            groups: vec![],
            not_after: OffsetDateTime::UNIX_EPOCH,
            client_ip: "192.0.2.1".into(),
        }
    }

    fn end(status: u32) -> CallEnd {
        CallEnd {
            grpc_status: status,
            grpc_message: (status != 0).then(|| "no".to_owned()),
            duration: Duration::from_millis(3),
            bytes_in: 5,
            bytes_out: 7,
        }
    }

    #[test]
    fn a_mutating_call_is_recorded_before_and_after() {
        let call = Call::new(
            "r1",
            "/machine.MachineService/Reboot",
            vec!["10.5.0.2".into()],
            MethodClass::Mutating,
        );
        let at = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let before = started(&caller("0a"), &call, at);
        assert_eq!(
            (before.event.as_str(), before.outcome.as_str()),
            (event::API_CALL, outcome::STARTED)
        );
        assert_eq!(before.details["method"], "/machine.MachineService/Reboot");
        assert_eq!(before.details["nodes"], json!(["10.5.0.2"]));
        assert_eq!(before.details["class"], "mutating");
        assert!(before.details.get("grpc_status").is_none());
        let after = ended(&caller("0a"), &call, &end(7), at);
        assert_eq!(after.outcome, outcome::FAILED);
        assert_eq!(after.details["grpc_status"], 7);
        assert_eq!(after.details["bytes_out"], 7);
        assert_eq!(after.request_id, before.request_id);
    }

    #[test]
    fn read_calls_are_counted_per_certificate_method_and_minute() {
        let mut reads = ReadCalls::default();
        let t0 = OffsetDateTime::from_unix_timestamp(1_800_000_000 / 60 * 60).unwrap();
        let version = Call::new(
            "r",
            "/machine.MachineService/Version",
            vec!["a".into()],
            MethodClass::Read,
        );
        let logs = Call::new(
            "r",
            "/machine.MachineService/Logs",
            vec!["b".into()],
            MethodClass::Read,
        );
        for i in 0..5 {
            assert!(
                reads
                    .add(&caller("0a"), &version, &end(if i == 4 { 14 } else { 0 }), t0)
                    .is_empty()
            );
        }
        reads.add(&caller("0b"), &version, &end(0), t0);
        reads.add(&caller("0a"), &logs, &end(0), t0 + time::Duration::seconds(59));
        reads.add(&caller("0a"), &version, &end(0), t0 + time::Duration::seconds(60));
        // Nothing is due inside the minute.
        assert!(reads.take(t0 + time::Duration::seconds(59), false).is_empty());
        let due = reads.take(t0 + time::Duration::seconds(61), false);
        assert_eq!(due.len(), 3);
        let first = due
            .iter()
            .find(|r| {
                r.serial.as_deref() == Some("0a") && r.details["method"] == "/machine.MachineService/Version"
            })
            .unwrap();
        assert_eq!(first.details["calls"], 5);
        assert_eq!(first.outcome, outcome::FAILED);
        assert_eq!(first.details["grpc_status"], 14);
        assert_eq!(first.details["statuses"], json!({"0": 4, "14": 1}));
        assert_eq!(first.details["bytes_in"], 25);
        // The next minute's window waits, and goes at shutdown.
        assert!(!reads.is_empty());
        assert_eq!(reads.take(t0 + time::Duration::seconds(61), true).len(), 1);
        assert!(reads.is_empty());
    }

    #[test]
    fn the_windows_held_are_bounded() {
        let mut reads = ReadCalls::default();
        let t0 = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let call = Call::new("r", "/machine.MachineService/Version", vec![], MethodClass::Read);
        let mut pushed = 0;
        for i in 0..(MAX_WINDOWS + 3) {
            pushed += reads.add(&caller(&format!("{i:x}")), &call, &end(0), t0).len();
        }
        assert_eq!(pushed, 3);
    }

    #[test]
    fn repeated_refusals_are_counted_not_recorded_one_by_one() {
        let mut refusals = Refusals::default();
        let t0 = OffsetDateTime::from_unix_timestamp(1_800_000_000 / 60 * 60).unwrap();
        let refused = |method: &str| {
            let call = Call::new("r", method, vec![], MethodClass::Mutating);
            denied(&caller("0a"), &call, "gateway_rule", Some("no-reset"), t0)
        };
        assert_eq!(
            refusals.add(refused("/machine.MachineService/Reset"), t0).len(),
            1
        );
        for i in 0..1000 {
            // Other method names do not open new windows.
            assert!(refusals.add(refused(&format!("/x.Y/Z{i}")), t0).is_empty());
        }
        assert!(refusals.take(t0 + time::Duration::seconds(30), false).is_empty());
        let counted = refusals.take(t0 + time::Duration::seconds(61), false);
        assert_eq!(counted.len(), 1);
        assert_eq!(counted[0].details["calls"], 1000);
        assert_eq!(counted[0].reason_code.as_deref(), Some("gateway_rule"));
        assert!(refusals.take(t0 + time::Duration::seconds(200), true).is_empty());
    }

    #[test]
    fn hostile_names_are_bounded() {
        let long = "n".repeat(10_000);
        let nodes = vec![long.clone(); 1000];
        let call = Call::new("r", &long, nodes, MethodClass::Mutating);
        assert_eq!(call.method.len(), MAX_NAME);
        assert_eq!(call.nodes.len(), MAX_NODES);
        assert!(call.nodes.iter().all(|n| n.len() == MAX_NAME));
    }
}
