//! Pass 1 of [`super::jsonrpc`]'s reading of a body: the validating pass, a
//! serde visitor that builds nothing but a stack of the current object's
//! keys, and refuses duplicate keys, case twins of the members each place
//! names ([`Role`]), nesting past the limit and a body that is not a
//! message or a batch of messages. The tape's reader ([`super::tape`])
//! applies the same roles.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::message::Limits;
use super::parse_error::{syntax_error, JsonPath, JsonType, ParseError, PathSegment};
use super::tape::{Folded, KeyRefusal, ObjectKeys, Shape};

/// The shape of the top-level value, as far as the typed pass needs it.
pub(super) enum Root {
    Object,
    Array(usize),
}

/// A semantic failure found by the validator; serde only sees a placeholder
/// error, the detail travels here.
enum Failure {
    Duplicate(String),
    CaseDuplicate(String),
    CaseVariant {
        key: String,
        member: &'static str,
        scope: &'static str,
    },
    TooDeep,
    NotObjectOrArray(JsonType),
    BatchTooLarge,
    ElementNotObject(usize, JsonType),
}

struct State<'de> {
    limits: Limits,
    depth: usize,
    /// Keys of every open object, innermost last; each object owns the tail
    /// from the index it recorded on entry.
    keys: Vec<Folded<'de>>,
    failure: Option<Failure>,
    /// Path to the failure, innermost first (built while unwinding).
    path: Vec<PathSegment>,
    root: Option<Root>,
}

#[derive(Clone, Copy)]
pub(super) enum Role {
    /// The body: a message object or a batch array.
    Root,
    /// A batch element: a message object.
    Element(usize),
    /// A message's `params`.
    Params,
    /// `params._meta`.
    Meta,
    /// A response's `result`.
    Result,
    /// Anything else.
    Inner,
}

impl Role {
    /// The members of the object in this role that a case-insensitive decoder
    /// could confuse with a differently cased key, and what they are called.
    fn members(self) -> Option<(&'static [&'static str], &'static str)> {
        match self {
            Role::Root | Role::Element(_) => Some((MESSAGE_MEMBERS, "JSON-RPC")),
            Role::Params => Some((PARAMS_MEMBERS, "MCP params")),
            Role::Meta => Some((META_MEMBERS, "MCP _meta")),
            Role::Result => Some((RESULT_MEMBERS, "MCP result")),
            Role::Inner => None,
        }
    }

    /// The role of the value of member `key` of an object in this role.
    fn child(self, key: &str) -> Role {
        match (self, key) {
            (Role::Root | Role::Element(_), "params") => Role::Params,
            (Role::Root | Role::Element(_), "result") => Role::Result,
            (Role::Params, "_meta") => Role::Meta,
            _ => Role::Inner,
        }
    }
}

/// The roles as the tape's reader sees them: the same members, the same
/// places where only objects (or objects and arrays) may stand.
impl Shape for Role {
    fn members(self) -> Option<(&'static [&'static str], &'static str)> {
        Role::members(self)
    }

    fn child(self, key: &str) -> Role {
        Role::child(self, key)
    }

    fn element(self, index: usize) -> Role {
        match self {
            Role::Root => Role::Element(index),
            _ => Role::Inner,
        }
    }

    fn holds_scalar(self) -> bool {
        !matches!(self, Role::Root | Role::Element(_))
    }

    fn holds_array(self) -> bool {
        !matches!(self, Role::Element(_))
    }

    fn is_batch(self) -> bool {
        matches!(self, Role::Root)
    }

    fn known_list(self, key: &str) -> bool {
        matches!(self, Role::Result) && key == "tools"
    }
}

/// Members of a JSON-RPC message.
pub(crate) const MESSAGE_MEMBERS: &[&str] =
    &["jsonrpc", "id", "method", "params", "result", "error"];

