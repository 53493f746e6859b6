//! A spool written, torn and opened again (tests and fuzz targets only):
//! rows appended and the spool closed as a process would leave it, its
//! newest segment cut at any byte or hit by a burst of changed bytes (a
//! crash mid-write, a bad sector), then recovered and read to the end.
//! What comes back must be the written rows, in order, up to some point:
//! never a row that was not written; all of them when nothing was torn.
//!
//! A burst is at most four bytes, which the records' CRC-32 always detects
//! (every burst error of 32 bits or fewer): a longer change could be made
//! to forge a record, which is writing to the spool, not tearing it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use super::{list_segments, open, segment_path, Batch, SpoolSettings};
use crate::audit::metrics::Metrics;

/// What happens to the newest segment before the spool is opened again.
#[derive(Debug, Clone, Copy)]
pub enum Tear {
    /// Nothing.
    None,
    /// Cut to this many bytes (modulo its length plus one).
    Cut(usize),
    /// These bytes XOR-ed in at this offset (modulo its length).
    Burst(usize, [u8; 4]),
}

fn runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RT: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()
    })
    .as_ref()
    .ok_or_else(|| "no runtime".to_owned())
}

/// Writes `rows` (each made a plausible row: at least 28 bytes), tears the
/// newest segment as `tear` says, opens the spool again and reads it all.
///
/// # Errors
/// What came back that was not written, or any step that failed.
pub fn torn_recovery(rows: &[Vec<u8>], tear: Tear) -> Result<(), String> {
    static N: AtomicU64 = AtomicU64::new(0);
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!(
        "mcp-firewall-torn-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let result = run(&dir, rows, tear);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(dir: &std::path::Path, rows: &[Vec<u8>], tear: Tear) -> Result<(), String> {
    let settings = SpoolSettings {
        dir: dir.to_owned(),
        // Small segments: rows span several, and rotation is torn too.
        segment_bytes: 256,
        fsync_interval: Duration::from_secs(3600),
        max_bytes: 1 << 30,
        min_free_bytes: 0,
        write_timeout: Duration::from_secs(5),
        reprobe_after: Duration::ZERO,
    };
    let rows: Vec<Vec<u8>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![0u8; 28];
            row.extend_from_slice(r);
            row
        })
        .collect();
    let spool = open(&settings, Metrics::default()).map_err(|e| e.to_string())?;
    let rt = runtime()?;
    for row in &rows {
        let appended = spool
            .shared
            .append(|b| b.extend_from_slice(row))
            .map_err(|e| e.to_string())?;
        match rt.block_on(appended.outcome()) {
            Some(Ok(())) => {}
            other => return Err(format!("a row was not written: {other:?}")),
        }
    }
    spool.shared.close();
    spool
        .syncer
        .join()
        .map_err(|_| "the spool thread panicked".to_owned())?;
    drop(spool.reader);
    drop(spool.shared);

    let torn = !matches!(tear, Tear::None);
    if let Some(seq) = list_segments(dir)
        .map_err(|e| e.to_string())?
        .into_iter()
        .rev()
        .find(|s| std::fs::metadata(segment_path(dir, *s)).is_ok_and(|m| m.len() > 16))
    {
        let path = segment_path(dir, seq);
        let mut bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
        match tear {
            Tear::None => {}
            Tear::Cut(at) => bytes.truncate(at % (bytes.len() + 1)),
            Tear::Burst(at, mask) => {
                let at = at % bytes.len();
                for (b, m) in bytes.iter_mut().skip(at).zip(mask) {
                    *b ^= m;
                }
            }
        }
        std::fs::write(&path, bytes).map_err(|e| e.to_string())?;
    }

    let mut spool = open(&settings, Metrics::default()).map_err(|e| e.to_string())?;
    let mut batch = Batch::default();
    spool
        .reader
        .fill(&mut batch, usize::MAX, usize::MAX)
        .map_err(|e| e.to_string())?;
    spool.shared.close();
    let _ = spool.syncer.join();
    let mut read = Vec::with_capacity(batch.rows);
    for (i, start) in batch.row_starts.iter().enumerate() {
        let end = batch
            .row_starts
            .get(i + 1)
            .copied()
            .unwrap_or(batch.body.len());
        read.push(batch.body.get(*start..end).unwrap_or_default());
    }
    for (i, r) in read.iter().enumerate() {
        if rows.get(i).map(Vec::as_slice) != Some(*r) {
            return Err(format!("row {i} read back is not the row written there"));
        }
    }
    if !torn && read.len() != rows.len() {
        return Err(format!(
            "{} of {} rows read back untorn",
            read.len(),
            rows.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_spools_give_back_a_prefix_of_what_was_written() {
        let rows: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; usize::from(i) * 13]).collect();
        assert_eq!(torn_recovery(&rows, Tear::None), Ok(()));
        for at in [0, 5, 16, 17, 40, 99, 250, 1000] {
            assert_eq!(torn_recovery(&rows, Tear::Cut(at)), Ok(()), "cut {at}");
            assert_eq!(
                torn_recovery(&rows, Tear::Burst(at, [1, 0x80, 0, 7])),
                Ok(()),
                "burst {at}"
            );
        }
    }
}
