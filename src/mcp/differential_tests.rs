use proptest::prelude::*;

use super::*;

/// Keys an attacker would try: the members, their case twins, escaped and
/// folded spellings, and plain others.
const KEYS: &[&str] = &[
    "jsonrpc",
    "id",
    "method",
    "params",
    "result",
    "error",
    "Result",
    "ID",
    "\\u0069d",
    "re\\u0073ult",
    "re\\u017Fult",
    "name",
    "arguments",
    "Name",
    "_meta",
    "requestState",
    "tools",
    "Tools",
    "isError",
    "resultType",
    "inputRequests",
    "InputRequests",
    "iserror",
    "inputrequests",
    "resulttype",
    "method",
    "Method",
    "mcp-firewall/cost",
    "code",
    "message",
    "a",
    "A",
    "\\u212A",
    "k",
    "",
];

/// Scalars: numbers at the edges of what a double and `i64` hold, strings
/// with escapes and surrogates.
const SCALARS: &[&str] = &[
    "\"2.0\"",
    "1",
    "-0",
    "-0.0",
    "0.1",
    "1e2",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "1e400",
    "2.5e-324",
    "0.30000000000000004",
    "true",
    "false",
    "null",
    "\"tools/call\"",
    "\"input_required\"",
    "\"sampling/createMessage\"",
    "\"\\ud83d\\ude00\"",
    "\"\\ud800\"",
    "\"\\udc00x\"",
    "\"a\\u0000b\"",
    "\"\\/\"",
    "\"x\"",
    "01",
    "1.",
    "\"\t\"",
];

fn value() -> impl Strategy<Value = String> {
    let leaf = proptest::sample::select(SCALARS).prop_map(str::to_owned);
    leaf.prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec((proptest::sample::select(KEYS), inner.clone()), 0..6)
                .prop_map(|members| {
                    let body: Vec<String> = members
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\":{v}"))
                        .collect();
                    format!("{{{}}}", body.join(","))
                }),
            proptest::collection::vec(inner, 0..4)
                .prop_map(|items| format!("[{}]", items.join(","))),
        ]
    })
}

/// A message-like object: mostly well formed, with hostile members mixed in.
fn message() -> impl Strategy<Value = String> {
    (
        proptest::sample::select(&["1", "\"a\"", "-0", "1.5", "null"][..]),
        prop_oneof![
            value().prop_map(|r| format!("\"result\":{r}")),
            value().prop_map(|p| format!("\"method\":\"tools/call\",\"params\":{p}")),
            Just("\"error\":{\"code\":-32000,\"message\":\"m\"}".to_owned()),
        ],
        proptest::collection::vec((proptest::sample::select(KEYS), value()), 0..3),
    )
        .prop_map(|(id, main, extra)| {
            let mut members = vec![
                "\"jsonrpc\":\"2.0\"".to_owned(),
                format!("\"id\":{id}"),
                main,
            ];
            members.extend(extra.into_iter().map(|(k, v)| format!("\"{k}\":{v}")));
            format!("{{{}}}", members.join(","))
        })
}

fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => message(),
        2 => proptest::collection::vec(message(), 0..4).prop_map(|m| format!("[{}]", m.join(","))),
        1 => value(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Every reader gives the reference's verdict and values on every shape
    /// of message, batch and value the generator makes.
    #[test]
    fn every_reader_reads_as_the_reference(text in body(), split in 0usize..512) {
        prop_assert_eq!(check_answer(text.as_bytes(), split), Ok(()), "answer {}", text);
        prop_assert_eq!(check_request(text.as_bytes()), Ok(()), "request {}", text);
    }
}

#[test]
fn the_reference_refuses_what_the_rules_refuse() {
    let refused = [
        r#"{"a":1,"a":2}"#,
        r#"{"a":1,"A":2}"#,
        r#"{"jsonrpc":"2.0","id":1,"Result":{}}"#,
        r#"{"s":1,"\u017F":2}"#,
        r#"{"x":"\ud800"}"#,
        r#"{"x":1e400}"#,
        r#"{"x":1} x"#,
    ];
    for text in refused {
        assert!(reference(text, 64).is_err(), "{text}");
    }
    assert_eq!(reference("[[[1]]]", 2), Err(Refusal::TooDeep));
    assert!(reference(r#"{"result":{"Tools":[]}}"#, 64).is_err());
    assert!(reference(r#"{"other":{"Tools":[]}}"#, 64).is_ok());
}

/// Findings of the differential target, kept as regressions.
#[test]
fn the_differential_findings_stay_fixed() {
    let answers = [
        // The scanner read an input request whose method was a case twin,
        // or whose list was an array: the held answer refuses both.
        r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"x":{"Method":"sampling/createMessage"}}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":[{"method":"sampling/createMessage"}]}}"#,
        // Result members the validator names and the scanner did not.
        r#"{"jsonrpc":"2.0","id":1,"result":{"NextCursor":"x"}}"#,
        r#"{"jsonrpc":"2.0","Method":"x","id":1,"result":{}}"#,
        // A lower-case spelling of a camel-case member: a case-insensitive
        // decoder reads it as the member; every reader refuses it.
        r#"{"jsonrpc":"2.0","id":1,"result":{"iserror":true}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputrequests":{"x":{"method":"sampling/createMessage"}}}}"#,
        // Not a message at all.
        "[1]",
        "[]",
        "5",
        // The reported cost read as serde_json reads it.
        r#"{"jsonrpc":"2.0","id":1,"result":{"_meta":{"mcp-firewall/cost":0.30000000000000004}}}"#,
    ];
    for text in answers {
        for split in [0, 7, text.len()] {
            assert_eq!(
                check_answer(text.as_bytes(), split),
                Ok(()),
                "{text} at {split}"
            );
        }
    }
}

#[test]
fn a_lower_case_twin_of_a_camel_case_member_is_refused() {
    for text in [
        r#"{"jsonrpc":"2.0","id":1,"result":{"iserror":true}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"inputrequests":{}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","requeststate":"x"}}"#,
    ] {
        assert!(
            super::super::parse_upstream(text.as_bytes()).is_err(),
            "{text}"
        );
        assert!(
            super::super::parse(text.as_bytes(), &Limits::default()).is_err(),
            "{text}"
        );
        let mut scan = Scan::new(COST_KEY);
        let scanned = scan.push(text.as_bytes()).and_then(|()| scan.finish());
        if text.contains("result") {
            assert!(scanned.is_err(), "{text}");
        }
    }
}
