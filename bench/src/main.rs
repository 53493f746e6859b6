//! The `mcp-bench` command: `run` (the harness) and `upstream` (the canned
//! upstream on its own). Parses the command line, builds the runtime (pinned
//! where asked), and writes the report files. Nothing else lives here.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use mcp_bench::catalog::Catalog;
use mcp_bench::report::{self, Report};
use mcp_bench::runner::{self, Cell, Options, TargetKind, UpstreamMode};
use mcp_bench::{passthrough, plot, procs, upstream};

/// Load harness for mcp-firewall: direct vs firewall vs nginx, interleaved.
#[derive(Parser)]
#[command(name = "mcp-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure every target in interleaved rounds and write the reports.
    Run(Box<RunArgs>),
    /// Load-test any MCP endpoint (the firewall in front of real servers,
    /// or an upstream to size): scenarios, run tokens, thresholds, reports.
    Load(Box<mcp_bench::operator::LoadArgs>),
    /// Serve the canned upstream until SIGTERM or Ctrl-C.
    Upstream(UpstreamArgs),
    /// A bare hyper pass-through (no token, policy or audit) until SIGTERM
    /// or Ctrl-C: what the HTTP stack alone costs.
    Passthrough {
        /// Plain HTTP/1.1 listener.
        #[arg(long, default_value = "127.0.0.1:8091")]
        listen: SocketAddr,
        /// The upstream, `http://host:port`.
        #[arg(long, default_value = "http://127.0.0.1:8090")]
        upstream: http::Uri,
        /// Runtime worker threads (default: one per CPU).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// The audit pipeline's capacity apart from the firewall: rows/s into
    /// the spool, from the spool into a throwaway ClickHouse, and both at
    /// once (needs `clickhouse-server`).
    AuditPipeline {
        /// Rows per phase.
        #[arg(long, default_value_t = 500_000)]
        rows: u64,
        /// Concurrent recording tasks (calls in flight).
        #[arg(long, default_value_t = 64)]
        tasks: u64,
        /// `audit.batch.max_rows` (default: the product's).
        #[arg(long)]
        batch_rows: Option<usize>,
        /// `audit.batch.max_bytes` (default: the product's).
        #[arg(long)]
        batch_bytes: Option<usize>,
    },
    /// The audit trail's proof: rows recorded through the product's
    /// auditor into a throwaway ClickHouse, chained and signed, then
    /// `audit verify` over all of them, timed (needs `clickhouse-server`).
    AuditVerify {
        /// Rows.
        #[arg(long, default_value_t = 1_000_000)]
        rows: u64,
        /// Concurrent recording tasks.
        #[arg(long, default_value_t = 64)]
        tasks: u64,
    },
    /// `tools/list` through virtual servers: the plain route, one member
    /// (`vs1`) and three (`vs3`) in interleaved rounds on one firewall, and
    /// a merged list with a member answering after 5 s (`vs-slow`): it
    /// must return within the deadline. Exits non-zero when that check fails.
    Virtual(VirtualArgs),
    /// What a stdio upstream costs: `tools/call` to the canned upstream over
    /// streamable HTTP and over stdio (started and sandboxed by the firewall,
    /// one shared process and a process per run) in interleaved rounds, and
    /// the first call of fresh runs (a process start). Reports go into
    /// `stdio-<time>/` (and `stdio.md`/`stdio.json` with --publish).
    Stdio(VirtualArgs),
    /// Instructions per request, counted by callgrind (valgrind): the
    /// firewall and the hyper pass-through in front of the canned upstream,
    /// per cell (`call`, `call-noaudit`, `list`, `list-cold`, `call-4k`)
    /// and per stage. Repeatable where timings are not: the figure a change
    /// is judged by, and the one `--check` guards.
    Instructions(InstructionsArgs),
    /// Re-render report.md and report.svg (and judge the targets of issue
    /// 20 again) from a report.json.
    Render {
        /// The report.json to read.
        json: PathBuf,
        /// Also write latest.{json,md,svg} next to the results directory.
        #[arg(long)]
        publish: bool,
    },
}

