//! JSON-RPC 2.0 parsing of MCP POST bodies: the one place a request body is
//! read, so every decision downstream works on the same model.
//!
//! Invariants:
//! - A body is accepted only if it is UTF-8, strict JSON with no duplicate key
//!   in any object (keys compared after unescaping), no lone UTF-16 surrogate
//!   escape, no trailing bytes, and nesting within [`Limits::max_depth`]. A
//!   firewall and an upstream must never read different values from the same
//!   bytes, so anything two parsers could disagree on is rejected here.
//! - A batch is accepted only if every element is a valid message; otherwise
//!   the whole body is rejected, so no part of an invalid body reaches the
//!   upstream.
//! - [`Message::span`] is the exact byte range of the message in the body, so
//!   [`splice_batch`] can forward a subset of a batch byte-for-byte.
//!
//! Parsing runs two passes over borrowed data: a validating pass (a serde
//! visitor that builds nothing but a stack of the current object's keys), then
//! a typed pass that pulls the envelope fields out as `&RawValue` slices of the
//! body. Nothing is copied except the fields [`Message`] owns.
//!
//! Upstream answers ([`parse_upstream`]) are read in one pass instead: the
//! tape's reader ([`super::tape`]) checks the same rules and records where
//! the values of the first levels are, so responses, and the lists in them,
//! are read off the tape ([`Envelope::tape`], [`Message::node`]) without
//! walking their bytes again. Whatever it declines is read the two-pass way,
//! whose verdict and error stand.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use bytes::Bytes;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;

use super::tape::{self, Folded, KeyRefusal, ObjectKeys, Shape, Tape};

/// JSON-RPC "Parse error": the body is not valid (or not acceptable) JSON.
pub const PARSE_ERROR: i32 = -32700;
/// JSON-RPC "Invalid Request": valid JSON that is not a valid message.
pub const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC "Method not found".
pub const METHOD_NOT_FOUND: i32 = -32601;
/// JSON-RPC "Invalid params": a known method with malformed parameters.
pub const INVALID_PARAMS: i32 = -32602;
/// JSON-RPC "Internal error".
pub const INTERNAL_ERROR: i32 = -32603;

/// Resource limits applied while parsing a body.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Maximum nesting of arrays and objects (the top-level value counts as 1).
    /// serde_json refuses nesting beyond 128 on its own, so larger values
    /// behave like 127.
    pub max_depth: usize,
    /// Maximum number of messages in a batch array.
    pub max_batch: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 64,
            max_batch: 64,
        }
    }
}

/// A request id: MCP allows a string or an integer (never null for requests).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Id {
    /// An integer id (JSON numbers without fraction or exponent, in `i64`).
    Number(i64),
    /// A string id, unescaped.
    String(String),
}

impl fmt::Display for Id {
    /// Writes the JSON form (strings quoted), so `1` and `"1"` stay distinct in
    /// logs and audit records.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Number(n) => write!(f, "{n}"),
            Id::String(s) => {
                let json = serde_json::to_string(s).map_err(|_| fmt::Error)?;
                f.write_str(&json)
            }
        }
    }
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Id::Number(n) => serializer.serialize_i64(*n),
            Id::String(s) => serializer.serialize_str(s),
        }
    }
}

/// What a message is, by its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Has `method` and `id`: expects a response.
    Request,
    /// Has `method` and no `id`.
    Notification,
    /// Has `id` and exactly one of `result` / `error`.
    Response,
}

/// One validated JSON-RPC message.
#[derive(Debug)]
pub struct Message {
    /// Request, notification or response.
    pub kind: Kind,
    /// The id of a request or response; `None` for notifications.
    pub id: Option<Id>,
    /// The method of a request or notification, unescaped.
    pub method: Option<String>,
    /// Byte range of this message in the body (for splicing batches).
    pub span: Range<usize>,
    /// The raw `params` (an object or array), exactly as in the body.
    pub params: Option<Box<RawValue>>,
    /// Set when `method == "tools/call"`.
    pub call: Option<ToolCall>,
    /// What the `Mcp-Name` header mirrors (see [`name_field`]).
    pub name: Option<String>,
    /// The raw `params._meta`, when params is an object that has it.
    pub meta: Option<Box<RawValue>>,
    /// Responses: true when the message carries `error`.
    pub is_error: bool,
    /// Responses: byte range of the raw `result` in the body.
    pub result: Option<Range<usize>>,
    /// `params.requestState` of a request that names its target (a
    /// 2026-07-28 multi-round retry), unescaped, when it is a string.
    pub request_state: Option<String>,
    /// This message's value on its envelope's [`Envelope::tape`], when it
    /// was read off one.
    pub node: Option<tape::NodeId>,
}

impl Message {
    /// A `tools/call` request known only by its id and tool (for answers the
    /// firewall builds for a call it holds, after the body is gone).
    pub fn synthetic_call(id: Id, tool: &str) -> Message {
        Message {
            kind: Kind::Request,
            id: Some(id),
            method: Some("tools/call".to_owned()),
            span: 0..0,
            params: None,
            call: Some(ToolCall {
                name: tool.to_owned(),
                arguments: None,
            }),
            name: Some(tool.to_owned()),
            meta: None,
            is_error: false,
            result: None,
            request_state: None,
            node: None,
        }
    }

