//! Budgets through the firewall, on both backends (memory, and Redis as
//! replicas share it): the step cap holds exactly under 100 concurrent calls
//! of one run, cost caps with a price table and with upstream-reported
//! costs, the rate-limit error shape, the skipped-result shape read by a
//! real MCP client, and the metrics on /metrics.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::common::backend::Backend;
use crate::common::{self, mcp::*, raw};
use crate::on_both_backends;
use crate::through_firewall::{connect_via, setup};

/// An upstream listing `get_incident` and `query`, counting executions, and
/// reporting a cost of 0.1 for `query` when asked with `{"cheap": true}`.
async fn counting_upstream(executions: Arc<AtomicUsize>) -> raw::RawUpstream {
    raw::upstream(move |seen| {
        let executions = executions.clone();
        async move {
            let req: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
            let result = match req["method"].as_str() {
                Some("tools/list") => json!({"tools": [
                    {"name": "get_incident", "inputSchema": {"type": "object"}},
                    {"name": "query", "inputSchema": {"type": "object"}},
                ]}),
                Some("tools/call") => {
                    executions.fetch_add(1, Ordering::SeqCst);
                    let mut r = json!({"content": [{"type": "text", "text": "ok"}]});
                    if req["params"]["arguments"]["cheap"] == true {
                        r["_meta"] = json!({"mcp-firewall/cost": 0.1});
                    }
                    r
                }
                _ => json!({}),
            };
            raw::full(
                200,
                "application/json",
                json!({"jsonrpc": "2.0", "id": req["id"], "result": result}).to_string(),
            )
        }
    })
    .await
}

const POLICY: &str = r#"
[[tools]]
upstream = "ledger"
match = ["get_incident"]
risk = "read"
[[tools]]
upstream = "ledger"
match = ["query"]
risk = "read"
price = 0.4

[[agents]]
name = "budgeted"
projects = ["sre"]
risks = ["read"]
allow = [{ upstream = "ledger" }]
max_cost = 1.0
max_steps = 100

[[agents]]
name = "throttled"
projects = ["sre"]
risks = ["read"]
allow = [{ upstream = "ledger" }]
calls_per_s = 1
"#;

async fn post(fw: &common::Firewall, token: &str, body: String) -> Value {
    common::http()
        .post(fw.mcp_url("ledger"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn call_body(id: usize, tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}}).to_string()
}

