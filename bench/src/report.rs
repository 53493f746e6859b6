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
//! - the targets of issue 20 ([`targets`], the standing goal) and the same
//!   targets at issue 32's thresholds ([`targets_for`] with [`STEP`]) are
//!   judged from the report alone (cells, instances, meta), so a
//!   re-rendered report judges them again;
//!   one the run did not measure is said to be "not measured in this run",
//!   never met;
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
    /// Every firewall instance the run started, with its resident memory
    /// fresh and at its end (absent in older reports).
    #[serde(default)]
    pub instances: Vec<InstanceReport>,
    /// The targets of issue 20, judged from this run ([`targets`]).
    #[serde(default)]
    pub verdicts: Vec<Verdict>,
    /// The same targets at issue 32's thresholds ([`targets_for`] with
    /// [`STEP`]).
    #[serde(default)]
    pub step_verdicts: Vec<Verdict>,
}

/// What [`InstanceReport::scope`] says of the long-lived instances.
pub const WHOLE_RUN: &str = "whole run";

/// One firewall instance the run started.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct InstanceReport {
    /// Instance name (`firewall-audit`, `firewall-noaudit-tls`, ...).
    pub name: String,
    /// The target it served.
    pub target: String,
    /// Whether its listener was TLS.
    pub tls: bool,
    /// [`WHOLE_RUN`] for the long-lived instances every shared cell uses;
    /// else the cell (and round) it was started fresh for.
    pub scope: String,
    /// `VmRSS` right after it was started, ready and primed (one
    /// `tools/list` per route), before any load, MB.
    pub fresh_rss_mb: Option<f64>,
    /// `VmRSS` at the end of the whole run (long-lived instances) or when it
    /// was stopped after its cell or round (fresh ones), MB.
    pub end_rss_mb: Option<f64>,
    /// Requests the harness sent it.
    pub requests: u64,
    /// Distinct runs (tokens) among them.
    pub runs: u64,
}

/// How a target of issue 20 came out in a run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Measured and within the target.
    Met,
    /// Measured and outside it.
    Missed,
    /// The run did not measure it (a cell, a target or a size missing).
    NotMeasured,
}

/// One target of issue 20 and its verdict in a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Verdict {
    /// What the target asks, e.g. `call h1 c=16: firewall ≥ 0.70× hyper`.
    pub target: String,
    /// Met, missed, or not measured.
    pub status: Status,
    /// The figures it was judged by (or why it was not measured), empty if
    /// none.
    pub figure: String,
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
    /// Whether the binaries were built optimized (`release` or `dist`, by
    /// path).
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
    /// Distinct runs (tokens) of the scale scenario's own pool (0: no scale
    /// cell).
    pub scale_runs: usize,
    /// Idle client connections the scale scenario holds per round.
    pub scale_idle: usize,
    /// Calls per run in the scale scenario.
    pub scale_calls_per_run: u64,
    /// The open-file limit the harness and its children ran with.
    pub nofile: u64,
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
    /// The scale scenario's own figures (scale cells only).
    #[serde(default)]
    pub scale: Option<ScaleFigures>,
}

