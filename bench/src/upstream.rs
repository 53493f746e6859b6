//! The canned upstream: a minimal hyper server that answers MCP's hot
//! methods from pre-rendered bytes, so it is never what limits a run.
//!
//! Routes (every target is driven with the same paths, so nginx and the
//! firewall can forward the path unchanged):
//! - `POST /mcp/bench`: `application/json` answers;
//! - `POST /mcp/bench-sse`: the same answers as one SSE `message` event;
//! - `POST /mcp/bench-hold`: SSE; a `tools/call` first gets an SSE comment,
//!   then the stream is held open for the configured time before the result
//!   (many concurrent open streams for the memory measurement);
//! - `POST /mcp/bench-fresh`: JSON like `/mcp/bench`, but the last tool of
//!   every `tools/list` result carries a counter of its own in its `_meta`
//!   (`{"tools":[…,{…,"_meta":{"mcp-bench/listing":N}}]}`): no two results,
//!   and no two `tools` arrays, are byte-identical, so a proxy cannot reuse
//!   a view it computed from an earlier one (the firewall's remembered views,
//!   of the result and of its tools, stay cold), while the other tools never
//!   change (as when an upstream changes one tool).
//!
//! Methods: `tools/list` (the whole catalog), `tools/call` (the same result
//! for every tool), `ping`, `initialize`; notifications and responses get
//! `202`; anything else `-32601`. Batches (2025-03-26) get an array of the
//! answers to their requests.
//!
//! Invariants: nothing is parsed beyond each message's `id` and `method`
//! (serde skips the rest without building values); answers are assembled
//! from shared `Bytes` without copying the catalog (the id is the only
//! per-request allocation besides the frame list); no request is logged.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

use crate::catalog::Catalog;

/// Path of the JSON route.
pub const ROUTE_JSON: &str = "/mcp/bench";
/// Path of the SSE route.
pub const ROUTE_SSE: &str = "/mcp/bench-sse";
/// Path of the held-SSE route.
pub const ROUTE_HOLD: &str = "/mcp/bench-hold";
/// Path of the JSON route whose `tools/list` result differs every time.
pub const ROUTE_FRESH: &str = "/mcp/bench-fresh";

/// Largest request body the upstream reads.
const MAX_BODY: usize = 1 << 20;

/// What the upstream answers with.
#[derive(Debug)]
pub struct Answers {
    list_result: Bytes,
    call_result: Bytes,
    hold: Duration,
    /// `tools/list` results answered on the fresh route so far.
    listings: AtomicU64,
}

/// Why a request could not be answered normally.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Reading the request body failed.
    #[error("reading the request body: {0}")]
    Body(#[source] hyper::Error),
    /// The body is over `MAX_BODY`.
    #[error("request body over {limit} bytes")]
    TooLarge {
        /// The cap.
        limit: usize,
    },
    /// Binding or accepting failed.
    #[error("upstream socket: {0}")]
    Io(#[from] std::io::Error),
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Json,
    Sse,
    Hold,
    Fresh,
}

// === impl Answers ===

impl Answers {
    /// Answers from a catalog; `hold` is how long the hold route keeps a
    /// `tools/call` stream open.
    pub fn new(catalog: &Catalog, hold: Duration) -> Answers {
        Answers {
            list_result: Bytes::from(catalog.list_result.clone()),
            call_result: Bytes::from(catalog.call_result.clone()),
            hold,
            listings: AtomicU64::new(0),
        }
    }

    /// Appends the `result` of `method` as frames; `fresh` gives the last
    /// tool of a `tools/list` result its own counter (the catalog's bytes
    /// are shared, only the counter is new). Returns false for an unknown
    /// method.
    fn push_result(&self, method: &str, fresh: bool, parts: &mut VecDeque<Bytes>) -> bool {
        // `{"tools":[…,{…}]}`: the last tool's closing brace is 3 from the end.
        let last = self.list_result.len().saturating_sub(3);
        if fresh && method == "tools/list" && self.list_result.get(last..) == Some(b"}]}") {
            let n = self.listings.fetch_add(1, Ordering::Relaxed);
            parts.push_back(self.list_result.slice(..last));
            parts.push_back(Bytes::from(format!(
                ",\"_meta\":{{\"mcp-bench/listing\":{n}}}}}]}}"
            )));
            return true;
        }
        match self.result_for(method) {
            Some(result) => {
                parts.push_back(result);
                true
            }
            None => false,
        }
    }

    fn result_for(&self, method: &str) -> Option<Bytes> {
        match method {
            "tools/list" => Some(self.list_result.clone()),
            "tools/call" => Some(self.call_result.clone()),
            "ping" => Some(Bytes::from_static(b"{}")),
            "initialize" => Some(Bytes::from_static(
                br#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":false}},"serverInfo":{"name":"mcp-bench-upstream","version":"0.1.0"}}"#,
            )),
            _ => None,
        }
    }
}

/// Serves `listener` (optionally behind TLS) until `stop` turns true.
/// Connections already open are left to finish on their own.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    answers: Arc<Answers>,
    mut stop: watch::Receiver<bool>,
) {
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    accept_until(&listener, &mut stop, "upstream", |stream| {
        let answers = answers.clone();
        let builder = builder.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let answers = answers.clone();
                async move { Ok::<_, Infallible>(handle(&answers, req).await) }
            });
            match tls {
                Some(acceptor) => {
                    if let Ok(s) = acceptor.accept(stream).await {
                        let _ = builder.serve_connection(TokioIo::new(s), svc).await;
                    }
                }
                None => {
                    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                }
            }
        });
    })
    .await;
}

