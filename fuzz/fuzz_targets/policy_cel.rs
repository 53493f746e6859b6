//! Policy files and CEL conditions: any policy text compiles or is refused
//! with an error, the same way twice; a condition of any CEL text, decided
//! on any arguments, gives a decision (never a panic), the same twice, and
//! never lets a call through that its condition could not evaluate to
//! `true` for: a `require` that is not a boolean `true` denies.
#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use mcp_firewall::policy::{compile, Call, Decision, Identity, Mode, UpstreamFacts};
use serde_json::Value;

const BASE: &str = r#"
[gates]
read = "allow"
write = "approve"
destructive = "approve"

[[tools]]
upstream = "up"
match = ["t"]
risk = "read"

[[agents]]
name = "a"
projects = ["p"]
risks = ["read"]
allow = [{ upstream = "up" }]
"#;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The whole text as a policy file.
    let file = || vec![(PathBuf::from("fuzz.toml"), text.to_owned())];
    match (compile(&file()), compile(&file())) {
        (Ok(a), Ok(b)) => assert_eq!(a.content_hash(), b.content_hash()),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("one policy text, two verdicts"),
    }
    // The text as a condition, then as arguments.
    let mut parts = text.splitn(2, '\u{1}');
    let (Some(require), args) = (parts.next(), parts.next()) else {
        return;
    };
    let condition = format!(
        "{BASE}\n[[conditions]]\nupstream = \"up\"\ntools = [\"t\"]\nrequire = {}\nreason = \"r\"\n",
        toml_string(require)
    );
    let Ok(policy) = compile(&[(PathBuf::from("c.toml"), condition)]) else {
        return;
    };
    let arguments: Value = args
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or(Value::Null);
    let projects = vec!["p".to_owned()];
    let id = Identity {
        subject: "s",
        tenant: "t",
        agent: "a",
        run_id: "r",
        mode: Mode::Caller,
        projects: &projects,
        ceiling: None,
        service_issuer: false,
    };
    let authority = policy.authority(&id).expect("the role has authority");
    let up = UpstreamFacts {
        name: "up",
        projects: &projects,
        categories: &[],
        trust_annotations: false,
        untrusted: false,
        private: false,
        egress: false,
    };
    let call = Call {
        identity: &id,
        authority: &authority,
        upstream: up,
        tool: "t",
        arguments: &arguments,
        hints: None,
    };
    let first = policy.decide(&call, None);
    let second = policy.decide(&call, None);
    assert_eq!(
        format!("{first:?}"),
        format!("{second:?}"),
        "one call, two decisions"
    );
    match first {
        Decision::Allow { .. } | Decision::Deny { .. } => {}
        other => panic!("a visible read decided as {other:?}"),
    }
    // A condition that is a constant other than `true` never allows.
    let constant = require.trim();
    if matches!(
        constant,
        "false" | "null" | "1" | "0" | "\"true\"" | "[]" | "{}"
    ) {
        assert!(
            matches!(first, Decision::Deny { .. }),
            "{constant} allowed a call"
        );
    }
});

/// A TOML basic string holding `s`.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
