//! Hot reload: the policy directory is checked for changes off the request
//! path; a valid change is compiled and swapped in atomically (requests in
//! flight finish on the snapshot they started with, new ones see the new
//! one, no connection is touched); an invalid change keeps the old policy,
//! logs why and sets the `policy_reload_error` gauge to 1 until a valid
//! version arrives.
//!
//! A shadow set (`[policy] shadow_dir`) is loaded and reloaded the same
//! way beside it, except that a set that does not compile is reported (log,
//! `policy_shadow_error` = 1) and left out, never fatal: decisions then have
//! no shadow until a valid version arrives. Each swap logs what the change
//! does in effect ([`super::diff`]): roles gained or lost, tools whose risk
//! or gate changed, by name.
//!
//! The directory is polled (names, sizes, modification times) rather than
//! watched: editors and config-map updates replace files through renames and
//! symlink swaps that inotify watches miss, and a `stat` per file per second
//! costs nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::{ArcSwap, ArcSwapOption};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{load_dir, Policy, PolicyError, UpstreamFacts};

/// The current policy, swappable, and the shadow set beside it.
pub struct PolicyStore {
    current: ArcSwap<Policy>,
    dir: Option<PathBuf>,
    error: Gauge<i64, AtomicI64>,
    reloads: Counter,
    shadow: Option<Shadow>,
    /// The upstreams a change's effect is told for.
    upstreams: Vec<Facts>,
}

/// The shadow set (`[policy] shadow_dir`).
struct Shadow {
    current: ArcSwapOption<Policy>,
    dir: PathBuf,
    error: Gauge<i64, AtomicI64>,
}

/// What policy matches an upstream on, owned ([`UpstreamFacts`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// Route name.
    pub name: String,
    /// Projects (sorted).
    pub projects: Vec<String>,
    /// Categories (sorted).
    pub categories: Vec<String>,
    /// `trust_annotations`.
    pub trust_annotations: bool,
    /// `trust = "untrusted"`.
    pub untrusted: bool,
    /// `data = "private"`.
    pub private: bool,
    /// `egress = true`.
    pub egress: bool,
}

impl Facts {
    /// Owned copies of `f`.
    pub fn of(f: UpstreamFacts<'_>) -> Facts {
        Facts {
            name: f.name.to_owned(),
            projects: f.projects.to_vec(),
            categories: f.categories.to_vec(),
            trust_annotations: f.trust_annotations,
            untrusted: f.untrusted,
            private: f.private,
            egress: f.egress,
        }
    }

    /// Borrowed, as policy reads them.
    pub fn facts(&self) -> UpstreamFacts<'_> {
        UpstreamFacts {
            name: &self.name,
            projects: &self.projects,
            categories: &self.categories,
            trust_annotations: self.trust_annotations,
            untrusted: self.untrusted,
            private: self.private,
            egress: self.egress,
        }
    }
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

    /// Loads the live directory once (an error here stops the start) and
    /// the shadow directory, if any (an error there is reported, not
    /// fatal); `upstreams` are what reloads tell a change's effect for.
    pub fn load_with_shadow(
        dir: &Path,
        shadow_dir: Option<&Path>,
        upstreams: Vec<Facts>,
        registry: &mut Registry,
    ) -> Result<Arc<PolicyStore>, PolicyError> {
        let policy = load_dir(dir)?;
        let shadow = shadow_dir.map(|d| {
            let shadow = Shadow {
                current: ArcSwapOption::empty(),
                dir: d.to_owned(),
                error: Gauge::default(),
            };
            registry.register(
                "policy_shadow_error",
                "1 while the shadow policy files ([policy] shadow_dir) fail to compile (decisions have no shadow until they do)",
                shadow.error.clone(),
            );
            shadow
        });
        let mut store = Self::build(policy, Some(dir.to_owned()), registry);
        store.shadow = shadow;
        store.upstreams = upstreams;
        store.reload_shadow();
        Ok(Arc::new(store))
    }

    fn with(policy: Policy, dir: Option<PathBuf>, registry: &mut Registry) -> Arc<PolicyStore> {
        Arc::new(Self::build(policy, dir, registry))
    }

    fn build(policy: Policy, dir: Option<PathBuf>, registry: &mut Registry) -> PolicyStore {
        let store = PolicyStore {
            current: ArcSwap::from_pointee(policy),
            dir,
            error: Gauge::default(),
            reloads: Counter::default(),
            shadow: None,
            upstreams: Vec::new(),
        };
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

    /// The shadow set to decide beside the live one, when one is
    /// configured and compiles.
    pub fn shadow(&self) -> Option<Arc<Policy>> {
        self.shadow.as_ref().and_then(|s| s.current.load_full())
    }

    /// Compiles the shadow directory now: swaps it in if valid, else
    /// leaves decisions without a shadow and says why.
    pub fn reload_shadow(&self) {
        let Some(shadow) = &self.shadow else {
            return;
        };
        match load_dir(&shadow.dir) {
            Ok(p) => {
                let against = shadow
                    .current
                    .load_full()
                    .unwrap_or_else(|| self.load_full());
                let changes = super::diff::effect(&against, &p, &self.facts());
                tracing::info!(
                    dir = %shadow.dir.display(),
                    sha256 = p.content_hash(),
                    against = if shadow.current.load().is_some() { "the previous shadow set" } else { "the live policy" },
                    effect = %super::diff::summary(&changes),
                    "shadow policy loaded"
                );
                shadow.current.store(Some(Arc::new(p)));
                shadow.error.set(0);
            }
            Err(e) => {
                shadow.current.store(None);
                shadow.error.set(1);
                tracing::error!(dir = %shadow.dir.display(), error = %e, "shadow policy does not compile; decisions have no shadow until it does (the live policy is unaffected)");
            }
        }
    }

    fn facts(&self) -> Vec<UpstreamFacts<'_>> {
        self.upstreams.iter().map(Facts::facts).collect()
    }

    /// The snapshot to decide one request with.
    pub fn load_full(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// Compiles the directory now and swaps it in if valid; returns what
    /// the change does in effect (also logged).
    pub fn reload(&self) -> Result<Vec<super::diff::Change>, PolicyError> {
        let Some(dir) = &self.dir else {
            return Ok(Vec::new());
        };
        match load_dir(dir) {
            Ok(p) => {
                let changes = super::diff::effect(&self.load_full(), &p, &self.facts());
                let sha256 = p.content_hash().to_owned();
                self.current.store(Arc::new(p));
                self.error.set(0);
                self.reloads.inc();
                tracing::info!(
                    dir = %dir.display(),
                    sha256,
                    effect = %super::diff::summary(&changes),
                    "policy reloaded"
                );
                for c in &changes {
                    tracing::info!(change = %c, "policy change in effect");
                }
                Ok(changes)
            }
            Err(e) => {
                self.error.set(1);
                tracing::error!(error = %e, "policy change rejected; the previous policy stays in force");
                Err(e)
            }
        }
    }

    /// Watches the directory (and the shadow directory) until the task is
    /// dropped.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let Some(dir) = self.dir.clone() else {
            return;
        };
        let shadow_dir = self.shadow.as_ref().map(|s| s.dir.clone());
        let mut last = fingerprint(&dir);
        let mut last_shadow = shadow_dir.as_deref().map(fingerprint);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = fingerprint(&dir);
            if now != last {
                last = now;
                let _ = self.reload();
            }
            let now_shadow = shadow_dir.as_deref().map(fingerprint);
            if now_shadow != last_shadow {
                last_shadow = now_shadow;
                self.reload_shadow();
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

#[cfg(test)]
#[path = "reload_tests.rs"]
mod tests;
