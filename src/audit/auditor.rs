//! The `Auditor` the request path writes rows through, and `start`, which opens
//! the spool, the chain linker and the shipping thread behind it.

use super::metrics::Metrics;
use super::shipper::{Phase, Shipper, ShipperSettings};
use super::spool::Shared;
use super::*;
use anyhow::Context;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::sync::watch;
use uuid::Uuid;

// What `mcp-firewall audit` (`crate::cli::audit`) reads with.
pub(crate) use super::clickhouse::build_client;

/// What the proxy does with a call whose audit row could not be spooled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Serve the call; the loss is counted (`audit_rows_lost`) and logged.
    Open,
    /// Refuse the call: no audit, no action.
    Closed,
}

/// Errors of the audit pipeline.
#[derive(Debug, Error)]
pub enum AuditError {
    /// The spool did not take the row.
    #[error("audit row not spooled: {0}")]
    Spool(#[from] SpoolError),
    /// The row's group writer went away before acknowledging the row.
    #[error("audit spool writer stopped before acknowledging the row")]
    WriterGone,
    /// [`Auditor::admit`]: the spool is known not to accept rows and the call's
    /// risk is configured fail-closed.
    #[error("audit spool is not accepting rows; {risk:?} calls fail closed")]
    NotAccepting {
        /// Risk of the refused call.
        risk: Risk,
    },
    /// `database`/`table` would not be a plain SQL identifier.
    #[error("invalid audit config: clickhouse.{field} {value:?} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 64 bytes)")]
    InvalidIdentifier {
        /// `database` or `table`.
        field: &'static str,
        /// The configured value.
        value: String,
    },
    /// The ClickHouse URL is not HTTP(S).
    #[error("invalid audit config: clickhouse.url {url:?} must start with http:// or https://")]
    InvalidUrl {
        /// The configured URL.
        url: String,
    },
    /// Both `password_env` and `password_file` are set.
    #[error(
        "invalid audit config: set clickhouse.password_env or clickhouse.password_file, not both"
    )]
    TwoPasswordSources,
    /// `spool.segment_bytes` is below the minimum.
    #[error(
        "invalid audit config: spool.segment_bytes {segment_bytes} is below the minimum {min}"
    )]
    SegmentTooSmall {
        /// The configured size.
        segment_bytes: u64,
        /// The minimum accepted.
        min: u64,
    },
    /// A limit that must be positive is 0.
    #[error("invalid audit config: {field} must be at least 1")]
    ZeroLimit {
        /// Dotted path of the setting.
        field: &'static str,
    },
    /// The retry delays are 0 or inverted.
    #[error("invalid audit config: batch.retry_min_ms {min_ms} must be positive and not above batch.retry_max_ms {max_ms}")]
    RetryRange {
        /// `batch.retry_min_ms`.
        min_ms: u64,
        /// `batch.retry_max_ms`.
        max_ms: u64,
    },
    /// `writer_id` is not a plain name.
    #[error("invalid audit config: writer_id {value:?} must be 1 to 128 bytes of [A-Za-z0-9._:-]")]
    InvalidWriterId {
        /// The configured value.
        value: String,
    },
    /// The checkpoint signing key cannot be used.
    #[error("audit.signing_key_file {path}: {reason}")]
    SigningKey {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// The redaction patterns do not compile.
    #[error(transparent)]
    Redact(#[from] RedactError),
    /// The ClickHouse client could not be set up.
    #[error(transparent)]
    ClickHouse(#[from] ClickHouseError),
}

/// What [`Auditor::record_or_fail`] did with a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Written to the spool; it will reach ClickHouse.
    Spooled,
    /// Audit is disabled; nothing was written.
    Disabled,
    /// The spool failed and the risk is fail-open: the call may proceed, the row is
    /// lost (counted and logged).
    Lost,
}

/// Redaction settings and where rows go; shared by all clones of an [`Auditor`].
pub(super) struct Inner {
    spool: Arc<Shared>,
    redactor: Redactor,
    max_result_bytes: usize,
    max_arguments_bytes: usize,
    instance: Box<str>,
    fail: FailModes,
    metrics: Metrics,
    /// Rate limit of the "row lost" log line.
    lost_log: LogEvery,
    /// Rate limit of the "row not written" log line.
    unwritten_log: LogEvery,
    /// Backlog age past which the firewall is not ready.
    max_backlog_age: Option<Duration>,
}

/// A log line at most once per interval, with how many occurrences it covers.
pub(super) struct LogEvery {
    last: std::sync::Mutex<Option<Instant>>,
    count: std::sync::atomic::AtomicU64,
    every: Duration,
}

impl LogEvery {
    fn new(every: Duration) -> Self {
        Self {
            last: std::sync::Mutex::new(None),
            count: std::sync::atomic::AtomicU64::new(0),
            every,
        }
    }

    /// One more occurrence: `Some(occurrences)` when a line is due.
    fn tick(&self) -> Option<u64> {
        let n = self
            .count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let mut last = self.last.lock().ok()?;
        if last.is_some_and(|t| t.elapsed() < self.every) {
            return None;
        }
        *last = Some(Instant::now());
        self.count.store(0, std::sync::atomic::Ordering::Relaxed);
        Some(n)
    }
}

/// The proxy's handle for writing audit rows. Cheap to clone.
#[derive(Clone)]
pub struct Auditor {
    /// `None` when audit is disabled.
    inner: Option<Arc<Inner>>,
}

impl fmt::Debug for Auditor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auditor")
            .field("enabled", &self.inner.is_some())
            .finish_non_exhaustive()
    }
}

