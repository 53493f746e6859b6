//! The load generator: hyper client connections (HTTP/1.1 keep-alive or
//! HTTP/2, plain or TLS), driven closed-loop (fixed concurrency) or
//! open-loop (fixed rate), with latencies in HDR histograms.
//!
//! - **Closed loop**: `concurrency` workers each send a request, wait for
//!   the whole answer, and send the next. Latency is send → last byte.
//! - **Open loop**: request *n* is due at `start + n / rate`. A worker takes
//!   the next due request, waits until it is due (if it is early) and sends
//!   it; latency is measured from the **intended** time, so a stall that
//!   delays the following requests shows up in their latency instead of
//!   vanishing (coordinated omission). `concurrency` bounds the requests in
//!   flight (connections for HTTP/1.1).
//!
//! Phases: connect, warm-up (answers checked, nothing recorded), measure
//! (answers checked and recorded, throughput counted), drain. A run stops
//! after its duration or once `requests` answers were measured.
//!
//! Costs kept off the hot path: bodies and tokens are shared `Bytes`; the
//! answer is classified by byte scans ([`Classifier`]); each worker owns its
//! histogram and counters (merged at the end, no locks); error labels are
//! only built for failures.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::outcome::{Classifier, Expect, Outcome};
use crate::scenario::{Pool, Route, Workload};
use crate::tokens::Tokens;

/// Highest latency the histograms hold (longer ones are clamped): 60 s.
const MAX_LATENCY_US: u64 = 60_000_000;

const PHASE_WARMUP: u8 = 0;
const PHASE_MEASURE: u8 = 1;
const PHASE_DONE: u8 = 2;

static MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// HTTP version spoken to the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// HTTP/1.1 keep-alive, one connection per worker.
    H1,
    /// HTTP/2 (h2c prior knowledge in plaintext, ALPN `h2` over TLS),
    /// workers multiplexed over a few connections.
    H2,
}

/// Where and how to connect.
#[derive(Clone)]
pub struct Endpoint {
    /// Address.
    pub addr: SocketAddr,
    /// HTTP version.
    pub proto: Proto,
    /// TLS client config (with the right ALPN), or plaintext.
    pub tls: Option<Arc<ClientConfig>>,
    /// Every request goes to this path instead of its route's (a virtual
    /// server's `/mcp/vs3` instead of `/mcp/bench`); `None` keeps the
    /// route's path.
    pub path: Option<Arc<str>>,
}

