//! What the compiled policy answers: who may see and call what, the risk and
//! gate of a call, the rule that decided, server-to-client requests.

use super::condition::{cel_context, evaluate, Condition, CEL_ROOT};
use super::*;
use serde_json::Value;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

// === impl Policy ===

impl Policy {
    /// This policy's generation, unique in the process (a reload gets a new one).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The files it was compiled from.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// SHA-256 (hex) of the policy files' names and contents: replicas
    /// deciding with the same policy show the same; every audit row this
    /// policy decided carries it (`policy_sha256`).
    pub fn content_hash(&self) -> &str {
        &self.content_hash
    }

    /// Default gates.
    pub fn gates(&self) -> Gates {
        self.gates
    }

    /// A role by name.
    pub fn agent(&self, name: &str) -> Option<&Agent> {
        self.agents.get(name)
    }

    /// All roles, sorted by name.
    pub fn agents(&self) -> Vec<&Agent> {
        let mut v: Vec<&Agent> = self.agents.values().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Server-to-client request permissions.
    pub fn server_requests(&self) -> &ServerRequests {
        &self.server_requests
    }

    /// Whether upstream `upstream` may send the client a `method` request
    /// with `params` (decoded by the strict reader): `Err` names why not.
    /// Refused unless allowed: sampling, elicitation and roots by the
    /// `[server_requests]` rules (URL-mode elicitation only to a listed
    /// origin), `ping` always, task polling only where sampling or
    /// elicitation is allowed, anything else never.
    pub fn server_request(
        &self,
        upstream: &str,
        method: &str,
        params: Option<&str>,
    ) -> Result<(), String> {
        let rules = self
            .server_requests
            .upstreams
            .get(upstream)
            .unwrap_or(&self.server_requests.all);
        let refused = |what: &str| {
            Err(format!(
                "{what} is not allowed for upstream {upstream:?} by the policy's [server_requests]"
            ))
        };
        match method {
            "ping" => Ok(()),
            "sampling/createMessage" if rules.sampling => Ok(()),
            "roots/list" if rules.roots => Ok(()),
            "elicitation/create" if rules.elicitation => elicitation_target(rules, params),
            "tasks/get" | "tasks/result" | "tasks/list" | "tasks/cancel"
                if rules.sampling || rules.elicitation =>
            {
                Ok(())
            }
            "sampling/createMessage" | "roots/list" | "elicitation/create" => refused(method),
            other => Err(format!(
                "{other:?} is not a server-to-client request the firewall relays"
            )),
        }
    }

    /// The run's role and effective projects. Fails closed: an unknown role
    /// or a service account that does not check out gives no authority.
    pub fn authority(&self, id: &Identity<'_>) -> Result<Authority, NoAuthority> {
        match id.mode {
            Mode::ServiceAccount => {
                if !id.service_issuer {
                    return Err(NoAuthority::ServiceIssuer);
                }
                let sa = self
                    .service_accounts
                    .get(id.subject)
                    .ok_or_else(|| NoAuthority::UnknownServiceAccount(id.subject.to_owned()))?;
                if sa.agent != id.agent {
                    return Err(NoAuthority::ServiceAgentMismatch {
                        subject: id.subject.to_owned(),
                        bound: sa.agent.clone(),
                        claimed: id.agent.to_owned(),
                    });
                }
                if !self.agents.contains_key(&sa.agent) {
                    return Err(NoAuthority::UnknownAgent(sa.agent.clone()));
                }
                Ok(Authority {
                    agent: sa.agent.clone(),
                    projects: sa.projects.clone(),
                })
            }
            Mode::Caller | Mode::Agent => {
                let agent = self
                    .agents
                    .get(id.agent)
                    .ok_or_else(|| NoAuthority::UnknownAgent(id.agent.to_owned()))?;
                let mut projects: Vec<String> = agent.projects.clone();
                if id.mode == Mode::Caller {
                    projects.retain(|p| id.projects.contains(p));
                }
                if let Some(ceiling) = id.ceiling {
                    projects.retain(|p| ceiling.contains(p));
                }
                Ok(Authority {
                    agent: agent.name.clone(),
                    projects,
                })
            }
        }
    }

    /// Whether the run reaches the upstream at all.
    pub fn reaches(&self, auth: &Authority, up: UpstreamFacts<'_>) -> bool {
        up.projects
            .iter()
            .any(|p| auth.projects.binary_search(p).is_ok())
    }

    /// The tool's risk and where it came from.
    pub fn risk(
        &self,
        up: UpstreamFacts<'_>,
        tool: &str,
        hints: Option<Hints>,
    ) -> (Risk, RiskSource) {
        // Exact names first, then globs, each in file order.
        for (i, r) in self.tool_rules.iter().enumerate() {
            if r.names.exact.contains(tool) && r.upstream.is_match(up.name) {
                return (r.risk, RiskSource::Policy(i));
            }
        }
        for (i, r) in self.tool_rules.iter().enumerate() {
            if r.names.globs.as_ref().is_some_and(|g| g.is_match(tool))
                && r.upstream.is_match(up.name)
            {
                return (r.risk, RiskSource::Policy(i));
            }
        }
        if up.trust_annotations {
            if let Some(h) = hints {
                return (h.risk(), RiskSource::Annotations);
            }
        }
        (Risk::Destructive, RiskSource::Default)
    }

    /// Tool names the policy names exactly for an upstream (sorted), for
    /// summaries; glob rules are not expanded.
    pub fn named_tools(&self, up: UpstreamFacts<'_>) -> Vec<String> {
        let mut v: Vec<String> = self
            .tool_rules
            .iter()
            .filter(|r| r.upstream.is_match(up.name))
            .flat_map(|r| r.names.exact.iter().cloned())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// The preview tool the policy names for a tool, and its fixed
    /// arguments, if any.
    pub fn preview(&self, up: UpstreamFacts<'_>, tool: &str) -> Option<(&str, Option<&Value>)> {
        match self.risk(up, tool, None).1 {
            RiskSource::Policy(i) => self
                .tool_rules
                .get(i)
                .and_then(|r| Some((r.preview.as_deref()?, r.preview_arguments.as_ref()))),
            _ => None,
        }
    }

    /// What the tool's results give the run and whether it can carry data
    /// out: its `[[tools]]` rule's `labels` and `egress`, and its
    /// upstream's `trust`, `data` and `egress`.
    pub fn traits(&self, up: UpstreamFacts<'_>, tool: &str) -> Traits {
        let rule = match self.risk(up, tool, None).1 {
            RiskSource::Policy(i) => self.tool_rules.get(i),
            _ => None,
        };
        Traits {
            labels: content::upstream_labels(up).union(rule.map_or(Labels::NONE, |r| r.labels)),
            egress: up.egress || rule.is_some_and(|r| r.egress),
        }
    }

    /// The labels content from `up` that is no tool's result gives the run.
    pub fn content_labels(&self, up: UpstreamFacts<'_>) -> Labels {
        content::upstream_labels(up)
    }

    /// Content screening's settings.
    pub fn screening(&self) -> &Screening {
        &self.screening
    }

    /// `[taint]`.
    pub fn taint(&self) -> Taint {
        self.taint
    }

    /// The price of one call of the tool (0 unless the policy sets one).
    pub fn price(&self, up: UpstreamFacts<'_>, tool: &str) -> f64 {
        match self.risk(up, tool, None).1 {
            RiskSource::Policy(i) => self.tool_rules.get(i).and_then(|r| r.price).unwrap_or(0.0),
            _ => 0.0,
        }
    }

    /// Steps 1–4: whether the run may see the tool, at which risk and gate.
    pub fn access(
        &self,
        auth: &Authority,
        up: UpstreamFacts<'_>,
        tool: &str,
        hints: Option<Hints>,
    ) -> Access {
        match self.classify_run(auth, up, tool, hints) {
            Ok(c) => c.access.clone(),
            Err(h) => Access::Hidden(h),
        }
    }

    /// [`Policy::classify`] for a run: its role must exist and its projects
    /// reach the upstream.
    fn classify_run(
        &self,
        auth: &Authority,
        up: UpstreamFacts<'_>,
        tool: &str,
        hints: Option<Hints>,
    ) -> Result<Arc<Classified>, Hidden> {
        if !self.agents.contains_key(&auth.agent) {
            return Err(Hidden::UnknownAgent);
        }
        if !self.reaches(auth, up) {
            return Err(Hidden::Unreachable);
        }
        Ok(self.classify(&auth.agent, up, tool, hints))
    }

    /// The memoized part of a decision (see [`Memo`]).
    fn classify(
        &self,
        agent: &str,
        up: UpstreamFacts<'_>,
        tool: &str,
        hints: Option<Hints>,
    ) -> Arc<Classified> {
        use std::hash::BuildHasher;
        let key = self.memo.hasher.hash_one((agent, &up.name, tool, hints));
        if let Some(c) = self.memo.entries.get(&key) {
            if &*c.agent == agent && *c.upstream == *up.name && &*c.tool == tool && c.hints == hints
            {
                return c.clone();
            }
        }
        let conditions = self
            .conditions
            .iter()
            .enumerate()
            .filter(|(_, c)| c.upstream.is_match(up.name) && c.tools.matches(tool))
            .filter(|(_, c)| c.agents.as_ref().is_none_or(|a| a.matches(agent)))
            .map(|(i, _)| i)
            .collect();
        let c = Arc::new(Classified {
            agent: agent.into(),
            upstream: up.name.into(),
            tool: tool.into(),
            hints,
            access: self.rules_access(agent, up, tool, hints),
            conditions,
        });
        if self.memo.entries.len() < MEMO_MAX {
            self.memo.entries.insert(key, c.clone());
        }
        c
    }

    /// Steps 2–4 for a run that reaches the upstream.
    fn rules_access(
        &self,
        agent: &str,
        up: UpstreamFacts<'_>,
        tool: &str,
        hints: Option<Hints>,
    ) -> Access {
        let Some(agent) = self.agents.get(agent) else {
            return Access::Hidden(Hidden::UnknownAgent);
        };
        let (risk, source) = self.risk(up, tool, hints);
        if !agent.risks[risk as usize] {
            return Access::Hidden(Hidden::Risk(risk));
        }
        if agent.deny.iter().any(|m| m.matches(up, tool)) {
            return Access::Hidden(Hidden::Denied);
        }
        if !agent.allow.iter().any(|m| m.matches(up, tool)) {
            return Access::Hidden(Hidden::NotAllowed);
        }
        match agent.gates.get(risk) {
            Gate::Deny => Access::Hidden(Hidden::GateDeny(risk)),
            gate => Access::Visible { risk, gate, source },
        }
    }

    /// Decides a `tools/call`. `trace`, when given, receives the rules that
    /// produced the decision (for `mcp-firewall explain`).
    pub fn decide(&self, call: &Call<'_>, mut trace: Option<&mut Vec<String>>) -> Decision {
        // Notes are formatted only when someone reads them.
        let mut note = |s: &dyn Fn() -> String| {
            if let Some(t) = trace.as_deref_mut() {
                t.push(s());
            }
        };
        note(&|| {
            format!(
                "authority: role {:?}, effective projects {:?}",
                call.authority.agent, call.authority.projects
            )
        });
        let classified =
            match self.classify_run(call.authority, call.upstream, call.tool, call.hints) {
                Ok(c) => c,
                Err(h) => {
                    note(&|| format!("hidden: {h}"));
                    return Decision::Unknown(h);
                }
            };
        let (risk, gate) = match classified.access.clone() {
            Access::Hidden(h) => {
                note(&|| format!("hidden: {h}"));
                return Decision::Unknown(h);
            }
            Access::Visible { risk, gate, source } => {
                note(&|| format!("risk {risk} from {}", self.describe_source(source)));
                note(&|| format!("gate for {risk}: {gate}"));
                (risk, gate)
            }
        };
        let applicable: Vec<&Condition> = classified
            .conditions
            .iter()
            .filter_map(|&i| self.conditions.get(i))
            .collect();
        if !applicable.is_empty() {
            let refused = CEL_ROOT.with(|root| {
                let needs = applicable.iter().fold(0u8, |acc, c| acc | c.vars);
                let cx = cel_context(root, call, needs);
                evaluate(&applicable, &cx, &mut note)
            });
            if let Some((reason, rule)) = refused {
                return Decision::Deny { risk, reason, rule };
            }
        }
        match gate {
            Gate::Approve => Decision::Approve { risk },
            _ => Decision::Allow { risk },
        }
    }

    /// The gate of a method the upstream adds to MCP (`extra_methods`),
    /// classified `risk` by the upstream's config: `None` when the run's
    /// role may not use that risk (or does not exist, or cannot reach the
    /// upstream), so the method is as unknown to it as any other.
    pub fn method_gate(&self, auth: &Authority, up: UpstreamFacts<'_>, risk: Risk) -> Option<Gate> {
        let agent = self.agents.get(&auth.agent)?;
        if !self.reaches(auth, up) || !agent.risks[risk as usize] {
            return None;
        }
        Some(agent.gates.get(risk))
    }

    /// Whether the run may use a prompt of the upstream.
    pub fn prompt_allowed(&self, auth: &Authority, up: UpstreamFacts<'_>, name: &str) -> bool {
        self.named_allowed(auth, up, name, |a| &a.prompts)
    }

    /// Whether the run may read a resource of the upstream: its rules
    /// match the URI as RFC 3986 normalizes it (scheme and host case,
    /// percent-encoding, dot segments), so no other spelling of a denied
    /// URI passes; a URI whose normalization is ambiguous (encoded `/`,
    /// NUL, backslash) is refused as such.
    pub fn resource_access(
        &self,
        auth: &Authority,
        up: UpstreamFacts<'_>,
        uri: &str,
    ) -> Result<bool, uri::UriError> {
        let normalized = uri::normalize(uri)?;
        Ok(self.named_allowed(auth, up, &normalized, |a| &a.resources))
    }

    /// [`Policy::resource_access`], with an unmatchable URI refused.
    pub fn resource_allowed(&self, auth: &Authority, up: UpstreamFacts<'_>, uri: &str) -> bool {
        self.resource_access(auth, up, uri).unwrap_or(false)
    }

    fn named_allowed(
        &self,
        auth: &Authority,
        up: UpstreamFacts<'_>,
        name: &str,
        pick: impl Fn(&Agent) -> &NamedAccess,
    ) -> bool {
        let Some(agent) = self.agents.get(&auth.agent) else {
            return false;
        };
        if !self.reaches(auth, up) {
            return false;
        }
        let access = pick(agent);
        if access.deny.iter().any(|r| r.matches(up, name)) {
            return false;
        }
        match &access.allow {
            None => true,
            Some(rules) => rules.iter().any(|r| r.matches(up, name)),
        }
    }

    /// Where a tool's risk comes from, for people: the `[[tools]]` rule's
    /// `file:line`, the upstream's annotations, or the default.
    pub fn risk_origin(&self, up: UpstreamFacts<'_>, tool: &str, hints: Option<Hints>) -> String {
        match self.risk(up, tool, hints).1 {
            RiskSource::Policy(i) => self
                .tool_rules
                .get(i)
                .map_or_else(String::new, |r| format!("[[tools]] at {}", r.origin)),
            RiskSource::Annotations => "the upstream's annotations".to_owned(),
            RiskSource::Default => "no [[tools]] rule: destructive by default".to_owned(),
        }
    }

    /// Every rule, role and gate of the policy that a decision can
    /// exercise (what `mcp-firewall test --coverage` counts).
    pub fn rule_ids(&self) -> Vec<RuleId> {
        let mut v: Vec<RuleId> = (0..self.tool_rules.len()).map(RuleId::Tool).collect();
        for a in self.agents() {
            v.push(RuleId::Role(a.name.clone()));
            for r in Risk::ALL {
                if a.risks[r as usize] && a.gates.get(r) != Gate::Deny {
                    v.push(RuleId::Gate(a.name.clone(), r));
                }
            }
            v.extend((0..a.allow.len()).map(|i| RuleId::Allow(a.name.clone(), i)));
            v.extend((0..a.deny.len()).map(|i| RuleId::Deny(a.name.clone(), i)));
        }
        v.extend((0..self.conditions.len()).map(RuleId::Condition));
        v
    }

    /// The rules, role and gate a `tools/call` of `tool` by a run of
    /// `auth` exercises: the role, the `[[tools]]` rule that gave the risk,
    /// the first `deny` and `allow` rules of the role that match, the
    /// role's gate for the risk (when the tool is visible) and the
    /// conditions that apply.
    pub fn exercised(
        &self,
        auth: &Authority,
        up: UpstreamFacts<'_>,
        tool: &str,
        hints: Option<Hints>,
    ) -> Vec<RuleId> {
        let Some(agent) = self.agents.get(&auth.agent) else {
            return Vec::new();
        };
        let mut v = vec![RuleId::Role(agent.name.clone())];
        if !self.reaches(auth, up) {
            return v;
        }
        let (risk, source) = self.risk(up, tool, hints);
        if let RiskSource::Policy(i) = source {
            v.push(RuleId::Tool(i));
        }
        if let Some(i) = agent.deny.iter().position(|m| m.matches(up, tool)) {
            v.push(RuleId::Deny(agent.name.clone(), i));
        }
        if let Some(i) = agent.allow.iter().position(|m| m.matches(up, tool)) {
            v.push(RuleId::Allow(agent.name.clone(), i));
        }
        let classified = self.classify(&agent.name, up, tool, hints);
        if let Access::Visible { .. } = classified.access {
            v.push(RuleId::Gate(agent.name.clone(), risk));
            v.extend(classified.conditions.iter().map(|&i| RuleId::Condition(i)));
        }
        v
    }

    /// Where a role's `allow` (or `deny`) rule number `i` is written.
    fn rule_origin(&self, role: &str, i: usize, deny: bool) -> Option<&str> {
        let agent = self.agents.get(role)?;
        let rules = if deny { &agent.deny } else { &agent.allow };
        rules.get(i).map(|m| m.origin.as_str())
    }

    /// The rule, role or gate that hid `tool` from a run of `auth`, for
    /// people (`explain`, `mcp-firewall test`, the audit row's rule): a
    /// role's `deny` rule with its `file:line`, the role whose `allow`
    /// rules all missed, the role's gate that is `deny`; else why it is
    /// hidden.
    pub fn hiding_rule(
        &self,
        auth: &Authority,
        up: UpstreamFacts<'_>,
        tool: &str,
        hints: Option<Hints>,
        hidden: &Hidden,
    ) -> String {
        let Some(agent) = self.agents.get(&auth.agent) else {
            return format!("hidden: {hidden}");
        };
        match hidden {
            Hidden::Denied => match agent.deny.iter().position(|m| m.matches(up, tool)) {
                Some(i) => format!(
                    "hidden: {}",
                    self.describe(&RuleId::Deny(agent.name.clone(), i))
                ),
                None => format!("hidden: {hidden}"),
            },
            Hidden::NotAllowed => format!(
                "hidden: no allow rule of role {} ({}) matches",
                agent.name, agent.origin
            ),
            Hidden::GateDeny(_) => {
                let (risk, _) = self.risk(up, tool, hints);
                format!(
                    "hidden: {} ({})",
                    self.describe(&RuleId::Gate(agent.name.clone(), risk)),
                    agent.origin
                )
            }
            Hidden::Risk(r) => format!(
                "hidden: role {} ({}) may not use {r} tools",
                agent.name, agent.origin
            ),
            _ => format!("hidden: {hidden}"),
        }
    }

    /// A rule, role or gate for people.
    pub fn describe(&self, id: &RuleId) -> String {
        let role_origin = |name: &str| self.agents.get(name).map_or("", |a| a.origin.as_str());
        match id {
            RuleId::Tool(i) => match self.tool_rules.get(*i) {
                Some(r) => format!(
                    "rule [[tools]] at {} ({} {})",
                    r.origin,
                    r.risk,
                    r.names.describe()
                ),
                None => format!("rule [[tools]] #{}", i + 1),
            },
            RuleId::Role(a) => format!("role {a} ({})", role_origin(a)),
            RuleId::Gate(a, r) => format!(
                "gate {r} = {} of role {a}",
                self.agents.get(a).map_or(Gate::Deny, |x| x.gates.get(*r))
            ),
            RuleId::Allow(a, i) => format!(
                "rule allow #{} of role {a} at {}",
                i + 1,
                self.rule_origin(a, *i, false)
                    .unwrap_or_else(|| role_origin(a))
            ),
            RuleId::Deny(a, i) => format!(
                "rule deny #{} of role {a} at {}",
                i + 1,
                self.rule_origin(a, *i, true)
                    .unwrap_or_else(|| role_origin(a))
            ),
            RuleId::Condition(i) => match self.conditions.get(*i) {
                Some(c) => format!("rule [[conditions]] at {} ({})", c.origin, c.require_text),
                None => format!("rule [[conditions]] #{}", i + 1),
            },
        }
    }

    fn describe_source(&self, s: RiskSource) -> String {
        match s {
            RiskSource::Policy(i) => format!("policy [[tools]] rule #{}", i + 1),
            RiskSource::Annotations => {
                "the upstream's annotations (trust_annotations = true)".to_owned()
            }
            RiskSource::Default => {
                "no rule and no trusted annotation: destructive by default".to_owned()
            }
        }
    }
}

/// A URL-mode elicitation (`mode = "url"`) may only send the user to an
/// origin the rules list; form mode needs nothing more.
pub(super) fn elicitation_target(
    rules: &ServerRequestRules,
    params: Option<&str>,
) -> Result<(), String> {
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow)]
        mode: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow)]
        url: Option<std::borrow::Cow<'a, str>>,
    }
    let p: Params<'_> = match params {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| format!("unreadable elicitation/create params: {e}"))?,
        None => Params {
            mode: None,
            url: None,
        },
    };
    match p.mode.as_deref() {
        None | Some("form") => Ok(()),
        Some("url") => {
            let url = p.url.as_deref().unwrap_or("");
            let origin = crate::http_util::origin_of(url, false);
            match origin {
                Some(o) if rules.elicitation_url_origins.contains(&o) => Ok(()),
                _ => Err(format!(
                    "URL-mode elicitation to {url:?}: its origin is not in the policy's elicitation_url_origins"
                )),
            }
        }
        Some(other) => Err(format!(
            "elicitation mode {other:?} is not one the firewall knows"
        )),
    }
}

