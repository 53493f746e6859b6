//! A throwaway ClickHouse for `mcp-firewall demo`: when a `clickhouse-server`
//! binary is on the machine, one is started on free loopback ports with its
//! data in a directory of the demo's, so the demo audits into a real
//! ClickHouse; it is killed and its directory removed when the demo ends.
//!
//! The same recipe as the tests' and the bench's (the shipped
//! `config/clickhouse/throwaway-server.xml`), for a person, not a harness:
//! absent binary or a server that does not come up is `None` with the reason,
//! and the demo carries on with the local spool.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The shipped throwaway-server config (placeholders `@DIR@`, `@HTTP_PORT@`,
/// `@TCP_PORT@`).
const SERVER_XML: &str = include_str!("../../config/clickhouse/throwaway-server.xml");

/// Its users: a passwordless `default` on loopback.
const USERS_XML: &str = include_str!("../../config/clickhouse/throwaway-users.xml");

/// A running throwaway server; stopped and removed on drop.
pub struct ThrowawayClickHouse {
    /// `http://127.0.0.1:PORT`.
    pub http_url: String,
    /// The native-protocol port (`clickhouse-client --port`).
    pub tcp_port: u16,
    child: Child,
    dir: PathBuf,
}

impl Drop for ThrowawayClickHouse {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server binary and its leading arguments, if installed.
fn server_command() -> Option<(PathBuf, Vec<&'static str>)> {
    if let Ok(bin) = std::env::var("MCPFW_CLICKHOUSE_BIN") {
        return Some((PathBuf::from(bin), Vec::new()));
    }
    for p in ["/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server"] {
        if Path::new(p).exists() {
            return Some((PathBuf::from(p), Vec::new()));
        }
    }
    super::on_path("clickhouse").map(|p| (p, vec!["server"]))
}

impl ThrowawayClickHouse {
    /// Starts one with its data in `dir` (created; removed on drop), or
    /// says why not.
    pub fn start(dir: PathBuf) -> Result<ThrowawayClickHouse, String> {
        let (program, lead) =
            server_command().ok_or_else(|| "clickhouse-server is not installed".to_owned())?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("a directory for ClickHouse ({}): {e}", dir.display()))?;
        let (http_port, tcp_port) = free_ports().map_err(|e| format!("free ports: {e}"))?;
        for sub in ["data", "tmp", "log", "user_files", "format_schemas"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
        }
        let config = SERVER_XML
            .replace("@DIR@", &dir.display().to_string())
            .replace("@HTTP_PORT@", &http_port.to_string())
            .replace("@TCP_PORT@", &tcp_port.to_string());
        let config_path = dir.join("config.xml");
        std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("users.xml"), USERS_XML).map_err(|e| e.to_string())?;
        let child = Command::new(&program)
            .args(&lead)
            .arg(format!("--config-file={}", config_path.display()))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", program.display()))?;
        let mut ch = ThrowawayClickHouse {
            http_url: format!("http://127.0.0.1:{http_port}"),
            tcp_port,
            child,
            dir: dir.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if ping(http_port) {
                return Ok(ch);
            }
            if let Ok(Some(status)) = ch.child.try_wait() {
                return Err(format!("clickhouse-server exited with {status}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err("clickhouse-server did not answer /ping within 30 s".to_owned())
    }
}

fn free_ports() -> std::io::Result<(u16, u16)> {
    let a = TcpListener::bind("127.0.0.1:0")?;
    let b = TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"GET /ping HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.") && buf.contains("Ok.")
}
