//! `mcp-bench virtual`: what a virtual server (`[[virtual_server]]`,
//! `/mcp/<name>`) costs on `tools/list`, and whether its merged list keeps
//! its deadline when a member is slow.
//!
//! One firewall instance (audit off) runs the generated config with its
//! virtual servers ([`crate::firewall::VIRTUAL_SERVERS`]) in front of the
//! canned upstream (its own process) and a slow upstream ([`SlowUpstream`],
//! in this process on a thread of its own). Three columns get the `list`
//! scenario's request in interleaved rounds ([`COLUMNS`]): the plain route
//! `/mcp/bench`, `vs1` (one member, `bench`) and `vs3` (`bench`, `bench-b`,
//! `bench-c`, each the canned upstream's `/mcp/bench`, so three times the
//! tools). Then one `tools/list` to `vs-slow` (`bench` and `bench-slow`,
//! whose `tools/list` answers after [`SLOW_DELAY`]): it must come back
//! within the deadline with `bench`'s tools, without `bench-slow`'s, and
//! with a `nextCursor` to ask the late member again ([`FanOut::judge`]).
//!
//! Invariants:
//! - ratios compare medians of the same run (never across runs);
//! - the expected tool count of a column is the reader's visible tools per
//!   member (the catalog's reads) times its members, checked on every
//!   answer like any other scenario's expectation;
//! - every process started here is stopped here (and by its watchdog if the
//!   harness dies);
//! - rendering and judging are pure (data in, text or verdict out), so they
//!   are unit-tested.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::catalog::{Catalog, CatalogError};
use crate::firewall::{self, Firewall, FirewallError, Virtuals, VS_SEPARATOR};
use crate::load::{self, Endpoint, LoadError, LoadSpec, Phase, Proto};
use crate::outcome::Expect;
use crate::procs::{self, Managed, Placement, ProcError};
use crate::report::Figures;
use crate::scenario::{Scenario, Workload, REVISION};
use crate::tokens::{Issuer, TokenError, Tokens};

/// How long the slow upstream takes to answer `tools/list`.
pub const SLOW_DELAY: Duration = Duration::from_secs(5);

/// The slack the fan-out test allows past the deadline (`list_timeout_ms`).
pub const FAN_OUT_SLACK: Duration = Duration::from_secs(1);

/// The tools the slow upstream lists.
pub const SLOW_TOOLS: [&str; 2] = ["slow_lookup", "slow_report"];

/// Largest request body the slow upstream reads.
const MAX_BODY: usize = 1 << 20;

/// One column of the measurement: a path of the same firewall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnDef {
    /// Its name in the report.
    pub name: &'static str,
    /// The request path.
    pub path: &'static str,
    /// How many members' tools it lists (the plain route: one).
    pub members: usize,
    /// What it is, for the report.
    pub what: &'static str,
    /// The scenario it is measured with (`list` here; `call` for the stdio
    /// columns of [`crate::stdio`]).
    pub scenario: Scenario,
}

/// The plain route.
pub const PLAIN: ColumnDef = ColumnDef {
    name: "firewall",
    path: "/mcp/bench",
    members: 1,
    what: "the plain upstream route",
    scenario: Scenario::List,
};

/// One member.
pub const VS1: ColumnDef = ColumnDef {
    name: "vs1",
    path: "/mcp/vs1",
    members: 1,
    what: "virtual server of one member (bench)",
    scenario: Scenario::List,
};

/// Three members.
pub const VS3: ColumnDef = ColumnDef {
    name: "vs3",
    path: "/mcp/vs3",
    members: 3,
    what: "virtual server of three members (bench, bench-b, bench-c)",
    scenario: Scenario::List,
};

/// The columns, in report order.
pub const COLUMNS: [ColumnDef; 3] = [PLAIN, VS1, VS3];

/// The fan-out test's path.
pub const SLOW_PATH: &str = "/mcp/vs-slow";

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The mcp-firewall binary.
    pub firewall_bin: PathBuf,
    /// Rounds per column.
    pub rounds: usize,
    /// Warm-up per round.
    pub warmup: Duration,
    /// Measured time per round.
    pub duration: Duration,
    /// Closed-loop workers (HTTP/1.1 connections).
    pub concurrency: usize,
    /// Distinct reader tokens (runs) to cycle.
    pub tokens: usize,
    /// Consecutive requests per token.
    pub calls_per_run: u64,
    /// Tools in the canned upstream's catalog.
    pub tools: usize,
    /// Per-request timeout.
    pub timeout: Duration,
    /// How long the slow upstream takes to answer `tools/list`.
    pub slow_delay: Duration,
    /// The firewall's `log.level`.
    pub log_level: String,
    /// CPUs of the load generator (this thread), if pinned.
    pub pin_loadgen: Option<Vec<usize>>,
    /// Online CPUs (counted before the load generator was pinned: a pinned
    /// thread sees only its own).
    pub cpus: usize,
}

