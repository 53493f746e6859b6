//! The request path's side of human approvals: what a gated call becomes
//! (held, resumed, or run once after approval), how a multi-round call
//! (2026-07-28) stays bound to the approval it ran under, the audit rows of
//! approval transitions, and the preview an approver sees.
//!
//! A call approved once runs once. When its answer is an input-required
//! result, the client must retry with the same tool and arguments plus its
//! answers; the firewall seals into that result's `requestState` which
//! approval the call ran under (with the upstream's own state inside), so
//! the retry runs under the same approval without asking the person again,
//! and only a retry of exactly that call by the same principal and run, within
//! the approval's lifetime, can use it. The client's word counts for nothing:
//! a state that does not verify is refused.

use std::sync::Arc;

use futures_util::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::{Approval, ApprovalId, Approvals, NewApproval, Transition};
use crate::audit::{redact_json, AuditRow, JsonPayload};
use crate::outcome::StopReason;
use crate::policy::Risk;

use super::super::decision::{Gated, Granted, RunContext};
use super::super::State;

/// What the firewall seals into a `requestState` (see the module docs).
#[derive(Serialize, Deserialize)]
struct StatePayload {
    /// Version of this layout.
    v: u8,
    /// The approval.
    a: String,
    /// Who approved.
    b: String,
    /// The run.
    r: String,
    /// The tool.
    n: String,
    /// Arguments hash, hex.
    h: String,
    /// Until, ms since the epoch.
    x: u64,
    /// The upstream's own `requestState`, if it sent one.
    o: Option<String>,
    /// The round this state releases (spent once in the approvals store).
    k: u32,
    /// When the approval was given, ms since the epoch (absent in states
    /// sealed by earlier releases: 0).
    #[serde(default)]
    t: u64,
}

// === impl RunContext ===