#[derive(Args, Clone)]
struct RunArgs {
    /// `full` (the table of record), `quick` (the headline cells), `smoke`
    /// (every scenario, ~2 s each, for CI).
    #[arg(long, default_value = "full")]
    profile: String,
    /// Cells instead of the profile's, comma-separated
    /// `scenario/proto/concurrency[@rate][+target...]`, e.g.
    /// `call/h1/16,list-cold/h1/16,call/h1/64@4000,streams/h1/1000+firewall-h2up,scale/h1/16`.
    /// Scenarios: call, call-sse, list (warm view cache), list-cold (view
    /// rebuilt per request), denied, gated, step-capped, batch, mix, streams
    /// (fresh firewall instances per round), scale (plain only; fresh
    /// firewall instances for the cell). A `+target` suffix adds a target
    /// to that cell only.
    #[arg(long, value_delimiter = ',')]
    cells: Vec<String>,
    /// Targets of every cell, comma-separated (default: direct, nginx,
    /// hyper, firewall, firewall-noaudit): direct, nginx, hyper (a bare
    /// hyper pass-through), firewall, firewall-noaudit, firewall-redis
    /// (audit on, budgets and rate limits in a throwaway Redis; only when
    /// asked for), firewall-h2up (audit on, HTTP/2 to the upstream; only
    /// when asked for, here or per cell as `streams/h1/1000+firewall-h2up`).
    #[arg(long, value_delimiter = ',')]
    targets: Vec<String>,
    /// Rounds per target per cell (profile default).
    #[arg(long)]
    rounds: Option<usize>,
    /// Measured seconds per round (profile default).
    #[arg(long)]
    duration: Option<f64>,
    /// Warm-up seconds per round (profile default).
    #[arg(long)]
    warmup: Option<f64>,
    /// Stop each round after this many answers instead of a duration.
    #[arg(long)]
    requests: Option<u64>,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 15.0)]
    timeout: f64,
    /// Distinct reader tokens (runs) to cycle (profile default).
    #[arg(long)]
    tokens: Option<usize>,
    /// Consecutive requests per token: the calls of one agent run (the
    /// first pays a full ES256 verification, the rest hit the cache).
    #[arg(long, default_value_t = 20)]
    calls_per_run: u64,
    /// Distinct runs (tokens of their own, minted only when a scale cell is
    /// planned) of the scale scenario (profile default).
    #[arg(long)]
    scale_runs: Option<usize>,
    /// Consecutive calls per run in the scale scenario.
    #[arg(long, default_value_t = 2)]
    scale_calls_per_run: u64,
    /// Idle client connections the scale scenario holds open to the target
    /// during each round (profile default).
    #[arg(long)]
    scale_idle: Option<usize>,
    /// Tools in the upstream's catalog.
    #[arg(long, default_value_t = 100)]
    tools: usize,
    /// Size of a tools/call result, bytes.
    #[arg(long, default_value_t = 310)]
    result_bytes: usize,
    /// How long the streams scenario holds each SSE answer, ms (profile default).
    #[arg(long)]
    hold_ms: Option<u64>,
    /// HTTP/2 connections per load.
    #[arg(long, default_value_t = 4)]
    h2_connections: usize,
    /// Load-generator threads.
    #[arg(long, default_value_t = 1)]
    loadgen_threads: usize,
    /// CPUs for the load generator (`0`, `0,1`, `none`); default `0` on
    /// machines with 2+ CPUs.
    #[arg(long)]
    pin_loadgen: Option<String>,
    /// CPUs for the proxies (taskset list); default: every CPU.
    #[arg(long)]
    pin_proxy: Option<String>,
    /// CPUs for the upstream (taskset list); default: every CPU.
    #[arg(long)]
    pin_upstream: Option<String>,
    /// Run the upstream inside the harness instead of its own process.
    #[arg(long)]
    upstream_in_process: bool,
    /// Upstream runtime threads.
    #[arg(long, default_value_t = 2)]
    upstream_threads: usize,
    /// The mcp-firewall binary (default: next to this binary).
    #[arg(long)]
    firewall_bin: Option<PathBuf>,
    /// The binary the `firewall-baseline` target runs (an earlier build,
    /// under the same config): old and new in one run.
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// nginx `worker_processes` (`auto` or a number).
    #[arg(long, default_value = "auto")]
    nginx_workers: String,
    /// Do not start ClickHouse (the audited firewall spools only).
    #[arg(long)]
    no_clickhouse: bool,
    /// The firewall's `log.level` (the product's default is info).
    #[arg(long, default_value = "info")]
    firewall_log_level: String,
    /// The firewall speaks HTTP/2 (h2c, `http2 = true`) to the canned
    /// upstream instead of HTTP/1.1 keep-alive (nginx stays on HTTP/1.1).
    #[arg(long)]
    firewall_upstream_http2: bool,
    /// Directory for the results (default: bench/results).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write latest.md, latest.svg and latest.json into the results directory.
    #[arg(long)]
    publish: bool,
    /// Seconds of the dedicated audit-pipeline load (0 skips it; profile default).
    #[arg(long)]
    audit_seconds: Option<f64>,
    /// Exit non-zero when a target answered nothing as expected in a cell.
    #[arg(long)]
    fail_on_errors: bool,
    /// One line per round instead of progress bars.
    #[arg(long)]
    plain: bool,
}