thread_local! {
    /// Per-thread buffers for the rendered arguments and result: reused across
    /// calls so rendering allocates nothing in steady state.
    static SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Scratch buffers above this capacity are freed after use, so one huge tool
/// argument does not pin memory on every worker thread.
pub(super) const SCRATCH_KEEP: usize = 256 << 10;

impl Auditor {
    /// An auditor that records nothing (audit disabled, demo without ClickHouse).
    pub fn disabled() -> Self {
        Self { inner: None }
    }

    /// Whether rows are actually recorded.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Redacts, encodes and spools `row`. Returns once the row is written to the
    /// spool (`write(2)` done: by the spool thread, with other callers' rows,
    /// on a multi-thread runtime; by this call otherwise; fsync is batched by
    /// the spool thread). Never touches the network. A no-op when disabled.
    ///
    /// Takes the row by reference or by value: a caller that keeps the row
    /// (an intent, completed later) lends it and no copy is made.
    pub async fn record(
        &self,
        row: impl std::borrow::Borrow<AuditRow> + Send,
    ) -> Result<(), AuditError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let row = row.borrow();
        let appended = SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let (args, result) = &mut *scratch;
            redact::render_payload(
                &row.arguments,
                &inner.redactor,
                inner.max_arguments_bytes,
                args,
            );
            redact::render_payload(&row.result, &inner.redactor, inner.max_result_bytes, result);
            let appended = inner
                .spool
                .append(|buf| record::encode_row(row, args, result, &inner.instance, buf));
            for b in [args, result] {
                if b.capacity() > SCRATCH_KEEP {
                    *b = Vec::new();
                }
            }
            appended
        })?;
        // A queued row waits for its group's write at most the write
        // deadline: a frozen disk must not hold every call.
        let deadline = inner.spool.write_timeout();
        match tokio::time::timeout(deadline, appended.outcome()).await {
            Ok(outcome) => outcome.ok_or(AuditError::WriterGone)??,
            Err(_) => {
                inner.metrics.spool_stall();
                return Err(AuditError::Spool(SpoolError::Stalled {
                    ms: deadline.as_millis() as u64,
                }));
            }
        }
        Ok(())
    }

    /// The configured behaviour when a call of `risk` cannot be audited. `Open`
    /// when audit is disabled.
    pub fn fail_mode(&self, risk: Risk) -> FailMode {
        self.inner
            .as_ref()
            .map_or(FailMode::Open, |i| i.fail.for_risk(risk))
    }

    /// Cheap pre-flight check before forwarding a call: `Err` when the spool is
    /// known not to accept rows (full, or its last write failed) and `risk` is
    /// fail-closed. A race remains (the spool may fail between this check and
    /// `record`); it only narrows the window in which an action happens unaudited.
    pub fn admit(&self, risk: Risk) -> Result<(), AuditError> {
        match &self.inner {
            Some(i) if !i.spool.accepting() && i.fail.for_risk(risk) == FailMode::Closed => {
                Err(AuditError::NotAccepting { risk })
            }
            _ => Ok(()),
        }
    }

    /// Counts and loudly logs a row lost under fail-open (one log line per
    /// second at most, with the count since the last one: a failing disk
    /// must not also flood the log).
    pub fn note_lost(&self, event_id: Uuid, err: &AuditError) {
        if let Some(i) = &self.inner {
            i.metrics.row_lost();
            if let Some(n) = i.lost_log.tick() {
                tracing::error!(%event_id, error = %err, lost_since_last_line = n, "AUDIT ROW LOST: call served fail-open without an audit record");
            }
        }
    }

    /// Logs (at most once a second, with a count) a fail-closed row that could
    /// not be written after its call was already decided.
    pub fn note_unwritten(&self, err: &AuditError) {
        if let Some(i) = &self.inner {
            if let Some(n) = i.unwritten_log.tick() {
                tracing::error!(error = %err, rows_since_last_line = n, "audit row could not be written");
            }
        }
    }

    /// Why the audit trail cannot promise what the configuration asks:
    /// `audit_spool_refusing` while the spool does not take rows and some
    /// risk is fail-closed (those calls are refused), `audit_backlog` while
    /// the oldest unsent row is older than `max_backlog_age_s`. Empty when
    /// audit is off or all is well.
    pub fn not_ready(&self) -> Vec<&'static str> {
        let Some(i) = &self.inner else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let fail_closed = Risk::ALL
            .iter()
            .any(|r| i.fail.for_risk(*r) == FailMode::Closed);
        if fail_closed && !i.spool.accepting() {
            out.push("audit_spool_refusing");
        }
        if i.max_backlog_age
            .is_some_and(|max| i.metrics.oldest_unsent_age() > max.as_secs_f64())
        {
            out.push("audit_backlog");
        }
        out
    }

    /// [`Auditor::record`], then the fail mode of the row's risk (`None` counts as
    /// read): `Err` means fail-closed, refuse the call; `Ok(Recorded::Lost)` means
    /// fail-open, serve it (already counted and logged).
    pub async fn record_or_fail(
        &self,
        row: impl std::borrow::Borrow<AuditRow> + Send,
    ) -> Result<Recorded, AuditError> {
        if self.inner.is_none() {
            return Ok(Recorded::Disabled);
        }
        let risk = row.borrow().risk.unwrap_or(Risk::Read);
        let event_id = row.borrow().event_id;
        match self.record(row).await {
            Ok(()) => Ok(Recorded::Spooled),
            Err(e) => match self.fail_mode(risk) {
                FailMode::Open => {
                    self.note_lost(event_id, &e);
                    Ok(Recorded::Lost)
                }
                FailMode::Closed => Err(e),
            },
        }
    }

    /// Rows lost under fail-open so far.
    pub fn rows_lost(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.metrics.rows_lost_total())
    }
}

