//! The labels a run has taken in (`untrusted`, `private`), kept beside its
//! budget and for as long: in this process, and in Redis when budgets are
//! shared, so every replica and a restarted one see them.
//!
//! Labels are only ever added, so what this process knows is a lower bound
//! of what the run holds: [`RunLabels::known`] answers from memory without
//! I/O (the audit row's labels), and [`RunLabels::held`] asks Redis only
//! for a label this process has not seen (a gate's decision). With each
//! label the first content that brought it is kept (`web: tools/call
//! fetch_page`), so an approval card and a refusal can name it.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;

use crate::policy::Labels;
use crate::state::{key_part, Unavailable};

use super::shared::RedisBudgets;

/// What a run holds: its labels, and what brought each in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// The labels.
    pub labels: Labels,
    /// What brought `untrusted` in.
    pub untrusted_from: Option<Arc<str>>,
    /// What brought `private` in.
    pub private_from: Option<Arc<str>>,
}

impl Held {
    /// What brought `label` in.
    pub fn source(&self, label: Labels) -> Option<&str> {
        if label == Labels::UNTRUSTED {
            self.untrusted_from.as_deref()
        } else if label == Labels::PRIVATE {
            self.private_from.as_deref()
        } else {
            None
        }
    }

    /// Adds `labels` brought in by `source` (a label held keeps its first
    /// source).
    fn add(&mut self, labels: Labels, source: &Arc<str>) {
        if labels.contains(Labels::UNTRUSTED) && self.untrusted_from.is_none() {
            self.untrusted_from = Some(source.clone());
        }
        if labels.contains(Labels::PRIVATE) && self.private_from.is_none() {
            self.private_from = Some(source.clone());
        }
        self.labels = self.labels.union(labels);
    }

