//! `mcp-bench stdio`: what a stdio upstream (`transport = "stdio"`, the
//! firewall starting and confining the server) costs on `tools/call`, and
//! how long a server process takes to start.
//!
//! One firewall instance (audit off) in front of the canned upstream twice:
//! over streamable HTTP (`/mcp/bench`, its own process) and over stdio (the
//! same answers from `mcp-bench upstream --stdio`, started by the firewall
//! in its default sandbox), once with one shared process
//! (`/mcp/bench-stdio-shared`) and once with a process per principal and
//! run (`/mcp/bench-stdio`, the default `per_session`). The `call` scenario
//! goes to the three columns in interleaved rounds, like `mcp-bench
//! virtual` ([`crate::vserver`]'s `World`). Before the rounds, the start
//! latency: the first call of fresh runs (a process starts for each), the
//! same runs' second call, and first calls over HTTP, one at a time.
//!
//! Invariants: ratios compare medians of the same run; every process
//! started here is stopped here; rendering is pure (unit-tested).

use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::procs;
use crate::scenario::Scenario;
use crate::vserver::{
    self, fmt_s, opt, post, ratio_of, ColumnDef, ColumnReport, Meta, Options, RatioReport,
    VirtualError, World,
};

/// The canned upstream over streamable HTTP.
pub const HTTP: ColumnDef = ColumnDef {
    name: "http",
    path: "/mcp/bench",
    members: 1,
    what: "the canned upstream over streamable HTTP",
    scenario: Scenario::Call,
};

/// Over stdio, one process.
pub const SHARED: ColumnDef = ColumnDef {
    name: "stdio-shared",
    path: "/mcp/bench-stdio-shared",
    members: 1,
    what: "the same answers over stdio, one sandboxed process (instances = \"shared\")",
    scenario: Scenario::Call,
};

/// Over stdio, a process per principal and run.
pub const PER_RUN: ColumnDef = ColumnDef {
    name: "stdio-per-run",
    path: "/mcp/bench-stdio",
    members: 1,
    what: "the same answers over stdio, a sandboxed process per principal and run (instances = \"per_session\")",
    scenario: Scenario::Call,
};

/// The columns, in report order.
pub const COLUMNS: [ColumnDef; 3] = [HTTP, SHARED, PER_RUN];

/// Fresh runs whose first call is timed.
pub const START_SAMPLES: usize = 20;

/// Everything the command measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// How and where it ran.
    pub meta: Meta,
    /// One entry per column, in [`COLUMNS`] order.
    pub columns: Vec<ColumnReport>,
    /// Ratios of the columns' medians.
    pub ratios: Vec<RatioReport>,
    /// Process start latency.
    pub start: StartLatency,
    /// Observations worth reading with the numbers.
    pub notes: Vec<String>,
}

/// How long the first call of a run takes when it starts a process.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct StartLatency {
    /// Runs timed.
    pub samples: usize,
    /// First call of a fresh run over stdio (a process starts), ms.
    pub first_stdio_ms: Spread,
    /// The same run's second call (its process running), ms.
    pub second_stdio_ms: Spread,
    /// First call of a fresh run over HTTP, ms.
    pub first_http_ms: Spread,
    /// Calls that did not answer 200 with a result.
    pub failed: usize,
}

/// Median, 95th percentile and maximum of some samples.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct Spread {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// Of `samples` (any order); zeros when empty.
    pub fn of(samples: &[f64]) -> Spread {
        let mut v: Vec<f64> = samples.iter().copied().filter(|s| s.is_finite()).collect();
        if v.is_empty() {
            return Spread::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Spread {
            p50: at(0.5),
            p95: at(0.95),
            max: at(1.0),
        }
    }
}

/// The ratios the report gives: each stdio column over HTTP.
pub fn ratios(columns: &[ColumnReport]) -> Vec<RatioReport> {
    let find = |n: &str| columns.iter().find(|c| c.name == n);
    [(SHARED, HTTP), (PER_RUN, HTTP)]
        .into_iter()
        .filter_map(|(a, b)| Some(ratio_of(find(a.name)?, find(b.name)?)))
        .collect()
}

/// The canned upstream's stdio command: a copy of this binary in `dir`
/// (every user may enter it: a firewall running as root runs its servers as
/// `nobody`, who may not reach the build directory).
fn stdio_command(tools: usize, dir: &std::path::Path) -> Result<Vec<String>, VirtualError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |what| move |source| VirtualError::Io { what, source };
    let exe = std::env::current_exe().map_err(io("locating mcp-bench"))?;
    let copy = dir.join("mcp-bench");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(io("opening the server directory"))?;
    std::fs::copy(&exe, &copy).map_err(io("copying mcp-bench for the stdio server"))?;
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755))
        .map_err(io("making the stdio server executable"))?;
    let exe = copy;
    Ok(vec![
        exe.display().to_string(),
        "upstream".to_owned(),
        "--stdio".to_owned(),
        "--tools".to_owned(),
        tools.to_string(),
    ])
}

