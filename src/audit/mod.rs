//! The audit pipeline: one row per JSON-RPC message the firewall decided on, into
//! ClickHouse, losing nothing.
//!
//! # Flow
//! 1. The proxy builds an [`AuditRow`] and calls [`Auditor::record`]. On the
//!    caller's task the arguments and result are redacted ([`redact_json`]) and
//!    capped, the row is encoded once as ClickHouse `RowBinary`, and queued.
//! 2. The row is appended to a checksummed segment file with `write(2)` before
//!    `record` returns: by the caller itself when no other write is in progress,
//!    otherwise in the next group the current writer commits (group commit, see
//!    [`spool`]). fsync is batched on the spool thread
//!    (`spool.fsync_interval_ms`). The network is never touched on this path.
//! 3. The shipper, on a thread of its own (its own single-threaded runtime:
//!    the lz4 compression and HTTP of an `INSERT` never occupy a worker that
//!    serves requests), reads the spool back, batches (`batch.max_rows`,
//!    `max_bytes`, `max_age_ms`), `INSERT`s the bytes unchanged (`FORMAT
//!    RowBinary`, lz4; up to `batch.max_in_flight` at once, acknowledged in spool
//!    order), retries with backoff, and deletes a segment only once every row in
//!    it was acknowledged. A restart replays whatever was not.
//!
//! Cost on the request path: redaction (a walk of the JSON, no parse of raw text
//! without a candidate key), one encode into the shared group buffer under a
//! mutex, and one `write(2)` (or, when another caller is writing, a oneshot and
//! the wait for its group).
//! ClickHouse 18.16 ingests far faster in large batches: raise `batch.max_rows`
//! (50,000 roughly doubles its rate) where a second of latency is acceptable.
//!
//! # Guarantees
//! * A row whose `record` returned `Ok` reaches ClickHouse, across ClickHouse
//!   outages and firewall crashes (SIGKILL), unless ClickHouse rejects it as bad
//!   data, in which case its batch is kept in the spool's `rejected/` folder.
//! * A row may be *sent* more than once (retry after a lost acknowledgement, replay
//!   after a crash) but never *counts* twice when read as below.
//! * If the spool cannot take a row (full, disk error, directory gone), `record`
//!   fails; the caller applies [`Auditor::fail_mode`]: `Closed` refuses the call
//!   (no audit, no action), `Open` serves it and [`Auditor::note_lost`] counts and
//!   logs the loss. [`Auditor::record_or_fail`] does both.
//!
//! # Reading without duplicates
//! The table is a `ReplacingMergeTree` keyed (last sort column) by `event_id`;
//! duplicates are byte-identical rows. Auditors query it in one of these forms:
//! * rows: `SELECT … FROM mcp_firewall.audit_events FINAL WHERE …`
//! * counts: `SELECT uniqExact(event_id) FROM mcp_firewall.audit_events WHERE …`
//! * explicit collapse: `SELECT event_id, any(decision), … GROUP BY event_id`
//!
//! A plain `count()` may exceed these until background merges catch up. The daily
//! aggregate `audit_events_daily_stats` stores `uniqExact*State(event_id)`, so its
//! counts (`uniqExactMerge(calls)`, `uniqExactIfMerge(denials)`, …) are
//! duplicate-proof as well; its latency quantiles are not (a duplicate weighs
//! twice). The DDL, with example queries, is `config/clickhouse/schema.sql`.
//!
//! Typical questions:
//! * a run's timeline: `… FINAL WHERE tenant = ? AND run_id = ? ORDER BY time_ms`
//! * destructive calls of a run: add `AND risk = 'destructive'`
//! * denials by role and reason: `SELECT agent_role, reason, uniqExact(event_id)
//!   … WHERE decision = 'deny' AND time >= today() - 7 GROUP BY agent_role, reason`
//! * p95 latency per tool per day, stop reasons per day: the daily aggregate.
//!
//! # Retention
//! `retention_days` drops whole day partitions (`ALTER TABLE … DROP PARTITION`)
//! of both tables hourly; `TTL` is not used since 18.16 lacks it.

#![deny(missing_docs)]

pub mod chain;
mod clickhouse;
mod config;
#[cfg(feature = "fault-injection")]
pub mod fault;
mod linker;
mod metrics;
mod record;
mod redact;
mod shipper;
mod spool;
/// The spool written, torn and recovered (fuzz targets).
#[cfg(any(test, fuzzing))]
pub use spool::torn as spool_torn;
pub mod verify;
mod verify_report;
pub use self::clickhouse::{
    added_chain_columns_sql, added_columns_sql, chain_state_sql, drop_partition_sql,
    partitions_sql, schema_statements, ClickHouseError, SCHEMA_SQL,
};
pub use self::config::*;
pub(crate) use self::config::{is_identifier, is_writer_id};
pub use self::record::{
    decode_row, hashed_part, row_len, row_version, AuditRow, JsonPayload, Label, COLUMNS,
};
pub use self::redact::{redact_json, truncate_utf8, RedactError, Redactor, REDACTED};
pub use self::shipper::ShipperError;
pub use self::spool::SpoolError;
pub(crate) use self::spool::{list_segments, payloads, segment_path};
/// How dangerous a call is; selects the [`FailMode`] and fills the `risk`
/// column. The policy's risk type, so the two can never disagree.
pub use crate::policy::Risk;
mod auditor;
pub use self::auditor::*;
