//! The hold stage: a gated call waits for a person, then goes on through the
//! same stages as any other call (budget, intent row, forward, the one
//! relay). A hold is not a second relay.
//!
//! When a `tools/call` meets an `approve` gate and the client accepts SSE,
//! the firewall keeps the request open as an event stream: progress
//! notifications while it waits (with the client's `progressToken`, else
//! keep-alive comments); the moment the approval is granted it consumes it
//! (exactly once) and forwards the call, relaying the upstream's answer on
//! the same stream, the upstream's progress shifted past the hold's so it
//! keeps increasing. A denial or an expiry ends the stream with a JSON-RPC
//! error carrying the reason; past the hold window the answer is the
//! resumable "approval required" error, and an identical retry after
//! approval runs the call once.
//!
//! Cancellation: `notifications/cancelled` for the held request (same
//! principal, same session, same id) ends the hold and **withdraws** the
//! approval, so a person approving later runs nothing. On 2026-07-28,
//! closing the stream is the cancellation (the transport spec says so); on
//! the session revisions a disconnect is not a cancel, and the approval
//! stays for the client's retry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{header, Method, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::Value;
use tokio::sync::Notify;

use crate::approval::{ApprovalId, Status};
use crate::audit::AuditRow;
use crate::budget::Settle;
use crate::http_util::mime_is;
use crate::mcp::jsonrpc::Id;
use crate::mcp::methods::Class;
use crate::mcp::sse;
use crate::server::listener::ConnInfo;

use super::super::answer;
use super::super::decision::{ApprovalNote, Gated, Granted, Outcome, RunContext};
use super::super::error::ProxyError;
use super::super::held_calls::{HoldKey, Holds};
use super::super::outbound::{Due, Exchange, ExchangeKind};
use super::super::record::Recorder;
use crate::http_util::{Body, BoxError};
use crate::upstream::client::Forward;
use crate::upstream::failure::UpstreamFailure;

/// A call held for approval, with what forwarding it needs later.
pub(crate) struct Held {
    /// The gate it waits at.
    pub gated: Gated,
    /// The request's JSON-RPC id.
    pub id: Id,
    /// The tool.
    pub tool: String,
    /// The client's progress token, if any.
    pub progress_token: Option<Value>,
    /// The message to forward once approved.
    pub body: Bytes,
    /// The client's headers (copied; cleaned when forwarded).
    pub headers: HeaderMap,
    /// Identity headers for the upstream.
    pub identity: Vec<(HeaderName, HeaderValue)>,
    /// The client connection.
    pub conn: ConnInfo,
    /// The upstream's session id, if any.
    pub session: Option<Vec<u8>>,
    /// Rows of this request.
    pub recorder: Recorder,
    /// The call's intent row, written once it is approved (`None`: audit off).
    pub intent: Option<AuditRow>,
    /// Largest SSE event relayed.
    pub max_sse_event_bytes: usize,
}

/// The SSE response that holds the call.
pub(crate) fn respond(run: Arc<RunContext>, holds: Arc<Holds>, held: Held) -> Response<Body> {
    let cancel = Arc::new(Notify::new());
    let key = HoldKey::new(&run.principal(), held.session.as_deref(), &held.id);
    // Not registered if its client cancelled it already: `cancel` is then
    // notified and the approval withdrawn, and the stream ends at once.
    let _registered = holds.insert(
        key.clone(),
        cancel.clone(),
        held.gated.approval.id.clone(),
        held.gated.key.tenant.clone(),
    );
    let hold_s = run.approvals.as_ref().map_or(0, |a| a.config().hold_s);
    let stream = HoldStream {
        guard: Guard {
            holds,
            key,
            approval: held.gated.approval.id.clone(),
            tenant: held.gated.key.tenant.clone(),
            stateless: run.version.is_stateless(),
            waiting: true,
        },
        run,
        held: Some(held),
        cancel,
        step: Step::Wait,
        ticks: 0,
        until: Instant::now() + Duration::from_secs(hold_s),
    };
    let body = futures_util::stream::unfold(stream, |mut s| async move {
        let next = s.next().await?;
        Some((next, s))
    });
    let mut r = Response::new(StreamBody::new(body).boxed_unsync());
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    r
}

/// Removes the hold from the registry when it stops waiting; a 2026-07-28
/// stream closed while waiting withdraws the approval (closing is cancelling).
struct Guard {
    holds: Arc<Holds>,
    key: HoldKey,
    approval: ApprovalId,
    tenant: String,
    stateless: bool,
    waiting: bool,
}

impl Guard {
    /// The hold no longer waits (decided, or about to run).
    fn stop_waiting(&mut self) {
        self.waiting = false;
        self.holds.release(&self.key);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Withdrawn before it is released: a hold gone from the registry has
        // its withdrawal done (journal) or under way (PostgreSQL).
        if self.waiting && self.stateless && self.holds.is_held(&self.key) {
            self.holds.withdraw(&self.tenant, &self.approval);
        }
        self.holds.release(&self.key);
    }
}

