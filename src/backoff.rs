//! Exponential backoff: the one schedule every retry loop of the firewall
//! waits by (the audit shipper's inserts and schema, approval webhooks, a
//! stdio server restarted after crashes in a row).
//!
//! Retry `n` (1-based) waits `first · 2^(n-1)`, capped at `max`; loops that
//! many firewalls run at once against one peer (ClickHouse) scale it into
//! `[½, 1]` of that by a random jitter so they do not retry in lockstep.

use std::time::Duration;

/// A retry schedule: the first delay, doubled per retry up to a ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// The delay before the first retry.
    pub first: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Backoff {
    /// The delay before retry number `retry` (1-based; 0 is read as 1):
    /// `first · 2^(retry-1)`, capped at `max`.
    pub(crate) fn delay(&self, retry: u32) -> Duration {
        let exp = retry.saturating_sub(1).min(30);
        self.first.saturating_mul(1u32 << exp).min(self.max)
    }

    /// [`Backoff::delay`] scaled into `[½, 1]` by `jitter ∈ [0, 1)` (out of
    /// range values are clamped).
    pub(crate) fn jittered(&self, retry: u32, jitter: f64) -> Duration {
        self.delay(retry)
            .mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEDULE: Backoff = Backoff {
        first: Duration::from_millis(200),
        max: Duration::from_secs(30),
    };

    #[test]
    fn the_delay_doubles_per_retry_up_to_the_ceiling() {
        let full = |a| SCHEDULE.delay(a);
        assert_eq!(full(1), Duration::from_millis(200));
        assert_eq!(full(2), Duration::from_millis(400));
        assert_eq!(full(5), Duration::from_millis(3_200));
        assert_eq!(full(8), Duration::from_millis(25_600));
        assert_eq!(full(9), SCHEDULE.max);
        assert_eq!(full(u32::MAX), SCHEDULE.max);
        // Retry 0 is read as the first.
        assert_eq!(full(0), SCHEDULE.first);
        // The jittered delay at 1.0 is the full one.
        assert_eq!(SCHEDULE.jittered(5, 1.0), full(5));
    }

    #[test]
    fn jitter_keeps_the_delay_between_half_and_full() {
        for j in [0.0, 0.25, 0.5, 0.999] {
            let d = SCHEDULE.jittered(3, j);
            assert!(
                d >= Duration::from_millis(400) && d <= Duration::from_millis(800),
                "{d:?}"
            );
        }
        assert_eq!(SCHEDULE.jittered(3, 0.0), Duration::from_millis(400));
        // Out-of-range jitter is clamped, never negative or above the full delay.
        assert_eq!(SCHEDULE.jittered(3, -5.0), Duration::from_millis(400));
        assert_eq!(SCHEDULE.jittered(3, 7.0), Duration::from_millis(800));
    }
}
