//! Throughput of the MCP wire formats on the request path: JSON-RPC body
//! parsing (with serde_json's `Value` parse as the yardstick), SSE decoding and
//! encoding, the SEP-2243 header check, and what the request path added to
//! be sealed: the session seal and open, event-id sealing, the exact-number
//! scan of arguments, the validating pass over upstream answers.

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use http::{HeaderMap, HeaderValue};
use mcp_firewall::internals::{Due, EventContext, Principal, SessionKey, Sessions};
use mcp_firewall::mcp::{headers, jsonrpc, numbers, sse};
use std::hint::black_box;

/// A typical modern `tools/call` (about 300 bytes).
const CALL: &str = r#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"execute_sql","arguments":{"region":"us-west1","query":"SELECT id, name FROM users WHERE created_at > $1 LIMIT 50","params":["2026-01-01"]},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"progressToken":"p-42"}}}"#;

fn batch_of(n: usize) -> String {
    let elements: Vec<String> = (0..n)
        .map(|i| CALL.replacen("\"id\":42", &format!("\"id\":{i}"), 1))
        .collect();
    format!("[{}]", elements.join(","))
}

fn bench_jsonrpc(c: &mut Criterion) {
    let limits = jsonrpc::Limits::default();
    let mut group = c.benchmark_group("jsonrpc");
    group.throughput(Throughput::Bytes(CALL.len() as u64));
    group.bench_function("parse_tools_call", |b| {
        b.iter(|| jsonrpc::parse(black_box(CALL.as_bytes()), &limits))
    });
    group.bench_function("serde_json_value_tools_call", |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(CALL.as_bytes())))
    });
    let batch = batch_of(20);
    group.throughput(Throughput::Bytes(batch.len() as u64));
    group.bench_function("parse_batch_20", |b| {
        b.iter(|| jsonrpc::parse(black_box(batch.as_bytes()), &limits))
    });
    let env = jsonrpc::parse(batch.as_bytes(), &limits).expect("valid batch");
    let spans: Vec<_> = env.messages.iter().step_by(2).map(|m| &m.span).collect();
    group.bench_function("splice_batch_10_of_20", |b| {
        b.iter(|| jsonrpc::splice_batch(black_box(batch.as_bytes()), spans.iter().copied()))
    });
    group.finish();
}

fn bench_sse(c: &mut Criterion) {
    let mut stream = BytesMut::new();
    for i in 0..100 {
        sse::encode_message(Some(&format!("s-{i}")), CALL.as_bytes(), &mut stream);
    }
    let stream = stream.freeze();
    let mut group = c.benchmark_group("sse");
    group.throughput(Throughput::Bytes(stream.len() as u64));
    group.bench_function("decode_100_events_4k_chunks", |b| {
        b.iter_batched(
            || sse::Decoder::new(1 << 20),
            |mut decoder| {
                let mut n = 0;
                for chunk in stream.chunks(4096) {
                    decoder.push(chunk).expect("within limit");
                    while let Some(event) = decoder.next_event() {
                        n += event.data.len();
                    }
                }
                n
            },
            BatchSize::SmallInput,
        )
    });
    group.throughput(Throughput::Bytes(CALL.len() as u64));
    group.bench_function("encode_message", |b| {
        let mut out = BytesMut::with_capacity(1024);
        b.iter(|| {
            out.clear();
            sse::encode_message(Some("s-1"), black_box(CALL.as_bytes()), &mut out);
        })
    });
    group.finish();
}

