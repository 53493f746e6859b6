//! Tool-definition pinning against rug pulls: a vendor server cannot change
//! what a tool is after a person reviewed it.
//!
//! A **pin** is the SHA-256 of a tool's whole definition as the upstream
//! lists it (name, title, description, input and output schemas,
//! annotations, `_meta`, anything else it sends), in RFC 8785 canonical
//! JSON ([`crate::canonical`]), so an auditor recomputes it with any JCS library.
//! Pins live in the policy directory, in `pins/<upstream>.toml`, which the
//! security team commits: per tool the hash, the canonical definition it
//! was computed from, who pinned it and when. Files are re-read when they
//! change.
//!
//! Each upstream has a mode (`[[upstream]] pinning`):
//! - `off`: no pins are asked for;
//! - `record` (trust on first use): calls go through; a definition without
//!   a pin, or unlike its pin, is proposed for review;
//! - `enforce`: such a tool is hidden from `tools/list` and refused on
//!   `tools/call` exactly like an unknown tool (stop reason `unpinned` or
//!   `pin_mismatch`), until a person accepts its definition.
//!
//! In every mode, a tool whose name differs from a pinned one only by case,
//! whitespace, invisible characters or confusable letters (UTS #39
//! skeleton) is refused: it can only be there to be mistaken for the other.
//!
//! Every drift (first sighting of a new or changed definition, per replica)
//! is an event: an audit row (`method = 'pins'`), the metric
//! `mcp_firewall_pin_drift_total{upstream,tool}`, a webhook, and a pending
//! review with the pinned and the new definition side by side, accepted or
//! rejected through the admin API ([`api`]), the console or `mcp-firewall
//! pins`. Accepting writes the pin file.
//!
//! Prompts and resource templates are pinned the same way ([`Subject`]):
//! their descriptions reach the model too. A changed or unpinned one is
//! hidden from `prompts/list` / `resources/templates/list` in `enforce`,
//! and a prompt is refused on `prompts/get` like an unknown prompt.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use dashmap::DashMap;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical;

pub mod api;

/// The directory under the policy directory holding pin files.
pub const PINS_DIR: &str = "pins";

/// `[[upstream]] pinning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// No pins asked for.
    #[default]
    Off,
    /// Trust on first use: propose pins, let calls through.
    Record,
    /// Hide and refuse what is not pinned as listed.
    Enforce,
}

/// What a pin covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    /// A tool (`tools/list`), named by `name`.
    #[default]
    Tool,
    /// A prompt (`prompts/list`), named by `name`.
    Prompt,
    /// A resource template (`resources/templates/list`), named by
    /// `uriTemplate`.
    ResourceTemplate,
}

impl Subject {
    /// `tool`, `prompt`, `resource_template`.
    pub fn as_str(self) -> &'static str {
        match self {
            Subject::Tool => "tool",
            Subject::Prompt => "prompt",
            Subject::ResourceTemplate => "resource_template",
        }
    }

    /// Parses [`Subject::as_str`].
    pub fn parse(s: &str) -> Option<Subject> {
        [Subject::Tool, Subject::Prompt, Subject::ResourceTemplate]
            .into_iter()
            .find(|x| x.as_str() == s)
    }

    /// The member of a listed definition that names it.
    pub fn key(self) -> &'static str {
        match self {
            Subject::Tool | Subject::Prompt => "name",
            Subject::ResourceTemplate => "uriTemplate",
        }
    }

    /// Its table in a pin file.
    fn table(self) -> &'static str {
        match self {
            Subject::Tool => "tools",
            Subject::Prompt => "prompts",
            Subject::ResourceTemplate => "resource_templates",
        }
    }

    /// `name` for tools, `prompt:name` and `resource_template:uri` for the
    /// others (the metric's and the audit row's `tool`).
    pub fn label(self, name: &str) -> String {
        match self {
            Subject::Tool => name.to_owned(),
            other => format!("{}:{name}", other.as_str()),
        }
    }
}

/// One reviewed definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    /// SHA-256 of `definition`, hex.
    pub sha256: String,
    /// Who pinned it.
    pub pinned_by: String,
    /// When (RFC 3339 UTC).
    pub pinned_at: String,
    /// The definition, RFC 8785 canonical JSON.
    pub definition: String,
}

/// `pins/<upstream>.toml`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PinFile {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    tools: BTreeMap<String, Pin>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    prompts: BTreeMap<String, Pin>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    resource_templates: BTreeMap<String, Pin>,
}

