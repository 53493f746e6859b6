//! The pin store behind `mcp-firewall pins` and the admin API: pin files on disk,
//! proposals, approving and reviewing them, reloading when the files change.

use super::*;
use arc_swap::ArcSwap;
use dashmap::DashMap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::canonical;
use serde_json::Value;

// === The store ===

/// (upstream, subject, name).
pub(super) type Key = (String, Subject, String);

pub(super) fn key(upstream: &str, subject: Subject, name: &str) -> Key {
    (upstream.to_owned(), subject, name.to_owned())
}

/// The pins in force, the reviews pending, and the drift events.
pub struct PinStore {
    dir: PathBuf,
    current: ArcSwap<Pins>,
    generation: AtomicU64,
    /// Pending reviews by (upstream, subject, name).
    proposals: DashMap<Key, Proposal>,
    /// Definitions a person rejected: not proposed again.
    rejected: DashMap<Key, String>,
    /// The hash each prompt and resource template was last listed with
    /// (tools have the catalog).
    seen: DashMap<Key, [u8; 32]>,
    drift: Family<DriftLabels, Counter>,
    hook: OnceLock<DriftHook>,
    signature: std::sync::Mutex<Vec<(PathBuf, std::time::SystemTime, u64)>>,
}

impl std::fmt::Debug for PinStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinStore")
            .field("dir", &self.dir)
            .field("proposals", &self.proposals.len())
            .finish_non_exhaustive()
    }
}

