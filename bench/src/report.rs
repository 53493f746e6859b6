//! The results of a run and their renderings: a terminal table, a JSON file
//! with every figure (every round of every target), and a Markdown report.
//!
//! Invariants:
//! - every figure in the table and the Markdown is a median over rounds of
//!   one target in one cell; the JSON also keeps the rounds;
//! - ratios compare medians of the same cell in the same run (never across
//!   runs): `x direct` = target rps / direct rps, `x nginx` = target rps /
//!   nginx rps, and the shared-state note firewall-redis / firewall;
//! - the proxy CPU and RSS columns are the proxy's own processes; servers
//!   that a firewall uses on the same machine (ClickHouse for audit, Redis
//!   for `firewall-redis`) are measured over the same window and reported
//!   next to it;
//! - rendering is pure (data in, text out), so it is unit-tested.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Everything a run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// How and where it ran.
    pub meta: Meta,
    /// One entry per cell (scenario × protocol × load).
    pub cells: Vec<CellReport>,
    /// The audit pipeline under load, when a firewall audited.
    pub audit: Option<AuditSummary>,
    /// Observations worth reading with the numbers.
    pub notes: Vec<String>,
}

/// How and where a run happened.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Meta {
    /// Unix time of the start.
    pub started_unix: u64,
    /// Profile name.
    pub profile: String,
    /// Online CPUs.
    pub cpus: usize,
    /// 1-minute load average before the run.
    pub load_before: Option<f64>,
    /// 1-minute load average after the run.
    pub load_after: Option<f64>,
    /// Who is pinned where.
    pub pinning: String,
    /// Load-generator worker threads.
    pub loadgen_threads: usize,
    /// The upstream ran in its own process or in the harness.
    pub upstream_mode: String,
    /// Upstream runtime threads.
    pub upstream_threads: usize,
    /// nginx version and `worker_processes`, if it ran.
    pub nginx: Option<String>,
    /// The Redis behind `firewall-redis` (version, key prefix), if it ran.
    pub redis: Option<String>,
    /// The firewall binary.
    pub firewall_bin: String,
    /// Whether the binaries were built in release mode (by path).
    pub release: bool,
    /// Rounds per target per cell.
    pub rounds: usize,
    /// Warm-up per round, seconds.
    pub warmup_s: f64,
    /// Measured time per round, seconds.
    pub duration_s: f64,
    /// Distinct tokens (runs) cycled by the reader pool.
    pub tokens: usize,
    /// Consecutive requests per token (calls of one run).
    pub calls_per_run: u64,
    /// Tools in the upstream's catalog.
    pub tools: usize,
    /// Bytes of a `tools/call` result.
    pub result_bytes: usize,
    /// Hold time of the streams scenario, ms.
    pub hold_ms: u64,
    /// Where audit rows went.
    pub audit_sink: String,
    /// The firewall's `log.level`.
    pub firewall_log_level: String,
    /// How the firewall talks to the upstream (absent in older reports).
    #[serde(default)]
    pub firewall_upstream: String,
    /// Seconds spent minting tokens.
    pub token_mint_s: f64,
}

/// One cell: a scenario at one protocol and load, every target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellReport {
    /// Scenario name.
    pub scenario: String,
    /// `h1`, `h2c`, `tls-h1`, `tls-h2`.
    pub proto: String,
    /// Concurrency (closed loop) or in-flight bound (open loop).
    pub concurrency: usize,
    /// Open-loop rate, requests per second.
    pub rate: Option<f64>,
    /// One entry per target, in target order.
    pub targets: Vec<TargetReport>,
}

