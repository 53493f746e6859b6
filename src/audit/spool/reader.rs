//! Reading the spool back for the shipper: records in order from the oldest
//! unacknowledged position, never past what the writer committed, in batches
//! for one `INSERT`; deleting segments once every record in them was
//! acknowledged.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;

use super::format::{
    header_version, list_segments, next_record, record_is_bad, segment_path, MAX_RECORD_LEN,
    RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
};
use super::recovery::save_rejected;
use super::{Position, Shared, SpoolError, READ_CHUNK};

/// Records read from the spool for one `INSERT`, and the spool range they cover.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Concatenated `RowBinary` payloads: the `INSERT` body as is.
    pub body: Vec<u8>,
    /// Rows in `body`.
    pub rows: usize,
    /// Where each row starts in `body` (the shipper links each into the
    /// writer's hash chain).
    pub row_starts: Vec<usize>,
    /// `time_ms` of the first row (oldest unsent).
    pub first_time_ms: Option<u64>,
    /// Where the first row starts (names rejected files).
    pub start: Option<Position>,
    /// Position right after the last row: the cursor once acknowledged.
    pub end: Option<Position>,
    /// Sealed segments read to their end within or before this batch: deletable
    /// once this batch is acknowledged.
    pub finished_segments: Vec<u64>,
    /// When the first row entered the batch.
    pub opened: Option<Instant>,
}

impl Batch {
    /// Empties the batch, keeping the body's capacity.
    pub(crate) fn reset(&mut self) {
        self.body.clear();
        self.rows = 0;
        self.row_starts.clear();
        self.first_time_ms = None;
        self.start = None;
        self.end = None;
        self.finished_segments.clear();
        self.opened = None;
    }
}

/// Why [`SpoolReader::fill`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FillOutcome {
    /// The batch reached `max_rows` or `max_bytes`.
    Full,
    /// Everything committed so far was read.
    CaughtUp,
}

/// Reads records back in order, from the oldest unacknowledged position.
pub(crate) struct SpoolReader {
    shared: Arc<Shared>,
    /// Segment being read and the offset of the next unread record.
    pos: Position,
    file: Option<File>,
    /// Bytes read from `file` starting at `buf_offset`, not yet consumed.
    buf: Vec<u8>,
    buf_offset: u64,
    /// Consumed prefix of `buf`.
    consumed: usize,
    /// What completes each row of the segment being read: the empty values
    /// of the columns added since an earlier release wrote it (empty for
    /// this build's format).
    tail: &'static [u8],
}

impl SpoolReader {
    pub(super) fn new(shared: Arc<Shared>, pos: Position) -> Self {
        Self {
            shared,
            pos,
            file: None,
            buf: Vec::with_capacity(READ_CHUNK),
            buf_offset: pos.offset,
            consumed: 0,
            tail: &[],
        }
    }

    /// The spool this reader belongs to.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Moves committed records into `batch` until it holds `max_rows` rows or
    /// `max_bytes` bytes, or nothing more is committed. Blocking file I/O: call it
    /// from a blocking-capable thread.
    pub(crate) fn fill(
        &mut self,
        batch: &mut Batch,
        max_rows: usize,
        max_bytes: usize,
    ) -> Result<FillOutcome, SpoolError> {
        loop {
            if batch.rows >= max_rows || (batch.rows > 0 && batch.body.len() >= max_bytes) {
                return Ok(FillOutcome::Full);
            }
            let committed = self.shared.committed();
            let sealed = self.pos.seq < committed.seq;
            let limit = if sealed { u64::MAX } else { committed.offset };
            if self.pos.seq > committed.seq {
                return Ok(FillOutcome::CaughtUp);
            }
            if self.file.is_none() {
                match self.open_current()? {
                    Opened::Yes => {}
                    Opened::Moved => continue,
                    // The writer sealed its segment and could not start the
                    // next one yet (disk full): nothing more to read.
                    Opened::NotYet => return Ok(FillOutcome::CaughtUp),
                }
            }
            // Parse whatever complete records the buffer holds.
            let data = &self.buf[self.consumed..];
            let mut local = 0usize;
            let mut bad = false;
            while batch.rows < max_rows && (batch.rows == 0 || batch.body.len() < max_bytes) {
                let rec_start = self.buf_offset + (self.consumed + local) as u64;
                if rec_start >= limit {
                    break;
                }
                match next_record(data, local) {
                    Some(span) => {
                        let payload = &data[span.payload.clone()];
                        if batch.rows == 0 {
                            batch.first_time_ms = crate::audit::record::payload_time_ms(payload);
                            batch.start = Some(Position {
                                seq: self.pos.seq,
                                offset: rec_start,
                            });
                            batch.opened = Some(Instant::now());
                        }
                        batch.row_starts.push(batch.body.len());
                        batch.body.extend_from_slice(payload);
                        batch.body.extend_from_slice(self.tail);
                        batch.rows += 1;
                        local = span.end;
                        batch.end = Some(Position {
                            seq: self.pos.seq,
                            offset: self.buf_offset + (self.consumed + local) as u64,
                        });
                    }
                    None => {
                        // Incomplete in the buffer is normal (read more); a bad
                        // checksum or absurd length with the bytes present is not.
                        bad = record_is_bad(data, local);
                        break;
                    }
                }
            }
            self.consumed += local;
            self.pos.offset = self.buf_offset + self.consumed as u64;
            if bad {
                self.skip_corrupt(limit, sealed)?;
                continue;
            }
            if batch.rows >= max_rows || (batch.rows > 0 && batch.body.len() >= max_bytes) {
                return Ok(FillOutcome::Full);
            }
            if self.pos.offset >= limit {
                // Active segment fully read: wait for more.
                return Ok(FillOutcome::CaughtUp);
            }
            if !sealed && self.buf_offset + self.buf.len() as u64 >= limit {
                // Everything up to the committed length (a record boundary) is
                // buffered, yet the head record is incomplete: its length lies.
                self.skip_corrupt(limit, false)?;
                continue;
            }
            let got = self.read_more(limit)?;
            if got == 0 {
                if sealed {
                    self.finish_segment(batch)?;
                    continue;
                }
                return Ok(FillOutcome::CaughtUp);
            }
        }
    }