/// One load run.
#[derive(Clone)]
pub struct LoadSpec {
    /// The target.
    pub endpoint: Endpoint,
    /// What to send.
    pub workload: Arc<Workload>,
    /// Tokens to cycle through.
    pub tokens: Arc<Tokens>,
    /// Judge answers by the firewall's expectations (else a plain target's).
    pub firewall: bool,
    /// Workers (closed loop) or most requests in flight (open loop).
    pub concurrency: usize,
    /// HTTP/2 connections the workers share.
    pub h2_connections: usize,
    /// Open loop at this many requests per second; `None` is closed loop.
    pub rate: Option<f64>,
    /// Warm-up time (not recorded).
    pub warmup: Duration,
    /// Measured time (upper bound when `requests` is set).
    pub duration: Duration,
    /// Stop after this many measured answers.
    pub requests: Option<u64>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Requests this target was sent before this load (selects tokens, so
    /// a long-lived firewall keeps meeting runs it has not seen).
    pub ticket_base: u64,
    /// Consecutive requests that share a token (one agent run's calls).
    pub calls_per_run: u64,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// Length of the measured window.
    pub elapsed: Duration,
    /// Answers that met the expectation.
    pub ok: u64,
    /// Everything else (wrong answers and transport failures).
    pub failed: u64,
    /// Failures by kind.
    pub errors: BTreeMap<String, u64>,
    /// Answers by template and outcome (`call: result`).
    pub outcomes: BTreeMap<String, u64>,
    /// Latency of every measured answer (ok or not), microseconds.
    pub histogram: Histogram<u64>,
    /// Requests sent, warm-up and drain included.
    pub tickets: u64,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No connection could be opened.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// The target.
        addr: SocketAddr,
        /// The cause.
        source: ConnectError,
    },
    /// The histogram bounds are invalid (cannot happen with constants).
    #[error("histogram: {0}")]
    Histogram(#[from] hdrhistogram::CreationError),
    /// A worker task failed.
    #[error("load worker failed: {0}")]
    Worker(#[from] tokio::task::JoinError),
}

/// Why one connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// TCP connect failed.
    #[error("tcp: {0}")]
    Tcp(#[source] std::io::Error),
    /// TLS handshake failed.
    #[error("tls: {0}")]
    Tls(#[source] std::io::Error),
    /// The HTTP handshake failed.
    #[error("http handshake: {0}")]
    Http(#[source] hyper::Error),
}

enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

struct Shared {
    phase: AtomicU8,
    tickets: AtomicU64,
    measured: AtomicU64,
    /// Woken by the worker that measures the last requested answer.
    limit_hit: tokio::sync::Notify,
}

struct Worker {
    spec: Arc<LoadSpec>,
    shared: Arc<Shared>,
    classifier: Classifier,
    uris: [Uri; 4],
    host: HeaderValue,
    sender: Sender,
    start: Instant,
    hist: Histogram<u64>,
    ok: u64,
    failed: u64,
    errors: BTreeMap<String, u64>,
    outcomes: Vec<(usize, Outcome, u64)>,
}

struct WorkerResult {
    hist: Histogram<u64>,
    ok: u64,
    failed: u64,
    errors: BTreeMap<String, u64>,
    outcomes: Vec<(usize, Outcome, u64)>,
}

/// Progress as seen while a run is going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Warming up.
    Warmup,
    /// Measuring: answers so far in the window.
    Measure(u64),
    /// The window just closed: answers in it.
    Done(u64),
}

// === connections ===

/// Opens one connection to `ep`.
async fn connect(ep: &Endpoint) -> Result<Sender, ConnectError> {
    let tcp = TcpStream::connect(ep.addr)
        .await
        .map_err(ConnectError::Tcp)?;
    tcp.set_nodelay(true).map_err(ConnectError::Tcp)?;
    match &ep.tls {
        None => handshake(ep.proto, tcp).await,
        Some(cfg) => {
            let name = ServerName::IpAddress(ep.addr.ip().into());
            let tls = TlsConnector::from(cfg.clone())
                .connect(name, tcp)
                .await
                .map_err(ConnectError::Tls)?;
            handshake(ep.proto, tls).await
        }
    }
}

async fn handshake<S>(proto: Proto, io: S) -> Result<Sender, ConnectError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    match proto {
        Proto::H1 => {
            let (sender, conn) = http1::handshake(io).await.map_err(ConnectError::Http)?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Sender::H1(sender))
        }
        Proto::H2 => {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .initial_stream_window_size(1 << 20)
                .initial_connection_window_size(4 << 20)
                .handshake(io)
                .await
                .map_err(ConnectError::Http)?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Sender::H2(sender))
        }
    }
}

