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
//!
//! This file holds the entry points and the answer's single pass; the
//! model is in `message.rs`, the refusals in `parse_error.rs`, the
//! validating pass in `validator.rs` and the typed pass in `extract.rs`,
//! all reached through the names re-exported here.

use std::ops::Range;

use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;

use super::extract::parse_message;
use super::extract::{check_error_object, parse_id_text};
use super::message::str_text;
use super::parse_error::syntax_error;
use super::tape::{self, Tape};
use super::validator::{validate, Role, Root};

pub use super::extract::{find_invisible, name_field};
pub use super::message::{
    Envelope, Id, Kind, Limits, Message, ToolCall, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST,
    METHOD_NOT_FOUND, PARSE_ERROR,
};
pub use super::parse_error::{JsonPath, JsonType, ParseError, PathSegment};
pub(crate) use super::validator::{MESSAGE_MEMBERS, RESULT_MEMBERS};

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
