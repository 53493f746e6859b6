//! RFC 8785 (JSON Canonicalization Scheme) for the hashes an auditor
//! recomputes with any JCS implementation: an approval binds a call's
//! arguments by [`sha256`] of their canonical text, a pin binds a tool's
//! definition the same way. `serde_jcs` writes the text: object members
//! sorted by their names' UTF-16 code units, no insignificant whitespace,
//! strings with the minimal escapes of ECMAScript's `JSON.stringify`, numbers
//! as ECMAScript prints them (`1000` for `1000.0`, `1e+21`, `1.5e-7`).
//!
//! RFC 8785 prints every number as the double nearest to it, so two
//! different integers beyond 2^53 (`9007199254740993`, `9007199254740992`)
//! share one canonical text. For a hash that binds an approval to a call
//! that would let an approval for one id run a call on another, so
//! [`sha256`] adds what the text lost: after the canonical text, a NUL byte
//! (which canonical text never contains) and the exact digits of every such
//! integer, comma-separated, in canonical member order. A value without such
//! integers (nearly all) hashes as plain `sha256(JCS(value))`.

use crate::digest::Sha256;
use serde_json::Value;

/// The canonical text of `value`.
pub(crate) fn canonical(value: &Value) -> String {
    // A `Value` always canonicalizes (its keys are strings, its numbers
    // finite); should that ever change, serde_json's own deterministic text
    // still binds the value.
    serde_jcs::to_string(value).unwrap_or_else(|_| value.to_string())
}

/// The canonical text of `value`, except that integers a double cannot
/// hold keep their exact digits: the form a pin file stores, so that reading
/// it back gives the value (and so the [`sha256`]) that was pinned. For a
/// value without such integers (nearly all) it is [`canonical`] itself.
pub(crate) fn canonical_exact(value: &Value) -> String {
    if !holds_inexact_integer(value) {
        return canonical(value);
    }
    let mut out = String::new();
    write_exact(value, &mut out);
    out
}

fn write_exact(value: &Value, out: &mut String) {
    match value {
        Value::Number(n) if is_inexact(n) => out.push_str(&n.to_string()),
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_exact(v, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&canonical(&Value::String(k.clone())));
                out.push(':');
                write_exact(v, out);
            }
            out.push('}');
        }
        other => out.push_str(&canonical(other)),
    }
}

/// SHA-256 of the canonical text, followed (only when the value holds
/// integers a double cannot) by NUL and those integers' exact digits.
pub(crate) fn sha256(value: &Value) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(canonical(value).as_bytes());
    if !holds_inexact_integer(value) {
        return h.finalize();
    }
    let mut lost = Vec::new();
    inexact_integers(value, &mut lost);
    for (i, digits) in lost.iter().enumerate() {
        h.update(if i == 0 { b"\0" } else { b"," });
        h.update(digits.as_bytes());
    }
    h.finalize()
}

/// Whether an integer of `value` is beyond what a double holds (nearly
/// never: the common case skips ordering the members a second time).
fn holds_inexact_integer(value: &Value) -> bool {
    match value {
        Value::Number(n) => is_inexact(n),
        Value::Array(items) => items.iter().any(holds_inexact_integer),
        Value::Object(map) => map.values().any(holds_inexact_integer),
        Value::Null | Value::Bool(_) | Value::String(_) => false,
    }
}

fn is_inexact(n: &serde_json::Number) -> bool {
    const EXACT: u64 = 1 << 53;
    n.as_u64()
        .map(|u| u > EXACT)
        .or_else(|| n.as_i64().map(|i| i.unsigned_abs() > EXACT))
        .unwrap_or(false)
}

/// The integers of `value` that a double does not hold exactly, in
/// canonical order (members sorted by UTF-16 code units, as JCS sorts).
fn inexact_integers(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Number(n) => {
            if is_inexact(n) {
                out.push(n.to_string());
            }
        }
        Value::Array(items) => items.iter().for_each(|v| inexact_integers(v, out)),
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            members
                .into_iter()
                .for_each(|(_, v)| inexact_integers(v, out));
        }
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    ::hex::encode(bytes)
}

