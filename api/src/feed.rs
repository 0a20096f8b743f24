//! Feeds of the audit trail for a SIEM: the lines of `GET /v1/audit/stream`
//! (JSON lines, one record per line, with heartbeats and a last line that
//! says why the stream ended), and the mapping of a record to the Elastic
//! Common Schema that `talos-sso audit export --output ecs` prints.
//!
//! A record on the stream is exactly the [`StoredRecord`] `GET /v1/audit`
//! serves (with `seq`, `prev_hash` and `hash`), so that a feed can be
//! verified against the chain like any page.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::audit::{StoredRecord, api_call, event, format_micros, outcome, workload};

/// The path of the follow stream; it takes the filters of `GET /v1/audit`.
pub const STREAM_PATH: &str = "/v1/audit/stream";

/// The media type of the stream: one JSON text per line.
pub const STREAM_CONTENT_TYPE: &str = "application/x-ndjson";

/// Why a stream ended, in its last line ([`StreamEnd::end`]).
pub mod end {
    /// The token the stream was opened with expired: reconnect with a fresh
    /// one (the caller's rights are checked again then).
    pub const TOKEN_EXPIRED: &str = "token_expired";
    /// The server is shutting down: reconnect (another replica answers).
    pub const SHUTTING_DOWN: &str = "shutting_down";
    /// The trail could not be read: reconnect later.
    pub const AUDIT_UNAVAILABLE: &str = "audit_unavailable";
    /// The caller may no longer read the trail: the running configuration
    /// no longer makes them an auditor (it was reloaded), or they are on
    /// the deny list. A reconnection is refused, saying why.
    pub const ACCESS_REVOKED: &str = "access_revoked";
}

/// Sent when nothing else was for a while, so that proxies keep the
/// connection: every record after `cursor` that matches is still to come.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// The server's time (RFC 3339 UTC).
    pub heartbeat: String,
    /// Reconnect with this `cursor` to miss nothing and repeat nothing.
    pub cursor: i64,
}

/// The last line of a stream that the server ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamEnd {
    /// One of [`end`].
    pub end: String,
    /// Reconnect with this `cursor`.
    pub cursor: i64,
}

/// One line of the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StreamLine {
    Heartbeat(Heartbeat),
    End(StreamEnd),
    /// A record as `GET /v1/audit` serves it; its `seq` is the cursor.
    Record(Box<StoredRecord>),
}

impl StreamLine {
    /// The line as sent: compact JSON and a newline.
    pub fn to_line(&self) -> Vec<u8> {
        // Serializing these types cannot fail: every map key is a string.
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// The ECS version the mapping follows.
pub const ECS_VERSION: &str = "8.11.0";

/// ECS `event.category` and `event.type` of an event, from ECS's allowed
/// values: certificates are authentications (a credential handed out or
/// refused; the gateway's own `os:impersonator` certificate too, which is
/// a credential handed out like the others), deny-list changes are
/// identity management, reading the trail is database access. A Talos
/// API call is `api` (ECS's category for calls to an API, RPC included):
/// of its types, `change` when the call may change a node (`class`
/// `mutating`), `access` when it reads; not `process`, which is about
/// processes started and ended on a host.
fn categories(name: &str, class: Option<&str>) -> (&'static [&'static str], &'static [&'static str]) {
    match name {
        event::API_CALL if class == Some(api_call::CLASS_MUTATING) => (&["api"], &["change"]),
        event::API_CALL => (&["api"], &["access"]),
        event::CERTIFICATE_ISSUED
        | event::CERTIFICATE_DENIED
        | event::BREAK_GLASS_ISSUED
        | event::GATEWAY_CERTIFICATE_ISSUED => (&["authentication"], &["start"]),
        event::CERTIFICATE_UNDELIVERED | event::REFUSALS_AGGREGATED => (&["authentication"], &["info"]),
        event::DENY_ADDED => (&["iam"], &["user", "change"]),
        event::DENY_REMOVED => (&["iam"], &["user", "change"]),
        event::DENY_LISTED => (&["iam"], &["user", "info"]),
        event::AUDIT_QUERY => (&["database"], &["access"]),
        event::RECORD_REFUSED => (&["database"], &["error"]),
        event::CONFIG_RELOADED => (&["configuration"], &["change"]),
        _ => (&[], &["info"]),
    }
}

/// Sets `key` to `value` unless it is `None`/empty: ECS documents carry the
/// fields that have a value.
fn put(object: &mut Map<String, Value>, key: &str, value: Value) {
    let empty = match &value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(fields) => fields.is_empty(),
        Value::String(text) => text.is_empty(),
        _ => false,
    };
    if !empty {
        object.insert(key.to_owned(), value);
    }
}

