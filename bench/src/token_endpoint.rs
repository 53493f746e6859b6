//! A canned OAuth token endpoint for the bench: answers every POST with
//! one token for an RFC 8693 exchange (`issued_token_type` an access
//! token, an hour's `expires_in`), and counts what it was asked. Enough to
//! measure what a call costs with a cached exchanged token
//! (`auth = "token_exchange"`): a run exchanges once, then every call uses
//! the kept token. The protocol itself is tested against a real
//! authorization server (the product's `tests/idp/`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// The token it issues (the bench upstream does not read it).
pub const TOKEN: &str = "bench-exchanged-token.for-the-run";

/// A running endpoint; stops when dropped.
pub struct TokenEndpoint {
    /// Where it listens.
    pub addr: SocketAddr,
    asked: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl TokenEndpoint {
    /// Starts it on a free loopback port.
    ///
    /// # Errors
    /// The port could not be bound.
    pub async fn start() -> std::io::Result<TokenEndpoint> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let asked = Arc::new(AtomicU64::new(0));
        let count = asked.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |_req: Request<hyper::body::Incoming>| {
                            count.fetch_add(1, Ordering::Relaxed);
                            async move {
                                let body = format!(
                                    r#"{{"access_token":"{TOKEN}","token_type":"Bearer","issued_token_type":"urn:ietf:params:oauth:token-type:access_token","expires_in":3600}}"#
                                );
                                let mut r = Response::new(Full::new(Bytes::from(body)));
                                r.headers_mut().insert(
                                    hyper::header::CONTENT_TYPE,
                                    hyper::header::HeaderValue::from_static("application/json"),
                                );
                                Ok::<_, Infallible>(r)
                            }
                        },
                    );
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(TokenEndpoint { addr, asked, task })
    }

    /// Requests answered so far.
    pub fn asked(&self) -> u64 {
        self.asked.load(Ordering::Relaxed)
    }
}

impl Drop for TokenEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}
