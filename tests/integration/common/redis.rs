//! Throwaway Redis servers for integration tests: a real `redis-server`
//! (Debian's `/usr/bin/redis-server`, or `$MCPFW_REDIS_BIN`) in a temp dir,
//! listening on 127.0.0.1 only, on a port picked at runtime, with no
//! persistence (`save ""`, `appendonly no`) and no password.
//!
//! [`Redis::shared`] gives one server per test binary; tests sharing it
//! isolate themselves with distinct key prefixes. [`Redis::start`] gives a
//! dedicated server for tests that [`Redis::stop`] (SIGKILL: a crash) and
//! [`Redis::resume`] it on the same port. As there is no persistence, a
//! resumed server starts empty.
//! Invariant: no server outlives the test process: a dedicated server is
//! killed on drop, and every server has a watchdog shell that kills it (and
//! removes its directory) once the test process is gone, even after a SIGKILL.
//! The watchdog notices through a pipe: its stdin's write end lives in the test
//! process, so the kernel closes it however that process ends.
//!
//! Commands go over RESP on a std `TcpStream` ([`Redis::command`]):
//! synchronous, so usable from sync and async tests alike, and independent of
//! the code under test. Starting and stopping wait for the server, so they
//! are async: a wait never puts the test's runtime thread to sleep.

// Each test binary uses a subset of this shared harness.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use std::time::{Duration, Instant};
use tokio::sync::OnceCell;

/// A running (or stopped) test Redis server.
pub struct Redis {
    /// `redis://127.0.0.1:PORT`
    pub url: String,
    /// TCP port.
    pub port: u16,
    dir: PathBuf,
    server: Mutex<Option<Child>>,
    watchdog: Mutex<Option<Child>>,
}

/// How long a server gets to answer `PING` after spawning.
const START_TIMEOUT: Duration = Duration::from_secs(60);

