//! One confined server process: started through `mcp-firewall
//! sandbox-exec` in a process group of its own, with only the environment
//! the config gives it and a private home; its stdin written a line per
//! message, its stdout read a line per message (a line that is not JSON,
//! or longer than the upstream's response cap, ends the process), its
//! stderr logged, bounded and rate-limited. Stopping it is the MCP close
//! sequence (stdin closed, then `SIGTERM`, then `SIGKILL`) sent to the
//! whole group, so no child of the server outlives it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};

use super::Shared;

/// What a process writes, as the instance reads it.
#[derive(Debug)]
pub(crate) enum Out {
    /// One JSON-RPC message (or batch).
    Message(Value),
    /// It ended, and why.
    Ended(String),
}

/// A running server process.
pub(crate) struct Process {
    /// Its pid (and process group).
    pub pid: u32,
    stdin: Mutex<Option<mpsc::Sender<Bytes>>>,
    exited: watch::Receiver<bool>,
}

/// Longest a stderr line is logged.
const STDERR_LINE: usize = 1024;
/// Stderr lines logged per 10 s per process; the rest are counted.
const STDERR_PER_10S: u32 = 50;
/// Time the process gets after stdin closes, then after `SIGTERM`.
const GRACE: Duration = Duration::from_secs(2);

/// The `mcp-firewall` binary that runs `sandbox-exec`: this one, or the one
/// beside it (tests run in another binary of the same build).
pub(crate) fn launcher() -> PathBuf {
    let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("mcp-firewall"));
    if me.file_name().is_some_and(|n| n == "mcp-firewall") {
        return me;
    }
    let mut dir = me.parent().map(Path::to_path_buf);
    while let Some(d) = dir {
        let candidate = d.join("mcp-firewall");
        if candidate.is_file() {
            return candidate;
        }
        dir = d.parent().map(Path::to_path_buf);
        if dir.as_ref().is_some_and(|d| d.join("Cargo.toml").exists()) {
            break;
        }
    }
    PathBuf::from("mcp-firewall")
}

