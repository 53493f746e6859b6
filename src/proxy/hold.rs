//! Holding a gated call until a person decides.
//!
//! When a `tools/call` meets an `approve` gate and the client accepts SSE,
//! the firewall keeps the request open as an event stream: it sends progress
//! notifications while it waits (with the client's `progressToken` when it
//! gave one, else SSE keep-alive comments), and the moment the approval is
//! granted it consumes it (exactly once), spends the run's budget and
//! forwards the call, relaying the upstream's answer on the same stream. A
//! denial or an expiry ends the stream with a JSON-RPC error carrying the
//! reason. The hold is bounded: past it, the answer is the resumable
//! "approval required" error (approval id, status URL, expiry), and an
//! identical retry after approval runs the call once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{header, Method, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::approval::{Approval, Approvals, CallKey, Status};
use crate::budget::{CallBudget, Settle};
use crate::mcp::jsonrpc::{self, Id};
use crate::mcp::sse;
use crate::server::listener::ConnInfo;

use super::approvals::approval_required;
use super::body::{Body, BoxError, UpstreamBody};
use super::decide::RunContext;
use super::error::codes;
use super::record::Recorder;
use super::relay::mime_is;
use super::upstream::Forward;

/// A call held for approval.
pub struct Held {
    /// The approval.
    pub approval: Approval,
    /// Its call key (to consume it).
    pub key: CallKey,
    /// The request's JSON-RPC id.
    pub id: Id,
    /// The client's progress token, if any.
    pub progress_token: Option<Value>,
    /// The tool.
    pub tool: String,
    /// The request body to forward once approved.
    pub body: Bytes,
    /// The client's headers (cleaned when forwarded).
    pub headers: HeaderMap,
    /// Identity headers for the upstream.
    pub identity: Vec<(HeaderName, HeaderValue)>,
    /// The client connection.
    pub conn: ConnInfo,
}

/// The SSE response that holds the call.
pub fn respond(
    cx: Arc<RunContext>,
    approvals: Arc<Approvals>,
    recorder: Recorder,
    held: Held,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(run(cx, approvals, recorder, held, tx));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let b = rx.recv().await?;
        Some((Ok::<_, BoxError>(Frame::data(b)), rx))
    });
    let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
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

async fn run(
    cx: Arc<RunContext>,
    approvals: Arc<Approvals>,
    recorder: Recorder,
    held: Held,
    tx: mpsc::Sender<Bytes>,
) {
    let cfg = approvals.config();
    let hold_until = Instant::now() + Duration::from_secs(cfg.hold_s);
    let every = Duration::from_secs(cfg.progress_interval_s.max(1));
    let mut step = 0u64;
    let status = loop {
        let until = (Instant::now() + every).min(hold_until);
        let status = approvals.wait(&held.approval.id, until).await;
        if status != Status::Pending || Instant::now() >= hold_until {
            break status;
        }
        step += 1;
        let mut out = BytesMut::new();
        match &held.progress_token {
            Some(token) => {
                let note = json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": {
                        "progressToken": token,
                        "progress": step,
                        "message": format!("waiting for a person to approve {} (approval {})", held.tool, held.approval.id.as_str()),
                    },
                });
                sse::encode_message(None, note.to_string().as_bytes(), &mut out);
            }
            None => out.extend_from_slice(b": waiting for approval\n\n"),
        }
        if tx.send(out.freeze()).await.is_err() {
            // The client left; the approval stays for a retry.
            return;
        }
    };
    let answer = match status {
        Status::Approved => match approvals.consume(&held.key) {
            Some(approval) => return execute(cx, recorder, held, approval, tx).await,
            // Someone else (an identical retry) consumed it first.
            None => error_event(
                &held.id,
                codes::APPROVAL_REQUIRED,
                "the approval was already used by an identical call",
                json!({"stop_reason": "approval_required", "approval_id": held.approval.id.as_str(), "status": "consumed"}),
            ),
        },
        Status::Denied => {
            let decided = approvals.get(&held.key.tenant, held.approval.id.as_str());
            let (by, reason) = decided
                .and_then(|a| a.decision)
                .map_or((String::new(), String::new()), |d| (d.by, d.reason));
            error_event(
                &held.id,
                codes::DENIED,
                &format!("a person denied the call to {}: {reason}", held.tool),
                json!({"stop_reason": "denied", "approval_id": held.approval.id.as_str(), "status": "denied", "by": by, "reason": reason}),
            )
        }
        Status::Expired => error_event(
            &held.id,
            codes::APPROVAL_REQUIRED,
            &format!("the approval for {} expired without a decision", held.tool),
            json!({"stop_reason": "approval_required", "approval_id": held.approval.id.as_str(), "status": "expired"}),
        ),
        // Still pending after the hold window: resumable.
        _ => {
            let body = approval_required(
                &held.id,
                &held.tool,
                &approvals,
                &held.approval,
                held.approval.risk,
            );
            let mut out = BytesMut::new();
            sse::encode_message(None, &body, &mut out);
            out.freeze()
        }
    };
    let _ = tx.send(answer).await;
}

