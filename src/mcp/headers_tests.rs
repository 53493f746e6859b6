use super::*;
use crate::mcp::jsonrpc::{parse, Limits};
use http::HeaderValue;
use serde_json::json;

const V: &str = "2026-07-28";

fn msg(body: &str) -> Message {
    let mut env = parse(body.as_bytes(), &Limits::default()).expect("valid body");
    env.messages.remove(0)
}

/// A modern request body with `_meta` protocol version.
fn modern(method: &str, params: &str) -> Message {
    let sep = if params.is_empty() { "" } else { "," };
    msg(&format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{{{params}{sep}"_meta":{{"io.modelcontextprotocol/protocolVersion":"{V}"}}}}}}"#
    ))
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    map
}

fn region_schema() -> ParamHeaders {
    ParamHeaders::from_input_schema(&json!({
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "count": {"type": "integer", "x-mcp-header": "Count"},
            "dry": {"type": "boolean", "x-mcp-header": "Dry-Run"},
            "opts": {"type": "object", "properties": {
                "zone": {"type": "string", "x-mcp-header": "Zone"}
            }},
            "query": {"type": "string"}
        }
    }))
}

fn call(arguments: &str) -> Message {
    modern(
        "tools/call",
        &format!(r#""name":"execute_sql","arguments":{arguments}"#),
    )
}

#[test]
fn spec_example_tools_call_passes() {
    let m = call(r#"{"region":"us-west1","query":"SELECT 1"}"#);
    let h = headers(&[
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "execute_sql"),
        ("Mcp-Param-Region", "us-west1"),
    ]);
    assert_eq!(check(&h, &m, Some(&region_schema())), Ok(()));
}

#[test]
fn header_names_are_case_insensitive() {
    let m = call(r#"{"region":"us-west1"}"#);
    let h = headers(&[
        ("mcp-protocol-version", V),
        ("MCP-METHOD", "tools/call"),
        ("mCp-NaMe", "execute_sql"),
        ("MCP-PARAM-REGION", "us-west1"),
    ]);
    assert_eq!(check(&h, &m, Some(&region_schema())), Ok(()));
}

#[test]
fn header_values_are_case_sensitive() {
    let m = modern("tools/list", "");
    let h = headers(&[("MCP-Protocol-Version", V), ("Mcp-Method", "Tools/List")]);
    let e = check(&h, &m, None).expect_err("case differs");
    assert_eq!(
        e,
        HeaderMismatch::Mismatch {
            header: Header::Method,
            header_value: "Tools/List".into(),
            body_value: "tools/list".into(),
        }
    );
}

#[test]
fn header_naming_a_different_tool_than_the_body_is_rejected() {
    let m = modern("tools/call", r#""name":"delete_everything""#);
    let h = headers(&[
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "read_file"),
    ]);
    let e = check(&h, &m, None).expect_err("different tool");
    assert_eq!(
        e.to_string(),
        "Header mismatch: Mcp-Name header value 'read_file' does not match body value 'delete_everything'"
    );
    assert_eq!(e.code(), -32020);
    assert_eq!(e.http_status(), StatusCode::BAD_REQUEST);
    assert_eq!(e.header(), &Header::Name);
}

#[test]
fn method_header_must_match_the_body_method() {
    let m = modern("tools/list", "");
    let h = headers(&[("MCP-Protocol-Version", V), ("Mcp-Method", "tools/call")]);
    assert!(matches!(
        check(&h, &m, None),
        Err(HeaderMismatch::Mismatch {
            header: Header::Method,
            ..
        })
    ));
}

#[test]
fn missing_required_headers_are_rejected_for_2026_requests() {
    let m = modern("tools/call", r#""name":"t""#);
    let e = check(&headers(&[("MCP-Protocol-Version", V)]), &m, None).expect_err("no Mcp-Method");
    assert_eq!(
        e,
        HeaderMismatch::Missing {
            header: Header::Method,
            body_value: "tools/call".into()
        }
    );
    let h = headers(&[("MCP-Protocol-Version", V), ("Mcp-Method", "tools/call")]);
    let e = check(&h, &m, None).expect_err("no Mcp-Name");
    assert_eq!(
        e,
        HeaderMismatch::Missing {
            header: Header::Name,
            body_value: "t".into()
        }
    );
    for (method, params) in [
        ("resources/read", r#""uri":"file:///x""#),
        ("prompts/get", r#""name":"p""#),
    ] {
        let m = modern(method, params);
        let h = headers(&[("MCP-Protocol-Version", V), ("Mcp-Method", method)]);
        assert!(
            matches!(
                check(&h, &m, None),
                Err(HeaderMismatch::Missing {
                    header: Header::Name,
                    ..
                })
            ),
            "{method}"
        );
    }
}

#[test]
fn name_is_not_required_for_methods_without_one() {
    let m = modern("tools/list", "");
    let h = headers(&[("MCP-Protocol-Version", V), ("Mcp-Method", "tools/list")]);
    assert_eq!(check(&h, &m, None), Ok(()));
}

#[test]
fn name_header_on_a_method_that_defines_none_is_rejected() {
    let m = modern("tools/list", "");
    let h = headers(&[
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/list"),
        ("Mcp-Name", "execute_sql"),
    ]);
    assert_eq!(
        check(&h, &m, None),
        Err(HeaderMismatch::Unexpected {
            header: Header::Name,
            header_value: "execute_sql".into()
        })
    );
}

#[test]
fn method_header_on_a_response_is_rejected() {
    let m = msg(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
    let h = headers(&[("Mcp-Method", "tools/call")]);
    assert!(matches!(
        check(&h, &m, None),
        Err(HeaderMismatch::Unexpected {
            header: Header::Method,
            ..
        })
    ));
}

#[test]
fn param_header_on_a_method_other_than_tools_call_is_rejected() {
    let m = modern("prompts/get", r#""name":"p""#);
    let h = headers(&[
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "prompts/get"),
        ("Mcp-Name", "p"),
        ("Mcp-Param-Region", "eu"),
    ]);
    assert_eq!(
        check(&h, &m, None),
        Err(HeaderMismatch::Unexpected {
            header: Header::Param("region".into()),
            header_value: "eu".into()
        })
    );
}

#[test]
fn unicode_names_travel_through_base64() {
    // "Hello, 世界" is the spec's own example.
    let m = modern("tools/call", r#""name":"Hello, 世界""#);
    let h = headers(&[
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "=?base64?SGVsbG8sIOS4lueVjA==?="),
    ]);
    assert_eq!(check(&h, &m, None), Ok(()));
    let other = headers(&[
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/call"),
        // "Hello, 世" (one character short).
        ("Mcp-Name", "=?base64?SGVsbG8sIOS4lg==?="),
    ]);
    assert_eq!(
        check(&other, &m, None),
        Err(HeaderMismatch::Mismatch {
            header: Header::Name,
            header_value: "Hello, 世".into(),
            body_value: "Hello, 世界".into()
        })
    );
}

#[test]
fn spec_encoding_examples_decode_to_their_values() {
    for (plain, encoded) in [
        (" padded ", "=?base64?IHBhZGRlZCA=?="),
        ("line1\nline2", "=?base64?bGluZTEKbGluZTI=?="),
        ("=?base64?literal?=", "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="),
        ("us-west1", "=?base64?dXMtd2VzdDE=?="),
    ] {
        assert_eq!(decode(encoded, || Header::Name).as_deref(), Ok(plain));
    }
    assert_eq!(
        decode("us-west1", || Header::Name).as_deref(),
        Ok("us-west1")
    );
}

#[test]
fn base64_markers_are_case_sensitive() {
    // An uppercase marker is not the sentinel: the value is compared as is.
    let m = modern("tools/call", r#""name":"t""#);
    let h = headers(&[
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "=?BASE64?dA==?="),
    ]);
    assert!(matches!(
        check(&h, &m, None),
        Err(HeaderMismatch::Mismatch { .. })
    ));
}

#[test]
fn invalid_base64_is_rejected() {
    for bad in ["=?base64?!!!?=", "=?base64?dA?=", "=?base64?/w==?="] {
        let e = decode(bad, || Header::Name).expect_err(bad);
        assert!(
            matches!(e, HeaderMismatch::InvalidBase64 { .. }),
            "{bad}: {e:?}"
        );
    }
}

#[test]
fn non_ascii_header_bytes_are_invalid_characters() {
    let m = modern("tools/call", r#""name":"café""#);
    let mut h = headers(&[("MCP-Protocol-Version", V), ("Mcp-Method", "tools/call")]);
    h.insert(
        MCP_NAME,
        HeaderValue::from_bytes("café".as_bytes()).expect("obs-text is a legal HeaderValue"),
    );
    assert!(matches!(
        check(&h, &m, None),
        Err(HeaderMismatch::InvalidCharacters {
            header: Header::Name,
            ..
        })
    ));
}

#[test]
fn repeated_headers_are_rejected() {
    let m = modern("tools/call", r#""name":"t""#);
    let h = headers(&[
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "t"),
        ("Mcp-Name", "u"),
    ]);
    assert_eq!(
        check(&h, &m, None),
        Err(HeaderMismatch::Repeated {
            header: Header::Name
        })
    );
}

#[test]
fn protocol_version_header_must_match_the_body() {
    let m = modern("tools/list", "");
    let h = headers(&[
        ("MCP-Protocol-Version", "2025-11-25"),
        ("Mcp-Method", "tools/list"),
    ]);
    assert_eq!(
        check(&h, &m, None),
        Err(HeaderMismatch::Mismatch {
            header: Header::ProtocolVersion,
            header_value: "2025-11-25".into(),
            body_value: V.into()
        })
    );
    let e = check(&headers(&[("Mcp-Method", "tools/list")]), &m, None).expect_err("absent");
    assert_eq!(
        e,
        HeaderMismatch::Missing {
            header: Header::ProtocolVersion,
            body_value: V.into()
        }
    );
}

#[test]
fn modern_header_without_body_version_is_invalid_params() {
    let m = msg(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    let h = headers(&[("MCP-Protocol-Version", V), ("Mcp-Method", "tools/list")]);
    let e = check(&h, &m, None).expect_err("no _meta version");
    assert!(matches!(e, HeaderMismatch::BodyVersionMissing { .. }));
    assert_eq!(e.code(), -32602);
    assert_eq!(e.http_status(), StatusCode::BAD_REQUEST);
}

#[test]
fn legacy_requests_need_no_mirrored_headers_but_present_ones_must_match() {
    let m = msg(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#);
    for h in [
        headers(&[]),
        headers(&[("MCP-Protocol-Version", "2025-06-18")]),
        headers(&[("MCP-Protocol-Version", "2025-11-25")]),
    ] {
        assert_eq!(check(&h, &m, Some(&region_schema())), Ok(()));
    }
    let h = headers(&[
        ("MCP-Protocol-Version", "2025-11-25"),
        ("Mcp-Name", "other"),
    ]);
    assert!(matches!(
        check(&h, &m, None),
        Err(HeaderMismatch::Mismatch {
            header: Header::Name,
            ..
        })
    ));
}

#[test]
fn notifications_need_no_headers_but_present_ones_must_match() {
    let m = msg(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
    );
    assert_eq!(
        check(&headers(&[("MCP-Protocol-Version", V)]), &m, None),
        Ok(())
    );
    let h = headers(&[("MCP-Protocol-Version", V), ("Mcp-Method", "tools/call")]);
    assert!(check(&h, &m, None).is_err());
}

#[test]
fn unknown_future_version_is_treated_strictly() {
    assert!(requires_mirroring("2026-07-28"));
    assert!(requires_mirroring("2027-01-01"));
    assert!(requires_mirroring("DRAFT-2026-v1"));
    assert!(!requires_mirroring("2025-11-25"));
    assert!(!requires_mirroring("2025-03-26"));
}

#[test]
fn param_values_mirror_strings_integers_and_booleans() {
    let m = call(r#"{"region":"eu","count":42,"dry":false,"opts":{"zone":"b"}}"#);
    let base = [
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "execute_sql"),
    ];
    let with = |extra: &[(&str, &str)]| {
        let mut pairs = base.to_vec();
        pairs.extend_from_slice(extra);
        headers(&pairs)
    };
    let good = [
        ("Mcp-Param-Region", "eu"),
        ("Mcp-Param-Count", "42"),
        ("Mcp-Param-Dry-Run", "false"),
        ("Mcp-Param-Zone", "b"),
    ];
    assert_eq!(check(&with(&good), &m, Some(&region_schema())), Ok(()));
    let mut numeric = good;
    numeric[1] = ("Mcp-Param-Count", "42.0");
    assert_eq!(check(&with(&numeric), &m, Some(&region_schema())), Ok(()));
    for (i, bad) in [
        (0, ("Mcp-Param-Region", "us")),
        (1, ("Mcp-Param-Count", "43")),
        (1, ("Mcp-Param-Count", "+42")),
        (2, ("Mcp-Param-Dry-Run", "False")),
        (3, ("Mcp-Param-Zone", "c")),
    ] {
        let mut pairs = good;
        pairs[i] = bad;
        let e = check(&with(&pairs), &m, Some(&region_schema())).expect_err(bad.1);
        assert!(
            matches!(e, HeaderMismatch::Mismatch { .. }),
            "{bad:?}: {e:?}"
        );
    }
}

#[test]
fn missing_param_header_for_a_body_value_is_rejected() {
    let m = call(r#"{"region":"eu"}"#);
    let h = headers(&[
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "execute_sql"),
    ]);
    assert_eq!(
        check(&h, &m, Some(&region_schema())),
        Err(HeaderMismatch::Missing {
            header: Header::Param("Region".into()),
            body_value: "eu".into()
        })
    );
}

#[test]
fn param_header_for_an_absent_or_null_value_is_rejected() {
    for args in [r#"{}"#, r#"{"region":null}"#] {
        let m = call(args);
        let h = headers(&[
            ("MCP-Protocol-Version", V),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "execute_sql"),
            ("Mcp-Param-Region", "eu"),
        ]);
        assert!(
            matches!(
                check(&h, &m, Some(&region_schema())),
                Err(HeaderMismatch::Unexpected { .. })
            ),
            "{args}"
        );
        // And absent/null values need no header.
        let h = headers(&[
            ("MCP-Protocol-Version", V),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "execute_sql"),
        ]);
        assert_eq!(check(&h, &m, Some(&region_schema())), Ok(()), "{args}");
    }
}

#[test]
fn param_values_with_unicode_travel_through_base64() {
    let m = call(r#"{"region":" Zürich "}"#);
    let h = headers(&[
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "execute_sql"),
        ("Mcp-Param-Region", "=?base64?IFrDvHJpY2gg?="),
    ]);
    assert_eq!(check(&h, &m, Some(&region_schema())), Ok(()));
}

#[test]
fn unknown_param_headers_on_tools_call_are_forwarded() {
    let m = call(r#"{"region":"eu"}"#);
    let h = headers(&[
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "execute_sql"),
        ("Mcp-Param-Region", "eu"),
        ("Mcp-Param-Tenant", "acme"),
    ]);
    assert_eq!(check(&h, &m, Some(&region_schema())), Ok(()));
    assert_eq!(check(&h, &m, None), Ok(()));
}

#[test]
fn batches_carry_no_mirrored_headers() {
    assert_eq!(
        check_batch(&headers(&[("MCP-Protocol-Version", "2025-03-26")])),
        Ok(())
    );
    for (name, header) in [
        ("Mcp-Method", Header::Method),
        ("Mcp-Name", Header::Name),
        ("Mcp-Param-Region", Header::Param("region".into())),
    ] {
        assert_eq!(
            check_batch(&headers(&[(name, "x")])),
            Err(HeaderMismatch::OnBatch {
                header,
                header_value: "x".into()
            })
        );
    }
}

#[test]
fn schema_annotations_follow_properties_chains_only() {
    let p = region_schema();
    assert_eq!(p.violation(), None);
    let mut found: Vec<(String, &str)> = p.iter().map(|(path, h)| (path.join("."), h)).collect();
    found.sort();
    assert_eq!(
        found,
        vec![
            ("count".to_string(), "Count"),
            ("dry".to_string(), "Dry-Run"),
            ("opts.zone".to_string(), "Zone"),
            ("region".to_string(), "Region"),
        ]
    );
}

#[test]
fn invalid_annotations_are_reported() {
    let cases = [
        (json!({"x-mcp-header": "A"}), AnnotationViolation::OnRoot),
        (
            json!({"properties": {"a": {"type": "array", "items": {"type": "string", "x-mcp-header": "A"}}}}),
            AnnotationViolation::OffChain {
                keyword: "items".into(),
            },
        ),
        (
            json!({"oneOf": [{"properties": {"a": {"type": "string", "x-mcp-header": "A"}}}]}),
            AnnotationViolation::OffChain {
                keyword: "oneOf".into(),
            },
        ),
        (
            json!({"properties": {"a": {"type": "string", "x-mcp-header": 5}}}),
            AnnotationViolation::NotAString {
                property: "a".into(),
            },
        ),
        (
            json!({"properties": {"a": {"type": "string", "x-mcp-header": ""}}}),
            AnnotationViolation::NotAToken {
                property: "a".into(),
                header: String::new(),
            },
        ),
        (
            json!({"properties": {"a": {"type": "string", "x-mcp-header": "Bad Name"}}}),
            AnnotationViolation::NotAToken {
                property: "a".into(),
                header: "Bad Name".into(),
            },
        ),
        (
            json!({"properties": {"a": {"type": "number", "x-mcp-header": "A"}}}),
            AnnotationViolation::NotPrimitive {
                property: "a".into(),
            },
        ),
        (
            json!({"properties": {
                "a": {"type": "string", "x-mcp-header": "Dup"},
                "b": {"type": "string", "x-mcp-header": "dup"}
            }}),
            AnnotationViolation::Duplicate {
                property: "b".into(),
                header: "dup".into(),
            },
        ),
    ];
    for (schema, expected) in cases {
        let p = ParamHeaders::from_input_schema(&schema);
        assert_eq!(p.violation(), Some(&expected), "{schema}");
    }
}

#[test]
fn annotation_like_keys_in_instance_data_are_not_annotations() {
    let p = ParamHeaders::from_input_schema(&json!({
        "properties": {"a": {"type": "object", "default": {"x-mcp-header": "not-one"}}}
    }));
    assert_eq!(p.violation(), None);
    assert!(p.is_empty());
}

#[test]
fn numbers_mirror_only_the_same_decimal_value() {
    let number = |text: &str| -> serde_json::Number { serde_json::from_str(text).expect(text) };
    for (header, body) in [
        ("42", "42"),
        ("4.2e1", "42"),
        ("420E-1", "42"),
        ("42.0", "42"),
        ("0", "-0"),
        ("-7", "-7"),
        ("0.5", "0.5"),
        ("9007199254740991", "9007199254740991"),
    ] {
        assert!(
            numbers_equal(header, &number(body)),
            "{header} mirrors {body}"
        );
    }
    for (header, body, why) in [
        ("+42", "42", "not a JSON number"),
        ("042", "42", "not a JSON number"),
        ("42 ", "42", "not a JSON number"),
        ("42.5", "42", "another value"),
        ("0x2a", "42", "not a JSON number"),
        // Equal as doubles, not as decimals: an exact reader behind the
        // firewall sees two values.
        ("0.10000000000000001", "0.1", "another decimal"),
        ("4503599627370496.25", "4503599627370496", "another decimal"),
        (
            "9007199254740992",
            "9007199254740993",
            "integers compare exactly",
        ),
        // Past 2^53 - 1 a JavaScript reader holds another value.
        (
            "9007199254740993",
            "9007199254740993",
            "outside the safe range",
        ),
    ] {
        assert!(
            !numbers_equal(header, &number(body)),
            "{header} against {body}: {why}"
        );
    }
}
