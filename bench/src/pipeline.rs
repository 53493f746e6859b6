//! The audit pipeline's own capacity, apart from the firewall's request rate
//! (`mcp-bench audit-pipeline`): rows recorded through the product's
//! [`Auditor`] into its spool while ClickHouse is unreachable, that spool
//! then shipped into a throwaway `clickhouse-server`, and both at once.
//! Every phase is checked in ClickHouse: every row present exactly once.
//!
//! The rows are built before the clock starts (the proxy builds its row
//! while it handles the call); what is timed is what the pipeline does with
//! them: redaction, RowBinary encoding, the spool's group commit, reading the
//! spool back and the `INSERT`s.

use std::path::Path;
use std::time::{Duration, Instant};

use mcp_firewall::audit::{self, AuditConfig, AuditRow, Auditor, Risk};
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::clickhouse::ClickHouse;
use crate::procs::Placement;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Rows per phase.
    pub rows: u64,
    /// Concurrent recording tasks (calls in flight).
    pub tasks: u64,
    /// `audit.batch.max_rows` (the product's default when `None`).
    pub batch_rows: Option<usize>,
    /// `audit.batch.max_bytes` (the product's default when `None`).
    pub batch_bytes: Option<usize>,
}

/// Rows per second of each phase.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Recording into the spool, ClickHouse unreachable.
    pub spool_rows_per_s: f64,
    /// Shipping the full spool into ClickHouse.
    pub ship_rows_per_s: f64,
    /// Recording while shipping: the recording rate.
    pub concurrent_record_rows_per_s: f64,
    /// Recording while shipping: until the last row is in ClickHouse.
    pub concurrent_end_to_end_rows_per_s: f64,
    /// `INSERT` batch size used.
    pub batch_rows: usize,
    /// `INSERT` body cap used, bytes.
    pub batch_bytes: usize,
}

/// Runs the three phases against a throwaway ClickHouse in `dir`.
pub async fn run(spec: &Spec, dir: &Path) -> anyhow::Result<Figures> {
    let mut ch = ClickHouse::start(&dir.join("clickhouse"), &Placement::default())?;
    let result = phases(spec, dir, &ch).await;
    ch.stop();
    result
}

async fn phases(spec: &Spec, dir: &Path, ch: &ClickHouse) -> anyhow::Result<Figures> {
    let defaults = AuditConfig::default();
    let batch_rows = spec.batch_rows.unwrap_or(defaults.batch.max_rows);
    let batch_bytes = spec.batch_bytes.unwrap_or(defaults.batch.max_bytes);
    let config = |spool: &Path, url: &str, db: &str| {
        let mut c = AuditConfig::default();
        c.clickhouse.url = url.to_owned();
        c.clickhouse.database = db.to_owned();
        c.spool.dir = spool.to_owned();
        c.spool.max_bytes = 8 << 30;
        c.batch.max_rows = batch_rows;
        c.batch.max_bytes = batch_bytes;
        c.batch.max_age_ms = 200;
        c.instance = Some("mcp-bench".to_owned());
        c
    };
    let unreachable = {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        format!("http://127.0.0.1:{port}")
    };

    // 1. Spool only.
    let db = "pipeline_a";
    let spool = dir.join("spool-a");
    let (auditor, handle, _registry) = start(&config(&spool, &unreachable, db)).await?;
    let spool_s = record_all(&auditor, spec).await?;
    handle.shutdown(Duration::from_millis(100)).await;
    drop(auditor);

    // 2. Ship that spool.
    let started = Instant::now();
    let (_auditor, handle, _registry) = start(&config(&spool, &ch.url(), db)).await?;
    wait_for(ch, db, spec.rows).await?;
    let ship_s = started.elapsed().as_secs_f64();
    handle.shutdown(Duration::from_secs(10)).await;

    // 3. Both at once.
    let db = "pipeline_b";
    let started = Instant::now();
    let (auditor, handle, _registry) = start(&config(&dir.join("spool-b"), &ch.url(), db)).await?;
    let record_s = record_all(&auditor, spec).await?;
    wait_for(ch, db, spec.rows).await?;
    let both_s = started.elapsed().as_secs_f64();
    handle.shutdown(Duration::from_secs(10)).await;

    let rate = |s: f64| spec.rows as f64 / s.max(1e-6);
    Ok(Figures {
        spool_rows_per_s: rate(spool_s),
        ship_rows_per_s: rate(ship_s),
        concurrent_record_rows_per_s: rate(record_s),
        concurrent_end_to_end_rows_per_s: rate(both_s),
        batch_rows,
        batch_bytes,
    })
}

/// What `mcp-bench audit-verify` measured.
#[derive(Debug, Clone)]
pub struct VerifyFigures {
    /// Rows recorded, chained and shipped (then verified).
    pub rows: u64,
    /// Recording until the last row and its chain entry were in ClickHouse.
    pub ship_rows_per_s: f64,
    /// `audit verify` over the whole trail.
    pub verify_rows_per_s: f64,
    /// Its wall time.
    pub verify_s: f64,
    /// Peak resident memory of this process after verifying, MB.
    pub peak_rss_mb: f64,
    /// The report's verdict (must hold).
    pub holds: bool,
}

/// Records `spec.rows` rows through the product's auditor into a
/// throwaway ClickHouse (chained, checkpoints signed), then times
/// `audit verify` over all of them.
pub async fn verify_run(spec: &Spec, dir: &Path) -> anyhow::Result<VerifyFigures> {
    let mut ch = ClickHouse::start(&dir.join("clickhouse"), &Placement::default())?;
    let result = verify_phases(spec, dir, &ch).await;
    ch.stop();
    result
}

