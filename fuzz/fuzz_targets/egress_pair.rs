//! The egress proxy's `host:port` reader (allow-list entries and CONNECT
//! targets): what it accepts, written back, reads as the same pair.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::internals::parse_pair;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some((host, port)) = parse_pair(text) {
        assert!(port > 0);
        assert_eq!(host, host.to_ascii_lowercase());
        let again = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        assert_eq!(parse_pair(&again), Some((host, port)), "{text:?}");
    }
});
