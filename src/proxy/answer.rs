//! Every JSON-RPC answer the firewall gives in a client's or an upstream's
//! place is built here, from the [`Outcome`] of a decision or the failure of
//! an upstream. Stop reasons are written from [`StopReason`] only.
//!
//! Answers are JSON-RPC errors (or, for budgets and invalid arguments, tool
//! results marked `isError`) sent with HTTP 200: MCP clients read them as the
//! call's answer, not as a transport failure.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::budget::Refusal;
use crate::mcp::jsonrpc::{self, Id, Message};
use crate::mcp::version::ProtocolVersion;
use crate::outcome::StopReason;

use super::decision::{NotPermitted, Outcome};
use crate::upstream::failure::UpstreamFailure;

/// Codes the firewall itself answers with, outside the JSON-RPC reserved range
/// (-32768..-32000) as MCP asks of application errors. Stable: clients may
/// match on them.
pub(crate) mod codes {
    /// The policy refused this call (gate `deny`, a condition, a role limit).
    pub(crate) const DENIED: i32 = -31001;
    /// A person must approve this exact call first.
    pub(crate) const APPROVAL_REQUIRED: i32 = -31002;
    /// A rate limit refused the call; `data.retry_after_ms` says when to retry.
    pub(crate) const RATE_LIMITED: i32 = -31003;
    /// The upstream could not be reached or failed; `data` names it and the cause.
    pub(crate) const UPSTREAM_ERROR: i32 = -31004;
    /// The audit trail cannot record this call and the policy is fail-closed.
    pub(crate) const AUDIT_UNAVAILABLE: i32 = -31005;
    /// The shared budget store cannot be asked and calls of this risk fail
    /// closed (`[state] on_store_unavailable`); retry later.
    pub(crate) const STORE_UNAVAILABLE: i32 = -31006;
    /// No credential for the upstream could be had for this run (its
    /// token exchange failed); nothing was sent.
    pub(crate) const CREDENTIAL_UNAVAILABLE: i32 = -31007;
    /// The request needs the user at a URL first (MCP's
    /// `URLElicitationRequiredError`): their consent to an upstream.
    pub(crate) const URL_ELICITATION_REQUIRED: i32 = -32042;
}

/// A JSON-RPC error response.
pub(crate) fn error(id: Option<&Id>, code: i32, message: &str, data: Option<&Value>) -> Bytes {
    jsonrpc::error_body(id, code, message, data)
}

