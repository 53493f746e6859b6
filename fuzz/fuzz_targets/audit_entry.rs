//! Chain entries as `audit verify` reads them from ClickHouse (RowBinary):
//! an entry it decodes encodes back to exactly the bytes it was read from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::audit::chain::{encode_entry, Entry};

fuzz_target!(|data: &[u8]| {
    if let Some((e, n)) = Entry::decode(data) {
        assert!(n <= data.len());
        let mut row = e.event_id.to_vec();
        row.extend_from_slice(&[0; 4]);
        row.extend_from_slice(&e.time_ms.to_le_bytes());
        let mut back = Vec::new();
        encode_entry(
            &e.writer_id,
            &e.link,
            &row,
            e.row_version,
            e.chained_s,
            &mut back,
        );
        // A legacy entry's link reads back as its row hash: its stored link
        // is empty.
        if e.link.legacy {
            assert!(data[..n].ends_with(&[0; 32]));
        }
        assert_eq!(
            back,
            data[..n],
            "an entry does not encode back to its bytes"
        );
    }
});
