//! What screening does with a JSON value the upstream sent: every string
//! in it (member names too), decoded, is scanned; each finding gets the
//! action its family is configured with ([`Actions`]); the strongest one
//! decides the value ([`Report::action`]). A value with something to
//! redact is rewritten (only the strings that hold it), one to block is
//! left to the caller to replace whole. The matched text never leaves:
//! a [`Report`] names kinds, not contents.
//!
//! The first pass reads the text with serde_json's own reader (the strict
//! reader accepted it before) without building a value: strings without
//! escapes are scanned where they lie. Only a value to redact is built and
//! written again.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use super::{redact, Family, Finding, Kind, Scanner};

/// What happens to content where a kind is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Not looked for.
    Off,
    /// Passed, and on record.
    Flag,
    /// Replaced by `[redacted:<kind>]` (hidden characters removed); the
    /// rest passes.
    Redact,
    /// The whole content is withheld; the client is told which kind.
    Block,
}

impl Action {
    /// `off`, `flag`, `redact` or `block`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Off => "off",
            Action::Flag => "flag",
            Action::Redact => "redact",
            Action::Block => "block",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An action per family (`[screen] secrets`, `pii`, `injection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Actions {
    /// Credentials and keys.
    pub secrets: Action,
    /// Personal and payment data.
    pub pii: Action,
    /// Content aimed at the model.
    pub injection: Action,
}

impl Actions {
    /// `secrets = "redact"`, `pii = "flag"`, `injection = "flag"`.
    pub const DEFAULT: Actions = Actions {
        secrets: Action::Redact,
        pii: Action::Flag,
        injection: Action::Flag,
    };

    /// The action for a finding of `kind`: its family's, except that
    /// e-mail addresses and phone numbers are only ever flagged (they are
    /// everywhere in legitimate answers).
    pub fn for_kind(self, kind: Kind) -> Action {
        let a = match kind.family() {
            Family::Secrets => self.secrets,
            Family::Pii => self.pii,
            Family::Injection => self.injection,
        };
        match kind {
            Kind::Email | Kind::Phone => a.min(Action::Flag),
            _ => a,
        }
    }

    /// Whether some family's finding withholds content.
    pub fn blocks_any(self) -> bool {
        self.secrets == Action::Block
            || self.pii == Action::Block
            || self.injection == Action::Block
    }

    /// Whether nothing is looked for.
    pub fn all_off(self) -> bool {
        self.secrets == Action::Off && self.pii == Action::Off && self.injection == Action::Off
    }
}

/// What screening found in one piece of content: the kinds (each once,
/// in the order first found) and the strongest action they call for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The kinds found (not those configured `off`).
    pub kinds: Vec<Kind>,
    /// The strongest action of those kinds.
    pub action: Action,
}

impl Default for Report {
    fn default() -> Self {
        Report {
            kinds: Vec::new(),
            action: Action::Off,
        }
    }
}

impl Report {
    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Whether content aimed at the model was found (the content is
    /// untrusted, whatever its source).
    pub fn injection(&self) -> bool {
        self.kinds.iter().any(|k| k.family() == Family::Injection)
    }

    /// The kinds' names, for records.
    pub fn names(&self) -> Vec<&'static str> {
        self.kinds.iter().map(|k| k.name()).collect()
    }

    /// The names of the kinds that call for `action`.
    pub fn names_for(&self, actions: Actions, action: Action) -> Vec<&'static str> {
        self.kinds
            .iter()
            .filter(|k| actions.for_kind(**k) == action)
            .map(|k| k.name())
            .collect()
    }

    /// Adds what `other` found.
    pub fn merge(&mut self, other: &Report) {
        for k in &other.kinds {
            if !self.kinds.contains(k) {
                self.kinds.push(*k);
            }
        }
        self.action = self.action.max(other.action);
    }

    /// Adds the findings of one text.
    fn add(&mut self, scanner: &Scanner, actions: Actions, text: &str) {
        // Most strings are short and plain: no finding is possible in
        // fewer bytes than the shortest kind needs.
        if text.len() < 4 {
            return;
        }
        self.add_findings(actions, &scanner.scan(text));
    }

    /// Adds `found`, each with the action `actions` gives its kind.
    pub fn add_findings(&mut self, actions: Actions, found: &[Finding]) {
        for f in found {
            let action = actions.for_kind(f.kind);
            if action == Action::Off {
                continue;
            }
            if !self.kinds.contains(&f.kind) {
                self.kinds.push(f.kind);
            }
            self.action = self.action.max(action);
        }
    }
}

/// The outcome of screening one JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Screened {
    /// What was found.
    pub report: Report,
    /// The value with what is to be redacted redacted (JSON text), when
    /// the report's action is [`Action::Redact`].
    pub redacted: Option<String>,
}

/// Bytes of each side of a boundary between two strings read as one text
/// (a PEM block opened further back is followed to its end by
/// [`Tail::open_key`]).
pub(crate) const WINDOW: usize = 4096;

/// Most groups a [`Carry`] keeps a tail of.
const MAX_CARRIED: usize = 32;

/// Member names whose strings are one text for the model (a result's
/// parts, a message, a description): read across their boundaries as one
/// group, whatever the member.
const PROSE: &[&str] = &[
    "text",
    "message",
    "description",
    "instructions",
    "title",
    "data",
    "content",
];

/// What one message leaves for the next of the same answer (consecutive
/// SSE events): the end of each group's last string, so that a token
/// split across two events is found in the second.
#[derive(Debug, Default)]
pub(crate) struct Carry {
    tails: Vec<(String, Tail)>,
    /// The open ends ([`Scanner::open_end`]) of the last message's
    /// strings, folded.
    ends: Vec<String>,
}

/// Most open ends of one message paired with the other strings.
const MAX_OPEN_ENDS: usize = 64;

/// The end of a group's last string.
#[derive(Debug, Clone, Default)]
struct Tail {
    /// Its last [`WINDOW`] bytes.
    text: String,
    /// It ends inside a private key's PEM block (no END line yet).
    open_key: bool,
}

/// Screens the JSON text `json` (a value the strict reader accepted) as
/// one unit: every string (member names too), decoded and folded, is
/// scanned; a member named for a secret is read with its value
/// (`{"db_password": "…"}`); consecutive strings of one group (a result's
/// text parts, across messages with a [`Carry`]) are read across their
/// boundaries, so a key split between them is found and redacted on both
/// sides.
///
/// # Errors
/// Text that is not JSON.
pub fn screen_json(
    scanner: &Scanner,
    actions: Actions,
    json: &str,
) -> Result<Screened, serde_json::Error> {
    screen_message(scanner, actions, json, None, Recall::Fresh)
}

/// [`screen_json`], continuing from what earlier messages of the same
/// answer left in `carry` (and leaving this one's); a list answer's
/// strings (definitions an upstream lists again and again) are scanned
/// with [`Recall::Remembered`]. Every string is still read, and what reads
/// across strings is done afresh.
///
/// # Errors
/// Text that is not JSON.
pub(crate) fn screen_message(
    scanner: &Scanner,
    actions: Actions,
    json: &str,
    carry: Option<&mut Carry>,
    recall: Recall,
) -> Result<Screened, serde_json::Error> {
    let mut screened = screen_once(scanner, actions, json, carry, recall)?;
    // A redaction can make a token's start a word start (`…A` + `xoxr-…`
    // becomes `…]xoxr-…`): what it reveals is redacted too, so what passes
    // reads the same when screened again (found by the `screen_planted`
    // fuzz target). Each pass only replaces tokens by markers.
    for _ in 0..MAX_REDACTION_PASSES {
        let Some(text) = screened.redacted.as_deref() else {
            break;
        };
        let again = screen_once(scanner, actions, text, None, recall)?;
        match again.redacted {
            Some(more) if more != text => {
                screened.report.merge(&again.report);
                screened.redacted = Some(more);
            }
            _ => break,
        }
    }
    Ok(screened)
}

/// Whether a string's scan may come from the scanner's memory
/// ([`Scanner::scan_remembered`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recall {
    /// Scanned now (content, whose text is seldom seen twice).
    Fresh,
    /// Remembered where read before (definitions).
    Remembered,
}

impl Recall {
    /// What `scanner` finds in `text`, remembered where this recalls.
    fn scan(self, scanner: &Scanner, text: &str) -> Vec<Finding> {
        match self {
            Recall::Fresh => scanner.scan(text),
            Recall::Remembered => scanner.scan_remembered(text),
        }
    }
}

/// Passes of redaction after the first, at most ([`screen_message`]).
const MAX_REDACTION_PASSES: usize = 3;

/// One pass of [`screen_message`].
fn screen_once(
    scanner: &Scanner,
    actions: Actions,
    json: &str,
    carry: Option<&mut Carry>,
    recall: Recall,
) -> Result<Screened, serde_json::Error> {
    let mut report = Report::default();
    if actions.all_off() {
        return Ok(Screened {
            report,
            redacted: None,
        });
    }
    let strings = lex(json)?;
    let mut found: Vec<Vec<Finding>> = strings
        .iter()
        .map(|s| {
            if s.text.len() < 4 || plain_word(&s.text) {
                Vec::new()
            } else {
                recall.scan(scanner, &s.text)
            }
        })
        .collect();
    // A member named for a secret, read with its value.
    if actions.secrets != Action::Off {
        for (i, s) in strings.iter().enumerate() {
            let Some(k) = s.name.filter(|_| !s.key) else {
                continue;
            };
            let Some(name) = strings.get(k).filter(|n| n.key) else {
                continue;
            };
            if let Some(range) = scanner.assigned(&name.text, &s.text) {
                found[i].push(Finding {
                    kind: Kind::Password,
                    range,
                });
            }
        }
    }
    let mut carry = carry;
    split_tokens(scanner, recall, &strings, &mut found, carry.as_deref_mut());
    across(scanner, recall, &strings, &mut found, carry);
    let mut settled = Vec::with_capacity(found.len());
    for f in found {
        let f = super::settle(f);
        report.add_findings(actions, &f);
        settled.push(f);
    }
    let redacted = (report.action == Action::Redact).then(|| {
        let mut out = String::with_capacity(json.len());
        let mut at = 0;
        for (s, f) in strings.iter().zip(&settled) {
            let to_redact: Vec<Finding> = f
                .iter()
                .filter(|f| actions.for_kind(f.kind) == Action::Redact)
                .cloned()
                .collect();
            if to_redact.is_empty() {
                continue;
            }
            out.push_str(json.get(at..s.span.start).unwrap_or(""));
            out.push_str(&Value::String(redact(&s.text, &to_redact)).to_string());
            at = s.span.end;
        }
        out.push_str(json.get(at..).unwrap_or(""));
        out
    });
    Ok(Screened { report, redacted })
}

/// Screens a text that is not JSON (an upstream's plain-text error body).
pub(crate) fn screen_text(scanner: &Scanner, actions: Actions, text: &str) -> Screened {
    let mut screened = screen_text_once(scanner, actions, text);
    // As for JSON ([`screen_message`]): what a redaction reveals is
    // redacted too.
    for _ in 0..MAX_REDACTION_PASSES {
        let Some(done) = screened.redacted.as_deref() else {
            break;
        };
        let again = screen_text_once(scanner, actions, done);
        match again.redacted {
            Some(more) if more != done => {
                screened.report.merge(&again.report);
                screened.redacted = Some(more);
            }
            _ => break,
        }
    }
    screened
}

/// One pass of [`screen_text`].
fn screen_text_once(scanner: &Scanner, actions: Actions, text: &str) -> Screened {
    let mut report = Report::default();
    if actions.all_off() {
        return Screened {
            report,
            redacted: None,
        };
    }
    let found = scanner.scan(text);
    report.add_findings(actions, &found);
    let redacted = (report.action == Action::Redact).then(|| {
        let to_redact: Vec<Finding> = found
            .into_iter()
            .filter(|f| actions.for_kind(f.kind) == Action::Redact)
            .collect();
        redact(text, &to_redact)
    });
    Screened { report, redacted }
}

/// Reads consecutive strings of each group across their boundary: a
/// finding that starts in one and ends in the next is added to both (the
/// first one's part, when it came from an earlier message, already left).
fn across(
    scanner: &Scanner,
    recall: Recall,
    strings: &[Str<'_>],
    found: &mut [Vec<Finding>],
    mut carry: Option<&mut Carry>,
) {
    enum Prev {
        Here(usize),
        Before(Tail),
    }
    let mut last: Vec<(String, Prev)> = match carry.as_deref_mut() {
        Some(c) => std::mem::take(&mut c.tails)
            .into_iter()
            .map(|(g, t)| (g, Prev::Before(t)))
            .collect(),
        None => Vec::new(),
    };
    for (i, s) in strings.iter().enumerate() {
        if s.key {
            continue;
        }
        let group = group_of(strings, s);
        let slot = last.iter().position(|(g, _)| *g == group);
        let prev = slot.map(|p| match &last[p].1 {
            Prev::Here(j) => (
                Some(*j),
                tail_of(&strings[*j].text),
                open_key(&found[*j], strings[*j].text.len()),
            ),
            Prev::Before(t) => (None, t.text.as_str(), t.open_key),
        });
        if let Some((j, tail, open)) = prev {
            let head = head_of(&s.text);
            let mut continued = false;
            if tail.len() + head.len() >= 8 {
                let window = [tail, head].concat();
                for f in recall.scan(scanner, &window) {
                    if f.range.start >= tail.len() || f.range.end <= tail.len() {
                        continue;
                    }
                    let mut end = f.range.end - tail.len();
                    if f.kind == Kind::PrivateKey {
                        continued = true;
                        if f.range.end == window.len() {
                            end = key_end(&s.text, end);
                        }
                    }
                    found[i].push(Finding {
                        kind: f.kind,
                        range: 0..end,
                    });
                    if let Some(j) = j {
                        let len = strings[j].text.len();
                        let start = len - (tail.len() - f.range.start);
                        found[j].push(Finding {
                            kind: f.kind,
                            range: start..len,
                        });
                    }
                }
            }
            if open && !continued {
                found[i].push(Finding {
                    kind: Kind::PrivateKey,
                    range: 0..key_end(&s.text, 0),
                });
            }
        }
        match slot {
            Some(p) => last[p].1 = Prev::Here(i),
            None => last.push((group.to_owned(), Prev::Here(i))),
        }
    }
    if let Some(carry) = carry {
        // The next event may go on where a string of this one ends: a
        // token cut there is not relayed (its rest is found in the next).
        for (_, p) in &last {
            if let Prev::Here(j) = p {
                if let Some(f) = scanner.cut_at_end(&strings[*j].text) {
                    found[*j].push(f);
                }
            }
        }
        let mut tails = Vec::with_capacity(last.len().min(MAX_CARRIED));
        for (g, p) in last.into_iter().rev().take(MAX_CARRIED) {
            let t = match p {
                Prev::Here(j) => Tail {
                    text: tail_of(&strings[j].text).to_owned(),
                    open_key: open_key(&found[j], strings[j].text.len()),
                },
                Prev::Before(t) => t,
            };
            tails.push((g, t));
        }
        tails.reverse();
        carry.tails = tails;
    }
}

/// Whether `text` is one plain word: ASCII letters with at most one
/// capital (`content`, `structuredContent`, `healthy`), in which no kind
/// can be found (every secret needs a digit, a separator or a run of
/// capitals; personal data digits, `@` or `+`; instruction cues spaces;
/// hidden text other characters). Most member names and many values are
/// such words: they are not scanned.
fn plain_word(text: &str) -> bool {
    text.len() <= 64
        && text.bytes().all(|b| b.is_ascii_alphabetic())
        && text.bytes().filter(u8::is_ascii_uppercase).count() <= 1
}

/// Finds a secret rule's token split between two strings of a message, in
/// either order and whichever members they are (`error.message` and
/// `error.data`, a text part and `structuredContent`), and between the
/// last message and this one: a string whose end may start a token
/// ([`Scanner::open_end`], folded) is read with the start of each other
/// string; a token found across the two is redacted in both.
fn split_tokens(
    scanner: &Scanner,
    recall: Recall,
    strings: &[Str<'_>],
    found: &mut [Vec<Finding>],
    carry: Option<&mut Carry>,
) {
    let folded: Vec<Option<super::normalize::Folded>> = strings
        .iter()
        .map(|s| super::normalize::fold(&s.text))
        .collect();
    let text = |i: usize| -> &str {
        folded[i]
            .as_ref()
            .map_or(strings[i].text.as_ref(), |f| f.text.as_str())
    };
    let back = |i: usize, r: std::ops::Range<usize>| {
        folded[i].as_ref().map_or(r.clone(), |f| f.original(&r))
    };
    let mut ends: Vec<(Option<usize>, String)> = carry
        .as_deref()
        .map(|c| c.ends.iter().map(|e| (None, e.clone())).collect())
        .unwrap_or_default();
    let mut mine = Vec::new();
    for (i, s) in strings.iter().enumerate() {
        if s.key || mine.len() >= MAX_OPEN_ENDS {
            continue;
        }
        if let Some(at) = scanner.open_end(text(i)) {
            let end = text(i)[at..].to_owned();
            mine.push(end.clone());
            ends.push((Some(i), end));
        }
    }
    for (i, end) in &ends {
        for (j, s) in strings.iter().enumerate() {
            if s.key || Some(j) == *i {
                continue;
            }
            let t = text(j);
            let run = t
                .bytes()
                .take(128)
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
                .count();
            if run == 0 || !scanner.may_continue(end, &t[..run]) {
                continue;
            }
            let window = format!("{end}{} ", &t[..run]);
            for f in recall.scan(scanner, &window) {
                let straddles = f.range.start < end.len() && f.range.end > end.len();
                if !straddles || !matches!(f.kind, Kind::Secret(_)) {
                    continue;
                }
                found[j].push(Finding {
                    kind: f.kind,
                    range: back(j, 0..f.range.end - end.len()),
                });
                if let Some(i) = *i {
                    let len = text(i).len();
                    let start = len - (end.len() - f.range.start);
                    found[i].push(Finding {
                        kind: f.kind,
                        range: back(i, start..len),
                    });
                }
            }
        }
    }
    if let Some(c) = carry {
        c.ends = mine;
    }
}

/// Whether a string's findings end inside a private key's PEM block.
fn open_key(found: &[Finding], len: usize) -> bool {
    found
        .iter()
        .any(|f| f.kind == Kind::PrivateKey && f.range.end >= len)
}

/// Where a PEM block continued in `text` from `from` ends: after its END
/// line, or at the end of the text.
fn key_end(text: &str, from: usize) -> usize {
    let rest = text.get(from..).unwrap_or("");
    match rest.find("-----END ") {
        Some(at) => {
            let after = at + 9;
            rest.get(after..)
                .and_then(|t| t.find("-----"))
                .map_or(text.len(), |i| from + after + i + 5)
        }
        None => text.len(),
    }
}

/// The last [`WINDOW`] bytes of `text` (from a character boundary).
fn tail_of(text: &str) -> &str {
    let mut at = text.len().saturating_sub(WINDOW);
    while !text.is_char_boundary(at) {
        at += 1;
    }
    text.get(at..).unwrap_or("")
}

/// The first [`WINDOW`] bytes of `text` (to a character boundary).
fn head_of(text: &str) -> &str {
    let mut at = text.len().min(WINDOW);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    text.get(..at).unwrap_or("")
}

/// The group a value string is read with: the member it stands under (in
/// an array: the array's), prose members all one group.
fn group_of<'s>(strings: &'s [Str<'_>], s: &Str<'_>) -> &'s str {
    let name = s
        .name
        .and_then(|k| strings.get(k))
        .map_or("", |n| n.text.as_ref());
    if PROSE.contains(&name) {
        "\u{0}prose"
    } else {
        name
    }
}

/// A string of a JSON text.
struct Str<'a> {
    /// Its token, quotes included.
    span: std::ops::Range<usize>,
    /// A member name.
    key: bool,
    /// The member name (its index) it stands under, or the one of the
    /// array it is in; for a member name, itself.
    name: Option<usize>,
    /// Decoded.
    text: Cow<'a, str>,
}

/// The strings of a JSON text, in document order.
fn lex(json: &str) -> Result<Vec<Str<'_>>, serde_json::Error> {
    enum Frame {
        Object {
            key: Option<usize>,
            expect_key: bool,
        },
        Array {
            name: Option<usize>,
        },
    }
    let name_here = |stack: &[Frame]| match stack.last() {
        Some(Frame::Object { key, .. }) => *key,
        Some(Frame::Array { name }) => *name,
        None => None,
    };
    let bytes = json.as_bytes();
    let mut out = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => stack.push(Frame::Object {
                key: None,
                expect_key: true,
            }),
            b'[' => {
                let name = name_here(&stack);
                stack.push(Frame::Array { name });
            }
            b'}' | b']' => {
                stack.pop();
            }
            b':' => {
                if let Some(Frame::Object { expect_key, .. }) = stack.last_mut() {
                    *expect_key = false;
                }
            }
            b',' => {
                if let Some(Frame::Object { expect_key, .. }) = stack.last_mut() {
                    *expect_key = true;
                }
            }
            b'"' => {
                let start = i;
                let mut j = i + 1;
                let mut escaped = false;
                // To the closing quote, over escapes.
                while let Some(k) = bytes.get(j..).and_then(|r| memchr::memchr2(b'"', b'\\', r)) {
                    j += k;
                    if bytes[j] == b'"' {
                        break;
                    }
                    escaped = true;
                    j += 2;
                }
                j = j.min(bytes.len());
                let end = (j + 1).min(bytes.len());
                let token = json.get(start..end).unwrap_or("");
                let text = if escaped || end - start < 2 || !token.ends_with('"') {
                    Cow::Owned(serde_json::from_str::<String>(token)?)
                } else {
                    Cow::Borrowed(json.get(start + 1..end - 1).unwrap_or(""))
                };
                let idx = out.len();
                let key = matches!(
                    stack.last(),
                    Some(Frame::Object {
                        expect_key: true,
                        ..
                    })
                );
                if key {
                    if let Some(Frame::Object { key, .. }) = stack.last_mut() {
                        *key = Some(idx);
                    }
                }
                let name = if key { Some(idx) } else { name_here(&stack) };
                out.push(Str {
                    span: start..end,
                    key,
                    name,
                    text,
                });
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(out)
}

/// Screens a value already built (a listed tool's definition).
pub(crate) fn screen_value(scanner: &Scanner, actions: Actions, v: &Value) -> Report {
    let mut report = Report::default();
    if !actions.all_off() {
        scan_value(scanner, actions, v, &mut report);
    }
    report
}

fn scan_value(scanner: &Scanner, actions: Actions, v: &Value, report: &mut Report) {
    match v {
        Value::String(s) => report.add(scanner, actions, s),
        Value::Array(a) => a
            .iter()
            .for_each(|x| scan_value(scanner, actions, x, report)),
        Value::Object(m) => {
            for (k, x) in m {
                report.add(scanner, actions, k);
                if let Value::String(value) = x {
                    if actions.secrets != Action::Off && scanner.assigned(k, value).is_some() {
                        report.add_findings(
                            actions,
                            &[Finding {
                                kind: Kind::Password,
                                range: 0..0,
                            }],
                        );
                    }
                }
                scan_value(scanner, actions, x, report);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanner() -> Scanner {
        Scanner::new(&["docs.example.com".to_owned()]).unwrap()
    }

    const KEY: &str = "AKIAIOSFODNN7EXAMPLQ";

    #[test]
    fn a_secret_is_redacted_and_the_rest_kept() {
        let json = format!(
            r#"{{"content":[{{"type":"text","text":"key {KEY} ok"}},{{"type":"text","text":"plain"}}]}}"#
        );
        let s = screen_json(&scanner(), Actions::DEFAULT, &json).unwrap();
        assert_eq!(s.report.names(), ["aws_access_key_id"]);
        assert_eq!(s.report.action, Action::Redact);
        let out = s.redacted.unwrap();
        assert!(!out.contains(KEY), "{out}");
        assert!(out.contains("key [redacted:aws_access_key_id] ok"), "{out}");
        assert!(out.contains("plain"), "{out}");
    }

    #[test]
    fn escaped_text_is_screened_decoded() {
        // A tag character and a key written with JSON escapes.
        let json = r#"{"text":"hi \udb40\udc41 there","k":"AKIA\u0049OSFODNN7EXAMPLQ"}"#;
        let s = screen_json(&scanner(), Actions::DEFAULT, json).unwrap();
        assert!(s.report.kinds.contains(&Kind::HiddenCharacters), "{s:?}");
        assert!(
            s.report.kinds.contains(&Kind::Secret("aws_access_key_id")),
            "{s:?}"
        );
        // Hidden characters are flagged by default; the key is redacted.
        let out = s.redacted.unwrap();
        assert!(!out.contains("EXAMPLQ"), "{out}");
    }

    #[test]
    fn member_names_are_screened_too() {
        let json = format!(r#"{{"structuredContent":{{"{KEY}":1}}}}"#);
        let s = screen_json(&scanner(), Actions::DEFAULT, &json).unwrap();
        let out = s.redacted.unwrap();
        assert!(!out.contains(KEY), "{out}");
    }

    #[test]
    fn e_mail_is_only_ever_flagged_and_off_finds_nothing() {
        let block = Actions {
            secrets: Action::Block,
            pii: Action::Block,
            injection: Action::Block,
        };
        let s = screen_json(&scanner(), block, r#"{"t":"write to ops@corp.example"}"#).unwrap();
        assert_eq!(s.report.action, Action::Flag);
        let off = Actions {
            secrets: Action::Off,
            pii: Action::Off,
            injection: Action::Off,
        };
        let s = screen_json(&scanner(), off, &format!(r#"{{"t":"{KEY}"}}"#)).unwrap();
        assert!(s.report.is_empty());
    }

    #[test]
    fn the_strongest_action_decides() {
        let a = Actions {
            injection: Action::Block,
            ..Actions::DEFAULT
        };
        let json = format!(r#"{{"t":"{KEY} and \u001b[2J"}}"#);
        let s = screen_json(&scanner(), a, &json).unwrap();
        assert_eq!(s.report.action, Action::Block);
        assert!(s.redacted.is_none());
        assert_eq!(s.report.names_for(a, Action::Block), ["terminal_escape"]);
        assert!(s.report.injection());
    }

    #[test]
    fn hidden_characters_under_redact_are_removed() {
        let a = Actions {
            injection: Action::Redact,
            ..Actions::DEFAULT
        };
        let s = screen_json(&scanner(), a, r#"{"t":"a\u200bb"}"#).unwrap();
        assert_eq!(s.redacted.as_deref(), Some(r#"{"t":"ab"}"#));
    }

    #[test]
    fn clean_content_reports_nothing() {
        let s = screen_json(
            &scanner(),
            Actions::DEFAULT,
            r#"{"content":[{"type":"text","text":"3 pods running, 0 restarts"}],"isError":false}"#,
        )
        .unwrap();
        assert!(s.report.is_empty() && s.redacted.is_none());
    }

    /// A PEM private key, built from pieces (no whole key in the source).
    fn pem() -> String {
        let body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\nMzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu\nNMoSfm76oqFvAp8Gy0iz5sxjZmSnXyCdPEovGhLa0VzMaQ8s+CLOyS56YyCFGeJZ";
        [
            "-----BEGIN ",
            "PRIVATE KEY-----\n",
            body,
            "\n-----END ",
            "PRIVATE KEY-----",
        ]
        .concat()
    }

    fn parts(a: &str, b: &str) -> String {
        serde_json::json!({"content": [{"type": "text", "text": a}, {"type": "text", "text": b}]})
            .to_string()
    }

    /// Every redact and block kind a text still holds.
    fn strong(out: &str) -> Vec<&'static str> {
        let s = screen_json(&scanner(), Actions::DEFAULT, out).unwrap();
        s.report.names_for(Actions::DEFAULT, Action::Redact)
    }

    #[test]
    fn a_key_split_across_two_parts_is_redacted_on_both_sides() {
        let key = pem();
        for cut in [20, key.len() / 2, key.len() - 10] {
            let (a, b) = key.split_at(cut);
            let json = parts(&format!("file: {a}"), &format!("{b}\nrest"));
            let s = screen_json(&scanner(), Actions::DEFAULT, &json).unwrap();
            let out = s.redacted.unwrap();
            assert!(
                !out.contains("END PRIVATE") && !out.contains("NMoSfm76"),
                "{cut}: {out}"
            );
            assert!(out.contains("rest") && out.contains("file: "), "{out}");
            assert!(strong(&out).is_empty(), "{out}");
        }
        for cut in 1..KEY.len() {
            let (a, b) = KEY.split_at(cut);
            let json = parts(&format!("id {a}"), &format!("{b} end"));
            let out = screen_json(&scanner(), Actions::DEFAULT, &json)
                .unwrap()
                .redacted
                .unwrap_or_else(|| panic!("{cut}: not found"));
            let v: Value = serde_json::from_str(&out).unwrap();
            let joined = format!("{}{}", v["content"][0]["text"], v["content"][1]["text"]);
            assert!(!joined.contains(a) || a.len() < 4, "{cut}: {out}");
            assert!(!joined.contains(b) || b.len() < 4, "{cut}: {out}");
        }
    }

    #[test]
    fn hidden_and_wide_forms_of_a_key_are_the_key() {
        let zw = [&KEY[..4], "\u{200b}", &KEY[4..]].concat();
        let wide: String = KEY
            .chars()
            .map(|c| char::from_u32(c as u32 - 0x21 + 0xFF01).unwrap_or(c))
            .collect();
        for injection in [Action::Flag, Action::Redact] {
            let a = Actions {
                injection,
                ..Actions::DEFAULT
            };
            for text in [&zw, &wide] {
                let json = serde_json::json!({"t": format!("k {text} ok")}).to_string();
                let s = screen_json(&scanner(), a, &json).unwrap();
                let out = s.redacted.unwrap();
                assert!(out.contains("[redacted:aws_access_key_id]"), "{out}");
                assert!(
                    !out.contains("EXAMPLQ") && !out.contains("ＥＸＡＭＰＬ"),
                    "{out}"
                );
                assert!(strong(&out).is_empty(), "{out}");
            }
        }
    }

    #[test]
    fn a_member_named_for_a_secret_is_read_with_its_value() {
        let json = r#"{"content":[{"type":"text","text":"{\"db_password\": \"x\"}"}],"structuredContent":{"db_password":"q7Vt2LmX9pR4sKw8ZyB3nD","clientSecret":"Zq8mX2vT7pL4wR9kN3bY6c","name":"Ada Lovelace the first"}}"#;
        let s = screen_json(&scanner(), Actions::DEFAULT, json).unwrap();
        let out = s.redacted.unwrap();
        assert!(
            !out.contains("q7Vt2LmX") && !out.contains("Zq8mX2vT"),
            "{out}"
        );
        assert!(out.contains("Ada Lovelace the first"), "{out}");
        assert!(strong(&out).is_empty(), "{out}");
        let creds = "[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLQ\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n";
        let json = serde_json::json!({"text": creds}).to_string();
        let out = screen_json(&scanner(), Actions::DEFAULT, &json)
            .unwrap()
            .redacted
            .unwrap();
        assert!(
            !out.contains("wJalrXUt") && !out.contains("EXAMPLQ"),
            "{out}"
        );
    }

    #[test]
    fn a_key_split_across_two_messages_is_found_in_both() {
        let mut carry = Carry::default();
        let (a, b) = KEY.split_at(9);
        // The first message ends inside the key: not relayed.
        let first = serde_json::json!({"params": {"message": format!("key {a}")}}).to_string();
        let s = screen_message(
            &scanner(),
            Actions::DEFAULT,
            &first,
            Some(&mut carry),
            Recall::Fresh,
        )
        .unwrap();
        let out = s.redacted.unwrap();
        assert!(!out.contains(a) && out.contains("key "), "{out}");
        let second = serde_json::json!({"result": {"content": [{"type": "text", "text": format!("{b} rest")}]}}).to_string();
        let s = screen_message(
            &scanner(),
            Actions::DEFAULT,
            &second,
            Some(&mut carry),
            Recall::Fresh,
        )
        .unwrap();
        let out = s.redacted.unwrap();
        assert!(!out.contains(b) && out.contains("rest"), "{out}");
        // Cut inside the prefix: the rest is found in the second.
        let mut carry = Carry::default();
        let (a, b) = KEY.split_at(3);
        let first = serde_json::json!({"params": {"message": format!("key {a}")}}).to_string();
        let second = serde_json::json!({"result": {"content": [{"type": "text", "text": format!("{b} rest")}]}}).to_string();
        let s = screen_message(
            &scanner(),
            Actions::DEFAULT,
            &first,
            Some(&mut carry),
            Recall::Fresh,
        )
        .unwrap();
        assert!(s.report.is_empty(), "{s:?}");
        let s = screen_message(
            &scanner(),
            Actions::DEFAULT,
            &second,
            Some(&mut carry),
            Recall::Fresh,
        )
        .unwrap();
        let out = s.redacted.unwrap();
        assert!(!out.contains(b) && out.contains("rest"), "{out}");
    }

    proptest::proptest! {
        /// What `plain_word` lets pass unscanned holds nothing any kind
        /// finds, whatever the actions.
        #[test]
        fn a_plain_word_holds_no_finding(w in "[a-z]{0,40}[A-Z]?[a-z]{0,20}") {
            proptest::prop_assume!(plain_word(&w));
            proptest::prop_assert!(scanner().scan(&w).is_empty(), "{}", w);
        }
    }
}