#[derive(Args)]
struct InstructionsArgs {
    /// The mcp-firewall binary (default: next to this binary).
    #[arg(long)]
    firewall_bin: Option<PathBuf>,
    /// Requests before counting (caches, pools, the verified token).
    #[arg(long, default_value_t = 500)]
    warmup: u64,
    /// Requests counted per window.
    #[arg(long, default_value_t = 2000)]
    requests: u64,
    /// Closed-loop workers.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Cells, comma-separated (default: all six).
    #[arg(long, value_delimiter = ',')]
    cells: Vec<String>,
    /// Counted windows per cell, on the same processes (shows the count
    /// repeats).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Audit into a closed port instead of a throwaway ClickHouse (rows
    /// stay in the spool; shipping is not counted).
    #[arg(long)]
    no_clickhouse: bool,
    /// Keep the callgrind dumps in this directory.
    #[arg(long)]
    keep: Option<PathBuf>,
    /// Print the report as one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Fail when the audited call's count is over this baseline (a report
    /// written by `--json`) by more than `--tolerance`.
    #[arg(long)]
    check: Option<PathBuf>,
    /// Allowed growth over the baseline, a fraction.
    #[arg(long, default_value_t = 0.10)]
    tolerance: f64,
}

#[derive(Args)]
struct VirtualArgs {
    /// The mcp-firewall binary (default: next to this binary).
    #[arg(long)]
    firewall_bin: Option<PathBuf>,
    /// Rounds per column.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Measured seconds per round.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Warm-up seconds per round.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Closed-loop workers (HTTP/1.1 connections).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Distinct reader tokens (runs) to cycle.
    #[arg(long, default_value_t = 10_000)]
    tokens: usize,
    /// The firewall's `log.level`.
    #[arg(long, default_value = "info")]
    firewall_log_level: String,
    /// Directory for the results (default: bench/results); the reports go
    /// into `virtual-<time>/` or `stdio-<time>/` under it.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write the files of record into the results directory
    /// (virtual-list.md/.json, or stdio.md/.json).
    #[arg(long)]
    publish: bool,
}