fn bench_headers(c: &mut Criterion) {
    let limits = jsonrpc::Limits::default();
    let msg = jsonrpc::parse(CALL.as_bytes(), &limits)
        .expect("valid")
        .messages
        .remove(0);
    let schema = serde_json::json!({"type":"object","properties":{
        "region":{"type":"string","x-mcp-header":"Region"},
        "query":{"type":"string"}}});
    let params = headers::ParamHeaders::from_input_schema(&schema);
    let mut map = HeaderMap::new();
    map.insert("host", HeaderValue::from_static("mcp.example.com"));
    map.insert("content-type", HeaderValue::from_static("application/json"));
    map.insert(
        "accept",
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    map.insert(
        "authorization",
        HeaderValue::from_static("Bearer abc.def.ghi"),
    );
    map.insert(
        "mcp-protocol-version",
        HeaderValue::from_static("2026-07-28"),
    );
    map.insert("mcp-method", HeaderValue::from_static("tools/call"));
    map.insert("mcp-name", HeaderValue::from_static("execute_sql"));
    map.insert("mcp-param-region", HeaderValue::from_static("us-west1"));
    let mut group = c.benchmark_group("headers");
    group.bench_function("check_tools_call_with_param", |b| {
        b.iter(|| headers::check(black_box(&map), &msg, Some(&params)))
    });
    group.bench_function("check_tools_call_without_schema", |b| {
        b.iter(|| headers::check(black_box(&map), &msg, None))
    });
    group.finish();
}

fn bench_seal(c: &mut Criterion) {
    let sessions = Sessions::new(&[SessionKey {
        id: "k1".into(),
        secret: b"a-shared-session-key-for-every-replica".to_vec(),
    }])
    .expect("key");
    let who = Principal {
        issuer: "https://idp.example.com",
        tenant: "acme",
        subject: "alice@example.com",
        upstream: "incidents",
        run: "run-42",
    };
    let upstream_id = b"3f2b8c1e-9a4d-4c7e-b2f1-6d8e0a5c4b3a";
    let sealed = sessions.seal(&who, upstream_id);
    let ctx = EventContext {
        due: vec![Due {
            id: jsonrpc::Id::Number(42),
            method: "tools/call".into(),
        }],
        upstream_event_id: "stream-1/17".into(),
    };
    let mut group = c.benchmark_group("seal");
    group.bench_function("session_seal", |b| {
        b.iter(|| sessions.seal(black_box(&who), black_box(upstream_id)))
    });
    group.bench_function("session_open", |b| {
        b.iter(|| sessions.open(black_box(&who), black_box(sealed.as_bytes())))
    });
    group.bench_function("event_id_seal", |b| {
        b.iter(|| sessions.seal_event(black_box(&who), Some(upstream_id), black_box(&ctx)))
    });
    group.finish();
}

fn bench_inspection(c: &mut Criterion) {
    let args = r#"{"region":"us-west1","query":"SELECT id, name FROM users WHERE created_at > $1 LIMIT 50","params":["2026-01-01"],"limit":50,"ratio":0.25}"#;
    let mut group = c.benchmark_group("inspect");
    group.throughput(Throughput::Bytes(args.len() as u64));
    group.bench_function("exact_numbers_of_arguments", |b| {
        b.iter(|| numbers::first_inexact(black_box(args)))
    });
    let answer = r#"{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","text":"id,name\n1,alice\n2,bob\n3,carol\n4,dave\n5,erin"}],"structuredContent":{"rows":5},"isError":false}}"#;
    group.throughput(Throughput::Bytes(answer.len() as u64));
    group.bench_function("parse_upstream_answer", |b| {
        b.iter(|| jsonrpc::parse_upstream(black_box(answer.as_bytes())))
    });
    group.finish();
}

/// The three JSON readers on the same bodies, each alone: whether one
/// could serve another's role at the same speed (issue 56). The scanner
/// reads in 4 KiB chunks, as a streamed answer arrives.
fn bench_readers(c: &mut Criterion) {
    use mcp_firewall::mcp::jsonrpc::readers;
    use mcp_firewall::mcp::scan::Scan;
    let answer = r#"{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","text":"id,name\n1,alice\n2,bob\n3,carol\n4,dave\n5,erin"}],"structuredContent":{"rows":5},"isError":false}}"#;
    let tools: Vec<String> = (0..100)
        .map(|i| format!(r#"{{"name":"tool_{i}","description":"Does thing {i} to the cluster","inputSchema":{{"type":"object","properties":{{"namespace":{{"type":"string"}},"limit":{{"type":"integer"}}}}}},"annotations":{{"title":"Tool {i}","readOnlyHint":true}}}}"#))
        .collect();
    let list = format!(
        r#"{{"jsonrpc":"2.0","id":7,"result":{{"tools":[{}]}}}}"#,
        tools.join(",")
    );
    let mut group = c.benchmark_group("readers");
    // Each body with the validator and the tape in its role (client limits
    // for the request, upstream limits for answers).
    type Reads = fn(&[u8]) -> bool;
    let request: (Reads, Reads) = (readers::request_validated, readers::request_on_tape);
    let answers: (Reads, Reads) = (readers::answer_validated, readers::answer_on_tape);
    for (name, body, (validated, on_tape)) in [
        ("request", CALL, request),
        ("answer", answer, answers),
        ("list_100", list.as_str(), answers),
    ] {
        let b_ = body.as_bytes();
        group.throughput(Throughput::Bytes(b_.len() as u64));
        group.bench_function(format!("{name}_validator"), |b| {
            b.iter(|| validated(black_box(b_)))
        });
        group.bench_function(format!("{name}_tape"), |b| {
            b.iter(|| on_tape(black_box(b_)))
        });
        group.bench_function(format!("{name}_scanner"), |b| {
            b.iter(|| {
                let mut s = Scan::new("mcp-firewall/cost");
                for chunk in black_box(b_).chunks(4096) {
                    let _ = s.push(chunk);
                }
                s.finish()
            })
        });
        if name != "request" {
            group.bench_function(format!("{name}_parse_validator"), |b| {
                b.iter(|| readers::answer_by_validator(black_box(b_)))
            });
            group.bench_function(format!("{name}_parse_tape"), |b| {
                b.iter(|| jsonrpc::parse_upstream(black_box(b_)))
            });
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_readers,
    bench_jsonrpc,
    bench_sse,
    bench_headers,
    bench_seal,
    bench_inspection
);
criterion_main!(benches);
