//! The shipper: reads spooled rows back in order, batches them, inserts them into
//! ClickHouse, and only then lets the spool forget them.
//!
//! Invariants:
//! * Up to `max_in_flight` `INSERT`s run at once, but they are acknowledged in
//!   spool order (an ordered futures queue), so the acknowledged prefix of the
//!   spool is a single position (the cursor).
//! * A batch is retried (exponential backoff with jitter) until ClickHouse
//!   acknowledges it, or, for bad-data errors only, saved to `rejected/`. Rows are
//!   never dropped; a retry after a lost acknowledgement may insert a row twice,
//!   which the `ReplacingMergeTree` on `event_id` absorbs (see [`super`]).
//! * Segments are deleted only after the batch holding their last row was
//!   acknowledged (or rejected and saved).
//! * Every batch's rows are linked into the writer's hash chain
//!   ([`super::linker`]) when it is formed; its chain entries are inserted
//!   before its rows, and the chain's head is kept in the spool with the
//!   cursor. Checkpoints are signed over acknowledged rows only.
//! * File reads run on the blocking pool; the task itself never blocks. In-flight
//!   inserts are futures owned by the task, so aborting it stops them too.

use crate::backoff::Backoff;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::OptionFuture;
use futures_util::stream::{FuturesOrdered, StreamExt};
use thiserror::Error;
use tokio::sync::watch;

use super::chain::{Hash, SignedCheckpoint};
use super::clickhouse::{self as ch, Disposition};
use super::linker::Linker;
use super::metrics::Metrics;
use super::spool::{self, Batch, FillOutcome, Position, Shared, SpoolError, SpoolReader};

/// Minimum spacing of reads while a partial batch waits to fill: every spool
/// write notifies (most are one row), and each read is a hop to the blocking
/// pool that competes with request handling. A partial batch waits up to
/// `max_age_ms` (1 s) anyway; this adds at most 50 ms to when rows ship.
const MIN_FILL_INTERVAL: Duration = Duration::from_millis(50);

/// Signed checkpoints go to ClickHouse at most this often (all signed
/// since, in one `INSERT`); each is in the local checkpoint file at once.
const CHECKPOINT_SEND_EVERY: Duration = Duration::from_secs(5);

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
    pub max_in_flight: usize,
    pub max_bytes: usize,
    pub max_age: Duration,
    pub retry_min: Duration,
    pub retry_max: Duration,
    pub insert_timeout: Duration,
    pub database: String,
    pub table: String,
    pub create_schema: bool,
}

impl ShipperSettings {
    /// Retries of inserts and of the schema: `retry_min` doubled up to
    /// `retry_max`, jittered.
    fn retry_schedule(&self) -> Backoff {
        Backoff {
            first: self.retry_min,
            max: self.retry_max,
        }
    }
}

/// What every insert needs; shared by the in-flight insert futures.
struct ShipCtx {
    client: clickhouse::Client,
    sql: String,
    /// The chain table's and the checkpoint table's `INSERT`.
    chain_sql: String,
    checkpoint_sql: String,
    settings: ShipperSettings,
    metrics: Metrics,
    shared: Arc<Shared>,
    /// Set once the schema exists; concurrent first inserts may both create it
    /// (the DDL is idempotent).
    schema_ready: AtomicBool,
    /// The ClickHouse outage going on, if any.
    outage: std::sync::Mutex<Outage>,
}

/// A run of failed `INSERT`s: logged once when it starts and once when it
/// ends, with counts, instead of a line per retry.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    since: Option<Instant>,
    failures: u64,
}

impl Outage {
    /// A failed insert: `true` when it starts an outage.
    pub(crate) fn failed(&mut self) -> bool {
        self.failures += 1;
        if self.since.is_none() {
            self.since = Some(Instant::now());
            return true;
        }
        false
    }

    /// A successful insert: the outage that ended, with its failure count.
    pub(crate) fn succeeded(&mut self) -> Option<(Duration, u64)> {
        let since = self.since.take()?;
        Some((since.elapsed(), std::mem::take(&mut self.failures)))
    }
}

/// Spool bookkeeping of a batch whose `INSERT` is in flight.
struct InFlight {
    /// Cursor value once acknowledged.
    end: Option<Position>,
    /// Segments deletable once acknowledged.
    finished_segments: Vec<u64>,
    /// Oldest row of the batch (for the age gauge).
    first_time_ms: Option<u64>,
    /// The chain's head after the batch's rows.
    head: Option<(u64, Hash)>,
}

