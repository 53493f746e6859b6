//! Relaying an upstream's response to the client.
//!
//! - `202` and other bodiless answers pass through as they are.
//! - `application/json` bodies are read up to the response cap, inspected
//!   (responses to `tools/list` are rewritten by the policy) and sent whole,
//!   so a connection that breaks mid-body still becomes a readable JSON-RPC
//!   error instead of a truncated document. A body over the cap is streamed
//!   on unmodified when nothing in it needs rewriting.
//! - `text/event-stream` bodies are relayed event by event as they arrive:
//!   a progress notification reaches the client while the call still runs.
//!   Only the partial event in flight is held in memory (capped); events the
//!   firewall does not change are forwarded byte for byte, keeping `id:` and
//!   `retry:` so resumption works. When the stream breaks, every request still
//!   waiting for its answer gets a JSON-RPC error event naming the upstream.
//! - Upstream 5xx answers become a JSON-RPC error naming the upstream and the
//!   status.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::json;

use crate::mcp::jsonrpc::{self, Id, Kind};
use crate::mcp::sse;

use super::body::{full, Body, Collected, UpstreamBody};
use super::error::{codes, ProxyError, UpstreamFailure};
use super::upstream::{response_headers, UpstreamClient};

/// A request forwarded upstream whose answer the firewall waits for.
#[derive(Debug, Clone)]
pub struct Pending {
    /// Its JSON-RPC id.
    pub id: Id,
    /// Its method.
    pub method: String,
}

/// Everything the relay needs to know about one exchange.
pub struct Exchange {
    /// The upstream.
    pub upstream: Arc<UpstreamClient>,
    /// Requests forwarded in this POST (empty for GET streams).
    pub pending: Vec<Pending>,
    /// Cap on one SSE event.
    pub max_sse_event_bytes: usize,
    /// JSON-RPC answers the firewall produced itself for parts of a batch,
    /// merged into the upstream's answer.
    pub local_answers: Vec<Bytes>,
}

// === impl Exchange ===

impl Exchange {
    /// Turns the upstream's response into the client's.
    pub async fn respond(mut self, resp: Response<Incoming>) -> Result<Response<Body>, ProxyError> {
        let (parts, incoming) = resp.into_parts();
        let idle = self.upstream.config.idle_timeout;
        let mut body = UpstreamBody::new(incoming, idle);

        if parts.status.is_server_error() {
            // Drain a little so the pooled connection can be reused; the
            // content is the upstream's business, the status is the cause.
            let _ = body.collect_bounded(64 * 1024).await;
            return Err(self.fail(UpstreamFailure::Status(parts.status.as_u16())));
        }

        let mut headers = response_headers(&parts.headers);
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let is_sse = mime_is(content_type, "text/event-stream");
        let is_json = mime_is(content_type, "application/json");

        if parts.status == StatusCode::ACCEPTED || (!is_sse && !is_json) {
            if !self.local_answers.is_empty() && parts.status == StatusCode::ACCEPTED {
                // The upstream accepted the notifications/responses of a
                // batch; the firewall still owes answers for what it refused.
                let merged = merge_json(None, &self.local_answers);
                return Ok(json_with(StatusCode::OK, headers, merged));
            }
            let stream = passthrough(body);
            let mut r = Response::new(stream);
            *r.status_mut() = parts.status;
            *r.headers_mut() = headers;
            return Ok(r);
        }

        if is_sse {
            headers.insert(
                http::header::HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            );
            let relay = SseRelay {
                body,
                decoder: sse::Decoder::new(self.max_sse_event_bytes),
                ex: self,
                done: false,
                started: false,
            };
            let stream = futures_util::stream::unfold(relay, |mut relay| async move {
                let next = relay.next().await?;
                Some((Ok::<_, super::body::BoxError>(Frame::data(next)), relay))
            });
            let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
            *r.status_mut() = parts.status;
            *r.headers_mut() = headers;
            return Ok(r);
        }

        // application/json
        let limit = self.upstream.config.max_response_bytes;
        let collected = match body.collect_bounded(limit).await {
            Ok(c) => c,
            Err(f) => return Err(self.fail(f)),
        };
        match collected {
            Collected::Complete(bytes) => {
                let out = self.inspect_json(bytes)?;
                Ok(json_with(parts.status, headers, out))
            }
            Collected::Partial(prefix) => {
                if self.needs_rewrite() {
                    return Err(self.fail(UpstreamFailure::TooLarge(limit)));
                }
                let rest = passthrough(body);
                let stream = futures_util::stream::once(async move {
                    Ok::<_, super::body::BoxError>(Frame::data(prefix))
                })
                .chain_body(rest);
                let mut r = Response::new(stream);
                *r.status_mut() = parts.status;
                *r.headers_mut() = headers;
                Ok(r)
            }
        }
    }

    fn needs_rewrite(&self) -> bool {
        self.pending.iter().any(|p| p.method == "tools/list")
    }

    fn fail(&self, failure: UpstreamFailure) -> ProxyError {
        ProxyError::Upstream {
            upstream: self.upstream.config.name.clone(),
            failure,
            ids: self.pending.iter().map(|p| p.id.clone()).collect(),
        }
    }

