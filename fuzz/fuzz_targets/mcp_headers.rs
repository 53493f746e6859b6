//! `Mcp-Name` and `Mcp-Param-*` against the body: the header check's
//! verdict is the decoded comparison's.
//!
//! - A plain value is taken as it is (visible ASCII, space and tab only);
//!   `=?base64?…?=` is standard Base64 (with padding, canonical) of UTF-8
//!   text.
//! - `Mcp-Name` must equal the tool's name.
//! - `Mcp-Param-{Name}` (a tool's `x-mcp-header` annotation on a string,
//!   integer or boolean property, at any depth of `properties`): a string
//!   is equal, a boolean is `true` or `false`, a number has exactly the
//!   body's decimal value (not merely the same double) within ±(2^53 - 1);
//!   a header without a value in the body, a value without its header, a
//!   repeated header, an object or array are refused.
#![no_main]

use base64::Engine as _;
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use mcp_firewall::mcp::headers::{check, ParamHeaders, MCP_METHOD, MCP_NAME, PROTOCOL_VERSION};
use mcp_firewall::mcp::jsonrpc::{parse, Limits};

fn reference(value: &[u8]) -> Option<String> {
    if !value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    match text
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    {
        Some(inner) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(inner)
                .ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(text.to_owned()),
    }
}

fuzz_target!(|data: &[u8]| {
    // mode, then name \0 header-value; bit 0 of the mode sends the header as
    // Base64 of the given value (exercising the decoder on valid forms);
    // bit 1 checks an `Mcp-Param-*` header instead (see `param`).
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 2 == 2 {
        return param(mode, rest);
    }
    let mut parts = rest.splitn(2, |&b| b == 0);
    let (Some(name), Some(value)) = (parts.next(), parts.next()) else {
        return;
    };
    let Ok(name) = std::str::from_utf8(name) else {
        return;
    };
    let value: Vec<u8> = if mode & 1 == 1 {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value)
        )
        .into_bytes()
    } else {
        value.to_vec()
    };
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": name,
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
        }
    })
    .to_string();
    let Ok(envelope) = parse(body.as_bytes(), &Limits::default()) else {
        return;
    };
    let Ok(header) = HeaderValue::from_bytes(&value) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(PROTOCOL_VERSION, HeaderValue::from_static("2026-07-28"));
    headers.insert(MCP_METHOD, HeaderValue::from_static("tools/call"));
    headers.insert(MCP_NAME, header);
    let verdict = check(&headers, &envelope.messages[0], None);
    let expected = reference(&value).is_some_and(|decoded| decoded == name);
    assert_eq!(
        verdict.is_ok(),
        expected,
        "header {:?} against name {name:?}: {verdict:?}",
        String::from_utf8_lossy(&value)
    );
});

/// The reference's reading of a JSON number: the sign, the significant
/// digits and the power of ten of the first of them (zero: no digits).
fn reference_decimal(text: &str) -> Option<(bool, String, i64)> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exp) = match rest.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (rest, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(int) || (int.len() > 1 && int.starts_with('0')) {
        return None;
    }
    if mantissa.contains('.') && !digits(frac) {
        return None;
    }
    let exp: i64 = match exp {
        None => 0,
        Some(e) => {
            let body = e.strip_prefix(['+', '-']).unwrap_or(e);
            if !digits(body) {
                return None;
            }
            let body = body.trim_start_matches('0');
            if body.len() > 18 {
                // Only zero may carry an exponent this large.
                return (int.bytes().chain(frac.bytes()).all(|b| b == b'0'))
                    .then(|| (false, String::new(), 0));
            }
            let v: i64 = if body.is_empty() {
                0
            } else {
                body.parse().ok()?
            };
            if e.starts_with('-') {
                -v
            } else {
                v
            }
        }
    };
    let all: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
    let Some(first) = all.iter().position(|&b| b != b'0') else {
        return Some((false, String::new(), 0));
    };
    // The first significant digit's place: int.len() - 1 - first.
    let place = int.len() as i64 - 1 - first as i64 + exp;
    let sig = String::from_utf8_lossy(&all[first..])
        .trim_end_matches('0')
        .to_owned();
    Some((negative, sig, place))
}

/// |value| <= 2^53 - 1, exactly.
fn reference_safe(d: &(bool, String, i64)) -> bool {
    let (_, sig, place) = d;
    if sig.is_empty() || *place < 15 {
        return true;
    }
    if *place > 15 {
        return false;
    }
    let mut integer: String = sig.chars().take(16).collect();
    while integer.len() < 16 {
        integer.push('0');
    }
    let fraction = sig.len() > 16;
    integer.as_str() < "9007199254740991" || (integer == "9007199254740991" && !fraction)
}

/// Whether a decoded header mirrors the body value (given as its text).
fn reference_mirrors(header: &str, body: &serde_json::Value, body_text: &str) -> bool {
    match body {
        serde_json::Value::String(s) => header == s,
        serde_json::Value::Bool(b) => header == if *b { "true" } else { "false" },
        serde_json::Value::Number(_) => {
            match (reference_decimal(header), reference_decimal(body_text)) {
                (Some(h), Some(b)) => h == b && reference_safe(&b),
                _ => false,
            }
        }
        _ => false,
    }
}

