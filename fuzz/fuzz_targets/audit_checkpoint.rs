//! Signed checkpoints as `audit verify` reads them (the table's RowBinary,
//! a checkpoint file's JSON lines): what decodes encodes back to the same
//! bytes, and a line reads back as itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::audit::chain::SignedCheckpoint;

fuzz_target!(|data: &[u8]| {
    if let Some((cp, n)) = SignedCheckpoint::decode(data) {
        let mut back = Vec::new();
        cp.encode(&mut back);
        // The trailing DateTime is derived from time_ms on encode.
        assert_eq!(
            back[..back.len() - 4],
            data[..n - 4],
            "a checkpoint does not encode back"
        );
    }
    if let Ok(line) = std::str::from_utf8(data) {
        if let Some(cp) = SignedCheckpoint::from_line(line) {
            assert_eq!(SignedCheckpoint::from_line(&cp.to_line()), Some(cp));
        }
    }
});
