//! The answer side: everything the upstream sends toward the client, the
//! one relay every POST, GET, DELETE and approved held call goes through.
//! Read it in this order:
//!
//! - [`decide`]: what happens to each upstream message, decided on what
//!   the strict reader accepted, without I/O (lists filtered, input
//!   requests policed, tasks sealed, server requests refused…);
//! - [`gate`]: **the one place every message passes before any byte of it
//!   leaves**: screened whole as it is about to leave, the run labelled
//!   by its source, withheld or redacted; its [`gate::FIELDS`] table says
//!   what of each message reaches the model;
//! - this file: the relay that carries bytes and verdicts — by status and
//!   content type, [`Exchange::respond`]; every JSON text (a whole answer,
//!   an SSE event, a batch) through [`Exchange::inspect`], each message
//!   through `on_message` (the verdict, then the gate, then its row);
//! - `lists.rs`, `task_answers.rs`: what the verdicts on lists and tasks
//!   rewrite; `event_stream.rs`: SSE event by event; `large.rs`: an answer too large
//!   to hold (only where the gate has nothing to do).
//!
//! By status and content type:
//! - **5xx**, and **401/407** (the upstream refused the firewall's own
//!   credentials: not the client's problem to solve): every request waiting
//!   for an answer gets a JSON-RPC error naming the upstream.
//! - **Other 4xx** reach the client with their status and body (a `404
//!   Session not found` makes the client re-initialize, as the spec
//!   requires), through the gate: a JSON body must be JSON-RPC error
//!   responses only (anything else is replaced by the firewall's error), a
//!   text body passes capped.
//! - **202/204**: accepted; nothing to inspect.
//! - **2xx JSON**: read whole up to `max_response_bytes` and inspected; a
//!   larger answer streams only where the gate has nothing to screen or
//!   label ([`gate::may_stream`]), else it is an upstream error.
//! - **2xx SSE**: event by event as they arrive (progress reaches the client
//!   while the call runs); events the firewall does not change are forwarded
//!   byte for byte except their `id:`, which is sealed with the stream's
//!   context ([`crate::session`]).
//! - **2xx anything else**: the firewall cannot inspect it, so it does not
//!   pass: an upstream error.
//!
//! Every answer is on record before it is relayed: its intent row is
//! completed and spooled first. When the client goes away, the exchange's
//! drop guard completes the rows still open as `client_gone` and settles
//! their budgets (the upstream may have acted).

mod event_stream;
pub mod gate;
mod large;
mod lists;
mod task_answers;

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::header::{HeaderMap, HeaderName};
use http::{header, HeaderValue, Method, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::audit::{AuditRow, JsonPayload};
use crate::budget::{Reservation, Settle};
use crate::http_util::{content_type, mime_is};
use crate::mcp::jsonrpc::{self, Id, Kind, Message};
use crate::mcp::methods::{Class, ListKind, TaskMethod};
use crate::mcp::scan::{Facts, Scan};
use crate::mcp::{rewrite, sse};
use crate::outcome::StopReason;
use crate::server::listener::ConnInfo;

use crate::http_util::{full, Body, BoxError};
use crate::policy::Labels;
use crate::proxy::answer;
use crate::proxy::decide::Granted;
use crate::proxy::decide::RunContext;
use crate::proxy::error::ProxyError;
use crate::proxy::record::{write_rows, AnswerParts, Recorder};
use crate::screen::content::{Action, Carry};
use crate::session::EventContext;
use crate::tasks;
use crate::upstream::body::{Collected, UpstreamBody, UpstreamIncoming};
use crate::upstream::client::{response_headers, Forward};
use crate::upstream::failure::UpstreamFailure;
use crate::verdict;
use crate::verdict::answer::{result_text, Answering, Content, NewTask, TaskIds, Verdict};

/// Most bytes of an upstream 4xx body relayed to the client.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Something forwarded whose end the exchange records: a request waiting for
/// its answer, a notification or response the upstream must accept, or the
/// GET stream / DELETE itself.
#[derive(Debug)]
pub struct Due {
    /// The request id (`None`: nothing to answer).
    pub id: Option<Id>,
    /// Its method (`GET` / `DELETE` for transport rows).
    pub method: String,
    /// What its answer needs.
    pub class: Class,
    /// The tool, for `tools/call`.
    pub tool: Option<String>,
    /// The budget reserved for it, settled when its answer (or failure) comes.
    pub reservation: Option<Reservation>,
    /// The approval it runs under.
    pub granted: Option<Arc<Granted>>,
    /// Its intent row, completed when it ends (`None` when audit is off).
    pub row: Option<AuditRow>,
    /// Learned from a sealed event id: its answer is replayed on a resumed
    /// stream (its budget and intent were settled on the original stream).
    pub resumed: bool,
    /// The run's own task a `tasks/*` request names.
    pub task: Option<crate::tasks::TaskRef>,
}

/// What kind of HTTP exchange this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    /// A POST of messages.
    Post,
    /// A GET stream (new or resumed).
    Get,
    /// A DELETE ending the session.
    Delete,
}

/// How to answer the upstream in the client's place (refused server-to-client
/// requests) on the client's session.
struct Reply {
    headers: HeaderMap,
    conn: ConnInfo,
    identity: Vec<(HeaderName, HeaderValue)>,
}