impl Sender {
    fn try_clone(&self) -> Option<Sender> {
        match self {
            Sender::H1(_) => None,
            Sender::H2(s) => Some(Sender::H2(s.clone())),
        }
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<(u16, Bytes), hyper::Error> {
        let resp = match self {
            Sender::H1(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
        };
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// Stable label of a transport failure.
fn transport_label(e: &hyper::Error) -> &'static str {
    if e.is_closed() {
        "transport: connection closed"
    } else if e.is_incomplete_message() {
        "transport: incomplete message"
    } else if e.is_canceled() {
        "transport: canceled"
    } else if e.is_parse() {
        "transport: unparsable response"
    } else if e.is_timeout() {
        "transport: timeout"
    } else if e.is_body_write_aborted() {
        "transport: body write aborted"
    } else {
        "transport: other"
    }
}

// === run ===

/// Runs one load: connect, warm up, measure, drain. `tick` is called about
/// every 200 ms with the phase, right after the measured window opens
/// (`Measure(0)`), and once with `Done` right after it closes.
pub async fn run(spec: LoadSpec, mut tick: impl FnMut(Phase)) -> Result<LoadReport, LoadError> {
    let spec = Arc::new(spec);
    let ep = &spec.endpoint;
    let concurrency = spec.concurrency.max(1);
    let h2_conns = spec.h2_connections.clamp(1, concurrency);
    let connect_err = |source| LoadError::Connect {
        addr: ep.addr,
        source,
    };
    // Connections first, all at once, so the first second of warm-up does
    // not measure handshakes.
    let mut senders = Vec::with_capacity(concurrency);
    match ep.proto {
        Proto::H1 => {
            let opened = futures_join(
                (0..concurrency)
                    .map(|_| {
                        let ep = ep.clone();
                        async move { connect(&ep).await }
                    })
                    .collect::<Vec<_>>(),
            )
            .await;
            for s in opened {
                senders.push(s.map_err(connect_err)?);
            }
        }
        Proto::H2 => {
            let opened = futures_join(
                (0..h2_conns)
                    .map(|_| {
                        let ep = ep.clone();
                        async move { connect(&ep).await }
                    })
                    .collect::<Vec<_>>(),
            )
            .await;
            let mut conns = Vec::with_capacity(h2_conns);
            for s in opened {
                conns.push(s.map_err(connect_err)?);
            }
            for i in 0..concurrency {
                if let Some(s) = conns[i % conns.len()].try_clone() {
                    senders.push(s);
                }
            }
        }
    }

    let shared = Arc::new(Shared {
        phase: AtomicU8::new(PHASE_WARMUP),
        tickets: AtomicU64::new(0),
        measured: AtomicU64::new(0),
        limit_hit: tokio::sync::Notify::new(),
    });
    let scheme_authority = format!(
        "{}://{}",
        if ep.tls.is_some() { "https" } else { "http" },
        ep.addr
    );
    let uri = |route: Route| -> Uri {
        let path = ep.path.as_deref().unwrap_or(route.path());
        let text = match ep.proto {
            // HTTP/1.1: origin form plus a Host header.
            Proto::H1 => path.to_owned(),
            // HTTP/2: absolute form, hyper derives :scheme and :authority.
            Proto::H2 => format!("{scheme_authority}{path}"),
        };
        text.parse().unwrap_or_else(|_| Uri::from_static("/"))
    };
    let uris = crate::scenario::ROUTES.map(uri);
    let host = HeaderValue::from_str(&ep.addr.to_string())
        .unwrap_or_else(|_| HeaderValue::from_static("127.0.0.1"));
    let start = Instant::now();
    let mut handles = Vec::with_capacity(senders.len());
    for sender in senders {
        let w = Worker {
            spec: spec.clone(),
            shared: shared.clone(),
            classifier: Classifier::default(),
            uris: uris.clone(),
            host: host.clone(),
            sender,
            start,
            hist: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)?,
            ok: 0,
            failed: 0,
            errors: BTreeMap::new(),
            outcomes: Vec::new(),
        };
        handles.push(tokio::spawn(w.run()));
    }

    // Warm-up.
    let warm_end = start + spec.warmup;
    while Instant::now() < warm_end {
        tick(Phase::Warmup);
        tokio::time::sleep(Duration::from_millis(200).min(warm_end - Instant::now())).await;
    }
    shared.phase.store(PHASE_MEASURE, Ordering::Release);
    tick(Phase::Measure(0));
    let measure_start = Instant::now();
    let measure_end = measure_start + spec.duration;
    loop {
        let now = Instant::now();
        let done = shared.measured.load(Ordering::Relaxed);
        if now >= measure_end || spec.requests.is_some_and(|n| done >= n) {
            break;
        }
        tick(Phase::Measure(done));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200).min(measure_end - now)) => {}
            _ = shared.limit_hit.notified() => {}
        }
    }
    shared.phase.store(PHASE_DONE, Ordering::Release);
    let elapsed = measure_start.elapsed();
    let measured = shared.measured.load(Ordering::Relaxed);
    tick(Phase::Done(
        spec.requests.map_or(measured, |n| measured.min(n)),
    ));

    // Drain: in-flight requests finish (bounded by their timeout).
    let mut report = LoadReport {
        elapsed,
        ok: 0,
        failed: 0,
        errors: BTreeMap::new(),
        outcomes: BTreeMap::new(),
        histogram: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)?,
        tickets: 0,
    };
    let mut outcomes: Vec<(usize, Outcome, u64)> = Vec::new();
    for h in handles {
        let r = h.await?;
        report.ok += r.ok;
        report.failed += r.failed;
        // Same bounds everywhere, so adding cannot fail.
        let _ = report.histogram.add(&r.hist);
        for (k, v) in r.errors {
            *report.errors.entry(k).or_default() += v;
        }
        for (t, o, n) in r.outcomes {
            match outcomes.iter_mut().find(|(a, b, _)| *a == t && *b == o) {
                Some(e) => e.2 += n,
                None => outcomes.push((t, o, n)),
            }
        }
    }
    report.tickets = shared.tickets.load(Ordering::Relaxed);
    for (t, o, n) in outcomes {
        let label = spec.workload.templates.get(t).map_or("?", |t| t.label);
        *report.outcomes.entry(format!("{label}: {o}")).or_default() += n;
    }
    Ok(report)
}

/// Awaits all futures concurrently (a small join_all without extra deps).
async fn futures_join<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}

// === impl Worker ===