fn object(pairs: &[(&str, Value)]) -> Value {
    let mut out = Map::new();
    for (key, value) in pairs {
        put(&mut out, key, value.clone());
    }
    Value::Object(out)
}

/// The record as an ECS document. `server_version` is the server's
/// (`service.version`), when known. What ECS has no field for is under
/// `talos_sso.*`, with the record's own names.
pub fn ecs_document(stored: &StoredRecord, server_version: Option<&str>) -> Value {
    let record = &stored.record;
    let class = record.details.get(api_call::CLASS).and_then(Value::as_str);
    let (category, kind) = categories(&record.event, class);
    // ECS has three outcomes: a call that only started has none yet.
    let ecs_outcome = match record.outcome.as_str() {
        outcome::SUCCESS => "success",
        outcome::DENIED | outcome::FAILED => "failure",
        _ => "unknown",
    };
    let time = |t: &Option<time::OffsetDateTime>| t.map(format_micros).map_or(Value::Null, Value::from);
    let certificate = record.serial.as_ref().map(|serial| {
        json!({
            "x509": object(&[
                ("serial_number", json!(serial.to_ascii_uppercase())),
                ("not_before", time(&record.not_before)),
                ("not_after", time(&record.not_after)),
                ("subject", object(&[
                    ("common_name", json!(record.username.iter().collect::<Vec<_>>())),
                    ("organization", json!(record.roles_granted)),
                ])),
            ]),
            "hash": object(&[("sha256", json!(record.certificate_sha256))]),
        })
    });
    let mut related_hashes: Vec<&String> = Vec::new();
    related_hashes.extend(&record.certificate_sha256);
    related_hashes.extend(&record.public_key_sha256);
    let mut related_users: Vec<&String> = Vec::new();
    related_users.extend(&record.username);
    related_users.extend(
        record
            .subject
            .iter()
            .filter(|s| Some(*s) != record.username.as_ref()),
    );

    let mut doc = Map::new();
    doc.insert("@timestamp".into(), json!(format_micros(record.occurred_at)));
    doc.insert("ecs".into(), json!({"version": ECS_VERSION}));
    doc.insert(
        "event".into(),
        object(&[
            ("kind", json!("event")),
            ("category", json!(category)),
            ("type", json!(kind)),
            ("action", json!(record.event)),
            ("outcome", json!(ecs_outcome)),
            ("reason", json!(record.reason_code)),
            ("sequence", json!(stored.seq)),
            ("hash", json!(stored.hash)),
            ("dataset", json!("talos_sso.audit")),
            ("module", json!("talos_sso")),
            ("provider", json!("talos-sso-server")),
        ]),
    );
    put(
        &mut doc,
        "user",
        object(&[
            ("id", json!(record.subject)),
            ("name", json!(record.username)),
            ("domain", json!(record.tenant)),
            ("roles", json!(record.roles_granted)),
        ]),
    );
    put(&mut doc, "source", object(&[("ip", json!(record.client_ip))]));
    put(
        &mut doc,
        "user_agent",
        object(&[("original", json!(record.user_agent))]),
    );
    put(
        &mut doc,
        "http",
        object(&[("request", object(&[("id", json!(record.request_id))]))]),
    );
    if let Some(certificate) = certificate {
        doc.insert("tls".into(), json!({"client": certificate}));
    }
    put(
        &mut doc,
        "related",
        object(&[
            ("user", json!(related_users)),
            ("ip", json!(record.client_ip.iter().collect::<Vec<_>>())),
            ("hash", json!(related_hashes)),
        ]),
    );
    doc.insert(
        "service".into(),
        object(&[
            ("name", json!("talos-sso")),
            ("type", json!("talos-sso")),
            ("version", json!(server_version)),
        ]),
    );
    // A workload's kind and issuer are what a SIEM rule keys on (every
    // GitHub Actions certificate, one issuer's refusals): labels, ECS's
    // keyword pairs for that; the rest stays under `talos_sso.details`.
    let workload_field = |key: &str| {
        record
            .details
            .get(workload::KEY)
            .and_then(|w| w.get(key))
            .and_then(Value::as_str)
            .map_or(Value::Null, Value::from)
    };
    put(
        &mut doc,
        "labels",
        object(&[
            ("cluster", json!(record.cluster)),
            ("workload_kind", workload_field(workload::KIND)),
            ("workload_issuer", workload_field(workload::ISSUER)),
        ]),
    );
    let details = match &record.details {
        Value::Object(fields) if fields.is_empty() => Value::Null,
        other => other.clone(),
    };
    doc.insert(
        "talos_sso".into(),
        object(&[
            ("seq", json!(stored.seq)),
            ("prev_hash", json!(stored.prev_hash)),
            ("hash", json!(stored.hash)),
            ("cluster", json!(record.cluster)),
            ("issuer", json!(record.issuer)),
            ("tenant", json!(record.tenant)),
            ("identity_verified", json!(record.identity_verified)),
            ("groups_evaluated", json!(record.groups_evaluated)),
            ("roles_requested", json!(record.roles_requested)),
            ("roles_granted", json!(record.roles_granted)),
            ("public_key_sha256", json!(record.public_key_sha256)),
            ("client_version", json!(record.client_version)),
            ("token_id", json!(record.token_id)),
            ("token_issued_at", time(&record.token_issued_at)),
            ("details", details),
        ]),
    );
    Value::Object(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditRecord;

    fn stored(name: &str, outcome: &str) -> StoredRecord {
        let at = time::macros::datetime!(2026-12-01 12:00:00.123456 UTC);
        let mut record = AuditRecord::new(name, outcome, "req-1", at);
        record.subject = Some("oid-1".into());
        record.username = Some("alice@example.com".into());
        record.tenant = Some("tid-1".into());
        record.client_ip = Some("203.0.113.7".into());
        record.user_agent = Some("talos-sso/1.0".into());
        record.cluster = Some("prod".into());
        StoredRecord {
            seq: 42,
            record,
            prev_hash: "p".repeat(64),
            hash: "h".repeat(64),
        }
    }

    #[test]
    fn every_event_maps_to_ecs_categories_and_an_outcome() {
        let expected: [(&str, &[&str], &[&str]); 13] = [
            (event::CERTIFICATE_ISSUED, &["authentication"], &["start"]),
            (event::CERTIFICATE_DENIED, &["authentication"], &["start"]),
            (event::BREAK_GLASS_ISSUED, &["authentication"], &["start"]),
            (event::CERTIFICATE_UNDELIVERED, &["authentication"], &["info"]),
            (event::DENY_ADDED, &["iam"], &["user", "change"]),
            (event::DENY_REMOVED, &["iam"], &["user", "change"]),
            (event::DENY_LISTED, &["iam"], &["user", "info"]),
            (event::AUDIT_QUERY, &["database"], &["access"]),
            (event::RECORD_REFUSED, &["database"], &["error"]),
            (event::REFUSALS_AGGREGATED, &["authentication"], &["info"]),
            (event::CONFIG_RELOADED, &["configuration"], &["change"]),
            // A record without a `class` is taken to read.
            (event::API_CALL, &["api"], &["access"]),
            (event::GATEWAY_CERTIFICATE_ISSUED, &["authentication"], &["start"]),
        ];
        assert_eq!(expected.len(), event::ALL.len());
        for (name, category, kind) in expected {
            for (outcome, ecs_outcome) in [
                (outcome::SUCCESS, "success"),
                (outcome::DENIED, "failure"),
                (outcome::FAILED, "failure"),
                (outcome::STARTED, "unknown"),
            ] {
                let doc = ecs_document(&stored(name, outcome), Some("1.2.3"));
                assert_eq!(doc["event"]["action"], name);
                assert_eq!(doc["event"]["kind"], "event");
                assert_eq!(doc["event"]["category"], json!(category), "{name}");
                assert_eq!(doc["event"]["type"], json!(kind), "{name}");
                assert_eq!(doc["event"]["outcome"], ecs_outcome);
                assert_eq!(doc["event"]["sequence"], 42);
                assert_eq!(doc["event"]["hash"], "h".repeat(64));
                assert_eq!(doc["@timestamp"], "2026-12-01T12:00:00.123456Z");
                assert_eq!(doc["user"]["id"], "oid-1");
                assert_eq!(doc["user"]["name"], "alice@example.com");
                assert_eq!(doc["user"]["domain"], "tid-1");
                assert_eq!(doc["source"]["ip"], "203.0.113.7");
                assert_eq!(doc["user_agent"]["original"], "talos-sso/1.0");
                assert_eq!(
                    doc["service"],
                    json!({"name": "talos-sso", "type": "talos-sso", "version": "1.2.3"})
                );
                assert_eq!(doc["labels"]["cluster"], "prod");
                assert_eq!(doc["talos_sso"]["prev_hash"], "p".repeat(64));
                assert_eq!(doc["http"]["request"]["id"], "req-1");
                assert!(doc.get("tls").is_none(), "no certificate, no tls.client");
            }
        }
    }

    #[test]
    fn an_issued_certificate_maps_to_tls_client_x509() {
        let mut issued = stored(event::CERTIFICATE_ISSUED, outcome::SUCCESS);
        let r = &mut issued.record;
        r.serial = Some("0a1b2c".into());
        r.roles_granted = vec!["os:operator".into(), "os:reader".into()];
        r.roles_requested = vec!["os:operator".into()];
        r.not_before = Some(time::macros::datetime!(2026-12-01 11:59:30 UTC));
        r.not_after = Some(time::macros::datetime!(2026-12-01 12:05:00 UTC));
        r.certificate_sha256 = Some("c".repeat(64));
        r.public_key_sha256 = Some("k".repeat(64));
        r.reason_code = None;
        r.details = json!({"note": "x"});
        let doc = ecs_document(&issued, None);
        let x509 = &doc["tls"]["client"]["x509"];
        assert_eq!(x509["serial_number"], "0A1B2C");
        assert_eq!(x509["not_before"], "2026-12-01T11:59:30.000000Z");
        assert_eq!(x509["not_after"], "2026-12-01T12:05:00.000000Z");
        assert_eq!(x509["subject"]["common_name"], json!(["alice@example.com"]));
        assert_eq!(
            x509["subject"]["organization"],
            json!(["os:operator", "os:reader"])
        );
        assert_eq!(doc["tls"]["client"]["hash"]["sha256"], "c".repeat(64));
        assert_eq!(doc["user"]["roles"], json!(["os:operator", "os:reader"]));
        assert_eq!(doc["related"]["hash"], json!(["c".repeat(64), "k".repeat(64)]));
        assert_eq!(doc["related"]["user"], json!(["alice@example.com", "oid-1"]));
        assert_eq!(doc["talos_sso"]["roles_requested"], json!(["os:operator"]));
        assert_eq!(doc["talos_sso"]["details"], json!({"note": "x"}));
        assert!(doc["event"].get("reason").is_none());
        assert!(doc["service"].get("version").is_none());
        let mut denied = stored(event::CERTIFICATE_DENIED, outcome::DENIED);
        denied.record.reason_code = Some("no_matching_rule".into());
        assert_eq!(ecs_document(&denied, None)["event"]["reason"], "no_matching_rule");
    }

    #[test]
    fn an_api_call_maps_to_ecs_api_by_its_class() {
        let mut call = stored(event::API_CALL, outcome::STARTED);
        call.record.details = json!({
            "method": "/machine.MachineService/Reboot", "nodes": ["10.5.0.2"], "class": "mutating",
        });
        let doc = ecs_document(&call, None);
        assert_eq!(doc["event"]["category"], json!(["api"]));
        assert_eq!(doc["event"]["type"], json!(["change"]));
        assert_eq!(doc["event"]["outcome"], "unknown");
        assert_eq!(doc["talos_sso"]["details"]["nodes"], json!(["10.5.0.2"]));
        call.record.details["class"] = json!("read");
        assert_eq!(ecs_document(&call, None)["event"]["type"], json!(["access"]));
        assert_eq!(outcome::ALL.len(), 4, "an outcome this test does not map");
    }

    #[test]
    fn a_workload_certificate_labels_its_kind_and_issuer() {
        let mut issued = stored(event::CERTIFICATE_ISSUED, outcome::SUCCESS);
        issued.record.details = json!({"workload": {
            "kind": "github-actions", "issuer": "github", "rules": ["deploy"],
            "claims": {"repository": "acme/infra"}, "token_use": 1, "token_uses_max": 1,
        }});
        let doc = ecs_document(&issued, None);
        assert_eq!(
            doc["labels"],
            json!({"cluster": "prod", "workload_kind": "github-actions", "workload_issuer": "github"})
        );
        assert_eq!(doc["event"]["category"], json!(["authentication"]));
        assert_eq!(
            doc["talos_sso"]["details"]["workload"]["claims"]["repository"],
            "acme/infra"
        );
        // A person's record has no workload labels; nor has a workload
        // object whose kind is not text.
        let person = ecs_document(&stored(event::CERTIFICATE_ISSUED, outcome::SUCCESS), None);
        assert_eq!(person["labels"], json!({"cluster": "prod"}));
        issued.record.details = json!({"workload": {"kind": 7}});
        assert_eq!(ecs_document(&issued, None)["labels"], json!({"cluster": "prod"}));
    }

    #[test]
    fn stream_lines_read_back_as_what_was_sent() {
        let lines = [
            StreamLine::Record(Box::new(stored(event::AUDIT_QUERY, outcome::SUCCESS))),
            StreamLine::Heartbeat(Heartbeat {
                heartbeat: "2026-12-01T12:00:00.000000Z".into(),
                cursor: 42,
            }),
            StreamLine::End(StreamEnd {
                end: end::TOKEN_EXPIRED.into(),
                cursor: 42,
            }),
        ];
        for line in lines {
            let bytes = line.to_line();
            assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
            assert_eq!(bytes.last(), Some(&b'\n'));
            let back: StreamLine = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(back, line);
        }
    }
}