async fn verify_phases(spec: &Spec, dir: &Path, ch: &ClickHouse) -> anyhow::Result<VerifyFigures> {
    let key = dir.join("audit.key");
    std::fs::write(&key, audit::chain::Signer::generate_pem()?)?;
    let db = "verify_bench";
    let mut c = AuditConfig::default();
    c.clickhouse.url = ch.url();
    c.clickhouse.database = db.to_owned();
    c.spool.dir = dir.join("spool-v");
    c.spool.max_bytes = 16 << 30;
    c.batch.max_rows = spec.batch_rows.unwrap_or(50_000);
    c.batch.max_bytes = spec.batch_bytes.unwrap_or(32 << 20);
    c.batch.max_age_ms = 200;
    c.instance = Some("mcp-bench".to_owned());
    c.signing_key_file = Some(key.clone());
    let started = Instant::now();
    let (auditor, handle, _registry) = start(&c).await?;
    // Rows made as they are recorded: millions of them built up front would
    // not fit beside ClickHouse.
    let tasks = spec.tasks.max(1);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let a = auditor.clone();
        let rows = spec.rows;
        handles.push(tokio::spawn(async move {
            for i in (t..rows).step_by(tasks as usize) {
                a.record(row(i)).await?;
            }
            anyhow::Ok(())
        }));
    }
    for h in handles {
        h.await??;
    }
    wait_for(ch, db, spec.rows).await?;
    handle.shutdown(Duration::from_secs(60)).await;
    let ship_s = started.elapsed().as_secs_f64();
    let entries = ch.query_u64(&format!("SELECT count() FROM {db}.audit_events_chain"))?;
    anyhow::ensure!(
        entries == spec.rows,
        "{entries} chain entries for {} rows",
        spec.rows
    );

    let client = audit::verify::client_for(&c.clickhouse)?;
    let signer = audit::chain::Signer::from_pem(&std::fs::read_to_string(&key)?)?;
    let public = audit::chain::parse_public_key(&signer.public_key_text())
        .ok_or_else(|| anyhow::anyhow!("the public key does not parse"))?;
    let opts = audit::verify::Options {
        keys: vec![public],
        ..audit::verify::Options::default()
    };
    let target = audit::verify::Target {
        client: &client,
        database: db,
        table: "audit_events",
    };
    let started = Instant::now();
    let report = audit::verify::verify(&target, &opts).await?;
    let verify_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        report.rows_read == spec.rows,
        "verify read {} of {} rows",
        report.rows_read,
        spec.rows
    );
    Ok(VerifyFigures {
        rows: spec.rows,
        ship_rows_per_s: spec.rows as f64 / ship_s.max(1e-6),
        verify_rows_per_s: spec.rows as f64 / verify_s.max(1e-6),
        verify_s,
        peak_rss_mb: peak_rss_mb(),
        holds: report.holds,
    })
}

/// This process's peak resident memory (`VmHWM`), MB.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn start(cfg: &AuditConfig) -> anyhow::Result<(Auditor, audit::AuditHandle, Registry)> {
    let mut registry = Registry::default();
    let (a, h) = audit::start(cfg, &mut registry).await?;
    Ok((a, h, registry))
}

/// Waits until `db` holds `rows` rows, each exactly once.
async fn wait_for(ch: &ClickHouse, db: &str, rows: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let n = ch
            .query_u64(&format!("SELECT count() FROM {db}.audit_events"))
            .unwrap_or(0);
        if n >= rows {
            let distinct = ch.query_u64(&format!(
                "SELECT uniqExact(event_id) FROM {db}.audit_events"
            ))?;
            anyhow::ensure!(
                n == rows && distinct == rows,
                "{db}: {n} rows, {distinct} distinct, {rows} recorded"
            );
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{db}: only {n} of {rows} rows after 600 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A row as the proxy fills it for a `tools/call` (one in ten denied).
fn row(i: u64) -> AuditRow {
    let mut r = AuditRow::new();
    r.tenant = "acme".into();
    r.subject = format!("user-{}", i % 7);
    r.agent_role = if i.is_multiple_of(2) {
        "sre-lead"
    } else {
        "observability"
    }
    .into();
    r.run_id = format!("run-{}", i / 20);
    r.upstream = "incidents".into();
    r.method = "tools/call".into();
    r.tool = format!("get_service_{}", i % 5);
    r.risk = Some(Risk::Read);
    r.decision = if i.is_multiple_of(10) {
        "deny"
    } else {
        "allow"
    }
    .into();
    r.jsonrpc_id = i.to_string();
    r.arguments = json!({"service": "checkout", "namespace": "prod", "n": i}).into();
    r.latency_us = 100 + i % 1000;
    r
}

/// Records `spec.rows` rows from `spec.tasks` tasks; returns the seconds taken.
async fn record_all(auditor: &Auditor, spec: &Spec) -> anyhow::Result<f64> {
    let tasks = spec.tasks.max(1);
    let per_task: Vec<Vec<AuditRow>> = (0..tasks)
        .map(|t| (t..spec.rows).step_by(tasks as usize).map(row).collect())
        .collect();
    let started = Instant::now();
    let mut handles = Vec::new();
    for rows in per_task {
        let a = auditor.clone();
        handles.push(tokio::spawn(async move {
            for r in rows {
                a.record(r).await?;
            }
            anyhow::Ok(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(started.elapsed().as_secs_f64())
}
