//! The strict reader's single pass over a JSON text: one walk that checks
//! everything the validating pass of [`super::jsonrpc`] checks (strict
//! RFC 8259 grammar, no lone surrogate escape, numbers a double can hold,
//! nesting, no key twice in an object, compared after unescaping and case
//! folding, no case twin of a member its [`Shape`] names) and records, on a
//! tape, where each value of the first levels is: its kind, its bytes and
//! its key. What the answer-side decisions need (a message's `id` and
//! `result`, a listed tool's members) is then read off the tape instead of
//! walking the bytes again.
//!
//! Invariants:
//! - `read` (test builds; [`read_known`] otherwise) accepts a subset of
//!   what the serde validator accepts: on any doubt it returns `None`, and
//!   the caller asks the serde validator, whose error is the one reported
//!   (and whose verdict stands). Debug builds check every acceptance
//!   against it.
//! - The tape borrows nothing: node spans index the text it was read from.
//! - Key comparisons ([`Folded`], [`ObjectKeys`]) are the ones both readers
//!   use: there is one definition of "the same key".
//! - [`Known`] elements (a list's objects this reader accepted before, in
//!   the same place, at the same depth, under the same limits) are taken
//!   byte for byte instead of read again: an object's extent is fixed by
//!   its own bytes, so identical bytes there read identically, and the tape
//!   gets the nodes the first read recorded. Anything else is read.

use std::borrow::Cow;
use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

/// Objects with more keys than this switch duplicate detection from a linear
/// scan to a hash set, so a body with one huge object cannot make the check
/// quadratic. Below it the scan beats hashing (typical MCP objects have < 8 keys).
pub(crate) const LINEAR_KEY_SCAN_MAX: usize = 16;

/// Bytes of a string tested at once for the end of its plain run.
const PLAIN_CHUNK: usize = 16;

/// serde_json refuses the 128th nested container; so does the tape.
const SERDE_DEPTH: usize = 127;

/// What a value in one place of a document may be, and what its members
/// are called (the roles of [`super::jsonrpc`]).
pub(crate) trait Shape: Copy {
    /// The members a differently cased key must not imitate, and what they
    /// are called, for an object in this place.
    fn members(self) -> Option<(&'static [&'static str], &'static str)>;
    /// The place of the value of member `key`.
    fn child(self, key: &str) -> Self;
    /// The place of element `index` of an array here.
    fn element(self, index: usize) -> Self;
    /// Whether a string, number, boolean or null may stand here.
    fn holds_scalar(self) -> bool;
    /// Whether an array may stand here.
    fn holds_array(self) -> bool;
    /// Whether an array here is a batch (its length is bounded).
    fn is_batch(self) -> bool;
    /// Whether the value of member `key` of an object here is a list whose
    /// elements may be taken from the [`Known`] ones (`result.tools`).
    fn known_list(self, _key: &str) -> bool {
        false
    }
}

/// What a recorded value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `{…}`
    Object,
    /// `[…]`
    Array,
    /// `"…"`
    String,
    /// A number.
    Number,
    /// `true` or `false`.
    Bool,
    /// `null`.
    Null,
}

/// A recorded value's index on its tape.
pub(crate) type NodeId = usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Node {
    kind: Kind,
    start: u32,
    end: u32,
    /// The key's token (quotes included) when the value is a member; an
    /// empty span otherwise.
    key_start: u32,
    key_end: u32,
    key_escaped: bool,
    /// Whether the members or elements are on the tape.
    children: bool,
    /// One past the last node of this value's recorded subtree.
    next: u32,
}

/// The values of the first levels of a document read by [`read_known`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tape {
    nodes: Vec<Node>,
}

/// The object elements of the last list read in a known place
/// ([`Shape::known_list`]), with the nodes their read recorded (spans
/// relative to the element), and where they were read: an element is
/// taken from here only at the same index, depth and limits.
#[derive(Debug)]
pub struct Known {
    place: Place,
    /// Shared with the next list learned where it takes them unchanged.
    elements: Vec<Arc<KnownElement>>,
}