/// What a target did in a scale cell beyond the usual figures.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct ScaleFigures {
    /// Distinct runs (tokens) in the scale pool.
    pub runs: u64,
    /// Distinct runs the target was sent by the end of the cell.
    pub runs_met: u64,
    /// Consecutive calls per run.
    pub calls_per_run: u64,
    /// Idle connections asked for per round.
    pub idle_wanted: u64,
    /// Idle connections opened and answered, fewest over rounds.
    pub idle_opened: u64,
    /// Idle connections still open when a round's load ended, fewest over
    /// rounds.
    pub idle_held: u64,
    /// Why idle connections failed to open or were lost, all rounds.
    pub idle_lost: BTreeMap<String, u64>,
    /// The target's `VmRSS` before the cell (a fresh firewall instance:
    /// right after it was started and primed), MB.
    pub rss_before_mb: Option<f64>,
    /// Its `VmRSS` after the cell's last round (load ended, idle
    /// connections closed), MB.
    pub rss_after_mb: Option<f64>,
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
    /// `VmRSS` of a firewall instance started fresh for this round or cell,
    /// right after it was ready and primed, before any load, MB.
    pub fresh_rss_mb: Option<f64>,
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
            fresh_rss_mb: o(|f| f.fresh_rss_mb),
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
    /// `call h1 c=16` or `call h1 @3000/s (≤64 in flight)`; the lists say
    /// which view they measure (`list (warm view cache) h1 c=16`).
    pub fn title(&self) -> String {
        let name = crate::scenario::label(&self.scenario);
        match self.rate {
            Some(r) => format!(
                "{name} {} open-loop {}/s (≤{} in flight)",
                self.proto, r as u64, self.concurrency
            ),
            None => format!("{name} {} c={}", self.proto, self.concurrency),
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

/// Issue 20: forwarded `tools/call` throughput of the audited firewall over
/// the hyper pass-through's (c=16 and c=64), at least.
pub const CALL_VS_HYPER: f64 = 0.70;
/// Issue 20: the firewall's own CPU per forwarded call (its CPU per call
/// minus the pass-through's), µs, at most.
pub const OWN_CPU_US: f64 = 10.0;
/// Issue 20: `firewall-noaudit` throughput over hyper's, at least.
pub const NOAUDIT_VS_HYPER: f64 = 0.85;
/// Issue 20: `tools/list` (100 tools filtered to 50), warm and cold view,
/// over hyper's, at least.
pub const LIST_VS_HYPER: f64 = 0.70;
/// Issue 20: p99 the audited firewall adds over direct at c=1, ms, at most.
pub const P99_ADDED_MS: f64 = 0.25;
/// Issue 20: streams held at once by the memory targets.
pub const STREAMS_HELD: usize = 1000;
/// Issue 20: KB (1,024 bytes) per held SSE stream over HTTP/1.1 upstreams
/// ((peak RSS − fresh RSS) / streams), at most.
pub const KB_PER_STREAM: f64 = 25.0;
/// Issue 20: peak RSS of a fresh instance holding 1,000 streams over
/// HTTP/1.1 upstreams, MB, at most.
pub const STREAMS_MB: f64 = 60.0;
/// Issue 20: the same with an HTTP/2 upstream, MB, at most.
pub const STREAMS_H2_MB: f64 = 45.0;
/// Issue 20: end-of-run RSS of the audited firewall over its fresh RSS,
/// MB, at most.
pub const END_RSS_GROWTH_MB: f64 = 20.0;
/// Issue 20: distinct runs the audited firewall must have met for the
/// end-of-run RSS target (the full profile's tokens).
pub const END_RSS_RUNS: u64 = 20_000;
/// Issue 20: distinct runs of the scale cell.
pub const SCALE_RUNS: u64 = 100_000;
/// Issue 20: idle client connections of the scale cell.
pub const SCALE_IDLE: u64 = 10_000;

/// One issue's thresholds for the targets [`targets_for`] judges.
#[derive(Debug, Clone, Copy)]
pub struct Goal {
    /// Forwarded `tools/call`, audited, over hyper's rps (c=16, c=64).
    pub call_vs_hyper: f64,
    /// The firewall's own CPU per forwarded call, µs.
    pub own_cpu_us: f64,
    /// `firewall-noaudit` over hyper's rps.
    pub noaudit_vs_hyper: f64,
    /// `tools/list` with the view cache warm, over hyper's rps.
    pub list_vs_hyper: f64,
    /// `tools/list` with the view rebuilt per request, over hyper's rps.
    pub list_cold_vs_hyper: f64,
    /// p99 the audited firewall adds over direct at c=1, ms.
    pub p99_added_ms: f64,
    /// KB per held SSE stream over HTTP/1.1 upstreams.
    pub kb_per_stream: f64,
    /// Peak RSS holding 1,000 streams over HTTP/1.1 upstreams, MB.
    pub streams_mb: f64,
    /// The same with an HTTP/2 upstream, MB.
    pub streams_h2_mb: f64,
    /// End-of-run RSS over fresh, MB.
    pub end_rss_growth_mb: f64,
}

/// Issue 20's targets: the standing goal.
pub const STANDING: Goal = Goal {
    call_vs_hyper: CALL_VS_HYPER,
    own_cpu_us: OWN_CPU_US,
    noaudit_vs_hyper: NOAUDIT_VS_HYPER,
    list_vs_hyper: LIST_VS_HYPER,
    list_cold_vs_hyper: LIST_VS_HYPER,
    p99_added_ms: P99_ADDED_MS,
    kb_per_stream: KB_PER_STREAM,
    streams_mb: STREAMS_MB,
    streams_h2_mb: STREAMS_H2_MB,
    end_rss_growth_mb: END_RSS_GROWTH_MB,
};

/// Issue 32's targets: the step of the hot-path redesign toward
/// [`STANDING`] (2× issue 20's measured throughput; an HTTP/2 upstream's
/// streams keep the standing bound).
pub const STEP: Goal = Goal {
    call_vs_hyper: 0.50,
    own_cpu_us: 40.0,
    noaudit_vs_hyper: 0.70,
    list_vs_hyper: 0.50,
    list_cold_vs_hyper: 0.35,
    p99_added_ms: 0.40,
    kb_per_stream: 30.0,
    streams_mb: 60.0,
    streams_h2_mb: STREAMS_H2_MB,
    end_rss_growth_mb: 25.0,
};

const NOT_MEASURED: &str = "not measured in this run";

// === impl Verdict ===

impl Verdict {
    fn judged(target: String, ok: bool, figure: String) -> Verdict {
        Verdict {
            target,
            status: if ok { Status::Met } else { Status::Missed },
            figure,
        }
    }

    fn not_measured(target: String, why: impl Into<String>) -> Verdict {
        Verdict {
            target,
            status: Status::NotMeasured,
            figure: why.into(),
        }
    }

    /// `target: met (figure)`, `target: MISSED (figure)` or `target: not
    /// measured in this run (why)`.
    pub fn line(&self) -> String {
        let status = match self.status {
            Status::Met => "met",
            Status::Missed => "MISSED",
            Status::NotMeasured => NOT_MEASURED,
        };
        if self.figure.is_empty() {
            format!("{}: {status}", self.target)
        } else {
            format!("{}: {status} ({})", self.target, self.figure)
        }
    }
}

/// The targets of issue 20 ("the firewall's own work per call down to a
/// third of the HTTP stack's"), each judged against this run, in the
/// issue's order; verdicts compare with `hyper`, the bare pass-through
/// (nginx's ratios are given as information):
///
/// 1. `call` h1 c=16 and c=64: the audited firewall ≥ 0.70× hyper's rps;
///    its own CPU per call (its `cpu_s_per_10k` minus hyper's, as µs per
///    call: s/10k × 100) ≤ 10 µs; `firewall-noaudit` ≥ 0.85× hyper;
/// 2. `list` (warm view cache) and `list-cold` (view rebuilt per request),
///    h1, c=16 preferred: the firewall ≥ 0.70× hyper each;
/// 3. `call` h1 c=1: the firewall's p99 ≤ direct's + 0.25 ms;
/// 4. `streams` h1 with ≥ 1,000 held streams, on fresh instances: ≤ 25 KB
///    per stream over HTTP/1.1 upstreams ((peak RSS − fresh RSS) /
///    streams), peak ≤ 60 MB, and ≤ 45 MB with an HTTP/2 upstream
///    (`firewall-h2up`);
/// 5. the long-lived audited firewall's `VmRSS` at the end of the run ≤ its
///    fresh `VmRSS` + 20 MB, once it has met ≥ 20,000 runs;
/// 6. `scale` (100,000 runs, 10,000 idle connections): every idle
///    connection held to the end, with rps and RSS against the same
///    target's `call` h1 c=16.
pub fn targets(r: &Report) -> Vec<Verdict> {
    targets_for(r, &STANDING)
}

/// The same targets as [`targets`], judged with `goal`'s thresholds
/// ([`STEP`]: issue 32's).
pub fn targets_for(r: &Report, goal: &Goal) -> Vec<Verdict> {
    let cells = &r.cells;
    let mut out = Vec::new();
    for c in [16, 64] {
        out.push(throughput_vs_hyper(
            cells,
            "call",
            c,
            "firewall",
            "firewall (verification, CEL policy, limits, audit)",
            goal.call_vs_hyper,
        ));
    }
    for c in [16, 64] {
        out.push(own_cpu(cells, c, goal));
    }
    for c in [16, 64] {
        out.push(throughput_vs_hyper(
            cells,
            "call",
            c,
            "firewall-noaudit",
            "firewall-noaudit (audit off)",
            goal.noaudit_vs_hyper,
        ));
    }
    for scenario in ["list", "list-cold"] {
        let list = closed_h1(cells, scenario);
        let c = list
            .iter()
            .find(|x| x.concurrency == 16)
            .or_else(|| list.first())
            .map_or(16, |x| x.concurrency);
        out.push(throughput_vs_hyper(
            cells,
            scenario,
            c,
            "firewall",
            "firewall",
            if scenario == "list" {
                goal.list_vs_hyper
            } else {
                goal.list_cold_vs_hyper
            },
        ));
    }
    out.push(p99_added(cells, goal));
    out.extend(streams(r, goal));
    out.push(end_of_run_rss(r, goal));
    out.push(scale(cells));
    out
}

/// Closed-loop HTTP/1.1 cells of `scenario`.
fn closed_h1<'a>(cells: &'a [CellReport], scenario: &str) -> Vec<&'a CellReport> {
    cells
        .iter()
        .filter(|x| x.scenario == scenario && x.proto == "h1" && x.rate.is_none())
        .collect()
}

