//! `mcp-firewall demo` works for a newcomer: the printed tokens let any MCP
//! client list and call the demo tools through the firewall.

use serde_json::json;

use crate::common::mcp::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_tokens_list_and_call_through_the_firewall() {
    crate::common::install_crypto();
    let crate::common::DemoUnderTest {
        demo,
        upstream,
        _dir,
    } = crate::common::start_demo(true).await;
    let url = format!("http://{}/mcp/incidents", demo.firewall.mcp_addr);
    for (n, era) in [Era::V2025_11_25, Era::V2026_07_28].into_iter().enumerate() {
        let mut cfg =
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                url.clone(),
            );
        cfg.auth_header = Some(demo.investigator_token.clone());
        let client = connect_with(TestClient::new(era), cfg).await;
        assert_eq!(
            client.list_all_tools().await.unwrap().len(),
            8,
            "{era:?}: the investigator sees the read tools"
        );
        let r = call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
        assert!(text(&r).contains("INC-1001"), "{era:?}");
        client.cancel().await.ok();

        let mut cfg =
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                url.clone(),
            );
        cfg.auth_header = Some(demo.operator_token.clone());
        let client = connect_with(TestClient::new(era), cfg).await;
        assert_eq!(
            client.list_all_tools().await.unwrap().len(),
            14,
            "{era:?}: the operator sees every tool"
        );
        // The gated call waits for a person; the printed approver token
        // approves it on the admin listener, and the call completes.
        let held = tokio::spawn(async move {
            let r = call(
                &client,
                "rollback_deployment",
                json!({"deployment_id": "dep-1042", "reason": "bad deploy"}),
            )
            .await;
            client.cancel().await.ok();
            r
        });
        let admin = format!("http://{}", demo.firewall.admin_addr);
        crate::common::approve_first_pending(&admin, &demo.approver_token).await;
        let r = held.await.unwrap();
        // It ran: the first rollback succeeds; the second finds the
        // deployment already rolled back (a tool error from the upstream).
        assert!(!r.content.is_empty(), "{era:?}: {r:?}");
        assert_eq!(upstream.calls("rollback_deployment"), n as u64 + 1);
    }
    demo.firewall.shutdown().await;
    upstream.shutdown().await;
}