/// Where a list's elements were read: what decides how an element is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    depth: usize,
    max_depth: usize,
    record: bool,
    record_depth: usize,
}

#[derive(Debug)]
struct KnownElement {
    text: Box<[u8]>,
    /// The element's subtree, spans from its first byte, `next` from its
    /// first node.
    nodes: Box<[Node]>,
}

/// Largest list whose elements are remembered ([`Known`]).
const MAX_KNOWN_BYTES: usize = 4 << 20;

// === impl Known ===

impl Known {
    /// How many elements are remembered.
    pub fn len(&self) -> usize {
        self.elements.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }

    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.elements
            .iter()
            .map(|e| e.text.len() + e.nodes.len() * std::mem::size_of::<Node>())
            .sum()
    }
}

/// One element of a list in a known place as this read found it.
#[derive(Clone, Copy)]
struct Seen {
    start: usize,
    end: usize,
    /// Its nodes on the tape: `first..last`.
    first: usize,
    last: usize,
    object: bool,
    /// Taken from the [`Known`] elements.
    taken: bool,
}

// === impl Tape ===

impl Tape {
    /// The document's value.
    pub fn root(&self) -> Option<NodeId> {
        (!self.nodes.is_empty()).then_some(0)
    }

    fn node(&self, n: NodeId) -> Option<&Node> {
        self.nodes.get(n)
    }

    /// The kind of value `n`.
    pub fn kind(&self, n: NodeId) -> Option<Kind> {
        self.node(n).map(|x| x.kind)
    }

    /// The bytes of value `n` in the text the tape was read from.
    pub fn span(&self, n: NodeId) -> Range<usize> {
        self.node(n)
            .map_or(0..0, |x| x.start as usize..x.end as usize)
    }

    /// The text of value `n`.
    pub fn text<'t>(&self, text: &'t str, n: NodeId) -> &'t str {
        text.get(self.span(n)).unwrap_or("")
    }

    /// The key of member `n` as written, without its quotes, when it has no
    /// escape (`None` for an escaped key or a value that is not a member).
    pub fn plain_key<'t>(&self, text: &'t str, n: NodeId) -> Option<&'t str> {
        let x = self.node(n)?;
        if x.key_escaped || x.key_end <= x.key_start + 1 {
            return None;
        }
        text.get(x.key_start as usize + 1..x.key_end as usize - 1)
    }

    /// The key of member `n`, unescaped.
    pub fn key<'t>(&self, text: &'t str, n: NodeId) -> Option<Cow<'t, str>> {
        let x = self.node(n)?;
        if !x.key_escaped {
            return self.plain_key(text, n).map(Cow::Borrowed);
        }
        let token = text.get(x.key_start as usize..x.key_end as usize)?;
        serde_json::from_str::<String>(token).ok().map(Cow::Owned)
    }

    /// The members or elements of `n`, when they are on the tape.
    pub fn children(&self, n: NodeId) -> Option<Children<'_>> {
        let x = self.node(n)?;
        if !x.children {
            return None;
        }
        Some(Children {
            tape: self,
            at: n + 1,
            end: x.next as usize,
        })
    }

    /// The member of object `n` called `name` (unescaped), if it has one.
    pub fn member(&self, text: &str, n: NodeId, name: &str) -> Option<NodeId> {
        self.children(n)?
            .find(|&c| self.key(text, c).is_some_and(|k| k == name))
    }
}

/// The members or elements of a value, in document order.
pub struct Children<'a> {
    tape: &'a Tape,
    at: usize,
    end: usize,
}

impl Iterator for Children<'_> {
    type Item = NodeId;

    fn next(&mut self) -> Option<NodeId> {
        if self.at >= self.end {
            return None;
        }
        let n = self.at;
        self.at = self.tape.node(n).map_or(self.end, |x| x.next as usize);
        Some(n)
    }
}

