//! One bench run: start the upstream, the targets, ClickHouse and Redis,
//! drive every cell in interleaved rounds, collect the figures, stop
//! everything.
//!
//! Rounds interleave targets (round *r* starts with target *r* mod *n*), so
//! drift on a shared machine hits every target alike and the ratios within a
//! run stay meaningful even when absolute numbers move.
//!
//! Firewall instances are long-lived (one per firewall target and listener,
//! shared by every cell that uses it) except where a scenario asks for fresh
//! ones ([`Instances`]): `streams` starts a fresh instance for each round,
//! `scale` one for the cell, so their memory is measured from a known start.
//! Every instance's `VmRSS` is recorded right after it is ready and primed,
//! and again at the end of the run (or when a fresh one is stopped).
//!
//! Invariants:
//! - every firewall answers a `tools/list` on every route before it is
//!   measured (its catalog must know the tools it decides on);
//! - a fresh instance is stopped only after ClickHouse acknowledged every
//!   row it spooled (bounded wait), and its counters are kept, so the run's
//!   audit summary still covers every row;
//! - CPU figures cover exactly the measured window; peak RSS is reset
//!   (`clear_refs`) before each round, so it is that round's peak; the same
//!   holds for the servers a firewall uses (ClickHouse's CPU, Redis's CPU
//!   and RSS), reported apart from the proxy's own columns;
//! - everything started here is stopped here (drop order included).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::catalog::{Catalog, CatalogError};
use crate::clickhouse::{ClickHouse, ClickHouseError};
use crate::firewall::{self, AuditCounters, AuditSink, Firewall, FirewallError};
use crate::idle::{self, Idle};
use crate::load::{self, Endpoint, LoadError, LoadSpec, Phase, Proto};
use crate::nginx::{Nginx, NginxError};
use crate::passthrough::Passthrough;
use crate::procs::{self, Managed, Placement, ProcError};
use crate::redis::{Redis, RedisError};
use crate::report::{
    self, AuditLoad, AuditSummary, CellReport, Figures, InstanceReport, Meta, Report, ScaleFigures,
    TargetReport,
};
use crate::scenario::{Instances, Scenario, Workload};
use crate::tls::{Material, TlsError};
use crate::tokens::{Issuer, TokenError, Tokens};

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The catalog parameters are invalid.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// Tokens could not be minted.
    #[error(transparent)]
    Tokens(#[from] TokenError),
    /// TLS material could not be made.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A child process failed.
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// The firewall failed to start.
    #[error(transparent)]
    Firewall(#[from] FirewallError),
    /// nginx failed to start.
    #[error(transparent)]
    Nginx(#[from] NginxError),
    /// ClickHouse failed.
    #[error(transparent)]
    ClickHouse(#[from] ClickHouseError),
    /// Redis failed to start.
    #[error(transparent)]
    Redis(#[from] RedisError),
    /// A load could not run.
    #[error("{cell} against {target}: {source}")]
    Load {
        /// The cell.
        cell: String,
        /// The target.
        target: String,
        /// The cause.
        source: LoadError,
    },
    /// The run directory could not be made.
    #[error("creating the run directory: {0}")]
    RunDir(#[source] std::io::Error),
    /// A local I/O step failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// The upstream did not start listening.
    #[error("the canned upstream did not start; log tail:\n{0}")]
    Upstream(String),
    /// A firewall did not answer the catalog-priming `tools/list` as expected.
    #[error("priming {route} on the {target} firewall: {detail}")]
    Prime {
        /// The firewall instance.
        target: String,
        /// The route.
        route: String,
        /// What went wrong.
        detail: String,
    },
    /// A process died during the run.
    #[error("{name} exited during the run; log tail:\n{log}")]
    Died {
        /// Which.
        name: String,
        /// Its log.
        log: String,
    },
    /// Interrupted (Ctrl-C).
    #[error("interrupted")]
    Interrupted,
}

/// Longest a scale round may take: its idle connections must outlive it,
/// and the firewall closes a keep-alive connection 30 s after its last
/// answer.
const SCALE_ROUND_MAX: Duration = Duration::from_secs(25);

/// Set by the Ctrl-C handler; checked between rounds.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// A target kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TargetKind {
    /// Straight to the canned upstream.
    Direct,
    /// nginx's plain proxy.
    Nginx,
    /// A bare hyper pass-through (plain HTTP only): the HTTP stack's floor.
    Hyper,
    /// The firewall with audit on.
    Firewall,
    /// The firewall with audit off.
    FirewallNoAudit,
    /// The firewall with audit on and budgets and rate limits in a
    /// throwaway Redis (`[state] backend = "redis"`); not a default target.
    FirewallRedis,
    /// The firewall with audit on, speaking HTTP/2 (h2c, `http2 = true`) to
    /// the canned upstream; not a default target (the full profile's
    /// streams cell adds it: `streams/h1/1000+firewall-h2up`).
    FirewallH2Up,
    /// The firewall with audit on and content screening off (`[screen]`
    /// every family `off`): the cost of screening is the firewall
    /// column's against this one; not a default target (`call/h1/16+firewall-unscreened`
    /// with `--result-bytes 4096`).
    FirewallUnscreened,
    /// The firewall with audit on and its hash chain off (`audit.chain =
    /// false`, no checkpoint key): the cost of chaining and signing is the
    /// firewall column's against this one; not a default target
    /// (`call/h1/16+firewall-unchained`).
    FirewallUnchained,
    /// The firewall with audit on and a shadow policy set decided beside
    /// the live one (`[policy] shadow_dir`, agreeing on every bench call):
    /// the cost of shadowing is the firewall column's against this one;
    /// not a default target (`call/h1/16+firewall-shadow`).
    FirewallShadow,
    /// The same audited firewall and config run by another binary
    /// (`--baseline-bin`, an earlier build): the change's cost is the
    /// firewall column's against this one, in the same rounds; not a
    /// default target (`call/h1/16+firewall-baseline`).
    FirewallBaseline,
}

/// One cell of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// The scenario.
    pub scenario: Scenario,
    /// HTTP version.
    pub proto: Proto,
    /// TLS to the target.
    pub tls: bool,
    /// Workers / in-flight bound.
    pub concurrency: usize,
    /// Open-loop rate.
    pub rate: Option<f64>,
    /// Targets this cell measures besides the run's (`+target` suffixes).
    pub extra: Vec<TargetKind>,
}

/// How the upstream runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamMode {
    /// Its own process (`mcp-bench upstream`); CPU from `/proc/<pid>`.
    Process,
    /// A runtime inside the harness; CPU from its threads.
    InProcess,
}

/// Everything a run needs to know.
#[derive(Debug, Clone)]
pub struct Options {
    /// Profile name (report only).
    pub profile: String,
    /// Online CPUs, counted before the load generator was pinned (a
    /// pinned thread sees only its own CPU).
    pub cpus: usize,
    /// The cells, in order.
    pub cells: Vec<Cell>,
    /// Targets to measure, in order.
    pub targets: Vec<TargetKind>,
    /// Rounds per target per cell.
    pub rounds: usize,
    /// Warm-up per round.
    pub warmup: Duration,
    /// Measured time per round.
    pub duration: Duration,
    /// Stop a round after this many answers instead.
    pub requests: Option<u64>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Reader tokens (distinct runs).
    pub tokens: usize,
    /// Consecutive requests per token (calls of one run).
    pub calls_per_run: u64,
    /// Catalog size.
    pub tools: usize,
    /// `tools/call` result size.
    pub result_bytes: usize,
    /// Hold time of the streams scenario.
    pub hold: Duration,
    /// HTTP/2 connections per load.
    pub h2_connections: usize,
    /// Load-generator threads (the caller builds the runtime).
    pub loadgen_threads: usize,
    /// CPUs the load generator is pinned to (the caller pins).
    pub pin_loadgen: Option<Vec<usize>>,
    /// CPUs for proxies (`taskset -c` list); `None` = every CPU.
    pub pin_proxy: Option<String>,
    /// CPUs for the upstream; `None` = every CPU.
    pub pin_upstream: Option<String>,
    /// How the upstream runs.
    pub upstream_mode: UpstreamMode,
    /// Upstream runtime threads.
    pub upstream_threads: usize,
    /// The firewall binary.
    pub firewall_bin: PathBuf,
    /// The binary of the `firewall-baseline` target (an earlier build).
    pub baseline_bin: Option<PathBuf>,
    /// nginx `worker_processes`.
    pub nginx_workers: String,
    /// Start ClickHouse for the audited firewall when installed.
    pub clickhouse: bool,
    /// The firewall's `log.level`.
    pub log_level: String,
    /// The firewall speaks HTTP/2 (h2c) to the canned upstream.
    pub firewall_upstream_http2: bool,
    /// Print a line per round instead of progress bars.
    pub plain_progress: bool,
    /// Length of the dedicated audit-pipeline load (zero skips it).
    pub audit_duration: Duration,
    /// Distinct runs (own tokens) of the scale scenario.
    pub scale_runs: usize,
    /// Consecutive calls per run in the scale scenario.
    pub scale_calls_per_run: u64,
    /// Idle client connections the scale scenario holds per round.
    pub scale_idle: usize,
    /// The open-file limit in force (report only; the caller raised it).
    pub nofile: u64,
}

/// An audited or unaudited, plain or TLS firewall instance, with budgets
/// in memory or in Redis, speaking HTTP/1.1 or HTTP/2 to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct FwKey {
    audit: bool,
    tls: bool,
    redis: bool,
    h2up: bool,
    unscreened: bool,
    unchained: bool,
    shadow: bool,
    baseline: bool,
}

/// A running firewall instance and what the report says of it.
struct Instance {
    fw: Firewall,
    target: TargetKind,
    /// [`report::WHOLE_RUN`], or the cell (and round) it is fresh for.
    scope: String,
    /// `VmRSS` once ready and primed, MB.
    fresh_rss_mb: Option<f64>,
    /// Requests sent to it (fresh instances; the long-lived ones count in
    /// `World::sent`).
    requests: u64,
    /// Distinct runs among them (fresh instances).
    runs: u64,
}

/// Handles to everything running.
struct World {
    dir: PathBuf,
    cpus: usize,
    taskset: bool,
    opts: Options,
    catalog: Catalog,
    tls: Material,
    issuer: Issuer,
    tokens: Arc<Tokens>,
    upstream: Upstream,
    clickhouse: Option<ClickHouse>,
    audit_db: Option<String>,
    /// The long-lived instances.
    firewalls: BTreeMap<FwKey, Instance>,
    /// The instances started fresh for the current cell or round.
    fresh: BTreeMap<FwKey, Instance>,
    /// Fresh instances started so far (their directory names).
    fresh_started: usize,
    /// Fresh instances already stopped, for the report.
    retired: Vec<InstanceReport>,
    /// Audit counters of the stopped fresh instances, summed.
    retired_audit: AuditCounters,
    nginx: Option<Nginx>,
    nginx_failed: bool,
    redis: Option<Redis>,
    redis_failed: bool,
    passthrough: Option<Passthrough>,
    client_h1: Arc<rustls::ClientConfig>,
    client_h2: Arc<rustls::ClientConfig>,
    notes: Vec<String>,
    audit_rounds: Vec<(f64, f64)>,
    mint_s: f64,
    /// Requests sent so far per target instance (kind, TLS).
    sent: BTreeMap<(TargetKind, bool), u64>,
}

/// The canned upstream, wherever it runs.
enum Upstream {
    Process {
        process: Managed,
        plain: SocketAddr,
        tls: SocketAddr,
    },
    InProcess {
        runtime: Option<tokio::runtime::Runtime>,
        stop: tokio::sync::watch::Sender<bool>,
        plain: SocketAddr,
        tls: SocketAddr,
    },
}

// === impl TargetKind ===

impl TargetKind {
    /// Every target, in report order.
    pub const ALL: [TargetKind; 11] = [
        TargetKind::Direct,
        TargetKind::Nginx,
        TargetKind::Hyper,
        TargetKind::Firewall,
        TargetKind::FirewallNoAudit,
        TargetKind::FirewallRedis,
        TargetKind::FirewallH2Up,
        TargetKind::FirewallUnscreened,
        TargetKind::FirewallUnchained,
        TargetKind::FirewallShadow,
        TargetKind::FirewallBaseline,
    ];

    /// What `--targets` defaults to: every target but `firewall-redis` and
    /// `firewall-h2up` (one more firewall column costs a sixth more run
    /// time; ask for it, for the run or for one cell).
    pub const DEFAULT: [TargetKind; 5] = [
        TargetKind::Direct,
        TargetKind::Nginx,
        TargetKind::Hyper,
        TargetKind::Firewall,
        TargetKind::FirewallNoAudit,
    ];

    /// Report name.
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Direct => "direct",
            TargetKind::Nginx => "nginx",
            TargetKind::Hyper => "hyper",
            TargetKind::Firewall => "firewall",
            TargetKind::FirewallNoAudit => "firewall-noaudit",
            TargetKind::FirewallRedis => "firewall-redis",
            TargetKind::FirewallH2Up => "firewall-h2up",
            TargetKind::FirewallUnscreened => "firewall-unscreened",
            TargetKind::FirewallUnchained => "firewall-unchained",
            TargetKind::FirewallShadow => "firewall-shadow",
            TargetKind::FirewallBaseline => "firewall-baseline",
        }
    }

    /// Parses a report name.
    pub fn parse(s: &str) -> Option<TargetKind> {
        TargetKind::ALL.into_iter().find(|t| t.name() == s)
    }

    /// A firewall instance (answers are judged by the firewall's
    /// expectations).
    pub fn is_firewall(self) -> bool {
        matches!(
            self,
            TargetKind::Firewall
                | TargetKind::FirewallNoAudit
                | TargetKind::FirewallRedis
                | TargetKind::FirewallH2Up
                | TargetKind::FirewallUnscreened
                | TargetKind::FirewallUnchained
                | TargetKind::FirewallShadow
                | TargetKind::FirewallBaseline
        )
    }

    /// A firewall with audit on.
    pub fn is_audited(self) -> bool {
        matches!(
            self,
            TargetKind::Firewall
                | TargetKind::FirewallRedis
                | TargetKind::FirewallH2Up
                | TargetKind::FirewallUnscreened
                | TargetKind::FirewallUnchained
                | TargetKind::FirewallShadow
                | TargetKind::FirewallBaseline
        )
    }

    /// Its firewall instance for plain or TLS cells, if a firewall.
    fn firewall_key(self, tls: bool) -> Option<FwKey> {
        self.is_firewall().then_some(FwKey {
            audit: self.is_audited(),
            tls,
            redis: self == TargetKind::FirewallRedis,
            h2up: self == TargetKind::FirewallH2Up,
            unscreened: self == TargetKind::FirewallUnscreened,
            unchained: self == TargetKind::FirewallUnchained,
            shadow: self == TargetKind::FirewallShadow,
            baseline: self == TargetKind::FirewallBaseline,
        })
    }
}

