//! Rate limits per client address (checked before any token work, so a
//! flood costs little) and per identity (checked once the token is
//! verified): certificate requests have their own identity quota, the audit
//! and deny-list API another. An IPv6 client is one /64 network (a host
//! usually has the whole /64). Limits are per server process: with N
//! replicas behind a load balancer a client can get up to N times the
//! quota. A limit of 0 turns that limit off.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::config::RateLimitConfig;

/// The key a client address is limited (and its refusals counted) under:
/// an IPv4 address, or the /64 network of an IPv6 address.
pub fn address_key(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let network = ipnet::Ipv6Net::new(v6, 64).map(|n| n.trunc());
                network.map(|n| n.to_string()).unwrap_or_else(|_| v6.to_string())
            }
        },
    }
}

#[derive(Debug)]
pub struct RateLimits {
    per_identity: Option<DefaultKeyedRateLimiter<String>>,
    per_address: Option<DefaultKeyedRateLimiter<String>>,
    api_per_identity: Option<DefaultKeyedRateLimiter<String>>,
    clock: DefaultClock,
}

fn limiter(per_minute: u32) -> Option<DefaultKeyedRateLimiter<String>> {
    NonZeroU32::new(per_minute).map(|n| DefaultKeyedRateLimiter::keyed(Quota::per_minute(n)))
}

impl RateLimits {
    pub fn new(config: &RateLimitConfig) -> Self {
        Self {
            per_identity: limiter(config.per_identity_per_minute),
            per_address: limiter(config.per_address_per_minute),
            api_per_identity: limiter(config.api_per_identity_per_minute),
            clock: DefaultClock::default(),
        }
    }

    fn check(&self, limiter: Option<&DefaultKeyedRateLimiter<String>>, key: &str) -> Result<(), Duration> {
        match limiter {
            None => Ok(()),
            Some(limiter) => limiter
                .check_key(&key.to_owned())
                .map_err(|not_until| not_until.wait_time_from(self.clock.now())),
        }
    }

    /// `Err(retry after)` when the address (its [`address_key`]) is over
    /// its quota.
    pub fn check_address(&self, address_key: &str) -> Result<(), Duration> {
        self.check(self.per_address.as_ref(), address_key)
    }

    /// `Err(retry after)` when the person is over their audit and deny-list
    /// quota.
    pub fn check_api_identity(&self, subject: &str) -> Result<(), Duration> {
        self.check(self.api_per_identity.as_ref(), subject)
    }

    /// `Err(retry after)` when the person is over their quota.
    pub fn check_identity(&self, subject: &str) -> Result<(), Duration> {
        self.check(self.per_identity.as_ref(), subject)
    }

    /// Drop the state of keys that are back to a full quota (memory bound).
    pub fn forget_idle(&self) {
        for limiter in [&self.per_identity, &self.per_address, &self.api_per_identity]
            .into_iter()
            .flatten()
        {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_are_per_key_and_zero_means_off() {
        let limits = RateLimits::new(&RateLimitConfig {
            per_identity_per_minute: 3,
            per_address_per_minute: 0,
            api_per_identity_per_minute: 0,
        });
        for _ in 0..3 {
            assert!(limits.check_identity("alice").is_ok());
        }
        let retry = limits.check_identity("alice").unwrap_err();
        assert!(
            retry > Duration::from_secs(1) && retry <= Duration::from_secs(20),
            "{retry:?}"
        );
        assert!(limits.check_identity("bob").is_ok(), "others are not affected");
        for _ in 0..1000 {
            assert!(limits.check_address("10.0.0.1").is_ok());
        }
        limits.forget_idle();
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64() {
        let key = |s: &str| address_key(s.parse().unwrap());
        assert_eq!(key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(key("2001:db8:1:2:ffff:ffff:ffff:ffff"), "2001:db8:1:2::/64");
        assert_ne!(key("2001:db8:1:3::1"), key("2001:db8:1:2::1"));
        assert_eq!(key("203.0.113.7"), "203.0.113.7");
        assert_eq!(key("::ffff:203.0.113.7"), "203.0.113.7");
    }
}