/// Reads `text` whole, strictly, as a value in place `shape`: the tape of
/// its values down to `record_depth` levels (the document's value is level
/// 1), or `None` if anything about it would make the serde validator fail
/// or need a closer look (then ask it).
#[cfg(test)]
pub(crate) fn read<S: Shape>(
    text: &str,
    shape: S,
    max_depth: usize,
    max_batch: usize,
    record_depth: usize,
) -> Option<Tape> {
    read_known(text, shape, max_depth, max_batch, record_depth, None).map(|(tape, _)| tape)
}

/// `read`, taking the elements of the first list in a known place from
/// `known` where they are byte for byte the same; with the tape comes that
/// list's elements as [`Known`] when they differ from `known` (to remember
/// for the next read), `None` when they are the same or there was no list.
pub(crate) fn read_known<S: Shape>(
    text: &str,
    shape: S,
    max_depth: usize,
    max_batch: usize,
    record_depth: usize,
    known: Option<&Known>,
) -> Option<(Tape, Option<Known>)> {
    // Spans are 32-bit; a larger text goes the long way.
    u32::try_from(text.len()).ok()?;
    let mut r = Reader {
        text,
        b: text.as_bytes(),
        pos: 0,
        depth: 0,
        max_depth: max_depth.min(SERDE_DEPTH),
        max_batch,
        record_depth,
        nodes: Vec::with_capacity(64),
        keys: Vec::with_capacity(16),
        known,
        known_next: false,
        list: None,
    };
    r.ws();
    if !matches!(r.peek(), Some(b'{' | b'[')) {
        return None;
    }
    r.value(shape, None, true).ok()?;
    r.ws();
    if r.pos != r.b.len() {
        return None;
    }
    let learned = r.learned();
    Some((Tape { nodes: r.nodes }, learned))
}

/// Any reason to hand the text to the serde validator.
struct Refused;

type Step<T = ()> = Result<T, Refused>;

struct Reader<'t> {
    text: &'t str,
    b: &'t [u8],
    pos: usize,
    depth: usize,
    max_depth: usize,
    max_batch: usize,
    record_depth: usize,
    nodes: Vec<Node>,
    keys: Vec<Folded<'t>>,
    known: Option<&'t Known>,
    /// The value about to be read is a list in a known place.
    known_next: bool,
    /// The first list read in a known place: where, and its elements.
    list: Option<(Place, Vec<Seen>)>,
}

/// A member's key token: its span and whether it has escapes.
#[derive(Clone, Copy)]
struct KeyToken {
    start: usize,
    end: usize,
    escaped: bool,
}

