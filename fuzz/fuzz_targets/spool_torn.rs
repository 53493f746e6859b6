//! The spool after a crash or a bad disk: rows written, the spool closed,
//! its newest segment cut anywhere or hit by a burst of up to four changed
//! bytes, then opened again. What is read back is the written rows, in
//! order, up to some point: never a row that was not written, never a
//! panic; untouched, every row.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::audit::spool_torn::{torn_recovery, Tear};

fuzz_target!(|data: &[u8]| {
    let Some((&op, rest)) = data.split_first() else {
        return;
    };
    // Rows: the bytes between 0xff separators (at most 16).
    let rows: Vec<Vec<u8>> = rest
        .split(|&b| b == 0xff)
        .take(16)
        .map(<[u8]>::to_vec)
        .collect();
    let at = rest.len().wrapping_mul(usize::from(op)).wrapping_add(17);
    let tear = match op % 3 {
        0 => Tear::None,
        1 => Tear::Cut(at),
        _ => Tear::Burst(at, [op | 1, op.rotate_left(3), op ^ 0x5a, 0]),
    };
    if let Err(e) = torn_recovery(&rows, tear) {
        panic!("{e}");
    }
});
