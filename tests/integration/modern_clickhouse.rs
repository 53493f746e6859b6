//! The audit schema, the retention job's statements, the README's and the
//! dashboard's queries on a current ClickHouse: this test writes a fixture
//! (the schema statements, rows encoded by the firewall's own encoder, taken
//! from a real spool, and every query) into `target/modern-clickhouse/`, and
//! `tests/modern_clickhouse/run.sh` (run by `.ci/run`) loads it into the
//! ClickHouse engine `chdb` embeds. With `MCPFW_CHDB_PYTHON` set (a Python
//! with chdb), this test runs it too.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::mcp::*;

pub const DATABASE: &str = "mcp_firewall";
pub const TABLE: &str = "audit_events";

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/modern-clickhouse")
}

/// The statements of a fenced `sql` block after `marker` in the README.
pub fn readme_sql_after(marker: &str) -> Vec<String> {
    let readme = include_str!("../../README.md");
    let at = readme
        .find(marker)
        .unwrap_or_else(|| panic!("README lacks {marker:?}"));
    let rest = &readme[at..];
    let start = rest.find("```sql\n").expect("a sql block") + 7;
    let block = &rest[start..];
    let block = &block[..block.find("```").expect("end of the block")];
    block
        .split(';')
        .map(|s| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
                .trim()
                .to_owned()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixture_for_a_current_clickhouse() {
    crate::common::install_crypto();
    let crate::common::DemoUnderTest {
        demo,
        upstream: _upstream,
        _dir,
    } = crate::common::start_demo(false).await;
    let url = format!("http://{}/mcp/incidents", demo.firewall.mcp_addr);
    let inv = connect_bearer(&url, &demo.investigator_token).await;
    inv.list_all_tools().await.unwrap();
    for id in ["INC-1001", "INC-1002"] {
        call(&inv, "get_incident", json!({"incident_id": id})).await;
    }
    let hidden = rmcp::model::CallToolRequestParams::new("restart_service")
        .with_arguments(args(json!({"service": "checkout"})));
    assert!(inv.call_tool(hidden).await.is_err());
    inv.cancel().await.ok();

    // Rows as the firewall's encoder wrote them into its spool.
    let deadline = Instant::now() + Duration::from_secs(10);
    let payloads = loop {
        let p = mcp_firewall::cli::audit::spool_payloads(&demo.audit.spool).unwrap();
        if p.len() >= 5 {
            break p;
        }
        assert!(Instant::now() < deadline, "{} rows in the spool", p.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    demo.firewall.shutdown().await;

    let dir = fixture_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("rows.rowbinary"), payloads.concat()).unwrap();
    let events: std::collections::BTreeSet<&[u8]> =
        payloads.iter().filter_map(|p| p.get(..16)).collect();
    std::fs::write(dir.join("row_count"), payloads.len().to_string()).unwrap();
    std::fs::write(dir.join("event_count"), events.len().to_string()).unwrap();
    std::fs::write(
        dir.join("columns.txt"),
        mcp_firewall::audit::COLUMNS.join(", "),
    )
    .unwrap();
    // The same rows' hash chain, as the shipper links it.
    let mut chain = mcp_firewall::audit::chain::Chain::new("fw-modern");
    let mut entries = Vec::new();
    for p in &payloads {
        let link = chain.link(p);
        let version = mcp_firewall::audit::row_version(p).unwrap();
        mcp_firewall::audit::chain::encode_entry("fw-modern", &link, p, version, 1_796_500_000, &mut entries);
    }
    std::fs::write(dir.join("chain.rowbinary"), entries).unwrap();
    std::fs::write(
        dir.join("chain_columns.txt"),
        mcp_firewall::audit::chain::CHAIN_COLUMNS.join(", "),
    )
    .unwrap();
    let schema = mcp_firewall::audit::schema_statements(DATABASE, TABLE);
    std::fs::write(dir.join("schema.json"), Value::from(schema).to_string()).unwrap();

    // Every query: the audit CLI's (as the README shows them), the README's
    // other questions, the dashboard's ClickHouse panels, and retention.
    use mcp_firewall::cli::audit::{query, Question};
    let mut queries: Vec<(String, String)> = vec![
        (
            "cli tail".into(),
            query(Question::Tail, DATABASE, TABLE).replace('?', "0"),
        ),
        (
            "cli run".into(),
            query(Question::Run, DATABASE, TABLE).replace('?', "'run-investigate-1'"),
        ),
        (
            "cli denials".into(),
            query(Question::Denials, DATABASE, TABLE).replace('?', "0"),
        ),
        (
            "cli stats".into(),
            query(Question::Stats, DATABASE, TABLE).replace('?', "7"),
        ),
    ];
    for (i, q) in readme_sql_after("More questions in SQL:")
        .into_iter()
        .enumerate()
    {
        queries.push((format!("README question {}", i + 1), q));
    }
    let dash: Value =
        serde_json::from_str(include_str!("../../config/grafana/mcp-firewall-audit.json")).unwrap();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            if let Some(sql) = t["rawSql"].as_str() {
                queries.push((
                    format!("dashboard panel {:?}", p["title"].as_str().unwrap_or("")),
                    sql.replace("${database}", DATABASE),
                ));
            }
        }
    }
    queries.push((
        "retention: partitions".into(),
        mcp_firewall::audit::partitions_sql(DATABASE, TABLE),
    ));
    std::fs::write(
        dir.join("queries.json"),
        Value::from(
            queries
                .iter()
                .map(|(n, q)| json!({"name": n, "sql": q}))
                .collect::<Vec<_>>(),
        )
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("drop_partition.sql"),
        mcp_firewall::audit::drop_partition_sql(DATABASE, &format!("{TABLE}_daily_stats"), 0),
    )
    .unwrap();

    if let Ok(python) = std::env::var("MCPFW_CHDB_PYTHON") {
        let out = std::process::Command::new(python)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/modern_clickhouse/run.py"
            ))
            .arg(&dir)
            .output()
            .expect("run the chdb check");
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
