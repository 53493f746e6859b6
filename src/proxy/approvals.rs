//! The request path's side of human approvals: what a gated call becomes
//! (held, resumed, or run once after approval), the audit rows of approval
//! transitions, and the preview an approver sees.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::FutureExt;
use serde_json::{json, Value};

use crate::approval::{args_sha256, Approval, Approvals, CallKey, NewApproval, Transition};
use crate::audit::{redact_json, AuditRow, JsonPayload};
use crate::mcp::jsonrpc::{self, Id};
use crate::outcome::StopReason;
use crate::policy::Risk;

use super::decide::RunContext;
use super::error::codes;
use super::State;

/// What a call behind an `approve` gate becomes.
pub enum Gated {
    /// An approval for exactly this call was granted: run it (once).
    Approved(Approval),
    /// Waiting for a person.
    Pending {
        /// The approval.
        approval: Approval,
        /// Its key (to consume it once granted).
        key: CallKey,
    },
    /// No approval can be created: answer with this error.
    Refused(String),
}

// === impl RunContext ===

impl RunContext {
    /// Consumes a granted approval for this exact call, or files one.
    pub fn gate(&self, tool: &str, arguments: &Value, risk: Risk) -> Gated {
        let Some(approvals) = &self.approvals else {
            return Gated::Refused("approvals are not configured on this firewall".to_owned());
        };
        let key = CallKey {
            tenant: self.claims.tenant_id.clone(),
            run_id: self.claims.run_id.clone(),
            upstream: self.upstream.config.name.clone(),
            tool: tool.to_owned(),
            args_sha256: args_sha256(arguments),
        };
        if let Some(approval) = approvals.consume(&key) {
            return Gated::Approved(approval);
        }
        let mut shown = arguments.clone();
        redact_json(&mut shown, &self.redactor);
        let role = self.policy.agent(&self.authority.agent);
        let new = NewApproval {
            key: key.clone(),
            subject: self.claims.sub.clone(),
            agent: self.authority.agent.clone(),
            risk,
            arguments: shown,
            token_exp: self.claims.exp,
            preview_tool: self
                .policy
                .preview(&self.upstream.config, tool)
                .map(|(t, _)| t.to_owned()),
            self_approval: role.is_some_and(|a| a.self_approval)
                || approvals.config().self_approval_default,
        };
        match approvals.request(new) {
            Ok(approval) => Gated::Pending { approval, key },
            Err(e) => Gated::Refused(e.to_string()),
        }
    }

    /// The risk recorded on an approval.
    pub fn approval_risk(&self, approval: &Approval) -> Risk {
        approval.risk
    }
}

/// The resumable "approval required" answer: the approval's id, where to
/// follow it, and until when it can be granted.
pub fn approval_required(
    id: &Id,
    tool: &str,
    approvals: &Approvals,
    approval: &Approval,
    risk: Risk,
) -> Bytes {
    jsonrpc::error_body(
        Some(id),
        codes::APPROVAL_REQUIRED,
        &format!(
            "Call to {tool} ({risk}) requires a person's approval; retry the identical call once approval {} is granted",
            approval.id.as_str()
        ),
        Some(&json!({
            "stop_reason": StopReason::ApprovalRequired.as_str(),
            "tool": tool,
            "risk": risk.as_str(),
            "approval_id": approval.id.as_str(),
            "status": approval.status.as_str(),
            "status_url": approvals.status_url(&approval.id),
            "expires_at_ms": approval.expires_ms,
        })),
    )
}

/// Connects approvals to the rest of the firewall: every transition becomes
/// an audit row, and approvers see the policy's preview of a gated call.
pub fn wire(state: &Arc<State>, approvals: &Arc<Approvals>) {
    let auditor = state.auditor.clone();
    approvals.on_transition(Box::new(move |t: &Transition| {
        let row = transition_row(t);
        let auditor = auditor.clone();
        // Off the caller's path: the hook runs under the store's lock.
        tokio::spawn(async move {
            if let Err(e) = auditor.record_or_fail(row).await {
                tracing::error!(error = %e, "audit row of an approval transition was not written");
            }
        });
    }));
    let weak = Arc::downgrade(state);
    approvals.set_preview(Arc::new(move |approval: &Approval| {
        let state = weak.upgrade();
        let approval = approval.clone();
        async move {
            let state = state.ok_or_else(|| "the firewall is shutting down".to_owned())?;
            preview(&state, &approval).await
        }
        .boxed()
    }));
}

async fn preview(state: &State, approval: &Approval) -> Result<Value, String> {
    let up = state
        .upstreams
        .get(&approval.key.upstream)
        .ok_or_else(|| format!("no upstream {:?}", approval.key.upstream))?;
    let policy = state.policy.load_full();
    let (tool, fixed) = policy
        .preview(&up.config, &approval.key.tool)
        .ok_or_else(|| "the policy names no preview for this tool".to_owned())?;
    // Only a tool the policy classifies as read-only may preview.
    let (risk, _) = policy.risk(&up.config, tool, None);
    if risk != Risk::Read {
        return Err(format!("preview tool {tool} is not read-only ({risk})"));
    }
    let schema = state
        .catalogs
        .get(&up.config.name, tool)
        .map(|e| e.input_schema.clone());
    let arguments = super::own_client::arguments(&approval.arguments, schema.as_ref(), fixed);
    super::own_client::call_tool(up, tool, arguments).await
}

fn transition_row(t: &Transition) -> AuditRow {
    let a = &t.approval;
    let mut row = AuditRow::new();
    row.tenant = a.key.tenant.clone();
    row.subject = a
        .decision
        .as_ref()
        .map_or_else(|| a.subject.clone(), |d| d.by.clone());
    row.agent_role = a.agent.clone();
    row.run_id = a.key.run_id.clone();
    row.upstream = a.key.upstream.clone();
    row.method = "approval".into();
    row.tool = a.key.tool.clone();
    row.risk = Some(a.risk);
    row.decision = t.to.as_str().into();
    row.reason = format!(
        "approval {} {} -> {}{}",
        a.id.as_str(),
        t.from.map_or("new", |s| s.as_str()),
        t.to.as_str(),
        a.decision
            .as_ref()
            .map(|d| format!(" by {}: {}", d.by, d.reason))
            .unwrap_or_else(|| format!(" (asked by {})", a.subject))
    );
    row.stop_reason = StopReason::ApprovalRequired.as_str().into();
    let mut args = (*a.arguments).clone();
    // Already redacted when filed; masking twice is harmless.
    if let Value::Object(_) = args {
        row.arguments = JsonPayload::Value(std::mem::take(&mut args));
    }
    row
}
