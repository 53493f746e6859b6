//! Secret removal and size capping of the JSON attached to audit rows.
//!
//! Runs on the caller's task inside [`super::Auditor::record`], before the row is
//! encoded, so an unredacted secret never reaches the spool, ClickHouse or logs.
//!
//! Invariants:
//! * Every object value whose key matches a pattern, at any depth (objects inside
//!   arrays included), is replaced by [`REDACTED`]; the key itself is kept so
//!   auditors see *that* a secret was passed.
//! * Raw JSON text is parsed only when it may contain a matching key within
//!   the part that is stored (the first `max_bytes`: a secret value follows its
//!   key, so a key starting past that point cannot put one there); the
//!   pre-filter is conservative (any backslash escape forces a parse, since
//!   `"pass\u0077ord"` is the key `password`).
//! * Output text is cut on a UTF-8 char boundary, never inside a character.

use std::io;

use aho_corasick::AhoCorasick;
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde_json::Value;
use thiserror::Error;

use super::record::JsonPayload;

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Why a set of key patterns could not be compiled.
#[derive(Debug, Error)]
pub enum RedactError {
    /// A pattern is empty: it would match every key and hide everything.
    #[error("redaction pattern #{index} is empty")]
    EmptyPattern {
        /// Position of the pattern in the configured list.
        index: usize,
    },
    /// A glob pattern does not parse.
    #[error("redaction pattern {pattern:?} is not a valid glob: {source}")]
    BadGlob {
        /// The offending pattern.
        pattern: String,
        /// globset's reason.
        #[source]
        source: globset::Error,
    },
    /// The substring patterns could not be compiled into one automaton
    /// (only when they are too large).
    #[error("redaction patterns cannot be compiled: {0}")]
    Automaton(String),
}

/// Compiled key patterns: ASCII case-insensitive substrings, plus case-insensitive
/// whole-key globs for patterns with glob metacharacters.
#[derive(Debug, Clone)]
pub struct Redactor {
    /// The substring patterns, ASCII case-insensitive, searched in one pass
    /// (a tool list or a result can be tens of kilobytes); `None` when there
    /// are none.
    substrings: Option<AhoCorasick>,
    /// Whole-key globs; `None` when no pattern is a glob.
    globs: Option<GlobSet>,
}

impl Redactor {
    /// Compiles `patterns` (see [`super::RedactConfig`] for the matching rules).
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, RedactError> {
        let mut substrings = Vec::new();
        let mut globs = GlobSetBuilder::new();
        let mut any_glob = false;
        for (index, p) in patterns.iter().enumerate() {
            let p = p.as_ref();
            if p.is_empty() {
                return Err(RedactError::EmptyPattern { index });
            }
            if p.contains(['*', '?', '[', '{']) {
                let glob = GlobBuilder::new(p)
                    .case_insensitive(true)
                    .literal_separator(false)
                    .build()
                    .map_err(|source| RedactError::BadGlob {
                        pattern: p.to_owned(),
                        source,
                    })?;
                globs.add(glob);
                any_glob = true;
            } else {
                substrings.push(p.to_ascii_lowercase());
            }
        }
        let globs = if any_glob {
            Some(globs.build().map_err(|source| {
                RedactError::BadGlob {
                    pattern: patterns
                        .iter()
                        .map(|p| p.as_ref())
                        .collect::<Vec<_>>()
                        .join(","),
                    source,
                }
            })?)
        } else {
            None
        };
        let substrings = if substrings.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .ascii_case_insensitive(true)
                    // A DFA where the configured names are few (a small
                    // one, read in fewer instructions per byte: every row
                    // passes it); the crate's choice for a long list.
                    .kind((substrings.len() <= 64).then_some(aho_corasick::AhoCorasickKind::DFA))
                    .build(&substrings)
                    .map_err(|e| RedactError::Automaton(e.to_string()))?,
            )
        };
        Ok(Self { substrings, globs })
    }

    /// A redactor that matches nothing.
    pub fn none() -> Self {
        Self {
            substrings: None,
            globs: None,
        }
    }

    /// Whether values under `key` must be hidden.
    pub fn matches(&self, key: &str) -> bool {
        self.substrings.as_ref().is_some_and(|a| a.is_match(key))
            || self.globs.as_ref().is_some_and(|g| g.is_match(key))
    }

    /// Conservative pre-filter on raw JSON text: false only if no key in it can
    /// match. Globs and escapes make it answer true (we then parse and walk).
    /// Whether some value that begins within the first `window` bytes of
    /// `text` may belong to a matching key. A value comes after its key, so
    /// only a key (and any escape in it) lying wholly inside the window can
    /// put a secret there: the rest of a long text is not scanned.
    fn may_match_text(&self, text: &str, window: usize) -> bool {
        let head = &text.as_bytes()[..text.len().min(window)];
        if self.globs.is_some() || head.contains(&b'\\') {
            return true;
        }
        self.substrings.as_ref().is_some_and(|a| a.is_match(head))
    }
}

