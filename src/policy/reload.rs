//! Hot reload: the policy directory is checked for changes off the request
//! path; a valid change is compiled and swapped in atomically (requests in
//! flight finish on the snapshot they started with, new ones see the new
//! one, no connection is touched); an invalid change keeps the old policy,
//! logs why and sets the `policy_reload_error` gauge to 1 until a valid
//! version arrives.
//!
//! The directory is polled (names, sizes, modification times) rather than
//! watched: editors and config-map updates replace files through renames and
//! symlink swaps that inotify watches miss, and a `stat` per file per second
//! costs nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{load_dir, Policy, PolicyError};

/// The current policy, swappable.
pub struct PolicyStore {
    current: ArcSwap<Policy>,
    dir: Option<PathBuf>,
    error: Gauge<i64, AtomicI64>,
    reloads: Counter,
}

// === impl PolicyStore ===

impl PolicyStore {
    /// Loads the directory once (an error here stops the start).
    pub fn load(dir: &Path, registry: &mut Registry) -> Result<Arc<PolicyStore>, PolicyError> {
        let policy = load_dir(dir)?;
        Ok(Self::with(policy, Some(dir.to_owned()), registry))
    }

    /// A store holding a fixed policy (the demo's embedded one, tests).
    pub fn fixed(policy: Policy, registry: &mut Registry) -> Arc<PolicyStore> {
        Self::with(policy, None, registry)
    }

    fn with(policy: Policy, dir: Option<PathBuf>, registry: &mut Registry) -> Arc<PolicyStore> {
        let store = Arc::new(PolicyStore {
            current: ArcSwap::from_pointee(policy),
            dir,
            error: Gauge::default(),
            reloads: Counter::default(),
        });
        registry.register(
            "policy_reload_error",
            "1 while the newest policy files failed to compile (the previous policy stays in force)",
            store.error.clone(),
        );
        registry.register(
            "policy_reloads",
            "Policy versions swapped in after a change",
            store.reloads.clone(),
        );
        store
    }

    /// The snapshot to decide one request with.
    pub fn load_full(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// Compiles the directory now and swaps it in if valid.
    pub fn reload(&self) -> Result<(), PolicyError> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        match load_dir(dir) {
            Ok(p) => {
                self.current.store(Arc::new(p));
                self.error.set(0);
                self.reloads.inc();
                tracing::info!(dir = %dir.display(), "policy reloaded");
                Ok(())
            }
            Err(e) => {
                self.error.set(1);
                tracing::error!(error = %e, "policy change rejected; the previous policy stays in force");
                Err(e)
            }
        }
    }

    /// Watches the directory until the task is dropped.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let Some(dir) = self.dir.clone() else {
            return;
        };
        let mut last = fingerprint(&dir);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = fingerprint(&dir);
            if now != last {
                last = now;
                let _ = self.reload();
            }
        }
    }
}

fn fingerprint(dir: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((e.path(), m.len(), m.modified().ok()))
        })
        .collect();
    v.sort();
    v
}
