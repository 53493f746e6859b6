//! The decision's vocabulary: the run's context ([`RunContext`]), what the
//! decision step ([`super::request::decide`]) rules on each message
//! ([`Ruling`], [`Verdict`], [`Outcome`]), what admission needs of it, and
//! the approval a call runs under ([`Granted`]). Below the stages that make
//! decisions, and below the records and the relay that carry them out.

use std::sync::Arc;

use serde_json::Value;

use crate::approval::{Approval, ApprovalId, Approvals, CallKey};
use crate::audit::{AuditError, Redactor};
use crate::auth::Claims;
use crate::budget::{Budgets, Refusal, Reservation};
use crate::catalog::Catalogs;
use crate::mcp::headers::HeaderMismatch;
use crate::mcp::version::ProtocolVersion;
use crate::outcome::{DecisionKind, StopReason};
use crate::policy::{Authority, Hidden, Policy, Risk};
use crate::telemetry::Metrics;

use super::held_calls::Holds;
use crate::session::Sessions;
use crate::upstream::client::UpstreamClient;

/// Everything a decision needs about the run and the upstream.
pub(crate) struct RunContext {
    /// The policy snapshot this request is decided with.
    pub policy: Arc<Policy>,
    /// The shadow policy's snapshot (`[policy] shadow_dir`), when one is
    /// configured and compiles: every `tools/call` is also decided under
    /// it, and only recorded.
    pub shadow: Option<Arc<Policy>>,
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
    pub approvals: Option<Arc<Approvals>>,
    /// Masks secrets in arguments shown to approvers.
    pub redactor: Arc<Redactor>,
    /// Seals session ids, event ids and request states.
    pub sessions: Arc<Sessions>,
    /// True once open streams must end (shutdown).
    pub closing: tokio::sync::watch::Receiver<bool>,
    /// Reviewed tool definitions.
    pub pins: Arc<crate::pins::PinStore>,
    /// Catalog refills (a `list_changed` re-lists at once).
    pub refills: Arc<crate::upstream::refill::Refills>,
    /// The tasks this replica saw created.
    pub tasks: Arc<crate::tasks::Tasks>,
    /// This request's trace, when traces are on.
    pub trace: Option<Arc<crate::trace::RequestTrace>>,
    /// The virtual server this message came through, if any (on record
    /// beside the member upstream).
    pub via: Option<Arc<str>>,
    /// The tool token as the client sent it, kept only where the upstream
    /// takes a token exchanged for the run (`auth = "token_exchange"`).
    pub subject_token: Option<Arc<str>>,
}

/// What a decision knows besides the message and the run: the caller's
/// session and the calls held for approval.
pub(crate) struct Around<'a> {
    /// The request body the messages were parsed from.
    pub body: &'a str,
    /// The upstream's session id (unsealed), if the request has one.
    pub session: Option<&'a [u8]>,
    /// Calls held for approval, to cancel.
    pub holds: &'a Holds,
    /// The request's headers (`Mcp-Param-*` are checked once the called
    /// tool is known to be visible to the run).
    pub headers: &'a http::HeaderMap,
}

/// What to do with one message.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Send it upstream.
    Forward(Forwarding),
    /// A call behind an `approve` gate waiting for a person.
    Hold(Box<Gated>),
    /// Answer it here; nothing reaches the upstream.
    Answer(Outcome),
}

/// What [`RunContext::decide`] makes of a message: a final verdict, or a
/// `tools/call` the policy lets through that still needs the admission step
/// (its approval gate and its budget, which ask stores).
#[derive(Debug)]
pub(crate) enum Ruling {
    /// Decided.
    Final(Verdict),
    /// Decided by the policy; admission follows ([`super::request::admit`]).
    Admit(Box<Admission>),
}

impl From<Verdict> for Ruling {
    fn from(v: Verdict) -> Ruling {
        Ruling::Final(v)
    }
}

impl From<Outcome> for Ruling {
    fn from(o: Outcome) -> Ruling {
        Ruling::Final(Verdict::Answer(o))
    }
}

/// A `tools/call` the policy lets through: its gate and its budget are
/// asked next.
#[derive(Debug)]
pub(crate) struct Admission {
    /// The tool.
    pub tool: String,
    /// Its risk.
    pub risk: Risk,
    /// The arguments and their hash, when an `approve` gate must be passed
    /// (and no sealed request state already carries the approval).
    pub gate: Option<(Value, [u8; 32])>,
    /// The approval a multi-round retry runs under.
    pub granted: Option<Arc<Granted>>,
    /// The message to send instead of its bytes.
    pub rewrite: Option<String>,
    /// The run's labels can gate it (`[taint]`): asked in admission.
    pub taint: Option<TaintCheck>,
    /// The pin its definition matched (SHA-256), if it matched one.
    pub pin: Option<[u8; 32]>,
}