/// Starts everything, times process starts, measures the columns, stops
/// everything.
pub async fn run(opts: &Options) -> Result<Report, VirtualError> {
    let bin = tempfile::Builder::new()
        .prefix("mcp-bench-stdio-")
        .tempdir()
        .map_err(|source| VirtualError::Io {
            what: "creating the server directory",
            source,
        })?;
    let mut world = World::start(opts, Some(stdio_command(opts.tools, bin.path())?)).await?;
    let start = start_latency(&world, opts).await;
    eprintln!(
        "mcp-bench stdio: first call of a run over stdio p50 {:.1} ms (second {:.1} ms; over HTTP {:.1} ms)",
        start.first_stdio_ms.p50, start.second_stdio_ms.p50, start.first_http_ms.p50
    );
    let columns = world.rounds(&COLUMNS, opts, "stdio").await?;
    let mut notes = Vec::new();
    if let Ok(m) = metrics(&world) {
        for line in m.lines().filter(|l| {
            l.starts_with("mcp_firewall_stdio_starts_total")
                || l.starts_with("mcp_firewall_stdio_exits_total")
                || l.starts_with("mcp_firewall_stdio_start_seconds_sum")
                || l.starts_with("mcp_firewall_stdio_start_seconds_count")
        }) {
            notes.push(format!("firewall metric: {line}"));
        }
    }
    if !world.firewall.running() {
        return Err(VirtualError::Died(world.firewall.log_tail(30)));
    }
    let bin = opts.firewall_bin.display().to_string();
    let meta = Meta {
        started_unix: world.started_unix,
        cpus: opts.cpus.max(1),
        load_before: world.load_before,
        load_after: procs::load_average(),
        pinning: vserver::pinning(opts, world.taskset),
        build: vserver::build_of(&bin).to_owned(),
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
        token_mint_s: world.token_mint_s,
        ..Meta::default()
    };
    drop(world);
    Ok(Report {
        meta,
        ratios: ratios(&columns),
        columns,
        start,
        notes,
    })
}

/// The firewall's `/metrics` text.
fn metrics(world: &World) -> Result<String, String> {
    let (status, text) = crate::probe::http(
        world.firewall.admin,
        "GET",
        "/metrics",
        b"",
        Duration::from_secs(5),
    )
    .map_err(|e| e.to_string())?;
    if status == 200 {
        Ok(text)
    } else {
        Err(format!("/metrics answered {status}"))
    }
}

/// The first and second call of fresh runs over stdio, and first calls
/// over HTTP, one at a time (tokens from the end of the pool: runs no
/// round has used yet).
async fn start_latency(world: &World, opts: &Options) -> StartLatency {
    let body = vserver::workload(&world.catalog, &PER_RUN)
        .templates
        .first()
        .map(|t| t.body.clone())
        .unwrap_or_default();
    let tokens = &world.tokens.reader;
    let n = START_SAMPLES.min(tokens.len() / 2);
    let mut out = StartLatency {
        samples: n,
        ..StartLatency::default()
    };
    let (mut first, mut second, mut http) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let stdio_run = tokens.get(tokens.len() - 1 - i);
        let http_run = tokens.get(tokens.len() - 1 - n - i);
        for (path, token, into) in [
            (PER_RUN.path, stdio_run, &mut first),
            (PER_RUN.path, stdio_run, &mut second),
            (HTTP.path, http_run, &mut http),
        ] {
            let a = post(world.firewall.addr, path, token, body.clone(), opts.timeout).await;
            match answered_ms(&a) {
                Some(ms) => into.push(ms),
                None => out.failed += 1,
            }
        }
    }
    out.first_stdio_ms = Spread::of(&first);
    out.second_stdio_ms = Spread::of(&second);
    out.first_http_ms = Spread::of(&http);
    out
}

/// How long a call took, when it answered 200 with a result.
fn answered_ms(a: &Result<vserver::Answer, String>) -> Option<f64> {
    let a = a.as_ref().ok()?;
    let result =
        a.status == 200 && vserver::message(&a.body).is_some_and(|m| m.get("result").is_some());
    result.then_some(a.elapsed.as_secs_f64() * 1000.0)
}