// === impl Cell ===

impl Cell {
    /// `h1`, `h2c`, `tls-h1` or `tls-h2`.
    pub fn proto_name(&self) -> &'static str {
        match (self.tls, self.proto) {
            (false, Proto::H1) => "h1",
            (false, Proto::H2) => "h2c",
            (true, Proto::H1) => "tls-h1",
            (true, Proto::H2) => "tls-h2",
        }
    }

    /// Parses `scenario/proto/concurrency[@rate][+target...]`, e.g.
    /// `call/h1/64@4000` or `streams/h1/1000+firewall-h2up` (a target this
    /// cell measures besides the run's). `scale` is plain only (its idle
    /// connections are plain TCP).
    pub fn parse(s: &str) -> Option<Cell> {
        let mut with_extra = s.split('+');
        let base = with_extra.next()?;
        let extra = with_extra
            .map(TargetKind::parse)
            .collect::<Option<Vec<_>>>()?;
        let mut parts = base.split('/');
        let scenario = Scenario::parse(parts.next()?).ok()?;
        let (proto, tls) = match parts.next()? {
            "h1" => (Proto::H1, false),
            "h2c" => (Proto::H2, false),
            "tls-h1" => (Proto::H1, true),
            "tls-h2" => (Proto::H2, true),
            _ => return None,
        };
        let load = parts.next()?;
        if parts.next().is_some() {
            return None;
        }
        let (c, rate) = match load.split_once('@') {
            Some((c, r)) => (c, Some(r.parse::<f64>().ok().filter(|r| *r > 0.0)?)),
            None => (load, None),
        };
        let concurrency = c.parse::<usize>().ok().filter(|c| *c > 0)?;
        if scenario == Scenario::Scale && tls {
            return None;
        }
        Some(Cell {
            scenario,
            proto,
            tls,
            concurrency,
            rate,
            extra,
        })
    }

    /// The targets this cell measures: the run's, then its own extras.
    pub fn targets(&self, run: &[TargetKind]) -> Vec<TargetKind> {
        let mut out = run.to_vec();
        for t in &self.extra {
            if !out.contains(t) {
                out.push(*t);
            }
        }
        out
    }

    fn title(&self) -> String {
        match self.rate {
            Some(r) => format!("{} {} @{}/s", self.scenario, self.proto_name(), r as u64),
            None => format!(
                "{} {} c={}",
                self.scenario,
                self.proto_name(),
                self.concurrency
            ),
        }
    }
}

/// Runs the whole plan and returns the report.
pub async fn run(opts: Options) -> Result<Report, RunError> {
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let load_before = procs::load_average();
    let mut world = World::start(opts).await?;
    let mut result = world.run_cells().await;
    let mut load = None;
    if result.is_ok() {
        match world.audit_phase().await {
            Ok(l) => load = l,
            Err(e) => result = Err(e),
        }
    }
    let audit = world.finish_audit(load);
    // After the audit backlog drained: what the long-lived instances keep.
    let instances = world.instance_reports();
    let load_after = procs::load_average();
    let meta = world.meta(started_unix, load_before, load_after);
    let mut notes = std::mem::take(&mut world.notes);
    world.stop();
    let cells = result?;
    notes.extend(report::shared_state(&cells));
    let mut report = Report {
        meta,
        cells,
        audit,
        notes,
        instances,
        verdicts: Vec::new(),
        step_verdicts: Vec::new(),
    };
    report.verdicts = report::targets(&report);
    report.step_verdicts = report::targets_for(&report, &report::STEP);
    Ok(report)
}

/// Every target any cell of `opts` measures.
fn all_targets(opts: &Options) -> Vec<TargetKind> {
    let mut out = opts.targets.clone();
    for c in &opts.cells {
        for t in c.targets(&opts.targets) {
            if !out.contains(&t) {
                out.push(t);
            }
        }
    }
    out
}

// === impl World ===

