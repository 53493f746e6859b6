//! The audit spool on a failing disk, readiness that tells the truth, and a
//! drain that ends what it must: a full disk (injected `ENOSPC`) refuses
//! fail-closed calls, recovers, frees shipped segments and does not stop a
//! restart; a stalled disk is bounded by the write deadline; `/readyz` says
//! why it is not ready; SIGTERM closes idle connections at once and ends
//! open streams with a final event and their completion rows.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::clickhouse::ClickHouse;
use crate::common::{self, eventually, raw, Firewall};
use mcp_firewall::audit::fault::{self, Plan};

const FULL: Plan = Plan {
    no_space: true,
    stall: None,
};

/// A recording upstream listing one read and one write tool of the shipped
/// `incidents` risk table; `post_incident_note` answers slowly when asked to.
async fn upstream() -> raw::RawUpstream {
    raw::upstream(|seen| async move {
        let v: Value = serde_json::from_slice(&seen.body).unwrap_or_default();
        match v["method"].as_str() {
            Some("tools/list") => raw::result_for(
                &seen,
                json!({"tools": [
                    {"name": "get_incident", "inputSchema": {"type": "object"}},
                    {"name": "post_incident_note", "inputSchema": {"type": "object"}},
                ]}),
            ),
            Some("tools/call") if v["params"]["arguments"]["slow"] == true => raw::sse(
                vec![
                    bytes::Bytes::from_static(b": working\n\n"),
                    bytes::Bytes::from(format!(
                        "data: {}\n\n",
                        json!({"jsonrpc":"2.0","id":v["id"],"result":{"content":[]}})
                    )),
                ],
                Duration::from_secs(30),
                false,
            ),
            _ => raw::mcp_answer(&seen),
        }
    })
    .await
}

/// A role that may write without approval, so the audit is the only gate.
const SCRIBE: &str = "[[agents]]\nname = \"scribe\"\nprojects = [\"sre\"]\nrisks = [\"read\", \"write\"]\nallow = [{ upstream = \"incidents\" }]\ngates = { write = \"allow\" }\nmax_steps = 1000\ncalls_per_s = 1000\n";

fn config(
    up: &raw::RawUpstream,
    spool: &Path,
    clickhouse: &str,
    db: &str,
) -> (common::TestConfig, tempfile::TempDir) {
    let policies = common::policy_dir(&[("90-scribe.toml", SCRIBE)]);
    let cfg = common::TestConfig::new()
        .policies(policies.path())
        .upstream("incidents", &up.url())
        .set("limits.per_run_tool_per_s", 0)
        .set("limits.per_ip_per_s", 0)
        .audit("fw", clickhouse, db, spool)
        .unset("audit.instance")
        .set("audit.spool.write_timeout_ms", 300);
    (cfg, policies)
}

fn call(tool: &str, id: u64, args: Value) -> String {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":args}})
        .to_string()
}

