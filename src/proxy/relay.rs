//! Relaying an upstream's response to the client, and the policy's view of
//! what comes back.
//!
//! - `202` and other bodiless answers pass through as they are.
//! - `application/json` bodies are read up to the response cap, inspected and
//!   sent whole, so a connection that breaks mid-body still becomes a readable
//!   JSON-RPC error instead of a truncated document. A body over the cap is
//!   streamed on unmodified when nothing in it needs rewriting.
//! - `text/event-stream` bodies are relayed event by event as they arrive: a
//!   progress notification reaches the client while the call still runs.
//!   Only the partial event in flight is held in memory (capped); events the
//!   firewall does not change are forwarded byte for byte, keeping `id:` and
//!   `retry:` so resumption works. When the stream breaks, every request still
//!   waiting for its answer gets a JSON-RPC error event naming the upstream.
//! - Upstream 5xx answers become a JSON-RPC error naming the upstream.
//!
//! What is inspected, in both JSON and SSE:
//! - answers to `tools/list`, `prompts/list`, `resources/list` and
//!   `resources/templates/list` are filtered for the run (and tools
//!   re-annotated from the policy's risk); listed tools feed the catalog;
//! - `notifications/tools/list_changed` clears the upstream's catalog;
//! - server-to-client requests (`sampling/createMessage`, `elicitation/create`,
//!   `roots/list`, and the same inside 2026-07-28 input-required results) are
//!   checked against the policy; a refused one never reaches the client, and
//!   the upstream gets a JSON-RPC error in the client's place.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName};
use http::{header, HeaderValue, Method, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::json;
use serde_json::value::RawValue;

use crate::audit::AuditRow;
use crate::mcp::jsonrpc::{self, Id, Kind, Message};
use crate::mcp::{rewrite, sse};
use crate::policy::Access;
use crate::server::listener::ConnInfo;

use super::body::{full, Body, BoxError, Collected, UpstreamBody, UpstreamIncoming};
use super::decide::RunContext;
use super::error::{codes, ProxyError, UpstreamFailure};
use super::record::{OpenRow, Recorder};
use super::upstream::{response_headers, Forward};
use crate::budget::{Reservation, Settle};
use crate::outcome::StopReason;

/// A request forwarded upstream whose answer the firewall waits for.
#[derive(Debug, Clone)]
pub struct Pending {
    /// Its JSON-RPC id.
    pub id: Id,
    /// Its method.
    pub method: String,
    /// The tool, for `tools/call`.
    pub tool: Option<String>,
    /// The budget reserved for it, settled when its answer (or failure) comes.
    pub reservation: Option<Reservation>,
}

/// Everything the relay needs to know about one exchange.
pub struct Exchange {
    cx: Arc<RunContext>,
    pending: Vec<Pending>,
    max_sse_event_bytes: usize,
    /// JSON-RPC answers the firewall produced itself for parts of a batch,
    /// merged into the upstream's answer.
    local_answers: Vec<Bytes>,
    /// How to answer the upstream in the client's place (refused
    /// server-to-client requests): the session headers and the connection.
    reply: Option<Reply>,
    /// Audit rows waiting for the upstream's answers.
    audit: Option<Audit>,
}

struct Audit {
    recorder: Recorder,
    open: Vec<OpenRow>,
    upstream_started: Instant,
    status: u16,
    bytes_out: usize,
}

struct Reply {
    headers: HeaderMap,
    conn: ConnInfo,
    identity: Vec<(HeaderName, HeaderValue)>,
}

// === impl Exchange ===

impl Exchange {
    /// An exchange for `pending` requests of the run in `cx`.
    pub fn new(
        cx: Arc<RunContext>,
        pending: Vec<Pending>,
        max_sse_event_bytes: usize,
        local_answers: Vec<Bytes>,
    ) -> Self {
        Exchange {
            cx,
            pending,
            max_sse_event_bytes,
            local_answers,
            reply: None,
            audit: None,
        }
    }

    /// Rows to complete with the upstream's answers and write before those
    /// answers reach the client.
    pub fn with_audit(mut self, recorder: Recorder, open: Vec<OpenRow>) -> Self {
        if recorder.enabled() {
            self.audit = Some(Audit {
                recorder,
                open,
                upstream_started: Instant::now(),
                status: 0,
                bytes_out: 0,
            });
        }
        self
    }

    /// Completes the open row answering `id`, if any.
    fn close_row(&mut self, id: &Id, answer: &str) -> Option<AuditRow> {
        let a = self.audit.as_mut()?;
        let pos = a.open.iter().position(|r| r.id.as_ref() == Some(id))?;
        let open = a.open.swap_remove(pos);
        Some(a.recorder.close(
            open,
            Some(answer),
            a.status,
            a.upstream_started,
            a.bytes_out,
        ))
    }

    /// Writes `rows` plus, when `all`, every row still open (forwarded
    /// notifications and responses, requests the upstream did not answer).
    async fn write_rows(&mut self, mut rows: Vec<AuditRow>, all: bool) {
        let Some(a) = self.audit.as_mut() else { return };
        if all {
            for open in std::mem::take(&mut a.open) {
                rows.push(
                    a.recorder
                        .close(open, None, a.status, a.upstream_started, a.bytes_out),
                );
            }
        }
        a.recorder.write(rows).await;
    }

    /// Lets the relay answer refused server-to-client requests on the
    /// client's session.
    pub fn with_reply(
        mut self,
        client: &HeaderMap,
        conn: ConnInfo,
        identity: Vec<(HeaderName, HeaderValue)>,
    ) -> Self {
        let mut headers = super::upstream::own_post_headers();
        for name in ["mcp-session-id", "mcp-protocol-version"] {
            // Copied, not cloned: a clone shares the client connection's read
            // buffer, which would then stay allocated for the stream's life.
            if let Some(v) = client
                .get(name)
                .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok())
            {
                headers.insert(HeaderName::from_static(name), v);
            }
        }
        self.reply = Some(Reply {
            headers,
            conn,
            identity,
        });
        self
    }

    /// The error for a failed upstream, answering every pending request;
    /// the open audit rows are written as failed first.
    pub async fn fail(mut self, failure: UpstreamFailure) -> ProxyError {
        self.record_failure(&failure).await;
        ProxyError::Upstream {
            upstream: self.cx.upstream.config.name.clone(),
            failure,
            ids: self.pending.iter().map(|p| p.id.clone()).collect(),
        }
    }

    /// Closes the budget reservation of pending request `pos` and counts its
    /// outcome. `failure`: how the upstream failed, if it did.
    fn settle(&mut self, pos: usize, raw: &str, failure: Option<&UpstreamFailure>) {
        let cx = self.cx.clone();
        let Some(p) = self.pending.get_mut(pos) else {
            return;
        };
        let Some(r) = p.reservation.take() else {
            return;
        };
        let how = match failure {
            // It never reached the upstream: nothing ran, nothing is spent.
            Some(UpstreamFailure::Connect(_)) => Settle::NotExecuted,
            Some(_) => Settle::Executed { reported: None },
            None => Settle::Executed {
                reported: reported_cost(raw, &cx.budgets.config().cost_meta_key),
            },
        };
        cx.budgets.settle(&r, how);
        let stop = if failure.is_some() {
            StopReason::UpstreamError
        } else {
            StopReason::Done
        };
        if let Some(tool) = &p.tool {
            cx.metrics.call(
                &cx.upstream.config.name,
                &super::tool_label(&cx, tool),
                stop,
            );
        }
    }

    async fn record_failure(&mut self, failure: &UpstreamFailure) {
        for pos in 0..self.pending.len() {
            self.settle(pos, "", Some(failure));
        }
        if let Some(a) = self.audit.as_mut() {
            let cause = failure.to_string();
            let rows: Vec<AuditRow> = std::mem::take(&mut a.open)
                .into_iter()
                .map(|open| {
                    a.recorder
                        .failed(open, &cause, a.status, a.upstream_started)
                })
                .collect();
            a.recorder.write(rows).await;
        }
    }

    /// Turns the upstream's response into the client's.
    pub async fn respond(
        mut self,
        resp: Response<UpstreamIncoming>,
    ) -> Result<Response<Body>, ProxyError> {
        let (parts, incoming) = resp.into_parts();
        if let Some(a) = self.audit.as_mut() {
            a.status = parts.status.as_u16();
        }
        let idle = self.cx.upstream.config.idle_timeout;
        let mut body = UpstreamBody::new(incoming, idle);

        if parts.status.is_server_error() {
            // Drain a little so the pooled connection can be reused; the
            // content is the upstream's business, the status is the cause.
            let _ = body.collect_bounded(64 * 1024).await;
            return Err(self
                .fail(UpstreamFailure::Status(parts.status.as_u16()))
                .await);
        }

        let mut headers = response_headers(&parts.headers);
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let is_sse = mime_is(content_type, "text/event-stream");
        let is_json = mime_is(content_type, "application/json");
        if self.filters() {
            // The answer now depends on who asked.
            headers.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, no-store"),
            );
            headers.insert(
                header::VARY,
                HeaderValue::from_static("authorization, x-tool-token"),
            );
        }

        if parts.status == StatusCode::ACCEPTED || (!is_sse && !is_json) {
            self.write_rows(Vec::new(), true).await;
            if !self.local_answers.is_empty() && parts.status == StatusCode::ACCEPTED {
                // The upstream accepted the notifications/responses of a
                // batch; the firewall still owes answers for what it refused.
                let merged = merge_json(None, &self.local_answers);
                return Ok(json_with(StatusCode::OK, headers, merged));
            }
            let mut r = Response::new(passthrough(body));
            *r.status_mut() = parts.status;
            *r.headers_mut() = headers;
            return Ok(r);
        }

        if is_sse {
            headers.insert(
                HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            );
            let relay = SseRelay {
                body,
                decoder: sse::Decoder::new(self.max_sse_event_bytes),
                ex: self,
                done: false,
                started: false,
            };
            let stream = futures_util::stream::unfold(relay, |mut relay| async move {
                let next = relay.next().await?;
                Some((Ok::<_, BoxError>(Frame::data(next)), relay))
            });
            let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
            *r.status_mut() = parts.status;
            *r.headers_mut() = headers;
            return Ok(r);
        }

        // application/json
        let limit = self.cx.upstream.config.max_response_bytes;
        let collected = match body.collect_bounded(limit).await {
            Ok(c) => c,
            Err(f) => return Err(self.fail(f).await),
        };
        match collected {
            Collected::Complete(bytes) => {
                let (out, rows) = match self.inspect_json(bytes) {
                    Ok(x) => x,
                    Err(f) => return Err(self.fail(f).await),
                };
                if let Some(a) = self.audit.as_mut() {
                    a.bytes_out = out.len();
                }
                // The answers are on record before they leave.
                self.write_rows(rows, true).await;
                Ok(json_with(parts.status, headers, out))
            }
            Collected::Partial(prefix) => {
                if self.filters() {
                    return Err(self.fail(UpstreamFailure::TooLarge(limit)).await);
                }
                self.write_rows(Vec::new(), true).await;
                let head =
                    futures_util::stream::once(
                        async move { Ok::<_, BoxError>(Frame::data(prefix)) },
                    );
                let rest = http_body_util::BodyStream::new(passthrough(body));
                let mut r = Response::new(
                    StreamBody::new(futures_util::StreamExt::chain(head, rest)).boxed_unsync(),
                );
                *r.status_mut() = parts.status;
                *r.headers_mut() = headers;
                Ok(r)
            }
        }
    }

    /// Whether some pending answer is rewritten for the run.
    fn filters(&self) -> bool {
        self.pending.iter().any(|p| is_list(&p.method))
    }

    /// Inspects a complete JSON answer (one message or a batch of them);
    /// returns what to send and the audit rows it completes.
    fn inspect_json(&mut self, bytes: Bytes) -> Result<(Bytes, Vec<AuditRow>), UpstreamFailure> {
        let env = match jsonrpc::parse_upstream(&bytes) {
            Ok(env) => env,
            Err(e) => {
                // What the firewall must filter and cannot read never passes.
                if self.filters() {
                    return Err(UpstreamFailure::Invalid(e.to_string()));
                }
                return Ok((merge_if(bytes, &self.local_answers), Vec::new()));
            }
        };
        let text = std::str::from_utf8(&bytes).unwrap_or("");
        let mut replaced: Vec<(std::ops::Range<usize>, String)> = Vec::new();
        let mut rows = Vec::new();
        for m in &env.messages {
            let raw = text.get(m.span.clone()).unwrap_or("");
            let new = self.on_message(m, raw)?;
            if let (Kind::Response, Some(id)) = (m.kind, &m.id) {
                rows.extend(self.close_row(id, new.as_deref().unwrap_or(raw)));
            }
            if let Some(new) = new {
                replaced.push((m.span.clone(), new));
            }
        }
        let out = if replaced.is_empty() {
            bytes
        } else {
            let mut out = String::with_capacity(bytes.len());
            let mut at = 0;
            for (span, new) in &replaced {
                out.push_str(text.get(at..span.start).unwrap_or(""));
                out.push_str(new);
                at = span.end;
            }
            out.push_str(text.get(at..).unwrap_or(""));
            Bytes::from(out)
        };
        Ok((merge_if(out, &self.local_answers), rows))
    }

    /// Inspects one upstream message; returns its replacement, if any.
    /// An error means the message cannot be let through as it is.
    fn on_message(&mut self, m: &Message, raw: &str) -> Result<Option<String>, UpstreamFailure> {
        match m.kind {
            Kind::Response => {
                let Some(id) = &m.id else { return Ok(None) };
                let Some(pos) = self.pending.iter().position(|p| &p.id == id) else {
                    // An answer the firewall did not ask for in this exchange
                    // (resumed streams): filter lists by their shape.
                    return self.filter_unknown_response(raw);
                };
                if m.is_error {
                    self.settle(pos, raw, None);
                    self.pending.swap_remove(pos);
                    return Ok(None);
                }
                self.settle(pos, raw, None);
                let outcome = match self.pending[pos].method.as_str() {
                    "tools/list" => self.filter_listed_tools(m, raw).map(Some),
                    "prompts/list" => self.filter_named(raw, "prompts", "name").map(Some),
                    "resources/list" => self.filter_named(raw, "resources", "uri").map(Some),
                    "resources/templates/list" => self
                        .filter_named(raw, "resourceTemplates", "uriTemplate")
                        .map(Some),
                    "tools/call" | "prompts/get" | "resources/read" => {
                        self.check_input_required(m, raw)
                    }
                    _ => Ok(None),
                };
                // A request whose answer cannot pass stays pending, so it is
                // answered with the upstream error.
                if outcome.is_ok() {
                    self.pending.swap_remove(pos);
                }
                outcome
            }
            Kind::Notification => {
                if m.method.as_deref() == Some("notifications/tools/list_changed") {
                    self.cx.catalogs.clear(&self.cx.upstream.config.name);
                }
                Ok(None)
            }
            Kind::Request => Ok(None),
        }
    }

    fn filter_unknown_response(&self, raw: &str) -> Result<Option<String>, UpstreamFailure> {
        if raw.contains("\"tools\"") {
            // A resumed answer that looks like a tool list is filtered like one.
            if let Ok(out) = self.filter_tools(raw) {
                return Ok(Some(out));
            }
        }
        Ok(None)
    }

    /// The answer to a `tools/list` this exchange sent: its `result` is
    /// replaced by the run's view of it (remembered by the catalog when the
    /// upstream repeats itself), the rest of the message is kept as is.
    fn filter_listed_tools(&self, m: &Message, raw: &str) -> Result<String, UpstreamFailure> {
        let Some(at) = m.result.as_ref().and_then(|r| {
            Some(r.start.checked_sub(m.span.start)?..r.end.checked_sub(m.span.start)?)
        }) else {
            return self.filter_tools(raw);
        };
        let (Some(head), Some(result), Some(tail)) =
            (raw.get(..at.start), raw.get(at.clone()), raw.get(at.end..))
        else {
            return self.filter_tools(raw);
        };
        let cx = &self.cx;
        let view = cx
            .catalogs
            .view(
                &cx.upstream.config.name,
                cx.policy.generation(),
                &cx.authority,
                result,
                || rewrite::tools_result(result, |t| self.listed_tool(t)),
            )
            .map_err(|e| UpstreamFailure::Invalid(e.to_string()))?;
        let mut out = String::with_capacity(head.len() + view.len() + tail.len());
        out.push_str(head);
        out.push_str(&view);
        out.push_str(tail);
        Ok(out)
    }

    fn filter_tools(&self, raw: &str) -> Result<String, UpstreamFailure> {
        rewrite::tools_list(raw, |t| self.listed_tool(t))
            .map_err(|e| UpstreamFailure::Invalid(e.to_string()))
    }

    /// Records one listed tool in the catalog and decides whether (and with
    /// which risk and gate) the run sees it.
    fn listed_tool(
        &self,
        t: &rewrite::ListedTool<'_>,
    ) -> Option<(crate::policy::Risk, crate::policy::Gate)> {
        let cx = &self.cx;
        let up = &cx.upstream.config;
        let entry = cx.catalogs.record_listed(&up.name, t);
        if entry.param_headers().violation().is_some() {
            // MCP clients must drop tools with invalid x-mcp-header
            // annotations; the firewall drops them first.
            return None;
        }
        match cx.policy.access(&cx.authority, up, t.name, entry.hints) {
            Access::Visible { risk, gate, .. } => Some((risk, gate)),
            Access::Hidden(_) => None,
        }
    }

    fn filter_named(&self, raw: &str, array: &str, key: &str) -> Result<String, UpstreamFailure> {
        let cx = &self.cx;
        let up = &cx.upstream.config;
        let prompts = array == "prompts";
        rewrite::named_list(raw, array, key, |name| {
            if prompts {
                cx.policy.prompt_allowed(&cx.authority, up, name)
            } else {
                cx.policy.resource_allowed(&cx.authority, up, name)
            }
        })
        .map_err(|e| UpstreamFailure::Invalid(e.to_string()))
    }

    /// 2026-07-28 input-required results carry server-to-client requests; a
    /// kind the policy refuses turns the answer into an error.
    fn check_input_required(
        &self,
        m: &Message,
        raw: &str,
    ) -> Result<Option<String>, UpstreamFailure> {
        if !raw.contains("input_required") {
            return Ok(None);
        }
        #[derive(serde::Deserialize)]
        struct Result<'a> {
            #[serde(borrow, rename = "inputRequests")]
            input_requests: Option<std::collections::BTreeMap<String, InputRequest<'a>>>,
        }
        #[derive(serde::Deserialize)]
        struct InputRequest<'a> {
            #[serde(borrow)]
            method: &'a str,
        }
        #[derive(serde::Deserialize)]
        struct Resp<'a> {
            #[serde(borrow)]
            result: Option<&'a RawValue>,
        }
        let Ok(Resp {
            result: Some(result),
        }) = serde_json::from_str::<Resp>(raw)
        else {
            return Ok(None);
        };
        let Ok(parsed) = serde_json::from_str::<Result>(result.get()) else {
            return Ok(None);
        };
        let refused: Vec<&str> = parsed
            .input_requests
            .iter()
            .flatten()
            .map(|(_, r)| r.method)
            .filter(|method| !self.server_request_allowed(method))
            .collect();
        if refused.is_empty() {
            return Ok(None);
        }
        let body = jsonrpc::error_body(
            m.id.as_ref(),
            codes::DENIED,
            &format!(
                "the upstream asked the client for {}, which the policy refuses",
                refused.join(", ")
            ),
            Some(&json!({ "stop_reason": "denied", "refused": refused })),
        );
        Ok(Some(String::from_utf8_lossy(&body).into_owned()))
    }

    fn server_request_allowed(&self, method: &str) -> bool {
        let rules = self.cx.policy.server_requests();
        match method {
            "sampling/createMessage" => rules.sampling,
            "elicitation/create" => rules.elicitation,
            "roots/list" => rules.roots,
            // ping and anything else harmless passes.
            _ => true,
        }
    }

    /// A legacy server-to-client request the policy refuses: the client never
    /// sees it; the upstream gets an error answer on the client's session.
    fn refuse_server_request(&self, m: &Message) {
        let (Some(id), Some(reply)) = (&m.id, &self.reply) else {
            return;
        };
        let method = m.method.as_deref().unwrap_or("");
        tracing::info!(upstream = %self.cx.upstream.config.name, method, "server-to-client request refused by policy");
        let body = jsonrpc::error_body(
            Some(id),
            jsonrpc::METHOD_NOT_FOUND,
            &format!("{method} is not permitted by the firewall's policy"),
            None,
        );
        let up = self.cx.upstream.clone();
        let headers = reply.headers.clone();
        let conn = reply.conn;
        let identity = reply.identity.clone();
        tokio::spawn(async move {
            let fwd = Forward {
                method: Method::POST,
                headers: &headers,
                query: None,
                body,
                conn,
                set: &identity,
            };
            if let Err(e) = up.send(fwd).await {
                tracing::warn!(upstream = %up.config.name, error = %e, "could not answer a refused server request");
            }
        });
    }
}