/// The answer to `msg` for an outcome the firewall decided itself; `None`
/// for a notification (nothing to answer) and for a cancelled call.
// An exhaustive match: every `Outcome` to its JSON-RPC answer.
#[allow(clippy::too_many_lines)]
pub(crate) fn for_outcome(
    msg: &Message,
    outcome: &Outcome,
    version: ProtocolVersion,
) -> Option<Bytes> {
    let id = msg.id.as_ref()?;
    let tool = msg.call.as_ref().map_or("", |c| c.name.as_str());
    Some(match outcome {
        Outcome::UnknownTool(_) | Outcome::PinRefused(_) => error(
            Some(id),
            jsonrpc::INVALID_PARAMS,
            &format!("Unknown tool: {tool}"),
            None,
        ),
        Outcome::UnknownMethod => {
            let method = msg.method.as_deref().unwrap_or("");
            error(
                Some(id),
                jsonrpc::METHOD_NOT_FOUND,
                &format!("Method not found: {method}"),
                Some(&json!({ "method": method })),
            )
        }
        Outcome::Denied { risk, reason, .. } => error(
            Some(id),
            codes::DENIED,
            &format!("Call to {tool} refused by policy: {reason}"),
            Some(&json!({
                "stop_reason": StopReason::Denied.as_str(),
                "tool": tool,
                "risk": risk.as_str(),
                "reason": reason,
            })),
        ),
        Outcome::BadRequestState(why) => error(
            Some(id),
            jsonrpc::INVALID_PARAMS,
            &format!("Call to {tool} refused: {why}"),
            Some(&json!({ "stop_reason": StopReason::Denied.as_str(), "tool": tool })),
        ),
        Outcome::ApprovalRequired {
            risk,
            approval: Some(a),
        } => error(
            Some(id),
            codes::APPROVAL_REQUIRED,
            &format!(
                "Call to {tool} ({risk}) requires a person's approval; retry the identical call once approval {} is granted",
                a.id
            ),
            Some(&json!({
                "stop_reason": StopReason::ApprovalRequired.as_str(),
                "tool": tool,
                "risk": risk.as_str(),
                "approval_id": a.id,
                "status": a.status,
                "status_url": a.status_url,
                "expires_at_ms": a.expires_at_ms,
            })),
        ),
        Outcome::ApprovalRequired {
            risk,
            approval: None,
        }
        | Outcome::ApprovalUnavailable { risk, .. } => {
            let why = match outcome {
                Outcome::ApprovalUnavailable { why, .. } => why.as_str(),
                _ => "approvals are not configured on this firewall",
            };
            error(
                Some(id),
                codes::APPROVAL_REQUIRED,
                &format!("Call to {tool} ({risk}) requires a person's approval, and none can be requested: {why}"),
                Some(&json!({
                    "stop_reason": StopReason::ApprovalRequired.as_str(),
                    "tool": tool,
                    "risk": risk.as_str(),
                })),
            )
        }
        // 2025-11-25 (SEP-1303) made invalid arguments a tool error the
        // model can act on; earlier revisions answer -32602.
        Outcome::InvalidArguments(detail) if version >= ProtocolVersion::V2025_11_25 => {
            invalid_arguments(id, tool, detail)
        }
        Outcome::InvalidArguments(detail) => error(
            Some(id),
            jsonrpc::INVALID_PARAMS,
            &format!("Invalid arguments for tool {tool}: {detail}"),
            None,
        ),
        Outcome::NotPermitted(NotPermitted::Prompt(name)) | Outcome::PromptPinRefused(name, _) => error(
            Some(id),
            jsonrpc::INVALID_PARAMS,
            &format!("Unknown prompt: {name}"),
            None,
        ),
        Outcome::NotPermitted(NotPermitted::Resource(uri)) => {
            // 2026-07-28 reports a missing resource as -32602; older
            // revisions use -32002.
            let code = if version.is_stateless() {
                jsonrpc::INVALID_PARAMS
            } else {
                -32002
            };
            error(
                Some(id),
                code,
                &format!("Resource not found: {uri}"),
                Some(&json!({ "uri": uri })),
            )
        }
        // The words an upstream uses for an id it does not know.
        Outcome::UnknownTask => error(
            Some(id),
            jsonrpc::INVALID_PARAMS,
            "Failed to retrieve task: Task not found",
            None,
        ),
        Outcome::AmbiguousUri { uri, why } => error(
            Some(id),
            jsonrpc::INVALID_PARAMS,
            &format!("Resource URI refused: {why} (the firewall matches resource rules on the normalized URI and does not guess at {uri:?})"),
            Some(&json!({ "uri": uri })),
        ),
        Outcome::Skipped {
            refusal: refusal @ Refusal::RateLimited { scope, retry_after },
            ..
        } => error(
            Some(id),
            codes::RATE_LIMITED,
            &format!("Call to {tool} refused: {}", refusal.describe()),
            Some(&json!({
                "stop_reason": StopReason::RateLimited.as_str(),
                "scope": scope,
                "retry_after_ms": retry_after.as_millis().max(1) as u64,
                "tool": tool,
            })),
        ),
        Outcome::Skipped {
            refusal: refusal @ Refusal::Unavailable { .. },
            risk,
        } => error(
            Some(id),
            codes::STORE_UNAVAILABLE,
            &format!("Call to {tool} refused: {}", refusal.describe()),
            Some(&json!({
                "stop_reason": StopReason::StoreUnavailable.as_str(),
                "risk": risk.as_str(),
                "retry_after_ms": 1000,
                "tool": tool,
            })),
        ),
        Outcome::Skipped { refusal, .. } => skipped(id, tool, refusal),
        Outcome::CredentialUnavailable {
            why:
                crate::credential::CredentialError::ConsentRequired {
                    upstream,
                    url,
                    id: eid,
                    url_client,
                },
            ..
        } => consent_required(
            id,
            *url_client || takes_url_elicitation(msg),
            tool,
            upstream,
            url,
            eid,
        ),
        Outcome::CredentialUnavailable { why, .. } => error(
            Some(id),
            codes::CREDENTIAL_UNAVAILABLE,
            "upstream credential unavailable",
            Some(&json!({ "reason": why.to_string(), "tool": tool })),
        ),
        Outcome::AuditUnavailable { .. } => error(
            Some(id),
            codes::AUDIT_UNAVAILABLE,
            "the audit trail cannot record this call; it was not executed",
            None,
        ),
        Outcome::HeaderMismatch(e) => error(Some(id), e.code(), &e.to_string(), None),
        Outcome::Cancelled { .. } => return None,
    })
}