    /// The protocol version a 2026-07-28+ request carries in
    /// `params._meta["io.modelcontextprotocol/protocolVersion"]`, if it is a
    /// string. Parsed on demand: only the header check needs it.
    pub fn protocol_version(&self) -> Option<Cow<'_, str>> {
        #[derive(Deserialize)]
        struct Meta<'a> {
            #[serde(
                borrow,
                default,
                rename = "io.modelcontextprotocol/protocolVersion",
                deserialize_with = "present"
            )]
            version: Option<&'a RawValue>,
        }
        let meta = self.meta.as_deref()?;
        let parsed: Meta<'_> = serde_json::from_str(meta.get()).ok()?;
        raw_str(parsed.version?)
    }
}

/// The parts of a `tools/call` request the policy engine decides on.
#[derive(Debug)]
pub struct ToolCall {
    /// `params.name`, checked free of invisible and control characters.
    pub name: String,
    /// `params.arguments`, an object, exactly as in the body.
    pub arguments: Option<Box<RawValue>>,
}

/// A parsed POST body.
#[derive(Debug)]
pub struct Envelope {
    /// True when the body was a JSON array (even of one message).
    pub batch: bool,
    /// The messages in body order.
    pub messages: Vec<Message>,
    /// Where the values of the first levels are, for an answer read by the
    /// tape's single pass ([`parse_upstream`]).
    pub tape: Option<Tape>,
}

/// The type of a JSON value, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonType {
    /// `null`
    Null,
    /// `true` / `false`
    Bool,
    /// A number without fraction or exponent.
    Integer,
    /// A number with a fraction or exponent.
    Float,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl JsonType {
    /// Classifies a validated raw JSON value by its first bytes.
    fn of(raw: &RawValue) -> JsonType {
        JsonType::of_text(raw.get())
    }

    /// Classifies the text of a validated JSON value by its first bytes.
    fn of_text(text: &str) -> JsonType {
        match text.as_bytes().first() {
            Some(b'n') => JsonType::Null,
            Some(b't' | b'f') => JsonType::Bool,
            Some(b'"') => JsonType::String,
            Some(b'[') => JsonType::Array,
            Some(b'{') => JsonType::Object,
            _ if text.contains(['.', 'e', 'E']) => JsonType::Float,
            _ => JsonType::Integer,
        }
    }
}

impl fmt::Display for JsonType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JsonType::Null => "null",
            JsonType::Bool => "a boolean",
            JsonType::Integer => "an integer",
            JsonType::Float => "a non-integer number",
            JsonType::String => "a string",
            JsonType::Array => "an array",
            JsonType::Object => "an object",
        })
    }
}

/// One step of a [`JsonPath`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSegment {
    /// An object member, unescaped.
    Key(String),
    /// An array index.
    Index(usize),
}

/// Where in the body a problem is, displayed as `$.params["a b"][2]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JsonPath(pub Vec<PathSegment>);

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("$")?;
        for segment in &self.0 {
            match segment {
                PathSegment::Index(i) => write!(f, "[{i}]")?,
                PathSegment::Key(k) if is_identifier(k) => write!(f, ".{k}")?,
                PathSegment::Key(k) => write!(f, "[{}]", Quoted(k))?,
            }
        }
        Ok(())
    }
}

fn is_identifier(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Displays a string as a JSON string literal (quoted, escaped), so keys and
/// names with quotes or control characters cannot garble a message.
struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let json = serde_json::to_string(self.0).map_err(|_| fmt::Error)?;
        f.write_str(&json)
    }
}

/// Prefix naming the batch element a message error is about.
struct Element<'a>(&'a Option<usize>);

impl fmt::Display for Element<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(i) => write!(f, "batch element {i}: "),
            None => Ok(()),
        }
    }
}

