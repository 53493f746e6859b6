//! Exchanged tokens kept per (principal, run, upstream): until shortly
//! before the token expires, never past the run's own tool token, never
//! shared between runs or principals. One exchange at a time per key
//! (concurrent calls of a run wait for the first one's token). Bounded:
//! every [`SWEEP_EVERY`] new runs the expired go, and past [`MAX_ENTRIES`]
//! everything (a full cache costs exchanges, never a wrong token).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::Credential;

/// Most runs kept at once.
pub(crate) const MAX_ENTRIES: usize = 100_000;

/// New runs between two sweeps of the expired.
pub(crate) const SWEEP_EVERY: u64 = 1024;

/// Who and which run a token was exchanged for: the principal's issuer,
/// tenant and subject, the agent and the run (each length-prefixed, so no
/// two differ only in where one ends).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct RunKey(Box<[u8]>);

impl RunKey {
    /// The key of `parts` (issuer, tenant, subject, agent, run).
    pub(crate) fn of(parts: [&str; 5]) -> RunKey {
        let mut k = Vec::with_capacity(parts.iter().map(|p| p.len() + 4).sum());
        for p in parts {
            k.extend_from_slice(&(p.len() as u32).to_be_bytes());
            k.extend_from_slice(p.as_bytes());
        }
        RunKey(k.into_boxed_slice())
    }
}

/// A token and until when it may be sent.
#[derive(Clone, Debug)]
pub(crate) struct Kept {
    /// The credential.
    pub credential: Credential,
    /// Sent until then.
    pub until: Instant,
}

/// One key's place: its token once exchanged; held across the exchange.
pub(crate) type Slot = Arc<tokio::sync::Mutex<Option<Kept>>>;

/// The kept tokens of one upstream.
#[derive(Default)]
pub(crate) struct Cache {
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    by_run: HashMap<RunKey, Slot>,
    /// New runs since the last sweep.
    added: u64,
}

impl Cache {
    /// The slot of `key` (made empty when new).
    pub(crate) fn slot(&self, key: &RunKey) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = slots.by_run.get(key) {
            return s.clone();
        }
        slots.added += 1;
        if slots.added >= SWEEP_EVERY || slots.by_run.len() >= MAX_ENTRIES {
            slots.added = 0;
            let now = Instant::now();
            // A slot being filled is locked: kept.
            slots.by_run.retain(|_, s| match s.try_lock() {
                Ok(k) => k.as_ref().is_some_and(|k| k.until > now),
                Err(_) => true,
            });
            if slots.by_run.len() >= MAX_ENTRIES {
                slots.by_run.clear();
            }
        }
        let s = Slot::default();
        slots.by_run.insert(key.clone(), s.clone());
        s
    }

    /// Runs kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_run
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unambiguous() {
        assert_ne!(
            RunKey::of(["iss", "t", "ab", "c", "r"]),
            RunKey::of(["iss", "t", "a", "bc", "r"])
        );
        assert_eq!(
            RunKey::of(["iss", "t", "a", "b", "r"]),
            RunKey::of(["iss", "t", "a", "b", "r"])
        );
    }

    #[tokio::test]
    async fn a_key_has_one_slot_and_the_cache_stays_bounded() {
        let c = Cache::default();
        let a = RunKey::of(["i", "t", "s", "a", "run-1"]);
        let s1 = c.slot(&a);
        let s2 = c.slot(&a);
        assert!(Arc::ptr_eq(&s1, &s2));
        for i in 0..(MAX_ENTRIES + 10) {
            c.slot(&RunKey::of(["i", "t", "s", "a", &i.to_string()]));
        }
        assert!(c.len() <= MAX_ENTRIES);
    }

    #[tokio::test]
    async fn the_expired_are_swept_the_live_kept() {
        let c = Cache::default();
        let kept = |until: Instant| Kept {
            credential: Credential {
                header: Some(http::HeaderValue::from_static("Bearer t")),
                auth: "exchange",
                id: Arc::from("id"),
            },
            until,
        };
        let live = RunKey::of(["i", "t", "s", "a", "live"]);
        *c.slot(&live).lock().await =
            Some(kept(Instant::now() + std::time::Duration::from_secs(60)));
        let gone = RunKey::of(["i", "t", "s", "a", "gone"]);
        *c.slot(&gone).lock().await = Some(kept(Instant::now()));
        // Never filled (an exchange that failed): swept too.
        c.slot(&RunKey::of(["i", "t", "s", "a", "empty"]));
        for i in 0..SWEEP_EVERY {
            c.slot(&RunKey::of(["j", "t", "s", "a", &i.to_string()]));
        }
        let slots = c.slots.lock().unwrap();
        assert!(slots.by_run.contains_key(&live));
        assert!(!slots.by_run.contains_key(&gone));
        assert!(!slots
            .by_run
            .contains_key(&RunKey::of(["i", "t", "s", "a", "empty"])));
    }
}
