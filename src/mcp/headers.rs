//! The request headers of the 2026-07-28 revision (SEP-2243) that mirror body
//! fields: `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` and
//! `Mcp-Param-{Name}`, checked against the parsed body.
//!
//! The firewall decides on the body only. This module makes sure no header
//! can tell an upstream (or a load balancer in front of it) something the body
//! does not say. The rules, from the 2026-07-28 Streamable HTTP transport:
//!
//! - **Era.** The protocol version is the `MCP-Protocol-Version` header. When
//!   the body carries `params._meta["io.modelcontextprotocol/protocolVersion"]`
//!   the header is required and must equal it. A header of 2026-07-28 or later
//!   (or any value not of the `YYYY-MM-DD` form) makes the mirrored headers
//!   required; older versions, or no header and no body version (a pre-
//!   2025-06-18 client, treated as 2025-03-26), make them optional.
//! - **Present headers always match.** In every era, a mirrored header that
//!   is present must equal its body value; a header with no body counterpart
//!   (e.g. `Mcp-Name` on `tools/list`, `Mcp-Method` on a response,
//!   `Mcp-Param-*` on anything but `tools/call`) is rejected. Each header may
//!   appear once.
//! - **Required headers.** For 2026-07-28+ requests: `Mcp-Method` always;
//!   `Mcp-Name` for `tools/call` and `prompts/get` (`params.name`) and
//!   `resources/read` (`params.uri`); `Mcp-Param-{Name}` for every
//!   `x-mcp-header` argument whose body value is a non-null primitive. The
//!   spec defines no header requirement for notification POSTs, so none is
//!   imposed there (present ones are still checked).
//! - **Values.** Header names are case-insensitive, values case-sensitive.
//!   `Mcp-Name` and `Mcp-Param-*` may use the `=?base64?{UTF-8 Base64}?=`
//!   form (markers lowercase, standard alphabet with padding) and are decoded
//!   before comparing. Other values must be visible ASCII, space or tab.
//!   Booleans mirror as `true`/`false`; integers compare numerically (`42.0`
//!   matches `42`).
//! - **Batches.** Only 2025-03-26 had batches, and it predates these headers:
//!   [`check_batch`] rejects any mirrored header on a batch body.
//! - **Unknown parameters.** A `Mcp-Param-*` header on `tools/call` that the
//!   tool's schema (as last seen) does not define is forwarded untouched, as
//!   the spec requires of intermediaries: the upstream, which knows its
//!   current schema, validates it.
//!
//! A rejection is HTTP 400 with JSON-RPC error -32020 (`HeaderMismatch`);
//! see [`HeaderMismatch::code`] and [`HeaderMismatch::http_status`].

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;
use http::{HeaderMap, HeaderName, StatusCode};
use serde_json::Value;

use crate::mcp::jsonrpc::{Kind, Message};
use crate::mcp::numbers::Decimal;

/// `MCP-Protocol-Version`.
pub const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// `Mcp-Method`, mirroring `method`.
pub const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
/// `Mcp-Name`, mirroring `params.name` / `params.uri`.
pub const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");
/// Prefix of the `Mcp-Param-{Name}` headers, lowercase as [`HeaderMap`] stores names.
pub const MCP_PARAM_PREFIX: &str = "mcp-param-";
/// The first protocol version whose requests must carry the mirrored headers.
pub const HEADERS_REQUIRED_SINCE: &str = "2026-07-28";
/// JSON-RPC error code `HeaderMismatch` (2026-07-28).
pub const HEADER_MISMATCH: i32 = -32020;

const BASE64_PREFIX: &str = "=?base64?";
const BASE64_SUFFIX: &str = "?=";

/// Which mirrored header a problem is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    /// `MCP-Protocol-Version`
    ProtocolVersion,
    /// `Mcp-Method`
    Method,
    /// `Mcp-Name`
    Name,
    /// `Mcp-Param-{0}`, with the name as annotated in the schema or, for an
    /// unexpected header, as received (lowercase).
    Param(String),
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Header::ProtocolVersion => f.write_str("MCP-Protocol-Version"),
            Header::Method => f.write_str("Mcp-Method"),
            Header::Name => f.write_str("Mcp-Name"),
            Header::Param(name) => write!(f, "Mcp-Param-{name}"),
        }
    }
}

