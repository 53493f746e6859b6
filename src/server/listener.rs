//! Accepting connections: TCP, optional rustls, HTTP/1.1 and HTTP/2 (ALPN or
//! prior knowledge), and a graceful drain.
//!
//! The protocol is chosen before hyper sees a byte: from ALPN on TLS, from a
//! `peek` at the first bytes on plain TCP (the HTTP/2 preface or not). Letting
//! hyper-util's auto builder sniff instead costs 8 KiB per connection: it
//! consumes the first bytes itself and hands them back, after which hyper's
//! read buffer holds a few bytes and doubles to 16 KiB. Only a client whose
//! first packet is a cut-off preface is still left to the auto builder.
//!
//! Every connection counts against `max_connections` (past it a new one is
//! closed at once) and its writes against `write_idle` ([`WriteIdle`]): a
//! client that stops reading a stream is dropped instead of holding the
//! firewall's buffers forever.
//!
//! On shutdown the accept loop stops, every open connection is told to finish
//! its in-flight requests (HTTP/1 stops keep-alive, HTTP/2 sends GOAWAY), and
//! the listener waits for them up to the drain deadline; what is still open
//! after that is dropped.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tokio_rustls::TlsAcceptor;

use super::shards::{Placed, Spread};

/// What the request path knows about the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    /// The peer's address.
    pub remote: SocketAddr,
    /// The client's address: the peer's, or behind trusted proxies the one
    /// they name in `X-Forwarded-For` (set per request).
    pub client: std::net::IpAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
}

/// A TLS handshake that takes longer than this is abandoned (slowloris).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection that sends no request head within this is closed.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// What a client speaking HTTP/2 with prior knowledge sends first (RFC 9113,
/// section 3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a connection's first bytes announce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sniffed {
    Http1,
    Http2,
    /// A prefix of the HTTP/2 preface, cut short.
    Unsure,
}

/// Pure: which protocol `first` (the first bytes received) announces.
fn sniff(first: &[u8]) -> Sniffed {
    let n = first.len().min(H2_PREFACE.len());
    if first[..n] != H2_PREFACE[..n] {
        Sniffed::Http1
    } else if n == H2_PREFACE.len() {
        Sniffed::Http2
    } else {
        Sniffed::Unsure
    }
}

/// One builder per way a connection's protocol was settled, configured alike.
struct Builders {
    /// Lets hyper-util read the first bytes and decide (rare fallback).
    sniffing: auto::Builder<TokioExecutor>,
    http1: auto::Builder<TokioExecutor>,
    http2: auto::Builder<TokioExecutor>,
}

/// The request-head cap when none is configured (16 KiB).
pub(crate) const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;

/// The smallest request-head cap hyper's HTTP/1.1 reader can work with.
pub(crate) const MIN_MAX_HEADER_BYTES: usize = 8192;

impl Builders {
    fn new(max_header_bytes: usize) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // hyper answers 431 when a request head does not fit its read
        // buffer (HTTP/1.1) or header list (HTTP/2).
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .max_buf_size(max_header_bytes.max(MIN_MAX_HEADER_BYTES))
            .keep_alive(true);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .max_header_list_size(u32::try_from(max_header_bytes).unwrap_or(u32::MAX))
            .max_concurrent_streams(1024);
        Self {
            http1: builder.clone().http1_only(),
            http2: builder.clone().http2_only(),
            sniffing: builder,
        }
    }

    fn for_protocol(&self, sniffed: Sniffed) -> &auto::Builder<TokioExecutor> {
        match sniffed {
            Sniffed::Http1 => &self.http1,
            Sniffed::Http2 => &self.http2,
            Sniffed::Unsure => &self.sniffing,
        }
    }

    /// By ALPN; without it, by the first bytes.
    fn for_alpn(&self, alpn: Option<&[u8]>) -> &auto::Builder<TokioExecutor> {
        match alpn {
            Some(b"h2") => &self.http2,
            Some(_) => &self.http1,
            None => &self.sniffing,
        }
    }
}

