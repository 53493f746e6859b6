//! The spool's write side: the group-commit queue, the active segment, the
//! syncer thread, and opening a spool directory under its lock.

use super::super::metrics::Metrics;
use super::*;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::sync::{oneshot, Notify};

/// After a failed write, [`Shared::accepting`] says no for this long, then lets
/// one more attempt probe the disk.
pub(crate) const REPROBE_AFTER: Duration = Duration::from_secs(1);
/// Bytes requested per read of a segment: large reads, few syscalls.
pub(super) const READ_CHUNK: usize = 1 << 20;
/// A write slower than this makes the disk count as slow ([`SLOW_FOR`]).
pub(super) const SLOW_WRITE: Duration = Duration::from_millis(20);
/// How long after a slow write callers hand their rows to the spool thread.
pub(super) const SLOW_FOR: Duration = Duration::from_secs(1);
/// Groups one leader writes before handing the queue to the spool thread.
pub(super) const LEADER_ROUNDS: usize = 8;
/// How often the spool thread looks for work when `fsync_interval_ms` is 0.
pub(super) const IDLE_TICK: Duration = Duration::from_secs(1);

/// Why the spool could not take or give back a row.
#[derive(Debug, Clone, Error)]
pub enum SpoolError {
    /// Accepting the row would exceed `spool.max_bytes`.
    #[error("audit spool is full: {used} bytes held, limit {max}")]
    Full {
        /// Bytes on disk plus bytes queued.
        used: u64,
        /// `spool.max_bytes`.
        max: u64,
    },
    /// One encoded row is larger than a record may be.
    #[error("audit row is {len} bytes, over the {max}-byte record limit")]
    TooLarge {
        /// Encoded size.
        len: usize,
        /// The record size limit (16 MiB).
        max: usize,
    },
    /// `write(2)` to the active segment failed (disk full, I/O error).
    #[error("writing audit spool segment {path}: {source}")]
    Write {
        /// Segment file.
        path: PathBuf,
        /// The OS error, shared by every caller of the failed group.
        #[source]
        source: Arc<io::Error>,
    },
    /// A new segment could not be created (directory gone or unwritable).
    #[error("creating audit spool segment {path}: {source}")]
    CreateSegment {
        /// Segment file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The spool directory cannot be prepared or read.
    #[error("audit spool directory {path}: {source}")]
    Dir {
        /// Directory or file inside it.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: Arc<io::Error>,
    },
    /// Another process holds the spool's `LOCK`.
    #[error("audit spool {path} is locked by another process")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The spool was shut down; no more rows are accepted.
    #[error("audit spool is shut down")]
    Closed,
    /// The spool's filesystem has less free space than `spool.min_free_bytes`.
    #[error("audit spool disk is nearly full: {free} bytes free, {min} required")]
    LowSpace {
        /// Free bytes on the spool's filesystem.
        free: u64,
        /// `spool.min_free_bytes`.
        min: u64,
    },
    /// A write has been in progress longer than `spool.write_timeout_ms`.
    #[error("audit spool write stalled for more than {ms} ms (disk frozen or failing)")]
    Stalled {
        /// The deadline.
        ms: u64,
    },
}

impl SpoolError {
    pub(crate) fn dir(path: &Path, e: io::Error) -> Self {
        Self::Dir {
            path: path.to_owned(),
            source: Arc::new(e),
        }
    }
}

/// A caller's acknowledgement channel: `Ok` once its row's write returned.
pub(crate) type Ack = oneshot::Receiver<Result<(), SpoolError>>;
pub(super) type AckSender = oneshot::Sender<Result<(), SpoolError>>;

/// What [`Shared::append`] did with a row.
#[derive(Debug)]
pub(crate) enum Appended {
    /// The caller led the group write: the row is written (or the write failed).
    Written(Result<(), SpoolError>),
    /// Another caller (or the spool thread) is writing; it acknowledges this row
    /// after the group that holds it was written.
    Queued(Ack),
}

impl Appended {
    /// The outcome of the row's write; `None` if its writer went away without
    /// acknowledging (it panicked).
    pub(crate) async fn outcome(self) -> Option<Result<(), SpoolError>> {
        match self {
            Appended::Written(result) => Some(result),
            Appended::Queued(ack) => ack.await.ok(),
        }
    }
}

/// Rows waiting for the next group write, and who writes them.
pub(super) struct Queue {
    /// Framed records, ready to append.
    buf: Vec<u8>,
    /// One acknowledgement per queued record (the leader's own row has none).
    waiters: Vec<AckSender>,
    /// A leader is writing; new rows queue behind it.
    writing: bool,
    /// A leader used up its rounds: the spool thread takes over writing.
    handed_off: bool,
    /// Set by shutdown; queued rows are still written, new ones refused.
    closed: bool,
}

/// Position in the spool: segment number and byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Position {
    /// Segment number.
    pub seq: u64,
    /// Byte offset inside the segment.
    pub offset: u64,
}

