//! When `watch` renews, apart from how: a certificate is renewed at about
//! two thirds of its lifetime, a failed renewal that may pass by itself
//! (server or provider unreachable) is tried again with a growing pause,
//! and a login that is gone (logged out, refresh refused, refused by
//! policy) is dropped. The loop runs on an environment ([`WatchEnv`]) so
//! that tests drive it with a clock of their own.
//!
//! Tokio's timers run on the monotonic clock, which stops while a laptop
//! sleeps (on Linux): a nap of three minutes begun before a night's sleep
//! ends three minutes after waking. So no nap is longer than
//! [`Settings::max_nap`], and each wake compares the wall clock with what
//! is due: a renewal due while the machine slept runs at the first wake.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use time::OffsetDateTime;

use crate::cli::exit::Outcome;

/// A saved login as the watch sees it: the certificate in its talosconfig
/// context (`None` when there is none, or it cannot be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub cluster: String,
    pub validity: Option<Validity>,
}

/// A certificate's validity period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

/// Why a renewal failed.
#[derive(Debug)]
pub enum RenewalError {
    /// The login is gone (refresh refused or revoked, refused by policy or
    /// the deny list): no retry brings it back; `outcome` is the status
    /// the watch ends with when no other login is left.
    Gone { outcome: Outcome, reason: String },
    /// Something that may pass by itself: tried again later.
    Transient(String),
}

/// What the watch tells the person, one line each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Watching `cluster`; its next renewal is at `next`.
    Watching {
        cluster: String,
        next: OffsetDateTime,
    },
    Renewed {
        cluster: String,
        not_after: OffsetDateTime,
        next: OffsetDateTime,
    },
    Retrying {
        cluster: String,
        reason: String,
        at: OffsetDateTime,
    },
    /// The login was removed (`talos-sso logout`).
    LoggedOut {
        cluster: String,
    },
    Dropped {
        cluster: String,
        reason: String,
    },
}

/// What the loop needs from the world.
#[allow(async_fn_in_trait)]
pub trait WatchEnv {
    /// The wall clock.
    fn now(&self) -> OffsetDateTime;
    /// Sleep for `duration` on the monotonic clock.
    async fn nap(&mut self, duration: Duration);
    /// The logins to keep fresh, read again at each wake.
    fn logins(&mut self) -> Vec<Watched>;
    /// Renew the certificate of `cluster` without asking the person.
    async fn renew(&mut self, cluster: &str) -> Result<Validity, RenewalError>;
    /// Tell the person.
    fn report(&mut self, event: Event);
}

/// The loop's timings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Longest nap: how late a renewal can run after a wake from sleep.
    pub max_nap: Duration,
    /// The first pause after a transient failure; it doubles up to
    /// `max_retry_pause`.
    pub first_retry_pause: Duration,
    pub max_retry_pause: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_nap: Duration::from_secs(30),
            first_retry_pause: Duration::from_secs(5),
            max_retry_pause: Duration::from_secs(60),
        }
    }
}

/// A pause never shorter than this between two renewals of one login, so
/// that a certificate already in its last third when issued (a lifetime
/// shorter than the server's clock-skew allowance) cannot spin the loop.
const LEAST_GAP: time::Duration = time::Duration::SECOND;

/// When to renew a certificate this watch has just obtained at `now`:
/// after two thirds of the time it has left.
pub fn due_after_renewal(now: OffsetDateTime, validity: Validity) -> OffsetDateTime {
    let left = validity.not_after - now;
    let two_thirds: time::Duration = left * 2 / 3;
    (now + two_thirds).max(now + LEAST_GAP)
}

/// When to renew a certificate found in the talosconfig at `now` (written
/// by `login`, `exec`, or before the watch started): after two thirds of
/// its validity, or of the time it has left, whichever is sooner.
pub fn due_when_found(now: OffsetDateTime, validity: Validity) -> OffsetDateTime {
    let span = validity.not_after - validity.not_before;
    let two_thirds: time::Duration = span * 2 / 3;
    let by_validity = validity.not_before + two_thirds;
    by_validity.min(due_after_renewal(now, validity))
}