enum Step {
    Wait,
    Relay(Body),
    Done,
}

struct HoldStream {
    guard: Guard,
    run: Arc<RunContext>,
    held: Option<Held>,
    cancel: Arc<Notify>,
    step: Step,
    ticks: u64,
    until: Instant,
}

impl HoldStream {
    async fn next(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        loop {
            match &mut self.step {
                Step::Done => return None,
                Step::Relay(body) => {
                    return match body.frame().await {
                        Some(Ok(f)) => Some(Ok(f)),
                        Some(Err(e)) => Some(Err(e)),
                        None => {
                            self.step = Step::Done;
                            None
                        }
                    }
                }
                Step::Wait => {
                    if let Some(bytes) = self.wait().await {
                        return Some(Ok(Frame::data(bytes)));
                    }
                }
            }
        }
    }

    /// One round of waiting: a progress event to send, or `None` once the
    /// step moved on.
    async fn wait(&mut self) -> Option<Bytes> {
        let approvals = self.run.approvals.clone()?;
        let held = self.held.as_ref()?;
        let every = Duration::from_secs(approvals.config().progress_interval_s.max(1));
        let until = (Instant::now() + every).min(self.until);
        let id = held.gated.approval.id.clone();
        let mut closing = self.run.closing.clone();
        let status = tokio::select! {
            s = approvals.wait(&id, until) => s,
            _ = closing.wait_for(|c| *c) => {
                // The firewall is going down: the call has not run; its
                // approval stays for the client's retry on another replica.
                self.guard.stop_waiting();
                let failure = UpstreamFailure::ShuttingDown;
                self.step = once(answer::upstream_error(
                    Some(&held.id),
                    &self.run.upstream.config.name,
                    &failure,
                ));
                return None;
            }
            () = self.cancel.notified() => {
                // Cancelled by the client: the approval is withdrawn, no
                // answer follows (the client asked for none).
                self.guard.stop_waiting();
                self.step = Step::Done;
                return None;
            }
        };
        if status == Status::Pending && Instant::now() < self.until {
            self.ticks += 1;
            return Some(self.progress(held));
        }
        self.guard.stop_waiting();
        let held = self.held.take()?;
        self.step = match status {
            Status::Approved => match approvals.consume(&held.gated.key).await {
                Some(approval) => {
                    let granted = Granted::of(&approval, &approvals);
                    Step::Relay(execute(self.run.clone(), self.ticks, held, granted).await)
                }
                // Someone else (an identical retry) consumed it first.
                None => {
                    let a = held.gated.approval.id.as_str().to_owned();
                    once(answer::approval_ended(&held.id, &held.tool, &a, "consumed"))
                }
            },
            Status::Denied => {
                let decided = approvals.get(&held.gated.key.tenant, id.as_str()).await;
                let (by, reason) = decided
                    .ok()
                    .flatten()
                    .and_then(|a| a.decision)
                    .map_or((String::new(), String::new()), |d| (d.by, d.reason));
                once(answer::approval_denied(
                    &held.id,
                    &held.tool,
                    id.as_str(),
                    &by,
                    &reason,
                ))
            }
            Status::Expired | Status::Consumed => once(answer::approval_ended(
                &held.id,
                &held.tool,
                id.as_str(),
                status.as_str(),
            )),
            Status::Withdrawn => Step::Done,
            // Still pending after the hold window: resumable.
            Status::Pending => {
                let outcome = Outcome::ApprovalRequired {
                    risk: held.gated.risk,
                    approval: Some(Box::new(ApprovalNote::of(&held.gated.approval, &approvals))),
                };
                let body = answer_for(&held, &outcome, &self.run);
                once(body)
            }
        };
        None
    }

    fn progress(&self, held: &Held) -> Bytes {
        let mut out = BytesMut::new();
        match &held.progress_token {
            Some(token) => {
                let note = answer::hold_progress(
                    token,
                    self.ticks,
                    &held.tool,
                    held.gated.approval.id.as_str(),
                );
                sse::encode_message(None, &note, &mut out);
            }
            None => out.extend_from_slice(b": waiting for approval\n\n"),
        }
        out.freeze()
    }
}