/// One target in one cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetReport {
    /// `direct`, `nginx`, `hyper`, `firewall`, `firewall-noaudit`,
    /// `firewall-redis`.
    pub target: String,
    /// Medians over rounds.
    pub median: Figures,
    /// Median rps over direct's median rps.
    pub ratio_direct: Option<f64>,
    /// Median rps over nginx's median rps.
    pub ratio_nginx: Option<f64>,
    /// Every round.
    pub rounds: Vec<Figures>,
    /// Failures by kind, all rounds.
    pub errors: BTreeMap<String, u64>,
    /// Answers by template and outcome, all rounds.
    pub outcomes: BTreeMap<String, u64>,
    /// Latency (ms) at percentiles, from all rounds' merged histogram.
    pub curve: Vec<CurvePoint>,
}

/// A point of a latency-percentile curve.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct CurvePoint {
    /// Percentile (0–100).
    pub percentile: f64,
    /// Latency, ms.
    pub ms: f64,
}

/// The figures of one round (or their medians).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct Figures {
    /// Answers per second in the measured window (ok or not).
    pub rps: f64,
    /// Latency percentiles, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// Largest latency, ms.
    pub max_ms: f64,
    /// Answers that met the expectation.
    pub ok: u64,
    /// Answers that did not, and transport failures.
    pub failed: u64,
    /// The proxy's CPU seconds per 10,000 answers (proxies only).
    pub cpu_s_per_10k: Option<f64>,
    /// The proxy's peak RSS in the round, MB (proxies only).
    pub peak_rss_mb: Option<f64>,
    /// The upstream's CPU use in the window, share of one core.
    pub upstream_cpu: Option<f64>,
    /// The load generator's CPU use in the window, share of one core.
    pub loadgen_cpu: Option<f64>,
    /// Audit rows written to the spool per second (audited firewall).
    pub audit_spool_rows_per_s: Option<f64>,
    /// Audit rows acknowledged by ClickHouse per second (audited firewall).
    pub audit_clickhouse_rows_per_s: Option<f64>,
    /// Share of requests carrying a token this firewall had not verified
    /// before (first call of a run).
    pub first_time_token_share: Option<f64>,
    /// ClickHouse's CPU use in the window, share of one core (audited
    /// firewalls; it runs on the same machine).
    pub clickhouse_cpu: Option<f64>,
    /// Redis's CPU use in the window, share of one core (`firewall-redis`).
    pub redis_cpu: Option<f64>,
    /// Redis's CPU seconds per 10,000 answers (`firewall-redis`): add it to
    /// the proxy's for the target's whole cost.
    pub redis_cpu_s_per_10k: Option<f64>,
    /// Redis's peak RSS in the round, MB (`firewall-redis`).
    pub redis_peak_rss_mb: Option<f64>,
    /// Scripts (`EVALSHA`) Redis ran per answer (`firewall-redis`).
    pub redis_scripts_per_answer: Option<f64>,
    /// Commands Redis executed per answer, those inside scripts included
    /// (`firewall-redis`).
    pub redis_commands_per_answer: Option<f64>,
}

/// The audit pipeline over the whole run.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct AuditSummary {
    /// Rows spooled by every audited firewall.
    pub rows_spooled: u64,
    /// Rows acknowledged by ClickHouse (firewall metrics).
    pub rows_sent: u64,
    /// Rows lost under fail-open.
    pub rows_lost: u64,
    /// Distinct `event_id`s in ClickHouse.
    pub rows_in_clickhouse: Option<u64>,
    /// `count()` minus distinct ids (re-sent rows before merges).
    pub duplicates_in_clickhouse: Option<u64>,
    /// Highest spool write rate of a round, rows/s.
    pub peak_spool_rows_per_s: Option<f64>,
    /// Highest ClickHouse ingest rate of a round, rows/s.
    pub peak_clickhouse_rows_per_s: Option<f64>,
    /// Where rows went.
    pub sink: String,
    /// The dedicated audit load, if it ran.
    pub load: Option<AuditLoad>,
}