/// Why a request's headers disagree with its body. Header values are shown
/// decoded (Base64 unwrapped) when decoding succeeded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderMismatch {
    /// A header the request's version requires is absent.
    #[error("Header mismatch: required {header} header is missing (body value '{body_value}')")]
    Missing {
        /// The missing header.
        header: Header,
        /// What it should have said.
        body_value: String,
    },
    /// Header and body say different things.
    #[error("Header mismatch: {header} header value '{header_value}' does not match body value '{body_value}'")]
    Mismatch {
        /// The header.
        header: Header,
        /// Its (decoded) value.
        header_value: String,
        /// The body's value, as the header would mirror it.
        body_value: String,
    },
    /// A header is present but the body has no value for it to mirror.
    #[error(
        "Header mismatch: {header} header value '{header_value}' has no counterpart in the body"
    )]
    Unexpected {
        /// The header.
        header: Header,
        /// Its (decoded) value.
        header_value: String,
    },
    /// A mirrored header appears more than once.
    #[error("Header mismatch: {header} header appears more than once")]
    Repeated {
        /// The header.
        header: Header,
    },
    /// A value holds bytes outside visible ASCII, space and tab.
    #[error("Header mismatch: {header} header value '{header_value}' contains invalid characters")]
    InvalidCharacters {
        /// The header.
        header: Header,
        /// The value, lossily decoded.
        header_value: String,
    },
    /// A `=?base64?...?=` value is not Base64 of UTF-8 text.
    #[error(
        "Header mismatch: {header} header value '{header_value}' is not valid Base64-encoded UTF-8"
    )]
    InvalidBase64 {
        /// The header.
        header: Header,
        /// The raw value.
        header_value: String,
    },
    /// A mirrored header on a batch body, which has no single value to mirror.
    #[error("Header mismatch: {header} header value '{header_value}' cannot mirror a batch body")]
    OnBatch {
        /// The header.
        header: Header,
        /// Its raw value.
        header_value: String,
    },
    /// A 2026-07-28+ request without the required body protocol version.
    #[error("request declares MCP-Protocol-Version '{header_value}' but params._meta lacks \"io.modelcontextprotocol/protocolVersion\"")]
    BodyVersionMissing {
        /// The header's value.
        header_value: String,
    },
}

impl HeaderMismatch {
    /// The JSON-RPC error code: -32020 (`HeaderMismatch`), except -32602 for
    /// a request missing its required `_meta` protocol version, which the
    /// spec classes as malformed params.
    pub fn code(&self) -> i32 {
        match self {
            HeaderMismatch::BodyVersionMissing { .. } => crate::mcp::jsonrpc::INVALID_PARAMS,
            _ => HEADER_MISMATCH,
        }
    }

    /// The HTTP status the spec prescribes for every header validation
    /// failure: 400 Bad Request.
    pub fn http_status(&self) -> StatusCode {
        StatusCode::BAD_REQUEST
    }

    /// The header the problem is about.
    pub fn header(&self) -> &Header {
        match self {
            HeaderMismatch::Missing { header, .. }
            | HeaderMismatch::Mismatch { header, .. }
            | HeaderMismatch::Unexpected { header, .. }
            | HeaderMismatch::Repeated { header }
            | HeaderMismatch::InvalidCharacters { header, .. }
            | HeaderMismatch::InvalidBase64 { header, .. }
            | HeaderMismatch::OnBatch { header, .. } => header,
            HeaderMismatch::BodyVersionMissing { .. } => &Header::ProtocolVersion,
        }
    }
}

/// Why a tool's `x-mcp-header` annotations make the tool invalid. Clients on
/// Streamable HTTP must drop such a tool from `tools/list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnnotationViolation {
    /// The schema root itself is annotated.
    OnRoot,
    /// An annotation sits under a keyword other than a `properties` chain
    /// (`items`, `oneOf`, `$defs`, ...).
    OffChain {
        /// The keyword it was found under.
        keyword: String,
    },
    /// The annotation is not a string.
    NotAString {
        /// Dotted property path.
        property: String,
    },
    /// The annotation is empty or not an RFC 9110 token.
    NotAToken {
        /// Dotted property path.
        property: String,
        /// The annotation.
        header: String,
    },
    /// Two annotations name the same header, ignoring case.
    Duplicate {
        /// Dotted property path of the second one.
        property: String,
        /// The annotation.
        header: String,
    },
    /// The property's `type` is not `string`, `integer` or `boolean`.
    NotPrimitive {
        /// Dotted property path.
        property: String,
    },
}