/// Why the command could not measure.
#[derive(Debug, thiserror::Error)]
pub enum VirtualError {
    /// The catalog parameters are invalid.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// Tokens could not be minted.
    #[error(transparent)]
    Tokens(#[from] TokenError),
    /// A child process failed.
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// The firewall failed to start.
    #[error(transparent)]
    Firewall(#[from] FirewallError),
    /// A local I/O step failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// The canned upstream did not start listening.
    #[error("the canned upstream did not start; log tail:\n{0}")]
    Upstream(String),
    /// A load could not run.
    #[error("{column}: {source}")]
    Load {
        /// The column.
        column: String,
        /// The cause.
        source: LoadError,
    },
    /// A column did not answer its first `tools/list` as expected.
    #[error("priming {column} ({path}): {detail}\nfirewall log tail:\n{log}")]
    Prime {
        /// The column.
        column: String,
        /// Its path.
        path: String,
        /// What went wrong.
        detail: String,
        /// The end of the firewall's log.
        log: String,
    },
    /// The firewall died during the run.
    #[error("mcp-firewall exited during the run; log tail:\n{0}")]
    Died(String),
}

// === the report ===

/// Everything the command measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// How and where it ran.
    pub meta: Meta,
    /// One entry per column, in [`COLUMNS`] order.
    pub columns: Vec<ColumnReport>,
    /// Ratios of the columns' medians.
    pub ratios: Vec<RatioReport>,
    /// The fan-out test.
    pub fan_out: FanOut,
    /// Observations worth reading with the numbers.
    pub notes: Vec<String>,
}

/// How and where it ran.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Meta {
    /// Unix time of the start.
    pub started_unix: u64,
    /// Online CPUs.
    pub cpus: usize,
    /// 1-minute load average before.
    pub load_before: Option<f64>,
    /// 1-minute load average after.
    pub load_after: Option<f64>,
    /// Who is pinned where.
    pub pinning: String,
    /// The firewall binary.
    pub firewall_bin: String,
    /// Its build profile, by path (`dist`, `release`, `debug`, `unknown`).
    pub build: String,
    /// The firewall's `log.level`.
    pub firewall_log_level: String,
    /// Rounds per column.
    pub rounds: usize,
    /// Warm-up per round, seconds.
    pub warmup_s: f64,
    /// Measured time per round, seconds.
    pub duration_s: f64,
    /// Closed-loop workers (HTTP/1.1 connections).
    pub concurrency: usize,
    /// Distinct reader tokens (runs) cycled.
    pub tokens: usize,
    /// Consecutive requests per token.
    pub calls_per_run: u64,
    /// Tools in the canned upstream's catalog.
    pub tools: usize,
    /// Of them, visible to the reader role (per member).
    pub visible_tools: usize,
    /// `list_timeout_ms` of the virtual servers.
    pub list_timeout_ms: u64,
    /// How long the slow upstream took to answer `tools/list`, ms.
    pub slow_delay_ms: u64,
    /// Seconds spent minting tokens.
    pub token_mint_s: f64,
}

/// One column's figures.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct ColumnReport {
    /// Its name.
    pub name: String,
    /// Its path.
    pub path: String,
    /// What it is.
    pub what: String,
    /// Members whose tools it lists.
    pub members: usize,
    /// Tools every answer must list.
    pub tools: u32,
    /// Every round's figures, in round order.
    pub rounds: Vec<Figures>,
    /// Medians over rounds.
    pub median: Figures,
    /// Failures by kind, over every round.
    pub errors: BTreeMap<String, u64>,
}

/// `numerator / denominator` of two columns' medians.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct RatioReport {
    /// The column divided.
    pub numerator: String,
    /// The column it is divided by.
    pub denominator: String,
    /// Requests per second.
    pub rps: Option<f64>,
    /// Median latency.
    pub p50: Option<f64>,
    /// 99th percentile latency.
    pub p99: Option<f64>,
    /// The firewall's CPU per answer.
    pub cpu: Option<f64>,
}

/// One check of the fan-out test.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct Check {
    /// What was checked.
    pub what: String,
    /// Whether it held.
    pub ok: bool,
}

/// The next page of the fan-out test's list (its `nextCursor`).
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct NextPage {
    /// Time to the whole answer, ms.
    pub elapsed_ms: f64,
    /// HTTP status.
    pub status: u16,
    /// Tools listed.
    pub tools: usize,
    /// Whether it carries a `nextCursor` again.
    pub next_cursor: bool,
    /// A JSON-RPC error's code, if it was one.
    pub error_code: Option<i64>,
}

/// The fan-out test: one `tools/list` to `vs-slow`.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct FanOut {
    /// The path asked.
    pub path: String,
    /// `list_timeout_ms`.
    pub deadline_ms: u64,
    /// The longest time allowed (deadline plus [`FAN_OUT_SLACK`]), ms.
    pub limit_ms: u64,
    /// How long the slow member takes to answer, ms.
    pub slow_delay_ms: u64,
    /// Time to the whole answer, ms.
    pub elapsed_ms: f64,
    /// HTTP status.
    pub status: u16,
    /// Tools listed, by member (the prefix before the separator).
    pub tools_by_member: BTreeMap<String, usize>,
    /// Whether the answer carries a `nextCursor`.
    pub next_cursor: bool,
    /// A JSON-RPC error's code, if the answer was one.
    pub error_code: Option<i64>,
    /// The start of the answer when it could not be read as a list.
    pub unreadable: Option<String>,
    /// The checks, each met or not.
    pub checks: Vec<Check>,
    /// The cursor's page (informational: the late member asked again).
    pub next_page: Option<NextPage>,
    /// Whether every check held.
    pub passed: bool,
}

/// What one `tools/list` answer says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listed {
    /// The tools' names.
    pub names: Vec<String>,
    /// The `nextCursor`, if any.
    pub next_cursor: Option<String>,
    /// A JSON-RPC error's code.
    pub error_code: Option<i64>,
}

/// The JSON-RPC message of an answer body: JSON, or the last `data:` event
/// of an event stream that carries a result or an error.
pub fn message(body: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(body).ok()?.trim_start();
    if text.starts_with('{') {
        return serde_json::from_str(text).ok();
    }
    let mut found = None;
    for event in text.split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            continue;
        }
        if let Ok(v) = serde_json::from_str::<Value>(&data.join("\n")) {
            if v.get("result").is_some() || v.get("error").is_some() {
                found = Some(v);
            }
        }
    }
    found
}