/// Runs the approved call and relays its answer on the held stream.
async fn execute(
    cx: Arc<RunContext>,
    recorder: Recorder,
    held: Held,
    approval: Approval,
    tx: mpsc::Sender<Bytes>,
) {
    let up = cx.upstream.clone();
    let role = cx.policy.agent(&cx.authority.agent);
    let budget = CallBudget {
        tenant: &cx.claims.tenant_id,
        run: &cx.claims.run_id,
        upstream: &up.config.name,
        tool: &held.tool,
        token_exp: cx.claims.exp,
        price: cx.policy.price(&up.config, &held.tool),
        max_steps: role
            .and_then(|a| a.max_steps)
            .unwrap_or(cx.budgets.config().default_max_steps),
        max_cost: role
            .and_then(|a| a.max_cost)
            .or(cx.budgets.config().default_max_cost),
        run_per_s: role.and_then(|a| a.calls_per_s),
        upstream_per_s: up.config.max_calls_per_s,
    };
    let reservation = match cx.budgets.admit(&budget) {
        Ok(r) => r,
        Err(refusal) => {
            let mut out = BytesMut::new();
            sse::encode_message(
                None,
                &super::decide::skipped_result(&held.id, &held.tool, &refusal),
                &mut out,
            );
            let _ = tx.send(out.freeze()).await;
            return;
        }
    };
    let started = Instant::now();
    let fwd = Forward {
        method: Method::POST,
        headers: &held.headers,
        query: None,
        body: held.body.clone(),
        conn: held.conn,
        set: &held.identity,
    };
    let reason = format!(
        "approved by {} (approval {})",
        approval.decision.as_ref().map_or("?", |d| d.by.as_str()),
        approval.id.as_str()
    );
    let resp = match up.send(fwd).await {
        Ok(r) => r,
        Err(failure) => {
            let how = match failure {
                super::error::UpstreamFailure::Connect(_) => Settle::NotExecuted,
                _ => Settle::Executed { reported: None },
            };
            cx.budgets.settle(&reservation, how);
            let row =
                recorder.held_failed(&held.tool, &held.id, &reason, &failure.to_string(), started);
            recorder.write(vec![row]).await;
            let msg = format!("upstream {:?} failed: {failure}", up.config.name);
            let _ = tx
                .send(error_event(&held.id, codes::UPSTREAM_ERROR, &msg, json!({"upstream": up.config.name, "cause": failure.to_string(), "stop_reason": "upstream_error"})))
                .await;
            return;
        }
    };
    let status = resp.status().as_u16();
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| mime_is(ct, "text/event-stream"));
    let mut body = UpstreamBody::new(resp.into_body(), up.config.idle_timeout);
    if is_sse {
        // Relay the upstream's events as they come; the answer is on record
        // before it is relayed.
        let mut decoder = sse::Decoder::new(1 << 22);
        let mut recorded = false;
        while let Ok(Some(chunk)) = body.chunk().await {
            if decoder.push(&chunk).is_err() {
                break;
            }
            let mut out = BytesMut::new();
            while let Some(ev) = decoder.next_event() {
                if !recorded && ev.has_data && answers(&ev.data, &held.id) {
                    recorded = true;
                    let row = recorder.held_done(
                        &held.tool,
                        &held.id,
                        &reason,
                        Some(&ev.data),
                        status,
                        started,
                    );
                    recorder.write(vec![row]).await;
                }
                out.extend_from_slice(&ev.raw);
            }
            if !out.is_empty() && tx.send(out.freeze()).await.is_err() {
                break;
            }
        }
        if !recorded {
            let row = recorder.held_failed(
                &held.tool,
                &held.id,
                &reason,
                "the stream ended without an answer",
                started,
            );
            recorder.write(vec![row]).await;
        }
        cx.budgets
            .settle(&reservation, Settle::Executed { reported: None });
        return;
    }
    let answer = match body.collect_bounded(up.config.max_response_bytes).await {
        Ok(super::body::Collected::Complete(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Ok(super::body::Collected::Partial(_)) | Err(_) => {
            cx.budgets
                .settle(&reservation, Settle::Executed { reported: None });
            let row =
                recorder.held_failed(&held.tool, &held.id, &reason, "unreadable answer", started);
            recorder.write(vec![row]).await;
            let msg = format!("upstream {:?} sent an unreadable answer", up.config.name);
            let _ = tx
                .send(error_event(
                    &held.id,
                    codes::UPSTREAM_ERROR,
                    &msg,
                    json!({"upstream": up.config.name, "stop_reason": "upstream_error"}),
                ))
                .await;
            return;
        }
    };
    let row = recorder.held_done(
        &held.tool,
        &held.id,
        &reason,
        Some(&answer),
        status,
        started,
    );
    recorder.write(vec![row]).await;
    cx.budgets
        .settle(&reservation, Settle::Executed { reported: None });
    let mut out = BytesMut::new();
    sse::encode_message(None, answer.as_bytes(), &mut out);
    let _ = tx.send(out.freeze()).await;
}

/// Whether an event's data is the JSON-RPC answer to `id`.
fn answers(data: &str, id: &Id) -> bool {
    serde_json::from_str::<Value>(data).is_ok_and(|v| {
        (v.get("result").is_some() || v.get("error").is_some())
            && serde_json::to_value(id).is_ok_and(|i| v.get("id") == Some(&i))
    })
}

fn error_event(id: &Id, code: i32, message: &str, data: Value) -> Bytes {
    let body = jsonrpc::error_body(Some(id), code, message, Some(&data));
    let mut out = BytesMut::new();
    sse::encode_message(None, &body, &mut out);
    out.freeze()
}