impl<'t> Reader<'t> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn expect(&mut self, c: u8) -> Step {
        self.ws();
        if self.peek() != Some(c) {
            return Err(Refused);
        }
        self.pos += 1;
        Ok(())
    }

    /// One value (after optional whitespace), recorded when `record`.
    fn value<S: Shape>(&mut self, shape: S, key: Option<KeyToken>, record: bool) -> Step {
        let known_list = std::mem::take(&mut self.known_next);
        self.ws();
        let start = self.pos;
        let c = self.peek().ok_or(Refused)?;
        let at = self.nodes.len();
        // Its members are recorded when it is above the last level.
        let inner = record && self.depth + 1 < self.record_depth;
        if record {
            let k = key.unwrap_or(KeyToken {
                start: 0,
                end: 0,
                escaped: false,
            });
            self.nodes.push(Node {
                kind: Kind::Null,
                start: start as u32,
                end: start as u32,
                key_start: k.start as u32,
                key_end: k.end as u32,
                key_escaped: k.escaped,
                children: inner,
                next: 0,
            });
        }
        let kind = match c {
            b'{' => {
                self.object(shape, inner)?;
                Kind::Object
            }
            b'[' => {
                self.array(shape, inner, known_list)?;
                Kind::Array
            }
            _ if !shape.holds_scalar() => return Err(Refused),
            b'"' => {
                self.string()?;
                Kind::String
            }
            b't' => {
                self.literal(b"true")?;
                Kind::Bool
            }
            b'f' => {
                self.literal(b"false")?;
                Kind::Bool
            }
            b'n' => {
                self.literal(b"null")?;
                Kind::Null
            }
            b'-' | b'0'..=b'9' => {
                self.number()?;
                Kind::Number
            }
            _ => return Err(Refused),
        };
        let next = self.nodes.len() as u32;
        if let Some(n) = self.nodes.get_mut(at).filter(|_| record) {
            n.kind = kind;
            n.end = self.pos as u32;
            n.next = next;
        }
        Ok(())
    }

    fn enter(&mut self) -> Step {
        self.depth += 1;
        if self.depth > self.max_depth {
            return Err(Refused);
        }
        Ok(())
    }

    fn object<S: Shape>(&mut self, shape: S, record: bool) -> Step {
        self.enter()?;
        self.pos += 1;
        let text = self.text;
        let mut keys = ObjectKeys::open(&self.keys, shape.members());
        self.ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                self.ws();
                if self.peek() != Some(b'"') {
                    return Err(Refused);
                }
                let start = self.pos;
                let escaped = self.string()?;
                let token = KeyToken {
                    start,
                    end: self.pos,
                    escaped,
                };
                let key: Cow<'t, str> = if escaped {
                    let raw = text.get(start..self.pos).ok_or(Refused)?;
                    Cow::Owned(serde_json::from_str::<String>(raw).map_err(|_| Refused)?)
                } else {
                    Cow::Borrowed(text.get(start + 1..self.pos - 1).ok_or(Refused)?)
                };
                keys.admit(&mut self.keys, key.clone())
                    .map_err(|_| Refused)?;
                self.expect(b':')?;
                self.known_next = shape.known_list(&key);
                self.value(shape.child(&key), Some(token), record)?;
                self.ws();
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(Refused),
                }
            }
        }
        keys.close(&mut self.keys);
        self.depth -= 1;
        Ok(())
    }

    fn array<S: Shape>(&mut self, shape: S, record: bool, known_list: bool) -> Step {
        if !shape.holds_array() {
            return Err(Refused);
        }
        self.enter()?;
        self.pos += 1;
        // The first list in a known place: its elements are seen (and
        // taken from the known ones where they can be).
        let place = Place {
            depth: self.depth,
            max_depth: self.max_depth,
            record,
            record_depth: self.record_depth,
        };
        let mut seen = (known_list && self.list.is_none()).then(Vec::new);
        self.ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
        } else {
            let mut index = 0usize;
            loop {
                if shape.is_batch() && index >= self.max_batch {
                    return Err(Refused);
                }
                match seen.as_mut() {
                    Some(seen) => {
                        self.ws();
                        let (start, first) = (self.pos, self.nodes.len());
                        let taken = self.take_known(place, index);
                        if !taken {
                            self.value(shape.element(index), None, record)?;
                        }
                        seen.push(Seen {
                            start,
                            end: self.pos,
                            first,
                            last: self.nodes.len(),
                            object: self.b.get(start) == Some(&b'{'),
                            taken,
                        });
                    }
                    None => self.value(shape.element(index), None, record)?,
                }
                index += 1;
                self.ws();
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(b']') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(Refused),
                }
            }
        }
        if let Some(seen) = seen {
            self.list = Some((place, seen));
        }
        self.depth -= 1;
        Ok(())
    }

    /// Takes element `index` of a list in a known place from the known
    /// ones if its bytes are the same there: the read moves past it and the
    /// tape gets the nodes its first read recorded. Only objects are known,
    /// so the bytes compared are the whole element (an object ends at its
    /// own closing brace; a number would not).
    fn take_known(&mut self, place: Place, index: usize) -> bool {
        let Some(e) = self
            .known
            .filter(|k| k.place == place)
            .and_then(|k| k.elements.get(index))
        else {
            return false;
        };
        let start = self.pos;
        if !self
            .b
            .get(start..)
            .is_some_and(|rest| rest.starts_with(&e.text))
        {
            return false;
        }
        let (Ok(at), Ok(base)) = (u32::try_from(start), u32::try_from(self.nodes.len())) else {
            return false;
        };
        self.nodes.extend(e.nodes.iter().map(|n| Node {
            start: n.start + at,
            end: n.end + at,
            key_start: if n.key_end > 0 { n.key_start + at } else { 0 },
            key_end: if n.key_end > 0 { n.key_end + at } else { 0 },
            next: n.next + base,
            ..*n
        }));
        self.pos += e.text.len();
        true
    }

    /// The elements of the list in a known place, to remember, when this
    /// read did not take every one of them from the known ones (or took
    /// them but there are fewer now). Only a list of objects is remembered.
    fn learned(&self) -> Option<Known> {
        let (place, seen) = self.list.as_ref()?;
        let same = self
            .known
            .is_some_and(|k| k.place == *place && k.len() == seen.len())
            && seen.iter().all(|s| s.taken);
        let size = seen.iter().map(|s| s.end - s.start).sum::<usize>();
        if same || size > MAX_KNOWN_BYTES || !seen.iter().all(|s| s.object) {
            return None;
        }
        // Elements taken unchanged are shared with the known list, not
        // copied (one tool of a hundred changing costs that one).
        let taken = self.known.filter(|k| k.place == *place);
        let mut elements = Vec::with_capacity(seen.len());
        for (index, s) in seen.iter().enumerate() {
            if let Some(e) = taken
                .filter(|_| s.taken)
                .and_then(|k| k.elements.get(index))
            {
                elements.push(Arc::clone(e));
                continue;
            }
            let at = u32::try_from(s.start).ok()?;
            let base = u32::try_from(s.first).ok()?;
            let nodes = self.nodes.get(s.first..s.last)?;
            elements.push(Arc::new(KnownElement {
                text: self.b.get(s.start..s.end)?.into(),
                nodes: nodes
                    .iter()
                    .map(|n| Node {
                        start: n.start - at,
                        end: n.end - at,
                        key_start: if n.key_end > 0 { n.key_start - at } else { 0 },
                        key_end: if n.key_end > 0 { n.key_end - at } else { 0 },
                        next: n.next - base,
                        ..*n
                    })
                    .collect(),
            }));
        }
        Some(Known {
            place: *place,
            elements,
        })
    }

    fn literal(&mut self, word: &[u8]) -> Step {
        if self.b.get(self.pos..self.pos + word.len()) != Some(word) {
            return Err(Refused);
        }
        self.pos += word.len();
        Ok(())
    }

    /// A string token from its opening quote; whether it had escapes.
    fn string(&mut self) -> Step<bool> {
        self.pos += 1;
        let mut escaped = false;
        loop {
            let rest = self.b.get(self.pos..).ok_or(Refused)?;
            self.pos += plain_run(rest);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    self.escape()?;
                }
                // A raw control character, or the text ended inside it.
                _ => return Err(Refused),
            }
        }
    }

    /// One escape, from its backslash. A `\u` escape of a UTF-16 surrogate
    /// must be a high one followed by a low one.
    fn escape(&mut self) -> Step {
        match self.b.get(self.pos + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                self.pos += 2;
                Ok(())
            }
            Some(b'u') => {
                let cp = self.hex4(self.pos + 2)?;
                self.pos += 6;
                if (0xDC00..0xE000).contains(&cp) {
                    return Err(Refused);
                }
                if (0xD800..0xDC00).contains(&cp) {
                    if self.b.get(self.pos..self.pos + 2) != Some(b"\\u") {
                        return Err(Refused);
                    }
                    let low = self.hex4(self.pos + 2)?;
                    if !(0xDC00..0xE000).contains(&low) {
                        return Err(Refused);
                    }
                    self.pos += 6;
                }
                Ok(())
            }
            _ => Err(Refused),
        }
    }

    fn hex4(&self, at: usize) -> Step<u32> {
        let digits = self.b.get(at..at + 4).ok_or(Refused)?;
        let mut v = 0u32;
        for d in digits {
            let x = (*d as char).to_digit(16).ok_or(Refused)?;
            v = v * 16 + x;
        }
        Ok(v)
    }

    /// A number: JSON's grammar, and a value a double holds (serde_json
    /// refuses one that overflows; so does the tape, with room to spare).
    fn number(&mut self) -> Step {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(Refused),
        }
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.some_digits()?;
            float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.some_digits()?;
            float = true;
        }
        let token = self.text.get(start..self.pos).ok_or(Refused)?;
        if float || token.len() > 18 {
            let v: f64 = token.parse().map_err(|_| Refused)?;
            if !v.is_finite() || v.abs() >= 1e308 {
                return Err(Refused);
            }
        }
        Ok(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn some_digits(&mut self) -> Step {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(Refused);
        }
        self.digits();
        Ok(())
    }
}

