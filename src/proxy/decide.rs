//! The decision step: what happens to each client-to-server message, decided
//! on the parsed body against one policy snapshot.
//!
//! | message | verdict |
//! |---|---|
//! | `tools/call` of a tool hidden from the run, or not in the upstream's catalog | `-32602 Unknown tool` (identical either way) |
//! | `tools/call` whose condition fails | `-31001` denied, with the reason |
//! | `tools/call` behind an `approve` gate | `-31002` approval required |
//! | `tools/call` whose arguments fail the tool's input schema | `-32602` with the schema errors |
//! | `prompts/get` / `resources/read|subscribe` outside the run's rules | `-32602` unknown prompt / resource not found |
//! | everything else on a reachable upstream | forwarded |
//!
//! Answers are JSON-RPC errors with HTTP 200: MCP clients read them as the
//! call's answer, not as a transport failure.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::approval::{Approval, CallKey};
use crate::auth::Claims;
use crate::budget::{Budgets, CallBudget, Refusal, Reservation};
use crate::catalog::{ArgumentsError, Catalogs};
use crate::mcp::jsonrpc::{self, Id, Kind, Message};
use crate::outcome::{DecisionKind, StopReason};
use crate::policy::{self, Authority, Call, Decision, Hidden, Identity, Policy, Risk};
use crate::telemetry::Metrics;

use super::approvals::Gated;
use super::error::codes;
use super::upstream::UpstreamClient;
use super::version::ProtocolVersion;

/// Everything a decision needs about the run and the upstream.
pub struct RunContext {
    /// The policy snapshot this request is decided with.
    pub policy: Arc<Policy>,
    /// The verified token.
    pub claims: Arc<Claims>,
    /// The run's authority.
    pub authority: Authority,
    /// Whether the token's issuer is the service-account issuer.
    pub service_issuer: bool,
    /// The upstream.
    pub upstream: Arc<UpstreamClient>,
    /// Tool catalogs.
    pub catalogs: Arc<Catalogs>,
    /// The request's protocol revision.
    pub version: ProtocolVersion,
    /// Rate limits and caps.
    pub budgets: Arc<Budgets>,
    /// Request-path metrics.
    pub metrics: Arc<Metrics>,
    /// Human approvals, when configured.
    pub approvals: Option<Arc<crate::approval::Approvals>>,
    /// Masks secrets in arguments shown to approvers.
    pub redactor: Arc<crate::audit::Redactor>,
}

/// What to do with one message.
#[derive(Debug)]
pub enum Verdict {
    /// Send it upstream.
    Forward {
        /// The tool's risk, for `tools/call`.
        risk: Option<Risk>,
        /// The budget reserved for a `tools/call`, settled when it ends.
        reservation: Option<Reservation>,
    },
    /// A call behind an `approve` gate waiting for a person.
    Hold {
        /// The pending approval.
        approval: Box<Approval>,
        /// Its key.
        key: CallKey,
        /// The tool's risk.
        risk: Risk,
    },
    /// Answer it here; nothing reaches the upstream.
    Answer {
        /// The JSON-RPC response (absent for a refused notification).
        body: Option<Bytes>,
        /// Why, for logs and audit.
        outcome: Outcome,
    },
}

/// Why the firewall answered a message itself.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Hidden or nonexistent tool.
    UnknownTool(Option<Hidden>),
    /// Refused by a condition.
    Denied {
        /// Risk of the tool.
        risk: Risk,
        /// The reason.
        reason: String,
        /// The rule.
        rule: String,
    },
    /// Needs a person's approval.
    ApprovalRequired {
        /// Risk of the tool.
        risk: Risk,
    },
    /// Arguments fail the schema.
    InvalidArguments(String),
    /// A prompt or resource outside the run's rules.
    NotPermitted,
    /// Over a budget: not executed.
    Skipped {
        /// Risk of the tool.
        risk: Risk,
        /// Which budget.
        refusal: Refusal,
    },
    /// The audit trail cannot record the call and its risk is fail-closed.
    AuditUnavailable {
        /// Risk of the tool.
        risk: Risk,
        /// The spool's error.
        error: String,
    },
}

// === impl Outcome ===

impl Outcome {
    /// Decision, stop reason, reason text and risk for the audit row.
    pub fn audit(&self) -> (DecisionKind, Option<StopReason>, String, Option<Risk>) {
        match self {
            Outcome::UnknownTool(h) => (
                DecisionKind::Hidden,
                Some(StopReason::Denied),
                h.as_ref().map_or_else(
                    || "not in the upstream's catalog".to_owned(),
                    |h| h.to_string(),
                ),
                None,
            ),
            Outcome::Denied { risk, reason, rule } => (
                DecisionKind::Deny,
                Some(StopReason::Denied),
                format!("{reason} ({rule})"),
                Some(*risk),
            ),
            Outcome::ApprovalRequired { risk } => (
                DecisionKind::Approve,
                Some(StopReason::ApprovalRequired),
                format!("{risk} tool behind an approve gate"),
                Some(*risk),
            ),
            Outcome::InvalidArguments(detail) => (
                DecisionKind::Invalid,
                Some(StopReason::Denied),
                detail.clone(),
                None,
            ),
            Outcome::NotPermitted => (
                DecisionKind::Hidden,
                Some(StopReason::Denied),
                "prompt or resource outside the run's rules".to_owned(),
                None,
            ),
            Outcome::Skipped { risk, refusal } => (
                DecisionKind::Skip,
                Some(refusal.stop_reason()),
                refusal.describe(),
                Some(*risk),
            ),
            Outcome::AuditUnavailable { risk, error } => {
                (DecisionKind::Error, None, error.clone(), Some(*risk))
            }
        }
    }
}

