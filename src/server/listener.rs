//! Accepting connections: TCP, optional rustls, HTTP/1.1 and HTTP/2 (ALPN or
//! prior knowledge) through hyper-util's auto builder, and a graceful drain.
//!
//! On shutdown the accept loop stops, every open connection is told to finish
//! its in-flight requests (HTTP/1 stops keep-alive, HTTP/2 sends GOAWAY), and
//! the listener waits for them up to the drain deadline; what is still open
//! after that is dropped.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// What the request path knows about the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    /// The peer's address.
    pub remote: SocketAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
}

/// A TLS handshake that takes longer than this is abandoned (slowloris).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `listener` until `shutdown` turns true, then drains for at most
/// `drain`. `service` builds the per-connection service from its [`ConnInfo`].
pub async fn serve<F, S, B>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    service: F,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
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
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .max_concurrent_streams(1024);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();

    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = wait_true(&mut shutdown) => break,
        };
        let _ = stream.set_nodelay(true);
        let info = ConnInfo {
            remote,
            tls: tls.is_some(),
        };
        let svc = service(info);
        let builder = builder.clone();
        match &tls {
            None => {
                let conn = builder
                    .serve_connection(TokioIo::new(stream), svc)
                    .into_owned();
                let fut = graceful.watch(conn);
                tokio::spawn(log_conn_end(fut, remote));
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let tls_stream = match tokio::time::timeout(
                        HANDSHAKE_TIMEOUT,
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%remote, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%remote, "TLS handshake timed out");
                            return;
                        }
                    };
                    let conn = builder
                        .serve_connection(TokioIo::new(tls_stream), svc)
                        .into_owned();
                    log_conn_end(watcher.watch(conn), remote).await;
                });
            }
        }
    }

    drop(listener);
    tracing::info!(open = graceful.count(), "draining connections");
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(deadline = ?drain, "drain deadline passed; closing remaining connections");
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
pub async fn wait_true(rx: &mut watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}
