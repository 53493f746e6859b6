//! Idle client connections held open to a target while a load runs (the
//! scale scenario): how much a proxy pays for connections that do nothing.
//!
//! Each connection is plain TCP to the target, sends one cheap request over
//! HTTP/1.1 keep-alive (a JSON-RPC `ping` on the JSON route, with a token and
//! the revision header, so every target answers it as a request it serves),
//! reads the whole answer, and then stays silent. The harness then holds the
//! bare socket (hyper's buffers are dropped with the client connection) and,
//! when the round ends, asks each socket whether the target still keeps it
//! open ([`Idle::check`]): a target that closes idle connections (a header
//! read timeout, a connection cap) shows up as connections not held.
//!
//! Invariants:
//! - at most [`Spec::parallel`] connections are being opened at once, so a
//!   target's accept backlog never overflows (which would turn into SYN
//!   retries of a second or more);
//! - nothing is read from or written to a held socket after its answer: the
//!   check only peeks, without blocking;
//! - dropping an [`Idle`] closes every socket normally (FIN), so the target
//!   sees clean closes, not resets.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// What to open.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The target (plain TCP).
    pub addr: SocketAddr,
    /// The request path of the one request.
    pub path: &'static str,
    /// Its JSON-RPC body.
    pub body: Bytes,
    /// `Authorization` value.
    pub token: HeaderValue,
    /// `MCP-Protocol-Version` value.
    pub version: HeaderValue,
    /// How many connections.
    pub count: usize,
    /// Most connections being opened at once.
    pub parallel: usize,
    /// Longest one connection may take to connect and be answered.
    pub timeout: Duration,
}

/// Connections held open, and why the others are not.
#[derive(Debug, Default)]
pub struct Idle {
    /// How many were asked for.
    pub wanted: u64,
    /// Sockets whose request was answered with 200, held since.
    conns: Vec<std::net::TcpStream>,
    /// Why the others failed, by kind.
    pub errors: BTreeMap<String, u64>,
}

/// The state of the held sockets at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Still open (nothing to read, no end of stream).
    pub open: u64,
    /// Closed or reset by the target, or sent something unasked, by kind.
    pub lost: BTreeMap<String, u64>,
}

// === impl Idle ===

impl Idle {
    /// Opens `spec.count` connections, each answered once, and holds them.
    pub async fn open(spec: &Spec) -> Idle {
        let spec = Arc::new(spec.clone());
        let next = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::with_capacity(spec.parallel.max(1));
        for _ in 0..spec.parallel.clamp(1, spec.count.max(1)) {
            let spec = spec.clone();
            let next = next.clone();
            workers.push(tokio::spawn(async move {
                let mut conns = Vec::new();
                let mut errors: BTreeMap<String, u64> = BTreeMap::new();
                while next.fetch_add(1, Ordering::Relaxed) < spec.count {
                    match tokio::time::timeout(spec.timeout, open_one(&spec)).await {
                        Ok(Ok(c)) => conns.push(c),
                        Ok(Err(e)) => *errors.entry(e).or_default() += 1,
                        Err(_) => *errors.entry("timeout".to_owned()).or_default() += 1,
                    }
                }
                (conns, errors)
            }));
        }
        let mut idle = Idle {
            wanted: spec.count as u64,
            conns: Vec::with_capacity(spec.count),
            errors: BTreeMap::new(),
        };
        for w in workers {
            match w.await {
                Ok((conns, errors)) => {
                    idle.conns.extend(conns);
                    for (k, v) in errors {
                        *idle.errors.entry(k).or_default() += v;
                    }
                }
                Err(_) => *idle.errors.entry("opener failed".to_owned()).or_default() += 1,
            }
        }
        idle
    }

    /// How many were opened and answered.
    pub fn opened(&self) -> u64 {
        self.conns.len() as u64
    }

    /// Which held sockets are still open now (a peek that would block).
    pub fn check(&self) -> Held {
        let mut held = Held::default();
        let mut byte = [0u8; 1];
        for c in &self.conns {
            let lost = match c.peek(&mut byte) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    held.open += 1;
                    continue;
                }
                Ok(0) => "closed by the target".to_owned(),
                Ok(_) => "the target sent data unasked".to_owned(),
                Err(e) => format!("socket error: {:?}", e.kind()),
            };
            *held.lost.entry(lost).or_default() += 1;
        }
        held
    }
}

