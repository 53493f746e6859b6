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
