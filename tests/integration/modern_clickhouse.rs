//! The audit schema, the retention job's statements, the auditor's guide's
//! (`docs/auditors.md`) and the dashboard's queries on a current ClickHouse: this test writes a fixture
//! (the schema statements, rows encoded by the firewall's own encoder, taken
//! from a real spool, and every query) into `target/modern-clickhouse/`, and
//! `tests/modern_clickhouse/run.sh` (run by `.ci/run`) loads it into the
//! ClickHouse engine `chdb` embeds. With `MCPFW_CHDB_PYTHON` set (a Python
//! with chdb), this test runs it too. The fixture also holds a table as the
//! release before the approval, policy, pin and delegation columns created
//! it, the firewall's migration of it (its `ALTER TABLE … ADD COLUMN`
//! statements, run for each column the table lacks, as at start), and a row
//! with those columns filled: the migrated table must take it and give it
//! back, byte for byte. And every statement `audit verify` (and a writer
//! without its chain head) runs, answered by the ClickHouse the tests run on
//! the same rows, chain and a forged row, for `run.py` to compare with the
//! current engine's answers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::mcp::*;

pub const DATABASE: &str = "mcp_firewall";
pub const TABLE: &str = "audit_events";
/// The database of the table an earlier release created.
const OLD_DATABASE: &str = "mcp_firewall_v3";

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/modern-clickhouse")
}