/// What bounds the connections of a listener.
#[derive(Clone)]
pub(crate) struct ConnLimits {
    /// One permit per open connection.
    pub connections: Arc<tokio::sync::Semaphore>,
    /// Longest a blocked write may wait.
    pub write_idle: Duration,
    /// Counts connections refused and closed for write idleness.
    pub on_refused: Arc<dyn Fn(Refused) + Send + Sync>,
    /// Most bytes of request head (HTTP/1.1: request line and headers;
    /// HTTP/2: the header list) a request may have: larger is a 431.
    pub max_header_bytes: usize,
    /// The serving threads sharing the listener, whose connections are
    /// spread evenly (`None`: one accept loop, nothing to spread).
    pub spread: Option<Arc<Spread<Handed>>>,
}

/// A connection a serving thread accepted and hands to a less busy one
/// ([`Spread`]), before a byte of it was read.
pub(crate) struct Handed {
    stream: std::net::TcpStream,
    remote: SocketAddr,
    slot: OwnedSemaphorePermit,
    placed: Placed<Handed>,
}

/// A connection to serve here: accepted, or handed over.
struct Accepted {
    stream: tokio::net::TcpStream,
    remote: SocketAddr,
    slot: OwnedSemaphorePermit,
    /// Counted on this thread while it is open.
    _placed: Option<Placed<Handed>>,
}

/// Why a connection was closed by the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `max_connections` were open.
    TooMany,
    /// The client stopped reading.
    WriteIdle,
}

impl ConnLimits {
    /// No limit worth speaking of (the admin listener).
    pub(crate) fn unlimited() -> ConnLimits {
        ConnLimits {
            connections: Arc::new(tokio::sync::Semaphore::new(
                tokio::sync::Semaphore::MAX_PERMITS,
            )),
            write_idle: Duration::from_secs(3600),
            on_refused: Arc::new(|_| {}),
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            spread: None,
        }
    }
}

pin_project_lite::pin_project! {
    /// An I/O stream whose writes may wait at most `limit` for the peer to
    /// read: past it the write fails with `TimedOut` and hyper closes the
    /// connection.
    pub struct WriteIdle<T> {
        #[pin]
        inner: T,
        limit: Duration,
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
        on_idle: Option<Arc<dyn Fn(Refused) + Send + Sync>>,
    }
}

impl<T> WriteIdle<T> {
    /// Wraps `inner`.
    pub(crate) fn new(
        inner: T,
        limit: Duration,
        on_idle: Arc<dyn Fn(Refused) + Send + Sync>,
    ) -> Self {
        WriteIdle {
            inner,
            limit,
            timer: None,
            on_idle: Some(on_idle),
        }
    }
}

