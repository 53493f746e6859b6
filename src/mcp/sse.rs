//! Server-Sent Events framing for streamable HTTP: an incremental decoder that
//! follows the WHATWG event-stream parsing rules, and a canonical encoder.
//!
//! Invariants:
//! - Decoding does not depend on how the stream is chunked: the same bytes
//!   give the same events whatever the split points, including inside a CRLF
//!   or a multi-byte UTF-8 character. The one visible difference is
//!   [`Event::raw`] of an event whose final CR arrives at the end of a chunk:
//!   it is dispatched at once (no added latency) and the LF that follows in
//!   the next chunk, which only completes that CRLF, is dropped.
//! - [`Event::raw`] is the exact byte slice of the event from its first line
//!   to its terminating blank line inclusive, so an event the firewall does
//!   not change can be relayed byte-for-byte. Blank lines between events and
//!   the optional leading BOM belong to no event and are dropped.
//! - Every block of lines ended by a blank line is an event, even one with no
//!   `data` (an `id`/`retry`-only priming event), so a relay never loses ids or
//!   retry hints.
//! - A comment line outside an event (a keep-alive such as `:\r\n`, which
//!   servers send as a bare line) is an event of its own, dispatched as soon as
//!   its line ends, with `raw` = that line. Waiting for a blank line would hold
//!   keep-alives back on long-lived streams until clients time out. A blank
//!   line after it dispatches nothing (WHATWG) and is dropped.
//! - Memory is bounded: the bytes buffered for one event never exceed
//!   `max_event_bytes` before [`SseError::EventTooLarge`] is returned.

use std::collections::VecDeque;
use std::fmt::Write as _;

use bytes::{Buf, Bytes, BytesMut};

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// A decoding failure. The decoder is unusable afterwards.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// One event (from its first line to its terminating blank line) is
    /// larger than the configured cap.
    #[error("SSE event exceeds the limit of {limit} bytes")]
    EventTooLarge {
        /// The configured `max_event_bytes`.
        limit: usize,
    },
}

/// One event of an event stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Event {
    /// The last `id` field (the WHATWG "last event ID"); an `id` whose value
    /// contains NUL is ignored, as browsers do.
    pub id: Option<String>,
    /// The last `event` field (the event type).
    pub event: Option<String>,
    /// The `data` fields joined with `\n`.
    pub data: String,
    /// The last `retry` field that was all ASCII digits, in milliseconds.
    pub retry: Option<u64>,
    /// The comment lines (after `:`, one leading space stripped), in order. A
    /// comment outside any event is an event of its own with only this set.
    pub comments: Vec<String>,
    /// True when at least one `data` field was present: exactly the events an
    /// EventSource would dispatch (an empty `data:` line still dispatches).
    pub has_data: bool,
    /// The exact bytes of the event including its terminating blank line.
    pub raw: Bytes,
}

/// Incremental event-stream decoder.
///
/// Feed bytes with [`Decoder::push`], then take complete events with
/// [`Decoder::next_event`] until it returns `None`; call [`Decoder::finish`]
/// at the end of the stream. Events are parsed eagerly during `push`, so
/// `next_event` is a queue pop.
#[derive(Debug)]
pub struct Decoder {
    max_event_bytes: usize,
    /// The current event's bytes (lines already applied to `current`) followed
    /// by not yet processed bytes starting at `scan`. Appending the chunk here
    /// is the decoder's one copy: `raw` is then a zero-copy split of it.
    buf: BytesMut,
    scan: usize,
    /// The last line ended with a CR at the end of the buffer: an LF arriving
    /// next completes that CRLF and is not a line ending of its own.
    skip_lf: bool,
    bom_checked: bool,
    current: Pending,
    ready: VecDeque<Event>,
    failed: Option<SseError>,
}

/// Fields of the event being read.
#[derive(Debug, Default)]
struct Pending {
    started: bool,
    id: Option<String>,
    event: Option<String>,
    data: String,
    has_data: bool,
    retry: Option<u64>,
    comments: Vec<String>,
}

