//! Body types of the request path: the boxed body every response uses, and
//! reading an upstream body frame by frame under an idle timeout.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;

use super::error::UpstreamFailure;

/// Errors a response body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the firewall sends.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A complete body.
pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// Reads an upstream body one data chunk at a time. Trailers are ignored
/// (MCP does not use them); silence longer than `idle` is a failure.
pub struct UpstreamBody {
    inner: Incoming,
    idle: Duration,
}

// === impl UpstreamBody ===

impl UpstreamBody {
    /// Wraps an upstream response body.
    pub fn new(inner: Incoming, idle: Duration) -> Self {
        UpstreamBody { inner, idle }
    }

    /// The next data chunk; `Ok(None)` at the end of the body.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, UpstreamFailure> {
        loop {
            let frame = match tokio::time::timeout(self.idle, self.inner.frame()).await {
                Err(_) => return Err(UpstreamFailure::Idle(self.idle.as_millis() as u64)),
                Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => return Err(UpstreamFailure::Reset(e.to_string())),
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
    pub async fn collect_bounded(&mut self, limit: usize) -> Result<Collected, UpstreamFailure> {
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
pub enum Collected {
    /// The whole body.
    Complete(Bytes),
    /// The first bytes of a body larger than the limit; the rest is unread.
    Partial(Bytes),
}