/// An insert; yields its batch body back once acknowledged (or rejected).
type InsertFuture = Pin<Box<dyn Future<Output = Bytes> + Send>>;
type SchemaFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Spare batch buffers up to this size are kept whatever their last batch
/// used: too small to be worth giving back.
pub(crate) const KEEP_ANY_BELOW: usize = 256 << 10;

/// Batch buffers handed back by finished inserts, for the next batches: the
/// shipper cycles through at most `max_in_flight + 1` buffers of up to
/// `batch.max_bytes` instead of allocating megabytes per batch, which the
/// allocator is slow to give back to the system. A buffer its last batch
/// filled less than half of (beyond [`KEEP_ANY_BELOW`]) is not kept: it was
/// sized by a busier time, and memory follows the load back down.
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    spares: Vec<Vec<u8>>,
    keep: usize,
}

impl BufferPool {
    pub(crate) fn new(keep: usize) -> Self {
        Self {
            spares: Vec::new(),
            keep,
        }
    }

    /// An empty buffer: a recycled one, else a new one of `capacity`.
    pub(crate) fn take(&mut self, capacity: usize) -> Vec<u8> {
        self.spares
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(capacity))
    }

    /// Keeps `body`'s buffer if nothing else refers to it, the pool is not
    /// full, and the batch it carried used at least half of it.
    pub(crate) fn give(&mut self, body: Bytes) {
        if self.spares.len() >= self.keep {
            return;
        }
        let used = body.len();
        if let Ok(unique) = body.try_into_mut() {
            let mut v = Vec::from(unique);
            if v.capacity() > KEEP_ANY_BELOW && v.capacity() / 2 > used {
                return;
            }
            v.clear();
            self.spares.push(v);
        }
    }
}

/// The shipping task's state.
pub(crate) struct Shipper {
    ctx: Arc<ShipCtx>,
    reader: Option<SpoolReader>,
    phase: watch::Receiver<Phase>,
    /// The phase sender is gone (handle dropped): stop watching it.
    phase_gone: bool,
    /// Futures of in-flight inserts, completing in dispatch order, and their
    /// bookkeeping (same order, same length).
    inserts: FuturesOrdered<InsertFuture>,
    in_flight: VecDeque<InFlight>,
    buffers: BufferPool,
    /// Background schema creation, until it succeeds.
    schema: Option<SchemaFuture>,
    /// This writer's hash chain.
    linker: Linker,
    /// The checkpoints being inserted, if any.
    checkpoint: Option<SchemaFuture>,
    /// Signed checkpoints (already in the local file) not yet sent, and
    /// when a batch of them was last sent.
    signed: Vec<SignedCheckpoint>,
    last_sent: Instant,
}

impl Shipper {
    pub(crate) fn new(
        client: clickhouse::Client,
        settings: ShipperSettings,
        reader: SpoolReader,
        metrics: Metrics,
        phase: watch::Receiver<Phase>,
        linker: Linker,
    ) -> Self {
        let buffers = BufferPool::new(settings.max_in_flight);
        Self {
            ctx: Arc::new(ShipCtx {
                sql: ch::insert_sql(&settings.database, &settings.table),
                chain_sql: ch::chain_insert_sql(&settings.database, &settings.table),
                checkpoint_sql: ch::checkpoint_insert_sql(&settings.database, &settings.table),
                schema_ready: AtomicBool::new(!settings.create_schema),
                shared: Arc::clone(reader.shared()),
                client,
                settings,
                metrics,
                outage: std::sync::Mutex::new(Outage::default()),
            }),
            reader: Some(reader),
            phase,
            phase_gone: false,
            inserts: FuturesOrdered::new(),
            in_flight: VecDeque::new(),
            buffers,
            schema: None,
            linker,
            checkpoint: None,
            signed: Vec::new(),
            last_sent: Instant::now(),
        }
    }