impl<T> WriteIdle<T> {
    /// After a pending write or flush: start or check the idle timer.
    fn pending<R>(
        timer: &mut Option<Pin<Box<tokio::time::Sleep>>>,
        limit: Duration,
        on_idle: &mut Option<Arc<dyn Fn(Refused) + Send + Sync>>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<R>> {
        let t = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match t.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => {
                if let Some(f) = on_idle.take() {
                    f(Refused::WriteIdle);
                }
                std::task::Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client stopped reading",
                )))
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<T: tokio::io::AsyncRead> tokio::io::AsyncRead for WriteIdle<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.project().inner.poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite> tokio::io::AsyncWrite for WriteIdle<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.project();
        match this.inner.poll_write(cx, buf) {
            std::task::Poll::Pending => Self::pending(this.timer, *this.limit, this.on_idle, cx),
            ready => {
                *this.timer = None;
                ready
            }
        }
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.project();
        match this.inner.poll_flush(cx) {
            std::task::Poll::Pending => Self::pending(this.timer, *this.limit, this.on_idle, cx),
            ready => {
                *this.timer = None;
                ready
            }
        }
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.project();
        match this.inner.poll_write_vectored(cx, bufs) {
            std::task::Poll::Pending => Self::pending(this.timer, *this.limit, this.on_idle, cx),
            ready => {
                *this.timer = None;
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Waits for the first bytes of a plain connection, without consuming them.
/// `None`: the peer closed, failed, sent nothing within [`HEAD_TIMEOUT`], or
/// the listener is shutting down (a connection that has sent nothing yet is
/// closed at once, so idle TCP health checks never hold up a restart).
async fn peek_protocol(
    stream: &tokio::net::TcpStream,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Sniffed> {
    let mut first = [0u8; H2_PREFACE.len()];
    tokio::select! {
        peeked = tokio::time::timeout(HEAD_TIMEOUT, stream.peek(&mut first)) => match peeked {
            Ok(Ok(n)) if n > 0 => first.get(..n).map(sniff),
            _ => None,
        },
        () = wait_true(shutdown) => None,
    }
}

/// Serves `listener` until `shutdown` turns true, then drains for at most
/// `drain`. `service` builds the per-connection service from its [`ConnInfo`].
pub(crate) async fn serve<F, S, B>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    service: F,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
    limits: ConnLimits,
) where
    F: Fn(ConnInfo) -> S,
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let builders = Arc::new(Builders::new(limits.max_header_bytes));
    let graceful = GracefulShutdown::new();
    // On a serving thread: its place among the others, and its inbox.
    let here = super::shards::current();
    let mut inbox = limits.spread.as_ref().and_then(|s| s.inbox(here));

    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => match admit(&limits, here, stream, remote) {
                    Some(a) => a,
                    None => continue,
                },
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            Some(handed) = next_handed(&mut inbox) => match handed.into_accepted() {
                Some(a) => a,
                None => continue,
            },
            _ = wait_true(&mut shutdown) => break,
        };
        let info = ConnInfo {
            remote: accepted.remote,
            client: accepted.remote.ip(),
            tls: tls.is_some(),
        };
        let conn = Conn {
            svc: service(info),
            builders: builders.clone(),
            write_idle: limits.write_idle,
            on_idle: limits.on_refused.clone(),
            watcher: graceful.watcher(),
            stop: shutdown.clone(),
        };
        match &tls {
            None => tokio::spawn(serve_plain(accepted, conn)),
            Some(acceptor) => tokio::spawn(serve_tls(accepted, acceptor.clone(), conn)),
        };
    }

    drop(listener);
    drain_connections(graceful, drain).await;
}

/// A connection just accepted on serving thread `here`: refused past
/// `max_connections` (`None`), else placed ([`place`]).
fn admit(
    limits: &ConnLimits,
    here: usize,
    stream: tokio::net::TcpStream,
    remote: SocketAddr,
) -> Option<Accepted> {
    let Ok(slot) = limits.connections.clone().try_acquire_owned() else {
        (limits.on_refused)(Refused::TooMany);
        drop(stream);
        return None;
    };
    let _ = stream.set_nodelay(true);
    place(limits, here, stream, remote, slot)
}

impl Handed {
    /// The connection, registered on this thread's runtime (`None`, logged:
    /// it could not be).
    fn into_accepted(self) -> Option<Accepted> {
        match tokio::net::TcpStream::from_std(self.stream) {
            Ok(stream) => Some(Accepted {
                stream,
                remote: self.remote,
                slot: self.slot,
                _placed: Some(self.placed),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "a handed-over connection could not be registered");
                None
            }
        }
    }
}

/// What a connection's task serves it with.
struct Conn<S> {
    /// The connection's service.
    svc: S,
    builders: Arc<Builders>,
    write_idle: Duration,
    on_idle: Arc<dyn Fn(Refused) + Send + Sync>,
    /// Drained with the listener's other connections.
    watcher: hyper_util::server::graceful::Watcher,
    /// The listener's shutdown.
    stop: watch::Receiver<bool>,
}