/// Accepts connections on `listener` (TCP_NODELAY: small answers must not
/// wait for Nagle) and hands each to `on_conn`, until `stop` turns true. A
/// failed accept (EMFILE and friends) backs off instead of spinning.
pub async fn accept_until(
    listener: &TcpListener,
    stop: &mut watch::Receiver<bool>,
    who: &str,
    mut on_conn: impl FnMut(TcpStream),
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        match accepted {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                on_conn(stream);
            }
            Err(e) => {
                eprintln!("mcp-bench {who}: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Binds `addr` and returns the listener with its bound address.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), UpstreamError> {
    let l = TcpListener::bind(addr).await?;
    let a = l.local_addr()?;
    Ok((l, a))
}

/// Answers one request.
pub async fn handle(answers: &Answers, req: Request<Incoming>) -> Response<Parts> {
    let route = match req.uri().path() {
        ROUTE_JSON => Route::Json,
        ROUTE_SSE => Route::Sse,
        ROUTE_HOLD => Route::Hold,
        ROUTE_FRESH => Route::Fresh,
        _ => return status(StatusCode::NOT_FOUND),
    };
    if req.method() != Method::POST {
        // No server-initiated stream here (MCP allows 405 for GET).
        return status(StatusCode::METHOD_NOT_ALLOWED);
    }
    let body = match read(req.into_body()).await {
        Ok(b) => b,
        Err(UpstreamError::TooLarge { .. }) => return status(StatusCode::PAYLOAD_TOO_LARGE),
        Err(_) => return status(StatusCode::BAD_REQUEST),
    };
    respond(answers, route, &body)
}

async fn read(body: Incoming) -> Result<Bytes, UpstreamError> {
    let limited = http_body_util::Limited::new(body, MAX_BODY);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => match e.downcast::<hyper::Error>() {
            Ok(h) => Err(UpstreamError::Body(*h)),
            Err(_) => Err(UpstreamError::TooLarge { limit: MAX_BODY }),
        },
    }
}

fn respond(answers: &Answers, route: Route, body: &[u8]) -> Response<Parts> {
    let batch = body
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'[');
    let mut parts = VecDeque::with_capacity(8);
    let mut hold = false;
    if batch {
        let Ok(messages) = serde_json::from_slice::<Vec<Message<'_>>>(body) else {
            return parse_error(route);
        };
        let mut first = true;
        for m in &messages {
            let (Some(id), Some(method)) = (m.id, m.method.as_deref()) else {
                continue;
            };
            parts.push_back(Bytes::from_static(if first { b"[" } else { b"," }));
            first = false;
            answer(answers, route, id, method, &mut parts);
        }
        if first {
            return status(StatusCode::ACCEPTED);
        }
        parts.push_back(Bytes::from_static(b"]"));
    } else {
        let Ok(m) = serde_json::from_slice::<Message<'_>>(body) else {
            return parse_error(route);
        };
        let (Some(id), Some(method)) = (m.id, m.method.as_deref()) else {
            // A notification or a response.
            return status(StatusCode::ACCEPTED);
        };
        hold = route == Route::Hold && method == "tools/call";
        answer(answers, route, id, method, &mut parts);
    }
    finish(route, parts, hold.then_some(answers.hold))
}

