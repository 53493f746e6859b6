//! What a pin is and how a definition is checked against it on the request
//! path (`Pins`): modes, subjects, verdicts, drift proposals, pin files.

use crate::canonical;
use prometheus_client::encoding::EncodeLabelSet;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The directory under the policy directory holding pin files.
pub(crate) const PINS_DIR: &str = "pins";

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
pub(super) struct PinFile {
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
pub(super) struct DriftLabels {
    pub(super) upstream: String,
    pub(super) tool: String,
}

/// Hands a drift to the audit trail and the webhook.
pub(crate) type DriftHook = Box<dyn Fn(&Proposal) + Send + Sync>;

/// The pins in force, by upstream.
#[derive(Debug, Default)]
pub struct Pins {
    pub(super) upstreams: HashMap<String, UpstreamPins>,
}

#[derive(Debug, Default)]
pub(super) struct UpstreamPins {
    /// Per subject: name → (hash, pin); looked up by `&str` on every call.
    pins: HashMap<Subject, HashMap<String, ([u8; 32], Pin)>>,
    /// Per subject: skeleton of each pinned name → the name.
    skeletons: HashMap<Subject, HashMap<String, String>>,
}

impl UpstreamPins {
    pub(super) fn get(&self, subject: Subject, name: &str) -> Option<&([u8; 32], Pin)> {
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
pub(crate) fn skeleton(name: &str) -> String {
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

pub(super) fn read_file(path: &Path) -> Result<PinFile, PinsError> {
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
pub(crate) fn pin_of(definition: &Value, who: &str) -> Pin {
    Pin {
        sha256: canonical::hex(&canonical::sha256(definition)),
        pinned_by: who.to_owned(),
        pinned_at: crate::clock::fmt_ms(crate::clock::now_ms()),
        definition: canonical::canonical_exact(definition),
    }
}

/// Writes `pins` into `dir/<upstream>.toml`, keeping the file's other pins
/// (atomically: a temp file renamed over it).
pub(crate) fn write_pins(
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
