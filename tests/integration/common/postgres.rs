//! Throwaway PostgreSQL servers for integration tests: a real `postgres`
//! (Debian's `/usr/lib/postgresql/<newest>/bin`, or the directory
//! `$MCPFW_PG_BIN`) with a fresh cluster in a temp dir, listening on 127.0.0.1
//! only (plus a Unix socket in that dir), on a port picked at runtime, with a
//! passwordless (`trust`) superuser `mcpfw` and a database `mcpfw`. Durability
//! is off (`fsync`, `full_page_writes`): committed data survives a killed
//! server ([`Postgres::stop`]), not a killed machine. `synchronous_commit`
//! stays on, so that no acknowledged commit is lost across stop/resume.
//!
//! PostgreSQL refuses to run as root: when the tests run as root, `initdb` and
//! `postgres` run as the `postgres` system user (the child drops to its uid
//! and gid before exec, see [`CommandExt::uid`]; no `su`/`runuser`), and the
//! temp dir is chowned to it. Clients (`psql`) run as the test's user.
//!
//! [`Postgres::shared`] gives one server per test binary (starting one takes
//! about a second); tests isolate themselves with
//! [`Postgres::create_database`]. [`Postgres::start`] gives a dedicated server
//! for tests that [`Postgres::stop`] it (SIGKILL: a crash) and
//! [`Postgres::resume`] it (crash recovery, same port and data).
//! Invariant: no server outlives the test process: a dedicated server is
//! killed on drop, and every server has a watchdog shell that kills the
//! postmaster and its children (and removes the directory and the SysV
//! shared memory segment) once the test process is gone, even after a SIGKILL.
//! The watchdog notices through a pipe: its stdin's write end lives in the test
//! process, so the kernel closes it however that process ends.
//!
//! Queries are synchronous and std-only (they go through the `psql` binary),
//! so usable from sync and async tests alike, and independent of the code
//! under test. Starting and stopping wait for the server, so they are async:
//! a wait never puts the test's runtime thread to sleep.

// Each test binary uses a subset of this shared harness.
#![allow(dead_code)]

use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

/// A running (or stopped) test PostgreSQL server.
pub struct Postgres {
    /// `postgres://mcpfw@127.0.0.1:PORT/mcpfw`
    pub url: String,
    /// TCP port.
    pub port: u16,
    /// The temp dir: `data/` (the cluster), the socket, `postgres.log`.
    dir: PathBuf,
    /// The directory with `initdb`, `postgres`, `psql`, `pg_isready`.
    bin: PathBuf,
    /// uid and gid the server runs as (`postgres` when we are root).
    run_as: Option<(u32, u32)>,
    server: Mutex<Option<Child>>,
    watchdog: Mutex<Option<Child>>,
}

/// Superuser and default database.
pub const USER: &str = "mcpfw";

/// How long a server gets to accept connections after spawning.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The watchdog: waits for EOF on stdin (the test process is gone), then
/// freezes the postmaster (pid in `$0/harness.pid`) so that it forks no more,
/// kills its children and it, removes the SysV segment named in
/// `postmaster.pid` and removes `$0`.
const WATCHDOG: &str = r#"
trap '' INT HUP TERM
while read -r _; do :; done
if [ -f "$0/harness.pid" ]; then
  read -r pid < "$0/harness.pid"
  kill -STOP "$pid" 2>/dev/null
  pkill -9 -P "$pid" 2>/dev/null
  kill -9 "$pid" 2>/dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
fi
if [ -f "$0/data/postmaster.pid" ]; then
  { read -r _; read -r _; read -r _; read -r _; read -r _; read -r _; read -r shm; } < "$0/data/postmaster.pid"
  set -- "$0" $shm
  [ -n "$3" ] && ipcrm -m "$3" 2>/dev/null
fi
rm -rf "$0" 2>/dev/null || { sleep 0.5; rm -rf "$0"; }
"#;