/// Appends one JSON-RPC response, as frames that share the catalog's bytes.
fn answer(
    answers: &Answers,
    route: Route,
    id: &RawValue,
    method: &str,
    parts: &mut VecDeque<Bytes>,
) {
    parts.push_back(Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":"));
    parts.push_back(Bytes::copy_from_slice(id.get().as_bytes()));
    parts.push_back(Bytes::from_static(b",\"result\":"));
    if answers.push_result(method, route == Route::Fresh, parts) {
        parts.push_back(Bytes::from_static(b"}"));
    } else {
        // No result after all: replace the `,"result":` just pushed.
        parts.pop_back();
        parts.push_back(Bytes::from_static(
            b",\"error\":{\"code\":-32601,\"message\":\"Method not found\"}}",
        ));
    }
}

/// The canned upstream over stdio (`mcp-bench upstream --stdio`): one
/// JSON-RPC message per line on stdin, its answer (the same bytes `/mcp/bench`
/// answers) as one line on stdout; notifications and responses get nothing.
/// Returns when stdin ends.
pub fn serve_stdio(answers: &Answers) -> std::io::Result<()> {
    use std::io::{BufRead, Write};
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut line = Vec::with_capacity(4096);
    let mut input = stdin.lock();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        let Some(answer) = stdio_answer(answers, &line) else {
            continue;
        };
        out.write_all(&answer)?;
        out.write_all(b"\n")?;
        out.flush()?;
    }
}

/// The answer to one stdio line (`None`: nothing to answer).
pub fn stdio_answer(answers: &Answers, line: &[u8]) -> Option<Vec<u8>> {
    let m = serde_json::from_slice::<Message<'_>>(line).ok()?;
    let (Some(id), Some(method)) = (m.id, m.method.as_deref()) else {
        return None;
    };
    let mut parts = VecDeque::with_capacity(8);
    answer(answers, Route::Json, id, method, &mut parts);
    Some(parts.iter().flat_map(|b| b.iter().copied()).collect())
}

fn parse_error(route: Route) -> Response<Parts> {
    let mut parts = VecDeque::new();
    parts.push_back(Bytes::from_static(
        b"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":\"Parse error\"}}",
    ));
    finish(route, parts, None)
}

fn finish(route: Route, mut parts: VecDeque<Bytes>, hold: Option<Duration>) -> Response<Parts> {
    let content_type = if matches!(route, Route::Json | Route::Fresh) {
        "application/json"
    } else {
        parts.push_front(Bytes::from_static(b"event: message\ndata: "));
        parts.push_back(Bytes::from_static(b"\n\n"));
        "text/event-stream"
    };
    let body = match hold {
        Some(d) => {
            parts.push_front(Bytes::from_static(b": working\n\n"));
            Parts::held(parts, d)
        }
        None => Parts::new(parts),
    };
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if !matches!(route, Route::Json | Route::Fresh) {
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    r
}

fn status(code: StatusCode) -> Response<Parts> {
    let mut r = Response::new(Parts::new(VecDeque::new()));
    *r.status_mut() = code;
    r
}

/// A response body of ready frames, optionally pausing once after the first
/// frame (the hold route). The length is exact when there is no pause, so
/// HTTP/1.1 answers carry `Content-Length`.
pub struct Parts {
    frames: VecDeque<Bytes>,
    remaining: u64,
    pause: Option<Pin<Box<Sleep>>>,
    sent_first: bool,
}

// === impl Parts ===

impl Parts {
    fn new(frames: VecDeque<Bytes>) -> Parts {
        let remaining = frames.iter().map(|f| f.len() as u64).sum();
        Parts {
            frames,
            remaining,
            pause: None,
            sent_first: false,
        }
    }

    fn held(frames: VecDeque<Bytes>, hold: Duration) -> Parts {
        let mut p = Parts::new(frames);
        p.pause = Some(Box::pin(tokio::time::sleep(hold)));
        p
    }
}

impl Body for Parts {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.sent_first {
            if let Some(pause) = this.pause.as_mut() {
                if pause.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.pause = None;
            }
        }
        match this.frames.pop_front() {
            Some(f) => {
                this.sent_first = true;
                this.remaining = this.remaining.saturating_sub(f.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(f))))
            }
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        if self.pause.is_some() {
            let mut h = SizeHint::new();
            h.set_lower(self.remaining);
            h
        } else {
            SizeHint::with_exact(self.remaining)
        }
    }
}

#[cfg(test)]
#[path = "upstream_tests.rs"]
mod tests;
