//! Minimal synchronous HTTP/1.0 exchanges for the harness's control plane:
//! readiness probes, the firewall's `/metrics`, ClickHouse queries.
//!
//! Deliberately independent of the load generator and of the code under
//! test: a plain `TcpStream`, one request per connection, the server closes
//! after the body. Never used on a measured path.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Connecting, writing or reading failed.
    #[error("HTTP exchange with {addr}: {source}")]
    Io {
        /// The server.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The answer has no parsable status line.
    #[error("no HTTP status line from {addr}")]
    NoStatus {
        /// The server.
        addr: SocketAddr,
    },
}

/// One HTTP/1.0 exchange; returns the status and the body as text.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<(u16, String), ProbeError> {
    let io = |source| ProbeError::Io { addr, source };
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).map_err(io)?;
    s.write_all(body).map_err(io)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(ProbeError::NoStatus { addr })?;
    Ok((status, body.to_owned()))
}

/// Polls `GET path` until it answers 200 or `deadline` passes; `alive` is
/// asked between attempts and stops the wait early when it says no.
pub fn wait_ready(
    addr: SocketAddr,
    path: &str,
    deadline: Duration,
    mut alive: impl FnMut() -> bool,
) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if let Ok((200, _)) = http(addr, "GET", path, b"", Duration::from_secs(2)) {
            return true;
        }
        if !alive() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_listening(
    addr: SocketAddr,
    deadline: Duration,
    mut alive: impl FnMut() -> bool,
) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        if !alive() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The value of an OpenMetrics sample line `name value` (no labels).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_lines_are_found_by_exact_name() {
        let text = "# TYPE audit_rows_queued counter\naudit_rows_queued_total 42\naudit_rows_queued_total_x 1\naudit_spool_bytes 7.5\n";
        assert_eq!(metric(text, "audit_rows_queued_total"), Some(42.0));
        assert_eq!(metric(text, "audit_spool_bytes"), Some(7.5));
        assert_eq!(metric(text, "audit_rows_sent_total"), None);
    }

    #[test]
    fn exchange_reads_status_and_body_from_a_real_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"GET /x HTTP/1.0\r\n"));
            s.write_all(b"HTTP/1.0 418 I'm a teapot\r\n\r\nshort and stout")
                .unwrap();
        });
        let (status, body) = http(addr, "GET", "/x", b"", Duration::from_secs(5)).unwrap();
        server.join().unwrap();
        assert_eq!(status, 418);
        assert_eq!(body, "short and stout");
    }
}