async fn readyz(fw: &Firewall) -> (u16, String) {
    let r = common::http()
        .get(format!("{}/readyz", fw.admin))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn metric(fw: &Firewall, name: &str) -> f64 {
    let text = fw.metrics().await;
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_fail_closed_calls_recovers_frees_the_spool_and_restarts() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let up = upstream().await;
    let (cfg, _policies) = config(&up, &spool, &ch.http_url, &db);
    let text = cfg.text();
    let fw = common::firewall(&text).await;
    let token = common::sign(&common::claims("scribe", &["sre"]));
    let url = fw.mcp_url("incidents");
    common::post(
        &url,
        &token,
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    )
    .await;
    assert_eq!(readyz(&fw).await.0, 200);

    fault::inject(&spool, FULL);
    // A read is served (fail-open, counted); a write is refused and never sent.
    let r = common::post(&url, &token, &[], &call("get_incident", 2, json!({}))).await;
    assert!(r.json()["result"].is_object(), "{}", r.text);
    let r = common::post(
        &url,
        &token,
        &[],
        &call("post_incident_note", 3, json!({"note": "x"})),
    )
    .await;
    assert_eq!(r.code(), -31005, "{}", r.text);
    assert_eq!(
        up.count("POST", "tools/call"),
        1,
        "only the read reached the upstream"
    );
    let (status, body) = readyz(&fw).await;
    assert_eq!(status, 503);
    assert!(body.contains("audit_spool_refusing"), "{body}");
    assert!(metric(&fw, "mcp_firewall_audit_rows_lost").await >= 1.0);
    assert!(
        metric(
            &fw,
            "mcp_firewall_not_ready{reason=\"audit_spool_refusing\"}"
        )
        .await
            >= 1.0
    );

    // Space is back: writes run again, every row ships, segments are freed.
    fault::clear(&spool);
    eventually("ready again", Duration::from_secs(5), || async {
        readyz(&fw).await.0 == 200
    })
    .await;
    let r = common::post(
        &url,
        &token,
        &[],
        &call("post_incident_note", 4, json!({"note": "y"})),
    )
    .await;
    assert!(r.json()["result"].is_object(), "{}", r.text);
    // (The calls made while the disk was full could not be recorded: the
    // read was served and counted as lost, the write refused.)
    eventually("the rows in ClickHouse", Duration::from_secs(20), || async {
        ch.try_query(&format!("SELECT count() FROM {db}.audit_events FINAL WHERE jsonrpc_id = '4' AND stop_reason = 'done'"))
            .is_ok_and(|t| t.trim() == "1")
    })
    .await;
    eventually(
        "shipped segments deleted",
        Duration::from_secs(10),
        || async {
            std::fs::read_dir(&spool)
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .path()
                        .extension()
                        .is_some_and(|x| x == "seg")
                })
                .count()
                <= 2
        },
    )
    .await;
    fw.stop().await;

    // A restart on a full disk starts, serves reads, says it is not ready.
    fault::inject(&spool, FULL);
    let fw = common::firewall(&text).await;
    let url = fw.mcp_url("incidents");
    assert_eq!(readyz(&fw).await.0, 503);
    let r = common::post(&url, &token, &[], &call("get_incident", 5, json!({}))).await;
    assert!(r.json()["result"].is_object(), "{}", r.text);
    fault::clear(&spool);
    eventually(
        "ready after the restart",
        Duration::from_secs(5),
        || async { readyz(&fw).await.0 == 200 },
    )
    .await;
    fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_disk_serves_reads_unaudited_and_refuses_writes_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let up = upstream().await;
    let (cfg, _policies) = config(&up, &spool, "http://127.0.0.1:9", "x");
    let text = cfg.text();
    let fw = common::firewall(&text).await;
    let token = common::sign(&common::claims("scribe", &["sre"]));
    let url = fw.mcp_url("incidents");
    common::post(
        &url,
        &token,
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    )
    .await;

    fault::inject(
        &spool,
        Plan {
            no_space: false,
            stall: Some(Duration::from_secs(3)),
        },
    );
    // The first call meets the frozen disk and waits for it (its writer is
    // stuck in the kernel); everyone after it gets the deadline.
    let first = {
        let (url, token) = (url.clone(), token.clone());
        tokio::spawn(async move {
            common::post(&url, &token, &[], &call("get_incident", 2, json!({}))).await
        })
    };
    // Its write runs past the 300 ms deadline: the spool says so.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !readyz(&fw).await.1.contains("audit_spool_refusing") {
        assert!(
            Instant::now() < deadline,
            "the stalled write was never noticed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let r = common::post(&url, &token, &[], &call("get_incident", 3, json!({}))).await;
    assert!(r.json()["result"].is_object(), "{}", r.text);
    let r = common::post(
        &url,
        &token,
        &[],
        &call("post_incident_note", 4, json!({"note": "x"})),
    )
    .await;
    assert_eq!(r.code(), -31005, "{}", r.text);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        !up.seen()
            .iter()
            .any(|s| s.body.windows(18).any(|w| w == b"post_incident_note")
                && s.rpc_method() == "tools/call"),
        "the refused write never reached the upstream"
    );
    let (status, body) = readyz(&fw).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("audit_spool_refusing"), "{body}");
    assert!(metric(&fw, "mcp_firewall_audit_spool_stalls").await >= 1.0);
    fault::clear(&spool);
    let r = first.await.unwrap();
    assert!(r.json()["result"].is_object(), "{}", r.text);
    fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_growing_backlog_and_clears_when_clickhouse_is_back() {
    let ch = ClickHouse::start().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let up = upstream().await;
    let (cfg, _policies) = config(&up, &spool, &ch.http_url, &db);
    let text = cfg.set("audit.max_backlog_age_s", 1).text();
    let fw = common::firewall(&text).await;
    let token = common::sign(&common::claims("scribe", &["sre"]));
    let url = fw.mcp_url("incidents");
    common::post(
        &url,
        &token,
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    )
    .await;
    eventually("shipping works", Duration::from_secs(20), || async {
        ch.try_query(&format!("SELECT count() FROM {db}.audit_events"))
            .is_ok_and(|t| t.trim() != "0")
    })
    .await;
    ch.stop().await;
    let r = common::post(&url, &token, &[], &call("get_incident", 2, json!({}))).await;
    assert!(r.json()["result"].is_object());
    eventually("the backlog named", Duration::from_secs(10), || async {
        let (status, body) = readyz(&fw).await;
        status == 503 && body.contains("audit_backlog")
    })
    .await;
    ch.resume().await;
    eventually(
        "ready once ClickHouse is back",
        Duration::from_secs(30),
        || async { readyz(&fw).await.0 == 200 },
    )
    .await;
    fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_connections_at_once_and_ends_streams_with_a_final_event() {
    use tokio::io::AsyncReadExt;
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let up = upstream().await;
    let (cfg, _policies) = config(&up, &spool, &ch.http_url, &db);
    let text = cfg.set("server.drain_timeout_ms", 3000).text();
    let fw = common::firewall(&text).await;
    let token = common::sign(&common::claims("scribe", &["sre"]));
    let url = fw.mcp_url("incidents");
    common::post(
        &url,
        &token,
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    )
    .await;
    // A connection that never sends a byte (a load balancer's TCP check).
    let mut idle = tokio::net::TcpStream::connect(fw.running.mcp_addr)
        .await
        .unwrap();
    // A stream the upstream keeps open for 30 s.
    let stream = common::http()
        .post(&url)
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(call("get_incident", 77, json!({"slow": true})))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let reading = tokio::spawn(async move { stream.text().await.unwrap_or_default() });
    let admin = fw.admin.clone();
    let started = Instant::now();
    let stopping = tokio::spawn(fw.stop());
    // The idle connection is closed at once.
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_millis(800), idle.read(&mut buf))
        .await
        .expect("the idle connection is closed at once")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // Not ready from the moment the drain starts, and still answering.
    let r = common::http()
        .get(format!("{admin}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.text().await.unwrap().contains("draining"));
    // The open stream ends before the deadline with a final error event.
    let text = reading.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(3000),
        "{:?}",
        started.elapsed()
    );
    let last: Value = text
        .lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data: "))
        .find_map(|d| serde_json::from_str(d).ok())
        .unwrap_or_else(|| panic!("a final event: {text}"));
    assert_eq!(last["id"], 77);
    assert_eq!(last["error"]["code"], -31004, "{last}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{last}"
    );
    stopping.await.unwrap();
    // Its completion row says how it ended.
    eventually("the completion row", Duration::from_secs(20), || async {
        ch.try_query(&format!(
            "SELECT stop_reason FROM {db}.audit_events FINAL WHERE jsonrpc_id = '77'"
        ))
        .is_ok_and(|t| t.trim() == "upstream_incomplete")
    })
    .await;
}