// === impl RunContext ===

impl RunContext {
    /// The policy's view of the token.
    pub fn identity(&self) -> Identity<'_> {
        identity(&self.claims, self.service_issuer)
    }

    /// Decides one message.
    pub fn decide(&self, msg: &Message) -> Verdict {
        if msg.kind != Kind::Request {
            return Verdict::Forward {
                risk: None,
                reservation: None,
            };
        }
        match msg.method.as_deref() {
            Some("tools/call") => self.decide_call(msg),
            Some("prompts/get") => {
                let name = msg.name.as_deref().unwrap_or("");
                if self
                    .policy
                    .prompt_allowed(&self.authority, &self.upstream.config, name)
                {
                    Verdict::Forward {
                        risk: None,
                        reservation: None,
                    }
                } else {
                    answer(
                        msg.id.as_ref(),
                        jsonrpc::INVALID_PARAMS,
                        &format!("Unknown prompt: {name}"),
                        None,
                        Outcome::NotPermitted,
                    )
                }
            }
            Some("resources/read" | "resources/subscribe" | "resources/unsubscribe") => {
                let uri = msg.name.as_deref().unwrap_or("");
                if self
                    .policy
                    .resource_allowed(&self.authority, &self.upstream.config, uri)
                {
                    Verdict::Forward {
                        risk: None,
                        reservation: None,
                    }
                } else {
                    // 2026-07-28 reports a missing resource as -32602; older
                    // revisions use -32002.
                    let code = if self.version.is_stateless() {
                        jsonrpc::INVALID_PARAMS
                    } else {
                        -32002
                    };
                    answer(
                        msg.id.as_ref(),
                        code,
                        &format!("Resource not found: {uri}"),
                        Some(json!({ "uri": uri })),
                        Outcome::NotPermitted,
                    )
                }
            }
            _ => Verdict::Forward {
                risk: None,
                reservation: None,
            },
        }
    }

    fn decide_call(&self, msg: &Message) -> Verdict {
        let Some(call) = &msg.call else {
            return answer(
                msg.id.as_ref(),
                jsonrpc::INVALID_PARAMS,
                "tools/call needs a tool name",
                None,
                Outcome::UnknownTool(None),
            );
        };
        let tool = call.name.as_str();
        let unknown = |hidden: Option<Hidden>| {
            answer(
                msg.id.as_ref(),
                jsonrpc::INVALID_PARAMS,
                &format!("Unknown tool: {tool}"),
                None,
                Outcome::UnknownTool(hidden),
            )
        };
        // A tool the upstream never listed does not exist, whatever the
        // policy would say about its name.
        let Some(entry) = self.catalogs.get(&self.upstream.config.name, tool) else {
            return unknown(None);
        };
        let arguments: Value = match &call.arguments {
            Some(raw) => serde_json::from_str(raw.get()).unwrap_or(Value::Null),
            None => Value::Object(Default::default()),
        };
        let identity = self.identity();
        let decision = self.policy.decide(
            &Call {
                identity: &identity,
                authority: &self.authority,
                upstream: &self.upstream.config,
                tool,
                arguments: &arguments,
                hints: entry.hints,
            },
            None,
        );
        let risk = match decision {
            Decision::Unknown(h) => return unknown(Some(h)),
            Decision::Deny { risk, reason, rule } => {
                return answer(
                    msg.id.as_ref(),
                    codes::DENIED,
                    &format!("Call to {tool} refused by policy: {reason}"),
                    Some(
                        json!({ "stop_reason": "denied", "tool": tool, "risk": risk.as_str(), "reason": reason }),
                    ),
                    Outcome::Denied { risk, reason, rule },
                )
            }
            Decision::Approve { risk } | Decision::Allow { risk } => risk,
        };
        // Arguments are checked before any gate: an approver should never be
        // asked about a call the upstream would reject anyway.
        if let Err(e) = entry.validate(&arguments) {
            let detail = match &e {
                ArgumentsError::BadSchema(s) => s.clone(),
                ArgumentsError::Invalid(list) => list.join("; "),
            };
            return answer(
                msg.id.as_ref(),
                jsonrpc::INVALID_PARAMS,
                &format!("Invalid arguments for tool {tool}: {detail}"),
                None,
                Outcome::InvalidArguments(detail),
            );
        }
        if matches!(decision, Decision::Approve { .. }) {
            match self.gate(tool, &arguments, risk) {
                // Granted for exactly this call: it runs (once), under budgets.
                Gated::Approved(approval) => {
                    tracing::info!(tool, approval = approval.id.as_str(), "running an approved call");
                }
                Gated::Pending { approval, key } => {
                    return Verdict::Hold {
                        approval: Box::new(approval),
                        key,
                        risk,
                    }
                }
                Gated::Refused(why) => {
                    return answer(
                        msg.id.as_ref(),
                        codes::APPROVAL_REQUIRED,
                        &format!("Call to {tool} ({risk}) requires a person's approval, and none can be requested: {why}"),
                        Some(json!({ "stop_reason": "approval_required", "tool": tool, "risk": risk.as_str() })),
                        Outcome::ApprovalRequired { risk },
                    )
                }
            }
        }
        // Budgets last: only a call that would run spends them.
        let role = self.policy.agent(&self.authority.agent);
        let budget = CallBudget {
            tenant: &self.claims.tenant_id,
            run: &self.claims.run_id,
            upstream: &self.upstream.config.name,
            tool,
            token_exp: self.claims.exp,
            price: self.policy.price(&self.upstream.config, tool),
            max_steps: role
                .and_then(|a| a.max_steps)
                .unwrap_or(self.budgets.config().default_max_steps),
            max_cost: role
                .and_then(|a| a.max_cost)
                .or(self.budgets.config().default_max_cost),
            run_per_s: role.and_then(|a| a.calls_per_s),
            upstream_per_s: self.upstream.config.max_calls_per_s,
        };
        match self.budgets.admit(&budget) {
            Ok(reservation) => Verdict::Forward {
                risk: Some(risk),
                reservation: Some(reservation),
            },
            Err(refusal) => match &refusal {
                // Rate limits are transient: a JSON-RPC error saying when to
                // retry. Caps are final for the run: a skipped tool result.
                Refusal::RateLimited { scope, retry_after } => {
                    let data = json!({
                        "stop_reason": "rate_limited",
                        "scope": scope,
                        "retry_after_ms": retry_after.as_millis().max(1) as u64,
                        "tool": tool,
                    });
                    answer(
                        msg.id.as_ref(),
                        codes::RATE_LIMITED,
                        &format!("Call to {tool} refused: {}", refusal.describe()),
                        Some(data),
                        Outcome::Skipped {
                            risk,
                            refusal: refusal.clone(),
                        },
                    )
                }
                _ => Verdict::Answer {
                    body: msg.id.as_ref().map(|id| skipped_result(id, tool, &refusal)),
                    outcome: Outcome::Skipped { risk, refusal },
                },
            },
        }
    }
}

