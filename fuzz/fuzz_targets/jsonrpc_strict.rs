//! The request reader is stricter than JSON: whatever it accepts,
//! `serde_json` accepts too (it never reads bytes that are not JSON), and
//! it never panics on anything.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::mcp::jsonrpc::{parse, parse_upstream, Limits};

fuzz_target!(|data: &[u8]| {
    let strict = parse(data, &Limits::default()).is_ok();
    let upstream = parse_upstream(data).is_ok();
    if strict || upstream {
        assert!(
            serde_json::from_slice::<serde_json::Value>(data).is_ok(),
            "accepted bytes that are not JSON"
        );
    }
});
