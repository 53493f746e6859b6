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
//! shipper) stays on the process's main runtime. A thread that is busy does
//! not accept: the kernel hands a new connection to a thread waiting in
//! `accept`.

use std::cell::Cell;
use std::future::Future;

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
pub fn spawn_detached<F>(task: F) -> bool
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
pub const MAX_SHARDS: usize = 64;

/// The serving thread this code runs on: `1..=MAX_SHARDS`, or 0 off them.
pub fn current() -> usize {
    SHARD.with(Cell::get)
}

/// How many serving threads `configured` asks for: 0 means one per CPU.
pub fn count(configured: usize) -> usize {
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
pub fn spawn<F, Fut>(
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