impl Redis {
    /// The server shared by all tests of this binary, started on first use.
    pub async fn shared() -> &'static Redis {
        static SHARED: OnceCell<Redis> = OnceCell::const_new();
        SHARED.get_or_init(Redis::start).await
    }

    /// Starts a dedicated server (killed when dropped).
    pub async fn start() -> Redis {
        let mut last_err = String::new();
        // Ports are probed then released, so another process may grab one in
        // between: retry with fresh ports.
        for _ in 0..3 {
            let port = super::watchdog::free_port();
            let dir = std::env::temp_dir().join(format!(
                "mcpfw-redis-{}-{}",
                std::process::id(),
                rand::random::<u32>()
            ));
            std::fs::create_dir_all(&dir).expect("create redis dir");
            let redis = Redis {
                url: format!("redis://127.0.0.1:{port}"),
                port,
                dir,
                server: Mutex::new(None),
                watchdog: Mutex::new(None),
            };
            // Dropping `redis` on failure kills what was started and removes
            // the directory.
            if let Err(e) = redis.write_config().and_then(|()| redis.spawn_watchdog()) {
                panic!("could not start redis-server: {e}");
            }
            match redis.spawn().await {
                Ok(()) => return redis,
                Err(e) => last_err = e,
            }
        }
        panic!("could not start redis-server: {last_err}");
    }

    /// Kills the server at once (SIGKILL), like a crash, and waits until its
    /// port refuses connections. The directory is kept for [`Redis::resume`].
    pub async fn stop(&self) {
        let Some(mut child) = self.server.lock().unwrap().take() else {
            return;
        };
        // The whole process group: a BGSAVE child too. The shell's builtin
        // `kill`: no dependency on a procps binary.
        let _ = Command::new("sh")
            .arg("-c")
            .arg("kill -9 \"-$0\" 2>/dev/null; kill -9 \"$0\" 2>/dev/null")
            .arg(child.id().to_string())
            .status();
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(self.dir.join("harness.pid"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            if Instant::now() > deadline {
                panic!(
                    "redis port {} still accepts connections after SIGKILL",
                    self.port
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the server again after [`Redis::stop`], on the same port and
    /// directory (with no persistence it starts empty). No-op when running.
    pub async fn resume(&self) {
        if self.is_running() {
            return;
        }
        let mut last_err = String::new();
        // A just-closed socket or a racing process may hold the port briefly.
        for _ in 0..5 {
            match self.spawn().await {
                Ok(()) => return,
                Err(e) => last_err = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "could not restart redis-server on port {}: {last_err}",
            self.port
        );
    }

    /// Whether the server process is alive (it may still be starting).
    pub fn is_running(&self) -> bool {
        match self.server.lock().unwrap().as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends one command (`["SET", "k", "v"]`) and returns the raw RESP reply,
    /// e.g. `+OK\r\n`, `$1\r\nv\r\n`, `$-1\r\n`, `:1\r\n`, `-ERR ...\r\n` or a
    /// `*N\r\n...` array. Panics when the server cannot be reached.
    pub fn command(&self, args: &[&str]) -> String {
        match self.try_command(args) {
            Ok(reply) => reply,
            Err(e) => panic!(
                "redis command {args:?} on port {} failed: {e}; log:\n{}",
                self.port,
                self.log_tail()
            ),
        }
    }

    /// [`Redis::command`], with `Err` for connection failures (outage tests).
    pub fn try_command(&self, args: &[&str]) -> std::io::Result<String> {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a.as_bytes());
            req.extend_from_slice(b"\r\n");
        }
        let s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_write_timeout(Some(Duration::from_secs(30)))?;
        (&s).write_all(&req)?;
        let mut reader = BufReader::new(&s);
        let mut raw = Vec::new();
        read_reply(&mut reader, &mut raw)?;
        Ok(String::from_utf8_lossy(&raw).into_owned())
    }

    /// Last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(20);
        lines[from..].join("\n")
    }

    fn write_config(&self) -> Result<(), String> {
        let config = format!(
            "bind 127.0.0.1\n\
             port {}\n\
             dir \"{}\"\n\
             save \"\"\n\
             appendonly no\n\
             protected-mode yes\n\
             daemonize no\n\
             logfile \"\"\n",
            self.port,
            self.dir.display()
        );
        std::fs::write(self.dir.join("redis.conf"), config)
            .map_err(|e| format!("writing redis.conf: {e}"))
    }

    /// One watchdog per server, for its whole life (it reads the current pid
    /// from `harness.pid`, so it survives stop/resume).
    fn spawn_watchdog(&self) -> Result<(), String> {
        let wd = super::watchdog::spawn(super::watchdog::KILL_GROUP, &self.dir)?;
        *self.watchdog.lock().unwrap() = Some(wd);
        Ok(())
    }

    async fn spawn(&self) -> Result<(), String> {
        let program = server_binary();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))
            .map_err(|e| format!("opening redis.log: {e}"))?;
        let log2 = log.try_clone().map_err(|e| format!("redis.log: {e}"))?;
        let mut child = Command::new(&program)
            .arg(self.dir.join("redis.conf"))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            // Its own group, so that the watchdog can kill forks (BGSAVE) too.
            .process_group(0)
            .spawn()
            .map_err(|e| {
                format!(
                    "spawning {program}: {e} (install it with \
                     `apt-get install redis-server`, or set MCPFW_REDIS_BIN)"
                )
            })?;
        std::fs::write(self.dir.join("harness.pid"), child.id().to_string())
            .map_err(|e| format!("writing harness.pid: {e}"))?;
        let port = self.port;
        crate::common::watchdog::until_ready(
            &mut child,
            &self.dir,
            &format!("PONG on port {port} (redis-server)"),
            START_TIMEOUT,
            Duration::from_millis(20),
            || std::future::ready(ping(port)),
            || self.log_tail(),
        )
        .await?;
        *self.server.lock().unwrap() = Some(child);
        Ok(())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(mut child) = self.server.lock().unwrap().take() {
            let _ = Command::new("sh")
                .arg("-c")
                .arg("kill -9 \"-$0\" 2>/dev/null")
                .arg(child.id().to_string())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.dir.join("harness.pid"));
        // Closing its stdin makes the watchdog remove the directory.
        if let Some(mut wd) = self.watchdog.lock().unwrap().take() {
            drop(wd.stdin.take());
            let _ = wd.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server binary.
fn server_binary() -> String {
    if let Ok(bin) = std::env::var("MCPFW_REDIS_BIN") {
        return bin;
    }
    for p in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] {
        if Path::new(p).exists() {
            return p.into();
        }
    }
    "redis-server".into()
}

/// Whether a raw `PING` gets `+PONG`.
fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(1),
    ) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    let mut got = Vec::new();
    while got.len() < 7 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got.starts_with(b"+PONG")
}

/// Reads one complete RESP2/RESP3 reply, appending its raw bytes to `out`.
fn read_reply(r: &mut impl BufRead, out: &mut Vec<u8>) -> std::io::Result<()> {
    let start = out.len();
    let n = r.read_until(b'\n', out)?;
    if n == 0 || !out.ends_with(b"\r\n") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed mid-reply",
        ));
    }
    let line = String::from_utf8_lossy(&out[start + 1..out.len() - 2]).into_owned();
    let count = || -> std::io::Result<i64> {
        line.trim().parse().map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad length {line:?}"),
            )
        })
    };
    match out[start] {
        // Simple string, error, integer, null, boolean, double, big number.
        b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => Ok(()),
        // Bulk string, bulk error, verbatim string: length, then data + CRLF.
        b'$' | b'!' | b'=' => {
            let len = count()?;
            if len >= 0 {
                let mut data = vec![0u8; len as usize + 2];
                r.read_exact(&mut data)?;
                out.extend_from_slice(&data);
            }
            Ok(())
        }
        // Array, set, push: N replies.
        b'*' | b'~' | b'>' => {
            for _ in 0..count()?.max(0) {
                read_reply(r, out)?;
            }
            Ok(())
        }
        // Map: N key/value pairs.
        b'%' => {
            for _ in 0..count()?.max(0) * 2 {
                read_reply(r, out)?;
            }
            Ok(())
        }
        // Attributes: N pairs, then the actual reply.
        b'|' => {
            for _ in 0..count()?.max(0) * 2 {
                read_reply(r, out)?;
            }
            read_reply(r, out)
        }
        other => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unknown RESP type byte {:?}", other as char),
        )),
    }
}