// === impl Risk / Gate / Gates / Mode / Hints ===

impl Risk {
    /// All risks, cheapest first.
    pub const ALL: [Risk; 3] = [Risk::Read, Risk::Write, Risk::Destructive];

    /// `read`, `write` or `destructive`.
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Read => "read",
            Risk::Write => "write",
            Risk::Destructive => "destructive",
        }
    }
}

/// A risk name that is not `read`, `write` or `destructive`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown risk {0:?} (expected read, write or destructive)")]
pub struct UnknownRisk(pub String);

impl std::str::FromStr for Risk {
    type Err = UnknownRisk;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read" => Ok(Risk::Read),
            "write" => Ok(Risk::Write),
            "destructive" => Ok(Risk::Destructive),
            other => Err(UnknownRisk(other.to_owned())),
        }
    }
}

impl fmt::Display for Risk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Gate {
    /// `allow`, `approve` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            Gate::Allow => "allow",
            Gate::Approve => "approve",
            Gate::Deny => "deny",
        }
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Gates {
    /// Reads allow, writes and destructive calls approve.
    pub const DEFAULT: Gates = Gates([Gate::Allow, Gate::Approve, Gate::Approve]);

    /// The gate for a risk.
    pub fn get(self, r: Risk) -> Gate {
        self.0[r as usize]
    }
}

