//! `mcp-firewall demo` works for a newcomer: the printed tokens let any MCP
//! client list and call the demo tools through the firewall.

use std::net::SocketAddr;

use serde_json::json;

use crate::common::mcp::*;
use crate::through_firewall::call_err;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_tokens_list_and_call_through_the_firewall() {
    crate::common::install_crypto();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let demo = mcp_firewall::demo::run::start(any, any)
        .await
        .expect("demo starts");
    let url = format!("http://{}/mcp/incidents", demo.firewall.mcp_addr);
    for era in [Era::V2025_11_25, Era::V2026_07_28] {
        let mut cfg =
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                url.clone(),
            );
        cfg.auth_header = Some(demo.investigator_token.clone());
        let client = connect_with(TestClient::new(era), cfg).await;
        assert_eq!(
            client.list_all_tools().await.unwrap().len(),
            8,
            "{era:?}: the investigator sees the read tools"
        );
        let r = call(&client, "get_incident", json!({"incident_id": "INC-1001"})).await;
        assert!(text(&r).contains("INC-1001"), "{era:?}");
        client.cancel().await.ok();

        let mut cfg =
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                url.clone(),
            );
        cfg.auth_header = Some(demo.operator_token.clone());
        let client = connect_with(TestClient::new(era), cfg).await;
        assert_eq!(
            client.list_all_tools().await.unwrap().len(),
            14,
            "{era:?}: the operator sees every tool"
        );
        let e = call_err(
            &client,
            "rollback_deployment",
            json!({"deployment_id": "dep-1042", "reason": "bad deploy"}),
        )
        .await;
        assert_eq!(e.code.0, -31002, "{era:?}: {e:?}");
        client.cancel().await.ok();
    }
    demo.firewall.shutdown().await;
    demo.upstream.shutdown().await;
}
