//! A throwaway Redis for the `firewall-redis` target: a real `redis-server`
//! (Debian's `/usr/bin/redis-server`, or `$MCPFW_REDIS_BIN`) holding the
//! firewall's shared budgets and rate limits (`[state] backend = "redis"`).
//!
//! The config is written into the run's directory (`bind 127.0.0.1`, a port
//! picked at start, `save ""`, `appendonly no`, `daemonize no`, log on
//! stdout into the run's directory) and the server runs in the foreground as
//! a [`Managed`] child, so it is stopped by PID at the end of the run and
//! killed by its watchdog if the harness dies. Nothing is persisted.
//!
//! The runner reads its CPU time and peak RSS from `/proc/<pid>` over each
//! measured window, like ClickHouse's and nginx's, and its command counts
//! (`INFO commandstats`: scripts run, and every command, those run inside
//! scripts included) to show what the firewall asks of it per call.
//!
//! Invariant: nothing is written outside the given directory, and the
//! server listens on 127.0.0.1 only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::procs::{self, Managed, Placement, ProcError};

/// How long the server gets to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Why Redis could not be started or asked.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    /// No server binary was found.
    #[error("no redis-server binary (install Debian's redis-server or set MCPFW_REDIS_BIN)")]
    NotInstalled,
    /// Writing its config failed.
    #[error("writing the Redis config into {dir}: {source}")]
    Config {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Starting the process failed.
    #[error(transparent)]
    Spawn(#[from] ProcError),
    /// It did not answer `PING` in time.
    #[error("redis-server did not become ready; log tail:\n{log}")]
    NotReady {
        /// The end of its log.
        log: String,
    },
    /// A command exchange failed.
    #[error("redis command {command}: {detail}")]
    Command {
        /// The command.
        command: String,
        /// What went wrong.
        detail: String,
    },
}

/// Commands a server has executed, from `INFO commandstats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Commands {
    /// `EVALSHA`, `EVAL` and their read-only variants: one per script run.
    pub scripts: u64,
    /// Every command, those a script ran included, but the harness's own
    /// `INFO` and `PING`.
    pub all: u64,
}

/// A running throwaway server.
pub struct Redis {
    /// Its listener (127.0.0.1).
    pub addr: SocketAddr,
    /// `redis-server --version`, first line.
    pub version: String,
    process: Managed,
}

// === impl Redis ===

impl Redis {
    /// The server binary: `$MCPFW_REDIS_BIN`, else `redis-server` on `PATH`
    /// or `/usr/bin/redis-server`.
    pub fn binary() -> Option<PathBuf> {
        if let Some(bin) = std::env::var_os("MCPFW_REDIS_BIN") {
            return Some(PathBuf::from(bin));
        }
        procs::find_program("redis-server", &["/usr/bin/redis-server"])
    }

    /// Starts a server with its config and log under `dir`.
    pub fn start(dir: &Path, placement: &Placement) -> Result<Redis, RedisError> {
        let bin = Redis::binary().ok_or(RedisError::NotInstalled)?;
        let cfg_err = |source| RedisError::Config {
            dir: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(cfg_err)?;
        let version = Command::new(&bin)
            .arg("--version")
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_owned()
            })
            .unwrap_or_default();
        let mut last = None;
        // Ports are probed then released: retry with a fresh one on a clash.
        for _ in 0..3 {
            let port = procs::free_port().map_err(cfg_err)?;
            let conf = dir.join("redis.conf");
            std::fs::write(&conf, config_text(dir, port)).map_err(cfg_err)?;
            let mut cmd = Command::new(&bin);
            cmd.arg(&conf).current_dir(dir);
            let mut process = Managed::spawn("redis", cmd, &dir.join("redis.log"), placement)?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let deadline = Instant::now() + START_TIMEOUT;
            while Instant::now() < deadline && process.running() {
                if matches!(command(addr, &["PING"]), Ok(ref s) if s == "PONG") {
                    return Ok(Redis {
                        addr,
                        version,
                        process,
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let log = process.log_tail(20);
            process.stop(Duration::from_secs(2));
            last = Some(RedisError::NotReady { log });
        }
        Err(last.unwrap_or(RedisError::NotReady { log: String::new() }))
    }

    /// The URL for the firewall's `state.redis_url`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The server's PID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.process.running()
    }

    /// The end of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Commands executed so far (`INFO commandstats`).
    pub fn commands(&self) -> Result<Commands, RedisError> {
        command(self.addr, &["INFO", "commandstats"]).map(|s| commands_executed(&s))
    }

    /// Stops the server (SIGTERM, SIGKILL after 5 s).
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(5));
    }
}

