//! JSON-RPC batches (2025-03-26): every element is decided on its own, a
//! denied element never travels upstream, and the answers are merged.

use serde_json::{json, Value};

use crate::common::{self, raw};

/// An upstream that lists two tools and answers batches element by element.
async fn batch_upstream() -> raw::RawUpstream {
    raw::upstream(|seen| async move {
        let body: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
        let answer = |req: &Value| -> Option<Value> {
            let id = req.get("id")?;
            let result = match req["method"].as_str() {
                Some("tools/list") => json!({"tools": [
                    {"name": "get_incident", "inputSchema": {"type": "object", "properties": {"incident_id": {"type": "string"}}}},
                    {"name": "restart_service", "inputSchema": {"type": "object"}},
                ]}),
                Some("tools/call") => json!({"content": [{"type": "text", "text": format!("ran {}", req["params"]["name"])}]}),
                _ => json!({}),
            };
            Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
        };
        match &body {
            Value::Array(items) => {
                let answers: Vec<Value> = items.iter().filter_map(answer).collect();
                if answers.is_empty() {
                    let mut r = raw::full(202, "application/json", "");
                    r.headers_mut().remove("content-type");
                    r
                } else {
                    raw::full(200, "application/json", Value::Array(answers).to_string())
                }
            }
            one => raw::full(200, "application/json", answer(one).unwrap_or(json!({})).to_string()),
        }
    })
    .await
}

async fn post(fw: &common::Firewall, token: &str, body: &str) -> reqwest::Response {
    common::http()
        .post(fw.mcp_url("incidents"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-03-26")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn batch_mixing_allowed_and_denied_calls() {
    let up = batch_upstream().await;
    let fw = common::firewall(
        &common::TestConfig::new()
            .upstream("incidents", &up.url())
            .text(),
    )
    .await;
    let token = common::sign(&common::claims("incident-investigator", &["sre"]));
    // The firewall learns the upstream's tools from a listing.
    let list: Value = post(
        &fw,
        &token,
        r#"{"jsonrpc":"2.0","id":"l","method":"tools/list"}"#,
    )
    .await
    .json()
    .await
    .unwrap();
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["get_incident"],
        "the investigator never sees restart_service"
    );

    let batch = r#"[
        {"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_incident","arguments":{"incident_id":"INC-1"}}},
        {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"restart_service","arguments":{}}},
        {"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"invented","arguments":{}}},
        {"jsonrpc":"2.0","method":"notifications/initialized"}
    ]"#;
    let resp = post(&fw, &token, batch).await;
    assert_eq!(resp.status(), 200);
    let answers: Vec<Value> = resp.json().await.unwrap();
    let by_id = |id: i64| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("answer {id} in {answers:?}"))
    };
    assert_eq!(
        by_id(1)["result"]["content"][0]["text"],
        "ran \"get_incident\""
    );
    assert_eq!(by_id(2)["error"]["code"], -32602);
    assert_eq!(by_id(3)["error"]["code"], -32602);
    assert_eq!(
        by_id(2)["error"]["message"]
            .as_str()
            .unwrap()
            .replace("restart_service", "X"),
        by_id(3)["error"]["message"]
            .as_str()
            .unwrap()
            .replace("invented", "X")
    );
    assert_eq!(answers.len(), 3);

    // The upstream saw only the allowed elements.
    let seen = up.seen();
    let forwarded: Value = serde_json::from_slice(&seen.last().unwrap().body).unwrap();
    let forwarded = forwarded.as_array().expect("still a batch");
    assert_eq!(forwarded.len(), 2);
    assert_eq!(forwarded[0]["params"]["name"], "get_incident");
    assert_eq!(forwarded[1]["method"], "notifications/initialized");
    assert!(!String::from_utf8_lossy(&seen.last().unwrap().body).contains("restart_service"));
    fw.stop().await;
}

#[tokio::test]
async fn batch_of_only_denied_calls_never_reaches_the_upstream() {
    let up = batch_upstream().await;
    let fw = common::firewall(
        &common::TestConfig::new()
            .upstream("incidents", &up.url())
            .text(),
    )
    .await;
    let token = common::sign(&common::claims("incident-investigator", &["sre"]));
    post(
        &fw,
        &token,
        r#"{"jsonrpc":"2.0","id":"l","method":"tools/list"}"#,
    )
    .await;
    let hits = up.hits();
    let resp = post(
        &fw,
        &token,
        r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"restart_service"}},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}}]"#,
    )
    .await;
    let answers: Vec<Value> = resp.json().await.unwrap();
    assert_eq!(answers.len(), 2);
    assert!(answers.iter().all(|a| a["error"]["code"] == -32602));
    // No element reached the upstream. The unknown name "x" may make the
    // firewall list the upstream's tools itself (a catalog refill); that is
    // all the upstream may have seen.
    for r in &up.seen()[hits..] {
        let body = String::from_utf8_lossy(&r.body);
        assert!(!body.contains("tools/call"), "{body}");
        assert!(
            body.is_empty() || body.contains("tools/list") || body.contains("initialize"),
            "{body}"
        );
    }
    fw.stop().await;
}

#[tokio::test]
async fn allowed_notifications_with_denied_calls_merge_with_202() {
    let up = batch_upstream().await;
    let fw = common::firewall(
        &common::TestConfig::new()
            .upstream("incidents", &up.url())
            .text(),
    )
    .await;
    let token = common::sign(&common::claims("incident-investigator", &["sre"]));
    post(
        &fw,
        &token,
        r#"{"jsonrpc":"2.0","id":"l","method":"tools/list"}"#,
    )
    .await;
    let resp = post(
        &fw,
        &token,
        r#"[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"restart_service"}}]"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let answers: Vec<Value> = resp.json().await.unwrap();
    assert_eq!(answers, vec![answers[0].clone()]);
    assert_eq!(answers[0]["id"], 9);
    fw.stop().await;
}
