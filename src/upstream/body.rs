//! An upstream's body on the request path: the HTTP/2 stream slot it holds,
//! and reading it frame by frame under an idle timeout. (The boxed body every
//! response uses is [`crate::http_util::Body`].)

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming, SizeHint};

use super::failure::{Cause, UpstreamFailure};
use super::h2pool::StreamSlot;

/// A client's request body: from the wire, or a message a virtual server
/// ([`crate::proxy::virtual_server`]) passes to one of its members, which
/// then takes the same path as any client's.
pub(crate) type ClientBody = http_body_util::Either<Incoming, http_body_util::Full<Bytes>>;

/// An upstream response body. Over HTTP/2 it holds its stream's slot on the
/// connection until dropped, so the pool counts the stream for as long as
/// the answer is being relayed.
#[derive(Debug)]
pub struct UpstreamIncoming {
    body: Incoming,
    _slot: Option<StreamSlot>,
}

impl UpstreamIncoming {
    /// A body received over HTTP/1.1.
    pub fn http1(body: Incoming) -> Self {
        UpstreamIncoming { body, _slot: None }
    }

    /// A body received over HTTP/2, holding `slot`.
    pub fn http2(body: Incoming, slot: StreamSlot) -> Self {
        UpstreamIncoming {
            body,
            _slot: Some(slot),
        }
    }
}

impl hyper::body::Body for UpstreamIncoming {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Reads an upstream body one data chunk at a time. Trailers are ignored
/// (MCP does not use them); silence longer than `idle` is a failure.
pub(crate) struct UpstreamBody {
    inner: UpstreamIncoming,
    idle: Duration,
}

// === impl UpstreamBody ===

impl UpstreamBody {
    /// Wraps an upstream response body.
    pub(crate) fn new(inner: UpstreamIncoming, idle: Duration) -> Self {
        UpstreamBody { inner, idle }
    }

    /// The next data chunk; `Ok(None)` at the end of the body.
    pub(crate) async fn chunk(&mut self) -> Result<Option<Bytes>, UpstreamFailure> {
        loop {
            let frame = match tokio::time::timeout(self.idle, self.inner.frame()).await {
                Err(_) => return Err(UpstreamFailure::Idle(self.idle.as_millis() as u64)),
                Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => return Err(UpstreamFailure::Reset(Cause::new(e))),
                Ok(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                if !data.is_empty() {
                    return Ok(Some(data));
                }
            }
        }
    }

    /// Reads the whole body if it fits in `limit` bytes. On overflow, returns
    /// what was read so far so the caller can stream the rest.
    pub(crate) async fn collect_bounded(
        &mut self,
        limit: usize,
    ) -> Result<Collected, UpstreamFailure> {
        let mut first: Option<Bytes> = None;
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = self.chunk().await? {
            // Most bodies arrive in one chunk: keep it without copying.
            let len = first.as_ref().map_or(0, Bytes::len) + buf.len() + chunk.len();
            if len > limit {
                let mut prefix = Vec::with_capacity(len);
                if let Some(f) = first.take() {
                    prefix.extend_from_slice(&f);
                }
                prefix.extend_from_slice(&buf);
                prefix.extend_from_slice(&chunk);
                return Ok(Collected::Partial(Bytes::from(prefix)));
            }
            match first.take() {
                None if buf.is_empty() => first = Some(chunk),
                None => buf.extend_from_slice(&chunk),
                Some(f) => {
                    buf.reserve(f.len() + chunk.len());
                    buf.extend_from_slice(&f);
                    buf.extend_from_slice(&chunk);
                }
            }
        }
        Ok(Collected::Complete(match first {
            Some(f) => f,
            None => Bytes::from(buf),
        }))
    }
}

/// The result of [`UpstreamBody::collect_bounded`].
pub(crate) enum Collected {
    /// The whole body.
    Complete(Bytes),
    /// The first bytes of a body larger than the limit; the rest is unread.
    Partial(Bytes),
}