/// The watch's memory of one login.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    /// The certificate the due time was worked out for: another one in
    /// the file (a `login` in between) is worked out again.
    not_after: Option<OffsetDateTime>,
    due: OffsetDateTime,
    failures: u32,
}

/// Keep the logins `env` gives fresh until none is left; the outcome is
/// the status of the last one dropped (4 a login is needed, 5 refused).
pub async fn run(env: &mut impl WatchEnv, settings: Settings) -> Outcome {
    let mut tracked: BTreeMap<String, Tracked> = BTreeMap::new();
    let mut dropped: BTreeSet<String> = BTreeSet::new();
    let mut ended = Outcome::LoginNeeded;
    loop {
        let logins = env.logins();
        let present: BTreeSet<&str> = logins.iter().map(|w| w.cluster.as_str()).collect();
        let gone: Vec<String> = tracked
            .keys()
            .filter(|c| !present.contains(c.as_str()))
            .cloned()
            .collect();
        for cluster in gone {
            tracked.remove(&cluster);
            dropped.insert(cluster.clone());
            ended = Outcome::LoginNeeded;
            env.report(Event::LoggedOut { cluster });
        }
        let mut next_wake: Option<OffsetDateTime> = None;
        for login in &logins {
            if dropped.contains(&login.cluster) {
                continue;
            }
            let now = env.now();
            let not_after = login.validity.map(|v| v.not_after);
            let entry = match tracked.get(&login.cluster) {
                Some(known) if known.not_after == not_after || known.failures > 0 => *known,
                seen_before => {
                    let due = login.validity.map_or(now, |v| due_when_found(now, v));
                    if seen_before.is_none() {
                        env.report(Event::Watching {
                            cluster: login.cluster.clone(),
                            next: due,
                        });
                    }
                    Tracked {
                        not_after,
                        due,
                        failures: 0,
                    }
                }
            };
            let entry = if entry.due <= now {
                match env.renew(&login.cluster).await {
                    Ok(validity) => {
                        let now = env.now();
                        let next = due_after_renewal(now, validity);
                        env.report(Event::Renewed {
                            cluster: login.cluster.clone(),
                            not_after: validity.not_after,
                            next,
                        });
                        Tracked {
                            not_after: Some(validity.not_after),
                            due: next,
                            failures: 0,
                        }
                    }
                    Err(RenewalError::Gone { outcome, reason }) => {
                        tracked.remove(&login.cluster);
                        dropped.insert(login.cluster.clone());
                        ended = outcome;
                        env.report(Event::Dropped {
                            cluster: login.cluster.clone(),
                            reason,
                        });
                        continue;
                    }
                    Err(RenewalError::Transient(reason)) => {
                        let failures = entry.failures.saturating_add(1);
                        let at = env.now() + retry_pause(settings, failures);
                        env.report(Event::Retrying {
                            cluster: login.cluster.clone(),
                            reason,
                            at,
                        });
                        Tracked {
                            due: at,
                            failures,
                            ..entry
                        }
                    }
                }
            } else {
                entry
            };
            tracked.insert(login.cluster.clone(), entry);
            next_wake = Some(next_wake.map_or(entry.due, |w| w.min(entry.due)));
        }
        let Some(next_wake) = next_wake else {
            return ended;
        };
        let until = (next_wake - env.now()).clamp(time::Duration::ZERO, time::Duration::SECOND * 86_400);
        let nap = Duration::try_from(until)
            .unwrap_or_default()
            .min(settings.max_nap);
        env.nap(nap).await;
    }
}

