//! Exchanged tokens kept per (principal, run, upstream): until shortly
//! before the token expires, never past the run's own tool token, never
//! shared between runs or principals. One exchange at a time per key
//! (concurrent calls of a run wait for the first one's token). Bounded:
//! past [`MAX_ENTRIES`] the expired go, then everything (a full cache costs
//! exchanges, never a wrong token).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::Presented;

/// Most runs kept at once.
pub(crate) const MAX_ENTRIES: usize = 100_000;

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
    pub presented: Presented,
    /// Sent until then.
    pub until: Instant,
}

/// One key's place: its token once exchanged; held across the exchange.
pub(crate) type Slot = Arc<tokio::sync::Mutex<Option<Kept>>>;

/// The kept tokens of one upstream.
#[derive(Default)]
pub(crate) struct Cache {
    slots: Mutex<HashMap<RunKey, Slot>>,
}

impl Cache {
    /// The slot of `key` (made empty when new).
    pub(crate) fn slot(&self, key: &RunKey) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = slots.get(key) {
            return s.clone();
        }
        if slots.len() >= MAX_ENTRIES {
            let now = Instant::now();
            // A slot being filled is locked: kept.
            slots.retain(|_, s| match s.try_lock() {
                Ok(k) => k.as_ref().is_some_and(|k| k.until > now),
                Err(_) => true,
            });
            if slots.len() >= MAX_ENTRIES {
                slots.clear();
            }
        }
        let s = Slot::default();
        slots.insert(key.clone(), s.clone());
        s
    }

    /// Runs kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
}
