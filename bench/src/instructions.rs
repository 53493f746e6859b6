//! `mcp-bench instructions`: what one request costs in CPU instructions,
//! counted by callgrind, for the firewall and for the bare hyper
//! pass-through in front of the same canned upstream.
//!
//! Throughput on two shared CPUs moves with the kernel's scheduling;
//! instruction counts do not: the same binary on the same inputs executes
//! the same instructions whatever else the machine does. So this is the
//! measure a change is judged by, and the one CI guards
//! (`bench/instructions-baseline.json`).
//!
//! How a cell is counted:
//! - the target runs under `valgrind --tool=callgrind`, every thread
//!   counted (the serving threads, the spool's syncer, the audit shipper,
//!   the chain: all of it is the firewall's work for the request);
//! - `warmup` requests first (caches, pools, the verified token, the
//!   remembered list view), then the counters are zeroed
//!   (`callgrind_control -z`), `requests` requests measured, and the
//!   counters dumped (`callgrind_control -d`); with `repeat` > 1 the
//!   measured window is repeated on the same process and every window's
//!   figure is reported, which is how the count shows it is repeatable;
//! - one run token for every request (c=1 by default), so every call is a
//!   verified-token cache hit, as an agent's run is after its first call;
//! - per stage, callgrind's inclusive cost of the functions that enter it
//!   ([`STAGES`]), divided by the requests; `relay and hyper` is what is
//!   left of the firewall's total.
//!
//! Invariants: a cell whose load saw any wrong answer fails (a count of
//! refusals is not a count of calls); the dump read is the one the dump
//! command wrote (named by the process and counted).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::catalog::Catalog;
use crate::clickhouse::ClickHouse;
use crate::firewall::{self, AuditSink, Firewall};
use crate::load::{self, Endpoint, LoadSpec, Proto};
use crate::passthrough::Passthrough;
use crate::procs::{self, Managed, Placement};
use crate::scenario::{Scenario, Workload};
use crate::tokens::{Issuer, Tokens};

/// The cells, in report order.
pub const CELLS: [&str; 6] = [
    "call",
    "call-noaudit",
    "list",
    "list-cold",
    "call-4k",
    "call-exchange",
];

/// Stages of the firewall's work: name, the functions whose inclusive cost
/// is the stage's, and the functions nested in those that another stage
/// counts (subtracted). A function matches by its demangled name, alone or
/// with `::{{closure}}` (an `async fn`'s body); the largest match of each
/// name counts. Names come from a release build's profile: a function the
/// compiler inlined has no cost of its own and counts where it was inlined.
pub const STAGES: [(&str, &[&str], &[&str]); 9] = [
    (
        "token check",
        &[
            "mcp_firewall::auth::token::extract",
            "mcp_firewall::auth::cache::TokenDigest::of",
        ],
        &[],
    ),
    (
        "strict read",
        &[
            "mcp_firewall::mcp::jsonrpc::parse",
            "mcp_firewall::proxy::request::stage::check_content_type",
        ],
        &[],
    ),
    (
        "decision and judge",
        &["mcp_firewall::proxy::request::stage::Decided::decide"],
        &[],
    ),
    (
        "labels and budget",
        &["mcp_firewall::proxy::request::admit::<impl mcp_firewall::proxy::decision::Admission>::admit"],
        &[],
    ),
    (
        "audit rows: build, encode, spool",
        &[
            "mcp_firewall::proxy::record::Recorder::new",
            "mcp_firewall::proxy::record::Recorder::row",
            "mcp_firewall::proxy::record::Recorder::complete_with",
            "mcp_firewall::audit::auditor::Auditor::record_or_fail",
        ],
        &[],
    ),
    (
        "hash chain and shipping",
        &["mcp_firewall::audit::shipper::Shipper::run"],
        &[],
    ),
    (
        "screening",
        &["mcp_firewall::proxy::outbound::gate::screen"],
        &[],
    ),
    (
        "answer: read, decide, relay",
        &["mcp_firewall::proxy::outbound::exchange::Exchange::respond"],
        &[
            "mcp_firewall::proxy::outbound::gate::screen",
            "mcp_firewall::audit::auditor::Auditor::record_or_fail",
        ],
    ),
    (
        "upstream client",
        &["mcp_firewall::upstream::client::UpstreamClient::send"],
        &[],
    ),
];

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// The mcp-firewall binary.
    pub firewall_bin: PathBuf,
    /// Requests before counting.
    pub warmup: u64,
    /// Requests counted per window.
    pub requests: u64,
    /// Closed-loop workers.
    pub concurrency: usize,
    /// Cells to measure (names of [`CELLS`]).
    pub cells: Vec<String>,
    /// Measured windows per cell (same process).
    pub repeat: usize,
    /// Audit into a throwaway ClickHouse (else into a closed port: rows
    /// stay in the spool and shipping is not counted).
    pub clickhouse: bool,
    /// Keep the callgrind dumps here (`callgrind_annotate` them).
    pub keep: Option<PathBuf>,
}