/// A held call's progress: the hold sent `after` notifications with the
/// client's token; the upstream's progress on that token is shifted past
/// them (progress must increase).
struct ProgressShift {
    token: Value,
    offset: f64,
}

/// One exchange with the upstream, from forwarding to the end of the answer.
pub struct Exchange {
    run: Arc<RunContext>,
    recorder: Recorder,
    kind: ExchangeKind,
    due: Vec<Due>,
    /// The firewall's own answers for parts of a batch, merged in.
    local: Vec<Bytes>,
    /// The upstream's session id (unsealed), if any.
    session: Option<Vec<u8>>,
    reply: Option<Reply>,
    progress: Option<ProgressShift>,
    max_sse_event_bytes: usize,
    upstream_started: Instant,
    status: u16,
    bytes_out: usize,
    /// The last `tools/list` answer inspected reused a remembered view.
    list_view_reused: bool,
    /// What screening found in the definitions of the tools listed.
    listed_found: std::sync::Mutex<crate::screen::content::Report>,
    /// What the gate read of this answer's earlier events (an SSE answer
    /// only): a token split across two of them is found in both.
    carry: Option<Carry>,
    /// Settlements in a shared budget store not yet confirmed: awaited
    /// (briefly) before the answers they belong to leave, so the caller's
    /// next call is admitted against them.
    settling: Vec<tokio::task::JoinHandle<()>>,
}

/// Longest an answer waits for its budget settlement in a shared store.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// An upstream answer as the strict reader read it: its text and the
/// tape of its first levels ([`jsonrpc::parse_upstream`]).
#[derive(Clone, Copy)]
struct Read<'a> {
    text: &'a str,
    tape: &'a crate::mcp::tape::Tape,
}

/// What an upstream message becomes.
enum Pass {
    /// Relayed as it is.
    Same,
    /// Relayed as this text.
    Replaced(String),
    /// Not relayed.
    Dropped,
}

// === impl Due ===

impl Due {
    /// A forwarded message: a request (with an id) waiting for its answer,
    /// or a notification or response.
    pub fn message(
        msg: &Message,
        class: Class,
        reservation: Option<Reservation>,
        granted: Option<Arc<Granted>>,
        row: Option<AuditRow>,
    ) -> Due {
        Due {
            id: (msg.kind == Kind::Request)
                .then(|| msg.id.clone())
                .flatten(),
            method: msg.method.clone().unwrap_or_default(),
            class,
            tool: msg.call.as_ref().map(|c| c.name.clone()),
            reservation,
            granted,
            row,
            resumed: false,
            task: None,
        }
    }

    /// The GET stream or DELETE itself.
    pub fn transport(method: &Method, row: Option<AuditRow>) -> Due {
        Due {
            id: None,
            method: method.as_str().to_owned(),
            class: Class::Pass,
            tool: None,
            reservation: None,
            granted: None,
            row,
            resumed: false,
            task: None,
        }
    }

    /// A request still due on a resumed stream, from its sealed event id.
    pub fn resumed(id: Id, method: String) -> Due {
        Due {
            id: Some(id),
            class: crate::mcp::methods::class_of(&method),
            tool: None,
            method,
            reservation: None,
            granted: None,
            row: None,
            resumed: true,
            task: None,
        }
    }
}

// === impl Exchange ===

impl Exchange {
    /// An exchange of `kind` for `due`, of the run in `run`.
    pub fn new(
        run: Arc<RunContext>,
        recorder: Recorder,
        kind: ExchangeKind,
        due: Vec<Due>,
        session: Option<Vec<u8>>,
        max_sse_event_bytes: usize,
    ) -> Self {
        Exchange {
            run,
            recorder,
            kind,
            due,
            local: Vec::new(),
            session,
            reply: None,
            progress: None,
            max_sse_event_bytes,
            upstream_started: Instant::now(),
            status: 0,
            bytes_out: 0,
            settling: Vec::new(),
            list_view_reused: false,
            listed_found: Default::default(),
            carry: None,
        }
    }

    /// Writes rows, once the budget settlements of the answers about to
    /// leave are in (each bounded by [`SETTLE_WAIT`]).
    async fn write(&mut self, rows: Vec<AuditRow>) {
        for h in self.settling.drain(..) {
            let _ = tokio::time::timeout(SETTLE_WAIT, h).await;
        }
        self.recorder.write(rows).await;
    }

    /// The firewall's own answers for the parts of a batch it refused.
    pub fn with_local(mut self, local: Vec<Bytes>) -> Self {
        self.local = local;
        self
    }

