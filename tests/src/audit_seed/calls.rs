//! Talos API calls through the gateway (`api.call`): what the people with
//! certificates do with them. Readers read (counted per certificate,
//! method and minute); operators and admins now and then change a node,
//! which is two records with one `request_id` (`started`, then `success`
//! or `failed` when the call ended, the next record of the trail; now and
//! then no end at all), or one `denied` record when the gateway refuses it.

use serde_json::json;
use talos_sso_api::audit::api_call;
use talos_sso_server::audit::{AuditRecord, event, outcome};
use time::OffsetDateTime;

use super::events::{plain, serial};
use super::{Tier, Trail};
use talos_sso_server::audit::store::Append;

/// The nodes of each cluster: `10.5.0.2` is prod's first control plane.
pub const NODES: [(&str, &[&str]); 4] = [
    (
        "prod",
        &[
            "10.5.0.2", "10.5.0.3", "10.5.0.4", "10.5.0.5", "10.5.0.6", "10.5.0.7",
        ],
    ),
    ("staging", &["10.6.0.2", "10.6.0.3", "10.6.0.4"]),
    ("dev", &["10.7.0.2", "10.7.0.3"]),
    ("homelab", &["192.168.10.11", "192.168.10.12"]),
];

/// Read-only methods, by how often they are called.
const READS: [(&str, f64); 7] = [
    ("/cosi.resource.State/List", 30.0),
    ("/cosi.resource.State/Get", 20.0),
    ("/cosi.resource.State/Watch", 10.0),
    ("/machine.MachineService/Version", 15.0),
    ("/machine.MachineService/ServiceList", 10.0),
    ("/machine.MachineService/Logs", 10.0),
    ("/machine.MachineService/EtcdMemberList", 5.0),
];

/// Methods that may change a node, by how often they are called.
const CHANGES: [(&str, f64); 7] = [
    ("/machine.MachineService/Reboot", 35.0),
    ("/machine.MachineService/Restart", 20.0),
    ("/machine.MachineService/ApplyConfiguration", 20.0),
    ("/machine.MachineService/Upgrade", 10.0),
    ("/machine.MachineService/EtcdRemoveMemberByID", 8.0),
    ("/machine.MachineService/EtcdLeaveCluster", 4.0),
    ("/machine.MachineService/Reset", 8.0),
];

/// A call that may change a node, recorded as it started: its end, to be
/// recorded next.
#[derive(Debug, Clone)]
pub(super) struct Ending {
    record: AuditRecord,
    started: OffsetDateTime,
}

impl Trail {
    /// One API call record at `at`; a call that changes a node leaves its
    /// end in `self.ending`.
    pub(super) fn api_call(&mut self, at: OffsetDateTime) -> Append {
        let user = self.pick_user();
        let tier = self.users[user].tier;
        // The cluster is picked for each call (every cluster has its
        // first control plane called often), with the person's last
        // certificate when it is for that cluster.
        let cluster = self.cluster();
        let (serial, roles) = match &self.certificates[user] {
            Some((serial, roles, held)) if *held == cluster => (serial.clone(), roles.clone()),
            _ => {
                let roles = self.roles(tier).1;
                (serial(&mut self.rng), roles)
            }
        };
        let nodes = self.nodes(&cluster);
        let changes = matches!(tier, Tier::Operator | Tier::Admin) && self.rng.chance(0.5);
        let mut r = self.base(at, event::API_CALL, outcome::SUCCESS, user);
        // An mTLS call: the certificate says who, no token, no CLI.
        r.token_id = None;
        r.token_issued_at = None;
        r.user_agent = Some("talosctl v1.9.1 (grpc-go/1.66.2)".into());
        r.client_version = None;
        r.groups_evaluated.clear();
        r.cluster = Some(cluster.clone());
        r.roles_granted = roles.clone();
        r.serial = Some(serial);
        if !changes {
            let method = *self.rng.weighted(&READS);
            let failed = self.rng.chance(0.03);
            let most = if self.rng.chance(0.7) { 3 } else { 60 };
            let calls = 1 + self.rng.below(most);
            r.outcome = if failed { outcome::FAILED } else { outcome::SUCCESS }.into();
            r.details = json!({
                api_call::METHOD: method, api_call::NODES: nodes, api_call::CLASS: api_call::CLASS_READ,
                api_call::GRPC_STATUS: if failed { 14 } else { 0 },
                api_call::DURATION_MS: 2 + self.rng.below(400), api_call::BYTES_IN: 40 * calls,
                api_call::BYTES_OUT: (200 + self.rng.below(20_000)) * calls, api_call::CALLS: calls,
            });
            if failed {
                r.details[api_call::GRPC_MESSAGE] = json!("connection error: connection refused");
            }
            return plain(r);
        }
        let method = *self.rng.weighted(&CHANGES);
        // Operators may not reset or take a member out of etcd.
        let refused = tier == Tier::Operator && method.contains("Reset")
            || tier == Tier::Operator && method.contains("Etcd") && self.rng.chance(0.8);
        if refused {
            r.outcome = outcome::DENIED.into();
            r.reason_code = Some("gateway_rule".into());
            r.details = json!({
                api_call::METHOD: method, api_call::NODES: nodes, api_call::CLASS: api_call::CLASS_MUTATING,
                api_call::RULE: "destructive-needs-os:admin", api_call::CALLS: 1,
            });
            return plain(r);
        }
        r.outcome = outcome::STARTED.into();
        r.details = json!({
            api_call::METHOD: method, api_call::NODES: nodes, api_call::CLASS: api_call::CLASS_MUTATING,
            api_call::CALLS: 1,
        });
        // Now and then the end is never recorded (the gateway stopped
        // while the call ran): `started` alone.
        if self.rng.chance(0.03) {
            return plain(r);
        }
        let mut end = r.clone();
        let failed = self.rng.chance(0.1);
        end.outcome = if failed { outcome::FAILED } else { outcome::SUCCESS }.into();
        end.details[api_call::GRPC_STATUS] = json!(if failed { 13 } else { 0 });
        if failed {
            end.details[api_call::GRPC_MESSAGE] = json!("failed to apply: node is not ready");
        }
        end.details[api_call::BYTES_IN] = json!(64 + self.rng.below(4000));
        end.details[api_call::BYTES_OUT] = json!(16 + self.rng.below(200));
        self.ending = Some(Ending {
            record: end,
            started: r.occurred_at,
        });
        plain(r)
    }

    /// The end of the call that started last, at `at`.
    pub(super) fn call_ended(&mut self, at: OffsetDateTime) -> Option<Append> {
        let Ending { mut record, started } = self.ending.take()?;
        record.occurred_at = at;
        record.details[api_call::DURATION_MS] = json!((at - started).whole_milliseconds());
        Some(plain(record))
    }

    /// One node of `cluster` mostly, now and then two or three.
    fn nodes(&mut self, cluster: &str) -> Vec<String> {
        let all = NODES
            .iter()
            .find(|(name, _)| *name == cluster)
            .map_or(&NODES[0].1, |(_, nodes)| nodes);
        let count = if self.rng.chance(0.8) {
            1
        } else {
            2 + self.rng.below(2) as usize
        };
        // The first control plane is where people go first.
        let first = if self.rng.chance(0.6) {
            0
        } else {
            self.rng.below(all.len() as u64) as usize
        };
        (0..count.min(all.len()))
            .map(|i| all[(first + i) % all.len()].to_owned())
            .collect()
    }
}