/// One cell's figures.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Cell {
    /// [`CELLS`] name.
    pub name: String,
    /// Instructions per request in the firewall (all threads).
    pub firewall_per_request: f64,
    /// Instructions per request in the hyper pass-through.
    pub passthrough_per_request: f64,
    /// `firewall_per_request - passthrough_per_request`.
    pub own_per_request: f64,
    /// Stage name → instructions per request.
    pub stages: BTreeMap<String, f64>,
    /// The firewall's figure of every measured window.
    pub windows: Vec<f64>,
    /// Audit rows shipped to ClickHouse per request, counted by their
    /// chain entries (0 without ClickHouse or audit).
    #[serde(default)]
    pub rows_per_request: f64,
    /// The firewall's own work per audit row: its [`AUDIT_STAGES`]
    /// (build, encode, spool; chain, ship) over `rows_per_request`.
    /// ClickHouse's work is in another process and not counted.
    #[serde(default)]
    pub audit_per_row: f64,
}

/// The stages that are the firewall's own work per audit row.
pub const AUDIT_STAGES: [&str; 2] = [
    "audit rows: build, encode, spool",
    "hash chain and shipping",
];

/// A run's report (`--json` prints it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// The binary measured.
    pub firewall_bin: String,
    /// Its build profile (the binary's directory: `debug`, `release`,
    /// `dist`): counts compare only within one.
    #[serde(default)]
    pub build: String,
    /// Requests before counting.
    pub warmup: u64,
    /// Requests per window.
    pub requests: u64,
    /// Closed-loop workers.
    pub concurrency: usize,
    /// Whether audit rows went into ClickHouse.
    pub clickhouse: bool,
    /// The cells.
    pub cells: Vec<Cell>,
}

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum InstrError {
    /// valgrind or its tools are missing.
    #[error("{0} is not installed (Debian: apt-get install valgrind)")]
    Missing(&'static str),
    /// An unknown cell name.
    #[error("unknown cell {0:?} (cells: {cells})", cells = CELLS.join(", "))]
    UnknownCell(String),
    /// Starting something failed.
    #[error("{what}: {detail}")]
    Start {
        /// What.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// The load did not get the answers it expects.
    #[error("cell {cell} on {target}: {detail}")]
    Load {
        /// Cell.
        cell: String,
        /// Target.
        target: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// callgrind's control or output failed.
    #[error("callgrind: {0}")]
    Callgrind(String),
}

fn start_err(what: &'static str) -> impl Fn(String) -> InstrError {
    move |detail| InstrError::Start { what, detail }
}

/// A target under callgrind.
struct Counted {
    pid: u32,
    out: PathBuf,
    dumps: usize,
}

impl Counted {
    fn placement(dir: &Path, name: &str) -> (Placement, PathBuf) {
        let out = dir.join(format!("{name}.callgrind"));
        let wrap = vec![
            "valgrind".to_owned(),
            "--tool=callgrind".to_owned(),
            "--quiet".to_owned(),
            format!("--callgrind-out-file={}", out.display()),
            "--dump-instr=no".to_owned(),
            "--dump-line=no".to_owned(),
            "--compress-strings=no".to_owned(),
            "--compress-pos=no".to_owned(),
        ];
        (Placement { cpus: None, wrap }, out)
    }

    fn control(&self, flag: &str) -> Result<(), InstrError> {
        let out = Command::new("callgrind_control")
            .arg(flag)
            .arg(self.pid.to_string())
            .output()
            .map_err(|e| InstrError::Callgrind(format!("callgrind_control {flag}: {e}")))?;
        if !out.status.success() {
            return Err(InstrError::Callgrind(format!(
                "callgrind_control {flag} {}: {}",
                self.pid,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Zeroes the counters.
    fn zero(&self) -> Result<(), InstrError> {
        self.control("-z")
    }

    /// Dumps the counters; returns the dump's path.
    fn dump(&mut self) -> Result<PathBuf, InstrError> {
        self.control("-d")?;
        self.dumps += 1;
        let path = PathBuf::from(format!("{}.{}", self.out.display(), self.dumps));
        if path.is_file() {
            Ok(path)
        } else {
            Err(InstrError::Callgrind(format!(
                "no dump at {} after callgrind_control -d",
                path.display()
            )))
        }
    }
}

/// The total instructions (`summary:` or `totals:` line) of a dump.
pub fn total_of(dump: &str) -> Option<u64> {
    dump.lines()
        .rev()
        .find_map(|l| {
            l.strip_prefix("summary: ")
                .or_else(|| l.strip_prefix("totals: "))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Inclusive cost by function name, from `callgrind_annotate --inclusive=yes`.
pub fn inclusive_of(annotated: &str) -> Vec<(u64, String)> {
    annotated
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let (count, rest) = l.split_once(' ')?;
            let count: u64 = count.replace(',', "").parse().ok()?;
            // `(12.34%)  file:function [object]`
            let rest = rest.trim_start();
            let rest = rest.strip_prefix('(').map_or(rest, |r| {
                r.split_once(')').map_or(r, |(_, after)| after.trim_start())
            });
            let func = function_part(rest)?;
            Some((count, func.to_owned()))
        })
        .collect()
}

/// `file:function [object]` → `function`: the file ends at the first
/// single colon (function names hold `::`).
fn function_part(s: &str) -> Option<&str> {
    let b = s.as_bytes();
    let at = (0..b.len())
        .find(|&i| b[i] == b':' && b.get(i + 1) != Some(&b':') && (i == 0 || b[i - 1] != b':'))?;
    let f = &s[at + 1..];
    Some(f.rsplit_once(" [").map_or(f, |(f, _)| f).trim())
}

/// The largest inclusive cost of a function named `name` (alone or as
/// an `async fn`'s `::{{closure}}`).
fn cost_of(inclusive: &[(u64, String)], name: &str) -> u64 {
    inclusive
        .iter()
        .filter(|(_, f)| {
            f.strip_prefix(name)
                .is_some_and(|rest| rest.is_empty() || rest == "::{{closure}}")
        })
        .map(|(c, _)| *c)
        .max()
        .unwrap_or(0)
}

/// Per-stage instructions from inclusive costs ([`STAGES`]), per request;
/// what no stage names is the rest.
pub fn stages_of(inclusive: &[(u64, String)], per: f64, total: f64) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let mut named = 0.0;
    for (stage, include, exclude) in STAGES {
        let plus: u64 = include.iter().map(|n| cost_of(inclusive, n)).sum();
        let minus: u64 = exclude.iter().map(|n| cost_of(inclusive, n)).sum();
        let v = plus.saturating_sub(minus) as f64 / per;
        named += v;
        out.insert(stage.to_owned(), v);
    }
    out.insert(
        "rest (hyper, tokio, the allocator)".to_owned(),
        (total - named).max(0.0),
    );
    out
}

fn annotate(dump: &Path) -> Result<String, InstrError> {
    let out = Command::new("callgrind_annotate")
        .arg("--inclusive=yes")
        .arg("--threshold=100")
        .arg(dump)
        .output()
        .map_err(|e| InstrError::Callgrind(format!("callgrind_annotate: {e}")))?;
    if !out.status.success() {
        return Err(InstrError::Callgrind(format!(
            "callgrind_annotate {}: {}",
            dump.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One side of a setup: the upstream (own process), the pass-through and
/// the audited firewall, each under callgrind; the audit-off firewall when
/// asked for.
struct Setup {
    _upstream: Managed,
    passthrough: (Passthrough, Counted),
    audited: (Firewall, Counted),
    plain: Option<(Firewall, Counted)>,
    /// Audited, its upstreams taking a token exchanged per run.
    exchange: Option<(Firewall, Counted)>,
    catalog: Catalog,
}

fn start_upstream(dir: &Path, result_bytes: usize) -> Result<(Managed, SocketAddr), InstrError> {
    let err = start_err("the canned upstream");
    let addr = SocketAddr::from((
        [127, 0, 0, 1],
        procs::free_port().map_err(|e| err(e.to_string()))?,
    ));
    let exe = std::env::current_exe().map_err(|e| err(e.to_string()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("upstream")
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--result-bytes")
        .arg(result_bytes.to_string())
        .arg("--threads")
        .arg("1");
    let log = dir.join(format!("upstream-{result_bytes}.log"));
    let mut p = Managed::spawn("upstream", cmd, &log, &Placement::default())
        .map_err(|e| err(e.to_string()))?;
    if !crate::probe::wait_listening(addr, Duration::from_secs(10), || p.running()) {
        return Err(err(p.log_tail(20)));
    }
    Ok((p, addr))
}

struct Shared<'a> {
    opts: &'a Options,
    dir: &'a Path,
    issuer: &'a Issuer,
    tokens: Arc<Tokens>,
    sink: Option<AuditSink>,
    clickhouse: Option<&'a ClickHouse>,
    /// The canned token endpoint (`call-exchange`).
    token_endpoint: Option<SocketAddr>,
}

/// The audit table the instruction runs write into.
const AUDIT_TABLE: &str = "mcp_bench_instructions.audit_events";

impl Shared<'_> {
    /// Waits until the audit rows sent so far have landed in ClickHouse
    /// (its row count stops moving), so a counted window holds the
    /// shipping of its own rows and not of the warm-up's. ClickHouse is
    /// asked, not the firewall: a scrape of `/metrics` would be counted.
    async fn settle_audit(&self) -> u64 {
        let Some(ch) = self.clickhouse else {
            return 0;
        };
        let started = std::time::Instant::now();
        let mut last = u64::MAX;
        let mut still = 0;
        while started.elapsed() < Duration::from_secs(60) {
            let n = ch
                // The chain's table: one entry per row shipped, never
                // merged away (the rows' table folds an intent into its
                // completion).
                .query_u64(&format!("SELECT count() FROM {AUDIT_TABLE}_chain"))
                .unwrap_or(0);
            if n == last {
                still += 1;
                if still >= 3 {
                    return n;
                }
            } else {
                still = 0;
                last = n;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        last
    }

    fn firewall(
        &self,
        name: &str,
        audited: bool,
        upstream: SocketAddr,
        token_exchange: Option<SocketAddr>,
    ) -> Result<(Firewall, Counted), InstrError> {
        let (placement, out) = Counted::placement(self.dir, name);
        let spec = firewall::Spec {
            name: name.to_owned(),
            tls: None,
            audit: if audited {
                Some(self.sink.clone().unwrap_or(AuditSink {
                    url: format!("http://127.0.0.1:{}", procs::free_port().unwrap_or(9)),
                    database: "mcp_bench_instructions".to_owned(),
                    chain: true,
                }))
            } else {
                None
            },
            log_level: "warn".to_owned(),
            upstream_http2: false,
            state: None,
            screening: true,
            shadow: false,
            virtual_servers: None,
            stdio: None,
            token_exchange,
        };
        let fw = Firewall::start(
            &self.opts.firewall_bin,
            self.dir,
            spec,
            upstream,
            self.issuer.public_pem(),
            &placement,
        )
        .map_err(|e| start_err("the firewall under callgrind")(e.to_string()))?;
        let pid = fw.pid();
        Ok((fw, Counted { pid, out, dumps: 0 }))
    }

    fn setup(&self, result_bytes: usize, cells: &[&str]) -> Result<Setup, InstrError> {
        let catalog =
            Catalog::new(100, result_bytes).map_err(|e| start_err("the catalog")(e.to_string()))?;
        let (upstream, addr) = start_upstream(self.dir, result_bytes)?;
        let name = |n: &str| format!("{n}-{result_bytes}");
        let (placement, out) = Counted::placement(self.dir, &name("passthrough"));
        let pt = Passthrough::start(
            addr,
            &self.dir.join(format!("{}.log", name("passthrough"))),
            &placement,
        )
        .map_err(|e| start_err("the pass-through under callgrind")(e.to_string()))?;
        let pid = pt.pid();
        let audited = self.firewall(&name("firewall"), true, addr, None)?;
        let plain = if cells.contains(&"call-noaudit") {
            Some(self.firewall(&name("firewall-noaudit"), false, addr, None)?)
        } else {
            None
        };
        let exchange = match self
            .token_endpoint
            .filter(|_| cells.contains(&"call-exchange"))
        {
            Some(at) => Some(self.firewall(&name("firewall-exchange"), true, addr, Some(at))?),
            None => None,
        };
        Ok(Setup {
            _upstream: upstream,
            passthrough: (pt, Counted { pid, out, dumps: 0 }),
            audited,
            plain,
            exchange,
            catalog,
        })
    }

    fn spec(
        &self,
        addr: SocketAddr,
        workload: &Arc<Workload>,
        firewall: bool,
        requests: u64,
    ) -> LoadSpec {
        LoadSpec {
            endpoint: Endpoint {
                addr,
                proto: Proto::H1,
                tls: None,
                path: None,
            },
            workload: workload.clone(),
            tokens: self.tokens.clone(),
            firewall,
            concurrency: self.opts.concurrency.max(1),
            h2_connections: 1,
            rate: None,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(3600),
            requests: Some(requests),
            timeout: Duration::from_secs(60),
            ticket_base: 0,
            calls_per_run: u64::MAX,
        }
    }

    /// Warm-up, then `repeat` counted windows; per-request totals and the
    /// last window's stages.
    async fn count(
        &self,
        cell: &str,
        target: &'static str,
        addr: SocketAddr,
        counted: &mut Counted,
        workload: &Arc<Workload>,
        firewall: bool,
    ) -> Result<Windows, InstrError> {
        let load = |requests| async move {
            let r = load::run(self.spec(addr, workload, firewall, requests), |_| {})
                .await
                .map_err(|e| InstrError::Load {
                    cell: cell.to_owned(),
                    target,
                    detail: e.to_string(),
                })?;
            if r.failed > 0 || r.ok < requests {
                return Err(InstrError::Load {
                    cell: cell.to_owned(),
                    target,
                    detail: format!(
                        "{} ok of {requests}, {} failed: {:?}",
                        r.ok, r.failed, r.errors
                    ),
                });
            }
            Ok(())
        };
        load(self.opts.warmup.max(1)).await?;
        let mut windows = Vec::new();
        let mut stages = BTreeMap::new();
        let mut rows = Vec::new();
        for _ in 0..self.opts.repeat.max(1) {
            let before = if firewall {
                self.settle_audit().await
            } else {
                0
            };
            counted.zero()?;
            load(self.opts.requests.max(1)).await?;
            if firewall {
                let after = self.settle_audit().await;
                rows.push(after.saturating_sub(before) as f64 / self.opts.requests.max(1) as f64);
            }
            let dump = counted.dump()?;
            let text = std::fs::read_to_string(&dump)
                .map_err(|e| InstrError::Callgrind(format!("reading {}: {e}", dump.display())))?;
            let total = total_of(&text)
                .ok_or_else(|| InstrError::Callgrind(format!("no total in {}", dump.display())))?;
            let per = self.opts.requests.max(1) as f64;
            let per_request = total as f64 / per;
            windows.push(per_request);
            if firewall {
                stages = stages_of(&inclusive_of(&annotate(&dump)?), per, per_request);
            }
            if let Some(keep) = &self.opts.keep {
                let to = keep.join(format!("{cell}-{target}.callgrind"));
                std::fs::copy(&dump, &to)
                    .map_err(|e| InstrError::Callgrind(format!("keeping {}: {e}", to.display())))?;
            }
        }
        Ok(Windows {
            windows,
            stages,
            rows_per_request: if rows.is_empty() { 0.0 } else { median(&rows) },
        })
    }
}

/// What [`Shared::count`] counted on one target.
struct Windows {
    /// Instructions per request, per window.
    windows: Vec<f64>,
    /// The last window's stages.
    stages: BTreeMap<String, f64>,
    /// Audit rows landed per request (median of the windows).
    rows_per_request: f64,
}

/// The firewall's own instructions per audit row: the audit stages over
/// the rows per request (0 when no row landed).
pub fn audit_per_row(stages: &BTreeMap<String, f64>, rows_per_request: f64) -> f64 {
    if rows_per_request <= 0.0 {
        return 0.0;
    }
    AUDIT_STAGES
        .iter()
        .map(|s| stages.get(*s).copied().unwrap_or(0.0))
        .sum::<f64>()
        / rows_per_request
}

/// The build profile of a binary under `target/<profile>/`.
pub fn build_of(bin: &Path) -> String {
    bin.parent()
        .and_then(Path::file_name)
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

fn scenario_of(cell: &str) -> Scenario {
    match cell {
        "list" => Scenario::List,
        "list-cold" => Scenario::ListCold,
        _ => Scenario::Call,
    }
}

/// Measures the cells.
pub async fn run(opts: &Options) -> Result<Report, InstrError> {
    for tool in ["valgrind", "callgrind_control", "callgrind_annotate"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Err(InstrError::Missing(tool));
        }
    }
    for c in &opts.cells {
        if !CELLS.contains(&c.as_str()) {
            return Err(InstrError::UnknownCell(c.clone()));
        }
    }
    if let Some(keep) = &opts.keep {
        std::fs::create_dir_all(keep)
            .map_err(|e| start_err("the directory for the dumps")(e.to_string()))?;
    }
    let dir = tempfile::Builder::new()
        .prefix("mcp-bench-instructions-")
        .tempdir()
        .map_err(|e| start_err("the run directory")(e.to_string()))?;
    let mut clickhouse = if opts.clickhouse && ClickHouse::available() {
        Some(
            ClickHouse::start(&dir.path().join("clickhouse"), &Placement::default())
                .map_err(|e| start_err("ClickHouse")(e.to_string()))?,
        )
    } else {
        None
    };
    let issuer = Issuer::generate().map_err(|e| start_err("the token issuer")(e.to_string()))?;
    let tokens = Arc::new(
        issuer
            .tokens(1, crate::tokens::MAX_LIFETIME)
            .map_err(|e| start_err("the run token")(e.to_string()))?,
    );
    // A cached exchanged token's cost: the token endpoint answers the
    // run's one exchange (the firewall's own calls use one more).
    let token_endpoint = if opts.cells.iter().any(|c| c == "call-exchange") {
        Some(
            crate::token_endpoint::TokenEndpoint::start()
                .await
                .map_err(|e| start_err("the token endpoint")(e.to_string()))?,
        )
    } else {
        None
    };
    let shared = Shared {
        token_endpoint: token_endpoint.as_ref().map(|t| t.addr),
        opts,
        dir: dir.path(),
        issuer: &issuer,
        tokens,
        sink: clickhouse.as_ref().map(|ch| AuditSink {
            url: ch.url(),
            database: "mcp_bench_instructions".to_owned(),
            chain: true,
        }),
        clickhouse: clickhouse.as_ref(),
    };
    let wants = |c: &str| opts.cells.iter().any(|x| x == c);
    let mut cells = Vec::new();
    let small: Vec<&str> = ["call", "call-noaudit", "list", "list-cold", "call-exchange"]
        .into_iter()
        .filter(|c| wants(c))
        .collect();
    if !small.is_empty() {
        cells.extend(measure(&shared, 310, &small).await?);
    }
    if wants("call-4k") {
        cells.extend(measure(&shared, 4096, &["call-4k"]).await?);
    }
    let into_clickhouse = shared.sink.is_some();
    drop(shared);
    if let Some(ch) = clickhouse.as_mut() {
        ch.stop();
    }
    cells.sort_by_key(|c| CELLS.iter().position(|n| *n == c.name));
    Ok(Report {
        firewall_bin: opts.firewall_bin.display().to_string(),
        build: build_of(&opts.firewall_bin),
        warmup: opts.warmup,
        requests: opts.requests,
        concurrency: opts.concurrency,
        clickhouse: into_clickhouse,
        cells,
    })
}

async fn measure(
    shared: &Shared<'_>,
    result_bytes: usize,
    cells: &[&str],
) -> Result<Vec<Cell>, InstrError> {
    let mut setup = shared.setup(result_bytes, cells)?;
    let mut out = Vec::new();
    let mut passthrough_by_scenario: BTreeMap<&str, f64> = BTreeMap::new();
    for &cell in cells {
        let scenario = scenario_of(cell);
        let workload = Arc::new(Workload::new(scenario, &setup.catalog));
        let key = scenario.name();
        let pt = match passthrough_by_scenario.get(key) {
            Some(v) => *v,
            None => {
                let addr = setup.passthrough.0.addr;
                let w = shared
                    .count(
                        cell,
                        "passthrough",
                        addr,
                        &mut setup.passthrough.1,
                        &workload,
                        false,
                    )
                    .await?
                    .windows;
                let v = median(&w);
                passthrough_by_scenario.insert(key, v);
                v
            }
        };
        let (fw, counted) = if cell == "call-noaudit" {
            match setup.plain.as_mut() {
                Some((f, c)) => (&*f, c),
                None => continue,
            }
        } else if cell == "call-exchange" {
            match setup.exchange.as_mut() {
                Some((f, c)) => (&*f, c),
                None => continue,
            }
        } else {
            (&setup.audited.0, &mut setup.audited.1)
        };
        let addr = fw.addr;
        let counted = shared
            .count(cell, "firewall", addr, counted, &workload, true)
            .await?;
        let f = median(&counted.windows);
        out.push(Cell {
            name: cell.to_owned(),
            firewall_per_request: f,
            passthrough_per_request: pt,
            own_per_request: f - pt,
            audit_per_row: audit_per_row(&counted.stages, counted.rows_per_request),
            rows_per_request: counted.rows_per_request,
            stages: counted.stages,
            windows: counted.windows,
        });
    }
    setup.passthrough.0.stop(Duration::from_secs(5));
    setup.audited.0.stop(Duration::from_secs(5));
    if let Some((f, _)) = setup.plain.as_mut() {
        f.stop(Duration::from_secs(5));
    }
    if let Some((f, _)) = setup.exchange.as_mut() {
        f.stop(Duration::from_secs(5));
    }
    Ok(out)
}

/// The report as a table.
pub fn markdown(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# mcp-bench instructions\n\n`{}` ({} build), {} warm-up and {} counted requests per window at c={}, audit {}.\n",
        r.firewall_bin,
        r.build,
        r.warmup,
        r.requests,
        r.concurrency,
        if r.clickhouse { "into ClickHouse" } else { "into the spool (ClickHouse not started)" }
    );
    let _ = writeln!(s, "| cell | firewall / request | pass-through / request | firewall's own | windows |\n|---|---|---|---|---|");
    for c in &r.cells {
        let w: Vec<String> = c.windows.iter().map(|x| format!("{:.0}", x)).collect();
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {:.0} | {} |",
            c.name,
            c.firewall_per_request,
            c.passthrough_per_request,
            c.own_per_request,
            w.join(", ")
        );
    }
    let _ = writeln!(
        s,
        "\nPer stage (instructions per request, callgrind's inclusive costs):\n"
    );
    let mut names: Vec<&String> = r.cells.iter().flat_map(|c| c.stages.keys()).collect();
    names.sort();
    names.dedup();
    let _ = write!(s, "| stage |");
    for c in &r.cells {
        let _ = write!(s, " {} |", c.name);
    }
    let _ = write!(s, "\n|---|");
    for _ in &r.cells {
        let _ = write!(s, "---|");
    }
    let _ = writeln!(s);
    for n in names {
        let _ = write!(s, "| {n} |");
        for c in &r.cells {
            let _ = write!(s, " {:.0} |", c.stages.get(n).copied().unwrap_or(0.0));
        }
        let _ = writeln!(s);
    }
    if r.cells.iter().any(|c| c.rows_per_request > 0.0) {
        let _ = writeln!(
            s,
            "\nThe audit's share (rows that landed in ClickHouse; the firewall's own work per row: build, encode, spool, chain, ship; ClickHouse's is not counted):\n\n| cell | rows / request | firewall's instructions / row |\n|---|---|---|"
        );
        for c in r.cells.iter().filter(|c| c.rows_per_request > 0.0) {
            let _ = writeln!(
                s,
                "| {} | {:.2} | {:.0} |",
                c.name, c.rows_per_request, c.audit_per_row
            );
        }
    }
    s
}

/// The guard: the cell's firewall count against a committed baseline.
/// Returns the report line, and whether it is within `tolerance` (0.10 is
/// 10 %).
pub fn guard(
    r: &Report,
    baseline: &Report,
    cell: &str,
    tolerance: f64,
) -> Result<(String, bool), String> {
    let now = r
        .cells
        .iter()
        .find(|c| c.name == cell)
        .ok_or_else(|| format!("cell {cell} was not measured"))?;
    let base = baseline
        .cells
        .iter()
        .find(|c| c.name == cell)
        .ok_or_else(|| format!("the baseline has no cell {cell}"))?;
    if r.build != baseline.build {
        return Err(format!(
            "the baseline counts a {} build and this run a {} build: counts compare only within one",
            baseline.build,
            r.build
        ));
    }
    let ratio = now.firewall_per_request / base.firewall_per_request.max(1.0);
    let ok = ratio <= 1.0 + tolerance;
    Ok((
        format!(
            "{cell}: {:.0} instructions per request against the baseline's {:.0} ({:+.1} %, allowed +{:.0} %): {}",
            now.firewall_per_request,
            base.firewall_per_request,
            (ratio - 1.0) * 100.0,
            tolerance * 100.0,
            if ok { "within" } else { "OVER" }
        ),
        ok,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_and_functions_are_read_from_callgrind_output() {
        assert_eq!(
            total_of("events: Ir\nfn=x\n1 2\nsummary: 12345\n"),
            Some(12345)
        );
        assert_eq!(total_of("events: Ir\ntotals: 99\n"), Some(99));
        assert_eq!(total_of("events: Ir\n"), None);
        let annotated = "\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,000,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                  file:function
--------------------------------------------------------------------------------
  400,000 (40.00%)  ???:mcp_firewall::auth::cache::TokenDigest::of [/bin/mcp-firewall]
  300,000 (30.00%)  src/proxy/outbound/gate.rs:mcp_firewall::proxy::outbound::gate::screen [/bin/mcp-firewall]
  350,000 (35.00%)  src/x.rs:mcp_firewall::proxy::outbound::exchange::Exchange::respond::{{closure}} [/bin/mcp-firewall]
  100,000 (10.00%)  ???:mcp_firewall::proxy::outbound::gate::screen_more [/bin/mcp-firewall]
   90,000 ( 9.00%)  ???:mcp_firewall::mcp::jsonrpc::parse_upstream_known [/bin/mcp-firewall]
";
        let inc = inclusive_of(annotated);
        assert!(inc.contains(&(
            400_000,
            "mcp_firewall::auth::cache::TokenDigest::of".to_owned()
        )));
        assert!(inc.contains(&(
            300_000,
            "mcp_firewall::proxy::outbound::gate::screen".to_owned()
        )));
        let stages = stages_of(&inc, 100.0, 10_000.0);
        assert_eq!(stages["token check"], 4_000.0);
        // A name matches whole (`screen_more` is not `screen`), and a
        // longer name that starts with it is another function.
        assert_eq!(stages["screening"], 3_000.0);
        assert_eq!(stages["strict read"], 0.0);
        // Nested costs another stage counts are subtracted.
        assert_eq!(stages["answer: read, decide, relay"], 500.0);
        assert_eq!(stages["rest (hyper, tokio, the allocator)"], 2_500.0);
    }

    fn report(n: f64) -> Report {
        Report {
            firewall_bin: "x".into(),
            build: "debug".into(),
            warmup: 1,
            requests: 1,
            concurrency: 1,
            clickhouse: false,
            cells: vec![Cell {
                name: "call".into(),
                firewall_per_request: n,
                passthrough_per_request: 1.0,
                own_per_request: n - 1.0,
                stages: BTreeMap::new(),
                windows: vec![n],
                rows_per_request: 0.0,
                audit_per_row: 0.0,
            }],
        }
    }

    #[test]
    fn the_audit_share_is_per_row() {
        let stages: BTreeMap<String, f64> = [
            ("audit rows: build, encode, spool", 30_000.0),
            ("hash chain and shipping", 80_000.0),
            ("screening", 26_000.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(audit_per_row(&stages, 2.0), 55_000.0);
        assert_eq!(audit_per_row(&stages, 0.0), 0.0);
        for s in AUDIT_STAGES {
            assert!(
                STAGES.iter().any(|(name, _, _)| *name == s),
                "{s} is a stage"
            );
        }
    }

    #[test]
    fn the_guard_fails_past_its_tolerance_and_only_then() {
        let base = report(100_000.0);
        assert!(guard(&report(109_999.0), &base, "call", 0.10).unwrap().1);
        assert!(!guard(&report(110_001.0), &base, "call", 0.10).unwrap().1);
        assert!(guard(&report(50_000.0), &base, "call", 0.10).unwrap().1);
        assert!(guard(&report(1.0), &base, "list", 0.10).is_err());
        let mut release = report(100_000.0);
        release.build = "release".into();
        assert!(guard(&release, &base, "call", 0.10).is_err());
    }
}
