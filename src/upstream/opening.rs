//! The order of a session's GET stream and its POSTs on their way upstream.
//!
//! A server may send a request that belongs to a running call on the
//! session's GET stream rather than on the call's own SSE stream (the
//! TypeScript SDK does for `server.request()` without a related request;
//! the conformance suite's reference server asks for sampling and
//! elicitation that way), and its SDK writes such a request nowhere when no
//! GET stream is open at that moment (only to its event store). A client
//! that opens its GET stream and sends its next request at once (the
//! TypeScript SDK client does, as soon as `notifications/initialized` is
//! accepted) then depends on the server seeing the GET first. Directly it
//! does, narrowly: the server parses the POST's body before the call runs.
//! Through a proxy each request takes a hop of its own, the two arrive in
//! either order, and the call waits for the answer to a request that was
//! never sent (the client's request timeout, 60 s, ends it).
//!
//! So the firewall keeps, per upstream session, what it knows about the GET
//! stream being opened, and a POST of the session waits for it, bounded:
//! - a GET that arrived first and is not answered yet: the POST goes once
//!   the upstream answered the GET's headers (the upstream has the stream
//!   then), or when [`GET_BOUND`] has passed since the GET arrived;
//! - after the upstream accepted the session's `notifications/initialized`
//!   and before its first GET: the client may be opening one right now, so
//!   a POST waits up to [`FIRST_GET_GRACE`] for that GET to arrive (and then
//!   as above). A client that opens no GET stream pays that once per
//!   session, and only where the policy lets the upstream ask the client
//!   something (sampling, elicitation or roots).
//!
//! This is one replica's knowledge: a GET and a POST of one session that
//! reach two replicas are not ordered, as they were not before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How long after a GET arrived a POST of its session waits for it at most.
pub(crate) const GET_BOUND: Duration = Duration::from_millis(500);

/// How long a POST waits for the first GET of a session whose
/// `notifications/initialized` was accepted.
pub(crate) const FIRST_GET_GRACE: Duration = Duration::from_millis(100);

/// How long after `notifications/initialized` a first GET is expected at all.
const EXPECT_FOR: Duration = Duration::from_secs(30);

/// Past this many sessions, expired entries are swept.
const SWEEP_AT: usize = 4096;

/// Upstream route name and the upstream's own session id.
type Key = (String, Box<[u8]>);

struct Entry {
    /// GETs sent upstream whose answer's headers have not come yet.
    pending: usize,
    /// Past this, POSTs no longer wait for the pending GETs.
    deadline: Instant,
    /// Set from `notifications/initialized` until the first GET (or until
    /// a POST waited for it in vain): when the expectation ends.
    expecting: Option<Instant>,
    /// Wakes the waiting POSTs on every change; dropped with the entry.
    changed: watch::Sender<()>,
}

impl Entry {
    fn new(now: Instant) -> Entry {
        Entry {
            pending: 0,
            deadline: now,
            expecting: None,
            changed: watch::Sender::new(()),
        }
    }

    fn live(&self, now: Instant) -> bool {
        self.pending > 0 || self.expecting.is_some_and(|t| t > now)
    }
}

/// The GET streams of sessions being opened, per upstream session.
#[derive(Default)]
pub struct Opening {
    entries: Mutex<HashMap<Key, Entry>>,
}

/// A GET on its way upstream; dropped when its answer's headers came (or
/// it failed), which lets the session's POSTs go.
pub struct GetGuard {
    opening: Arc<Opening>,
    key: Key,
}

// === impl Opening ===

impl Opening {
    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        // The map holds no invariant a panic could break half-way.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A GET of `session` goes upstream now.
    pub fn get(self: &Arc<Self>, upstream: &str, session: &[u8]) -> GetGuard {
        let key: Key = (upstream.to_owned(), session.into());
        let now = Instant::now();
        let mut entries = self.lock();
        sweep(&mut entries, now);
        let e = entries
            .entry(key.clone())
            .or_insert_with(|| Entry::new(now));
        e.pending += 1;
        e.deadline = now + GET_BOUND;
        e.expecting = None;
        e.changed.send_replace(());
        GetGuard {
            opening: Arc::clone(self),
            key,
        }
    }

    /// The upstream accepted the session's `notifications/initialized`: its
    /// client may be opening the GET stream now.
    pub fn initialized(&self, upstream: &str, session: &[u8]) {
        let now = Instant::now();
        let mut entries = self.lock();
        sweep(&mut entries, now);
        let e = entries
            .entry((upstream.to_owned(), session.into()))
            .or_insert_with(|| Entry::new(now));
        if e.pending == 0 {
            e.expecting = Some(now + EXPECT_FOR);
        }
    }

    /// Returns when a POST of `session` may go upstream: no GET of the
    /// session is on its way (or its bound passed), and none is expected
    /// (or the grace for it passed).
    pub async fn before_post(&self, upstream: &str, session: &[u8]) {
        let key: Key = (upstream.to_owned(), session.into());
        let grace_end = Instant::now() + FIRST_GET_GRACE;
        loop {
            let now = Instant::now();
            let (mut changed, until) = {
                let mut entries = self.lock();
                let Some(e) = entries.get_mut(&key) else {
                    return;
                };
                if e.pending > 0 {
                    if e.deadline <= now {
                        return;
                    }
                    (e.changed.subscribe(), e.deadline)
                } else if e.expecting.is_some_and(|t| t > now) {
                    if grace_end <= now {
                        // No GET came: this client opens none, and no POST
                        // of the session waits for one again.
                        entries.remove(&key);
                        return;
                    }
                    (e.changed.subscribe(), grace_end)
                } else {
                    entries.remove(&key);
                    return;
                }
            };
            // A change (a GET arrived or was answered, the entry went) or
            // the bound: look again.
            let _ = tokio::time::timeout_at(until, changed.changed()).await;
        }
    }