/// A respelling of a JSON number that keeps its value.
fn respell(text: &str, how: usize) -> String {
    let has_exp = text.contains(['e', 'E']);
    match (how % 4, has_exp, text.contains('.')) {
        (0, false, false) => format!("{text}.0"),
        (1, false, true) => format!("{text}00"),
        (2, false, _) => format!("{text}E+0"),
        (_, true, _) => text.replacen(['e', 'E'], "e0", 1).replacen("e0-", "e-0", 1),
        _ => format!("{text}e-0"),
    }
}

/// `Mcp-Param-{name}` on a tool whose schema annotates property `p` (bit 6:
/// `o.p`) of a type chosen by bits 4-5 with `name`, the body's value being
/// the given JSON text; bits 2-3 choose the header: the given bytes, none,
/// the body's own value, or a respelling of its number; bit 7 repeats it.
///
/// Input after the mode: name \0 value-json \0 header-bytes.
fn param(mode: u8, rest: &[u8]) {
    let mut parts = rest.splitn(3, |&b| b == 0);
    let (Some(name), Some(value), given) = (parts.next(), parts.next(), parts.next()) else {
        return;
    };
    let (Ok(name), Ok(value_text)) = (std::str::from_utf8(name), std::str::from_utf8(value)) else {
        return;
    };
    let Ok(value) = serde_json::from_str::<serde_json::Value>(value_text) else {
        return;
    };
    let ty = ["string", "integer", "boolean", "number"][usize::from((mode >> 4) & 3)];
    let nested = mode & 0x40 != 0;
    let property = serde_json::json!({"type": ty, "x-mcp-header": name});
    let schema = if nested {
        serde_json::json!({"type": "object", "properties": {"o": {"type": "object", "properties": {"p": property}}}})
    } else {
        serde_json::json!({"type": "object", "properties": {"p": property}})
    };
    let params = ParamHeaders::from_input_schema(&schema);
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    let primitive = ty != "number";
    assert_eq!(
        params.violation().is_none(),
        token && primitive,
        "annotation {name:?} on a {ty}: {:?}",
        params.violation()
    );
    if params.violation().is_some() {
        assert!(params.is_empty(), "an invalid annotation is enforced");
        return;
    }
    // The arguments, with the value's own text (so its number spelling).
    let arguments = if nested {
        format!(r#"{{"o":{{"p":{value_text}}}}}"#)
    } else {
        format!(r#"{{"p":{value_text}}}"#)
    };
    // A number no reader holds exactly is refused before any decision.
    if mcp_firewall::mcp::numbers::first_inexact(&arguments).is_some() {
        return;
    }
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","arguments":{arguments},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}}}}"#
    );
    let Ok(envelope) = parse(body.as_bytes(), &Limits::default()) else {
        return;
    };
    let trimmed = value_text.trim_matches([' ', '\t', '\n', '\r']);
    let header: Option<Vec<u8>> = match (mode >> 2) & 3 {
        0 => given.map(<[u8]>::to_vec),
        1 => None,
        2 => match &value {
            serde_json::Value::String(s) => Some(s.clone().into_bytes()),
            serde_json::Value::Null => None,
            _ => Some(trimmed.as_bytes().to_vec()),
        },
        _ => match &value {
            serde_json::Value::Number(_) => Some(respell(trimmed, name.len()).into_bytes()),
            _ => given.map(<[u8]>::to_vec),
        },
    };
    let header = header.map(|h| {
        if mode & 1 == 1 {
            format!(
                "=?base64?{}?=",
                base64::engine::general_purpose::STANDARD.encode(h)
            )
            .into_bytes()
        } else {
            h
        }
    });
    let mut headers = HeaderMap::new();
    headers.insert(PROTOCOL_VERSION, HeaderValue::from_static("2026-07-28"));
    headers.insert(MCP_METHOD, HeaderValue::from_static("tools/call"));
    headers.insert(MCP_NAME, HeaderValue::from_static("t"));
    let Ok(header_name) =
        http::HeaderName::from_bytes(format!("mcp-param-{}", name.to_ascii_lowercase()).as_bytes())
    else {
        return;
    };
    let repeated = mode & 0x80 != 0;
    if let Some(h) = &header {
        let Ok(v) = HeaderValue::from_bytes(h) else {
            return;
        };
        headers.append(header_name.clone(), v.clone());
        if repeated {
            headers.append(header_name, v);
        }
    }
    let verdict = check(&headers, &envelope.messages[0], Some(&params));

    let body_value = Some(&value).filter(|v| !v.is_null());
    let expected = match (&header, body_value) {
        (Some(_), _) if repeated => false,
        (Some(h), b) => match reference(h) {
            None => false,
            Some(decoded) => b.is_some_and(|b| reference_mirrors(&decoded, b, trimmed)),
        },
        (None, None) => true,
        (None, Some(b)) => !matches!(
            b,
            serde_json::Value::String(_)
                | serde_json::Value::Bool(_)
                | serde_json::Value::Number(_)
        ),
    };
    assert_eq!(
        verdict.is_ok(),
        expected,
        "Mcp-Param-{name} {:?} against {value_text:?} ({ty}): {verdict:?}",
        header.as_deref().map(String::from_utf8_lossy)
    );
}