impl World {
    async fn start(opts: Options) -> Result<World, RunError> {
        let cpus = opts.cpus.max(1);
        let taskset = procs::have_taskset();
        let base = std::env::temp_dir().join(format!(
            "mcp-bench-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&base).map_err(RunError::RunDir)?;
        remove_when_gone(&base);
        let catalog = Catalog::new(opts.tools, opts.result_bytes)?;
        let tls = Material::generate(&base)?;
        let issuer = Issuer::generate()?;
        let minted = Instant::now();
        // The scale pool only when a scale cell needs it (100,000 ES256
        // signatures take half a minute).
        let scale = if opts.cells.iter().any(|c| c.scenario == Scenario::Scale) {
            opts.scale_runs.max(1)
        } else {
            0
        };
        // Long enough for the longest run; the config allows MAX_LIFETIME.
        // Signed on every CPU: this thread may be the pinned load generator.
        let tokens = Arc::new(issuer.tokens_with_scale(
            opts.tokens,
            scale,
            crate::tokens::MAX_LIFETIME,
            cpus,
        )?);
        let mint_s = minted.elapsed().as_secs_f64();
        let client_h1 = tls.client(&[b"http/1.1"])?;
        let client_h2 = tls.client(&[b"h2"])?;
        let mut world = World {
            dir: base,
            cpus,
            taskset,
            catalog,
            upstream: Upstream::start_placeholder(),
            tls,
            issuer,
            tokens,
            clickhouse: None,
            audit_db: None,
            firewalls: BTreeMap::new(),
            fresh: BTreeMap::new(),
            fresh_started: 0,
            retired: Vec::new(),
            retired_audit: AuditCounters::default(),
            nginx: None,
            nginx_failed: false,
            redis: None,
            redis_failed: false,
            passthrough: None,
            client_h1,
            client_h2,
            notes: Vec::new(),
            audit_rounds: Vec::new(),
            mint_s,
            sent: BTreeMap::new(),
            opts,
        };
        world.upstream = world.start_upstream()?;
        if all_targets(&world.opts).iter().any(|t| t.is_audited()) && world.opts.clickhouse {
            if ClickHouse::available() {
                let dir = world.dir.join("clickhouse");
                let ch = ClickHouse::start(&dir, &world.placement(None))?;
                let db = format!("bench_{:08x}", rand::random::<u32>());
                world.clickhouse = Some(ch);
                world.audit_db = Some(db);
            } else {
                world.notes.push(
                    "clickhouse-server is not installed: the audited firewall spools rows locally only (its ClickHouse URL is a closed port)"
                        .to_owned(),
                );
            }
        }
        Ok(world)
    }

    /// `taskset` placement for a child: `cpus`, or every CPU when the load
    /// generator is pinned (children would inherit its affinity).
    fn placement(&self, cpus: Option<&str>) -> Placement {
        if !self.taskset {
            return Placement::default();
        }
        match cpus {
            Some(c) => Placement {
                cpus: Some(c.to_owned()),
                wrap: Vec::new(),
            },
            None if self.opts.pin_loadgen.is_some() => Placement {
                cpus: Some(format!("0-{}", self.cpus.saturating_sub(1))),
                wrap: Vec::new(),
            },
            None => Placement::default(),
        }
    }

    fn start_upstream(&mut self) -> Result<Upstream, RunError> {
        let io = |what| move |source| RunError::Io { what, source };
        let plain = SocketAddr::from((
            [127, 0, 0, 1],
            procs::free_port().map_err(io("picking a port"))?,
        ));
        let tls = SocketAddr::from((
            [127, 0, 0, 1],
            procs::free_port().map_err(io("picking a port"))?,
        ));
        match self.opts.upstream_mode {
            UpstreamMode::Process => {
                let exe = std::env::current_exe().map_err(io("locating mcp-bench"))?;
                let mut cmd = Command::new(exe);
                cmd.arg("upstream")
                    .arg("--listen")
                    .arg(plain.to_string())
                    .arg("--tls-listen")
                    .arg(tls.to_string())
                    .arg("--tls-cert")
                    .arg(&self.tls.cert_file)
                    .arg("--tls-key")
                    .arg(&self.tls.key_file)
                    .arg("--tools")
                    .arg(self.opts.tools.to_string())
                    .arg("--result-bytes")
                    .arg(self.opts.result_bytes.to_string())
                    .arg("--hold-ms")
                    .arg(self.opts.hold.as_millis().to_string())
                    .arg("--threads")
                    .arg(self.opts.upstream_threads.to_string());
                let placement = self.placement(self.opts.pin_upstream.as_deref());
                let mut process =
                    Managed::spawn("upstream", cmd, &self.dir.join("upstream.log"), &placement)?;
                let up = crate::probe::wait_listening(plain, Duration::from_secs(10), || {
                    process.running()
                }) && crate::probe::wait_listening(tls, Duration::from_secs(5), || {
                    process.running()
                });
                if !up {
                    return Err(RunError::Upstream(process.log_tail(20)));
                }
                Ok(Upstream::Process {
                    process,
                    plain,
                    tls,
                })
            }
            UpstreamMode::InProcess => {
                let cpus = self
                    .opts
                    .pin_upstream
                    .as_deref()
                    .and_then(procs::parse_cpus)
                    .unwrap_or_else(|| (0..self.cpus).collect());
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(self.opts.upstream_threads.max(1))
                    .thread_name("bench-upstream")
                    .on_thread_start(move || {
                        procs::pin_current_thread(&cpus);
                    })
                    .enable_all()
                    .build()
                    .map_err(io("building the upstream runtime"))?;
                let answers =
                    Arc::new(crate::upstream::Answers::new(&self.catalog, self.opts.hold));
                let (stop, rx) = tokio::sync::watch::channel(false);
                let server_tls = tokio_rustls::TlsAcceptor::from(self.tls.server()?);
                // Bound with std and registered inside the upstream runtime:
                // this may run on the harness's runtime, where block_on is
                // not allowed.
                let bind = |addr: SocketAddr| -> Result<tokio::net::TcpListener, RunError> {
                    let l =
                        std::net::TcpListener::bind(addr).map_err(io("binding the upstream"))?;
                    l.set_nonblocking(true)
                        .map_err(io("binding the upstream"))?;
                    let _entered = runtime.enter();
                    tokio::net::TcpListener::from_std(l).map_err(io("binding the upstream"))
                };
                let plain_l = bind(plain)?;
                let tls_l = bind(tls)?;
                runtime.spawn(crate::upstream::serve(
                    plain_l,
                    None,
                    answers.clone(),
                    rx.clone(),
                ));
                runtime.spawn(crate::upstream::serve(tls_l, Some(server_tls), answers, rx));
                Ok(Upstream::InProcess {
                    runtime: Some(runtime),
                    stop,
                    plain,
                    tls,
                })
            }
        }
    }

    fn upstream_cpu(&self) -> Option<f64> {
        match &self.upstream {
            Upstream::Process { process, .. } => procs::cpu_seconds(process.pid()).ok(),
            Upstream::InProcess { .. } => Some(procs::thread_cpu_seconds("bench-upstream")),
        }
    }

    fn loadgen_cpu(&self) -> Option<f64> {
        let own = procs::cpu_seconds(std::process::id()).ok()?;
        Some(match &self.upstream {
            Upstream::Process { .. } => own,
            Upstream::InProcess { .. } => own - procs::thread_cpu_seconds("bench-upstream"),
        })
    }

    /// The long-lived firewall instance for `key`, started (and primed) on
    /// first use.
    async fn firewall(
        &mut self,
        key: FwKey,
        target: TargetKind,
    ) -> Result<&mut Firewall, RunError> {
        if !self.firewalls.contains_key(&key) {
            let name = instance_name(key);
            let inst = self
                .start_instance(key, target, name, report::WHOLE_RUN.to_owned())
                .await?;
            self.firewalls.insert(key, inst);
        }
        self.firewalls
            .get_mut(&key)
            .map(|i| &mut i.fw)
            .ok_or_else(|| RunError::Died {
                name: "firewall".to_owned(),
                log: String::new(),
            })
    }

    /// Starts a firewall instance for `key` named `name` (its directory),
    /// primes it, and records its fresh `VmRSS`.
    async fn start_instance(
        &mut self,
        key: FwKey,
        target: TargetKind,
        name: String,
        scope: String,
    ) -> Result<Instance, RunError> {
        let state = match (key.redis, &self.redis) {
            (false, _) => None,
            (true, Some(r)) => Some(firewall::SharedState {
                redis_url: r.url(),
                key_prefix: firewall::REDIS_KEY_PREFIX.to_owned(),
            }),
            (true, None) => {
                return Err(RunError::Died {
                    name: "redis-server".to_owned(),
                    log: "not started".to_owned(),
                })
            }
        };
        let audit = key.audit.then(|| AuditSink {
            url: match &self.clickhouse {
                Some(ch) => ch.url(),
                None => format!("http://127.0.0.1:{}", procs::free_port().unwrap_or(1)),
            },
            database: self
                .audit_db
                .clone()
                .unwrap_or_else(|| "mcp_bench_spool_only".to_owned()),
            chain: !key.unchained,
        });
        let spec = firewall::Spec {
            name: name.clone(),
            tls: key
                .tls
                .then(|| (self.tls.cert_file.clone(), self.tls.key_file.clone())),
            audit,
            log_level: self.opts.log_level.clone(),
            upstream_http2: self.opts.firewall_upstream_http2 || key.h2up,
            state,
            screening: !key.unscreened,
            shadow: key.shadow,
            virtual_servers: None,
            stdio: None,
            token_exchange: None,
        };
        let placement = self.placement(self.opts.pin_proxy.as_deref());
        let bin = match (key.baseline, &self.opts.baseline_bin) {
            (true, Some(b)) => b,
            _ => &self.opts.firewall_bin,
        };
        let fw = Firewall::start(
            bin,
            &self.dir,
            spec,
            self.upstream.plain(),
            self.issuer.public_pem(),
            &placement,
        )?;
        let endpoint = Endpoint {
            addr: fw.addr,
            proto: Proto::H1,
            tls: key.tls.then(|| self.client_h1.clone()),
            path: None,
        };
        let mut inst = Instance {
            fw,
            target,
            scope,
            fresh_rss_mb: None,
            requests: 0,
            runs: 0,
        };
        if let Err(e) = self.prime(&name, &endpoint).await {
            inst.fw.stop(Duration::from_secs(2));
            return Err(e);
        }
        inst.fresh_rss_mb = procs::rss_mb(inst.fw.pid());
        Ok(inst)
    }

    /// Starts a fresh instance of `target` for `key` (the current cell, or
    /// one round of it); false when the target is unavailable (no Redis).
    async fn start_fresh(
        &mut self,
        target: TargetKind,
        key: FwKey,
        cell: &Cell,
        round: Option<usize>,
    ) -> Result<bool, RunError> {
        if key.redis && self.redis()?.is_none() {
            return Ok(false);
        }
        self.retire(key).await;
        self.fresh_started += 1;
        let name = format!("{}-fresh{}", instance_name(key), self.fresh_started);
        let scope = match round {
            Some(r) => format!("{}, round {}", cell.title(), r + 1),
            None => cell.title(),
        };
        let inst = self.start_instance(key, target, name, scope).await?;
        self.fresh.insert(key, inst);
        Ok(true)
    }

    /// Stops the fresh instance for `key`, once ClickHouse has its rows
    /// (at most 30 s), keeping its counters and its last `VmRSS`.
    async fn retire(&mut self, key: FwKey) {
        let Some(mut inst) = self.fresh.remove(&key) else {
            return;
        };
        let mut counters = inst.fw.audit_counters();
        if key.audit && self.clickhouse.is_some() {
            let start = Instant::now();
            while counters.is_some_and(|c| c.sent < c.spooled)
                && start.elapsed() < Duration::from_secs(30)
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
                counters = inst.fw.audit_counters();
            }
        }
        if let Some(c) = counters {
            let r = &mut self.retired_audit;
            r.spooled += c.spooled;
            r.sent += c.sent;
            r.lost += c.lost;
        }
        let end = procs::rss_mb(inst.fw.pid());
        inst.fw.stop(Duration::from_secs(5));
        self.retired.push(InstanceReport {
            name: inst.fw.spec.name.clone(),
            target: inst.target.name().to_owned(),
            tls: key.tls,
            scope: inst.scope,
            fresh_rss_mb: inst.fresh_rss_mb,
            end_rss_mb: end,
            requests: inst.requests,
            runs: inst.runs,
        });
    }

    /// Every instance of the run: the stopped fresh ones, then the
    /// long-lived ones with their `VmRSS` now.
    fn instance_reports(&self) -> Vec<InstanceReport> {
        let mut out = self.retired.clone();
        for (key, inst) in &self.firewalls {
            let requests = self.sent(inst.target, key.tls);
            out.push(InstanceReport {
                name: inst.fw.spec.name.clone(),
                target: inst.target.name().to_owned(),
                tls: key.tls,
                scope: inst.scope.clone(),
                fresh_rss_mb: inst.fresh_rss_mb,
                end_rss_mb: procs::rss_mb(inst.fw.pid()),
                requests,
                runs: fresh_runs(
                    0,
                    requests,
                    self.opts.calls_per_run,
                    self.tokens.reader.len() as u64,
                ),
            });
        }
        out
    }

    /// One `tools/list` per route through a new firewall: fills its catalog.
    async fn prime(&self, target: &str, endpoint: &Endpoint) -> Result<(), RunError> {
        let workload = Arc::new(Workload::new(Scenario::List, &self.catalog));
        let want = workload.templates[0].firewall;
        for route in crate::scenario::ROUTES {
            let mut w = (*workload).clone();
            w.templates[0].route = route;
            let spec = LoadSpec {
                endpoint: endpoint.clone(),
                workload: Arc::new(w),
                tokens: self.tokens.clone(),
                firewall: true,
                concurrency: 1,
                h2_connections: 1,
                rate: None,
                warmup: Duration::ZERO,
                duration: Duration::from_secs(10),
                requests: Some(1),
                timeout: Duration::from_secs(10),
                ticket_base: 0,
                calls_per_run: 1,
            };
            let r = load::run(spec, |_| {}).await.map_err(|e| RunError::Prime {
                target: target.to_owned(),
                route: route.path().to_owned(),
                detail: e.to_string(),
            })?;
            if r.ok == 0 {
                return Err(RunError::Prime {
                    target: target.to_owned(),
                    route: route.path().to_owned(),
                    detail: format!("expected {want}, got {:?} / {:?}", r.outcomes, r.errors),
                });
            }
        }
        Ok(())
    }

    fn nginx(&mut self) -> Result<Option<&Nginx>, RunError> {
        if self.nginx.is_none() && !self.nginx_failed {
            if Nginx::binary().is_none() {
                self.nginx_failed = true;
                self.notes
                    .push("nginx is not installed: no nginx column".to_owned());
                return Ok(None);
            }
            let placement = self.placement(self.opts.pin_proxy.as_deref());
            // Room for the scale cell's idle connections in any one worker.
            let idle = if self
                .opts
                .cells
                .iter()
                .any(|c| c.scenario == Scenario::Scale)
            {
                self.opts.scale_idle
            } else {
                0
            };
            let n = Nginx::start(
                &self.dir.join("nginx"),
                self.upstream.plain(),
                &self.tls.cert_file,
                &self.tls.key_file,
                &self.opts.nginx_workers,
                8192.max(idle + 4096),
                &placement,
            )?;
            self.nginx = Some(n);
        }
        Ok(self.nginx.as_ref())
    }

    /// The throwaway Redis of `firewall-redis`, started on first use;
    /// `None` (and a note) when redis-server is not installed.
    fn redis(&mut self) -> Result<Option<&mut Redis>, RunError> {
        if self.redis.is_none() && !self.redis_failed {
            if Redis::binary().is_none() {
                self.redis_failed = true;
                self.notes.push(
                    "redis-server is not installed (MCPFW_REDIS_BIN names another binary): no firewall-redis column"
                        .to_owned(),
                );
                return Ok(None);
            }
            // Like ClickHouse: a server the firewall uses, on every CPU.
            let r = Redis::start(&self.dir.join("redis"), &self.placement(None))?;
            self.redis = Some(r);
        }
        Ok(self.redis.as_mut())
    }

    fn passthrough(&mut self) -> Result<&Passthrough, RunError> {
        let p = match self.passthrough.take() {
            Some(p) => p,
            None => Passthrough::start(
                self.upstream.plain(),
                &self.dir.join("passthrough.log"),
                &self.placement(self.opts.pin_proxy.as_deref()),
            )?,
        };
        Ok(self.passthrough.insert(p))
    }

    /// Endpoint and process ids of `target` for `cell`; `None` if the target
    /// is unavailable.
    async fn endpoint(
        &mut self,
        target: TargetKind,
        cell: &Cell,
    ) -> Result<Option<(Endpoint, Vec<u32>)>, RunError> {
        let client = match (cell.tls, cell.proto) {
            (false, _) => None,
            (true, Proto::H1) => Some(self.client_h1.clone()),
            (true, Proto::H2) => Some(self.client_h2.clone()),
        };
        let ep = |addr| Endpoint {
            addr,
            proto: cell.proto,
            tls: client.clone(),
            path: None,
        };
        Ok(match target {
            TargetKind::Direct => {
                let addr = if cell.tls {
                    self.upstream.tls()
                } else {
                    self.upstream.plain()
                };
                Some((ep(addr), Vec::new()))
            }
            TargetKind::Nginx => match self.nginx()? {
                None => None,
                Some(n) => {
                    let port = match (cell.tls, cell.proto) {
                        (true, _) => n.ports.tls,
                        (false, Proto::H1) => n.ports.h1,
                        (false, Proto::H2) => n.ports.h2c,
                    };
                    Some((ep(SocketAddr::from(([127, 0, 0, 1], port))), n.pids()))
                }
            },
            // The pass-through has no TLS listener: plain cells only.
            TargetKind::Hyper if cell.tls => None,
            TargetKind::Hyper => {
                let p = self.passthrough()?;
                Some((ep(p.addr), vec![p.pid()]))
            }
            TargetKind::Firewall
            | TargetKind::FirewallNoAudit
            | TargetKind::FirewallRedis
            | TargetKind::FirewallH2Up
            | TargetKind::FirewallUnscreened
            | TargetKind::FirewallUnchained
            | TargetKind::FirewallShadow
            | TargetKind::FirewallBaseline => {
                if target == TargetKind::FirewallBaseline && self.opts.baseline_bin.is_none() {
                    // Nothing to compare with: not measured.
                    return Ok(None);
                }
                if target == TargetKind::FirewallRedis {
                    let Some(r) = self.redis()? else {
                        return Ok(None);
                    };
                    if !r.running() {
                        return Err(RunError::Died {
                            name: "redis-server".to_owned(),
                            log: r.log_tail(30),
                        });
                    }
                }
                let Some(key) = target.firewall_key(cell.tls) else {
                    return Ok(None);
                };
                let fw = if cell.scenario.instances() == Instances::Shared {
                    self.firewall(key, target).await?
                } else {
                    // Started by the cell (run_cells) before it is measured.
                    match self.fresh.get_mut(&key) {
                        Some(i) => &mut i.fw,
                        None => return Ok(None),
                    }
                };
                if !fw.running() {
                    return Err(RunError::Died {
                        name: "mcp-firewall".to_owned(),
                        log: fw.log_tail(30),
                    });
                }
                Some((ep(fw.addr), vec![fw.pid()]))
            }
        })
    }

    fn audit_counters(&self, target: TargetKind, cell: &Cell) -> Option<AuditCounters> {
        let key = target.firewall_key(cell.tls).filter(|k| k.audit)?;
        let instances = if cell.scenario.instances() == Instances::Shared {
            &self.firewalls
        } else {
            &self.fresh
        };
        instances.get(&key).and_then(|i| i.fw.audit_counters())
    }

    async fn run_cells(&mut self) -> Result<Vec<CellReport>, RunError> {
        let mut out = Vec::with_capacity(self.opts.cells.len());
        let cells = self.opts.cells.clone();
        let rounds = self.opts.rounds.max(1);
        for (ci, cell) in cells.iter().enumerate() {
            let targets = cell.targets(&self.opts.targets);
            let instances = cell.scenario.instances();
            let workload = Arc::new(Workload::new(cell.scenario, &self.catalog));
            let bar = self.bar(ci, cells.len(), cell, (rounds * targets.len()) as u64);
            let mut per_target: BTreeMap<TargetKind, TargetAcc> = BTreeMap::new();
            // Requests per target in this cell: the tickets of a cell on
            // fresh instances start at 0 (a fresh instance met no run yet).
            let mut cell_sent: BTreeMap<TargetKind, u64> = BTreeMap::new();
            let mut rss_before: BTreeMap<TargetKind, Option<f64>> = BTreeMap::new();
            if instances == Instances::FreshPerCell {
                for &t in &targets {
                    if let Some(key) = t.firewall_key(cell.tls) {
                        if !self.start_fresh(t, key, cell, None).await? {
                            continue;
                        }
                    }
                    // A fresh firewall's RSS right after priming; another
                    // proxy's as the cell starts.
                    if let Some((_, pids)) = self.endpoint(t, cell).await? {
                        rss_before.insert(t, rss_of(&pids));
                    }
                }
            }
            for round in 0..rounds {
                for i in 0..targets.len() {
                    let target = targets[(i + round) % targets.len()];
                    let per_round = target
                        .firewall_key(cell.tls)
                        .filter(|_| instances == Instances::FreshPerRound);
                    if let Some(key) = per_round {
                        if !self.start_fresh(target, key, cell, Some(round)).await? {
                            bar.inc(1);
                            continue;
                        }
                        cell_sent.insert(target, 0);
                    }
                    let Some((endpoint, pids)) = self.endpoint(target, cell).await? else {
                        bar.inc(1);
                        continue;
                    };
                    let shared = instances == Instances::Shared;
                    let base = if shared {
                        self.sent(target, cell.tls)
                    } else {
                        cell_sent.get(&target).copied().unwrap_or(0)
                    };
                    let measured = self
                        .measure(
                            cell,
                            target,
                            endpoint,
                            &pids,
                            workload.clone(),
                            &bar,
                            round,
                            base,
                        )
                        .await?;
                    if shared {
                        self.add_sent(target, cell.tls, measured.tickets);
                    } else {
                        let sent = cell_sent.entry(target).or_default();
                        *sent += measured.tickets;
                        let (per_run, pool) = self.run_shape(cell);
                        let runs = fresh_runs(0, *sent, per_run, pool);
                        if let Some(inst) = target
                            .firewall_key(cell.tls)
                            .and_then(|k| self.fresh.get_mut(&k))
                        {
                            inst.requests = *sent;
                            inst.runs = runs;
                        }
                    }
                    if let Some(key) = per_round {
                        self.retire(key).await;
                    }
                    let acc = per_target.entry(target).or_insert_with(TargetAcc::new);
                    acc.add(measured);
                    bar.inc(1);
                }
                if INTERRUPTED.load(Ordering::Relaxed) {
                    return Err(RunError::Interrupted);
                }
            }
            let mut rss_after: BTreeMap<TargetKind, Option<f64>> = BTreeMap::new();
            if instances == Instances::FreshPerCell {
                for &t in &targets {
                    if let Some((_, pids)) = self.endpoint(t, cell).await? {
                        rss_after.insert(t, rss_of(&pids));
                    }
                    if let Some(key) = t.firewall_key(cell.tls) {
                        self.retire(key).await;
                    }
                }
            }
            bar.finish_and_clear();
            let (per_run, pool) = self.run_shape(cell);
            let mut report = CellReport {
                scenario: cell.scenario.name().to_owned(),
                proto: cell.proto_name().to_owned(),
                concurrency: cell.concurrency,
                rate: cell.rate,
                targets: targets
                    .iter()
                    .filter_map(|t| {
                        let acc = per_target.remove(t)?;
                        let scale = (cell.scenario == Scenario::Scale).then(|| ScaleFigures {
                            runs: pool,
                            runs_met: fresh_runs(
                                0,
                                cell_sent.get(t).copied().unwrap_or(0),
                                per_run,
                                pool,
                            ),
                            calls_per_run: per_run,
                            idle_wanted: acc.idle_wanted,
                            idle_opened: acc.idle_opened.unwrap_or(0),
                            idle_held: acc.idle_held.unwrap_or(0),
                            idle_lost: acc.idle_lost.clone(),
                            rss_before_mb: rss_before.get(t).copied().flatten(),
                            rss_after_mb: rss_after.get(t).copied().flatten(),
                        });
                        let mut r = acc.finish(t.name());
                        r.scale = scale;
                        Some(r)
                    })
                    .collect(),
            };
            report.compute_ratios();
            if self.opts.plain_progress {
                eprintln!("{}", cell_line(&report));
            }
            out.push(report);
        }
        Ok(out)
    }

    /// A scale round's length in answers, not seconds (bounded by
    /// [`SCALE_ROUND_MAX`]): the cell's rounds
    /// together meet every run of its pool (5 % over, for the runs the
    /// warm-ups took), however fast the target is. `None` for other cells.
    fn scale_round_requests(&self, cell: &Cell, calls_per_run: u64, pool: u64) -> Option<u64> {
        if cell.scenario != Scenario::Scale || self.tokens.scale.is_empty() {
            return None;
        }
        let rounds = self.opts.rounds.max(1) as u64;
        let calls = pool.saturating_mul(calls_per_run);
        Some((calls + calls / 20).div_ceil(rounds).max(1))
    }

    /// Calls per run and distinct runs of the token pool `cell` draws from.
    fn run_shape(&self, cell: &Cell) -> (u64, u64) {
        if cell.scenario == Scenario::Scale && !self.tokens.scale.is_empty() {
            (
                self.opts.scale_calls_per_run.max(1),
                self.tokens.scale.len() as u64,
            )
        } else {
            (
                self.opts.calls_per_run.max(1),
                self.tokens.reader.len() as u64,
            )
        }
    }

    fn bar(&self, index: usize, total: usize, cell: &Cell, len: u64) -> ProgressBar {
        if self.opts.plain_progress {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{prefix:>24} [{bar:24}] {pos}/{len} rounds {elapsed:>4} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(format!("[{}/{}] {}", index + 1, total, cell.title()));
        bar
    }

    #[allow(clippy::too_many_arguments)]
    async fn measure(
        &mut self,
        cell: &Cell,
        target: TargetKind,
        endpoint: Endpoint,
        pids: &[u32],
        workload: Arc<Workload>,
        bar: &ProgressBar,
        round: usize,
        ticket_base: u64,
    ) -> Result<Measured, RunError> {
        let redis_pid = self
            .redis
            .as_ref()
            .filter(|_| target == TargetKind::FirewallRedis)
            .map(Redis::pid);
        for &p in pids.iter().chain(redis_pid.as_ref()) {
            procs::reset_peak_rss(p);
        }
        // The scale scenario's idle connections, open before the load
        // starts (inside the round's peak RSS, outside its CPU window).
        // Idle connections speak HTTP/1.1: nginx's cleartext HTTP/2 port
        // takes prior knowledge only, so they go to its HTTP/1.1 port (the
        // other targets take both on one).
        let idle_addr = match (target, &self.nginx) {
            (TargetKind::Nginx, Some(n)) => SocketAddr::from(([127, 0, 0, 1], n.ports.h1)),
            _ => endpoint.addr,
        };
        let idle = match (cell.scenario, self.opts.scale_idle) {
            (Scenario::Scale, n) if n > 0 => Some(
                Idle::open(&idle::Spec {
                    addr: idle_addr,
                    path: crate::upstream::ROUTE_JSON,
                    body: crate::scenario::ping_body(),
                    token: self
                        .tokens
                        .reader
                        .first()
                        .cloned()
                        .unwrap_or_else(|| http::HeaderValue::from_static("Bearer none")),
                    version: http::HeaderValue::from_static(crate::scenario::REVISION),
                    count: n,
                    parallel: 128,
                    timeout: self.opts.timeout,
                })
                .await,
            ),
            _ => None,
        };
        let (calls_per_run, pool) = self.run_shape(cell);
        let scale_requests = self.scale_round_requests(cell, calls_per_run, pool);
        let fresh_rss_mb = target
            .firewall_key(cell.tls)
            .filter(|_| cell.scenario.instances() != Instances::Shared)
            .and_then(|k| self.fresh.get(&k))
            .and_then(|i| i.fresh_rss_mb);
        let spec = LoadSpec {
            endpoint,
            workload,
            tokens: self.tokens.clone(),
            firewall: target.is_firewall(),
            concurrency: cell.concurrency,
            h2_connections: self.opts.h2_connections,
            rate: cell.rate,
            warmup: self.opts.warmup,
            duration: scale_requests.map_or(self.opts.duration, |_| SCALE_ROUND_MAX),
            requests: self.opts.requests.or(scale_requests),
            timeout: self.opts.timeout,
            ticket_base,
            calls_per_run,
        };
        let base = spec.ticket_base;
        let mut window: Option<Sample> = None;
        let mut last: Option<Sample> = None;
        let sample = |w: &World| Sample {
            at: Instant::now(),
            proxy: procs::usage(pids),
            upstream: w.upstream_cpu(),
            loadgen: w.loadgen_cpu(),
            audit: w.audit_counters(target, cell),
            sink: target
                .is_audited()
                .then(|| {
                    w.clickhouse
                        .as_ref()
                        .and_then(|c| procs::cpu_seconds(c.pid()).ok())
                })
                .flatten(),
            redis: redis_pid.map(|p| procs::usage(&[p])),
            redis_commands: redis_pid
                .and(w.redis.as_ref())
                .and_then(|r| r.commands().ok()),
        };
        let name = target.name();
        let started = Instant::now();
        let mut window_start: Option<Instant> = None;
        // Readings only at the window's edges: /proc and /metrics reads are
        // cheap but not free, and the load generator pays for them.
        let report = load::run(spec, |phase| match phase {
            Phase::Warmup => bar.set_message(format!(
                "round {} · {name} · warm-up {:.1}s",
                round + 1,
                started.elapsed().as_secs_f64()
            )),
            Phase::Measure(n) => {
                let since = *window_start.get_or_insert_with(|| {
                    window = Some(sample(self));
                    Instant::now()
                });
                let rps = n as f64 / since.elapsed().as_secs_f64().max(1e-3);
                bar.set_message(format!("round {} · {name} · {rps:.0} rps", round + 1));
            }
            Phase::Done(_) => last = Some(sample(self)),
        })
        .await
        .map_err(|source| RunError::Load {
            cell: cell.title(),
            target: name.to_owned(),
            source,
        })?;
        let end = sample(self);
        let idle = idle.map(|set| {
            let held = set.check();
            let mut lost = set.errors.clone();
            for (k, v) in &held.lost {
                *lost.entry(k.clone()).or_default() += v;
            }
            let round = IdleRound {
                wanted: set.wanted,
                opened: set.opened(),
                held: held.open,
                lost,
            };
            drop(set);
            round
        });
        if idle.is_some() {
            // Let the target take the closes in before the next target's
            // round (they are not measured, but they share the CPUs).
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let mut figures = Figures::from_histogram(
            &report.histogram,
            report.elapsed.as_secs_f64(),
            report.ok,
            report.failed,
        );
        figures.fresh_rss_mb = fresh_rss_mb;
        if let (Some(a), Some(b)) = (&window, last.as_ref().or(Some(&end))) {
            let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
            let answers = (report.ok + report.failed).max(1) as f64;
            if target.is_firewall() {
                let fresh = fresh_runs(base, report.tickets, calls_per_run, pool);
                figures.first_time_token_share = Some(fresh as f64 / report.tickets.max(1) as f64);
            }
            if !pids.is_empty() {
                figures.cpu_s_per_10k = Some((b.proxy.cpu_s - a.proxy.cpu_s) / answers * 10_000.0);
                figures.peak_rss_mb = Some(end.proxy.peak_rss_kb as f64 / 1024.0);
            }
            if let (Some(x), Some(y)) = (a.upstream, b.upstream) {
                figures.upstream_cpu = Some((y - x) / secs);
            }
            if let (Some(x), Some(y)) = (a.loadgen, b.loadgen) {
                figures.loadgen_cpu = Some((y - x) / secs);
            }
            if let (Some(x), Some(y)) = (a.redis, b.redis) {
                figures.redis_cpu = Some((y.cpu_s - x.cpu_s) / secs);
                figures.redis_cpu_s_per_10k = Some((y.cpu_s - x.cpu_s) / answers * 10_000.0);
                figures.redis_peak_rss_mb = end.redis.map(|u| u.peak_rss_kb as f64 / 1024.0);
            }
            if let (Some(x), Some(y)) = (a.redis_commands, b.redis_commands) {
                figures.redis_scripts_per_answer =
                    Some(y.scripts.saturating_sub(x.scripts) as f64 / answers);
                figures.redis_commands_per_answer =
                    Some(y.all.saturating_sub(x.all) as f64 / answers);
            }
            if let (Some(x), Some(y)) = (a.audit, b.audit) {
                let spool = (y.spooled - x.spooled) / secs;
                let sent = (y.sent - x.sent) / secs;
                figures.audit_spool_rows_per_s = Some(spool);
                figures.audit_clickhouse_rows_per_s = Some(sent);
                if let (Some(x), Some(y)) = (a.sink, b.sink) {
                    figures.clickhouse_cpu = Some((y - x) / secs);
                }
                self.audit_rounds.push((spool, sent));
            }
        }
        if self.opts.plain_progress {
            let held = idle.as_ref().map_or_else(String::new, |i| {
                format!("  idle held {}/{}", i.held, i.wanted)
            });
            eprintln!(
                "  {} round {} {:<17} {:>9.0} rps  p99 {:>7.2} ms  ok {} failed {}{held}",
                cell.title(),
                round + 1,
                name,
                figures.rps,
                figures.p99_ms,
                figures.ok,
                figures.failed
            );
        }
        Ok(Measured {
            figures,
            histogram: report.histogram,
            errors: report.errors,
            outcomes: report.outcomes,
            tickets: report.tickets,
            idle,
        })
    }

    fn sent(&self, target: TargetKind, tls: bool) -> u64 {
        self.sent.get(&(target, tls)).copied().unwrap_or(0)
    }

    fn add_sent(&mut self, target: TargetKind, tls: bool, n: u64) {
        *self.sent.entry((target, tls)).or_default() += n;
    }

    /// A dedicated load on the audited plain firewall (`call`, 64 in
    /// flight): how fast rows are spooled and acknowledged by ClickHouse
    /// under load, and how long the backlog takes to drain after it.
    async fn audit_phase(&mut self) -> Result<Option<AuditLoad>, RunError> {
        if !self.opts.targets.contains(&TargetKind::Firewall) || self.opts.audit_duration.is_zero()
        {
            return Ok(None);
        }
        let cell = Cell {
            scenario: Scenario::Call,
            proto: Proto::H1,
            tls: false,
            concurrency: 64,
            rate: None,
            extra: Vec::new(),
        };
        let Some((endpoint, _)) = self.endpoint(TargetKind::Firewall, &cell).await? else {
            return Ok(None);
        };
        let key = FwKey {
            audit: true,
            tls: false,
            redis: false,
            h2up: false,
            unscreened: false,
            unchained: false,
            shadow: false,
            baseline: false,
        };
        let counters = |w: &World| {
            w.firewalls
                .get(&key)
                .and_then(|i| i.fw.audit_counters())
                .unwrap_or_default()
        };
        let spec = LoadSpec {
            endpoint,
            workload: Arc::new(Workload::new(Scenario::Call, &self.catalog)),
            tokens: self.tokens.clone(),
            firewall: true,
            concurrency: cell.concurrency,
            h2_connections: 1,
            rate: None,
            warmup: Duration::ZERO,
            duration: self.opts.audit_duration,
            requests: None,
            timeout: self.opts.timeout,
            ticket_base: self.sent(TargetKind::Firewall, false),
            calls_per_run: self.opts.calls_per_run,
        };
        let mut start: Option<(Instant, AuditCounters)> = None;
        let mut end: Option<(Instant, AuditCounters)> = None;
        let report = load::run(spec, |phase| match phase {
            Phase::Measure(_) if start.is_none() => start = Some((Instant::now(), counters(self))),
            Phase::Done(_) => end = Some((Instant::now(), counters(self))),
            _ => {}
        })
        .await
        .map_err(|source| RunError::Load {
            cell: "audit pipeline load".to_owned(),
            target: "firewall".to_owned(),
            source,
        })?;
        self.add_sent(TargetKind::Firewall, false, report.tickets);
        let (Some((t0, c0)), Some((t1, c1))) = (start, end) else {
            return Ok(None);
        };
        // Drain: until ClickHouse acknowledged every row spooled by the end.
        let mut drained = None;
        if self.clickhouse.is_some() {
            while t1.elapsed() < Duration::from_secs(60) {
                let c = counters(self);
                if c.sent >= c1.spooled {
                    drained = Some((Instant::now(), c));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let load_s = t1.duration_since(t0).as_secs_f64().max(1e-3);
        let rate = |a: f64, b: f64, s: f64| (b - a) / s;
        Ok(Some(AuditLoad {
            seconds: load_s,
            rps: (report.ok + report.failed) as f64 / report.elapsed.as_secs_f64().max(1e-3),
            spool_rows_per_s: rate(c0.spooled, c1.spooled, load_s),
            clickhouse_rows_per_s_during_load: rate(c0.sent, c1.sent, load_s),
            end_to_end_rows_per_s: drained.map(|(t2, c2)| {
                rate(
                    c0.sent,
                    c2.sent,
                    t2.duration_since(t0).as_secs_f64().max(1e-3),
                )
            }),
            drain_after_load_s: drained.map(|(t2, _)| t2.duration_since(t1).as_secs_f64()),
            failed: report.failed,
        }))
    }

    /// Waits for every audited row to reach ClickHouse and counts them there.
    fn finish_audit(&mut self, load: Option<AuditLoad>) -> Option<AuditSummary> {
        let audited: Vec<&Firewall> = self
            .firewalls
            .iter()
            .filter(|(k, _)| k.audit)
            .map(|(_, i)| &i.fw)
            .collect();
        let retired = self.retired_audit;
        let retired_audited = self
            .retired
            .iter()
            .any(|i| TargetKind::parse(&i.target).is_some_and(TargetKind::is_audited));
        if audited.is_empty() && !retired_audited {
            return None;
        }
        // The stopped fresh instances' rows count too.
        let total = |fws: &[&Firewall]| {
            fws.iter()
                .filter_map(|f| f.audit_counters())
                .fold(retired, |a, c| AuditCounters {
                    spooled: a.spooled + c.spooled,
                    sent: a.sent + c.sent,
                    lost: a.lost + c.lost,
                })
        };
        let start = Instant::now();
        let mut c = total(&audited);
        if self.clickhouse.is_some() {
            while start.elapsed() < Duration::from_secs(60) {
                c = total(&audited);
                if c.sent >= c.spooled {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let (in_ch, dups) = match (&self.clickhouse, &self.audit_db) {
            (Some(ch), Some(db)) => {
                let uniq = ch
                    .query_u64(&format!(
                        "SELECT uniqExact(event_id) FROM {db}.audit_events"
                    ))
                    .ok();
                let all = ch
                    .query_u64(&format!("SELECT count() FROM {db}.audit_events"))
                    .ok();
                (uniq, uniq.zip(all).map(|(u, a)| a.saturating_sub(u)))
            }
            _ => (None, None),
        };
        let max = |f: fn(&(f64, f64)) -> f64| self.audit_rounds.iter().map(f).reduce(f64::max);
        Some(AuditSummary {
            rows_spooled: c.spooled as u64,
            rows_sent: c.sent as u64,
            rows_lost: c.lost as u64,
            rows_in_clickhouse: in_ch,
            duplicates_in_clickhouse: dups,
            peak_spool_rows_per_s: max(|r| r.0),
            peak_clickhouse_rows_per_s: max(|r| r.1),
            sink: self.audit_sink(),
            load,
        })
    }

    fn audit_sink(&self) -> String {
        match (&self.clickhouse, &self.audit_db) {
            (Some(ch), Some(db)) => {
                format!("spool + throwaway ClickHouse ({}), database {db}", ch.url())
            }
            _ => "spool only (no ClickHouse)".to_owned(),
        }
    }

    fn meta(&self, started_unix: u64, load_before: Option<f64>, load_after: Option<f64>) -> Meta {
        let o = &self.opts;
        let pin = |what: &str, v: Option<String>| {
            format!("{what} {}", v.unwrap_or_else(|| "unpinned".to_owned()))
        };
        let pinning = if self.taskset || o.pin_loadgen.is_none() {
            [
                pin(
                    "load generator",
                    o.pin_loadgen.as_ref().map(|c| {
                        format!(
                            "cpu {}",
                            c.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
                        )
                    }),
                ),
                pin("proxies", o.pin_proxy.as_ref().map(|c| format!("cpu {c}"))),
                pin(
                    "upstream",
                    o.pin_upstream.as_ref().map(|c| format!("cpu {c}")),
                ),
            ]
            .join("; ")
        } else {
            "load generator pinned, but taskset is missing: children inherit its CPU".to_owned()
        };
        let bin = o.firewall_bin.display().to_string();
        Meta {
            started_unix,
            profile: o.profile.clone(),
            cpus: self.cpus,
            load_before,
            load_after,
            pinning,
            loadgen_threads: o.loadgen_threads,
            upstream_mode: match o.upstream_mode {
                UpstreamMode::Process => "own process".to_owned(),
                UpstreamMode::InProcess => "in the harness process".to_owned(),
            },
            upstream_threads: o.upstream_threads,
            nginx: self
                .nginx
                .as_ref()
                .map(|n| format!("{}, worker_processes {}", n.version, n.workers)),
            redis: self.redis.as_ref().map(|r| {
                format!(
                    "throwaway {} on {} (nothing persisted), key prefix `{}`; calls fail closed (-31006) while it cannot be asked",
                    r.version,
                    r.addr,
                    firewall::REDIS_KEY_PREFIX
                )
            }),
            release: bin.contains("/release/") || bin.contains("/dist/"),
            firewall_bin: bin,
            rounds: o.rounds,
            warmup_s: o.warmup.as_secs_f64(),
            duration_s: o.duration.as_secs_f64(),
            tokens: o.tokens,
            calls_per_run: o.calls_per_run,
            tools: o.tools,
            result_bytes: o.result_bytes,
            hold_ms: u64::try_from(o.hold.as_millis()).unwrap_or(u64::MAX),
            audit_sink: self.audit_sink(),
            firewall_log_level: o.log_level.clone(),
            firewall_upstream: if o.firewall_upstream_http2 {
                "HTTP/2 (h2c)".to_owned()
            } else {
                "HTTP/1.1 keep-alive".to_owned()
            },
            token_mint_s: self.mint_s,
            scale_runs: self.tokens.scale.len(),
            scale_idle: if self.tokens.scale.is_empty() {
                0
            } else {
                o.scale_idle
            },
            scale_calls_per_run: o.scale_calls_per_run,
            nofile: o.nofile,
        }
    }

    fn stop(&mut self) {
        for inst in self.firewalls.values_mut().chain(self.fresh.values_mut()) {
            inst.fw.stop(Duration::from_secs(5));
        }
        if let Some(n) = &mut self.nginx {
            n.stop(Duration::from_secs(5));
        }
        if let Some(p) = &mut self.passthrough {
            p.stop(Duration::from_secs(5));
        }
        if let Some(ch) = &mut self.clickhouse {
            ch.stop();
        }
        // After the firewalls that use it.
        if let Some(r) = &mut self.redis {
            r.stop();
        }
        match &mut self.upstream {
            Upstream::Process { process, .. } => process.stop(Duration::from_secs(2)),
            Upstream::InProcess { runtime, stop, .. } => {
                let _ = stop.send(true);
                if let Some(rt) = runtime.take() {
                    rt.shutdown_background();
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Idempotent: handles stopped in `stop` are already gone.
        if let Upstream::InProcess { runtime, .. } = &mut self.upstream {
            if let Some(rt) = runtime.take() {
                rt.shutdown_background();
            }
        }
    }
}

// === impl Upstream ===

impl Upstream {
    /// A stand-in until the real upstream is started (keeps `World`
    /// construction in one place).
    fn start_placeholder() -> Upstream {
        let (stop, _) = tokio::sync::watch::channel(false);
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Upstream::InProcess {
            runtime: None,
            stop,
            plain: any,
            tls: any,
        }
    }

    fn plain(&self) -> SocketAddr {
        match self {
            Upstream::Process { plain, .. } | Upstream::InProcess { plain, .. } => *plain,
        }
    }

    fn tls(&self) -> SocketAddr {
        match self {
            Upstream::Process { tls, .. } | Upstream::InProcess { tls, .. } => *tls,
        }
    }
}

/// A reading at one moment of a round.
struct Sample {
    at: Instant,
    proxy: procs::Usage,
    upstream: Option<f64>,
    loadgen: Option<f64>,
    audit: Option<AuditCounters>,
    /// ClickHouse's CPU seconds (audited firewalls only): it shares the
    /// machine, so its ingest cost is reported next to the firewall's.
    sink: Option<f64>,
    /// Redis's CPU and memory (`firewall-redis` only), likewise.
    redis: Option<procs::Usage>,
    /// Commands Redis has executed (`firewall-redis` only).
    redis_commands: Option<crate::redis::Commands>,
}

/// One round of one target.
struct Measured {
    figures: Figures,
    histogram: Histogram<u64>,
    errors: BTreeMap<String, u64>,
    outcomes: BTreeMap<String, u64>,
    /// Requests sent, warm-up and drain included.
    tickets: u64,
    /// The idle connections of a scale round.
    idle: Option<IdleRound>,
}

/// What became of a round's idle connections.
struct IdleRound {
    wanted: u64,
    opened: u64,
    held: u64,
    lost: BTreeMap<String, u64>,
}

/// A target's rounds in one cell.
struct TargetAcc {
    rounds: Vec<Figures>,
    histogram: Option<Histogram<u64>>,
    errors: BTreeMap<String, u64>,
    outcomes: BTreeMap<String, u64>,
    idle_wanted: u64,
    /// Fewest over rounds.
    idle_opened: Option<u64>,
    /// Fewest over rounds.
    idle_held: Option<u64>,
    idle_lost: BTreeMap<String, u64>,
}

impl TargetAcc {
    fn new() -> TargetAcc {
        TargetAcc {
            rounds: Vec::new(),
            histogram: None,
            errors: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            idle_wanted: 0,
            idle_opened: None,
            idle_held: None,
            idle_lost: BTreeMap::new(),
        }
    }

    fn add(&mut self, m: Measured) {
        if let Some(i) = m.idle {
            self.idle_wanted = self.idle_wanted.max(i.wanted);
            self.idle_opened = Some(self.idle_opened.map_or(i.opened, |o| o.min(i.opened)));
            self.idle_held = Some(self.idle_held.map_or(i.held, |h| h.min(i.held)));
            for (k, v) in i.lost {
                *self.idle_lost.entry(k).or_default() += v;
            }
        }
        self.rounds.push(m.figures);
        match &mut self.histogram {
            Some(h) => {
                let _ = h.add(&m.histogram);
            }
            None => self.histogram = Some(m.histogram),
        }
        for (k, v) in m.errors {
            *self.errors.entry(k).or_default() += v;
        }
        for (k, v) in m.outcomes {
            *self.outcomes.entry(k).or_default() += v;
        }
    }

    fn finish(self, name: &str) -> TargetReport {
        TargetReport {
            target: name.to_owned(),
            median: Figures::median(&self.rounds),
            ratio_direct: None,
            ratio_nginx: None,
            rounds: self.rounds,
            errors: self.errors,
            outcomes: self.outcomes,
            curve: self
                .histogram
                .as_ref()
                .map(report::curve)
                .unwrap_or_default(),
            scale: None,
        }
    }
}

fn cell_line(c: &CellReport) -> String {
    let parts: Vec<String> = c
        .targets
        .iter()
        .map(|t| {
            format!(
                "{} {:.0} rps (x{})",
                t.target,
                t.median.rps,
                t.ratio_direct
                    .map_or_else(|| "–".to_owned(), |r| format!("{r:.2}"))
            )
        })
        .collect();
    format!("{}: {}", c.title(), parts.join(", "))
}

/// How many runs (tokens) a target met for the first time among requests
/// `base..base + n`, with `per_run` requests per token and `pool` tokens:
/// a token is new the first time its run starts, until the pool wraps.
pub fn fresh_runs(base: u64, n: u64, per_run: u64, pool: u64) -> u64 {
    let per_run = per_run.max(1);
    // Runs start at multiples of per_run; count those in range, first pass only.
    let first = base.div_ceil(per_run);
    let end = (base + n).div_ceil(per_run).min(pool);
    end.saturating_sub(first)
}

/// `VmRSS` of a target's processes, summed, MB (`None` without processes).
fn rss_of(pids: &[u32]) -> Option<f64> {
    (!pids.is_empty()).then(|| procs::usage(pids).rss_kb as f64 / 1024.0)
}

/// The directory and log name of a firewall instance.
fn instance_name(key: FwKey) -> String {
    format!(
        "firewall{}{}{}{}{}{}{}{}",
        if key.audit { "-audit" } else { "-noaudit" },
        if key.redis { "-redis" } else { "" },
        if key.h2up { "-h2up" } else { "" },
        if key.unscreened { "-unscreened" } else { "" },
        if key.unchained { "-unchained" } else { "" },
        if key.shadow { "-shadow" } else { "" },
        if key.baseline { "-baseline" } else { "" },
        if key.tls { "-tls" } else { "" }
    )
}

/// Removes `dir` once this process is gone, even after a SIGKILL.
fn remove_when_gone(dir: &Path) {
    let _ = Command::new("sh")
        .arg("-c")
        .arg("while kill -0 \"$0\" 2>/dev/null; do sleep 2; done; rm -rf \"$1\"")
        .arg(std::process::id().to_string())
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_parse_from_their_short_form() {
        let c = Cell::parse("call/h1/64@4000").unwrap();
        assert_eq!(c.scenario, Scenario::Call);
        assert_eq!(c.proto, Proto::H1);
        assert!(!c.tls);
        assert_eq!(c.concurrency, 64);
        assert_eq!(c.rate, Some(4000.0));
        let t = Cell::parse("list/tls-h2/16").unwrap();
        assert!(t.tls && t.proto == Proto::H2 && t.rate.is_none());
        assert_eq!(t.proto_name(), "tls-h2");
        assert!(t.extra.is_empty());
        // A cell may add targets of its own.
        let s = Cell::parse("streams/h1/1000+firewall-h2up").unwrap();
        assert_eq!(s.extra, vec![TargetKind::FirewallH2Up]);
        assert_eq!(s.concurrency, 1000);
        let run = [TargetKind::Direct, TargetKind::Firewall];
        assert_eq!(
            s.targets(&run),
            vec![
                TargetKind::Direct,
                TargetKind::Firewall,
                TargetKind::FirewallH2Up
            ]
        );
        let r = Cell::parse("call/h1/64@4000+firewall+firewall-redis").unwrap();
        assert_eq!(r.rate, Some(4000.0));
        // Already a run target: measured once.
        assert_eq!(r.targets(&run).len(), 3);
        assert_eq!(
            Cell::parse("scale/h2c/16").map(|c| c.scenario),
            Some(Scenario::Scale)
        );
        for bad in [
            "call/h3/1",
            "call/h1/0",
            "nope/h1/1",
            "call/h1",
            "call/h1/1/2",
            "call/h1/4@0",
            "streams/h1/1000+envoy",
            "streams/h1/1000+",
            "scale/tls-h1/16",
        ] {
            assert_eq!(Cell::parse(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn a_direct_run_measures_the_in_process_upstream() {
        let opts = Options {
            profile: "test".into(),
            cpus: 2,
            cells: vec![
                Cell::parse("call/h1/2").unwrap(),
                Cell::parse("batch/tls-h2/2").unwrap(),
                Cell::parse("list-cold/h1/2").unwrap(),
                Cell::parse("scale/h1/2").unwrap(),
            ],
            targets: vec![TargetKind::Direct],
            rounds: 2,
            warmup: Duration::from_millis(20),
            duration: Duration::from_millis(150),
            requests: None,
            timeout: Duration::from_secs(5),
            tokens: 4,
            calls_per_run: 5,
            tools: 20,
            result_bytes: 310,
            hold: Duration::from_millis(50),
            h2_connections: 1,
            loadgen_threads: 1,
            pin_loadgen: None,
            pin_proxy: None,
            pin_upstream: None,
            upstream_mode: UpstreamMode::InProcess,
            upstream_threads: 1,
            firewall_bin: PathBuf::from("/nonexistent/mcp-firewall"),
            baseline_bin: None,
            nginx_workers: "1".into(),
            clickhouse: false,
            log_level: "warn".into(),
            firewall_upstream_http2: false,
            plain_progress: true,
            audit_duration: Duration::ZERO,
            scale_runs: 10,
            scale_calls_per_run: 2,
            scale_idle: 5,
            nofile: 1024,
        };
        let report = run(opts).await.unwrap();
        assert_eq!(report.cells.len(), 4);
        for c in &report.cells {
            let t = &c.targets[0];
            assert_eq!(t.target, "direct");
            assert_eq!(t.rounds.len(), 2);
            assert!(t.median.ok > 0 && t.median.failed == 0, "{:?}", t.errors);
            assert_eq!(t.ratio_direct, Some(1.0));
            assert!(t.median.upstream_cpu.is_some());
            assert!(!t.curve.is_empty());
        }
        assert!(report.audit.is_none());
        // The scale cell held its idle connections and drew on its own runs.
        let scale = report.cells[3].targets[0].scale.as_ref().unwrap();
        assert_eq!((scale.idle_wanted, scale.idle_held), (5, 5), "{scale:?}");
        assert_eq!((scale.runs, scale.calls_per_run), (10, 2));
        assert!(scale.runs_met > 0);
        assert_eq!(report.meta.scale_runs, 10);
        // No firewall ran: every target of issue 20 says so.
        assert!(report.instances.is_empty());
        assert!(!report.verdicts.is_empty());
        assert!(report
            .verdicts
            .iter()
            .all(|v| v.status == report::Status::NotMeasured));
    }

    #[test]
    fn fresh_runs_count_first_uses_until_the_pool_wraps() {
        // Runs of 10 calls: requests 0..25 start runs 0, 1, 2.
        assert_eq!(fresh_runs(0, 25, 10, 100), 3);
        // Continuing at 25: runs 3, 4 start at 30 and 40.
        assert_eq!(fresh_runs(25, 20, 10, 100), 2);
        // A pool of 4 runs: nothing is new past request 40.
        assert_eq!(fresh_runs(35, 100, 10, 4), 0);
        assert_eq!(fresh_runs(0, 1000, 10, 4), 4);
        assert_eq!(fresh_runs(0, 5, 1, 1000), 5);
    }

    #[test]
    fn target_names_round_trip() {
        for t in TargetKind::ALL {
            assert_eq!(TargetKind::parse(t.name()), Some(t));
        }
        assert_eq!(
            TargetKind::parse("firewall-redis"),
            Some(TargetKind::FirewallRedis)
        );
        assert_eq!(TargetKind::parse("envoy"), None);
        // firewall-redis and firewall-h2up are asked for, never a default.
        assert!(!TargetKind::DEFAULT.contains(&TargetKind::FirewallRedis));
        assert!(!TargetKind::DEFAULT.contains(&TargetKind::FirewallH2Up));
        assert!(TargetKind::DEFAULT
            .iter()
            .all(|t| TargetKind::ALL.contains(t)));
    }

    #[test]
    fn each_firewall_target_has_its_own_instance() {
        let keys: Vec<FwKey> = TargetKind::ALL
            .into_iter()
            .filter_map(|t| t.firewall_key(false))
            .collect();
        assert_eq!(keys.len(), 8);
        let mut distinct = keys.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 8);
        let baseline = TargetKind::FirewallBaseline.firewall_key(false).unwrap();
        assert!(baseline.audit && baseline.baseline && !baseline.shadow);
        assert_eq!(instance_name(baseline), "firewall-audit-baseline");
        assert!(!TargetKind::DEFAULT.contains(&TargetKind::FirewallBaseline));
        let shadow = TargetKind::FirewallShadow.firewall_key(false).unwrap();
        assert!(shadow.audit && shadow.shadow && !shadow.unchained);
        assert_eq!(instance_name(shadow), "firewall-audit-shadow");
        assert!(!TargetKind::DEFAULT.contains(&TargetKind::FirewallShadow));
        let unchained = TargetKind::FirewallUnchained.firewall_key(false).unwrap();
        assert!(unchained.audit && unchained.unchained && !unchained.unscreened);
        assert_eq!(instance_name(unchained), "firewall-audit-unchained");
        assert!(!TargetKind::DEFAULT.contains(&TargetKind::FirewallUnchained));
        let h2up = TargetKind::FirewallH2Up.firewall_key(false).unwrap();
        assert!(h2up.audit && h2up.h2up && !h2up.redis);
        assert_eq!(instance_name(h2up), "firewall-audit-h2up");
        let redis = TargetKind::FirewallRedis.firewall_key(true).unwrap();
        assert!(redis.audit && redis.redis && redis.tls);
        assert_eq!(
            TargetKind::Firewall.firewall_key(false),
            Some(FwKey {
                audit: true,
                tls: false,
                redis: false,
                h2up: false,
                unscreened: false,
                unchained: false,
                shadow: false,
                baseline: false,
            })
        );
        let unscreened = TargetKind::FirewallUnscreened.firewall_key(false).unwrap();
        assert!(unscreened.audit && unscreened.unscreened);
        assert_eq!(instance_name(unscreened), "firewall-audit-unscreened");
        assert!(!TargetKind::DEFAULT.contains(&TargetKind::FirewallUnscreened));
        assert_eq!(TargetKind::Hyper.firewall_key(false), None);
        assert!(TargetKind::FirewallRedis.is_audited());
        assert!(!TargetKind::FirewallNoAudit.is_audited());
    }
}
