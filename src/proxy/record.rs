//! Audit rows of the request path: one per JSON-RPC message the firewall
//! decided on, plus one per GET stream and DELETE.
//!
//! - A message the firewall answers itself gets one final row, written
//!   before the answer leaves.
//! - A message that is forwarded gets an **intent** row (`row_version` 0:
//!   who, run, tool, arguments, decision) written *before* it is sent. That
//!   write is the admission check: when it fails and the risk is
//!   fail-closed, the call is not sent. Its **completion** (`row_version`
//!   1, same `event_id` and `time`, so the table's `FINAL` keeps only it)
//!   follows when the answer comes, when the stream breaks
//!   (`upstream_incomplete`), when the upstream fails (`upstream_error`), or
//!   when the client goes away (`client_gone`, from the exchange's drop
//!   guard). After a crash the intent of every call the upstream saw is in
//!   the spool.
//!
//! A row is "written" once it is in the local spool (`write(2)` done), never
//! on the network: ClickHouse is fed by the shipper in the background.

use std::net::IpAddr;
use std::time::Instant;

use http::HeaderMap;
use serde_json::value::RawValue;

use crate::audit::{AuditError, AuditRow, Auditor, JsonPayload, Recorded};
use crate::mcp::jsonrpc::Message;
use crate::outcome::{DecisionKind, StopReason};
use crate::policy::Risk;

use super::decision::{Outcome, RunContext};

/// The claims a decision used besides the row's own columns, as JSON
/// (what `audit replay` re-decides with): one string, no tree.
fn principal_claims(c: &crate::auth::Claims) -> String {
    #[derive(serde::Serialize)]
    struct Used<'a> {
        agent: &'a str,
        mode: &'static str,
        projects: &'a [String],
        project_ceiling: Option<&'a [String]>,
        iss: &'a str,
    }
    serde_json::to_string(&Used {
        agent: &c.agent,
        mode: c.mode.name(),
        projects: &c.projects,
        project_ceiling: c.project_ceiling.as_deref(),
        iss: &c.iss,
    })
    .unwrap_or_default()
}

/// Builds and writes the rows of one HTTP request.
#[derive(Clone)]
pub(crate) struct Recorder {
    auditor: Auditor,
    base: AuditRow,
    started: Instant,
    /// The request's trace: each final row is also a span.
    trace: Option<std::sync::Arc<crate::trace::RequestTrace>>,
}

// === impl Recorder ===

impl Recorder {
    /// The identity part every row of this request shares. `session` is the
    /// session's audit name (never the upstream's id itself).
    pub(crate) fn new(
        auditor: Auditor,
        cx: &RunContext,
        headers: &HeaderMap,
        client_ip: IpAddr,
        bytes_in: usize,
        session: String,
    ) -> Recorder {
        let mut base = AuditRow::new();
        let trace = cx.trace.clone();
        if !auditor.is_enabled() && trace.is_none() {
            // Rows go nowhere: skip building them.
            return Recorder {
                auditor,
                base,
                started: Instant::now(),
                trace,
            };
        }
        let c = &cx.claims;
        base.tenant = c.tenant_id.to_string();
        base.subject = c.sub.to_string();
        base.agent_role = cx.authority.agent.clone();
        base.run_id = c.run_id.clone();
        base.token_id = c.jti.clone();
        base.token_jti = c.jti.clone();
        base.delegation = c.delegation.clone();
        base.principal_claims = principal_claims(c);
        // The snapshot every message of this request is decided with.
        base.policy_sha256 = cx.policy.content_hash().to_owned();
        base.client_ip = Some(client_ip);
        base.upstream = cx.upstream.config.name.clone();
        base.project = cx
            .upstream
            .config
            .projects
            .iter()
            .find(|p| cx.authority.projects.binary_search(p).is_ok())
            .cloned()
            .unwrap_or_default();
        base.protocol_version = cx.version.to_string();
        base.session_id = session;
        base.trace_id = match &trace {
            Some(t) => t.trace_id(),
            None => trace_id(headers),
        };
        base.bytes_in = bytes_in as u64;
        // What this process knows the run holds (no I/O: labels are only
        // ever added, so this is a lower bound; gates ask the store).
        base.run_labels = cx.budgets.labels().known(&c.tenant_id, &c.run_id);
        if let Some(v) = &cx.via {
            base.virtual_server = v.to_string();
        }
        Recorder {
            auditor,
            base,
            started: Instant::now(),
            trace,
        }
    }

    /// Whether rows go anywhere (the audit trail, or spans).
    pub(crate) fn enabled(&self) -> bool {
        self.auditor.is_enabled() || self.trace.is_some()
    }

