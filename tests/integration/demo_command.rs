//! `mcp-firewall demo` works for a newcomer: the printed tokens let any MCP
//! client list and call the demo tools through the firewall.

use std::net::SocketAddr;

use serde_json::json;

use crate::common::mcp::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_tokens_list_and_call_through_the_firewall() {
    crate::common::install_crypto();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let demo = mcp_firewall::demo::run::start(any, any)
        .await
        .expect("demo starts");
    let url = format!("http://{}/mcp/incidents", demo.firewall.mcp_addr);
    for (n, era) in [Era::V2025_11_25, Era::V2026_07_28].into_iter().enumerate() {
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
        // The gated call waits for a person; the printed approver token
        // approves it on the admin listener, and the call completes.
        let held = tokio::spawn(async move {
            let r = call(
                &client,
                "rollback_deployment",
                json!({"deployment_id": "dep-1042", "reason": "bad deploy"}),
            )
            .await;
            client.cancel().await.ok();
            r
        });
        let admin = format!("http://{}", demo.firewall.admin_addr);
        let id = loop {
            let v: serde_json::Value = crate::common::http()
                .get(format!("{admin}/approvals?status=pending"))
                .bearer_auth(&demo.approver_token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if let Some(id) = v["approvals"][0]["id"].as_str() {
                break id.to_owned();
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        let approved = crate::common::http()
            .post(format!("{admin}/approvals/{id}/approve"))
            .bearer_auth(&demo.approver_token)
            .json(&json!({"reason": "demo"}))
            .send()
            .await
            .unwrap();
        assert_eq!(approved.status(), 200);
        let r = held.await.unwrap();
        // It ran: the first rollback succeeds; the second finds the
        // deployment already rolled back (a tool error from the upstream).
        assert!(!r.content.is_empty(), "{era:?}: {r:?}");
        assert_eq!(demo.upstream.calls("rollback_deployment"), n as u64 + 1);
    }
    demo.firewall.shutdown().await;
    demo.upstream.shutdown().await;
}