impl RunContext {
    /// Consumes a granted approval for this exact call, or files one:
    /// `Ok(Ok(granted))` runs the call, `Ok(Err(gated))` waits for a person,
    /// `Err(why)` means no approval can be had.
    pub(crate) async fn gate(
        &self,
        tool: &str,
        arguments: &Value,
        args_sha256: [u8; 32],
        risk: Risk,
        why: Option<String>,
    ) -> Result<Result<Granted, Gated>, String> {
        let Some(approvals) = &self.approvals else {
            return Err("approvals are not configured on this firewall".to_owned());
        };
        let key = self.call_key(tool, args_sha256);
        if let Some(approval) = approvals.consume(&key).await {
            return Ok(Ok(Granted::of(&approval, approvals)));
        }
        let mut shown = arguments.clone();
        redact_json(&mut shown, &self.redactor);
        let role = self.policy.agent(&self.authority.agent);
        let new = NewApproval {
            key: key.clone(),
            agent: self.authority.agent.clone(),
            risk,
            arguments: shown,
            token_exp: self.claims.exp,
            preview_tool: self
                .policy
                .preview(self.upstream.config.facts(), tool)
                .map(|(t, _)| t.to_owned()),
            self_approval: role.is_some_and(|a| a.self_approval)
                || approvals.config().self_approval_default,
            why,
        };
        match approvals.request(new).await {
            Ok(approval) => Ok(Err(Gated {
                approval,
                key,
                risk,
                pin: None,
                recheck: None,
            })),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Seals `granted` and the upstream's own `requestState` into the
    /// `requestState` the client gets.
    pub(crate) fn seal_granted(&self, granted: &Granted, upstream_state: Option<String>) -> String {
        let payload = StatePayload {
            v: 2,
            a: granted.approval.as_str().to_owned(),
            b: granted.by.clone(),
            r: self.claims.run_id.clone(),
            n: granted.tool.clone(),
            h: hex::encode(granted.args_sha256),
            x: granted.until_ms,
            o: upstream_state,
            k: granted.round.saturating_add(1),
            t: granted.approved_ms,
        };
        let bytes = serde_json::to_vec(&payload).unwrap_or_default();
        self.sessions.seal_state(&self.principal(), &bytes)
    }

    /// The approval a retry's sealed `requestState` binds it to, and the
    /// upstream's own state, if the state was sealed for this principal,
    /// run, tool and arguments and has not lapsed.
    pub(crate) fn open_granted(
        &self,
        state: &str,
        tool: &str,
        args_sha256: &[u8; 32],
    ) -> Result<(Granted, Option<String>), String> {
        let refused = |why: &str| format!("requestState {why}");
        let bytes = self
            .sessions
            .open_state(&self.principal(), state.as_bytes())
            .map_err(|e| {
                refused(&format!(
                    "was not issued by this firewall to this caller ({e})"
                ))
            })?;
        let p: StatePayload =
            serde_json::from_slice(&bytes).map_err(|_| refused("is not readable"))?;
        if p.v != 2 || p.r != self.claims.run_id {
            return Err(refused("belongs to another run"));
        }
        if p.n != tool || p.h != hex::encode(args_sha256) {
            return Err(refused(
                "belongs to another call (the retry must repeat the tool and its arguments)",
            ));
        }
        if crate::clock::now_ms() >= p.x {
            return Err(refused("has expired; call the tool again"));
        }
        let approval = ApprovalId::parse(&p.a).ok_or_else(|| refused("is not readable"))?;
        Ok((
            Granted {
                approval,
                by: p.b,
                approved_ms: p.t,
                tool: p.n,
                args_sha256: *args_sha256,
                until_ms: p.x,
                round: p.k,
            },
            p.o,
        ))
    }
}

impl RunContext {
    /// Spends the round a retry's sealed `requestState` releases, before
    /// the retry runs: a replayed state finds it spent and is refused.
    pub(crate) async fn spend_round(&self, granted: &Granted) -> Result<(), String> {
        let Some(approvals) = &self.approvals else {
            return Err("approvals are not configured on this firewall".to_owned());
        };
        approvals
            .spend_round(&self.claims.tenant_id, &granted.approval, granted.round)
            .await
            .map_err(|e| format!("requestState {e}"))
    }
}

/// Connects approvals to the rest of the firewall: every transition becomes
/// an audit row, and approvers see the policy's preview of a gated call.
pub(crate) fn wire(state: &Arc<State>, approvals: &Arc<Approvals>) {
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
    let budgets = Arc::downgrade(&state.budgets);
    approvals.set_labels(Arc::new(move |tenant: &str, run: &str| {
        let Some(budgets) = budgets.upgrade() else {
            return Vec::new();
        };
        let held = budgets.labels().known_held(tenant, run);
        crate::policy::Labels::ALL
            .iter()
            .filter(|(l, _)| held.labels.contains(*l))
            .map(|(l, name)| crate::approval::RunLabel {
                label: (*name).to_owned(),
                from: held.source(*l).unwrap_or("an earlier answer").to_owned(),
            })
            .collect()
    }));
    let weak = Arc::downgrade(state);
    approvals.set_preview(Arc::new(move |approval: &Approval, by: &str| {
        let state = weak.upgrade();
        let approval = approval.clone();
        let by = by.to_owned();
        async move {
            let state = state.ok_or_else(|| "the firewall is shutting down".to_owned())?;
            preview(&state, &approval, &by).await
        }
        .boxed()
    }));
}

/// The preview of `approval` for the approver `by`: a call of the policy's
/// read-only preview tool, on record as the firewall's own request made for
/// that approver.
async fn preview(state: &State, approval: &Approval, by: &str) -> Result<Value, String> {
    let up = state
        .upstreams
        .get(&approval.key.upstream)
        .ok_or_else(|| format!("no upstream {:?}", approval.key.upstream))?;
    let policy = state.policy.load_full();
    let (tool, fixed) = policy
        .preview(up.config.facts(), &approval.key.tool)
        .ok_or_else(|| "the policy names no preview for this tool".to_owned())?;
    // Only a tool the policy classifies as read-only may preview.
    let (risk, _) = policy.risk(up.config.facts(), tool, None);
    if risk != Risk::Read {
        return Err(format!("preview tool {tool} is not read-only ({risk})"));
    }
    let schema = state
        .catalogs
        .get(&up.config.name, tool)
        .map(|e| e.input_schema.clone());
    let arguments =
        crate::upstream::own_client::arguments(&approval.arguments, schema.as_ref(), fixed);
    // The approvals side shows the reason to the approver as text.
    let reason = format!(
        "preview {tool} of approval {} ({}), opened by {by}",
        approval.id.as_str(),
        approval.key.tool
    );
    let on_behalf = crate::upstream::own_client::OnBehalf {
        auditor: &state.auditor,
        tenant: &approval.key.tenant,
        subject: by,
        run_id: &approval.key.run_id,
        user: None,
        reason: &reason,
    };
    crate::upstream::own_client::call_tool(up, on_behalf, tool, arguments)
        .await
        .map_err(|e| e.to_string())
}

/// Connects pins to the rest of the firewall: every drift becomes an
/// audit row (with both definitions) and a webhook notification.
pub(crate) fn wire_pins(state: &Arc<State>, pins: &Arc<crate::pins::PinStore>) {
    let auditor = state.auditor.clone();
    let approvals = state.approvals.clone();
    pins.on_drift(Box::new(move |p: &crate::pins::Proposal| {
        let mut row = AuditRow::new();
        row.upstream = p.upstream.clone();
        row.method = "pins".into();
        row.tool = p.subject.label(&p.tool);
        row.decision = "drift".into();
        row.stop_reason = match p.kind {
            "changed" => StopReason::PinMismatch,
            "shadowing" => StopReason::PinShadowing,
            _ => StopReason::Unpinned,
        }
        .as_str()
        .into();
        row.reason = match &p.pinned {
            Some(pin) => format!(
                "{} definition {} ({}): pinned {} by {}, now {}",
                p.subject.as_str(), p.kind, p.tool, pin.sha256, pin.pinned_by, p.sha256
            ),
            None => format!("{} definition {} ({}): {}", p.subject.as_str(), p.kind, p.tool, p.sha256),
        };
        let definitions = serde_json::json!({
            "seen": serde_json::from_str::<Value>(&p.definition).unwrap_or(Value::Null),
            "pinned": p.pinned.as_ref().and_then(|x| serde_json::from_str::<Value>(&x.definition).ok()),
        });
        row.arguments = JsonPayload::Value(definitions);
        let auditor = auditor.clone();
        tokio::spawn(async move {
            if let Err(e) = auditor.record_or_fail(row).await {
                tracing::error!(error = %e, "audit row of a pin drift was not written");
            }
        });
        if let Some(a) = &approvals {
            a.notify(
                "pin.drift",
                format!("{}.{}.{}", p.upstream, p.tool, p.sha256),
                serde_json::json!({
                    "event": "pin.drift",
                    "upstream": p.upstream,
                    "subject": p.subject.as_str(),
                    "tool": p.tool,
                    "kind": p.kind,
                    "sha256": p.sha256,
                    "pinned_sha256": p.pinned.as_ref().map(|x| x.sha256.clone()),
                    "console_url": format!("{}#pins", a.console_url_base()),
                }),
            );
        }
    }));
}

fn transition_row(t: &Transition) -> AuditRow {
    let a = &t.approval;
    let mut row = AuditRow::new();
    row.tenant = a.key.tenant.clone();
    row.subject = a
        .decision
        .as_ref()
        .map_or_else(|| a.key.subject.clone(), |d| d.by.clone());
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
            .unwrap_or_else(|| format!(" (asked by {})", a.key.subject))
    );
    row.stop_reason = StopReason::ApprovalRequired.as_str().into();
    row.approval_id = a.id.as_str().to_owned();
    if let Some(d) = a.decision.as_ref().filter(|d| d.approved) {
        row.approver.clone_from(&d.by);
        row.approved_ms = d.at_ms;
    }
    let mut args = (*a.arguments).clone();
    // Already redacted when filed; masking twice is harmless.
    if let Value::Object(_) = args {
        row.arguments = JsonPayload::Value(std::mem::take(&mut args));
    }
    row
}
