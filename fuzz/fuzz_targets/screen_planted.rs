//! Screening: a secret planted anywhere in a tool result's text (between
//! any two fuzz-chosen texts, at a word boundary) is found, and redacted
//! out of what would pass; redaction is idempotent (screening the redacted
//! text redacts nothing more); nothing panics on any JSON text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::internals::Scanner;
use mcp_firewall::internals::{screen_json, Action, Actions};

/// Secrets of some of the rules' shapes.
const SECRETS: &[&str] = &[
    "AKIAIOSFODNN7EXAMPLQ",
    "ghp_0123456789abcdefghijABCDEFGHIJ012345",
    "xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx",
    "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
];

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let scanner = Scanner::new(&[]).expect("scanner");
    let actions = Actions {
        secrets: Action::Redact,
        pii: Action::Redact,
        injection: Action::Flag,
    };
    // Any JSON text: no panic, and redaction settles in one pass.
    if let Ok(text) = std::str::from_utf8(rest) {
        if serde_json::from_str::<serde_json::Value>(text).is_ok() {
            if let Ok(s) = screen_json(&scanner, actions, text) {
                if let Some(r) = s.redacted {
                    let again = screen_json(&scanner, actions, &r).expect("redacted is JSON");
                    assert!(
                        again.redacted.is_none() || again.redacted.as_deref() == Some(r.as_str()),
                        "redaction is not idempotent"
                    );
                }
            }
        }
    }
    // A planted secret.
    let cut = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let before = String::from_utf8_lossy(&rest[..cut]);
    let after = String::from_utf8_lossy(rest.get(cut + 1..).unwrap_or_default());
    let secret = SECRETS[usize::from(which) % SECRETS.len()];
    let text = format!("{before} {secret} {after}");
    let json = serde_json::json!({"content": [{"type": "text", "text": text}]}).to_string();
    let s = screen_json(&scanner, actions, &json).expect("JSON");
    assert!(!s.report.is_empty(), "a planted secret was not found");
    let redacted = s.redacted.expect("a secret is redacted");
    assert!(
        !redacted.contains(secret),
        "a planted secret passed redaction: {redacted}"
    );
});
