//! Serving threads ("shards"): the MCP listener is served by `server.threads`
//! OS threads, each a single-threaded tokio runtime with an accept loop of
//! its own on the one listening socket, and with upstream connections of its
//! own ([`current`] picks them). A forwarded call (the client's connection,
//! the decision, the spool append, the upstream's connection, the relay)
//! then runs start to end on the thread that accepted it: no hand-off
//! between threads and no wake-up of another thread on its path (a
//! work-stealing runtime wakes idle workers whenever work is queued, which
//! the profile showed as a tenth of the firewall's CPU).
//!
//! Everything else (the admin listener, background tasks, the audit
//! shipper) stays on the process's main runtime.
//!
//! Connections are spread over the threads ([`Spread`]): the kernel wakes
//! every thread waiting on the shared socket and the first to call `accept`
//! takes what is queued, so a burst of connections (a client pool opening,
//! a load balancer reconnecting) lands on one thread and leaves the others
//! idle for the connections' whole life (measured: one thread of two took
//! all 16 of a load generator's connections, and the firewall ran on one
//! CPU). A thread that accepts a connection while it serves more than the
//! least busy thread hands it over, once, before a byte is read: the hand-off
//! is per connection, never per call.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

thread_local! {
    static SHARD: Cell<usize> = const { Cell::new(0) };
    /// On a serving thread: the runtime that started it (the process's
    /// main one), where work that must outlive a connection goes.
    static MAIN: std::cell::RefCell<Option<tokio::runtime::Handle>> =
        const { std::cell::RefCell::new(None) };
}

/// Spawns `task`, which must finish even if the connection (and the serving
/// thread) that left it behind ends first: completion rows of a client that
/// went away, an answer in the client's place. On a serving thread it goes
/// to the main runtime (a rare path, so the hand-off is moot); elsewhere to
/// the current one. Without any runtime it is dropped, and false returned.
pub(crate) fn spawn_detached<F>(task: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    let main = MAIN.with(|m| m.borrow().clone());
    match main.or_else(|| tokio::runtime::Handle::try_current().ok()) {
        Some(rt) => {
            rt.spawn(task);
            true
        }
        None => false,
    }
}

/// Most serving threads (and so upstream connection sets per upstream).
pub(crate) const MAX_SHARDS: usize = 64;

/// The serving thread this code runs on: `1..=MAX_SHARDS`, or 0 off them.
pub(crate) fn current() -> usize {
    SHARD.with(Cell::get)
}

/// How many serving threads `configured` asks for: 0 means one per CPU.
pub(crate) fn count(configured: usize) -> usize {
    let n = if configured == 0 {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    } else {
        configured
    };
    n.clamp(1, MAX_SHARDS)
}

/// Runs `serve(i)` on each of `n` serving threads (`i` in `1..=n`), each on a
/// single-threaded runtime of its own; resolves once every one returned.
/// Called on the main runtime: what a serving thread hands to
/// [`spawn_detached`] runs there. Tasks still alive on a serving thread when
/// its `serve` returned (idle upstream connections) end with it.
///
/// # Errors
/// A thread or runtime that cannot be started, or no runtime to call it on.
pub(crate) fn spawn<F, Fut>(
    n: usize,
    serve: F,
) -> std::io::Result<impl Future<Output = ()> + Send + 'static>
where
    F: Fn(usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let main = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
    let mut done = Vec::with_capacity(n);
    for i in 1..=n {
        let main = main.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let serve = serve.clone();
        std::thread::Builder::new()
            .name(format!("mcp-serve-{i}"))
            .spawn(move || {
                SHARD.with(|s| s.set(i));
                MAIN.with(|m| *m.borrow_mut() = Some(main));
                // Inside the runtime: `serve` may register sockets.
                let serving = {
                    let _inside = runtime.enter();
                    serve(i)
                };
                runtime.block_on(serving);
                drop(runtime);
                let _ = tx.send(());
            })?;
        done.push(rx);
    }
    Ok(async move {
        for rx in done {
            let _ = rx.await;
        }
    })
}

/// The open connections of each serving thread, and an inbox per thread
/// for the connections another one accepted and hands over.
pub(crate) struct Spread<T> {
    /// Connections placed on each thread (index `shard - 1`) and still open.
    loads: Box<[AtomicUsize]>,
    inboxes: Box<[mpsc::UnboundedSender<T>]>,
    /// Each thread's receiving end, taken once by the thread.
    receivers: Mutex<Vec<Option<mpsc::UnboundedReceiver<T>>>>,
}

/// A connection counted on a serving thread until it is dropped.
pub(crate) struct Placed<T: Send + 'static> {
    spread: Arc<Spread<T>>,
    /// The thread it is counted on (`1..=n`).
    pub shard: usize,
}

