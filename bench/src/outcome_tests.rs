//! Tests of answer classification and expectations.

use super::*;

fn c(status: u16, body: &str) -> Outcome {
    Classifier::default().classify(status, body.as_bytes())
}

#[test]
fn single_result_and_error_are_told_apart() {
    assert_eq!(
        c(
            200,
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}"#
        ),
        Outcome::Result
    );
    assert_eq!(
        c(
            200,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-31001,"message":"refused","data":{"stop_reason":"denied"}}}"#
        ),
        Outcome::RpcError(-31001)
    );
    assert_eq!(
        c(200, r#"{"id":1,"error":{"message":"x", "code": 42}}"#),
        Outcome::RpcError(42)
    );
}

#[test]
fn sse_answers_are_classified_like_json() {
    let body = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n";
    assert_eq!(c(200, body), Outcome::Result);
    let held = ": working\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-31002,\"message\":\"m\"}}\n\n";
    assert_eq!(c(200, held), Outcome::RpcError(-31002));
    let batch = "event: message\ndata: [{\"id\":1,\"result\":{}},{\"id\":2,\"result\":{}}]\n\n";
    assert_eq!(
        c(200, batch),
        Outcome::Batch {
            results: 2,
            errors: 0
        }
    );
}

#[test]
fn tool_lists_count_their_tools() {
    let body = r#"{"id":1,"result":{"tools":[{"name":"a","inputSchema":{}},{"name":"b","inputSchema":{}}]}}"#;
    assert_eq!(c(200, body), Outcome::Tools(2));
    assert_eq!(
        c(200, r#"{"id":1,"result":{"tools":[]}}"#),
        Outcome::Tools(0)
    );
}

#[test]
fn batches_count_results_and_errors() {
    let body = r#"[{"id":1,"result":{}},{"id":2,"result":{}},{"id":3,"error":{"code":-31001,"message":"m"}},{"id":4,"result":{}}]"#;
    assert_eq!(
        c(200, body),
        Outcome::Batch {
            results: 3,
            errors: 1
        }
    );
}

#[test]
fn skipped_results_and_http_statuses_are_recognised() {
    assert_eq!(
        c(
            200,
            r#"{"id":1,"result":{"content":[],"_meta":{"mcp-firewall/skipped":true}}}"#
        ),
        Outcome::Skipped
    );
    assert_eq!(c(202, ""), Outcome::Accepted);
    assert_eq!(c(401, "{}"), Outcome::Status(401));
    assert_eq!(c(200, "{\"id\":1}"), Outcome::Malformed);
    assert_eq!(c(200, r#"{"error":{"code":"x"}}"#), Outcome::Malformed);
}

#[test]
fn expectations_accept_only_their_outcome() {
    assert!(Expect::Result.accepts(Outcome::Result));
    assert!(!Expect::Result.accepts(Outcome::Skipped));
    assert!(Expect::ResultOrSkipped.accepts(Outcome::Skipped));
    assert!(Expect::Tools(50).accepts(Outcome::Tools(50)));
    assert!(!Expect::Tools(50).accepts(Outcome::Tools(100)));
    assert!(Expect::Error(-31002).accepts(Outcome::RpcError(-31002)));
    assert!(!Expect::Error(-31002).accepts(Outcome::RpcError(-31001)));
    assert!(!Expect::Error(-31002).accepts(Outcome::Result));
    let b = Expect::Batch {
        results: 3,
        errors: 1,
    };
    assert!(b.accepts(Outcome::Batch {
        results: 3,
        errors: 1
    }));
    assert!(!b.accepts(Outcome::Batch {
        results: 4,
        errors: 0
    }));
}

#[test]
fn integers_parse_with_sign_and_bounds() {
    assert_eq!(parse_int(b"-32602,"), Some(-32602));
    assert_eq!(parse_int(b"  7}"), Some(7));
    assert_eq!(parse_int(b"-"), None);
    assert_eq!(parse_int(b"12345678901"), None);
}