    /// Runs until drained after shutdown (or the reader is lost).
    pub(crate) async fn run(mut self) -> Result<(), ShipperError> {
        if !self.ctx.schema_ready.load(Ordering::Acquire) {
            // Create the schema right away rather than with the first row, beside
            // the inserts (not in their queue: a user without DDL rights must
            // still be able to insert into a schema a DBA created).
            self.schema = Some(Box::pin(ensure_schema_until_done(Arc::clone(&self.ctx))));
        }
        let mut batch = Batch::default();
        let mut last_fill;
        let mut read_failures: u32 = 0;
        loop {
            if self.in_flight.len() >= self.ctx.settings.max_in_flight {
                // New data cannot be dispatched now: wait for an insert only, rather
                // than waking on every group commit.
                self.wait_inner(Some(Instant::now() + GAUGE_TICK), &batch, false)
                    .await;
                continue;
            }
            let draining = *self.phase.borrow() == Phase::Draining;
            let outcome = match self.fill(&mut batch).await? {
                Ok(o) => {
                    read_failures = 0;
                    o
                }
                Err(e) => {
                    read_failures = read_failures.saturating_add(1);
                    let s = &self.ctx.settings;
                    let delay = s.retry_schedule().jittered(read_failures, rand::random());
                    tracing::error!(error = %e, attempt = read_failures, "audit shipper: reading the spool failed; retrying");
                    self.wait(Some(Instant::now() + delay), &batch).await;
                    continue;
                }
            };
            last_fill = Instant::now();
            self.update_age(&batch);

            if batch.rows == 0 {
                self.release_finished(&mut batch.finished_segments);
                if draining && outcome == FillOutcome::CaughtUp {
                    if self.in_flight.is_empty() {
                        self.last_checkpoint().await;
                        return Ok(());
                    }
                    self.wait(Some(Instant::now() + GAUGE_TICK), &batch).await;
                    continue;
                }
                self.wait(None, &batch).await;
                continue;
            }

            if outcome == FillOutcome::CaughtUp && !draining {
                let deadline = batch
                    .opened
                    .map_or_else(Instant::now, |t| t + self.ctx.settings.max_age);
                if Instant::now() < deadline {
                    if self.wait(Some(deadline), &batch).await == Woke::NewData {
                        tokio::time::sleep_until((last_fill + MIN_FILL_INTERVAL).into()).await;
                    }
                    continue;
                }
            }
            if self.linker.needs_head() {
                self.learn_head(&batch).await;
            }
            self.dispatch(&mut batch);
        }
    }

    /// Continues the chain where this writer can prove it ended (the spool
    /// lost its head). With a signing key, that is the last checkpoint it
    /// signed (its local checkpoint file, else the table's, verified with
    /// its own key): entries ClickHouse holds after it are not provably
    /// this writer's, so the chain is not continued from them and no
    /// checkpoint will sign them; the next entry takes the next free `seq`
    /// and links to the checkpoint, they are logged, counted
    /// (`mcp_firewall_audit_chain_unproven_entries`) and reported by
    /// `verify`. Without a key (nothing is provable): after the entry of
    /// the first row to send when it was sent before, else after the last
    /// entry.
    fn resume_from(&mut self, state: &ch::ChainState) {
        let writer = self.linker.writer_id().to_owned();
        let proven = self.linker.last_signed_locally().or(state.signed);
        let last_seq = state.last.map_or(0, |(seq, _)| seq);
        let (seq, link) = match proven {
            None => state.replay.or(state.last).unwrap_or((0, [0; 32])),
            Some((cp, link)) if last_seq <= cp || state.replay.is_some_and(|(s, _)| s == cp) => {
                (cp, link)
            }
            Some((cp, link)) => {
                tracing::error!(
                    writer_id = %writer,
                    signed = cp,
                    unproven_from = cp + 1,
                    unproven_to = last_seq,
                    "audit chain: the entries after the last checkpoint this writer signed are not provably its own; the chain goes on from that checkpoint and never signs them"
                );
                self.ctx.metrics.set_chain_unproven(last_seq - cp);
                (last_seq, link)
            }
        };
        let linked_from = state.linked_from.unwrap_or(seq + 1);
        tracing::info!(writer_id = %writer, seq, "audit chain: continuing where this writer's chain is known to end");
        self.linker.resume(seq, link, linked_from);
    }