/// Why a body was rejected. [`ParseError::code`] gives the JSON-RPC code;
/// `index` fields name the batch element (`None` for a single message).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The body is not UTF-8.
    #[error("body is not valid UTF-8 at byte offset {offset}")]
    InvalidUtf8 {
        /// Offset of the first invalid byte.
        offset: usize,
    },
    /// The body is not JSON.
    #[error("JSON syntax error: {source}")]
    Syntax {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// serde_json's description (includes the position).
        source: serde_json::Error,
    },
    /// Bytes other than whitespace follow the top-level value.
    #[error("trailing characters after the JSON value at line {line} column {column}")]
    TrailingCharacters {
        /// 1-based line of the first trailing byte.
        line: usize,
        /// 1-based column of the first trailing byte.
        column: usize,
    },
    /// A string contains a `\uD800`-`\uDFFF` escape not forming a valid pair.
    #[error("lone UTF-16 surrogate escape in a string at line {line} column {column}")]
    LoneSurrogate {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
    },
    /// An object has the same key twice (after unescaping).
    #[error("duplicate key {} at {path}", Quoted(.key))]
    DuplicateKey {
        /// The repeated key, unescaped.
        key: String,
        /// The object holding it.
        path: JsonPath,
    },
    /// An object has two keys that are equal when letter case is ignored:
    /// a decoder matching keys case-insensitively reads either one.
    #[error("key {} at {path} repeats another key of the same object when letter case is ignored", Quoted(.key))]
    CaseDuplicateKey {
        /// The second spelling, unescaped.
        key: String,
        /// The object holding it.
        path: JsonPath,
    },
    /// A member name differs from a JSON-RPC or MCP member only by letter
    /// case (`"Method"`, `"Params"`, `"NAME"`): the firewall reads one
    /// member, a case-insensitive decoder behind it would read the other.
    #[error("member {} at {path} differs from the {scope} member {} only by letter case", Quoted(.key), Quoted(.member))]
    CaseVariantMember {
        /// The key as sent.
        key: String,
        /// The member it imitates.
        member: &'static str,
        /// Which vocabulary (`JSON-RPC`, `MCP params`, `MCP _meta`).
        scope: &'static str,
        /// The object holding it.
        path: JsonPath,
    },
    /// Arrays and objects nest deeper than [`Limits::max_depth`].
    #[error("nesting deeper than {limit} at {path}")]
    TooDeep {
        /// The configured limit.
        limit: usize,
        /// The container that exceeded it.
        path: JsonPath,
    },
    /// The top-level value is neither an object nor an array.
    #[error("body must be a JSON-RPC object or a batch array, found {found}")]
    NotObjectOrArray {
        /// What the body was.
        found: JsonType,
    },
    /// The body is `[]`.
    #[error("batch array is empty")]
    EmptyBatch,
    /// The batch has more elements than [`Limits::max_batch`].
    #[error("batch has more than {limit} elements")]
    BatchTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// A batch element is not an object.
    #[error("batch element {index} must be an object, found {found}")]
    ElementNotObject {
        /// Position in the batch.
        index: usize,
        /// What it was.
        found: JsonType,
    },
    /// `"jsonrpc"` is absent.
    #[error("{}\"jsonrpc\" member is missing", Element(.index))]
    VersionMissing {
        /// Batch position.
        index: Option<usize>,
    },
    /// `"jsonrpc"` is present but not the string `"2.0"`.
    #[error("{}\"jsonrpc\" must be \"2.0\"", Element(.index))]
    VersionInvalid {
        /// Batch position.
        index: Option<usize>,
    },
    /// `"method"` is not a string.
    #[error("{}\"method\" must be a string, found {found}", Element(.index))]
    MethodNotString {
        /// Batch position.
        index: Option<usize>,
        /// What it was.
        found: JsonType,
    },
    /// `"id"` is not a string or an integer.
    #[error("{}\"id\" must be a string or an integer, found {found}", Element(.index))]
    IdInvalidType {
        /// Batch position.
        index: Option<usize>,
        /// What it was.
        found: JsonType,
    },
    /// `"id"` is an integer outside `i64`.
    #[error("{}\"id\" integer is out of the 64-bit signed range", Element(.index))]
    IdOutOfRange {
        /// Batch position.
        index: Option<usize>,
    },
    /// `"params"` is neither an object nor an array.
    #[error("{}\"params\" must be an object or an array, found {found}", Element(.index))]
    ParamsNotStructured {
        /// Batch position.
        index: Option<usize>,
        /// What it was.
        found: JsonType,
    },
    /// A message with `"method"` also carries `"result"` or `"error"`.
    #[error("{}a request or notification must not carry \"result\" or \"error\"", Element(.index))]
    MethodWithResult {
        /// Batch position.
        index: Option<usize>,
    },
    /// A message has neither `"method"` nor `"result"`/`"error"`.
    #[error("{}message has neither \"method\" nor \"result\"/\"error\"", Element(.index))]
    NoMethodOrResult {
        /// Batch position.
        index: Option<usize>,
    },
    /// A response carries both `"result"` and `"error"`.
    #[error("{}response carries both \"result\" and \"error\"", Element(.index))]
    ResultAndError {
        /// Batch position.
        index: Option<usize>,
    },
    /// A response has no `"id"`.
    #[error("{}response has no \"id\"", Element(.index))]
    ResponseWithoutId {
        /// Batch position.
        index: Option<usize>,
    },
    /// A response's `"error"` is not an object.
    #[error("{}\"error\" must be an object, found {found}", Element(.index))]
    ErrorNotObject {
        /// Batch position.
        index: Option<usize>,
        /// What it was.
        found: JsonType,
    },
    /// `"error.code"` is missing or not an integer.
    #[error("{}\"error.code\" must be an integer", Element(.index))]
    ErrorCodeInvalid {
        /// Batch position.
        index: Option<usize>,
    },
    /// `"error.message"` is missing or not a string.
    #[error("{}\"error.message\" must be a string", Element(.index))]
    ErrorMessageInvalid {
        /// Batch position.
        index: Option<usize>,
    },
    /// A method that names its target (see [`name_field`]) has params that
    /// are not an object.
    #[error("{}params of {method} must be an object, found {found}", Element(.index))]
    ParamsNotObject {
        /// Batch position.
        index: Option<usize>,
        /// The request id, for the error response.
        id: Option<Id>,
        /// The method.
        method: &'static str,
        /// What params was (`Null` when absent).
        found: JsonType,
    },
    /// The naming field (`name`, `uri`, `taskId`) is missing or not a string.
    #[error("{}params.{field} of {method} must be a string", Element(.index))]
    NameNotString {
        /// Batch position.
        index: Option<usize>,
        /// The request id, for the error response.
        id: Option<Id>,
        /// The method.
        method: &'static str,
        /// The params member.
        field: &'static str,
    },
    /// `tools/call` arguments are present but not an object.
    #[error("{}params.arguments of tools/call must be an object, found {found}", Element(.index))]
    ArgumentsNotObject {
        /// Batch position.
        index: Option<usize>,
        /// The request id, for the error response.
        id: Option<Id>,
        /// What it was.
        found: JsonType,
    },
    /// A tool or prompt name holds a control, format or otherwise invisible
    /// character that could make two different names look the same.
    #[error(
        "{}params.name of {method} contains invisible or control character U+{:04X} at character {position}",
        Element(.index), u32::from(*.character)
    )]
    InvisibleCharacter {
        /// Batch position.
        index: Option<usize>,
        /// The request id, for the error response.
        id: Option<Id>,
        /// `tools/call` or `prompts/get`.
        method: &'static str,
        /// The offending character.
        character: char,
        /// Its 0-based position in characters.
        position: usize,
    },
}