    /// Lets the relay answer refused server-to-client requests on the
    /// client's session.
    pub fn with_reply(
        mut self,
        client: &HeaderMap,
        conn: ConnInfo,
        identity: Vec<(HeaderName, HeaderValue)>,
    ) -> Self {
        let mut headers = crate::upstream::client::own_post_headers();
        if let Some(v) = client
            .get(crate::mcp::headers::PROTOCOL_VERSION)
            .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok())
        {
            // Copied, not cloned: a clone shares the client connection's read
            // buffer, which would then stay allocated for the stream's life.
            headers.insert(crate::mcp::headers::PROTOCOL_VERSION, v);
        }
        self.reply = Some(Reply {
            headers,
            conn,
            identity,
        });
        self
    }

    /// Shifts the upstream's progress on `token` past the `after`
    /// notifications a hold already sent.
    pub fn with_progress(mut self, token: Option<Value>, after: u64) -> Self {
        if let (Some(token), true) = (token, after > 0) {
            self.progress = Some(ProgressShift {
                token,
                offset: after as f64 + 1.0,
            });
        }
        self
    }

    /// Starts the upstream clock (when the request is sent).
    pub fn started(mut self) -> Self {
        self.upstream_started = Instant::now();
        self
    }

    /// The error for a failed upstream, answering every waiting request;
    /// the open rows are written as failed first.
    ///
    /// Boxed, like the other rare ends of an exchange ([`Exchange::accepted`],
    /// [`Exchange::client_error`]): awaited inline, each would make the
    /// future of every request, which holds the largest of its awaits, a few
    /// KB larger (allocated and copied per request, and resident for every
    /// one in flight).
    pub fn fail(mut self, failure: UpstreamFailure) -> BoxFuture<'static, ProxyError> {
        Box::pin(async move {
            let ids: Vec<Id> = self.due.iter().filter_map(|d| d.id.clone()).collect();
            let rows = self.end_all(
                StopReason::UpstreamError,
                &failure.to_string(),
                settle_for(&failure),
            );
            self.write(rows).await;
            ProxyError::Upstream {
                upstream: self.run.upstream.config.name.clone(),
                failure,
                ids,
            }
        })
    }

    /// Ends every open due: rows completed with `stop`, budgets settled.
    fn end_all(&mut self, stop: StopReason, cause: &str, how: Settle) -> Vec<AuditRow> {
        let mut rows = Vec::new();
        for mut d in std::mem::take(&mut self.due) {
            self.settle(&mut d, how, stop, None);
            if let Some(row) = d.row.take() {
                rows.push(self.recorder.fail(
                    row,
                    stop,
                    cause,
                    self.status,
                    self.upstream_started,
                    self.bytes_out,
                ));
            }
        }
        rows
    }

    /// Closes a due's reservation and counts its outcome.
    fn settle(&mut self, d: &mut Due, how: Settle, stop: StopReason, answer: Option<&str>) {
        let how = match (how, answer) {
            (Settle::Executed { .. }, Some(raw)) => Settle::Executed {
                reported: reported_cost(raw, &self.run.budgets.config().cost_meta_key),
            },
            (how, _) => how,
        };
        if let Some(r) = d.reservation.take() {
            self.settling.extend(self.run.budgets.settle(&r, how));
        }
        if let (Some(tool), false) = (&d.tool, d.resumed) {
            let cx = &self.run;
            cx.metrics.call(
                &cx.upstream.config.name,
                &crate::proxy::tool_label(cx, tool),
                stop,
            );
        }
    }

    /// Completes the due answering `id` with `answer` (as relayed).
    /// `parts` locate its `result` or `error` when they are known
    /// already; else the completion row reads them out of `answer`.
    fn answered(
        &mut self,
        pos: usize,
        answer: &str,
        parts: Option<AnswerParts<'_>>,
    ) -> Option<AuditRow> {
        let mut d = self.due.swap_remove(pos);
        self.settle(
            &mut d,
            Settle::Executed { reported: None },
            StopReason::Done,
            Some(answer),
        );
        let row = match d.row.take() {
            Some(row) => Some(row),
            None if d.resumed && self.recorder.enabled() => {
                let mut row = self.recorder.transport("GET", String::new());
                row.method = d.method.clone().into();
                row.jsonrpc_id = d.id.as_ref().map(|i| i.to_string()).unwrap_or_default();
                row.reason = "answer delivered on a resumed stream".to_owned();
                Some(row)
            }
            None => None,
        };
        row.map(|row| {
            let parts = parts.unwrap_or_else(|| AnswerParts::of(answer));
            self.recorder.complete_with(
                row,
                Some(parts),
                self.status,
                self.upstream_started,
                self.bytes_out,
            )
        })
    }

    /// Whether some answer due is a list rewritten for the run.
    fn filters(&self) -> bool {
        self.due.iter().any(|d| matches!(d.class, Class::List(_)))
    }

    /// Whether an answer too large to hold may stream past the gate
    /// ([`gate::may_stream`]): never when screening or labels apply.
    fn may_stream(&self) -> bool {
        let tools: Vec<Option<&str>> = self
            .due
            .iter()
            .filter(|d| d.id.is_some())
            .map(|d| {
                d.tool
                    .as_deref()
                    .or_else(|| d.task.as_ref().map(|t| t.tool.as_str()))
            })
            .collect();
        gate::may_stream(self.run.answer_scope(), &tools)
    }

    fn requests_due(&self) -> bool {
        self.due.iter().any(|d| d.id.is_some())
    }

    /// Turns the upstream's response into the client's.
    pub async fn respond(
        mut self,
        resp: Response<UpstreamIncoming>,
    ) -> Result<Response<Body>, ProxyError> {
        let (parts, incoming) = resp.into_parts();
        self.status = parts.status.as_u16();
        let idle = self.run.upstream.config.idle_timeout;
        let mut body = UpstreamBody::new(incoming, idle);
        let status = parts.status;

        if status.is_server_error()
            || status == StatusCode::UNAUTHORIZED
            || status == StatusCode::PROXY_AUTHENTICATION_REQUIRED
        {
            // Drain a little so the pooled connection can be reused; the
            // content is the upstream's business, the status is the cause.
            let _ = body.collect_bounded(64 * 1024).await;
            return Err(self.fail(UpstreamFailure::Status(status.as_u16())).await);
        }

        let mut headers = response_headers(&parts.headers);
        self.seal_session_header(&parts.headers, &mut headers);
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
        if status.is_client_error() {
            return Ok(self.client_error(status, headers, body).await);
        }
        let ct = content_type(&parts.headers).to_owned();
        let is_sse = mime_is(&ct, "text/event-stream");
        let is_json = mime_is(&ct, "application/json");

        if status == StatusCode::ACCEPTED
            || status == StatusCode::NO_CONTENT
            || self.kind == ExchangeKind::Delete
        {
            let _ = body.collect_bounded(64 * 1024).await;
            return self.accepted(status, headers).await;
        }
        if is_sse {
            return Ok(self.stream(status, headers, body));
        }
        if !is_json {
            // An empty answer to notifications and responses is an acceptance.
            if !self.requests_due() && self.kind == ExchangeKind::Post {
                if let Ok(Collected::Complete(b)) = body.collect_bounded(1024).await {
                    if b.is_empty() {
                        return self.accepted(status, headers).await;
                    }
                }
            }
            let what = if ct.is_empty() { "none".to_owned() } else { ct };
            return Err(self
                .fail(UpstreamFailure::Invalid(format!(
                    "the firewall cannot inspect an answer of content type {what}"
                )))
                .await);
        }

        let limit = self.run.upstream.config.max_response_bytes;
        let collected = match body.collect_bounded(limit).await {
            Ok(c) => c,
            Err(f) => return Err(self.fail(f).await),
        };
        match collected {
            Collected::Complete(bytes) => {
                let text = match std::str::from_utf8(&bytes) {
                    Ok(t) => t.to_owned(),
                    Err(_) => {
                        return Err(self
                            .fail(UpstreamFailure::Invalid("answer is not UTF-8".to_owned()))
                            .await)
                    }
                };
                let (out, rows) = match self.inspect(&text) {
                    Ok(x) => x,
                    Err(f) => return Err(self.fail(f).await),
                };
                let out = match out {
                    Pass::Same => bytes,
                    Pass::Replaced(t) => Bytes::from(t),
                    Pass::Dropped => Bytes::new(),
                };
                let out = merge_json(&out, &self.local);
                self.bytes_out = out.len();
                let mut rows = rows;
                // Requests the answer did not answer get an error of their own.
                let unanswered: Vec<Id> = self.due.iter().filter_map(|d| d.id.clone()).collect();
                let failure =
                    UpstreamFailure::Invalid("the answer did not answer this request".to_owned());
                rows.extend(self.end_all(
                    StopReason::UpstreamIncomplete,
                    &failure.to_string(),
                    Settle::Executed { reported: None },
                ));
                let name = self.run.upstream.config.name.clone();
                let extra: Vec<Bytes> = unanswered
                    .iter()
                    .map(|id| answer::upstream_error(Some(id), &name, &failure))
                    .collect();
                let out = if extra.is_empty() {
                    out
                } else {
                    merge_json(&out, &extra)
                };
                // The answers are on record before they leave.
                self.write(rows).await;
                if out.is_empty() {
                    return Err(self
                        .fail(UpstreamFailure::Invalid(
                            "the answer answered nothing".to_owned(),
                        ))
                        .await);
                }
                Ok(json_with(status, headers, out))
            }
            Collected::Partial(prefix) => {
                // A list is filtered whole; whatever the gate screens or
                // labels by is held whole: neither passes as a stream.
                if self.filters() || !self.may_stream() {
                    return Err(self.fail(UpstreamFailure::TooLarge(limit)).await);
                }
                Ok(self.large(status, headers, prefix, body))
            }
        }
    }

    /// The session id an `initialize` answer carries, sealed for the caller
    /// (session revisions); never passed on a 2026-07-28 exchange.
    fn seal_session_header(&self, upstream: &HeaderMap, out: &mut HeaderMap) {
        if self.run.version.is_stateless() {
            return;
        }
        if let Some(sid) = upstream.get("mcp-session-id") {
            let sealed = self
                .run
                .sessions
                .seal(&self.run.principal(), sid.as_bytes());
            if let Ok(v) = HeaderValue::from_str(&sealed) {
                out.insert(HeaderName::from_static("mcp-session-id"), v);
            }
        }
    }

    /// 202/204 (and DELETE's answer): what was forwarded is accepted.
    fn accepted(
        mut self,
        status: StatusCode,
        headers: HeaderMap,
    ) -> BoxFuture<'static, Result<Response<Body>, ProxyError>> {
        Box::pin(async move {
            if self.requests_due() {
                return Err(self
                    .fail(UpstreamFailure::Invalid(
                        "the upstream accepted a request without answering it".to_owned(),
                    ))
                    .await);
            }
            let rows: Vec<AuditRow> = std::mem::take(&mut self.due)
                .into_iter()
                .filter_map(|d| d.row)
                .map(|row| {
                    self.recorder
                        .complete(row, None, self.status, self.upstream_started, 0)
                })
                .collect();
            self.write(rows).await;
            if !self.local.is_empty() {
                // The upstream accepted the notifications/responses of a batch;
                // the firewall still owes answers for what it refused.
                let merged = merge_json(&Bytes::new(), &self.local);
                return Ok(json_with(StatusCode::OK, headers, merged));
            }
            let mut r = Response::new(crate::http_util::empty());
            *r.status_mut() = status;
            *r.headers_mut() = headers;
            Ok(r)
        })
    }

    /// A 4xx answer, relayed with its status: JSON bodies only when they are
    /// JSON-RPC errors, text bodies capped.
    fn client_error(
        mut self,
        status: StatusCode,
        mut headers: HeaderMap,
        mut body: UpstreamBody,
    ) -> BoxFuture<'static, Response<Body>> {
        Box::pin(async move {
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let bytes = match body.collect_bounded(MAX_ERROR_BODY).await {
                Ok(Collected::Complete(b)) => Some(b),
                _ => None,
            };
            let cause = format!("upstream answered HTTP {}", status.as_u16());
            // JSON-RPC error responses only (their id may be null: the
            // upstream could not tell which request failed).
            let errors_only = |b: &Bytes| {
                let is_error = |v: &Value| {
                    v.get("error").is_some_and(Value::is_object)
                        && v.get("result").is_none()
                        && v.get("method").is_none()
                };
                match serde_json::from_slice::<Value>(b) {
                    Ok(Value::Array(items)) => !items.is_empty() && items.iter().all(is_error),
                    Ok(v) => is_error(&v),
                    Err(_) => false,
                }
            };
            let is_json = mime_is(&ct, "application/json");
            let body = match bytes {
                Some(b) if b.is_empty() => Some(b),
                Some(b) if is_json && errors_only(&b) => Some(b),
                Some(b) if !is_json && !mime_is(&ct, "text/event-stream") => Some(b),
                _ => None,
            };
            // The body passes the gate like any answer: screened, and the
            // run labelled by its source, before it leaves.
            let run = self.run.clone();
            let scope = run.answer_scope();
            let tool = self.due.iter().find_map(|d| d.tool.clone());
            let source = tool
                .as_deref()
                .map_or(gate::Source::Upstream, gate::Source::Tool);
            let text = body
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned());
            let screened = match text.as_deref().filter(|t| !t.is_empty()) {
                // Not JSON after all: withheld below as unreadable.
                Some(t) if is_json => gate::screen(scope, source, t, None).unwrap_or_default(),
                Some(t) => gate::screen_text(scope, source, t),
                None => None,
            };
            let mut withheld = None;
            let body = match (&screened, body) {
                (Some(c), _) if c.report.action == Action::Block => {
                    withheld = Some(c.report.names_for(c.actions, Action::Block).join(", "));
                    None
                }
                (Some(c), Some(_)) if c.report.action == Action::Redact => {
                    c.redacted.clone().map(Bytes::from)
                }
                (_, body) => body,
            };
            let method = self
                .due
                .first()
                .map(|d| d.method.clone())
                .unwrap_or_default();
            if let Some(c) = &screened {
                self.note_content(c, &method, tool.as_deref());
            }
            // It refused: nothing ran.
            let mut rows = self.end_all(StopReason::UpstreamError, &cause, Settle::NotExecuted);
            if let Some(c) = &screened {
                rows.iter_mut().for_each(|row| stamp(row, c));
            }
            self.write(rows).await;
            let body = match body {
                Some(b) => b,
                None => {
                    headers.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    let what = match &withheld {
                        Some(kinds) => {
                            format!("{cause}; the body carried {kinds}, which [screen] blocks")
                        }
                        None => cause,
                    };
                    answer::error(
                        None,
                        crate::proxy::answer::codes::UPSTREAM_ERROR,
                        &format!("upstream {:?}: {what}", self.run.upstream.config.name),
                        None,
                    )
                }
            };
            let mut r = Response::new(full(body));
            *r.status_mut() = status;
            *r.headers_mut() = headers;
            r
        })
    }

    /// Inspects one complete upstream JSON text (a message or a batch):
    /// what to send instead, and the rows it completes.
    fn inspect(&mut self, text: &str) -> Result<(Pass, Vec<AuditRow>), UpstreamFailure> {
        if let Some(remembered) = self.remembered_list_answer(text) {
            return Ok(remembered);
        }
        // A whole tools/list answer is remembered with what the run was
        // given for it: the catalog's epoch is read before it is filtered.
        let epoch = self.run.catalogs.epoch();
        // An answer to a tools/list this exchange sent: the tools the
        // upstream listed last time are not read again where they are the
        // same bytes.
        let lists_tools = self
            .due
            .iter()
            .any(|d| d.class == Class::List(ListKind::Tools));
        let upstream = &self.run.upstream.config.name;
        let known = lists_tools
            .then(|| self.run.catalogs.known_tools(upstream))
            .flatten();
        let (env, learned) = jsonrpc::parse_upstream_known(text.as_bytes(), known.as_deref())
            .map_err(|e| UpstreamFailure::Invalid(e.to_string()))?;
        if let Some(learned) = learned.filter(|_| lists_tools) {
            self.run.catalogs.remember_known_tools(upstream, learned);
        }
        self.list_view_reused = false;
        let list_answer = match env.messages.as_slice() {
            [m] if !env.batch && m.kind == Kind::Response && !m.is_error => self
                .due
                .iter()
                .any(|d| d.class == Class::List(ListKind::Tools) && d.id.is_some() && d.id == m.id),
            _ => false,
        };
        let mut rows = Vec::new();
        let mut parts: Vec<(std::ops::Range<usize>, Pass)> = Vec::with_capacity(env.messages.len());
        let read = env.tape.as_ref().map(|tape| Read { text, tape });
        for m in &env.messages {
            let raw = text.get(m.span.clone()).unwrap_or("");
            let pass = self.on_message(m, raw, read, &mut rows)?;
            parts.push((m.span.clone(), pass));
        }
        // Only a result seen twice (a view reused): one that changes with
        // every answer is not worth the two extra reads.
        if let (true, true, [(_, Pass::Replaced(relayed))]) =
            (list_answer, self.list_view_reused, parts.as_slice())
        {
            let cx = &self.run;
            cx.catalogs.remember_answer(
                &cx.upstream.config.name,
                cx.view_generation(),
                &cx.authority,
                epoch,
                text,
                relayed,
            );
        }
        if parts.iter().all(|(_, p)| matches!(p, Pass::Same)) {
            return Ok((Pass::Same, rows));
        }
        if !env.batch {
            return Ok((parts.pop().map_or(Pass::Dropped, |(_, p)| p), rows));
        }
        let kept: Vec<&str> = parts
            .iter()
            .filter_map(|(span, p)| match p {
                Pass::Same => text.get(span.clone()),
                Pass::Replaced(t) => Some(t.as_str()),
                Pass::Dropped => None,
            })
            .collect();
        if kept.is_empty() {
            return Ok((Pass::Dropped, rows));
        }
        Ok((Pass::Replaced(format!("[{}]", kept.join(","))), rows))
    }

    /// A whole `tools/list` answer the firewall validated and filtered for
    /// this run's authority before, byte for byte but for its id
    /// ([`crate::catalog::Catalogs::remembered_answer`]): relayed as it was
    /// then, and on record like any answer.
    fn remembered_list_answer(&mut self, text: &str) -> Option<(Pass, Vec<AuditRow>)> {
        let cx = self.run.clone();
        let (pos, relayed) = self.due.iter().enumerate().find_map(|(pos, d)| {
            let id =
                d.id.as_ref()
                    .filter(|_| d.class == Class::List(ListKind::Tools))?;
            cx.catalogs
                .remembered_answer(
                    &cx.upstream.config.name,
                    cx.view_generation(),
                    &cx.authority,
                    text,
                    id,
                )
                .map(|relayed| (pos, relayed))
        })?;
        let (relayed, result) = relayed;
        let parts = AnswerParts {
            result: result.and_then(|r| relayed.get(r)),
            error: None,
        };
        let rows = self
            .answered(pos, &relayed, Some(parts))
            .into_iter()
            .collect();
        Some((Pass::Replaced(relayed), rows))
    }

    /// Carries out the answer-side decision ([`decide`]) on one
    /// upstream message; `raw` is its text. What is to leave then passes
    /// the gate ([`Exchange::gate`]) before its row is completed.
    fn on_message(
        &mut self,
        m: &Message,
        raw: &str,
        read: Option<Read<'_>>,
        rows: &mut Vec<AuditRow>,
    ) -> Result<Pass, UpstreamFailure> {
        let pos =
            m.id.as_ref()
                .filter(|_| m.kind == Kind::Response)
                .and_then(|id| self.due.iter().position(|d| d.id.as_ref() == Some(id)));
        let run = self.run.clone();
        let answering = pos.map(|p| Answering {
            class: &self.due[p].class,
            tool: self.due[p].tool.as_deref(),
            approved: self.due[p].granted.is_some(),
        });
        let verdict = verdict::answer::decide(run.answer_scope(), m, raw, answering)?;
        let lists = matches!(verdict, Verdict::Filter(_));
        // Where a filtered list's view is in what is relayed.
        let mut view_at = None;
        // An answer the firewall made in the upstream's place: nothing of
        // the upstream's reaches the client.
        let mut own = false;
        let upstream = &run.upstream.config.name;
        let pass = match verdict {
            Verdict::Relay => Pass::Same,
            Verdict::Unsolicited => {
                tracing::info!(upstream = %upstream, id = ?m.id, "dropped an answer to a request this exchange did not send");
                return Ok(Pass::Dropped);
            }
            Verdict::Filter(kind) => Pass::Replaced(match kind {
                ListKind::Tools => {
                    let (out, at) = self.filter_listed_tools(m, raw, read)?;
                    view_at = at;
                    out
                }
                ListKind::Prompts => self.filter_named(raw, kind, "prompts", "name")?,
                ListKind::Resources => self.filter_named(raw, kind, "resources", "uri")?,
                ListKind::ResourceTemplates => {
                    self.filter_named(raw, kind, "resourceTemplates", "uriTemplate")?
                }
            }),
            Verdict::RefuseInputRequests(refused) => {
                for r in &refused {
                    tracing::info!(upstream = %upstream, method = %r.method, reason = %r.why, "input request refused");
                }
                let methods: Vec<String> = refused.into_iter().map(|r| r.method).collect();
                let body = answer::refused_input_request(m.id.as_ref(), &methods);
                own = true;
                Pass::Replaced(String::from_utf8_lossy(&body).into_owned())
            }
            Verdict::SealState(state) => {
                let granted = pos.and_then(|p| self.due[p].granted.clone());
                self.seal_request_state(m, raw, granted.as_deref(), state)?
            }
            Verdict::TaskCreated(task) => match pos {
                Some(p) => self.task_created(p, raw, task)?,
                None => Pass::Same,
            },
            Verdict::Task(method) => match pos {
                Some(p) => self.task_answer(p, method, raw)?,
                None => Pass::Same,
            },
            Verdict::RefuseServerRequest(why) => {
                if self.recorder.enabled() {
                    rows.push(self.recorder.refused_server_request(m, why.clone()));
                }
                self.refuse_server_request(m, &why);
                return Ok(Pass::Dropped);
            }
            Verdict::ListChanged => {
                run.catalogs.clear(upstream);
                if let Some(shared) = run.budgets.store() {
                    crate::catalog::announce_list_changed(shared.redis(), upstream);
                }
                // Re-list at once: a changed definition is compared with its
                // pin before any client lists again.
                if run.upstream.config.pinning != crate::pins::Mode::Off {
                    let run = run.clone();
                    tokio::spawn(async move {
                        run.refills
                            .refill(&run.catalogs, &run.upstream, &run.pins)
                            .await;
                    });
                }
                Pass::Same
            }
            Verdict::Progress => self.shift_progress(raw),
            Verdict::SealTasks(at) => self.seal_task_ids(raw, at)?,
            Verdict::ForeignTask => {
                tracing::debug!(upstream = %upstream, "dropped a notification about another run's task");
                return Ok(Pass::Dropped);
            }
        };
        let (pass, mut screened) = if own {
            (pass, None)
        } else {
            self.gate(m, raw, pos, pass, rows)?
        };
        if screened.as_ref().is_some_and(|c| c.redacted.is_some()) {
            view_at = None;
        }
        if lists {
            let found = self
                .listed_found
                .lock()
                .map(|mut f| std::mem::take(&mut *f))
                .unwrap_or_default();
            if !found.is_empty() {
                match &mut screened {
                    Some(c) => c.report.merge(&found),
                    None => {
                        screened = Some(Box::new(Content {
                            report: found,
                            actions: run.policy.screening().actions(upstream, None),
                            redacted: None,
                            labels: Labels::NONE,
                        }))
                    }
                }
            }
        }
        if let Some(pos) = pos {
            let (relayed, parts) = match &pass {
                Pass::Replaced(t) => (
                    t.as_str(),
                    view_at.and_then(|at| {
                        Some(AnswerParts {
                            result: Some(t.get(at)?),
                            error: None,
                        })
                    }),
                ),
                // Relayed as read off the tape: its result's span is known,
                // its error is a member of its node.
                _ => (
                    raw,
                    read.zip(m.node).map(|(r, n)| AnswerParts {
                        result: m.result.clone().and_then(|at| r.text.get(at)),
                        error: m
                            .is_error
                            .then(|| r.tape.member(r.text, n, "error"))
                            .flatten()
                            .map(|x| r.tape.text(r.text, x)),
                    }),
                ),
            };
            let row = self.answered(pos, relayed, parts);
            rows.extend(row.map(|mut row| {
                if let Some(c) = &screened {
                    stamp(&mut row, c);
                }
                row
            }));
        }
        Ok(pass)
    }

    /// Keeps a held call's progress increasing past what the hold sent.
    fn shift_progress(&self, raw: &str) -> Pass {
        let Some(shift) = &self.progress else {
            return Pass::Same;
        };
        let Ok(mut v) = serde_json::from_str::<Value>(raw) else {
            return Pass::Same;
        };
        let Some(params) = v.get_mut("params").and_then(Value::as_object_mut) else {
            return Pass::Same;
        };
        if params.get("progressToken") != Some(&shift.token) {
            return Pass::Same;
        }
        for key in ["progress", "total"] {
            if let Some(n) = params.get(key).and_then(Value::as_f64) {
                params.insert(key.to_owned(), Value::from(n + shift.offset));
            }
        }
        Pass::Replaced(v.to_string())
    }

    /// An input-required result of a call that ran under an approval: the
    /// approval (and the upstream's own `state`) is sealed into the
    /// `requestState`, so the retry runs under it.
    fn seal_request_state(
        &self,
        m: &Message,
        raw: &str,
        granted: Option<&Granted>,
        state: Option<String>,
    ) -> Result<Pass, UpstreamFailure> {
        let (Some(granted), Some(result)) = (granted, result_text(m, raw)) else {
            // Nothing to seal (never for a call that ran under an approval).
            return Ok(Pass::Same);
        };
        let sealed = self.run.seal_granted(granted, state);
        let new_result = set_member(result, "requestState", &Value::String(sealed).to_string())
            .ok_or_else(|| {
                UpstreamFailure::Invalid("unreadable input-required result".to_owned())
            })?;
        let (Some(r), start) = (m.result.as_ref(), m.span.start) else {
            return Ok(Pass::Same);
        };
        let (head, tail) = (
            raw.get(..r.start - start).unwrap_or(""),
            raw.get(r.end - start..).unwrap_or(""),
        );
        Ok(Pass::Replaced(format!("{head}{new_result}{tail}")))
    }

    /// A legacy server-to-client request the policy refuses: the client never
    /// sees it; the upstream gets an error answer on the client's session.
    fn refuse_server_request(&self, m: &Message, why: &str) {
        let method = m.method.as_deref().unwrap_or("");
        tracing::info!(upstream = %self.run.upstream.config.name, method, reason = why, "server-to-client request refused by policy");
        let (Some(id), Some(reply)) = (&m.id, &self.reply) else {
            return;
        };
        let body = answer::refused_server_request(id, method);
        let up = self.run.upstream.clone();
        let headers = reply.headers.clone();
        let conn = reply.conn;
        let identity = reply.identity.clone();
        let session = self.session.clone();
        crate::server::shards::spawn_detached(async move {
            let fwd = Forward {
                method: Method::POST,
                headers: &headers,
                query: None,
                body,
                conn,
                set: &identity,
                session: session.as_deref(),
                last_event_id: None,
            };
            if let Err(e) = up.send(fwd).await {
                tracing::warn!(upstream = %up.config.name, error = %e, "could not answer a refused server request");
            }
        });
    }

    /// The sealed form of an upstream event id, carrying the requests still
    /// due on this stream; `None`: relay the event without an id.
    fn seal_event_id(&self, id: &str) -> Option<String> {
        if self.run.version.is_stateless() || id.is_empty() {
            return None;
        }
        let context = EventContext {
            due: self
                .due
                .iter()
                .filter_map(|d| {
                    Some(crate::session::Due {
                        id: d.id.clone()?,
                        method: d.method.clone(),
                    })
                })
                .collect(),
            upstream_event_id: id.to_owned(),
        };
        self.run
            .sessions
            .seal_event(&self.run.principal(), self.session.as_deref(), &context)
    }
}

