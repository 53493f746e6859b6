use super::*;

fn ok(body: &str) -> Envelope {
    match parse(body.as_bytes(), &Limits::default()) {
        Ok(env) => env,
        Err(e) => panic!("expected {body} to parse, got {e}"),
    }
}

fn err(body: &[u8]) -> ParseError {
    match parse(body, &Limits::default()) {
        Ok(env) => panic!("expected an error, parsed {env:?}"),
        Err(e) => e,
    }
}

fn one(body: &str) -> Message {
    let mut env = ok(body);
    assert!(!env.batch);
    assert_eq!(env.messages.len(), 1);
    env.messages.remove(0)
}

const CALL: &str = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_weather","arguments":{"city":"Paris","days":3},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","progressToken":"t1"}}}"#;

#[test]
fn tools_call_request_is_fully_extracted() {
    let m = one(CALL);
    assert_eq!(m.kind, Kind::Request);
    assert_eq!(m.id, Some(Id::Number(7)));
    assert_eq!(m.method.as_deref(), Some("tools/call"));
    assert_eq!(m.name.as_deref(), Some("get_weather"));
    assert_eq!(m.span, 0..CALL.len());
    assert!(!m.is_error);
    let call = m.call.as_ref().expect("tools/call sets call");
    assert_eq!(call.name, "get_weather");
    assert_eq!(
        call.arguments.as_ref().map(|a| a.get()),
        Some(r#"{"city":"Paris","days":3}"#)
    );
    assert!(m
        .meta
        .as_ref()
        .is_some_and(|meta| meta.get().contains("progressToken")));
    assert!(m
        .params
        .as_ref()
        .is_some_and(|p| p.get().starts_with(r#"{"name":"get_weather""#)));
    assert_eq!(m.protocol_version().as_deref(), Some("2026-07-28"));
}

#[test]
fn notification_response_and_error_response_are_classified() {
    let n = one(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    assert_eq!((n.kind, n.id), (Kind::Notification, None));
    let r = one(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#);
    assert_eq!(r.kind, Kind::Response);
    assert_eq!(r.id, Some(Id::String("a".into())));
    assert!(!r.is_error);
    assert_eq!(r.method, None);
    let e = one(r#"{"jsonrpc":"2.0","id":-3,"error":{"code":-32601,"message":"nope","data":[1]}}"#);
    assert_eq!((e.kind, e.is_error), (Kind::Response, true));
    assert_eq!(e.id, Some(Id::Number(-3)));
}

#[test]
fn name_is_mirrored_from_uri_and_task_id() {
    let m =
        one(r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a b"}}"#);
    assert_eq!(m.name.as_deref(), Some("file:///a b"));
    assert!(m.call.is_none());
    let t = one(r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"t-9"}}"#);
    assert_eq!(t.name.as_deref(), Some("t-9"));
    let l = one(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"name":"x"}}"#);
    assert_eq!(l.name, None, "tools/list has no Mcp-Name source");
}

#[test]
fn escaped_strings_are_unescaped_in_the_model() {
    let m = one(
        r#"{"jsonrpc":"2\u002e0","id":"\u0031","method":"tools\/call","params":{"name":"caf\u00e9"}}"#,
    );
    assert_eq!(m.id, Some(Id::String("1".into())));
    assert_eq!(m.method.as_deref(), Some("tools/call"));
    assert_eq!(m.name.as_deref(), Some("café"));
}

#[test]
fn surrounding_whitespace_is_outside_the_span() {
    let body = " \n\t{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\r\n ";
    let m = one(body);
    assert_eq!(
        &body[m.span.clone()],
        "{\"jsonrpc\":\"2.0\",\"method\":\"x\"}"
    );
}

#[test]
fn batch_spans_splice_back_byte_for_byte() {
    let a = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let b = r#"{ "jsonrpc" : "2.0", "method" : "notifications/x" }"#;
    let c = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t"}}"#;
    let body = format!("[ {a},\n{b} , {c}]");
    let env = ok(&body);
    assert!(env.batch);
    let spans: Vec<_> = env.messages.iter().map(|m| m.span.clone()).collect();
    assert_eq!(&body[spans[0].clone()], a);
    assert_eq!(&body[spans[1].clone()], b);
    assert_eq!(&body[spans[2].clone()], c);
    let spliced = splice_batch(body.as_bytes(), [&spans[0], &spans[2]]);
    assert_eq!(&spliced[..], format!("[{a},{c}]").as_bytes());
    let reparsed = parse(&spliced, &Limits::default()).expect("spliced batch parses");
    assert_eq!(reparsed.messages.len(), 2);
    assert_eq!(&splice_batch(body.as_bytes(), []), &b"[]"[..]);
}

#[test]
fn single_element_batch_is_still_a_batch() {
    let env = ok(r#"[{"jsonrpc":"2.0","method":"a"}]"#);
    assert!(env.batch);
    assert_eq!(env.messages.len(), 1);
}

#[test]
fn invalid_utf8_reports_the_byte_offset() {
    let e = err(b"{\"jsonrpc\":\"2.0\",\"method\":\"\xff\"}");
    assert!(matches!(e, ParseError::InvalidUtf8 { offset: 27 }), "{e:?}");
    assert_eq!(e.code(), PARSE_ERROR);
    assert_eq!(e.to_string(), "body is not valid UTF-8 at byte offset 27");
}

#[test]
fn syntax_error_reports_line_and_column() {
    let e = err(b"{\"jsonrpc\":\"2.0\",\n\"method\": x}");
    match &e {
        ParseError::Syntax { line, column, .. } => assert_eq!((*line, *column), (2, 11)),
        other => panic!("expected Syntax, got {other:?}"),
    }
    assert_eq!(e.code(), PARSE_ERROR);
    assert!(e.to_string().contains("line 2 column 11"), "{e}");
}

#[test]
fn empty_and_truncated_bodies_are_parse_errors() {
    assert_eq!(err(b"").code(), PARSE_ERROR);
    assert_eq!(err(b"   ").code(), PARSE_ERROR);
    assert_eq!(err(b"{\"jsonrpc\":\"2.0\"").code(), PARSE_ERROR);
}

#[test]
fn trailing_garbage_is_rejected() {
    let e = err(br#"{"jsonrpc":"2.0","method":"a"} x"#);
    assert!(
        matches!(
            e,
            ParseError::TrailingCharacters {
                line: 1,
                column: 32
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.code(), PARSE_ERROR);
    // A second top-level value is trailing garbage too.
    let e = err(br#"{"jsonrpc":"2.0","method":"a"}{"jsonrpc":"2.0","method":"b"}"#);
    assert!(matches!(e, ParseError::TrailingCharacters { .. }), "{e:?}");
}

#[test]
fn duplicate_key_at_top_level_is_rejected() {
    let e = err(br#"{"jsonrpc":"2.0","method":"a","method":"b"}"#);
    assert_eq!(e.to_string(), r#"duplicate key "method" at $"#);
    assert_eq!(e.code(), PARSE_ERROR);
}

#[test]
fn duplicate_key_in_params_is_rejected() {
    let e = err(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"safe","name":"rm_rf"}}"#);
    assert_eq!(e.to_string(), r#"duplicate key "name" at $.params"#);
}

#[test]
fn duplicate_key_deep_inside_arguments_is_rejected_with_its_path() {
    let e = err(
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"list":[1,{"a b":{"x":1,"x":2}}]}}}"#,
    );
    assert_eq!(
        e.to_string(),
        r#"duplicate key "x" at $.params.arguments.list[1]["a b"]"#
    );
    match e {
        ParseError::DuplicateKey { key, path } => {
            assert_eq!(key, "x");
            assert_eq!(path.0.len(), 5);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn escaped_and_plain_spellings_of_a_key_are_duplicates() {
    let e = err(br#"{"jsonrpc":"2.0","method":"a","params":{"a":1,"\u0061":2}}"#);
    assert!(
        matches!(&e, ParseError::DuplicateKey { key, .. } if key == "a"),
        "{e:?}"
    );
    let e = err(br#"{"jsonrpc":"2.0","method":"a","params":{"\u00e9":1,"\u00E9":2}}"#);
    assert!(matches!(e, ParseError::DuplicateKey { .. }), "{e:?}");
}

#[test]
fn same_key_in_sibling_objects_is_not_a_duplicate() {
    let m = one(
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":{"k":1},"b":{"k":2},"c":[{"k":3},{"k":4}]}}"#,
    );
    assert_eq!(m.kind, Kind::Request);
}

#[test]
fn duplicate_detection_holds_in_objects_with_many_keys() {
    let mut keys: Vec<String> = (0..200).map(|i| format!("\"k{i}\":{i}")).collect();
    let body = format!(
        r#"{{"jsonrpc":"2.0","method":"m","params":{{{}}}}}"#,
        keys.join(",")
    );
    assert_eq!(ok(&body).messages.len(), 1);
    keys.push("\"k3\":0".into());
    let body = format!(
        r#"{{"jsonrpc":"2.0","method":"m","params":{{{}}}}}"#,
        keys.join(",")
    );
    let e = err(body.as_bytes());
    assert_eq!(e.to_string(), r#"duplicate key "k3" at $.params"#);
    // A duplicate just past the switch to hashing is still found.
    let mut keys: Vec<String> = (0..tape::LINEAR_KEY_SCAN_MAX + 1)
        .map(|i| format!("\"k{i}\":{i}"))
        .collect();
    keys.push("\"k0\":0".into());
    let body = format!(
        r#"{{"jsonrpc":"2.0","method":"m","params":{{{}}}}}"#,
        keys.join(",")
    );
    assert!(matches!(
        err(body.as_bytes()),
        ParseError::DuplicateKey { .. }
    ));
}

#[test]
fn keys_of_a_large_object_do_not_leak_into_its_parent() {
    // The parent's "z" must not collide with a "z" inside a hashed child.
    let inner: Vec<String> = (0..40).map(|i| format!("\"k{i}\":{i}")).collect();
    let body = format!(
        r#"{{"jsonrpc":"2.0","method":"m","params":{{"a":{{{},"z":1}},"z":2}}}}"#,
        inner.join(",")
    );
    assert_eq!(ok(&body).messages.len(), 1);
}

#[test]
fn nesting_beyond_the_limit_is_rejected() {
    let limits = Limits {
        max_depth: 4,
        max_batch: 64,
    };
    let fits = br#"{"jsonrpc":"2.0","method":"m","params":{"a":[{"b":1}]}}"#;
    assert!(parse(fits, &limits).is_ok());
    let deep = br#"{"jsonrpc":"2.0","method":"m","params":{"a":[{"b":[1]}]}}"#;
    let e = parse(deep, &limits).expect_err("depth 5 > 4");
    assert_eq!(e.to_string(), "nesting deeper than 4 at $.params.a[0].b");
    assert_eq!(e.code(), PARSE_ERROR);
}

#[test]
fn default_depth_limit_rejects_deep_arrays() {
    let body = format!(
        r#"{{"jsonrpc":"2.0","method":"m","params":{}{}}}"#,
        "[".repeat(70),
        "]".repeat(70)
    );
    assert!(matches!(
        err(body.as_bytes()),
        ParseError::TooDeep { limit: 64, .. }
    ));
}

#[test]
fn lone_surrogates_are_rejected() {
    for body in [
        br#"{"jsonrpc":"2.0","method":"\ud800"}"#.as_slice(),
        br#"{"jsonrpc":"2.0","method":"a","params":{"x":"\udc00"}}"#,
        br#"{"jsonrpc":"2.0","method":"a","params":{"x":"\ud800\u0041"}}"#,
        br#"{"jsonrpc":"2.0","method":"a","params":{"\ud83d":1}}"#,
        br#"{"jsonrpc":"2.0","method":"a","params":["\ud800x"]}"#,
    ] {
        let e = err(body);
        assert!(
            matches!(e, ParseError::LoneSurrogate { .. }),
            "{}: {e:?}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(e.code(), PARSE_ERROR);
    }
    // A correctly paired surrogate is fine.
    let m =
        one(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\ud83d\ude00"}}"#);
    assert_eq!(m.name.as_deref(), Some("😀"));
}

#[test]
fn top_level_scalars_are_invalid_requests() {
    for (body, found) in [
        ("1", JsonType::Integer),
        ("\"x\"", JsonType::String),
        ("null", JsonType::Null),
        ("true", JsonType::Bool),
    ] {
        let e = err(body.as_bytes());
        assert!(
            matches!(e, ParseError::NotObjectOrArray { found: f } if f == found),
            "{body}: {e:?}"
        );
        assert_eq!(e.code(), INVALID_REQUEST);
    }
}

#[test]
fn empty_batch_is_an_invalid_request() {
    let e = err(b" [ ] ");
    assert!(matches!(e, ParseError::EmptyBatch));
    assert_eq!(e.code(), INVALID_REQUEST);
}

#[test]
fn batch_over_the_limit_is_rejected() {
    let limits = Limits {
        max_depth: 64,
        max_batch: 2,
    };
    let m = r#"{"jsonrpc":"2.0","method":"a"}"#;
    assert!(parse(format!("[{m},{m}]").as_bytes(), &limits).is_ok());
    let e = parse(format!("[{m},{m},{m}]").as_bytes(), &limits).expect_err("3 > 2");
    assert!(matches!(e, ParseError::BatchTooLarge { limit: 2 }));
    assert_eq!(e.code(), INVALID_REQUEST);
}

#[test]
fn non_object_batch_element_is_named_by_index() {
    let e = err(br#"[{"jsonrpc":"2.0","method":"a"},{"jsonrpc":"2.0","method":"b"},3]"#);
    assert_eq!(
        e.to_string(),
        "batch element 2 must be an object, found an integer"
    );
    assert_eq!(e.code(), INVALID_REQUEST);
    let e = err(br#"[[{"jsonrpc":"2.0","method":"a"}]]"#);
    assert!(matches!(
        e,
        ParseError::ElementNotObject {
            index: 0,
            found: JsonType::Array
        }
    ));
}

#[test]
fn one_invalid_element_rejects_the_whole_batch() {
    let e = err(
        br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ok"}},{"jsonrpc":"1.0","id":3,"method":"x"}]"#,
    );
    assert_eq!(e.to_string(), r#"batch element 2: "jsonrpc" must be "2.0""#);
}

#[test]
fn jsonrpc_version_is_required_and_exact() {
    let e = err(br#"{"method":"a"}"#);
    assert!(matches!(e, ParseError::VersionMissing { index: None }));
    assert_eq!(e.to_string(), r#""jsonrpc" member is missing"#);
    for v in ["\"2\"", "2.0", "null", "\"2.0 \""] {
        let body = format!(r#"{{"jsonrpc":{v},"method":"a"}}"#);
        let e = err(body.as_bytes());
        assert!(matches!(e, ParseError::VersionInvalid { .. }), "{v}: {e:?}");
        assert_eq!(e.code(), INVALID_REQUEST);
    }
}

#[test]
fn method_must_be_a_string() {
    let e = err(br#"{"jsonrpc":"2.0","id":1,"method":5}"#);
    assert_eq!(
        e.to_string(),
        r#""method" must be a string, found an integer"#
    );
    assert_eq!(e.code(), INVALID_REQUEST);
    let e = err(br#"{"jsonrpc":"2.0","method":null}"#);
    assert!(matches!(
        e,
        ParseError::MethodNotString {
            found: JsonType::Null,
            ..
        }
    ));
}

#[test]
fn id_must_be_a_string_or_an_integer() {
    for (id, found) in [
        ("null", JsonType::Null),
        ("1.5", JsonType::Float),
        ("1.0", JsonType::Float),
        ("1e3", JsonType::Float),
        ("true", JsonType::Bool),
        ("{}", JsonType::Object),
        ("[1]", JsonType::Array),
    ] {
        let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"a"}}"#);
        let e = err(body.as_bytes());
        assert!(
            matches!(e, ParseError::IdInvalidType { found: f, .. } if f == found),
            "{id}: {e:?}"
        );
        assert_eq!(e.code(), INVALID_REQUEST);
    }
    let e = err(br#"{"jsonrpc":"2.0","id":9223372036854775808,"method":"a"}"#);
    assert!(matches!(e, ParseError::IdOutOfRange { .. }), "{e:?}");
    let m = one(r#"{"jsonrpc":"2.0","id":-9223372036854775808,"method":"a"}"#);
    assert_eq!(m.id, Some(Id::Number(i64::MIN)));
}

#[test]
fn null_id_does_not_turn_a_request_into_a_notification() {
    let e = err(br#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"t"}}"#);
    assert!(matches!(
        e,
        ParseError::IdInvalidType {
            found: JsonType::Null,
            ..
        }
    ));
}

#[test]
fn message_shape_violations_name_their_reason() {
    let cases: [(&[u8], &str); 8] = [
        (
            br#"{"jsonrpc":"2.0","id":1}"#,
            r#"message has neither "method" nor "result"/"error""#,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"a","result":{}}"#,
            r#"a request or notification must not carry "result" or "error""#,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"m"}}"#,
            r#"response carries both "result" and "error""#,
        ),
        (
            br#"{"jsonrpc":"2.0","result":{}}"#,
            r#"response has no "id""#,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"error":"boom"}"#,
            r#""error" must be an object, found a string"#,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":1.5,"message":"m"}}"#,
            r#""error.code" must be an integer"#,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":1}}"#,
            r#""error.message" must be a string"#,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":"x"}"#,
            r#""params" must be an object or an array, found a string"#,
        ),
    ];
    for (body, message) in cases {
        let e = err(body);
        assert_eq!(e.to_string(), message, "{}", String::from_utf8_lossy(body));
        assert_eq!(e.code(), INVALID_REQUEST);
    }
    let e = err(br#"{"jsonrpc":"2.0","method":"a","params":null}"#);
    assert!(matches!(e, ParseError::ParamsNotStructured { .. }));
}

#[test]
fn tools_call_params_must_be_an_object_with_a_string_name() {
    let e = err(br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":["t"]}"#);
    assert_eq!(
        e.to_string(),
        "params of tools/call must be an object, found an array"
    );
    assert_eq!(e.code(), INVALID_PARAMS);
    assert_eq!(e.id(), Some(&Id::Number(4)));
    let e = err(br#"{"jsonrpc":"2.0","id":4,"method":"tools/call"}"#);
    assert!(matches!(
        e,
        ParseError::ParamsNotObject {
            found: JsonType::Null,
            ..
        }
    ));
    let e = err(br#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":3}}"#);
    assert_eq!(e.to_string(), "params.name of tools/call must be a string");
    assert_eq!(e.code(), INVALID_PARAMS);
    assert_eq!(e.id(), Some(&Id::String("x".into())));
    let e = err(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#);
    assert!(matches!(e, ParseError::NameNotString { field: "name", .. }));
}

#[test]
fn tools_call_arguments_must_be_an_object() {
    for (args, found) in [
        ("[]", JsonType::Array),
        ("\"a=1\"", JsonType::String),
        ("null", JsonType::Null),
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","arguments":{args}}}}}"#
        );
        let e = err(body.as_bytes());
        assert!(
            matches!(e, ParseError::ArgumentsNotObject { found: f, .. } if f == found),
            "{args}: {e:?}"
        );
        assert_eq!(e.code(), INVALID_PARAMS);
    }
    let m = one(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#);
    assert!(m.call.is_some_and(|c| c.arguments.is_none()));
}

#[test]
fn resources_read_needs_a_string_uri() {
    let e = err(br#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":1}}"#);
    assert_eq!(
        e.to_string(),
        "params.uri of resources/read must be a string"
    );
    assert_eq!(e.code(), INVALID_PARAMS);
}

#[test]
fn invisible_characters_in_tool_names_are_rejected() {
    for (escaped, cp, position) in [
        (r"get\u200bweather", 0x200B, 3),
        (r"\u202eredaolnwod", 0x202E, 0),
        (r"read\u2066file\u2069", 0x2066, 4),
        (r"\ufefftool", 0xFEFF, 0),
        (r"tool\u0000", 0x0000, 4),
        (r"a\u00adb", 0x00AD, 1),
        (r"a\u00a0b", 0x00A0, 1),
        (r"a\u3164b", 0x3164, 1),
        (r"a\ufe0fb", 0xFE0F, 1),
        (r"a\udb40\udc41", 0xE0041, 1),
        (r"tab\there", 0x0009, 3),
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{escaped}"}}}}"#
        );
        let e = err(body.as_bytes());
        match &e {
            ParseError::InvisibleCharacter {
                character,
                position: p,
                method,
                ..
            } => {
                assert_eq!(u32::from(*character), cp, "{escaped}");
                assert_eq!(*p, position, "{escaped}");
                assert_eq!(*method, "tools/call");
            }
            other => panic!("{escaped}: {other:?}"),
        }
        assert_eq!(e.code(), INVALID_PARAMS);
    }
    let e = err(
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get\u200bweather"}}"#,
    );
    assert_eq!(
        e.to_string(),
        "params.name of tools/call contains invisible or control character U+200B at character 3"
    );
}

#[test]
fn raw_invisible_characters_are_rejected_too() {
    let body = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"prompts/get\",\"params\":{\"name\":\"sum\u{200D}mary\"}}";
    let e = err(body.as_bytes());
    assert!(matches!(
        e,
        ParseError::InvisibleCharacter {
            method: "prompts/get",
            ..
        }
    ));
}

#[test]
fn visible_unicode_tool_names_are_accepted() {
    let m =
        one(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"météo_北京 v2"}}"#);
    assert_eq!(m.name.as_deref(), Some("météo_北京 v2"));
}

#[test]
fn invisible_characters_elsewhere_are_not_a_name_problem() {
    let m = one(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"q":"a\u200bb"}}}"#,
    );
    assert_eq!(m.kind, Kind::Request);
}

#[test]
fn error_body_is_a_valid_json_rpc_error_response() {
    let body = error_body(
        Some(&Id::String("q\"1".into())),
        INVALID_PARAMS,
        "bad \"x\"",
        None,
    );
    let v: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
    assert_eq!(
        v,
        serde_json::json!({"jsonrpc":"2.0","id":"q\"1","error":{"code":-32602,"message":"bad \"x\""}})
    );
    let data = serde_json::json!({"supported":["2026-07-28"]});
    let body = error_body(None, -32022, "Unsupported protocol version", Some(&data));
    let v: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
    assert_eq!(v["id"], serde_json::Value::Null);
    assert_eq!(v["error"]["data"], data);
    // Our own error bodies are acceptable to our own parser.
    let e =
        one(std::str::from_utf8(&error_body(Some(&Id::Number(5)), -1, "m", None)).expect("utf8"));
    assert!(e.is_error);
}

#[test]
fn id_display_and_serialize_use_the_json_form() {
    assert_eq!(Id::Number(-4).to_string(), "-4");
    assert_eq!(Id::String("a\"b".into()).to_string(), r#""a\"b""#);
    assert_eq!(
        serde_json::to_string(&Id::String("x".into())).expect("serialize"),
        r#""x""#
    );
    assert_eq!(
        serde_json::to_string(&Id::Number(3)).expect("serialize"),
        "3"
    );
}

#[test]
fn protocol_version_is_none_without_meta_or_when_not_a_string() {
    let m = one(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    assert_eq!(m.protocol_version(), None);
    let m = one(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":7}}}"#,
    );
    assert_eq!(m.protocol_version(), None);
}

#[test]
fn large_numbers_inside_params_are_accepted_unless_out_of_f64_range() {
    let m =
        one(r#"{"jsonrpc":"2.0","method":"m","params":[123456789012345678901234567890, -1e300]}"#);
    assert_eq!(m.kind, Kind::Notification);
    assert_eq!(
        err(br#"{"jsonrpc":"2.0","method":"m","params":[1e400]}"#).code(),
        PARSE_ERROR
    );
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "[a-z\u{e9}\u{4e16}\"\\\\\n]{0,6}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::btree_map("[a-c]{1,2}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        // Whatever serde_json serializes (which never has duplicate keys) is
        // accepted, and params come back byte-identical.
        #[test]
        fn serialized_messages_round_trip(params in arb_json(), id in any::<i64>()) {
            let params = match params {
                v @ (serde_json::Value::Object(_) | serde_json::Value::Array(_)) => v,
                other => serde_json::json!([other]),
            };
            let text = serde_json::to_string(&params).expect("serialize");
            let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"m","params":{text}}}"#);
            let env = parse(body.as_bytes(), &Limits::default()).expect("parses");
            prop_assert_eq!(env.messages[0].params.as_ref().map(|p| p.get()), Some(text.as_str()));
            prop_assert_eq!(env.messages[0].id.clone(), Some(Id::Number(id)));
        }

        // Tools taken from the known ones read exactly as a full read: the
        // same acceptance and the same tape, whatever the earlier list was
        // and however the new answer was edited (a byte inserted, dropped
        // or replaced, in a tool or around them), single or in a batch.
        #[test]
        fn known_tools_read_as_a_full_read(
            before in prop::collection::vec(arb_json(), 0..5),
            keep in prop::collection::vec(any::<bool>(), 0..5),
            added in prop::option::of(arb_json()),
            batch_before in any::<bool>(),
            batch_after in any::<bool>(),
            edit in prop::option::of((any::<prop::sample::Index>(), 0u8..3, prop::sample::select(
                vec![b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b'0', b'-', b'e', b'u', 0x01, b' ', b'a', b'A'],
            ))),
        ) {
            let tool = |i: usize, v: &serde_json::Value| format!(
                r#"{{"name":"t{i}","inputSchema":{{"type":"object"}},"v":{}}}"#,
                serde_json::to_string(v).expect("serialize"),
            );
            let answer = |tools: &[String], n: usize, batch: bool| {
                let one = format!(
                    r#"{{"jsonrpc":"2.0","id":1,"result":{{"_meta":{{"n":{n}}},"tools":[{}]}}}}"#,
                    tools.join(", "),
                );
                if batch { format!("[{one}]") } else { one }
            };
            let first: Vec<String> = before.iter().enumerate().map(|(i, v)| tool(i, v)).collect();
            let mut next: Vec<String> = first
                .iter()
                .enumerate()
                .filter(|(i, _)| keep.get(*i).copied().unwrap_or(true))
                .map(|(_, t)| t.clone())
                .collect();
            if let Some(v) = &added {
                next.insert(next.len() / 2, tool(9, v));
            }
            let earlier = answer(&first, 1, batch_before);
            let (_, known) = parse_upstream_known(earlier.as_bytes(), None).expect("well formed");
            let mut body = answer(&next, 2, batch_after).into_bytes();
            if let Some((at, op, byte)) = edit {
                let i = at.index(body.len());
                match op {
                    0 => body.insert(i, byte),
                    1 => { body.remove(i); }
                    _ => body[i] = byte,
                }
            }
            let Ok(text) = std::str::from_utf8(&body) else { return Ok(()) };
            let read = |known| tape::read_known(text, Role::Root, UPSTREAM_LIMITS.max_depth, UPSTREAM_LIMITS.max_batch, TAPE_DEPTH, known);
            let full = read(None).map(|(t, _)| t);
            let taken = read(known.as_ref()).map(|(t, _)| t);
            prop_assert_eq!(&taken, &full, "{}", text);
            if taken.is_some() {
                prop_assert!(validate(text, &UPSTREAM_LIMITS).is_ok(), "accepted {text}");
            }
        }

        // The tape's single pass over an answer accepts only what the serde
        // validator accepts, accepts every well-formed answer, and reads
        // the same envelope; mutated answers (a byte inserted, dropped or
        // replaced) included.
        #[test]
        fn the_tape_reads_answers_as_the_validator_does(
            result in arb_json(),
            id in any::<i64>(),
            batch in any::<bool>(),
            edit in prop::option::of((any::<prop::sample::Index>(), 0u8..3, prop::sample::select(
                vec![b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b'0', b'-', b'.', b'e', b'u', b'd', b'8', 0x01, b' ', b'a', b'A'],
            ))),
        ) {
            let one = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{}}}"#,
                serde_json::to_string(&result).expect("serialize"),
            );
            let mut body = if batch { format!("[{one},{one}]") } else { one }.into_bytes();
            if let Some((at, op, byte)) = edit {
                let i = at.index(body.len());
                match op {
                    0 => body.insert(i, byte),
                    1 => { body.remove(i); }
                    _ => body[i] = byte,
                }
            }
            let Ok(text) = std::str::from_utf8(&body) else { return Ok(()) };
            let taped = tape::read(text, Role::Root, UPSTREAM_LIMITS.max_depth, UPSTREAM_LIMITS.max_batch, TAPE_DEPTH);
            let serde = parse_upstream_serde(text);
            if taped.is_some() {
                prop_assert!(validate(text, &UPSTREAM_LIMITS).is_ok(), "tape accepted {text}");
            }
            if edit.is_none() {
                prop_assert!(taped.is_some(), "tape declined a well-formed answer {text}");
            }
            match (parse_upstream(&body), serde) {
                (Ok(fast), Ok(slow)) => {
                    prop_assert_eq!(fast.batch, slow.batch);
                    prop_assert_eq!(fast.messages.len(), slow.messages.len());
                    for (f, s) in fast.messages.iter().zip(&slow.messages) {
                        prop_assert_eq!(f.kind, s.kind);
                        prop_assert_eq!(&f.id, &s.id);
                        prop_assert_eq!(&f.span, &s.span);
                        prop_assert_eq!(&f.result, &s.result);
                        prop_assert_eq!(f.is_error, s.is_error);
                        prop_assert_eq!(&f.method, &s.method);
                    }
                }
                (Err(f), Err(s)) => prop_assert_eq!(f.to_string(), s.to_string()),
                (f, s) => prop_assert!(false, "fast {:?} vs slow {:?} for {}", f.map(|_| ()), s.map(|_| ()), text),
            }
        }

        // Arbitrary bytes never panic, and anything accepted is valid JSON.
        #[test]
        fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..64)) {
            if parse(&body, &Limits::default()).is_ok() {
                prop_assert!(serde_json::from_slice::<serde_json::Value>(&body).is_ok());
            }
        }
    }
}

#[test]
fn keys_equal_but_for_letter_case_are_duplicates() {
    // Go's encoding/json and case-insensitive Java/.NET mappers read the
    // later spelling; the firewall would have decided on the first.
    // A JSON-RPC or MCP member in another case is refused as such.
    let e = err(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call"}"#);
    assert!(
        matches!(&e, ParseError::CaseVariantMember { key, .. } if key == "Method"),
        "{e:?}"
    );
    let e = err(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"safe","NAME":"rm_rf"}}"#);
    assert!(matches!(e, ParseError::CaseVariantMember { .. }), "{e:?}");
    // Any other two spellings of one key are case duplicates.
    let e = err(br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"xKey":1,"XKEY":2}}"#);
    assert!(
        matches!(&e, ParseError::CaseDuplicateKey { key, .. } if key == "XKEY"),
        "{e:?}"
    );
    assert_eq!(e.code(), PARSE_ERROR);
    // Inside tool arguments too: a condition on `namespace` must see what
    // the upstream sees.
    let e = err(
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"namespace":"sre","Namespace":"prod"}}}"#,
    );
    assert_eq!(
        e.to_string(),
        r#"key "Namespace" at $.params.arguments repeats another key of the same object when letter case is ignored"#
    );
    // Unicode folding that lands on ASCII: U+017F folds to `s`, U+212A to `k`.
    let e = err("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"t\",\"params\":{\"arguments\":{\"pods\":1,\"pod\u{17F}\":2}}}".as_bytes());
    assert!(matches!(e, ParseError::CaseDuplicateKey { .. }), "{e:?}");
    let e = err("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"t\",\"params\":{\"arguments\":{\"kind\":1,\"\u{212A}ind\":2}}}".as_bytes());
    assert!(matches!(e, ParseError::CaseDuplicateKey { .. }), "{e:?}");
}

#[test]
fn members_spelled_in_another_case_are_refused() {
    for (body, key, member) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"Method":"tools/call"}"#,
            "Method",
            "method",
        ),
        (
            r#"{"jsonrpc":"2.0","ID":1,"method":"tools/list"}"#,
            "ID",
            "id",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","Params":{"name":"x"}}"#,
            "Params",
            "params",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"a","Arguments":{}}}"#,
            "Arguments",
            "arguments",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","RequestState":"x"}}"#,
            "RequestState",
            "requestState",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","_meta":{"ProgressToken":1}}}"#,
            "ProgressToken",
            "progressToken",
        ),
    ] {
        let e = err(body.as_bytes());
        match &e {
            ParseError::CaseVariantMember {
                key: k, member: m, ..
            } => {
                assert_eq!((k.as_str(), *m), (key, member), "{body}");
            }
            other => panic!("{body}: {other:?}"),
        }
        assert_eq!(e.code(), INVALID_REQUEST);
    }
    // The exact members, other keys with capitals, and capitals inside
    // arguments (the tool's own vocabulary) are fine.
    let m = one(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"Name":"n","Method":"GET"},"xCustom":1}}"#,
    );
    assert_eq!(m.call.expect("call").name, "t");
}

#[test]
fn answers_the_tape_declines_get_the_validators_verdict_and_error() {
    let cases: &[&str] = &[
        // A member twice, in another case, a case twin of a result member.
        r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"tools":[]}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"isError":false,"ISERROR":true}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"Tools":[]}}"#,
        // The same, spelled with an escape.
        r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"\u0074ools":[]}}"#,
        // Lone surrogates, raw control characters, numbers a double cannot hold.
        r#"{"jsonrpc":"2.0","id":1,"result":{"a":"\ud800"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"a":"\udc00x"}}"#,
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"a\":\"\u{1}\"}}",
        r#"{"jsonrpc":"2.0","id":1,"result":{"a":1e400}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"a":01}}"#,
        // Trailing bytes, a trailing comma, a scalar where a message belongs.
        r#"{"jsonrpc":"2.0","id":1,"result":{}} x"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{},}"#,
        r#"[1]"#,
        r#""x""#,
        // Envelope errors only the message parser names.
        r#"{"jsonrpc":"1.0","id":1,"result":{}}"#,
        r#"{"jsonrpc":"2.0","result":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"m"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"m"}}"#,
    ];
    for text in cases {
        let fast = parse_upstream(text.as_bytes())
            .map(|_| ())
            .map_err(|e| e.to_string());
        let slow = parse_upstream_serde(text)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(fast.is_err(), "accepted {text}");
        assert_eq!(fast, slow, "{text}");
    }
    // Nesting past serde_json's own limit is refused by both.
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{}{}}}"#,
        "[".repeat(130),
        "]".repeat(130)
    );
    assert!(parse_upstream(deep.as_bytes()).is_err());
}

#[test]
fn a_response_read_off_the_tape_is_the_one_parsed_from_its_bytes() {
    for text in [
        r#"{"jsonrpc":"2.0","id":"a\u0062","result":{"tools":[{"name":"x"}]}}"#,
        r#"{"\u006asonrpc":"2.0","id":7,"error":{"code":-32000,"message":"m"}}"#,
        r#" [ {"jsonrpc":"2.0","id":1,"result":{}} , {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":1}} ] "#,
        r#"{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{"messages":[]}}"#,
    ] {
        let fast = parse_upstream(text.as_bytes()).unwrap();
        assert!(fast.tape.is_some(), "{text}");
        let slow = parse_upstream_serde(text).unwrap();
        assert_eq!(fast.messages.len(), slow.messages.len());
        for (f, s) in fast.messages.iter().zip(&slow.messages) {
            assert_eq!(
                (f.kind, &f.id, &f.span, &f.result, f.is_error),
                (s.kind, &s.id, &s.span, &s.result, s.is_error),
                "{text}"
            );
            assert_eq!(&f.method, &s.method);
            assert_eq!(
                f.params.as_ref().map(|p| p.get()),
                s.params.as_ref().map(|p| p.get())
            );
        }
    }
}

/// A `tools/list` answer of `tools` with its own `_meta` counter `n`.
fn listing(tools: &str, n: u32) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{n},"result":{{"_meta":{{"n":{n}}},"tools":[{tools}]}}}}"#)
}

