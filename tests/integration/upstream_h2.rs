//! HTTP/2 to an upstream (`http2 = true`): streams spread over as many
//! connections as they need, each carrying at most `http2_max_streams`, and a
//! stream counts until its answer has been relayed (held SSE answers too), so
//! long-lived streams never leave later requests waiting behind the
//! upstream's per-connection stream limit.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::common;
use crate::common::wait_until;

/// An h2c-only upstream that allows `limit` streams per connection and
/// answers every POST with SSE headers at once and its one event only when
/// released.
struct HeldH2 {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    release: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HeldH2 {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn held_h2(limit: u32) -> HeldH2 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (release, released) = watch::channel(false);
    let (c, r) = (connections.clone(), requests.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            c.fetch_add(1, Ordering::SeqCst);
            let (r, released) = (r.clone(), released.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (r, mut released) = (r.clone(), released.clone());
                    async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let msg: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        r.fetch_add(1, Ordering::SeqCst);
                        let event = format!(
                            "event: message\ndata: {}\n\n",
                            serde_json::json!({"jsonrpc": "2.0", "id": msg["id"], "result": {"ok": true}})
                        );
                        let once = futures_util::stream::once(async move {
                            let _ = released.wait_for(|go| *go).await;
                            Ok::<_, Infallible>(Frame::data(Bytes::from(event)))
                        });
                        let mut resp = Response::new(StreamBody::new(once));
                        resp.headers_mut()
                            .insert("content-type", "text/event-stream".parse().unwrap());
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(limit)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    HeldH2 {
        addr,
        connections,
        requests,
        release,
        task,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_streams_open_new_connections_instead_of_queueing() {
    // The upstream serves 2 streams per connection; the firewall puts at
    // most 2 on each. Five held answers need three connections, all at once.
    let up = held_h2(2).await;
    let url = format!("http://{}/mcp", up.addr);
    // One serving thread: each has upstream connections of its own, and
    // the count is of one pool's.
    let text = common::TestConfig::new()
        .set("server.threads", 1)
        .upstream("u", &url)
        .upstream_set("u", "http2", true)
        .upstream_set("u", "http2_max_streams", 2)
        .text();
    assert!(text.contains("http2_max_streams = 2"));
    let fw = common::firewall(&text).await;
    let mcp = fw.mcp_url("u");

    let calls: Vec<_> = (1..=5)
        .map(|id| {
            let mcp = mcp.clone();
            tokio::spawn(async move {
                let resp = common::post_json(
                    &mcp,
                    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#),
                )
                .await;
                assert_eq!(resp.status(), 200);
                resp.text().await.unwrap()
            })
        })
        .collect();
    // Every request reaches the upstream while the earlier answers are
    // still open: none waits for a stream to end.
    wait_until(
        "five requests are in flight upstream",
        Duration::from_secs(10),
        || up.requests.load(Ordering::SeqCst) == 5,
    )
    .await;
    assert_eq!(up.connections.load(Ordering::SeqCst), 3);

    up.release.send(true).unwrap();
    for (i, call) in calls.into_iter().enumerate() {
        let body = call.await.unwrap();
        assert!(
            body.contains(&format!("\"id\":{}", i + 1)) && body.contains("\"ok\":true"),
            "{body}"
        );
    }

    // Finished streams free their slots: more calls reuse the connections.
    for id in 6..=9 {
        let resp = common::post_json(
            &mcp,
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#),
        )
        .await;
        assert!(resp.text().await.unwrap().contains("\"ok\":true"));
    }
    assert_eq!(up.requests.load(Ordering::SeqCst), 9);
    assert_eq!(up.connections.load(Ordering::SeqCst), 3);
    fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_does_not_speak_http2_is_a_clear_connect_error() {
    // An HTTP/1.1-only upstream behind `http2 = true`: the call fails with a
    // JSON-RPC error naming the upstream, not a hang or a transport error.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let s = served.clone();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let s = s.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    s.fetch_add(1, Ordering::SeqCst);
                    async move {
                        Ok::<_, Infallible>(Response::new(http_body_util::Full::new(Bytes::from(
                            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let listener_only_h1 = format!("http://{addr}/mcp");
    let text = common::TestConfig::new()
        .upstream("u", &listener_only_h1)
        .upstream_set("u", "http2", true)
        .text();
    let fw = common::firewall(&text).await;
    let resp = common::post_json(
        &fw.mcp_url("u"),
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["id"], 1);
    assert!(body["error"]["code"].is_i64(), "{body}");
    assert_eq!(served.load(Ordering::SeqCst), 0);
    fw.stop().await;
    task.abort();
}