impl Worker {
    async fn run(mut self) -> WorkerResult {
        let spec = self.spec.clone();
        let interval = spec.rate.filter(|r| *r > 0.0).map(|r| 1.0 / r);
        loop {
            if self.shared.phase.load(Ordering::Acquire) == PHASE_DONE {
                break;
            }
            let ticket = self.shared.tickets.fetch_add(1, Ordering::Relaxed);
            // Open loop: the request's intended time; wait for it if early.
            let intended = match interval {
                Some(i) => {
                    let due = self.start + Duration::from_secs_f64(ticket as f64 * i);
                    tokio::time::sleep_until(due.into()).await;
                    if self.shared.phase.load(Ordering::Acquire) == PHASE_DONE {
                        break;
                    }
                    due
                }
                None => Instant::now(),
            };
            let (index, template) = spec.workload.pick(ticket);
            let pool = match template.pool {
                Pool::Reader => &spec.tokens.reader,
                Pool::Operator => &spec.tokens.operator,
                Pool::Capped => &spec.tokens.capped,
                Pool::Scale if spec.tokens.scale.is_empty() => &spec.tokens.reader,
                Pool::Scale => &spec.tokens.scale,
            };
            let run = (spec.ticket_base + ticket) / spec.calls_per_run.max(1);
            let token = pool
                .get((run % pool.len().max(1) as u64) as usize)
                .cloned()
                .unwrap_or_else(|| HeaderValue::from_static("Bearer none"));
            let mut req = Request::new(Full::new(template.body.clone()));
            *req.method_mut() = Method::POST;
            *req.uri_mut() = self.uris[template.route.index()].clone();
            let h = req.headers_mut();
            if matches!(self.sender, Sender::H1(_)) {
                h.insert(HOST, self.host.clone());
            }
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            h.insert(
                ACCEPT,
                HeaderValue::from_static("application/json, text/event-stream"),
            );
            h.insert(AUTHORIZATION, token);
            if let Some(v) = &template.version {
                h.insert(MCP_PROTOCOL_VERSION.clone(), v.clone());
            }
            let expect = if spec.firewall {
                template.firewall
            } else {
                template.plain
            };
            let answer = tokio::time::timeout(spec.timeout, self.sender.send(req)).await;
            let done = Instant::now();
            let measuring = self.shared.phase.load(Ordering::Acquire) == PHASE_MEASURE;
            let failure: Option<String> = match &answer {
                Ok(Ok((status, body))) => {
                    let outcome = self.classifier.classify(*status, body);
                    if measuring {
                        match self
                            .outcomes
                            .iter_mut()
                            .find(|(t, o, _)| *t == index && *o == outcome)
                        {
                            Some(e) => e.2 += 1,
                            None => self.outcomes.push((index, outcome, 1)),
                        }
                    }
                    check(template.label, expect, outcome)
                }
                Ok(Err(e)) => Some(transport_label(e).to_owned()),
                Err(_) => Some(format!("timeout after {:?}", spec.timeout)),
            };
            if measuring {
                let n = self.shared.measured.fetch_add(1, Ordering::Relaxed);
                // With a request limit, exactly that many answers count.
                if spec.requests.is_none_or(|limit| n < limit) {
                    let us = u64::try_from(done.duration_since(intended).as_micros())
                        .unwrap_or(MAX_LATENCY_US)
                        .clamp(1, MAX_LATENCY_US);
                    let _ = self.hist.record(us);
                    match &failure {
                        None => self.ok += 1,
                        Some(label) => {
                            self.failed += 1;
                            *self.errors.entry(label.clone()).or_default() += 1;
                        }
                    }
                }
                if spec.requests == Some(n + 1) {
                    self.shared.phase.store(PHASE_DONE, Ordering::Release);
                    self.shared.limit_hit.notify_one();
                }
            }
            if !matches!(answer, Ok(Ok(_))) {
                // The connection may be gone: open a fresh one.
                match connect(&spec.endpoint).await {
                    Ok(s) => self.sender = s,
                    Err(e) => {
                        if measuring {
                            *self.errors.entry(format!("reconnect: {e}")).or_default() += 1;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
        WorkerResult {
            hist: self.hist,
            ok: self.ok,
            failed: self.failed,
            errors: self.errors,
            outcomes: self.outcomes,
        }
    }
}

/// `None` when `outcome` is expected, else the failure label.
fn check(label: &str, expect: Expect, outcome: Outcome) -> Option<String> {
    if expect.accepts(outcome) {
        None
    } else {
        Some(format!("{label}: got {outcome}, expected {expect}"))
    }
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