/// The dedicated audit-pipeline load: `call` at 64 in flight on the audited
/// firewall, then the wait until ClickHouse has every row.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct AuditLoad {
    /// Length of the load, seconds.
    pub seconds: f64,
    /// Requests per second the firewall served meanwhile.
    pub rps: f64,
    /// Rows written to the spool per second during the load.
    pub spool_rows_per_s: f64,
    /// Rows acknowledged by ClickHouse per second during the load.
    pub clickhouse_rows_per_s_during_load: f64,
    /// Rows acknowledged per second from the start of the load until the
    /// last row spooled by its end was acknowledged.
    pub end_to_end_rows_per_s: Option<f64>,
    /// Seconds from the end of the load until then.
    pub drain_after_load_s: Option<f64>,
    /// Requests that did not get the expected answer.
    pub failed: u64,
}

// === impl Figures ===

impl Figures {
    /// Latency and throughput figures of one measured histogram.
    pub fn from_histogram(h: &Histogram<u64>, elapsed_s: f64, ok: u64, failed: u64) -> Figures {
        let ms = |q: f64| {
            if h.is_empty() {
                0.0
            } else {
                h.value_at_quantile(q) as f64 / 1000.0
            }
        };
        Figures {
            rps: if elapsed_s > 0.0 {
                (ok + failed) as f64 / elapsed_s
            } else {
                0.0
            },
            p50_ms: ms(0.50),
            p90_ms: ms(0.90),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: h.max() as f64 / 1000.0,
            ok,
            failed,
            ..Figures::default()
        }
    }

    /// Field-wise medians of `rounds` (counts are summed).
    pub fn median(rounds: &[Figures]) -> Figures {
        let m = |f: fn(&Figures) -> f64| median(rounds.iter().map(f).collect());
        let o = |f: fn(&Figures) -> Option<f64>| {
            let v: Vec<f64> = rounds.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| median(v))
        };
        Figures {
            rps: m(|f| f.rps),
            p50_ms: m(|f| f.p50_ms),
            p90_ms: m(|f| f.p90_ms),
            p99_ms: m(|f| f.p99_ms),
            p999_ms: m(|f| f.p999_ms),
            max_ms: rounds.iter().map(|f| f.max_ms).fold(0.0, f64::max),
            ok: rounds.iter().map(|f| f.ok).sum(),
            failed: rounds.iter().map(|f| f.failed).sum(),
            cpu_s_per_10k: o(|f| f.cpu_s_per_10k),
            peak_rss_mb: rounds.iter().filter_map(|f| f.peak_rss_mb).reduce(f64::max),
            upstream_cpu: o(|f| f.upstream_cpu),
            loadgen_cpu: o(|f| f.loadgen_cpu),
            audit_spool_rows_per_s: o(|f| f.audit_spool_rows_per_s),
            audit_clickhouse_rows_per_s: o(|f| f.audit_clickhouse_rows_per_s),
            first_time_token_share: o(|f| f.first_time_token_share),
            clickhouse_cpu: o(|f| f.clickhouse_cpu),
            redis_cpu: o(|f| f.redis_cpu),
            redis_cpu_s_per_10k: o(|f| f.redis_cpu_s_per_10k),
            redis_peak_rss_mb: rounds
                .iter()
                .filter_map(|f| f.redis_peak_rss_mb)
                .reduce(f64::max),
            redis_scripts_per_answer: o(|f| f.redis_scripts_per_answer),
            redis_commands_per_answer: o(|f| f.redis_commands_per_answer),
        }
    }
}

/// Median of a list (mean of the middle two for even lengths); 0 if empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Latency at fixed percentiles from a histogram (for the plot).
pub fn curve(h: &Histogram<u64>) -> Vec<CurvePoint> {
    if h.is_empty() {
        return Vec::new();
    }
    // Evenly spaced in "number of nines": 0, 50, 68, 90, 96.8, 99, ... 99.99.
    (0..=16)
        .map(|k| {
            let nines = f64::from(k) / 4.0;
            let q = 1.0 - 10f64.powf(-nines);
            CurvePoint {
                percentile: q * 100.0,
                ms: h.value_at_quantile(q) as f64 / 1000.0,
            }
        })
        .collect()
}

