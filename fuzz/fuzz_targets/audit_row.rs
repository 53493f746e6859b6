//! Audit rows in RowBinary (the spool's payloads, `audit verify`'s and
//! `audit tail`'s input): the row's extent is one answer whoever asks. A
//! row `row_len` finds decodes; a whole row decodes only to its own
//! length; `hashed_part` and `row_version` never read past the row.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::audit::{decode_row, hashed_part, row_len, row_version};

fuzz_target!(|data: &[u8]| {
    let n = row_len(data);
    if let Some(n) = n {
        assert!(n <= data.len());
        let row = &data[..n];
        assert!(
            decode_row(row).is_some(),
            "a row by its length does not decode"
        );
        assert!(row_version(row).is_some());
        let h = hashed_part(row);
        assert!(row.starts_with(h));
    }
    if decode_row(data).is_some() {
        // A whole row, or one of an earlier release's shorter forms.
        if let Some(n) = n {
            assert_eq!(n, data.len(), "a row decodes past its length");
        }
    }
});