impl PinFile {
    fn table(&mut self, subject: Subject) -> &mut BTreeMap<String, Pin> {
        match subject {
            Subject::Tool => &mut self.tools,
            Subject::Prompt => &mut self.prompts,
            Subject::ResourceTemplate => &mut self.resource_templates,
        }
    }
}

/// What the pins say about one listed tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Pinned as listed.
    Pinned,
    /// The upstream has no pin for it.
    Unpinned,
    /// Its definition differs from its pin.
    Mismatch,
    /// Its name imitates this pinned tool's.
    Shadows(String),
}

/// Why a call is refused for its pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No pin (enforce).
    Unpinned,
    /// Not as pinned (enforce).
    Mismatch,
    /// Imitates a pinned name (any mode).
    Shadows(String),
    /// This definition was rejected in review (record and enforce).
    Rejected,
}

/// A definition waiting for a person.
#[derive(Debug, Clone, Serialize)]
pub struct Proposal {
    /// The upstream.
    pub upstream: String,
    /// What is pinned.
    pub subject: Subject,
    /// The tool's or prompt's name, or the template's URI template.
    pub tool: String,
    /// `new`, `changed` or `shadowing`.
    pub kind: &'static str,
    /// SHA-256 of the definition seen, hex.
    pub sha256: String,
    /// The definition seen, canonical JSON.
    pub definition: String,
    /// The pin it differs from, if any.
    pub pinned: Option<Pin>,
    /// When this replica first saw it (ms since the epoch).
    pub first_seen_ms: u64,
}

/// Labels of the drift counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriftLabels {
    upstream: String,
    tool: String,
}

/// Hands a drift to the audit trail and the webhook.
pub type DriftHook = Box<dyn Fn(&Proposal) + Send + Sync>;

/// The pins in force, by upstream.
#[derive(Debug, Default)]
pub struct Pins {
    upstreams: HashMap<String, UpstreamPins>,
}

#[derive(Debug, Default)]
struct UpstreamPins {
    /// Per subject: name → (hash, pin); looked up by `&str` on every call.
    pins: HashMap<Subject, HashMap<String, ([u8; 32], Pin)>>,
    /// Per subject: skeleton of each pinned name → the name.
    skeletons: HashMap<Subject, HashMap<String, String>>,
}

impl UpstreamPins {
    fn get(&self, subject: Subject, name: &str) -> Option<&([u8; 32], Pin)> {
        self.pins.get(&subject)?.get(name)
    }
}

/// Why pins could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PinsError {
    /// A file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        error: String,
    },
    /// A file is not a valid pin file.
    #[error("{path}: {error}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: String,
    },
}

/// The name with case, whitespace, invisible characters and confusable
/// letters folded away (UTS #39 skeleton of the lower-cased name): two
/// names with one skeleton read alike.
pub fn skeleton(name: &str) -> String {
    let folded: String = name
        .chars()
        .filter(|c| {
            !c.is_whitespace()
                && !matches!(c, '\u{00AD}' | '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}')
        })
        .flat_map(char::to_lowercase)
        .collect();
    unicode_security::skeleton(&folded)
        .flat_map(char::to_lowercase)
        .collect()
}

// === impl Pins ===