    /// A GET's answer's headers came (or it failed).
    fn answered(&self, key: &Key) {
        let now = Instant::now();
        let mut entries = self.lock();
        let Some(e) = entries.get_mut(key) else {
            return;
        };
        e.pending = e.pending.saturating_sub(1);
        if e.live(now) {
            e.changed.send_replace(());
        } else {
            // Dropping the sender wakes the waiting POSTs.
            entries.remove(key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Drops what no POST will wait for any more, once the map is large: an
/// `initialized` whose client never opened a GET stream nor sent a POST.
fn sweep(entries: &mut HashMap<Key, Entry>, now: Instant) {
    if entries.len() >= SWEEP_AT {
        entries.retain(|_, e| e.live(now));
    }
}

impl Drop for GetGuard {
    fn drop(&mut self) {
        self.opening.answered(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UP: &str = "up";

    async fn elapsed_ms(f: impl std::future::Future<Output = ()>) -> u128 {
        let t = std::time::Instant::now();
        f.await;
        t.elapsed().as_millis()
    }

    #[test]
    fn the_wait_is_send() {
        fn send<T: Send>(_: &T) {}
        let o = Arc::new(Opening::default());
        let wait = o.before_post(UP, b"s");
        send(&wait);
        send(&o.get(UP, b"s"));
    }

    #[tokio::test]
    async fn a_post_without_a_get_goes_at_once() {
        let o = Arc::new(Opening::default());
        assert!(elapsed_ms(o.before_post(UP, b"s")).await < 20);
        assert_eq!(o.len(), 0);
    }

    #[tokio::test]
    async fn a_post_waits_for_the_get_that_arrived_first() {
        let o = Arc::new(Opening::default());
        let guard = o.get(UP, b"s");
        let answer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(guard);
        });
        let waited = elapsed_ms(o.before_post(UP, b"s")).await;
        assert!((90..900).contains(&waited), "waited {waited} ms");
        answer.await.unwrap();
        assert_eq!(o.len(), 0);
        // Another session never waited.
        assert!(elapsed_ms(o.before_post(UP, b"other")).await < 20);
    }

    #[tokio::test]
    async fn a_get_that_is_not_answered_holds_posts_no_longer_than_its_bound() {
        let o = Arc::new(Opening::default());
        let guard = o.get(UP, b"s");
        let waited = elapsed_ms(o.before_post(UP, b"s")).await;
        assert!(waited >= GET_BOUND.as_millis() - 10, "waited {waited} ms");
        // Past the bound, later POSTs do not wait at all.
        assert!(elapsed_ms(o.before_post(UP, b"s")).await < 20);
        drop(guard);
        assert_eq!(o.len(), 0);
    }

    #[tokio::test]
    async fn after_initialized_a_post_waits_for_the_first_get_and_its_answer() {
        let o = Arc::new(Opening::default());
        o.initialized(UP, b"s");
        let o2 = o.clone();
        let client = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            let guard = o2.get(UP, b"s");
            // Answered after the grace: the POST still waits for it.
            tokio::time::sleep(FIRST_GET_GRACE + Duration::from_millis(50)).await;
            drop(guard);
        });
        let waited = elapsed_ms(o.before_post(UP, b"s")).await;
        let least = 30 + FIRST_GET_GRACE.as_millis() + 50 - 10;
        assert!(waited >= least, "waited {waited} ms");
        client.await.unwrap();
        assert_eq!(o.len(), 0);
    }

    #[tokio::test]
    async fn a_client_that_opens_no_get_pays_the_grace_once() {
        let o = Arc::new(Opening::default());
        o.initialized(UP, b"s");
        let waited = elapsed_ms(o.before_post(UP, b"s")).await;
        assert!(
            waited >= FIRST_GET_GRACE.as_millis() - 10,
            "waited {waited} ms"
        );
        assert!(elapsed_ms(o.before_post(UP, b"s")).await < 20);
        assert_eq!(o.len(), 0);
    }

    #[tokio::test]
    async fn a_get_already_answered_leaves_nothing_to_wait_for() {
        let o = Arc::new(Opening::default());
        o.initialized(UP, b"s");
        drop(o.get(UP, b"s"));
        assert!(elapsed_ms(o.before_post(UP, b"s")).await < 20);
        assert_eq!(o.len(), 0);
    }

    #[tokio::test]
    async fn two_gets_hold_posts_until_both_are_answered() {
        let o = Arc::new(Opening::default());
        let first = o.get(UP, b"s");
        let second = o.get(UP, b"s");
        drop(first);
        let answer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(80)).await;
            drop(second);
        });
        let waited = elapsed_ms(o.before_post(UP, b"s")).await;
        assert!(waited >= 70, "waited {waited} ms");
        answer.await.unwrap();
        assert_eq!(o.len(), 0);
    }
}
