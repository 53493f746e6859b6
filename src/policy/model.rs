//! The policy's vocabulary: risks, gates, identities, authority, rule ids,
//! decisions, and the compiled `Policy` with its roles and matchers.

use super::*;

/// How much harm a tool can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Risk {
    /// Reads only.
    Read = 0,
    /// Changes state, reversibly.
    Write = 1,
    /// Changes state in ways that may not be undone.
    Destructive = 2,
}

/// What happens to a call of a given risk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Runs unattended.
    Allow,
    /// Waits for a person to approve this exact call.
    Approve,
    /// Never runs.
    Deny,
}

/// A gate per risk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gates(pub [Gate; 3]);

/// How a run was started (the token's `mode` claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A person's request: role memberships ∩ the person's projects.
    Caller,
    /// A scheduled agent, no person: role memberships.
    Agent,
    /// A service account: exactly its policy bindings.
    ServiceAccount,
}

/// The verified identity of a run, as the policy needs it.
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    /// Token subject.
    pub subject: &'a str,
    /// Tenant.
    pub tenant: &'a str,
    /// The role claimed by the token.
    pub agent: &'a str,
    /// The run.
    pub run_id: &'a str,
    /// How the run was started.
    pub mode: Mode,
    /// The caller's projects (the token's `projects`).
    pub projects: &'a [String],
    /// An optional further restriction (the token's `project_ceiling`).
    pub ceiling: Option<&'a [String]>,
    /// Whether the token came from the issuer configured for service accounts.
    pub service_issuer: bool,
}

/// What a run may reach: its role and its effective projects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Authority {
    /// The role (an agent defined in the policy).
    pub agent: String,
    /// Effective projects, sorted.
    pub projects: Vec<String>,
}

/// Why a run has no authority at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoAuthority {
    /// The token names a role the policy does not define.
    #[error("unknown agent role {0:?}")]
    UnknownAgent(String),
    /// `service_account` mode from an issuer not configured for it.
    #[error("service_account tokens are only accepted from the service-account issuer")]
    ServiceIssuer,
    /// `service_account` mode for a subject the policy does not bind.
    #[error("no service account {0:?} in the policy")]
    UnknownServiceAccount(String),
    /// The token's role differs from the service account's bound role.
    #[error("service account {subject:?} runs as {bound:?}, token claims {claimed:?}")]
    ServiceAgentMismatch {
        /// The subject.
        subject: String,
        /// Role bound by the policy.
        bound: String,
        /// Role claimed by the token.
        claimed: String,
    },
}

/// Untrusted risk hints from an upstream's tool annotations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Hints {
    /// `readOnlyHint`.
    pub read_only: Option<bool>,
    /// `destructiveHint`.
    pub destructive: Option<bool>,
}

/// Where a tool's risk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RiskSource {
    /// A `[[tools]]` rule (index in the compiled list).
    Policy(usize),
    /// The upstream's annotations (upstream marked `trust_annotations`).
    Annotations,
    /// Neither: destructive.
    Default,
}

/// Whether a run may see a tool, and if so at which risk and gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// The run may call it (possibly after approval).
    Visible {
        /// Its risk.
        risk: Risk,
        /// Its gate (never `Deny`).
        gate: Gate,
        /// Where the risk came from.
        source: RiskSource,
    },
    /// The tool does not exist for this run.
    Hidden(Hidden),
}

/// A rule, role or gate of a policy ([`Policy::rule_ids`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuleId {
    /// A `[[tools]]` rule, by index.
    Tool(usize),
    /// A role.
    Role(String),
    /// A role's gate for a risk it may use.
    Gate(String, Risk),
    /// A role's `allow` rule, by index.
    Allow(String, usize),
    /// A role's `deny` rule, by index.
    Deny(String, usize),
    /// A `[[conditions]]` entry, by index.
    Condition(usize),
}

/// Why a tool is hidden from a run (for logs, audit and `explain`; never
/// shown to the agent, which just sees an unknown tool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hidden {
    /// The role is not in the policy.
    UnknownAgent,
    /// The upstream is outside the run's effective projects.
    Unreachable,
    /// The role may not use this risk.
    Risk(Risk),
    /// No `allow` rule of the role matches.
    NotAllowed,
    /// A `deny` rule of the role matches.
    Denied,
    /// The gate for this risk is `deny`.
    GateDeny(Risk),
}

/// The verdict on one `tools/call`.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Forward it.
    Allow {
        /// Its risk.
        risk: Risk,
    },
    /// Hold it for a person's approval.
    Approve {
        /// Its risk.
        risk: Risk,
    },
    /// Visible, but refused (a condition failed).
    Deny {
        /// Its risk.
        risk: Risk,
        /// What the agent can act on.
        reason: String,
        /// The rule that refused (`file:line`).
        rule: String,
    },
    /// Answer exactly as for a tool that does not exist.
    Unknown(Hidden),
}

/// What policy knows of an upstream: the facts its rules match on. The
/// upstream's config (`crate::config::Upstream::facts`) lends them; policy
/// needs nothing else of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamFacts<'a> {
    /// Route name.
    pub name: &'a str,
    /// Projects it belongs to (sorted).
    pub projects: &'a [String],
    /// Categories (sorted).
    pub categories: &'a [String],
    /// Whether its annotations count as risk hints.
    pub trust_annotations: bool,
    /// Its content is untrusted (`trust = "untrusted"`).
    pub untrusted: bool,
    /// Its content is private data (`data = "private"`).
    pub private: bool,
    /// Every one of its tools can carry data out (`egress = true`).
    pub egress: bool,
}

