//! The policy file format: what a security team writes in `policies/*.toml`.
//! These types mirror the files exactly; every struct denies unknown keys, so
//! a typo is an error naming the file, line and key rather than a silently
//! ignored rule. Strings that are compiled later (globs, CEL expressions) are
//! kept with their byte span so compile errors can name their line too.

use serde::Deserialize;
use toml::Spanned;

/// One policy file. Any section may appear in any file; the directory's files
/// are merged (agents, service accounts and the gates table must be unique).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicyFile {
    /// Default gate per risk (at most one file may set it).
    pub gates: Option<RawGates>,
    /// Risk of tools, by upstream and name or glob.
    #[serde(default)]
    pub tools: Vec<RawToolRule>,
    /// Agent roles.
    #[serde(default)]
    pub agents: Vec<RawAgent>,
    /// Service accounts and the bindings they get.
    #[serde(default)]
    pub service_accounts: Vec<RawServiceAccount>,
    /// Conditions on arguments and claims.
    #[serde(default)]
    pub conditions: Vec<RawCondition>,
    /// Server-to-client requests an upstream may send (sampling, elicitation, roots).
    pub server_requests: Option<RawServerRequests>,
    /// Content screening of what upstreams send (at most one file may set it).
    pub screen: Option<RawScreen>,
    /// Gates on the run's labels (at most one file may set it).
    pub taint: Option<RawTaint>,
}

/// `[screen]`: what screening does per family, and where answers may link.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScreen {
    /// Credentials and keys (default `redact`).
    pub secrets: Option<crate::screen::content::Action>,
    /// Card numbers, IBANs, e-mail addresses, phone numbers (default `flag`).
    pub pii: Option<crate::screen::content::Action>,
    /// Hidden characters, terminal escapes, foreign images and links,
    /// instruction cues (default `flag`).
    pub injection: Option<crate::screen::content::Action>,
    /// Hosts answers may show images from and link to: a name, or
    /// `*.name` for its subdomains.
    #[serde(default)]
    pub link_hosts: Vec<String>,
    /// Narrower settings for an upstream's content or some of its tools.
    #[serde(default)]
    pub rule: Vec<RawScreenRule>,
}

/// `[[screen.rule]]`: settings for an upstream (name or glob), and, with
/// `match`, only for the results of those tools.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScreenRule {
    /// Upstream name or glob; default every upstream.
    #[serde(default = "star")]
    pub upstream: Spanned<String>,
    /// Tool names or globs; default all of the upstream's content.
    #[serde(rename = "match")]
    pub names: Option<Vec<Spanned<String>>>,
    /// Overrides `[screen] secrets`.
    pub secrets: Option<crate::screen::content::Action>,
    /// Overrides `[screen] pii`.
    pub pii: Option<crate::screen::content::Action>,
    /// Overrides `[screen] injection`.
    pub injection: Option<crate::screen::content::Action>,
}

/// `[taint]`: what a run's labels do to its calls.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTaint {
    /// Write and destructive calls of a run that took in untrusted
    /// content (default `approve`).
    pub after_untrusted: Option<GateName>,
    /// An `egress` call of a run holding both `private` and `untrusted`
    /// (default `deny`).
    pub trifecta: Option<GateName>,
}

/// A label a tool's results give the run.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LabelName {
    /// Content from outside (web pages, tickets, mail).
    Untrusted,
    /// Private data (customer records, internal documents).
    Private,
}

/// Gates per risk; missing entries keep the default (read allow, write and
/// destructive approve).
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGates {
    /// Gate for read tools.
    pub read: Option<GateName>,
    /// Gate for write tools.
    pub write: Option<GateName>,
    /// Gate for destructive tools.
    pub destructive: Option<GateName>,
}

/// `allow`, `approve` or `deny`.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GateName {
    /// Runs unattended.
    Allow,
    /// Needs a person's approval of the exact call.
    Approve,
    /// Never runs.
    Deny,
}

/// `read`, `write` or `destructive`.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RiskName {
    /// Reads only.
    Read,
    /// Changes state, reversibly.
    Write,
    /// Changes state in ways that may not be undone.
    Destructive,
}

/// `[[tools]]`: the risk of matching tools.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawToolRule {
    /// Upstream name or glob; default every upstream.
    #[serde(default = "star")]
    pub upstream: Spanned<String>,
    /// Tool names or globs.
    #[serde(rename = "match")]
    pub names: Vec<Spanned<String>>,
    /// Their risk.
    pub risk: RiskName,
    /// A read-only tool of the same upstream that shows what a call would do,
    /// offered to approvers (e.g. `preview_remediation`).
    pub preview: Option<String>,
    /// Fixed arguments of the preview call (merged over the gated call's
    /// arguments that the preview tool accepts), e.g. `{ action = "rollback" }`.
    pub preview_arguments: Option<toml::Table>,
    /// Price of one call, in the budget's unit (default 0).
    pub price: Option<f64>,
    /// Labels its results give the run (`untrusted`, `private`).
    #[serde(default)]
    pub labels: Vec<LabelName>,
    /// It can carry data out (mail, a fetch of a URL argument, a chat post).
    #[serde(default)]
    pub egress: bool,
}