/// Reads a `tools/list` answer.
pub fn listed(v: &Value) -> Listed {
    let names = v
        .pointer("/result/tools")
        .and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    Listed {
        names,
        next_cursor: v
            .pointer("/result/nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned),
        error_code: v.pointer("/error/code").and_then(Value::as_i64),
    }
}

/// The member a prefixed name comes from (`bench__get_service` →
/// `bench`); names without the separator count under `""`.
pub fn member_of(name: &str) -> &str {
    name.split_once(VS_SEPARATOR).map_or("", |(m, _)| m)
}

/// What the fan-out test expects of `vs-slow`.
#[derive(Debug, Clone, Copy)]
pub struct FanOutCase<'a> {
    /// `list_timeout_ms`.
    pub deadline: Duration,
    /// How long the slow member takes.
    pub slow_delay: Duration,
    /// The member that answers in time.
    pub fast: &'a str,
    /// The member that answers late.
    pub slow: &'a str,
    /// Tools of `fast` the caller may see.
    pub visible: usize,
}

// === impl FanOut ===

impl FanOut {
    /// Judges one answer of `vs-slow`: answered within the deadline plus
    /// [`FAN_OUT_SLACK`]; the fast member's visible tools there (prefixed
    /// `fast__`); none of the slow member's; a `nextCursor` to ask it again.
    pub fn judge(case: &FanOutCase<'_>, elapsed: Duration, status: u16, body: &[u8]) -> FanOut {
        let FanOutCase {
            deadline,
            slow_delay,
            fast,
            slow,
            visible,
        } = *case;
        let limit = deadline + FAN_OUT_SLACK;
        let msg = message(body);
        let l = msg.as_ref().map(listed).unwrap_or_default();
        let mut by_member: BTreeMap<String, usize> = BTreeMap::new();
        for n in &l.names {
            *by_member.entry(member_of(n).to_owned()).or_default() += 1;
        }
        let count = |m: &str| by_member.get(m).copied().unwrap_or(0);
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let checks = vec![
            Check {
                what: format!(
                    "answered within list_timeout_ms + {} s ({} ms)",
                    FAN_OUT_SLACK.as_secs(),
                    ms(limit)
                ),
                ok: elapsed <= limit,
            },
            Check {
                what: format!(
                    "{fast}'s {visible} visible tools listed, prefixed `{fast}{VS_SEPARATOR}`"
                ),
                ok: status == 200 && count(fast) == visible,
            },
            Check {
                what: format!("no tool of {slow} (it answers after the deadline)"),
                ok: status == 200 && msg.is_some() && count(slow) == 0,
            },
            Check {
                what: "a nextCursor to ask the late member again".to_owned(),
                ok: l.next_cursor.is_some(),
            },
        ];
        let unreadable = msg.is_none().then(|| {
            let text = String::from_utf8_lossy(body);
            text.chars().take(300).collect()
        });
        FanOut {
            path: SLOW_PATH.to_owned(),
            deadline_ms: ms(deadline),
            limit_ms: ms(limit),
            slow_delay_ms: ms(slow_delay),
            elapsed_ms: elapsed.as_secs_f64() * 1000.0,
            status,
            tools_by_member: by_member,
            next_cursor: l.next_cursor.is_some(),
            error_code: l.error_code,
            unreadable,
            passed: checks.iter().all(|c| c.ok),
            checks,
            next_page: None,
        }
    }

    /// The checks that failed, one line each.
    pub fn failures(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.what.clone())
            .collect()
    }
}

/// The firewall log's warnings and errors, each distinct line (without
/// its time stamp and colours) with how often it came, in first-seen order.
pub fn log_warnings(log: &str) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for line in log.lines() {
        let plain = strip_ansi(line);
        let rest = plain
            .split_once(char::is_whitespace)
            .map_or(plain.as_str(), |(_, r)| r)
            .trim();
        if !(rest.starts_with("WARN") || rest.starts_with("ERROR")) {
            continue;
        }
        match out.iter_mut().find(|(l, _)| l == rest) {
            Some(e) => e.1 += 1,
            None => out.push((rest.to_owned(), 1)),
        }
    }
    out
}

/// `text` without ANSI colour sequences (`ESC [ ... letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `a / b`, when both are finite and `b` is positive.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && b > 0.0).then(|| a / b)
}

/// The ratio of two columns' medians.
pub fn ratio_of(num: &ColumnReport, den: &ColumnReport) -> RatioReport {
    let (a, b) = (&num.median, &den.median);
    RatioReport {
        numerator: num.name.clone(),
        denominator: den.name.clone(),
        rps: ratio(a.rps, b.rps),
        p50: ratio(a.p50_ms, b.p50_ms),
        p99: ratio(a.p99_ms, b.p99_ms),
        cpu: a
            .cpu_s_per_10k
            .zip(b.cpu_s_per_10k)
            .and_then(|(x, y)| ratio(x, y)),
    }
}

/// The ratios the report gives: vs3 / vs1 (what two more members cost),
/// vs1 / the plain route (what the virtual server itself costs), vs3 / the
/// plain route.
pub fn ratios(columns: &[ColumnReport]) -> Vec<RatioReport> {
    let find = |n: &str| columns.iter().find(|c| c.name == n);
    [(VS3, VS1), (VS1, PLAIN), (VS3, PLAIN)]
        .into_iter()
        .filter_map(|(a, b)| Some(ratio_of(find(a.name)?, find(b.name)?)))
        .collect()
}