/// The statements of a fenced `sql` block after `marker` in the auditor's
/// guide (`docs/auditors.md`).
pub fn auditors_sql_after(marker: &str) -> Vec<String> {
    let guide = include_str!("../../docs/auditors.md");
    let at = guide
        .find(marker)
        .unwrap_or_else(|| panic!("docs/auditors.md lacks {marker:?}"));
    let rest = &guide[at..];
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
        mcp_firewall::audit::chain::encode_entry(
            "fw-modern",
            &link,
            p,
            version,
            1_796_500_000,
            &mut entries,
        );
    }
    std::fs::write(dir.join("chain.rowbinary"), &entries).unwrap();
    std::fs::write(
        dir.join("chain_columns.txt"),
        mcp_firewall::audit::chain::CHAIN_COLUMNS.join(", "),
    )
    .unwrap();
    let schema = mcp_firewall::audit::schema_statements(DATABASE, TABLE);
    std::fs::write(dir.join("schema.json"), Value::from(schema).to_string()).unwrap();

    // Every query: the audit CLI's (as the auditor's guide shows them), the
    // guide's other questions, the dashboard's ClickHouse panels, and retention.
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
        (
            "cli shadow tools".into(),
            query(Question::ShadowTools, DATABASE, TABLE).replace('?', "0"),
        ),
        (
            "cli shadow principals".into(),
            query(Question::ShadowPrincipals, DATABASE, TABLE).replace('?', "0"),
        ),
        (
            "cli replay".into(),
            query(Question::Replay, DATABASE, TABLE)
                .replacen('?', "0", 1)
                .replace('?', "1000"),
        ),
    ];
    for (i, q) in auditors_sql_after("More questions in SQL:")
        .into_iter()
        .enumerate()
    {
        queries.push((format!("auditors' guide question {}", i + 1), q));
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
    // `audit verify`'s statements (a full verify and an anchored window),
    // and what a writer without its chain head asks.
    for (name, sql) in mcp_firewall::audit::verify::queries(DATABASE, TABLE, "fw-modern") {
        queries.push((name.into(), sql));
    }
    let first = Some((uuid::Uuid::nil(), 1));
    for (i, sql) in mcp_firewall::audit::chain_state_sql(DATABASE, TABLE, "fw-modern", first)
        .into_iter()
        .flatten()
        .enumerate()
    {
        queries.push((format!("chain head lost: question {}", i + 1), sql));
    }
    // A chain table of a release before links, migrated as at start.
    let old_chain = mcp_firewall::audit::schema_statements(DATABASE, "old")
        .into_iter()
        .find(|s| s.contains("old_chain"))
        .unwrap()
        .replace(",\n    link        FixedString(32)", "");
    assert!(!old_chain.contains("link"), "{old_chain}");
    queries.push(("chain migration: a table before links".into(), old_chain));
    for (_, alter) in mcp_firewall::audit::added_chain_columns_sql(DATABASE, "old") {
        queries.push(("chain migration: add link".into(), alter));
    }
    queries.push((
        "chain migration: columns".into(),
        format!(
            "SELECT (SELECT groupArray(concat(name, ' ', type)) FROM (SELECT name, type FROM system.columns WHERE database = '{DATABASE}' AND table = 'old_chain' ORDER BY position)) \
             = (SELECT groupArray(concat(name, ' ', type)) FROM (SELECT name, type FROM system.columns WHERE database = '{DATABASE}' AND table = '{TABLE}_chain' ORDER BY position)) AS same"
        ),
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

    migration_fixture(&dir).await;
    verify_fixture(&dir, &payloads.concat(), &entries).await;

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

/// The migration part of the fixture: `migration.json` (the old table, the
/// firewall's `ALTER`s, the values to read back) and
/// `migration_rows.rowbinary` (one row with them, encoded by the firewall).
async fn migration_fixture(dir: &std::path::Path) {
    use mcp_firewall::audit::{self, AuditConfig, AuditRow};
    let spool = tempfile::tempdir().unwrap();
    let mut cfg = AuditConfig::default();
    // Nothing listens there: the row stays in the spool.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    cfg.clickhouse.url = format!("http://127.0.0.1:{port}");
    cfg.clickhouse.database = OLD_DATABASE.to_owned();
    cfg.spool.dir = spool.path().to_owned();
    let mut registry = prometheus_client::registry::Registry::default();
    let (auditor, handle) = audit::start(&cfg, &mut registry).await.unwrap();
    let mut r = AuditRow::new();
    r.tenant = "acme".into();
    r.run_id = "run-migrated".into();
    r.method = "tools/call".into();
    r.tool = "rollback_deployment".into();
    r.decision = "allow".into();
    r.approval_id = "apr_1".into();
    r.approver = "oncall".into();
    r.approved_ms = 1_767_225_599_001;
    r.policy_sha256 = "0f".repeat(32);
    r.pin_sha256 = "e1".repeat(32);
    r.delegation = vec!["agent:planner".to_owned(), "user:olga".to_owned()].into();
    r.token_id = "jti-9".into();
    r.token_jti = "jti-9".into();
    r.shadow_decision = "deny";
    r.principal_claims = r#"{"mode":"caller"}"#.into();
    r.upstream_auth = "exchange";
    r.credential_id = "3f".repeat(16);
    auditor.record(r).await.unwrap();
    handle.shutdown(Duration::from_millis(100)).await;
    drop(auditor);
    let rows = mcp_firewall::cli::audit::spool_payloads(spool.path()).unwrap();
    assert_eq!(rows.len(), 1);
    std::fs::write(dir.join("migration_rows.rowbinary"), rows.concat()).unwrap();
    let migration = json!({
        "database": OLD_DATABASE,
        "table": TABLE,
        "old_schema": [
            format!("CREATE DATABASE IF NOT EXISTS {OLD_DATABASE}"),
            crate::common::clickhouse::audit_table_ending_at(OLD_DATABASE, TABLE, "virtual_server"),
        ],
        "alter": audit::added_columns_sql(OLD_DATABASE, TABLE)
            .into_iter()
            .map(|(column, sql)| json!([column, sql]))
            .collect::<Vec<_>>(),
        "run_id": "run-migrated",
        "expect": {
            "approval_id": "apr_1",
            "approver": "oncall",
            "approved_ms": 1_767_225_599_001u64,
            "policy_sha256": "0f".repeat(32),
            "pin_sha256": "e1".repeat(32),
            "delegation": ["agent:planner", "user:olga"],
            "token_jti": "jti-9",
            "shadow_decision": "deny",
            "principal_claims": "{\"mode\":\"caller\"}",
            "upstream_auth": "exchange",
            "credential_id": "3f".repeat(16),
        },
        "empty": {
            "approval_id": "",
            "approver": "",
            "approved_ms": 0,
            "policy_sha256": "",
            "pin_sha256": "",
            "delegation": [],
            "token_jti": "",
            "shadow_decision": "",
            "principal_claims": "",
            "upstream_auth": "",
            "credential_id": "",
        },
    });
    std::fs::write(dir.join("migration.json"), migration.to_string()).unwrap();
}

/// The statement that forges a `row_version = 2` copy of a real call (what
/// a windowed verify must name), with `{database}` for the database.
fn forge_sql() -> String {
    let cols: Vec<String> = mcp_firewall::audit::COLUMNS
        .iter()
        .map(|c| {
            if *c == "row_version" {
                "toUInt8(2)".to_owned()
            } else {
                (*c).to_owned()
            }
        })
        .collect();
    format!(
        "INSERT INTO {{database}}.audit_events ({}) SELECT {} FROM {{database}}.audit_events WHERE row_version = 1 ORDER BY event_id LIMIT 1",
        mcp_firewall::audit::COLUMNS.join(", "),
        cols.join(", ")
    )
}

/// `verify` on a current ClickHouse reads what it reads on 18.16: the same
/// rows and chain (and a forged `row_version = 2` row) loaded into the
/// ClickHouse the tests run, every statement of `verify` and of a writer
/// without its head answered there; `run.py` loads the same into chdb,
/// runs the same statements and compares the answers (the chain's byte for
/// byte, the rows' as sets). Since `verify` is a function of these
/// answers, its verdicts (the attacks of `audit_chain.rs`) are the same on
/// both.
async fn verify_fixture(dir: &std::path::Path, rows: &[u8], chain: &[u8]) {
    let ch = crate::common::clickhouse::ClickHouse::shared().await;
    let db = ch.create_database();
    for stmt in mcp_firewall::audit::schema_statements(&db, TABLE) {
        ch.query(&stmt);
    }
    ch.insert_rowbinary(&db, TABLE, mcp_firewall::audit::COLUMNS, rows.to_vec())
        .await;
    ch.insert_rowbinary(
        &db,
        "audit_events_chain",
        mcp_firewall::audit::chain::CHAIN_COLUMNS,
        chain.to_vec(),
    )
    .await;
    ch.query(&forge_sql().replace("{database}", &db));
    // Merged (each intent folded into its completion), as the table ends
    // up: the same rows on both engines, whatever merges ran meanwhile.
    ch.query(&format!("OPTIMIZE TABLE {db}.{TABLE} FINAL"));
    let first = Some((uuid::Uuid::nil(), 1));
    let mut statements: Vec<(String, String)> =
        mcp_firewall::audit::verify::queries(&db, TABLE, "fw-modern")
            .into_iter()
            .map(|(n, q)| (n.to_owned(), q))
            .collect();
    for (i, q) in mcp_firewall::audit::chain_state_sql(&db, TABLE, "fw-modern", first)
        .into_iter()
        .flatten()
        .enumerate()
    {
        statements.push((format!("chain head lost: question {}", i + 1), q));
    }
    let answers = dir.join("verify-answers");
    std::fs::create_dir_all(&answers).unwrap();
    let mut index = Vec::new();
    for (i, (name, sql)) in statements.iter().enumerate() {
        let answer = ch.fetch_rowbinary(sql).await;
        std::fs::write(answers.join(format!("{i}.bin")), answer).unwrap();
        index.push(json!({
            "name": name,
            "sql": sql.replace(&db, "{database}"),
            "file": format!("{i}.bin"),
            "rows": name.contains("rows"),
        }));
    }
    std::fs::write(
        dir.join("verify.json"),
        json!({"forge": forge_sql(), "statements": index}).to_string(),
    )
    .unwrap();
}
