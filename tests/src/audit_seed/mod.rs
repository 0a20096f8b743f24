//! A realistic audit trail, made up: the records a company's talos-sso
//! server would write over a few months, deterministic from a seed, for
//! measuring queries on a large trail (`seed-audit`, `audit-queries`) and
//! for checking the documented SQL against known answers (the `audit_sql`
//! tests).
//!
//! What it looks like: a few clusters, a few thousand people with Entra
//! subjects, mostly `os:reader`, some on-call `os:operator`, a few platform
//! admins who ask for `os:admin` now and then; about one request in ten
//! refused, with the codes the server really uses; client addresses from the
//! company's own ranges ([`COMPANY_RANGES`]), each person mostly from the
//! same few, and now and then from an address outside them; traffic by
//! office hours over the days before `until`; the security team reading the
//! trail (`audit.query`); admins blocking and unblocking people (`deny.added`,
//! `deny.removed`, with the deny list changed in the same transaction), and
//! the blocked ones refused `identity_denied` meanwhile; a few break-glass
//! certificates, undelivered certificates and aggregated refusals; and,
//! when the plan asks for them, Talos API calls through the gateway
//! (`api.call`, [`calls`]).
//!
//! Records come out in time order, each as the [`Append`] the server would
//! hand the store, so that they are hash-chained by the store itself.

use talos_sso_server::audit::store::{Append, AuditStore};
use talos_sso_server::audit::{AuditRecord, StoredRecord};
use time::{Duration, OffsetDateTime};

mod calls;
mod events;
mod people;
mod rng;

pub use calls::NODES;
use events::whole_seconds;
use people::make_users;
pub use people::{Tier, User};
pub use rng::Rng;

/// A made-up trail of `records` records over the `days` before now, from
/// `seed`, appended to `store` a thousand at a time (the tests' large
/// trails).
pub async fn seed_store(store: &AuditStore, records: u64, seed: u64, days: u32) {
    let plan = SeedPlan {
        records,
        seed,
        until: OffsetDateTime::now_utc(),
        days,
        users: 100,
        api_calls: 0.0,
    };
    let trail: Vec<_> = Trail::new(&plan).collect();
    for batch in trail.chunks(1000) {
        store.append_batch(batch).await.expect("a seeded batch");
    }
}

/// `records` appended to `store` as they are, in one batch, and what the
/// store made of them: for tests of records that no part of the server
/// under test writes (and for test crates that do not depend on the
/// server's).
pub async fn append_records(store: &AuditStore, records: Vec<AuditRecord>) -> Vec<StoredRecord> {
    let batch: Vec<Append> = records
        .into_iter()
        .map(|record| Append {
            record,
            ..Append::default()
        })
        .collect();
    let appended = store.append_batch(&batch).await.expect("the records appended");
    appended.iter().map(|a| a.stored().clone()).collect()
}

/// The company's own client address ranges: offices, VPN pools, the IPv6
/// office network. Everything else is unusual.
pub const COMPANY_RANGES: [&str; 4] = [
    "10.20.0.0/16",
    "10.40.0.0/16",
    "172.20.0.0/16",
    "2001:db8:4000::/48",
];

/// The clusters the server knows, busiest first.
pub const CLUSTERS: [&str; 4] = ["prod", "staging", "dev", "homelab"];

pub const ISSUER: &str = "https://login.microsoftonline.com/5b1a0c2e-7d3f-4e8a-9b6c-1f2e3d4c5b6a/v2.0";
pub const TENANT: &str = "5b1a0c2e-7d3f-4e8a-9b6c-1f2e3d4c5b6a";

const GROUP_READERS: &str = "9a1c0000-0000-4000-8000-00000000a001";
const GROUP_ONCALL: &str = "9a1c0000-0000-4000-8000-00000000a002";
const GROUP_PLATFORM_ADMINS: &str = "9a1c0000-0000-4000-8000-00000000a003";
const GROUP_SECURITY: &str = "9a1c0000-0000-4000-8000-00000000a004";

/// What to make.
#[derive(Debug, Clone)]
pub struct SeedPlan {
    /// How many records in all.
    pub records: u64,
    /// The same seed (and `until`) makes the same trail.
    pub seed: u64,
    /// The newest record is shortly before this time.
    pub until: OffsetDateTime,
    /// Records are spread over this many days before `until`.
    pub days: u32,
    /// How many people.
    pub users: usize,
    /// The share of records that are Talos API calls (0 to 1). With none
    /// (0), a seed makes the trail it made before the gateway recorded
    /// calls: no random number is drawn for them.
    pub api_calls: f64,
}

impl SeedPlan {
    /// A million records over 90 days, 3000 people.
    pub fn new(records: u64, until: OffsetDateTime) -> Self {
        Self {
            records,
            seed: 1,
            until,
            days: 90,
            users: 3000,
            api_calls: 0.0,
        }
    }
}