impl<T: Send + 'static> Spread<T> {
    /// A spread over `n` serving threads.
    pub(crate) fn new(n: usize) -> Arc<Self> {
        let (inboxes, receivers): (Vec<_>, Vec<_>) = (0..n)
            .map(|_| {
                let (tx, rx) = mpsc::unbounded_channel();
                (tx, Some(rx))
            })
            .unzip();
        Arc::new(Spread {
            loads: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            inboxes: inboxes.into(),
            receivers: Mutex::new(receivers),
        })
    }

    /// The inbox of serving thread `shard`: given once.
    pub(crate) fn inbox(&self, shard: usize) -> Option<mpsc::UnboundedReceiver<T>> {
        let mut receivers = self.receivers.lock().ok()?;
        receivers.get_mut(shard.checked_sub(1)?)?.take()
    }

    /// Where a connection accepted on `here` is served: `here`, unless
    /// another thread serves fewer connections (the least busy one then;
    /// ties stay). Counted there until the [`Placed`] is dropped. Off the
    /// serving threads (`here` 0 or out of range) nothing is counted.
    pub(crate) fn place(self: &Arc<Self>, here: usize) -> Option<Placed<T>> {
        let mine = self
            .loads
            .get(here.checked_sub(1)?)?
            .load(Ordering::Relaxed);
        let mut to = here;
        let mut least = mine;
        for (i, load) in self.loads.iter().enumerate() {
            let l = load.load(Ordering::Relaxed);
            if l < least {
                least = l;
                to = i + 1;
            }
        }
        Some(self.count(to))
    }

    /// Counts one more connection on `shard`.
    fn count(self: &Arc<Self>, shard: usize) -> Placed<T> {
        if let Some(l) = shard.checked_sub(1).and_then(|i| self.loads.get(i)) {
            l.fetch_add(1, Ordering::Relaxed);
        }
        Placed {
            spread: Arc::clone(self),
            shard,
        }
    }

    /// Hands `item` to serving thread `shard`; gives it back if that thread
    /// no longer takes any (it stopped).
    pub(crate) fn hand(&self, shard: usize, item: T) -> Result<(), T> {
        match shard.checked_sub(1).and_then(|i| self.inboxes.get(i)) {
            Some(tx) => tx.send(item).map_err(|e| e.0),
            None => Err(item),
        }
    }

    /// The connections each thread serves now, in thread order (tests).
    #[cfg(test)]
    pub(crate) fn loads(&self) -> Vec<usize> {
        self.loads
            .iter()
            .map(|l| l.load(Ordering::Relaxed))
            .collect()
    }
}

impl<T: Send + 'static> Placed<T> {
    /// The same connection counted on `shard` instead (a hand-over that did
    /// not happen).
    pub(crate) fn recount(self, shard: usize) -> Placed<T> {
        let spread = Arc::clone(&self.spread);
        drop(self);
        spread.count(shard)
    }
}

impl<T: Send + 'static> Drop for Placed<T> {
    fn drop(&mut self) {
        if let Some(l) = self
            .shard
            .checked_sub(1)
            .and_then(|i| self.spread.loads.get(i))
        {
            l.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn configured_counts_are_bounded() {
        assert!(count(0) >= 1);
        assert_eq!(count(3), 3);
        assert_eq!(count(1000), MAX_SHARDS);
    }

    #[test]
    fn a_burst_accepted_on_one_thread_is_spread_evenly() {
        let spread = Spread::<u32>::new(3);
        // Every connection is accepted on thread 1, as after a burst.
        let placed: Vec<_> = (0..9).map(|_| spread.place(1).unwrap()).collect();
        assert_eq!(spread.loads(), [3, 3, 3]);
        // Ties stay where they were accepted.
        assert_eq!(placed.first().unwrap().shard, 1);
        // Closing thread 2's connections makes it the one to hand to.
        let (two, rest): (Vec<_>, Vec<_>) = placed.into_iter().partition(|p| p.shard == 2);
        drop(two);
        assert_eq!(spread.loads(), [3, 0, 3]);
        let next = spread.place(3).unwrap();
        assert_eq!(next.shard, 2);
        // A hand-over that did not happen counts where it stays.
        let back = next.recount(3);
        assert_eq!(spread.loads(), [3, 0, 4]);
        drop((back, rest));
        assert_eq!(spread.loads(), [0, 0, 0]);
        // Off the serving threads nothing is counted.
        assert!(spread.place(0).is_none());
        assert!(spread.place(4).is_none());
    }

    #[tokio::test]
    async fn handed_items_reach_the_inbox_taken_once() {
        let spread = Spread::<u32>::new(2);
        let mut inbox = spread.inbox(2).unwrap();
        assert!(spread.inbox(2).is_none(), "an inbox is given once");
        spread.hand(2, 7).unwrap();
        assert_eq!(inbox.recv().await, Some(7));
        drop(inbox);
        assert_eq!(spread.hand(2, 8), Err(8), "a stopped thread gives it back");
        assert_eq!(spread.hand(3, 9), Err(9));
    }

    #[tokio::test]
    async fn each_thread_knows_its_shard_and_detached_work_outlives_it() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let done = spawn(3, move |i| {
            let s = s.clone();
            async move {
                assert_eq!(current(), i);
                // Work left behind when the serve future returns: on the
                // main runtime, so it finishes after the thread is gone.
                assert!(spawn_detached(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    s.lock().unwrap().push(current());
                }));
            }
        })
        .unwrap();
        assert_eq!(current(), 0);
        done.await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Ran off the serving threads, once per thread.
        assert_eq!(*seen.lock().unwrap(), [0, 0, 0]);
    }
}