/// Replaces, in place, every value whose object key matches `patterns` with
/// [`REDACTED`], recursing through objects and arrays.
pub fn redact_json(value: &mut Value, patterns: &Redactor) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if patterns.matches(k) {
                    *v = Value::String(REDACTED.to_owned());
                } else {
                    redact_json(v, patterns);
                }
            }
        }
        Value::Array(items) => {
            for v in items {
                redact_json(v, patterns);
            }
        }
        _ => {}
    }
}

/// Writes the redacted JSON text of `payload` into `out`, at most `max_bytes`
/// bytes (cut on a char boundary). `out` is cleared first.
///
/// Cost: a `Raw` payload without a possible match in its first `max_bytes`
/// is copied as is (no parse, and only that prefix is scanned); a
/// `Value` is walked once and serialised only up to `max_bytes`, so a large tool
/// result costs its walk, not its full serialisation.
pub(crate) fn render_payload(
    payload: &JsonPayload,
    patterns: &Redactor,
    max_bytes: usize,
    out: &mut Vec<u8>,
) {
    out.clear();
    match payload {
        JsonPayload::Absent => {}
        JsonPayload::Raw(raw) => render_text(raw.get(), patterns, max_bytes, out),
        JsonPayload::Text(text) => render_text(text, patterns, max_bytes, out),
        JsonPayload::Value(v) => {
            // Parsed payloads are the rare case (rows built by the firewall
            // itself); the caller's row stays as it was.
            let mut v = v.clone();
            redact_json(&mut v, patterns);
            write_capped(&v, max_bytes, out);
        }
    }
}

/// Renders JSON text: copied (capped) when no pattern may match in what is
/// kept, else parsed, redacted and written capped.
fn render_text(text: &str, patterns: &Redactor, max_bytes: usize, out: &mut Vec<u8>) {
    if !patterns.may_match_text(text, max_bytes) {
        out.extend_from_slice(truncate_utf8(text, max_bytes).as_bytes());
        return;
    }
    match serde_json::from_str::<Value>(text) {
        Ok(mut v) => {
            redact_json(&mut v, patterns);
            write_capped(&v, max_bytes, out);
        }
        // The text was read as valid JSON; should parsing still fail
        // (recursion limit), storing it could leak a secret.
        Err(_) => out.extend_from_slice(REDACTED.as_bytes()),
    }
}

/// Serialises `v` into `out` but stops once `max_bytes` are written.
fn write_capped(v: &Value, max_bytes: usize, out: &mut Vec<u8>) {
    let mut w = CappedWriter {
        out,
        room: max_bytes,
    };
    // An error here only means the cap was hit; what was written is kept.
    let _ = serde_json::to_writer(&mut w, v);
    let valid = match std::str::from_utf8(w.out) {
        Ok(s) => s.len(),
        Err(e) => e.valid_up_to(),
    };
    w.out.truncate(valid);
}

/// An `io::Write` that accepts `room` more bytes, then fails, aborting serde early.
struct CappedWriter<'a> {
    out: &'a mut Vec<u8>,
    room: usize,
}

impl io::Write for CappedWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.room == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let n = buf.len().min(self.room);
        self.out.extend_from_slice(&buf[..n]);
        self.room -= n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The longest prefix of `s` that is at most `max` bytes and ends on a char boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
#[path = "redact_tests.rs"]
mod tests;
