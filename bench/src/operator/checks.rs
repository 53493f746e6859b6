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
/// waiting up to `target.wait` for rows still on their way. A query that
/// fails in transport (a pooled connection ClickHouse closed when it
/// restarted) or with a 5xx is asked again until the wait runs out; then
/// the check reports why it could not run ([`AuditCheck::error`]) and the
/// load's report is written all the same.
pub async fn verify_audit(http: &reqwest::Client, target: &AuditTarget, ids: &[u64]) -> AuditCheck {
    let deadline = Instant::now() + target.wait;
    let mut missing: Vec<u64> = ids.to_vec();
    missing.sort_unstable();
    missing.dedup();
    let answered = missing.len() as u64;
    let mut error: Option<String>;
    loop {
        let mut still = Vec::new();
        error = None;
        for chunk in missing.chunks(2000) {
            match found_of(http, target, chunk).await {
                Ok(found) => still.extend(
                    chunk
                        .iter()
                        .filter(|id| !found.contains(id.to_string().as_str())),
                ),
                Err(Query::Refused(e)) => {
                    return AuditCheck {
                        answered,
                        found: 0,
                        missing_sample: Vec::new(),
                        error: Some(e),
                    }
                }
                Err(Query::Retry(e)) => {
                    still.extend(chunk);
                    error = Some(e);
                }
            }
        }
        missing = still;
        if missing.is_empty() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    AuditCheck {
        answered,
        found: if error.is_some() {
            0
        } else {
            answered - missing.len() as u64
        },
        missing_sample: if error.is_some() {
            Vec::new()
        } else {
            missing.into_iter().take(10).collect()
        },
        error,
    }
}

/// Why one query had no answer.
enum Query {
    /// Worth asking again (transport, 5xx).
    Retry(String),
    /// Asking again will not help (4xx: credentials, the table).
    Refused(String),
}

async fn found_of(
    http: &reqwest::Client,
    target: &AuditTarget,
    chunk: &[u64],
) -> Result<std::collections::HashSet<String>, Query> {
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
        .map_err(|e| Query::Retry(format!("ClickHouse {}: {e}", target.url)))?;
    let status = resp.status();
    let text = resp
        .text()
        .await
        .map_err(|e| Query::Retry(format!("ClickHouse {}: {e}", target.url)))?;
    if !status.is_success() {
        let why = format!(
            "ClickHouse {} answered {status}: {}",
            target.url,
            text.lines().next().unwrap_or_default()
        );
        return Err(if status.is_server_error() {
            Query::Retry(why)
        } else {
            Query::Refused(why)
        });
    }
    Ok(text.lines().map(|l| l.trim().to_owned()).collect())
}

/// A ClickHouse identifier in backquotes.
fn quote_ident(s: &str) -> String {
    format!("`{}`", s.replace('\\', "\\\\").replace('`', "\\`"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn client() -> reqwest::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::new()
    }

    fn target(url: String, wait_ms: u64) -> AuditTarget {
        AuditTarget {
            url,
            database: "db".into(),
            table: "t".into(),
            user: "default".into(),
            password: String::new(),
            wait: Duration::from_millis(wait_ms),
        }
    }

    /// A ClickHouse stand-in: answers each connection in turn with the
    /// next of `answers` (`None` closes the connection without a word, as
    /// a restarted server does to a pooled one), counting the requests.
    async fn serve(
        answers: Vec<Option<(&'static str, &'static str)>>,
    ) -> (String, tokio::task::JoinHandle<usize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let h = tokio::spawn(async move {
            let mut n = 0;
            for a in answers {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                n += 1;
                if let Some((status, body)) = a {
                    let resp = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    s.write_all(resp.as_bytes()).await.unwrap();
                }
            }
            n
        });
        (url, h)
    }

    #[tokio::test]
    async fn a_connection_closed_under_the_check_is_asked_again() {
        let (url, h) = serve(vec![None, Some(("200 OK", "1\n2\n"))]).await;
        let http = client();
        let check = verify_audit(&http, &target(url, 5_000), &[1, 2]).await;
        assert_eq!(check.error, None);
        assert_eq!((check.answered, check.found), (2, 2));
        assert_eq!(h.await.unwrap(), 2);
    }

    #[tokio::test]
    async fn a_check_that_cannot_run_says_so_instead_of_failing_the_load() {
        // Nothing listens: every attempt fails until the wait runs out.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let http = client();
        let check = verify_audit(
            &http,
            &target(format!("http://127.0.0.1:{port}"), 1_200),
            &[7],
        )
        .await;
        let e = check.error.expect("the check reports why it could not run");
        assert!(e.contains("ClickHouse http://127.0.0.1:"), "{e}");
        assert_eq!(check.found, 0);
    }

    #[tokio::test]
    async fn a_refusal_is_not_retried() {
        let (url, h) = serve(vec![Some((
            "403 Forbidden",
            "Code: 516. Authentication failed",
        ))])
        .await;
        let http = client();
        let check = verify_audit(&http, &target(url, 5_000), &[1]).await;
        let e = check.error.expect("refused");
        assert!(
            e.contains("403") && e.contains("Authentication failed"),
            "{e}"
        );
        assert_eq!(h.await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_server_error_is_retried_and_rows_still_missing_are_named() {
        let (url, h) = serve(vec![
            Some(("503 Service Unavailable", "starting")),
            Some(("200 OK", "1\n")),
        ])
        .await;
        let http = client();
        let check = verify_audit(&http, &target(url, 400), &[1, 2]).await;
        assert_eq!(check.error, None);
        assert_eq!((check.answered, check.found), (2, 1));
        assert_eq!(check.missing_sample, vec![2]);
        assert_eq!(h.await.unwrap(), 2);
    }
}
