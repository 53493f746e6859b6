//! Cost of auditing a decided message on the request path: redaction of the
//! arguments, and `Auditor::record` (redact, cap, encode the row once as
//! ClickHouse RowBinary, append to the spool's group buffer, wait for the
//! group's write(2)), one at a time (the latency a request pays) and from 64
//! concurrent tasks (the throughput of group commit).
//!
//! The row encoder itself is crate-private, so it is measured inside
//! `record`; the spool runs in a temp dir and ClickHouse is a closed port,
//! so rows stay spooled and nothing but the request-path work is timed.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use mcp_firewall::audit::{self, AuditConfig, AuditRow, Auditor, Redactor, Risk};
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use std::hint::black_box;

/// Arguments of a typical tool call, with one key the default patterns
/// redact (`api_key`).
fn arguments() -> Value {
    json!({
        "service": "checkout",
        "namespace": "prod",
        "query": "SELECT id, status FROM orders WHERE created_at > now() - interval 1 hour LIMIT 50",
        "options": {"timeout_ms": 5000, "api_key": "sk-live-0123456789abcdef", "tags": ["incident", "INC-1001"]}
    })
}

/// A row as the proxy fills it for an allowed `tools/call`.
fn row(i: u64) -> AuditRow {
    let mut r = AuditRow::new();
    r.tenant = "acme".into();
    r.subject = "alice@example.com".into();
    r.agent_role = "sre-lead".into();
    r.run_id = "run-7f3c2a9e-5b1d-4e8a-9c6f-2d0b1a3e4f56".into();
    r.session_id = "3f2b8c1d-aa41-4f0e-8e37-0b9c6d5e4a21".into();
    r.token_id = "b1c7e0f2-1d2e-4c53-9a0e-6f1f0c0b2a11".into();
    r.client_ip = Some([10, 1, 2, 3].into());
    r.upstream = "incidents".into();
    r.project = "sre".into();
    r.protocol_version = "2025-11-25".into();
    r.method = "tools/call".into();
    r.tool = "get_deployment".into();
    r.risk = Some(Risk::Read);
    r.decision = "allow".into();
    r.stop_reason = "done".into();
    r.jsonrpc_id = i.to_string();
    r.arguments = arguments().into();
    r.result = json!({"content": [{"type": "text", "text": "dep-1042 live on checkout/prod since 09:12 UTC"}], "isError": false}).into();
    r.upstream_status = 200;
    r.latency_us = 412;
    r.upstream_latency_us = 198;
    r.bytes_in = 310;
    r.bytes_out = 290;
    r
}

fn config(dir: &std::path::Path) -> AuditConfig {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let mut c = AuditConfig::default();
    c.clickhouse.url = format!("http://127.0.0.1:{port}");
    c.spool.dir = dir.to_owned();
    c.spool.max_bytes = 2 << 30;
    c.instance = Some("bench".into());
    c
}

fn redaction(c: &mut Criterion) {
    let redactor = Redactor::new(&audit::default_key_patterns()).expect("patterns");
    let args = arguments();
    let mut group = c.benchmark_group("audit");
    group.throughput(Throughput::Elements(1));
    group.bench_function("redact_typical_arguments", |b| {
        b.iter_batched(
            || args.clone(),
            |mut v| {
                audit::redact_json(&mut v, &redactor);
                v
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn record(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (auditor, handle) = runtime
        .block_on(audit::start(&config(dir.path()), &mut Registry::default()))
        .expect("audit pipeline");
    let mut group = c.benchmark_group("audit");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(1));
    group.bench_function("record_one_row", |b| {
        b.iter_batched(
            || row(1),
            |r| {
                runtime
                    .block_on(auditor.record(black_box(r)))
                    .expect("spooled")
            },
            BatchSize::SmallInput,
        )
    });
    const TASKS: u64 = 64;
    const PER_TASK: u64 = 50;
    group.throughput(Throughput::Elements(TASKS * PER_TASK));
    group.bench_function("record_64_concurrent_tasks_x50", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let rows: Vec<Vec<AuditRow>> = (0..TASKS)
                    .map(|t| (0..PER_TASK).map(|i| row(t * PER_TASK + i)).collect())
                    .collect();
                total += runtime.block_on(concurrent(&auditor, rows));
            }
            total
        })
    });
    group.finish();
    runtime.block_on(handle.shutdown(Duration::from_millis(100)));
}

async fn concurrent(auditor: &Auditor, rows: Vec<Vec<AuditRow>>) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = rows
        .into_iter()
        .map(|rows| {
            let a = auditor.clone();
            tokio::spawn(async move {
                for r in rows {
                    a.record(r).await.expect("spooled");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    start.elapsed()
}

criterion_group!(benches, redaction, record);
criterion_main!(benches);