/// The server config: loopback only, nothing persisted, foreground.
pub fn config_text(dir: &Path, port: u16) -> String {
    format!(
        "# Generated by mcp-bench: a throwaway Redis for one run.\n\
bind 127.0.0.1\n\
port {port}\n\
protected-mode yes\n\
daemonize no\n\
dir {dir}\n\
logfile \"\"\n\
save \"\"\n\
appendonly no\n",
        dir = dir.display()
    )
}

/// The `calls=` of `cmdstat_*` lines: script runs, and all but `info` and
/// `ping`.
pub fn commands_executed(info: &str) -> Commands {
    let mut c = Commands::default();
    for l in info.lines() {
        let Some((name, rest)) = l.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else {
            continue;
        };
        let Some(n) = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse::<u64>().ok())
        else {
            continue;
        };
        if matches!(name, "info" | "ping") {
            continue;
        }
        if matches!(name, "evalsha" | "eval" | "evalsha_ro" | "eval_ro") {
            c.scripts += n;
        }
        c.all += n;
    }
    c
}

/// One command on a fresh connection; the answer of a simple, integer or
/// bulk reply as text.
fn command(addr: SocketAddr, args: &[&str]) -> Result<String, RedisError> {
    let err = |detail: String| RedisError::Command {
        command: args.join(" "),
        detail,
    };
    let io = |e: std::io::Error| err(e.to_string());
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    s.set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes()).map_err(io)?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).map_err(io)?;
    let line = line.trim_end();
    match line.as_bytes().first() {
        Some(b'+' | b':') => Ok(line[1..].to_owned()),
        Some(b'-') => Err(err(line[1..].to_owned())),
        Some(b'$') => {
            let n: usize = line[1..]
                .parse()
                .map_err(|_| err(format!("bad bulk length {line:?}")))?;
            let mut buf = vec![0u8; n + 2];
            r.read_exact(&mut buf).map_err(io)?;
            buf.truncate(n);
            Ok(String::from_utf8_lossy(&buf).into_owned())
        }
        _ => Err(err(format!("unexpected reply {line:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_keeps_nothing_and_listens_on_loopback() {
        let text = config_text(Path::new("/run/x"), 6390);
        for line in [
            "bind 127.0.0.1\n",
            "port 6390\n",
            "save \"\"\n",
            "appendonly no\n",
            "daemonize no\n",
            "dir /run/x\n",
        ] {
            assert!(text.contains(line), "{line:?} missing:\n{text}");
        }
    }

    #[test]
    fn command_counts_leave_out_the_harness_own_questions() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=20,usec=100,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=7,usec=9\r\ncmdstat_ping:calls=2,usec=1\r\ncmdstat_script|load:calls=3,usec=4\r\ncmdstat_time:calls=20,usec=4\r\n";
        assert_eq!(
            commands_executed(info),
            Commands {
                scripts: 20,
                all: 43
            }
        );
        assert_eq!(commands_executed(""), Commands::default());
    }

    #[test]
    fn a_throwaway_server_answers_and_stops_when_installed() {
        if Redis::binary().is_none() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut r = Redis::start(dir.path(), &Placement::default()).unwrap();
        assert!(r.url().starts_with("redis://127.0.0.1:"));
        assert_eq!(command(r.addr, &["SET", "k", "v"]).unwrap(), "OK");
        assert_eq!(command(r.addr, &["GET", "k"]).unwrap(), "v");
        assert_eq!(
            command(r.addr, &["EVAL", "return redis.call('GET', 'k')", "0"]).unwrap(),
            "v"
        );
        let c = r.commands().unwrap();
        assert_eq!(c.scripts, 1);
        // SET, GET, EVAL and the GET inside it.
        assert_eq!(c.all, 4);
        assert!(procs::cpu_seconds(r.pid()).is_ok());
        let pid = r.pid();
        r.stop();
        assert!(!r.running());
        assert!(!Path::new(&format!("/proc/{pid}/stat")).exists());
        // Nothing persisted.
        assert!(!dir.path().join("dump.rdb").exists());
    }
}