fn find_cell<'a>(cells: &'a [CellReport], scenario: &str, c: usize) -> Option<&'a CellReport> {
    closed_h1(cells, scenario)
        .into_iter()
        .find(|x| x.concurrency == c)
}

impl CellReport {
    /// The target of that name, if it was measured here.
    pub fn target(&self, name: &str) -> Option<&TargetReport> {
        self.targets.iter().find(|t| t.target == name)
    }
}

/// The medians of `name` in `cell`, if it answered anything.
fn answered<'a>(cell: Option<&'a CellReport>, name: &str) -> Option<&'a Figures> {
    cell?
        .target(name)
        .map(|t| &t.median)
        .filter(|m| m.rps > 0.0)
}

fn throughput_vs_hyper(
    cells: &[CellReport],
    scenario: &str,
    c: usize,
    name: &str,
    who: &str,
    floor: f64,
) -> Verdict {
    let label = crate::scenario::label(scenario);
    let title = format!("{label} h1 c={c}: {who} ≥ {floor:.2}× hyper");
    let cell = find_cell(cells, scenario, c);
    if cell.is_none() {
        return Verdict::not_measured(title, format!("no {scenario}/h1/{c} cell"));
    }
    let (Some(fw), Some(hy)) = (answered(cell, name), answered(cell, "hyper")) else {
        return Verdict::not_measured(title, format!("{name} or hyper not measured in the cell"));
    };
    let ratio = fw.rps / hy.rps;
    let nginx = answered(cell, "nginx").map_or_else(String::new, |ng| {
        format!(
            "; nginx {} rps: {name} x{:.2} of nginx, hyper x{:.2}",
            k(ng.rps),
            fw.rps / ng.rps,
            hy.rps / ng.rps
        )
    });
    Verdict::judged(
        title,
        ratio >= floor,
        format!(
            "x{ratio:.2}: {name} {} rps, hyper {} rps{nginx}",
            k(fw.rps),
            k(hy.rps)
        ),
    )
}