    /// `private (from crm: tools/call get_customer), untrusted (from …)`.
    pub fn describe(&self) -> String {
        if self.labels.is_empty() {
            return "none".to_owned();
        }
        Labels::ALL
            .iter()
            .filter(|(l, _)| self.labels.contains(*l))
            .map(|(l, name)| match self.source(*l) {
                Some(from) => format!("{name} (from {from})"),
                None => (*name).to_owned(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[derive(Debug, Clone)]
struct Entry {
    held: Held,
    /// The run's last activity here (a call, or a label taken).
    last_ms: u64,
    /// When the run's Redis key's lifetime was last renewed.
    renewed_ms: u64,
}

/// The runs' labels.
pub struct RunLabels {
    local: DashMap<u64, Entry>,
    hasher: std::collections::hash_map::RandomState,
    ttl_ms: u64,
    max_runs: usize,
    shared: Option<Arc<RedisBudgets>>,
}

impl RunLabels {
    /// Labels kept `ttl` after a run's last label, at most `max_runs` runs
    /// in memory; in Redis too when `shared`.
    pub fn new(ttl: Duration, max_runs: usize, shared: Option<Arc<RedisBudgets>>) -> RunLabels {
        RunLabels {
            local: DashMap::new(),
            hasher: Default::default(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1000),
            max_runs,
            shared,
        }
    }

    fn key(&self, tenant: &str, run: &str) -> u64 {
        self.hasher.hash_one((tenant, run))
    }

    /// What this process knows the run holds (no I/O).
    pub fn known(&self, tenant: &str, run: &str) -> Labels {
        if self.local.is_empty() {
            return Labels::NONE;
        }
        self.local
            .get(&self.key(tenant, run))
            .map_or(Labels::NONE, |e| e.held.labels)
    }

    /// What this process knows the run holds, with the sources (no I/O).
    pub fn known_held(&self, tenant: &str, run: &str) -> Held {
        self.local
            .get(&self.key(tenant, run))
            .map(|e| e.held.clone())
            .unwrap_or_default()
    }

    /// What the run holds: from memory, and from Redis when budgets are
    /// shared and this process has not seen every label.
    ///
    /// # Errors
    /// Redis could not be asked (the caller fails closed).
    pub async fn held(&self, tenant: &str, run: &str) -> Result<Held, Unavailable> {
        let key = self.key(tenant, run);
        let mine = self
            .local
            .get(&key)
            .map(|e| e.held.clone())
            .unwrap_or_default();
        let Some(shared) = &self.shared else {
            return Ok(mine);
        };
        if mine
            .labels
            .contains(Labels::PRIVATE.union(Labels::UNTRUSTED))
        {
            return Ok(mine);
        }
        let rkey = redis_key(shared, tenant, run);
        let (untrusted, private): (Option<String>, Option<String>) = shared
            .redis()
            .run(|mut c| async move {
                redis::cmd("HMGET")
                    .arg(&rkey)
                    .arg("untrusted")
                    .arg("private")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let mut held = mine;
        if let Some(from) = untrusted {
            held.add(Labels::UNTRUSTED, &Arc::from(from));
        }
        if let Some(from) = private {
            held.add(Labels::PRIVATE, &Arc::from(from));
        }
        if !held.labels.is_empty() {
            self.remember(key, &held);
        }
        Ok(held)
    }

    fn remember(&self, key: u64, held: &Held) {
        let now = super::unix_ms();
        let mut e = self.local.entry(key).or_insert_with(|| Entry {
            held: Held::default(),
            last_ms: now,
            renewed_ms: now,
        });
        if let Some(from) = &held.untrusted_from {
            e.held.add(Labels::UNTRUSTED, from);
        }
        if let Some(from) = &held.private_from {
            e.held.add(Labels::PRIVATE, from);
        }
        e.held.labels = e.held.labels.union(held.labels);
        e.last_ms = now;
    }

    /// The run took in content with `labels`, brought by `source` (what
    /// is asked for only when a label is new to this process). In memory
    /// at once; in Redis on a task whose handle lets the answer wait for
    /// it (a failure is logged and counted in
    /// `mcp_firewall_label_store_errors_total`).
    #[must_use = "an answer should wait for its labels to be stored"]
    pub fn take(
        &self,
        tenant: &str,
        run: &str,
        labels: Labels,
        source: impl FnOnce() -> String,
        metrics: &Arc<crate::telemetry::Metrics>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if labels.is_empty() {
            return None;
        }
        let key = self.key(tenant, run);
        // The common case, a run taking in what it already holds: no
        // source built, nothing stored again (Redis has it, or is being
        // told).
        if let Some(mut e) = self.local.get_mut(&key) {
            if e.held.labels.contains(labels) {
                e.last_ms = super::unix_ms();
                return None;
            }
        }
        let source: Arc<str> = Arc::from(source());
        let mut held = Held::default();
        held.add(labels, &source);
        self.remember(key, &held);
        if self.local.len() > self.max_runs.saturating_add(self.max_runs / 64 + 1) {
            self.sweep_to(self.max_runs);
        }
        let shared = self.shared.clone()?;
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let rkey = redis_key(&shared, tenant, run);
        let ttl = self.ttl_ms;
        let metrics = metrics.clone();
        Some(rt.spawn(async move {
            let r = shared
                .redis()
                .run(|mut c| {
                    let mut p = redis::pipe();
                    for (l, name) in Labels::ALL {
                        if labels.contains(l) {
                            p.hset_nx(&rkey, name, &*source).ignore();
                        }
                    }
                    p.pexpire(&rkey, i64::try_from(ttl).unwrap_or(i64::MAX))
                        .ignore();
                    async move { p.query_async::<()>(&mut c).await }
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(error = %e, "a run's labels could not be stored in Redis; this replica keeps them");
                metrics.label_store_errors.inc();
            }
        }))
    }

    /// The run is active (it made a call): the labels it holds here last
    /// the lifetime from now, and so does its key in Redis (renewed at
    /// most every third of the lifetime), so a run keeps its labels for
    /// as long as it is active and loses them only `ttl` after its last
    /// activity.
    pub fn touch(&self, tenant: &str, run: &str) {
        if self.local.is_empty() {
            return;
        }
        let now = super::unix_ms();
        let Some(mut e) = self.local.get_mut(&self.key(tenant, run)) else {
            return;
        };
        e.last_ms = now;
        let Some(shared) = self.shared.clone() else {
            return;
        };
        if now.saturating_sub(e.renewed_ms) < self.ttl_ms / 3 {
            return;
        }
        e.renewed_ms = now;
        drop(e);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rkey = redis_key(&shared, tenant, run);
        let ttl = i64::try_from(self.ttl_ms).unwrap_or(i64::MAX);
        rt.spawn(async move {
            let r = shared
                .redis()
                .run(|mut c| {
                    let rkey = rkey.clone();
                    async move {
                        redis::cmd("PEXPIRE")
                            .arg(&rkey)
                            .arg(ttl)
                            .query_async::<()>(&mut c)
                            .await
                    }
                })
                .await;
            if let Err(e) = r {
                tracing::debug!(error = %e, "a run's labels' lifetime could not be renewed in Redis");
            }
        });
    }

    /// Drops runs whose last activity is older than the lifetime.
    pub fn sweep(&self) {
        let now = super::unix_ms();
        let ttl = self.ttl_ms;
        self.local
            .retain(|_, e| e.last_ms.saturating_add(ttl) > now);
        self.sweep_to(self.max_runs);
    }

    /// Keeps at most `cap` runs, dropping the oldest (their labels stay in
    /// Redis when shared).
    fn sweep_to(&self, cap: usize) {
        super::evict_oldest(&self.local, cap, |e| e.last_ms);
    }
}

fn redis_key(shared: &RedisBudgets, tenant: &str, run: &str) -> String {
    format!(
        "{}:{{{}}}:labels:{}",
        shared.redis().prefix(),
        key_part(tenant),
        key_part(run)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> Arc<crate::telemetry::Metrics> {
        crate::telemetry::Metrics::register(&mut Default::default())
    }

    #[tokio::test]
    async fn labels_accumulate_and_keep_their_first_source() {
        let l = RunLabels::new(Duration::from_secs(60), 100, None);
        let m = metrics();
        assert!(l.known("t", "r").is_empty());
        assert!(l
            .take("t", "r", Labels::PRIVATE, || "crm: get".into(), &m)
            .is_none());
        let _ = l.take("t", "r", Labels::UNTRUSTED, || "web: fetch".into(), &m);
        let _ = l.take(
            "t",
            "r",
            Labels::PRIVATE,
            || unreachable!("a label held asks for no source"),
            &m,
        );
        let held = l.held("t", "r").await.unwrap();
        assert_eq!(held.labels, Labels::PRIVATE.union(Labels::UNTRUSTED));
        assert_eq!(held.source(Labels::PRIVATE), Some("crm: get"));
        assert_eq!(
            held.describe(),
            "private (from crm: get), untrusted (from web: fetch)"
        );
        assert!(l.known("t", "other").is_empty());
        assert!(l.known("u", "r").is_empty());
    }

    #[test]
    fn memory_stays_bounded() {
        let l = RunLabels::new(Duration::from_secs(60), 10, None);
        let m = metrics();
        for i in 0..100 {
            let _ = l.take("t", &format!("r{i}"), Labels::UNTRUSTED, || "x".into(), &m);
        }
        assert!(l.local.len() <= 12, "{}", l.local.len());
    }
}
