//! Pass 2 of [`super::jsonrpc`]'s reading of a body: the typed pass that
//! pulls each message's envelope fields out as `&RawValue` slices of the
//! body ([`parse_message`]), checks them, and reads the name a method
//! names its target by ([`name_field`]), refusing names with invisible
//! characters ([`find_invisible`]).

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::message::{present, raw_str, str_text, Id, Kind, Message, ToolCall};
use super::parse_error::{syntax_error, JsonType, ParseError};

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
pub(super) fn naming(method: &str) -> Option<(&'static str, &'static str)> {
    NAMED_METHODS.iter().copied().find(|(m, _)| *m == method)
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

fn is_integer(raw: &RawValue) -> bool {
    JsonType::of(raw) == JsonType::Integer
}

/// One message of a validated body, read into the model: the envelope's
/// members checked ([`check_version`], [`method_of`], [`check_params`],
/// [`kind_of`]), then, for a method that names its target, the name and
/// what goes with it ([`read_target`]).
pub(super) fn parse_message(
    text: &str,
    span: Range<usize>,
    index: Option<usize>,
) -> Result<Message, ParseError> {
    let wire: Wire<'_> = serde_json::from_str(text).map_err(syntax_error)?;
    check_version(wire.jsonrpc, index)?;
    let id = match wire.id {
        None => None,
        Some(raw) => Some(parse_id(raw, index)?),
    };
    let method = method_of(wire.method, index)?;
    check_params(wire.params, index)?;

    let result = wire.result.map(|r| {
        let start = span.start + (r.get().as_ptr() as usize - text.as_ptr() as usize);
        start..start + r.get().len()
    });
    let (kind, is_error) = kind_of(
        method.is_some(),
        id.is_some(),
        wire.result,
        wire.error,
        index,
    )?;

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
        read_target(
            &mut message,
            canonical,
            field,
            wire.params,
            params_view.as_ref(),
            index,
        )?;
    }
    message.method = Some(method.into_owned());
    Ok(message)
}

/// `"jsonrpc"` is present and `"2.0"`.
fn check_version(jsonrpc: Option<&RawValue>, index: Option<usize>) -> Result<(), ParseError> {
    match jsonrpc {
        None => Err(ParseError::VersionMissing { index }),
        Some(v) if v.get() == "\"2.0\"" => Ok(()),
        Some(v) if raw_str(v).as_deref() == Some("2.0") => Ok(()),
        Some(_) => Err(ParseError::VersionInvalid { index }),
    }
}

/// The method, unescaped, when there is one; it must be a string.
fn method_of(
    method: Option<&RawValue>,
    index: Option<usize>,
) -> Result<Option<Cow<'_, str>>, ParseError> {
    let Some(raw) = method else {
        return Ok(None);
    };
    match raw_str(raw) {
        Some(m) => Ok(Some(m)),
        None => Err(ParseError::MethodNotString {
            index,
            found: JsonType::of(raw),
        }),
    }
}

/// `"params"`, when present, is an object or an array.
fn check_params(params: Option<&RawValue>, index: Option<usize>) -> Result<(), ParseError> {
    if let Some(params) = params {
        let found = JsonType::of(params);
        if !matches!(found, JsonType::Object | JsonType::Array) {
            return Err(ParseError::ParamsNotStructured { index, found });
        }
    }
    Ok(())
}

/// What the message is by its members, and whether it is an error
/// response (whose `error` object is checked).
fn kind_of(
    has_method: bool,
    has_id: bool,
    result: Option<&RawValue>,
    error: Option<&RawValue>,
    index: Option<usize>,
) -> Result<(Kind, bool), ParseError> {
    match (has_method, result, error) {
        (true, None, None) if has_id => Ok((Kind::Request, false)),
        (true, None, None) => Ok((Kind::Notification, false)),
        (true, _, _) => Err(ParseError::MethodWithResult { index }),
        (false, None, None) => Err(ParseError::NoMethodOrResult { index }),
        (false, Some(_), Some(_)) => Err(ParseError::ResultAndError { index }),
        (false, _, _) if !has_id => Err(ParseError::ResponseWithoutId { index }),
        (false, Some(_), None) => Ok((Kind::Response, false)),
        (false, None, Some(error)) => {
            check_error_object(error.get(), index)?;
            Ok((Kind::Response, true))
        }
    }
}

/// For a method that names its target (`canonical`, its name in `field`):
/// `params` must be an object with the name as a string, a tool's or
/// prompt's name free of invisible characters, a call's arguments an
/// object. Sets the message's name, request state and call.
fn read_target(
    message: &mut Message,
    canonical: &'static str,
    field: &'static str,
    params: Option<&RawValue>,
    view: Option<&ParamsView<'_>>,
    index: Option<usize>,
) -> Result<(), ParseError> {
    let Some(view) = view else {
        return Err(ParseError::ParamsNotObject {
            index,
            id: message.id.take(),
            method: canonical,
            found: params.map_or(JsonType::Null, JsonType::of),
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
            id: message.id.take(),
            method: canonical,
            field,
        });
    };
    if field == "name" {
        if let Some((position, character)) = find_invisible(&name) {
            return Err(ParseError::InvisibleCharacter {
                index,
                id: message.id.take(),
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
                    id: message.id.take(),
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
    Ok(())
}

fn parse_id(raw: &RawValue, index: Option<usize>) -> Result<Id, ParseError> {
    parse_id_text(raw.get(), index)
}

pub(super) fn parse_id_text(raw: &str, index: Option<usize>) -> Result<Id, ParseError> {
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

pub(super) fn check_error_object(raw: &str, index: Option<usize>) -> Result<(), ParseError> {
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