/// `mcp-firewall audit …` as a newcomer types it; stdout.
fn audit_cli(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .arg("audit")
        .args(args)
        .output()
        .expect("run mcp-firewall audit");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

async fn investigator_calls(demo: &mcp_firewall::demo::run::Demo) {
    let url = format!("http://{}/mcp/incidents", demo.firewall.mcp_addr);
    let client = connect_bearer(&url, &demo.investigator_token).await;
    client.list_all_tools().await.unwrap();
    call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
    // Hidden from the investigator: a refusal on record.
    let params = rmcp::model::CallToolRequestParams::new("restart_service")
        .with_arguments(args(json!({"service": "checkout"})));
    assert!(client.call_tool(params).await.is_err());
    client.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_shows_the_audit_trail_of_your_own_calls_in_clickhouse() {
    crate::common::install_crypto();
    let crate::common::DemoUnderTest {
        demo,
        upstream: _upstream,
        _dir,
    } = crate::common::start_demo(true).await;
    let Some(ch) = demo.audit.clickhouse.as_ref() else {
        // The CI machine has clickhouse-server; elsewhere say what is missing.
        eprintln!("no ClickHouse: {:?}", demo.audit.why_not);
        assert!(mcp_firewall::demo::run::audit_help(&demo.audit).contains("--spool"));
        demo.firewall.shutdown().await;
        return;
    };
    let help = mcp_firewall::demo::run::audit_help(&demo.audit);
    let at = [
        "--clickhouse",
        ch.http_url.as_str(),
        "--database",
        "mcp_firewall",
    ];
    assert!(
        help.contains(&format!(
            "mcp-firewall audit {} run run-investigate-1",
            at.join(" ")
        )),
        "{help}"
    );
    investigator_calls(&demo).await;
    // The run's timeline, as the printed command shows it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let timeline = loop {
        let mut a = at.to_vec();
        a.extend(["--json", "run", "run-investigate-1"]);
        let (ok, text) = audit_cli(&a);
        let rows: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if ok
            && rows.iter().any(|r| r["tool"] == "restart_service")
            && rows.iter().any(|r| r["stop_reason"] == "done")
        {
            break rows;
        }
        assert!(std::time::Instant::now() < deadline, "no rows yet: {text}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    };
    let call = timeline
        .iter()
        .find(|r| r["tool"] == "get_incident" && r["method"] == "tools/call")
        .expect("the call");
    assert_eq!(call["decision"], "allow");
    assert_eq!(
        call["stop_reason"], "done",
        "FINAL keeps the completion row"
    );
    let hidden = timeline
        .iter()
        .find(|r| r["tool"] == "restart_service")
        .unwrap();
    assert_eq!(hidden["decision"], "hidden");
    // Denials and stats, as tables.
    let mut a = at.to_vec();
    a.extend(["denials", "--since", "1h"]);
    let (ok, text) = audit_cli(&a);
    assert!(ok, "{text}");
    assert!(
        text.contains("incident-investigator") && text.contains("hidden"),
        "{text}"
    );
    let mut a = at.to_vec();
    a.extend(["stats", "--days", "1"]);
    let (ok, text) = audit_cli(&a);
    assert!(ok && text.contains("get_incident"), "{text}");
    let mut a = at.to_vec();
    a.extend(["tail", "--once", "-n", "50"]);
    let (ok, text) = audit_cli(&a);
    assert!(
        ok && text.contains("run-investigate-1") && text.contains("(forwarding)"),
        "{text}"
    );
    demo.firewall.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_clickhouse_the_demo_keeps_rows_in_the_spool_and_tail_reads_them() {
    crate::common::install_crypto();
    let crate::common::DemoUnderTest {
        demo,
        upstream: _upstream,
        _dir,
    } = crate::common::start_demo(false).await;
    assert!(demo.audit.clickhouse.is_none());
    let spool = demo.audit.spool.display().to_string();
    let help = mcp_firewall::demo::run::audit_help(&demo.audit);
    assert!(
        help.contains(&format!("mcp-firewall audit --spool {spool} tail")),
        "{help}"
    );
    assert!(help.contains("apt install clickhouse-server"), "{help}");
    // Not unready for the backlog a missing ClickHouse leaves.
    investigator_calls(&demo).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (ok, text) = audit_cli(&["--spool", &spool, "--json", "tail", "--once", "-n", "100"]);
        let rows: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if ok
            && rows
                .iter()
                .any(|r| r["tool"] == "get_incident" && r["stop_reason"] == "done")
            && rows
                .iter()
                .any(|r| r["tool"] == "restart_service" && r["decision"] == "hidden")
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let ready = crate::common::http()
        .get(format!("http://{}/readyz", demo.firewall.admin_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    // Questions for ClickHouse are refused with the reason.
    let (ok, text) = audit_cli(&["--spool", &spool, "run", "run-investigate-1"]);
    assert!(!ok && text.contains("ask ClickHouse"), "{text}");
    demo.firewall.shutdown().await;
}

/// `mcp-firewall demo` on free ports, rows kept in the spool, the estate's
/// binary `estate`, state in `data`.
fn demo_command(estate: &std::path::Path, data: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-firewall"));
    cmd.args([
        "demo",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--spool-only",
    ])
    .arg("--upstream-bin")
    .arg(estate)
    .arg("--data-dir")
    .arg(data);
    cmd
}

/// Reads the demo's stdout until its guide names the endpoint and the
/// investigator's token.
fn read_guide(stdout: std::process::ChildStdout) -> (String, String, String) {
    use std::io::BufRead as _;
    let mut lines = std::io::BufReader::new(stdout).lines();
    let (mut url, mut upstream, mut token) = (None, None, None);
    let mut seen = Vec::new();
    while let Some(Ok(line)) = lines.next() {
        let t = line.trim().to_owned();
        if let Some(rest) = t.strip_prefix("MCP endpoint") {
            url = Some(rest.trim().to_owned());
        } else if let Some(rest) = t.strip_prefix("upstream") {
            upstream = rest.split_whitespace().next().map(str::to_owned);
        } else if t.starts_with("investigator") {
            token = lines
                .next()
                .and_then(Result::ok)
                .map(|l| l.trim().to_owned());
        }
        seen.push(line);
        if let (Some(u), Some(up), Some(tok)) = (&url, &upstream, &token) {
            // Keep draining so the demo never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return (u.clone(), up.clone(), tok.clone());
        }
    }
    panic!("the demo's guide lacks its endpoint or token: {seen:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_command_starts_the_estate_as_a_child_and_it_dies_with_the_firewall() {
    crate::common::install_crypto();
    let estate = crate::common::estate_binary();
    let dir = tempfile::tempdir().unwrap();
    let mut child = demo_command(&estate, dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (url, upstream_url, token) = tokio::task::spawn_blocking(move || read_guide(stdout))
        .await
        .unwrap();
    assert_ne!(url, upstream_url, "the firewall is not the estate");
    // The printed token works through the firewall.
    let client = connect_bearer(&url, &token).await;
    assert_eq!(client.list_all_tools().await.unwrap().len(), 8);
    let r = call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
    assert!(text(&r).contains("INC-1001"));
    client.cancel().await.ok();
    // The estate answers at the URL the guide printed.
    let direct = crate::common::http()
        .post(&upstream_url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
        .send()
        .await;
    assert!(direct.is_ok(), "the estate listens: {direct:?}");
    // Killed without a chance to clean up, the firewall takes the estate
    // with it (its stdin closes).
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = crate::common::http()
            .post(&upstream_url)
            .body("{}")
            .timeout(std::time::Duration::from_secs(1))
            .send()
            .await;
        if r.is_err() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the estate outlived the firewall"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The state directory holds the spool an auditor reads afterwards.
    assert!(dir.path().join("audit-spool").is_dir());
}

#[tokio::test]
async fn the_demo_command_says_how_to_get_the_estate_when_its_binary_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let out = demo_command(&dir.path().join("no-such-binary"), dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-such-binary") && err.contains("does not exist"),
        "{err}"
    );
}
