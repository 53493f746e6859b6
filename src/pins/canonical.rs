//! RFC 8785 (JSON Canonicalization Scheme) for tool definitions, so that an
//! auditor can recompute a pin with any JCS implementation: object members
//! sorted by their names' UTF-16 code units, no insignificant whitespace,
//! strings with the minimal escapes of ECMAScript's `JSON.stringify`,
//! numbers as ECMAScript prints them (`1000` for `1000.0`, `1e+21`,
//! `1.5e-7`).

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The canonical text of `value`.
pub fn canonical(value: &Value) -> String {
    let mut out = String::with_capacity(256);
    write(value, &mut out);
    out
}

/// SHA-256 of the canonical text.
pub fn sha256(value: &Value) -> [u8; 32] {
    Sha256::digest(canonical(value).as_bytes()).into()
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses lower- or upper-case hex of exactly 32 bytes.
pub fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn write(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                number(i as f64, Some(i.to_string()), out);
            } else if let Some(u) = n.as_u64() {
                number(u as f64, Some(u.to_string()), out);
            } else {
                number(n.as_f64().unwrap_or(0.0), None, out);
            }
        }
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(v, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(k, out);
                out.push(':');
                if let Some(v) = map.get(k) {
                    write(v, out);
                }
            }
            out.push('}');
        }
    }
}

/// ECMAScript's Number::toString for finite doubles. Integers that a double
/// holds exactly print as integers; `exact` is the integer's own text, used
/// when the double could not hold it (JCS then prints the double's value,
/// which is what ECMAScript would have parsed).
fn number(x: f64, exact: Option<String>, out: &mut String) {
    if x == 0.0 {
        out.push('0');
        return;
    }
    if let Some(e) =
        exact.filter(|_| x.abs() < 1e21 && x.fract() == 0.0 && x.abs() <= 9007199254740992.0)
    {
        out.push_str(&e);
        return;
    }
    // Shortest round-trip digits and exponent, from Rust's `{:e}`.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let k = digits.len() as i32;
    let n = exp + 1;
    if x < 0.0 {
        out.push('-');
    }
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if n > 0 { '+' } else { '-' });
        out.push_str(&(n - 1).abs().to_string());
    }
}

fn string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            let mut out = String::new();
            number(x, None, &mut out);
            assert_eq!(out, s, "{x}");
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
}