impl Process {
    /// Starts the server of `shared` in its instance directory `dir`
    /// (its private home and the mount point of its private root), as
    /// `uid` when the firewall is root.
    pub(crate) fn spawn(
        shared: &Shared,
        dir: &Path,
        egress: Option<PathBuf>,
        uid: Option<super::uids::Lease>,
    ) -> std::io::Result<(Process, mpsc::Receiver<Out>)> {
        let home = dir.join("home");
        let root = dir.join("root");
        instance_dir(dir, &home, &root, uid.as_ref().map(super::uids::Lease::uid))?;
        let launch = &shared.launch;
        let mut spec = launch.sandbox.clone();
        spec.write.push(home.clone());
        spec.read.extend(runtime_of(&launch.command));
        let spec = serde_json::to_string(&spec).map_err(std::io::Error::other)?;
        let mut cmd = tokio::process::Command::new(launcher());
        cmd.arg("sandbox-exec")
            .arg("--spec")
            .arg(spec)
            .arg("--root")
            .arg(&root)
            .arg("--env-stdin");
        if let Some(lease) = &uid {
            cmd.arg("--uid")
                .arg(lease.uid().to_string())
                .arg("--gid")
                .arg(launch.host.gid.to_string());
        }
        if let Some(socket) = &egress {
            cmd.arg("--egress-socket").arg(socket);
        }
        cmd.arg("--").args(&launch.command);
        // The launcher runs with no environment: the server's is handed to
        // the sandbox's init on stdin and applied when the server starts,
        // after every layer.
        cmd.env_clear();
        let env_line = environment(launch, &home, egress.is_some());
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pid = child.id().unwrap_or(0);
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(std::io::Error::other("the child's pipes were not opened"));
        };
        let name: Arc<str> = Arc::from(shared.name.as_str());
        let last_stderr = Arc::new(Mutex::new(String::new()));
        let (to_stdin, mut lines) = mpsc::channel::<Bytes>(256);
        // First, the environment line the init reads.
        let _ = to_stdin.try_send(env_line);
        tokio::spawn(async move {
            while let Some(line) = lines.recv().await {
                let ok = stdin.write_all(&line).await.is_ok()
                    && stdin.write_all(b"\n").await.is_ok()
                    && stdin.flush().await.is_ok();
                if !ok {
                    break;
                }
            }
            // Dropping stdin closes it: the first step of the close sequence.
        });
        let stderr_done = tokio::spawn(log_stderr(name.clone(), pid, stderr, last_stderr.clone()));
        let (out_tx, out_rx) = mpsc::channel(256);
        let (exited_tx, exited) = watch::channel(false);
        let (status_tx, status_rx) = tokio::sync::oneshot::channel();
        // The leader's exit ends the group: children that inherited stdout
        // would otherwise keep it open.
        tokio::spawn(async move {
            let status = child.wait().await;
            signal_group(pid, Signal::SIGKILL);
            reap_group(pid).await;
            // Its uid is free again once nothing of it runs.
            drop(uid);
            let _ = exited_tx.send(true);
            let _ = status_tx.send(match status {
                Ok(s) => s.to_string(),
                Err(e) => e.to_string(),
            });
        });
        let max_line = shared.max_line;
        tokio::spawn(async move {
            let broke = read_stdout(&name, pid, stdout, max_line, &out_tx).await;
            // Its stdout closed: it ended, or is about to (its status is
            // what it exited with); whatever it started goes with it.
            if broke.is_some() {
                signal_group(pid, Signal::SIGKILL);
            }
            let mut status_rx = status_rx;
            let status = match tokio::time::timeout(GRACE, &mut status_rx).await {
                Ok(s) => s.unwrap_or_else(|_| "ended".to_owned()),
                Err(_) => {
                    signal_group(pid, Signal::SIGKILL);
                    status_rx.await.unwrap_or_else(|_| "ended".to_owned())
                }
            };
            // What it said last (why it could not start, say) is read
            // before its end is reported.
            let _ = tokio::time::timeout(Duration::from_millis(500), stderr_done).await;
            let last = last_stderr.lock().clone();
            let mut why = broke.unwrap_or(status);
            if !last.is_empty() {
                why = format!("{why}; its last stderr line: {last}");
            }
            let _ = out_tx.send(Out::Ended(why)).await;
        });
        Ok((
            Process {
                pid,
                stdin: Mutex::new(Some(to_stdin)),
                exited,
            },
            out_rx,
        ))
    }

    /// Writes one message (a line).
    pub(crate) async fn write(&self, line: Bytes) -> Result<(), String> {
        let tx = self.stdin.lock().clone();
        match tx {
            Some(tx) => tx
                .send(line)
                .await
                .map_err(|_| "the stdio server's stdin is closed".to_owned()),
            None => Err("the stdio server is stopping".to_owned()),
        }
    }

    /// The close sequence: stdin closed; `SIGTERM` to the group after a
    /// grace period; `SIGKILL` after another.
    pub(crate) async fn close(&self) {
        self.stdin.lock().take();
        let mut exited = self.exited.clone();
        let wait = |mut rx: watch::Receiver<bool>| async move {
            tokio::time::timeout(GRACE, rx.wait_for(|e| *e))
                .await
                .is_ok()
        };
        if wait(exited.clone()).await {
            return;
        }
        signal_group(self.pid, Signal::SIGTERM);
        if wait(exited.clone()).await {
            return;
        }
        signal_group(self.pid, Signal::SIGKILL);
        let _ = tokio::time::timeout(GRACE, exited.wait_for(|e| *e)).await;
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !*self.exited.borrow() {
            signal_group(self.pid, Signal::SIGKILL);
        }
    }
}

/// Makes this process the reaper of its descendants' orphans: what a
/// server started is reparented here, not to init (which in a container is
/// often this process anyway), and [`reap_group`] collects it.
pub(crate) fn become_subreaper() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(error = %e, "cannot become the reaper of the stdio servers' orphans; init reaps them");
    }
}