    /// Inspects a complete JSON answer (one message or a batch of them).
    fn inspect_json(&mut self, bytes: Bytes) -> Result<Bytes, ProxyError> {
        if self.pending.is_empty() && self.local_answers.is_empty() {
            return Ok(bytes);
        }
        let limits = jsonrpc::Limits {
            max_depth: 128,
            max_batch: usize::MAX,
        };
        let env = match jsonrpc::parse(&bytes, &limits) {
            Ok(env) => env,
            Err(e) => {
                // What the firewall must filter and cannot read never passes.
                if self.needs_rewrite() {
                    return Err(self.fail(UpstreamFailure::Invalid(e.to_string())));
                }
                return Ok(bytes);
            }
        };
        for m in &env.messages {
            if m.kind == Kind::Response {
                if let Some(id) = &m.id {
                    self.pending.retain(|p| &p.id != id);
                }
            }
        }
        if self.local_answers.is_empty() {
            return Ok(bytes);
        }
        Ok(merge_json(Some(&bytes), &self.local_answers))
    }
}

/// Streams an SSE response event by event.
struct SseRelay {
    body: UpstreamBody,
    decoder: sse::Decoder,
    ex: Exchange,
    done: bool,
    started: bool,
}

impl SseRelay {
    /// The next bytes to send to the client; `None` when the stream is over.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            let mut out = BytesMut::new();
            if !self.started {
                self.started = true;
                for answer in std::mem::take(&mut self.ex.local_answers) {
                    sse::encode_message(None, &answer, &mut out);
                }
                if !out.is_empty() {
                    return Some(out.freeze());
                }
            }
            match self.body.chunk().await {
                Ok(Some(chunk)) => {
                    if let Err(e) = self.decoder.push(&chunk) {
                        return self.end(UpstreamFailure::Invalid(e.to_string()));
                    }
                    while let Some(ev) = self.decoder.next_event() {
                        self.on_event(ev, &mut out);
                    }
                    if !out.is_empty() {
                        return Some(out.freeze());
                    }
                }
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(f) => return self.end(f),
            }
        }
    }

    fn on_event(&mut self, ev: sse::Event, out: &mut BytesMut) {
        if ev.has_data && !ev.data.is_empty() {
            let limits = jsonrpc::Limits {
                max_depth: 128,
                max_batch: usize::MAX,
            };
            if let Ok(env) = jsonrpc::parse(ev.data.as_bytes(), &limits) {
                for m in &env.messages {
                    if m.kind == Kind::Response {
                        if let Some(id) = &m.id {
                            self.ex.pending.retain(|p| &p.id != id);
                        }
                    }
                }
            }
        }
        out.extend_from_slice(&ev.raw);
    }

    /// Ends a broken stream: every request still waiting gets an error event.
    fn end(&mut self, failure: UpstreamFailure) -> Option<Bytes> {
        self.done = true;
        tracing::warn!(upstream = %self.ex.upstream.config.name, error = %failure, "upstream stream failed");
        let mut out = BytesMut::new();
        let msg = format!(
            "upstream {:?} failed: {failure}",
            self.ex.upstream.config.name
        );
        let data = json!({
            "upstream": self.ex.upstream.config.name,
            "cause": failure.to_string(),
            "stop_reason": "upstream_error",
        });
        for p in std::mem::take(&mut self.ex.pending) {
            let body = jsonrpc::error_body(Some(&p.id), codes::UPSTREAM_ERROR, &msg, Some(&data));
            sse::encode_message(None, &body, &mut out);
        }
        if out.is_empty() {
            None
        } else {
            Some(out.freeze())
        }
    }
}

/// A body that forwards the upstream's chunks as they come.
fn passthrough(body: UpstreamBody) -> Body {
    let stream = futures_util::stream::unfold(body, |mut body| async move {
        match body.chunk().await {
            Ok(Some(chunk)) => Some((Ok(Frame::data(chunk)), body)),
            Ok(None) => None,
            Err(f) => Some((Err(Box::new(f) as super::body::BoxError), body)),
        }
    });
    StreamBody::new(stream).boxed_unsync()
}

trait ChainBody {
    fn chain_body(self, rest: Body) -> Body;
}

impl<S> ChainBody for S
where
    S: futures_util::Stream<Item = Result<Frame<Bytes>, super::body::BoxError>> + Send + 'static,
{
    fn chain_body(self, rest: Body) -> Body {
        use futures_util::StreamExt;
        let rest = http_body_util::BodyStream::new(rest);
        StreamBody::new(self.chain(rest)).boxed_unsync()
    }
}

fn json_with(status: StatusCode, mut headers: http::HeaderMap, body: Bytes) -> Response<Body> {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    r
}

/// Merges the upstream's JSON answer (an object or an array) with the
/// firewall's own answers into one JSON array.
fn merge_json(upstream: Option<&Bytes>, local: &[Bytes]) -> Bytes {
    let mut out = Vec::with_capacity(
        upstream.map_or(0, Bytes::len) + local.iter().map(Bytes::len).sum::<usize>() + 8,
    );
    out.push(b'[');
    let mut first = true;
    if let Some(u) = upstream {
        let t = trim_ascii(u);
        let inner = if t.first() == Some(&b'[') && t.last() == Some(&b']') {
            trim_ascii(&t[1..t.len() - 1])
        } else {
            t
        };
        if !inner.is_empty() {
            out.extend_from_slice(inner);
            first = false;
        }
    }
    for a in local {
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(a);
        first = false;
    }
    out.push(b']');
    Bytes::from(out)
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

/// `true` when a Content-Type's media type (parameters ignored) is `expected`.
pub fn mime_is(content_type: &str, expected: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|m| m.trim().eq_ignore_ascii_case(expected))
}