/// A call whose gate the run's labels may change ([`crate::policy::Taint`]).
#[derive(Debug)]
pub(crate) struct TaintCheck {
    /// It can carry data out.
    pub egress: bool,
    /// Its arguments and their hash, for an approval a label may ask for
    /// (`None` when the call already has a gate or an approval).
    pub arguments: Option<(Value, [u8; 32])>,
}

/// A message that goes upstream.
#[derive(Debug, Default)]
pub(crate) struct Forwarding {
    /// The tool's (or extra method's) risk.
    pub risk: Option<Risk>,
    /// The budget reserved for a `tools/call`, settled when it ends.
    pub reservation: Option<Reservation>,
    /// The approval this call runs under, if it was gated.
    pub granted: Option<Arc<Granted>>,
    /// The message to send instead of its bytes (a multi-round retry whose
    /// `requestState` the firewall sealed gets the upstream's own back).
    pub rewrite: Option<String>,
    /// The run's own task a `tasks/*` request names (opened from its sealed
    /// id); the upstream gets its own id, in the body and in `Mcp-Name`.
    pub task: Option<crate::tasks::TaskRef>,
    /// The pin the called tool's (or got prompt's) definition matched
    /// (SHA-256), if it matched one.
    pub pin: Option<[u8; 32]>,
}

/// What an approver-facing answer says about a pending approval.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApprovalNote {
    /// Its id.
    pub id: String,
    /// Its status.
    pub status: String,
    /// Where to follow it.
    pub status_url: String,
    /// Until when it can be granted.
    pub expires_at_ms: u64,
}

impl ApprovalNote {
    /// The note for `approval`.
    pub(crate) fn of(approval: &Approval, approvals: &Approvals) -> ApprovalNote {
        ApprovalNote {
            id: approval.id.as_str().to_owned(),
            status: approval.status.as_str().to_owned(),
            status_url: approvals.status_url(&approval.id),
            expires_at_ms: approval.expires_ms,
        }
    }
}

/// A prompt or resource outside the run's rules.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NotPermitted {
    /// A prompt, by name.
    Prompt(String),
    /// A resource, by URI.
    Resource(String),
}

/// Why the firewall answered a message itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// Hidden or nonexistent tool.
    UnknownTool(Option<Hidden>),
    /// A tool whose definition is not pinned as listed (answered exactly
    /// like an unknown tool).
    PinRefused(crate::pins::Refusal),
    /// A prompt whose definition is not pinned as listed (answered exactly
    /// like an unknown prompt).
    PromptPinRefused(String, crate::pins::Refusal),
    /// A method the revision does not define.
    UnknownMethod,
    /// Refused by a condition or a gate.
    Denied {
        /// Risk of the tool.
        risk: Risk,
        /// The reason.
        reason: String,
        /// The rule.
        rule: String,
    },
    /// Needs a person's approval; the one filed, when there is one.
    ApprovalRequired {
        /// Risk of the tool.
        risk: Risk,
        /// The pending approval to follow.
        approval: Option<Box<ApprovalNote>>,
    },
    /// Needs a person's approval and none can be requested.
    ApprovalUnavailable {
        /// Risk of the tool.
        risk: Risk,
        /// Why not.
        why: String,
    },
    /// A `requestState` in the firewall's form that does not verify.
    BadRequestState(String),
    /// Arguments fail the schema or hold an inexact number.
    InvalidArguments(String),
    /// A prompt or resource outside the run's rules.
    NotPermitted(NotPermitted),
    /// A task id that is not one the firewall sealed for this principal and
    /// run (forged, altered, another's, or its tool out of reach): answered
    /// like a task that does not exist.
    UnknownTask,
    /// A resource URI whose normalization is ambiguous: refused, not
    /// guessed at.
    AmbiguousUri {
        /// The URI as sent.
        uri: String,
        /// What makes it ambiguous.
        why: crate::policy::uri::UriError,
    },
    /// Over a budget: not executed.
    Skipped {
        /// Risk of the tool.
        risk: Risk,
        /// Which budget.
        refusal: Refusal,
    },
    /// No credential for the upstream could be had for this run (the
    /// token exchange failed): not sent, never with another credential.
    CredentialUnavailable {
        /// Risk of the tool (read for other messages).
        risk: Risk,
        /// Why (a consent link when the user has not connected).
        why: crate::credential::CredentialError,
    },
    /// The audit trail cannot record the call and its risk is fail-closed.
    AuditUnavailable {
        /// Risk of the tool.
        risk: Risk,
        /// Why the spool refused.
        error: AuditCause,
    },
    /// `Mcp-Param-*` headers disagree with the arguments (answered with
    /// HTTP 400, as the transport spec requires).
    HeaderMismatch(HeaderMismatch),
    /// The client cancelled a held call; its approval was withdrawn.
    Cancelled {
        /// The withdrawn approval.
        approval: Option<String>,
    },
}