/// Waits (bounded) for every member of the killed group `pgid` to end, and
/// reaps those reparented to this process (the group's own leader is
/// tokio's to reap). A server may not leave its group (`setsid` and
/// `setpgid` are refused), so the group is everything it started.
async fn reap_group(pgid: u32) {
    let me = std::process::id();
    for _ in 0..100 {
        let members = group_members(pgid);
        let mut alive = false;
        for (pid, state, ppid) in members {
            if state == 'Z' && ppid == me {
                if let Ok(p) = i32::try_from(pid) {
                    let _ = nix::sys::wait::waitpid(
                        Pid::from_raw(p),
                        Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                    );
                }
            } else if state != 'Z' && state != 'X' {
                alive = true;
            }
        }
        if !alive {
            return;
        }
        signal_group(pgid, Signal::SIGKILL);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::warn!(
        pgid,
        "stdio server's process group still has members after SIGKILL"
    );
}

/// `(pid, state, ppid)` of every process in group `pgid` (from `/proc`).
fn group_members(pgid: u32) -> Vec<(u32, char, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After the command's closing parenthesis: state, ppid, pgrp.
            let rest = stat.get(stat.rfind(')')? + 1..)?;
            let mut f = rest.split_whitespace();
            let state = f.next()?.chars().next()?;
            let ppid = f.next()?.parse().ok()?;
            let group: u32 = f.next()?.parse().ok()?;
            (group == pgid).then_some((pid, state, ppid))
        })
        .collect()
}

fn signal_group(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        if pid > 1 {
            let _ = killpg(Pid::from_raw(pid), signal);
        }
    }
}

/// The instance's directory (the firewall's own, 0700), its private home
/// in it (owned by the server's uid when the firewall is root), and the
/// empty mount point of its private root.
fn instance_dir(dir: &Path, home: &Path, root: &Path, uid: Option<u32>) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let _ = std::fs::remove_dir_all(dir);
    let mut private = std::fs::DirBuilder::new();
    private.mode(0o700);
    private.create(dir)?;
    private.create(home)?;
    private.create(root)?;
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700))?;
    if let Some(uid) = uid {
        std::os::unix::fs::chown(home, Some(uid), None)?;
    }
    Ok(())
}

/// The server's environment, as the first line of its stdin: `PATH`, its
/// home and temporary directory, the upstream's `env` and `env_from`, and
/// the egress proxy of an allow-list.
fn environment(launch: &super::Launch, home: &Path, egress: bool) -> Bytes {
    let mut env = std::collections::BTreeMap::new();
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    env.insert("PATH".to_owned(), path);
    let home = home.display().to_string();
    env.insert("HOME".to_owned(), home.clone());
    env.insert("TMPDIR".to_owned(), home);
    for (k, v) in &launch.env {
        env.insert(k.clone(), v.clone());
    }
    for name in &launch.env_from {
        if let Ok(v) = std::env::var(name) {
            env.insert(name.clone(), v);
        }
    }
    if egress {
        let proxy = format!("http://127.0.0.1:{}", crate::sandbox::net::EGRESS_PORT);
        for k in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            env.insert(k.to_owned(), proxy.clone());
        }
    }
    Bytes::from(serde_json::to_string(&env).unwrap_or_else(|_| "{}".to_owned()))
}

/// What a command needs to read besides the runtime: its program's and
/// its script's package (the first absolute file argument: `node
/// /opt/x/index.js`, `python3 /opt/y/server.py`), as the `node_modules` it
/// is in, or its directory. Later file arguments are the server's data,
/// given to it by the operator: the sandbox's `read` decides those.
fn runtime_of(command: &[String]) -> Vec<PathBuf> {
    let program = command.first().map(Path::new);
    let script = command
        .iter()
        .skip(1)
        .map(Path::new)
        .find(|p| p.is_absolute() && p.is_file());
    program
        .into_iter()
        .chain(script)
        .filter(|p| p.is_absolute() && p.is_file())
        .map(|p| {
            let package = p
                .ancestors()
                .filter(|d| d.file_name().is_some_and(|n| n == "node_modules"))
                .last();
            package
                .or_else(|| p.parent())
                .map(Path::to_path_buf)
                .unwrap_or_default()
        })
        .collect()
}

