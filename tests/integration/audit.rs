//! Integration tests of the audit pipeline against a real ClickHouse server:
//! field round trip, redaction, ClickHouse outage, firewall crash (SIGKILL of a
//! child process), spool failures under both fail modes, torn records, bad data,
//! duplicate-proof daily stats, retention, and (ignored) throughput.

use std::collections::HashSet;
use std::io::Write;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::clickhouse::{ClickHouse, INSERTER_PASSWORD};
use crate::common::wait_until;
use mcp_firewall::audit::{
    self, AuditConfig, AuditError, AuditRow, Auditor, FailMode, JsonPayload, Recorded, Risk,
    SpoolError, REDACTED,
};
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

/// Env var that turns the crash test's child process into a writer.
const CHILD_ENV: &str = "MCPFW_AUDIT_CRASH_CHILD";

/// Pipeline settings sized for tests: small segments (rotation happens), short
/// batch age and retry delays (tests finish fast).
fn test_config(spool: &Path, url: &str, database: &str) -> AuditConfig {
    let mut c = AuditConfig::default();
    c.clickhouse.url = url.to_owned();
    c.clickhouse.database = database.to_owned();
    c.clickhouse.insert_timeout_ms = 10_000;
    c.spool.dir = spool.to_owned();
    c.spool.segment_bytes = 256 << 10;
    c.spool.fsync_interval_ms = 20;
    c.batch.max_rows = 1_000;
    c.batch.max_age_ms = 50;
    c.batch.retry_min_ms = 50;
    c.batch.retry_max_ms = 400;
    c.instance = Some("fw-test-1".to_owned());
    c
}

/// A URL nothing listens on: rows stay in the spool.
fn dead_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    format!("http://127.0.0.1:{port}")
}

fn row(i: u64, run: &str) -> AuditRow {
    let mut r = AuditRow::new();
    r.tenant = "acme".into();
    r.subject = format!("user-{}", i % 7);
    r.agent_role = if i % 2 == 0 { "coder" } else { "reviewer" }.into();
    r.run_id = run.into();
    r.upstream = "github".into();
    r.method = "tools/call".into();
    r.tool = format!("tool_{}", i % 5);
    r.risk = Some(Risk::Read);
    r.decision = if i % 10 == 0 { "deny" } else { "allow" }.into();
    r.jsonrpc_id = i.to_string();
    r.arguments = json!({"n": i, "path": format!("/src/file{i}.rs")}).into();
    r.latency_us = 100 + i % 1000;
    r
}

async fn start(cfg: &AuditConfig) -> (Auditor, audit::AuditHandle, Registry) {
    let mut registry = Registry::default();
    let (a, h) = audit::start(cfg, &mut registry)
        .await
        .expect("audit pipeline starts");
    (a, h, registry)
}

/// Value of a metric sample from the registry's text encoding.
fn metric(registry: &Registry, name: &str) -> f64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing in:\n{text}"))
}

/// [`wait_until`] that blocks its thread while it polls: only for the test
/// that proves rows ship while the recording runtime cannot run anything.
fn block_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ids_in(ch: &ClickHouse, sql: &str) -> Vec<String> {
    ch.query(sql).lines().map(str::to_owned).collect()
}

