//! The model of a JSON-RPC body as [`super::jsonrpc`] reads it: the error
//! codes, the parsing limits, a message ([`Message`]) with its id, kind and
//! the fields decisions need, and the envelope of a body ([`Envelope`]).
//! Also the small readers of raw JSON strings both passes share.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::Deserializer;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;

use super::tape::{self, Tape};

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
    /// What the `Mcp-Name` header mirrors (see [`name_field`](super::jsonrpc::name_field)).
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
    /// tape's single pass ([`parse_upstream`](super::jsonrpc::parse_upstream)).
    pub tape: Option<Tape>,
}

/// Deserializes a member as present even when it is `null`: `Option<&RawValue>`
/// alone would turn `"id": null` into "no id" and a request into a notification.
pub(super) fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// The unescaped value of a raw JSON string, borrowed when it has no escapes.
pub(super) fn raw_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    str_text(raw.get())
}

/// The unescaped value of the text of a JSON string, borrowed when it has
/// no escapes.
pub(super) fn str_text(text: &str) -> Option<Cow<'_, str>> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(text).ok().map(Cow::Owned)
}
