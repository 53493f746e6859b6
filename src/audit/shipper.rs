//! The shipper: reads spooled rows back in order, batches them, inserts them into
//! ClickHouse, and only then lets the spool forget them.
//!
//! Invariants:
//! * One `INSERT` in flight, batches in spool order, so the acknowledged prefix of
//!   the spool is a single position (the cursor).
//! * A batch is retried (exponential backoff with jitter) until ClickHouse
//!   acknowledges it, or, for bad-data errors only, saved to `rejected/`. Rows are
//!   never dropped; a retry after a lost acknowledgement may insert a row twice,
//!   which the `ReplacingMergeTree` on `event_id` absorbs (see [`super`]).
//! * Segments are deleted only after the batch holding their last row was
//!   acknowledged (or rejected and saved).
//! * File reads run on the blocking pool; the task itself never blocks.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use thiserror::Error;
use tokio::sync::watch;

use super::clickhouse::{self as ch, Disposition};
use super::metrics::Metrics;
use super::spool::{self, Batch, FillOutcome, Shared, SpoolError, SpoolReader};

/// Minimum spacing of reads while a partial batch waits to fill: under load the
/// writer notifies per group write, and one read per notify would cost more than
/// the rows it fetches. Bounds added latency to 5 ms.
const MIN_FILL_INTERVAL: Duration = Duration::from_millis(5);

/// How often the oldest-unsent gauge is refreshed while idle or backing off.
const GAUGE_TICK: Duration = Duration::from_secs(1);

/// Why the shipper stopped early.
#[derive(Debug, Error)]
pub enum ShipperError {
    /// The blocking read task died (runtime shutting down); the spool reader is gone.
    #[error("audit spool reader task failed: {0}")]
    ReaderLost(#[source] tokio::task::JoinError),
}

/// Lifecycle signal from [`super::AuditHandle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Normal operation.
    Running,
    /// The writer has stopped: ship everything left, then exit.
    Draining,
}

/// Batching and retry parameters.
#[derive(Debug, Clone)]
pub(crate) struct ShipperSettings {
    pub max_rows: usize,
    pub max_bytes: usize,
    pub max_age: Duration,
    pub retry_min: Duration,
    pub retry_max: Duration,
    pub insert_timeout: Duration,
    pub database: String,
    pub table: String,
    pub create_schema: bool,
}

/// The shipping task's state.
pub(crate) struct Shipper {
    client: clickhouse::Client,
    sql: String,
    settings: ShipperSettings,
    reader: Option<SpoolReader>,
    shared: Arc<Shared>,
    metrics: Metrics,
    phase: watch::Receiver<Phase>,
    /// The phase sender is gone (handle dropped): stop watching it.
    phase_gone: bool,
    schema_ready: bool,
}

impl Shipper {
    pub(crate) fn new(
        client: clickhouse::Client,
        settings: ShipperSettings,
        reader: SpoolReader,
        metrics: Metrics,
        phase: watch::Receiver<Phase>,
    ) -> Self {
        Self {
            sql: ch::insert_sql(&settings.database, &settings.table),
            schema_ready: !settings.create_schema,
            shared: Arc::clone(reader.shared()),
            client,
            settings,
            reader: Some(reader),
            metrics,
            phase,
            phase_gone: false,
        }
    }