/// How many bytes at the start of `bytes` a JSON string holds as they are:
/// up to the first `"`, `\` or control character (below U+0020, which
/// strings must escape), or all of them. One pass: whole chunks are tested
/// at once (the test vectorizes), the chunk that holds the stop byte by byte.
fn plain_run(bytes: &[u8]) -> usize {
    let stops = |c: u8| (c == b'"') | (c == b'\\') | (c < 0x20);
    let mut at = 0;
    for chunk in bytes.chunks_exact(PLAIN_CHUNK) {
        if chunk.iter().fold(false, |any, &c| any | stops(c)) {
            break;
        }
        at += PLAIN_CHUNK;
    }
    let tail = bytes.get(at..).unwrap_or_default();
    at + tail.iter().position(|&c| stops(c)).unwrap_or(tail.len())
}

/// Why a key is refused ([`ObjectKeys::admit`]).
pub(crate) enum KeyRefusal {
    /// The same key again.
    Duplicate,
    /// The same key again in other letter case.
    CaseDuplicate,
    /// A case twin of the member `member` of `scope`.
    CaseVariant {
        member: &'static str,
        scope: &'static str,
    },
}

/// The keys of one open object, checked as each is read: no key twice
/// (compared folded, [`Folded`]) and no case twin of a member the place
/// names. Keys of every open object share one stack; this object owns its
/// tail from `start`.
pub(crate) struct ObjectKeys<'de> {
    start: usize,
    hashed: Option<HashSet<Folded<'de>>>,
    members: Option<(&'static [&'static str], &'static str)>,
}

