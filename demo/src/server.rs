//! Serving the demo upstream over HTTP: rmcp's streamable HTTP service behind a
//! hyper-util server (HTTP/1.1 and cleartext HTTP/2 on one port), wrapped by a
//! recorder of request headers, and the handle tests use to observe and stop it.
//!
//! Invariants:
//! - Both eras are served on one URL: 2026-07-28 requests statelessly, older
//!   revisions with sessions when [`UpstreamOptions::legacy_session_mode`] is
//!   on (rmcp routes each request).
//! - Requests are recorded before rmcp sees them, so a request rmcp rejects
//!   (bad Host, bad headers) is still in the log.
//! - `Host` is accepted for any port of 127.0.0.1, localhost and ::1: the
//!   firewall forwards the upstream's host, but a proxy on another port must
//!   not be refused.
//! - Dropping a [`DemoUpstream`] stops accepting connections; [`DemoUpstream::shutdown`]
//!   also waits (bounded) for open connections and SSE streams to close.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use rmcp::model::Tool;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::tools::{Behaviour, DemoTools, ProgressPlan, Shared, ToolCatalogError};

/// Longest [`DemoUpstream::shutdown`] waits for open connections to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Hosts accepted in `Host`. Entries without a port match every port.
const ALLOWED_HOSTS: [&str; 3] = ["127.0.0.1", "localhost", "::1"];

/// How to run the sample upstream.
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    /// Answer stateless requests (every 2026-07-28 request, and legacy ones
    /// when sessions are off) with `application/json` when the handler sends
    /// nothing before its result; rmcp falls back to SSE when it does (e.g.
    /// progress). Legacy sessions always answer with SSE.
    pub json_response: bool,
    /// Serve revisions before 2026-07-28 with `Mcp-Session-Id` sessions
    /// (needed for server-to-client requests and list_changed in those
    /// revisions). When off, they are served statelessly.
    pub legacy_session_mode: bool,
    /// Pause after each progress notification.
    pub progress_delay: Duration,
    /// Progress notifications sent by `export_metrics_csv` and the rollback
    /// tools when the request carries a progress token; 0 disables progress.
    pub progress_steps: u32,
    /// Record every request's method, URI and headers (see
    /// [`DemoUpstream::requests`]). Benches turn this off: the log grows with
    /// every request.
    pub record_requests: bool,
    /// Interval of SSE keep-alive comments; `None` sends none.
    pub sse_keep_alive: Option<Duration>,
}

impl Default for UpstreamOptions {
    /// Sessions on, SSE responses, three progress steps 50 ms apart, requests
    /// recorded: the settings of `mcp-firewall demo` and of most tests.
    fn default() -> Self {
        UpstreamOptions {
            json_response: false,
            legacy_session_mode: true,
            progress_delay: Duration::from_millis(50),
            progress_steps: 3,
            record_requests: true,
            sse_keep_alive: Some(Duration::from_secs(15)),
        }
    }
}

impl UpstreamOptions {
    /// Settings for throughput runs: JSON responses, no progress pauses, no
    /// request log (it would grow with every request).
    pub fn bench() -> Self {
        UpstreamOptions {
            json_response: true,
            progress_steps: 0,
            progress_delay: Duration::ZERO,
            record_requests: false,
            ..UpstreamOptions::default()
        }
    }
}

/// One HTTP request as the upstream received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// The request method.
    pub method: http::Method,
    /// The request target.
    pub uri: http::Uri,
    /// Every header, as received.
    pub headers: http::HeaderMap,
}

#[derive(Default)]
struct RequestLog {
    entries: Mutex<Vec<RecordedRequest>>,
}

impl RequestLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RecordedRequest>> {
        // Pushing and cloning cannot leave the vector inconsistent, so a
        // poisoned lock still guards usable data.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

type McpService = StreamableHttpService<DemoTools, LocalSessionManager>;

/// A running sample upstream. Dropping it stops the server in the background;
/// call [`DemoUpstream::shutdown`] to wait for that.
pub struct DemoUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    log: Arc<RequestLog>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// Starts the sample upstream on `listener` and serves it until the returned
/// handle is shut down or dropped.
///
/// # Errors
///
/// Fails if the listener has no local address.
pub async fn spawn(listener: TcpListener, opts: UpstreamOptions) -> anyhow::Result<DemoUpstream> {
    let addr = listener
        .local_addr()
        .context("the demo upstream's listener has no local address")?;
    let shared = Arc::new(Shared::new(Behaviour {
        progress: ProgressPlan {
            steps: opts.progress_steps,
            delay: opts.progress_delay,
        },
        legacy_sessions: opts.legacy_session_mode,
    }));
    let handler = DemoTools::new(Arc::clone(&shared));
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(opts.legacy_session_mode)
        .with_json_response(opts.json_response)
        .with_sse_keep_alive(opts.sse_keep_alive)
        .with_allowed_hosts(ALLOWED_HOSTS);
    // One service behind an `Arc`: cloning `StreamableHttpService` copies its
    // config (several heap strings), which would cost allocations per request.
    let service = Arc::new(StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    ));
    let log = Arc::new(RequestLog::default());
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(serve(
        listener,
        service,
        opts.record_requests.then(|| Arc::clone(&log)),
        stopped,
    ));
    Ok(DemoUpstream {
        addr,
        shared,
        log,
        stop: Some(stop),
        task: Some(task),
    })
}