/// Streams an SSE response event by event.
struct SseRelay {
    body: UpstreamBody,
    decoder: sse::Decoder,
    ex: Exchange,
    done: bool,
    started: bool,
}

impl SseRelay {
    /// The next bytes to send to the client; `None` when the stream is over.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            let mut out = BytesMut::new();
            if !self.started {
                self.started = true;
                for answer in std::mem::take(&mut self.ex.local_answers) {
                    sse::encode_message(None, &answer, &mut out);
                }
                if !out.is_empty() {
                    return Some(out.freeze());
                }
            }
            match self.body.chunk().await {
                Ok(Some(chunk)) => {
                    if let Err(e) = self.decoder.push(&chunk) {
                        return self.end(UpstreamFailure::Invalid(e.to_string())).await;
                    }
                    let mut rows = Vec::new();
                    while let Some(ev) = self.decoder.next_event() {
                        if let Err(f) = self.on_event(ev, &mut out, &mut rows) {
                            // Whatever was decided so far still goes out first.
                            self.ex.write_rows(rows, false).await;
                            let tail = self.end(f).await;
                            out.extend_from_slice(&tail.unwrap_or_default());
                            return Some(out.freeze());
                        }
                    }
                    if let Some(a) = self.ex.audit.as_mut() {
                        a.bytes_out += out.len();
                    }
                    // Answers are on record before they are relayed.
                    self.ex.write_rows(rows, false).await;
                    if !out.is_empty() {
                        return Some(out.freeze());
                    }
                }
                Ok(None) => {
                    self.done = true;
                    self.ex.write_rows(Vec::new(), true).await;
                    return None;
                }
                Err(f) => return self.end(f).await,
            }
        }
    }

    fn on_event(
        &mut self,
        ev: sse::Event,
        out: &mut BytesMut,
        rows: &mut Vec<AuditRow>,
    ) -> Result<(), UpstreamFailure> {
        if !ev.has_data || ev.data.is_empty() {
            out.extend_from_slice(&ev.raw);
            return Ok(());
        }
        let env = match jsonrpc::parse_upstream(ev.data.as_bytes()) {
            Ok(env) => env,
            Err(_) => {
                if self.ex.filters() {
                    // Cannot tell whether this is the list to filter.
                    return Err(UpstreamFailure::Invalid(
                        "unreadable SSE event while a list answer is pending".to_owned(),
                    ));
                }
                out.extend_from_slice(&ev.raw);
                return Ok(());
            }
        };
        let [m] = env.messages.as_slice() else {
            // A batch inside one event (2025-03-26): relayed as is unless it
            // answers something the firewall filters.
            if env.messages.iter().any(|m| {
                self.ex
                    .pending
                    .iter()
                    .any(|p| Some(&p.id) == m.id.as_ref() && is_list(&p.method))
            }) {
                return Err(UpstreamFailure::Invalid(
                    "batched answer to a filtered list".to_owned(),
                ));
            }
            out.extend_from_slice(&ev.raw);
            return Ok(());
        };
        if m.kind == Kind::Request {
            let method = m.method.as_deref().unwrap_or("");
            if !self.ex.server_request_allowed(method) {
                self.ex.refuse_server_request(m);
                return Ok(());
            }
        }
        let new = self.ex.on_message(m, &ev.data)?;
        if let (Kind::Response, Some(id)) = (m.kind, &m.id) {
            rows.extend(self.ex.close_row(id, new.as_deref().unwrap_or(&ev.data)));
        }
        match new {
            None => out.extend_from_slice(&ev.raw),
            Some(new) => {
                let rewritten = sse::Event { data: new, ..ev };
                sse::encode(&rewritten, out);
            }
        }
        Ok(())
    }

    /// Ends a broken stream: every request still waiting gets an error event.
    async fn end(&mut self, failure: UpstreamFailure) -> Option<Bytes> {
        self.done = true;
        self.ex.record_failure(&failure).await;
        let name = self.ex.cx.upstream.config.name.clone();
        tracing::warn!(upstream = %name, error = %failure, "upstream stream failed");
        let mut out = BytesMut::new();
        let msg = format!("upstream {name:?} failed: {failure}");
        let data = json!({
            "upstream": name,
            "cause": failure.to_string(),
            "stop_reason": "upstream_error",
        });
        for p in std::mem::take(&mut self.ex.pending) {
            let body = jsonrpc::error_body(Some(&p.id), codes::UPSTREAM_ERROR, &msg, Some(&data));
            sse::encode_message(None, &body, &mut out);
        }
        if out.is_empty() {
            None
        } else {
            Some(out.freeze())
        }
    }
}

