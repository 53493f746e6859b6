//! HTTP/2 to one upstream over a small, growing set of connections.
//!
//! A single HTTP/2 connection is not enough for a proxy of MCP traffic: the
//! upstream caps the streams it serves at once (`SETTINGS_MAX_CONCURRENT_STREAMS`,
//! 100–250 in common servers), and MCP holds streams open for long (SSE
//! answers, the GET stream of a session). Past the cap, every further request
//! would wait behind streams that may never end. So each connection carries
//! at most `max_streams` streams at once; a request goes to the least busy
//! connection under the cap, and a new connection is opened (one at a time)
//! only when every connection is full. A stream counts until its response
//! body is dropped ([`StreamSlot`] travels with the body), not just until the
//! response headers arrive.
//!
//! Connections that are closed are forgotten; one that carried nothing for
//! `idle` is dropped (the first is kept).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower::Service;

use super::failure::{Cause, UpstreamFailure};

/// Counts one open stream on its connection until dropped.
#[derive(Debug)]
pub struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Conn {
    tx: SendRequest<Full<Bytes>>,
    active: Arc<AtomicUsize>,
    last_used: Instant,
}

/// The connections to one upstream.
pub(crate) struct H2Pool {
    connector: HttpsConnector<HttpConnector>,
    /// Scheme and authority to connect to.
    target: Uri,
    max_streams: usize,
    idle: Duration,
    conns: Mutex<Vec<Conn>>,
    /// Held while a connection is being opened: requests that find every
    /// connection full wait for it instead of opening one each.
    opening: tokio::sync::Mutex<()>,
}

impl H2Pool {
    /// A pool connecting to `target` with `connector`, at most `max_streams`
    /// streams per connection.
    pub(crate) fn new(
        connector: HttpsConnector<HttpConnector>,
        target: Uri,
        max_streams: usize,
        idle: Duration,
    ) -> Self {
        H2Pool {
            connector,
            target,
            max_streams: max_streams.max(1),
            idle,
            conns: Mutex::new(Vec::new()),
            opening: tokio::sync::Mutex::new(()),
        }
    }

    /// Sends `req` and returns the response with the slot its stream holds.
    /// A request the connection refused before sending anything (it was
    /// closing) is sent once more on another connection. Failing to open a
    /// connection is [`UpstreamFailure::Connect`], a stream that breaks is
    /// [`UpstreamFailure::Reset`].
    pub(crate) async fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<(Response<Incoming>, StreamSlot), UpstreamFailure> {
        let mut req = req;
        for attempt in 0..2 {
            let (mut tx, slot) = match self.pick() {
                Some(picked) => picked,
                None => self.open().await?,
            };
            if tx.ready().await.is_err() {
                // Closed between the pick and now: nothing was sent.
                drop(slot);
                continue;
            }
            match tx.try_send_request(req).await {
                Ok(resp) => return Ok((resp, slot)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) if attempt == 0 => req = unsent,
                    _ => return Err(UpstreamFailure::Reset(Cause::new(e.into_error()))),
                },
            }
        }
        Err(UpstreamFailure::Reset(Cause::stated(
            "the upstream closed every HTTP/2 connection",
        )))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The least busy open connection under the cap, with a slot taken on it.
    fn pick(&self) -> Option<(SendRequest<Full<Bytes>>, StreamSlot)> {
        let mut conns = self.lock();
        let now = Instant::now();
        let idle = self.idle;
        let mut first = true;
        conns.retain(|c| {
            let keep = !c.tx.is_closed()
                && (first
                    || c.active.load(Ordering::Acquire) > 0
                    || now.duration_since(c.last_used) < idle);
            first &= !keep;
            keep
        });
        let best = conns
            .iter_mut()
            .filter(|c| c.active.load(Ordering::Acquire) < self.max_streams)
            .min_by_key(|c| c.active.load(Ordering::Acquire))?;
        best.active.fetch_add(1, Ordering::AcqRel);
        best.last_used = now;
        Some((best.tx.clone(), StreamSlot(best.active.clone())))
    }

    /// Opens a connection (one at a time) unless one freed up meanwhile.
    async fn open(&self) -> Result<(SendRequest<Full<Bytes>>, StreamSlot), UpstreamFailure> {
        let _opening = self.opening.lock().await;
        if let Some(picked) = self.pick() {
            return Ok(picked);
        }
        let mut connector = self.connector.clone();
        let io = connector
            .call(self.target.clone())
            .await
            .map_err(|e| UpstreamFailure::Connect(Cause::boxed(e)))?;
        let (tx, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(20))
            .handshake(io)
            .await
            .map_err(|e| UpstreamFailure::Connect(Cause::new(e)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
            }
        });
        let active = Arc::new(AtomicUsize::new(1));
        self.lock().push(Conn {
            tx: tx.clone(),
            active: active.clone(),
            last_used: Instant::now(),
        });
        Ok((tx, StreamSlot(active)))
    }
}