// === impl TargetReport ===

impl CellReport {
    /// `call h1 c=16` or `call h1 @3000/s (≤64 in flight)`.
    pub fn title(&self) -> String {
        match self.rate {
            Some(r) => format!(
                "{} {} open-loop {}/s (≤{} in flight)",
                self.scenario, self.proto, r as u64, self.concurrency
            ),
            None => format!("{} {} c={}", self.scenario, self.proto, self.concurrency),
        }
    }

    /// Fills each target's ratios from the medians of direct and nginx.
    pub fn compute_ratios(&mut self) {
        let rps = |name: &str| {
            self.targets
                .iter()
                .find(|t| t.target == name)
                .map(|t| t.median.rps)
                .filter(|r| *r > 0.0)
        };
        let direct = rps("direct");
        let nginx = rps("nginx");
        for t in &mut self.targets {
            t.ratio_direct = direct.map(|d| t.median.rps / d);
            t.ratio_nginx = nginx.map(|n| t.median.rps / n);
        }
    }
}

/// The design targets, checked against the run: the audited firewall at
/// least as fast as nginx on the small call (c=16, c=64), at most +0.3 ms
/// p99 over direct at c=1, and under 64 MB peak RSS at 1,000 concurrent
/// streams. One line per target that the run measured.
pub fn design_targets(cells: &[CellReport]) -> Vec<String> {
    let find = |scenario: &str, c: usize, target: &str| {
        cells
            .iter()
            .find(|x| {
                x.scenario == scenario && x.proto == "h1" && x.concurrency == c && x.rate.is_none()
            })
            .and_then(|x| x.targets.iter().find(|t| t.target == target))
    };
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let mut out = Vec::new();
    for c in [16, 64] {
        if let (Some(fw), Some(ng)) = (find("call", c, "firewall"), find("call", c, "nginx")) {
            let ratio = fw.median.rps / ng.median.rps.max(1e-9);
            out.push(format!(
                "target firewall (verification, policy, audit) ≥ nginx throughput, call c={c}: {} ({} vs {} rps, x{ratio:.2})",
                verdict(ratio >= 1.0),
                k(fw.median.rps),
                k(ng.median.rps)
            ));
            if let Some(hy) = find("call", c, "hyper") {
                out.push(format!(
                    "  the HTTP stack's floor, call c={c}: a bare hyper pass-through {} rps (x{:.2} nginx); the firewall reaches x{:.2} of it",
                    k(hy.median.rps),
                    hy.median.rps / ng.median.rps.max(1e-9),
                    fw.median.rps / hy.median.rps.max(1e-9)
                ));
            }
        }
    }
    if let (Some(fw), Some(d)) = (find("call", 1, "firewall"), find("call", 1, "direct")) {
        let extra = fw.median.p99_ms - d.median.p99_ms;
        out.push(format!(
            "target ≤ +0.3 ms p99 at c=1: {} (firewall p99 {} ms, direct {} ms: +{extra:.2} ms)",
            verdict(extra <= 0.3),
            ms(fw.median.p99_ms),
            ms(d.median.p99_ms)
        ));
    }
    if let Some(cell) = cells
        .iter()
        .filter(|x| x.scenario == "streams" && x.concurrency >= 1000)
        .max_by_key(|x| x.concurrency)
    {
        if let Some(fw) = cell.targets.iter().find(|t| t.target == "firewall") {
            if let Some(rss) = fw.median.peak_rss_mb {
                out.push(format!(
                    "target peak RSS < 64 MB at {} concurrent streams: {} ({rss:.1} MB, after every earlier cell of the run)",
                    cell.concurrency,
                    verdict(rss < 64.0)
                ));
            }
        }
    }
    out
}

/// How every note of [`shared_state`] starts (re-rendering replaces them).
pub const SHARED_STATE_NOTE: &str = "firewall-redis vs firewall";