/// The cost an upstream reports in a `tools/call` result's `_meta[key]`.
fn reported_cost(raw: &str, key: &str) -> Option<f64> {
    if raw.is_empty() || !raw.contains(key) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(raw).ok()?;
    v.get("result")?.get("_meta")?.get(key)?.as_f64()
}

fn is_list(method: &str) -> bool {
    matches!(
        method,
        "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list"
    )
}

/// A body that forwards the upstream's chunks as they come.
fn passthrough(body: UpstreamBody) -> Body {
    let stream = futures_util::stream::unfold(body, |mut body| async move {
        match body.chunk().await {
            Ok(Some(chunk)) => Some((Ok(Frame::data(chunk)), body)),
            Ok(None) => None,
            Err(f) => Some((Err(Box::new(f) as BoxError), body)),
        }
    });
    StreamBody::new(stream).boxed_unsync()
}

fn json_with(status: StatusCode, mut headers: HeaderMap, body: Bytes) -> Response<Body> {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    r
}

fn merge_if(upstream: Bytes, local: &[Bytes]) -> Bytes {
    if local.is_empty() {
        upstream
    } else {
        merge_json(Some(&upstream), local)
    }
}

/// Merges the upstream's JSON answer (an object or an array) with the
/// firewall's own answers into one JSON array.
fn merge_json(upstream: Option<&Bytes>, local: &[Bytes]) -> Bytes {
    let mut out = Vec::with_capacity(
        upstream.map_or(0, Bytes::len)
            + local.iter().map(Bytes::len).sum::<usize>()
            + local.len()
            + 2,
    );
    out.push(b'[');
    let mut first = true;
    if let Some(u) = upstream {
        let t = u.trim_ascii();
        let inner = match (t.first(), t.last()) {
            (Some(b'['), Some(b']')) => t[1..t.len() - 1].trim_ascii(),
            _ => t,
        };
        if !inner.is_empty() {
            out.extend_from_slice(inner);
            first = false;
        }
    }
    for a in local {
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(a);
        first = false;
    }
    out.push(b']');
    Bytes::from(out)
}

/// `true` when a Content-Type's media type (parameters ignored) is `expected`.
pub fn mime_is(content_type: &str, expected: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|m| m.trim().eq_ignore_ascii_case(expected))
}
