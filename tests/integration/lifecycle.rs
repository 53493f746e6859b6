//! Operations: health and readiness on the admin listener, and a graceful
//! drain on shutdown (in-flight streams finish, new requests are refused).

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
    let fw = common::firewall(&common::config_text(&[("u", &up.url())], "")).await;
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
    tokio::time::sleep(Duration::from_millis(150)).await;
    let base = fw.base.clone();
    let stopping = tokio::spawn(fw.stop());
    tokio::time::sleep(Duration::from_millis(100)).await;
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