/// What sharing budgets and rate limits in Redis costs, per `call` cell
/// that measured both `firewall` and `firewall-redis` (same config, same
/// audit, same run): throughput ratio firewall-redis / firewall, added
/// latency per call at p50 and p99 (µs, medians over rounds), and CPU per
/// 10,000 calls with Redis's own CPU added to the firewall-redis process's.
/// The proxy columns count the firewall process only for both; Redis is
/// measured apart over the same window, as ClickHouse is for the audited
/// firewalls (whose CPU stays apart for both, since both audit into it).
pub fn shared_state(cells: &[CellReport]) -> Vec<String> {
    let mut out = Vec::new();
    for c in cells.iter().filter(|c| c.scenario == "call") {
        let find = |name: &str| c.targets.iter().find(|t| t.target == name);
        let (Some(fw), Some(rd)) = (find("firewall"), find("firewall-redis")) else {
            continue;
        };
        let (a, b) = (&fw.median, &rd.median);
        let us = |d: f64| {
            let v = d * 1000.0;
            if v >= 0.0 {
                format!("+{v:.0}")
            } else {
                format!("{v:.0}")
            }
        };
        let cpu = match (b.cpu_s_per_10k, b.redis_cpu_s_per_10k, a.cpu_s_per_10k) {
            (Some(p), Some(r), Some(f)) => format!(
                "; CPU s per 10k calls: {:.2} (firewall-redis {p:.2} + its Redis {r:.2}) vs firewall {f:.2}, x{:.2}",
                p + r,
                (p + r) / f.max(1e-9)
            ),
            (Some(p), None, Some(f)) => {
                format!("; CPU s per 10k calls: firewall-redis {p:.2} (Redis not measured) vs firewall {f:.2}")
            }
            _ => String::new(),
        };
        let commands = b.redis_scripts_per_answer.map_or_else(String::new, |n| {
            format!("; {n:.2} Redis scripts (EVALSHA) per call")
        });
        out.push(format!(
            "{SHARED_STATE_NOTE}, {}: x{:.2} throughput ({} vs {} rps), {} µs p50 and {} µs p99 per call ({} vs {} ms, {} vs {} ms){cpu}{commands}. Redis's CPU is measured apart like ClickHouse's (its process over the same window) and added here; ClickHouse's, which both audit into, is in neither figure",
            c.title(),
            b.rps / a.rps.max(1e-9),
            k(b.rps),
            k(a.rps),
            us(b.p50_ms - a.p50_ms),
            us(b.p99_ms - a.p99_ms),
            ms(b.p50_ms),
            ms(a.p50_ms),
            ms(b.p99_ms),
            ms(a.p99_ms),
        ));
    }
    out
}

fn k(rps: f64) -> String {
    if rps >= 10_000.0 {
        format!("{:.1}k", rps / 1000.0)
    } else if rps >= 1000.0 {
        format!("{:.2}k", rps / 1000.0)
    } else {
        format!("{rps:.0}")
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn errors_text(t: &TargetReport) -> String {
    if t.errors.is_empty() {
        return "0".to_owned();
    }
    let total: u64 = t.errors.values().sum();
    let top = t
        .errors
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(k, _)| k.as_str())
        .unwrap_or("");
    format!("{total} ({top})")
}

// === renderings ===

/// The terminal table: one block per cell.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    for c in &r.cells {
        let _ = writeln!(s, "\n{}", c.title());
        let _ = writeln!(
            s,
            "  {:<17} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>9} {:>8}  errors",
            "target",
            "rps",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "p99.9",
            "x dir",
            "x nginx",
            "cpu s/10k",
            "rss MB"
        );
        for t in &c.targets {
            let m = &t.median;
            let _ = writeln!(
                s,
                "  {:<17} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>9} {:>8}  {}",
                t.target,
                k(m.rps),
                ms(m.p50_ms),
                ms(m.p90_ms),
                ms(m.p99_ms),
                ms(m.p999_ms),
                opt(t.ratio_direct, 2),
                opt(t.ratio_nginx, 2),
                opt(m.cpu_s_per_10k, 2),
                opt(m.peak_rss_mb, 1),
                errors_text(t)
            );
        }
        for t in &c.targets {
            if let Some(line) = redis_line(t) {
                let _ = writeln!(s, "  {line}");
            }
        }
    }
    if let Some(a) = &r.audit {
        let _ = writeln!(s, "\naudit: {}", audit_line(a));
    }
    s
}

