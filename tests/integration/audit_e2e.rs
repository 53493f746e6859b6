//! The audit trail of real calls through the firewall, read back from a real
//! ClickHouse: every field of an allowed call, a denied call and an upstream
//! error; redaction; and the firewall killed with SIGKILL in the middle of a
//! load and restarted on the same spool (every answered call present exactly
//! once).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::clickhouse::ClickHouse;
use crate::common::{self, mcp::*, TestConfig};
use crate::through_firewall::{call_err, connect_via};

/// Config for a firewall in front of `url` (as upstream `incidents`) that
/// audits into `db`.
fn config(spool: &Path, ch: &ClickHouse, db: &str, url: &str) -> TestConfig {
    TestConfig::new()
        .audit("fw-e2e", &ch.http_url, db, spool)
        .upstream("incidents", url)
}

async fn wait_rows(ch: &ClickHouse, sql: &str, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // The firewall creates the schema in the background: until it
        // exists the count is zero.
        let n = ch
            .try_query(sql)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        if n >= want || Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn row(ch: &ClickHouse, db: &str, filter: &str) -> Value {
    let text = ch.query(&format!(
        "SELECT * FROM {db}.audit_events FINAL WHERE {filter} ORDER BY time_ms DESC LIMIT 1 FORMAT JSONEachRow"
    ));
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("row for {filter}: {e}: {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_denied_and_failed_calls_are_audited_with_every_field() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let upstream = upstream(options(true)).await;
    let fw =
        common::firewall(&config(&dir.path().join("spool"), ch, &db, &upstream.url()).text()).await;
    let token = common::token();
    let s = crate::through_firewall::Setup { upstream, fw };
    let client = connect_via(&s, Era::V2026_07_28, &token).await;
    client.list_all_tools().await.unwrap();
    // Allowed read, with a secret-looking argument key to redact.
    let r = call(
        &client,
        "export_metrics_csv",
        json!({"service": "checkout", "points": 3}),
    )
    .await;
    assert!(r.is_error != Some(true));
    // Denied by condition.
    call_err(
        &client,
        "get_deployment",
        json!({"deployment_id": "prod-1"}),
    )
    .await;
    // Gated.
    call_err(
        &client,
        "restart_service",
        json!({"service": "checkout", "namespace": "prod", "reason": "r"}),
    )
    .await;
    // Hidden / invented.
    call_err(&client, "launch_missiles", json!({})).await;
    client.cancel().await.ok();

    let calls =
        format!("SELECT uniqExact(event_id) FROM {db}.audit_events WHERE method = 'tools/call'");
    assert_eq!(wait_rows(ch, &calls, 4).await, 4, "{}", ch.log_tail());

    let allowed = row(ch, &db, "tool = 'export_metrics_csv'");
    assert_eq!(allowed["tenant"], "acme");
    assert_eq!(allowed["subject"], "alice");
    assert_eq!(allowed["agent_role"], "sre-lead");
    assert!(allowed["run_id"].as_str().unwrap().starts_with("run-"));
    assert!(!allowed["token_id"].as_str().unwrap().is_empty());
    assert_eq!(allowed["client_ip"].as_str().unwrap(), "127.0.0.1");
    assert_eq!(allowed["upstream"], "incidents");
    assert_eq!(allowed["project"], "sre");
    assert_eq!(allowed["protocol_version"], "2026-07-28");
    assert_eq!(allowed["method"], "tools/call");
    assert_eq!(allowed["risk"], "read");
    assert_eq!(allowed["decision"], "allow");
    assert_eq!(allowed["stop_reason"], "done");
    assert_eq!(allowed["is_error"], 0);
    assert_eq!(allowed["upstream_status"], 200);
    assert_eq!(allowed["instance"], "fw-e2e");
    assert!(num(&allowed["latency_us"]) >= num(&allowed["upstream_latency_us"]));
    assert!(num(&allowed["upstream_latency_us"]) > 0);
    assert!(num(&allowed["bytes_in"]) > 0);
    assert!(num(&allowed["bytes_out"]) > 0);
    let args: Value = serde_json::from_str(allowed["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["service"], "checkout");
    assert!(
        allowed["result_summary"]
            .as_str()
            .unwrap()
            .contains("content"),
        "{allowed}"
    );
    assert!(!allowed["jsonrpc_id"].as_str().unwrap().is_empty());

    let denied = row(ch, &db, "tool = 'get_deployment'");
    assert_eq!(denied["decision"], "deny");
    assert_eq!(denied["stop_reason"], "denied");
    assert!(
        denied["reason"].as_str().unwrap().contains("dep-<number>"),
        "{denied}"
    );
    assert_eq!(denied["upstream_status"], 0, "never forwarded");
    let gated = row(ch, &db, "tool = 'restart_service'");
    assert_eq!(gated["decision"], "approve");
    assert_eq!(gated["stop_reason"], "approval_required");
    assert_eq!(gated["risk"], "destructive");
    let hidden = row(ch, &db, "tool = 'launch_missiles'");
    assert_eq!(hidden["decision"], "hidden");

    // The auditors' queries in the docs (`docs/auditors.md`; any `sql`
    // block of the README or `docs/`) run as written and find these rows.
    let run_id = allowed["run_id"].as_str().unwrap().to_owned();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("README.md")];
    docs.extend(
        std::fs::read_dir(root.join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    let text: String = docs
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let queries: Vec<String> = text
        .split("```sql")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .flat_map(|block| {
            block
                .split(';')
                .map(str::trim)
                .filter(|q| !q.is_empty() && q.lines().any(|l| !l.trim_start().starts_with("--")))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        queries.len() >= 5,
        "the docs have the auditors' queries: {queries:?}"
    );
    let daily = wait_rows(
        ch,
        &format!("SELECT count() FROM {db}.audit_events_daily_stats"),
        1,
    )
    .await;
    assert!(daily >= 1);
    for q in &queries {
        let q = q
            .replace("mcp_firewall.", &format!("{db}."))
            .replace("run-42", &run_id)
            .replace("'RUN_ID'", &format!("'{run_id}'"))
            .replace("{from_ms}", "0")
            .replace("{since_ms}", "0")
            .replace("{days}", "7")
            .replace("{limit}", "1000");
        let out = ch
            .try_query(&q)
            .unwrap_or_else(|e| panic!("docs query fails: {e}\n{q}"));
        // No tool definition drifted in this test, no answer held
        // anything screening finds (the flagged query runs in
        // `screening::a_secret_is_redacted_the_rest_arrives_and_both_are_on_record`),
        // nobody approved a call (who did runs in
        // `approvals_e2e::an_approved_pinned_call_stands_on_its_own_in_clickhouse_and_the_cli`),
        // and no shadow policy ran (its questions run in
        // `policy_assurance::a_shadow_set_that_denies_a_tool_changes_no_answer_and_the_difference_is_counted_and_on_record`).
        // The chain questions of *Proving the audit trail* name a fixed
        // day (`audit_chain` verifies the chain itself): they must run.
        if !q.contains("method = 'pins'")
            && !q.contains("screen_action != ''")
            && !q.contains("approval_id != ''")
            && !q.contains("shadow_decision != ''")
            && !q.contains("2026-12-04")
            && !q.contains("fw-eu-1")
        {
            assert!(!out.trim().is_empty(), "docs query found nothing:\n{q}");
        }
    }

    s.fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_are_audited() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/mcp", l.local_addr().unwrap());
    drop(l);
    let fw = common::firewall(&config(&dir.path().join("spool"), ch, &db, &dead).text()).await;
    let resp = common::post_json(
        &fw.mcp_url("incidents"),
        r#"{"jsonrpc":"2.0","id":5,"method":"ping","params":{"password":"hunter2"}}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    // Its intent and its completion: one event.
    let n = wait_rows(ch, &format!("SELECT count() FROM {db}.audit_events"), 2).await;
    assert_eq!(n, 2);
    let events = ch.query_u64(&format!(
        "SELECT uniqExact(event_id) FROM {db}.audit_events"
    ));
    assert_eq!(events, 1);
    let r = row(ch, &db, "method = 'ping'");
    assert_eq!(r["row_version"], 1);
    assert_eq!(r["stop_reason"], "upstream_error");
    assert_eq!(r["is_error"], 1);
    assert!(
        r["reason"].as_str().unwrap().contains("cannot connect"),
        "{r}"
    );
    assert_eq!(r["jsonrpc_id"], "5");
    fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firewall_killed_mid_load_loses_no_answered_call() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let upstream = crate::common::raw::upstream(|seen| async move {
        crate::common::raw::result_for(&seen, json!({}))
    })
    .await;
    // A real firewall process.
    let port = free_port();
    let admin = free_port();
    let text = config(&spool, ch, &db, &upstream.url())
        .set("server.listen", format!("127.0.0.1:{port}"))
        .set("admin.listen", format!("127.0.0.1:{admin}"))
        .text();
    let cfg_path = dir.path().join("fw.toml");
    std::fs::write(&cfg_path, &text).unwrap();
    let start = || serve(&cfg_path);
    let mut child = start();
    let url = format!("http://127.0.0.1:{port}/mcp/incidents");
    wait_listening(port).await;
    let token = common::token();
    let http = common::http();
    let send = |i: u64| {
        http.post(&url)
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"ping"}}"#))
            .send()
    };
    // Load from a few tasks; count the calls that were answered.
    let answered = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let answered = answered.clone();
        let url = url.clone();
        let token = token.clone();
        let http = http.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..1_000_000u64 {
                let id = t * 1_000_000 + i + 1;
                let r = http
                    .post(&url)
                    .bearer_auth(&token)
                    .header("content-type", "application/json")
                    .body(format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#))
                    .send()
                    .await;
                let Ok(resp) = r else { return };
                if resp.status() != 200 {
                    return;
                }
                // Answered by the upstream (not refused by a limit).
                match resp.bytes().await {
                    Ok(b) if b.ends_with(b"}") && b.windows(8).any(|w| w == b"\"result\"") => {
                        answered.lock().unwrap().push(id)
                    }
                    _ => return,
                }
            }
        }));
    }
    // Kill it under load: once a good number of calls were answered.
    let deadline = Instant::now() + Duration::from_secs(30);
    while answered.lock().unwrap().len() < 100 {
        assert!(Instant::now() < deadline, "the load never got going");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    for t in tasks {
        t.await.unwrap();
    }
    let answered = answered.lock().unwrap().clone();
    assert!(
        answered.len() > 50,
        "the load ran ({} answered)",
        answered.len()
    );

    // Restart on the same spool: it replays what ClickHouse has not acknowledged.
    let mut child = start();
    wait_listening(port).await;
    let _ = send(0).await;
    // Every answered call's completion row, once the restarted firewall has
    // shipped what the killed one left in the spool.
    let deadline = Instant::now() + Duration::from_secs(30);
    let missing: Vec<u64> = loop {
        let present = ch
            .try_query(&format!(
                "SELECT DISTINCT jsonrpc_id FROM {db}.audit_events WHERE row_version = 1"
            ))
            .unwrap_or_default();
        let present: std::collections::HashSet<&str> = present.lines().collect();
        let missing: Vec<u64> = answered
            .iter()
            .copied()
            .filter(|id| !present.contains(id.to_string().as_str()))
            .take(10)
            .collect();
        if missing.is_empty() || Instant::now() > deadline {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        missing.is_empty(),
        "answered calls missing from the audit trail: {missing:?}"
    );
    // Every call the upstream received, answered or not, has at least its
    // intent row: it was on record before it was sent.
    let received: Vec<String> = upstream
        .seen()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .filter_map(|v| v.get("id").map(|id| id.to_string()))
        .filter(|id| id != "0")
        .collect();
    assert!(
        received.len() >= answered.len(),
        "{} received, {} answered, {} seen",
        received.len(),
        answered.len(),
        upstream.seen().len()
    );
    let present = ch.query(&format!(
        "SELECT DISTINCT jsonrpc_id FROM {db}.audit_events"
    ));
    let present: std::collections::HashSet<&str> = present.lines().collect();
    let unrecorded: Vec<&String> = received
        .iter()
        .filter(|id| !present.contains(id.as_str()))
        .take(10)
        .collect();
    assert!(
        unrecorded.is_empty(),
        "calls the upstream received without an intent row: {unrecorded:?}"
    );
    // Exactly once with the documented query form.
    let dupes = ch.query_u64(&format!(
        "SELECT count() FROM (SELECT event_id FROM {db}.audit_events FINAL GROUP BY event_id HAVING count() > 1)"
    ));
    assert_eq!(dupes, 0);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// ClickHouse quotes 64-bit integers in JSON output.
fn num(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("not a number: {v}"))
}

/// `mcp-firewall serve --config CFG` as a process of its own (to be killed).
pub(crate) fn serve(cfg: &Path) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) async fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "firewall did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_spool_refuses_writes_and_serves_reads() {
    let dir = tempfile::tempdir().unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    let upstream = upstream(options(true)).await;
    // ClickHouse unreachable and a tiny spool: it fills up and stays full.
    let writer = "[[agents]]\nname = \"scribe\"\nprojects = [\"sre\"]\nrisks = [\"read\", \"write\"]\nallow = [{ upstream = \"incidents\" }]\ngates = { write = \"allow\" }\nmax_steps = 1000\ncalls_per_s = 1000\n";
    let policies = common::policy_dir(&[("90-scribe.toml", writer)]);
    let text = TestConfig::new()
        .policies(policies.path())
        .set("limits.per_run_tool_per_s", 0)
        .set("audit.enabled", true)
        .set("audit.clickhouse.url", dead.as_str())
        .set("audit.clickhouse.database", "x")
        .set(
            "audit.spool.dir",
            common::toml_path(&dir.path().join("spool")),
        )
        .set("audit.spool.segment_bytes", 4096)
        .set("audit.spool.max_bytes", 16384)
        .upstream("incidents", &upstream.url())
        .text();
    let fw = common::firewall(&text).await;
    let token = common::sign(&common::claims("scribe", &["sre"]));
    let s = crate::through_firewall::Setup { upstream, fw };
    let client = connect_via(&s, Era::V2026_07_28, &token).await;
    client.list_all_tools().await.unwrap();
    // Fill the spool with read calls (fail-open: they are always served).
    let mut reads = 0;
    let refused = loop {
        call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
        reads += 1;
        let params = rmcp::model::CallToolRequestParams::new("post_incident_note")
            .with_arguments(args(json!({"incident_id": "INC-1001", "note": "n"})));
        match client.call_tool(params).await {
            Err(rmcp::ServiceError::McpError(e)) => break e,
            Ok(_) => {}
            Err(other) => panic!("{other:?}"),
        }
        assert!(reads < 500, "the spool never filled");
    };
    assert_eq!(refused.code.0, -31005, "{refused:?}");
    let notes_before = s.upstream.calls("post_incident_note");
    // Still refused (no audit, no action), while reads are served.
    let params = rmcp::model::CallToolRequestParams::new("post_incident_note")
        .with_arguments(args(json!({"incident_id": "INC-1001", "note": "again"})));
    assert!(client.call_tool(params).await.is_err());
    assert_eq!(s.upstream.calls("post_incident_note"), notes_before);
    let r = call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
    assert!(r.is_error != Some(true));
    let metrics = common::http()
        .get(format!("{}/metrics", s.fw.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lost = metrics
        .lines()
        .find(|l| l.starts_with("mcp_firewall_audit_rows_lost"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no lost-rows metric in:\n{metrics}"));
    assert!(lost >= 1.0, "fail-open losses are counted: {lost}");
    client.cancel().await.ok();
    s.fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_leaves_the_intent_and_a_client_gone_completion() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    // Calls answer slowly; everything else at once.
    let upstream = crate::common::raw::upstream(|seen| async move {
        if seen.rpc_method() == "tools/call" {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        crate::common::raw::mcp_answer(&seen)
    })
    .await;
    let fw =
        common::firewall(&config(&dir.path().join("spool"), ch, &db, &upstream.url()).text()).await;
    let url = fw.mcp_url("incidents");
    let token = common::token();
    common::post(
        &url,
        &token,
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    )
    .await;
    let gone = common::http()
        .post(&url)
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .timeout(Duration::from_millis(300))
        .body(r#"{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"get_incident","arguments":{"incident_id":"INC-9"}}}"#)
        .send()
        .await;
    assert!(gone.is_err(), "the client gave up");
    // The upstream did receive it (the firewall forwarded before the client left).
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.count("POST", "tools/call") == 0 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A GET stream and a DELETE of a session are on record too.
    let init = common::post(&url, &token, &[], r#"{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#).await;
    let sid = init.headers["mcp-session-id"].to_str().unwrap().to_owned();
    let get = common::send(
        reqwest::Method::GET,
        &url,
        Some(&token),
        &[("mcp-session-id", &sid)],
        None,
    )
    .await;
    assert_eq!(get.status, 200);
    let del = common::send(
        reqwest::Method::DELETE,
        &url,
        Some(&token),
        &[("mcp-session-id", &sid)],
        None,
    )
    .await;
    assert_eq!(del.status, 200);

    let n = wait_rows(
        ch,
        &format!("SELECT count() FROM {db}.audit_events WHERE jsonrpc_id = '77'"),
        2,
    )
    .await;
    assert_eq!(n, 2, "an intent and a completion");
    // Without FINAL both rows show; with it, only the completion.
    let text = ch.query(&format!(
        "SELECT * FROM {db}.audit_events WHERE jsonrpc_id = '77' AND row_version = 0 FORMAT JSONEachRow"
    ));
    let intent: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(intent["decision"], "allow");
    let finals = ch.query_u64(&format!(
        "SELECT count() FROM {db}.audit_events FINAL WHERE jsonrpc_id = '77'"
    ));
    assert_eq!(finals, 1);
    let done = row(ch, &db, "jsonrpc_id = '77'");
    assert_eq!(done["row_version"], 1);
    assert_eq!(done["stop_reason"], "client_gone", "{done}");
    assert_eq!(done["event_id"], intent["event_id"]);
    for method in ["GET", "DELETE"] {
        wait_rows(
            ch,
            &format!("SELECT count() FROM {db}.audit_events WHERE method = '{method}' AND row_version = 1"),
            1,
        ).await;
        let r = row(ch, &db, &format!("method = '{method}'"));
        assert_eq!(r["row_version"], 1, "{method}: {r}");
        assert!(!r["session_id"].as_str().unwrap().is_empty(), "{r}");
        assert!(
            !r["session_id"]
                .as_str()
                .unwrap()
                .contains("upstream-session"),
            "the upstream's id is not stored as it is: {r}"
        );
    }
    fw.stop().await;
}