    /// Runs until drained after shutdown (or the reader is lost).
    pub(crate) async fn run(mut self) -> Result<(), ShipperError> {
        let mut batch = Batch::default();
        let mut last_fill;
        let mut read_failures: u32 = 0;
        loop {
            let draining = *self.phase.borrow() == Phase::Draining;
            let outcome = match self.fill(&mut batch).await? {
                Ok(o) => {
                    read_failures = 0;
                    o
                }
                Err(e) => {
                    read_failures = read_failures.saturating_add(1);
                    let delay = backoff(
                        read_failures,
                        self.settings.retry_min,
                        self.settings.retry_max,
                        rand::random::<f64>(),
                    );
                    tracing::error!(error = %e, attempt = read_failures, "audit shipper: reading the spool failed; retrying");
                    self.pause(delay, &batch).await;
                    continue;
                }
            };
            last_fill = Instant::now();
            self.update_age(&batch);

            if batch.rows == 0 {
                if !batch.finished_segments.is_empty() {
                    spool::delete_segments(&self.shared, &batch.finished_segments);
                    batch.finished_segments.clear();
                }
                if draining && outcome == FillOutcome::CaughtUp {
                    return Ok(());
                }
                self.wait_for_data(None).await;
                continue;
            }

            if outcome == FillOutcome::CaughtUp && !draining {
                let deadline = batch
                    .opened
                    .map_or_else(Instant::now, |t| t + self.settings.max_age);
                if Instant::now() < deadline {
                    let woke_for_data = self.wait_for_data(Some(deadline)).await;
                    if woke_for_data {
                        tokio::time::sleep_until((last_fill + MIN_FILL_INTERVAL).into()).await;
                    }
                    continue;
                }
            }
            self.ship(&mut batch).await;
            batch.reset();
            self.update_age(&batch);
        }
    }

    /// Reads more rows into `batch` on the blocking pool.
    async fn fill(
        &mut self,
        batch: &mut Batch,
    ) -> Result<Result<FillOutcome, SpoolError>, ShipperError> {
        let Some(mut reader) = self.reader.take() else {
            return Ok(Ok(FillOutcome::CaughtUp));
        };
        let mut b = std::mem::take(batch);
        let (max_rows, max_bytes) = (self.settings.max_rows, self.settings.max_bytes);
        let (reader, b, res) = tokio::task::spawn_blocking(move || {
            let res = reader.fill(&mut b, max_rows, max_bytes);
            (reader, b, res)
        })
        .await
        .map_err(ShipperError::ReaderLost)?;
        self.reader = Some(reader);
        *batch = b;
        Ok(res)
    }

    /// Waits for new spool data, the deadline, a phase change or a gauge tick.
    /// Returns true when woken by new data.
    async fn wait_for_data(&mut self, deadline: Option<Instant>) -> bool {
        let until = deadline.unwrap_or_else(|| Instant::now() + GAUGE_TICK);
        let shared = Arc::clone(&self.shared);
        let phase_gone = self.phase_gone;
        tokio::select! {
            () = shared.new_data.notified() => true,
            () = tokio::time::sleep_until(until.into()) => false,
            changed = self.phase.changed(), if !phase_gone => {
                if changed.is_err() {
                    self.phase_gone = true;
                }
                false
            }
        }
    }

    /// Inserts `batch` until acknowledged or rejected-and-saved; then advances the
    /// cursor and deletes finished segments.
    async fn ship(&mut self, batch: &mut Batch) {
        let body = Bytes::from(std::mem::take(&mut batch.body));
        let rows = batch.rows as u64;
        let mut attempt: u32 = 0;
        loop {
            let result = self.try_insert(&body).await;
            match result {
                Ok(()) => {
                    self.metrics.rows_sent(rows);
                    break;
                }
                Err((err, disposition)) => {
                    self.metrics.send_error();
                    if disposition == Disposition::Reject {
                        let start = batch.start.unwrap_or(spool::Position { seq: 0, offset: 0 });
                        match spool::save_rejected(
                            self.shared.dir(),
                            start.seq,
                            start.offset,
                            "rowbinary",
                            &body,
                        ) {
                            Ok(path) => {
                                tracing::error!(
                                    rows,
                                    error = %err,
                                    saved = %path.display(),
                                    "audit: ClickHouse rejected a batch as bad data; saved to rejected/"
                                );
                                self.metrics.rows_rejected(rows);
                                break;
                            }
                            Err(e) => {
                                tracing::error!(error = %e, "audit: cannot save rejected batch; will retry it");
                            }
                        }
                    }
                    attempt = attempt.saturating_add(1);
                    self.metrics.retry();
                    let delay = backoff(
                        attempt,
                        self.settings.retry_min,
                        self.settings.retry_max,
                        rand::random::<f64>(),
                    );
                    tracing::warn!(
                        rows,
                        attempt,
                        retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        error = %err,
                        "audit: INSERT into ClickHouse failed; retrying"
                    );
                    self.pause(delay, batch).await;
                }
            }
        }
        if let Some(end) = batch.end {
            if let Err(e) = spool::write_cursor(self.shared.dir(), end) {
                // Only costs a larger (deduplicated) replay after a restart.
                tracing::warn!(error = %e, "audit spool: cannot update cursor");
            }
        }
        spool::delete_segments(&self.shared, &batch.finished_segments);
        // Take the allocation back for the next batch when no clone survived.
        if let Ok(buf) = body.try_into_mut() {
            let mut v = Vec::from(buf);
            v.clear();
            batch.body = v;
        }
    }