/// What the Redis behind `t` used in the cell, if it was measured.
fn redis_line(t: &TargetReport) -> Option<String> {
    let m = &t.median;
    let cpu = m.redis_cpu?;
    Some(format!(
        "Redis (same machine, for {}): {:.0} % of a core, {} CPU s per 10k answers, peak RSS {} MB; per answer {} scripts (EVALSHA), {} commands with those the scripts ran",
        t.target,
        cpu * 100.0,
        opt(m.redis_cpu_s_per_10k, 2),
        opt(m.redis_peak_rss_mb, 1),
        opt(m.redis_scripts_per_answer, 2),
        opt(m.redis_commands_per_answer, 1)
    ))
}

fn audit_line(a: &AuditSummary) -> String {
    let mut s = format!(
        "whole run: {} rows spooled, {} acknowledged by ClickHouse, {} distinct in ClickHouse ({} duplicates), {} lost; highest round: spool {} rows/s, ClickHouse {} rows/s ({})",
        a.rows_spooled,
        a.rows_sent,
        a.rows_in_clickhouse.map_or_else(|| "–".to_owned(), |v| v.to_string()),
        a.duplicates_in_clickhouse.map_or_else(|| "–".to_owned(), |v| v.to_string()),
        a.rows_lost,
        opt(a.peak_spool_rows_per_s, 0),
        opt(a.peak_clickhouse_rows_per_s, 0),
        a.sink
    );
    if let Some(l) = &a.load {
        let _ = write!(
            s,
            ". Dedicated load ({:.0} s of call at 64 in flight, {} rps, {} failed): spool {:.0} rows/s, ClickHouse {:.0} rows/s during the load, {} rows/s end to end, drained {} s after the load",
            l.seconds,
            k(l.rps),
            l.failed,
            l.spool_rows_per_s,
            l.clickhouse_rows_per_s_during_load,
            opt(l.end_to_end_rows_per_s, 0),
            opt(l.drain_after_load_s, 2)
        );
    }
    s
}

