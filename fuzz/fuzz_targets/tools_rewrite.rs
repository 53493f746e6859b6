//! The rewritten `tools/list`: whatever `rewrite` writes parses strictly,
//! holds exactly the tools kept (each as the upstream listed it but for
//! the annotations and `_meta` the firewall derives), marks a 2026-07-28
//! list private with a bounded `ttlMs`; and the rewrite off the strict reader's
//! tape writes the same bytes as the one from the raw text.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use mcp_firewall::mcp::jsonrpc::parse_upstream;
use mcp_firewall::mcp::rewrite::{self, ListedTool, MAX_TTL_MS};
use mcp_firewall::policy::{Gate, Risk};
use serde_json::Value;

/// Keeps a tool by one bit of its name's bytes and the seed; its risk by
/// the name's length.
fn decision(seed: u8, name: &str) -> Option<(Risk, Gate)> {
    let h = name.bytes().fold(seed, |a, b| a.rotate_left(3) ^ b);
    if h & 1 == 0 {
        return None;
    }
    let risk = [Risk::Read, Risk::Write, Risk::Destructive][name.len() % 3];
    let gate = if h & 2 == 0 {
        Gate::Allow
    } else {
        Gate::Approve
    };
    Some((risk, gate))
}

/// `tool` without the members that are `keys` to a case-insensitive
/// decoder (which the firewall writes itself, in place of the vendor's).
fn without(mut tool: Value, keys: &[&str]) -> Value {
    let fold = |k: &str| k.to_lowercase().replace('\u{17F}', "s");
    if let Some(o) = tool.as_object_mut() {
        o.retain(|k, _| !keys.iter().any(|key| fold(k) == fold(key)));
    }
    tool
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let Ok(envelope) = parse_upstream(body) else {
        return;
    };
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let kept = RefCell::new(Vec::new());
    let decide = |t: &ListedTool<'_>| {
        let d = decision(seed, t.name);
        if d.is_some() {
            kept.borrow_mut().push(t.name.to_owned());
        }
        d
    };
    let Ok(out) = rewrite::tools_list(text, decide) else {
        return;
    };
    let back = parse_upstream(out.as_bytes()).expect("the rewritten list reads strictly");
    assert!(!back.batch && back.messages.len() == 1);
    let before: Value = serde_json::from_str(text).expect("JSON");
    let after: Value = serde_json::from_str(&out).expect("JSON");
    let tools_before = before["result"]["tools"].as_array().expect("tools");
    let tools_after = after["result"]["tools"].as_array().expect("tools");
    let expected: Vec<&Value> = tools_before
        .iter()
        .filter(|t| {
            t["name"]
                .as_str()
                .is_some_and(|n| decision(seed, n).is_some())
        })
        .collect();
    assert_eq!(tools_after.len(), expected.len(), "kept tools differ");
    assert_eq!(kept.borrow().len(), expected.len());
    for (a, b) in tools_after.iter().zip(expected) {
        assert_eq!(
            without(a.clone(), &["annotations", "_meta"]),
            without(b.clone(), &["annotations", "_meta"]),
            "a kept tool changed"
        );
        let name = b["name"].as_str().unwrap_or_default();
        let (risk, _) = decision(seed, name).expect("kept");
        assert_eq!(
            a["annotations"]["readOnlyHint"].as_bool(),
            Some(risk == Risk::Read),
            "annotations are not the policy's"
        );
        assert!(a["_meta"]["mcp-firewall/risk"].is_string());
    }
    let result = after["result"].as_object().expect("result");
    // A 2026-07-28 result (one that speaks of caching or has a type) is
    // marked private: the list is this run's.
    let modern = ["cacheScope", "ttlMs", "resultType"]
        .iter()
        .any(|k| before["result"].get(k).is_some());
    if modern {
        assert_eq!(
            result.get("cacheScope").and_then(Value::as_str),
            Some("private")
        );
    }
    if let Some(ttl) = result.get("ttlMs") {
        assert!(ttl.as_u64().is_some_and(|t| t <= MAX_TTL_MS), "ttlMs {ttl}");
    }
    // The tape's rewrite writes the raw rewrite's bytes.
    let (Some(tape), Some(node)) = (envelope.tape.as_ref(), envelope.messages[0].node) else {
        return;
    };
    let Some(at) = tape.member(text, node, "result") else {
        return;
    };
    let raw = rewrite::tools_result(&text[tape.span(at)], |t| decision(seed, t.name));
    let on_tape = rewrite::tools_result_on(text, tape, at, |tools| {
        tools
            .rewrite(None, |_| None, |t| (decision(seed, t.name), 0))
            .map(|v| v.text)
    });
    assert_eq!(raw, on_tape, "the two rewrites differ");
});