/// Relative traffic in an hour: office hours on weekdays (UTC), a little
/// in the evening, hardly any at night or at weekends.
fn hour_weight(start: OffsetDateTime, rng: &mut Rng) -> f64 {
    let hour = start.hour();
    let base = match hour {
        7..=16 => 1.0,
        17..=21 => 0.3,
        _ => 0.05,
    };
    let weekend = matches!(start.weekday(), time::Weekday::Saturday | time::Weekday::Sunday);
    base * if weekend { 0.15 } else { 1.0 } * (0.8 + 0.4 * rng.unit())
}

/// The trail, one [`Append`] at a time, oldest first.
#[derive(Debug)]
pub struct Trail {
    rng: Rng,
    users: Vec<User>,
    /// Cumulative user weights, for picking who acts.
    cumulative: Vec<f64>,
    /// Per hour of the period: its start and how many records it holds.
    hours: Vec<(OffsetDateTime, u64)>,
    next_hour: usize,
    /// The current hour's record times, latest first (popped from the end).
    pending: Vec<OffsetDateTime>,
    /// The seq the next record will get (the trail starts empty).
    seq: i64,
    /// People on the deny list now (indexes into `users`).
    denied: Vec<usize>,
    /// Recent issuances that could be reported undelivered: (seq, user, cluster, serial, certificate sha).
    last_issued: Option<(i64, usize, String, String, String)>,
    /// [`SeedPlan::api_calls`].
    api_calls: f64,
    /// Each person's last certificate: serial, roles, cluster (their API
    /// calls are made with it).
    certificates: Vec<Option<(String, Vec<String>, String)>>,
    /// A call that changes a node, started: its end is the next record.
    ending: Option<calls::Ending>,
}

impl Trail {
    pub fn new(plan: &SeedPlan) -> Self {
        let mut rng = Rng::new(plan.seed);
        let users = make_users(&mut rng, plan.users);
        let mut total = 0.0;
        let cumulative = users
            .iter()
            .map(|u| {
                total += u.weight;
                total
            })
            .collect();
        // Whole hours, ending at the hour before `until`'s minute.
        let end = plan.until.replace_nanosecond(0).unwrap_or(plan.until) - Duration::minutes(1);
        let hours_total = i64::from(plan.days.max(1)) * 24;
        let starts: Vec<OffsetDateTime> = (0..hours_total)
            .map(|h| end - Duration::hours(hours_total - h))
            .collect();
        let weights: Vec<f64> = starts.iter().map(|s| hour_weight(*s, &mut rng)).collect();
        let sum: f64 = weights.iter().sum();
        let mut before = 0.0;
        let mut given = 0u64;
        let hours = starts
            .into_iter()
            .zip(weights)
            .map(|(start, w)| {
                before += w;
                let upto = ((before / sum) * plan.records as f64).round() as u64;
                let upto = upto.min(plan.records);
                let count = upto - given;
                given = upto;
                (start, count)
            })
            .collect();
        let people = users.len();
        Self {
            rng,
            users,
            cumulative,
            hours,
            next_hour: 0,
            pending: Vec::new(),
            seq: 0,
            denied: Vec::new(),
            last_issued: None,
            api_calls: plan.api_calls,
            certificates: vec![None; people],
            ending: None,
        }
    }

    pub fn users(&self) -> &[User] {
        &self.users
    }

    fn next_time(&mut self) -> Option<OffsetDateTime> {
        while self.pending.is_empty() {
            let (start, count) = *self.hours.get(self.next_hour)?;
            self.next_hour += 1;
            let mut times: Vec<OffsetDateTime> = (0..count)
                .map(|_| start + Duration::microseconds(self.rng.below(3_600_000_000) as i64))
                .collect();
            times.sort_unstable_by(|a, b| b.cmp(a));
            self.pending = times;
        }
        self.pending.pop()
    }

    fn pick_user(&mut self) -> usize {
        let total = self.cumulative.last().copied().unwrap_or(1.0);
        let x = self.rng.unit() * total;
        self.cumulative
            .partition_point(|c| *c <= x)
            .min(self.users.len() - 1)
    }

    fn pick_tier(&mut self, tier: Tier) -> usize {
        loop {
            let i = self.rng.below(self.users.len() as u64) as usize;
            if self.users[i].tier == tier {
                return i;
            }
        }
    }

