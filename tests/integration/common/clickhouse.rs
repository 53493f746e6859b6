//! Throwaway ClickHouse servers for integration tests: a real `clickhouse-server`
//! (Debian's 18.16 `/usr/sbin/clickhouse-server`, or `clickhouse server` from a
//! current release, or `$MCPFW_CLICKHOUSE_BIN`) in a temp dir, listening on
//! 127.0.0.1 only, on ports picked at runtime, with a passwordless `default` user.
//!
//! [`ClickHouse::shared`] gives one server per test binary (starting one takes
//! seconds); tests isolate themselves with [`ClickHouse::create_database`].
//! [`ClickHouse::start`] gives a dedicated server for tests that stop and restart
//! it. Besides the passwordless `default` user there is `inserter` (password
//! [`INSERTER_PASSWORD`], no DDL allowed) for least-privilege tests.
//! Invariant: no server outlives the test process: a dedicated server is
//! killed on drop, and every server has a watchdog shell that kills it (and
//! removes its directory) once the test process is gone, even after a SIGKILL.
//!
//! Queries go over plain HTTP/1.0 on a std `TcpStream`: synchronous, so usable
//! from sync and async tests alike, and independent of the code under test.
//! Starting and stopping wait for the server, so they are async: a wait never
//! puts the test's runtime thread to sleep.

// Each test binary uses a subset of this shared harness.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use std::time::{Duration, Instant};
use tokio::sync::OnceCell;

/// A running (or stopped) test ClickHouse server.
pub struct ClickHouse {
    /// `http://127.0.0.1:PORT`
    pub http_url: String,
    /// HTTP interface port.
    pub http_port: u16,
    /// Native protocol port (for `clickhouse-client --port`).
    pub tcp_port: u16,
    dir: PathBuf,
    server: Mutex<Option<Child>>,
    watchdog: Mutex<Option<Child>>,
}

/// Password of the `inserter` user (profile with `allow_ddl = 0`).
pub const INSERTER_PASSWORD: &str = "inserter-pw";

/// How long a server gets to answer `/ping` after spawning.
const START_TIMEOUT: Duration = Duration::from_secs(60);