impl ParseError {
    /// The JSON-RPC error code for this rejection: -32700, -32600 or -32602.
    pub fn code(&self) -> i32 {
        use ParseError::*;
        match self {
            InvalidUtf8 { .. }
            | Syntax { .. }
            | TrailingCharacters { .. }
            | LoneSurrogate { .. }
            | DuplicateKey { .. }
            | CaseDuplicateKey { .. }
            | TooDeep { .. } => PARSE_ERROR,
            ParamsNotObject { .. }
            | NameNotString { .. }
            | ArgumentsNotObject { .. }
            | InvisibleCharacter { .. } => INVALID_PARAMS,
            _ => INVALID_REQUEST,
        }
    }

    /// The method whose params were refused, for the errors about a named
    /// method's params (a method the revision in use does not define is
    /// unknown there, whatever its params).
    pub fn method(&self) -> Option<&'static str> {
        match self {
            ParseError::ParamsNotObject { method, .. }
            | ParseError::NameNotString { method, .. }
            | ParseError::InvisibleCharacter { method, .. } => Some(method),
            ParseError::ArgumentsNotObject { .. } => Some("tools/call"),
            _ => None,
        }
    }

    /// The id of the rejected request when it was readable: only the
    /// invalid-params errors, where the message itself was well formed.
    pub fn id(&self) -> Option<&Id> {
        match self {
            ParseError::ParamsNotObject { id, .. }
            | ParseError::NameNotString { id, .. }
            | ParseError::ArgumentsNotObject { id, .. }
            | ParseError::InvisibleCharacter { id, .. } => id.as_ref(),
            _ => None,
        }
    }
}

/// Methods whose request names its target, and the `params` member holding
/// the name (documented on [`name_field`]).
const NAMED_METHODS: [(&str, &str); 8] = [
    ("tools/call", "name"),
    ("prompts/get", "name"),
    ("resources/read", "uri"),
    ("resources/subscribe", "uri"),
    ("resources/unsubscribe", "uri"),
    ("tasks/get", "taskId"),
    ("tasks/update", "taskId"),
    ("tasks/cancel", "taskId"),
];

/// The `params` member that `Mcp-Name` mirrors for `method`, if any.
///
/// Core (2026-07-28 transport table): `tools/call` and `prompts/get` use
/// `name`, `resources/read` uses `uri`. Also covered, as rmcp 3.11 mirrors
/// them into `Mcp-Name`: the legacy `resources/subscribe`/`unsubscribe`
/// (`uri`) and the Tasks extension's `tasks/get|update|cancel` (`taskId`).
/// For these methods `params` must be an object with that member as a string
/// (else -32602).
pub fn name_field(method: &str) -> Option<&'static str> {
    naming(method).map(|(_, field)| field)
}

/// The method as a `'static` string (for error variants) and its name field.
fn naming(method: &str) -> Option<(&'static str, &'static str)> {
    NAMED_METHODS.iter().copied().find(|(m, _)| *m == method)
}