impl From<crate::verdict::call::Refused> for Outcome {
    fn from(r: crate::verdict::call::Refused) -> Outcome {
        use crate::verdict::call::Refused;
        match r {
            Refused::Unknown(h) => Outcome::UnknownTool(h),
            Refused::Pin(p) => Outcome::PinRefused(p),
            Refused::Arguments(why) => Outcome::InvalidArguments(why),
        }
    }
}

impl From<crate::verdict::call::Refused> for Ruling {
    fn from(r: crate::verdict::call::Refused) -> Ruling {
        Outcome::from(r).into()
    }
}

/// An outcome's audit columns.
pub(crate) struct AuditFacts {
    /// `decision`.
    pub decision: DecisionKind,
    /// `stop_reason`.
    pub stop: StopReason,
    /// `reason`.
    pub reason: String,
    /// `risk`.
    pub risk: Option<Risk>,
}

// === impl Outcome ===

impl Outcome {
    /// Decision, stop reason, reason text and risk for the audit row.
    // An exhaustive match: every `Outcome` to its `AuditFacts`.
    #[allow(clippy::too_many_lines)]
    pub(crate) fn audit(&self) -> AuditFacts {
        let facts = |decision, stop, reason: String, risk| AuditFacts {
            decision,
            stop,
            reason,
            risk,
        };
        match self {
            Outcome::UnknownTool(h) => facts(
                DecisionKind::Hidden,
                StopReason::Denied,
                h.as_ref().map_or_else(
                    || "not in the upstream's catalog".to_owned(),
                    |h| h.to_string(),
                ),
                None,
            ),
            Outcome::PinRefused(r) | Outcome::PromptPinRefused(_, r) => {
                let what = match self {
                    Outcome::PinRefused(_) => "tool",
                    _ => "prompt",
                };
                let (stop, why) = match r {
                    crate::pins::Refusal::Unpinned => (
                        StopReason::Unpinned,
                        format!("no reviewed pin for this {what}'s definition"),
                    ),
                    crate::pins::Refusal::Mismatch => (
                        StopReason::PinMismatch,
                        format!("the {what}'s definition differs from its pin"),
                    ),
                    crate::pins::Refusal::Rejected => (
                        StopReason::PinMismatch,
                        format!("this definition of the {what} was rejected in review"),
                    ),
                    crate::pins::Refusal::Shadows(other) => (
                        StopReason::PinShadowing,
                        format!("the name imitates pinned {what} {other:?}"),
                    ),
                };
                facts(DecisionKind::Hidden, stop, why, None)
            }
            Outcome::UnknownMethod => facts(
                DecisionKind::Deny,
                StopReason::Denied,
                "method not defined by the protocol revision in use".to_owned(),
                None,
            ),
            Outcome::Denied { risk, reason, rule } => facts(
                DecisionKind::Deny,
                StopReason::Denied,
                format!("{reason} ({rule})"),
                Some(*risk),
            ),
            Outcome::ApprovalRequired { risk, approval } => facts(
                DecisionKind::Approve,
                StopReason::ApprovalRequired,
                match approval {
                    Some(a) => format!("{risk} tool behind an approve gate (approval {})", a.id),
                    None => format!("{risk} tool behind an approve gate"),
                },
                Some(*risk),
            ),
            Outcome::ApprovalUnavailable { risk, why } => facts(
                DecisionKind::Approve,
                StopReason::ApprovalRequired,
                format!("{risk} tool behind an approve gate; no approval can be requested: {why}"),
                Some(*risk),
            ),
            Outcome::BadRequestState(why) => {
                facts(DecisionKind::Deny, StopReason::Denied, why.clone(), None)
            }
            Outcome::InvalidArguments(detail) => facts(
                DecisionKind::Invalid,
                StopReason::Denied,
                detail.clone(),
                None,
            ),
            Outcome::NotPermitted(what) => facts(
                DecisionKind::Hidden,
                StopReason::Denied,
                match what {
                    NotPermitted::Prompt(_) => "prompt outside the run's rules".to_owned(),
                    NotPermitted::Resource(_) => "resource outside the run's rules".to_owned(),
                },
                None,
            ),
            Outcome::UnknownTask => facts(
                DecisionKind::Hidden,
                StopReason::Denied,
                "not a task of this principal and run".to_owned(),
                None,
            ),
            Outcome::AmbiguousUri { uri, why } => facts(
                DecisionKind::Invalid,
                StopReason::Denied,
                format!("resource URI {uri:?} refused: {why}"),
                None,
            ),
            Outcome::Skipped { risk, refusal } => facts(
                match refusal {
                    Refusal::Unavailable { .. } => DecisionKind::Error,
                    _ => DecisionKind::Skip,
                },
                refusal.stop_reason(),
                refusal.describe(),
                Some(*risk),
            ),
            Outcome::CredentialUnavailable { risk, why } => facts(
                DecisionKind::Error,
                StopReason::Denied,
                format!("upstream credential unavailable: {why}"),
                Some(*risk),
            ),
            Outcome::AuditUnavailable { risk, error } => facts(
                DecisionKind::Error,
                StopReason::Denied,
                error.to_string(),
                Some(*risk),
            ),
            Outcome::HeaderMismatch(e) => facts(
                DecisionKind::Invalid,
                StopReason::Denied,
                e.to_string(),
                None,
            ),
            Outcome::Cancelled { approval } => facts(
                DecisionKind::Cancel,
                StopReason::Cancelled,
                match approval {
                    Some(a) => {
                        format!("cancelled by the client while held; approval {a} withdrawn")
                    }
                    None => "cancelled by the client while held".to_owned(),
                },
                None,
            ),
        }
    }
}

