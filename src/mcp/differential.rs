//! One verdict from every JSON reader (tests and fuzz targets only): a
//! reference reading of a body, written from the rules rather than from the
//! readers, and the comparison of each reader with it.
//!
//! The reference is `serde_json`'s decoding of every value (strings
//! unescaped, a lone surrogate refused, numbers as `serde_json` reads them,
//! members in order with their duplicates kept) followed by the key rules as
//! the specification of [`super`] states them: no two keys of one object
//! alike after unescaping and case folding, no case twin of a member the
//! place names, nesting within the limit. The readers compared with it:
//! - the serde validator and typed pass of [`super::parse`] (requests) and
//!   of [`super::parse_upstream`] the long way (answers);
//! - the tape ([`super::super::tape`]), which may decline (then the
//!   validator decides) but never accepts what the reference refuses, and
//!   whose recorded values, keys and spans decode to the reference's;
//! - the streaming scanner ([`super::super::scan`]), whose facts are the
//!   reference's wherever the validator accepts, and which refuses whatever
//!   the reference refuses at the levels it decides on.
//!
//! Each check returns `Err` naming the first disagreement.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::super::scan::{Facts, Scan};
use super::super::tape::{self, Tape};
use super::super::validator::{META_MEMBERS, PARAMS_MEMBERS};
use super::{
    envelope_from_tape, parse, parse_upstream_serde, Envelope, Id, Limits, Message, ParseError,
    MESSAGE_MEMBERS, RESULT_MEMBERS, UPSTREAM_LIMITS,
};

/// A JSON value as `serde_json` decodes it, members in order, duplicates kept.
#[derive(Debug, Clone, PartialEq)]
pub enum Tree {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// An integer without fraction or exponent.
    Int(i128),
    /// Any other number.
    Float(f64),
    /// A string, unescaped.
    String(String),
    /// An array.
    Array(Vec<Tree>),
    /// An object's members in order.
    Object(Vec<(String, Tree)>),
}

