//! The vocabulary of outcomes, shared by responses, logs, audit rows and
//! metrics, so the same stop reason reads the same everywhere.

use std::fmt;

/// Why a call (or a run) stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The call ran and answered.
    Done,
    /// The run reached its cap on `tools/call`.
    StepCap,
    /// The call's price would pass the run's or tenant's cost cap.
    CostCap,
    /// A rate limit refused the call.
    RateLimited,
    /// The policy refused the call.
    Denied,
    /// A person must approve the call first.
    ApprovalRequired,
    /// The upstream failed.
    UpstreamError,
    /// The client went away before the answer reached it (the upstream may
    /// have acted).
    ClientGone,
    /// The upstream's stream ended without the answer.
    UpstreamIncomplete,
    /// The client cancelled the call before it ran.
    Cancelled,
    /// The run ended (its token's `run_exp`).
    RunEnded,
    /// A shared store the decision needs (budgets) could not be asked, and
    /// the call's risk fails closed.
    StoreUnavailable,
    /// The tool's definition has no reviewed pin (`enforce`).
    Unpinned,
    /// The tool's definition differs from its pin (`enforce`).
    PinMismatch,
    /// The tool's name imitates a pinned tool's.
    PinShadowing,
}

/// What the firewall decided about one message (the audit `decision` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum DecisionKind {
    /// Forwarded upstream.
    Allow,
    /// Refused by a condition or gate.
    Deny,
    /// Answered as an unknown tool, prompt or resource (hidden from the run).
    Hidden,
    /// Held for a person's approval.
    Approve,
    /// Refused for invalid arguments.
    Invalid,
    /// Not executed: a budget or rate limit (a `skipped` result).
    Skip,
    /// The firewall could not do its job (audit unavailable, internal error).
    Error,
    /// The client cancelled a held call.
    Cancel,
}

impl StopReason {
    /// Every stop reason, for metric initialisation.
    pub const ALL: [StopReason; 15] = [
        StopReason::Done,
        StopReason::StepCap,
        StopReason::CostCap,
        StopReason::RateLimited,
        StopReason::Denied,
        StopReason::ApprovalRequired,
        StopReason::UpstreamError,
        StopReason::ClientGone,
        StopReason::UpstreamIncomplete,
        StopReason::Cancelled,
        StopReason::RunEnded,
        StopReason::StoreUnavailable,
        StopReason::Unpinned,
        StopReason::PinMismatch,
        StopReason::PinShadowing,
    ];

    /// The wire and column name.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Done => "done",
            StopReason::StepCap => "step_cap",
            StopReason::CostCap => "cost_cap",
            StopReason::RateLimited => "rate_limited",
            StopReason::Denied => "denied",
            StopReason::ApprovalRequired => "approval_required",
            StopReason::UpstreamError => "upstream_error",
            StopReason::ClientGone => "client_gone",
            StopReason::UpstreamIncomplete => "upstream_incomplete",
            StopReason::Cancelled => "cancelled",
            StopReason::RunEnded => "run_ended",
            StopReason::StoreUnavailable => "store_unavailable",
            StopReason::Unpinned => "unpinned",
            StopReason::PinMismatch => "pin_mismatch",
            StopReason::PinShadowing => "pin_shadowing",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl DecisionKind {
    /// The column value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Allow => "allow",
            DecisionKind::Deny => "deny",
            DecisionKind::Hidden => "hidden",
            DecisionKind::Approve => "approve",
            DecisionKind::Invalid => "invalid",
            DecisionKind::Skip => "skip",
            DecisionKind::Error => "error",
            DecisionKind::Cancel => "cancel",
        }
    }
}
