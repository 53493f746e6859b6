//! `Mcp-Name` against the body's tool name: the header check's verdict is
//! the decoded comparison's. A plain value is taken as it is (visible
//! ASCII, space and tab only); `=?base64?…?=` is standard Base64 (with
//! padding, canonical) of UTF-8 text; the two must be equal.
#![no_main]

use base64::Engine as _;
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use mcp_firewall::mcp::headers::{check, MCP_METHOD, MCP_NAME, PROTOCOL_VERSION};
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
    // name \0 header-value; a leading byte chooses to send the header as
    // Base64 of the given value (exercising the decoder on valid forms).
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
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