/// Runs the approved call through the usual stages: budget, intent row,
/// forward, relay. Returns the SSE body of its answer. `ticks`: the progress
/// notifications the hold sent.
async fn execute(run: Arc<RunContext>, ticks: u64, mut held: Held, granted: Granted) -> Body {
    {
        let run = &run;
        let risk = held.gated.risk;
        // The run's labels, judged again at release.
        if let Some(r) = held.gated.recheck {
            if let Err(outcome) = super::admit::recheck(run, &held.tool, risk, r).await {
                write_outcome(&held, &outcome).await;
                return event_body(answer_for(&held, &outcome, run));
            }
        }
        let reservation = match run.budgets.admit(&run.call_budget(&held.tool), risk).await {
            Ok(r) => r,
            Err(refusal) => {
                let outcome = Outcome::Skipped { risk, refusal };
                write_outcome(&held, &outcome).await;
                return event_body(answer_for(&held, &outcome, run));
            }
        };
        // The credential is asked at release: the run's token kept from
        // before the wait, or a new exchange (a run that ended since gets
        // none).
        let credential = match run.credential().await {
            Ok(c) => c,
            Err(e) => {
                run.budgets
                    .settle_now(&reservation, Settle::NotExecuted)
                    .await;
                let outcome = Outcome::CredentialUnavailable {
                    risk,
                    why: e.clone(),
                };
                write_outcome(&held, &outcome).await;
                return event_body(answer_for(&held, &outcome, run));
            }
        };
        credential.add_to(&mut held.identity);
        if let Some(row) = held.intent.as_mut() {
            granted.stamp(row);
            credential.stamp(row);
        }
        if let Some(row) = &held.intent {
            if let Err(e) = held.recorder.write_ahead(row).await {
                run.budgets
                    .settle_now(&reservation, Settle::NotExecuted)
                    .await;
                let outcome = Outcome::AuditUnavailable {
                    risk,
                    error: e.into(),
                };
                write_outcome(&held, &outcome).await;
                return event_body(answer_for(&held, &outcome, run));
            }
        }
        tracing::info!(tool = %held.tool, approval = %granted.approval, "running an approved held call");
        let due = Due {
            id: Some(held.id.clone()),
            method: "tools/call".to_owned(),
            class: Class::ToolCall,
            tool: Some(held.tool.clone()),
            reservation: Some(reservation),
            granted: Some(Arc::new(granted)),
            row: held.intent.take(),
            resumed: false,
            task: None,
        };
        let exchange = Exchange::new(
            run.clone(),
            held.recorder.clone(),
            ExchangeKind::Post,
            vec![due],
            held.session.clone(),
            held.max_sse_event_bytes,
        )
        .with_reply(&held.headers, held.conn, held.identity.clone())
        .with_progress(held.progress_token.clone(), ticks);
        let fwd = Forward {
            method: Method::POST,
            headers: &held.headers,
            query: None,
            body: held.body.clone(),
            conn: held.conn,
            set: &held.identity,
            session: held.session.as_deref(),
            last_event_id: None,
        };
        let sending = run.upstream.send(fwd);
        let exchange = exchange.started();
        let relayed = match sending.await {
            Ok(resp) => exchange.respond(resp).await,
            Err(failure) => Err(exchange.fail(failure).await),
        };
        match relayed {
            Ok(resp) => into_events(resp, &held.id, &run.upstream.config.name).await,
            Err(e) => event_body(error_answer(&e, &held.id, &run.upstream.config.name)),
        }
    }
}

async fn write_outcome(held: &Held, outcome: &Outcome) {
    {
        let Some(template) = &held.intent else { return };
        let mut row = template.clone();
        let facts = outcome.audit();
        row.row_version = 1;
        row.decision = facts.decision.as_str().into();
        row.stop_reason = facts.stop.as_str().into();
        row.reason = facts.reason;
        row.is_error = true;
        held.recorder.write(vec![row]).await;
    }
}

/// The answer of a held call for a decided outcome.
fn answer_for(held: &Held, outcome: &Outcome, run: &RunContext) -> Bytes {
    // The message is rebuilt from what the hold knows: its id and tool.
    let msg = crate::mcp::jsonrpc::Message::synthetic_call(held.id.clone(), &held.tool);
    answer::for_outcome(&msg, outcome, run.version).unwrap_or_default()
}

fn once(body: Bytes) -> Step {
    Step::Relay(event_body(body))
}

/// One SSE event carrying `json`.
fn event_body(json: Bytes) -> Body {
    let mut out = BytesMut::new();
    sse::encode_message(None, &json, &mut out);
    crate::http_util::full(out.freeze())
}

/// A relayed response as events on the held stream: SSE passes as it is, a
/// JSON answer becomes one event, anything else an upstream error.
async fn into_events(resp: Response<Body>, id: &Id, upstream: &str) -> Body {
    let (parts, body) = resp.into_parts();
    let ct = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if parts.status.is_success() && mime_is(ct, "text/event-stream") {
        return body;
    }
    if parts.status.is_success() && mime_is(ct, "application/json") {
        if let Ok(c) = body.collect().await {
            return event_body(c.to_bytes());
        }
    }
    let failure = UpstreamFailure::Status(parts.status.as_u16());
    event_body(answer::upstream_error(Some(id), upstream, &failure))
}

fn error_answer(e: &ProxyError, id: &Id, upstream: &str) -> Bytes {
    match e {
        ProxyError::Upstream { failure, .. } => answer::upstream_error(Some(id), upstream, failure),
        other => answer::upstream_error(
            Some(id),
            upstream,
            &UpstreamFailure::Invalid(other.to_string()),
        ),
    }
}