impl PinStore {
    /// Loads `policy_dir/pins` and registers the drift metric.
    pub fn open(
        policy_dir: &Path,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Result<Arc<PinStore>, PinsError> {
        let dir = policy_dir.join(PINS_DIR);
        let pins = Pins::load(&dir)?;
        let drift = Family::<DriftLabels, Counter>::default();
        registry.register(
            "pin_drift",
            "Tool definitions seen unlike their pin, without one, or imitating a pinned name (first sighting per replica)",
            drift.clone(),
        );
        let store = PinStore {
            signature: std::sync::Mutex::new(signature(&dir)),
            dir,
            current: ArcSwap::from_pointee(pins),
            generation: AtomicU64::new(1),
            proposals: DashMap::new(),
            rejected: DashMap::new(),
            seen: DashMap::new(),
            drift,
            hook: OnceLock::new(),
        };
        Ok(Arc::new(store))
    }

    /// No pins, nowhere to write them (tests, `off` everywhere).
    pub fn empty() -> Arc<PinStore> {
        Arc::new(PinStore {
            dir: PathBuf::new(),
            current: ArcSwap::from_pointee(Pins::default()),
            generation: AtomicU64::new(1),
            proposals: DashMap::new(),
            rejected: DashMap::new(),
            seen: DashMap::new(),
            drift: Family::default(),
            hook: OnceLock::new(),
            signature: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Where the pin files are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sets what happens on drift (audit row, webhook); once.
    pub fn on_drift(&self, hook: DriftHook) {
        let _ = self.hook.set(hook);
    }

    /// The pins in force.
    pub fn current(&self) -> Arc<Pins> {
        self.current.load_full()
    }

    /// Changes whenever the pins do (list views depend on it).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Re-reads the files if any changed; keeps the pins in force when the
    /// new ones are invalid (and says so).
    pub fn reload_if_changed(&self) -> Result<bool, PinsError> {
        let now = signature(&self.dir);
        {
            let Ok(mut sig) = self.signature.lock() else {
                return Ok(false);
            };
            if *sig == now {
                return Ok(false);
            }
            *sig = now;
        }
        self.reload()?;
        Ok(true)
    }

    /// Re-reads the files.
    pub fn reload(&self) -> Result<(), PinsError> {
        let pins = Pins::load(&self.dir)?;
        self.current.store(Arc::new(pins));
        self.generation.fetch_add(1, Ordering::AcqRel);
        // Reviews the new pins settle are no longer pending.
        let current = self.current();
        self.proposals.retain(|(up, subject, name), p| {
            canonical::parse_hex32(&p.sha256)
                .is_none_or(|sha| current.verdict_of(up, *subject, name, &sha) != Verdict::Pinned)
        });
        tracing::info!(dir = %self.dir.display(), "pins loaded");
        Ok(())
    }

    /// Whether pins matter for `upstream` in `mode` (not `off`, or `off`
    /// with a pin file, where shadowing names are still refused).
    pub fn applies(&self, mode: Mode, upstream: &str) -> bool {
        mode != Mode::Off || self.current().upstreams.contains_key(upstream)
    }

    /// Looks at one listed tool of an upstream in `mode`: whether the run may
    /// see it, and a drift event and review when it is new or changed.
    /// `definition` is the tool's JSON as listed, `sha256` its pin hash.
    pub fn observe(
        &self,
        mode: Mode,
        upstream: &str,
        tool: &str,
        sha256: &[u8; 32],
        definition: &Value,
    ) -> Result<(), Refusal> {
        self.observe_of(mode, upstream, Subject::Tool, tool, sha256, definition)
    }

    /// [`PinStore::observe`] for any subject; prompts and resource
    /// templates are remembered as listed, for [`PinStore::check_listed`].
    pub fn observe_of(
        &self,
        mode: Mode,
        upstream: &str,
        subject: Subject,
        name: &str,
        sha256: &[u8; 32],
        definition: &Value,
    ) -> Result<(), Refusal> {
        let pins = self.current();
        if mode == Mode::Off && !pins.upstreams.contains_key(upstream) {
            return Ok(());
        }
        let key = key(upstream, subject, name);
        if subject != Subject::Tool {
            self.seen.insert(key.clone(), *sha256);
        }
        let verdict = pins.verdict_of(upstream, subject, name, sha256);
        let hex = canonical::hex(sha256);
        let refusal = match (&verdict, mode) {
            (Verdict::Pinned, _) => return Ok(()),
            (Verdict::Shadows(other), _) => Some(Refusal::Shadows(other.clone())),
            (_, Mode::Off) => return Ok(()),
            _ if self.rejected.get(&key).is_some_and(|r| *r == hex) => {
                return Err(Refusal::Rejected)
            }
            (Verdict::Unpinned, Mode::Enforce) => Some(Refusal::Unpinned),
            (Verdict::Mismatch, Mode::Enforce) => Some(Refusal::Mismatch),
            (_, _) => None,
        };
        if self.proposals.get(&key).is_none_or(|p| p.sha256 != hex) {
            let proposal = Proposal {
                upstream: upstream.to_owned(),
                subject,
                tool: name.to_owned(),
                kind: match verdict {
                    Verdict::Mismatch => "changed",
                    Verdict::Shadows(_) => "shadowing",
                    _ => "new",
                },
                sha256: hex,
                definition: canonical::canonical_exact(definition),
                pinned: pins.pin(upstream, subject, name).cloned(),
                first_seen_ms: crate::clock::now_ms(),
            };
            // Two listings seen at once (a refill and a relayed list) raise
            // one event: only the one that puts the proposal in place does.
            let fresh = match self.proposals.entry(key) {
                dashmap::Entry::Occupied(e) if e.get().sha256 == proposal.sha256 => false,
                dashmap::Entry::Occupied(mut e) => {
                    e.insert(proposal.clone());
                    true
                }
                dashmap::Entry::Vacant(e) => {
                    e.insert(proposal.clone());
                    true
                }
            };
            if !fresh {
                return refusal.map_or(Ok(()), Err);
            }
            self.drift
                .get_or_create(&DriftLabels {
                    upstream: upstream.to_owned(),
                    tool: subject.label(name),
                })
                .inc();
            tracing::warn!(
                upstream,
                subject = subject.as_str(),
                name,
                kind = proposal.kind,
                sha256 = %proposal.sha256,
                ?mode,
                "definition drift"
            );
            if let Some(hook) = self.hook.get() {
                hook(&proposal);
            }
        }
        match refusal {
            Some(r) => Err(r),
            None => Ok(()),
        }
    }

    /// Whether a call of `tool` (listed with `sha256`) may run in `mode`;
    /// no events (the listing raised them). `Ok(Some(pin))`: it matched the
    /// pin with that hash (the audit row's `pin_sha256`); `Ok(None)`: it
    /// runs without matching a pin (`off`, or `record`).
    pub fn check(
        &self,
        mode: Mode,
        upstream: &str,
        tool: &str,
        sha256: &[u8; 32],
    ) -> Result<Option<[u8; 32]>, Refusal> {
        self.check_of(mode, upstream, Subject::Tool, tool, Some(sha256))
    }

    /// Whether a prompt (or template) may be used in `mode`, judged by the
    /// definition it was last listed with; one never listed here is judged
    /// by its name alone (pinned: yes). `Ok` as for [`PinStore::check`].
    pub fn check_listed(
        &self,
        mode: Mode,
        upstream: &str,
        subject: Subject,
        name: &str,
    ) -> Result<Option<[u8; 32]>, Refusal> {
        let seen = self.seen.get(&key(upstream, subject, name)).map(|e| *e);
        self.check_of(mode, upstream, subject, name, seen.as_ref())
    }

    fn check_of(
        &self,
        mode: Mode,
        upstream: &str,
        subject: Subject,
        name: &str,
        sha256: Option<&[u8; 32]>,
    ) -> Result<Option<[u8; 32]>, Refusal> {
        let pins = self.current();
        if mode == Mode::Off && !pins.upstreams.contains_key(upstream) {
            return Ok(None);
        }
        // The pin a pinned verdict matched, from the same pins as the verdict.
        let pinned = pins
            .upstreams
            .get(upstream)
            .and_then(|u| u.get(subject, name))
            .map(|(sha, _)| *sha);
        let verdict = match sha256 {
            Some(sha) => pins.verdict_of(upstream, subject, name, sha),
            None if pinned.is_some() => Verdict::Pinned,
            // Any hash that is not a pin's: unpinned or shadowing.
            None => pins.verdict_of(upstream, subject, name, &[0; 32]),
        };
        let rejected = || {
            sha256.is_some_and(|sha| {
                self.rejected
                    .get(&key(upstream, subject, name))
                    .is_some_and(|r| *r == canonical::hex(sha))
            })
        };
        match (verdict, mode) {
            (Verdict::Pinned, _) => Ok(pinned),
            (Verdict::Shadows(other), _) => Err(Refusal::Shadows(other)),
            (_, Mode::Off) => Ok(None),
            _ if rejected() => Err(Refusal::Rejected),
            (Verdict::Unpinned, Mode::Enforce) => Err(Refusal::Unpinned),
            (Verdict::Mismatch, Mode::Enforce) => Err(Refusal::Mismatch),
            _ => Ok(None),
        }
    }

    /// Pending reviews, oldest first.
    pub fn proposals(&self) -> Vec<Proposal> {
        let mut v: Vec<Proposal> = self.proposals.iter().map(|e| e.value().clone()).collect();
        v.sort_by(|a, b| {
            (a.first_seen_ms, &a.upstream, a.subject.as_str(), &a.tool).cmp(&(
                b.first_seen_ms,
                &b.upstream,
                b.subject.as_str(),
                &b.tool,
            ))
        });
        v
    }

    /// Accepts the pending definition `sha256` of `name`: writes its pin
    /// (by `who`) and reloads. Refused when what is pending is not that
    /// definition (a newer one arrived since the person looked), or when it
    /// imitates a pinned name.
    pub fn accept(
        &self,
        upstream: &str,
        subject: Subject,
        name: &str,
        sha256: &str,
        who: &str,
    ) -> Result<Pin, ReviewError> {
        let key = key(upstream, subject, name);
        let proposal = self
            .proposals
            .get(&key)
            .map(|p| p.value().clone())
            .ok_or(ReviewError::NothingPending)?;
        if !proposal.sha256.eq_ignore_ascii_case(sha256) {
            return Err(ReviewError::Stale {
                pending: proposal.sha256,
            });
        }
        if proposal.kind == "shadowing" {
            return Err(ReviewError::Shadowing);
        }
        let definition: Value = serde_json::from_str(&proposal.definition)
            .map_err(|e| ReviewError::Write(e.to_string()))?;
        let pin = pin_of(&definition, who);
        write_pins(
            &self.dir,
            upstream,
            vec![(subject, name.to_owned(), pin.clone())],
        )
        .map_err(|e| ReviewError::Write(e.to_string()))?;
        self.reload()
            .map_err(|e| ReviewError::Write(e.to_string()))?;
        self.proposals.remove(&key);
        Ok(pin)
    }

    /// Rejects the pending definition `sha256`: it stays refused (in
    /// `record` too) and is not proposed again by this replica.
    pub fn reject(
        &self,
        upstream: &str,
        subject: Subject,
        name: &str,
        sha256: &str,
    ) -> Result<(), ReviewError> {
        let key = key(upstream, subject, name);
        let Some((_, proposal)) = self
            .proposals
            .remove_if(&key, |_, p| p.sha256.eq_ignore_ascii_case(sha256))
        else {
            return match self.proposals.get(&key) {
                Some(p) => Err(ReviewError::Stale {
                    pending: p.sha256.clone(),
                }),
                None => Err(ReviewError::NothingPending),
            };
        };
        self.rejected.insert(key, proposal.sha256);
        // Views remembered under the old generation listed it: the next
        // list is filtered again, without the rejected definition.
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

/// Why a review could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// No definition of this tool is waiting (404).
    #[error("no definition of this tool is pending review")]
    NothingPending,
    /// The pending definition is another one (409).
    #[error("the pending definition is {pending}, not the one reviewed; look again")]
    Stale {
        /// What is pending now.
        pending: String,
    },
    /// A name imitating a pinned one cannot be accepted (409).
    #[error("this name imitates a pinned tool's and cannot be pinned; rename it upstream")]
    Shadowing,
    /// The pin file could not be written (500).
    #[error("the pin could not be written: {0}")]
    Write(String),
}

pub(super) fn signature(dir: &Path) -> Vec<(PathBuf, std::time::SystemTime, u64)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((e.path(), m.modified().ok()?, m.len()))
        })
        .collect();
    v.sort();
    v
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
