//! The estate's vocabulary: services, namespaces, incident and finding
//! states, verdicts, what a tool returns, and the limits and metric constants
//! both the fixed data (`catalog`) and the state (`estate`) are written in.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest `points` value `export_metrics_csv` accepts. A row is about 50
/// bytes, so the largest export is about 50 MB: enough for tests and benches to
/// probe response size limits.
pub const MAX_METRIC_POINTS: u64 = 1_000_000;

/// Largest `limit` value `list_recent_deployments` accepts.
pub const MAX_DEPLOYMENT_LIMIT: u32 = 50;

/// Longest accepted note, in characters.
pub const MAX_NOTE_CHARS: usize = 2_000;

/// Longest accepted free-text field other than notes (reasons, summaries,
/// evidence items, authors), in characters.
pub const MAX_SHORT_TEXT_CHARS: usize = 500;

/// Most evidence items a finding may carry.
pub const MAX_EVIDENCE_ITEMS: usize = 10;

/// Unix timestamp of the first metric sample: 2026-03-11T00:00:00Z.
pub const METRICS_START_UNIX: u64 = 1_773_187_200;

/// Seconds between two metric samples.
pub const METRICS_STEP_SECS: u64 = 60;

/// The CSV header line of every metrics export (without its newline).
pub const METRICS_CSV_HEADER: &str =
    "unix_ts,service,namespace,latency_p50_ms,latency_p99_ms,error_rate,requests_per_s";

/// A service of the estate.
///
/// Variants carry plain comments, not doc comments, in this and the other
/// argument enums: schemars turns variant docs into a `oneOf` of `const`s,
/// while a plain `enum` list is what clients and the firewall's schema checks
/// handle best.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Service {
    // The storefront checkout flow.
    Checkout,
    // Payment authorization and capture.
    Payments,
    // Product search.
    Search,
    // Login and token issuance.
    Auth,
}

impl Service {
    /// Every service, in catalog order.
    pub const ALL: [Service; 4] = [
        Service::Checkout,
        Service::Payments,
        Service::Search,
        Service::Auth,
    ];

    /// The wire name (`checkout`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Service::Checkout => "checkout",
            Service::Payments => "payments",
            Service::Search => "search",
            Service::Auth => "auth",
        }
    }

    pub(super) fn index(self) -> usize {
        match self {
            Service::Checkout => 0,
            Service::Payments => 1,
            Service::Search => 2,
            Service::Auth => 3,
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A namespace (environment) a service runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Namespace {
    // Production.
    Prod,
    // Staging.
    Staging,
}

impl Namespace {
    /// The wire name (`prod`, `staging`).
    pub fn as_str(self) -> &'static str {
        match self {
            Namespace::Prod => "prod",
            Namespace::Staging => "staging",
        }
    }

    pub(super) fn index(self) -> usize {
        match self {
            Namespace::Prod => 0,
            Namespace::Staging => 1,
        }
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lifecycle state of an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum IncidentStatus {
    // Impact is ongoing.
    Open,
    // Impact stopped; follow-up still pending.
    Mitigated,
    // Closed.
    Resolved,
}

impl IncidentStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentStatus::Open => "open",
            IncidentStatus::Mitigated => "mitigated",
            IncidentStatus::Resolved => "resolved",
        }
    }
}

/// Severity of a recorded finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum FindingSeverity {
    // Cosmetic or informational.
    Low,
    // Worth fixing in the normal course.
    Medium,
    // Contributed to customer impact.
    High,
    // Root cause of customer impact.
    Critical,
}

impl FindingSeverity {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingSeverity::Low => "low",
            FindingSeverity::Medium => "medium",
            FindingSeverity::High => "high",
            FindingSeverity::Critical => "critical",
        }
    }
}

/// The remediation a preview describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum RemediationAction {
    // Roll a deployment back to the previous version.
    Rollback,
    // Restart every replica of a service instance.
    Restart,
}

impl fmt::Display for RemediationAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RemediationAction::Rollback => "rollback",
            RemediationAction::Restart => "restart",
        })
    }
}

/// The outcome of auditing a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The finding is supported by its evidence.
    Confirmed,
    /// The finding may be right but lacks evidence.
    NeedsMoreEvidence,
    /// The finding is wrong.
    Rejected,
}

impl Verdict {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Confirmed => "confirmed",
            Verdict::NeedsMoreEvidence => "needs_more_evidence",
            Verdict::Rejected => "rejected",
        }
    }

    /// Reads a verdict out of free text (a model's reply). Checks the more
    /// specific words first so "not confirmed, rejected" reads as rejected; a
    /// reply naming no verdict is treated conservatively as needing evidence.
    pub fn from_reply(reply: &str) -> Verdict {
        let lower = reply.to_ascii_lowercase();
        if lower.contains("rejected") {
            Verdict::Rejected
        } else if lower.contains("needs_more_evidence") || lower.contains("needs more evidence") {
            Verdict::NeedsMoreEvidence
        } else if lower.contains("confirmed") {
            Verdict::Confirmed
        } else {
            Verdict::NeedsMoreEvidence
        }
    }
}

/// Who decided an audit verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditSource {
    /// The client's model, through `sampling/createMessage`.
    Sampling {
        /// The model the client reported.
        model: String,
    },
    /// The deterministic rule
    /// ([`Estate::rule_verdict`](crate::estate::Estate::rule_verdict)), used
    /// when the client's model could not be asked.
    Rule {
        /// Why the model was not asked, e.g. "the client did not declare
        /// sampling".
        why: &'static str,
    },
}

/// A tool's answer before it is wrapped in an MCP result: human-readable text
/// plus, where natural, the same facts as structured JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// The text content block.
    pub text: String,
    /// The `structuredContent`, if the tool has one.
    pub structured: Option<Value>,
}

/// What an audit needs to know about a finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindingBrief {
    /// `F-<n>`.
    pub finding_id: String,
    /// The incident the finding belongs to.
    pub incident_id: &'static str,
    /// One-line summary.
    pub summary: String,
    /// Severity given when it was recorded.
    pub severity: FindingSeverity,
    /// Evidence items given when it was recorded.
    pub evidence: Vec<String>,
}