/// State shared by callers, the spool thread and the shipper's reader.
pub(crate) struct Shared {
    pub(super) dir: PathBuf,
    queue: Mutex<Queue>,
    /// Wakes the spool thread (hand-off, shutdown); paired with `queue`.
    wake_syncer: Condvar,
    /// The segment being appended to. Locked by whoever writes (a serving
    /// thread its own row, a leader its group) and briefly by the spool
    /// thread; never taken while `queue` is held. A `parking_lot` mutex for
    /// its bounded wait ([`parking_lot::Mutex::try_lock_for`]).
    log: parking_lot::Mutex<Log>,
    /// Active segment and how much of it is fully written (readers stop there).
    committed: Mutex<Position>,
    /// Wakes the shipper when new records were committed.
    pub(crate) new_data: Notify,
    /// Bytes of segments on disk (headers included).
    bytes_on_disk: AtomicU64,
    max_bytes: u64,
    segment_bytes: u64,
    fsync_interval: Duration,
    /// False after a failed write or segment creation, true after the next success.
    healthy: AtomicBool,
    /// When `healthy` last turned false.
    failed_at: Mutex<Option<Instant>>,
    /// Set when a row was refused for lack of room, cleared when segments are freed.
    full: AtomicBool,
    /// Free bytes on the spool's filesystem are below `min_free_bytes`.
    low_space: AtomicBool,
    /// Free bytes last seen (statvfs), for the error.
    free_bytes: AtomicU64,
    min_free_bytes: u64,
    /// Milliseconds since `epoch` when the write in progress started; 0 when
    /// none is.
    writing_since: AtomicU64,
    /// Milliseconds since `epoch` until which the disk counts as slow (a
    /// write took longer than [`SLOW_WRITE`]): callers hand their rows to
    /// the spool thread meanwhile instead of writing them themselves.
    slow_until: AtomicU64,
    epoch: Instant,
    /// The write deadline.
    write_timeout: Duration,
    /// See [`SpoolSettings::reprobe_after`].
    reprobe_after: Duration,
    /// Failed writes since the spool last wrote successfully (the outage's
    /// size, logged when it ends).
    failures: AtomicU64,
    pub(super) metrics: Metrics,
    /// Held open so the `flock` lasts as long as the spool.
    _lock: File,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // No code panics while holding the lock, so a poisoned lock's data is intact.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writer's published position: active segment and committed length.
    pub(crate) fn committed(&self) -> Position {
        *self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, pos: Position) {
        *self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = pos;
    }

    /// Whether a row would likely be accepted: no row was refused for lack of
    /// room since segments were last freed, and the last write (or segment
    /// creation) succeeded or failed more than `reprobe_after` ago. The
    /// re-probe matters: callers that stop calling `record` on `false` would
    /// otherwise never learn that the disk recovered.
    pub(crate) fn accepting(&self) -> bool {
        if self.full.load(Ordering::Relaxed) || self.low_space.load(Ordering::Relaxed) {
            return false;
        }
        if self.stalled().is_some() {
            return false;
        }
        self.healthy.load(Ordering::Relaxed)
            || self
                .failed_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_none_or(|t| t.elapsed() >= self.reprobe_after)
    }

    /// How long the write in progress has run, when past the deadline.
    pub(crate) fn stalled(&self) -> Option<Duration> {
        let since = self.writing_since.load(Ordering::Relaxed);
        if since == 0 {
            return None;
        }
        let now = self.epoch.elapsed().as_millis() as u64;
        let running = Duration::from_millis(now.saturating_sub(since));
        (running > self.write_timeout).then_some(running)
    }

    /// The write deadline.
    pub(crate) fn write_timeout(&self) -> Duration {
        self.write_timeout
    }

    /// Whether a recent write was slow: callers do not write themselves then.
    fn disk_slow(&self) -> bool {
        let until = self.slow_until.load(Ordering::Relaxed);
        until != 0 && (self.epoch.elapsed().as_millis() as u64) < until
    }