impl Decoder {
    /// A decoder that rejects events larger than `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Decoder {
        Decoder {
            max_event_bytes,
            buf: BytesMut::new(),
            scan: 0,
            skip_lf: false,
            bom_checked: false,
            current: Pending::default(),
            ready: VecDeque::new(),
            failed: None,
        }
    }

    /// Appends a chunk of the stream and parses every event it completes.
    ///
    /// On error, events completed before the oversized one stay available
    /// from [`Decoder::next_event`]; further pushes return the same error.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), SseError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        self.buf.extend_from_slice(chunk);
        let result = self.process();
        if let Err(err) = &result {
            self.failed = Some(err.clone());
        }
        result
    }

    /// The next complete event, in stream order.
    pub fn next_event(&mut self) -> Option<Event> {
        self.ready.pop_front()
    }

    /// Ends the stream. Per the HTML standard an unterminated final event is
    /// discarded: returns its bytes when there were any (`None` for a clean
    /// end). Complete events stay available from [`Decoder::next_event`], and
    /// the decoder is ready for a new stream.
    pub fn finish(&mut self) -> Option<Bytes> {
        let pending = std::mem::take(&mut self.buf).freeze();
        self.scan = 0;
        self.skip_lf = false;
        self.bom_checked = false;
        self.current = Pending::default();
        self.failed = None;
        (!pending.is_empty()).then_some(pending)
    }

    fn process(&mut self) -> Result<(), SseError> {
        if !self.bom_checked {
            // The BOM may itself be split across chunks: wait for 3 bytes.
            if self.buf.len() < BOM.len() && BOM.starts_with(&self.buf) {
                return Ok(());
            }
            if self.buf.starts_with(BOM) {
                self.buf.advance(BOM.len());
            }
            self.bom_checked = true;
        }
        loop {
            if self.skip_lf {
                let Some(&first) = self.buf.get(self.scan) else {
                    break;
                };
                self.skip_lf = false;
                if first == b'\n' {
                    self.scan += 1;
                    if !self.current.started {
                        self.drop_scanned();
                    }
                }
            }
            let Some(offset) = memchr::memchr2(b'\n', b'\r', &self.buf[self.scan..]) else {
                break;
            };
            let end = self.scan + offset;
            let terminator = if self.buf[end] == b'\r' {
                match self.buf.get(end + 1) {
                    Some(b'\n') => 2,
                    Some(_) => 1,
                    None => {
                        self.skip_lf = true;
                        1
                    }
                }
            } else {
                1
            };
            let next = end + terminator;
            if end > self.scan {
                let line = &self.buf[self.scan..end];
                if !self.current.started && line[0] == b':' {
                    apply_line(&mut self.current, line);
                    self.dispatch(next)?;
                } else {
                    self.current.started = true;
                    apply_line(&mut self.current, line);
                    self.scan = next;
                }
            } else if self.current.started {
                self.dispatch(next)?;
            } else {
                // A blank line outside any event: nothing to dispatch or relay.
                self.scan = next;
                self.drop_scanned();
            }
        }
        if self.buf.len() > self.max_event_bytes {
            return Err(SseError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        Ok(())
    }

    fn drop_scanned(&mut self) {
        self.buf.advance(self.scan);
        self.scan = 0;
    }

    fn dispatch(&mut self, end: usize) -> Result<(), SseError> {
        // Measure without the LF of a final CRLF, so the limit does not depend
        // on whether that LF arrived in the same chunk as the CR.
        let measured = if self.buf[..end].ends_with(b"\r\n") {
            end - 1
        } else {
            end
        };
        if measured > self.max_event_bytes {
            return Err(SseError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        let raw = self.buf.split_to(end).freeze();
        self.scan = 0;
        let p = std::mem::take(&mut self.current);
        self.ready.push_back(Event {
            id: p.id,
            event: p.event,
            data: p.data,
            retry: p.retry,
            comments: p.comments,
            has_data: p.has_data,
            raw,
        });
        Ok(())
    }
}

/// Applies one non-empty line (without its terminator) to the event.
fn apply_line(event: &mut Pending, line: &[u8]) {
    if let Some(comment) = line.strip_prefix(b":") {
        event.comments.push(text(strip_space(comment)).into_owned());
        return;
    }
    let (field, value) = match memchr::memchr(b':', line) {
        Some(colon) => (&line[..colon], strip_space(&line[colon + 1..])),
        None => (line, &b""[..]),
    };
    match field {
        b"data" => {
            if event.has_data {
                event.data.push('\n');
            }
            event.data.push_str(&text(value));
            event.has_data = true;
        }
        b"event" => event.event = Some(text(value).into_owned()),
        // An id containing NUL is ignored (WHATWG), but stays in `raw`.
        b"id" if !value.contains(&0) => event.id = Some(text(value).into_owned()),
        // Only all-digit values count; a value beyond u64 is ignored like any
        // other unusable retry. All digits also means valid UTF-8.
        b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
            if let Some(ms) = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
            {
                event.retry = Some(ms);
            }
        }
        // Unknown fields carry no meaning but stay in `raw`.
        _ => {}
    }
}

fn strip_space(value: &[u8]) -> &[u8] {
    value.strip_prefix(b" ").unwrap_or(value)
}

/// The stream is UTF-8 decoded with replacement (WHATWG); a complete line never
/// ends inside a character, so per-line decoding is exact.
fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// Writes `event` in canonical form: `event:`, `id:`, `retry:`, `data:` lines
/// (one per line of `data`, split on CRLF, CR or LF), comments, then a blank
/// line; every line ends in LF.
///
/// Comments come last so that [`Decoder`] reads them back as part of the same
/// event; an event with nothing but comments decodes as one comment event per
/// line (see the module invariants).
///
/// Values that cannot be represented are made safe rather than allowed to
/// inject fields: `event` and `id` are cut at their first CR or LF, an `id`
/// containing NUL is omitted (a reader would ignore it), and a comment with
/// line breaks becomes several comment lines.
pub fn encode(event: &Event, out: &mut BytesMut) {
    out.reserve(event.data.len() + 32);
    if let Some(kind) = &event.event {
        field(out, b"event", first_line(kind.as_bytes()));
    }
    if let Some(id) = &event.id {
        if !id.contains('\0') {
            field(out, b"id", first_line(id.as_bytes()));
        }
    }
    if let Some(retry) = event.retry {
        // BytesMut's fmt::Write never fails.
        let _ = writeln!(out, "retry: {retry}");
    }
    if event.has_data || !event.data.is_empty() {
        for line in lines(event.data.as_bytes()) {
            field(out, b"data", line);
        }
    }
    for comment in &event.comments {
        for line in lines(comment.as_bytes()) {
            out.extend_from_slice(b":");
            if !line.is_empty() {
                out.extend_from_slice(b" ");
                out.extend_from_slice(line);
            }
            out.extend_from_slice(b"\n");
        }
    }
    out.extend_from_slice(b"\n");
}

/// Writes one event carrying one JSON-RPC message: optional `id:`, the JSON as
/// `data:` (split into several `data:` lines only if it contains line breaks,
/// which compact JSON never does), and the blank line.
pub fn encode_message(id: Option<&str>, json: &[u8], out: &mut BytesMut) {
    out.reserve(json.len() + id.map_or(0, str::len) + 16);
    if let Some(id) = id {
        if !id.contains('\0') {
            field(out, b"id", first_line(id.as_bytes()));
        }
    }
    for line in lines(json) {
        field(out, b"data", line);
    }
    out.extend_from_slice(b"\n");
}

fn field(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\n");
}

fn first_line(value: &[u8]) -> &[u8] {
    match memchr::memchr2(b'\n', b'\r', value) {
        Some(end) => &value[..end],
        None => value,
    }
}

/// Splits on CRLF, CR or LF; always yields at least one (possibly empty) line.
fn lines(mut value: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        match memchr::memchr2(b'\n', b'\r', value) {
            None => {
                done = true;
                Some(value)
            }
            Some(end) => {
                let line = &value[..end];
                let skip = if value[end] == b'\r' && value.get(end + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                value = &value[end + skip..];
                Some(line)
            }
        }
    })
}

#[cfg(test)]
#[path = "sse_tests.rs"]
mod tests;