/// Serves a plain TCP connection, its protocol sniffed from its first bytes.
async fn serve_plain<S, B>(accepted: Accepted, mut conn: Conn<S>)
where
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Accepted {
        stream,
        remote,
        slot,
        _placed,
    } = accepted;
    let _held = (slot, _placed);
    let Some(sniffed) = peek_protocol(&stream, &mut conn.stop).await else {
        return;
    };
    let io = WriteIdle::new(stream, conn.write_idle, conn.on_idle);
    let served = conn
        .builders
        .for_protocol(sniffed)
        .serve_connection(TokioIo::new(io), conn.svc)
        .into_owned();
    log_conn_end(conn.watcher.watch(served), remote).await;
}

/// Serves a TLS connection after its handshake, its protocol by ALPN.
async fn serve_tls<S, B>(accepted: Accepted, acceptor: TlsAcceptor, mut conn: Conn<S>)
where
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Accepted {
        stream,
        remote,
        slot,
        _placed,
    } = accepted;
    let _held = (slot, _placed);
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
    let tls_stream = tokio::select! {
        done = handshake => match done {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(%remote, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%remote, "TLS handshake timed out");
                return;
            }
        },
        // Nothing sent yet that anyone waits for.
        () = wait_true(&mut conn.stop) => return,
    };
    let alpn = tls_stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let io = WriteIdle::new(tls_stream, conn.write_idle, conn.on_idle);
    let served = conn
        .builders
        .for_alpn(alpn.as_deref())
        .serve_connection(TokioIo::new(io), conn.svc)
        .into_owned();
    log_conn_end(conn.watcher.watch(served), remote).await;
}

/// Waits for the open connections to finish, at most `drain`; what is
/// still open after that is dropped.
async fn drain_connections(graceful: GracefulShutdown, drain: Duration) {
    tracing::info!(open = graceful.count(), "draining connections");
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(deadline = ?drain, "drain deadline passed; closing remaining connections");
    }
}

/// Where a connection just accepted on serving thread `here` is served:
/// here (returned), or handed to a less busy thread (`None`). A connection
/// that cannot be moved is served here.
fn place(
    limits: &ConnLimits,
    here: usize,
    stream: tokio::net::TcpStream,
    remote: SocketAddr,
    slot: OwnedSemaphorePermit,
) -> Option<Accepted> {
    let placed = limits.spread.as_ref().and_then(|s| s.place(here));
    let (spread, placed) = match (&limits.spread, placed) {
        (Some(spread), Some(placed)) if placed.shard != here => (spread, placed),
        (_, placed) => {
            return Some(Accepted {
                stream,
                remote,
                slot,
                _placed: placed,
            })
        }
    };
    let to = placed.shard;
    // Out of this thread's reactor, into the other's (`from_std` there).
    let stream = match stream.into_std() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "an accepted connection could not be handed over");
            return None;
        }
    };
    let handed = Handed {
        stream,
        remote,
        slot,
        placed,
    };
    match spread.hand(to, handed) {
        Ok(()) => None,
        // That thread stopped (shutting down): serve it here.
        Err(h) => match tokio::net::TcpStream::from_std(h.stream) {
            Ok(stream) => Some(Accepted {
                stream,
                remote: h.remote,
                slot: h.slot,
                _placed: Some(h.placed.recount(here)),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "an accepted connection could not be registered");
                None
            }
        },
    }
}