async fn serve(
    listener: TcpListener,
    service: Arc<McpService>,
    log: Option<Arc<RequestLog>>,
    mut stopped: oneshot::Receiver<()>,
) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Usually descriptor exhaustion; back off instead of spinning.
                    tracing::warn!(%error, "demo upstream failed to accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Small JSON-RPC messages: send them now rather than wait for Nagle.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "demo upstream could not set TCP_NODELAY");
        }
        let service = Arc::clone(&service);
        let log = log.clone();
        let handler = service_fn(move |request: http::Request<Incoming>| {
            if let Some(log) = &log {
                log.lock().push(RecordedRequest {
                    method: request.method().clone(),
                    uri: request.uri().clone(),
                    headers: request.headers().clone(),
                });
            }
            let service = Arc::clone(&service);
            async move { Ok::<_, Infallible>(service.handle(request).await) }
        });
        let connection = builder
            .serve_connection(TokioIo::new(stream), handler)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "demo upstream connection ended with an error");
            }
        });
    }
    drop(listener);
    // Ends sessions and open SSE streams, which otherwise keep their
    // connections busy past the grace period.
    service.config.cancellation_token.cancel();
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("demo upstream shut down with connections still open");
    }
}

impl DemoUpstream {
    /// The socket the upstream listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The MCP endpoint, `http://127.0.0.1:PORT/mcp` (any path works; `/mcp`
    /// is the conventional one).
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// How many `tools/call` requests reached `tool` (see the counting rule in
    /// [`super::tools`]).
    pub fn calls(&self, tool: &str) -> u64 {
        self.shared.calls(tool)
    }

    /// How many `tools/call` requests reached any registered tool.
    pub fn total_calls(&self) -> u64 {
        self.shared.total_calls()
    }

    /// Headers of every HTTP request received so far, in arrival order.
    pub fn requests(&self) -> Vec<http::HeaderMap> {
        self.log.lock().iter().map(|r| r.headers.clone()).collect()
    }

    /// Every HTTP request received so far (method, URI, headers), in arrival
    /// order.
    pub fn recorded_requests(&self) -> Vec<RecordedRequest> {
        self.log.lock().clone()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.log.lock().clear();
    }

    /// Live legacy sessions that will receive `notifications/tools/list_changed`.
    pub fn session_count(&self) -> usize {
        self.shared.session_count()
    }

    /// Open 2026-07-28 `subscriptions/listen` streams.
    pub fn subscription_count(&self) -> usize {
        self.shared.subscription_count()
    }

    /// Names of the tools currently listed, sorted.
    pub fn tool_names(&self) -> Vec<String> {
        self.shared.tool_names()
    }

    /// Registers `tool`; calling it echoes its name and arguments. Connected
    /// clients are told the tool list changed.
    ///
    /// # Errors
    ///
    /// [`ToolCatalogError::ToolExists`] if the name is taken.
    pub async fn add_tool(&self, tool: Tool) -> Result<(), ToolCatalogError> {
        self.shared.add_tool(tool).await
    }

    /// Renames a tool; it keeps its behaviour, schema and annotations.
    /// Connected clients are told the tool list changed.
    ///
    /// # Errors
    ///
    /// [`ToolCatalogError::UnknownTool`] if `from` does not exist,
    /// [`ToolCatalogError::ToolExists`] if `to` does.
    pub async fn rename_tool(&self, from: &str, to: &str) -> Result<(), ToolCatalogError> {
        self.shared.rename_tool(from, to).await
    }

    /// Changes a tool's definition (description, schemas, annotations…) and
    /// keeps its behaviour. Connected clients are told the tool list changed.
    ///
    /// # Errors
    ///
    /// [`ToolCatalogError::UnknownTool`] if it does not exist.
    pub async fn edit_tool(
        &self,
        name: &str,
        edit: impl FnOnce(&mut Tool),
    ) -> Result<(), ToolCatalogError> {
        self.shared.edit_tool(name, edit).await
    }

    /// Serves `tools/list` in pages of `n` tools (0: one page).
    pub fn set_page_size(&self, n: usize) {
        self.shared
            .page_size
            .store(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Unregisters a tool. Connected clients are told the tool list changed.
    ///
    /// # Errors
    ///
    /// [`ToolCatalogError::UnknownTool`] if it does not exist.
    pub async fn remove_tool(&self, name: &str) -> Result<(), ToolCatalogError> {
        self.shared.remove_tool(name).await
    }

    /// Stops accepting connections, ends sessions and SSE streams, and waits
    /// (at most about two seconds) for open connections to close.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            // The server task may already be gone; then there is nothing to stop.
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            if let Err(error) = task.await {
                tracing::warn!(%error, "demo upstream server task failed");
            }
        }
    }
}

impl Drop for DemoUpstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
