//! The verified-token cache: an ES256 check costs ~80 µs, a hit here well
//! under 1 µs, and an agent presents the same token on every call of its run.
//!
//! Invariants:
//! - only tokens that passed every check are inserted, keyed by the SHA-256 of
//!   the whole token: no token text is retained, and finding another token
//!   with the same key is a SHA-256 second preimage;
//! - an entry is returned only while `now < exp` (never past expiry, leeway
//!   or not: after `exp` the full check, with its leeway, decides), for the
//!   audience it was verified for, and under the key-set generation it was
//!   verified with; anything else is a miss;
//! - the map never holds more than its capacity: inserting into a full cache
//!   first drops dead entries, then arbitrary live ones (hash order is random
//!   order), which costs only a re-verification later.

use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

use crate::digest::Sha256;
use dashmap::DashMap;

use super::{Audience, Claims};

/// SHA-256 of a token. Costs ~0.3 µs for a 1 KiB token with SHA-NI; hashing
/// instead of storing the token keeps bearer credentials out of the cache.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct TokenDigest([u8; 32]);

impl TokenDigest {
    /// Hashes a token. (Never inlined: `mcp-bench instructions` counts it
    /// in the token check's stage by its name.)
    #[inline(never)]
    pub(crate) fn of(token: &str) -> TokenDigest {
        TokenDigest(Sha256::digest(token.as_bytes()))
    }
}

impl Hash for TokenDigest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The digest is already uniformly distributed; rehashing it with
        // SipHash would only cost time.
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.0[..8]);
        state.write_u64(u64::from_ne_bytes(word));
    }
}

/// A hasher that passes a `u64` through; only fed by [`TokenDigest`].
#[derive(Default)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not reached for TokenDigest; folded in FNV-1a style so any other use
        // still spreads.
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

struct Entry {
    claims: Arc<Claims>,
    audience: Audience,
    exp: u64,
    generation: u64,
}

/// Bounded map from token digest to verified claims.
pub(crate) struct TokenCache {
    map: DashMap<TokenDigest, Entry, BuildHasherDefault<PassThrough>>,
    capacity: usize,
}

impl TokenCache {
    /// A cache of at most `capacity` entries; 0 disables caching.
    pub(crate) fn new(capacity: usize) -> TokenCache {
        TokenCache {
            map: DashMap::with_hasher(BuildHasherDefault::default()),
            capacity,
        }
    }

    /// Whether caching is on.
    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// The claims cached for this token, if still valid for `audience` at
    /// `now` under key-set `generation`. A dead entry found on the way is
    /// removed.
    pub(crate) fn get(
        &self,
        digest: &TokenDigest,
        audience: Audience,
        now: u64,
        generation: u64,
    ) -> Option<Arc<Claims>> {
        let entry = self.map.get(digest)?;
        let dead = entry.generation != generation || now >= entry.exp;
        if !dead && entry.audience == audience {
            return Some(Arc::clone(&entry.claims));
        }
        drop(entry);
        if dead {
            self.map
                .remove_if(digest, |_, e| e.generation != generation || now >= e.exp);
        }
        None
    }

    /// Caches freshly verified claims.
    pub(crate) fn insert(
        &self,
        digest: TokenDigest,
        claims: Arc<Claims>,
        now: u64,
        generation: u64,
    ) {
        if !self.enabled() || now >= claims.exp {
            return;
        }
        if self.map.len() >= self.capacity {
            self.make_room(now, generation);
        }
        let entry = Entry {
            audience: claims.audience,
            exp: claims.exp,
            claims,
            generation,
        };
        self.map.insert(digest, entry);
    }

    /// How many entries are held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Drops dead entries; if that frees too little, drops arbitrary ones down
    /// to 7/8 of capacity so the sweep is not repeated on every insert.
    fn make_room(&self, now: u64, generation: u64) {
        self.map
            .retain(|_, e| e.generation == generation && now < e.exp);
        let target = self.capacity - self.capacity / 8 - 1;
        let excess = self.map.len().saturating_sub(target);
        if excess == 0 {
            return;
        }
        // Collect first: removing while iterating would deadlock on the shard
        // lock the iterator holds.
        let victims: Vec<TokenDigest> = self.map.iter().take(excess).map(|e| *e.key()).collect();
        for digest in victims {
            self.map.remove(&digest);
        }
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