/// The build profile of a binary, by its path.
pub fn build_of(bin: &str) -> &'static str {
    if bin.contains("/dist/") {
        "dist"
    } else if bin.contains("/release/") {
        "release"
    } else if bin.contains("/debug/") {
        "debug"
    } else {
        "unknown"
    }
}

pub(crate) fn x(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".to_owned(), |v| format!("x{v:.2}"))
}

pub(crate) fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.digits$}"))
}

/// The Markdown report.
pub fn markdown(r: &Report) -> String {
    let m = &r.meta;
    let mut s = String::new();
    let _ = writeln!(s, "# mcp-bench: virtual servers (`tools/list`)\n");
    let _ = writeln!(
        s,
        "The `list` scenario's request (`tools/list`; the reader role sees {} of each member's {} tools) on one firewall instance, to its plain route `/mcp/bench`, to `vs1` (one member) and to `vs3` (three members, each the same canned upstream, so three times the tools), in interleaved rounds ({} × {} s measured after {} s warm-up per column; closed loop, {} connections over HTTP/1.1, no session). Figures are medians over rounds; ratios divide medians of this run.\n",
        m.visible_tools,
        m.tools,
        m.rounds,
        fmt_s(m.duration_s),
        fmt_s(m.warmup_s),
        m.concurrency
    );
    settings(&mut s, m);
    let _ = writeln!(
        s,
        "| upstreams | canned upstream (own process) for `bench`, `bench-b`, `bench-c`; slow upstream (`bench-slow`, in the harness) answering `tools/list` after {} ms |",
        m.slow_delay_ms
    );
    let _ = writeln!(
        s,
        "| virtual servers | `collisions = \"prefix\"`, separator `{VS_SEPARATOR}`, `list_timeout_ms = {}` |",
        m.list_timeout_ms
    );
    let _ = writeln!(
        s,
        "| tokens | {} distinct ES256 reader tokens (runs), {} calls per run, minted in {:.1} s |",
        m.tokens, m.calls_per_run, m.token_mint_s
    );
    let _ = writeln!(
        s,
        "\n## `tools/list` through a virtual server\n\n| column | path | members | tools per answer | rps | p50 ms | p99 ms | firewall CPU s / 10k | upstream CPU | failed | rps per round |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in &r.columns {
        let f = &c.median;
        let rounds = per_round(c);
        let _ = writeln!(
            s,
            "| {} | `{}` | {} | {} | {:.0} | {:.2} | {:.2} | {} | {} | {} | {} |",
            c.name,
            c.path,
            c.members,
            c.tools,
            f.rps,
            f.p50_ms,
            f.p99_ms,
            opt(f.cpu_s_per_10k, 2),
            f.upstream_cpu
                .map_or_else(|| "n/a".to_owned(), |u| format!("{:.0} %", u * 100.0)),
            f.failed,
            rounds
        );
    }
    ratios_and_failures(&mut s, &r.ratios, &r.columns, "list");
    let f = &r.fan_out;
    let _ = writeln!(
        s,
        "\n## Fan-out deadline\n\nOne `tools/list` to `{}` (members `bench` and `bench-slow`; `bench-slow` answers `tools/list` after {} ms, the deadline is {} ms), no session: **{}** in {:.0} ms (limit {} ms), HTTP {}.\n",
        f.path,
        f.slow_delay_ms,
        f.deadline_ms,
        if f.passed { "passed" } else { "FAILED" },
        f.elapsed_ms,
        f.limit_ms,
        f.status
    );
    for c in &f.checks {
        let _ = writeln!(s, "- {}: {}", c.what, if c.ok { "met" } else { "FAILED" });
    }
    let listed = f
        .tools_by_member
        .iter()
        .map(|(m, n)| {
            if m.is_empty() {
                format!("{n} without a member prefix")
            } else {
                format!("{n} of {m}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        s,
        "\nListed: {}; nextCursor {}.",
        if listed.is_empty() {
            "no tools".to_owned()
        } else {
            listed
        },
        if f.next_cursor { "present" } else { "absent" }
    );
    if let Some(code) = f.error_code {
        let _ = writeln!(s, "\nThe answer was a JSON-RPC error {code}.");
    }
    if let Some(u) = &f.unreadable {
        let _ = writeln!(s, "\nThe answer could not be read: `{u}`");
    }
    if let Some(n) = &f.next_page {
        let _ = writeln!(
            s,
            "\nThe cursor's page (the late member asked once more): {:.0} ms, HTTP {}, {} tools, nextCursor {}{}.",
            n.elapsed_ms,
            n.status,
            n.tools,
            if n.next_cursor { "present" } else { "absent" },
            n.error_code
                .map_or_else(String::new, |c| format!(", JSON-RPC error {c}"))
        );
    }
    if !r.notes.is_empty() {
        let _ = writeln!(s, "\n## Notes\n");
        for n in &r.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

/// The settings table's first rows: CPUs, load, pinning, the firewall.
pub(crate) fn settings(s: &mut String, m: &Meta) {
    let _ = writeln!(s, "| setting | value |\n|---|---|");
    let _ = writeln!(s, "| CPUs | {} |", m.cpus);
    let _ = writeln!(
        s,
        "| load average (1 min) before / after | {} / {} |",
        opt(m.load_before, 2),
        opt(m.load_after, 2)
    );
    let _ = writeln!(s, "| pinning | {} |", m.pinning);
    let _ = writeln!(
        s,
        "| firewall | {} ({}), log level {}, audit off |",
        m.firewall_bin, m.build, m.firewall_log_level
    );
}

/// A column's throughput in each round, `a / b / c`.
pub(crate) fn per_round(c: &ColumnReport) -> String {
    c.rounds
        .iter()
        .map(|f| format!("{:.0}", f.rps))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The ratios (CPU per `unit`) and each column's failures.
pub(crate) fn ratios_and_failures(
    s: &mut String,
    ratios: &[RatioReport],
    columns: &[ColumnReport],
    unit: &str,
) {
    let _ = writeln!(s, "\nRatios (medians of this run):\n");
    for q in ratios {
        let _ = writeln!(
            s,
            "- **{} / {}**: throughput {}, p50 {}, p99 {}, firewall CPU per {unit} {}",
            q.numerator,
            q.denominator,
            x(q.rps),
            x(q.p50),
            x(q.p99),
            x(q.cpu)
        );
    }
    for c in columns.iter().filter(|c| !c.errors.is_empty()) {
        let _ = writeln!(s, "\nFailures of {}:\n", c.name);
        for (k, n) in &c.errors {
            let _ = writeln!(s, "- {k}: {n}");
        }
    }
}

pub(crate) fn fmt_s(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

// === the slow upstream ===

/// A minimal MCP server whose `tools/list` answers after a delay: the late
/// member of `vs-slow`. Everything else is answered at once: `initialize`,
/// `ping`, empty prompt and resource lists (the firewall lists every
/// member's four lists to resolve names), 202 for notifications and
/// responses, -32601 for other methods, 405 for anything but POST. It runs
/// on a runtime of its own (one thread), so nothing the harness blocks on
/// delays it.
pub struct SlowUpstream {
    /// Where it listens (plain HTTP/1.1 and h2c).
    pub addr: SocketAddr,
    lists: Arc<AtomicU64>,
    stop: watch::Sender<bool>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl SlowUpstream {
    /// Starts it on a free port; its thread may run on CPUs `0..cpus`.
    pub fn start(delay: Duration, cpus: usize) -> std::io::Result<SlowUpstream> {
        let all: Vec<usize> = (0..cpus.max(1)).collect();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-slow-upstream")
            .on_thread_start(move || {
                procs::pin_current_thread(&all);
            })
            .enable_all()
            .build()?;
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.set_nonblocking(true)?;
        let addr = l.local_addr()?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(l)?
        };
        let (stop, rx) = watch::channel(false);
        let lists = Arc::new(AtomicU64::new(0));
        runtime.spawn(serve_slow(listener, delay, lists.clone(), rx));
        Ok(SlowUpstream {
            addr,
            lists,
            stop,
            runtime: Some(runtime),
        })
    }

    /// `tools/list` requests it was sent so far.
    pub fn lists_asked(&self) -> u64 {
        self.lists.load(Ordering::Relaxed)
    }
}

impl Drop for SlowUpstream {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(rt) = self.runtime.take() {
            // Allowed inside an async context (a plain drop is not).
            rt.shutdown_background();
        }
    }
}

async fn serve_slow(
    listener: tokio::net::TcpListener,
    delay: Duration,
    lists: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) {
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    crate::upstream::accept_until(&listener, &mut stop, "slow upstream", |stream| {
        let builder = builder.clone();
        let lists = lists.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let lists = lists.clone();
                async move { Ok::<_, Infallible>(handle_slow(req, delay, &lists).await) }
            });
            let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
        });
    })
    .await;
}

/// What the slow upstream answers to one request (`None`: 202), and
/// whether it waits first.
pub fn slow_answer(msg: &Value) -> (Option<Value>, bool) {
    let (Some(id), Some(method)) = (msg.get("id"), msg.get("method").and_then(Value::as_str))
    else {
        // A notification or a response.
        return (None, false);
    };
    let ok = |result: Value| Some(json!({"jsonrpc": "2.0", "id": id, "result": result}));
    match method {
        "initialize" => {
            let version = msg
                .pointer("/params/protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or(REVISION);
            (
                ok(json!({
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": false}},
                    "serverInfo": {"name": "mcp-bench-slow", "version": env!("CARGO_PKG_VERSION")},
                })),
                false,
            )
        }
        "ping" => (ok(json!({})), false),
        "tools/list" => {
            let tools: Vec<Value> = SLOW_TOOLS
                .iter()
                .map(|n| {
                    json!({
                        "name": n,
                        "description": "Answers slowly (mcp-bench's late member).",
                        "inputSchema": {"type": "object", "properties": {}},
                        "annotations": {"readOnlyHint": true},
                    })
                })
                .collect();
            (ok(json!({ "tools": tools })), true)
        }
        "prompts/list" => (ok(json!({"prompts": []})), false),
        "resources/list" => (ok(json!({"resources": []})), false),
        "resources/templates/list" => (ok(json!({"resourceTemplates": []})), false),
        _ => (
            Some(json!({
                "jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": "Method not found"},
            })),
            false,
        ),
    }
}

async fn handle_slow(
    req: Request<Incoming>,
    delay: Duration,
    lists: &AtomicU64,
) -> Response<Full<Bytes>> {
    let status = |code: StatusCode| {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = code;
        r
    };
    if req.method() != Method::POST {
        return status(StatusCode::METHOD_NOT_ALLOWED);
    }
    let body = match http_body_util::Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => return status(StatusCode::BAD_REQUEST),
    };
    let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
        return status(StatusCode::BAD_REQUEST);
    };
    let (answer, wait) = slow_answer(&msg);
    let Some(answer) = answer else {
        return status(StatusCode::ACCEPTED);
    };
    if wait {
        lists.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(delay).await;
    }
    let mut r = Response::new(Full::new(Bytes::from(answer.to_string())));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

// === one request ===

/// An answer to [`post`].
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The whole body.
    pub body: Bytes,
    /// From sending the request to the last byte of the body.
    pub elapsed: Duration,
}