    /// A write took `took`: for [`SLOW_FOR`] from now, rows are written by
    /// the spool thread (whose stall holds no caller), and the first slow
    /// write of a spell logs one line.
    fn note_slow(&self, took: Duration) {
        let now = self.epoch.elapsed().as_millis() as u64;
        let was = self
            .slow_until
            .swap(now + SLOW_FOR.as_millis() as u64, Ordering::Relaxed);
        if was <= now {
            tracing::warn!(ms = took.as_millis() as u64, "audit spool: a write was slow; the spool thread writes rows until the disk is fast again");
            self.metrics.spool_slow_write();
        }
    }

    fn begin_write(&self) {
        let now = (self.epoch.elapsed().as_millis() as u64).max(1);
        self.writing_since.store(now, Ordering::Relaxed);
    }

    fn end_write(&self) {
        self.writing_since.store(0, Ordering::Relaxed);
    }

    /// A write failed: the first failure of an outage logs one ERROR line;
    /// the rest only count.
    fn note_write_failure(&self, what: &str, path: &Path, e: &io::Error) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            tracing::error!(file = %path.display(), error = %e, "audit spool: {what} failed; rows are refused or served unaudited by the fail modes until the disk works again");
        }
        self.metrics.spool_write_failure();
    }

    /// A write succeeded: an outage that was going on ends with one line.
    fn note_write_success(&self) {
        let n = self.failures.swap(0, Ordering::Relaxed);
        if n > 0 {
            tracing::error!(
                failed_writes = n,
                "audit spool: writing again; the disk outage is over"
            );
        }
    }

    /// Re-reads the free space of the spool's filesystem (the spool thread,
    /// once a tick).
    fn check_free_space(&self) {
        if self.min_free_bytes == 0 {
            return;
        }
        let Ok(st) = rustix::fs::statvfs(&self.dir) else {
            return;
        };
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        self.free_bytes.store(free, Ordering::Relaxed);
        self.metrics.set_spool_free_bytes(free);
        let low = free < self.min_free_bytes;
        let was = self.low_space.swap(low, Ordering::Relaxed);
        if low && !was {
            tracing::error!(free, min = self.min_free_bytes, dir = %self.dir.display(), "audit spool: disk nearly full; new rows are refused (fail-closed risks are not served)");
        } else if was && !low {
            tracing::error!(free, dir = %self.dir.display(), "audit spool: disk space is back; rows are accepted again");
        }
    }

    fn mark_failed(&self) {
        self.healthy.store(false, Ordering::Relaxed);
        *self
            .failed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    fn log(&self) -> parking_lot::MutexGuard<'_, Log> {
        self.log.lock()
    }

    /// Appends one record (`encode` appends the payload). On a serving
    /// thread, or off any runtime, its caller writes it ([`Self::append_own`]);
    /// on a multi-thread runtime, or while the disk is slow, it is queued for
    /// the spool thread ([`Self::append_queued`]), which acknowledges it.
    pub(crate) fn append(&self, encode: impl FnOnce(&mut Vec<u8>)) -> Result<Appended, SpoolError> {
        if on_runtime_worker() || self.disk_slow() {
            return self.append_queued(encode);
        }
        self.append_own(encode)
    }

    /// A serving thread's row (or one written off any runtime): framed in
    /// the thread's own buffer and written by its caller under the segment's
    /// lock. Waits at most [`SLOW_WRITE`] for another thread's write; past
    /// that the disk counts as slow and the row goes to the spool thread.
    fn append_own(&self, encode: impl FnOnce(&mut Vec<u8>)) -> Result<Appended, SpoolError> {
        thread_local! {
            static FRAME: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let mut rec = FRAME.with(std::cell::RefCell::take);
        rec.clear();
        rec.extend_from_slice(&[0u8; RECORD_HEADER_LEN]);
        encode(&mut rec);
        let result = self.write_own(&mut rec);
        // Keep a typical row's buffer for the thread's next one.
        if rec.capacity() <= 1 << 16 {
            FRAME.with(|f| f.replace(rec));
        }
        result
    }

    fn write_own(&self, rec: &mut [u8]) -> Result<Appended, SpoolError> {
        let len = rec.len() - RECORD_HEADER_LEN;
        if len > MAX_RECORD_LEN {
            return Err(SpoolError::TooLarge {
                len,
                max: MAX_RECORD_LEN,
            });
        }
        // Framed before any lock: the CRC is this caller's work alone.
        frame(rec);
        let rec: &[u8] = rec;
        {
            let mut q = self.queue();
            if q.closed {
                return Err(SpoolError::Closed);
            }
            // Checked before the segment's lock is taken: two serving
            // threads may each pass with one record to spare, so the spool
            // can end one record per thread over `max_bytes`.
            self.admit(q.buf.len() + rec.len())?;
            self.refuse_if_stalled()?;
            if q.writing {
                // The spool thread writes a handed-off queue: the row joins
                // it, behind the rows queued first.
                q.buf.extend_from_slice(rec);
                return Ok(await_group(&mut q));
            }
        }
        let wait = SLOW_WRITE.min(self.write_timeout);
        let Some(mut log) = self.log.try_lock_for(wait) else {
            // Another thread's write has held the segment that long: the
            // disk is slow, and the spool thread writes for a while.
            self.note_slow(wait);
            return self.hand_off(rec);
        };
        let began = Instant::now();
        self.begin_write();
        let result = log.write_group(self, rec);
        self.end_write();
        let took = began.elapsed();
        if took > SLOW_WRITE {
            self.note_slow(took);
        }
        if result.is_ok() {
            if self.fsync_interval.is_zero() {
                log.sync_inline(&self.dir);
            }
            self.metrics.rows_queued(1);
        }
        Ok(Appended::Written(result))
    }

    /// Queues a framed record for the spool thread and wakes it.
    fn hand_off(&self, rec: &[u8]) -> Result<Appended, SpoolError> {
        let mut q = self.queue();
        if q.closed {
            return Err(SpoolError::Closed);
        }
        q.buf.extend_from_slice(rec);
        let queued = await_group(&mut q);
        if !q.writing {
            q.writing = true;
            q.handed_off = true;
            drop(q);
            self.wake_syncer.notify_one();
        }
        Ok(queued)
    }

    /// Refuses a row while a write has been in progress past the deadline:
    /// it is not queued behind a write that may never return.
    fn refuse_if_stalled(&self) -> Result<(), SpoolError> {
        if self.stalled().is_none() {
            return Ok(());
        }
        self.metrics.spool_stall();
        Err(SpoolError::Stalled {
            ms: self.write_timeout.as_millis() as u64,
        })
    }

    /// Refuses a row that would take the spool past its limits: too little
    /// free disk, or `max_bytes` with `queued` bytes not yet written.
    fn admit(&self, queued: usize) -> Result<(), SpoolError> {
        if self.low_space.load(Ordering::Relaxed) {
            return Err(SpoolError::LowSpace {
                free: self.free_bytes.load(Ordering::Relaxed),
                min: self.min_free_bytes,
            });
        }
        let used = self.bytes_on_disk.load(Ordering::Relaxed) + queued as u64;
        if used > self.max_bytes {
            self.full.store(true, Ordering::Relaxed);
            return Err(SpoolError::Full {
                used,
                max: self.max_bytes,
            });
        }
        Ok(())
    }

    /// Frames one record into the next group write and, if no write is in
    /// progress and the caller may write (off any runtime), writes it right
    /// away as the group's leader; otherwise the spool thread (or the current
    /// leader) writes it and acknowledges it. Encoding happens under the
    /// queue lock, straight into the group buffer.
    fn append_queued(&self, encode: impl FnOnce(&mut Vec<u8>)) -> Result<Appended, SpoolError> {
        let mut q = self.queue();
        if q.closed {
            return Err(SpoolError::Closed);
        }
        let start = q.buf.len();
        q.buf.extend_from_slice(&[0u8; RECORD_HEADER_LEN]);
        encode(&mut q.buf);
        let len = q.buf.len() - start - RECORD_HEADER_LEN;
        if len > MAX_RECORD_LEN {
            q.buf.truncate(start);
            return Err(SpoolError::TooLarge {
                len,
                max: MAX_RECORD_LEN,
            });
        }
        if q.writing {
            if let Err(e) = self.refuse_if_stalled() {
                q.buf.truncate(start);
                return Err(e);
            }
        }
        if let Err(e) = self.admit(q.buf.len()) {
            q.buf.truncate(start);
            return Err(e);
        }
        frame(&mut q.buf[start..]);
        if q.writing {
            return Ok(await_group(&mut q));
        }
        q.writing = true;
        if on_runtime_worker() || self.disk_slow() {
            // The spool thread writes: a disk that stalls holds it, never a
            // runtime worker and the tasks queued on that worker. Under load
            // it writes many callers' rows with one `write(2)`.
            let queued = await_group(&mut q);
            q.handed_off = true;
            drop(q);
            self.wake_syncer.notify_one();
            return Ok(queued);
        }
        drop(q);
        Ok(Appended::Written(self.lead(LEADER_ROUNDS, true)))
    }

    /// Writes queued groups as the leader until the queue is empty (then clears
    /// `writing`) or `rounds` groups are written (then hands off to the spool
    /// thread, `writing` stays set). With `own`, the first group holds the
    /// caller's own record, whose result is returned.
    fn lead(&self, rounds: usize, own: bool) -> Result<(), SpoolError> {
        let mut log = self.log();
        let mut buf = std::mem::take(&mut log.buf);
        let mut waiters = std::mem::take(&mut log.waiters);
        let mut first = None;
        let mut slow = false;
        for round in 0.. {
            {
                let mut q = self.queue();
                if q.buf.is_empty() {
                    q.writing = false;
                    break;
                }
                // After a write slower than the deadline (a failing disk),
                // the spool thread writes the rest: this caller's runtime
                // worker, and the tasks queued on it, are held no longer.
                if round == rounds || slow {
                    q.handed_off = true;
                    drop(q);
                    self.wake_syncer.notify_one();
                    break;
                }
                std::mem::swap(&mut q.buf, &mut buf);
                std::mem::swap(&mut q.waiters, &mut waiters);
            }
            let rows = waiters.len() + usize::from(own && round == 0);
            let began = Instant::now();
            self.begin_write();
            let result = log.write_group(self, &buf);
            self.end_write();
            let took = began.elapsed();
            // A caller that met a slow disk writes no more groups either.
            slow = took > self.write_timeout || (own && took > SLOW_WRITE);
            if took > SLOW_WRITE {
                self.note_slow(took);
            }
            if result.is_ok() && self.fsync_interval.is_zero() {
                log.sync_inline(&self.dir);
            }
            if result.is_ok() {
                self.metrics.rows_queued(rows as u64);
            }
            for w in waiters.drain(..) {
                // A caller that gave up waiting is fine: its row is written.
                let _ = w.send(result.clone());
            }
            buf.clear();
            first.get_or_insert(result);
        }
        log.buf = buf;
        log.waiters = waiters;
        first.unwrap_or(Ok(()))
    }

    /// Stops accepting rows and lets the spool thread write what is queued,
    /// sync, and exit.
    pub(crate) fn close(&self) {
        self.queue().closed = true;
        self.wake_syncer.notify_one();
    }

    /// Accounts for deleted segments (called by the shipper).
    pub(super) fn release(&self, bytes: u64) {
        let prev = self.bytes_on_disk.fetch_sub(bytes, Ordering::Relaxed);
        self.metrics.set_spool_bytes(prev.saturating_sub(bytes));
        self.full.store(false, Ordering::Relaxed);
    }

    fn grow(&self, bytes: u64) {
        let prev = self.bytes_on_disk.fetch_add(bytes, Ordering::Relaxed);
        self.metrics.set_spool_bytes(prev + bytes);
    }

    /// Directory the spool lives in.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Flushes to disk what was written since the last sync: sealed segments, the
    /// active one, and the directory if segments were created. The disk waits
    /// happen without the log lock, so leaders keep writing meanwhile.
    fn sync(&self) {
        let pending = self.log().take_unsynced();
        pending.sync(&self.dir);
    }
}

