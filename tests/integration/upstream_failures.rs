//! Upstream failures become JSON-RPC errors naming the upstream and the cause;
//! header hygiene on the way up; SSE relayed event by event.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::common::{self, raw};

/// A request the firewall forwards without inspecting its answer.
const CALL: &str = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;

async fn error_of(resp: reqwest::Response) -> Value {
    assert_eq!(resp.status(), 200, "upstream failures are JSON-RPC answers");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["id"], 7, "{v}");
    assert_eq!(v["error"]["code"], -31004, "{v}");
    assert_eq!(v["error"]["data"]["upstream"], "u", "{v}");
    v
}

#[tokio::test]
async fn refused_connection_names_upstream_and_cause() {
    // A port nothing listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", l.local_addr().unwrap());
    drop(l);
    let fw = common::firewall(&common::TestConfig::new().upstream("u", &url).text()).await;
    let v = error_of(common::post_json(&fw.mcp_url("u"), CALL).await).await;
    assert!(
        v["error"]["data"]["cause"]
            .as_str()
            .unwrap()
            .contains("cannot connect"),
        "{v}"
    );
    fw.stop().await;
}

#[tokio::test]
async fn upstream_5xx_becomes_jsonrpc_error() {
    let up = raw::upstream(|_| async { raw::full(503, "text/plain", "overloaded") }).await;
    let fw = common::firewall(&common::TestConfig::new().upstream("u", &up.url()).text()).await;
    let v = error_of(common::post_json(&fw.mcp_url("u"), CALL).await).await;
    assert!(
        v["error"]["data"]["cause"]
            .as_str()
            .unwrap()
            .contains("HTTP 503"),
        "{v}"
    );
    fw.stop().await;
}

#[tokio::test]
async fn upstream_timeout_becomes_jsonrpc_error() {
    let up = raw::upstream(|seen| async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        raw::result_for(&seen, json!({}))
    })
    .await;
    let text = common::TestConfig::new()
        .upstream("u", &up.url())
        .upstream_set("u", "request_timeout_ms", 300)
        .text();
    let fw = common::firewall(&text).await;
    let started = Instant::now();
    let v = error_of(common::post_json(&fw.mcp_url("u"), CALL).await).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        v["error"]["data"]["cause"]
            .as_str()
            .unwrap()
            .contains("no response within 300 ms"),
        "{v}"
    );
    fw.stop().await;
}

#[tokio::test]
async fn reset_mid_stream_ends_sse_with_error_event() {
    let up = raw::upstream(|_| async {
        raw::sse(
            vec![Bytes::from_static(
                b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n",
            )],
            Duration::from_millis(10),
            true,
        )
    })
    .await;
    let fw = common::firewall(&common::TestConfig::new().upstream("u", &up.url()).text()).await;
    let resp = common::post_json(&fw.mcp_url("u"), CALL).await;
    assert_eq!(resp.status(), 200);
    let text = resp
        .text()
        .await
        .expect("the stream ends cleanly for the client");
    assert!(text.contains("notifications/progress"), "{text}");
    let last = text
        .split("\n\n")
        .filter(|e| e.contains("data:"))
        .last()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap();
    let v: Value = serde_json::from_str(last).unwrap();
    assert_eq!(v["id"], 7);
    assert_eq!(v["error"]["code"], -31004);
    assert!(
        v["error"]["data"]["cause"]
            .as_str()
            .unwrap()
            .contains("reset"),
        "{v}"
    );
    fw.stop().await;
}