/// Parses lower- or upper-case hex of exactly 32 bytes.
pub(crate) fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    ::hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod exact_tests {
    use super::*;

    #[test]
    fn exact_text_reads_back_to_the_same_hash() {
        let v: Value = serde_json::from_str(
            r#"{"z":1,"b":{"max":9007199254740993,"x":[1.5,18446744073709551615]},"a":"é\n"}"#,
        )
        .unwrap();
        let text = canonical_exact(&v);
        assert!(text.contains("9007199254740993"), "{text}");
        assert!(text.contains("18446744073709551615"), "{text}");
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
        assert_eq!(sha256(&back), sha256(&v));
        // Lossy canonical text would not: that was the bug.
        let lossy: Value = serde_json::from_str(&canonical(&v)).unwrap();
        assert_ne!(sha256(&lossy), sha256(&v));
        // Without such integers it is the canonical text itself.
        let plain = serde_json::json!({"b": 2, "a": [1.0, "x"]});
        assert_eq!(canonical_exact(&plain), canonical(&plain));
        // Member order and string escapes are the canonical ones.
        let mixed = serde_json::json!({"b": 9007199254740995u64, "a": "q\"\u{1}"});
        assert_eq!(
            canonical_exact(&mixed),
            format!(
                "{{\"a\":{},\"b\":9007199254740995}}",
                canonical(&mixed["a"])
            )
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sha2::Digest as _;

    #[test]
    fn rfc_8785_examples() {
        // RFC 8785 §3.2.2 (sorting) and §3.2.2.3 (numbers).
        let v: Value = serde_json::from_str(
            r#"{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}"#,
        )
        .unwrap();
        assert_eq!(
            canonical(&v),
            "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\"string\":\"€$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}"
        );
        // UTF-16 order: "\u{10000}" sorts before "\u{FB33}" in UTF-16, not in UTF-8.
        let v = json!({"\u{FB33}": 1, "\u{10000}": 2, "a": 3, "B": 4});
        assert_eq!(
            canonical(&v),
            "{\"B\":4,\"a\":3,\"\u{10000}\":2,\"\u{FB33}\":1}"
        );
    }

    #[test]
    fn numbers_print_as_ecmascript_does() {
        for (x, s) in [
            (1000.0, "1000"),
            (-0.5, "-0.5"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1.5e-7, "1.5e-7"),
            (0.000001, "0.000001"),
            (123.456, "123.456"),
        ] {
            assert_eq!(canonical(&json!(x)), s, "{x}");
        }
        assert_eq!(canonical(&json!({"a": 5, "b": -7})), "{\"a\":5,\"b\":-7}");
    }

    #[test]
    fn hashes_ignore_member_order_and_whitespace() {
        let a: Value =
            serde_json::from_str(r#"{"name":"x","inputSchema":{"type":"object","properties":{}}}"#)
                .unwrap();
        let b: Value = serde_json::from_str(
            r#"{ "inputSchema" : { "properties":{}, "type":"object" }, "name":"x" }"#,
        )
        .unwrap();
        assert_eq!(sha256(&a), sha256(&b));
        let h = hex(&sha256(&a));
        assert_eq!(parse_hex32(&h), Some(sha256(&a)));
        assert_eq!(parse_hex32("zz"), None);
    }

    #[test]
    fn integers_a_double_cannot_hold_still_hash_apart() {
        let a = json!({"id": 9_007_199_254_740_993_u64});
        let b = json!({"id": 9_007_199_254_740_992_u64});
        // RFC 8785 prints both as the same double ...
        assert_eq!(canonical(&a), canonical(&b));
        // ... the hash keeps them apart, and says how.
        assert_ne!(sha256(&a), sha256(&b));
        let mut h = sha2::Sha256::new();
        h.update(canonical(&a).as_bytes());
        h.update(b"\x009007199254740993");
        assert_eq!(sha256(&a), <[u8; 32]>::from(h.finalize()));
        let c = json!({"b": -9_007_199_254_740_995_i64, "a": [18_446_744_073_709_551_615_u64]});
        let mut h = sha2::Sha256::new();
        h.update(canonical(&c).as_bytes());
        h.update(b"\x0018446744073709551615,-9007199254740995");
        assert_eq!(sha256(&c), <[u8; 32]>::from(h.finalize()));
        // Up to 2^53 a value hashes as plain SHA-256 of its JCS text.
        let d = json!({"id": 9_007_199_254_740_992_u64, "x": 1.5});
        assert_eq!(
            sha256(&d),
            <[u8; 32]>::from(sha2::Sha256::digest(canonical(&d).as_bytes()))
        );
    }
}