impl fmt::Display for AnnotationViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnnotationViolation::OnRoot => f.write_str("x-mcp-header annotates the schema root"),
            AnnotationViolation::OffChain { keyword } => {
                write!(f, "x-mcp-header under `{keyword}` is not statically reachable through `properties`")
            }
            AnnotationViolation::NotAString { property } => {
                write!(f, "property `{property}`: x-mcp-header must be a string")
            }
            AnnotationViolation::NotAToken { property, header } => {
                write!(
                    f,
                    "property `{property}`: x-mcp-header `{header}` is not a non-empty HTTP token"
                )
            }
            AnnotationViolation::Duplicate { property, header } => {
                write!(f, "property `{property}`: x-mcp-header `{header}` repeats another (case-insensitive)")
            }
            AnnotationViolation::NotPrimitive { property } => write!(
                f,
                "property `{property}`: x-mcp-header requires type string, integer or boolean"
            ),
        }
    }
}

/// One `x-mcp-header` annotation.
#[derive(Debug, Clone)]
struct ParamHeader {
    /// Property names from the arguments root to the annotated property.
    path: Box<[String]>,
    /// The annotation as written (for messages).
    name: String,
    /// `mcp-param-{name}`, lowercase.
    header: HeaderName,
}

/// The x-mcp-header annotations of one tool (property path -> header name),
/// built from its inputSchema.
#[derive(Debug, Clone, Default)]
pub struct ParamHeaders {
    params: Vec<ParamHeader>,
    violation: Option<AnnotationViolation>,
}

impl ParamHeaders {
    /// Collects the well-formed annotations found along `properties` chains
    /// and records the first rule violation, if any (see
    /// [`ParamHeaders::violation`]).
    pub fn from_input_schema(schema: &Value) -> ParamHeaders {
        let mut out = ParamHeaders::default();
        let Some(root) = schema.as_object() else {
            return out;
        };
        if root.contains_key("x-mcp-header") {
            out.violate(AnnotationViolation::OnRoot);
        }
        out.scan_keywords(root);
        out.collect(root.get("properties"), &mut Vec::new());
        out
    }

    /// The first reason the annotations make the tool invalid, if any.
    pub fn violation(&self) -> Option<&AnnotationViolation> {
        self.violation.as_ref()
    }

    /// True when the tool mirrors no argument into a header.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// The annotations as (property path, header name as annotated).
    pub fn iter(&self) -> impl Iterator<Item = (&[String], &str)> {
        self.params.iter().map(|p| (&*p.path, p.name.as_str()))
    }

    fn violate(&mut self, violation: AnnotationViolation) {
        if self.violation.is_none() {
            self.violation = Some(violation);
        }
    }

    fn collect<'a>(&mut self, properties: Option<&'a Value>, path: &mut Vec<&'a str>) {
        let Some(properties) = properties.and_then(Value::as_object) else {
            return;
        };
        for (name, schema) in properties {
            let Some(schema) = schema.as_object() else {
                continue;
            };
            path.push(name);
            if let Some(annotation) = schema.get("x-mcp-header") {
                self.annotation(annotation, schema, path);
            }
            self.scan_keywords(schema);
            self.collect(schema.get("properties"), path);
            path.pop();
        }
    }

    fn annotation(
        &mut self,
        annotation: &Value,
        schema: &serde_json::Map<String, Value>,
        path: &[&str],
    ) {
        let property = path.join(".");
        let Some(name) = annotation.as_str() else {
            return self.violate(AnnotationViolation::NotAString { property });
        };
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return self.violate(AnnotationViolation::NotAToken {
                property,
                header: name.to_owned(),
            });
        }
        if self
            .params
            .iter()
            .any(|p| p.name.eq_ignore_ascii_case(name))
        {
            return self.violate(AnnotationViolation::Duplicate {
                property,
                header: name.to_owned(),
            });
        }
        if !matches!(
            schema.get("type").and_then(Value::as_str),
            Some("string" | "integer" | "boolean")
        ) {
            return self.violate(AnnotationViolation::NotPrimitive { property });
        }
        let lower = format!("{MCP_PARAM_PREFIX}{}", name.to_ascii_lowercase());
        match HeaderName::from_bytes(lower.as_bytes()) {
            Ok(header) => self.params.push(ParamHeader {
                path: path.iter().map(|s| (*s).to_owned()).collect(),
                name: name.to_owned(),
                header,
            }),
            Err(_) => self.violate(AnnotationViolation::NotAToken {
                property,
                header: name.to_owned(),
            }),
        }
    }

    /// Flags annotations under any keyword of `schema` other than
    /// `properties` (walked by `collect`) and those holding instance data.
    fn scan_keywords(&mut self, schema: &serde_json::Map<String, Value>) {
        for (keyword, value) in schema {
            let data = matches!(
                keyword.as_str(),
                "properties" | "x-mcp-header" | "default" | "const" | "enum" | "examples"
            );
            if !data && contains_annotation(value) {
                self.violate(AnnotationViolation::OffChain {
                    keyword: keyword.clone(),
                });
            }
        }
    }
}