/// The Markdown report.
pub fn markdown(r: &Report) -> String {
    let m = &r.meta;
    let mut s = String::new();
    let _ = writeln!(s, "# mcp-bench: {} profile\n", m.profile);
    let _ = writeln!(
        s,
        "Ratios within one run: every target is measured in the same interleaved rounds ({} × {:.0} s measured after {:.1} s warm-up per target and cell); figures are medians over rounds. `x direct` and `x nginx` divide a target's requests per second by direct's and nginx's in the same cell.\n",
        m.rounds, m.duration_s, m.warmup_s
    );
    let _ = writeln!(s, "| setting | value |\n|---|---|");
    let rows: Vec<(&str, String)> = vec![
        ("CPUs", m.cpus.to_string()),
        (
            "load average (1 min) before / after",
            format!("{} / {}", opt(m.load_before, 2), opt(m.load_after, 2)),
        ),
        ("pinning", m.pinning.clone()),
        ("load generator threads", m.loadgen_threads.to_string()),
        (
            "upstream",
            format!("{} ({} threads)", m.upstream_mode, m.upstream_threads),
        ),
        (
            "nginx",
            m.nginx.clone().unwrap_or_else(|| "not installed".into()),
        ),
        (
            "shared state (firewall-redis)",
            m.redis.clone().unwrap_or_else(|| "not measured".into()),
        ),
        (
            "firewall",
            format!(
                "{} ({}), log level {}{}",
                m.firewall_bin,
                if m.release { "release" } else { "debug" },
                m.firewall_log_level,
                if m.firewall_upstream.is_empty() {
                    String::new()
                } else {
                    format!(", to the upstream over {}", m.firewall_upstream)
                }
            ),
        ),
        ("audit", m.audit_sink.clone()),
        (
            "tokens",
            format!(
                "{} distinct ES256 tokens (runs) for reads, {} calls per run, minted in {:.1} s; every firewall instance meets each run first at its own pace, so the share of first-time verifications per cell is in the JSON (`first_time_token_share`)",
                m.tokens, m.calls_per_run, m.token_mint_s
            ),
        ),
        (
            "catalog",
            format!(
                "{} tools, tools/call result {} B, streams held {} ms",
                m.tools, m.result_bytes, m.hold_ms
            ),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    let _ = writeln!(s, "\n## Summary (requests per second, ratio to direct)\n");
    let targets: Vec<String> = r
        .cells
        .first()
        .map(|c| c.targets.iter().map(|t| t.target.clone()).collect())
        .unwrap_or_default();
    let _ = writeln!(s, "| cell | {} |", targets.join(" | "));
    let _ = writeln!(s, "|---|{}", "---|".repeat(targets.len()));
    for c in &r.cells {
        let cells: Vec<String> = targets
            .iter()
            .map(|name| {
                c.targets.iter().find(|t| &t.target == name).map_or_else(
                    || "–".to_owned(),
                    |t| format!("{} ({})", k(t.median.rps), opt(t.ratio_direct, 2)),
                )
            })
            .collect();
        let _ = writeln!(s, "| {} | {} |", c.title(), cells.join(" | "));
    }
    let _ = writeln!(s, "\n## Cells\n");
    for c in &r.cells {
        let _ = writeln!(s, "### {}\n", c.title());
        let _ = writeln!(s, "| target | rps | p50 ms | p90 ms | p99 ms | p99.9 ms | x direct | x nginx | proxy CPU s / 10k | peak RSS MB | upstream CPU | loadgen CPU | new runs | errors |");
        let _ = writeln!(
            s,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        for t in &c.targets {
            let f = &t.median;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                t.target,
                k(f.rps),
                ms(f.p50_ms),
                ms(f.p90_ms),
                ms(f.p99_ms),
                ms(f.p999_ms),
                opt(t.ratio_direct, 2),
                opt(t.ratio_nginx, 2),
                opt(f.cpu_s_per_10k, 2),
                opt(f.peak_rss_mb, 1),
                f.upstream_cpu
                    .map_or_else(|| "–".into(), |v| format!("{:.0} %", v * 100.0)),
                f.loadgen_cpu
                    .map_or_else(|| "–".into(), |v| format!("{:.0} %", v * 100.0)),
                f.first_time_token_share
                    .map_or_else(|| "–".into(), |v| format!("{:.1} %", v * 100.0)),
                errors_text(t).replace('|', "/"),
            );
        }
        let clickhouse: Vec<String> = c
            .targets
            .iter()
            .filter_map(|t| {
                t.median.clickhouse_cpu.map(|cpu| {
                    format!(
                        "{:.0} % of a core while {} ran this cell",
                        cpu * 100.0,
                        t.target
                    )
                })
            })
            .collect();
        if !clickhouse.is_empty() {
            let _ = writeln!(
                s,
                "\nClickHouse (same machine) used {}.",
                clickhouse.join(", ")
            );
        }
        for t in &c.targets {
            if let Some(line) = redis_line(t) {
                let _ = writeln!(s, "\n{line}.");
            }
        }
        let _ = writeln!(s);
    }
    if let Some(a) = &r.audit {
        let _ = writeln!(s, "## Audit pipeline\n\n{}\n", audit_line(a));
    }
    if !r.notes.is_empty() {
        let _ = writeln!(s, "## Notes\n");
        for n in &r.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
