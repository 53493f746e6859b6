//! The egress proxy of a stdio upstream with a `network` allow-list: an
//! HTTP `CONNECT` proxy on a UNIX socket of the firewall. A confined server
//! lives in a network namespace of its own whose only way out is the
//! forwarder `sandbox-exec` puts on its loopback ([`crate::sandbox::net::Egress`])
//! (`127.0.0.1:3128`, named to it as `HTTPS_PROXY`/`HTTP_PROXY`), joined to
//! this socket. It admits a tunnel only to a listed `host:port` (host
//! compared case-insensitively, as written in the config); everything else
//! is refused with 403 (405 for anything but `CONNECT`), logged and
//! counted.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};

use crate::telemetry::Metrics;

/// A running egress proxy (stopped when dropped).
pub(crate) struct Egress {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Longest request head.
const MAX_HEAD: usize = 8 * 1024;
/// Time to send the head, and to connect.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A `host:port` of the allow-list, split: `None` when it is not one.
pub fn parse_pair(pair: &str) -> Option<(String, u16)> {
    let (host, port) = pair.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ok = !host.is_empty()
        && host.len() <= 253
        && (host.parse::<std::net::IpAddr>().is_ok()
            || host.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            }));
    ok.then(|| (host.to_ascii_lowercase(), port))
}

impl Egress {
    /// Starts the proxy of `upstream` admitting `allow`, on `socket`.
    pub(crate) fn start(
        upstream: &str,
        allow: &[String],
        socket: &std::path::Path,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Egress> {
        let allow: Arc<Vec<(String, u16)>> =
            Arc::new(allow.iter().filter_map(|p| parse_pair(p)).collect());
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)?;
        let name: Arc<str> = Arc::from(upstream);
        tracing::info!(upstream, socket = %socket.display(), "stdio egress proxy listening");
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let allow = allow.clone();
                let name = name.clone();
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    if let Err(e) = tunnel(conn, &allow, &name, &metrics).await {
                        tracing::debug!(upstream = %name, error = %e, "egress tunnel ended");
                    }
                });
            }
        });
        Ok(Egress { task })
    }
}

async fn tunnel(
    mut conn: impl AsyncRead + AsyncWrite + Unpin,
    allow: &[(String, u16)],
    name: &str,
    metrics: &Metrics,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let end = tokio::time::timeout(TIMEOUT, async {
        let mut buf = [0u8; 1024];
        loop {
            if let Some(i) = memchr::memmem::find(&head, b"\r\n\r\n") {
                return Ok(i + 4);
            }
            if head.len() > MAX_HEAD {
                return Err(std::io::Error::other("request head too long"));
            }
            let n = conn.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::Error::other(
                    "closed before the request head ended",
                ));
            }
            head.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .map_err(|_| std::io::Error::other("request head timed out"))??;
    let line = String::from_utf8_lossy(&head[..head.iter().position(|b| *b == b'\r').unwrap_or(0)])
        .into_owned();
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "CONNECT" {
        tracing::warn!(upstream = %name, request = %line, "stdio server's egress refused: only CONNECT tunnels are proxied");
        metrics.stdio_egress_refused(name);
        conn.write_all(
            b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await?;
        return Ok(());
    }
    let wanted = parse_pair(target);
    let admitted = wanted.as_ref().filter(|w| allow.iter().any(|a| a == *w));
    let Some((host, port)) = admitted else {
        tracing::warn!(upstream = %name, target = %target, "stdio server's egress refused: not in network allow-list");
        metrics.stdio_egress_refused(name);
        conn.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await?;
        return Ok(());
    };
    let mut out =
        match tokio::time::timeout(TIMEOUT, TcpStream::connect((host.as_str(), *port))).await {
            Ok(Ok(s)) => s,
            _ => {
                conn.write_all(
                    b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await?;
                return Ok(());
            }
        };
    tracing::info!(upstream = %name, target = %target, "stdio server's egress admitted");
    conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    if head.len() > end {
        out.write_all(&head[end..]).await?;
    }
    tokio::io::copy_bidirectional(&mut conn, &mut out).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_pairs_parse_strictly() {
        assert_eq!(
            parse_pair("API.example.com:443"),
            Some(("api.example.com".into(), 443))
        );
        assert_eq!(
            parse_pair("127.0.0.1:8080"),
            Some(("127.0.0.1".into(), 8080))
        );
        assert_eq!(parse_pair("[::1]:443"), Some(("::1".into(), 443)));
        for bad in [
            "api.example.com",
            "api.example.com:0",
            "api.example.com:70000",
            ":443",
            "a b:1",
            "x..y:1",
            "host:port",
        ] {
            assert_eq!(parse_pair(bad), None, "{bad}");
        }
    }
}