fn own_cpu(cells: &[CellReport], c: usize, goal: &Goal) -> Verdict {
    let title = format!(
        "call h1 c={c}: the firewall's own CPU per call (firewall − hyper) ≤ {:.0} µs",
        goal.own_cpu_us
    );
    let cell = find_cell(cells, "call", c);
    if cell.is_none() {
        return Verdict::not_measured(title, format!("no call/h1/{c} cell"));
    }
    let per_call = |name: &str| answered(cell, name)?.cpu_s_per_10k.map(|s| s * 100.0);
    let (Some(fw), Some(hy)) = (per_call("firewall"), per_call("hyper")) else {
        return Verdict::not_measured(title, "firewall or hyper CPU not measured in the cell");
    };
    let own = fw - hy;
    Verdict::judged(
        title,
        own <= goal.own_cpu_us,
        format!("{own:.1} µs: firewall {fw:.1} µs per call, hyper {hy:.1} µs"),
    )
}

fn p99_added(cells: &[CellReport], goal: &Goal) -> Verdict {
    let title = format!(
        "call h1 c=1: p99 the audited firewall adds over direct ≤ {:.2} ms",
        goal.p99_added_ms
    );
    let cell = find_cell(cells, "call", 1);
    if cell.is_none() {
        return Verdict::not_measured(title, "no call/h1/1 cell");
    }
    let (Some(fw), Some(d)) = (answered(cell, "firewall"), answered(cell, "direct")) else {
        return Verdict::not_measured(title, "firewall or direct not measured in the cell");
    };
    let extra = fw.p99_ms - d.p99_ms;
    Verdict::judged(
        title,
        extra <= goal.p99_added_ms,
        format!(
            "{extra:+.2} ms: firewall p99 {} ms, direct {} ms",
            ms(fw.p99_ms),
            ms(d.p99_ms)
        ),
    )
}

