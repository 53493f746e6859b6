//! Why a forwarded request failed at or on the way to the upstream: the
//! transport's failures as one type, below everything that forwards (the
//! upstream client, its bodies, the HTTP/2 pool) and everything that answers
//! for them (`crate::proxy::answer`, `crate::proxy::error`).

/// Why a forwarded request failed at or on the way to the upstream.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamFailure {
    /// TCP connect refused, DNS failure, TLS handshake failure.
    #[error("cannot connect: {0}")]
    Connect(Cause),
    /// No response headers within the request timeout.
    #[error("no response within {0} ms")]
    Timeout(u64),
    /// The body went silent longer than the idle timeout.
    #[error("response stalled for more than {0} ms")]
    Idle(u64),
    /// The connection broke while the response was being read.
    #[error("connection reset while reading the response: {0}")]
    Reset(Cause),
    /// The upstream answered with a server error status.
    #[error("upstream answered HTTP {0}")]
    Status(u16),
    /// The response could not be understood.
    #[error("invalid response: {0}")]
    Invalid(String),
    /// The response is larger than the firewall buffers for inspection.
    #[error("response larger than {0} bytes")]
    TooLarge(usize),
    /// The firewall is shutting down: the stream ends before its answer.
    #[error("the firewall is shutting down; retry the request")]
    ShuttingDown,
}

/// An error and its sources on one line (`outer: cause: root cause`).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// The error underneath a transport failure, kept whole (its type and its
/// sources) and shown as one line, `outer: cause: root cause`. Cheap to
/// clone: a failure is reported to the client, the audit row and the logs.
#[derive(Clone)]
pub struct Cause(std::sync::Arc<dyn std::error::Error + Send + Sync>);

impl Cause {
    /// Keeps `e`.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Cause {
        Cause(std::sync::Arc::new(e))
    }

    /// Keeps an already boxed error.
    pub fn boxed(e: Box<dyn std::error::Error + Send + Sync>) -> Cause {
        Cause(std::sync::Arc::from(e))
    }

    /// A cause the firewall states itself (no underlying error).
    pub fn stated(text: &'static str) -> Cause {
        Cause::new(Stated(text))
    }

    /// The error itself.
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&error_chain(&*self.0))
    }
}

impl std::fmt::Debug for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cause({self})")
    }
}

/// A reason the firewall states about the upstream's transport.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Stated(&'static str);