/// The pause after the `failures`-th failure in a row.
fn retry_pause(settings: Settings, failures: u32) -> time::Duration {
    let doubled = settings
        .first_retry_pause
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    let pause = doubled.min(settings.max_retry_pause);
    time::Duration::try_from(pause).unwrap_or(time::Duration::MINUTE)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    fn at(seconds: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + seconds).unwrap()
    }

    /// A five-minute certificate issued at `issued`, backdated a minute
    /// for clock skew, as the server does by default.
    fn five_minutes_from(issued: i64) -> Validity {
        Validity {
            not_before: at(issued - 60),
            not_after: at(issued + 300),
        }
    }

    /// A clock and a world the test controls: `nap` advances the wall
    /// clock by the nap, plus any `suspend` queued (time the machine slept
    /// during that nap, which the monotonic clock does not see).
    struct FakeEnv {
        wall: OffsetDateTime,
        suspends: VecDeque<(usize, time::Duration)>,
        naps: Vec<Duration>,
        certificate: Option<Validity>,
        /// What each renewal answers, in order; then a five-minute
        /// certificate from the current time.
        answers: VecDeque<Result<(), RenewalError>>,
        renewals: Vec<OffsetDateTime>,
        events: Vec<Event>,
        logged_out_after: Option<usize>,
        /// Stops the test's world after this many naps.
        nap_budget: usize,
        /// From this time on, the file holds this certificate (another
        /// command renewed it).
        replaced: Option<(OffsetDateTime, Validity)>,
    }

    impl FakeEnv {
        fn new(certificate: Option<Validity>) -> Self {
            Self {
                wall: at(0),
                suspends: VecDeque::new(),
                naps: Vec::new(),
                certificate,
                answers: VecDeque::new(),
                renewals: Vec::new(),
                events: Vec::new(),
                logged_out_after: None,
                nap_budget: 10_000,
                replaced: None,
            }
        }
    }

    impl WatchEnv for FakeEnv {
        fn now(&self) -> OffsetDateTime {
            self.wall
        }

        async fn nap(&mut self, duration: Duration) {
            self.naps.push(duration);
            self.wall += time::Duration::try_from(duration).unwrap();
            if self.suspends.front().is_some_and(|(n, _)| *n == self.naps.len()) {
                let (_, slept) = self.suspends.pop_front().unwrap();
                self.wall += slept;
            }
            assert!(self.naps.len() < self.nap_budget, "the watch never stopped");
        }

        fn logins(&mut self) -> Vec<Watched> {
            if self.logged_out_after.is_some_and(|n| self.naps.len() >= n) {
                return Vec::new();
            }
            if let Some((from, validity)) = self.replaced
                && self.wall >= from
            {
                self.certificate = Some(validity);
                self.replaced = None;
            }
            vec![Watched {
                cluster: "prod".into(),
                validity: self.certificate,
            }]
        }

        async fn renew(&mut self, _cluster: &str) -> Result<Validity, RenewalError> {
            self.renewals.push(self.wall);
            self.answers.pop_front().unwrap_or(Ok(()))?;
            let validity = Validity {
                not_before: self.wall - time::Duration::MINUTE,
                not_after: self.wall + time::Duration::minutes(5),
            };
            self.certificate = Some(validity);
            Ok(validity)
        }

        fn report(&mut self, event: Event) {
            self.events.push(event);
        }
    }

    fn gone(outcome: Outcome) -> RenewalError {
        RenewalError::Gone {
            outcome,
            reason: "refused".into(),
        }
    }

    #[test]
    fn a_certificate_is_renewed_after_two_thirds_of_its_lifetime() {
        let fresh = five_minutes_from(0);
        assert_eq!(due_after_renewal(at(0), fresh), at(200));
        // Found at start: two thirds of its validity (skew included) is
        // sooner than two thirds of what is left.
        assert_eq!(due_when_found(at(0), fresh), at(180));
        assert_eq!(due_when_found(at(250), fresh), at(180), "overdue: at once");
        // A lifetime shorter than the skew allowance cannot spin the loop.
        let tiny = Validity {
            not_before: at(-60),
            not_after: at(0),
        };
        assert_eq!(due_after_renewal(at(0), tiny), at(1));
    }

    #[tokio::test]
    async fn renewals_come_every_two_thirds_of_the_lifetime_with_few_wakes() {
        let mut env = FakeEnv::new(Some(five_minutes_from(0)));
        env.answers
            .extend([Ok(()), Ok(()), Ok(()), Err(gone(Outcome::LoginNeeded))]);
        let outcome = run(&mut env, Settings::default()).await;
        assert_eq!(outcome, Outcome::LoginNeeded);
        assert_eq!(env.renewals, [at(180), at(380), at(580), at(780)]);
        // 200 s between renewals at most 30 s a nap: 7 wakes a renewal.
        assert_eq!(env.naps.len(), 4 * 7 - 1, "{:?}", env.naps);
        assert!(env.naps.iter().all(|n| *n <= Duration::from_secs(30)));
        assert!(matches!(&env.events[0], Event::Watching { next, .. } if *next == at(180)));
        assert!(matches!(env.events.last(), Some(Event::Dropped { .. })));
    }

    #[tokio::test]
    async fn a_renewal_due_while_the_machine_slept_runs_at_the_first_wake() {
        let mut env = FakeEnv::new(Some(five_minutes_from(0)));
        // The lid closes during the first nap, for two hours.
        env.suspends.push_back((1, time::Duration::hours(2)));
        env.answers.extend([Ok(()), Err(gone(Outcome::LoginNeeded))]);
        run(&mut env, Settings::default()).await;
        // The nap of 30 s ends at 2 h 30 s on the wall clock: renewed then,
        // not at 2 h 180 s, when a monotonic sleep to the due time would end.
        assert_eq!(env.renewals[0], at(2 * 3600 + 30));
        assert_eq!(env.renewals[1], at(2 * 3600 + 30 + 200));
    }

    #[tokio::test]
    async fn a_transient_failure_is_retried_with_a_growing_pause() {
        let mut env = FakeEnv::new(Some(five_minutes_from(0)));
        let down = || Err(RenewalError::Transient("connection refused".into()));
        env.answers.extend([
            down(),
            down(),
            down(),
            down(),
            down(),
            Ok(()),
            Err(gone(Outcome::Refused)),
        ]);
        let outcome = run(&mut env, Settings::default()).await;
        assert_eq!(outcome, Outcome::Refused, "the last drop's status");
        let gaps: Vec<i64> = env
            .renewals
            .windows(2)
            .map(|w| (w[1] - w[0]).whole_seconds())
            .collect();
        assert_eq!(gaps, [5, 10, 20, 40, 60, 200]);
        let retries = env
            .events
            .iter()
            .filter(|e| matches!(e, Event::Retrying { .. }))
            .count();
        assert_eq!(retries, 5);
    }

    #[tokio::test]
    async fn a_logout_stops_the_watch_with_a_login_needed() {
        let mut env = FakeEnv::new(Some(five_minutes_from(0)));
        env.logged_out_after = Some(3);
        let outcome = run(&mut env, Settings::default()).await;
        assert_eq!(outcome, Outcome::LoginNeeded);
        assert!(env.renewals.is_empty());
        assert_eq!(
            env.events.last(),
            Some(&Event::LoggedOut {
                cluster: "prod".into()
            })
        );
    }

    #[tokio::test]
    async fn a_missing_certificate_is_renewed_at_once_and_nothing_left_ends_the_watch() {
        let mut env = FakeEnv::new(None);
        env.answers.push_back(Err(gone(Outcome::LoginNeeded)));
        assert_eq!(run(&mut env, Settings::default()).await, Outcome::LoginNeeded);
        assert_eq!(env.renewals, [at(0)]);
        assert!(env.naps.is_empty());
    }

    #[tokio::test]
    async fn a_certificate_renewed_by_someone_else_moves_the_schedule() {
        let mut env = FakeEnv::new(Some(five_minutes_from(0)));
        // `talos-sso exec` at 90 s writes a new certificate.
        env.replaced = Some((at(90), five_minutes_from(90)));
        env.answers.push_back(Err(gone(Outcome::LoginNeeded)));
        run(&mut env, Settings::default()).await;
        assert_eq!(env.renewals, [at(270)], "not at 180, the old certificate's time");
    }
}