fn contains_annotation(value: &Value) -> bool {
    match value {
        Value::Object(map) => {
            map.contains_key("x-mcp-header") || map.values().any(contains_annotation)
        }
        Value::Array(items) => items.iter().any(contains_annotation),
        _ => false,
    }
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// True when requests of `version` must carry the mirrored headers: dated
/// versions from 2026-07-28 on, and any value not of the `YYYY-MM-DD` form
/// (unknown versions get the strict treatment).
pub fn requires_mirroring(version: &str) -> bool {
    let b = version.as_bytes();
    let dated = b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        });
    // Dates in this form order lexicographically.
    !dated || version >= HEADERS_REQUIRED_SINCE
}

/// The `MCP-Protocol-Version` header, if present exactly once with a valid value.
pub fn protocol_version(headers: &HeaderMap) -> Result<Option<&str>, HeaderMismatch> {
    single(headers, &PROTOCOL_VERSION, || Header::ProtocolVersion)
}

/// Checks the Mcp-* headers of a request against its single parsed message.
///
/// `params` is the annotation set of the called tool when `msg` is a
/// `tools/call` and the tool's schema is known; without it, `Mcp-Param-*`
/// headers on a `tools/call` are forwarded unchecked (see the module docs).
///
/// Cost: a few header-map lookups; the arguments are parsed into a
/// `serde_json::Value` only when the tool has annotations.
pub fn check(
    headers: &HeaderMap,
    msg: &Message,
    params: Option<&ParamHeaders>,
) -> Result<(), HeaderMismatch> {
    let version = protocol_version(headers)?;
    let is_request = msg.kind == Kind::Request;
    let body_version = if msg.kind == Kind::Response {
        None
    } else {
        msg.protocol_version()
    };
    match (version, body_version.as_deref()) {
        (Some(h), Some(b)) if h != b => {
            return Err(HeaderMismatch::Mismatch {
                header: Header::ProtocolVersion,
                header_value: h.to_owned(),
                body_value: b.to_owned(),
            })
        }
        (None, Some(b)) => {
            return Err(HeaderMismatch::Missing {
                header: Header::ProtocolVersion,
                body_value: b.to_owned(),
            })
        }
        (Some(h), None) if is_request && requires_mirroring(h) => {
            return Err(HeaderMismatch::BodyVersionMissing {
                header_value: h.to_owned(),
            })
        }
        _ => {}
    }
    // Only requests have defined header requirements; notifications and
    // responses are held to "present headers must match".
    let strict = is_request && version.is_some_and(requires_mirroring);

    let method = single(headers, &MCP_METHOD, || Header::Method)?;
    compare_plain(Header::Method, method, msg.method.as_deref(), strict)?;

    let name = single(headers, &MCP_NAME, || Header::Name)?;
    let name = name.map(|v| decode(v, || Header::Name)).transpose()?;
    let name_required = strict
        && matches!(
            msg.method.as_deref(),
            Some("tools/call" | "prompts/get" | "resources/read")
        );
    compare_plain(
        Header::Name,
        name.as_deref(),
        msg.name.as_deref(),
        name_required,
    )?;

    match &msg.call {
        Some(call) => match params {
            Some(params) if !params.is_empty() => check_params(headers, call, params, strict),
            _ => Ok(()),
        },
        None => match headers
            .keys()
            .find(|k| k.as_str().starts_with(MCP_PARAM_PREFIX))
        {
            Some(key) => Err(HeaderMismatch::Unexpected {
                header: Header::Param(key.as_str()[MCP_PARAM_PREFIX.len()..].to_owned()),
                header_value: lossy(headers.get(key)),
            }),
            None => Ok(()),
        },
    }
}

/// Rejects any mirrored header on a batch body: batches exist only in
/// 2025-03-26, which has no mirrored headers, and a batch has no single
/// method or name a header could mirror.
pub fn check_batch(headers: &HeaderMap) -> Result<(), HeaderMismatch> {
    for (key, value) in headers {
        let header = if key == MCP_METHOD {
            Header::Method
        } else if key == MCP_NAME {
            Header::Name
        } else if let Some(param) = key.as_str().strip_prefix(MCP_PARAM_PREFIX) {
            Header::Param(param.to_owned())
        } else {
            continue;
        };
        return Err(HeaderMismatch::OnBatch {
            header,
            header_value: lossy(Some(value)),
        });
    }
    Ok(())
}

fn lossy(value: Option<&http::HeaderValue>) -> String {
    value.map_or_else(String::new, |v| {
        String::from_utf8_lossy(v.as_bytes()).into_owned()
    })
}