/// Reads stdout a line at a time until it ends; `Some(why)` when the
/// process broke the transport.
async fn read_stdout(
    name: &str,
    pid: u32,
    stdout: impl AsyncRead + Unpin,
    max_line: usize,
    out: &mpsc::Sender<Out>,
) -> Option<String> {
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);
    let mut line = Vec::with_capacity(4096);
    loop {
        line.clear();
        match read_line(&mut reader, &mut line, max_line).await {
            Ok(0) => return None,
            Ok(_) => {}
            Err(why) => {
                tracing::error!(upstream = %name, pid, reason = %why, "stdio server broke the transport: stopping it");
                return Some(why);
            }
        }
        let text = trim(&line);
        if text.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Value>(text) {
            Ok(v) if is_jsonrpc(&v) => {
                if out.send(Out::Message(v)).await.is_err() {
                    return None;
                }
            }
            _ => {
                let shown: String = String::from_utf8_lossy(&text[..text.len().min(80)]).into();
                let why = format!("it wrote a line to stdout that is not JSON-RPC: {shown:?}");
                tracing::error!(upstream = %name, pid, line = %shown, "stdio server wrote a line to stdout that is not JSON-RPC: stopping it");
                return Some(why);
            }
        }
    }
}

/// A JSON-RPC 2.0 message (an object with `"jsonrpc": "2.0"`), or a
/// non-empty batch of them.
fn is_jsonrpc(v: &Value) -> bool {
    let one = |m: &Value| m.get("jsonrpc").and_then(Value::as_str) == Some("2.0");
    match v {
        Value::Array(batch) => !batch.is_empty() && batch.iter().all(one),
        m => one(m),
    }
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end.max(start)]
}

/// One line (without its newline) of at most `max` bytes.
async fn read_line(
    reader: &mut (impl tokio::io::AsyncBufRead + Unpin),
    line: &mut Vec<u8>,
    max: usize,
) -> Result<usize, String> {
    let mut total = 0;
    loop {
        let buf = reader.fill_buf().await.map_err(|e| e.to_string())?;
        if buf.is_empty() {
            return Ok(total);
        }
        let (used, done) = match memchr::memchr(b'\n', buf) {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let take = if done { used - 1 } else { used };
        if line.len() + take > max {
            return Err(format!("a stdout line longer than {max} bytes"));
        }
        line.extend_from_slice(&buf[..take]);
        reader.consume(used);
        total += used;
        if done {
            return Ok(total);
        }
    }
}

/// How many stderr lines are logged: [`STDERR_PER_10S`] per 10 s window,
/// the rest counted and reported when the next window opens.
struct StderrBudget {
    window: Instant,
    logged: u32,
    dropped: u64,
}

/// What to do with one stderr line.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Log it (after reporting how many the last window dropped, if any).
    Log { dropped_before: u64 },
    /// Count it.
    Drop,
}

impl StderrBudget {
    fn new(now: Instant) -> StderrBudget {
        StderrBudget {
            window: now,
            logged: 0,
            dropped: 0,
        }
    }

    fn admit(&mut self, now: Instant) -> Verdict {
        let mut dropped_before = 0;
        if now.duration_since(self.window) >= Duration::from_secs(10) {
            dropped_before = self.dropped;
            self.window = now;
            self.logged = 0;
            self.dropped = 0;
        }
        if self.logged < STDERR_PER_10S {
            self.logged += 1;
            Verdict::Log { dropped_before }
        } else {
            self.dropped += 1;
            Verdict::Drop
        }
    }
}

