//! The spool's file format: segment names, the 16-byte segment header, and
//! `[len u32 LE][crc32 u32 LE][payload]` records; finding the whole,
//! checksum-valid records in a segment's bytes. No I/O beyond listing and
//! naming files.

use std::fs;
use std::path::{Path, PathBuf};

use super::SpoolError;

/// First bytes of every segment.
pub(super) const MAGIC: &[u8; 8] = b"MCPFWAUD";

/// Segment format written by this build; bump when the row layout changes.
/// 2: rows end with the screening and label columns.
/// 3: and then `virtual_server`.
/// 4: and then the approval, policy, pin and delegation columns.
/// 5: and then `shadow_decision` and `principal_claims`.
/// 6: and then `upstream_auth` and `credential_id`.
pub(super) const FORMAT_VERSION: u32 = 6;

/// The format of releases before delegated upstream credentials: the
/// reader completes its rows with [`crate::audit::record::SHADOW_TAIL`].
pub(super) const SHADOW_VERSION: u32 = 5;

/// The format of releases before the shadow policy: the reader completes
/// its rows with [`crate::audit::record::APPROVAL_TAIL`].
pub(super) const APPROVAL_VERSION: u32 = 4;

/// The format of releases with virtual servers but before the approval,
/// policy, pin and delegation columns: the reader completes its rows with
/// [`crate::audit::record::VIRTUAL_TAIL`].
pub(super) const VIRTUAL_VERSION: u32 = 3;

/// The format of releases with screening but before virtual servers: the
/// reader completes its rows with [`crate::audit::record::SCREENING_TAIL`].
pub(super) const SCREENING_VERSION: u32 = 2;

/// The format of releases before content screening: its rows lack the
/// last columns, which the reader completes
/// ([`crate::audit::record::LEGACY_TAIL`]).
pub(super) const LEGACY_VERSION: u32 = 1;

/// Size of the segment header.
pub(crate) const SEGMENT_HEADER_LEN: u64 = 16;

/// `len` + `crc` before each payload.
pub(super) const RECORD_HEADER_LEN: usize = 8;

/// Larger lengths are corruption, not rows; bounds what a garbage header can allocate.
pub(crate) const MAX_RECORD_LEN: usize = 16 << 20;

pub(crate) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.seg"))
}

/// Segment numbers present in `dir`, ascending.
pub(crate) fn list_segments(dir: &Path) -> Result<Vec<u64>, SpoolError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| SpoolError::dir(dir, e))? {
        let entry = entry.map_err(|e| SpoolError::dir(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(num) = name.strip_suffix(".seg") {
            if num.len() == 20 {
                if let Ok(seq) = num.parse::<u64>() {
                    out.push(seq);
                }
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The payloads of a segment's whole, checksum-valid records, in order
/// (read-only: `mcp-firewall audit tail --spool` reads a live spool).
pub(crate) fn payloads(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    if !header_ok(data) {
        return out;
    }
    let mut pos = SEGMENT_HEADER_LEN as usize;
    while let Some(next) = next_record(data, pos) {
        if let Some(p) = data.get(next.payload.clone()) {
            out.push(p);
        }
        pos = next.end;
    }
    out
}

/// Length of the longest prefix of a segment made of a valid header and whole,
/// checksum-correct records. 0 when the header itself is missing or wrong.
pub(crate) fn valid_prefix(data: &[u8]) -> usize {
    if !header_ok(data) {
        return 0;
    }
    let mut pos = SEGMENT_HEADER_LEN as usize;
    while let Some(next) = next_record(data, pos) {
        pos = next.end;
    }
    pos
}

pub(super) fn header_ok(data: &[u8]) -> bool {
    header_version(data).is_some()
}

/// The format version of a segment header this build reads.
pub(super) fn header_version(data: &[u8]) -> Option<u32> {
    if data.len() < SEGMENT_HEADER_LEN as usize || &data[..8] != MAGIC {
        return None;
    }
    let v = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
    [
        FORMAT_VERSION,
        SHADOW_VERSION,
        APPROVAL_VERSION,
        VIRTUAL_VERSION,
        SCREENING_VERSION,
        LEGACY_VERSION,
    ]
    .contains(&v)
    .then_some(v)
}

/// A record found in a buffer: payload range and where the next record starts.
pub(super) struct RecordSpan {
    pub(super) payload: std::ops::Range<usize>,
    pub(super) end: usize,
}

/// The complete, checksum-valid record at `pos`, or `None` (incomplete or bad).
pub(super) fn next_record(data: &[u8], pos: usize) -> Option<RecordSpan> {
    let header = data.get(pos..pos + RECORD_HEADER_LEN)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len > MAX_RECORD_LEN {
        return None;
    }
    let start = pos + RECORD_HEADER_LEN;
    let payload = data.get(start..start + len)?;
    (crc32fast::hash(payload) == crc).then_some(RecordSpan {
        payload: start..start + len,
        end: start + len,
    })
}

/// At `pos` the bytes for a full record are present but it does not validate.
pub(super) fn record_is_bad(data: &[u8], pos: usize) -> bool {
    let Some(header) = data.get(pos..pos + RECORD_HEADER_LEN) else {
        return false;
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len > MAX_RECORD_LEN {
        return true;
    }
    data.len() >= pos + RECORD_HEADER_LEN + len
}
