//! OpenTelemetry traces, exported over OTLP/HTTP (JSON) when
//! `[telemetry.otlp] endpoint` is set, and nothing at all otherwise.
//!
//! A request gets a server span, the child of the agent's W3C
//! `traceparent` (the HTTP header, or `params._meta.traceparent` of its
//! first message); every message the firewall decided gets a child span
//! (method, tool, decision, stop reason, upstream, latency; never argument
//! values); the upstream receives a `traceparent` naming the request span,
//! so one trace runs from the agent through the firewall into the tool
//! server.
//!
//! Invariants: spans are handed to the SDK's batch processor, which exports
//! on its own thread through [`Exporter`] (a hyper client on the runtime):
//! the request path never waits for the collector; a full batch queue drops
//! spans, never blocks.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use serde::Deserialize;

use crate::audit::AuditRow;

/// `[telemetry]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// `[telemetry.otlp]`: where traces go (absent: no traces).
    #[serde(default)]
    pub otlp: Option<OtlpConfig>,
}

/// `[telemetry.otlp]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`; spans
    /// go to `/v1/traces` under it) or the full traces URL.
    pub endpoint: String,
    /// `service.name` of the spans.
    #[serde(default = "default_service")]
    pub service_name: String,
    /// Extra headers on every export (an API key, say).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Upper bound of one export.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Longest a finished span waits before it is exported.
    #[serde(default = "default_export_interval_ms")]
    pub export_interval_ms: u64,
    /// Spans queued for export at most; beyond, new spans are dropped.
    #[serde(default = "default_max_queue")]
    pub max_queue: usize,
}

fn default_export_interval_ms() -> u64 {
    1000
}

fn default_max_queue() -> usize {
    4096
}

fn default_service() -> String {
    "mcp-firewall".to_owned()
}

fn default_timeout_ms() -> u64 {
    5000
}

/// Why traces could not start.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The exporter refused its settings.
    #[error("telemetry.otlp: {0}")]
    Exporter(String),
}

/// The tracer of a firewall with traces on.
#[derive(Clone)]
pub struct Traces {
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
    tracer: opentelemetry_sdk::trace::SdkTracer,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces").finish_non_exhaustive()
    }
}

impl Traces {
    /// Starts the exporter (on the current runtime).
    pub fn start(cfg: &OtlpConfig) -> Result<Traces, TraceError> {
        use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
        let endpoint = if cfg.endpoint.trim_end_matches('/').ends_with("/v1/traces") {
            cfg.endpoint.clone()
        } else {
            format!("{}/v1/traces", cfg.endpoint.trim_end_matches('/'))
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpJson)
            .with_endpoint(endpoint)
            .with_timeout(Duration::from_millis(cfg.timeout_ms))
            .with_headers(cfg.headers.clone().into_iter().collect::<HashMap<_, _>>())
            .with_http_client(Exporter::new()?)
            .build()
            .map_err(|e| TraceError::Exporter(e.to_string()))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(cfg.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let batch = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                opentelemetry_sdk::trace::BatchConfigBuilder::default()
                    .with_scheduled_delay(Duration::from_millis(cfg.export_interval_ms.max(10)))
                    .with_max_queue_size(cfg.max_queue.max(16))
                    .build(),
            )
            .build();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_span_processor(batch)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("mcp-firewall");
        Ok(Traces { provider, tracer })
    }

    /// The span of one request on `/mcp/<upstream>`.
    pub fn request(
        &self,
        headers: &HeaderMap,
        meta_traceparent: Option<&str>,
        http_method: &str,
        upstream: &str,
    ) -> RequestTrace {
        let remote = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .or(meta_traceparent)
            .and_then(parse_traceparent);
        let parent = match remote {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::new(),
        };
        let span = self
            .tracer
            .span_builder(format!("MCP {http_method} /mcp/{upstream}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("http.request.method", http_method.to_owned()),
                KeyValue::new("mcp.upstream", upstream.to_owned()),
            ])
            .start_with_context(&self.tracer, &parent);
        RequestTrace {
            cx: parent.with_span(span),
            tracer: self.tracer.clone(),
        }
    }

