//! The `mcp-demo-upstream` binary as `mcp-firewall demo` and the compose file
//! use it: it says where it listens on its first stdout line, answers MCP
//! there, and stops when its standard input closes.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One HTTP/1.1 POST of `body` to `url` (`http://host:port/path`); the
/// response's status line and body.
fn post(url: &str, body: &str) -> std::io::Result<String> {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = TcpStream::connect(host)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "POST /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: server/discover\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[test]
fn it_says_where_it_listens_serves_mcp_there_and_stops_with_its_stdin() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-demo-upstream"))
        .args(["--listen", "127.0.0.1:0", "--exit-with-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line: {first:?}"))
        .to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );
    let discover = r#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    let answer = post(&url, discover).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("serverInfo"), "{answer}");
    // Closing stdin stops it, and the port stops answering.
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "still running after stdin closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    assert!(post(&url, discover).is_err(), "the port still answers");
}

#[test]
fn a_bad_listen_address_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-demo-upstream"))
        .args(["--listen", "not-an-address"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--listen"), "{err}");
}
