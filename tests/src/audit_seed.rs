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
//! certificates, undelivered certificates and aggregated refusals.
//!
//! Records come out in time order, each as the [`Append`] the server would
//! hand the store, so that they are hash-chained by the store itself.

use serde_json::json;
use talos_sso_server::audit::store::{Append, AuditStore, DenyChange, DenyEntry};
use talos_sso_server::audit::{AuditRecord, event, outcome};
use time::{Duration, OffsetDateTime};

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
    };
    let trail: Vec<_> = Trail::new(&plan).collect();
    for batch in trail.chunks(1000) {
        store.append_batch(batch).await.expect("a seeded batch");
    }
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
        }
    }
}

/// SplitMix64: small, fast, and the same on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x5eed_a0d1_7000_0000)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    pub fn hex(&mut self, digits: usize) -> String {
        let mut out = String::with_capacity(digits);
        while out.len() < digits {
            out.push_str(&format!("{:016x}", self.next_u64()));
        }
        out.truncate(digits);
        out
    }

    /// One of `items`, by weight.
    pub fn weighted<'a, T>(&mut self, items: &'a [(T, f64)]) -> &'a T {
        let total: f64 = items.iter().map(|(_, w)| w).sum();
        let mut pick = self.unit() * total;
        for (item, weight) in items {
            if pick < *weight {
                return item;
            }
            pick -= weight;
        }
        &items[items.len() - 1].0
    }
}

/// What a person may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Reader,
    Operator,
    Admin,
    Security,
}

/// One made-up person.
#[derive(Debug, Clone)]
pub struct User {
    pub username: String,
    pub subject: String,
    pub tier: Tier,
    /// Their usual office address and VPN network (the last octet varies).
    pub office_ip: String,
    pub vpn_prefix: String,
    /// How busy they are, relative to the others.
    pub weight: f64,
}

const FIRST: [&str; 24] = [
    "anna", "ben", "carla", "dev", "emil", "fatima", "gus", "hana", "ivan", "jo", "kai", "lena", "mo",
    "nina", "omar", "pia", "quinn", "rosa", "sam", "tariq", "uma", "vik", "wen", "yara",
];
const LAST: [&str; 20] = [
    "berg", "costa", "dahl", "eriksen", "fischer", "garcia", "haas", "ito", "jansen", "klein", "lind",
    "moreau", "nowak", "okafor", "petrov", "quist", "rossi", "silva", "tanaka", "weber",
];

fn subject(rng: &mut Rng) -> String {
    let h = rng.hex(32);
    format!(
        "{}-{}-4{}-8{}-{}",
        &h[..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

fn make_users(rng: &mut Rng, count: usize) -> Vec<User> {
    (0..count.max(8))
        .map(|i| {
            let first = FIRST[i % FIRST.len()];
            let last = LAST[(i / FIRST.len()) % LAST.len()];
            let round = i / (FIRST.len() * LAST.len());
            let username = if round == 0 {
                format!("{first}.{last}@example.com")
            } else {
                format!("{first}.{last}{round}@example.com")
            };
            // The first few are the security team, then one admin and one
            // on call at least; then about 1.5% platform admins, 15% on
            // call, the rest readers.
            let tier = if i < 6 {
                Tier::Security
            } else if i == 6 {
                Tier::Admin
            } else if i == 7 {
                Tier::Operator
            } else {
                *rng.weighted(&[
                    (Tier::Admin, 0.015),
                    (Tier::Operator, 0.15),
                    (Tier::Reader, 0.835),
                ])
            };
            let office_ip = match rng.below(10) {
                0..=5 => format!("10.20.{}.{}", rng.below(64), 1 + rng.below(250)),
                6..=8 => format!("10.40.{}.{}", rng.below(16), 1 + rng.below(250)),
                _ => format!("2001:db8:4000:{:x}::{:x}", rng.below(16), 1 + rng.below(4000)),
            };
            let vpn_prefix = format!("172.20.{}", rng.below(256));
            // Few people do most of the work.
            let weight = 0.2 + 4.0 * rng.unit().powi(3);
            User {
                username,
                subject: subject(rng),
                tier,
                office_ip,
                vpn_prefix,
                weight,
            }
        })
        .collect()
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

    fn issuance(&mut self, at: OffsetDateTime, user: usize) -> Append {
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
        self.last_issued = Some((
            self.seq + 1,
            user,
            cluster,
            r.serial.clone().unwrap_or_default(),
            r.certificate_sha256.clone().unwrap_or_default(),
        ));
        plain(r)
    }

    fn denial(&mut self, at: OffsetDateTime, user: usize) -> Append {
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

    fn audit_query(&mut self, at: OffsetDateTime) -> Append {
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

    fn deny_change(&mut self, at: OffsetDateTime) -> Append {
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

    fn break_glass(&mut self, at: OffsetDateTime) -> Append {
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

    fn undelivered(&mut self, at: OffsetDateTime) -> Option<Append> {
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

    fn aggregated(&mut self, at: OffsetDateTime) -> Append {
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

impl Iterator for Trail {
    type Item = Append;

    fn next(&mut self) -> Option<Append> {
        let at = self.next_time()?;
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

fn plain(record: AuditRecord) -> Append {
    Append {
        record,
        ..Append::default()
    }
}

fn whole_seconds(t: OffsetDateTime) -> OffsetDateTime {
    t.replace_nanosecond(0).unwrap_or(t)
}

/// 128 random bits, positive, lowercase hex without leading zero bytes.
fn serial(rng: &mut Rng) -> String {
    let hex = format!("{:016x}{:016x}", rng.next_u64() >> 1, rng.next_u64());
    let trimmed = hex.trim_start_matches("00");
    trimmed.to_owned()
}

/// Whether `ip` is in one of [`COMPANY_RANGES`] (for the tests' own answers).
pub fn in_company_ranges(ip: &str) -> bool {
    ip.starts_with("10.20.")
        || ip.starts_with("10.40.")
        || ip.starts_with("172.20.")
        || ip.starts_with("2001:db8:4000:")
}
