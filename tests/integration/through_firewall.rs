//! A real MCP client (rmcp) talks to the sample upstream (rmcp) through the
//! firewall, in every protocol era and transport mode: listing and calling
//! tools, progress, sessions, and the policy's answers as a client reads them.

#![allow(deprecated)]

use std::time::{Duration, Instant};

use mcp_demo_upstream::{DemoUpstream, UpstreamOptions};
use rmcp::model::{CallToolRequestParams, Tool};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{json, Value};

use crate::common::mcp::*;
use crate::common::{self, Firewall};

/// The demo upstream behind a firewall (as upstream `incidents`, project `sre`,
/// with identity headers).
pub struct Setup {
    pub upstream: DemoUpstream,
    pub fw: Firewall,
}

pub async fn setup(opts: UpstreamOptions) -> Setup {
    setup_in(opts, &common::shipped_policies()).await
}

/// [`setup`] with another policy directory.
pub async fn setup_in(opts: UpstreamOptions, policies: &std::path::Path) -> Setup {
    let upstream = upstream(opts).await;
    let text = common::TestConfig::new()
        .policies(policies)
        .upstream("incidents", &upstream.url())
        .upstream_set(
            "incidents",
            "identity_headers",
            common::table([
                ("X-Tenant-Id", "tenant_id".into()),
                ("X-Run-Id", "run_id".into()),
                ("X-Agent", "agent".into()),
            ]),
        )
        .text();
    let fw = common::firewall(&text).await;
    Setup { upstream, fw }
}

/// Connects an rmcp client through the firewall with `token`.
pub async fn connect_via(s: &Setup, era: Era, token: &str) -> Client {
    connect_client_via(s, TestClient::new(era), token).await
}

pub async fn connect_client_via(s: &Setup, client: TestClient, token: &str) -> Client {
    let mut config = StreamableHttpClientTransportConfig::with_uri(s.fw.mcp_url("incidents"));
    config.auth_header = Some(token.to_owned());
    connect_with(client, config).await
}

/// Calls a tool and returns the JSON-RPC error the client got.
pub async fn call_err(client: &Client, tool: &str, arguments: Value) -> rmcp::ErrorData {
    let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args(arguments));
    match tokio::time::timeout(WAIT, client.call_tool(params))
        .await
        .expect("no hang")
    {
        Err(rmcp::ServiceError::McpError(e)) => e,
        other => panic!("expected a JSON-RPC error for {tool}, got {other:?}"),
    }
}

fn ann(tools: &[Tool], name: &str) -> (Option<bool>, Option<bool>) {
    let t = tools
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} listed"));
    let a = t
        .annotations
        .as_ref()
        .expect("annotations derived by the firewall");
    (a.read_only_hint, a.destructive_hint)
}