/// Running background parts of an enabled pipeline.
pub(super) struct Running {
    spool: Arc<Shared>,
    syncer: std::thread::JoinHandle<()>,
    phase: watch::Sender<Phase>,
    ship_thread: ShipThread,
    shipper: tokio::task::JoinHandle<Result<(), ShipperError>>,
    retention: Option<tokio::task::JoinHandle<()>>,
}

/// The thread the shipper and the retention task run on: a single-threaded
/// runtime of its own, so compressing and sending a batch (milliseconds for a
/// full one) never holds a runtime worker that requests are waiting for.
pub(super) struct ShipThread {
    runtime: tokio::runtime::Handle,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl ShipThread {
    fn start() -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let runtime = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("audit-ship".into())
            .spawn(move || {
                rt.block_on(async move {
                    // A handle dropped without `shutdown` leaves the pipeline
                    // running, as a detached task would.
                    if stopped.await.is_err() {
                        std::future::pending::<()>().await;
                    }
                });
                // A spool read in progress finishes quickly; do not hang on one.
                rt.shutdown_timeout(Duration::from_secs(1));
            })?;
        Ok(Self {
            runtime,
            stop,
            thread,
        })
    }

    /// Ends the runtime (its tasks are finished or aborted by now) and joins.
    async fn stop(self) {
        // Ignored error: the thread already ended.
        let _ = self.stop.send(());
        let thread = self.thread;
        if tokio::task::spawn_blocking(move || thread.join())
            .await
            .map_or(true, |r| r.is_err())
        {
            tracing::error!("audit shipper thread could not be joined");
        }
    }
}

/// Owns the pipeline's background work; [`AuditHandle::shutdown`] stops it.
/// Dropping the handle without calling it leaves the pipeline running.
pub struct AuditHandle {
    running: Option<Running>,
}