fn num(v: &Value) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().expect("u64"),
        Value::String(s) => s.parse().expect("numeric string"),
        other => panic!("not a number: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_round_trips_through_clickhouse() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let cfg = test_config(spool.path(), &ch.http_url, &db);
    let (auditor, handle, _reg) = start(&cfg).await;

    let mut r = AuditRow::new();
    r.time_ms = 1_767_225_600_123; // 2026-01-01T00:00:00.123Z
    r.tenant = "acme".into();
    r.subject = "alice@acme.example".into();
    r.agent_role = "deployer".into();
    r.run_id = "run-42".into();
    r.session_id = "sess-9f".into();
    r.token_id = "jti-77".into();
    r.client_ip = Some("2001:db8::7".parse::<IpAddr>().unwrap());
    r.upstream = "k8s".into();
    r.project = "payments".into();
    r.protocol_version = "2025-06-18".into();
    r.method = "tools/call".into();
    r.tool = "delete_namespace".into();
    r.risk = Some(Risk::Destructive);
    r.decision = "approve".into();
    r.reason = "rule:prod-destructive needs approval — ok'd by bob".into();
    r.stop_reason = "approval_required".into();
    r.jsonrpc_id = "\"req-1\"".into();
    r.arguments = json!({
        "namespace": "prod-ü",
        "auth": {"Password": "hunter2", "nested": [{"api_key": "k-1"}, {"x": 1}]}
    })
    .into();
    let raw = serde_json::value::RawValue::from_string(
        r#"{"content":[{"type":"text","text":"deleted"}],"SessionToken":"s3cr3t"}"#.to_owned(),
    )
    .unwrap();
    r.result = JsonPayload::Raw(raw);
    r.is_error = true;
    r.upstream_status = 502;
    r.latency_us = 123_456;
    r.upstream_latency_us = 120_000;
    r.bytes_in = 345;
    r.bytes_out = 6_789;
    r.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736".into();
    r.approval_id = "apr_7".into();
    r.approver = "bob@acme.example".into();
    r.approved_ms = 1_767_225_599_001;
    r.policy_sha256 = "0f".repeat(32);
    r.pin_sha256 = "e1".repeat(32);
    r.delegation = vec!["agent:planner".to_owned(), "user:olga ü".to_owned()].into();
    r.token_jti = "jti-77".into();
    let id = r.event_id;
    let same = r.clone();
    auditor.record(r).await.expect("recorded");
    handle.shutdown(Duration::from_secs(30)).await;

    // The bytes the firewall encodes are the bytes ClickHouse gives back
    // for them (`SELECT <COLUMNS> … FORMAT RowBinary`): what a hash over a
    // row's encoding needs.
    let spool = tempfile::tempdir().unwrap();
    let (auditor, handle, _reg) = start(&test_config(spool.path(), &dead_url(), &db)).await;
    auditor.record(same).await.expect("recorded");
    handle.shutdown(Duration::from_millis(100)).await;
    drop(auditor);
    let encoded = mcp_firewall::cli::audit::spool_payloads(spool.path()).unwrap();
    assert_eq!(encoded.len(), 1);
    let back = crate::common::http()
        .post(&ch.http_url)
        .body(format!(
            "SELECT {} FROM {db}.audit_events FINAL FORMAT RowBinary",
            audit::COLUMNS.join(", ")
        ))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&back[..], &encoded[0][..], "RowBinary round trip");

    let out = ch.query(&format!(
        "SELECT toString(event_id) AS event_id, toUInt32(time) AS time, time_ms, \
         tenant, subject, agent_role, run_id, session_id, token_id, client_ip, upstream, \
         project, protocol_version, method, tool, risk, decision, reason, stop_reason, \
         jsonrpc_id, arguments, result_summary, is_error, upstream_status, latency_us, \
         upstream_latency_us, bytes_in, bytes_out, instance, trace_id, \
         approval_id, approver, approved_ms, policy_sha256, pin_sha256, delegation, token_jti \
         FROM {db}.audit_events FINAL FORMAT JSONEachRow"
    ));
    let rows: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{out}");
    let got = &rows[0];
    let s = |k: &str| {
        got[k]
            .as_str()
            .unwrap_or_else(|| panic!("{k} in {got}"))
            .to_owned()
    };
    assert_eq!(s("event_id"), id.to_string());
    assert_eq!(num(&got["time"]), 1_767_225_600);
    assert_eq!(num(&got["time_ms"]), 1_767_225_600_123);
    assert_eq!(s("tenant"), "acme");
    assert_eq!(s("subject"), "alice@acme.example");
    assert_eq!(s("agent_role"), "deployer");
    assert_eq!(s("run_id"), "run-42");
    assert_eq!(s("session_id"), "sess-9f");
    assert_eq!(s("token_id"), "jti-77");
    assert_eq!(s("client_ip"), "2001:db8::7");
    assert_eq!(s("upstream"), "k8s");
    assert_eq!(s("project"), "payments");
    assert_eq!(s("protocol_version"), "2025-06-18");
    assert_eq!(s("method"), "tools/call");
    assert_eq!(s("tool"), "delete_namespace");
    assert_eq!(s("risk"), "destructive");
    assert_eq!(s("decision"), "approve");
    assert_eq!(
        s("reason"),
        "rule:prod-destructive needs approval — ok'd by bob"
    );
    assert_eq!(s("stop_reason"), "approval_required");
    assert_eq!(s("jsonrpc_id"), "\"req-1\"");
    let args: Value = serde_json::from_str(&s("arguments")).expect("arguments are JSON");
    assert_eq!(
        args,
        json!({"namespace": "prod-ü",
               "auth": {"Password": REDACTED, "nested": [{"api_key": REDACTED}, {"x": 1}]}})
    );
    let result: Value = serde_json::from_str(&s("result_summary")).expect("result is JSON");
    assert_eq!(result["SessionToken"], REDACTED);
    assert_eq!(result["content"][0]["text"], "deleted");
    assert_eq!(num(&got["is_error"]), 1);
    assert_eq!(num(&got["upstream_status"]), 502);
    assert_eq!(num(&got["latency_us"]), 123_456);
    assert_eq!(num(&got["upstream_latency_us"]), 120_000);
    assert_eq!(num(&got["bytes_in"]), 345);
    assert_eq!(num(&got["bytes_out"]), 6_789);
    assert_eq!(s("instance"), "fw-test-1");
    assert_eq!(s("trace_id"), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(s("approval_id"), "apr_7");
    assert_eq!(s("approver"), "bob@acme.example");
    assert_eq!(num(&got["approved_ms"]), 1_767_225_599_001);
    assert_eq!(s("policy_sha256"), "0f".repeat(32));
    assert_eq!(s("pin_sha256"), "e1".repeat(32));
    assert_eq!(got["delegation"], json!(["agent:planner", "user:olga ü"]));
    assert_eq!(s("token_jti"), "jti-77");

    // Auditors read JSON columns with visitParam* (18.16 has no JSONExtract).
    let visit = ch.query(&format!(
        "SELECT visitParamExtractString(arguments, 'namespace'), \
                visitParamExtractString(arguments, 'Password'), \
                visitParamExtractString(result_summary, 'SessionToken') \
         FROM {db}.audit_events FINAL"
    ));
    assert_eq!(visit.trim(), format!("prod-ü\t{REDACTED}\t{REDACTED}"));
    // The secret is nowhere in the table, nor in the spool directory.
    let leaks = ch.query_u64(&format!(
        "SELECT count() FROM {db}.audit_events WHERE position(arguments, 'hunter2') > 0 \
         OR position(result_summary, 's3cr3t') > 0 OR position(arguments, 'k-1') > 0"
    ));
    assert_eq!(leaks, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_outage_mid_load_loses_nothing_and_counts_nothing_twice() {
    let ch = ClickHouse::start().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let mut cfg = test_config(spool.path(), &ch.http_url, &db);
    cfg.batch.max_rows = 500;
    let (auditor, handle, reg) = start(&cfg).await;

    const TOTAL: u64 = 20_000;
    let mut expected = HashSet::new();
    let mut stopped = false;
    for chunk in 0..(TOTAL / 500) {
        let mut tasks = Vec::new();
        for i in chunk * 500..(chunk + 1) * 500 {
            let a = auditor.clone();
            let r = row(i, &format!("run-{}", i / 100));
            expected.insert(r.event_id.to_string());
            tasks.push(tokio::spawn(async move { a.record(r).await }));
        }
        for t in tasks {
            t.await
                .unwrap()
                .expect("record succeeds while ClickHouse is down too");
        }
        if chunk == 10 {
            // A crash-like stop: in-flight INSERTs lose their acknowledgement.
            ch.kill();
            stopped = true;
        }
        if chunk == 25 {
            ch.resume().await;
            stopped = false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!stopped);
    handle.shutdown(Duration::from_secs(120)).await;

    let dedup = ch.query_u64(&format!(
        "SELECT uniqExact(event_id) FROM {db}.audit_events"
    ));
    let final_count = ch.query_u64(&format!("SELECT count() FROM {db}.audit_events FINAL"));
    let raw = ch.query_u64(&format!("SELECT count() FROM {db}.audit_events"));
    assert_eq!(dedup, TOTAL);
    assert_eq!(final_count, TOTAL);
    assert!(raw >= TOTAL);
    let got: HashSet<String> = ids_in(
        &ch,
        &format!("SELECT toString(event_id) FROM {db}.audit_events"),
    )
    .into_iter()
    .collect();
    assert_eq!(got, expected, "exactly the recorded rows are in ClickHouse");
    // Any surplus in the raw count comes from re-sent batches, and the copies are
    // byte-identical rows (so FINAL and uniqExact collapse them).
    let retries = metric(&reg, "audit_retries_total");
    eprintln!("outage: {TOTAL} rows, raw count {raw}, {retries} retries");
    assert!(retries > 0.0, "the outage must have caused retries");
    if raw > TOTAL {
        let differing = ch.query_u64(&format!(
            "SELECT count() FROM (SELECT event_id, uniqExact(cityHash64(arguments, decision, \
             latency_us, time_ms, run_id)) AS v FROM {db}.audit_events GROUP BY event_id \
             HAVING v > 1)"
        ));
        assert_eq!(differing, 0);
    }
    let stats_calls = ch.query_u64(&format!(
        "SELECT uniqExactMerge(calls) FROM {db}.audit_events_daily_stats"
    ));
    assert_eq!(stats_calls, TOTAL);
    assert_eq!(metric(&reg, "audit_rows_queued_total"), TOTAL as f64);
}

/// Child mode of the crash test: records rows as fast as it can and appends the
/// id of each acknowledged row to a file, until killed (or 60 s pass).
async fn crash_child(spool: &str, url: &str, db: &str, ack_path: &str) {
    let mut cfg = test_config(Path::new(spool), url, db);
    cfg.spool.segment_bytes = 64 << 10;
    // Large, slow batches: at the kill, acknowledged rows are still unshipped.
    cfg.batch.max_rows = 2_000;
    cfg.batch.max_age_ms = 2_000;
    let (auditor, _handle, _reg) = start(&cfg).await;
    let mut acks = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ack_path)
        .unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    let mut i = 0u64;
    while Instant::now() < end {
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let a = auditor.clone();
            let r = row(i, "crash-run");
            i += 1;
            tasks.push(tokio::spawn(async move {
                let id = r.event_id;
                a.record(r).await.map(|()| id)
            }));
        }
        let mut lines = String::new();
        for t in tasks {
            let id = t.await.unwrap().unwrap();
            lines.push_str(&format!("{id}\n"));
        }
        // One write per group: a kill tears at most the last line.
        acks.write_all(lines.as_bytes()).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_killed_mid_load_replays_every_acknowledged_row_once() {
    if let Ok(args) = std::env::var(CHILD_ENV) {
        let parts: Vec<&str> = args.split('|').collect();
        crash_child(parts[0], parts[1], parts[2], parts[3]).await;
        return;
    }
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let ack_path = dir.path().join("acks");
    // The test's own name, also when this file becomes a module of a larger
    // test binary (libtest names omit the crate, module_path! includes it).
    let fn_name = "pipeline_killed_mid_load_replays_every_acknowledged_row_once";
    let test_name = match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{fn_name}"),
        None => fn_name.to_owned(),
    };
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &test_name, "--nocapture", "--test-threads=1"])
        .env(
            CHILD_ENV,
            format!(
                "{}|{}|{db}|{}",
                spool.display(),
                ch.http_url,
                ack_path.display()
            ),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let acked_lines = || {
        std::fs::read_to_string(&ack_path)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    // Kill once the child has both shipped some rows and spooled many more.
    wait_until(
        "child to record and ship rows",
        Duration::from_secs(60),
        || {
            acked_lines() >= 5_000
                && ch
                    .try_query(&format!("SELECT count() FROM {db}.audit_events"))
                    .map(|c| c.trim().parse::<u64>().unwrap_or(0) > 0)
                    .unwrap_or(false)
        },
    )
    .await;
    child.kill().unwrap(); // SIGKILL: no shutdown, no flush, no cursor update.
    child.wait().unwrap();
    let text = std::fs::read_to_string(&ack_path).unwrap();
    let acked: HashSet<String> = text
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(|l| l.trim().to_owned())
        .collect();
    let shipped_before = ch.query_u64(&format!("SELECT count() FROM {db}.audit_events"));
    eprintln!(
        "at SIGKILL: {} rows acknowledged, {shipped_before} in ClickHouse",
        acked.len()
    );

    // Restart on the same spool: the torn tail is cut, the rest replayed.
    let cfg = test_config(&spool, &ch.http_url, &db);
    let (_auditor, handle, _reg) = start(&cfg).await;
    handle.shutdown(Duration::from_secs(60)).await;

    let got: HashSet<String> = ids_in(
        ch,
        &format!("SELECT toString(event_id) FROM {db}.audit_events FINAL"),
    )
    .into_iter()
    .collect();
    let missing: Vec<&String> = acked.difference(&got).take(5).collect();
    assert!(missing.is_empty(), "acknowledged rows missing: {missing:?}");
    let final_count = ch.query_u64(&format!("SELECT count() FROM {db}.audit_events FINAL"));
    let distinct = ch.query_u64(&format!(
        "SELECT uniqExact(event_id) FROM {db}.audit_events"
    ));
    assert_eq!(final_count, distinct, "no row counts twice");
    assert!(distinct >= acked.len() as u64);
    // Nothing is left behind in the spool.
    let leftover: Vec<_> = std::fs::read_dir(&spool)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .collect();
    assert!(
        leftover.len() <= 1,
        "only the (empty) active segment remains"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_spool_fails_closed_for_writes_and_open_for_reads() {
    let spool = tempfile::tempdir().unwrap();
    let mut cfg = test_config(spool.path(), &dead_url(), "unused");
    cfg.spool.max_bytes = 8 << 10;
    let (auditor, handle, reg) = start(&cfg).await;

    let mut accepted = 0;
    let err = loop {
        match auditor.record(row(accepted, "r")).await {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted < 1_000, "the spool never filled up");
    };
    assert!(accepted > 0);
    assert!(
        matches!(err, AuditError::Spool(SpoolError::Full { max, .. }) if max == 8 << 10),
        "{err}"
    );
    assert_eq!(auditor.fail_mode(Risk::Read), FailMode::Open);
    assert_eq!(auditor.fail_mode(Risk::Write), FailMode::Closed);
    assert_eq!(auditor.fail_mode(Risk::Destructive), FailMode::Closed);
    assert!(auditor.admit(Risk::Read).is_ok());
    assert!(matches!(
        auditor.admit(Risk::Destructive),
        Err(AuditError::NotAccepting { .. })
    ));

    let mut write = row(1, "r");
    write.risk = Some(Risk::Write);
    assert!(
        auditor.record_or_fail(write).await.is_err(),
        "writes fail closed"
    );
    let read = row(2, "r");
    assert_eq!(auditor.record_or_fail(read).await.unwrap(), Recorded::Lost);
    assert_eq!(auditor.rows_lost(), 1);
    assert_eq!(metric(&reg, "audit_rows_lost_total"), 1.0);
    assert_eq!(metric(&reg, "audit_rows_queued_total"), accepted as f64);
    assert!(metric(&reg, "audit_spool_bytes") > 4096.0);
    // Nothing can be shipped: the oldest unsent row ages in the gauge.
    let oldest = || metric(&reg, "audit_oldest_unsent_age_seconds");
    let end = Instant::now() + Duration::from_secs(10);
    while oldest() < 0.5 {
        assert!(Instant::now() < end, "oldest-unsent age never grew");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(metric(&reg, "audit_send_errors_total") >= 1.0);
    assert_eq!(metric(&reg, "audit_rows_sent_total"), 0.0);
    handle.shutdown(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwritable_spool_dir_fails_calls_per_fail_mode_and_recovers() {
    let base = tempfile::tempdir().unwrap();
    // At start: a spool path under a regular file cannot be created.
    let file = base.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let bad = test_config(&file.join("spool"), &dead_url(), "unused");
    assert!(audit::start(&bad, &mut Registry::default()).await.is_err());

    // At run time: the directory disappears under the firewall (unmounted, replaced).
    let dir = base.path().join("spool");
    let mut cfg = test_config(&dir, &dead_url(), "unused");
    cfg.spool.segment_bytes = 4096; // rotate after a few rows
    let (auditor, handle, reg) = start(&cfg).await;
    auditor.record(row(0, "r")).await.unwrap();
    let moved = base.path().join("moved");
    std::fs::rename(&dir, &moved).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();
    let mut i = 1;
    let err = loop {
        match auditor.record(row(i, "r")).await {
            Ok(()) => i += 1,
            Err(e) => break e,
        }
        assert!(i < 200, "rotation into the missing directory never failed");
    };
    assert!(
        matches!(err, AuditError::Spool(SpoolError::CreateSegment { .. })),
        "{err}"
    );
    let mut destructive = row(i, "r");
    destructive.risk = Some(Risk::Destructive);
    assert!(auditor.record_or_fail(destructive).await.is_err());
    assert!(auditor.admit(Risk::Destructive).is_err());
    assert_eq!(
        auditor.record_or_fail(row(i + 1, "r")).await.unwrap(),
        Recorded::Lost
    );
    assert_eq!(metric(&reg, "audit_rows_lost_total"), 1.0);

    // The directory comes back: the next row opens a new segment and succeeds.
    std::fs::remove_file(&dir).unwrap();
    std::fs::rename(&moved, &dir).unwrap();
    // Callers that stopped recording on a refused admit get a re-probe window:
    // admission comes back by itself once it has passed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while auditor.admit(Risk::Destructive).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "admission never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    auditor
        .record(row(i + 2, "r"))
        .await
        .expect("spool recovered");
    assert!(auditor.admit(Risk::Destructive).is_ok());
    handle.shutdown(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_record_at_segment_end_is_cut_and_the_rest_shipped() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");

    // First run: ClickHouse unreachable, so rows stay spooled.
    let cfg = test_config(&spool, &dead_url(), &db);
    let (auditor, handle, _reg) = start(&cfg).await;
    let mut ids = HashSet::new();
    for i in 0..300 {
        let r = row(i, "torn");
        ids.insert(r.event_id.to_string());
        auditor.record(r).await.unwrap();
    }
    handle.shutdown(Duration::from_millis(200)).await;
    drop(auditor);

    // A crash in the middle of a write: a record header promising 400 bytes,
    // followed by only 10 of them, at the end of the newest segment.
    let mut segs: Vec<_> = std::fs::read_dir(&spool)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    let last = segs.last().unwrap();
    let before = std::fs::metadata(last).unwrap().len();
    let mut f = std::fs::OpenOptions::new().append(true).open(last).unwrap();
    f.write_all(&400u32.to_le_bytes()).unwrap();
    f.write_all(&0xdead_beefu32.to_le_bytes()).unwrap();
    f.write_all(&[7u8; 10]).unwrap();
    drop(f);

    // Second run with ClickHouse reachable.
    let cfg = test_config(&spool, &ch.http_url, &db);
    let (_auditor, handle, reg) = start(&cfg).await;
    handle.shutdown(Duration::from_secs(30)).await;

    let got: HashSet<String> = ids_in(
        ch,
        &format!("SELECT toString(event_id) FROM {db}.audit_events FINAL"),
    )
    .into_iter()
    .collect();
    assert_eq!(got, ids);
    let rejected: Vec<_> = std::fs::read_dir(spool.join("rejected"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(std::fs::read(&rejected[0]).unwrap().len(), 18);
    assert!(rejected[0]
        .to_string_lossy()
        .ends_with(&format!("{before:012}.corrupt")));
    assert_eq!(metric(&reg, "audit_rows_sent_total"), 300.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_refused_as_bad_data_is_kept_in_rejected_and_shipping_continues() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    // A well-formed spool record whose payload is not a valid row (truncated).
    let payload = [1u8, 2, 3, 4, 5];
    let mut seg = Vec::new();
    seg.extend_from_slice(b"MCPFWAUD");
    // This release's format: nothing completes the row.
    seg.extend_from_slice(&6u32.to_le_bytes());
    seg.extend_from_slice(&[0u8; 4]);
    seg.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    seg.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    seg.extend_from_slice(&payload);
    std::fs::write(spool.join(format!("{:020}.seg", 1)), &seg).unwrap();

    let cfg = test_config(&spool, &ch.http_url, &db);
    let (auditor, handle, reg) = start(&cfg).await;
    let rejected_dir = spool.join("rejected");
    wait_until("bad batch to be rejected", Duration::from_secs(30), || {
        std::fs::read_dir(&rejected_dir).unwrap().count() == 1
    })
    .await;
    let good = row(1, "after-bad");
    let id = good.event_id.to_string();
    auditor.record(good).await.unwrap();
    handle.shutdown(Duration::from_secs(30)).await;

    let files: Vec<_> = std::fs::read_dir(&rejected_dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert!(files[0].to_string_lossy().ends_with(".rowbinary"));
    assert_eq!(std::fs::read(&files[0]).unwrap(), payload);
    assert_eq!(metric(&reg, "audit_rows_rejected_total"), 1.0);
    let got = ch.query(&format!("SELECT toString(event_id) FROM {db}.audit_events"));
    assert_eq!(got.trim(), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daily_stats_do_not_double_count_duplicate_inserts() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let cfg = test_config(spool.path(), &ch.http_url, &db);
    let (auditor, handle, _reg) = start(&cfg).await;
    for i in 0..200 {
        let mut r = row(i, &format!("run-{}", i % 4));
        r.is_error = i % 25 == 0;
        auditor.record(r).await.unwrap();
    }
    handle.shutdown(Duration::from_secs(30)).await;

    let stats = |db: &str| {
        ch.query(&format!(
            "SELECT uniqExactMerge(calls), uniqExactIfMerge(denials), uniqExactIfMerge(errors), \
             uniqExactMerge(runs) FROM {db}.audit_events_daily_stats"
        ))
    };
    let before = stats(&db);
    assert_eq!(before.trim(), "200\t20\t8\t4");
    // Every row sent a second time, as a retry after a lost ack would.
    ch.query(&format!(
        "INSERT INTO {db}.audit_events SELECT * FROM {db}.audit_events"
    ));
    assert_eq!(
        ch.query_u64(&format!("SELECT count() FROM {db}.audit_events")),
        400
    );
    assert_eq!(stats(&db), before);
    assert_eq!(
        ch.query_u64(&format!("SELECT count() FROM {db}.audit_events FINAL")),
        200
    );
    let per_tool = ch.query(&format!(
        "SELECT tool, uniqExactMerge(calls) FROM {db}.audit_events_daily_stats \
         GROUP BY tool ORDER BY tool"
    ));
    assert_eq!(per_tool.lines().count(), 5);
    assert!(per_tool.lines().all(|l| l.ends_with("\t40")), "{per_tool}");
    let p95 = ch.query(&format!(
        "SELECT quantilesMerge(0.5, 0.95, 0.99)(latency_quantiles) FROM {db}.audit_events_daily_stats"
    ));
    assert!(p95.starts_with('['), "{p95}");
}

/// Copies the regular files of `from` into `to` (a spool snapshot).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spool_replayed_after_a_crash_is_stored_twice_but_counts_once() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let snapshot = dir.path().join("snapshot");

    // Spool 500 rows while ClickHouse is unreachable.
    let (auditor, handle, _reg) = start(&test_config(&spool, &dead_url(), &db)).await;
    for i in 0..500 {
        auditor
            .record(row(i, &format!("run-{}", i % 3)))
            .await
            .unwrap();
    }
    handle.shutdown(Duration::from_millis(200)).await;
    drop(auditor);
    copy_dir(&spool, &snapshot);

    // Ship them; then put the spool back as it was before, as if the firewall had
    // crashed after ClickHouse stored the rows but before the spool learnt it.
    let (_a, handle, _reg) = start(&test_config(&spool, &ch.http_url, &db)).await;
    handle.shutdown(Duration::from_secs(30)).await;
    drop(_a);
    assert_eq!(
        ch.query_u64(&format!("SELECT count() FROM {db}.audit_events")),
        500
    );
    std::fs::remove_dir_all(&spool).unwrap();
    copy_dir(&snapshot, &spool);
    let (_a, handle, _reg) = start(&test_config(&spool, &ch.http_url, &db)).await;
    handle.shutdown(Duration::from_secs(30)).await;

    // Stored twice, counted once by every documented query form.
    assert_eq!(
        ch.query_u64(&format!("SELECT count() FROM {db}.audit_events")),
        1000
    );
    assert_eq!(
        ch.query_u64(&format!("SELECT count() FROM {db}.audit_events FINAL")),
        500
    );
    assert_eq!(
        ch.query_u64(&format!(
            "SELECT uniqExact(event_id) FROM {db}.audit_events"
        )),
        500
    );
    assert_eq!(
        ch.query_u64(&format!(
            "SELECT count() FROM (SELECT event_id, any(decision) FROM {db}.audit_events GROUP BY event_id)"
        )),
        500
    );
    assert_eq!(
        ch.query(&format!(
            "SELECT uniqExactMerge(calls), uniqExactIfMerge(denials), uniqExactMerge(runs) \
             FROM {db}.audit_events_daily_stats"
        ))
        .trim(),
        "500\t50\t3"
    );
    // Background merges eventually drop the copies for good.
    ch.query(&format!("OPTIMIZE TABLE {db}.audit_events FINAL"));
    assert_eq!(
        ch.query_u64(&format!("SELECT count() FROM {db}.audit_events")),
        500
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_expired_day_partitions_only() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let cfg = test_config(spool.path(), &ch.http_url, &db);
    let (auditor, handle, _reg) = start(&cfg).await;
    let now_ms = AuditRow::new().time_ms;
    for (i, age_days) in [(0u64, 0u64), (1, 1), (2, 40), (3, 41)] {
        let mut r = row(i, "ret");
        r.time_ms = now_ms - age_days * 86_400_000;
        auditor.record(r).await.unwrap();
    }
    handle.shutdown(Duration::from_secs(30)).await;
    drop(auditor);
    assert_eq!(
        ch.query_u64(&format!("SELECT count() FROM {db}.audit_events")),
        4
    );

    let mut cfg = test_config(spool.path(), &ch.http_url, &db);
    cfg.retention_days = Some(30);
    let (_a, handle, _reg) = start(&cfg).await;
    // One retention pass drops the events' partitions, then the daily
    // aggregate's: wait for both, not just the first.
    let stats_days = || {
        ch.query_u64(&format!(
            "SELECT uniqExact(day) FROM {db}.audit_events_daily_stats"
        ))
    };
    wait_until(
        "old partitions to be dropped",
        Duration::from_secs(30),
        || {
            ch.query_u64(&format!("SELECT count() FROM {db}.audit_events")) == 2
                && stats_days() <= 2
        },
    )
    .await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        ch.query_u64(&format!("SELECT count() FROM {db}.audit_events")),
        2,
        "only the expired day partitions were dropped"
    );
    assert!(stats_days() <= 2, "old daily stats dropped too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_is_created_at_start_before_any_row() {
    let ch = ClickHouse::shared().await;
    let db = format!("t_{:016x}", rand::random::<u64>());
    let spool = tempfile::tempdir().unwrap();
    let (_a, handle, _reg) = start(&test_config(spool.path(), &ch.http_url, &db)).await;
    wait_until("schema creation", Duration::from_secs(30), || {
        ch.try_query(&format!("SHOW TABLES FROM {db}"))
            .is_ok_and(|t| t.lines().count() == 5)
    })
    .await;
    handle.shutdown(Duration::from_secs(5)).await;
    drop(_a); // the spool stays locked while an Auditor lives
              // A second start finds it in place (idempotent DDL) and still works.
    let (a, handle, _reg) = start(&test_config(spool.path(), &ch.http_url, &db)).await;
    a.record(row(1, "r")).await.unwrap();
    handle.shutdown(Duration::from_secs(30)).await;
    assert_eq!(
        ch.query_u64(&format!("SELECT count() FROM {db}.audit_events")),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_user_inserts_into_a_schema_the_dba_created() {
    let ch = ClickHouse::shared().await;
    let db = format!("t_{:016x}", rand::random::<u64>());
    for stmt in audit::schema_statements(&db, "audit_events") {
        ch.query(&stmt);
    }
    let dir = tempfile::tempdir().unwrap();
    let pw_file = dir.path().join("pw");
    std::fs::write(&pw_file, format!("{INSERTER_PASSWORD}\n")).unwrap();
    let mut cfg = test_config(&dir.path().join("spool"), &ch.http_url, &db);
    cfg.clickhouse.user = "inserter".into();
    cfg.clickhouse.password_file = Some(pw_file);
    // Left on: the DDL is refused for this user, which must not block inserts.
    cfg.clickhouse.create_schema = true;
    let (auditor, handle, reg) = start(&cfg).await;
    auditor.record(row(1, "lp")).await.unwrap();
    wait_until("the refused DDL", Duration::from_secs(10), || {
        metric(&reg, "audit_send_errors_total") >= 1.0
    })
    .await;
    handle.shutdown(Duration::from_secs(30)).await;
    let count = || ch.query_u64(&format!("SELECT count() FROM {db}.audit_events"));
    assert_eq!(count(), 1);
    assert_eq!(metric(&reg, "audit_rows_sent_total"), 1.0);

    // A wrong password is retried, never dropped: the row waits in the spool.
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong-pw");
    std::fs::write(&wrong, "wrong").unwrap();
    let spool = dir.path().join("spool");
    let mut cfg = test_config(&spool, &ch.http_url, &db);
    cfg.clickhouse.user = "inserter".into();
    cfg.clickhouse.password_file = Some(wrong);
    let (auditor, handle, reg) = start(&cfg).await;
    auditor.record(row(2, "lp")).await.unwrap();
    wait_until("failed attempts", Duration::from_secs(10), || {
        metric(&reg, "audit_retries_total") >= 2.0
    })
    .await;
    handle.shutdown(Duration::from_millis(100)).await;
    assert_eq!(count(), 1);
    assert_eq!(metric(&reg, "audit_rows_rejected_total"), 0.0);
    let segments_bytes: u64 = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(segments_bytes > 16, "the row is still spooled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_auditor_records_nothing_and_never_fails() {
    let cfg = AuditConfig {
        enabled: false,
        ..AuditConfig::default()
    };
    let (auditor, handle) = audit::start(&cfg, &mut Registry::default()).await.unwrap();
    assert!(!auditor.is_enabled());
    let mut r = row(1, "r");
    r.risk = Some(Risk::Destructive);
    assert_eq!(auditor.record_or_fail(r).await.unwrap(), Recorded::Disabled);
    assert!(auditor.admit(Risk::Destructive).is_ok());
    handle.shutdown(Duration::from_millis(10)).await;
}

#[tokio::test]
async fn schema_file_creates_the_same_tables_by_hand() {
    // The DDL shipped to DBAs runs as is (after placeholder substitution) and is
    // idempotent.
    let ch = ClickHouse::shared().await;
    let db = format!("t_{:016x}", rand::random::<u64>());
    for _ in 0..2 {
        for stmt in audit::schema_statements(&db, "audit_events") {
            ch.query(&stmt);
        }
    }
    let tables = ch.query(&format!("SHOW TABLES FROM {db}"));
    assert_eq!(
        tables.lines().collect::<Vec<_>>(),
        [
            "audit_events",
            "audit_events_chain",
            "audit_events_checkpoints",
            "audit_events_daily_stats",
            "audit_events_daily_stats_mv"
        ]
    );
    let cols = ch.query(&format!(
        "SELECT name FROM system.columns WHERE database = '{db}' AND table = 'audit_events'"
    ));
    assert_eq!(cols.lines().collect::<Vec<_>>(), audit::COLUMNS);
}

/// The shipper runs on a thread of its own: rows reach ClickHouse while the
/// runtime that recorded them cannot run anything (its only thread is
/// blocked here on purpose, as a saturated worker pool would be).
#[tokio::test(flavor = "current_thread")]
async fn rows_ship_while_the_recording_runtime_is_blocked() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let cfg = test_config(spool.path(), &ch.http_url, &db);
    let (auditor, handle, reg) = start(&cfg).await;
    for i in 0..50 {
        auditor.record(row(i, "run-blocked")).await.unwrap();
    }
    // Blocking sleeps from here on: no task of this runtime is polled.
    block_until("rows acknowledged", Duration::from_secs(30), || {
        metric(&reg, "audit_rows_sent_total") >= 50.0
    });
    assert_eq!(
        ch.query_u64(&format!(
            "SELECT uniqExact(event_id) FROM {db}.audit_events WHERE run_id = 'run-blocked'"
        )),
        50
    );
    handle.shutdown(Duration::from_secs(5)).await;
}

/// Earlier releases: their spool format, the last column of their table,
/// and how many bytes of this release's row (with empty later columns)
/// their rows lack.
const EARLIER_RELEASES: [(u32, &str, usize); 5] = [
    // Before content screening.
    (1, "row_version", 4 + 14 + 2 + 2),
    // Before virtual servers.
    (2, "run_labels", 1 + 14 + 2 + 2),
    // Before the approval, policy, pin and delegation columns.
    (3, "virtual_server", 14 + 2 + 2),
    // Before the shadow policy and the principal's claims.
    (4, "token_jti", 2 + 2),
    // Before delegated upstream credentials.
    (5, "principal_claims", 2),
];

/// A segment as an earlier release wrote it: format `version`, rows
/// without their last `cut` bytes (the empty columns added since).
fn as_old_segment(segment: &[u8], version: u32, cut: usize) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&segment[..8]);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&segment[12..16]);
    let mut at = 16;
    while at + 8 <= segment.len() {
        let len = u32::from_le_bytes(segment[at..at + 4].try_into().unwrap()) as usize;
        let Some(payload) = segment.get(at + 8..at + 8 + len) else {
            break;
        };
        // The columns added since are empty: '', [] and 0 are zero bytes.
        assert!(payload[len - cut..].iter().all(|b| *b == 0));
        let old = &payload[..len - cut];
        out.extend_from_slice(&(old.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(old).to_le_bytes());
        out.extend_from_slice(old);
        at += 8 + len;
    }
    out
}

/// Name and type of each column of `db.table`, in order.
fn columns_of(ch: &ClickHouse, db: &str, table: &str) -> Vec<String> {
    ch.query(&format!(
        "SELECT name, type FROM system.columns WHERE database = '{db}' AND table = '{table}' FORMAT TSV"
    ))
    .lines()
    .map(str::to_owned)
    .collect()
}

/// An upgrade from each earlier release: the spool it left (its segment
/// format) ships into the table it created, which the new release migrates
/// at start (`ALTER TABLE … ADD COLUMN`); the old rows arrive with the
/// columns added since empty, the new ones with their values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_ships_the_old_spool_into_the_old_table() {
    let ch = ClickHouse::shared().await;
    // The table as this release creates it, to compare with.
    let fresh = ch.create_database();
    for stmt in audit::schema_statements(&fresh, "audit_events") {
        ch.query(&stmt);
    }
    let want_columns = columns_of(ch, &fresh, "audit_events");
    assert_eq!(want_columns.len(), audit::COLUMNS.len());
    for (version, last, cut) in EARLIER_RELEASES {
        let db = ch.create_database();
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool");
        // Rows spooled while ClickHouse is away...
        let (auditor, handle, _reg) = start(&test_config(&spool, &dead_url(), &db)).await;
        for i in 0..20 {
            auditor.record(row(i, "run-upgrade")).await.unwrap();
        }
        handle.shutdown(Duration::from_millis(200)).await;
        drop(auditor);
        // ... by the release before: its segment format, its table.
        for entry in std::fs::read_dir(&spool).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "seg") {
                let old = as_old_segment(&std::fs::read(&path).unwrap(), version, cut);
                std::fs::write(&path, old).unwrap();
            }
        }
        let create = crate::common::clickhouse::audit_table_ending_at(&db, "audit_events", last);
        assert!(!create.contains("credential_id"), "{create}");
        ch.query(&create);
        let before = columns_of(ch, &db, "audit_events");
        assert!(
            before.last().unwrap().starts_with(&format!("{last}\t")),
            "{before:?}"
        );
        // The new release: the table gets the columns, the old rows arrive
        // with empty ones.
        let (auditor, handle, _reg) = start(&test_config(&spool, &ch.http_url, &db)).await;
        let mut new = row(99, "run-upgrade");
        new.screen_kinds = vec!["card_number"];
        new.screen_action = "flag";
        new.virtual_server = "ops".into();
        new.approval_id = "apr_1".into();
        new.approver = "oncall".into();
        new.approved_ms = 1_767_225_599_001;
        new.policy_sha256 = "0f".repeat(32);
        new.pin_sha256 = "e1".repeat(32);
        new.delegation = vec!["agent:planner".to_owned()].into();
        new.token_jti = "jti-99".into();
        new.shadow_decision = "hidden";
        new.principal_claims = "{}".into();
        new.upstream_auth = "exchange";
        new.credential_id = "c0ffee".into();
        auditor.record(new).await.unwrap();
        handle.shutdown(Duration::from_secs(30)).await;
        drop(auditor);
        assert_eq!(
            columns_of(ch, &db, "audit_events"),
            want_columns,
            "format {version}: migrated to this release's columns and types"
        );
        let got = ch.query(&format!(
            "SELECT count(), \
             countIf(screen_action = '' AND empty(screen_kinds) AND virtual_server = '' AND approval_id = '' \
                     AND approver = '' AND approved_ms = 0 AND policy_sha256 = '' AND pin_sha256 = '' \
                     AND empty(delegation) AND token_jti = '' AND shadow_decision = '' AND principal_claims = '' \
                     AND upstream_auth = '' AND credential_id = ''), \
             countIf(screen_action = 'flag' AND has(screen_kinds, 'card_number') AND virtual_server = 'ops' \
                     AND approval_id = 'apr_1' AND approver = 'oncall' AND approved_ms = 1767225599001 \
                     AND policy_sha256 = '{policy}' AND pin_sha256 = '{pin}' \
                     AND delegation = ['agent:planner'] AND token_jti = 'jti-99' \
                     AND shadow_decision = 'hidden' AND principal_claims = '{{}}' \
                     AND upstream_auth = 'exchange' AND credential_id = 'c0ffee') \
             FROM {db}.audit_events FINAL WHERE run_id = 'run-upgrade'",
            policy = "0f".repeat(32),
            pin = "e1".repeat(32),
        ));
        assert_eq!(
            got.trim(),
            "21\t20\t1",
            "format {version}: {}",
            ch.log_tail()
        );
    }
}
