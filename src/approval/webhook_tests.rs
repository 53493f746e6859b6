//! Webhook delivery against a real local HTTP server: retries after a
//! failure, no retry after a final refusal, bounded backoff.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use http::HeaderMap;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::super::service::tests::{approver, clock_at, key, new_approval, open_in, T0};
use super::*;

/// A receiver answering `statuses[i]` to the i-th POST (the last one
/// repeats) and keeping what it got.
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    async fn start(statuses: Vec<u16>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let got: Arc<Mutex<Vec<(HeaderMap, Value)>>> = Arc::default();
        let count = Arc::new(AtomicUsize::new(0));
        let statuses = Arc::new(statuses);
        let task = {
            let got = got.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let (got, count, statuses) = (got.clone(), count.clone(), statuses.clone());
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                            let (got, count, statuses) =
                                (got.clone(), count.clone(), statuses.clone());
                            async move {
                                let (parts, body) = req.into_parts();
                                let bytes = body.collect().await.expect("body").to_bytes();
                                let v: Value = serde_json::from_slice(&bytes).expect("json body");
                                got.lock().expect("lock").push((parts.headers, v));
                                let i = count.fetch_add(1, Ordering::SeqCst);
                                let status = statuses[i.min(statuses.len() - 1)];
                                let mut r = http::Response::new(Full::new(Bytes::new()));
                                *r.status_mut() = StatusCode::from_u16(status).expect("status");
                                Ok::<_, Infallible>(r)
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            })
        };
        Receiver { addr, got, task }
    }

    fn url(&self) -> String {
        format!("http://{}/hooks/approvals", self.addr)
    }

    async fn wait_for(&self, n: usize) -> Vec<(HeaderMap, Value)> {
        for _ in 0..500 {
            let got = self.got.lock().expect("lock").clone();
            if got.len() >= n {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "webhook receiver got {} requests, expected {n}",
            self.got.lock().expect("lock").len()
        );
    }
}

fn webhook(url: String, max_retries: u32) -> Option<WebhookConfig> {
    Some(WebhookConfig {
        url,
        timeout_ms: 2000,
        max_retries,
        backoff_ms: 50,
    })
}

fn metrics(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encode");
    out
}

#[tokio::test]
async fn a_failed_notification_is_retried_and_delivered() {
    let receiver = Receiver::start(vec![500, 200]).await;
    let dir = tempfile::tempdir().expect("dir");
    let url = receiver.url();
    let (a, registry) = open_in(dir.path(), &clock_at(T0), |c| {
        c.webhook = webhook(url.clone(), 3);
        c.public_url = Some("https://fw.example".to_owned());
    })
    .await;
    let p = a
        .request(new_approval(key("rollback_deployment", &json!({"d": 1}))))
        .await
        .expect("request");
    let got = receiver.wait_for(2).await;
    let (first_headers, first) = &got[0];
    let (second_headers, second) = &got[1];
    assert_eq!(first, second, "a retry sends the same notification");
    assert_eq!(
        first_headers["x-mcp-firewall-delivery"],
        second_headers["x-mcp-firewall-delivery"]
    );
    assert_eq!(first_headers["x-mcp-firewall-event"], "approval.requested");
    assert_eq!(first_headers["content-type"], "application/json");
    assert_eq!(first["event"], "approval.requested");
    assert_eq!(first["approval"]["id"], p.id.as_str());
    assert_eq!(first["approval"]["tool"], "rollback_deployment");
    assert_eq!(first["approval"]["status"], "pending");
    assert_eq!(first["approval"]["subject"], "alice");
    assert_eq!(first["approval"]["arguments"]["deployment"], "checkout");
    assert_eq!(
        first["status_url"],
        format!("https://fw.example/approvals/{}", p.id)
    );

    a.decide("acme", p.id.as_str(), &approver("bob"), false, "freeze")
        .await
        .expect("deny");
    let got = receiver.wait_for(3).await;
    let (_, denied) = &got[2];
    assert_eq!(denied["event"], "approval.denied");
    assert_eq!(denied["from"], "pending");
    assert_eq!(denied["approval"]["decision"]["by"], "bob");
    assert_eq!(denied["approval"]["decision"]["reason"], "freeze");
    let text = metrics(&registry);
    assert!(
        text.contains("approvals_webhook_failures_total{kind=\"attempt\"} 1"),
        "{text}"
    );
    assert!(text.contains("approvals_webhook_sent_total 2"), "{text}");
    assert!(!text.contains("kind=\"dropped\""), "{text}");
}

#[tokio::test]
async fn a_final_refusal_is_not_retried_and_is_counted_as_dropped() {
    let receiver = Receiver::start(vec![403]).await;
    let dir = tempfile::tempdir().expect("dir");
    let url = receiver.url();
    let (a, registry) = open_in(dir.path(), &clock_at(T0), |c| {
        c.webhook = webhook(url.clone(), 5);
    })
    .await;
    a.request(new_approval(key("restart", &json!({}))))
        .await
        .expect("request");
    receiver.wait_for(1).await;
    let mut text = String::new();
    for _ in 0..200 {
        text = metrics(&registry);
        if text.contains("kind=\"dropped\"} 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        text.contains("approvals_webhook_failures_total{kind=\"dropped\"} 1"),
        "{text}"
    );
    // "dropped" is counted once the delivery has given up: no attempt can
    // follow it.
    assert!(
        text.contains("approvals_webhook_failures_total{kind=\"attempt\"} 1"),
        "one failed attempt: {text}"
    );
    assert_eq!(
        receiver.got.lock().expect("lock").len(),
        1,
        "no retry after 403"
    );
}

#[tokio::test]
async fn an_unreachable_receiver_gets_bounded_attempts() {
    // A port nobody listens on: bind, note it, close.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let dir = tempfile::tempdir().expect("dir");
    let (a, registry) = open_in(dir.path(), &clock_at(T0), |c| {
        c.webhook = webhook(format!("http://{addr}/"), 2);
    })
    .await;
    a.request(new_approval(key("restart", &json!({}))))
        .await
        .expect("request");
    let mut text = String::new();
    for _ in 0..300 {
        text = metrics(&registry);
        if text.contains("kind=\"dropped\"} 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        text.contains("{kind=\"attempt\"} 3"),
        "1 + 2 retries: {text}"
    );
    assert!(text.contains("{kind=\"dropped\"} 1"), "{text}");
}

#[tokio::test]
async fn a_hanging_receiver_never_slows_requests_or_decisions() {
    // Connections complete in the kernel's backlog and then hear nothing.
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = silent.local_addr().expect("addr");
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |c| {
        c.webhook = Some(WebhookConfig {
            url: format!("http://{addr}/"),
            timeout_ms: 30_000,
            max_retries: 0,
            backoff_ms: 1,
        });
    })
    .await;
    let started = std::time::Instant::now();
    for i in 0..20 {
        let p = a
            .request(new_approval(key("restart", &json!({ "i": i }))))
            .await
            .expect("request");
        a.decide("acme", p.id.as_str(), &approver("bob"), true, "")
            .await
            .expect("approve");
    }
    // 40 notifications are stuck behind a 30 s timeout; the calls were not.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    drop(silent);
}

#[test]
fn backoff_doubles_and_is_capped() {
    let s = schedule(Duration::from_millis(250));
    assert_eq!(s.delay(1), Duration::from_millis(250));
    assert_eq!(s.delay(2), Duration::from_millis(500));
    assert_eq!(s.delay(4), Duration::from_secs(2));
    assert_eq!(s.delay(11), MAX_BACKOFF);
    assert_eq!(s.delay(u32::MAX), MAX_BACKOFF);
}