/// The only value of `name`, as text. Repeats are rejected: a proxy and an
/// upstream could each pick a different one.
fn single<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
    which: impl Fn() -> Header,
) -> Result<Option<&'h str>, HeaderMismatch> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(HeaderMismatch::Repeated { header: which() });
    }
    // to_str accepts exactly visible ASCII, space and tab: the plain-value
    // character set of the spec.
    first
        .to_str()
        .map(Some)
        .map_err(|_| HeaderMismatch::InvalidCharacters {
            header: which(),
            header_value: lossy(Some(first)),
        })
}

/// Unwraps the `=?base64?...?=` form; other values are used as they are.
fn decode(value: &str, which: impl Fn() -> Header) -> Result<Cow<'_, str>, HeaderMismatch> {
    let Some(inner) = value
        .strip_prefix(BASE64_PREFIX)
        .and_then(|v| v.strip_suffix(BASE64_SUFFIX))
    else {
        return Ok(Cow::Borrowed(value));
    };
    base64::engine::general_purpose::STANDARD
        .decode(inner)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .map(Cow::Owned)
        .ok_or_else(|| HeaderMismatch::InvalidBase64 {
            header: which(),
            header_value: value.to_owned(),
        })
}

fn compare_plain(
    header: Header,
    header_value: Option<&str>,
    body_value: Option<&str>,
    required: bool,
) -> Result<(), HeaderMismatch> {
    match (header_value, body_value) {
        (Some(h), Some(b)) if h != b => Err(HeaderMismatch::Mismatch {
            header,
            header_value: h.to_owned(),
            body_value: b.to_owned(),
        }),
        (Some(h), None) => Err(HeaderMismatch::Unexpected {
            header,
            header_value: h.to_owned(),
        }),
        (None, Some(b)) if required => Err(HeaderMismatch::Missing {
            header,
            body_value: b.to_owned(),
        }),
        _ => Ok(()),
    }
}

fn check_params(
    headers: &HeaderMap,
    call: &crate::mcp::jsonrpc::ToolCall,
    params: &ParamHeaders,
    strict: bool,
) -> Result<(), HeaderMismatch> {
    // Parsing the arguments costs an allocation per value; it happens only
    // for tools that declare x-mcp-header annotations.
    let arguments: Option<Value> = call
        .arguments
        .as_deref()
        .and_then(|raw| serde_json::from_str(raw.get()).ok());
    for param in &params.params {
        let which = || Header::Param(param.name.clone());
        let header_value = single(headers, &param.header, which)?
            .map(|v| decode(v, which))
            .transpose()?;
        let body = arguments
            .as_ref()
            .and_then(|args| param.path.iter().try_fold(args, |v, key| v.get(key)))
            .filter(|v| !v.is_null());
        match (header_value, body) {
            (None, None) => {}
            (Some(h), None) => {
                return Err(HeaderMismatch::Unexpected {
                    header: which(),
                    header_value: h.into_owned(),
                })
            }
            (None, Some(b)) => {
                let primitive = matches!(b, Value::String(_) | Value::Bool(_) | Value::Number(_));
                if strict && primitive {
                    return Err(HeaderMismatch::Missing {
                        header: which(),
                        body_value: mirror(b),
                    });
                }
            }
            (Some(h), Some(b)) => {
                if !mirrors(&h, b) {
                    return Err(HeaderMismatch::Mismatch {
                        header: which(),
                        header_value: h.into_owned(),
                        body_value: mirror(b),
                    });
                }
            }
        }
    }
    Ok(())
}

/// The body value as the header would carry it (before Base64 wrapping).
fn mirror(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Whether a decoded header value mirrors a body value.
fn mirrors(header: &str, body: &Value) -> bool {
    match body {
        Value::String(s) => header == s,
        Value::Bool(true) => header == "true",
        Value::Bool(false) => header == "false",
        Value::Number(n) => numbers_equal(header, n),
        _ => false,
    }
}

/// Numeric comparison (the spec: `42.0` matches `42`): the header must be
/// a JSON number of exactly the body's value, compared as decimals (a
/// double would let `0.10000000000000001` mirror `0.1`, and
/// `4503599627370496.25` mirror `4503599627370496`), within the range every
/// reader holds exactly (the spec: mirrored integers lie within ±(2^53 - 1)).
fn numbers_equal(header: &str, body: &serde_json::Number) -> bool {
    match (Decimal::parse(header), Decimal::of(body)) {
        (Some(h), Some(b)) => h == b && b.within_safe_range(),
        _ => false,
    }
}

#[cfg(test)]
#[path = "headers_tests.rs"]
mod tests;