/// Logs stderr: each line cut to 1 KiB, at most 50 lines per 10 s (the
/// rest counted and reported); keeps the last line for the exit reason.
async fn log_stderr(
    name: Arc<str>,
    pid: u32,
    stderr: impl AsyncRead + Unpin,
    last: Arc<Mutex<String>>,
) {
    let mut lines = BufReader::new(stderr).split(b'\n');
    let mut budget = StderrBudget::new(Instant::now());
    while let Ok(Some(line)) = lines.next_segment().await {
        let cut = &line[..line.len().min(STDERR_LINE)];
        let text = String::from_utf8_lossy(cut).trim_end().to_owned();
        if text.is_empty() {
            continue;
        }
        if let Verdict::Log { dropped_before } = budget.admit(Instant::now()) {
            if dropped_before > 0 {
                tracing::warn!(upstream = %name, pid, dropped = dropped_before, "stdio server stderr: lines not logged (over 50 per 10 s)");
            }
            tracing::info!(upstream = %name, pid, "stdio server stderr: {text}");
        }
        *last.lock() = text;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded_and_only_json_rpc_passes() {
        let input: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n  \n[{\"jsonrpc\":\"2.0\",\"method\":\"n\"}]\n{\"id\":2}\n";
        let (tx, mut rx) = mpsc::channel(8);
        let why = read_stdout("t", 1, input, 1024, &tx).await;
        assert!(matches!(
            rx.recv().await,
            Some(Out::Message(Value::Object(_)))
        ));
        assert!(matches!(
            rx.recv().await,
            Some(Out::Message(Value::Array(_)))
        ));
        assert!(
            why.is_some_and(|w| w.contains("not JSON-RPC")),
            "an object without jsonrpc ends it"
        );
        let long = [b'x'; 64];
        let (tx, _rx) = mpsc::channel(8);
        let why = read_stdout("t", 1, &long[..], 16, &tx).await;
        assert!(why.is_some_and(|w| w.contains("longer than 16")));
        let (tx, _rx) = mpsc::channel(8);
        assert!(read_stdout("t", 1, &b"plain text\n"[..], 1024, &tx)
            .await
            .is_some());
        assert_eq!(
            read_stdout("t", 1, &b""[..], 1024, &tx).await,
            None,
            "EOF is not an error"
        );
    }

    #[test]
    fn stderr_is_rate_limited_and_the_dropped_are_reported() {
        let t0 = Instant::now();
        let mut b = StderrBudget::new(t0);
        for _ in 0..STDERR_PER_10S {
            assert_eq!(b.admit(t0), Verdict::Log { dropped_before: 0 });
        }
        for _ in 0..7 {
            assert_eq!(b.admit(t0 + Duration::from_secs(9)), Verdict::Drop);
        }
        assert_eq!(
            b.admit(t0 + Duration::from_secs(10)),
            Verdict::Log { dropped_before: 7 }
        );
        assert_eq!(
            b.admit(t0 + Duration::from_secs(11)),
            Verdict::Log { dropped_before: 0 }
        );
    }

    #[test]
    fn a_command_reads_its_own_package() {
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("node_modules/@x/server/dist");
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::write(pkg.join("index.js"), "").unwrap();
        std::fs::write(dir.path().join("tool.py"), "").unwrap();
        let cmd = vec![
            "/usr/bin/env".to_owned(),
            "relative.txt".to_owned(),
            pkg.join("index.js").display().to_string(),
            dir.path().join("tool.py").display().to_string(),
        ];
        let got = runtime_of(&cmd);
        assert!(got.contains(&dir.path().join("node_modules")), "{got:?}");
        assert!(got.contains(&PathBuf::from("/usr/bin")), "{got:?}");
        // A later file argument is data: its directory is not opened.
        assert!(!got.contains(&dir.path().to_path_buf()), "{got:?}");
        assert_eq!(got.len(), 2, "{got:?}");
    }
}