/// Parses and validates a POST body.
///
/// Cost: one UTF-8 check, one validating pass, one typed pass over each
/// message, plus one pass over `params` when it is an object. Allocations: the
/// message vector, the owned fields of each [`Message`], and (batches only) a
/// vector of element slices.
pub fn parse(body: &[u8], limits: &Limits) -> Result<Envelope, ParseError> {
    let text = std::str::from_utf8(body).map_err(|e| ParseError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    let root = validate(text, limits)?;
    match root {
        Root::Object => {
            // The validator proved the body is one object with only JSON
            // whitespace around it, so its span is the trimmed body: no need
            // to scan it again as a RawValue.
            let trimmed = text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
            let start = trimmed.as_ptr() as usize - text.as_ptr() as usize;
            let message = parse_message(trimmed, start..start + trimmed.len(), None)?;
            Ok(Envelope {
                batch: false,
                messages: vec![message],
                tape: None,
            })
        }
        Root::Array(0) => Err(ParseError::EmptyBatch),
        Root::Array(_) => {
            let elements: Vec<&RawValue> = serde_json::from_str(text).map_err(syntax_error)?;
            let base = text.as_ptr() as usize;
            let mut messages = Vec::with_capacity(elements.len());
            for (index, element) in elements.into_iter().enumerate() {
                let raw = element.get();
                // `raw` is a subslice of `text`, so the pointer difference is
                // its byte offset.
                let start = raw.as_ptr() as usize - base;
                messages.push(parse_message(raw, start..start + raw.len(), Some(index))?);
            }
            Ok(Envelope {
                batch: true,
                messages,
                tape: None,
            })
        }
    }
}

/// Limits for upstream answers: their nesting and batch size are the
/// upstream's business; serde_json's own cap bounds the nesting.
const UPSTREAM_LIMITS: Limits = Limits {
    max_depth: 128,
    max_batch: 4096,
};

/// Parses a message from an upstream into the same model, with the same
/// validating pass as client bodies: the client behind the firewall reads
/// these bytes, and must not read a member the firewall did not (a
/// duplicate, or a case twin of `result`, `tools`, `inputRequests` that a
/// case-insensitive client would take instead of the filtered one).
pub fn parse_upstream(body: &[u8]) -> Result<Envelope, ParseError> {
    parse_upstream_known(body, None).map(|(envelope, _)| envelope)
}

/// [`parse_upstream`] of an answer that may hold a `tools/list` result:
/// the listed tools byte for byte the same as `known` ones (read strictly
/// before, in the same place) are not read again ([`tape::Known`]). With
/// the envelope come the tools to remember when they differ from `known`.
pub fn parse_upstream_known(
    body: &[u8],
    known: Option<&tape::Known>,
) -> Result<(Envelope, Option<tape::Known>), ParseError> {
    let text = std::str::from_utf8(body).map_err(|e| ParseError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    if let Some((tape, learned)) = answer_tape(text, known) {
        debug_assert!(
            validate(text, &UPSTREAM_LIMITS).is_ok(),
            "the tape accepted an answer the validator refuses: {text}"
        );
        return Ok((envelope_from_tape(text, tape)?, learned));
    }
    Ok((parse_upstream_serde(text)?, None))
}

/// The tape of an answer under the upstream limits, or `None` where the
/// tape's reader declines (then the validator decides).
fn answer_tape(text: &str, known: Option<&tape::Known>) -> Option<(Tape, Option<tape::Known>)> {
    tape::read_known(
        text,
        Role::Root,
        UPSTREAM_LIMITS.max_depth,
        UPSTREAM_LIMITS.max_batch,
        TAPE_DEPTH,
        known,
    )
}

/// [`parse_upstream`] the long way: the serde validator, then each message
/// parsed from its bytes (an answer the tape's reader declined: its error,
/// or a verdict on what the tape was unsure of).
fn parse_upstream_serde(text: &str) -> Result<Envelope, ParseError> {
    validate(text, &UPSTREAM_LIMITS)?;
    let trimmed = text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
    let base = text.as_ptr() as usize;
    if trimmed.starts_with('[') {
        let elements: Vec<&RawValue> = serde_json::from_str(trimmed).map_err(syntax_error)?;
        let mut messages = Vec::with_capacity(elements.len());
        for (index, element) in elements.into_iter().enumerate() {
            let raw = element.get();
            let start = raw.as_ptr() as usize - base;
            messages.push(parse_message(raw, start..start + raw.len(), Some(index))?);
        }
        return Ok(Envelope {
            batch: true,
            messages,
            tape: None,
        });
    }
    let start = trimmed.as_ptr() as usize - base;
    let message = parse_message(trimmed, start..start + trimmed.len(), None)?;
    Ok(Envelope {
        batch: false,
        messages: vec![message],
        tape: None,
    })
}

/// Levels of an answer kept on its tape: a batch, a message, its `result`,
/// a list in it, an item, the item's members and what is in those (a
/// tool's `annotations.title`).
const TAPE_DEPTH: usize = 7;

/// The messages of an answer the tape's reader accepted. Responses are read
/// off the tape; anything else (a request or notification from the
/// upstream, or a response the tape cannot vouch for) is parsed from its
/// bytes as before, which also yields the precise error.
fn envelope_from_tape(text: &str, tape: Tape) -> Result<Envelope, ParseError> {
    let root = tape.root().ok_or(ParseError::NotObjectOrArray {
        found: JsonType::Null,
    })?;
    let batch = tape.kind(root) == Some(tape::Kind::Array);
    let nodes: Vec<tape::NodeId> = if batch {
        tape.children(root)
            .map(Iterator::collect)
            .unwrap_or_default()
    } else {
        vec![root]
    };
    let mut messages = Vec::with_capacity(nodes.len());
    for (i, n) in nodes.into_iter().enumerate() {
        let index = batch.then_some(i);
        let message = match response_from_tape(text, &tape, n, index) {
            Some(m) => m,
            None => {
                let span = tape.span(n);
                parse_message(text.get(span.clone()).unwrap_or(""), span, index)?
            }
        };
        messages.push(message);
    }
    Ok(Envelope {
        batch,
        messages,
        tape: Some(tape),
    })
}

/// A well-formed response read off the tape: `"jsonrpc": "2.0"`, a valid
/// `id`, exactly one of `result` and a valid `error`, no `method` or
/// `params`. `None` for anything else ([`parse_message`] decides it).
fn response_from_tape(
    text: &str,
    tape: &Tape,
    n: tape::NodeId,
    index: Option<usize>,
) -> Option<Message> {
    let (mut jsonrpc, mut id, mut result, mut error) = (None, None, None, None);
    for c in tape.children(n)? {
        match tape.key(text, c)?.as_ref() {
            "jsonrpc" => jsonrpc = Some(c),
            "id" => id = Some(c),
            "result" => result = Some(c),
            "error" => error = Some(c),
            "method" | "params" => return None,
            _ => {}
        }
    }
    let version = tape.text(text, jsonrpc?);
    if version != "\"2.0\"" && str_text(version).as_deref() != Some("2.0") {
        return None;
    }
    let id = parse_id_text(tape.text(text, id?), index).ok()?;
    let (is_error, result) = match (result, error) {
        (Some(r), None) => (false, Some(r)),
        (None, Some(e)) => {
            check_error_object(tape.text(text, e), index).ok()?;
            (true, None)
        }
        _ => return None,
    };
    Some(Message {
        kind: Kind::Response,
        id: Some(id),
        method: None,
        span: tape.span(n),
        params: None,
        call: None,
        name: None,
        meta: None,
        is_error,
        result: result.map(|r| tape.span(r)),
        request_state: None,
        node: Some(n),
    })
}

/// A complete JSON-RPC error response body (single object) for `id` (null when None).
pub fn error_body(
    id: Option<&Id>,
    code: i32,
    message: &str,
    data: Option<&serde_json::Value>,
) -> Bytes {
    #[derive(Serialize)]
    struct Body<'a> {
        jsonrpc: &'static str,
        id: Option<&'a Id>,
        error: ErrorObject<'a>,
    }
    #[derive(Serialize)]
    struct ErrorObject<'a> {
        code: i32,
        message: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<&'a serde_json::Value>,
    }
    let body = Body {
        jsonrpc: "2.0",
        id,
        error: ErrorObject {
            code,
            message,
            data,
        },
    };
    let mut out = Vec::with_capacity(64 + message.len());
    // Serializing these types into a Vec cannot fail: every key is a string
    // and a Value holds no non-finite float.
    if serde_json::to_writer(&mut out, &body).is_err() {
        out.clear();
        out.extend_from_slice(
            br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal error"}}"#,
        );
    }
    Bytes::from(out)
}

