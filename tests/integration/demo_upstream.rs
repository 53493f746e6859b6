//! End-to-end tests of the sample upstream (`mcp_firewall::demo`): a real rmcp
//! client talks to a spawned upstream over real HTTP, in every protocol era the
//! firewall proxies. No mocks.

// Sampling is deprecated by SEP-2577 but the upstream still has to serve it.
#![allow(deprecated)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_demo_upstream::{self as demo, UpstreamOptions};
use rmcp::model::{
    CallToolRequestParams, ElicitationAction, ServerNotification, SubscriptionFilter, Tool,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{json, Value};

use crate::common::mcp::*;
use crate::common::wait_until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_fourteen_tools_with_honest_annotations_in_every_era() {
    for (era, json_response) in SETUPS {
        let upstream = upstream(options(json_response)).await;
        let client = connect(&upstream.url(), TestClient::new(era)).await;
        let tools = client.list_all_tools().await.expect("tools/list");
        let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        names.sort_unstable();
        let mut expected = demo::tools::TOOL_NAMES.to_vec();
        expected.sort_unstable();
        assert_eq!(names, expected, "{era:?}");

        for name in READ_ONLY {
            let a = annotations(&tools, name).expect("annotated");
            assert_eq!(a.read_only_hint, Some(true), "{name} in {era:?}");
        }
        for name in WRITE {
            let a = annotations(&tools, name).expect("annotated");
            assert_eq!(
                (a.read_only_hint, a.destructive_hint),
                (Some(false), Some(false)),
                "{name}"
            );
        }
        for name in DESTRUCTIVE {
            let a = annotations(&tools, name).expect("annotated");
            assert_eq!(
                (a.read_only_hint, a.destructive_hint),
                (Some(false), Some(true)),
                "{name}"
            );
        }
        assert!(annotations(&tools, "rollback_deployment_unsafe").is_none());

        let rollback = tools
            .iter()
            .find(|t| t.name == "rollback_deployment")
            .expect("listed");
        let schema = Value::Object(rollback.input_schema.as_ref().clone());
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["required"], json!(["deployment_id", "reason"]));
        assert_eq!(
            schema["properties"]["deployment_id"]["pattern"],
            "^dep-[0-9]+$"
        );
        assert_eq!(schema["additionalProperties"], false);
        let restart = tools
            .iter()
            .find(|t| t.name == "restart_service")
            .expect("listed");
        assert_eq!(
            restart.input_schema["properties"]["namespace"]["enum"],
            json!(["prod", "staging"])
        );
        client.cancel().await.expect("close client");
        upstream.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_tools_return_deterministic_content_in_every_era() {
    let mut seen: Vec<(String, Value, String)> = Vec::new();
    for (era, json_response) in SETUPS {
        let upstream = upstream(options(json_response)).await;
        let client = connect(&upstream.url(), TestClient::new(era)).await;
        let incident = call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
        assert_ne!(incident.is_error, Some(true));
        assert!(text(&incident).starts_with("INC-1001 [sev1, open] Checkout error rate"));
        assert_eq!(structured(&incident)["suspected_deployment"], "dep-1042");
        let csv = call(
            &client,
            "export_metrics_csv",
            json!({"service": "checkout", "points": 3}),
        )
        .await;
        let csv_text = text(&csv).to_owned();
        assert_eq!(csv_text.lines().count(), 4);
        assert!(csv_text.starts_with("unix_ts,service,namespace,"));
        seen.push((
            text(&incident).to_owned(),
            structured(&incident).clone(),
            csv_text,
        ));
        assert_eq!(upstream.calls("get_incident"), 1);
        assert_eq!(upstream.calls("export_metrics_csv"), 1);
        assert_eq!(upstream.total_calls(), 2);
        client.cancel().await.expect("close client");
        upstream.shutdown().await;
    }
    assert!(
        seen.windows(2).all(|w| w[0] == w[1]),
        "content differs between runs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_are_tool_errors_and_still_count() {
    let upstream = upstream(options(true)).await;
    let client = connect(&upstream.url(), TestClient::new(Era::V2026_07_28)).await;
    let result = call(
        &client,
        "get_deployment",
        json!({"deployment_id": "dep-9999"}),
    )
    .await;
    assert_eq!(result.is_error, Some(true));
    assert!(text(&result).contains("unknown deployment `dep-9999`"));
    assert_eq!(upstream.calls("get_deployment"), 1);
    let unknown_tool = client
        .call_tool(CallToolRequestParams::new("no_such_tool"))
        .await;
    assert!(unknown_tool.is_err(), "an unknown tool is a JSON-RPC error");
    assert_eq!(upstream.total_calls(), 1);
    client.cancel().await.expect("close client");
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_and_destructive_tools_change_state_and_count() {
    for (era, json_response) in SETUPS {
        let upstream = upstream(options(json_response)).await;
        let client = connect(&upstream.url(), TestClient::new(era)).await;
        let posted = call(
            &client,
            "post_incident_note",
            json!({"incident_id": "INC-1001", "note": "rolling back dep-1042"}),
        )
        .await;
        assert_eq!(structured(&posted)["note_number"], 3);
        let incident = call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
        assert_eq!(
            structured(&incident)["notes"][2]["text"],
            "rolling back dep-1042"
        );

        let rolled = call(
            &client,
            "rollback_deployment",
            json!({"deployment_id": "dep-1042", "reason": "INC-1001"}),
        )
        .await;
        assert_eq!(structured(&rolled)["live_deployment"], "dep-1038");
        let unsafe_rolled = call(
            &client,
            "rollback_deployment_unsafe",
            json!({"deployment_id": "dep-1038", "reason": "further back"}),
        )
        .await;
        assert_eq!(structured(&unsafe_rolled)["live_deployment"], "dep-1031");
        let health = call(
            &client,
            "get_service_health",
            json!({"service": "checkout"}),
        )
        .await;
        assert_eq!(structured(&health)["version"], "v2.13.0");

        assert_eq!(upstream.calls("post_incident_note"), 1);
        assert_eq!(upstream.calls("rollback_deployment"), 1);
        assert_eq!(upstream.calls("rollback_deployment_unsafe"), 1);
        assert_eq!(upstream.total_calls(), 5);
        client.cancel().await.expect("close client");
        upstream.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notifications_arrive_before_the_result() {
    const PROGRESS_DELAY: Duration = Duration::from_millis(100);
    for (era, json_response) in SETUPS {
        let upstream = upstream(UpstreamOptions {
            progress_delay: PROGRESS_DELAY,
            ..options(json_response)
        })
        .await;
        let client = TestClient::new(era);
        let state = Arc::clone(&client.0);
        let client = connect(&upstream.url(), client).await;
        for (tool, arguments) in [
            (
                "export_metrics_csv",
                json!({"service": "search", "points": 10}),
            ),
            (
                "rollback_deployment",
                json!({"deployment_id": "dep-1042", "reason": "INC-1001"}),
            ),
        ] {
            state.progress.lock().expect("log").clear();
            let result = call(&client, tool, arguments).await;
            let finished = Instant::now();
            assert_ne!(result.is_error, Some(true), "{tool}: {}", text(&result));
            let progress = state.progress.lock().expect("log").clone();
            assert_eq!(
                progress.iter().map(|p| p.1).collect::<Vec<_>>(),
                vec![1.0, 2.0, 3.0],
                "{tool} in {era:?}"
            );
            // rmcp runs notification handlers as separate tasks, so a loaded
            // machine may record them a little late; the margins allow for
            // that. Every notification is followed by a pause before the
            // result, the first one by three.
            for (at, step) in &progress {
                assert!(
                    *at < finished,
                    "{tool} in {era:?}: progress {step} arrived after the result"
                );
            }
            let lead = finished.duration_since(progress[0].0);
            assert!(
                lead >= PROGRESS_DELAY * 2,
                "{tool} in {era:?}: first progress only {lead:?} before the result"
            );
        }
        client.cancel().await.expect("close client");
        upstream.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_asks_the_clients_model_when_it_can_sample() {
    let eras = [
        Era::V2025_11_25,
        Era::V2025_06_18,
        Era::V2025_03_26,
        Era::V2026_07_28,
    ];
    for era in eras {
        let upstream = upstream(options(true)).await;
        let client = TestClient::new(era);
        let state = Arc::clone(&client.0);
        let client = connect(&upstream.url(), client).await;
        let finding = call(
            &client,
            "record_finding",
            json!({
                "incident_id": "INC-1001",
                "summary": "retries lack an idempotency key",
                "severity": "critical",
                "evidence": ["dep-1042 removes the idempotency-key header"]
            }),
        )
        .await;
        assert_eq!(structured(&finding)["finding_id"], "F-1");
        let audit = call(&client, "audit_finding", json!({"finding_id": "F-1"})).await;
        // The rule would say "confirmed" (evidence present); the model says
        // "rejected", so this proves the answer came from sampling.
        assert_eq!(structured(&audit)["verdict"], "rejected", "{era:?}");
        assert_eq!(structured(&audit)["source"], "sampling");
        assert_eq!(structured(&audit)["model"], "test-model");
        assert_eq!(state.samplings.load(Ordering::SeqCst), 1);
        let expected_calls = if era == Era::V2026_07_28 { 2 } else { 1 };
        assert_eq!(upstream.calls("audit_finding"), expected_calls, "{era:?}");
        client.cancel().await.expect("close client");
        upstream.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_falls_back_to_the_rule_without_sampling() {
    for era in [Era::V2025_11_25, Era::V2026_07_28] {
        let upstream = upstream(options(false)).await;
        let client = TestClient::with(era, |s| s.sampling = false);
        let state = Arc::clone(&client.0);
        let client = connect(&upstream.url(), client).await;
        call(
            &client,
            "record_finding",
            json!({"incident_id": "INC-1002", "summary": "cache TTL too long", "severity": "high"}),
        )
        .await;
        let audit = call(&client, "audit_finding", json!({"finding_id": "F-1"})).await;
        assert_eq!(structured(&audit)["verdict"], "needs_more_evidence");
        assert_eq!(structured(&audit)["source"], "rule");
        assert_eq!(
            structured(&audit)["rule_reason"],
            "the client did not declare sampling"
        );
        assert_eq!(state.samplings.load(Ordering::SeqCst), 0);
        client.cancel().await.expect("close client");
        upstream.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_note_is_posted_only_when_the_user_accepts() {
    for era in [Era::V2025_11_25, Era::V2025_06_18, Era::V2026_07_28] {
        for action in [ElicitationAction::Accept, ElicitationAction::Decline] {
            let upstream = upstream(options(false)).await;
            let client = TestClient::with(era, |s| s.elicit_action = action.clone());
            let state = Arc::clone(&client.0);
            let client = connect(&upstream.url(), client).await;
            let result = call(
                &client,
                "post_incident_note",
                json!({"incident_id": "INC-1002", "note": "restarting search", "confirm": true}),
            )
            .await;
            assert_ne!(result.is_error, Some(true), "{}", text(&result));
            let accepted = action == ElicitationAction::Accept;
            assert_eq!(
                structured(&result)["posted"],
                accepted,
                "{era:?} {action:?}"
            );
            assert_eq!(state.elicitations.load(Ordering::SeqCst), 1);
            let incident = call(&client, "get_incident", json!({"incident_id": "INC-1002"})).await;
            let notes = structured(&incident)["notes"]
                .as_array()
                .expect("notes")
                .len();
            assert_eq!(notes, if accepted { 2 } else { 1 }, "{era:?} {action:?}");
            client.cancel().await.expect("close client");
            upstream.shutdown().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmation_without_elicitation_capability_posts_nothing() {
    for era in [Era::V2025_11_25, Era::V2026_07_28] {
        let upstream = upstream(options(true)).await;
        let client = TestClient::with(era, |s| s.elicitation = false);
        let client = connect(&upstream.url(), client).await;
        let result = call(
            &client,
            "post_incident_note",
            json!({"incident_id": "INC-1001", "note": "x", "confirm": true}),
        )
        .await;
        assert_eq!(result.is_error, Some(true));
        let incident = call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
        assert_eq!(
            structured(&incident)["notes"]
                .as_array()
                .expect("notes")
                .len(),
            2
        );
        client.cancel().await.expect("close client");
        upstream.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_tool_is_announced_to_session_clients() {
    let upstream = upstream(options(false)).await;
    let client = TestClient::new(Era::V2025_11_25);
    let state = Arc::clone(&client.0);
    let client = connect(&upstream.url(), client).await;
    wait_until("the session to register", WAIT, || {
        upstream.session_count() == 1
    })
    .await;

    upstream
        .rename_tool("get_incident", "get_incident_v2")
        .await
        .expect("rename");
    tokio::time::timeout(WAIT, state.list_changed.notified())
        .await
        .expect("list_changed notification");
    let names: Vec<String> = client
        .list_all_tools()
        .await
        .expect("tools/list")
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(names.contains(&"get_incident_v2".to_owned()));
    assert!(!names.contains(&"get_incident".to_owned()));
    let renamed = call(
        &client,
        "get_incident_v2",
        json!({"incident_id": "INC-1003"}),
    )
    .await;
    assert_eq!(structured(&renamed)["status"], "resolved");
    assert_eq!(upstream.calls("get_incident_v2"), 1);

    let added = Tool::new(
        "drop_database",
        "Looks harmless.",
        Arc::new(args(json!({"type": "object"}))),
    );
    upstream.add_tool(added).await.expect("add");
    wait_until("a second notification", WAIT, || {
        state.list_changes.load(Ordering::SeqCst) == 2
    })
    .await;
    let echoed = call(&client, "drop_database", json!({"table": "orders"})).await;
    assert_eq!(structured(&echoed)["arguments"]["table"], "orders");
    assert_eq!(
        upstream.rename_tool("nope", "x").await,
        Err(demo::ToolCatalogError::UnknownTool {
            name: "nope".into()
        })
    );
    client.cancel().await.expect("close client");
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_changes_reach_modern_listeners() {
    let upstream = upstream(options(true)).await;
    let client = connect(&upstream.url(), TestClient::new(Era::V2026_07_28)).await;
    let mut subscription = client
        .listen(SubscriptionFilter::builder().tools_list_changed().build())
        .await
        .expect("subscriptions/listen");
    wait_until("the listener to start", WAIT, || {
        upstream.subscription_count() == 1
    })
    .await;
    upstream
        .remove_tool("restart_service")
        .await
        .expect("remove");
    let notification = tokio::time::timeout(WAIT, subscription.next())
        .await
        .expect("notification in time")
        .expect("stream open")
        .expect("a notification");
    assert!(matches!(
        notification,
        ServerNotification::ToolListChangedNotification(_)
    ));
    assert!(!upstream
        .tool_names()
        .contains(&"restart_service".to_owned()));
    subscription.cancel().await.expect("cancel subscription");
    client.cancel().await.expect("close client");
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_headers_are_recorded() {
    let upstream = upstream(options(true)).await;
    let url = upstream.url();
    let config = StreamableHttpClientTransportConfig::with_uri(url.clone()).auth_header("s3cret");
    let client = connect_with(TestClient::new(Era::V2026_07_28), config).await;
    call(&client, "list_incidents", json!({})).await;
    let requests = upstream.recorded_requests();
    let tools_call = requests
        .iter()
        .find(|r| {
            r.headers
                .get("mcp-method")
                .is_some_and(|m| m == "tools/call")
        })
        .expect("the tools/call request was recorded");
    assert_eq!(tools_call.method, http::Method::POST);
    assert_eq!(tools_call.headers["authorization"], "Bearer s3cret");
    assert_eq!(tools_call.headers["mcp-protocol-version"], "2026-07-28");
    assert_eq!(tools_call.headers["mcp-name"], "list_incidents");
    assert_eq!(upstream.requests().len(), requests.len());
    upstream.clear_requests();
    assert!(upstream.requests().is_empty());
    client.cancel().await.expect("close client");
    upstream.shutdown().await;
}

fn modern_call_body(tool: &str, arguments: Value, progress_token: Option<&str>) -> Value {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}
    });
    if let Some(token) = progress_token {
        meta["progressToken"] = json!(token);
    }
    json!({
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta}
    })
}

async fn raw_post(url: &str, host: Option<&str>, body: &Value, tool: &str) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .json(body);
    if let Some(host) = host {
        request = request.header("host", host);
    }
    request.send().await.expect("raw POST")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modern_json_mode_answers_json_without_progress_token_and_sse_with_one() {
    let upstream = upstream(options(true)).await;
    let url = upstream.url();
    let plain = modern_call_body(
        "export_metrics_csv",
        json!({"service": "auth", "points": 2}),
        None,
    );
    let response = raw_post(&url, None, &plain, "export_metrics_csv").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: Value = response.json().await.expect("json body");
    assert_eq!(body["id"], 7);
    assert!(body["result"]["content"][0]["text"]
        .as_str()
        .expect("csv")
        .starts_with("unix_ts,"));

    let with_token = modern_call_body(
        "export_metrics_csv",
        json!({"service": "auth", "points": 2}),
        Some("tok-1"),
    );
    let response = raw_post(&url, None, &with_token, "export_metrics_csv").await;
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let sse = response.text().await.expect("sse body");
    let progress_at = sse.find("notifications/progress").expect("progress event");
    let result_at = sse.find("\"result\"").expect("result event");
    assert!(progress_at < result_at, "progress must precede the result");
    assert_eq!(sse.matches("notifications/progress").count(), 3);
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_hosts_on_any_loopback_port_are_accepted_and_others_refused() {
    let upstream = upstream(options(true)).await;
    let url = upstream.url();
    let body = modern_call_body("list_incidents", json!({}), None);
    for host in ["127.0.0.1:1", "localhost:65000", "127.0.0.1"] {
        let response = raw_post(&url, Some(host), &body, "list_incidents").await;
        assert_eq!(response.status(), 200, "Host: {host}");
    }
    let response = raw_post(&url, Some("evil.example:80"), &body, "list_incidents").await;
    assert_eq!(response.status(), 403);
    assert_eq!(
        upstream.requests().len(),
        4,
        "rejected requests are recorded too"
    );
    assert_eq!(upstream.calls("list_incidents"), 3);
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_serving() {
    let upstream = upstream(options(true)).await;
    let url = upstream.url();
    upstream.shutdown().await;
    let body = modern_call_body("list_incidents", json!({}), None);
    let refused = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .json(&body)
        .send()
        .await;
    assert!(refused.is_err(), "the port no longer accepts connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleartext_http2_is_served() {
    let upstream = upstream(options(true)).await;
    let body = modern_call_body("get_incident", json!({"incident_id": "INC-1004"}), None);
    let response = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("h2c client")
        .post(upstream.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "get_incident")
        .json(&body)
        .send()
        .await
        .expect("h2c POST");
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["result"]["structuredContent"]["status"], "mitigated");
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_revisions_work_without_sessions() {
    let upstream = upstream(UpstreamOptions {
        legacy_session_mode: false,
        ..options(true)
    })
    .await;
    let client = TestClient::new(Era::V2025_11_25);
    let state = Arc::clone(&client.0);
    let client = connect(&upstream.url(), client).await;
    let tools = client.list_all_tools().await.expect("tools/list");
    assert_eq!(tools.len(), 14);
    let posted = call(
        &client,
        "post_incident_note",
        json!({"incident_id": "INC-1004", "note": "consumers scaled"}),
    )
    .await;
    assert_eq!(structured(&posted)["note_number"], 2);
    call(
        &client,
        "record_finding",
        json!({"incident_id": "INC-1004", "summary": "shared queue is saturated", "severity": "medium", "evidence": ["lag 240s"]}),
    )
    .await;
    // Without a session the server cannot ask the client anything: the audit
    // falls back to the rule and says why, the confirmation refuses to post.
    let audit = call(&client, "audit_finding", json!({"finding_id": "F-1"})).await;
    assert_eq!(structured(&audit)["source"], "rule");
    let reason = structured(&audit)["rule_reason"].as_str().expect("reason");
    assert!(reason.contains("unknown for this request"), "{reason}");
    assert_eq!(structured(&audit)["verdict"], "confirmed");
    let confirm = call(
        &client,
        "post_incident_note",
        json!({"incident_id": "INC-1004", "note": "x", "confirm": true}),
    )
    .await;
    assert_eq!(confirm.is_error, Some(true));
    assert!(text(&confirm).contains("unknown for this request"));
    assert_eq!(state.samplings.load(Ordering::SeqCst), 0);
    assert_eq!(state.elicitations.load(Ordering::SeqCst), 0);
    assert_eq!(upstream.session_count(), 0);
    client.cancel().await.expect("close client");
    upstream.shutdown().await;
}