/// The next connection handed to this thread; never, without an inbox.
async fn next_handed(inbox: &mut Option<mpsc::UnboundedReceiver<Handed>>) -> Option<Handed> {
    match inbox {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn log_conn_end<E: std::fmt::Display>(
    fut: impl Future<Output = Result<(), E>>,
    remote: SocketAddr,
) {
    if let Err(e) = fut.await {
        tracing::debug!(%remote, error = %e, "connection ended with an error");
    }
}

/// Resolves once the watched value is `true` (or the sender is gone).
pub(crate) async fn wait_true(rx: &mut watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of connections (all queued before any thread accepts) is
    /// served by every serving thread, however the kernel woke them.
    #[tokio::test]
    async fn a_burst_of_connections_is_served_by_every_thread() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let std_listener = Arc::new(std_listener);
        let spread = Spread::<Handed>::new(2);
        let (stop, rx) = watch::channel(false);
        let limits = ConnLimits {
            spread: Some(spread.clone()),
            ..ConnLimits::unlimited()
        };
        let serving = crate::server::shards::spawn(2, move |_| {
            let listener = std_listener.try_clone().and_then(TcpListener::from_std);
            let (rx, limits) = (rx.clone(), limits.clone());
            async move {
                let service = |_conn| {
                    hyper::service::service_fn(|_req| async {
                        let shard = crate::server::shards::current().to_string();
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from(shard)),
                        ))
                    })
                };
                serve(
                    listener.unwrap(),
                    None,
                    service,
                    rx,
                    Duration::from_secs(1),
                    limits,
                )
                .await;
            }
        })
        .unwrap();
        let serving = tokio::spawn(serving);

        let mut conns =
            futures_util::future::join_all((0..16).map(|_| tokio::net::TcpStream::connect(addr)))
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
        let mut served = [0usize; 2];
        for c in &mut conns {
            c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 512];
            let shard = loop {
                let n = c.read(&mut chunk).await.unwrap();
                assert!(n > 0, "closed before answering");
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf);
                if let Some((_, body)) = text.split_once("\r\n\r\n") {
                    if !body.is_empty() {
                        break body.parse::<usize>().unwrap();
                    }
                }
            };
            served[shard - 1] += 1;
        }
        assert_eq!(served.iter().sum::<usize>(), 16);
        assert!(
            served.iter().all(|&n| (6..=10).contains(&n)),
            "connections per thread: {served:?}"
        );
        // Counted where they are served, while they are open.
        assert_eq!(spread.loads().iter().sum::<usize>(), 16);
        drop(conns);
        stop.send(true).unwrap();
        serving.await.unwrap();
        assert_eq!(
            spread.loads(),
            [0, 0],
            "a closed connection is no longer counted"
        );
    }

    #[test]
    fn first_bytes_choose_the_protocol() {
        assert_eq!(sniff(b"POST /mcp/x HTTP/1.1\r\n"), Sniffed::Http1);
        assert_eq!(sniff(b"G"), Sniffed::Http1);
        // "PRI" is a legal HTTP/1 method token; only the whole preface is h2.
        assert_eq!(sniff(b"PRI /x HTTP/1.1\r\n"), Sniffed::Http1);
        assert_eq!(sniff(H2_PREFACE), Sniffed::Http2);
        let mut more = H2_PREFACE.to_vec();
        more.extend_from_slice(b"\0\0\x12\x04");
        assert_eq!(sniff(&more), Sniffed::Http2);
        assert_eq!(sniff(b"PRI * HTTP/2.0\r\n"), Sniffed::Unsure);
        assert_eq!(sniff(b"P"), Sniffed::Unsure);
    }

    #[test]
    fn alpn_chooses_the_protocol_and_its_absence_leaves_it_to_the_bytes() {
        let b = Builders::new(DEFAULT_MAX_HEADER_BYTES);
        assert!(std::ptr::eq(b.for_alpn(Some(b"h2")), &b.http2));
        assert!(std::ptr::eq(b.for_alpn(Some(b"http/1.1")), &b.http1));
        assert!(std::ptr::eq(b.for_alpn(None), &b.sniffing));
        assert!(std::ptr::eq(b.for_protocol(Sniffed::Unsure), &b.sniffing));
    }
}