impl Pins {
    /// Reads every `*.toml` in `dir` (absent: no pins). A pin whose hash is
    /// not the hash of its definition is an error: the file was edited by
    /// hand or tampered with.
    pub fn load(dir: &Path) -> Result<Pins, PinsError> {
        let mut pins = Pins::default();
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(pins),
            Err(e) => {
                return Err(PinsError::Io {
                    path: dir.to_owned(),
                    error: e.to_string(),
                })
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
            .collect();
        paths.sort();
        for path in paths {
            let Some(upstream) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            let mut file = read_file(&path)?;
            let mut up = UpstreamPins::default();
            let all = [Subject::Tool, Subject::Prompt, Subject::ResourceTemplate]
                .into_iter()
                .flat_map(|subject| {
                    std::mem::take(file.table(subject))
                        .into_iter()
                        .map(move |(name, pin)| (subject, name, pin))
                })
                .collect::<Vec<_>>();
            for (subject, tool, pin) in all {
                let invalid = |error: String| PinsError::Invalid {
                    path: path.clone(),
                    error: format!("{}.{tool}: {error}", subject.table()),
                };
                let sha = canonical::parse_hex32(&pin.sha256)
                    .ok_or_else(|| invalid("sha256 is not 64 hex digits".into()))?;
                let definition: Value = serde_json::from_str(&pin.definition)
                    .map_err(|e| invalid(format!("definition is not JSON: {e}")))?;
                if canonical::sha256(&definition) != sha {
                    return Err(invalid(
                        "sha256 is not the SHA-256 of the definition's canonical JSON".into(),
                    ));
                }
                if definition.get(subject.key()).and_then(Value::as_str) != Some(tool.as_str()) {
                    return Err(invalid(format!(
                        "the definition's {} is another",
                        subject.key()
                    )));
                }
                up.skeletons
                    .entry(subject)
                    .or_default()
                    .insert(skeleton(&tool), tool.clone());
                up.pins.entry(subject).or_default().insert(tool, (sha, pin));
            }
            pins.upstreams.insert(upstream.to_owned(), up);
        }
        Ok(pins)
    }

    /// What the pins say about `tool` of `upstream` listed with `sha256`.
    pub fn verdict(&self, upstream: &str, tool: &str, sha256: &[u8; 32]) -> Verdict {
        self.verdict_of(upstream, Subject::Tool, tool, sha256)
    }

    /// [`Pins::verdict`] for any subject.
    pub fn verdict_of(
        &self,
        upstream: &str,
        subject: Subject,
        name: &str,
        sha256: &[u8; 32],
    ) -> Verdict {
        let Some(up) = self.upstreams.get(upstream) else {
            return Verdict::Unpinned;
        };
        match up.get(subject, name) {
            Some((sha, _)) if sha == sha256 => Verdict::Pinned,
            Some(_) => Verdict::Mismatch,
            None => match up
                .skeletons
                .get(&subject)
                .and_then(|s| s.get(&skeleton(name)))
            {
                Some(other) => Verdict::Shadows(other.clone()),
                None => Verdict::Unpinned,
            },
        }
    }

    /// The pin of `name`, if any.
    pub fn pin(&self, upstream: &str, subject: Subject, name: &str) -> Option<&Pin> {
        self.upstreams
            .get(upstream)?
            .get(subject, name)
            .map(|(_, p)| p)
    }

    /// Pinned tool names of `upstream`.
    pub fn tools(&self, upstream: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .upstreams
            .get(upstream)
            .and_then(|u| u.pins.get(&Subject::Tool))
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Upstreams with a pin file.
    pub fn upstreams(&self) -> Vec<String> {
        let mut v: Vec<String> = self.upstreams.keys().cloned().collect();
        v.sort();
        v
    }
}

fn read_file(path: &Path) -> Result<PinFile, PinsError> {
    let text = std::fs::read_to_string(path).map_err(|e| PinsError::Io {
        path: path.to_owned(),
        error: e.to_string(),
    })?;
    toml::from_str(&text).map_err(|e| PinsError::Invalid {
        path: path.to_owned(),
        error: e.to_string(),
    })
}

/// A pin for `definition` (a tool's JSON as listed), by `who`, now.
pub fn pin_of(definition: &Value, who: &str) -> Pin {
    Pin {
        sha256: canonical::hex(&canonical::sha256(definition)),
        pinned_by: who.to_owned(),
        pinned_at: crate::clock::fmt_ms(crate::clock::now_ms()),
        definition: canonical::canonical_exact(definition),
    }
}

/// Writes `pins` into `dir/<upstream>.toml`, keeping the file's other pins
/// (atomically: a temp file renamed over it).
pub fn write_pins(
    dir: &Path,
    upstream: &str,
    pins: Vec<(Subject, String, Pin)>,
) -> Result<(), PinsError> {
    let io = |path: &Path, e: std::io::Error| PinsError::Io {
        path: path.to_owned(),
        error: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let path = dir.join(format!("{upstream}.toml"));
    let mut file = match path.exists() {
        true => read_file(&path)?,
        false => PinFile::default(),
    };
    for (subject, name, pin) in pins {
        file.table(subject).insert(name, pin);
    }
    let body = toml::to_string(&file).map_err(|e| PinsError::Invalid {
        path: path.clone(),
        error: e.to_string(),
    })?;
    let text = format!(
        "# Tool definitions of upstream {upstream:?} as reviewed (mcp-firewall pins).\n\
         # sha256 = SHA-256 of `definition`, RFC 8785 canonical JSON of the definition as listed.\n\n{body}"
    );
    let tmp = dir.join(format!(".{upstream}.toml.tmp"));
    std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
}

// === The store ===

/// (upstream, subject, name).
type Key = (String, Subject, String);

fn key(upstream: &str, subject: Subject, name: &str) -> Key {
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

fn signature(dir: &Path) -> Vec<(PathBuf, std::time::SystemTime, u64)> {
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
#[path = "pins_tests.rs"]
mod tests;