    /// Opens the segment at `pos.seq`, or skips to the next existing one.
    fn open_current(&mut self) -> Result<Opened, SpoolError> {
        let path = segment_path(&self.shared.dir, self.pos.seq);
        match File::open(&path) {
            Ok(f) => {
                let mut header = [0u8; SEGMENT_HEADER_LEN as usize];
                let version = f
                    .read_exact_at(&mut header, 0)
                    .ok()
                    .and_then(|()| header_version(&header));
                self.tail = match version {
                    Some(super::format::LEGACY_VERSION) => &crate::audit::record::LEGACY_TAIL,
                    Some(super::format::SCREENING_VERSION) => &crate::audit::record::SCREENING_TAIL,
                    Some(super::format::VIRTUAL_VERSION) => &crate::audit::record::VIRTUAL_TAIL,
                    Some(super::format::APPROVAL_VERSION) => &crate::audit::record::APPROVAL_TAIL,
                    Some(super::format::SHADOW_VERSION) => &crate::audit::record::SHADOW_TAIL,
                    _ => &[],
                };
                if version.is_none() {
                    tracing::error!(segment = %path.display(), "audit spool: segment header unreadable; skipping segment");
                    self.file = Some(f);
                    self.buf.clear();
                    self.consumed = 0;
                    self.buf_offset = 0;
                    self.pos.offset = 0;
                    self.skip_corrupt(u64::MAX, true)?;
                    return Ok(Opened::Moved);
                }
                if self.pos.offset < SEGMENT_HEADER_LEN {
                    self.pos.offset = SEGMENT_HEADER_LEN;
                }
                self.file = Some(f);
                self.buf.clear();
                self.consumed = 0;
                self.buf_offset = self.pos.offset;
                Ok(Opened::Yes)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // A gap (e.g. a segment that could not be created): jump to the next
                // existing segment, if any.
                let next = list_segments(&self.shared.dir)?
                    .into_iter()
                    .find(|&s| s > self.pos.seq);
                match next {
                    Some(s) => {
                        self.pos = Position {
                            seq: s,
                            offset: SEGMENT_HEADER_LEN,
                        };
                        Ok(Opened::Moved)
                    }
                    None => {
                        let committed = self.shared.committed();
                        if committed.seq > self.pos.seq {
                            self.pos = Position {
                                seq: committed.seq,
                                offset: SEGMENT_HEADER_LEN,
                            };
                            Ok(Opened::Moved)
                        } else {
                            // The segment the writer will create next.
                            Ok(Opened::NotYet)
                        }
                    }
                }
            }
            Err(e) => Err(SpoolError::dir(&path, e)),
        }
    }