/// KB (1,024 bytes) per held stream: (peak − fresh) / streams.
pub fn kb_per_stream(m: &Figures, streams: usize) -> Option<f64> {
    Some((m.peak_rss_mb? - m.fresh_rss_mb?) * 1024.0 / streams.max(1) as f64)
}

fn streams(r: &Report, goal: &Goal) -> Vec<Verdict> {
    let per_stream = format!(
        "streams h1: ≤ {:.0} KB per held SSE stream over HTTP/1.1 upstreams (firewall, fresh instance)",
        goal.kb_per_stream
    );
    let h1 = format!(
        "streams h1: {} held streams ≤ {:.0} MB on a fresh firewall instance (HTTP/1.1 upstream)",
        thousands(STREAMS_HELD as u64),
        goal.streams_mb
    );
    let h2 = format!(
        "streams h1: {} held streams ≤ {:.0} MB on a fresh firewall instance with an HTTP/2 upstream (firewall-h2up)",
        thousands(STREAMS_HELD as u64),
        goal.streams_h2_mb
    );
    let Some(cell) = closed_h1(&r.cells, "streams")
        .into_iter()
        .max_by_key(|x| x.concurrency)
    else {
        return [per_stream, h1, h2]
            .into_iter()
            .map(|t| Verdict::not_measured(t, "no streams/h1 cell"))
            .collect();
    };
    let n = cell.concurrency;
    let small = n < STREAMS_HELD;
    // With --firewall-upstream-http2 every firewall spoke HTTP/2 upstream.
    let whole_run_h2 = r.meta.firewall_upstream.contains("HTTP/2");
    let figures = |name: &str| -> Result<(&Figures, f64, f64), String> {
        let m = answered(Some(cell), name).ok_or_else(|| format!("{name} not measured"))?;
        let (Some(peak), Some(fresh)) = (m.peak_rss_mb, m.fresh_rss_mb) else {
            return Err(format!("{name}'s RSS was not measured on a fresh instance"));
        };
        Ok((m, peak, fresh))
    };
    let size = |t: String, figure: String| {
        Verdict::not_measured(
            t,
            format!(
                "the cell held {n} streams, fewer than {}; {figure}",
                thousands(STREAMS_HELD as u64)
            ),
        )
    };
    let mut out = Vec::new();
    if whole_run_h2 {
        let why = "the run's firewall spoke HTTP/2 to the upstream (--firewall-upstream-http2)";
        out.push(Verdict::not_measured(per_stream, why));
        out.push(Verdict::not_measured(h1, why));
    } else {
        match figures("firewall") {
            Err(e) => {
                out.push(Verdict::not_measured(per_stream, e.clone()));
                out.push(Verdict::not_measured(h1, e));
            }
            Ok((m, peak, fresh)) => {
                let kb = kb_per_stream(m, n).unwrap_or(f64::NAN);
                let per = format!(
                    "{kb:.1} KB per stream: ({peak:.1} MB peak − {fresh:.1} MB fresh) / {n}"
                );
                let whole = format!("{peak:.1} MB peak, {fresh:.1} MB fresh");
                if small {
                    out.push(size(per_stream, per));
                    out.push(size(h1, whole));
                } else {
                    out.push(Verdict::judged(per_stream, kb <= goal.kb_per_stream, per));
                    out.push(Verdict::judged(h1, peak <= goal.streams_mb, whole));
                }
            }
        }
    }
    let h2_target = if answered(Some(cell), "firewall-h2up").is_none() && whole_run_h2 {
        "firewall"
    } else {
        "firewall-h2up"
    };
    out.push(match figures(h2_target) {
        Err(e) => Verdict::not_measured(
            h2,
            format!("{e} (add it to the cell: streams/h1/1000+firewall-h2up)"),
        ),
        Ok((m, peak, fresh)) => {
            let whole = format!(
                "{peak:.1} MB peak, {fresh:.1} MB fresh, {} KB per stream",
                kb_per_stream(m, n).map_or_else(|| "–".to_owned(), |v| format!("{v:.1}"))
            );
            if small {
                size(h2, whole)
            } else {
                Verdict::judged(h2, peak <= goal.streams_h2_mb, whole)
            }
        }
    });
    out
}

