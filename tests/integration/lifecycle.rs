//! Operations: health and readiness on the admin listener, a graceful drain
//! on shutdown (in-flight streams finish, new requests are refused), and the
//! protocols the MCP listener tells apart on plain TCP.

use std::time::Duration;

use bytes::Bytes;

use crate::common::{self, raw};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_streams() {
    let up = raw::upstream(|_| async {
        raw::sse(
            (1..=4)
                .map(|i| Bytes::from(format!("event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{\"progressToken\":1,\"progress\":{i}}}}}\n\n")))
                .chain(std::iter::once(Bytes::from_static(b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n")))
                .collect(),
            Duration::from_millis(200),
            false,
        )
    })
    .await;
    let fw = common::firewall(&common::TestConfig::new().upstream("u", &up.url()).text()).await;
    let admin = fw.admin.clone();
    assert_eq!(
        common::http()
            .get(format!("{admin}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        common::http()
            .get(format!("{admin}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    let url = fw.mcp_url("u");
    let inflight = tokio::spawn(async move {
        let resp = common::post_json(&url, r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).await;
        resp.text()
            .await
            .expect("the stream completes during the drain")
    });
    // The call is in flight once the upstream has it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while up.count("POST", "ping") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let base = fw.base.clone();
    let addr = fw.running.mcp_addr;
    let stopping = tokio::spawn(fw.stop());
    // The drain has begun once the listener refuses connections.
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener never closed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // New connections are no longer accepted.
    let refused = common::http()
        .post(format!("{base}/mcp/u"))
        .bearer_auth(common::token())
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#)
        .send()
        .await;
    assert!(
        refused.is_err(),
        "a new request during the drain must not be served"
    );
    let body = inflight.await.unwrap();
    assert!(
        body.contains("\"progress\":4") && body.contains("\"id\":7"),
        "{body}"
    );
    stopping.await.unwrap();
}

/// Plain TCP carries HTTP/1.1 and HTTP/2 with prior knowledge on one port; the
/// listener tells them apart by the first bytes, including a preface that
/// arrives cut in two (left to hyper-util's own detection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_listener_serves_http1_http2_and_a_split_preface() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let up =
        raw::upstream(
            |seen| async move { raw::result_for(&seen, serde_json::json!({"ok": true})) },
        )
        .await;
    let fw = common::firewall(&common::TestConfig::new().upstream("u", &up.url()).text()).await;
    let url = fw.mcp_url("u");
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

    let h1 = common::post_json(&url, ping).await;
    assert_eq!(h1.version(), reqwest::Version::HTTP_11);
    assert!(h1.text().await.unwrap().contains("\"ok\":true"));

    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap()
        .post(&url)
        .bearer_auth(common::token())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(ping)
        .send()
        .await
        .unwrap();
    assert_eq!(h2.version(), reqwest::Version::HTTP_2);
    assert!(h2.text().await.unwrap().contains("\"ok\":true"));

    // The preface in two writes, then an empty SETTINGS frame: the server's
    // first frame must be its own SETTINGS (an HTTP/1 server answers 400).
    let addr = fw.base.trim_start_matches("http://").to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    tcp.write_all(&preface[..10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    tcp.write_all(&preface[10..]).await.unwrap();
    tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let mut head = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut head))
        .await
        .expect("the server answers the preface")
        .unwrap();
    assert_eq!(head[3], 4, "first frame is SETTINGS: {head:?}");
    assert_eq!(up.hits(), 2);
    fw.stop().await;
}