    /// Learns where the chain continues from ClickHouse (the spool did not
    /// say), retrying until it answers: nothing can be shipped meanwhile
    /// anyway.
    async fn learn_head(&mut self, batch: &Batch) {
        let first = batch.row_starts.first().and_then(|&at| {
            let row = batch.body.get(at..)?;
            Some((
                super::record::uuid_of(row)?,
                super::record::row_version(row)?,
            ))
        });
        let mut attempt: u32 = 0;
        loop {
            let s = &self.ctx.settings;
            // The chain table may not exist yet (the schema task is not
            // polled while this waits).
            schema_if_needed(&self.ctx).await;
            match ch::chain_state(
                &self.ctx.client,
                &s.database,
                &s.table,
                self.linker.writer_id(),
                first,
                self.linker.public_key(),
            )
            .await
            {
                Ok(state) => {
                    self.resume_from(&state);
                    return;
                }
                Err(e) => {
                    attempt = attempt.saturating_add(1);
                    let delay = s.retry_schedule().jittered(attempt, rand::random());
                    if attempt == 1 {
                        tracing::error!(error = %e, "audit chain: the spool does not say where this writer's chain continues and ClickHouse cannot be asked; rows wait in the spool");
                    }
                    self.ctx.metrics.send_error();
                    self.ctx.metrics.retry();
                    // The backlog stays visible (gauge, /readyz) meanwhile.
                    self.update_age(batch);
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Signs a checkpoint if one is due (it goes to the local file at once)
    /// and sends the signed ones to ClickHouse in one `INSERT` at most every
    /// [`CHECKPOINT_SEND_EVERY`] (`now`: at once): a tiny insert per batch
    /// would make ClickHouse create and merge a part per batch.
    fn maybe_checkpoint(&mut self, now: bool) {
        if let Some(cp) = self.linker.checkpoint(now) {
            self.signed.push(cp);
        }
        let due = now || self.last_sent.elapsed() >= CHECKPOINT_SEND_EVERY;
        if self.checkpoint.is_some() || self.signed.is_empty() || !due {
            return;
        }
        let batch = std::mem::take(&mut self.signed);
        self.last_sent = Instant::now();
        self.checkpoint = Some(Box::pin(insert_checkpoints(Arc::clone(&self.ctx), batch)));
    }

    /// At the end of a drain: the acknowledged tail signed and sent (a
    /// bounded wait: the handle's deadline aborts it otherwise).
    async fn last_checkpoint(&mut self) {
        if let Some(pending) = self.checkpoint.take() {
            pending.await;
        }
        self.maybe_checkpoint(true);
        if let Some(pending) = self.checkpoint.take() {
            pending.await;
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
        let (max_rows, max_bytes) = (self.ctx.settings.max_rows, self.ctx.settings.max_bytes);
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

    /// Sealed segments read to their end: deletable now if no insert is in
    /// flight, else once the newest in-flight batch (which may hold their last
    /// rows) is acknowledged.
    fn release_finished(&mut self, finished: &mut Vec<u64>) {
        if finished.is_empty() {
            return;
        }
        match self.in_flight.back_mut() {
            Some(last) => last.finished_segments.append(finished),
            None => {
                spool::delete_segments(&self.ctx.shared, finished);
                finished.clear();
            }
        }
    }

    /// Starts the `INSERT` of `batch` and empties it for the next one.
    fn dispatch(&mut self, batch: &mut Batch) {
        let mut entries = Vec::with_capacity(batch.rows * 160);
        let head = self.linker.link(batch, &mut entries);
        let next = self.buffers.take(batch.body.len());
        let body = Bytes::from(std::mem::replace(&mut batch.body, next));
        let start = batch.start.unwrap_or(Position { seq: 0, offset: 0 });
        self.in_flight.push_back(InFlight {
            end: batch.end,
            finished_segments: std::mem::take(&mut batch.finished_segments),
            first_time_ms: batch.first_time_ms,
            head,
        });
        self.inserts.push_back(Box::pin(insert_until_done(
            Arc::clone(&self.ctx),
            Bytes::from(entries),
            body,
            batch.rows as u64,
            start,
        )));
        batch.reset();
    }

    /// Waits for the oldest in-flight insert to finish (then records it), new
    /// spool data, the deadline (default: a gauge tick), or a phase change.
    async fn wait(&mut self, deadline: Option<Instant>, batch: &Batch) -> Woke {
        self.wait_inner(deadline, batch, true).await
    }

    async fn wait_inner(
        &mut self,
        deadline: Option<Instant>,
        batch: &Batch,
        want_data: bool,
    ) -> Woke {
        let until = deadline.unwrap_or_else(|| Instant::now() + GAUGE_TICK);
        let shared = Arc::clone(&self.ctx.shared);
        let phase_gone = self.phase_gone;
        let has_inserts = !self.inserts.is_empty();
        let has_schema = self.schema.is_some();
        let has_checkpoint = self.checkpoint.is_some();
        let woke = tokio::select! {
            Some(body) = self.inserts.next(), if has_inserts => {
                self.buffers.give(body);
                Woke::InsertDone
            }
            Some(()) = OptionFuture::from(self.schema.as_mut()), if has_schema => {
                self.schema = None;
                Woke::SchemaDone
            }
            Some(()) = OptionFuture::from(self.checkpoint.as_mut()), if has_checkpoint => {
                self.checkpoint = None;
                Woke::SchemaDone
            }
            () = shared.new_data.notified(), if want_data => Woke::NewData,
            () = tokio::time::sleep_until(until.into()) => Woke::Timeout,
            changed = self.phase.changed(), if !phase_gone => {
                if changed.is_err() {
                    self.phase_gone = true;
                }
                Woke::Phase
            }
        };
        if woke == Woke::InsertDone {
            self.acknowledge();
        }
        self.maybe_checkpoint(false);
        self.update_age(batch);
        woke
    }

    /// The oldest in-flight batch is in ClickHouse (or saved in `rejected/`):
    /// advance the cursor and delete the segments it finished.
    fn acknowledge(&mut self) {
        let Some(done) = self.in_flight.pop_front() else {
            return;
        };
        // Free space first: deleting shipped segments needs none, and may be
        // what a full disk waits for.
        spool::delete_segments(&self.ctx.shared, &done.finished_segments);
        if let Some(end) = done.end {
            if let Err(e) = spool::write_cursor(self.ctx.shared.dir(), end) {
                // Only costs a larger (deduplicated) replay after a restart.
                tracing::warn!(error = %e, "audit spool: cannot update cursor");
            }
            if let Some(head) = done.head {
                self.ctx.metrics.set_chain_seq(head.0);
                let head = self.linker.acknowledged(end, head);
                if let Err(e) = spool::write_chain_head(self.ctx.shared.dir(), &head) {
                    // The next start asks ClickHouse instead.
                    tracing::warn!(error = %e, "audit spool: cannot update the chain head");
                }
            }
        }
    }

    fn update_age(&self, batch: &Batch) {
        // In-flight batches are older than the one being filled.
        let oldest = self
            .in_flight
            .iter()
            .find_map(|f| f.first_time_ms)
            .or(if batch.rows > 0 {
                batch.first_time_ms
            } else {
                None
            });
        let age = oldest.map_or(0.0, |t| {
            crate::clock::now_ms().saturating_sub(t) as f64 / 1000.0
        });
        self.ctx.metrics.set_oldest_unsent_age(age);
    }
}

/// What ended a [`Shipper::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    InsertDone,
    SchemaDone,
    NewData,
    Timeout,
    Phase,
}

/// Inserts one batch until ClickHouse acknowledges it or, for bad data, until it
/// is saved to `rejected/`. Never gives up otherwise. Yields the body back.
async fn insert_until_done(
    ctx: Arc<ShipCtx>,
    entries: Bytes,
    body: Bytes,
    rows: u64,
    start: Position,
) -> Bytes {
    let mut attempt: u32 = 0;
    // The chain entries go first (once): a row in the table always has its
    // entry, even when the process dies between the two inserts.
    let mut entries_done = entries.is_empty();
    loop {
        let sent = if entries_done {
            try_insert(&ctx, &ctx.sql, &body).await
        } else {
            match try_insert(&ctx, &ctx.chain_sql, &entries).await {
                Ok(()) => {
                    entries_done = true;
                    try_insert(&ctx, &ctx.sql, &body).await
                }
                // Entries are never bad data (the firewall wrote every
                // byte): whatever ClickHouse says, retry them.
                Err((e, _)) => Err((e, Disposition::Retry)),
            }
        };
        let (err, disposition) = match sent {
            Ok(()) => {
                ctx.metrics.rows_sent(rows);
                let ended = ctx.outage.lock().ok().and_then(|mut o| o.succeeded());
                if let Some((lasted, failures)) = ended {
                    tracing::error!(
                        lasted_s = lasted.as_secs(),
                        failed_inserts = failures,
                        "audit: ClickHouse accepts rows again; the outage is over and the spooled rows are shipping"
                    );
                }
                return body;
            }
            Err(e) => e,
        };
        ctx.metrics.send_error();
        if disposition == Disposition::Retry {
            let started = ctx.outage.lock().is_ok_and(|mut o| o.failed());
            if started {
                tracing::error!(
                    error = %err,
                    "audit: ClickHouse outage: INSERTs fail; rows stay in the spool and ship when it is back (retrying every few seconds at most)"
                );
            }
        }
        if disposition == Disposition::Reject {
            match spool::save_rejected(
                ctx.shared.dir(),
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
                    ctx.metrics.rows_rejected(rows);
                    return body;
                }
                Err(e) => {
                    tracing::error!(error = %e, "audit: cannot save rejected batch; will retry it");
                }
            }
        }
        attempt = attempt.saturating_add(1);
        ctx.metrics.retry();
        let s = &ctx.settings;
        let delay = s.retry_schedule().jittered(attempt, rand::random());
        tracing::debug!(
            rows,
            attempt,
            retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            error = %err,
            "audit: INSERT into ClickHouse failed; retrying"
        );
        tokio::time::sleep(delay).await;
    }
}

/// Inserts signed checkpoints, retrying until ClickHouse acknowledges them
/// (their copies in the local checkpoint file are already written).
async fn insert_checkpoints(ctx: Arc<ShipCtx>, cps: Vec<SignedCheckpoint>) {
    let mut body = Vec::with_capacity(256 * cps.len());
    for cp in &cps {
        cp.encode(&mut body);
    }
    let body = Bytes::from(body);
    let what = format!(
        "inserting checkpoints up to seq {}",
        cps.last().map_or(0, |c| c.checkpoint.seq)
    );
    until_ok(&ctx, &what, || async {
        try_insert(&ctx, &ctx.checkpoint_sql, &body)
            .await
            .map_err(|(e, _)| e.to_string())
    })
    .await;
    ctx.metrics.checkpoints_sent(cps.len() as u64);
}

/// Creates the schema, retrying with backoff until ClickHouse accepts it.
async fn ensure_schema_until_done(ctx: Arc<ShipCtx>) {
    until_ok(&ctx, "creating the ClickHouse schema", || async {
        if ctx.schema_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        ch::ensure_schema(&ctx.client, &ctx.settings.database, &ctx.settings.table)
            .await
            .map_err(|e| e.to_string())?;
        ctx.schema_ready.store(true, Ordering::Release);
        Ok(())
    })
    .await;
}

/// Creates the schema if it is not known to exist (best effort: whatever
/// runs next says whether the tables are usable).
async fn schema_if_needed(ctx: &ShipCtx) {
    if ctx.schema_ready.load(Ordering::Acquire) {
        return;
    }
    match ch::ensure_schema(&ctx.client, &ctx.settings.database, &ctx.settings.table).await {
        Ok(()) => ctx.schema_ready.store(true, Ordering::Release),
        Err(e) => tracing::debug!(error = %e, "audit: schema creation failed"),
    }
}

/// Runs `op` until it succeeds, backing off between failures (each a send
/// error, logged as `what`): work that must happen eventually and holds no
/// batch.
async fn until_ok<Fut>(ctx: &ShipCtx, what: &str, mut op: impl FnMut() -> Fut)
where
    Fut: Future<Output = Result<(), String>>,
{
    let mut attempt: u32 = 0;
    while let Err(e) = op().await {
        attempt = attempt.saturating_add(1);
        ctx.metrics.send_error();
        let s = &ctx.settings;
        let delay = s.retry_schedule().jittered(attempt, rand::random());
        tracing::warn!(attempt, error = %e, "audit: {what} failed; retrying");
        tokio::time::sleep(delay).await;
    }
}

/// Creates the schema if still needed, then inserts. A failed schema creation
/// is not the batch's failure: only the insert's outcome counts.
async fn try_insert(
    ctx: &ShipCtx,
    sql: &str,
    body: &Bytes,
) -> Result<(), (clickhouse::error::Error, Disposition)> {
    // Best effort: the insert below says whether the table is usable.
    schema_if_needed(ctx).await;
    ch::insert(&ctx.client, sql, body, ctx.settings.insert_timeout)
        .await
        .map_err(|e| {
            let d = ch::classify(&e);
            (e, d)
        })
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
        let today = i64::try_from(crate::clock::now_ms() / 86_400_000).unwrap_or(0);
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