#[tokio::test]
async fn sse_events_are_relayed_as_they_arrive() {
    let up = raw::upstream(|_| async {
        raw::sse(
            vec![
                Bytes::from_static(b"id: e1\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n"),
                Bytes::from_static(b"id: e2\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[]}}\n\n"),
            ],
            Duration::from_millis(400),
            false,
        )
    })
    .await;
    let fw = common::firewall(&common::TestConfig::new().upstream("u", &up.url()).text()).await;
    let started = Instant::now();
    let resp = common::post_json(&fw.mcp_url("u"), CALL).await;
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    let mut progress_at = None;
    while let Some(chunk) = stream.next().await {
        seen.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        if progress_at.is_none() && seen.contains("notifications/progress") {
            progress_at = Some(started.elapsed());
        }
    }
    let total = started.elapsed();
    let progress_at = progress_at.expect("progress relayed");
    assert!(total >= Duration::from_millis(400));
    assert!(
        progress_at + Duration::from_millis(300) < total,
        "progress at {progress_at:?}, end at {total:?}"
    );
    // Event ids reach the client sealed (bound to its principal and
    // session), never as the upstream wrote them.
    let ids: Vec<&str> = seen
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .collect();
    assert!(ids.len() >= 2, "event ids are kept: {seen}");
    assert!(ids.iter().all(|id| id.starts_with("e1.")), "{seen}");
    assert!(!seen.contains("id: e2\n"), "{seen}");
    fw.stop().await;
}

#[tokio::test]
async fn client_credentials_and_hop_by_hop_headers_never_reach_the_upstream() {
    let up = raw::upstream(|seen| async move { raw::result_for(&seen, json!({})) }).await;
    let fw = common::firewall(&common::TestConfig::new().upstream("u", &up.url()).text()).await;
    let resp = common::http()
        .post(fw.mcp_url("u"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {}", common::token()))
        .header("x-forwarded-for", "6.6.6.6")
        .header("connection", "x-private, keep-alive")
        .header("x-private", "hop")
        .header("cookie", "session=secret")
        .header("x-api-key", "client-key")
        .header("x-forwarded-user", "admin")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert!(
        h.get("authorization").is_none(),
        "client Authorization leaked upstream"
    );
    assert!(
        h.get("x-private").is_none(),
        "Connection-listed header leaked upstream"
    );
    assert_eq!(
        h["x-forwarded-for"], "127.0.0.1",
        "client-supplied X-Forwarded-For must be replaced"
    );
    assert_eq!(h["x-forwarded-proto"], "http");
    for leaked in ["cookie", "x-api-key", "x-forwarded-user", "connection"] {
        assert!(h.get(leaked).is_none(), "{leaked} leaked upstream");
    }
    assert_eq!(h["accept-encoding"], "identity");
    fw.stop().await;
}

#[tokio::test]
async fn injected_credentials_reach_the_upstream() {
    let up = raw::upstream(|seen| async move { raw::result_for(&seen, json!({})) }).await;
    let cfg = common::TestConfig::new()
        .upstream("u", &up.url())
        .upstream_set(
            "u",
            "headers",
            common::table([(
                "X-Api-Key",
                toml::Value::Table(common::table([("value", "vendor-key".into())])),
            )]),
        );
    let fw = common::firewall(&cfg.text()).await;
    let resp = common::post_json(
        &fw.mcp_url("u"),
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(up.seen()[0].headers["x-api-key"], "vendor-key");
    fw.stop().await;
}

#[tokio::test]
async fn notification_gets_upstreams_202() {
    let up = raw::upstream(|_| async {
        let mut r = raw::full(202, "text/plain", "");
        r.headers_mut().remove("content-type");
        r
    })
    .await;
    let fw = common::firewall(&common::TestConfig::new().upstream("u", &up.url()).text()).await;
    let resp = common::post_json(
        &fw.mcp_url("u"),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    assert_eq!(resp.status(), 202);
    assert_eq!(up.hits(), 1);
    fw.stop().await;
}

#[tokio::test]
async fn unreadable_tool_list_is_an_error_not_an_unfiltered_list() {
    // `tools` is not an array: the firewall cannot filter it, so it must not pass.
    let up =
        raw::upstream(
            |seen| async move { raw::result_for(&seen, json!({"tools": {"name": "rm_rf"}})) },
        )
        .await;
    let fw = common::firewall(&common::TestConfig::new().upstream("u", &up.url()).text()).await;
    let resp = common::post_json(
        &fw.mcp_url("u"),
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#,
    )
    .await;
    let v = error_of(resp).await;
    assert!(!v.to_string().contains("rm_rf"), "{v}");
    fw.stop().await;
}