/// The last record queued waits for the group write that takes it: its
/// writer acknowledges it.
pub(super) fn await_group(q: &mut Queue) -> Appended {
    let (tx, rx) = oneshot::channel();
    q.waiters.push(tx);
    Appended::Queued(rx)
}

/// Fills in the header of the record that `rec` holds (header space, then
/// the payload): its length and the payload's CRC.
pub(super) fn frame(rec: &mut [u8]) {
    let (header, payload) = rec.split_at_mut(RECORD_HEADER_LEN);
    let crc = crc32fast::hash(payload);
    // The length fits: callers refuse payloads over MAX_RECORD_LEN (16 MiB).
    let len32 = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    header[..4].copy_from_slice(&len32.to_le_bytes());
    header[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Whether the caller is a task of a multi-thread runtime (whose worker a
/// stalled `write(2)` must not hold).
pub(super) fn on_runtime_worker() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Settings the spool needs (a subset of [`super::super::SpoolConfig`]).
#[derive(Debug, Clone)]
pub(crate) struct SpoolSettings {
    pub dir: PathBuf,
    pub segment_bytes: u64,
    pub fsync_interval: Duration,
    pub max_bytes: u64,
    /// Refuse rows while the filesystem has less free space (0: no check).
    pub min_free_bytes: u64,
    /// A write running longer refuses new rows at once.
    pub write_timeout: Duration,
    /// After a failed write, rows are refused for this long before the disk
    /// is tried again ([`REPROBE_AFTER`] in production; tests shorten it).
    pub reprobe_after: Duration,
}

/// An opened spool: shared state, the spool thread, and where the reader starts.
pub(crate) struct Spool {
    pub shared: Arc<Shared>,
    /// Syncs on the interval, takes over writing from leaders that handed off,
    /// and drains the queue at shutdown.
    pub syncer: std::thread::JoinHandle<()>,
    pub reader: SpoolReader,
    pub recovery: Recovery,
    /// The last acknowledged position (the cursor), if any.
    pub cursor: Option<Position>,
}

/// Opens (creating if needed) the spool, recovers what a previous process left,
/// starts a fresh segment and the spool thread.
pub(crate) fn open(settings: &SpoolSettings, metrics: Metrics) -> Result<Spool, SpoolError> {
    let dir = &settings.dir;
    let lock = lock_dir(dir)?;
    // A cursor.tmp left by an older build's interrupted rename.
    let _ = fs::remove_file(dir.join("cursor.tmp"));
    let cursor = read_cursor(dir);
    let found = recover(dir, cursor)?;
    let on_disk = found.on_disk;

    metrics.set_spool_bytes(on_disk);
    metrics.corrupt_bytes(found.recovery.cut_bytes);
    let mut log = Log::starting_at(found.last_seq + 1);
    let shared = Arc::new(Shared::new(
        settings,
        found.last_seq,
        on_disk,
        metrics,
        lock,
    ));
    shared.check_free_space();
    warn_if_short_of_room(dir, settings.max_bytes, on_disk);
    // The first segment is created (and synced) now, so a working disk is
    // ready for the first call. A full disk does not stop the start: what is
    // spooled still ships, and new rows meet the fail modes until the next
    // write can create a segment.
    if let Err(e) = log.open_segment(&shared) {
        tracing::error!(error = %e, "audit spool: cannot start a segment at start-up; rows are refused or served unaudited by the fail modes until the disk works again");
    }
    log.sync_inline(dir);
    *shared.log() = log;
    let syncer = {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("audit-spool".into())
            .spawn(move || run_syncer(&shared))
            .map_err(|e| SpoolError::dir(dir, e))?
    };

    let reader = SpoolReader::new(Arc::clone(&shared), found.start);
    Ok(Spool {
        shared,
        syncer,
        reader,
        recovery: found.recovery,
        cursor,
    })
}

/// Creates the spool directory and `rejected/` (owner-only), and takes the
/// spool's lock: an error when another process holds it.
pub(super) fn lock_dir(dir: &Path) -> Result<fs::File, SpoolError> {
    // Audit rows are sensitive even redacted: owner-only directories and files.
    // (The mode applies to directories created here; an existing one is kept as
    // the operator made it.)
    for d in [dir.to_owned(), dir.join("rejected")] {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&d)
            .map_err(|e| SpoolError::dir(&d, e))?;
    }
    let lock_path = dir.join("LOCK");
    let lock = OpenOptions::new()
        .mode(0o600)
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| SpoolError::dir(&lock_path, e))?;
    // flock(2): released by the kernel when the process dies, even by SIGKILL.
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(lock),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(SpoolError::Locked { path: lock_path }),
        Err(e) => Err(SpoolError::dir(&lock_path, e.into())),
    }
}