impl ClickHouse {
    /// The server shared by all tests of this binary, started on first use.
    pub async fn shared() -> &'static ClickHouse {
        static SHARED: OnceCell<ClickHouse> = OnceCell::const_new();
        SHARED.get_or_init(ClickHouse::start).await
    }

    /// Starts a dedicated server (killed when dropped).
    pub async fn start() -> ClickHouse {
        let mut last_err = String::new();
        // Ports are probed then released, so another process may grab one in
        // between: retry with fresh ports.
        for _ in 0..3 {
            let (http_port, tcp_port) = free_ports();
            let dir = std::env::temp_dir().join(format!(
                "mcpfw-clickhouse-{}-{}",
                std::process::id(),
                rand::random::<u32>()
            ));
            write_config(&dir, http_port, tcp_port);
            let ch = ClickHouse {
                http_url: format!("http://127.0.0.1:{http_port}"),
                http_port,
                tcp_port,
                dir,
                server: Mutex::new(None),
                watchdog: Mutex::new(None),
            };
            match ch.spawn().await {
                Ok(()) => return ch,
                Err(e) => last_err = e,
            }
        }
        panic!("could not start clickhouse-server: {last_err}");
    }

    /// Starts the server again after [`ClickHouse::stop`], same ports and data.
    pub async fn resume(&self) {
        if let Err(e) = self.spawn().await {
            panic!("could not restart clickhouse-server: {e}");
        }
    }

    async fn spawn(&self) -> Result<(), String> {
        let (program, args) = server_command();
        let config = self.dir.join("config.xml");
        let mut cmd = Command::new(&program);
        cmd.args(&args)
            .arg(format!("--config-file={}", config.display()))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.join("log/stderr.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            );
        let mut child = cmd.spawn().map_err(|e| {
            format!(
                "spawning {program}: {e} (install Debian's clickhouse-server, \
                 or set MCPFW_CLICKHOUSE_BIN)"
            )
        })?;
        let pid = child.id();
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(
                "while kill -0 \"$0\" 2>/dev/null; do sleep 1; done; \
                 kill -9 \"$1\" 2>/dev/null; sleep 1; rm -rf \"$2\"",
            )
            .arg(std::process::id().to_string())
            .arg(pid.to_string())
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawning watchdog: {e}"))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok((200, body)) = http(self.http_port, "GET", "/ping", b"") {
                if body.starts_with("Ok") {
                    break;
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut wd = watchdog;
                let _ = wd.kill();
                let _ = wd.wait();
                return Err(format!(
                    "clickhouse-server exited with {status}; log:\n{}",
                    self.log_tail()
                ));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let mut wd = watchdog;
                let _ = wd.kill();
                let _ = wd.wait();
                return Err(format!(
                    "no /ping answer in time; log:\n{}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        *self.server.lock().unwrap() = Some(child);
        if let Some(mut old) = self.watchdog.lock().unwrap().replace(watchdog) {
            let _ = old.kill();
            let _ = old.wait();
        }
        Ok(())
    }

    /// Stops the server (SIGTERM, then SIGKILL after 10 s) and waits for it.
    pub async fn stop(&self) {
        let Some(mut child) = self.server.lock().unwrap().take() else {
            return;
        };
        // The shell's builtin `kill`: no dependency on a procps binary.
        let _ = Command::new("sh")
            .arg("-c")
            .arg("kill -TERM \"$0\"")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the server at once (SIGKILL), like a crash or a pulled cable.
    pub fn kill(&self) {
        if let Some(mut child) = self.server.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs `sql`, returning the response body; panics with ClickHouse's error.
    pub fn query(&self, sql: &str) -> String {
        match self.try_query(sql) {
            Ok(body) => body,
            Err(e) => panic!("query failed: {sql}\n{e}"),
        }
    }

    /// Runs `sql`; `Err` carries the status and error text.
    pub fn try_query(&self, sql: &str) -> Result<String, String> {
        // 18.x needs the opt-in to create LowCardinality columns; later releases
        // dropped the setting.
        static PATH: OnceLock<&'static str> = OnceLock::new();
        let path = *PATH.get_or_init(|| {
            match http(self.http_port, "GET", "/?query=SELECT%20version()", b"") {
                Ok((200, v)) if v.starts_with("18.") => {
                    "/?allow_experimental_low_cardinality_type=1"
                }
                _ => "/",
            }
        });
        match http(self.http_port, "POST", path, sql.as_bytes()) {
            Ok((200, body)) => Ok(body),
            Ok((status, body)) => Err(format!("HTTP {status}: {body}")),
            Err(e) => Err(format!("connection: {e}")),
        }
    }

    /// The `RowBinary` answer of `sql`.
    pub async fn fetch_rowbinary(&self, sql: &str) -> Vec<u8> {
        let resp = crate::common::http()
            .post(&self.http_url)
            .body(format!("{sql} FORMAT RowBinary"))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{sql}");
        resp.bytes().await.unwrap().to_vec()
    }

    /// Inserts `body` (`RowBinary` of `columns`) into `db.table`.
    pub async fn insert_rowbinary(&self, db: &str, table: &str, columns: &[&str], body: Vec<u8>) {
        let sql = format!(
            "INSERT INTO {db}.{table} ({}) FORMAT RowBinary",
            columns.join(", ")
        );
        let query: String = sql
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let resp = crate::common::http()
            .post(format!("{}/?query={query}", self.http_url))
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        assert!(status.is_success(), "{sql}: {}", resp.text().await.unwrap());
    }

    /// Runs `sql` and parses its single numeric result.
    pub fn query_u64(&self, sql: &str) -> u64 {
        let out = self.query(sql);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("not a number from {sql}: {out:?}"))
    }

    /// Creates a database with a random name and returns the name.
    pub fn create_database(&self) -> String {
        let name = format!("t_{:016x}", rand::random::<u64>());
        self.query(&format!("CREATE DATABASE {name}"));
        name
    }

    /// Last lines of the server's logs, for failure messages.
    pub fn log_tail(&self) -> String {
        let mut out = String::new();
        for f in ["log/err.log", "log/stderr.log"] {
            if let Ok(text) = std::fs::read_to_string(self.dir.join(f)) {
                let lines: Vec<&str> = text.lines().collect();
                let from = lines.len().saturating_sub(20);
                out.push_str(&lines[from..].join("\n"));
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        self.kill();
        if let Some(mut wd) = self.watchdog.lock().unwrap().take() {
            let _ = wd.kill();
            let _ = wd.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server binary and leading arguments.
/// The audit table's `CREATE TABLE` as a release whose rows ended at
/// column `last` made it: the shipped schema without the columns added
/// after it (what the firewall's migration must add back).
pub fn audit_table_ending_at(database: &str, table: &str, last: &str) -> String {
    let head = format!("CREATE TABLE IF NOT EXISTS {database}.{table}\n");
    let create = mcp_firewall::audit::schema_statements(database, table)
        .into_iter()
        .find(|s| s.starts_with(&head))
        .expect("the audit table's CREATE TABLE");
    let mut out = Vec::new();
    let mut dropping = false;
    for line in create.lines() {
        if line.starts_with(')') {
            dropping = false;
        }
        if dropping {
            continue;
        }
        if line.split_whitespace().next() == Some(last) {
            out.push(line.trim_end_matches(','));
            dropping = true;
            continue;
        }
        out.push(line);
    }
    let sql = out.join("\n");
    assert!(sql.contains(last), "no column {last} in {create}");
    sql
}

fn server_command() -> (String, Vec<String>) {
    if let Ok(bin) = std::env::var("MCPFW_CLICKHOUSE_BIN") {
        return (bin, Vec::new());
    }
    if Path::new("/usr/sbin/clickhouse-server").exists() {
        return ("/usr/sbin/clickhouse-server".into(), Vec::new());
    }
    if Path::new("/usr/bin/clickhouse-server").exists() {
        return ("/usr/bin/clickhouse-server".into(), Vec::new());
    }
    ("clickhouse".into(), vec!["server".into()])
}

/// Two distinct free ports (both listeners are held until both are known).
fn free_ports() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").expect("no free port");
    let b = TcpListener::bind("127.0.0.1:0").expect("no free port");
    let port = |l: &TcpListener| l.local_addr().expect("bound socket").port();
    (port(&a), port(&b))
}

fn write_config(dir: &Path, http_port: u16, tcp_port: u16) {
    for sub in ["data", "tmp", "log", "user_files", "format_schemas"] {
        std::fs::create_dir_all(dir.join(sub)).expect("create clickhouse dir");
    }
    let config = include_str!("../../../config/clickhouse/throwaway-server.xml")
        .replace("@DIR@", &dir.display().to_string())
        .replace("@HTTP_PORT@", &http_port.to_string())
        .replace("@TCP_PORT@", &tcp_port.to_string());
    let users = r#"<?xml version="1.0"?>
<yandex>
  <profiles>
    <default></default>
    <insert_only><allow_ddl>0</allow_ddl></insert_only>
  </profiles>
  <users>
    <default>
      <password></password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
    <inserter>
      <password>inserter-pw</password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>insert_only</profile>
      <quota>default</quota>
    </inserter>
  </users>
  <quotas><default></default></quotas>
</yandex>
"#;
    std::fs::write(dir.join("config.xml"), config).expect("write config.xml");
    std::fs::write(dir.join("users.xml"), users).expect("write users.xml");
}

/// Minimal HTTP/1.0 exchange: the server closes the connection after the body.
fn http(port: u16, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

/// `mcp-firewall audit <command>` against `db` (as `--json` lines or the
/// table people read), with `config` when the command needs one.
pub async fn audit_cli(
    ch: &ClickHouse,
    db: &str,
    config: Option<std::path::PathBuf>,
    json: bool,
    command: mcp_firewall::cli::audit::AuditCommand,
) -> String {
    let args = mcp_firewall::cli::audit::AuditArgs {
        config,
        clickhouse: Some(ch.http_url.clone()),
        database: Some(db.to_owned()),
        table: None,
        user: None,
        password_env: None,
        spool: None,
        json,
        command,
    };
    let mut out = Vec::new();
    mcp_firewall::cli::audit::run(&args, &mut out)
        .await
        .expect("the audit command");
    String::from_utf8(out).expect("UTF-8 output")
}