    /// Creates the schema if still needed, then inserts. Schema failures are
    /// always retried: they say nothing about the rows.
    async fn try_insert(
        &mut self,
        body: &Bytes,
    ) -> Result<(), (clickhouse::error::Error, Disposition)> {
        if !self.schema_ready {
            ch::ensure_schema(&self.client, &self.settings.database, &self.settings.table)
                .await
                .map_err(|e| (e, Disposition::Retry))?;
            self.schema_ready = true;
        }
        ch::insert(&self.client, &self.sql, body, self.settings.insert_timeout)
            .await
            .map_err(|e| {
                let d = ch::classify(&e);
                (e, d)
            })
    }

    /// Sleeps `delay`, refreshing the age gauge every tick.
    async fn pause(&self, delay: Duration, batch: &Batch) {
        let end = Instant::now() + delay;
        loop {
            self.update_age(batch);
            let now = Instant::now();
            if now >= end {
                return;
            }
            tokio::time::sleep((end - now).min(GAUGE_TICK)).await;
        }
    }

    fn update_age(&self, batch: &Batch) {
        let age = match batch.first_time_ms {
            Some(t) if batch.rows > 0 => now_ms().saturating_sub(t) as f64 / 1000.0,
            _ => 0.0,
        };
        self.metrics.set_oldest_unsent_age(age);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Pure: delay before retry number `attempt` (1-based): `min · 2^(attempt-1)`
/// capped at `max`, then scaled into `[½, 1]` by `jitter ∈ [0, 1)` so many
/// firewalls recovering together do not retry in lockstep.
pub(crate) fn backoff(attempt: u32, min: Duration, max: Duration, jitter: f64) -> Duration {
    let exp = attempt.saturating_sub(1).min(30);
    let base = min.saturating_mul(1u32 << exp).min(max);
    base.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// Drops expired day partitions hourly until `phase` leaves `Running` (a dropped
/// handle does not stop it: the pipeline keeps running then, and so does this).
pub(crate) async fn retention_loop(
    client: clickhouse::Client,
    database: String,
    table: String,
    keep_days: u32,
    mut phase: watch::Receiver<Phase>,
) {
    let mut phase_gone = false;
    loop {
        let today = i64::try_from(now_ms() / 86_400_000).unwrap_or(0);
        match ch::enforce_retention(&client, &database, &table, keep_days, today).await {
            Ok(n) if n > 0 => tracing::info!(dropped = n, "audit retention pass done"),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "audit retention pass failed; next try in an hour")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(3600)) => {}
            r = phase.changed(), if !phase_gone => match r {
                Ok(()) if *phase.borrow() != Phase::Running => return,
                Ok(()) => {}
                Err(_) => phase_gone = true,
            },
        }
    }
}

#[cfg(test)]
#[path = "shipper_tests.rs"]
mod tests;