#[test]
fn known_tools_are_taken_only_where_their_bytes_are_the_same() {
    let tools =
        r#"{"name":"a","inputSchema":{"type":"object"}}, {"name":"b","description":"\u0062"}"#;
    let (_, known) = parse_upstream_known(listing(tools, 1).as_bytes(), None).unwrap();
    let known = known.expect("the first list is remembered");
    assert_eq!(known.len(), 2);
    // The same tools around another envelope: every tool is taken, nothing
    // new to remember, and the tape is a full read's.
    let again = listing(tools, 2);
    let (env, learned) = parse_upstream_known(again.as_bytes(), Some(&known)).unwrap();
    assert!(
        learned.is_none(),
        "every tool was taken from the known ones"
    );
    assert_eq!(env.tape, parse_upstream(again.as_bytes()).unwrap().tape);
    // One tool fewer: remembered anew.
    let fewer = listing(r#"{"name":"a","inputSchema":{"type":"object"}}"#, 3);
    let (_, learned) = parse_upstream_known(fewer.as_bytes(), Some(&known)).unwrap();
    assert_eq!(learned.map(|k| k.len()), Some(1));
    // A known tool's bytes followed by what makes the answer malformed, or a
    // tool that starts like a known one and goes on with a duplicate key:
    // refused, as without the known tools.
    for hostile in [
        listing(r#"{"name":"a","inputSchema":{"type":"object"}}}"#, 4),
        listing(r#"{"name":"a","inputSchema":{"type":"object"}} {"name":"b"}"#, 5),
        r#"{"jsonrpc":"2.0","id":6,"result":{"tools":[{"name":"a","inputSchema":{"type":"object"}},"name":"a"}]}}"#.to_owned(),
        listing(r#"{"name":"a","name":"a","inputSchema":{"type":"object"}}"#, 7),
    ] {
        let taken = parse_upstream_known(hostile.as_bytes(), Some(&known));
        let full = parse_upstream(hostile.as_bytes());
        assert!(taken.is_err(), "{hostile}");
        assert_eq!(
            taken.err().map(|e| e.to_string()),
            full.err().map(|e| e.to_string())
        );
    }
}

#[test]
fn only_a_list_of_objects_in_result_tools_is_remembered() {
    // Numbers could be a prefix of a longer number: never remembered.
    let (_, known) = parse_upstream_known(listing("1, 2", 1).as_bytes(), None).unwrap();
    assert!(known.is_none());
    // A `tools` member anywhere but in a result is not a list of tools.
    let call = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{"tools":[{"name":"a"}]}}}"#;
    let (_, known) = parse_upstream_known(call.as_bytes(), None).unwrap();
    assert!(known.is_none());
}