    /// Where this person's request came from: mostly their office or
    /// their VPN pool; now and then from outside the company.
    fn client_ip(&mut self, user: usize) -> String {
        match self.rng.below(1000) {
            0..=5 => match self.rng.below(3) {
                0 => format!("198.51.100.{}", 1 + self.rng.below(250)),
                1 => format!("203.0.113.{}", 1 + self.rng.below(250)),
                _ => format!("2001:db8:ffff::{:x}", 1 + self.rng.below(60000)),
            },
            6..=600 => self.users[user].office_ip.clone(),
            _ => format!("{}.{}", self.users[user].vpn_prefix, 1 + self.rng.below(250)),
        }
    }

    fn base(&mut self, at: OffsetDateTime, ev: &str, out: &str, user: usize) -> AuditRecord {
        let request_id = self.rng.hex(32);
        let mut r = AuditRecord::new(ev, out, &request_id, at);
        let u = &self.users[user];
        r.issuer = Some(ISSUER.into());
        r.tenant = Some(TENANT.into());
        r.subject = Some(u.subject.clone());
        r.username = Some(u.username.clone());
        r.identity_verified = true;
        r.groups_evaluated = match u.tier {
            Tier::Reader => vec![GROUP_READERS.into()],
            Tier::Operator => vec![GROUP_READERS.into(), GROUP_ONCALL.into()],
            Tier::Admin => vec![GROUP_ONCALL.into(), GROUP_PLATFORM_ADMINS.into()],
            Tier::Security => vec![GROUP_READERS.into(), GROUP_SECURITY.into()],
        };
        r.client_ip = Some(self.client_ip(user));
        r.user_agent = Some(
            if self.rng.chance(0.9) {
                "talos-sso/0.1.0"
            } else {
                "talos-sso/0.0.9"
            }
            .into(),
        );
        r.client_version = r
            .user_agent
            .as_deref()
            .and_then(|a| a.strip_prefix("talos-sso/"))
            .map(Into::into);
        let token_id: String = (0..22)
            .map(|_| {
                const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
                ALPHABET[self.rng.below(64) as usize] as char
            })
            .collect();
        r.token_id = Some(token_id);
        r.token_issued_at = Some(whole_seconds(
            at - Duration::minutes(5 + self.rng.below(30) as i64),
        ));
        r
    }

    fn cluster(&mut self) -> String {
        (*self
            .rng
            .weighted(&[("prod", 0.4), ("staging", 0.3), ("dev", 0.2), ("homelab", 0.1)]))
        .to_owned()
    }

    /// The roles asked for and the ones a successful request gets.
    fn roles(&mut self, tier: Tier) -> (Vec<String>, Vec<String>) {
        let v = |roles: &[&str]| roles.iter().map(|r| (*r).to_owned()).collect::<Vec<_>>();
        match tier {
            Tier::Reader | Tier::Security => {
                if self.rng.chance(0.1) {
                    (v(&["os:reader"]), v(&["os:reader"]))
                } else {
                    (v(&[]), v(&["os:reader"]))
                }
            }
            Tier::Operator => match self.rng.below(20) {
                0 => (v(&["os:etcd:backup"]), v(&["os:etcd:backup"])),
                1..=3 => (v(&["os:reader"]), v(&["os:reader"])),
                _ => (v(&[]), v(&["os:operator"])),
            },
            Tier::Admin => match self.rng.below(10) {
                0..=3 => (v(&["os:admin"]), v(&["os:admin"])),
                4 => (
                    v(&["os:admin", "os:etcd:backup"]),
                    v(&["os:admin", "os:etcd:backup"]),
                ),
                _ => (v(&[]), v(&["os:operator"])),
            },
        }
    }
}

impl Iterator for Trail {
    type Item = Append;

    fn next(&mut self) -> Option<Append> {
        let at = self.next_time()?;
        if let Some(end) = self.call_ended(at) {
            self.seq += 1;
            return Some(end);
        }
        if self.api_calls > 0.0 && self.rng.chance(self.api_calls) {
            self.seq += 1;
            return Some(self.api_call(at));
        }
        let roll = self.rng.below(100_000);
        let append = match roll {
            0..=1 => self.break_glass(at),
            2..=3 => match self.undelivered(at) {
                Some(a) => a,
                None => {
                    let user = self.pick_user();
                    self.issuance(at, user)
                }
            },
            4..=43 => self.deny_change(at),
            44..=343 => self.aggregated(at),
            344..=1843 => self.audit_query(at),
            1844..=11843 => {
                let user = self.pick_user();
                self.denial(at, user)
            }
            _ => {
                let user = self.pick_user();
                self.issuance(at, user)
            }
        };
        self.seq += 1;
        Some(append)
    }
}

/// Whether `ip` is in one of [`COMPANY_RANGES`] (for the tests' own answers).
pub fn in_company_ranges(ip: &str) -> bool {
    ip.starts_with("10.20.")
        || ip.starts_with("10.40.")
        || ip.starts_with("172.20.")
        || ip.starts_with("2001:db8:4000:")
}
