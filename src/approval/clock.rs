//! The approvals subsystem's notion of now: the system clock, or in tests a
//! manual one they move to cross deadlines without sleeping.

#[cfg(any(test, feature = "fault-injection"))]
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where `now` comes from.
#[derive(Clone)]
pub(crate) enum Clock {
    System,
    #[cfg(any(test, feature = "fault-injection"))]
    Manual(Arc<std::sync::atomic::AtomicU64>),
}

impl Clock {
    /// Now, ms since the epoch.
    pub(crate) fn now_ms(&self) -> u64 {
        match self {
            // A clock before 1970 reads as 0: everything looks young, which
            // only delays expiry until the clock is fixed.
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            #[cfg(any(test, feature = "fault-injection"))]
            Clock::Manual(ms) => ms.load(std::sync::atomic::Ordering::SeqCst),
        }
    }
}