    /// Reads the next chunk (up to `limit`) into the buffer, dropping consumed bytes.
    fn read_more(&mut self, limit: u64) -> Result<usize, SpoolError> {
        let Some(file) = &self.file else { return Ok(0) };
        if self.consumed > 0 {
            self.buf.drain(..self.consumed);
            self.buf_offset += self.consumed as u64;
            self.consumed = 0;
        }
        let read_at = self.buf_offset + self.buf.len() as u64;
        // At least the rest of the head record, else a full chunk; never past `limit`.
        let want = usize::try_from(limit.saturating_sub(read_at))
            .unwrap_or(usize::MAX)
            .min(READ_CHUNK.max(self.needed_for_next_record()));
        if want == 0 {
            return Ok(0);
        }
        let old = self.buf.len();
        // Zero-filling is the price of reading without `unsafe`: one memset per
        // chunk, small next to the copy into the batch.
        self.buf.resize(old + want, 0);
        let mut filled = 0;
        while filled < want {
            match file.read_at(&mut self.buf[old + filled..], read_at + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.buf.truncate(old);
                    let path = segment_path(&self.shared.dir, self.pos.seq);
                    return Err(SpoolError::dir(&path, e));
                }
            }
        }
        self.buf.truncate(old + filled);
        Ok(filled)
    }

    /// Bytes the buffer must hold for the record at its head to be complete.
    fn needed_for_next_record(&self) -> usize {
        let data = &self.buf[self.consumed..];
        match data.get(..4) {
            Some(h) => {
                let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
                (len.min(MAX_RECORD_LEN) + RECORD_HEADER_LEN).saturating_sub(data.len())
            }
            None => RECORD_HEADER_LEN,
        }
    }

    /// Moves unreadable bytes from the read position to the end of the readable
    /// region (EOF when sealed, the committed length otherwise, which is a record
    /// boundary) into `rejected/`, and resumes after them.
    fn skip_corrupt(&mut self, limit: u64, sealed: bool) -> Result<(), SpoolError> {
        let from = self.pos.offset;
        let path = segment_path(&self.shared.dir, self.pos.seq);
        let Some(file) = &self.file else {
            return Ok(());
        };
        let end = if sealed {
            file.metadata()
                .map_err(|e| SpoolError::dir(&path, e))?
                .len()
        } else {
            limit
        };
        let len = usize::try_from(end.saturating_sub(from)).unwrap_or(0);
        let mut bytes = vec![0u8; len];
        file.read_exact_at(&mut bytes, from)
            .map_err(|e| SpoolError::dir(&path, e))?;
        let saved = save_rejected(&self.shared.dir, self.pos.seq, from, "corrupt", &bytes)?;
        tracing::error!(
            segment = %path.display(),
            offset = from,
            bytes = len,
            saved = %saved.display(),
            "audit spool: corrupt records; moved to rejected/"
        );
        self.shared.metrics.corrupt_bytes(len as u64);
        self.buf.clear();
        self.consumed = 0;
        self.pos.offset = end;
        self.buf_offset = end;
        Ok(())
    }

    /// The current sealed segment is read to its end: note it and move on.
    fn finish_segment(&mut self, batch: &mut Batch) -> Result<(), SpoolError> {
        // Bytes still buffered at EOF are a torn tail (the writer abandoned the
        // segment after a failed rollback): keep them in rejected/.
        if self.consumed < self.buf.len() {
            let rest = self.buf[self.consumed..].to_vec();
            save_rejected(
                &self.shared.dir,
                self.pos.seq,
                self.pos.offset,
                "corrupt",
                &rest,
            )?;
            self.shared.metrics.corrupt_bytes(rest.len() as u64);
        }
        batch.finished_segments.push(self.pos.seq);
        self.file = None;
        self.buf.clear();
        self.consumed = 0;
        self.pos = Position {
            seq: self.pos.seq + 1,
            offset: SEGMENT_HEADER_LEN,
        };
        self.buf_offset = SEGMENT_HEADER_LEN;
        Ok(())
    }
}

/// What [`SpoolReader::open_current`] did.
enum Opened {
    /// The current segment is open.
    Yes,
    /// It moved to another segment (or past a corrupt one): look again.
    Moved,
    /// The current segment does not exist yet: the writer will create it.
    NotYet,
}

/// Deletes segments whose rows were all acknowledged and releases their bytes.
pub(crate) fn delete_segments(shared: &Shared, seqs: &[u64]) {
    for &seq in seqs {
        let path = segment_path(&shared.dir, seq);
        match fs::metadata(&path).and_then(|m| fs::remove_file(&path).map(|()| m.len())) {
            Ok(len) => shared.release(len),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::error!(segment = %path.display(), error = %e, "audit spool: cannot delete shipped segment");
            }
        }
    }
}
