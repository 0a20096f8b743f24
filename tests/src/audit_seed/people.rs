//! The made-up people: names, Entra subjects, tiers and how often each acts.

use super::rng::Rng;

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

pub(super) fn make_users(rng: &mut Rng, count: usize) -> Vec<User> {
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