    fn row(&self, m: &Message) -> AuditRow {
        let mut row = self.base.clone();
        row.event_id = uuid::Uuid::now_v7();
        row.method = m
            .method
            .clone()
            .map_or(std::borrow::Cow::Borrowed(""), std::borrow::Cow::Owned);
        if let Some(call) = &m.call {
            row.tool = call.name.clone();
            if let Some(args) = &call.arguments {
                row.arguments = JsonPayload::Raw(args.clone());
            }
        } else if let Some(name) = &m.name {
            // prompts/get, resources/read: the name or URI acted on.
            row.tool = name.clone();
        }
        if let Some(id) = &m.id {
            row.jsonrpc_id = serde_json::to_string(id).unwrap_or_default();
        }
        row
    }

    /// The final row of a message the firewall answered itself.
    pub(crate) fn answered(&self, m: &Message, outcome: &Outcome) -> AuditRow {
        let mut row = self.row(m);
        let facts = outcome.audit();
        row.decision = facts.decision.as_str().into();
        row.stop_reason = facts.stop.as_str().into();
        row.reason = facts.reason;
        row.risk = facts.risk;
        row.is_error = facts.decision != DecisionKind::Cancel;
        row.latency_us = self.started.elapsed().as_micros() as u64;
        row
    }

    /// The intent row of a message about to be forwarded (`reason`: why it
    /// may run, e.g. the approval it runs under).
    pub(crate) fn intent(&self, m: &Message, risk: Option<Risk>, reason: String) -> AuditRow {
        let mut row = self.row(m);
        row.decision = DecisionKind::Allow.as_str().into();
        row.risk = risk;
        row.reason = reason;
        row.row_version = 0;
        row
    }

    /// The final row of a server-to-client request the firewall refused in
    /// the client's place (it never reached the client).
    pub(crate) fn refused_server_request(&self, m: &Message, reason: String) -> AuditRow {
        let mut row = self.row(m);
        row.decision = DecisionKind::Deny.as_str().into();
        row.stop_reason = StopReason::Denied.as_str().into();
        row.reason = format!("server-to-client request refused: {reason}");
        row.is_error = true;
        row.latency_us = self.started.elapsed().as_micros() as u64;
        row
    }

    /// The row of a server-to-client request the policy let through whose
    /// content screening found something in.
    pub(crate) fn relayed_server_request(&self, m: &Message) -> AuditRow {
        let mut row = self.row(m);
        row.decision = DecisionKind::Allow.as_str().into();
        row.stop_reason = StopReason::Done.as_str().into();
        row.reason = "server-to-client request relayed".to_owned();
        row.latency_us = self.started.elapsed().as_micros() as u64;
        row
    }

    /// The row of a request refused before any decision could be made on
    /// its messages (`method` and `id` when the refusal knows them).
    pub(crate) fn refused_message(
        &self,
        method: Option<&str>,
        id: Option<&crate::mcp::jsonrpc::Id>,
        reason: String,
    ) -> AuditRow {
        let mut row = self.base.clone();
        row.event_id = uuid::Uuid::now_v7();
        row.method = method.unwrap_or("").to_owned().into();
        if let Some(id) = id {
            row.jsonrpc_id = serde_json::to_string(id).unwrap_or_default();
        }
        row.decision = DecisionKind::Invalid.as_str().into();
        row.stop_reason = StopReason::Denied.as_str().into();
        row.reason = format!("refused before a decision: {reason}");
        // No policy decided it.
        row.policy_sha256.clear();
        row.is_error = true;
        row.latency_us = self.started.elapsed().as_micros() as u64;
        row
    }

    /// The intent row of a GET stream or a DELETE (`method` is the HTTP
    /// method: these carry no JSON-RPC message).
    pub(crate) fn transport(&self, method: &'static str, reason: String) -> AuditRow {
        let mut row = self.base.clone();
        row.event_id = uuid::Uuid::now_v7();
        row.method = method.into();
        row.decision = DecisionKind::Allow.as_str().into();
        row.reason = reason;
        row.row_version = 0;
        row
    }

    /// Spools an intent row before its call is sent: `Err` means the risk
    /// is fail-closed and the spool refused it (the call must not run); a
    /// fail-open loss is counted and logged by the auditor and returns `Ok`.
    pub(crate) async fn write_ahead(&self, row: &AuditRow) -> Result<(), AuditError> {
        if !self.enabled() {
            return Ok(());
        }
        self.auditor.record_or_fail(row).await.map(|_| ())
    }

    /// Writes final rows. Fail-open rows that cannot be written are counted
    /// as lost by the auditor; fail-closed ones are logged (the call they
    /// record has already been refused or completed).
    pub(crate) async fn write(&self, rows: Vec<AuditRow>) {
        if let Some(t) = &self.trace {
            for r in rows.iter().filter(|r| r.row_version == 1) {
                t.message(r);
            }
        }
        write_rows(&self.auditor, rows).await;
    }

    /// The auditor (for rows written after the request is gone).
    pub(crate) fn auditor(&self) -> &Auditor {
        &self.auditor
    }