/// Members the MCP schema defines for request and notification `params`
/// (2025-03-26 to 2026-07-28). Keys outside this set are the method's or the
/// tool's own business; a key that equals one of these ignoring case is
/// refused, because a decoder that matches keys case-insensitively (Go's
/// `encoding/json`, several Java and .NET mappers) would read it as that
/// member.
pub(super) const PARAMS_MEMBERS: &[&str] = &[
    "_meta",
    "name",
    "arguments",
    "uri",
    "cursor",
    "taskId",
    "task",
    "ref",
    "argument",
    "context",
    "level",
    "protocolVersion",
    "capabilities",
    "clientInfo",
    "requestId",
    "reason",
    "progressToken",
    "progress",
    "total",
    "message",
    "inputResponses",
    "requestState",
    "notifications",
    "filter",
    "status",
];

/// Members of MCP results a client acts on (2025-03-26 to 2026-07-28): the
/// firewall filters, settles or polices them, so a differently cased twin
/// that a case-insensitive client would read instead is refused.
pub(crate) const RESULT_MEMBERS: &[&str] = &[
    "_meta",
    "tools",
    "prompts",
    "resources",
    "resourceTemplates",
    "contents",
    "content",
    "structuredContent",
    "isError",
    "nextCursor",
    "resultType",
    "inputRequests",
    "requestState",
    "ttlMs",
    "cacheScope",
    "messages",
    "protocolVersion",
    "capabilities",
    "serverInfo",
    "instructions",
    "completion",
    "task",
];

/// Members of `params._meta` the firewall or MCP give a meaning to.
pub(super) const META_MEMBERS: &[&str] = &[
    "progressToken",
    "io.modelcontextprotocol/protocolVersion",
    "io.modelcontextprotocol/clientCapabilities",
    "io.modelcontextprotocol/clientInfo",
    "io.modelcontextprotocol/logLevel",
    "traceparent",
    "tracestate",
    "baggage",
];

struct Validate<'s, 'de> {
    state: &'s mut State<'de>,
    role: Role,
}

pub(super) fn validate(text: &str, limits: &Limits) -> Result<Root, ParseError> {
    let mut state = State {
        limits: *limits,
        depth: 0,
        // Enough for the keys of a typical message's open objects.
        keys: Vec::with_capacity(16),
        failure: None,
        path: Vec::new(),
        root: None,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let result = Validate {
        state: &mut state,
        role: Role::Root,
    }
    .deserialize(&mut de);
    if let Err(err) = result {
        return Err(match state.failure.take() {
            Some(failure) => {
                state.path.reverse();
                let path = JsonPath(std::mem::take(&mut state.path));
                match failure {
                    Failure::Duplicate(key) => ParseError::DuplicateKey { key, path },
                    Failure::CaseDuplicate(key) => ParseError::CaseDuplicateKey { key, path },
                    Failure::CaseVariant { key, member, scope } => ParseError::CaseVariantMember {
                        key,
                        member,
                        scope,
                        path,
                    },
                    Failure::TooDeep => ParseError::TooDeep {
                        limit: limits.max_depth,
                        path,
                    },
                    Failure::NotObjectOrArray(found) => ParseError::NotObjectOrArray { found },
                    Failure::BatchTooLarge => ParseError::BatchTooLarge {
                        limit: limits.max_batch,
                    },
                    Failure::ElementNotObject(index, found) => {
                        ParseError::ElementNotObject { index, found }
                    }
                }
            }
            None => syntax_error(err),
        });
    }
    if let Err(err) = de.end() {
        return Err(ParseError::TrailingCharacters {
            line: err.line(),
            column: err.column(),
        });
    }
    state.root.ok_or(ParseError::NotObjectOrArray {
        found: JsonType::Null,
    })
}

impl<'de> Validate<'_, 'de> {
    fn fail<E: de::Error>(&mut self, failure: Failure) -> Result<(), E> {
        self.state.failure = Some(failure);
        Err(E::custom(""))
    }

    /// Called for every non-container value.
    fn scalar<E: de::Error>(&mut self, found: JsonType) -> Result<(), E> {
        match self.role {
            Role::Inner | Role::Params | Role::Meta | Role::Result => Ok(()),
            Role::Root => self.fail(Failure::NotObjectOrArray(found)),
            Role::Element(i) => self.fail(Failure::ElementNotObject(i, found)),
        }
    }

    fn enter<E: de::Error>(&mut self) -> Result<(), E> {
        self.state.depth += 1;
        if self.state.depth > self.state.limits.max_depth {
            return self.fail(Failure::TooDeep);
        }
        Ok(())
    }

    /// Records the segment of a child that failed, while unwinding.
    fn unwind(&mut self, segment: impl FnOnce() -> PathSegment) {
        if self.state.failure.is_some() {
            self.state.path.push(segment());
        }
    }
}

