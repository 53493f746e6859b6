//! Scripted raw HTTP upstreams for transport-level tests: they record every
//! request they receive and answer with whatever the test scripts, including
//! failures a real MCP server library would never produce on purpose
//! (5xx, resets in the middle of a stream, silence).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type RawBody = UnsyncBoxBody<Bytes, BoxError>;

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: http::Method,
    pub uri: http::Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A scripted upstream.
pub struct RawUpstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RawUpstream {
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
    pub fn hits(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts an upstream answering every request with `respond(seen)`.
pub async fn upstream<F, Fut>(respond: F) -> RawUpstream
where
    F: Fn(Seen) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<RawBody>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let respond = Arc::new(respond);
    let log = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let respond = respond.clone();
            let log = log.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let respond = respond.clone();
                    let log = log.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body
                            .collect()
                            .await
                            .map(|c| c.to_bytes())
                            .unwrap_or_default();
                        let seen = Seen {
                            method: parts.method,
                            uri: parts.uri,
                            headers: parts.headers,
                            body,
                        };
                        log.lock().unwrap().push(seen.clone());
                        Ok::<_, Infallible>(respond(seen).await)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    RawUpstream { addr, seen, task }
}

pub fn full(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<RawBody> {
    let mut r = Response::new(
        Full::new(body.into())
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
    r.headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    r
}

/// A JSON-RPC result for the request in `seen` (echoing its id).
pub fn result_for(seen: &Seen, result: serde_json::Value) -> Response<RawBody> {
    let req: serde_json::Value = serde_json::from_slice(&seen.body).unwrap_or_default();
    let body = serde_json::json!({"jsonrpc": "2.0", "id": req["id"], "result": result});
    full(200, "application/json", body.to_string())
}

/// An SSE body made of `chunks`, each sent after `gap`, optionally ending
/// with a transport error instead of a clean end.
pub fn sse(chunks: Vec<Bytes>, gap: std::time::Duration, then_fail: bool) -> Response<RawBody> {
    let stream = futures_util::stream::unfold(
        (chunks.into_iter(), then_fail, false),
        move |(mut it, fail, first_done)| async move {
            if first_done {
                tokio::time::sleep(gap).await;
            }
            match it.next() {
                Some(c) => Some((Ok::<_, BoxError>(Frame::data(c)), (it, fail, true))),
                None if fail => Some((
                    Err::<Frame<Bytes>, BoxError>("injected reset".into()),
                    (it, false, true),
                )),
                None => None,
            }
        },
    );
    let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
    r.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    r
}

/// The tools the recording MCP upstream lists: one read tool, one
/// destructive tool (in the shipped policy's table for `incidents`), one
/// with `x-mcp-header` parameters (a string and an integer).
pub fn tools() -> serde_json::Value {
    serde_json::json!([
        {"name": "get_incident", "description": "Reads an incident",
         "inputSchema": {"type": "object", "properties": {"incident_id": {"type": "string"}, "n": {"type": "number"}}}},
        {"name": "restart_service", "description": "Restarts a service",
         "inputSchema": {"type": "object", "properties": {"service": {"type": "string", "x-mcp-header": "Service"}}}},
        {"name": "get_deployment", "description": "Reads a deployment",
         "inputSchema": {"type": "object", "properties": {"deployment_id": {"type": "string", "x-mcp-header": "Deployment"},
                                                          "revision": {"type": "integer", "x-mcp-header": "Revision"}}}},
    ])
}

/// What every session id the recording MCP upstream hands out starts with
/// (each `initialize` gets a new one).
pub const UPSTREAM_SESSION: &str = "upstream-session-";

static SESSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// What a minimal MCP server answers to `seen` (the recording upstream's
/// default): `initialize` with a session id, `tools/list` with [`tools`],
/// `tools/call` with a text result, other requests with `{}`,
/// notifications and responses with 202, GET with an SSE stream carrying
/// one event `up-e1`, DELETE with 200.
pub fn mcp_answer(seen: &Seen) -> Response<RawBody> {
    match seen.method.as_str() {
        "GET" => {
            return sse(
                vec![Bytes::from_static(b"id: up-e1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"hi\"}}\n\n")],
                std::time::Duration::from_millis(10),
                false,
            )
        }
        "DELETE" => return full(200, "text/plain", ""),
        _ => {}
    }
    let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap_or_default();
    let answer_one = |m: &serde_json::Value| -> Option<serde_json::Value> {
        let id = m.get("id")?.clone();
        let result = match m["method"].as_str().unwrap_or("") {
            "initialize" => serde_json::json!({
                "protocolVersion": m["params"]["protocolVersion"].as_str().unwrap_or("2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "recording", "version": "1"},
            }),
            "tools/list" => serde_json::json!({"tools": tools()}),
            "tools/call" => serde_json::json!({"content": [{"type": "text", "text": "ok"}]}),
            _ => serde_json::json!({}),
        };
        m.get("method")?;
        Some(serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}))
    };
    let answers: Vec<serde_json::Value> = match &body {
        serde_json::Value::Array(items) => items.iter().filter_map(answer_one).collect(),
        one => answer_one(one).into_iter().collect(),
    };
    if answers.is_empty() {
        let mut r = full(202, "text/plain", "");
        *r.status_mut() = http::StatusCode::ACCEPTED;
        return r;
    }
    let text = if body.is_array() {
        serde_json::Value::Array(answers).to_string()
    } else {
        answers[0].to_string()
    };
    let mut r = full(200, "application/json", text);
    if body["method"] == "initialize" {
        let n = SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        r.headers_mut().insert(
            "mcp-session-id",
            format!("{UPSTREAM_SESSION}{n}").parse().unwrap(),
        );
    }
    r
}

/// A recording MCP upstream answering as [`mcp_answer`].
pub async fn mcp() -> RawUpstream {
    upstream(|seen| async move { mcp_answer(&seen) }).await
}

impl RawUpstream {
    /// How many `tools/call` of `tool` it received.
    pub fn calls_of(&self, tool: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| {
                let v: serde_json::Value = serde_json::from_slice(&s.body).unwrap_or_default();
                v["method"] == "tools/call" && v["params"]["name"] == tool
            })
            .count()
    }
}

impl Seen {
    /// The JSON-RPC method of a POST body (the first of a batch).
    pub fn rpc_method(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_default();
        let m = if v.is_array() {
            &v[0]["method"]
        } else {
            &v["method"]
        };
        m.as_str().unwrap_or("").to_owned()
    }
}

impl RawUpstream {
    /// Requests seen with this HTTP method and (for POST) JSON-RPC method.
    pub fn count(&self, http: &str, rpc: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.method == http && (rpc.is_empty() || s.rpc_method() == rpc))
            .count()
    }
}