impl<'de> ObjectKeys<'de> {
    /// An object just opened, whose members are `members`.
    pub(crate) fn open(
        stack: &[Folded<'de>],
        members: Option<(&'static [&'static str], &'static str)>,
    ) -> ObjectKeys<'de> {
        ObjectKeys {
            start: stack.len(),
            hashed: None,
            members,
        }
    }

    /// Admits `key`, the next key of this object, or says why not.
    pub(crate) fn admit(
        &mut self,
        stack: &mut Vec<Folded<'de>>,
        key: Cow<'de, str>,
    ) -> Result<(), KeyRefusal> {
        // Keys are compared folded (without allocating): two keys equal
        // but for letter case are one key to a case-insensitive decoder.
        let folded = Folded::new(key);
        let key = &folded.key;
        // Every spelling is looked at, lower case too: `iserror` is
        // `isError` to a case-insensitive decoder (found by the
        // `json_differential` fuzz target).
        if let Some((names, scope)) = self.members {
            if let Some(member) = names
                .iter()
                .find(|m| folded.eq_member(m) && **m != key.as_ref())
            {
                return Err(KeyRefusal::CaseVariant { member, scope });
            }
        }
        let earlier: Option<bool> = match &mut self.hashed {
            Some(set) => match set.get(&folded) {
                Some(k) => Some(k.key == folded.key),
                None => {
                    set.insert(folded);
                    None
                }
            },
            None => {
                let found = stack
                    .get(self.start..)
                    .unwrap_or_default()
                    .iter()
                    .find(|k| **k == folded)
                    .map(|k| k.key == folded.key);
                if found.is_none() {
                    if stack.len() - self.start >= LINEAR_KEY_SCAN_MAX {
                        let mut set: HashSet<Folded<'de>> = stack.drain(self.start..).collect();
                        set.insert(folded);
                        self.hashed = Some(set);
                    } else {
                        stack.push(folded);
                    }
                }
                found
            }
        };
        match earlier {
            None => Ok(()),
            Some(true) => Err(KeyRefusal::Duplicate),
            Some(false) => Err(KeyRefusal::CaseDuplicate),
        }
    }

