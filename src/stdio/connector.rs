//! The upstream client's connector for a stdio upstream: every
//! "connection" is an in-memory pipe whose other end is served by the
//! upstream's [`Bridge`] (HTTP/1.1, kept alive and pooled like any other
//! upstream connection). No socket is opened: nothing else on the machine
//! can reach a stdio server.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::io::DuplexStream;

use super::Bridge;

/// Connects to a bridge.
#[derive(Clone)]
pub(crate) struct Local {
    bridge: Arc<Bridge>,
}

impl Local {
    /// A connector to `bridge`.
    pub(crate) fn new(bridge: Arc<Bridge>) -> Local {
        Local { bridge }
    }
}

pin_project_lite::pin_project! {
    /// One in-memory connection.
    pub struct Pipe {
        #[pin]
        io: TokioIo<DuplexStream>,
    }
}

impl Connection for Pipe {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for Pipe {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.project().io.poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Pipe {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

/// Buffer of each direction of a pipe.
const PIPE_BYTES: usize = 256 * 1024;

impl tower::Service<Uri> for Local {
    type Response = Pipe;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Pipe>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let bridge = self.bridge.clone();
        Box::pin(async move {
            let (client, server) = tokio::io::duplex(PIPE_BYTES);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let bridge = bridge.clone();
                    async move { Ok::<_, std::convert::Infallible>(bridge.serve(req).await) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(server), service)
                    .await
                {
                    tracing::debug!(error = %e, "stdio bridge connection ended");
                }
            });
            Ok(Pipe {
                io: TokioIo::new(client),
            })
        })
    }
}