/// The report as Markdown.
pub fn markdown(r: &Report) -> String {
    let m = &r.meta;
    let mut s = String::new();
    let _ = writeln!(s, "# mcp-bench: stdio upstreams (`tools/call`)\n");
    let _ = writeln!(
        s,
        "The `call` scenario's request (`tools/call` of a read tool, a {}-tool catalog) on one firewall instance, to the canned upstream over streamable HTTP and to the same answers over stdio (`mcp-bench upstream --stdio`, started by the firewall in its default sandbox: no network, Landlock, seccomp, `nobody` when root), shared and per run, in interleaved rounds ({} × {} s measured after {} s warm-up per column; closed loop, {} connections over HTTP/1.1, no session, {} calls per run, {} runs cycled). Figures are medians over rounds; ratios divide medians of this run.\n",
        m.tools,
        m.rounds,
        fmt_s(m.duration_s),
        fmt_s(m.warmup_s),
        m.concurrency,
        m.calls_per_run,
        m.tokens
    );
    vserver::settings(&mut s, m);
    let _ = writeln!(
        s,
        "\n## `tools/call`\n\n| column | path | what | rps | p50 ms | p99 ms | firewall CPU s / 10k | failed | rps per round |\n|---|---|---|---|---|---|---|---|---|"
    );
    for c in &r.columns {
        let f = &c.median;
        let rounds = vserver::per_round(c);
        let _ = writeln!(
            s,
            "| {} | `{}` | {} | {:.0} | {:.2} | {:.2} | {} | {} | {} |",
            c.name,
            c.path,
            c.what,
            f.rps,
            f.p50_ms,
            f.p99_ms,
            opt(f.cpu_s_per_10k, 2),
            f.failed,
            rounds
        );
    }
    vserver::ratios_and_failures(&mut s, &r.ratios, &r.columns, "call");
    let st = &r.start;
    let _ = writeln!(
        s,
        "\n## Process start\n\nThe first `tools/call` of {} fresh runs over stdio (a sandboxed process starts for each: `sandbox-exec`, the layers, `exec`), the same runs' second call, and the first call of {} fresh runs over HTTP; one at a time, before the rounds.\n\n| | p50 ms | p95 ms | max ms |\n|---|---|---|---|",
        st.samples, st.samples
    );
    for (what, v) in [
        ("first call over stdio (process start)", st.first_stdio_ms),
        ("second call over stdio", st.second_stdio_ms),
        ("first call over HTTP", st.first_http_ms),
    ] {
        let _ = writeln!(s, "| {what} | {:.2} | {:.2} | {:.2} |", v.p50, v.p95, v.max);
    }
    let start_cost = st.first_stdio_ms.p50 - st.second_stdio_ms.p50;
    let _ = writeln!(
        s,
        "\nA process start adds {:.1} ms to a run's first call (p50 difference){}.",
        start_cost,
        if st.failed > 0 {
            format!("; {} calls failed", st.failed)
        } else {
            String::new()
        }
    );
    if !r.notes.is_empty() {
        let _ = writeln!(s, "\n## Notes\n");
        for n in &r.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firewall::{STDIO_ROUTE, STDIO_SHARED_ROUTE};
    use crate::report::Figures;

    fn col(def: ColumnDef, rps: f64) -> ColumnReport {
        ColumnReport {
            name: def.name.to_owned(),
            path: def.path.to_owned(),
            what: def.what.to_owned(),
            members: 1,
            median: Figures {
                rps,
                p50_ms: 1000.0 / rps,
                p99_ms: 2000.0 / rps,
                ..Figures::default()
            },
            ..ColumnReport::default()
        }
    }

    #[test]
    fn spreads_and_ratios() {
        let s = Spread::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.p50, s.max), (3.0, 5.0));
        assert_eq!(Spread::of(&[]), Spread::default());
        let cols = vec![col(HTTP, 1000.0), col(SHARED, 800.0), col(PER_RUN, 200.0)];
        let r = ratios(&cols);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].numerator, "stdio-shared");
        assert!((r[0].rps.unwrap() - 0.8).abs() < 1e-9);
        assert!((r[1].rps.unwrap() - 0.2).abs() < 1e-9);
    }

    #[test]
    fn the_report_names_every_column_and_the_start_cost() {
        let cols = vec![col(HTTP, 1000.0), col(SHARED, 800.0), col(PER_RUN, 200.0)];
        let r = Report {
            meta: Meta::default(),
            ratios: ratios(&cols),
            columns: cols,
            start: StartLatency {
                samples: 3,
                first_stdio_ms: Spread {
                    p50: 40.0,
                    p95: 50.0,
                    max: 60.0,
                },
                second_stdio_ms: Spread {
                    p50: 1.0,
                    p95: 2.0,
                    max: 3.0,
                },
                first_http_ms: Spread {
                    p50: 1.5,
                    p95: 2.0,
                    max: 2.5,
                },
                failed: 0,
            },
            notes: vec![],
        };
        let md = markdown(&r);
        for want in [
            "`/mcp/bench-stdio-shared`",
            "stdio-per-run / http",
            "x0.80",
            "adds 39.0 ms",
        ] {
            assert!(md.contains(want), "{want} in\n{md}");
        }
        assert_eq!(PER_RUN.path, format!("/mcp/{STDIO_ROUTE}"));
        assert_eq!(SHARED.path, format!("/mcp/{STDIO_SHARED_ROUTE}"));
    }
}