    /// The object closed: its keys leave the stack.
    pub(crate) fn close(self, stack: &mut Vec<Folded<'de>>) {
        stack.truncate(self.start);
    }
}

/// An object key compared and hashed as a case-insensitive decoder sees it:
/// lower case, with U+017F LATIN SMALL LETTER LONG S as `s` and U+212A
/// KELVIN SIGN as `k` (Unicode case folding maps both onto ASCII letters, as
/// Go's `strings.EqualFold` does). Nothing is allocated; whether the key is
/// ASCII is found once, so most comparisons are a length check.
#[derive(Debug, Clone)]
pub(crate) struct Folded<'de> {
    key: Cow<'de, str>,
    ascii: bool,
}

impl<'de> Folded<'de> {
    /// `key`, to be compared folded.
    pub(crate) fn new(key: Cow<'de, str>) -> Folded<'de> {
        let ascii = key.is_ascii();
        Folded { key, ascii }
    }
}

impl Folded<'_> {
    fn chars(s: &str) -> impl Iterator<Item = char> + '_ {
        s.chars().flat_map(|c| {
            let one = match c {
                '\u{17F}' => Some('s'),
                c if c.is_ascii() => Some(c.to_ascii_lowercase()),
                _ => None,
            };
            one.into_iter().chain(
                one.is_none()
                    .then(|| c.to_lowercase())
                    .into_iter()
                    .flatten(),
            )
        })
    }

    /// Whether this key is `member` (an ASCII name a place defines) to a
    /// case-insensitive decoder: for an ASCII key a length check first.
    fn eq_member(&self, member: &str) -> bool {
        if self.ascii {
            return member.len() == self.key.len() && member.eq_ignore_ascii_case(&self.key);
        }
        Self::eq_str(member, &self.key)
    }

    /// Whether `a` and `b` are one key to a case-insensitive decoder.
    pub(crate) fn eq_str(a: &str, b: &str) -> bool {
        if a.is_ascii() && b.is_ascii() {
            return a.eq_ignore_ascii_case(b);
        }
        Self::chars(a).eq(Self::chars(b))
    }
}

impl PartialEq for Folded<'_> {
    fn eq(&self, other: &Self) -> bool {
        if self.ascii && other.ascii {
            return self.key.eq_ignore_ascii_case(&other.key);
        }
        Self::chars(&self.key).eq(Self::chars(&other.key))
    }
}

impl Eq for Folded<'_> {}

impl std::hash::Hash for Folded<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        if self.ascii {
            for b in self.key.bytes() {
                state.write_u8(b.to_ascii_lowercase());
            }
        } else {
            for c in Self::chars(&self.key) {
                state.write_u32(u32::from(c));
            }
        }
        state.write_u8(0xff);
    }
}

#[cfg(test)]
#[path = "tape_tests.rs"]
mod tests;