/// `message` (one JSON-RPC message object, as validated by [`parse`]) with
/// `params.<key>` set to the raw JSON `value`, or removed when `value` is
/// `None`. Members keep their bytes; their order may change. `None` when
/// `message` has no object `params`.
pub fn with_param(message: &str, key: &str, value: Option<&str>) -> Option<String> {
    use std::collections::BTreeMap;
    let top: BTreeMap<&str, &RawValue> = serde_json::from_str(message).ok()?;
    let params: BTreeMap<&str, &RawValue> = serde_json::from_str(top.get("params")?.get()).ok()?;
    let mut out = String::with_capacity(message.len() + value.map_or(0, str::len));
    out.push('{');
    let mut first = true;
    let mut put = |out: &mut String, k: &str, v: &str| {
        if !std::mem::take(&mut first) {
            out.push(',');
        }
        // Keys of a validated body are valid JSON strings when re-quoted.
        out.push_str(&serde_json::to_string(k).unwrap_or_default());
        out.push(':');
        out.push_str(v);
    };
    for (k, v) in &top {
        if *k != "params" {
            put(&mut out, k, v.get());
            continue;
        }
        let mut p = String::with_capacity(v.get().len());
        p.push('{');
        let mut pfirst = true;
        let mut pput = |p: &mut String, k: &str, v: &str| {
            if !std::mem::take(&mut pfirst) {
                p.push(',');
            }
            p.push_str(&serde_json::to_string(k).unwrap_or_default());
            p.push(':');
            p.push_str(v);
        };
        for (pk, pv) in &params {
            if *pk != key {
                pput(&mut p, pk, pv.get());
            }
        }
        if let Some(value) = value {
            pput(&mut p, key, value);
        }
        p.push('}');
        put(&mut out, k, &p);
    }
    out.push('}');
    Some(out)
}

/// `[` + the raw bytes of the given spans of `body` joined by `,` + `]`:
/// forwards a batch's allowed elements byte-for-byte.
///
/// Spans must come from [`parse`] of the same body; out-of-range spans are
/// skipped rather than panicking.
pub fn splice_batch<'a>(body: &[u8], spans: impl IntoIterator<Item = &'a Range<usize>>) -> Bytes {
    let mut out = Vec::with_capacity(body.len() + 2);
    out.push(b'[');
    let mut first = true;
    for span in spans {
        let Some(bytes) = body.get(span.clone()) else {
            continue;
        };
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(bytes);
    }
    out.push(b']');
    Bytes::from(out)
}

// ---------------------------------------------------------------------------
// Pass 1: validation
// ---------------------------------------------------------------------------

/// The shape of the top-level value, as far as the typed pass needs it.
enum Root {
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
enum Role {
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
const PARAMS_MEMBERS: &[&str] = &[
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
const META_MEMBERS: &[&str] = &[
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

fn validate(text: &str, limits: &Limits) -> Result<Root, ParseError> {
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

/// Maps a serde_json error to the precise variant. serde_json does not expose
/// its error codes, so surrogate errors are recognised by their (stable since
/// 1.0) wording; anything unrecognised stays a generic syntax error, which has
/// the same JSON-RPC code.
fn syntax_error(err: serde_json::Error) -> ParseError {
    let (line, column) = (err.line(), err.column());
    let text = err.to_string();
    if text.starts_with("lone leading surrogate")
        || text.starts_with("unexpected end of hex escape")
    {
        ParseError::LoneSurrogate { line, column }
    } else {
        ParseError::Syntax {
            line,
            column,
            source: err,
        }
    }
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

/// Deserializes a member as present even when it is `null`: `Option<&RawValue>`
/// alone would turn `"id": null` into "no id" and a request into a notification.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ParamsView<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    name: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    uri: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "taskId", deserialize_with = "present")]
    task_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "_meta", deserialize_with = "present")]
    meta: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "requestState", deserialize_with = "present")]
    request_state: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ErrorView<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    code: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    message: Option<&'a RawValue>,
}

/// The unescaped value of a raw JSON string, borrowed when it has no escapes.
fn raw_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    str_text(raw.get())
}

