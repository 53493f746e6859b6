//! The JSON readers hold one verdict: the serde validator, the tape and the
//! streaming scanner against a reference reading (serde_json's decoded
//! values with the key rules written out) and one another, on requests,
//! single answers and batches, with the scanner fed in two chunks split
//! where the first byte says (`mcp_firewall::mcp::jsonrpc::differential`).
//! A body holding a NUL byte (never JSON) is two answers: the second is
//! also read with the list elements the first taught the tape, and must
//! read as it does afresh. A body sent as an SSE event's data lines comes
//! out of the event decoder as the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::mcp::jsonrpc::differential::{check_answer, check_known, check_request};
use mcp_firewall::mcp::sse::Decoder;

fuzz_target!(|data: &[u8]| {
    let Some((&split, body)) = data.split_first() else {
        return;
    };
    if let Err(e) = check_answer(body, usize::from(split) * body.len() / 255) {
        panic!("answer readers disagree: {e}");
    }
    if let Err(e) = check_request(body) {
        panic!("request readers disagree: {e}");
    }
    if let Some(nul) = body.iter().position(|&b| b == 0) {
        let (first, second) = (&body[..nul], &body[nul + 1..]);
        if let Err(e) = check_known(first, second) {
            panic!("known elements read otherwise: {e}");
        }
    }
    if !body.contains(&b'\r') && std::str::from_utf8(body).is_ok() {
        let mut stream = Vec::new();
        for line in body.split(|&b| b == b'\n') {
            stream.extend_from_slice(b"data: ");
            stream.extend_from_slice(line);
            stream.push(b'\n');
        }
        stream.push(b'\n');
        let mut d = Decoder::new(1 << 20);
        if d.push(&stream).is_ok() {
            let event = d.next_event().expect("one event");
            assert_eq!(event.data.as_bytes(), body, "SSE data is not the body");
        }
    }
});
