//! Why a body was refused ([`ParseError`], with its JSON-RPC code), and the
//! words its messages are written with: the type of a JSON value
//! ([`JsonType`]) and where in the body a problem is ([`JsonPath`]).

use std::fmt;

use serde_json::value::RawValue;

use super::message::{Id, INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR};

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
    pub(super) fn of(raw: &RawValue) -> JsonType {
        JsonType::of_text(raw.get())
    }

    /// Classifies the text of a validated JSON value by its first bytes.
    pub(super) fn of_text(text: &str) -> JsonType {
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
    /// Arrays and objects nest deeper than [`Limits::max_depth`](super::message::Limits::max_depth).
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
    /// The batch has more elements than [`Limits::max_batch`](super::message::Limits::max_batch).
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
    /// A method that names its target (see [`name_field`](super::extract::name_field)) has params that
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

/// Maps a serde_json error to the precise variant. serde_json does not expose
/// its error codes, so surrogate errors are recognised by their (stable since
/// 1.0) wording; anything unrecognised stays a generic syntax error, which has
/// the same JSON-RPC code.
pub(super) fn syntax_error(err: serde_json::Error) -> ParseError {
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
