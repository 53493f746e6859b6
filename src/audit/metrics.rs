//! Prometheus metrics of the audit pipeline, registered under the `audit_` prefix
//! of the registry handed to [`super::start`].
//!
//! Invariant: every handle is a cheap clone of shared atomics, so the request path
//! (rows queued, rows lost), the spool writer and the shipper update them without
//! locks.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The pipeline's counters and gauges.
#[derive(Clone, Debug, Default)]
pub(crate) struct Metrics {
    rows_queued: Counter,
    spool_bytes: Gauge,
    rows_sent: Counter,
    send_errors: Counter,
    retries: Counter,
    rows_lost: Counter,
    rows_rejected: Counter,
    corrupt_bytes: Counter,
    oldest_unsent_age: Gauge<f64, AtomicU64>,
    spool_free_bytes: Gauge,
    spool_write_failures: Counter,
    spool_stalls: Counter,
    spool_slow_writes: Counter,
    checkpoints: Counter,
    chain_seq: Gauge,
    chain_unproven: Gauge,
}

impl Metrics {
    /// Creates the metrics and registers them into `registry` (prefix `audit`).
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("audit");
        r.register(
            "rows_queued",
            "Rows written to the local spool (acknowledged to the caller)",
            m.rows_queued.clone(),
        );
        r.register(
            "spool_bytes",
            "Bytes of spool segments on disk not yet deleted after shipping",
            m.spool_bytes.clone(),
        );
        r.register(
            "rows_sent",
            "Rows acknowledged by ClickHouse",
            m.rows_sent.clone(),
        );
        r.register(
            "send_errors",
            "Failed INSERTs (each retried or rejected)",
            m.send_errors.clone(),
        );
        r.register(
            "retries",
            "INSERT attempts repeated after a retryable failure",
            m.retries.clone(),
        );
        r.register(
            "rows_lost",
            "Calls served without an audit row because the spool failed (fail-open)",
            m.rows_lost.clone(),
        );
        r.register(
            "rows_rejected",
            "Rows ClickHouse refused as bad data, moved to the spool's rejected/ folder",
            m.rows_rejected.clone(),
        );
        r.register(
            "spool_corrupt_bytes",
            "Unreadable spool bytes moved to rejected/ (torn or corrupt records)",
            m.corrupt_bytes.clone(),
        );
        r.register(
            "spool_free_bytes",
            "Free bytes on the spool's filesystem (checked once a second)",
            m.spool_free_bytes.clone(),
        );
        r.register(
            "spool_write_failures",
            "Spool writes and segment creations that failed (disk full, I/O error)",
            m.spool_write_failures.clone(),
        );
        r.register(
            "spool_stalls",
            "Rows refused or given up on because a spool write ran past spool.write_timeout_ms",
            m.spool_stalls.clone(),
        );
        r.register(
            "spool_slow_writes",
            "Spells of a slow spool disk (a write over 20 ms): rows are written by the spool thread, not by the serving threads, for a second after each",
            m.spool_slow_writes.clone(),
        );
        r.register(
            "checkpoints",
            "Signed checkpoints of the hash chain acknowledged by ClickHouse",
            m.checkpoints.clone(),
        );
        r.register(
            "chain_seq",
            "seq of the last row of this writer's hash chain acknowledged by ClickHouse",
            m.chain_seq.clone(),
        );
        r.register(
            "chain_unproven_entries",
            "Entries of this writer's chain after the last checkpoint it signed that it cannot prove it wrote (found when it resumed without its chain head): never continued, never signed",
            m.chain_unproven.clone(),
        );
        r.register(
            "oldest_unsent_age_seconds",
            "Age of the oldest row spooled but not yet acknowledged by ClickHouse",
            m.oldest_unsent_age.clone(),
        );
        m
    }

    pub(crate) fn rows_queued(&self, n: u64) {
        self.rows_queued.inc_by(n);
    }
    pub(crate) fn set_spool_bytes(&self, bytes: u64) {
        self.spool_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    pub(crate) fn rows_sent(&self, n: u64) {
        self.rows_sent.inc_by(n);
    }
    pub(crate) fn checkpoints_sent(&self, n: u64) {
        self.checkpoints.inc_by(n);
    }
    pub(crate) fn set_chain_unproven(&self, n: u64) {
        self.chain_unproven
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    pub(crate) fn set_chain_seq(&self, seq: u64) {
        self.chain_seq.set(i64::try_from(seq).unwrap_or(i64::MAX));
    }
    pub(crate) fn send_error(&self) {
        self.send_errors.inc();
    }
    pub(crate) fn retry(&self) {
        self.retries.inc();
    }
    pub(crate) fn row_lost(&self) {
        self.rows_lost.inc();
    }
    pub(crate) fn rows_rejected(&self, n: u64) {
        self.rows_rejected.inc_by(n);
    }
    pub(crate) fn corrupt_bytes(&self, n: u64) {
        self.corrupt_bytes.inc_by(n);
    }
    pub(crate) fn set_oldest_unsent_age(&self, seconds: f64) {
        self.oldest_unsent_age.set(seconds);
    }
    pub(crate) fn set_spool_free_bytes(&self, bytes: u64) {
        self.spool_free_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    pub(crate) fn spool_write_failure(&self) {
        self.spool_write_failures.inc();
    }
    pub(crate) fn spool_stall(&self) {
        self.spool_stalls.inc();
    }
    pub(crate) fn spool_slow_write(&self) {
        self.spool_slow_writes.inc();
    }
    pub(crate) fn oldest_unsent_age(&self) -> f64 {
        self.oldest_unsent_age.get()
    }
    /// Rows lost so far (tests and the lead's status page).
    pub(crate) fn rows_lost_total(&self) -> u64 {
        self.rows_lost.get()
    }
}