impl Tree {
    /// The first member called `key`.
    pub fn get(&self, key: &str) -> Option<&Tree> {
        match self {
            Tree::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn depth(&self) -> usize {
        match self {
            Tree::Array(items) => 1 + items.iter().map(Tree::depth).max().unwrap_or(0),
            Tree::Object(members) => 1 + members.iter().map(|(_, v)| v.depth()).max().unwrap_or(0),
            _ => 0,
        }
    }
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tree, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Tree, E> {
        Ok(Tree::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Tree, E> {
        Ok(Tree::Int(i128::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Tree, E> {
        Ok(Tree::Int(i128::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Tree, E> {
        Ok(Tree::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Tree, E> {
        Ok(Tree::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element::<Tree>()? {
            items.push(v);
        }
        Ok(Tree::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut members = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Tree>()? {
            members.push((k, v));
        }
        Ok(Tree::Object(members))
    }
}

/// Why the reference refuses a text.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// Not JSON to `serde_json` (grammar, lone surrogate, number out of
    /// range, trailing bytes, nesting past its own limit).
    Grammar(String),
    /// Nested deeper than the limit.
    TooDeep,
    /// Two keys of one object alike, or a case twin of a named member, at
    /// `path` (member names and indices from the root).
    Key { path: Vec<String>, key: String },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Grammar(why) => write!(f, "not JSON: {why}"),
            Refusal::TooDeep => f.write_str("nested too deep"),
            Refusal::Key { path, key } => write!(f, "key {key:?} at /{}", path.join("/")),
        }
    }
}

/// A key as a case-insensitive decoder compares it: each character lower
/// cased, with U+017F LATIN SMALL LETTER LONG S as `s`.
fn fold(key: &str) -> String {
    key.chars()
        .flat_map(|c| {
            if c == '\u{17F}' {
                'S'.to_lowercase()
            } else {
                c.to_lowercase()
            }
        })
        .collect()
}

/// The members a place names (the places of [`super`]: a message, its
/// `params`, their `_meta`, a response's `result`).
#[derive(Clone, Copy, PartialEq)]
enum Place {
    Message,
    Params,
    Meta,
    Result,
    Other,
}

impl Place {
    fn names(self) -> &'static [&'static str] {
        match self {
            Place::Message => MESSAGE_MEMBERS,
            Place::Params => PARAMS_MEMBERS,
            Place::Meta => META_MEMBERS,
            Place::Result => RESULT_MEMBERS,
            Place::Other => &[],
        }
    }

    fn child(self, key: &str) -> Place {
        match (self, key) {
            (Place::Message, "params") => Place::Params,
            (Place::Message, "result") => Place::Result,
            (Place::Params, "_meta") => Place::Meta,
            _ => Place::Other,
        }
    }
}

/// Reads `text` as the reference does, with nesting up to `max_depth`.
///
/// # Errors
/// The first rule the text breaks.
pub fn reference(text: &str, max_depth: usize) -> Result<Tree, Refusal> {
    let tree: Tree = serde_json::from_str(text).map_err(|e| {
        if e.to_string().starts_with("recursion limit exceeded") {
            Refusal::TooDeep
        } else {
            Refusal::Grammar(e.to_string())
        }
    })?;
    if tree.depth() > max_depth.min(127) {
        return Err(Refusal::TooDeep);
    }
    let root = match &tree {
        Tree::Array(_) => Place::Other,
        _ => Place::Message,
    };
    keys(&tree, root, true, &mut Vec::new())?;
    Ok(tree)
}

fn keys(tree: &Tree, place: Place, top: bool, path: &mut Vec<String>) -> Result<(), Refusal> {
    match tree {
        Tree::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(i.to_string());
                let place = if top { Place::Message } else { Place::Other };
                keys(item, place, false, path)?;
                path.pop();
            }
        }
        Tree::Object(members) => {
            for (i, (k, v)) in members.iter().enumerate() {
                let f = fold(k);
                let twin = place
                    .names()
                    .iter()
                    .any(|m| fold(m) == f && *m != k.as_str());
                let again = members[..i].iter().any(|(e, _)| fold(e) == f);
                if twin || again {
                    return Err(Refusal::Key {
                        path: path.clone(),
                        key: k.clone(),
                    });
                }
                path.push(k.clone());
                keys(v, place.child(k), false, path)?;
                path.pop();
            }
        }
        _ => {}
    }
    Ok(())
}

/// The decoded value of `text` (a part of a body the reference accepted).
fn decoded(text: &str) -> Result<Tree, String> {
    serde_json::from_str(text).map_err(|e| format!("a span that is not one value: {e} in {text:?}"))
}

/// The id the reference reads for a message: an integer within `i64`, or a
/// string. `-0` is an integer to the readers and `-0.0` to serde_json.
fn reference_id(tree: Option<&Tree>) -> Option<Id> {
    match tree? {
        Tree::Int(i) => i64::try_from(*i).ok().map(Id::Number),
        Tree::Float(f) if *f == 0.0 && f.is_sign_negative() => Some(Id::Number(0)),
        Tree::String(s) => Some(Id::String(s.clone())),
        _ => None,
    }
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

/// A message a reader accepted, against the reference's value of its bytes.
fn same_message(text: &str, m: &Message, tree: &Tree) -> Result<(), String> {
    let own = decoded(text.get(m.span.clone()).unwrap_or(""))?;
    ensure(&own == tree, || {
        format!("a message's span {:?} is not its value", m.span)
    })?;
    let id = tree.get("id");
    if m.id.is_some() || id.is_some() {
        ensure(m.id == reference_id(id), || {
            format!("id {:?} read where the reference has {id:?}", m.id)
        })?;
    }
    let method = match tree.get("method") {
        Some(Tree::String(s)) => Some(s.as_str()),
        _ => None,
    };
    ensure(m.method.as_deref() == method, || {
        format!(
            "method {:?} read where the reference has {method:?}",
            m.method
        )
    })?;
    let params = tree.get("params");
    let read = m.params.as_deref().map(|p| decoded(p.get())).transpose()?;
    ensure(read.as_ref() == params.filter(|_| read.is_some()), || {
        "params read as another value".to_owned()
    })?;
    if let Some(call) = &m.call {
        let name = params.and_then(|p| p.get("name"));
        ensure(name == Some(&Tree::String(call.name.clone())), || {
            format!("tool {:?} read where the reference has {name:?}", call.name)
        })?;
        let args = call
            .arguments
            .as_deref()
            .map(|a| decoded(a.get()))
            .transpose()?;
        let reference = params.and_then(|p| p.get("arguments"));
        ensure(
            args.as_ref() == reference.filter(|_| args.is_some()),
            || "arguments read as another value".to_owned(),
        )?;
    }
    if let Some(state) = &m.request_state {
        let reference = params.and_then(|p| p.get("requestState"));
        ensure(reference == Some(&Tree::String(state.clone())), || {
            "requestState read as another value".to_owned()
        })?;
    }
    ensure(m.is_error == tree.get("error").is_some(), || {
        "an error read where there is none, or missed".to_owned()
    })?;
    if let Some(r) = &m.result {
        let own = decoded(text.get(r.clone()).unwrap_or(""))?;
        ensure(Some(&own) == tree.get("result"), || {
            "result's span is not its value".to_owned()
        })?;
    }
    Ok(())
}

/// An envelope a reader accepted, against the reference tree of the body.
fn same_envelope(text: &str, e: &Envelope, tree: &Tree) -> Result<(), String> {
    let messages: Vec<&Tree> = match tree {
        Tree::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    ensure(e.batch == matches!(tree, Tree::Array(_)), || {
        "a batch read as a message, or the reverse".to_owned()
    })?;
    ensure(e.messages.len() == messages.len(), || {
        format!("{} messages read of {}", e.messages.len(), messages.len())
    })?;
    for (m, t) in e.messages.iter().zip(messages) {
        same_message(text, m, t)?;
    }
    Ok(())
}

/// Two envelopes read from one body by two readers: the same messages.
fn same_reading(a: &Envelope, b: &Envelope) -> Result<(), String> {
    ensure(
        a.batch == b.batch && a.messages.len() == b.messages.len(),
        || "the two readers see different message counts".to_owned(),
    )?;
    for (x, y) in a.messages.iter().zip(&b.messages) {
        let same = x.kind == y.kind
            && x.id == y.id
            && x.method == y.method
            && x.span == y.span
            && x.is_error == y.is_error
            && x.result == y.result
            && x.name == y.name
            && x.request_state == y.request_state;
        ensure(same, || {
            format!("the readers differ on a message: {x:?} / {y:?}")
        })?;
    }
    Ok(())
}

/// The tape's recorded values against the reference tree.
fn same_tape(text: &str, t: &Tape, n: tape::NodeId, tree: &Tree) -> Result<(), String> {
    let span = t.span(n);
    let own = decoded(text.get(span.clone()).unwrap_or(""))?;
    ensure(&own == tree, || {
        format!("the tape's span {span:?} is another value")
    })?;
    let kind = match tree {
        Tree::Null => tape::Kind::Null,
        Tree::Bool(_) => tape::Kind::Bool,
        Tree::Int(_) | Tree::Float(_) => tape::Kind::Number,
        Tree::String(_) => tape::Kind::String,
        Tree::Array(_) => tape::Kind::Array,
        Tree::Object(_) => tape::Kind::Object,
    };
    ensure(t.kind(n) == Some(kind), || {
        format!("the tape's kind {:?} is not {kind:?}", t.kind(n))
    })?;
    let Some(children) = t.children(n) else {
        return Ok(());
    };
    let children: Vec<tape::NodeId> = children.collect();
    match tree {
        Tree::Array(items) => {
            ensure(children.len() == items.len(), || {
                "the tape lost elements".to_owned()
            })?;
            for (c, item) in children.into_iter().zip(items) {
                same_tape(text, t, c, item)?;
            }
        }
        Tree::Object(members) => {
            ensure(children.len() == members.len(), || {
                "the tape lost members".to_owned()
            })?;
            for (c, (k, v)) in children.into_iter().zip(members) {
                let key = t.key(text, c);
                ensure(key.as_deref() == Some(k.as_str()), || {
                    format!("the tape reads key {key:?} where the reference has {k:?}")
                })?;
                same_tape(text, t, c, v)?;
            }
        }
        _ => ensure(children.is_empty(), || {
            "the tape records children of a scalar".to_owned()
        })?,
    }
    Ok(())
}

/// Whether the validator's refusal is one the reference must share (the
/// JSON itself, its keys or its depth, rather than JSON-RPC's shape).
fn json_level(e: &ParseError) -> bool {
    matches!(
        e,
        ParseError::InvalidUtf8 { .. }
            | ParseError::Syntax { .. }
            | ParseError::TrailingCharacters { .. }
            | ParseError::LoneSurrogate { .. }
            | ParseError::DuplicateKey { .. }
            | ParseError::CaseDuplicateKey { .. }
            | ParseError::CaseVariantMember { .. }
            | ParseError::TooDeep { .. }
    )
}

/// The validator against the reference: the same verdict on the JSON, the
/// same values where it accepts.
fn validator_agrees(
    text: &str,
    read: &Result<Envelope, ParseError>,
    reference: &Result<Tree, Refusal>,
) -> Result<(), String> {
    match (read, reference) {
        (Ok(e), Ok(tree)) => same_envelope(text, e, tree),
        (Ok(_), Err(why)) => Err(format!(
            "the validator accepted what the reference refuses: {why}"
        )),
        (Err(e), Ok(_)) if json_level(e) => {
            Err(format!("the validator refused valid JSON as {e:?}"))
        }
        (Err(_), _) => Ok(()),
    }
}

/// A request body: [`parse`] against the reference.
///
/// # Errors
/// The first disagreement.
pub fn check_request(body: &[u8]) -> Result<(), String> {
    let limits = Limits::default();
    let read = parse(body, &limits);
    let Ok(text) = std::str::from_utf8(body) else {
        return ensure(read.is_err(), || {
            "accepted bytes that are not UTF-8".to_owned()
        });
    };
    validator_agrees(text, &read, &reference(text, limits.max_depth))
}

/// The facts the scanner must report for an answer the validator accepted;
/// `Err` where the held decision could not read its input requests (an
/// object of objects, each with a string `method`), which the scanner must
/// refuse.
fn reference_facts(tree: &Tree, cost_key: &str) -> Result<Vec<Facts>, String> {
    let messages: Vec<&Tree> = match tree {
        Tree::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    messages
        .into_iter()
        .map(|m| {
            let result = m.get("result");
            let string = |t: Option<&Tree>| match t {
                Some(Tree::String(s)) => Some(s.clone()),
                _ => None,
            };
            let input_methods = match result.and_then(|r| r.get("inputRequests")) {
                Some(Tree::Object(requests)) => requests
                    .iter()
                    .map(|(_, r)| string(r.get("method")).ok_or("an unreadable input request"))
                    .collect::<Result<Vec<String>, _>>()?,
                Some(_) => return Err("input requests that are not an object"),
                None => Vec::new(),
            };
            let cost = match result
                .and_then(|r| r.get("_meta"))
                .and_then(|x| x.get(cost_key))
            {
                Some(Tree::Int(i)) => Some(*i as f64),
                Some(Tree::Float(f)) => Some(*f),
                _ => None,
            };
            Ok(Facts {
                id: reference_id(m.get("id")),
                error: m.get("error").is_some(),
                is_error: matches!(
                    result.and_then(|r| r.get("isError")),
                    Some(Tree::Bool(true))
                ),
                result_type: string(result.and_then(|r| r.get("resultType"))),
                input_methods,
                cost,
            })
        })
        .collect::<Result<_, &str>>()
        .map_err(str::to_owned)
}

/// Whether the reference's refusal is at a level the scanner decides on:
/// the JSON itself, or the keys of a message, its `result` or an input
/// request.
fn scanner_level(why: &Refusal, batch: bool) -> bool {
    let Refusal::Key { path, .. } = why else {
        return true;
    };
    let inner: &[String] = if batch {
        path.get(1..).unwrap_or(&[])
    } else {
        path
    };
    match inner {
        [] => true,
        [r] => r == "result",
        [r, i, _] => r == "result" && i == "inputRequests",
        _ => false,
    }
}

/// The cost member the scanner is asked for in [`check_answer`].
pub const COST_KEY: &str = "mcp-firewall/cost";

/// An answer body: the validator, the tape and the scanner (fed in two
/// chunks split at `split`) against the reference and one another.
///
/// # Errors
/// The first disagreement.
pub fn check_answer(body: &[u8], split: usize) -> Result<(), String> {
    let mut scan = Scan::new(COST_KEY);
    let cut = split.min(body.len());
    let scanned = scan
        .push(body.get(..cut).unwrap_or_default())
        .and_then(|()| scan.push(body.get(cut..).unwrap_or_default()))
        .and_then(|()| scan.finish());
    let Ok(text) = std::str::from_utf8(body) else {
        ensure(super::parse_upstream(body).is_err(), || {
            "accepted bytes that are not UTF-8".to_owned()
        })?;
        return ensure(scanned.is_err(), || {
            "the scanner accepted bytes that are not UTF-8".to_owned()
        });
    };
    let reference = reference(text, UPSTREAM_LIMITS.max_depth);
    let read = parse_upstream_serde(text);
    validator_agrees(text, &read, &reference)?;
    if let Some((t, _)) = super::answer_tape(text, None) {
        let tree = reference
            .as_ref()
            .map_err(|why| format!("the tape accepted what the reference refuses: {why}"))?;
        if let Some(root) = t.root() {
            same_tape(text, &t, root, tree)?;
        }
        let from_tape = envelope_from_tape(text, t);
        match (&from_tape, &read) {
            (Ok(a), Ok(b)) => same_reading(a, b)?,
            (Err(_), Err(_)) => {}
            (a, b) => {
                return Err(format!(
                    "the tape and the validator differ: {:?} / {:?}",
                    a.as_ref().err(),
                    b.as_ref().err()
                ))
            }
        }
    }
    match (&scanned, &reference, &read) {
        (_, Ok(tree), Ok(_)) => match (scanned, reference_facts(tree, COST_KEY)) {
            (Ok(facts), Ok(expected)) => ensure(facts == expected, || {
                format!("the scanner read {facts:?} where the reference has {expected:?}")
            }),
            (Err(e), Ok(_)) => Err(format!(
                "the scanner refused an answer the validator accepts: {e}"
            )),
            (Ok(_), Err(e)) => Err(format!("the scanner accepted {e}")),
            (Err(_), Err(_)) => Ok(()),
        },
        (Ok(_), Err(why), _) if scanner_level(why, text.trim_start().starts_with('[')) => Err(
            format!("the scanner accepted what the reference refuses: {why}"),
        ),
        (
            Ok(_),
            Ok(_),
            Err(
                e @ (ParseError::NotObjectOrArray { .. }
                | ParseError::EmptyBatch
                | ParseError::ElementNotObject { .. }),
            ),
        ) => Err(format!(
            "the scanner accepted an answer that is no message: {e:?}"
        )),
        _ => Ok(()),
    }
}

/// The tape's [`tape::Known`] elements: `second` read with what reading
/// `first` taught is read exactly as `second` read afresh (an element
/// taken byte for byte from an earlier list reads as it would have).
///
/// # Errors
/// The first disagreement.
pub fn check_known(first: &[u8], second: &[u8]) -> Result<(), String> {
    let Ok((_, Some(known))) = super::parse_upstream_known(first, None) else {
        return Ok(());
    };
    let fresh = super::parse_upstream_known(second, None);
    let taught = super::parse_upstream_known(second, Some(&known));
    match (&fresh, &taught) {
        (Ok((a, _)), Ok((b, _))) => {
            same_reading(a, b)?;
            ensure(a.tape == b.tape, || {
                "a list read with known elements has another tape".to_owned()
            })
        }
        (Err(_), Err(_)) => Ok(()),
        _ => Err(format!(
            "known elements changed the verdict: {:?} / {:?}",
            fresh.as_ref().err(),
            taught.as_ref().err()
        )),
    }
}

#[cfg(test)]
#[path = "differential_tests.rs"]
mod tests;