#[derive(Args)]
struct UpstreamArgs {
    /// Plain HTTP listener (HTTP/1.1 and h2c).
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// TLS listener (needs --tls-cert and --tls-key).
    #[arg(long)]
    tls_listen: Option<SocketAddr>,
    /// Certificate chain, PEM.
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// Private key, PEM.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// Tools in the catalog.
    #[arg(long, default_value_t = 100)]
    tools: usize,
    /// Size of a tools/call result, bytes.
    #[arg(long, default_value_t = 310)]
    result_bytes: usize,
    /// How long /mcp/bench-hold holds a tools/call answer, ms.
    #[arg(long, default_value_t = 1000)]
    hold_ms: u64,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Speak MCP over stdin and stdout instead of listening (what a stdio
    /// upstream of the firewall runs); the same answers as `/mcp/bench`.
    #[arg(long)]
    stdio: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(*args),
        Command::Upstream(args) => serve_upstream(args),
        Command::Passthrough {
            listen,
            upstream,
            threads,
        } => serve_passthrough(listen, upstream, threads),
        Command::AuditPipeline {
            rows,
            tasks,
            batch_rows,
            batch_bytes,
        } => audit_pipeline(mcp_bench::pipeline::Spec {
            rows,
            tasks,
            batch_rows,
            batch_bytes,
        }),
        Command::AuditVerify { rows, tasks } => audit_verify(mcp_bench::pipeline::Spec {
            rows,
            tasks,
            batch_rows: None,
            batch_bytes: None,
        }),
        Command::Render { json, publish } => render(&json, publish),
        Command::Load(args) => load(&args),
        Command::Virtual(args) => virtual_servers(&args),
        Command::Stdio(args) => stdio_upstreams(&args),
        Command::Instructions(args) => instructions(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mcp-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

struct Profile {
    cells: &'static [&'static str],
    rounds: usize,
    duration: f64,
    warmup: f64,
    tokens: usize,
    hold_ms: u64,
    audit_seconds: f64,
    scale_runs: usize,
    scale_idle: usize,
}

fn profile(name: &str) -> anyhow::Result<Profile> {
    Ok(match name {
        "full" => Profile {
            cells: &[
                "call/h1/1",
                "call/h1/16",
                "call/h1/64",
                "list/h1/16",
                "list-cold/h1/16",
                "call-sse/h1/16",
                "denied/h1/16",
                "gated/h1/16",
                "step-capped/h1/16",
                "batch/h1/16",
                "mix/h1/16",
                "call/h2c/16",
                "call/tls-h1/16",
                "call/tls-h2/16",
                "call/h1/64@4000",
                "streams/h1/1000+firewall-h2up",
                "scale/h1/16",
            ],
            rounds: 3,
            duration: 4.0,
            warmup: 1.0,
            tokens: 20_000,
            hold_ms: 1000,
            audit_seconds: 10.0,
            scale_runs: 100_000,
            scale_idle: 10_000,
        },
        "quick" => Profile {
            cells: &[
                "call/h1/1",
                "call/h1/16",
                "call/h1/64",
                "list/h1/16",
                "list-cold/h1/16",
                "streams/h1/1000",
            ],
            rounds: 2,
            duration: 3.0,
            warmup: 1.0,
            tokens: 10_000,
            hold_ms: 1000,
            audit_seconds: 5.0,
            scale_runs: 100_000,
            scale_idle: 10_000,
        },
        "smoke" => Profile {
            cells: &[
                "call/h1/8",
                "call-sse/h1/8",
                "list/h1/8",
                "list-cold/h1/8",
                "denied/h1/8",
                "gated/h1/8",
                "step-capped/h1/8",
                "batch/h1/8",
                "mix/h1/8",
                "streams/h1/64+firewall-h2up",
                "scale/h1/8",
                "call/h2c/8",
                "call/tls-h2/8",
                "call/h1/8@300",
            ],
            rounds: 1,
            duration: 2.0,
            warmup: 0.2,
            tokens: 300,
            hold_ms: 200,
            audit_seconds: 1.5,
            scale_runs: 1_000,
            scale_idle: 200,
        },
        other => anyhow::bail!("unknown profile {other:?} (full, quick, smoke)"),
    })
}

fn options(args: &RunArgs) -> anyhow::Result<Options> {
    let p = profile(&args.profile)?;
    let cell_texts: Vec<String> = if args.cells.is_empty() {
        p.cells.iter().map(|s| (*s).to_owned()).collect()
    } else {
        args.cells.clone()
    };
    let cells = cell_texts
        .iter()
        .map(|c| {
            Cell::parse(c).with_context(|| {
                format!("bad cell {c:?}: want scenario/proto/concurrency[@rate][+target...], proto h1|h2c|tls-h1|tls-h2 (scale: h1|h2c)")
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut targets = if args.targets.is_empty() {
        TargetKind::DEFAULT.to_vec()
    } else {
        args.targets
            .iter()
            .map(|t| TargetKind::parse(t).with_context(|| format!("unknown target {t:?}")))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    targets.dedup();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin_loadgen = match args.pin_loadgen.as_deref() {
        Some("none") => None,
        Some(list) => {
            Some(procs::parse_cpus(list).with_context(|| format!("bad CPU list {list:?}"))?)
        }
        None if cpus >= 2 => Some(vec![0]),
        None => None,
    };
    let firewall_bin = match &args.firewall_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("locating mcp-bench")?
            .with_file_name("mcp-firewall"),
    };
    Ok(Options {
        profile: args.profile.clone(),
        cpus,
        cells,
        targets,
        rounds: args.rounds.unwrap_or(p.rounds).max(1),
        warmup: Duration::from_secs_f64(args.warmup.unwrap_or(p.warmup).max(0.0)),
        duration: Duration::from_secs_f64(args.duration.unwrap_or(p.duration).max(0.1)),
        requests: args.requests,
        timeout: Duration::from_secs_f64(args.timeout.max(0.1)),
        tokens: args.tokens.unwrap_or(p.tokens).max(1),
        calls_per_run: args.calls_per_run.max(1),
        tools: args.tools,
        result_bytes: args.result_bytes,
        hold: Duration::from_millis(args.hold_ms.unwrap_or(p.hold_ms)),
        h2_connections: args.h2_connections.max(1),
        loadgen_threads: args.loadgen_threads.max(1),
        pin_loadgen,
        pin_proxy: args.pin_proxy.clone(),
        pin_upstream: args.pin_upstream.clone(),
        upstream_mode: if args.upstream_in_process {
            UpstreamMode::InProcess
        } else {
            UpstreamMode::Process
        },
        upstream_threads: args.upstream_threads.max(1),
        firewall_bin,
        baseline_bin: args.baseline_bin.clone(),
        nginx_workers: args.nginx_workers.clone(),
        clickhouse: !args.no_clickhouse,
        log_level: args.firewall_log_level.clone(),
        firewall_upstream_http2: args.firewall_upstream_http2,
        plain_progress: args.plain || !std::io::IsTerminal::is_terminal(&std::io::stderr()),
        audit_duration: Duration::from_secs_f64(
            args.audit_seconds.unwrap_or(p.audit_seconds).max(0.0),
        ),
        scale_runs: args.scale_runs.unwrap_or(p.scale_runs).max(1),
        scale_calls_per_run: args.scale_calls_per_run.max(1),
        scale_idle: args.scale_idle.unwrap_or(p.scale_idle),
        nofile: 0,
    })
}

fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let mut opts = options(&args)?;
    let biggest = opts.cells.iter().map(|c| c.concurrency).max().unwrap_or(1) as u64;
    let idle = if opts
        .cells
        .iter()
        .any(|c| c.scenario == mcp_bench::scenario::Scenario::Scale)
    {
        opts.scale_idle as u64
    } else {
        0
    };
    // The harness holds every client socket, the target as many again.
    let want = biggest * 2 + idle + 1024;
    let nofile = procs::raise_nofile(want);
    opts.nofile = nofile;
    if nofile < want {
        eprintln!(
            "mcp-bench: warning: open-file limit {nofile} is low for concurrency {biggest}{}: raise the hard limit (ulimit -Hn) to {want}",
            if idle > 0 {
                format!(" and {idle} idle connections (those that do not open are reported)")
            } else {
                String::new()
            }
        );
    }
    let runtime = match (opts.loadgen_threads, opts.pin_loadgen.clone()) {
        (1, pin) => {
            // The load generator is this thread.
            if let Some(cpus) = &pin {
                procs::pin_current_thread(cpus);
            }
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
        }
        (n, pin) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .thread_name("bench-loadgen")
            .on_thread_start(move || {
                if let Some(cpus) = &pin {
                    procs::pin_current_thread(cpus);
                }
            })
            .enable_all()
            .build()?,
    };
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("results"));
    eprintln!(
        "mcp-bench: {} cells x {} targets x {} rounds; load average {}",
        opts.cells.len(),
        opts.targets.len(),
        opts.rounds,
        procs::load_average().map_or_else(|| "?".to_owned(), |l| format!("{l:.2}"))
    );
    let fail_on_errors = args.fail_on_errors;
    let report = runtime.block_on(async move {
        tokio::spawn(async {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\nmcp-bench: interrupted; stopping after this round");
                runner::INTERRUPTED.store(true, Ordering::Relaxed);
            }
        });
        runner::run(opts).await
    })?;
    print!("{}", report::table(&report));
    let dir = write_reports(&report, &out_dir, args.publish)?;
    eprintln!("mcp-bench: reports in {}", dir.display());
    if fail_on_errors {
        let empty = only_errors(&report);
        if !empty.is_empty() {
            eprintln!("mcp-bench: these scenarios produced only errors:");
            for e in &empty {
                eprintln!("  {e}");
            }
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `cell / target: top error` for every target that got no expected answer.
fn only_errors(report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for c in &report.cells {
        for t in &c.targets {
            if t.median.ok == 0 {
                let top = t
                    .errors
                    .iter()
                    .max_by_key(|(_, n)| **n)
                    .map_or("no answers at all", |(k, _)| k.as_str());
                out.push(format!("{} / {}: {top}", c.title(), t.target));
            }
        }
    }
    out
}

fn write_reports(report: &Report, out: &Path, publish: bool) -> anyhow::Result<PathBuf> {
    let stamp = report.meta.started_unix;
    let dir = out.join(format!("{}-{stamp}", report.meta.profile));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(report)?;
    let md = report::markdown(report);
    let svg = plot::svg(report)?;
    for (name, text) in [
        ("report.json", &json),
        ("report.md", &md),
        ("report.svg", &svg),
    ] {
        std::fs::write(dir.join(name), text)
            .with_context(|| format!("writing {}", dir.join(name).display()))?;
    }
    if publish {
        for (name, text) in [
            ("latest.json", &json),
            ("latest.md", &md),
            ("latest.svg", &svg),
        ] {
            std::fs::write(out.join(name), text)
                .with_context(|| format!("writing {}", out.join(name).display()))?;
        }
    }
    Ok(dir)
}

/// `mcp-bench load`: prints the report; exit 2 when a threshold failed.
fn load(args: &mcp_bench::operator::LoadArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the runtime")?;
    let Some(done) = runtime.block_on(mcp_bench::operator::run(args))? else {
        return Ok(ExitCode::SUCCESS);
    };
    print!("{}", done.report.text());
    if let Some(dir) = &done.dir {
        println!("reports in {}", dir.display());
    }
    if done.report.passed() {
        Ok(ExitCode::SUCCESS)
    } else {
        for v in done.report.verdicts.iter().filter(|v| !v.ok) {
            eprintln!(
                "mcp-bench: threshold failed: {} on {} ({:.3} {})",
                v.threshold, v.target, v.actual, v.unit
            );
        }
        Ok(ExitCode::from(2))
    }
}

/// `mcp-bench virtual`: prints the Markdown report; exit 1 when the
/// fan-out test failed.
/// The harness options of `virtual` and `stdio`; pins this thread (the
/// load generator) like `run`'s.
fn harness_options(args: &VirtualArgs) -> anyhow::Result<mcp_bench::vserver::Options> {
    use mcp_bench::vserver;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin_loadgen = (cpus >= 2).then(|| vec![0]);
    let firewall_bin = match &args.firewall_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("locating mcp-bench")?
            .with_file_name("mcp-firewall"),
    };
    let opts = vserver::Options {
        firewall_bin,
        rounds: args.rounds.max(1),
        warmup: Duration::from_secs_f64(args.warmup.max(0.0)),
        duration: Duration::from_secs_f64(args.duration.max(0.1)),
        concurrency: args.concurrency.max(1),
        tokens: args.tokens.max(1),
        calls_per_run: 20,
        tools: 100,
        timeout: Duration::from_secs(15),
        slow_delay: vserver::SLOW_DELAY,
        log_level: args.firewall_log_level.clone(),
        pin_loadgen: pin_loadgen.clone(),
        cpus,
    };
    procs::raise_nofile(opts.concurrency as u64 * 2 + 1024);
    if let Some(cpus) = &pin_loadgen {
        procs::pin_current_thread(cpus);
    }
    Ok(opts)
}

/// Writes a harness report into `<out>/<prefix>-<time>/` (and as the files
/// of record `<out>/<record>.{json,md}` with --publish).
fn write_harness_report(
    args: &VirtualArgs,
    prefix: &str,
    record: &str,
    started_unix: u64,
    json: &str,
    md: &str,
) -> anyhow::Result<()> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("results"));
    let dir = out.join(format!("{prefix}-{started_unix}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut files = vec![(dir.join("report.json"), json), (dir.join("report.md"), md)];
    if args.publish {
        files.push((out.join(format!("{record}.json")), json));
        files.push((out.join(format!("{record}.md")), md));
    }
    for (path, text) in files {
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!("mcp-bench: reports in {}", dir.display());
    Ok(())
}

fn harness_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the runtime")
}

fn virtual_servers(args: &VirtualArgs) -> anyhow::Result<ExitCode> {
    use mcp_bench::vserver;
    let opts = harness_options(args)?;
    let report = harness_runtime()?.block_on(vserver::run(&opts))?;
    let md = vserver::markdown(&report);
    print!("{md}");
    let json = serde_json::to_string_pretty(&report)?;
    write_harness_report(
        args,
        "virtual",
        "virtual-list",
        report.meta.started_unix,
        &json,
        &md,
    )?;
    if report.fan_out.passed {
        Ok(ExitCode::SUCCESS)
    } else {
        for f in report.fan_out.failures() {
            eprintln!("mcp-bench: fan-out check failed: {f}");
        }
        Ok(ExitCode::FAILURE)
    }
}

fn stdio_upstreams(args: &VirtualArgs) -> anyhow::Result<ExitCode> {
    use mcp_bench::stdio;
    let opts = harness_options(args)?;
    let report = harness_runtime()?.block_on(stdio::run(&opts))?;
    let md = stdio::markdown(&report);
    print!("{md}");
    let json = serde_json::to_string_pretty(&report)?;
    write_harness_report(args, "stdio", "stdio", report.meta.started_unix, &json, &md)?;
    let failed = report.start.failed > 0 || report.columns.iter().any(|c| c.median.rps <= 0.0);
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn instructions(args: &InstructionsArgs) -> anyhow::Result<ExitCode> {
    use mcp_bench::instructions;
    let firewall_bin = match &args.firewall_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("locating mcp-bench")?
            .with_file_name("mcp-firewall"),
    };
    let cells = if args.cells.is_empty() {
        instructions::CELLS
            .iter()
            .map(|c| (*c).to_owned())
            .collect()
    } else {
        args.cells.clone()
    };
    let opts = instructions::Options {
        firewall_bin,
        warmup: args.warmup,
        requests: args.requests,
        concurrency: args.concurrency,
        cells,
        repeat: args.repeat,
        clickhouse: !args.no_clickhouse,
        keep: args.keep.clone(),
    };
    let report = harness_runtime()?.block_on(instructions::run(&opts))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", instructions::markdown(&report));
    }
    let Some(path) = &args.check else {
        return Ok(ExitCode::SUCCESS);
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let baseline: instructions::Report =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let (line, ok) = instructions::guard(&report, &baseline, "call", args.tolerance)
        .map_err(anyhow::Error::msg)?;
    eprintln!("mcp-bench instructions --check: {line}");
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn render(json: &Path, publish: bool) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
    let mut report: Report =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
    // Judged again from the figures; notes of older harness versions held
    // design-target verdicts (against nginx), which the targets replace.
    let shared = report::shared_state(&report.cells);
    report.notes.retain(|n| {
        !n.starts_with("target ")
            && !n.starts_with("  the HTTP stack's floor")
            && !n.starts_with(report::SHARED_STATE_NOTE)
    });
    report.notes.extend(shared);
    report.verdicts = report::targets(&report);
    report.step_verdicts = report::targets_for(&report, &report::STEP);
    let dir = json.parent().unwrap_or(Path::new("."));
    let md = report::markdown(&report);
    let svg = plot::svg(&report)?;
    std::fs::write(dir.join("report.md"), &md)?;
    std::fs::write(dir.join("report.svg"), &svg)?;
    if publish {
        let out = dir.parent().unwrap_or(Path::new("."));
        std::fs::write(
            out.join("latest.json"),
            serde_json::to_string_pretty(&report)?,
        )?;
        std::fs::write(out.join("latest.md"), &md)?;
        std::fs::write(out.join("latest.svg"), &svg)?;
    }
    print!("{}", report::table(&report));
    Ok(ExitCode::SUCCESS)
}

fn audit_pipeline(spec: mcp_bench::pipeline::Spec) -> anyhow::Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let f = runtime.block_on(mcp_bench::pipeline::run(&spec, dir.path()))?;
    println!(
        "audit pipeline, {} rows per phase, {} tasks, INSERTs of at most {} rows / {} KiB:\n  \
         spool only              {:>9.0} rows/s\n  \
         spool -> ClickHouse     {:>9.0} rows/s\n  \
         concurrent: recorded at {:>9.0} rows/s, all in ClickHouse at {:.0} rows/s\n  \
         every row present exactly once in ClickHouse",
        spec.rows,
        spec.tasks,
        f.batch_rows,
        f.batch_bytes / 1024,
        f.spool_rows_per_s,
        f.ship_rows_per_s,
        f.concurrent_record_rows_per_s,
        f.concurrent_end_to_end_rows_per_s
    );
    Ok(ExitCode::SUCCESS)
}

fn audit_verify(spec: mcp_bench::pipeline::Spec) -> anyhow::Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let f = runtime.block_on(mcp_bench::pipeline::verify_run(&spec, dir.path()))?;
    println!(
        "audit verify, {} rows recorded by {} tasks, chained and signed:\n  \
         recorded and shipped     {:>9.0} rows/s\n  \
         audit verify             {:>9.0} rows/s ({:.1} s, peak RSS {:.0} MB)\n  \
         verdict                  {}",
        f.rows,
        spec.tasks,
        f.ship_rows_per_s,
        f.verify_rows_per_s,
        f.verify_s,
        f.peak_rss_mb,
        if f.holds { "holds" } else { "DOES NOT HOLD" }
    );
    Ok(if f.holds {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn serve_passthrough(
    listen: SocketAddr,
    upstream: http::Uri,
    threads: Option<usize>,
) -> anyhow::Result<ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        builder.worker_threads(n.max(1));
    }
    let runtime = builder
        .thread_name("bench-passthrough")
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let (stop, rx) = tokio::sync::watch::channel(false);
        let (listener, addr) = upstream::bind(listen).await?;
        println!("listening http://{addr}");
        let task = tokio::spawn(passthrough::serve(listener, upstream, rx));
        wait_for_signal().await;
        let _ = stop.send(true);
        let _ = task.await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn serve_upstream(args: UpstreamArgs) -> anyhow::Result<ExitCode> {
    let catalog = Catalog::new(args.tools, args.result_bytes)?;
    let answers = Arc::new(upstream::Answers::new(
        &catalog,
        Duration::from_millis(args.hold_ms),
    ));
    if args.stdio {
        upstream::serve_stdio(&answers)?;
        return Ok(ExitCode::SUCCESS);
    }
    let tls = match (&args.tls_listen, &args.tls_cert, &args.tls_key) {
        (Some(addr), Some(cert), Some(key)) => Some((
            *addr,
            tokio_rustls::TlsAcceptor::from(mcp_bench::tls::server_from_files(cert, key)?),
        )),
        (None, _, _) => None,
        _ => anyhow::bail!("--tls-listen needs --tls-cert and --tls-key"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .thread_name("bench-upstream")
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let (stop, rx) = tokio::sync::watch::channel(false);
        let (plain, addr) = upstream::bind(args.listen).await?;
        println!("listening http://{addr}");
        let mut tasks = vec![tokio::spawn(upstream::serve(
            plain,
            None,
            answers.clone(),
            rx.clone(),
        ))];
        if let Some((tls_addr, acceptor)) = tls {
            let (l, a) = upstream::bind(tls_addr).await?;
            println!("listening https://{a}");
            tasks.push(tokio::spawn(upstream::serve(
                l,
                Some(acceptor),
                answers,
                rx,
            )));
        }
        wait_for_signal().await;
        let _ = stop.send(true);
        for t in tasks {
            let _ = t.await;
        }
        anyhow::Ok(())
    })?;
    // Open connections are not drained: the process exits.
    runtime.shutdown_timeout(Duration::from_millis(100));
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