fn end_of_run_rss(r: &Report, goal: &Goal) -> Verdict {
    let title = format!(
        "end-of-run VmRSS of the audited firewall ≤ fresh + {:.0} MB after {} runs",
        goal.end_rss_growth_mb,
        thousands(END_RSS_RUNS)
    );
    let Some(i) = r
        .instances
        .iter()
        .find(|i| i.target == "firewall" && !i.tls && i.scope == WHOLE_RUN)
    else {
        return Verdict::not_measured(title, "no long-lived plain audited firewall");
    };
    let (Some(fresh), Some(end)) = (i.fresh_rss_mb, i.end_rss_mb) else {
        return Verdict::not_measured(title, "its RSS could not be read");
    };
    let growth = end - fresh;
    let figure = format!(
        "{growth:+.1} MB: {fresh:.1} MB fresh, {end:.1} MB at the end, after {} runs and {} requests",
        thousands(i.runs),
        thousands(i.requests)
    );
    if i.runs < END_RSS_RUNS {
        return Verdict::not_measured(
            title,
            format!(
                "it met fewer than {} runs; {figure}",
                thousands(END_RSS_RUNS)
            ),
        );
    }
    Verdict::judged(title, growth <= goal.end_rss_growth_mb, figure)
}

fn scale(cells: &[CellReport]) -> Verdict {
    let title = format!(
        "scale: {} runs with {} idle connections held open while loaded (firewall; rps and RSS against its call h1 c=16)",
        thousands(SCALE_RUNS),
        thousands(SCALE_IDLE)
    );
    let Some(cell) = cells
        .iter()
        .find(|x| x.scenario == "scale" && x.rate.is_none())
    else {
        return Verdict::not_measured(title, "no scale cell");
    };
    let Some(t) = cell.target("firewall") else {
        return Verdict::not_measured(title, "the firewall was not measured in the scale cell");
    };
    let Some(s) = &t.scale else {
        return Verdict::not_measured(title, "the cell has no scale figures");
    };
    let figure = scale_figure(
        t,
        s,
        find_cell(cells, "call", 16).and_then(|c| c.target("firewall")),
    );
    if s.runs < SCALE_RUNS || s.idle_wanted < SCALE_IDLE {
        return Verdict::not_measured(
            title,
            format!(
                "the cell ran with {} runs and {} idle connections; {figure}",
                thousands(s.runs),
                thousands(s.idle_wanted)
            ),
        );
    }
    if s.idle_held < s.idle_wanted {
        return Verdict::judged(title, false, figure);
    }
    if s.runs_met < SCALE_RUNS {
        return Verdict::not_measured(
            title,
            format!(
                "only {} of its runs were reached (its rounds hit their 25 s bound, or --requests was set too low); {figure}",
                thousands(s.runs_met)
            ),
        );
    }
    Verdict::judged(title, true, figure)
}

