//! The floor of any hyper-based proxy: a bare pass-through built
//! from the same parts as the firewall (hyper's server, hyper-util's pooled
//! client, tokio's multi-threaded runtime) that forwards every request (HTTP/1.1 or h2c) to
//! one upstream over pooled HTTP/1.1 keep-alive connections as it came and streams the answer back. No token, no
//! parsing, no policy, no audit. Measured next to nginx and the firewall it
//! splits the firewall's cost into what the HTTP stack costs and what the
//! firewall's own work costs.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::procs::{self, Managed, Placement, ProcError};

type Body = BoxBody<Bytes, hyper::Error>;

/// A running pass-through (`mcp-bench passthrough` as a child process, so
/// its CPU and memory are measured like nginx's and the firewall's).
pub struct Passthrough {
    /// Where it listens (HTTP/1.1 and h2c).
    pub addr: SocketAddr,
    process: Managed,
}

impl Passthrough {
    /// Starts it in front of `upstream`, logging to `log`.
    pub fn start(
        upstream: SocketAddr,
        log: &Path,
        placement: &Placement,
    ) -> Result<Passthrough, ProcError> {
        let mut last = String::new();
        for _ in 0..3 {
            let port = procs::free_port().map_err(|source| ProcError::Io {
                what: "picking a port",
                source,
            })?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let exe = std::env::current_exe().map_err(|source| ProcError::Io {
                what: "locating mcp-bench",
                source,
            })?;
            let mut cmd = Command::new(exe);
            cmd.arg("passthrough")
                .arg("--listen")
                .arg(addr.to_string())
                .arg("--upstream")
                .arg(format!("http://{upstream}"));
            let mut process = Managed::spawn("passthrough", cmd, log, placement)?;
            if crate::probe::wait_listening(
                addr,
                Duration::from_secs(10) * placement.start_factor(),
                || process.running(),
            ) {
                return Ok(Passthrough { addr, process });
            }
            last = process.log_tail(20);
            process.stop(Duration::from_secs(2));
        }
        Err(ProcError::NotReady {
            name: "passthrough".to_owned(),
            log: last,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Stops it (SIGTERM, SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) {
        self.process.stop(grace);
    }
}

/// Serves `listener` until `stop` turns true, forwarding every request to
/// `upstream` (`http://host:port`, the request's path and query appended).
pub async fn serve(listener: TcpListener, upstream: Uri, mut stop: watch::Receiver<bool>) {
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector);
    crate::upstream::accept_until(&listener, &mut stop, "passthrough", |stream| {
        let client = client.clone();
        let upstream = upstream.clone();
        let builder = builder.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| forward(client.clone(), upstream.clone(), req));
            let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
        });
    })
    .await;
}

async fn forward(
    client: Client<HttpConnector, Incoming>,
    upstream: Uri,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (mut parts, body) = req.into_parts();
    let mut uri = upstream.into_parts();
    uri.path_and_query = parts
        .uri
        .path_and_query()
        .cloned()
        .or(Some(PathAndQuery::from_static("/")));
    parts.uri = match Uri::from_parts(uri) {
        Ok(u) => u,
        Err(_) => return Ok(status(StatusCode::BAD_REQUEST)),
    };
    parts.headers.remove(http::header::HOST);
    // h2c from the client, HTTP/1.1 keep-alive to the upstream (like nginx).
    parts.version = http::Version::HTTP_11;
    match client.request(Request::from_parts(parts, body)).await {
        Ok(resp) => Ok(resp.map(BodyExt::boxed)),
        Err(_) => Ok(status(StatusCode::BAD_GATEWAY)),
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *r.status_mut() = code;
    r
}