/// One MCP POST over a fresh HTTP/1.1 connection, as the load generator
/// sends them (JSON, `MCP-Protocol-Version`, a bearer token, no session).
pub async fn post(
    addr: SocketAddr,
    path: &str,
    token: Option<&HeaderValue>,
    body: Bytes,
    timeout: Duration,
) -> Result<Answer, String> {
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("HTTP handshake with {addr}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = path.parse().map_err(|e| format!("path {path:?}: {e}"))?;
        let h = req.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&addr.to_string()) {
            h.insert(HOST, v);
        }
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        h.insert("mcp-protocol-version", HeaderValue::from_static(REVISION));
        if let Some(t) = token {
            h.insert(AUTHORIZATION, t.clone());
        }
        let started = Instant::now();
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("POST {path}: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the answer to POST {path}: {e}"))?
            .to_bytes();
        Ok(Answer {
            status,
            body,
            elapsed: started.elapsed(),
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("POST {path}: no answer within {timeout:?}"))?
}

/// A `tools/list` request body (with a cursor, for a next page).
pub fn list_body(id: u64, cursor: Option<&str>) -> Bytes {
    let params = match cursor {
        Some(c) => json!({ "cursor": c }),
        None => json!({}),
    };
    Bytes::from(
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params}).to_string(),
    )
}