// === impl RunContext ===

/// Why the audit trail could not record a call: the spool's error, kept
/// whole (with its sources) for whoever needs more than its message; the
/// audit row and the answer show the message. Two causes are equal when
/// they say the same.
#[derive(Debug, Clone)]
pub(crate) struct AuditCause(pub Arc<AuditError>);

impl From<AuditError> for AuditCause {
    fn from(e: AuditError) -> AuditCause {
        AuditCause(Arc::new(e))
    }
}

impl std::fmt::Display for AuditCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl PartialEq for AuditCause {
    fn eq(&self, other: &AuditCause) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.to_string() == other.to_string()
    }
}

/// A call behind an `approve` gate, waiting for a person.
#[derive(Debug)]
pub(crate) struct Gated {
    /// The pending approval.
    pub approval: Approval,
    /// Its key (to consume it once granted).
    pub key: CallKey,
    /// The tool's risk.
    pub risk: Risk,
    /// The pin the tool's definition matched (SHA-256), if it matched one.
    pub pin: Option<[u8; 32]>,
    /// The run's labels can gate the call: judged again when it is
    /// released ([`super::request::admit::recheck`]).
    pub recheck: Option<Recheck>,
}

/// What a held call's labels were judged with when it was held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recheck {
    /// It can carry data out.
    pub egress: bool,
    /// The `[taint]` rule that put the approval on it, if one did (the
    /// person who approves is told why).
    pub held_for: Option<crate::policy::TaintRule>,
}

/// The approval a call runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Granted {
    /// The approval's id.
    pub approval: ApprovalId,
    /// Who approved.
    pub by: String,
    /// When they approved (ms since the epoch; 0 when unknown).
    pub approved_ms: u64,
    /// The tool.
    pub tool: String,
    /// Its arguments' hash.
    pub args_sha256: [u8; 32],
    /// Until when multi-round retries may run under it (ms since the epoch).
    pub until_ms: u64,
    /// Which execution of the call this is: 0 for the one the approval's
    /// consumption released, `n` for the retry carrying the `requestState`
    /// sealed after execution `n - 1` (spent in the store before it runs).
    pub round: u32,
}

impl Granted {
    /// The approval `approval`, consumed for `tool` now.
    pub(crate) fn of(approval: &Approval, approvals: &Approvals) -> Granted {
        let now = crate::clock::now_ms();
        Granted {
            approval: approval.id.clone(),
            by: approval
                .decision
                .as_ref()
                .map_or_else(String::new, |d| d.by.clone()),
            approved_ms: approval.decision.as_ref().map_or(0, |d| d.at_ms),
            tool: approval.key.tool.clone(),
            args_sha256: approval.key.args_sha256,
            // Retries of a multi-round call may follow within the time a
            // person would have had to approve it.
            until_ms: now
                .saturating_add(approvals.config().expiry_s.saturating_mul(1000))
                .min(approval.token_exp.saturating_mul(1000).max(now)),
            round: 0,
        }
    }

    /// The audit reason of a call running under it.
    pub(crate) fn reason(&self) -> String {
        format!("approved by {} (approval {})", self.by, self.approval)
    }

    /// Puts it on the row of a call running under it: the reason, and
    /// which approval, who gave it and when.
    pub(crate) fn stamp(&self, row: &mut crate::audit::AuditRow) {
        row.reason = self.reason();
        row.approval_id = self.approval.as_str().to_owned();
        row.approver.clone_from(&self.by);
        row.approved_ms = self.approved_ms;
    }
}
