//! A circuit breaker in front of an external store: after `threshold`
//! consecutive failures (errors or timeouts) the store is not asked for
//! `cooldown`; then one call probes it, and its success closes the breaker
//! again. While open, callers get an answer at once instead of waiting a
//! timeout each, so a dead Redis or PostgreSQL costs the request path
//! nothing but the fallback it chose.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The breaker's state, shared by every caller of one store.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cooldown: Duration,
    start: Instant,
    failures: AtomicU32,
    /// Milliseconds after `start` until which the store is not asked; 0:
    /// closed.
    open_until: AtomicU64,
    /// A probe is in flight (only one while half-open).
    probing: AtomicBool,
    /// Times it opened.
    opened: AtomicU64,
}

/// Whether a call may go to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Closed: go ahead.
    Closed,
    /// Half-open: this call is the probe.
    Probe,
    /// Open: do not ask the store.
    Refused,
}

impl Breaker {
    /// A closed breaker opening after `threshold` consecutive failures
    /// (at least 1) for `cooldown`.
    pub fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            start: Instant::now(),
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            opened: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// May a call go to the store now?
    pub fn permit(&self) -> Permit {
        self.permit_at(self.now_ms())
    }

    /// [`Breaker::permit`] at `now` (milliseconds after the breaker's start).
    fn permit_at(&self, now: u64) -> Permit {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Permit::Closed;
        }
        if now < until {
            return Permit::Refused;
        }
        // Past the cooldown: one caller probes, the others stay refused.
        match self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Permit::Probe,
            Err(_) => Permit::Refused,
        }
    }

    /// The store answered.
    pub fn success(&self) {
        self.failures.store(0, Ordering::Release);
        if self.open_until.swap(0, Ordering::AcqRel) != 0 {
            tracing::info!("store reachable again; circuit breaker closed");
        }
        self.probing.store(false, Ordering::Release);
    }

    /// The store failed or timed out.
    pub fn failure(&self) {
        self.failure_at(self.now_ms());
    }

    /// [`Breaker::failure`] at `now` (milliseconds after the breaker's start).
    fn failure_at(&self, now: u64) {
        let n = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        let was_probe = self.probing.swap(false, Ordering::AcqRel);
        if n >= self.threshold || was_probe {
            let until =
                now.saturating_add(u64::try_from(self.cooldown.as_millis()).unwrap_or(u64::MAX));
            if self.open_until.swap(until, Ordering::AcqRel) == 0 {
                self.opened.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    failures = n,
                    cooldown_ms = self.cooldown.as_millis() as u64,
                    "store failing; circuit breaker open"
                );
            }
        }
    }

    /// Whether the breaker is open (or half-open) now.
    pub fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    /// Times it has opened since start.
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_and_one_probe_closes_it() {
        let b = Breaker::new(3, Duration::from_millis(30));
        assert_eq!(b.permit_at(1), Permit::Closed);
        b.failure_at(1);
        b.failure_at(1);
        assert!(!b.is_open(), "two failures of three do not open it");
        b.success();
        b.failure_at(1);
        b.failure_at(1);
        assert!(!b.is_open(), "a success resets the count");
        b.failure_at(10);
        assert!(b.is_open());
        assert_eq!(b.permit_at(10), Permit::Refused);
        assert_eq!(b.permit_at(39), Permit::Refused, "until the cooldown ends");
        assert_eq!(b.opened(), 1);
        assert_eq!(b.permit_at(40), Permit::Probe);
        assert_eq!(b.permit_at(41), Permit::Refused, "one probe at a time");
        b.success();
        assert!(!b.is_open());
        assert_eq!(b.permit_at(41), Permit::Closed);
    }

    #[test]
    fn a_failed_probe_opens_it_again() {
        let b = Breaker::new(1, Duration::from_millis(20));
        b.failure_at(1);
        assert_eq!(b.permit_at(21), Permit::Probe);
        b.failure_at(21);
        assert_eq!(b.permit_at(22), Permit::Refused);
        assert_eq!(
            b.permit_at(40),
            Permit::Refused,
            "a new cooldown from the probe"
        );
        assert_eq!(b.permit_at(41), Permit::Probe);
        assert_eq!(b.opened(), 1, "still the same outage");
    }

    #[test]
    fn the_public_calls_read_the_breakers_own_clock() {
        // The public calls read the breaker's own clock, which starts at 1.
        let b = Breaker::new(1, Duration::from_secs(3600));
        assert!(b.now_ms() >= 1);
        b.failure();
        assert_eq!(b.permit(), Permit::Refused);
    }
}
