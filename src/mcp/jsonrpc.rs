//! PROVISIONAL stand-in with the agreed API; replaced by the wire module.
#![allow(missing_docs, dead_code)]
use std::ops::Range;

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;

pub const PARSE_ERROR: i32 = -32700;
pub const INVALID_REQUEST: i32 = -32600;
pub const METHOD_NOT_FOUND: i32 = -32601;
pub const INVALID_PARAMS: i32 = -32602;
pub const INTERNAL_ERROR: i32 = -32603;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_depth: usize,
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

#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(untagged)]
pub enum Id {
    Number(i64),
    String(String),
}
impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Id::Number(n) => write!(f, "{n}"),
            Id::String(s) => write!(f, "{s:?}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request,
    Notification,
    Response,
}

#[derive(Debug)]
pub struct Message {
    pub kind: Kind,
    pub id: Option<Id>,
    pub method: Option<String>,
    pub span: Range<usize>,
    pub params: Option<Box<RawValue>>,
    pub call: Option<ToolCall>,
    pub name: Option<String>,
    pub meta: Option<Box<RawValue>>,
    pub is_error: bool,
}
#[derive(Debug)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Option<Box<RawValue>>,
}
#[derive(Debug)]
pub struct Envelope {
    pub batch: bool,
    pub messages: Vec<Message>,
}

#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("parse error: {0}")]
    Syntax(String),
    #[error("invalid request: {0}")]
    Invalid(String),
}
impl ParseError {
    pub fn code(&self) -> i32 {
        match self {
            ParseError::Syntax(_) => PARSE_ERROR,
            ParseError::Invalid(_) => INVALID_REQUEST,
        }
    }
}

pub fn parse(body: &[u8], limits: &Limits) -> Result<Envelope, ParseError> {
    let _ = limits;
    let text = std::str::from_utf8(body).map_err(|e| ParseError::Syntax(e.to_string()))?;
    let raw: &RawValue =
        serde_json::from_str(text).map_err(|e| ParseError::Syntax(e.to_string()))?;
    let base = text.as_ptr() as usize;
    let mut out = Vec::new();
    let batch = raw.get().trim_start().starts_with('[');
    let elems: Vec<&RawValue> = if batch {
        serde_json::from_str(raw.get()).map_err(|e| ParseError::Invalid(e.to_string()))?
    } else {
        vec![raw]
    };
    if batch && elems.is_empty() {
        return Err(ParseError::Invalid("empty batch".into()));
    }
    for e in elems {
        let start = e.get().as_ptr() as usize - base;
        let span = start..start + e.get().len();
        let v: Value =
            serde_json::from_str(e.get()).map_err(|e| ParseError::Invalid(e.to_string()))?;
        let obj = v
            .as_object()
            .ok_or_else(|| ParseError::Invalid("not an object".into()))?;
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(ParseError::Invalid("\"jsonrpc\" must be \"2.0\"".into()));
        }
        let id = match obj.get("id") {
            None => None,
            Some(Value::String(s)) => Some(Id::String(s.clone())),
            Some(Value::Number(n)) => Some(Id::Number(
                n.as_i64()
                    .ok_or_else(|| ParseError::Invalid("bad id".into()))?,
            )),
            Some(_) => return Err(ParseError::Invalid("bad id".into())),
        };
        let method = obj.get("method").and_then(Value::as_str).map(str::to_owned);
        let kind = match (&method, &id) {
            (Some(_), Some(_)) => Kind::Request,
            (Some(_), None) => Kind::Notification,
            (None, Some(_)) => Kind::Response,
            (None, None) => return Err(ParseError::Invalid("neither method nor id".into())),
        };
        let params = obj
            .get("params")
            .map(|p| RawValue::from_string(p.to_string()))
            .transpose()
            .map_err(|e| ParseError::Invalid(e.to_string()))?;
        let meta = obj
            .get("params")
            .and_then(|p| p.get("_meta"))
            .map(|p| RawValue::from_string(p.to_string()))
            .transpose()
            .map_err(|e| ParseError::Invalid(e.to_string()))?;
        let call = if method.as_deref() == Some("tools/call") {
            let p = obj
                .get("params")
                .ok_or_else(|| ParseError::Invalid("no params".into()))?;
            let name = p
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ParseError::Invalid("no name".into()))?;
            Some(ToolCall {
                name: name.to_owned(),
                arguments: p
                    .get("arguments")
                    .map(|a| RawValue::from_string(a.to_string()))
                    .transpose()
                    .map_err(|e| ParseError::Invalid(e.to_string()))?,
            })
        } else {
            None
        };
        let name = obj
            .get("params")
            .and_then(|p| p.get("name").or_else(|| p.get("uri")))
            .and_then(Value::as_str)
            .map(str::to_owned);
        out.push(Message {
            kind,
            id,
            method,
            span,
            params,
            call,
            name,
            meta,
            is_error: obj.contains_key("error"),
        });
    }
    Ok(Envelope {
        batch,
        messages: out,
    })
}

pub fn error_body(id: Option<&Id>, code: i32, message: &str, data: Option<&Value>) -> Bytes {
    let mut err = serde_json::json!({"code": code, "message": message});
    if let Some(d) = data {
        err["data"] = d.clone();
    }
    let v = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": err});
    Bytes::from(v.to_string())
}

pub fn splice_batch<'a>(body: &[u8], spans: impl IntoIterator<Item = &'a Range<usize>>) -> Bytes {
    let mut out = Vec::with_capacity(body.len() + 2);
    out.push(b'[');
    for (i, s) in spans.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&body[s.clone()]);
    }
    out.push(b']');
    Bytes::from(out)
}