impl Mode {
    /// The claim value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Caller => "caller",
            Mode::Agent => "agent",
            Mode::ServiceAccount => "service_account",
        }
    }
}

impl Hints {
    /// Reads tool annotations (`readOnlyHint`, `destructiveHint`) from a tool
    /// object's `annotations`.
    pub fn from_annotations(annotations: Option<&Value>) -> Option<Hints> {
        let a = annotations?.as_object()?;
        let h = Hints {
            read_only: a.get("readOnlyHint").and_then(Value::as_bool),
            destructive: a.get("destructiveHint").and_then(Value::as_bool),
        };
        (h != Hints::default()).then_some(h)
    }

    /// The risk the hints claim, read per the MCP defaults (`destructiveHint`
    /// defaults to true when not read-only).
    pub fn risk(self) -> Risk {
        match (self.read_only, self.destructive) {
            (Some(true), _) => Risk::Read,
            (_, Some(false)) => Risk::Write,
            _ => Risk::Destructive,
        }
    }
}

impl fmt::Display for Hidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hidden::UnknownAgent => f.write_str("the role is not defined in the policy"),
            Hidden::Unreachable => {
                f.write_str("the upstream is outside the run's effective projects")
            }
            Hidden::Risk(r) => write!(f, "the role may not use {r} tools"),
            Hidden::NotAllowed => f.write_str("no allow rule of the role matches"),
            Hidden::Denied => f.write_str("a deny rule of the role matches"),
            Hidden::GateDeny(r) => write!(f, "the gate for {r} tools is deny"),
        }
    }
}

// === impl NameSet / Matcher / NamedRule ===

impl NameSet {
    /// The names and globs as written.
    fn describe(&self) -> String {
        self.written.join(", ")
    }

    pub(super) fn matches(&self, name: &str) -> bool {
        self.exact.contains(name) || self.globs.as_ref().is_some_and(|g| g.is_match(name))
    }
}

impl Matcher {
    pub(super) fn matches(&self, up: UpstreamFacts<'_>, tool: &str) -> bool {
        self.upstream.as_ref().is_none_or(|g| g.is_match(up.name))
            && self
                .category
                .as_ref()
                .is_none_or(|c| up.categories.binary_search(c).is_ok())
            && self.tools.as_ref().is_none_or(|t| t.matches(tool))
    }
}

impl NamedRule {
    pub(super) fn matches(&self, up: UpstreamFacts<'_>, name: &str) -> bool {
        self.upstream.as_ref().is_none_or(|g| g.is_match(up.name)) && self.names.matches(name)
    }
}
