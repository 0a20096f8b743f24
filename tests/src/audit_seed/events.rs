//! The records of each kind the trail mixes: issuances, refusals, reads
//! of the trail, deny-list changes, break-glass and the rarer ones.

use serde_json::json;
use talos_sso_server::audit::store::{Append, DenyChange, DenyEntry};
use talos_sso_server::audit::{AuditRecord, event, outcome};
use time::{Duration, OffsetDateTime};

use super::rng::Rng;
use super::{Tier, Trail};

impl Trail {
    pub(super) fn issuance(&mut self, at: OffsetDateTime, user: usize) -> Append {
        let cluster = self.cluster();
        if self.denied.contains(&user) {
            let mut r = self.base(at, event::CERTIFICATE_DENIED, outcome::DENIED, user);
            r.cluster = Some(cluster);
            r.roles_requested = self.roles(self.users[user].tier).0;
            r.reason_code = Some("identity_denied".into());
            return plain(r);
        }
        let mut r = self.base(at, event::CERTIFICATE_ISSUED, outcome::SUCCESS, user);
        let (requested, granted) = self.roles(self.users[user].tier);
        r.roles_requested = requested;
        r.roles_granted = granted;
        let signed = whole_seconds(at);
        let ttl = if self.rng.chance(0.1) { 15 } else { 5 };
        r.not_before = Some(signed - Duration::minutes(5));
        r.not_after = Some(signed + Duration::minutes(ttl));
        r.serial = Some(serial(&mut self.rng));
        r.certificate_sha256 = Some(self.rng.hex(64));
        r.public_key_sha256 = Some(self.rng.hex(64));
        r.cluster = Some(cluster.clone());
        self.certificates[user] = Some((
            r.serial.clone().unwrap_or_default(),
            r.roles_granted.clone(),
            cluster.clone(),
        ));
        self.last_issued = Some((
            self.seq + 1,
            user,
            cluster,
            r.serial.clone().unwrap_or_default(),
            r.certificate_sha256.clone().unwrap_or_default(),
        ));
        plain(r)
    }

    pub(super) fn denial(&mut self, at: OffsetDateTime, user: usize) -> Append {
        let code = *self.rng.weighted(&[
            ("no_matching_rule", 25.0),
            ("role_not_permitted", 20.0),
            ("token_expired", 18.0),
            ("rate_limited", 8.0),
            ("ttl_too_long", 7.0),
            ("csr_invalid", 5.0),
            ("token_replayed", 5.0),
            ("token_signature_invalid", 3.0),
            ("role_required", 3.0),
            ("cluster_unknown", 2.0),
        ]);
        let mut r = self.base(at, event::CERTIFICATE_DENIED, outcome::DENIED, user);
        r.reason_code = Some(code.into());
        r.cluster = Some(self.cluster());
        match code {
            "role_not_permitted" => {
                r.roles_requested = vec![
                    if self.rng.chance(0.6) {
                        "os:admin"
                    } else {
                        "os:operator"
                    }
                    .into(),
                ];
            }
            "token_expired" | "token_signature_invalid" => {
                r.identity_verified = false;
                r.groups_evaluated.clear();
            }
            "cluster_unknown" => {
                r.cluster = None;
                r.details =
                    json!({"requested_cluster": if self.rng.chance(0.5) { "production" } else { "prd" }});
            }
            "no_matching_rule" => r.roles_requested = self.roles(self.users[user].tier).0,
            _ => {}
        }
        plain(r)
    }

    pub(super) fn audit_query(&mut self, at: OffsetDateTime) -> Append {
        // Now and then someone outside the security team tries.
        if self.rng.chance(0.05) {
            let user = self.pick_user();
            let mut r = self.base(at, event::AUDIT_QUERY, outcome::DENIED, user);
            r.reason_code = Some("not_an_auditor".into());
            r.details = json!({"action": "list", "filter": {}});
            return plain(r);
        }
        let auditor = self.pick_tier(Tier::Security);
        let mut r = self.base(at, event::AUDIT_QUERY, outcome::SUCCESS, auditor);
        r.details = if self.rng.chance(0.1) {
            json!({"action": "verify"})
        } else {
            let target = self.pick_user();
            let filter = match self.rng.below(4) {
                0 => json!({"since": "7d", "username": self.users[target].username}),
                1 => json!({"since": "30d", "role": "os:admin"}),
                2 => json!({"since": "1d", "outcome": "denied"}),
                _ => json!({"cluster": "prod", "role": "os:admin", "since": "7d"}),
            };
            json!({"action": "list", "filter": filter})
        };
        plain(r)
    }