/// Warns when the filesystem of `dir` has less free space than the spool
/// may still grow by.
pub(super) fn warn_if_short_of_room(dir: &Path, max_bytes: u64, on_disk: u64) {
    if let Ok(st) = rustix::fs::statvfs(dir) {
        let room = st.f_bavail.saturating_mul(st.f_frsize);
        if room < max_bytes.saturating_sub(on_disk) {
            tracing::warn!(free = room, max_bytes = max_bytes, dir = %dir.display(), "audit spool: the filesystem has less free space than spool.max_bytes allows the spool to use; it may fill the disk first");
        }
    }
}

impl Shared {
    /// The state of a spool just opened: segments up to `last_seq` hold
    /// `on_disk` bytes, nothing is queued, the disk is taken as healthy.
    fn new(
        settings: &SpoolSettings,
        last_seq: u64,
        on_disk: u64,
        metrics: Metrics,
        lock: fs::File,
    ) -> Shared {
        Shared {
            dir: settings.dir.clone(),
            queue: Mutex::new(Queue {
                buf: Vec::with_capacity(1 << 16),
                waiters: Vec::with_capacity(256),
                writing: false,
                handed_off: false,
                closed: false,
            }),
            wake_syncer: Condvar::new(),
            log: parking_lot::Mutex::new(Log::default()),
            committed: Mutex::new(Position {
                seq: last_seq,
                offset: u64::MAX,
            }),
            new_data: Notify::new(),
            bytes_on_disk: AtomicU64::new(on_disk),
            max_bytes: settings.max_bytes,
            segment_bytes: settings.segment_bytes,
            fsync_interval: settings.fsync_interval,
            healthy: AtomicBool::new(true),
            failed_at: Mutex::new(None),
            full: AtomicBool::new(false),
            low_space: AtomicBool::new(false),
            free_bytes: AtomicU64::new(u64::MAX),
            min_free_bytes: settings.min_free_bytes,
            writing_since: AtomicU64::new(0),
            slow_until: AtomicU64::new(0),
            epoch: Instant::now(),
            write_timeout: settings.write_timeout,
            reprobe_after: settings.reprobe_after,
            failures: AtomicU64::new(0),
            metrics,
            _lock: lock,
        }
    }
}