fn gate(tools: &[Tool], name: &str) -> String {
    let t = tools.iter().find(|t| t.name == name).unwrap();
    t.meta
        .as_ref()
        .and_then(|m| m.get("mcp-firewall/gate"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_to_upstream_list_and_call_in_every_era() {
    for (era, json_response) in SETUPS {
        let s = setup(options(json_response)).await;
        let client = connect_via(&s, era, &common::token()).await;
        let tools = client
            .list_all_tools()
            .await
            .expect("tools/list through the firewall");
        assert_eq!(tools.len(), 14, "{era:?}: sre-lead sees every tool");
        // Annotations come from the policy's risk, not from the vendor.
        assert_eq!(
            ann(&tools, "get_incident"),
            (Some(true), Some(false)),
            "{era:?}"
        );
        assert_eq!(
            ann(&tools, "post_incident_note"),
            (Some(false), Some(false)),
            "{era:?}"
        );
        assert_eq!(
            ann(&tools, "rollback_deployment"),
            (Some(false), Some(true)),
            "{era:?}"
        );
        assert_eq!(
            ann(&tools, "rollback_deployment_unsafe"),
            (Some(false), Some(true)),
            "{era:?}: the unannotated tool is destructive"
        );
        assert_eq!(gate(&tools, "get_incident"), "allow");
        assert_eq!(gate(&tools, "restart_service"), "approve");

        let direct = {
            let d = connect(&s.upstream.url(), TestClient::new(era)).await;
            let r = call(&d, "get_incident", json!({"incident_id": "INC-1001"})).await;
            let t = text(&r).to_owned();
            d.cancel().await.ok();
            t
        };
        let r = call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
        assert_eq!(text(&r), direct, "{era:?}: the same answer as direct");
        assert_eq!(s.upstream.calls("get_incident"), 2);
        client.cancel().await.ok();
        s.fw.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_reaches_the_client_before_the_result() {
    for era in [Era::V2025_11_25, Era::V2026_07_28] {
        let s = setup(UpstreamOptions {
            json_response: false,
            progress_delay: Duration::from_millis(150),
            ..UpstreamOptions::default()
        })
        .await;
        let tc = TestClient::new(era);
        let client = connect_client_via(&s, tc.clone(), &common::token()).await;
        client.list_all_tools().await.unwrap();
        let started = Instant::now();
        let r = call(
            &client,
            "export_metrics_csv",
            json!({"service": "checkout", "points": 5}),
        )
        .await;
        let done = Instant::now();
        assert!(!text(&r).is_empty());
        let progress = tc.0.progress.lock().unwrap().clone();
        assert!(
            progress.len() >= 2,
            "{era:?}: progress relayed ({progress:?})"
        );
        let first = progress[0].0;
        assert!(
            first > started && first + Duration::from_millis(100) < done,
            "{era:?}: first progress {:?} after start, result {:?}",
            first - started,
            done - started
        );
        client.cancel().await.ok();
        s.fw.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_role_lists_only_read_tools() {
    let s = setup(options(true)).await;
    let token = common::sign(&common::claims("incident-investigator", &["sre"]));
    let client = connect_via(&s, Era::V2026_07_28, &token).await;
    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    let mut want = READ_ONLY.to_vec();
    want.sort_unstable();
    assert_eq!(names, want);
    for t in &tools {
        assert_eq!(ann(&tools, &t.name), (Some(true), Some(false)));
    }
    client.cancel().await.ok();
    s.fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_lists_keep_each_roles_own_view() {
    // The upstream answers the same list every time; the firewall remembers
    // the filtered view per authority. Interleaving two roles must never hand
    // one the other's view, and a call after a remembered list still works.
    let s = setup(options(true)).await;
    let reader_token = common::sign(&common::claims("incident-investigator", &["sre"]));
    let reader = connect_via(&s, Era::V2026_07_28, &reader_token).await;
    let operator = connect_via(&s, Era::V2026_07_28, &common::token()).await;
    let mut read_only = READ_ONLY.to_vec();
    read_only.sort_unstable();
    let sorted = |tools: &[Tool]| {
        let mut n: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
        n.sort_unstable();
        n
    };
    let all = sorted(&operator.list_all_tools().await.unwrap());
    assert!(all.len() > read_only.len(), "{all:?}");
    for _ in 0..3 {
        let r = reader.list_all_tools().await.unwrap();
        assert_eq!(sorted(&r), read_only);
        for t in &r {
            assert_eq!(ann(&r, &t.name), (Some(true), Some(false)));
        }
        assert_eq!(sorted(&operator.list_all_tools().await.unwrap()), all);
    }
    let e = call_err(&reader, "restart_service", json!({"service": "checkout"})).await;
    assert_eq!(e.code.0, -32602);
    assert_eq!(s.upstream.calls("restart_service"), 0);
    reader.cancel().await.ok();
    operator.cancel().await.ok();
    s.fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invented_and_hidden_tools_get_the_identical_answer() {
    let s = setup(options(true)).await;
    let token = common::sign(&common::claims("incident-investigator", &["sre"]));
    let client = connect_via(&s, Era::V2025_11_25, &token).await;
    client.list_all_tools().await.unwrap();
    let hidden = call_err(&client, "restart_service", json!({"service": "checkout"})).await;
    let invented = call_err(&client, "launch_missiles", json!({"service": "checkout"})).await;
    assert_eq!(hidden.code, invented.code);
    assert_eq!(hidden.code.0, -32602);
    assert_eq!(
        hidden.message.replace("restart_service", "X"),
        invented.message.replace("launch_missiles", "X")
    );
    assert_eq!(hidden.data, invented.data);
    assert_eq!(s.upstream.calls("restart_service"), 0);
    client.cancel().await.ok();
    s.fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_call_never_reaches_the_upstream() {
    let s = setup(options(true)).await;
    let client = connect_via(&s, Era::V2026_07_28, &common::token()).await;
    client.list_all_tools().await.unwrap();
    let e = call_err(
        &client,
        "rollback_deployment",
        json!({"deployment_id": "dep-1042", "reason": "bad deploy"}),
    )
    .await;
    assert_eq!(e.code.0, -31002, "{e:?}");
    assert_eq!(e.data.as_ref().unwrap()["stop_reason"], "approval_required");
    let e = call_err(
        &client,
        "rollback_deployment_unsafe",
        json!({"deployment_id": "dep-1042", "reason": "bad deploy"}),
    )
    .await;
    assert_eq!(e.code.0, -31002);
    assert_eq!(e.data.as_ref().unwrap()["risk"], "destructive");
    assert_eq!(s.upstream.calls("rollback_deployment"), 0);
    assert_eq!(s.upstream.calls("rollback_deployment_unsafe"), 0);
    client.cancel().await.ok();
    s.fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_failing_the_schema_never_reach_the_upstream() {
    let s = setup(options(true)).await;
    // 2025-11-25 and later (SEP-1303): a tool error the model can act on.
    let client = connect_via(&s, Era::V2026_07_28, &common::token()).await;
    client.list_all_tools().await.unwrap();
    for bad in [
        json!({"incident_id": 42}),
        json!({"incident_id": "INC-1001", "extra": true}),
    ] {
        let r = call(&client, "get_incident", bad).await;
        assert_eq!(r.is_error, Some(true), "{r:?}");
        let text = format!("{:?}", r.content);
        assert!(
            text.contains("Invalid arguments for tool get_incident"),
            "{r:?}"
        );
    }
    client.cancel().await.ok();
    // Earlier revisions: -32602.
    let client = connect_via(&s, Era::V2025_06_18, &common::token()).await;
    client.list_all_tools().await.unwrap();
    let e = call_err(&client, "get_incident", json!({"incident_id": 42})).await;
    assert_eq!(e.code.0, -32602);
    assert!(e.message.contains("Invalid arguments"), "{e:?}");
    assert_eq!(s.upstream.calls("get_incident"), 0);
    client.cancel().await.ok();
    s.fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn condition_on_arguments_denies_with_reason() {
    let s = setup(options(true)).await;
    let client = connect_via(&s, Era::V2025_11_25, &common::token()).await;
    client.list_all_tools().await.unwrap();
    let e = call_err(
        &client,
        "get_deployment",
        json!({"deployment_id": "prod-7"}),
    )
    .await;
    assert_eq!(e.code.0, -31001, "{e:?}");
    assert!(e.message.contains("dep-<number>"), "{e:?}");
    assert_eq!(s.upstream.calls("get_deployment"), 0);
    let ok = call(
        &client,
        "get_deployment",
        json!({"deployment_id": "dep-1042"}),
    )
    .await;
    assert!(ok.is_error != Some(true));
    assert_eq!(s.upstream.calls("get_deployment"), 1);
    client.cancel().await.ok();
    s.fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_sees_identity_from_the_token_only() {
    let s = setup(options(true)).await;
    let token = common::token();
    let mut config = StreamableHttpClientTransportConfig::with_uri(s.fw.mcp_url("incidents"));
    config.auth_header = Some(token.clone());
    config.custom_headers.insert(
        http::HeaderName::from_static("x-tenant-id"),
        http::HeaderValue::from_static("evil-corp"),
    );
    config.custom_headers.insert(
        http::HeaderName::from_static("x-tool-token"),
        http::HeaderValue::from_str(&token).unwrap(),
    );
    let client = connect_with(TestClient::new(Era::V2026_07_28), config).await;
    client.list_all_tools().await.unwrap();
    let seen = s.upstream.requests();
    assert!(!seen.is_empty());
    for h in &seen {
        assert!(h.get("authorization").is_none(), "client token forwarded");
        assert!(
            h.get("x-tool-token").is_none(),
            "tool-token header forwarded"
        );
        assert_eq!(
            h["x-tenant-id"], "acme",
            "spoofed identity header not overwritten"
        );
        assert_eq!(h["x-agent"], "sre-lead");
        assert!(h["x-run-id"].to_str().unwrap().starts_with("run-"));
    }
    client.cancel().await.ok();
    s.fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_stream_and_delete_pass_through() {
    let s = setup(options(false)).await;
    let tc = TestClient::new(Era::V2025_11_25);
    let client = connect_client_via(&s, tc.clone(), &common::token()).await;
    assert_eq!(client.list_all_tools().await.unwrap().len(), 14);
    // A server-initiated notification on the session's GET stream reaches the
    // client through the firewall.
    s.upstream
        .rename_tool("list_incidents", "list_open_incidents")
        .await
        .unwrap();
    tokio::time::timeout(WAIT, tc.0.list_changed.notified())
        .await
        .expect("list_changed relayed");
    let tools = client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "list_open_incidents"));
    let sessions_before = s.upstream.session_count();
    assert!(sessions_before >= 1);
    // Closing the client sends DELETE through the firewall.
    client.cancel().await.ok();
    let deadline = Instant::now() + WAIT;
    while s.upstream.session_count() >= sessions_before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        s.upstream.session_count() < sessions_before,
        "DELETE ended the session"
    );
    let methods: Vec<String> = s
        .upstream
        .recorded_requests()
        .iter()
        .map(|r| r.method.to_string())
        .collect();
    assert!(methods.iter().any(|m| m == "GET"), "{methods:?}");
    assert!(methods.iter().any(|m| m == "DELETE"), "{methods:?}");
    s.fw.stop().await;
}

/// A role that may write without approval, for server-to-client requests.
const WRITER: &str = r#"
[[agents]]
name = "scribe"
projects = ["sre"]
risks = ["read", "write"]
allow = [{ upstream = "incidents" }]
gates = { write = "allow" }
"#;

async fn record_finding(client: &Client) {
    call(
        client,
        "record_finding",
        json!({"incident_id": "INC-1001", "summary": "retries lack an idempotency key", "severity": "critical",
               "evidence": ["dep-1042 removes the idempotency-key header"]}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_and_elicitation_round_trip_through_the_firewall() {
    let dir = common::policy_dir(&[("90-scribe.toml", WRITER)]);
    for era in [Era::V2025_11_25, Era::V2026_07_28] {
        let s = setup_in(options(false), dir.path()).await;
        let tc = TestClient::new(era);
        let token = common::sign(&common::claims("scribe", &["sre"]));
        let client = connect_client_via(&s, tc.clone(), &token).await;
        client.list_all_tools().await.unwrap();
        record_finding(&client).await;
        let audit = call(&client, "audit_finding", json!({"finding_id": "F-1"})).await;
        assert_eq!(structured(&audit)["source"], "sampling", "{era:?}");
        assert_eq!(
            structured(&audit)["verdict"],
            "rejected",
            "{era:?}: the client's model answered"
        );
        assert_eq!(tc.0.samplings.load(std::sync::atomic::Ordering::SeqCst), 1);
        let note = call(
            &client,
            "post_incident_note",
            json!({"incident_id": "INC-1002", "note": "restarting search", "confirm": true}),
        )
        .await;
        assert!(note.is_error != Some(true), "{era:?}: {note:?}");
        assert_eq!(
            tc.0.elicitations.load(std::sync::atomic::Ordering::SeqCst),
            1
        );
        client.cancel().await.ok();
        s.fw.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_can_refuse_sampling_requests_from_an_upstream() {
    let no_sampling = "[server_requests]\nsampling = false\nelicitation = true\nroots = false\n";
    let dir = common::policy_dir(&[
        ("90-scribe.toml", WRITER),
        ("95-no-sampling.toml", no_sampling),
    ]);
    // Session era: the request is dropped and the upstream is answered with
    // an error in the client's place.
    let s = setup_in(options(false), dir.path()).await;
    let tc = TestClient::new(Era::V2025_11_25);
    let token = common::sign(&common::claims("scribe", &["sre"]));
    let client = connect_client_via(&s, tc.clone(), &token).await;
    client.list_all_tools().await.unwrap();
    record_finding(&client).await;
    let params = CallToolRequestParams::new("audit_finding")
        .with_arguments(args(json!({"finding_id": "F-1"})));
    let outcome = tokio::time::timeout(WAIT, client.call_tool(params))
        .await
        .expect("the call does not hang");
    assert_eq!(
        tc.0.samplings.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "sampling reached the client"
    );
    if let Ok(r) = outcome {
        assert_ne!(structured(&r)["source"], "sampling");
    }
    client.cancel().await.ok();
    s.fw.stop().await;

    // 2026-07-28: an input-required result asking for sampling becomes an error.
    let s = setup_in(options(false), dir.path()).await;
    let tc = TestClient::new(Era::V2026_07_28);
    let client = connect_client_via(&s, tc.clone(), &token).await;
    client.list_all_tools().await.unwrap();
    record_finding(&client).await;
    let e = call_err(&client, "audit_finding", json!({"finding_id": "F-1"})).await;
    assert_eq!(e.code.0, -31001, "{e:?}");
    assert!(e.message.contains("sampling/createMessage"), "{e:?}");
    assert_eq!(tc.0.samplings.load(std::sync::atomic::Ordering::SeqCst), 0);
    client.cancel().await.ok();
    s.fw.stop().await;
}

/// The firewall's own `tools/list` requests the upstream received (they
/// carry no run identity: the firewall asks as itself).
fn own_lists(s: &Setup) -> usize {
    s.upstream
        .recorded_requests()
        .iter()
        .filter(|r| r.method == http::Method::POST && !r.headers.contains_key("x-run-id"))
        .filter(|r| {
            r.headers
                .get("mcp-method")
                .is_some_and(|v| v == "tools/list")
                || r.headers.get("mcp-session-id").is_some()
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_before_any_list_is_decided_on_a_refilled_catalog() {
    // A fresh firewall has seen no tools/list (a restart, another replica):
    // the firewall lists the upstream's tools itself, then decides as usual.
    for era in [Era::V2025_11_25, Era::V2026_07_28] {
        let s = setup(options(true)).await;
        let client = connect_via(&s, era, &common::token()).await;
        let r = call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
        assert_ne!(r.is_error, Some(true), "{era:?}: {r:?}");
        assert_eq!(s.upstream.calls("get_incident"), 1, "{era:?}");
        let refills = own_lists(&s);
        assert!(
            refills >= 1,
            "{era:?}: the firewall listed the tools itself"
        );
        // The policy still decides on what was refilled: a destructive tool
        // waits for approval and never runs.
        let e = call_err(
            &client,
            "rollback_deployment",
            json!({"deployment_id": "dep-1042", "reason": "bad deploy"}),
        )
        .await;
        assert_eq!(e.code.0, -31002, "{era:?}: {e:?}");
        assert_eq!(s.upstream.calls("rollback_deployment"), 0);
        // Invented names stay unknown and cause no further listing within
        // the refill interval.
        for name in ["get_incidnet", "drop_all_tables"] {
            let e = call_err(&client, name, json!({})).await;
            assert_eq!(e.code.0, -32602, "{era:?} {name}: {e:?}");
        }
        assert_eq!(own_lists(&s), refills, "{era:?}: no refill storm");
        client.cancel().await.ok();
        s.fw.stop().await;
    }
}