/// A call whose user has not connected their account to the upstream
/// (`auth = "oauth_user"`): a URL-mode elicitation (`-32042`) to a client
/// that declares it takes them, else `-31007` whose message carries the
/// link (a person reads it there).
fn consent_required(
    id: &Id,
    url_mode: bool,
    tool: &str,
    upstream: &str,
    url: &str,
    elicitation_id: &str,
) -> Bytes {
    let message = format!(
        "{tool} needs your own {upstream} account: connect it at {url} (the link works once, for you only), then call again"
    );
    if url_mode {
        error(
            Some(id),
            codes::URL_ELICITATION_REQUIRED,
            &message,
            Some(&json!({
                "elicitations": [{
                    "mode": "url",
                    "elicitationId": elicitation_id,
                    "url": url,
                    "message": format!("Connect your {upstream} account so the agent can use {tool} as you."),
                }]
            })),
        )
    } else {
        error(
            Some(id),
            codes::CREDENTIAL_UNAVAILABLE,
            &format!("upstream credential unavailable: {message}"),
            Some(&json!({
                "reason": "consent_required",
                "connect_url": url,
                "upstream": upstream,
                "tool": tool,
            })),
        )
    }
}

/// Whether the request says its client takes URL-mode elicitation: its
/// `params._meta["io.modelcontextprotocol/clientCapabilities"]` has
/// `elicitation.url` (2026-07-28 requests carry their client's
/// capabilities).
fn takes_url_elicitation(msg: &Message) -> bool {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "io.modelcontextprotocol/clientCapabilities")]
        caps: Option<Value>,
    }
    msg.meta
        .as_deref()
        .and_then(|m| serde_json::from_str::<Meta>(m.get()).ok())
        .and_then(|m| m.caps)
        .is_some_and(|c| c.pointer("/elicitation/url").is_some_and(Value::is_object))
}

/// Invalid arguments, as the 2025-11-25 revision asks (SEP-1303): a tool
/// result marked `isError` carrying the validation message, so the model
/// can correct the call.
pub(crate) fn invalid_arguments(id: &Id, tool: &str, detail: &str) -> Bytes {
    let text = format!("Invalid arguments for tool {tool}: {detail}");
    tool_error(
        id,
        &text,
        json!({
            "tool": tool,
            "stop_reason": StopReason::Denied.as_str(),
            "invalid_arguments": detail,
        }),
    )
}

/// A call past a step or cost cap is not executed: the agent gets a tool
/// result marked `isError` that names the stop reason, so its framework
/// records a result rather than a crash.
pub(crate) fn skipped(id: &Id, tool: &str, refusal: &Refusal) -> Bytes {
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
        Refusal::RunEnded { at_s } => {
            structured["run_ended_at"] = json!(at_s);
        }
        Refusal::Unavailable { why } => {
            structured["error"] = json!(why);
        }
    }
    tool_error(id, &refusal.describe(), structured)
}

/// An answer screening withheld (`block`): a tool result marked `isError`
/// for a tool's, a JSON-RPC error for any other, naming the kinds found,
/// never the content.
pub(crate) fn withheld(id: Option<&Id>, tool: Option<&str>, kinds: &[&str]) -> Bytes {
    let text = format!(
        "The firewall withheld this answer: it contained {} ([screen] blocks it).",
        kinds.join(", ")
    );
    let data = json!({
        "withheld": true,
        "found": kinds,
        "stop_reason": StopReason::Denied.as_str(),
    });
    match (id, tool) {
        (Some(id), Some(tool)) => {
            let mut data = data;
            data["tool"] = json!(tool);
            tool_error(id, &text, data)
        }
        _ => error(id, codes::DENIED, &text, Some(&data)),
    }
}

fn tool_error(id: &Id, text: &str, structured: Value) -> Bytes {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "result": {
            "content": [{ "type": "text", "text": text }],
            "structuredContent": structured,
            "isError": true,
        },
    });
    Bytes::from(body.to_string())
}

/// The answer to a request the upstream failed to answer.
pub(crate) fn upstream_error(id: Option<&Id>, upstream: &str, failure: &UpstreamFailure) -> Bytes {
    error(
        id,
        codes::UPSTREAM_ERROR,
        &format!("upstream {upstream:?} failed: {failure}"),
        Some(&json!({
            "upstream": upstream,
            "cause": failure.to_string(),
            "stop_reason": StopReason::UpstreamError.as_str(),
        })),
    )
}