/// An injected disk fault of the spool in `dir`, if any (test builds).
#[cfg(feature = "fault-injection")]
pub(super) fn injected(dir: &Path) -> io::Result<()> {
    super::super::fault::before_write(dir)
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(super) fn injected(_dir: &Path) -> io::Result<()> {
    Ok(())
}

/// The segment being appended to.
pub(super) struct ActiveSegment {
    seq: u64,
    path: PathBuf,
    /// Shared with the spool thread, which syncs it without the log lock.
    file: Arc<File>,
    len: u64,
}

/// The write side of the spool, owned by whoever holds [`Shared::log`].
#[derive(Default)]
pub(super) struct Log {
    active: Option<ActiveSegment>,
    next_seq: u64,
    /// The active segment has bytes written since its last sync.
    dirty: bool,
    /// Segments rotated away (or abandoned) since the last sync.
    unsynced: Vec<(PathBuf, Arc<File>)>,
    /// A segment was created since the directory was last synced.
    dir_dirty: bool,
    /// The leader's group buffers, swapped with the queue's each round, so
    /// steady state allocates nothing.
    buf: Vec<u8>,
    waiters: Vec<AckSender>,
}

impl Log {
    /// A log with no segment open yet, the next one numbered `next_seq`.
    fn starting_at(next_seq: u64) -> Log {
        Log {
            active: None,
            next_seq,
            dirty: false,
            unsynced: Vec::new(),
            dir_dirty: false,
            buf: Vec::with_capacity(1 << 16),
            waiters: Vec::with_capacity(256),
        }
    }

    /// Appends one group of framed records with a single write.
    fn write_group(&mut self, shared: &Shared, buf: &[u8]) -> Result<(), SpoolError> {
        if self.active.is_none() {
            self.open_segment(shared)?;
        }
        let Some(seg) = self.active.as_mut() else {
            return Err(SpoolError::Closed);
        };
        let before = seg.len;
        let written = injected(&shared.dir).and_then(|()| (&*seg.file).write_all(buf));
        match written {
            Ok(()) => {
                seg.len += buf.len() as u64;
                self.dirty = true;
                let pos = Position {
                    seq: seg.seq,
                    offset: seg.len,
                };
                let full = seg.len >= shared.segment_bytes;
                shared.grow(buf.len() as u64);
                shared.publish(pos);
                shared.healthy.store(true, Ordering::Relaxed);
                shared.note_write_success();
                shared.new_data.notify_one();
                if full {
                    self.rotate(shared);
                }
                Ok(())
            }
            Err(e) => {
                shared.mark_failed();
                let path = seg.path.clone();
                shared.note_write_failure("write", &path, &e);
                // Roll back a partial write so the segment ends on a record boundary.
                if let Err(e2) = seg.file.set_len(before) {
                    tracing::error!(segment = %path.display(), error = %e2, "audit spool: cannot roll back a partial write; the reader cuts the torn tail");
                }
                // Seal it: a segment that cannot grow must still be finished
                // by the shipper and deleted once shipped, or a full disk
                // never frees. The next write starts a new segment.
                self.seal();
                shared.publish(Position {
                    seq: self.next_seq,
                    offset: SEGMENT_HEADER_LEN,
                });
                shared.new_data.notify_one();
                Err(SpoolError::Write {
                    path,
                    source: Arc::new(e),
                })
            }
        }
    }

    /// Seals the active segment and starts the next one right away, so the
    /// shipper sees the old one as complete and can delete it once shipped. The
    /// old segment is synced by the spool thread's next tick.
    fn rotate(&mut self, shared: &Shared) {
        self.seal();
        if let Err(e) = self.open_segment(shared) {
            // Retried on the next write; callers of that write see the error.
            tracing::error!(error = %e, "audit spool: cannot start next segment");
        }
    }

    /// Stops writing to the active segment; it is still synced. (After a failed
    /// rollback its tail may be torn; the reader cuts the tail.)
    fn seal(&mut self) {
        if let Some(seg) = self.active.take() {
            if std::mem::take(&mut self.dirty) {
                self.unsynced.push((seg.path, seg.file));
            }
        }
    }

    /// Creates the next segment with its header. Not synced here: the spool
    /// thread syncs the file and the directory on its next tick.
    fn open_segment(&mut self, shared: &Shared) -> Result<(), SpoolError> {
        let seq = self.next_seq;
        let path = segment_path(&shared.dir, seq);
        let create = || -> io::Result<File> {
            injected(&shared.dir)?;
            let mut f = OpenOptions::new()
                .append(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            let mut header = [0u8; SEGMENT_HEADER_LEN as usize];
            header[..8].copy_from_slice(MAGIC);
            header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
            f.write_all(&header)?;
            Ok(f)
        };
        match create() {
            Ok(file) => {
                self.next_seq += 1;
                shared.grow(SEGMENT_HEADER_LEN);
                self.active = Some(ActiveSegment {
                    seq,
                    path,
                    file: Arc::new(file),
                    len: SEGMENT_HEADER_LEN,
                });
                // The header must reach the disk with the directory entry.
                self.dirty = true;
                self.dir_dirty = true;
                shared.publish(Position {
                    seq,
                    offset: SEGMENT_HEADER_LEN,
                });
                shared.new_data.notify_one();
                Ok(())
            }
            Err(e) => {
                shared.mark_failed();
                shared.note_write_failure("creating a segment", &path, &e);
                // Skip the number: a half-created file must not be reused.
                if path.exists() {
                    let _ = fs::remove_file(&path);
                    self.next_seq += 1;
                }
                Err(SpoolError::CreateSegment {
                    path,
                    source: Arc::new(e),
                })
            }
        }
    }

    /// Syncs everything pending while holding the log (start-up, and
    /// `fsync_interval_ms = 0`, where each group waits for the disk).
    fn sync_inline(&mut self, dir: &Path) {
        self.take_unsynced().sync(dir);
    }

    /// What needs a sync since the last one; the log counts as clean after.
    fn take_unsynced(&mut self) -> Unsynced {
        let mut files = std::mem::take(&mut self.unsynced);
        if std::mem::take(&mut self.dirty) {
            if let Some(seg) = &self.active {
                files.push((seg.path.clone(), Arc::clone(&seg.file)));
            }
        }
        Unsynced {
            files,
            dir: std::mem::take(&mut self.dir_dirty),
        }
    }
}

/// Files (and whether the directory) to sync, taken from the log so the disk
/// waits can happen without holding it.
pub(super) struct Unsynced {
    files: Vec<(PathBuf, Arc<File>)>,
    dir: bool,
}

impl Unsynced {
    fn sync(self, dir: &Path) {
        for (path, file) in self.files {
            if let Err(e) = file.sync_data() {
                tracing::error!(segment = %path.display(), error = %e, "audit spool fsync failed");
            }
        }
        if self.dir {
            if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
                tracing::error!(dir = %dir.display(), error = %e, "audit spool: directory fsync failed");
            }
        }
    }
}

/// The spool thread: syncs every `fsync_interval`, writes for leaders that
/// handed off, and at shutdown writes what is queued, syncs and returns.
pub(super) fn run_syncer(shared: &Shared) {
    let tick = if shared.fsync_interval.is_zero() {
        IDLE_TICK
    } else {
        shared.fsync_interval
    };
    let mut next_sync = Instant::now() + tick;
    loop {
        let (handed_off, closed) = {
            let mut q = shared.queue();
            let wait = next_sync.saturating_duration_since(Instant::now());
            if !q.handed_off && !q.closed && !wait.is_zero() {
                q = shared
                    .wake_syncer
                    .wait_timeout(q, wait)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            (std::mem::take(&mut q.handed_off), q.closed)
        };
        if handed_off {
            let _ = shared.lead(usize::MAX, false);
        }
        if closed {
            break;
        }
        if Instant::now() >= next_sync {
            shared.sync();
            shared.check_free_space();
            next_sync = Instant::now() + tick;
        }
    }
    // Closed: no new rows are accepted. A leader still writing either empties the
    // queue or hands it over; wait for one or the other.
    loop {
        let handed_off = {
            let mut q = shared.queue();
            if !q.writing {
                break;
            }
            if !q.handed_off {
                q = shared
                    .wake_syncer
                    .wait_timeout(q, Duration::from_millis(1))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            std::mem::take(&mut q.handed_off)
        };
        if handed_off {
            let _ = shared.lead(usize::MAX, false);
        }
    }
    shared.sync();
    tracing::debug!("audit spool thread stopped");
}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;