impl Postgres {
    /// The server shared by all tests of this binary, started on first use.
    pub async fn shared() -> &'static Postgres {
        static SHARED: OnceCell<Postgres> = OnceCell::const_new();
        SHARED.get_or_init(Postgres::start).await
    }

    /// Starts a dedicated server (killed when dropped).
    pub async fn start() -> Postgres {
        let bin = bin_dir();
        let run_as = if is_root() {
            Some(postgres_user().unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL refuses to run as root and {e}; install the server \
                     (`apt-get install postgresql`, which creates the user) or run \
                     the tests as another user"
                )
            }))
        } else {
            None
        };
        let dir = std::env::temp_dir().join(format!(
            "mcpfw-postgres-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("create postgres dir");
        let mut pg = Postgres {
            url: String::new(),
            port: 0,
            dir,
            bin,
            run_as,
            server: Mutex::new(None),
            watchdog: Mutex::new(None),
        };
        // On panic from here on, dropping `pg` cleans up.
        if let Err(e) = pg.spawn_watchdog().and_then(|()| pg.initdb()) {
            panic!("could not start postgres: {e}");
        }
        let mut last_err = String::new();
        // Ports are probed then released, so another process may grab one in
        // between: retry with fresh ports (same cluster).
        for _ in 0..3 {
            pg.port = super::watchdog::free_port();
            pg.url = pg.url_for(USER);
            match pg.spawn().await {
                Ok(()) => {
                    pg.psql("postgres", &format!("CREATE DATABASE {USER}"));
                    return pg;
                }
                Err(e) => last_err = e,
            }
        }
        panic!("could not start postgres: {last_err}");
    }

    /// Kills the server at once (SIGKILL to the postmaster and its children),
    /// like a crash, and waits until its port refuses connections. The data
    /// dir is kept for [`Postgres::resume`].
    pub async fn stop(&self) {
        let children = self.kill_server();
        // Orphans are reaped by init; a zombie holds no socket or memory.
        let deadline = Instant::now() + Duration::from_secs(10);
        while children.iter().any(|&c| alive(c)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            if Instant::now() > deadline {
                panic!(
                    "postgres port {} still accepts connections after SIGKILL",
                    self.port
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the server again after [`Postgres::stop`], on the same port and
    /// data dir (it runs crash recovery first). No-op when running.
    pub async fn resume(&self) {
        if self.is_running() {
            return;
        }
        let mut last_err = String::new();
        // A racing process may hold the port briefly.
        for _ in 0..5 {
            match self.spawn().await {
                Ok(()) => return,
                Err(e) => last_err = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "could not restart postgres on port {}: {last_err}",
            self.port
        );
    }

    /// Whether the postmaster is alive (it may still be starting).
    pub fn is_running(&self) -> bool {
        match self.server.lock().unwrap().as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// `postgres://mcpfw@127.0.0.1:PORT/<db>`
    pub fn url_for(&self, db: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates the database `name` (letters, digits, `_`; it must not exist
    /// yet) and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "database name {name:?}: use letters, digits and '_'"
        );
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""));
        self.url_for(name)
    }

    /// Creates a database with a random name and returns its URL.
    pub fn create_random_database(&self) -> String {
        self.create_database(&format!("t_{:016x}", rand::random::<u64>()))
    }

    /// Runs `sql` in database `db` with `psql -At` (unaligned, tuples only:
    /// one row a line, columns split by `|`) and returns stdout; panics with
    /// psql's stderr on failure.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        match self.try_psql(db, sql) {
            Ok(out) => out,
            Err(e) => panic!("psql failed in database {db}: {sql}\n{e}"),
        }
    }

    /// [`Postgres::psql`], with `Err` (psql's stderr) on failure.
    pub fn try_psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let mut cmd = self.client("psql");
        cmd.args(["-X", "-At", "-d", db, "-c", sql]);
        let out = cmd.output().map_err(|e| format!("spawning psql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "psql exited with {}:\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ))
        }
    }

    /// Last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(20);
        lines[from..].join("\n")
    }

    /// A client binary of the same installation, pointed at this server, with
    /// the caller's `PG*` variables (and `~/.psqlrc`, via `-X`) out of the way.
    fn client(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(name));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("PG") {
                cmd.env_remove(k);
            }
        }
        cmd.env("PGCONNECT_TIMEOUT", "10")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
            .stdin(Stdio::null());
        cmd
    }

    /// A server binary, run as `postgres` when we are root.
    fn server_cmd(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(name));
        if let Some((uid, gid)) = self.run_as {
            // std also drops supplementary groups (setgroups(0)) before setuid.
            cmd.uid(uid)
                .gid(gid)
                .env("HOME", &self.dir)
                .env("USER", "postgres");
        }
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("PG") {
                cmd.env_remove(k);
            }
        }
        cmd.env("LC_ALL", "C")
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        cmd
    }

    fn initdb(&self) -> Result<(), String> {
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::fs::chown(&self.dir, Some(uid), Some(gid))
                .map_err(|e| format!("chown {} to postgres: {e}", self.dir.display()))?;
        }
        let out = self
            .server_cmd("initdb")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args([
                "-A",
                "trust",
                "-U",
                USER,
                "--no-sync",
                "-E",
                "UTF8",
                "--no-locale",
            ])
            .output()
            .map_err(|e| {
                format!(
                    "spawning {}: {e} (install PostgreSQL with \
                     `apt-get install postgresql`, or set MCPFW_PG_BIN to its bin dir)",
                    self.bin.join("initdb").display()
                )
            })?;
        if !out.status.success() {
            return Err(format!(
                "initdb exited with {}:\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }

    /// One watchdog per server, for its whole life (it reads the current pid
    /// from `harness.pid`, so it survives stop/resume).
    fn spawn_watchdog(&self) -> Result<(), String> {
        let wd = super::watchdog::spawn(WATCHDOG, &self.dir)?;
        *self.watchdog.lock().unwrap() = Some(wd);
        Ok(())
    }

    async fn spawn(&self) -> Result<(), String> {
        let data = self.dir.join("data");
        // Left behind by a SIGKILL; its pid may belong to another process by
        // now, which would make the postmaster refuse to start.
        for stale in [
            data.join("postmaster.pid"),
            self.dir.join(format!(".s.PGSQL.{}", self.port)),
            self.dir.join(format!(".s.PGSQL.{}.lock", self.port)),
        ] {
            let _ = std::fs::remove_file(stale);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("postgres.log"))
            .map_err(|e| format!("opening postgres.log: {e}"))?;
        let log2 = log.try_clone().map_err(|e| format!("postgres.log: {e}"))?;
        let mut child = self
            .server_cmd("postgres")
            .arg("-D")
            .arg(&data)
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                // Not `synchronous_commit=off`: with it, a commit acknowledged
                // up to ~600 ms before a `stop()` is lost on `resume()`. With
                // `fsync=off` a synchronous commit costs a write(2) only.
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
                // Dynamic shared memory as files under data/, not in /dev/shm,
                // where a SIGKILL would leak them.
                "-c",
                "dynamic_shared_memory_type=mmap",
            ])
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", self.bin.join("postgres").display()))?;
        std::fs::write(self.dir.join("harness.pid"), child.id().to_string())
            .map_err(|e| format!("writing harness.pid: {e}"))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.is_ready() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let _ = std::fs::remove_file(self.dir.join("harness.pid"));
                return Err(format!(
                    "postgres exited with {status}; log:\n{}",
                    self.log_tail()
                ));
            }
            if Instant::now() > deadline {
                *self.server.lock().unwrap() = Some(child);
                self.kill_server();
                return Err(format!(
                    "not accepting connections on port {} within {START_TIMEOUT:?}; log:\n{}",
                    self.port,
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        *self.server.lock().unwrap() = Some(child);
        Ok(())
    }

    /// `pg_isready -h 127.0.0.1 -p PORT` succeeds.
    fn is_ready(&self) -> bool {
        let mut cmd = Command::new(self.bin.join("pg_isready"));
        cmd.args([
            "-q",
            "-t",
            "2",
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        matches!(cmd.status(), Ok(s) if s.success())
    }

    /// SIGKILLs the postmaster and its children; returns the children's
    /// pids (they may take a moment to die).
    fn kill_server(&self) -> Vec<u32> {
        let Some(mut child) = self.server.lock().unwrap().take() else {
            return Vec::new();
        };
        let pid = child.id();
        // Frozen, the postmaster forks no new children while we kill them.
        let _ = sh_kill("STOP", &[pid]);
        let children = children_of(pid);
        let _ = sh_kill("KILL", &children);
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(self.dir.join("harness.pid"));
        children
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.kill_server();
        // Closing its stdin makes the watchdog remove the SysV segment and the
        // directory.
        if let Some(mut wd) = self.watchdog.lock().unwrap().take() {
            drop(wd.stdin.take());
            let _ = wd.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `$MCPFW_PG_BIN`, else the newest `/usr/lib/postgresql/<version>/bin`.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MCPFW_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut best: Option<(u32, PathBuf)> = None;
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        for e in entries.flatten() {
            let Some(version) = e.file_name().to_str().and_then(|v| v.parse::<u32>().ok()) else {
                continue;
            };
            let bin = e.path().join("bin");
            if bin.join("postgres").exists() && best.as_ref().is_none_or(|(v, _)| version > *v) {
                best = Some((version, bin));
            }
        }
    }
    match best {
        Some((_, bin)) => bin,
        None => panic!(
            "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin: install them with \
             `apt-get install postgresql` (Debian 12: PostgreSQL 15), or set MCPFW_PG_BIN \
             to the directory holding initdb, postgres, psql and pg_isready"
        ),
    }
}

/// Whether we run as root (`/proc/self` belongs to the effective uid).
fn is_root() -> bool {
    match std::fs::metadata("/proc/self") {
        Ok(m) => m.uid() == 0,
        Err(_) => Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false),
    }
}

/// uid and gid of the `postgres` user.
fn postgres_user() -> Result<(u32, u32), String> {
    let id = |flag: &str| -> Result<u32, String> {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .map_err(|e| format!("running `id {flag} postgres` failed: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| "there is no `postgres` user".to_owned())
    };
    Ok((id("-u")?, id("-g")?))
}

/// Pids whose parent is `pid` (from `/proc/*/stat`).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// Whether `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Sends `signal` with the shell's builtin `kill` (no procps needed).
fn sh_kill(signal: &str, pids: &[u32]) -> std::io::Result<()> {
    if pids.is_empty() {
        return Ok(());
    }
    let pids: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    Command::new("sh")
        .arg("-c")
        .arg(format!("kill -{signal} \"$@\" 2>/dev/null; true"))
        .arg("sh")
        .args(&pids)
        .status()
        .map(|_| ())
}