/// The answer to a held call whose approval a person denied.
pub(crate) fn approval_denied(
    id: &Id,
    tool: &str,
    approval: &str,
    by: &str,
    reason: &str,
) -> Bytes {
    error(
        Some(id),
        codes::DENIED,
        &format!("a person denied the call to {tool}: {reason}"),
        Some(&json!({
            "stop_reason": StopReason::Denied.as_str(),
            "approval_id": approval,
            "status": crate::approval::Status::Denied.as_str(),
            "by": by,
            "reason": reason,
        })),
    )
}

/// The answer to a held call whose approval ended without running it
/// (expired, or already used by an identical call).
pub(crate) fn approval_ended(id: &Id, tool: &str, approval: &str, status: &str) -> Bytes {
    let message = match status {
        "consumed" => "the approval was already used by an identical call".to_owned(),
        _ => format!("the approval for {tool} {status} without a decision"),
    };
    error(
        Some(id),
        codes::APPROVAL_REQUIRED,
        &message,
        Some(&json!({
            "stop_reason": StopReason::ApprovalRequired.as_str(),
            "approval_id": approval,
            "status": status,
        })),
    )
}

/// An upstream answer the policy refuses to pass on: it asked the client
/// for something the policy does not allow.
pub(crate) fn refused_input_request(id: Option<&Id>, refused: &[String]) -> Bytes {
    error(
        id,
        codes::DENIED,
        &format!(
            "the upstream asked the client for {}, which the policy refuses",
            refused.join(", ")
        ),
        Some(&json!({ "stop_reason": StopReason::Denied.as_str(), "refused": refused })),
    )
}

/// `-32601` for a server-to-client request the policy refuses, sent to the
/// upstream in the client's place.
pub(crate) fn refused_server_request(id: &Id, method: &str) -> Bytes {
    error(
        Some(id),
        jsonrpc::METHOD_NOT_FOUND,
        &format!("{method} is not permitted by the firewall's policy"),
        None,
    )
}

/// An unknown or foreign session (HTTP 404, no id): the client starts a
/// new session, as the transport spec requires.
pub(crate) fn session_not_found() -> Bytes {
    error(None, -32001, "Session not found", None)
}

/// The `notifications/progress` a held call's stream carries while it waits
/// for a person (`ticks` so far).
pub(crate) fn hold_progress(token: &Value, ticks: u64, tool: &str, approval: &str) -> Bytes {
    Bytes::from(
        json!({
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {
                "progressToken": token,
                "progress": ticks,
                "message": format!("waiting for a person to approve {tool} (approval {approval})"),
            },
        })
        .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::jsonrpc;

    fn first(body: &str) -> Message {
        let limits = jsonrpc::Limits {
            max_depth: 64,
            max_batch: 16,
        };
        jsonrpc::parse(body.as_bytes(), &limits)
            .unwrap()
            .messages
            .remove(0)
    }

    fn consent() -> Outcome {
        Outcome::CredentialUnavailable {
            risk: crate::policy::Risk::Read,
            why: crate::credential::CredentialError::ConsentRequired {
                upstream: "github".to_owned(),
                url: "https://fw.example/connect/github?ticket=T".to_owned(),
                id: "n1".to_owned(),
                url_client: false,
            },
        }
    }

    #[test]
    fn a_missing_consent_is_a_url_elicitation_only_for_a_client_that_takes_one() {
        let takes = first(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}}}}"#,
        );
        let v: Value = serde_json::from_slice(
            &for_outcome(&takes, &consent(), ProtocolVersion::V2026_07_28).unwrap(),
        )
        .unwrap();
        assert_eq!(v["error"]["code"], -32042, "{v}");
        let e = &v["error"]["data"]["elicitations"][0];
        assert_eq!(e["mode"], "url");
        assert_eq!(e["elicitationId"], "n1");
        assert_eq!(e["url"], "https://fw.example/connect/github?ticket=T");

        // Form-mode elicitation only, or no capabilities: the link in an
        // error a person reads.
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/clientCapabilities":{"elicitation":{"form":{}}}}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        ] {
            let v: Value = serde_json::from_slice(
                &for_outcome(&first(body), &consent(), ProtocolVersion::V2025_11_25).unwrap(),
            )
            .unwrap();
            assert_eq!(v["error"]["code"], -31007, "{v}");
            assert_eq!(v["error"]["data"]["reason"], "consent_required");
            assert!(v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("https://fw.example/connect/github?ticket=T"));
        }
        // The error's own text (logs, the audit row) never carries the link.
        let Outcome::CredentialUnavailable { why, .. } = consent() else {
            unreachable!()
        };
        assert!(!why.to_string().contains("ticket"), "{why}");
    }
}