impl fmt::Debug for AuditHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditHandle")
            .field("running", &self.running.is_some())
            .finish()
    }
}

impl AuditHandle {
    /// Stops accepting rows, flushes the spool, and ships what is left until
    /// `deadline` has passed. Rows not shipped by then stay in the spool and are
    /// shipped by the next start.
    pub async fn shutdown(self, deadline: Duration) {
        let Some(run) = self.running else { return };
        let end = Instant::now() + deadline;
        run.spool.close();
        let syncer = run.syncer;
        if tokio::task::spawn_blocking(move || syncer.join())
            .await
            .is_err()
        {
            tracing::error!("audit spool thread could not be joined");
        }
        // Ignored error: the shipper already exited.
        let _ = run.phase.send(Phase::Draining);
        let mut shipper = run.shipper;
        match tokio::time::timeout_at(end.into(), &mut shipper).await {
            Ok(Ok(Ok(()))) => tracing::info!("audit: spool drained into ClickHouse"),
            Ok(Ok(Err(e))) => tracing::error!(error = %e, "audit shipper failed"),
            Ok(Err(e)) => tracing::error!(error = %e, "audit shipper task failed"),
            Err(_) => {
                shipper.abort();
                let _ = shipper.await;
                tracing::warn!("audit: shutdown deadline reached; unshipped rows stay spooled for the next start");
            }
        }
        if let Some(r) = run.retention {
            r.abort();
            let _ = r.await;
        }
        run.ship_thread.stop().await;
    }
}

/// Starts the pipeline described by `cfg`: opens (and recovers) the spool, starts
/// the spool thread, the shipper and, with `retention_days`, the retention task.
/// ClickHouse need not be up: rows are spooled and shipped once it is. When
/// `cfg.enabled` is false, returns a disabled auditor and an inert handle.
pub async fn start(
    cfg: &AuditConfig,
    registry: &mut Registry,
) -> anyhow::Result<(Auditor, AuditHandle)> {
    if !cfg.enabled {
        return Ok((Auditor::disabled(), AuditHandle { running: None }));
    }
    cfg.validate()?;
    let redactor = Redactor::new(&cfg.redact.key_patterns)?;
    let client = super::clickhouse::build_client(&cfg.clickhouse)?;
    let metrics = Metrics::register(registry);

    let settings = spool::SpoolSettings {
        dir: cfg.spool.dir.clone(),
        // Shipped rows are freed a whole segment at a time; capping segments at a
        // quarter of the spool keeps shipped-but-undeleted bytes from filling it.
        segment_bytes: cfg
            .spool
            .segment_bytes
            .min(cfg.spool.max_bytes / 4)
            .max(1024),
        fsync_interval: Duration::from_millis(cfg.spool.fsync_interval_ms),
        max_bytes: cfg.spool.max_bytes,
        min_free_bytes: cfg.spool.min_free_bytes,
        write_timeout: Duration::from_millis(cfg.spool.write_timeout_ms),
        reprobe_after: spool::REPROBE_AFTER,
    };
    let m = metrics.clone();
    // Recovery reads every leftover segment: blocking work, off the runtime.
    let spool = tokio::task::spawn_blocking(move || spool::open(&settings, m)).await??;
    if spool.recovery.segments > 0 || spool.recovery.cut_bytes > 0 {
        tracing::info!(
            segments = spool.recovery.segments,
            cut_bytes = spool.recovery.cut_bytes,
            "audit spool: replaying rows left by a previous run"
        );
    }

    let linker = linker_for(cfg, spool.cursor)?;
    let (phase_tx, phase_rx) = watch::channel(Phase::Running);
    let ch = &cfg.clickhouse;
    let shipper = Shipper::new(
        client.clone(),
        ShipperSettings {
            max_rows: cfg.batch.max_rows,
            max_in_flight: cfg.batch.max_in_flight,
            max_bytes: cfg.batch.max_bytes,
            max_age: Duration::from_millis(cfg.batch.max_age_ms),
            retry_min: Duration::from_millis(cfg.batch.retry_min_ms),
            retry_max: Duration::from_millis(cfg.batch.retry_max_ms),
            insert_timeout: Duration::from_millis(ch.insert_timeout_ms),
            database: ch.database.clone(),
            table: ch.table.clone(),
            create_schema: ch.create_schema,
        },
        spool.reader,
        metrics.clone(),
        phase_rx.clone(),
        linker,
    );
    let ship_thread = ShipThread::start().context("starting the audit shipper thread")?;
    let shipper = ship_thread.runtime.spawn(shipper.run());
    let retention = cfg.retention_days.map(|days| {
        ship_thread.runtime.spawn(shipper::retention_loop(
            client,
            ch.database.clone(),
            ch.table.clone(),
            days,
            phase_rx,
        ))
    });

    let instance = cfg.instance.clone().unwrap_or_else(host_name);
    let auditor = Auditor {
        inner: Some(Arc::new(Inner {
            spool: Arc::clone(&spool.shared),
            redactor,
            max_result_bytes: cfg.redact.max_result_bytes,
            max_arguments_bytes: cfg.redact.max_arguments_bytes,
            instance: instance.into_boxed_str(),
            fail: cfg.on_spool_failure,
            metrics,
            lost_log: LogEvery::new(Duration::from_secs(1)),
            unwritten_log: LogEvery::new(Duration::from_secs(1)),
            max_backlog_age: (cfg.max_backlog_age_s > 0)
                .then(|| Duration::from_secs(cfg.max_backlog_age_s)),
        })),
    };
    let handle = AuditHandle {
        running: Some(Running {
            spool: spool.shared,
            syncer: spool.syncer,
            phase: phase_tx,
            ship_thread,
            shipper,
            retention,
        }),
    };
    Ok((auditor, handle))
}