impl Drop for Exchange {
    /// The client went away (or the firewall is dropping the answer): what
    /// is still open ends as `client_gone`, its budget kept (the upstream
    /// may have acted), its row written off the request's task.
    fn drop(&mut self) {
        if self.due.is_empty() {
            return;
        }
        let stop = match self.kind {
            ExchangeKind::Get => StopReason::Done,
            _ => StopReason::ClientGone,
        };
        let cause = match self.kind {
            ExchangeKind::Get => "the client closed the stream",
            _ => "the client went away before the answer reached it",
        };
        let rows = self.end_all(stop, cause, Settle::Executed { reported: None });
        if rows.is_empty() {
            return;
        }
        let auditor = self.recorder.auditor().clone();
        let n = rows.len();
        if !crate::server::shards::spawn_detached(async move { write_rows(&auditor, rows).await }) {
            tracing::error!(rows = n, "completion rows lost: no runtime");
        }
    }
}

/// How a failed call's budget is settled: refunded only when it certainly
/// never reached the upstream.
fn settle_for(failure: &UpstreamFailure) -> Settle {
    match failure {
        UpstreamFailure::Connect(_) => Settle::NotExecuted,
        _ => Settle::Executed { reported: None },
    }
}

/// Streams an SSE response event by event.
/// `json` (an object) with member `key` set to the raw JSON `value`.
/// Puts what screening found and the labels it brought on a row.
fn stamp(row: &mut AuditRow, c: &Content) {
    row.screen_kinds = c.report.names();
    if !c.report.is_empty() {
        row.screen_action = c.report.action.as_str();
    }
    row.run_labels = row.run_labels.union(c.labels);
}

