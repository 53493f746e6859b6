//! Audit rows for the request path: one per JSON-RPC message the firewall
//! decided on. Rows of messages the firewall answers itself are written
//! before the answer leaves; rows of forwarded requests are completed with
//! what came back and written before that answer reaches the client. A row
//! is "written" once it is in the local spool (`write(2)` done), never on the
//! network: ClickHouse is fed by the shipper in the background.

use std::net::IpAddr;
use std::time::Instant;

use http::HeaderMap;
use serde_json::value::RawValue;

use crate::audit::{AuditRow, Auditor, JsonPayload, Recorded};
use crate::mcp::jsonrpc::{Id, Message};
use crate::outcome::{DecisionKind, StopReason};
use crate::policy::Risk;

use super::decide::{Outcome, RunContext};

/// Builds and writes the rows of one HTTP request.
pub struct Recorder {
    auditor: Auditor,
    base: AuditRow,
    started: Instant,
}

/// A row waiting for the upstream's answer.
pub struct OpenRow {
    /// The request id it answers (none for notifications and responses).
    pub id: Option<Id>,
    row: AuditRow,
}

// === impl Recorder ===

impl Recorder {
    /// The identity part every row of this request shares.
    pub fn new(
        auditor: Auditor,
        cx: &RunContext,
        headers: &HeaderMap,
        client_ip: IpAddr,
        bytes_in: usize,
    ) -> Recorder {
        let mut base = AuditRow::new();
        if !auditor.is_enabled() {
            // Rows go nowhere: skip building them.
            return Recorder {
                auditor,
                base,
                started: Instant::now(),
            };
        }
        let c = &cx.claims;
        base.tenant = c.tenant_id.clone();
        base.subject = c.sub.clone();
        base.agent_role = cx.authority.agent.clone();
        base.run_id = c.run_id.clone();
        base.token_id = c.jti.clone();
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
        base.session_id = header(headers, "mcp-session-id");
        base.trace_id = trace_id(headers);
        base.bytes_in = bytes_in as u64;
        Recorder {
            auditor,
            base,
            started: Instant::now(),
        }
    }

    /// Whether rows go anywhere.
    pub fn enabled(&self) -> bool {
        self.auditor.is_enabled()
    }

    /// The auditor (fail-mode checks before forwarding).
    pub fn auditor(&self) -> &Auditor {
        &self.auditor
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

    /// A row for a message the firewall answered itself.
    pub fn answered(&self, m: &Message, outcome: &Outcome) -> AuditRow {
        let mut row = self.row(m);
        let (decision, stop, reason, risk) = outcome.audit();
        row.decision = decision.as_str().into();
        row.stop_reason = stop.map_or("", StopReason::as_str).into();
        row.reason = reason;
        row.risk = risk;
        row.is_error = true;
        row.latency_us = self.started.elapsed().as_micros() as u64;
        row
    }

    /// A row for a forwarded message, completed when the answer comes.
    pub fn forwarded(&self, m: &Message, risk: Option<Risk>) -> OpenRow {
        let mut row = self.row(m);
        row.decision = DecisionKind::Allow.as_str().into();
        row.risk = risk;
        OpenRow {
            id: m.id.clone(),
            row,
        }
    }

    /// Writes rows to the spool. Fail-open rows that cannot be written are
    /// counted as lost by the auditor; fail-closed ones return the error
    /// (the caller has already refused or completed the call).
    pub async fn write(&self, rows: Vec<AuditRow>) {
        if !self.auditor.is_enabled() || rows.is_empty() {
            return;
        }
        let writes = rows.into_iter().map(|r| self.auditor.record_or_fail(r));
        for result in futures_util::future::join_all(writes).await {
            match result {
                Ok(Recorded::Spooled | Recorded::Disabled | Recorded::Lost) => {}
                Err(e) => tracing::error!(error = %e, "audit row could not be written"),
            }
        }
    }

    /// Completes an open row with the upstream's answer.
    pub fn close(
        &self,
        open: OpenRow,
        answer: Option<&str>,
        status: u16,
        upstream_started: Instant,
        bytes_out: usize,
    ) -> AuditRow {
        let mut row = open.row;
        row.upstream_status = status;
        row.latency_us = self.started.elapsed().as_micros() as u64;
        row.upstream_latency_us = upstream_started.elapsed().as_micros() as u64;
        row.bytes_out = bytes_out as u64;
        row.stop_reason = StopReason::Done.as_str().into();
        if let Some(raw) = answer {
            #[derive(serde::Deserialize)]
            struct Answer<'a> {
                #[serde(borrow)]
                result: Option<&'a RawValue>,
                #[serde(borrow)]
                error: Option<&'a RawValue>,
            }
            #[derive(serde::Deserialize)]
            struct IsError {
                #[serde(rename = "isError")]
                is_error: Option<bool>,
            }
            if let Ok(a) = serde_json::from_str::<Answer>(raw) {
                if let Some(e) = a.error {
                    row.is_error = true;
                    row.result = JsonPayload::Raw(e.to_owned());
                } else if let Some(r) = a.result {
                    // `isError` exists only on tool results; other results
                    // (a 100-tool list) are not read a second time for it.
                    row.is_error = row.tool_call()
                        && serde_json::from_str::<IsError>(r.get())
                            .ok()
                            .and_then(|x| x.is_error)
                            .unwrap_or(false);
                    row.result = JsonPayload::Raw(r.to_owned());
                }
            }
        }
        row
    }

    /// The row of a held call that ran after approval.
    pub fn held_done(
        &self,
        tool: &str,
        id: &Id,
        reason: &str,
        answer: Option<&str>,
        status: u16,
        upstream_started: Instant,
    ) -> AuditRow {
        let open = self.held_open(tool, id, reason);
        self.close(open, answer, status, upstream_started, 0)
    }

    /// The row of a held call that ran after approval and failed upstream.
    pub fn held_failed(
        &self,
        tool: &str,
        id: &Id,
        reason: &str,
        cause: &str,
        upstream_started: Instant,
    ) -> AuditRow {
        let open = self.held_open(tool, id, reason);
        let mut row = self.failed(open, cause, 0, upstream_started);
        row.reason = format!("{reason}; {cause}");
        row
    }

    fn held_open(&self, tool: &str, id: &Id, reason: &str) -> OpenRow {
        let mut row = self.base.clone();
        row.event_id = uuid::Uuid::now_v7();
        row.method = "tools/call".into();
        row.tool = tool.to_owned();
        row.jsonrpc_id = serde_json::to_string(id).unwrap_or_default();
        row.decision = DecisionKind::Allow.as_str().into();
        row.reason = reason.to_owned();
        OpenRow {
            id: Some(id.clone()),
            row,
        }
    }

    /// Completes an open row for a failed upstream.
    pub fn failed(
        &self,
        open: OpenRow,
        cause: &str,
        status: u16,
        upstream_started: Instant,
    ) -> AuditRow {
        let mut row = open.row;
        row.upstream_status = status;
        row.latency_us = self.started.elapsed().as_micros() as u64;
        row.upstream_latency_us = upstream_started.elapsed().as_micros() as u64;
        row.stop_reason = StopReason::UpstreamError.as_str().into();
        row.reason = cause.to_owned();
        row.is_error = true;
        row
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
