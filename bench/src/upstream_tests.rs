//! Tests of the canned upstream: every method and route, batches, the held
//! stream's timing.

use std::time::Instant;

use http_body_util::BodyExt;

use super::*;

fn answers(hold: Duration) -> Answers {
    Answers::new(&Catalog::new(100, 310).unwrap(), hold)
}

async fn text(r: Response<Parts>) -> (u16, String, String) {
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, ct, String::from_utf8(body.to_vec()).unwrap())
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap()
}

#[tokio::test]
async fn tools_list_answers_the_whole_catalog_with_the_request_id() {
    let a = answers(Duration::ZERO);
    let r = respond(
        &a,
        Route::Json,
        br#"{"jsonrpc":"2.0","id":"abc","method":"tools/list","params":{}}"#,
    );
    let (status, ct, body) = text(r).await;
    assert_eq!((status, ct.as_str()), (200, "application/json"));
    let v = json(&body);
    assert_eq!(v["id"], "abc");
    assert_eq!(v["result"]["tools"].as_array().unwrap().len(), 100);
}

#[tokio::test]
async fn tools_call_ping_and_unknown_methods() {
    let a = answers(Duration::ZERO);
    let call = json(
        &text(respond(
            &a,
            Route::Json,
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{}}}"#,
        ))
        .await
        .2,
    );
    assert_eq!(call["id"], 7);
    assert_eq!(call["result"]["isError"], false);
    let ping = json(
        &text(respond(
            &a,
            Route::Json,
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        ))
        .await
        .2,
    );
    assert_eq!(ping["result"], serde_json::json!({}));
    let unknown = json(
        &text(respond(
            &a,
            Route::Json,
            br#"{"jsonrpc":"2.0","id":2,"method":"resources/list"}"#,
        ))
        .await
        .2,
    );
    assert_eq!(unknown["error"]["code"], -32601);
    let (status, _, body) = text(respond(
        &a,
        Route::Json,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    ))
    .await;
    assert_eq!((status, body.as_str()), (202, ""));
    let bad = json(&text(respond(&a, Route::Json, b"{not json")).await.2);
    assert_eq!(bad["error"]["code"], -32700);
}

#[tokio::test]
async fn batches_answer_requests_in_order_and_skip_notifications() {
    let a = answers(Duration::ZERO);
    let body = br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":"b","method":"tools/call","params":{}}]"#;
    let v = json(&text(respond(&a, Route::Json, body)).await.2);
    let items = v.as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["id"], 1);
    assert_eq!(items[1]["id"], "b");
    assert!(items[1]["result"]["content"].is_array());
    let only_notes = br#"[{"jsonrpc":"2.0","method":"notifications/x"}]"#;
    assert_eq!(text(respond(&a, Route::Json, only_notes)).await.0, 202);
}

#[tokio::test]
async fn sse_route_sends_one_message_event() {
    let a = answers(Duration::ZERO);
    let (status, ct, body) = text(respond(
        &a,
        Route::Sse,
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{}}"#,
    ))
    .await;
    assert_eq!((status, ct.as_str()), (200, "text/event-stream"));
    let data = body
        .strip_prefix("event: message\ndata: ")
        .and_then(|d| d.strip_suffix("\n\n"))
        .unwrap();
    assert_eq!(json(data)["id"], 3);
}

#[tokio::test]
async fn hold_route_sends_a_comment_then_waits_before_the_result() {
    let hold = Duration::from_millis(150);
    let a = answers(hold);
    let r = respond(
        &a,
        Route::Hold,
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
    );
    assert!(r.body().size_hint().exact().is_none());
    let mut body = r.into_body();
    let start = Instant::now();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b": working\n\n");
    assert!(start.elapsed() < hold);
    let rest = body.collect().await.unwrap().to_bytes();
    assert!(start.elapsed() >= hold);
    assert!(std::str::from_utf8(&rest).unwrap().contains("\"result\""));
    // Only calls are held: a list on the hold route answers at once.
    let list = respond(
        &a,
        Route::Hold,
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    );
    assert!(list.body().size_hint().exact().is_some());
}

#[tokio::test]
async fn json_answers_carry_an_exact_length() {
    let a = answers(Duration::ZERO);
    let r = respond(
        &a,
        Route::Json,
        br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    );
    let exact = r.body().size_hint().exact().unwrap();
    let (_, _, body) = text(r).await;
    assert_eq!(exact, body.len() as u64);
}

#[tokio::test]
async fn the_fresh_route_never_answers_the_same_tools_list_twice() {
    let a = answers(Duration::ZERO);
    let list = br#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}"#;
    let (status, ct, first) = text(respond(&a, Route::Fresh, list)).await;
    assert_eq!((status, ct.as_str()), (200, "application/json"));
    let second = text(respond(&a, Route::Fresh, list)).await.2;
    assert_ne!(first, second);
    let (x, y) = (json(&first), json(&second));
    assert_eq!(x["id"], 3);
    let last = |v: &serde_json::Value| {
        let tools = v["result"]["tools"].as_array().unwrap().clone();
        tools.last().unwrap().clone()
    };
    assert_eq!(last(&x)["_meta"]["mcp-bench/listing"], 0);
    assert_eq!(last(&y)["_meta"]["mcp-bench/listing"], 1);
    // The tools are the JSON route's but for the last one's `_meta`.
    let plain = json(&text(respond(&a, Route::Json, list)).await.2);
    let mut fresh = x["result"]["tools"].clone();
    let n = fresh.as_array().unwrap().len();
    fresh[n - 1].as_object_mut().unwrap().remove("_meta");
    assert_eq!(fresh, plain["result"]["tools"]);
    assert_eq!(last(&plain).get("_meta"), None);
    // Other methods answer as on the JSON route.
    let call =
        br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","arguments":{}}}"#;
    assert_eq!(
        json(&text(respond(&a, Route::Fresh, call)).await.2)["result"]["isError"],
        false
    );
    let unknown = br#"{"jsonrpc":"2.0","id":5,"method":"nope"}"#;
    assert_eq!(
        json(&text(respond(&a, Route::Fresh, unknown)).await.2)["error"]["code"],
        -32601
    );
}