/// The policy's view of verified claims.
pub fn identity(claims: &Claims, service_issuer: bool) -> Identity<'_> {
    Identity {
        subject: &claims.sub,
        tenant: &claims.tenant_id,
        agent: &claims.agent,
        run_id: &claims.run_id,
        mode: match claims.mode {
            crate::auth::Mode::Caller => policy::Mode::Caller,
            crate::auth::Mode::Agent => policy::Mode::Agent,
            crate::auth::Mode::ServiceAccount => policy::Mode::ServiceAccount,
        },
        projects: &claims.projects,
        ceiling: claims.project_ceiling.as_deref(),
        service_issuer,
    }
}

/// A call past a step or cost cap is not executed: the agent gets a tool
/// result marked `isError` that names the stop reason, so its framework
/// records a result rather than a crash.
pub fn skipped_result(id: &Id, tool: &str, refusal: &Refusal) -> Bytes {
    let mut structured = json!({
        "skipped": true,
        "tool": tool,
        "stop_reason": refusal.stop_reason().as_str(),
    });
    match refusal {
        Refusal::StepCap { used, max } => {
            structured["steps_used"] = json!(used);
            structured["max_steps"] = json!(max);
        }
        Refusal::CostCap {
            scope,
            spent,
            price,
            cap,
        } => {
            structured["scope"] = json!(scope);
            structured["spent"] = json!(spent);
            structured["price"] = json!(price);
            structured["cap"] = json!(cap);
        }
        Refusal::RateLimited { scope, retry_after } => {
            structured["scope"] = json!(scope);
            structured["retry_after_ms"] = json!(retry_after.as_millis() as u64);
        }
    }
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "result": {
            "content": [{ "type": "text", "text": refusal.describe() }],
            "structuredContent": structured,
            "isError": true,
        },
    });
    Bytes::from(body.to_string())
}

fn answer(
    id: Option<&Id>,
    code: i32,
    message: &str,
    data: Option<Value>,
    outcome: Outcome,
) -> Verdict {
    Verdict::Answer {
        body: id.map(|id| jsonrpc::error_body(Some(id), code, message, data.as_ref())),
        outcome,
    }
}