    /// Completes an intent row with the upstream's answer (as relayed).
    pub(crate) fn complete(
        &self,
        row: AuditRow,
        answer: Option<&str>,
        status: u16,
        upstream_started: Instant,
        bytes_out: usize,
    ) -> AuditRow {
        let parts = answer.map(AnswerParts::of);
        self.complete_with(row, parts, status, upstream_started, bytes_out)
    }

    /// [`Recorder::complete`] with the answer's `result` and `error`
    /// already located (off the strict reader's tape, or where the
    /// firewall wrote them): the answer is not read again.
    pub(crate) fn complete_with(
        &self,
        mut row: AuditRow,
        parts: Option<AnswerParts<'_>>,
        status: u16,
        upstream_started: Instant,
        bytes_out: usize,
    ) -> AuditRow {
        row.row_version = 1;
        row.upstream_status = status;
        row.latency_us = self.started.elapsed().as_micros() as u64;
        row.upstream_latency_us = upstream_started.elapsed().as_micros() as u64;
        row.bytes_out = bytes_out as u64;
        row.stop_reason = StopReason::Done.as_str().into();
        #[derive(serde::Deserialize)]
        struct IsError {
            #[serde(rename = "isError")]
            is_error: Option<bool>,
        }
        let raw = |text: &str| JsonPayload::Text(text.into());
        match parts {
            Some(AnswerParts { error: Some(e), .. }) => {
                row.is_error = true;
                row.result = raw(e);
            }
            Some(AnswerParts {
                result: Some(r),
                is_error,
                ..
            }) => {
                // `isError` exists only on tool results; other results
                // (a 100-tool list) are not read a second time for it, nor
                // a result whose members the strict reader already holds.
                row.is_error = row.tool_call()
                    && is_error.unwrap_or_else(|| {
                        serde_json::from_str::<IsError>(r)
                            .ok()
                            .and_then(|x| x.is_error)
                            .unwrap_or(false)
                    });
                row.result = raw(r);
            }
            _ => {}
        }
        row
    }

    /// Completes an intent row whose call did not end with an answer.
    pub(crate) fn fail(
        &self,
        mut row: AuditRow,
        stop: StopReason,
        cause: &str,
        status: u16,
        upstream_started: Instant,
        bytes_out: usize,
    ) -> AuditRow {
        row.row_version = 1;
        row.upstream_status = status;
        row.latency_us = self.started.elapsed().as_micros() as u64;
        row.upstream_latency_us = upstream_started.elapsed().as_micros() as u64;
        row.bytes_out = bytes_out as u64;
        row.stop_reason = stop.as_str().into();
        if !cause.is_empty() {
            row.reason = if row.reason.is_empty() {
                cause.to_owned()
            } else {
                format!("{}; {cause}", row.reason)
            };
        }
        row.is_error = true;
        row
    }
}

/// Writes final rows through `auditor` (see [`Recorder::write`]).
pub(crate) async fn write_rows(auditor: &Auditor, rows: Vec<AuditRow>) {
    if !auditor.is_enabled() || rows.is_empty() {
        return;
    }
    let writes = rows.iter().map(|r| auditor.record_or_fail(r));
    for result in futures_util::future::join_all(writes).await {
        match result {
            Ok(Recorded::Spooled | Recorded::Disabled | Recorded::Lost) => {}
            Err(e) => auditor.note_unwritten(&e),
        }
    }
}

fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.chars().take(256).collect())
        .unwrap_or_default()
}

/// The W3C trace id from `traceparent` (`00-<trace-id>-<span>-<flags>`),
/// else the request id.
fn trace_id(headers: &HeaderMap) -> String {
    if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        if let Some(id) = tp
            .split('-')
            .nth(1)
            .filter(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return id.to_owned();
        }
    }
    header(headers, "x-request-id")
}

/// Where an answer's `result` and `error` are (each the member's text).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AnswerParts<'a> {
    /// The `result` member's value.
    pub result: Option<&'a str>,
    /// The `error` member's value.
    pub error: Option<&'a str>,
    /// Whether `result.isError` is `true`, when the strict reader's tape
    /// already holds the result's members (`None`: read it from `result`).
    pub is_error: Option<bool>,
}

impl<'a> AnswerParts<'a> {
    /// Reads them out of a whole answer (nothing, if it is not an object).
    pub(crate) fn of(answer: &'a str) -> AnswerParts<'a> {
        #[derive(serde::Deserialize)]
        struct Answer<'a> {
            #[serde(borrow)]
            result: Option<&'a RawValue>,
            #[serde(borrow)]
            error: Option<&'a RawValue>,
        }
        serde_json::from_str::<Answer>(answer).map_or_else(
            |_| AnswerParts::default(),
            |a| AnswerParts {
                result: a.result.map(RawValue::get),
                error: a.error.map(RawValue::get),
                is_error: None,
            },
        )
    }
}
