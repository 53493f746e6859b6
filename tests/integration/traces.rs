//! OpenTelemetry traces: with `[telemetry.otlp]` the firewall sends spans to
//! an OTLP/HTTP receiver (a small one here): the request span is the child
//! of the agent's `traceparent` (from the header, or from `_meta`), each
//! decided message a child of the request span, and the upstream receives a
//! `traceparent` naming the firewall's span, so the trace runs from the
//! agent into the tool server. No argument value is in any span.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::raw;
use crate::common::{self, Firewall};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const AGENT_SPAN: &str = "00f067aa0ba902b7";

/// Every span the receiver got, flattened: (span, resource attributes).
fn spans(receiver: &raw::RawUpstream) -> Vec<Value> {
    receiver
        .seen()
        .iter()
        .filter(|s| s.uri.path() == "/v1/traces")
        .filter_map(|s| serde_json::from_slice::<Value>(&s.body).ok())
        .flat_map(|v| {
            v["resourceSpans"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .flat_map(|rs| {
                    rs["scopeSpans"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .flat_map(|ss| ss["spans"].as_array().cloned().unwrap_or_default())
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

async fn wait_spans(receiver: &raw::RawUpstream, trace: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s: Vec<Value> = spans(receiver)
            .into_iter()
            .filter(|s| s["traceId"].as_str() == Some(trace))
            .collect();
        if s.len() >= n {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{} spans of trace {trace}: {s:#?}",
            s.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn setup() -> (Firewall, raw::RawUpstream, raw::RawUpstream) {
    let receiver =
        raw::upstream(|_seen| async move { raw::full(200, "application/json", "{}") }).await;
    let upstream = raw::mcp().await;
    let text = common::TestConfig::new()
        .upstream("incidents", &upstream.url())
        .set(
            "telemetry.otlp.endpoint",
            format!("http://{}", receiver.addr),
        )
        .set("telemetry.otlp.export_interval_ms", 100)
        .text();
    (common::firewall(&text).await, upstream, receiver)
}

fn call_body(meta_traceparent: Option<&str>) -> String {
    let mut meta = serde_json::json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"});
    if let Some(tp) = meta_traceparent {
        meta["traceparent"] = Value::from(tp);
    }
    serde_json::json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "get_incident", "arguments": {"incident_id": "INC-SECRET-4711"}, "_meta": meta}})
    .to_string()
}

const MODERN: [(&str, &str); 3] = [
    ("mcp-protocol-version", "2026-07-28"),
    ("mcp-method", "tools/call"),
    ("mcp-name", "get_incident"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_runs_from_the_agent_through_the_firewall_into_the_upstream() {
    let (fw, upstream, receiver) = setup().await;
    let url = fw.mcp_url("incidents");
    let agent_tp = format!("00-{TRACE}-{AGENT_SPAN}-01");
    let mut headers = MODERN.to_vec();
    headers.push(("traceparent", &agent_tp));
    let a = common::post(&url, &common::token(), &headers, &call_body(None)).await;
    assert_eq!(a.status, 200, "{}", a.text);

    let spans = wait_spans(&receiver, TRACE, 2).await;
    let request = spans
        .iter()
        .find(|s| s["kind"] == 2 || s["kind"] == "SPAN_KIND_SERVER")
        .unwrap_or_else(|| panic!("a server span: {spans:#?}"));
    assert_eq!(
        request["parentSpanId"], AGENT_SPAN,
        "the agent's span is the parent"
    );
    let request_id = request["spanId"].as_str().unwrap().to_owned();
    let call = spans
        .iter()
        .find(|s| s["name"] == "tools/call get_incident")
        .unwrap_or_else(|| panic!("a span for the call: {spans:#?}"));
    assert_eq!(call["parentSpanId"], request_id.as_str());
    assert_eq!(
        attr(call, "mcp.tool").unwrap()["stringValue"],
        "get_incident"
    );
    assert_eq!(attr(call, "mcp.decision").unwrap()["stringValue"], "allow");
    assert_eq!(
        attr(call, "mcp.stop_reason").unwrap()["stringValue"],
        "done"
    );
    assert_eq!(
        attr(call, "mcp.upstream").unwrap()["stringValue"],
        "incidents"
    );
    // Never an argument value.
    let all: String = receiver
        .seen()
        .iter()
        .map(|s| String::from_utf8_lossy(&s.body).into_owned())
        .collect();
    assert!(
        !all.contains("INC-SECRET-4711"),
        "argument values stay out of spans"
    );
    assert!(all.contains("\"mcp-firewall\""), "service.name");

    // The upstream continues under the firewall's span.
    let seen = upstream
        .seen()
        .into_iter()
        .find(|s| s.rpc_method() == "tools/call")
        .expect("the call reached the upstream");
    let tp = seen.headers["traceparent"].to_str().unwrap().to_owned();
    assert_eq!(tp, format!("00-{TRACE}-{request_id}-01"));
    fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_traceparent_in_meta_starts_the_trace_when_no_header_does() {
    let (fw, upstream, receiver) = setup().await;
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let tp = format!("00-{trace}-b7ad6b7169203331-01");
    let a = common::post(
        &fw.mcp_url("incidents"),
        &common::token(),
        &MODERN,
        &call_body(Some(&tp)),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let spans = wait_spans(&receiver, trace, 2).await;
    assert!(
        spans
            .iter()
            .any(|s| s["parentSpanId"] == "b7ad6b7169203331"),
        "{spans:#?}"
    );
    let seen = upstream
        .seen()
        .into_iter()
        .find(|s| s.rpc_method() == "tools/call")
        .unwrap();
    assert!(seen.headers["traceparent"]
        .to_str()
        .unwrap()
        .starts_with(&format!("00-{trace}-")));
    // A malformed traceparent starts a trace of the firewall's own.
    let a = common::post(
        &fw.mcp_url("incidents"),
        &common::token(),
        &[
            MODERN[0],
            MODERN[1],
            MODERN[2],
            ("traceparent", "00-zz-00-01"),
        ],
        &call_body(None),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    fw.stop().await;
}
