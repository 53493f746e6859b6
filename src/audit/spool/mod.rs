//! The local write-ahead spool: every audit row is appended here before
//! [`super::Auditor::record`] returns, and stays until ClickHouse acknowledged it.
//!
//! Layout of the spool directory (created `0700`, files `0600`: rows are
//! sensitive even redacted):
//! * `LOCK`: held (`flock`) for the process lifetime, so two firewalls never share
//!   a spool and double-ship it.
//! * `NNNNNNNNNNNNNNNNNNNN.seg`: segments, numbered in write order. A segment is a
//!   16-byte header (`MCPFWAUD`, format version u32 LE, 4 reserved bytes) followed by
//!   records `[len u32 LE][crc32(payload) u32 LE][payload]`; the payload is one
//!   `RowBinary` row ([`super::record`]).
//! * `cursor`: the last position ClickHouse acknowledged (segment, offset, crc),
//!   rewritten in place after each acknowledged batch.
//! * `chain`: the hash chain's head at the cursor ([`ChainHead`]).
//! * `writer_id`: this spool's writer in the hash chain, made at first start
//!   unless `audit.writer_id` names it.
//! * `rejected/`: batches ClickHouse refused as bad data (`*.rowbinary`, replayable
//!   with `clickhouse-client --query "INSERT INTO db.t (cols) FORMAT RowBinary"`)
//!   and unreadable spool bytes (`*.corrupt`); nothing is silently dropped.
//!
//! Invariants:
//! * A caller on a serving thread (a single-threaded runtime,
//!   [`crate::server::shards`]) writes its own record with one `write(2)`
//!   under the segment's lock, waiting at most [`SLOW_WRITE`] for another
//!   thread's write to finish: no queue, no acknowledgement, so no serving
//!   thread ever wakes another one to say its row is written (measured: when
//!   callers queued behind whichever thread was writing, the two serving
//!   threads woke each other about once per forwarded call). Tasks of one
//!   serving thread never wait for each other: a write is synchronous.
//! * Rows are queued instead, and written as groups by the spool thread (or a
//!   leader that found no write in progress, off any runtime), on a
//!   multi-thread runtime, and on every thread for [`SLOW_FOR`] after a write
//!   slower than [`SLOW_WRITE`] or a wait for the segment's lock that long
//!   (the watchdog), so a disk that turns slow holds the spool thread rather
//!   than the threads serving calls. A leader writes at most
//!   [`LEADER_ROUNDS`] groups, then hands the queue to the spool thread.
//! * fsync never runs on a caller's task: the spool thread syncs every
//!   `fsync_interval_ms` (a process crash, SIGKILL, loses no acknowledged row; a
//!   power loss loses at most one interval). Segments are created without an
//!   fsync on the write path; the spool thread syncs them and the directory on
//!   its next tick. `fsync_interval_ms = 0` syncs each group before acknowledging
//!   (the leader waits for the disk).
//! * A failed write is rolled back with `ftruncate`; if that fails too the segment
//!   is abandoned and a new one started, so later records never follow torn bytes.
//! * The reader never reads past the writer's published committed length of the
//!   active segment; segments with a lower number are sealed and read to EOF.
//! * A segment is deleted only after every record in it was acknowledged.
//! * At start, torn or corrupt tails are cut off (the cut bytes are kept in
//!   `rejected/`), so a crash mid-write is never fatal.
//! * A failing disk never wedges the spool: a write that fails seals its
//!   segment (so the shipper can finish it and delete it once acknowledged)
//!   and the next write starts a new one; the cursor is rewritten in place
//!   (20 bytes over the old ones, crc-checked), so a full disk cannot leave
//!   it missing; start-up on a full disk succeeds (rows that can be shipped
//!   are shipped, new rows meet the fail modes until space returns). Free
//!   space below `spool.min_free_bytes` refuses new rows like a full spool.
//! * A write has a deadline (`spool.write_timeout_ms`): while one has been
//!   in progress longer, new rows are refused at once (`Stalled`) instead of
//!   queueing behind a frozen disk, and queued callers stop waiting.

mod format;
mod reader;
mod recovery;
#[cfg(any(test, fuzzing))]
pub mod torn;
pub(crate) use format::*;
pub(crate) use reader::*;
pub(crate) use recovery::*;
mod log;
pub use self::log::*;
