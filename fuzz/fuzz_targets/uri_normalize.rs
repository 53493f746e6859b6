//! Resource URI normalization: what it accepts it normalizes idempotently
//! (a normalized URI normalizes to itself), and never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::policy::uri::normalize;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(once) = normalize(text) {
        let twice = normalize(&once).expect("a normalized URI normalizes");
        assert_eq!(once, twice, "normalization is not idempotent for {text:?}");
    }
});