/// One `tools/call` to decide.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The run's identity.
    pub identity: &'a Identity<'a>,
    /// The run's authority (from [`Policy::authority`]).
    pub authority: &'a Authority,
    /// The upstream.
    pub upstream: UpstreamFacts<'a>,
    /// The tool name.
    pub tool: &'a str,
    /// The call's arguments (an object, or `Null` when absent).
    pub arguments: &'a Value,
    /// The upstream's annotations for this tool, if the firewall saw them.
    pub hints: Option<Hints>,
}

/// The compiled policy.
pub struct Policy {
    pub(super) gates: Gates,
    pub(super) tool_rules: Vec<ToolRule>,
    pub(super) agents: HashMap<String, Agent>,
    pub(super) service_accounts: HashMap<String, ServiceAccount>,
    pub(super) conditions: Vec<Condition>,
    pub(super) server_requests: ServerRequests,
    pub(super) screening: Screening,
    pub(super) taint: Taint,
    pub(super) files: Vec<PathBuf>,
    /// See [`Policy::content_hash`].
    pub(super) content_hash: String,
    /// What the rules say about each (role, upstream, tool, hints) seen so
    /// far; see [`Memo`].
    pub(super) memo: Memo,
    /// Unique per compiled policy in this process: what was derived from one
    /// policy (remembered list views) is never reused under another.
    pub(super) generation: u64,
}

/// Source of [`Policy::generation`].
pub(super) static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The next policy generation.
pub(crate) fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Most entries the memo keeps; past it, classifications are computed on
/// every call (a flood of invented tool names cannot grow memory).
pub(super) const MEMO_MAX: usize = 65_536;

/// A memo of [`Policy::classify`]: the part of a decision that depends only
/// on the role, the upstream, the tool name and its hints (globs, allow and
/// deny lists, gates, which conditions apply), not on the run's projects or
/// the call's arguments. A policy is immutable and a reload builds a new one
/// with an empty memo, so an entry never outlives the rules it came from.
/// Entries are keyed by a hash and carry their full key, so a hash
/// collision costs a recomputation, never a wrong answer.
#[derive(Default)]
pub(super) struct Memo {
    pub(super) hasher: std::hash::RandomState,
    pub(super) entries: dashmap::DashMap<u64, Arc<Classified>>,
}

/// What the rules say about one (role, upstream, tool, hints).
pub(super) struct Classified {
    pub(super) agent: Box<str>,
    pub(super) upstream: Box<str>,
    pub(super) tool: Box<str>,
    pub(super) hints: Option<Hints>,
    /// The access, for a run that reaches the upstream.
    pub(super) access: Access,
    /// Indices of the conditions that apply.
    pub(super) conditions: Box<[usize]>,
}

/// A compiled `[[agents]]` entry.
pub struct Agent {
    /// Role name.
    pub name: String,
    /// Where it is defined (`file:line`).
    pub origin: String,
    /// Free text.
    pub description: String,
    /// Memberships (sorted).
    pub projects: Vec<String>,
    pub(super) risks: [bool; 3],
    pub(super) allow: Vec<Matcher>,
    pub(super) deny: Vec<Matcher>,
    /// Gates after role overrides.
    pub gates: Gates,
    pub(super) prompts: NamedAccess,
    pub(super) resources: NamedAccess,
    /// Whether the run's own caller may approve its calls.
    pub self_approval: bool,
    /// Step cap per run, if the role sets one.
    pub max_steps: Option<u32>,
    /// Cost cap per run, if the role sets one.
    pub max_cost: Option<f64>,
    /// Calls per second per run, if the role sets it.
    pub calls_per_s: Option<u32>,
}

pub(super) struct ToolRule {
    /// Where it is written (`file:line`).
    pub(super) origin: String,
    pub(super) upstream: GlobMatcher,
    pub(super) names: NameSet,
    pub(super) risk: Risk,
    pub(super) preview: Option<String>,
    pub(super) preview_arguments: Option<Value>,
    pub(super) price: Option<f64>,
    pub(super) labels: Labels,
    pub(super) egress: bool,
}

pub(super) struct ServiceAccount {
    pub(super) name: String,
    pub(super) agent: String,
    pub(super) projects: Vec<String>,
    pub(super) file: PathBuf,
    pub(super) line: usize,
}

/// Which server-to-client requests upstreams may send: none unless the
/// policy allows them, for every upstream or for one by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerRequests {
    /// For every upstream without a table of its own.
    pub all: ServerRequestRules,
    /// Per upstream, by route name (keys it leaves out come from `all`).
    pub upstreams: HashMap<String, ServerRequestRules>,
}

/// What one upstream may ask the client for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerRequestRules {
    /// `sampling/createMessage`.
    pub sampling: bool,
    /// `elicitation/create` (form mode; URL mode also needs its origin
    /// listed).
    pub elicitation: bool,
    /// `roots/list`.
    pub roots: bool,
    /// Origins (`scheme://host[:port]`) a URL-mode elicitation may send the
    /// user to.
    pub elicitation_url_origins: Vec<String>,
}

pub(super) struct NameSet {
    /// The names and globs as written.
    pub(super) written: Vec<String>,
    pub(super) exact: HashSet<String>,
    pub(super) globs: Option<GlobSet>,
}

pub(super) struct Matcher {
    /// Where it is written (`file:line`).
    pub(super) origin: String,
    pub(super) upstream: Option<GlobMatcher>,
    pub(super) category: Option<String>,
    pub(super) tools: Option<NameSet>,
}

pub(super) struct NamedAccess {
    pub(super) allow: Option<Vec<NamedRule>>,
    pub(super) deny: Vec<NamedRule>,
}

pub(super) struct NamedRule {
    pub(super) upstream: Option<GlobMatcher>,
    pub(super) names: NameSet,
}

#[cfg(test)]
#[path = "shipped_tests.rs"]
mod tests;
