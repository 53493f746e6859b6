use super::*;

fn sent(content_type: &str, body: &str, status: u16) -> Sent {
    Sent {
        status,
        version: "HTTP/1.1".into(),
        session: None,
        content_type: content_type.into(),
        body: body.as_bytes().to_vec(),
    }
}

#[test]
fn answers_are_found_in_json_batches_and_sse() {
    let json = sent(
        "application/json",
        r#"{"jsonrpc":"2.0","id":7,"result":{}}"#,
        200,
    );
    assert!(find_response(&json, 7).is_some());
    assert!(find_response(&json, 8).is_none());
    let batch = sent(
        "application/json",
        r#"[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","id":2,"error":{"code":-1,"message":"x"}}]"#,
        200,
    );
    assert!(find_response(&batch, 2).unwrap().get("error").is_some());
    let sse = sent(
        "text/event-stream",
        "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\nid: e2\ndata: {\"jsonrpc\":\"2.0\",\"id\":9,\ndata: \"result\":{\"content\":[]}}\n\n",
        200,
    );
    let m = find_response(&sse, 9).expect("the response after a notification");
    assert!(m.get("result").is_some());
}

#[test]
fn refusals_tool_errors_and_failures_are_told_apart() {
    let c = |v: Value| classify(&v);
    assert_eq!(c(json!({"result": {"content": []}})).category, Category::Ok);
    let skipped =
        c(json!({"result": {"structuredContent": {"skipped": true, "stop_reason": "step_cap"}}}));
    assert_eq!(
        (skipped.label.as_str(), skipped.category),
        ("step_cap", Category::Refused)
    );
    let limited = c(json!({"error": {"code": -31003, "data": {"stop_reason": "rate_limited"}}}));
    assert_eq!(
        (limited.label.as_str(), limited.category),
        ("rate_limited", Category::Refused)
    );
    assert_eq!(
        c(json!({"result": {"isError": true}})).category,
        Category::ToolError
    );
    let rpc = c(json!({"error": {"code": -32602, "message": "Unknown tool"}}));
    assert_eq!(
        (rpc.label.as_str(), rpc.category),
        ("rpc -32602", Category::Error)
    );
    assert_eq!(http_outcome(401, b"").category, Category::Refused);
    assert_eq!(http_outcome(429, b"").category, Category::Refused);
    assert_eq!(http_outcome(503, b"").category, Category::Error);
    assert_eq!(http_outcome(502, b"gateway").label, "http 502");
}

#[test]
fn arguments_fill_what_the_schema_requires() {
    let tool = ToolInfo {
        name: "t".into(),
        schema: json!({"type": "object", "required": ["a", "b", "c", "d", "given"], "properties": {
            "a": {"type": "string", "enum": ["x", "y"]},
            "b": {"type": ["integer", "null"], "minimum": 3},
            "c": {"type": "boolean"},
            "d": {"type": "string", "default": "dflt"},
            "e": {"type": "string"},
            "h": {"type": "string", "x-mcp-header": "Region"}}}),
    };
    let mut given = Map::new();
    given.insert("given".into(), json!(1));
    let args = tool.arguments(given);
    assert_eq!(
        args,
        json!({"a": "x", "b": 3, "c": false, "d": "dflt", "given": 1})
    );
    assert_eq!(
        tool.header_params(),
        vec![("h".to_owned(), "mcp-param-region".to_owned())]
    );
}

#[test]
fn header_values_use_base64_when_not_plain_ascii() {
    assert_eq!(header_text("eu-west-1"), "eu-west-1");
    assert_eq!(header_text("Zürich"), "=?base64?WsO8cmljaA==?=");
    assert!(header_text(" padded").starts_with("=?base64?"));
}