// === the run ===

/// The `list` workload with the firewall's expectation for `column`: the
/// reader's visible tools of every member.
pub fn workload(catalog: &Catalog, column: &ColumnDef) -> Workload {
    let mut w = Workload::new(column.scenario, catalog);
    if column.scenario == Scenario::List {
        for t in &mut w.templates {
            t.firewall = Expect::Tools(expected_tools(catalog, column));
        }
    }
    w
}

/// Tools every answer of `column` lists.
pub fn expected_tools(catalog: &Catalog, column: &ColumnDef) -> u32 {
    u32::try_from(catalog.reads() * column.members).unwrap_or(u32::MAX)
}

struct Sample {
    at: Instant,
    firewall_cpu: Option<f64>,
    upstream_cpu: Option<f64>,
}

fn sample(firewall: u32, upstream: u32) -> Sample {
    Sample {
        at: Instant::now(),
        firewall_cpu: procs::cpu_seconds(firewall).ok(),
        upstream_cpu: procs::cpu_seconds(upstream).ok(),
    }
}

/// Everything started for the run, stopped when dropped (firewall first).
pub(crate) struct World {
    pub(crate) firewall: Firewall,
    upstream: Managed,
    slow: SlowUpstream,
    pub(crate) catalog: Catalog,
    pub(crate) tokens: Arc<Tokens>,
    /// When it started, the load before, whether `taskset` pins children,
    /// and how long minting the tokens took.
    pub(crate) started_unix: u64,
    pub(crate) load_before: Option<f64>,
    pub(crate) taskset: bool,
    pub(crate) token_mint_s: f64,
    // Last: removed once the processes are gone.
    pub(crate) dir: tempfile::TempDir,
}

impl Drop for World {
    fn drop(&mut self) {
        self.firewall.stop(Duration::from_secs(5));
        self.upstream.stop(Duration::from_secs(2));
    }
}

/// Starts everything, measures the columns in interleaved rounds, runs the
/// fan-out test, stops everything.
pub async fn run(opts: &Options) -> Result<Report, VirtualError> {
    let mut world = World::start(opts, None).await?;
    let columns = world.rounds(&COLUMNS, opts, "virtual").await?;
    let fan_out = world.fan_out(opts).await;
    eprintln!(
        "mcp-bench virtual: fan-out {SLOW_PATH}: {:.0} ms (limit {} ms): {}",
        fan_out.elapsed_ms,
        fan_out.limit_ms,
        if fan_out.passed { "passed" } else { "FAILED" }
    );
    let mut notes = vec![format!(
        "bench-slow was asked tools/list {} times in the run: by the firewall's own listings of the members (at start, every 30 s, on demand) and by the fan-out test's pages",
        world.slow.lists_asked()
    )];
    if !world.firewall.running() {
        return Err(VirtualError::Died(world.firewall.log_tail(30)));
    }
    let log = world
        .dir
        .path()
        .join(&world.firewall.spec.name)
        .join("firewall.log");
    if let Ok(text) = std::fs::read_to_string(&log) {
        for (line, n) in log_warnings(&text) {
            notes.push(format!("firewall log ({n}x): {line}"));
        }
    }
    let bin = opts.firewall_bin.display().to_string();
    let meta = Meta {
        started_unix: world.started_unix,
        cpus: opts.cpus.max(1),
        load_before: world.load_before,
        load_after: procs::load_average(),
        pinning: pinning(opts, world.taskset),
        build: build_of(&bin).to_owned(),
        firewall_bin: bin,
        firewall_log_level: opts.log_level.clone(),
        rounds: opts.rounds.max(1),
        warmup_s: opts.warmup.as_secs_f64(),
        duration_s: opts.duration.as_secs_f64(),
        concurrency: opts.concurrency,
        tokens: world.tokens.reader.len(),
        calls_per_run: opts.calls_per_run,
        tools: world.catalog.tools.len(),
        visible_tools: world.catalog.reads(),
        list_timeout_ms: firewall::VS_LIST_TIMEOUT_MS,
        slow_delay_ms: u64::try_from(opts.slow_delay.as_millis()).unwrap_or(u64::MAX),
        token_mint_s: world.token_mint_s,
    };
    drop(world);
    Ok(Report {
        meta,
        ratios: ratios(&columns),
        columns,
        fan_out,
        notes,
    })
}