impl<'de> DeserializeSeed<'de> for Validate<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Validate<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(mut self, _: bool) -> Result<(), E> {
        self.scalar(JsonType::Bool)
    }

    fn visit_i64<E: de::Error>(mut self, _: i64) -> Result<(), E> {
        self.scalar(JsonType::Integer)
    }

    fn visit_u64<E: de::Error>(mut self, _: u64) -> Result<(), E> {
        self.scalar(JsonType::Integer)
    }

    fn visit_f64<E: de::Error>(mut self, _: f64) -> Result<(), E> {
        self.scalar(JsonType::Float)
    }

    // serde_json calls these only after unescaping the string, which is where
    // it rejects lone surrogates: that is why strings are visited, not skipped.
    fn visit_borrowed_str<E: de::Error>(mut self, _: &'de str) -> Result<(), E> {
        self.scalar(JsonType::String)
    }

    fn visit_str<E: de::Error>(mut self, _: &str) -> Result<(), E> {
        self.scalar(JsonType::String)
    }

    fn visit_unit<E: de::Error>(mut self) -> Result<(), E> {
        self.scalar(JsonType::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let batch = match self.role {
            Role::Root => true,
            Role::Element(i) => return self.fail(Failure::ElementNotObject(i, JsonType::Array)),
            Role::Inner | Role::Params | Role::Meta | Role::Result => false,
        };
        self.enter()?;
        let mut index = 0usize;
        loop {
            if batch && index >= self.state.limits.max_batch {
                // Fail before reading the element so an oversized batch costs
                // no more than `max_batch` elements of work.
                let next = seq.next_element::<de::IgnoredAny>()?;
                if next.is_some() {
                    return self.fail(Failure::BatchTooLarge);
                }
                break;
            }
            let role = if batch {
                Role::Element(index)
            } else {
                Role::Inner
            };
            let child = Validate {
                state: &mut *self.state,
                role,
            };
            match seq.next_element_seed(child) {
                Ok(Some(())) => index += 1,
                Ok(None) => break,
                Err(e) => {
                    self.unwind(|| PathSegment::Index(index));
                    return Err(e);
                }
            }
        }
        self.state.depth -= 1;
        if batch {
            self.state.root = Some(Root::Array(index));
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        if let Role::Root = self.role {
            self.state.root = Some(Root::Object);
        }
        self.enter()?;
        let mut keys = ObjectKeys::open(&self.state.keys, self.role.members());
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if let Err(refusal) = keys.admit(&mut self.state.keys, key.clone()) {
                let key = key.into_owned();
                return self.fail(match refusal {
                    KeyRefusal::Duplicate => Failure::Duplicate(key),
                    // Two spellings that differ in case.
                    KeyRefusal::CaseDuplicate => Failure::CaseDuplicate(key),
                    KeyRefusal::CaseVariant { member, scope } => {
                        Failure::CaseVariant { key, member, scope }
                    }
                });
            }
            let child = Validate {
                state: &mut *self.state,
                role: self.role.child(&key),
            };
            if let Err(e) = map.next_value_seed(child) {
                self.unwind(|| PathSegment::Key(key.into_owned()));
                return Err(e);
            }
        }
        keys.close(&mut self.state.keys);
        self.state.depth -= 1;
        Ok(())
    }
}

/// Deserializes an object key without allocating unless it had escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

// ---------------------------------------------------------------------------
// Pass 2: typed extraction
// ---------------------------------------------------------------------------