/// `[[agents]]`: a role an agent runs as.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgent {
    /// The role name tokens carry in their `agent` claim.
    pub name: Spanned<String>,
    /// Free text for humans.
    #[serde(default)]
    pub description: String,
    /// Projects this role is a member of.
    #[serde(default)]
    pub projects: Vec<String>,
    /// Risks this role may use at all; default `["read"]`.
    #[serde(default = "default_risks")]
    pub risks: Vec<RiskName>,
    /// What the role may use; a tool must match at least one rule. Default:
    /// nothing.
    #[serde(default)]
    pub allow: Vec<Spanned<RawMatch>>,
    /// What the role may never use; wins over `allow`.
    #[serde(default)]
    pub deny: Vec<Spanned<RawMatch>>,
    /// Gate overrides for this role.
    #[serde(default)]
    pub gates: RawGates,
    /// Prompts rules (default: every prompt of a reachable upstream).
    #[serde(default)]
    pub prompts: RawNamedAccess,
    /// Resources rules (default: every resource of a reachable upstream).
    #[serde(default)]
    pub resources: RawNamedAccess,
    /// Whether the run's own caller may approve its gated calls. Default false.
    #[serde(default)]
    pub self_approval: bool,
    /// Most `tools/call` per run (default from config).
    pub max_steps: Option<u32>,
    /// Largest total price per run.
    pub max_cost: Option<f64>,
    /// Most `tools/call` per second per run of this role.
    pub calls_per_s: Option<u32>,
}

/// A rule matching tools by upstream, upstream category and tool name.
/// Every field given must match; an empty rule matches everything.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMatch {
    /// Upstream name or glob.
    pub upstream: Option<Spanned<String>>,
    /// An upstream category (config `categories`), e.g. `metrics`.
    pub category: Option<String>,
    /// Tool names or globs.
    pub tools: Option<Vec<Spanned<String>>>,
}

/// Allow and deny lists for prompts or resources, by upstream and name/URI glob.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNamedAccess {
    /// When given, only matching names are allowed.
    pub allow: Option<Vec<RawNameMatch>>,
    /// Matching names are refused.
    #[serde(default)]
    pub deny: Vec<RawNameMatch>,
}

/// A prompt-name or resource-URI rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNameMatch {
    /// Upstream name or glob.
    pub upstream: Option<Spanned<String>>,
    /// Names (prompts) or URIs (resources), globs allowed.
    pub names: Vec<Spanned<String>>,
}

/// `[[service_accounts]]`: a non-human principal and exactly what it may reach.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServiceAccount {
    /// The token's `sub`.
    pub name: Spanned<String>,
    /// The role it runs as.
    pub agent: String,
    /// Its project bindings (its effective projects, exactly).
    pub projects: Vec<String>,
}

/// `[[conditions]]`: a CEL expression that must hold for matching calls.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCondition {
    /// Upstream name or glob; default every upstream.
    #[serde(default = "star")]
    pub upstream: Spanned<String>,
    /// Tool names or globs.
    pub tools: Vec<Spanned<String>>,
    /// Roles it applies to (globs); default all.
    pub agents: Option<Vec<Spanned<String>>>,
    /// Optional CEL: the condition applies only when this is true.
    pub when: Option<Spanned<String>>,
    /// CEL that must evaluate to `true`; false, an error, or a missing field denies.
    pub require: Spanned<String>,
    /// The reason the agent reads when it fails.
    pub reason: String,
}

/// `[server_requests]`: which server-to-client requests upstreams may send
/// (none by default), with `[server_requests.upstreams.<name>]` for one
/// upstream.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServerRequests {
    /// `sampling/createMessage` (default false).
    pub sampling: Option<bool>,
    /// `elicitation/create` (default false).
    pub elicitation: Option<bool>,
    /// `roots/list` (default false).
    pub roots: Option<bool>,
    /// Origins URL-mode elicitation may point at (default none).
    pub elicitation_url_origins: Option<Vec<String>>,
    /// Per upstream, by route name.
    #[serde(default)]
    pub upstreams: std::collections::BTreeMap<String, RawServerRequestsFor>,
}

/// `[server_requests.upstreams.<name>]`: the same keys for one upstream.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServerRequestsFor {
    /// `sampling/createMessage`.
    pub sampling: Option<bool>,
    /// `elicitation/create`.
    pub elicitation: Option<bool>,
    /// `roots/list`.
    pub roots: Option<bool>,
    /// Origins URL-mode elicitation may point at.
    pub elicitation_url_origins: Option<Vec<String>>,
}

fn star() -> Spanned<String> {
    Spanned::new(0..0, "*".to_owned())
}

fn default_risks() -> Vec<RiskName> {
    vec![RiskName::Read]
}
