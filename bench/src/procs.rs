//! Child processes the harness starts (firewall, nginx, upstream,
//! ClickHouse) and what `/proc` says about them: CPU time, peak and current
//! RSS, child processes.
//!
//! Invariants:
//! - every child is started with a watchdog shell that SIGKILLs it once the
//!   harness is gone, even after a SIGKILL of the harness, so no server
//!   outlives a run;
//! - a child is stopped by its PID only (SIGTERM, then SIGKILL after a grace
//!   period), never by name;
//! - with CPU pinning active, every child is started through `taskset` with
//!   an explicit CPU list, because a forked child inherits the affinity of
//!   the (pinned) load-generator thread that spawned it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// Why a child could not be started or inspected.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// `spawn` failed.
    #[error("starting {name} ({program}): {source}")]
    Spawn {
        /// Role of the child.
        name: String,
        /// The program.
        program: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The log file could not be created.
    #[error("creating log file {path}: {source}")]
    Log {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Picking a port or finding our own executable failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// The child started but never listened.
    #[error("{name} did not start listening; log tail:\n{log}")]
    NotReady {
        /// Role of the child.
        name: String,
        /// The end of its log.
        log: String,
    },
    /// A `/proc` file could not be read or parsed.
    #[error("reading /proc/{pid}/{file}")]
    Proc {
        /// The process.
        pid: u32,
        /// The file under `/proc/<pid>`.
        file: &'static str,
    },
}

/// A started child with its watchdog.
pub struct Managed {
    name: String,
    child: Option<Child>,
    watchdog: Option<Child>,
    log: PathBuf,
}

/// CPU time and memory of a set of processes at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// User plus system CPU seconds since each process started.
    pub cpu_s: f64,
    /// Peak resident set (`VmHWM`) summed over the processes, KiB.
    pub peak_rss_kb: u64,
    /// Current resident set (`VmRSS`) summed, KiB.
    pub rss_kb: u64,
}

/// Where children run when pinning is active.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// `taskset -c` list, or `None` to start the child as is.
    pub cpus: Option<String>,
    /// A command the child runs under (`valgrind --tool=callgrind …`):
    /// the program and its arguments follow it. Empty: none.
    pub wrap: Vec<String>,
}

impl Placement {
    /// How much longer than usual a child may take to start: a child
    /// under a wrapper (valgrind runs it about fifty times slower) gets
    /// twenty times the time.
    pub fn start_factor(&self) -> u32 {
        if self.wrap.is_empty() {
            1
        } else {
            20
        }
    }
}

/// `cmd` run under `prefix` (a program and its arguments, `cmd`'s program
/// and arguments following), in `cmd`'s directory with `cmd`'s
/// environment changes.
fn under(prefix: &[&str], cmd: &Command) -> Command {
    let mut wrapped = Command::new(prefix.first().copied().unwrap_or_default());
    wrapped
        .args(prefix.iter().skip(1))
        .arg(cmd.get_program())
        .args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        wrapped.current_dir(dir);
    }
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    wrapped
}

// === impl Managed ===

impl Managed {
    /// Starts `cmd` with stdout/stderr appended to `log`, under `placement`,
    /// guarded by a watchdog.
    pub fn spawn(
        name: &str,
        mut cmd: Command,
        log: &Path,
        placement: &Placement,
    ) -> Result<Managed, ProcError> {
        let out = File::create(log).map_err(|source| ProcError::Log {
            path: log.to_owned(),
            source,
        })?;
        let err = out.try_clone().map_err(|source| ProcError::Log {
            path: log.to_owned(),
            source,
        })?;
        if let Some(cpus) = &placement.cpus {
            cmd = under(&["taskset", "-c", cpus], &cmd);
        }
        if !placement.wrap.is_empty() {
            let wrap: Vec<&str> = placement.wrap.iter().map(String::as_str).collect();
            cmd = under(&wrap, &cmd);
        }
        let program = cmd.get_program().to_string_lossy().into_owned();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|source| ProcError::Spawn {
                name: name.to_owned(),
                program: program.clone(),
                source,
            })?;
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg("while kill -0 \"$0\" 2>/dev/null; do sleep 1; done; kill -9 \"$1\" 2>/dev/null")
            .arg(std::process::id().to_string())
            .arg(child.id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        Ok(Managed {
            name: name.to_owned(),
            child: Some(child),
            watchdog,
            log: log.to_owned(),
        })
    }

    /// The child's PID (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Its role name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The last `lines` lines of its log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL; reaps the child.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process(pid, Signal::TERM);
            }
            let deadline = Instant::now() + grace;
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

/// The last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let from = len.saturating_sub(16 * 1024);
    let _ = f.seek(SeekFrom::Start(from));
    let mut buf = String::new();
    let _ = f.read_to_string(&mut buf);
    let all: Vec<&str> = buf.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// === /proc ===

/// Clock ticks per second of `/proc/<pid>/stat` times.
fn ticks() -> f64 {
    rustix::param::clock_ticks_per_second() as f64
}