/// The hash chain's writer for this spool: its id, its signing key, where
/// its checkpoints are copied, and its head as the spool last knew it.
pub(super) fn linker_for(
    cfg: &AuditConfig,
    cursor: Option<spool::Position>,
) -> Result<linker::Linker, AuditError> {
    let dir = &cfg.spool.dir;
    let writer_id = match &cfg.writer_id {
        Some(id) => id.clone(),
        None => spool_writer_id(dir)?,
    };
    let signer = match &cfg.signing_key_file {
        Some(path) => Some(load_signer(path)?),
        None if !cfg.chain => None,
        None => {
            tracing::warn!(writer_id, "audit: no audit.signing_key_file: rows are chained but no checkpoint is signed, so the chain's tail can be cut unnoticed (`mcp-firewall audit keygen --out FILE`)");
            None
        }
    };
    let file = cfg
        .checkpoint_file
        .clone()
        .unwrap_or_else(|| dir.join("checkpoints.jsonl"));
    if !cfg.chain {
        tracing::warn!("audit.chain = false: rows are shipped unchained; `mcp-firewall audit verify` can prove nothing about them");
    }
    Ok(linker::Linker::new(
        cfg.chain,
        writer_id,
        signer,
        cfg.checkpoint_every.limits(),
        file,
        spool::read_chain_head(dir),
        cursor,
    ))
}

/// Reads an Ed25519 checkpoint key (PKCS#8 PEM); warns when others may
/// read it.
pub(crate) fn load_signer(path: &std::path::Path) -> Result<chain::Signer, AuditError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |reason: String| AuditError::SigningKey {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    if std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
        tracing::warn!(path = %path.display(), "audit.signing_key_file is readable by group or others: whoever reads it can sign checkpoints");
    }
    chain::Signer::from_pem(&text).map_err(|e| err(e.to_string()))
}

/// The writer id kept in the spool (`writer_id`), made at first start:
/// the host name and 8 random hex digits.
pub(super) fn spool_writer_id(dir: &std::path::Path) -> Result<String, AuditError> {
    let path = dir.join("writer_id");
    let spool_err = |e: std::io::Error| AuditError::Spool(SpoolError::dir(&path, e));
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim().to_owned();
            if is_writer_id(&id) {
                return Ok(id);
            }
            return Err(AuditError::InvalidWriterId { value: id });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(spool_err(e)),
    }
    let host: String = host_name()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .take(100)
        .collect();
    let id = format!(
        "{}-{:08x}",
        if host.is_empty() { "fw" } else { host.as_str() },
        rand::random::<u32>()
    );
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(spool_err)?;
        f.write_all(format!("{id}\n").as_bytes())
            .map_err(spool_err)?;
        f.sync_all().map_err(spool_err)?;
    }
    Ok(id)
}

/// The kernel's host name, or empty when unreadable.
pub(super) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "auditor_tests.rs"]
mod tests;
