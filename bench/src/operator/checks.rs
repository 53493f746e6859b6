//! Deployment checks around a load test: the firewall's `/metrics` read
//! before and after (calls by stop reason, audit backlog, lost rows), and
//! `--verify-audit`: every `tools/call` that got an answer has its row in
//! ClickHouse, found by the JSON-RPC ids the load test sent.
//!
//! Both run off the measured path, before and after a target's rounds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::summary::{AuditCheck, MetricDelta};

/// Reads a Prometheus text page into `series → value`.
pub async fn scrape(http: &reqwest::Client, url: &str) -> Result<BTreeMap<String, f64>, String> {
    let text = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?
        .text()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if let Ok(v) = value.parse::<f64>() {
            out.insert(series.to_owned(), v);
        }
    }
    Ok(out)
}

/// The series an operator acts on, as they changed: calls by stop reason
/// and decision, audit rows lost, and the audit backlog and spool.
pub fn deltas(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Vec<MetricDelta> {
    let interesting = |s: &str| {
        s.starts_with("mcp_firewall_tool_calls")
            || s.starts_with("mcp_firewall_audit_rows_lost")
            || (s.starts_with("mcp_firewall_audit")
                && (s.contains("backlog") || s.contains("spool")))
            || s.starts_with("mcp_firewall_not_ready")
            || s.starts_with("mcp_firewall_degraded")
    };
    after
        .iter()
        .filter(|(k, _)| interesting(k))
        .filter_map(|(k, a)| {
            let b = before.get(k).copied().unwrap_or(0.0);
            let gauge = !k.contains("_total");
            (gauge || (a - b).abs() > 0.0).then(|| MetricDelta {
                series: k.clone(),
                before: b,
                after: *a,
            })
        })
        .collect()
}

/// Where the audit rows are.
#[derive(Debug, Clone)]
pub struct AuditTarget {
    /// ClickHouse's HTTP interface, e.g. `http://127.0.0.1:8123`.
    pub url: String,
    /// The database.
    pub database: String,
    /// The table.
    pub table: String,
    /// User (`X-ClickHouse-User`).
    pub user: String,
    /// Password (`X-ClickHouse-Key`).
    pub password: String,
    /// How long to wait for rows still shipping.
    pub wait: Duration,
}

/// Checks that each of `ids` (answered `tools/call` requests) has a row,
/// waiting up to `target.wait` for rows still on their way.
pub async fn verify_audit(
    http: &reqwest::Client,
    target: &AuditTarget,
    ids: &[u64],
) -> Result<AuditCheck, String> {
    let deadline = Instant::now() + target.wait;
    let mut missing: Vec<u64> = ids.to_vec();
    missing.sort_unstable();
    missing.dedup();
    let answered = missing.len() as u64;
    loop {
        let mut still = Vec::new();
        for chunk in missing.chunks(2000) {
            let list: Vec<String> = chunk.iter().map(u64::to_string).collect();
            let sql = format!(
                "SELECT DISTINCT jsonrpc_id FROM {}.{} WHERE method = 'tools/call' AND jsonrpc_id IN ('{}') FORMAT TSV",
                quote_ident(&target.database),
                quote_ident(&target.table),
                list.join("','")
            );
            let resp = http
                .post(&target.url)
                .header("X-ClickHouse-User", &target.user)
                .header("X-ClickHouse-Key", &target.password)
                .body(sql)
                .send()
                .await
                .map_err(|e| format!("ClickHouse {}: {e}", target.url))?;
            let status = resp.status();
            let text = resp
                .text()
                .await
                .map_err(|e| format!("ClickHouse {}: {e}", target.url))?;
            if !status.is_success() {
                return Err(format!(
                    "ClickHouse {} answered {status}: {}",
                    target.url,
                    text.lines().next().unwrap_or_default()
                ));
            }
            let found: std::collections::HashSet<&str> = text.lines().map(str::trim).collect();
            still.extend(
                chunk
                    .iter()
                    .filter(|id| !found.contains(id.to_string().as_str())),
            );
        }
        missing = still;
        if missing.is_empty() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(AuditCheck {
        answered,
        found: answered - missing.len() as u64,
        missing_sample: missing.into_iter().take(10).collect(),
    })
}

/// A ClickHouse identifier in backquotes.
fn quote_ident(s: &str) -> String {
    format!("`{}`", s.replace('\\', "\\\\").replace('`', "\\`"))
}