/// Connects, sends the one request, reads the answer, and hands back the
/// bare socket (non-blocking, out of the runtime's reactor).
async fn open_one(spec: &Spec) -> Result<std::net::TcpStream, String> {
    let tcp = TcpStream::connect(spec.addr)
        .await
        .map_err(|e| format!("connect: {:?}", e.kind()))?;
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) = http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
        .await
        .map_err(|_| "http handshake".to_owned())?;
    let mut req = Request::new(Full::new(spec.body.clone()));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = http::Uri::from_static(spec.path);
    let h = req.headers_mut();
    if let Ok(host) = HeaderValue::from_str(&spec.addr.to_string()) {
        h.insert(HOST, host);
    }
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(
        ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    h.insert(AUTHORIZATION, spec.token.clone());
    h.insert("mcp-protocol-version", spec.version.clone());
    let exchange = async move {
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        resp.into_body().collect().await?;
        // Dropping the sender lets the connection hand back its socket.
        drop(sender);
        Ok::<u16, hyper::Error>(status)
    };
    let (parts, status) = tokio::join!(conn.without_shutdown(), exchange);
    let status = status.map_err(|e| format!("request: {e}"))?;
    if status != 200 {
        return Err(format!("http {status}"));
    }
    let parts = parts.map_err(|e| format!("connection: {e}"))?;
    if !parts.read_buf.is_empty() {
        return Err("the target sent more than its answer".to_owned());
    }
    parts
        .io
        .into_inner()
        .into_std()
        .map_err(|e| format!("socket: {:?}", e.kind()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::upstream::{self, Answers};

    #[tokio::test]
    async fn idle_connections_stay_open_until_the_target_closes_them() {
        let answers = Arc::new(Answers::new(
            &Catalog::new(20, 310).unwrap(),
            Duration::ZERO,
        ));
        let (stop, rx) = tokio::sync::watch::channel(false);
        let (listener, addr) = upstream::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let server = tokio::spawn(upstream::serve(listener, None, answers, rx));
        let spec = Spec {
            addr,
            path: upstream::ROUTE_JSON,
            body: crate::scenario::ping_body(),
            token: HeaderValue::from_static("Bearer none"),
            version: HeaderValue::from_static(crate::scenario::REVISION),
            count: 40,
            parallel: 8,
            timeout: Duration::from_secs(5),
        };
        let idle = Idle::open(&spec).await;
        assert_eq!(idle.wanted, 40);
        assert_eq!(idle.opened(), 40, "{:?}", idle.errors);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let held = idle.check();
        assert_eq!(held.open, 40, "{:?}", held.lost);
        // A route the upstream does not know: 404, not held.
        let bad = Idle::open(&Spec {
            path: "/nope",
            count: 3,
            ..spec.clone()
        })
        .await;
        assert_eq!(bad.opened(), 0);
        assert_eq!(bad.errors.get("http 404"), Some(&3), "{:?}", bad.errors);
        // Nothing listening: every connect fails, nothing is held.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = l.local_addr().unwrap();
        drop(l);
        let none = Idle::open(&Spec {
            addr: closed,
            count: 2,
            ..spec
        })
        .await;
        assert_eq!(none.opened(), 0);
        assert_eq!(none.errors.values().sum::<u64>(), 2, "{:?}", none.errors);
        // The upstream leaves open connections alone when it stops
        // accepting; closing the sockets on our side ends them.
        let _ = stop.send(true);
        let _ = server.await;
        drop(idle);
    }

    #[test]
    fn a_socket_closed_by_the_peer_is_not_held() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        client.set_nonblocking(true).unwrap();
        let idle = Idle {
            wanted: 1,
            conns: vec![client],
            errors: BTreeMap::new(),
        };
        assert_eq!(idle.check().open, 1);
        drop(server);
        std::thread::sleep(Duration::from_millis(50));
        let held = idle.check();
        assert_eq!(held.open, 0);
        assert_eq!(held.lost.get("closed by the target"), Some(&1));
    }
}