pub(crate) fn pinning(opts: &Options, taskset: bool) -> String {
    match &opts.pin_loadgen {
        None => "load generator unpinned; firewall and upstreams unpinned".to_owned(),
        Some(c) if taskset => format!(
            "load generator cpu {}; firewall and upstreams on every CPU",
            c.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
        ),
        Some(_) => {
            "load generator pinned, but taskset is missing: children inherit its CPU".to_owned()
        }
    }
}

/// Starts the canned upstream (`mcp-bench upstream`) as its own process.
fn start_upstream(
    dir: &std::path::Path,
    tools: usize,
    placement: &Placement,
) -> Result<(Managed, SocketAddr), VirtualError> {
    let io = |what| move |source| VirtualError::Io { what, source };
    let addr = SocketAddr::from((
        [127, 0, 0, 1],
        procs::free_port().map_err(io("picking a port"))?,
    ));
    let exe = std::env::current_exe().map_err(io("locating mcp-bench"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("upstream")
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--tools")
        .arg(tools.to_string())
        .arg("--threads")
        .arg("2");
    let mut process = Managed::spawn("upstream", cmd, &dir.join("upstream.log"), placement)?;
    if !crate::probe::wait_listening(addr, Duration::from_secs(10), || process.running()) {
        return Err(VirtualError::Upstream(process.log_tail(20)));
    }
    Ok((process, addr))
}

impl World {
    /// Starts the canned upstream, the slow one and the firewall (with the
    /// stdio upstreams of `stdio`, the canned upstream's stdio command).
    pub(crate) async fn start(
        opts: &Options,
        stdio: Option<Vec<String>>,
    ) -> Result<World, VirtualError> {
        let started_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let load_before = procs::load_average();
        let cpus = opts.cpus.max(1);
        let io = |what| move |source| VirtualError::Io { what, source };
        let dir = tempfile::Builder::new()
            .prefix("mcp-bench-virtual-")
            .tempdir()
            .map_err(io("creating the run directory"))?;
        let catalog = Catalog::new(opts.tools, 310)?;
        let issuer = Issuer::generate()?;
        let minted = Instant::now();
        let tokens = Arc::new(issuer.tokens_with_scale(
            opts.tokens.max(1),
            0,
            crate::tokens::MAX_LIFETIME,
            cpus,
        )?);
        let token_mint_s = minted.elapsed().as_secs_f64();
        // Children get every CPU: they would inherit the pinned load
        // generator's otherwise.
        let taskset = procs::have_taskset();
        let placement = match (&opts.pin_loadgen, taskset) {
            (Some(_), true) => Placement {
                cpus: Some(format!("0-{}", cpus.saturating_sub(1))),
                wrap: Vec::new(),
            },
            _ => Placement::default(),
        };
        let upstream = start_upstream(dir.path(), opts.tools, &placement)?;
        let upstream_addr = upstream.1;
        let slow =
            SlowUpstream::start(opts.slow_delay, cpus).map_err(io("starting the slow upstream"))?;
        let spec = firewall::Spec {
            name: "firewall-virtual".to_owned(),
            tls: None,
            audit: None,
            log_level: opts.log_level.clone(),
            upstream_http2: false,
            state: None,
            screening: true,
            shadow: false,
            virtual_servers: Some(Virtuals {
                slow_upstream: slow.addr,
            }),
            stdio,
            token_exchange: None,
        };
        let fw = Firewall::start(
            &opts.firewall_bin,
            dir.path(),
            spec,
            upstream_addr,
            issuer.public_pem(),
            &placement,
        )?;
        Ok(World {
            firewall: fw,
            upstream: upstream.0,
            slow,
            catalog,
            tokens,
            started_unix,
            load_before,
            taskset,
            token_mint_s,
            dir,
        })
    }

    /// Primes every column, then measures them in interleaved rounds
    /// (`command` names the runs in the progress lines).
    pub(crate) async fn rounds(
        &mut self,
        columns_def: &[ColumnDef],
        opts: &Options,
        command: &str,
    ) -> Result<Vec<ColumnReport>, VirtualError> {
        let mut columns: Vec<ColumnReport> = columns_def
            .iter()
            .map(|c| ColumnReport {
                name: c.name.to_owned(),
                path: c.path.to_owned(),
                what: c.what.to_owned(),
                members: c.members,
                tools: if c.scenario == Scenario::List {
                    expected_tools(&self.catalog, c)
                } else {
                    0
                },
                ..ColumnReport::default()
            })
            .collect();
        for c in columns_def {
            self.prime(c, opts).await?;
        }
        let mut ticket_base = 0u64;
        let rounds = opts.rounds.max(1);
        for round in 0..rounds {
            for k in 0..columns_def.len() {
                // Round r starts with column r mod n: drift hits every column.
                let i = (round + k) % columns_def.len();
                let (figures, errors, tickets) =
                    self.measure(&columns_def[i], opts, ticket_base).await?;
                ticket_base += tickets;
                eprintln!(
                    "mcp-bench {command}: round {}/{rounds} {:<8} {:>7.0} rps  p50 {:.2} ms  p99 {:.2} ms{}",
                    round + 1,
                    columns_def[i].name,
                    figures.rps,
                    figures.p50_ms,
                    figures.p99_ms,
                    if figures.failed > 0 {
                        format!("  {} failed", figures.failed)
                    } else {
                        String::new()
                    }
                );
                let col = &mut columns[i];
                col.rounds.push(figures);
                for (k, n) in errors {
                    *col.errors.entry(k).or_default() += n;
                }
            }
        }
        for c in &mut columns {
            c.median = Figures::median(&c.rounds);
        }
        Ok(columns)
    }
}

impl World {
    fn spec(&self, column: &ColumnDef, opts: &Options) -> LoadSpec {
        LoadSpec {
            endpoint: Endpoint {
                addr: self.firewall.addr,
                proto: Proto::H1,
                tls: None,
                path: Some(Arc::from(column.path)),
            },
            workload: Arc::new(workload(&self.catalog, column)),
            tokens: self.tokens.clone(),
            firewall: true,
            concurrency: opts.concurrency.max(1),
            h2_connections: 1,
            rate: None,
            warmup: opts.warmup,
            duration: opts.duration,
            requests: None,
            timeout: opts.timeout,
            ticket_base: 0,
            calls_per_run: opts.calls_per_run.max(1),
        }
    }

    /// One `tools/list` on `column`: the firewall knows every member's
    /// tools before it is measured.
    async fn prime(&mut self, column: &ColumnDef, opts: &Options) -> Result<(), VirtualError> {
        let mut spec = self.spec(column, opts);
        spec.concurrency = 1;
        spec.warmup = Duration::ZERO;
        spec.duration = Duration::from_secs(30);
        spec.requests = Some(1);
        spec.calls_per_run = 1;
        let want = spec
            .workload
            .templates
            .first()
            .map(|t| t.firewall.to_string())
            .unwrap_or_default();
        let prime_err = |detail: String, log: String| VirtualError::Prime {
            column: column.name.to_owned(),
            path: column.path.to_owned(),
            detail,
            log,
        };
        let r = load::run(spec, |_| {})
            .await
            .map_err(|e| prime_err(e.to_string(), self.firewall.log_tail(30)))?;
        if r.ok == 0 {
            return Err(prime_err(
                format!("expected {want}, got {:?} / {:?}", r.outcomes, r.errors),
                self.firewall.log_tail(30),
            ));
        }
        Ok(())
    }

    /// One round of `column`: its figures, its failures, the requests sent.
    async fn measure(
        &mut self,
        column: &ColumnDef,
        opts: &Options,
        ticket_base: u64,
    ) -> Result<(Figures, BTreeMap<String, u64>, u64), VirtualError> {
        let mut spec = self.spec(column, opts);
        spec.ticket_base = ticket_base;
        let (fw, up) = (self.firewall.pid(), self.upstream.pid());
        let mut window: Option<Sample> = None;
        let mut last: Option<Sample> = None;
        let report = load::run(spec, |phase| match phase {
            Phase::Measure(_) if window.is_none() => window = Some(sample(fw, up)),
            Phase::Done(_) => last = Some(sample(fw, up)),
            _ => {}
        })
        .await
        .map_err(|source| VirtualError::Load {
            column: column.name.to_owned(),
            source,
        })?;
        if !self.firewall.running() {
            return Err(VirtualError::Died(self.firewall.log_tail(30)));
        }
        let mut f = Figures::from_histogram(
            &report.histogram,
            report.elapsed.as_secs_f64(),
            report.ok,
            report.failed,
        );
        if let (Some(a), Some(b)) = (window, last) {
            let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
            let answers = (report.ok + report.failed).max(1) as f64;
            if let (Some(x), Some(y)) = (a.firewall_cpu, b.firewall_cpu) {
                f.cpu_s_per_10k = Some((y - x) / answers * 10_000.0);
            }
            if let (Some(x), Some(y)) = (a.upstream_cpu, b.upstream_cpu) {
                f.upstream_cpu = Some((y - x) / secs);
            }
        }
        Ok((f, report.errors, report.tickets))
    }

    /// The fan-out test: one `tools/list` to `vs-slow`, judged; then the
    /// page its cursor names (informational).
    async fn fan_out(&self, opts: &Options) -> FanOut {
        let deadline = Duration::from_millis(firewall::VS_LIST_TIMEOUT_MS);
        let token = self.tokens.reader.last();
        let timeout = opts.slow_delay + Duration::from_secs(10);
        let case = FanOutCase {
            deadline,
            slow_delay: opts.slow_delay,
            fast: firewall::VS_SLOW
                .members
                .first()
                .copied()
                .unwrap_or("bench"),
            slow: firewall::SLOW_ROUTE,
            visible: self.catalog.reads(),
        };
        let first = post(
            self.firewall.addr,
            SLOW_PATH,
            token,
            list_body(1, None),
            timeout,
        )
        .await;
        let judge = |elapsed, status, body: &[u8]| FanOut::judge(&case, elapsed, status, body);
        let (mut out, cursor) = match first {
            Ok(a) => (
                judge(a.elapsed, a.status, &a.body),
                message(&a.body).and_then(|m| listed(&m).next_cursor),
            ),
            Err(e) => {
                let mut f = judge(timeout, 0, b"");
                f.unreadable = Some(e);
                (f, None)
            }
        };
        if let Some(c) = cursor {
            match post(
                self.firewall.addr,
                SLOW_PATH,
                token,
                list_body(2, Some(&c)),
                timeout,
            )
            .await
            {
                Ok(a) => {
                    let l = message(&a.body).map(|m| listed(&m)).unwrap_or_default();
                    out.next_page = Some(NextPage {
                        elapsed_ms: a.elapsed.as_secs_f64() * 1000.0,
                        status: a.status,
                        tools: l.names.len(),
                        next_cursor: l.next_cursor.is_some(),
                        error_code: l.error_code,
                    });
                }
                Err(e) => eprintln!("mcp-bench virtual: the cursor's page: {e}"),
            }
        }
        out
    }
}

#[cfg(test)]
#[path = "vserver_tests.rs"]
mod tests;
