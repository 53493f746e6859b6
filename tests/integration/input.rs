//! Bad input of every kind gets a precise error and never reaches the upstream.

use serde_json::Value;

use crate::common::{self, raw};

/// A firewall in front of an upstream that answers everything with an empty
/// result, so any request that reaches it is visible in `hits()`.
async fn setup() -> (common::Firewall, raw::RawUpstream) {
    let up =
        raw::upstream(|seen| async move { raw::result_for(&seen, serde_json::json!({})) }).await;
    let fw = common::firewall(&common::TestConfig::new().upstream("u", &up.url()).text()).await;
    (fw, up)
}

async fn rejected(body: &[u8], headers: &[(&str, &str)]) -> (u16, Value) {
    let (fw, up) = setup().await;
    let mut req = common::http()
        .post(fw.mcp_url("u"))
        .bearer_auth(common::token())
        .header("accept", "application/json, text/event-stream")
        .body(body.to_vec());
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        req = req.header("content-type", "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let json: Value =
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("error body is not JSON: {text}"));
    assert_eq!(
        up.hits(),
        0,
        "the upstream must see nothing of a refused request"
    );
    fw.stop().await;
    (status, json)
}

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("no error code in {v}"))
}

fn message(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn malformed_json_is_parse_error() {
    let (status, v) = rejected(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#, &[]).await;
    assert_eq!(status, 400);
    assert_eq!(code(&v), -32700);
}

#[tokio::test]
async fn not_jsonrpc_is_invalid_request() {
    let (status, v) = rejected(br#"{"id":1,"method":"tools/list"}"#, &[]).await;
    assert_eq!(status, 400);
    assert_eq!(code(&v), -32600);
    assert!(message(&v).contains("jsonrpc"), "{v}");
}

#[tokio::test]
async fn duplicate_key_is_rejected() {
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_incident","name":"restart_service","arguments":{}}}"#;
    let (status, v) = rejected(body, &[]).await;
    assert_eq!(status, 400);
    assert!(message(&v).contains("duplicate"), "{v}");
}

#[tokio::test]
async fn duplicate_key_in_nested_arguments_is_rejected() {
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_incident","arguments":{"a":{"b":1,"b":2}}}}"#;
    let (status, v) = rejected(body, &[]).await;
    assert_eq!(status, 400);
    assert!(message(&v).contains("duplicate"), "{v}");
}

#[tokio::test]
async fn oversized_body_is_413() {
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"x","arguments":{{"blob":"{}"}}}}}}"#,
        "a".repeat(1024 * 1024 + 10)
    );
    let (status, v) = rejected(big.as_bytes(), &[]).await;
    assert_eq!(status, 413);
    assert!(message(&v).contains("larger than"), "{v}");
}

#[tokio::test]
async fn wrong_content_type_is_415() {
    let (status, v) = rejected(
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        &[("content-type", "text/plain")],
    )
    .await;
    assert_eq!(status, 415);
    assert!(message(&v).contains("application/json"), "{v}");
}

#[tokio::test]
async fn empty_batch_is_rejected() {
    let (status, v) = rejected(b"[]", &[]).await;
    assert_eq!(status, 400);
    assert_eq!(code(&v), -32600);
}

#[tokio::test]
async fn too_deep_nesting_is_rejected() {
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"x","arguments":{{"a":{}1{}}}}}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let (status, v) = rejected(deep.as_bytes(), &[]).await;
    assert_eq!(status, 400);
    assert_eq!(code(&v), -32700, "{v}");
}

#[tokio::test]
async fn invalid_utf8_is_rejected() {
    let mut body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"#.to_vec();
    body.extend_from_slice(&[0xff, 0xfe]);
    body.extend_from_slice(br#""}}"#);
    let (status, v) = rejected(&body, &[]).await;
    assert_eq!(status, 400);
    assert_eq!(code(&v), -32700);
}

#[tokio::test]
async fn batch_in_a_revision_without_batches_is_rejected() {
    let body = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"tools/list"}]"#;
    let (status, v) = rejected(body, &[("mcp-protocol-version", "2025-06-18")]).await;
    assert_eq!(status, 400);
    assert!(message(&v).contains("batches are not allowed"), "{v}");
}

#[tokio::test]
async fn null_id_is_rejected() {
    let (status, v) = rejected(br#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#, &[]).await;
    assert_eq!(status, 400);
    assert_eq!(code(&v), -32600);
}

#[tokio::test]
async fn tools_call_without_name_is_invalid_params() {
    let (status, v) = rejected(
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#,
        &[],
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(code(&v), -32602);
}

#[tokio::test]
async fn invisible_characters_in_tool_name_are_rejected() {
    let body = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"get_\u{200b}incident\"}}";
    let (status, v) = rejected(body.as_bytes(), &[]).await;
    assert_eq!(status, 400);
    assert_eq!(code(&v), -32602, "{v}");
}

#[tokio::test]
async fn lone_surrogate_is_rejected() {
    let (status, v) = rejected(
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\ud800"}}"#,
        &[],
    )
    .await;
    assert_eq!(status, 400);
    assert!(code(&v) == -32700 || code(&v) == -32602, "{v}");
}

#[tokio::test]
async fn unknown_upstream_is_404_with_json_body() {
    let (fw, up) = setup().await;
    let resp = common::post_json(
        &fw.mcp_url("nope"),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    )
    .await;
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"], "unknown_upstream");
    assert_eq!(up.hits(), 0);
    fw.stop().await;
}

#[tokio::test]
async fn other_methods_are_405() {
    let (fw, up) = setup().await;
    let resp = common::http()
        .put(fw.mcp_url("u"))
        .bearer_auth(common::token())
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(up.hits(), 0);
    fw.stop().await;
}