/// The scale cell's figures of one target, against its `call` h1 c=16.
fn scale_figure(t: &TargetReport, s: &ScaleFigures, call16: Option<&TargetReport>) -> String {
    let m = &t.median;
    let mut out = format!(
        "{} rps, p50 {} ms, p99 {} ms",
        k(m.rps),
        ms(m.p50_ms),
        ms(m.p99_ms)
    );
    if let Some(c) = call16.filter(|c| c.median.rps > 0.0) {
        let _ = write!(
            out,
            " (x{:.2} of its call h1 c=16, {} rps)",
            m.rps / c.median.rps,
            k(c.median.rps)
        );
    }
    // Direct has no proxy process to read.
    if s.rss_before_mb.is_some() || m.peak_rss_mb.is_some() || s.rss_after_mb.is_some() {
        let _ = write!(
            out,
            "; RSS {} MB before, peak {} MB, {} MB after",
            opt(s.rss_before_mb, 1),
            opt(m.peak_rss_mb, 1),
            opt(s.rss_after_mb, 1)
        );
    }
    // Runs mean something to a firewall only (the others pass tokens on).
    let firewall = t.target.starts_with("firewall");
    if let (Some(a), Some(b)) = (s.rss_before_mb, s.rss_after_mb) {
        let _ = write!(out, " ({:+.1} MB", b - a);
        if firewall && s.runs_met > 0 {
            let _ = write!(
                out,
                ", {:.2} KB per run met",
                (b - a) * 1024.0 / s.runs_met as f64
            );
        }
        out.push(')');
    }
    if let Some(peak) = call16.and_then(|c| c.median.peak_rss_mb) {
        let _ = write!(out, "; call h1 c=16 peak {peak:.1} MB");
    }
    let _ = write!(
        out,
        "; idle connections: {} held of {} asked ({} opened)",
        thousands(s.idle_held),
        thousands(s.idle_wanted),
        thousands(s.idle_opened),
    );
    if firewall {
        let _ = write!(
            out,
            "; runs: {} of {} met, {} calls each",
            thousands(s.runs_met),
            thousands(s.runs),
            s.calls_per_run
        );
    }
    if !s.idle_lost.is_empty() {
        let lost: Vec<String> = s
            .idle_lost
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect();
        let _ = write!(out, " (lost: {})", lost.join(", "));
    }
    out
}

/// `12,345`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
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
        for line in cell_notes(c, call16(&r.cells)) {
            let _ = writeln!(s, "  {line}");
        }
    }
    if let Some(a) = &r.audit {
        let _ = writeln!(s, "\naudit: {}", audit_line(a));
    }
    if !r.instances.is_empty() {
        let _ = writeln!(s, "\n{INSTANCES_HEAD}:");
        for i in &r.instances {
            let _ = writeln!(s, "  {}", instance_line(i));
        }
    }
    if !r.step_verdicts.is_empty() {
        let _ = writeln!(
            s,
            "\nTargets of issue 32 (this step), against the hyper pass-through:"
        );
        for v in &r.step_verdicts {
            let _ = writeln!(s, "  {}", v.line());
        }
    }
    if !r.verdicts.is_empty() {
        let _ = writeln!(s, "\nTargets (issue 20), against the hyper pass-through:");
        for v in &r.verdicts {
            let _ = writeln!(s, "  {}", v.line());
        }
    }
    s
}

const INSTANCES_HEAD: &str = "firewall instances (VmRSS fresh: started, ready and primed, before any load; end: at the end of the run, or when an instance started fresh for a cell was stopped)";

