//! PROVISIONAL stand-in with the agreed API; replaced by the wire module.
#![allow(missing_docs, dead_code)]
use bytes::{Bytes, BytesMut};

#[derive(Debug, thiserror::Error)]
pub enum SseError {
    #[error("SSE event larger than {limit} bytes")]
    EventTooLarge { limit: usize },
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Event {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
    pub retry: Option<u64>,
    pub comments: Vec<String>,
    pub raw: Bytes,
}

pub struct Decoder {
    buf: BytesMut,
    max: usize,
}

impl Decoder {
    pub fn new(max_event_bytes: usize) -> Self {
        Decoder {
            buf: BytesMut::new(),
            max: max_event_bytes,
        }
    }
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), SseError> {
        self.buf.extend_from_slice(chunk);
        Ok(())
    }
    pub fn next_event(&mut self) -> Result<Option<Event>, SseError> {
        let pos = self.buf.windows(2).position(|w| w == b"\n\n");
        let Some(pos) = pos else {
            if self.buf.len() > self.max {
                return Err(SseError::EventTooLarge { limit: self.max });
            }
            return Ok(None);
        };
        let raw = self.buf.split_to(pos + 2).freeze();
        let mut ev = Event {
            raw: raw.clone(),
            ..Default::default()
        };
        let mut data: Vec<&str> = Vec::new();
        let text = String::from_utf8_lossy(&raw[..pos]).into_owned();
        for line in text.split('\n') {
            if let Some(c) = line.strip_prefix(':') {
                ev.comments.push(c.trim_start().to_owned());
                continue;
            }
            let (f, v) = line.split_once(':').unwrap_or((line, ""));
            let v = v.strip_prefix(' ').unwrap_or(v);
            match f {
                "data" => data.push(v),
                "id" => ev.id = Some(v.to_owned()),
                "event" => ev.event = Some(v.to_owned()),
                "retry" => ev.retry = v.parse().ok(),
                _ => {}
            }
        }
        ev.data = data.join("\n");
        Ok(Some(ev))
    }
    pub fn finish(&mut self) -> bool {
        !self.buf.is_empty()
    }
}

pub fn encode(event: &Event, out: &mut BytesMut) {
    for c in &event.comments {
        out.extend_from_slice(b": ");
        out.extend_from_slice(c.as_bytes());
        out.extend_from_slice(b"\n");
    }
    if let Some(e) = &event.event {
        out.extend_from_slice(format!("event: {e}\n").as_bytes());
    }
    if let Some(i) = &event.id {
        out.extend_from_slice(format!("id: {i}\n").as_bytes());
    }
    if let Some(r) = event.retry {
        out.extend_from_slice(format!("retry: {r}\n").as_bytes());
    }
    for l in event.data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(l.as_bytes());
        out.extend_from_slice(b"\n");
    }
    out.extend_from_slice(b"\n");
}

pub fn encode_message(id: Option<&str>, json: &[u8], out: &mut BytesMut) {
    out.extend_from_slice(b"event: message\n");
    if let Some(i) = id {
        out.extend_from_slice(format!("id: {i}\n").as_bytes());
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
}