async fn metric(admin: &str, needle: &str) -> f64 {
    let text = common::http()
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

on_both_backends!(
    step_cap_is_exact_under_100_concurrent_calls,
    cost_cap_with_price_table_and_upstream_reported_cost,
    rate_limit_is_a_jsonrpc_error_with_retry_after,
);

async fn step_cap_is_exact_under_100_concurrent_calls(b: Backend) {
    let scope = b.scope().await;
    let executions = Arc::new(AtomicUsize::new(0));
    let up = counting_upstream(executions.clone()).await;
    let dir = common::policy_dir(&[("90-budget.toml", POLICY)]);
    // A role with the default cap (8): reuse `throttled`'s allow list without its rate.
    let extra = "[[agents]]\nname = \"capped\"\nprojects = [\"sre\"]\nrisks = [\"read\"]\nallow = [{ upstream = \"ledger\" }]\n";
    std::fs::write(dir.path().join("91-capped.toml"), extra).unwrap();
    let cfg = common::TestConfig::new()
        .policies(dir.path())
        .upstream("ledger", &up.url())
        .set("limits.per_run_per_s", 0)
        .set("limits.per_run_tool_per_s", 0);
    // Exactness is the shared counter's: a store answering later than the
    // timeout would admit a read against this replica's own budget instead
    // (`on_store_unavailable`, tested on its own), which a loaded machine
    // can make happen at the default.
    let cfg = scope.state(cfg);
    let cfg = if matches!(scope.backend, crate::common::backend::Backend::Shared) {
        cfg.set("state.timeout_ms", 5000)
    } else {
        cfg
    };
    let fw = common::firewall(&cfg.text()).await;
    let token = common::sign(&common::claims("capped", &["sre"]));
    post(
        &fw,
        &token,
        r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#.to_owned(),
    )
    .await;

    let mut tasks = Vec::new();
    for i in 1..=100 {
        let (url, token) = (fw.mcp_url("ledger"), token.clone());
        tasks.push(tokio::spawn(async move {
            let v: Value = common::http()
                .post(url)
                .bearer_auth(token)
                .header("content-type", "application/json")
                .body(call_body(i, "get_incident", json!({})))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v
        }));
    }
    let mut skipped = 0;
    let mut ran = 0;
    for t in tasks {
        let v = t.await.unwrap();
        let r = &v["result"];
        if r["structuredContent"]["skipped"] == true {
            assert_eq!(r["isError"], true);
            assert_eq!(r["structuredContent"]["stop_reason"], "step_cap");
            assert_eq!(r["structuredContent"]["max_steps"], 8);
            assert!(r["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("step_cap"));
            skipped += 1;
        } else {
            assert_eq!(r["content"][0]["text"], "ok", "{v}");
            ran += 1;
        }
    }
    assert_eq!(ran, 8);
    assert_eq!(skipped, 92);
    assert_eq!(
        executions.load(Ordering::SeqCst),
        8,
        "exactly 8 executed at the upstream"
    );
    assert_eq!(metric(&fw.admin, "stop_reason=\"step_cap\"").await, 92.0);
    assert_eq!(metric(&fw.admin, "stop_reason=\"done\"").await, 8.0);
    fw.stop().await;
}

async fn cost_cap_with_price_table_and_upstream_reported_cost(b: Backend) {
    let scope = b.scope().await;
    let executions = Arc::new(AtomicUsize::new(0));
    let up = counting_upstream(executions.clone()).await;
    let dir = common::policy_dir(&[("90-budget.toml", POLICY)]);
    let cfg = common::TestConfig::new()
        .policies(dir.path())
        .upstream("ledger", &up.url());
    let fw = common::firewall(&scope.state(cfg).text()).await;
    let token = common::sign(&common::claims("budgeted", &["sre"]));
    post(
        &fw,
        &token,
        r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#.to_owned(),
    )
    .await;
    // 0.4 + 0.4 = 0.8; a third call (0.4) would pass the cap of 1.0.
    for i in 1..=2 {
        let v = post(&fw, &token, call_body(i, "query", json!({}))).await;
        assert_eq!(v["result"]["content"][0]["text"], "ok");
    }
    let v = post(&fw, &token, call_body(3, "query", json!({}))).await;
    assert_eq!(
        v["result"]["structuredContent"]["stop_reason"], "cost_cap",
        "{v}"
    );
    assert_eq!(v["result"]["isError"], true);
    assert_eq!(
        executions.load(Ordering::SeqCst),
        2,
        "checked before forwarding"
    );

    // Another run: the upstream reports 0.1 per call, refining the price.
    let token = common::sign(&common::claims("budgeted", &["sre"]));
    for i in 1..=6 {
        let v = post(&fw, &token, call_body(i, "query", json!({"cheap": true}))).await;
        assert_eq!(v["result"]["content"][0]["text"], "ok", "call {i}: {v}");
    }
    // Spent 0.6 at reported cost; the next would be 0.6 + 0.4 = 1.0: still fits; then no more.
    let v = post(&fw, &token, call_body(7, "query", json!({"cheap": true}))).await;
    assert_eq!(v["result"]["content"][0]["text"], "ok", "{v}");
    let v = post(&fw, &token, call_body(8, "query", json!({}))).await;
    assert_eq!(
        v["result"]["structuredContent"]["stop_reason"], "cost_cap",
        "{v}"
    );
    fw.stop().await;
}

async fn rate_limit_is_a_jsonrpc_error_with_retry_after(b: Backend) {
    let scope = b.scope().await;
    let executions = Arc::new(AtomicUsize::new(0));
    let up = counting_upstream(executions.clone()).await;
    let dir = common::policy_dir(&[("90-budget.toml", POLICY)]);
    let cfg = common::TestConfig::new()
        .policies(dir.path())
        .upstream("ledger", &up.url());
    let fw = common::firewall(&scope.state(cfg).text()).await;
    let token = common::sign(&common::claims("throttled", &["sre"]));
    post(
        &fw,
        &token,
        r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#.to_owned(),
    )
    .await;
    let first = post(&fw, &token, call_body(1, "get_incident", json!({}))).await;
    assert_eq!(first["result"]["content"][0]["text"], "ok");
    let resp = common::http()
        .post(fw.mcp_url("ledger"))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(call_body(2, "get_incident", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        200,
        "MCP calls over a limit are answered, not 429"
    );
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["id"], 2);
    assert_eq!(v["error"]["code"], -31003);
    assert_eq!(v["error"]["data"]["stop_reason"], "rate_limited");
    assert_eq!(v["error"]["data"]["scope"], "run");
    let retry = v["error"]["data"]["retry_after_ms"].as_u64().unwrap();
    assert!(retry > 0 && retry <= 1000, "{retry}");
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    assert_eq!(metric(&fw.admin, "stop_reason=\"rate_limited\"").await, 1.0);
    fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_result_reads_as_a_tool_result_in_a_real_client() {
    let s = setup(options(true)).await;
    // incident-investigator: max_steps = 8 in the shipped policy.
    let token = common::sign(&common::claims("incident-investigator", &["sre"]));
    let client = connect_via(&s, Era::V2026_07_28, &token).await;
    client.list_all_tools().await.unwrap();
    for _ in 0..8 {
        let r = call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
        assert!(r.is_error != Some(true));
    }
    let r = call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(structured(&r)["stop_reason"], "step_cap");
    assert_eq!(structured(&r)["steps_used"], 8);
    assert!(text(&r).contains("step_cap"));
    assert_eq!(s.upstream.calls("get_incident"), 8);
    client.cancel().await.ok();
    s.fw.stop().await;
}