    /// Exports what is queued and stops (at shutdown; blocks).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "traces: the last export failed");
        }
    }
}

/// The trace of one request: its span, and the children of its messages.
pub struct RequestTrace {
    cx: Context,
    tracer: opentelemetry_sdk::trace::SdkTracer,
}

impl RequestTrace {
    /// The request span's `traceparent`, for the upstream.
    pub fn traceparent(&self) -> Option<HeaderValue> {
        let sc = self.cx.span().span_context().clone();
        let v = format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        );
        HeaderValue::from_str(&v).ok()
    }

    /// The trace id (hex), for the audit row.
    pub fn trace_id(&self) -> String {
        self.cx.span().span_context().trace_id().to_string()
    }

    /// A finished child span for one decided message, from its audit row.
    pub fn message(&self, row: &AuditRow) {
        let start = UNIX_EPOCH + Duration::from_millis(row.time_ms);
        let end = start + Duration::from_micros(row.latency_us);
        let name = if row.tool.is_empty() {
            row.method.to_string()
        } else {
            format!("{} {}", row.method, row.tool)
        };
        let mut attrs = vec![
            KeyValue::new("mcp.method", row.method.to_string()),
            KeyValue::new("mcp.decision", row.decision.to_string()),
            KeyValue::new("mcp.upstream", row.upstream.clone()),
            KeyValue::new("mcp.latency_us", row.latency_us as i64),
        ];
        if !row.tool.is_empty() {
            attrs.push(KeyValue::new("mcp.tool", row.tool.clone()));
        }
        if !row.stop_reason.is_empty() {
            attrs.push(KeyValue::new(
                "mcp.stop_reason",
                row.stop_reason.to_string(),
            ));
        }
        if row.upstream_status != 0 {
            attrs.push(KeyValue::new(
                "http.response.status_code",
                i64::from(row.upstream_status),
            ));
        }
        let mut span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes(attrs)
            .start_with_context(&self.tracer, &self.cx);
        if row.is_error {
            span.set_status(Status::error(row.stop_reason.to_string()));
        }
        span.end_with_timestamp(end.max(start));
    }

    /// Records the answer's HTTP status on the request span.
    pub fn status(&self, status: u16) {
        self.cx.span().set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
    }
}

/// A W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), or `None`.
pub(crate) fn parse_traceparent(v: &str) -> Option<SpanContext> {
    let mut parts = v.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2
        || version == "ff"
        || trace.len() != 32
        || span.len() != 16
        || flags.len() != 2
    {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    ))
}

/// The exporter's HTTP client: hyper on the firewall's runtime, reached from
/// the batch processor's thread through a spawned task.
#[derive(Clone)]
pub(crate) struct Exporter {
    handle: tokio::runtime::Handle,
    client: hyper_util::client::legacy::Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        Full<Bytes>,
    >,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").finish_non_exhaustive()
    }
}

impl Exporter {
    fn new() -> Result<Exporter, TraceError> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|e| TraceError::Exporter(format!("no runtime: {e}")))?;
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(https);
        Ok(Exporter { handle, client })
    }
}

type Answer = Result<Response<Bytes>, opentelemetry_http::HttpError>;

impl opentelemetry_http::HttpClient for Exporter {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Answer> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        let client = self.client.clone();
        let task = self.handle.spawn(async move {
            let (parts, body) = request.into_parts();
            let resp = client
                .request(Request::from_parts(parts, Full::new(body)))
                .await?;
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await?.to_bytes();
            Ok::<_, opentelemetry_http::HttpError>(Response::from_parts(parts, bytes))
        });
        Box::pin(async move { task.await? })
    }
}
