//! The shipped Grafana dashboards ask for what the firewall exports: every
//! metric a Prometheus panel uses is on `/metrics` of a firewall that served
//! calls, denials, an approval and a drifted tool; every ClickHouse panel's
//! SQL runs against the schema the firewall creates.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::clickhouse::ClickHouse;
use crate::common::mcp::*;

fn dashboard(name: &str) -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/grafana/").to_owned() + name;
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn targets(d: &Value, key: &str) -> Vec<String> {
    d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t[key].as_str().map(str::to_owned))
        .collect()
}

/// `mcp_firewall_*` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("mcp_firewall_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// Series names `/metrics` can show: each `# TYPE` family with the suffixes
/// its kind gets.
fn exported(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if parts.next() != Some("#") || parts.next() != Some("TYPE") {
            continue;
        }
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        // A family is listed only once it has a sample.
        let has_sample = text
            .lines()
            .any(|l| !l.starts_with('#') && l.starts_with(name));
        if !has_sample {
            continue;
        }
        match kind {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{s}"));
                }
            }
            _ => {
                out.insert(name.to_owned());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_uses_is_exported() {
    crate::common::install_crypto();
    let crate::common::DemoUnderTest {
        demo,
        upstream,
        _dir,
    } = crate::common::start_demo(false).await;
    let url = format!("http://{}/mcp/incidents", demo.firewall.mcp_addr);
    let inv = connect_bearer(&url, &demo.investigator_token).await;
    inv.list_all_tools().await.unwrap();
    call(&inv, "get_incident", json!({"incident_id": "INC-1001"})).await;
    let hidden = rmcp::model::CallToolRequestParams::new("restart_service")
        .with_arguments(args(json!({"service": "checkout"})));
    assert!(inv.call_tool(hidden).await.is_err());
    // An approval waits for a person.
    let op = connect_bearer(&url, &demo.operator_token).await;
    op.list_all_tools().await.unwrap();
    let held = tokio::spawn(async move {
        let p = rmcp::model::CallToolRequestParams::new("rollback_deployment")
            .with_arguments(args(json!({"deployment_id": "dep-1042", "reason": "bad"})));
        let _ = op.call_tool(p).await;
    });
    // A person approves it.
    let base = format!("http://{}", demo.firewall.admin_addr);
    crate::common::approve_first_pending(&base, &demo.approver_token).await;
    // A tool changes: drift.
    upstream
        .edit_tool("get_deployment", |t| {
            t.description = Some("Changed.".into());
        })
        .await
        .unwrap();
    inv.list_all_tools().await.unwrap();
    let admin = format!("http://{}/metrics", demo.firewall.admin_addr);
    let wanted: BTreeSet<String> = targets(&dashboard("mcp-firewall.json"), "expr")
        .iter()
        .flat_map(|e| metric_names(e))
        .collect();
    assert!(wanted.len() >= 12, "{wanted:?}");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = crate::common::http()
            .get(&admin)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let have = exported(&text);
        let missing: Vec<&String> = wanted.iter().filter(|w| !have.contains(*w)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dashboard uses metrics /metrics does not export: {missing:?}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    held.abort();
    inv.cancel().await.ok();
    demo.firewall.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_clickhouse_panel_runs_against_the_schema() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let upstream = upstream(options(true)).await;
    let text = crate::common::TestConfig::new()
        .upstream("incidents", &upstream.url())
        .set("audit.enabled", true)
        .set("audit.clickhouse.url", ch.http_url.as_str())
        .set("audit.clickhouse.database", db.as_str())
        .set(
            "audit.spool.dir",
            crate::common::toml_path(&dir.path().join("spool")),
        )
        .text();
    let fw = crate::common::firewall(&text).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while ch
        .try_query(&format!(
            "SELECT count() FROM {db}.audit_events_daily_stats"
        ))
        .is_err()
    {
        assert!(Instant::now() < deadline, "schema not created");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sqls = targets(&dashboard("mcp-firewall-audit.json"), "rawSql");
    assert!(sqls.len() >= 6);
    // The auditor's guide's other questions too, on this (18.16) ClickHouse.
    let guide = crate::modern_clickhouse::auditors_sql_after("More questions in SQL:");
    assert!(guide.len() >= 3);
    for sql in sqls.into_iter().chain(guide) {
        let sql = sql
            .replace("${database}", &db)
            .replace("mcp_firewall.", &format!("{db}."));
        if let Err(e) = ch.try_query(&sql) {
            panic!("panel SQL fails on ClickHouse: {e}\n{sql}");
        }
    }
    fw.stop().await;
}
