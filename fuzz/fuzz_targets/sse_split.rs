//! SSE framing: any split of a stream into chunks yields the same events,
//! the same error, and the same unterminated tail as the stream in one
//! piece; every event's `raw` bytes are bytes of the stream, in order (blank
//! lines outside an event belong to none).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::mcp::sse::{Decoder, Event};

fn decode(chunks: &[&[u8]], limit: usize) -> (Vec<Event>, bool, Option<bytes::Bytes>) {
    let mut d = Decoder::new(limit);
    let mut failed = false;
    for c in chunks {
        if d.push(c).is_err() {
            failed = true;
            break;
        }
    }
    let mut events = Vec::new();
    while let Some(e) = d.next_event() {
        events.push(e);
    }
    let tail = if failed { None } else { d.finish() };
    (events, failed, tail)
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let limit = 16 + usize::from(head) * 4;
    let (whole, failed, tail) = decode(&[rest], limit);
    // Split at positions the input's own bytes choose.
    let mut cuts: Vec<usize> = rest
        .iter()
        .step_by(7)
        .map(|b| usize::from(*b) % (rest.len() + 1))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut chunks = Vec::new();
    let mut at = 0;
    for c in cuts {
        chunks.push(&rest[at..c]);
        at = c;
    }
    chunks.push(&rest[at..]);
    let (split, split_failed, split_tail) = decode(&chunks, limit);
    assert_eq!(
        failed, split_failed,
        "an error depends on how the stream was split"
    );
    assert_eq!(
        whole.len(),
        split.len(),
        "events depend on how the stream was split"
    );
    for (w, s) in whole.iter().zip(&split) {
        let fields = |e: &Event| {
            (
                e.id.clone(),
                e.event.clone(),
                e.data.clone(),
                e.retry,
                e.comments.clone(),
                e.has_data,
            )
        };
        assert_eq!(
            fields(w),
            fields(s),
            "an event's fields depend on how the stream was split"
        );
        // By design an event ended by a CR at the end of a chunk is
        // dispatched at once (a lone CR ends a line): only the LF of a final
        // CRLF split there may be missing from its raw bytes.
        let same =
            w.raw == s.raw || (w.raw.ends_with(b"\r\n") && s.raw[..] == w.raw[..w.raw.len() - 1]);
        assert!(same, "raw {:?} vs {:?}", w.raw, s.raw);
    }
    if !failed {
        assert_eq!(tail, split_tail);
    }
    let body = rest
        .strip_prefix(b"\xEF\xBB\xBF".as_slice())
        .unwrap_or(rest);
    let mut at = 0;
    for e in &whole {
        let found = body[at..]
            .windows(e.raw.len().max(1))
            .position(|w| w == &e.raw[..])
            .unwrap_or_else(|| panic!("an event's raw bytes are not the stream's"));
        at += found + e.raw.len();
    }
});