fn set_member(json: &str, key: &str, value: &str) -> Option<String> {
    let map: std::collections::BTreeMap<&str, &RawValue> = serde_json::from_str(json).ok()?;
    let mut out = String::with_capacity(json.len() + value.len() + key.len() + 4);
    out.push('{');
    let mut first = true;
    let mut put = |out: &mut String, k: &str, v: &str| {
        if !std::mem::take(&mut first) {
            out.push(',');
        }
        out.push_str(&Value::String(k.to_owned()).to_string());
        out.push(':');
        out.push_str(v);
    };
    for (k, v) in &map {
        if *k != key {
            put(&mut out, k, v.get());
        }
    }
    put(&mut out, key, value);
    out.push('}');
    Some(out)
}

/// The cost an upstream reports in a `tools/call` result's `_meta[key]`.
fn reported_cost(raw: &str, key: &str) -> Option<f64> {
    if raw.is_empty() || !raw.contains(key) {
        return None;
    }
    let v: Value = serde_json::from_str(raw).ok()?;
    v.get("result")?.get("_meta")?.get(key)?.as_f64()
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

/// The upstream's JSON answer (an object, an array or nothing) merged with
/// the firewall's own answers; unchanged when there are none.
fn merge_json(upstream: &Bytes, local: &[Bytes]) -> Bytes {
    if local.is_empty() {
        return upstream.clone();
    }
    let mut out = Vec::with_capacity(
        upstream.len() + local.iter().map(Bytes::len).sum::<usize>() + local.len() + 2,
    );
    out.push(b'[');
    let mut first = true;
    let t = upstream.trim_ascii();
    let inner = match (t.first(), t.last()) {
        (Some(b'['), Some(b']')) => t[1..t.len() - 1].trim_ascii(),
        _ => t,
    };
    if !inner.is_empty() {
        out.extend_from_slice(inner);
        first = false;
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

impl RunContext {
    /// What the upstream's answers to this run are decided against.
    pub fn answer_scope(&self) -> crate::verdict::answer::Scope<'_> {
        crate::verdict::answer::Scope {
            policy: &self.policy,
            authority: &self.authority,
            upstream: &self.upstream.config,
            stateless: self.version.is_stateless(),
            tasks: &self.tasks,
            principal: self.principal(),
        }
    }
}