/// utime + stime of a process or thread from its `stat` file, in ticks.
fn stat_ticks(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    // The command name may contain spaces and parentheses: fields start
    // after the last ')'. utime and stime are fields 14 and 15 overall,
    // so 12th and 13th after the name.
    let rest = text.get(text.rfind(')')? + 2..)?;
    let mut fields = rest.split_ascii_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// CPU seconds (user + system) a process has used, all threads.
pub fn cpu_seconds(pid: u32) -> Result<f64, ProcError> {
    stat_ticks(Path::new(&format!("/proc/{pid}/stat")))
        .map(|t| t as f64 / ticks())
        .ok_or(ProcError::Proc { pid, file: "stat" })
}

/// CPU seconds used by this process's threads whose name starts with
/// `prefix` (an in-process upstream's runtime).
pub fn thread_cpu_seconds(prefix: &str) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let mut total = 0u64;
    for e in dir.flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim_end().starts_with(prefix) {
            total += stat_ticks(&e.path().join("stat")).unwrap_or(0);
        }
    }
    total as f64 / ticks()
}

/// A `kB` field (`VmHWM`, `VmRSS`) of `/proc/<pid>/status`.
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Usage summed over `pids` (missing processes count as zero).
pub fn usage(pids: &[u32]) -> Usage {
    let mut u = Usage::default();
    for &pid in pids {
        u.cpu_s += cpu_seconds(pid).unwrap_or(0.0);
        u.peak_rss_kb += status_kb(pid, "VmHWM").unwrap_or(0);
        u.rss_kb += status_kb(pid, "VmRSS").unwrap_or(0);
    }
    u
}

/// Resets the peak-RSS mark of `pid` (`/proc/<pid>/clear_refs`, value 5),
/// so the next `VmHWM` is the peak since now. Best effort: returns whether
/// the kernel took it.
pub fn reset_peak_rss(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Direct children of `pid` (nginx workers of a master).
pub fn children(pid: u32) -> Vec<u32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    if let Ok(text) = std::fs::read_to_string(path) {
        return text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
    }
    // Kernels without CONFIG_PROC_CHILDREN: scan every process's parent.
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|t| {
                    let rest = t.get(t.rfind(')')? + 2..)?.to_owned();
                    rest.split_ascii_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// Raises this process's open-file limit to at least `want` descriptors
/// where the system lets it (the hard limit too, which only a privileged
/// process may raise), else to its hard limit, and returns the limit now in
/// force. 1,000 streams need over 2,000 descriptors in a proxy, 10,000 idle
/// connections over 10,000 in the harness and in the target; children
/// inherit the limit.
pub fn raise_nofile(want: u64) -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    let hard = lim.maximum.unwrap_or(u64::MAX);
    if hard < want {
        // Refused without CAP_SYS_RESOURCE; then the hard limit below.
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(want),
                maximum: Some(want),
            },
        );
    }
    let lim = getrlimit(Resource::Nofile);
    if let Some(max) = lim.maximum {
        if lim.current.is_some_and(|c| c < max) {
            let _ = setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(max),
                    maximum: Some(max),
                },
            );
        }
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The current resident set (`VmRSS`) of `pid`, MB (of 1,024 KiB), if it
/// runs.
pub fn rss_mb(pid: u32) -> Option<f64> {
    status_kb(pid, "VmRSS").map(|kb| kb as f64 / 1024.0)
}

/// Pins the calling thread to `cpus` (threads it creates inherit this).
pub fn pin_current_thread(cpus: &[usize]) -> bool {
    let mut set = rustix::thread::CpuSet::new();
    for &c in cpus {
        set.set(c);
    }
    rustix::thread::sched_setaffinity(None, &set).is_ok()
}

/// Parses a CPU list like `0`, `0,2` or `1-3`.
pub fn parse_cpus(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if a > b {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Whether `taskset` can be run.
pub fn have_taskset() -> bool {
    Command::new("taskset")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The 1-minute load average.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A port nothing listens on right now (released before returning, so a
/// race with another process is possible; callers retry).
pub fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Finds an executable: `name` on `PATH`, else the given absolute fallbacks.
pub fn find_program(name: &str, fallbacks: &[&str]) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    fallbacks.iter().map(PathBuf::from).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_ranges_and_singles() {
        assert_eq!(parse_cpus("0"), Some(vec![0]));
        assert_eq!(parse_cpus("0,2"), Some(vec![0, 2]));
        assert_eq!(parse_cpus("1-3"), Some(vec![1, 2, 3]));
        assert_eq!(parse_cpus("3-1"), None);
        assert_eq!(parse_cpus("x"), None);
        assert_eq!(parse_cpus(""), None);
    }

    #[test]
    fn own_process_has_cpu_time_and_memory() {
        // Burn a little CPU so the reading cannot be zero.
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        assert!(x != 1);
        let u = usage(&[std::process::id()]);
        assert!(u.cpu_s > 0.0);
        assert!(u.peak_rss_kb >= u.rss_kb && u.rss_kb > 0);
        assert!(rss_mb(std::process::id()).is_some_and(|mb| mb > 0.0));
        assert_eq!(rss_mb(0), None);
    }

    #[test]
    fn the_open_file_limit_is_raised_as_far_as_allowed() {
        let before = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        let now = raise_nofile(64);
        assert!(now >= 64.min(before.maximum.unwrap_or(u64::MAX)));
        assert!(before.current.is_none_or(|c| now >= c));
    }

    #[test]
    fn stopped_child_is_reaped_and_its_log_kept() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sleep.log");
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("echo started; exec sleep 30");
        let mut m = Managed::spawn("sleeper", cmd, &log, &Placement::default()).unwrap();
        let pid = m.pid();
        assert!(pid > 0 && m.running());
        std::thread::sleep(Duration::from_millis(100));
        m.stop(Duration::from_secs(2));
        assert!(!Path::new(&format!("/proc/{pid}/stat")).exists() || !m.running());
        assert_eq!(m.log_tail(5), "started");
    }
}
