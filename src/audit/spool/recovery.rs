//! What survives a restart: at start, segments already acknowledged are
//! deleted, torn or corrupt segment tails are cut (the bytes kept in
//! `rejected/`) and the reader's start is found; the cursor file keeps the last position
//! ClickHouse acknowledged, and the chain head file the hash chain's head
//! there; batches ClickHouse refused as bad data are saved for replay.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::format::{list_segments, segment_path, valid_prefix, SEGMENT_HEADER_LEN};
use super::{injected, Position, SpoolError};

/// What opening an existing spool found.
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    /// Segments found (not yet shipped), before a new one was started.
    pub segments: usize,
    /// Bytes cut from torn or corrupt tails (kept in `rejected/`).
    pub cut_bytes: u64,
}

/// What the segments a previous process left hold.
pub(super) struct Found {
    pub(super) recovery: Recovery,
    /// Bytes of the segments kept.
    pub(super) on_disk: u64,
    /// The highest segment number seen (or the cursor's).
    pub(super) last_seq: u64,
    /// Where the reader starts.
    pub(super) start: Position,
}

/// Deletes the segments before the `cursor`, repairs the others' tails, and
/// finds where reading starts.
pub(super) fn recover(dir: &Path, cursor: Option<Position>) -> Result<Found, SpoolError> {
    let mut recovery = Recovery::default();
    let mut on_disk = 0u64;
    // Numbering continues past the cursor too: if every segment was shipped and
    // deleted, a new segment must not reuse a number the cursor points into.
    let mut last_seq = cursor.map_or(0, |c| c.seq);
    let mut remaining = Vec::new();
    for seq in list_segments(dir)? {
        last_seq = last_seq.max(seq);
        let path = segment_path(dir, seq);
        // Segments before the cursor were fully acknowledged; a crash between the
        // cursor write and the delete leaves them behind.
        if cursor.is_some_and(|c| seq < c.seq) {
            fs::remove_file(&path).map_err(|e| SpoolError::dir(&path, e))?;
            continue;
        }
        let (cut, len) = repair_segment(dir, seq)?;
        recovery.cut_bytes += cut;
        if let Some(len) = len {
            on_disk += len;
            recovery.segments += 1;
            remaining.push(seq);
        }
    }
    let start = match (cursor, remaining.first()) {
        (Some(c), Some(&first)) if c.seq == first => c,
        (_, Some(&first)) => Position {
            seq: first,
            offset: SEGMENT_HEADER_LEN,
        },
        (_, None) => Position {
            seq: last_seq + 1,
            offset: SEGMENT_HEADER_LEN,
        },
    };
    Ok(Found {
        recovery,
        on_disk,
        last_seq,
        start,
    })
}

/// Scans a segment left by a previous process and cuts any torn or corrupt tail,
/// saving the cut bytes to `rejected/`. Returns the bytes cut and the segment's
/// remaining length (`None`: removed, it had no valid header).
pub(super) fn repair_segment(dir: &Path, seq: u64) -> Result<(u64, Option<u64>), SpoolError> {
    let path = segment_path(dir, seq);
    let data = fs::read(&path).map_err(|e| SpoolError::dir(&path, e))?;
    let valid = valid_prefix(&data);
    if valid == data.len() {
        return Ok((0, Some(valid as u64)));
    }
    let cut = (data.len() - valid) as u64;
    // A header-less file (crash right after create) holds no rows: remove it.
    if valid == 0 {
        tracing::warn!(segment = %path.display(), bytes = cut, "audit spool: removing segment without a valid header");
        keep_rejected(dir, seq, 0, &data);
        fs::remove_file(&path).map_err(|e| SpoolError::dir(&path, e))?;
        return Ok((cut, None));
    }
    tracing::warn!(
        segment = %path.display(),
        valid_bytes = valid,
        cut_bytes = cut,
        "audit spool: torn record at segment end (crash during write); truncating"
    );
    keep_rejected(dir, seq, valid as u64, &data[valid..]);
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| SpoolError::dir(&path, e))?;
    f.set_len(valid as u64)
        .and_then(|()| f.sync_all())
        .map_err(|e| SpoolError::dir(&path, e))?;
    Ok((cut, Some(valid as u64)))
}

/// Saves cut bytes at start-up when the disk allows; on a full disk they are
/// logged and dropped (they are a torn tail, never an acknowledged row).
pub(super) fn keep_rejected(dir: &Path, seq: u64, offset: u64, bytes: &[u8]) {
    if let Err(e) = save_rejected(dir, seq, offset, "corrupt", bytes) {
        tracing::error!(error = %e, bytes = bytes.len(), "audit spool: cannot keep the torn tail in rejected/ (disk full?); it held no acknowledged row");
    }
}