/// The `call` h1 c=16 cell the scale figures compare with.
fn call16(cells: &[CellReport]) -> Option<&CellReport> {
    find_cell(cells, "call", 16)
}

/// What a cell adds under its table: memory per held stream on fresh
/// instances, and the scale figures.
fn cell_notes(c: &CellReport, call16: Option<&CellReport>) -> Vec<String> {
    let mut out = Vec::new();
    for t in &c.targets {
        let m = &t.median;
        if c.scenario == "streams" {
            if let (Some(fresh), Some(peak)) = (m.fresh_rss_mb, m.peak_rss_mb) {
                out.push(format!(
                    "{} on instances started fresh for each round: {fresh:.1} MB fresh, {peak:.1} MB peak with {} held streams: {} KB per stream",
                    t.target,
                    c.concurrency,
                    opt(kb_per_stream(m, c.concurrency), 1)
                ));
            }
        }
        if let Some(sc) = &t.scale {
            let base = call16.and_then(|x| x.target(&t.target));
            out.push(format!(
                "scale, {}: {}",
                t.target,
                scale_figure(t, sc, base)
            ));
        }
    }
    out
}

/// The cargo profile a binary was built with, by its path: `dist` (the
/// build of record), `release`, or `debug`.
fn build_profile(bin: &str, optimized: bool) -> &'static str {
    if bin.contains("/dist/") {
        "dist"
    } else if optimized {
        "release"
    } else {
        "debug"
    }
}

fn instance_line(i: &InstanceReport) -> String {
    let growth = match (i.fresh_rss_mb, i.end_rss_mb) {
        (Some(a), Some(b)) => format!(" ({:+.1} MB)", b - a),
        _ => String::new(),
    };
    format!(
        "{} ({}{}, {}): {} MB fresh, {} MB at the end{growth}; {} requests, {} runs",
        i.name,
        i.target,
        if i.tls { ", TLS" } else { "" },
        i.scope,
        opt(i.fresh_rss_mb, 1),
        opt(i.end_rss_mb, 1),
        thousands(i.requests),
        thousands(i.runs)
    )
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
                build_profile(&m.firewall_bin, m.release),
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
        (
            "scale cell",
            if m.scale_runs == 0 {
                "none".to_owned()
            } else {
                format!(
                    "{} distinct runs of {} calls (their own tokens), {} idle connections held per round; open-file limit {}",
                    thousands(m.scale_runs as u64),
                    m.scale_calls_per_run,
                    thousands(m.scale_idle as u64),
                    m.nofile
                )
            },
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    if !r.step_verdicts.is_empty() {
        let _ = writeln!(
            s,
            "\n## Targets of issue 32 (this step)\n\nThe same targets at issue 32's thresholds, judged against the bare hyper pass-through of the same run.\n"
        );
        for v in &r.step_verdicts {
            let _ = writeln!(s, "- {}", v.line());
        }
    }
    if !r.verdicts.is_empty() {
        let _ = writeln!(
            s,
            "\n## Targets (issue 20)\n\nJudged against the bare hyper pass-through of the same run (nginx's ratios as information).\n"
        );
        for v in &r.verdicts {
            let _ = writeln!(s, "- {}", v.line());
        }
    }
    let _ = writeln!(s, "\n## Summary (requests per second, ratio to direct)\n");
    // Every target any cell measured, in the order they first appear.
    let mut targets: Vec<String> = Vec::new();
    for t in r.cells.iter().flat_map(|c| &c.targets) {
        if !targets.contains(&t.target) {
            targets.push(t.target.clone());
        }
    }
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
        let notes = cell_notes(c, call16(&r.cells));
        if !notes.is_empty() {
            let _ = writeln!(s);
            for n in notes {
                let _ = writeln!(s, "- {n}");
            }
        }
        let _ = writeln!(s);
    }
    if !r.instances.is_empty() {
        let _ = writeln!(s, "## Firewall instances\n\n{INSTANCES_HEAD}.\n");
        for i in &r.instances {
            let _ = writeln!(s, "- {}", instance_line(i));
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