    pub(super) fn deny_change(&mut self, at: OffsetDateTime) -> Append {
        let admin = self.pick_tier(Tier::Admin);
        // Unblock someone blocked before, or block someone new.
        if !self.denied.is_empty() && self.rng.chance(0.45) {
            let which = self.rng.below(self.denied.len() as u64) as usize;
            let target = self.denied.swap_remove(which);
            let (subject, username) = (
                self.users[target].subject.clone(),
                self.users[target].username.clone(),
            );
            let mut r = self.base(at, event::DENY_REMOVED, outcome::SUCCESS, admin);
            r.details = json!({"target_subject": subject, "target_username": username});
            return Append {
                record: r,
                deny_change: Some(DenyChange::Remove {
                    subject: Some(subject),
                    username: Some(username),
                }),
                ..Append::default()
            };
        }
        let target = loop {
            let t = self.pick_user();
            if !self.denied.contains(&t) && self.users[t].tier != Tier::Security {
                break t;
            }
        };
        self.denied.push(target);
        let reason = match self.rng.below(4) {
            0 => "left the company".to_owned(),
            1 => "laptop reported stolen".to_owned(),
            2 => format!("security investigation INC-{}", 1000 + self.rng.below(9000)),
            _ => "access review: no longer on the platform team".to_owned(),
        };
        let (subject, username) = (
            self.users[target].subject.clone(),
            self.users[target].username.clone(),
        );
        let mut r = self.base(at, event::DENY_ADDED, outcome::SUCCESS, admin);
        r.details = json!({"target_subject": subject, "target_username": username, "reason": reason});
        Append {
            deny_change: Some(DenyChange::Add(DenyEntry {
                subject: Some(subject),
                username: Some(username),
                reason,
                added_by: r.username.clone().unwrap_or_default(),
                added_at: r.occurred_at,
                expires_at: None,
            })),
            record: r,
            ..Append::default()
        }
    }

    pub(super) fn break_glass(&mut self, at: OffsetDateTime) -> Append {
        let request_id = self.rng.hex(32);
        let mut r = AuditRecord::new(event::BREAK_GLASS_ISSUED, outcome::SUCCESS, &request_id, at);
        let host = format!("talos-sso-{}", self.rng.below(3));
        r.cluster = Some("prod".into());
        r.username = Some(format!("break-glass:root@{host}"));
        r.roles_requested = vec!["os:admin".into()];
        r.roles_granted = vec!["os:admin".into()];
        let signed = whole_seconds(at);
        r.not_before = Some(signed - Duration::minutes(5));
        r.not_after = Some(signed + Duration::minutes(30));
        r.serial = Some(serial(&mut self.rng));
        r.certificate_sha256 = Some(self.rng.hex(64));
        r.public_key_sha256 = Some(self.rng.hex(64));
        let admin = self.pick_tier(Tier::Admin);
        let operator = self.users[admin].username.clone();
        r.details = json!({
            "operator": "root", "uid": 0, "login_uid": 1000 + self.rng.below(50),
            "claimed_user": operator, "host": host,
            "reason": "identity provider outage, restoring etcd", "ttl_seconds": 1800,
        });
        plain(r)
    }

    pub(super) fn undelivered(&mut self, at: OffsetDateTime) -> Option<Append> {
        let (seq, user, cluster, serial, sha) = self.last_issued.take()?;
        let mut r = self.base(at, event::CERTIFICATE_UNDELIVERED, outcome::DENIED, user);
        r.cluster = Some(cluster);
        r.serial = Some(serial);
        r.certificate_sha256 = Some(sha);
        r.reason_code = Some("audit_unavailable".into());
        r.details = json!({
            "recorded_seq": seq, "recorded_event": event::CERTIFICATE_ISSUED,
            "reason": "the commit was not acknowledged",
        });
        Some(plain(r))
    }

    pub(super) fn aggregated(&mut self, at: OffsetDateTime) -> Append {
        let request_id = self.rng.hex(32);
        let mut r = AuditRecord::new(event::REFUSALS_AGGREGATED, outcome::DENIED, &request_id, at);
        let code = if self.rng.chance(0.7) {
            "token_signature_invalid"
        } else {
            "rate_limited"
        };
        r.reason_code = Some(code.into());
        r.client_ip = Some(format!("203.0.113.{}", 1 + self.rng.below(250)));
        let count = 1 + self.rng.below(400);
        r.details = json!({
            "event": event::CERTIFICATE_DENIED, "count": count,
            "first_at": talos_sso_server::audit::format_micros(at - Duration::seconds(60)),
            "last_at": talos_sso_server::audit::format_micros(at - Duration::seconds(1)),
            "recorded_first": self.rng.hex(32), "window_seconds": 60,
        });
        plain(r)
    }
}

pub(super) fn plain(record: AuditRecord) -> Append {
    Append {
        record,
        ..Append::default()
    }
}

pub(super) fn whole_seconds(t: OffsetDateTime) -> OffsetDateTime {
    t.replace_nanosecond(0).unwrap_or(t)
}

/// 128 random bits, positive, lowercase hex without leading zero bytes.
pub(super) fn serial(rng: &mut Rng) -> String {
    let hex = format!("{:016x}{:016x}", rng.next_u64() >> 1, rng.next_u64());
    let trimmed = hex.trim_start_matches("00");
    trimmed.to_owned()
}