/// Writes `bytes` to `rejected/<seq>-<offset>.<kind>` and fsyncs it.
pub(crate) fn save_rejected(
    dir: &Path,
    seq: u64,
    offset: u64,
    kind: &str,
    bytes: &[u8],
) -> Result<PathBuf, SpoolError> {
    let path = dir
        .join("rejected")
        .join(format!("{seq:020}-{offset:012}.{kind}"));
    let write = || -> io::Result<()> {
        injected(dir)?;
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    write().map_err(|e| SpoolError::dir(&path, e))?;
    Ok(path)
}

/// The cursor file: last acknowledged position, with a crc so a torn write is
/// recognised (and ignored: replaying more is safe, rows are deduplicated).
pub(crate) fn read_cursor(dir: &Path) -> Option<Position> {
    let body = read_checked(dir, "cursor", 16)?;
    Some(Position {
        seq: u64_at(&body, 0)?,
        offset: u64_at(&body, 8)?,
    })
}

/// Rewrites the cursor file in place: 20 bytes over the old 20, which needs
/// no new disk block, so a full disk cannot leave the cursor missing or
/// empty. A torn write fails its crc and reads as no cursor: the spool then
/// replays from its oldest segment, rows ClickHouse deduplicates. No fsync,
/// for the same reason.
pub(crate) fn write_cursor(dir: &Path, pos: Position) -> io::Result<()> {
    let mut body = [0u8; 16];
    body[..8].copy_from_slice(&pos.seq.to_le_bytes());
    body[8..].copy_from_slice(&pos.offset.to_le_bytes());
    write_checked(dir, "cursor", &body)
}

/// Length of the chain head file's body (a release before links wrote
/// [`LEGACY_HEAD_LEN`] bytes: no `linked_from`).
const HEAD_LEN: usize = 8 + 8 + 8 + 8 + 32 + 8;
const LEGACY_HEAD_LEN: usize = HEAD_LEN - 8;

/// The hash chain's head at an acknowledged spool position: the last row
/// shipped before `at` was row `seq` of writer `writer_id` (only a digest of
/// the id is kept) with hash `hash`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChainHead {
    /// The cursor position it belongs to.
    pub at: Position,
    /// The first 8 bytes of SHA-256(writer_id).
    pub writer_tag: [u8; 8],
    /// The last linked row.
    pub seq: u64,
    /// Its link.
    pub hash: [u8; 32],
    /// The first `seq` of the writer's chain that was linked (0: the head
    /// of a release before links, whose chain so far is legacy).
    pub linked_from: u64,
}

/// The chain head file (`chain`), written right after each cursor update:
/// the shipper continues the chain from it when its position is the
/// cursor's, and otherwise (a crash between the two writes, a torn write,
/// a spool of an older release) asks ClickHouse. Same in-place, crc-checked
/// write as the cursor.
pub(crate) fn read_chain_head(dir: &Path) -> Option<ChainHead> {
    let body = read_checked(dir, "chain", HEAD_LEN)
        .or_else(|| read_checked(dir, "chain", LEGACY_HEAD_LEN))?;
    Some(ChainHead {
        at: Position {
            seq: u64_at(&body, 0)?,
            offset: u64_at(&body, 8)?,
        },
        writer_tag: body.get(16..24)?.try_into().ok()?,
        seq: u64_at(&body, 24)?,
        hash: body.get(32..64)?.try_into().ok()?,
        linked_from: u64_at(&body, 64).unwrap_or(0),
    })
}

/// Rewrites the chain head file in place (see [`read_chain_head`]).
pub(crate) fn write_chain_head(dir: &Path, head: &ChainHead) -> io::Result<()> {
    let mut body = [0u8; HEAD_LEN];
    body[..8].copy_from_slice(&head.at.seq.to_le_bytes());
    body[8..16].copy_from_slice(&head.at.offset.to_le_bytes());
    body[16..24].copy_from_slice(&head.writer_tag);
    body[24..32].copy_from_slice(&head.seq.to_le_bytes());
    body[32..64].copy_from_slice(&head.hash);
    body[64..72].copy_from_slice(&head.linked_from.to_le_bytes());
    write_checked(dir, "chain", &body)
}

/// The body of a small state file written by [`write_checked`], if whole:
/// `len` bytes and their crc32.
fn read_checked(dir: &Path, name: &str, len: usize) -> Option<Vec<u8>> {
    let mut data = fs::read(dir.join(name)).ok()?;
    if data.len() != len + 4 {
        return None;
    }
    let crc = u32::from_le_bytes(data.get(len..)?.try_into().ok()?);
    data.truncate(len);
    (crc32fast::hash(&data) == crc).then_some(data)
}

/// Rewrites a small state file in place: `body`, then its crc32 (LE).
fn write_checked(dir: &Path, name: &str, body: &[u8]) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(body.len() + 4);
    bytes.extend_from_slice(body);
    bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    injected(dir)?;
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(name))?;
    f.write_all_at(&bytes, 0)?;
    if f.metadata()?.len() > bytes.len() as u64 {
        f.set_len(bytes.len() as u64)?;
    }
    Ok(())
}

fn u64_at(body: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?))
}