/// The unescaped value of the text of a JSON string, borrowed when it has
/// no escapes.
fn str_text(text: &str) -> Option<Cow<'_, str>> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(text).ok().map(Cow::Owned)
}

fn is_integer(raw: &RawValue) -> bool {
    JsonType::of(raw) == JsonType::Integer
}

fn parse_message(
    text: &str,
    span: Range<usize>,
    index: Option<usize>,
) -> Result<Message, ParseError> {
    let wire: Wire<'_> = serde_json::from_str(text).map_err(syntax_error)?;

    match wire.jsonrpc {
        None => return Err(ParseError::VersionMissing { index }),
        Some(v) if v.get() == "\"2.0\"" => {}
        Some(v) if raw_str(v).as_deref() == Some("2.0") => {}
        Some(_) => return Err(ParseError::VersionInvalid { index }),
    }

    let id = match wire.id {
        None => None,
        Some(raw) => Some(parse_id(raw, index)?),
    };

    let method = match wire.method {
        None => None,
        Some(raw) => match raw_str(raw) {
            Some(m) => Some(m),
            None => {
                return Err(ParseError::MethodNotString {
                    index,
                    found: JsonType::of(raw),
                })
            }
        },
    };

    if let Some(params) = wire.params {
        let found = JsonType::of(params);
        if !matches!(found, JsonType::Object | JsonType::Array) {
            return Err(ParseError::ParamsNotStructured { index, found });
        }
    }

    let result = wire.result.map(|r| {
        let start = span.start + (r.get().as_ptr() as usize - text.as_ptr() as usize);
        start..start + r.get().len()
    });
    let (kind, is_error) = match (&method, wire.result, wire.error) {
        (Some(_), None, None) if id.is_some() => (Kind::Request, false),
        (Some(_), None, None) => (Kind::Notification, false),
        (Some(_), _, _) => return Err(ParseError::MethodWithResult { index }),
        (None, None, None) => return Err(ParseError::NoMethodOrResult { index }),
        (None, Some(_), Some(_)) => return Err(ParseError::ResultAndError { index }),
        (None, _, _) if id.is_none() => return Err(ParseError::ResponseWithoutId { index }),
        (None, Some(_), None) => (Kind::Response, false),
        (None, None, Some(error)) => {
            check_error_object(error.get(), index)?;
            (Kind::Response, true)
        }
    };

    let mut message = Message {
        kind,
        id,
        method: None,
        span,
        params: wire.params.map(RawValue::to_owned),
        call: None,
        name: None,
        meta: None,
        is_error,
        result,
        request_state: None,
        node: None,
    };
    let Some(method) = method else {
        return Ok(message);
    };

    let params_view = match wire.params {
        Some(p) if JsonType::of(p) == JsonType::Object => {
            Some(serde_json::from_str::<ParamsView<'_>>(p.get()).map_err(syntax_error)?)
        }
        _ => None,
    };
    if let Some(view) = &params_view {
        message.meta = view.meta.map(RawValue::to_owned);
    }

    if let Some((canonical, field)) = naming(&method) {
        let Some(view) = &params_view else {
            return Err(ParseError::ParamsNotObject {
                index,
                id: message.id,
                method: canonical,
                found: wire.params.map_or(JsonType::Null, JsonType::of),
            });
        };
        let raw = match field {
            "name" => view.name,
            "uri" => view.uri,
            _ => view.task_id,
        };
        let Some(name) = raw.and_then(raw_str) else {
            return Err(ParseError::NameNotString {
                index,
                id: message.id,
                method: canonical,
                field,
            });
        };
        if field == "name" {
            if let Some((position, character)) = find_invisible(&name) {
                return Err(ParseError::InvisibleCharacter {
                    index,
                    id: message.id,
                    method: canonical,
                    character,
                    position,
                });
            }
        }
        let name = name.into_owned();
        message.request_state = view.request_state.and_then(raw_str).map(Cow::into_owned);
        if canonical == "tools/call" {
            let arguments = match view.arguments {
                None => None,
                Some(a) if JsonType::of(a) == JsonType::Object => Some(a.to_owned()),
                Some(a) => {
                    return Err(ParseError::ArgumentsNotObject {
                        index,
                        id: message.id,
                        found: JsonType::of(a),
                    })
                }
            };
            message.call = Some(ToolCall {
                name: name.clone(),
                arguments,
            });
        }
        message.name = Some(name);
    }
    message.method = Some(method.into_owned());
    Ok(message)
}

fn parse_id(raw: &RawValue, index: Option<usize>) -> Result<Id, ParseError> {
    parse_id_text(raw.get(), index)
}

fn parse_id_text(raw: &str, index: Option<usize>) -> Result<Id, ParseError> {
    match JsonType::of_text(raw) {
        JsonType::String => {
            str_text(raw)
                .map(|s| Id::String(s.into_owned()))
                .ok_or(ParseError::IdInvalidType {
                    index,
                    found: JsonType::String,
                })
        }
        JsonType::Integer => raw
            .parse::<i64>()
            .map(Id::Number)
            .map_err(|_| ParseError::IdOutOfRange { index }),
        found => Err(ParseError::IdInvalidType { index, found }),
    }
}

fn check_error_object(raw: &str, index: Option<usize>) -> Result<(), ParseError> {
    let found = JsonType::of_text(raw);
    if found != JsonType::Object {
        return Err(ParseError::ErrorNotObject { index, found });
    }
    let view: ErrorView<'_> = serde_json::from_str(raw).map_err(syntax_error)?;
    match view.code {
        Some(code) if is_integer(code) && code.get().parse::<i64>().is_ok() => {}
        _ => return Err(ParseError::ErrorCodeInvalid { index }),
    }
    match view.message {
        Some(m) if JsonType::of(m) == JsonType::String => Ok(()),
        _ => Err(ParseError::ErrorMessageInvalid { index }),
    }
}

/// The first character of `name` that must not appear in a tool or prompt
/// name, with its character position.
///
/// Rejected: C0/C1 controls, every Unicode format character (Cf), all
/// Default_Ignorable_Code_Point characters (zero-width, joiners, bidi
/// controls, variation selectors, Hangul fillers, tags), line and paragraph
/// separators, non-ASCII spaces, the braille blank, and noncharacters. These
/// render as nothing or as a plain space, so they let two distinct names look
/// identical to a human approving a call.
pub fn find_invisible(name: &str) -> Option<(usize, char)> {
    // Fast path: printable ASCII is always fine (the common case: the spec
    // recommends [A-Za-z0-9_.-] names).
    if name.bytes().all(|b| (0x20..0x7F).contains(&b)) {
        return None;
    }
    name.chars().enumerate().find(|(_, c)| is_invisible(*c))
}

fn is_invisible(c: char) -> bool {
    let cp = u32::from(c);
    matches!(cp,
        // Controls (Cc).
        0x0000..=0x001F | 0x007F..=0x009F
        // Non-ASCII spaces (Zs), line/paragraph separators (Zl, Zp).
        | 0x00A0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000
        // Format characters (Cf) and other default-ignorable code points.
        | 0x00AD | 0x034F | 0x061C | 0x0600..=0x0605 | 0x06DD | 0x070F | 0x0890..=0x0891
        | 0x08E2 | 0x115F..=0x1160 | 0x17B4..=0x17B5 | 0x180B..=0x180F
        | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x206F | 0x2800 | 0x3164
        | 0xFE00..=0xFE0F | 0xFEFF | 0xFFA0 | 0xFFF0..=0xFFFB
        | 0x110BD | 0x110CD | 0x13430..=0x1343F | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A
        | 0xE0000..=0xE0FFF
        // Noncharacters.
        | 0xFDD0..=0xFDEF
    ) || (cp & 0xFFFE) == 0xFFFE
}

#[cfg(test)]
#[path = "jsonrpc_tests.rs"]
mod tests;

#[cfg(any(test, fuzzing))]
#[path = "differential.rs"]
pub mod differential;

/// Each JSON reader alone, for the bench that compares them
/// (`benches/wire.rs`, group `readers`): what merging two of them would
/// cost or save. Not part of the firewall's API.
#[doc(hidden)]
pub mod readers {
    use super::{tape, validate, Envelope, ParseError, Role, TAPE_DEPTH, UPSTREAM_LIMITS};

    /// An answer the long way: the serde validator, then the typed pass.
    ///
    /// # Errors
    /// As [`super::parse_upstream`].
    pub fn answer_by_validator(body: &[u8]) -> Result<Envelope, ParseError> {
        let text = std::str::from_utf8(body).map_err(|e| ParseError::InvalidUtf8 {
            offset: e.valid_up_to(),
        })?;
        super::parse_upstream_serde(text)
    }

    /// Whether the tape accepts `body` as a request (client limits): what
    /// serving requests from the tape would start with.
    pub fn request_on_tape(body: &[u8]) -> bool {
        let limits = super::Limits::default();
        std::str::from_utf8(body).is_ok_and(|text| {
            tape::read_known(
                text,
                Role::Root,
                limits.max_depth,
                limits.max_batch,
                TAPE_DEPTH,
                None,
            )
            .is_some()
        })
    }

    /// Whether the serde validator alone accepts `body` as a request.
    pub fn request_validated(body: &[u8]) -> bool {
        std::str::from_utf8(body)
            .is_ok_and(|text| validate(text, &super::Limits::default()).is_ok())
    }

    /// Whether the tape accepts `body` as an answer.
    pub fn answer_on_tape(body: &[u8]) -> bool {
        std::str::from_utf8(body).is_ok_and(|text| super::answer_tape(text, None).is_some())
    }

    /// Whether the serde validator alone accepts `body` as an answer.
    pub fn answer_validated(body: &[u8]) -> bool {
        std::str::from_utf8(body).is_ok_and(|text| validate(text, &UPSTREAM_LIMITS).is_ok())
    }
}
