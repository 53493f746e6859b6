//! Policy files -> one compiled [`Policy`]. Runs at start and on reload, never
//! per request: globs become matchers, CEL expressions become programs, and
//! every mistake is reported with its file and line.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use cel::Program;
use globset::{Glob, GlobBuilder, GlobMatcher, GlobSetBuilder};
use toml::Spanned;

use super::content::{ScreenRule, Screening};
use super::file::{
    GateName, LabelName, RawAgent, RawCondition, RawGates, RawMatch, RawNameMatch, RawNamedAccess,
    RawPolicyFile, RawScreen, RawServiceAccount, RawTaint, RawToolRule, RiskName,
};
use super::{
    Agent, Condition, Gate, Gates, Labels, Matcher, NameSet, NamedAccess, NamedRule, Policy, Risk,
    ServerRequestRules, ServerRequests, ServiceAccount, Taint, ToolRule,
};

/// A policy error: file, line and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The directory or a file could not be read.
    #[error("{path}: cannot read: {reason}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        reason: String,
    },
    /// TOML syntax, unknown key, wrong type (toml's message names line and key).
    #[error("{file}: {message}")]
    Parse {
        /// The file.
        file: PathBuf,
        /// toml's description.
        message: String,
    },
    /// A semantic error at a line.
    #[error("{file}:{line}: {message}")]
    Invalid {
        /// The file.
        file: PathBuf,
        /// 1-based line (0 when unknown).
        line: usize,
        /// What is wrong.
        message: String,
    },
}

/// Loads and compiles every `*.toml` file in `dir` (sorted by name).
pub fn load_dir(dir: &Path) -> Result<Policy, PolicyError> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| PolicyError::Read {
            path: dir.to_owned(),
            reason: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
        .collect();
    paths.sort();
    let mut sources = Vec::with_capacity(paths.len());
    for p in paths {
        let text = std::fs::read_to_string(&p).map_err(|e| PolicyError::Read {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        sources.push((p, text));
    }
    compile(&sources)
}

/// SHA-256 over the files' names (without their directory) and contents,
/// hex: equal on replicas that load the same policy.
fn content_hash(sources: &[(PathBuf, String)]) -> String {
    let mut h = crate::digest::Sha256::new();
    for (path, text) in sources {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        h.update((name.len() as u64).to_be_bytes());
        h.update(name.as_bytes());
        h.update((text.len() as u64).to_be_bytes());
        h.update(text.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Compiles policy sources given as (file name, text).
pub fn compile(sources: &[(PathBuf, String)]) -> Result<Policy, PolicyError> {
    let mut policy = empty_policy(sources)?;
    let mut once = SetIn::default();
    let mut raw_agents: Vec<(PathBuf, String, RawAgent)> = Vec::new();
    for (file, text) in sources {
        let raw: RawPolicyFile = toml::from_str(text).map_err(|e| PolicyError::Parse {
            file: file.clone(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let cx = Cx { file, text };
        cx.add_file(raw, &mut policy, &mut once, &mut raw_agents)?;
    }
    // Agents last: their gates default to the (possibly later-file) [gates].
    for (file, name, a) in raw_agents {
        let text = sources
            .iter()
            .find(|(p, _)| *p == file)
            .map(|(_, t)| t.as_str())
            .unwrap_or("");
        let cx = Cx { file: &file, text };
        let agent = cx.agent(a, policy.gates)?;
        policy.agents.insert(name, agent);
    }
    check_service_account_agents(&policy)?;
    Ok(policy)
}

/// The policy before any file: default gates, screening and taint, no
/// rules, and the sources' names and hash.
fn empty_policy(sources: &[(PathBuf, String)]) -> Result<Policy, PolicyError> {
    Ok(Policy {
        gates: Gates::DEFAULT,
        tool_rules: Vec::new(),
        agents: HashMap::new(),
        service_accounts: HashMap::new(),
        conditions: Vec::new(),
        server_requests: ServerRequests::default(),
        screening: Screening::new(crate::screen::content::Actions::DEFAULT, &[], Vec::new())
            .map_err(|message| PolicyError::Invalid {
                file: PathBuf::new(),
                line: 0,
                message,
            })?,
        taint: Taint::DEFAULT,
        files: sources.iter().map(|(p, _)| p.clone()).collect(),
        content_hash: content_hash(sources),
        memo: Default::default(),
        generation: super::next_generation(),
    })
}

/// Every service account names an agent that is defined.
fn check_service_account_agents(policy: &Policy) -> Result<(), PolicyError> {
    for sa in policy.service_accounts.values() {
        if !policy.agents.contains_key(&sa.agent) {
            return Err(PolicyError::Invalid {
                file: sa.file.clone(),
                line: sa.line,
                message: format!(
                    "service account {:?} names unknown agent {:?}",
                    sa.name, sa.agent
                ),
            });
        }
    }
    Ok(())
}

/// The file that set each section at most one file may set.
#[derive(Default)]
struct SetIn {
    gates: Option<PathBuf>,
    screen: Option<PathBuf>,
    taint: Option<PathBuf>,
}

/// `[taint]`, defaults filled in.
fn taint_gates(t: &RawTaint) -> Taint {
    Taint {
        after_untrusted: t
            .after_untrusted
            .map_or(Taint::DEFAULT.after_untrusted, Gate::from),
        trifecta: t.trifecta.map_or(Taint::DEFAULT.trifecta, Gate::from),
    }
}

struct Cx<'a> {
    file: &'a Path,
    text: &'a str,
}

impl Cx<'_> {
    fn line(&self, offset: usize) -> usize {
        if offset == 0 && self.text.is_empty() {
            return 0;
        }
        self.text
            .get(..offset.min(self.text.len()))
            .map_or(0, |t| t.bytes().filter(|&b| b == b'\n').count() + 1)
    }

    fn err(&self, span: std::ops::Range<usize>, message: impl Into<String>) -> PolicyError {
        PolicyError::Invalid {
            file: self.file.to_owned(),
            line: if span == (0..0) {
                0
            } else {
                self.line(span.start)
            },
            message: message.into(),
        }
    }

    /// Adds one parsed file to `policy`; its agents are kept in
    /// `raw_agents`, compiled once every file's `[gates]` is known.
    fn add_file(
        &self,
        raw: RawPolicyFile,
        policy: &mut Policy,
        once: &mut SetIn,
        raw_agents: &mut Vec<(PathBuf, String, RawAgent)>,
    ) -> Result<(), PolicyError> {
        if let Some(g) = raw.gates {
            self.set_once(&mut once.gates, "gates")?;
            policy.gates = Gates::DEFAULT.overridden(&g);
        }
        for rule in raw.tools {
            policy.tool_rules.push(self.tool_rule(rule)?);
        }
        for a in raw.agents {
            let name = a.name.get_ref().clone();
            if raw_agents.iter().any(|(_, n, _)| *n == name) {
                return Err(self.err(a.name.span(), format!("agent {name:?} is defined twice")));
            }
            raw_agents.push((self.file.to_owned(), name, a));
        }
        for sa in raw.service_accounts {
            self.add_service_account(sa, &mut policy.service_accounts)?;
        }
        for c in raw.conditions {
            policy.conditions.push(self.condition(c)?);
        }
        if let Some(screen) = raw.screen {
            self.set_once(&mut once.screen, "screen")?;
            policy.screening = self.screening(screen)?;
        }
        if let Some(taint) = raw.taint {
            self.set_once(&mut once.taint, "taint")?;
            policy.taint = taint_gates(&taint);
        }
        if let Some(sr) = raw.server_requests {
            policy.server_requests = server_requests(sr, self.file)?;
        }
        Ok(())
    }

    /// Records that this file sets `[section]`; an error when another file
    /// (`from`) already did.
    fn set_once(&self, from: &mut Option<PathBuf>, section: &str) -> Result<(), PolicyError> {
        if let Some(prev) = from {
            return Err(self.err(
                0..0,
                format!("[{section}] is already set in {}", prev.display()),
            ));
        }
        *from = Some(self.file.to_owned());
        Ok(())
    }

    /// One `[[tools]]` rule.
    fn tool_rule(&self, rule: RawToolRule) -> Result<ToolRule, PolicyError> {
        let names = self.name_set(&rule.names)?;
        if rule.names.is_empty() {
            return Err(self.err(
                rule.upstream.span(),
                "[[tools]] needs at least one name in `match`",
            ));
        }
        if let Some(p) = rule.price {
            if !(p.is_finite() && p >= 0.0) {
                return Err(self.err(rule.upstream.span(), "price must be a finite number >= 0"));
            }
        }
        let origin = format!(
            "{}:{}",
            self.file.display(),
            self.line(rule.names.first().map_or(0, |n| n.span().start))
        );
        Ok(ToolRule {
            origin,
            upstream: self.glob(&rule.upstream)?,
            names,
            risk: rule.risk.into(),
            preview: rule.preview,
            preview_arguments: rule
                .preview_arguments
                .map(|t| serde_json::to_value(t).unwrap_or(serde_json::Value::Null)),
            price: rule.price,
            labels: rule.labels.iter().fold(Labels::NONE, |l, n| {
                l.union(match n {
                    LabelName::Untrusted => Labels::UNTRUSTED,
                    LabelName::Private => Labels::PRIVATE,
                })
            }),
            egress: rule.egress,
        })
    }

    /// One `[[service_accounts]]` entry, added to `accounts`; an error when
    /// its name is already there.
    fn add_service_account(
        &self,
        sa: RawServiceAccount,
        accounts: &mut HashMap<String, ServiceAccount>,
    ) -> Result<(), PolicyError> {
        let name = sa.name.get_ref().clone();
        if accounts.contains_key(&name) {
            return Err(self.err(
                sa.name.span(),
                format!("service account {name:?} is defined twice"),
            ));
        }
        accounts.insert(
            name.clone(),
            ServiceAccount {
                name,
                agent: sa.agent,
                projects: sorted(sa.projects),
                line: self.line(sa.name.span().start),
                file: self.file.to_owned(),
            },
        );
        Ok(())
    }

    /// `[screen]` and its rules.
    fn screening(&self, raw: RawScreen) -> Result<Screening, PolicyError> {
        use crate::screen::content::Actions;
        for h in &raw.link_hosts {
            let name = h.strip_prefix("*.").unwrap_or(h);
            let ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
                && !name.starts_with('.')
                && !name.ends_with('.');
            if !ok {
                return Err(self.err(
                    0..0,
                    format!(
                        "[screen] link_hosts: {h:?} is not a host name (or *.name for its subdomains)"
                    ),
                ));
            }
        }
        let mut rules = Vec::with_capacity(raw.rule.len());
        for r in raw.rule {
            let names = match &r.names {
                Some(n) if n.is_empty() => {
                    return Err(self.err(
                        r.upstream.span(),
                        "[[screen.rule]] `match` needs at least one name (or leave it out)",
                    ))
                }
                Some(n) => Some(self.name_set(n)?),
                None => None,
            };
            rules.push(ScreenRule {
                upstream: self.glob(&r.upstream)?,
                names,
                secrets: r.secrets,
                pii: r.pii,
                injection: r.injection,
            });
        }
        let base = Actions {
            secrets: raw.secrets.unwrap_or(Actions::DEFAULT.secrets),
            pii: raw.pii.unwrap_or(Actions::DEFAULT.pii),
            injection: raw.injection.unwrap_or(Actions::DEFAULT.injection),
        };
        let hosts: Vec<String> = raw
            .link_hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        Screening::new(base, &hosts, rules).map_err(|m| self.err(0..0, m))
    }

    fn glob(&self, s: &Spanned<String>) -> Result<GlobMatcher, PolicyError> {
        build_glob(s.get_ref())
            .map(|g| g.compile_matcher())
            .map_err(|e| self.err(s.span(), format!("bad glob {:?}: {e}", s.get_ref())))
    }

    fn name_set(&self, names: &[Spanned<String>]) -> Result<NameSet, PolicyError> {
        let mut exact = HashSet::new();
        let mut globs = GlobSetBuilder::new();
        let mut any_glob = false;
        for n in names {
            let s = n.get_ref();
            if s.is_empty() {
                return Err(self.err(n.span(), "empty name"));
            }
            if is_glob(s) {
                globs.add(
                    build_glob(s)
                        .map_err(|e| self.err(n.span(), format!("bad glob {s:?}: {e}")))?,
                );
                any_glob = true;
            } else {
                exact.insert(s.clone());
            }
        }
        let globs =
            if any_glob {
                Some(globs.build().map_err(|e| {
                    self.err(names.first().map_or(0..0, Spanned::span), e.to_string())
                })?)
            } else {
                None
            };
        Ok(NameSet {
            written: names.iter().map(|n| n.get_ref().clone()).collect(),
            exact,
            globs,
        })
    }

    fn matcher(&self, m: &Spanned<RawMatch>) -> Result<Matcher, PolicyError> {
        let origin = format!("{}:{}", self.file.display(), self.line(m.span().start));
        let m = m.get_ref();
        Ok(Matcher {
            origin,
            upstream: m.upstream.as_ref().map(|u| self.glob(u)).transpose()?,
            category: m.category.clone(),
            tools: m.tools.as_deref().map(|t| self.name_set(t)).transpose()?,
        })
    }

    fn named_access(&self, a: &RawNamedAccess, uris: bool) -> Result<NamedAccess, PolicyError> {
        let rules = |list: &[RawNameMatch]| -> Result<Vec<NamedRule>, PolicyError> {
            list.iter()
                .map(|r| {
                    let names = if uris {
                        self.name_set(&self.normalized_uris(&r.names)?)?
                    } else {
                        self.name_set(&r.names)?
                    };
                    Ok(NamedRule {
                        upstream: r.upstream.as_ref().map(|u| self.glob(u)).transpose()?,
                        names,
                    })
                })
                .collect()
        };
        Ok(NamedAccess {
            allow: a.allow.as_deref().map(rules).transpose()?,
            deny: rules(&a.deny)?,
        })
    }

    /// Resource rules in the form URIs are matched in (RFC 3986
    /// normalization); a pattern without a scheme (`*`) stays as written.
    fn normalized_uris(
        &self,
        names: &[Spanned<String>],
    ) -> Result<Vec<Spanned<String>>, PolicyError> {
        names
            .iter()
            .map(|n| match super::uri::normalize(n.get_ref()) {
                Ok(u) => Ok(Spanned::new(n.span(), u)),
                Err(super::uri::UriError::NoScheme) => Ok(n.clone()),
                Err(e) => Err(self.err(
                    n.span(),
                    format!(
                        "resource rule {:?} is not a URI the firewall can match: {e}",
                        n.get_ref()
                    ),
                )),
            })
            .collect()
    }

    fn agent(&self, a: RawAgent, defaults: Gates) -> Result<Agent, PolicyError> {
        let name = a.name.get_ref().clone();
        if name.is_empty() {
            return Err(self.err(a.name.span(), "agent name is empty"));
        }
        let mut risks = [false; 3];
        for r in &a.risks {
            risks[Risk::from(*r) as usize] = true;
        }
        if let Some(c) = a.max_cost {
            if !(c.is_finite() && c >= 0.0) {
                return Err(self.err(a.name.span(), "max_cost must be a finite number >= 0"));
            }
        }
        Ok(Agent {
            origin: format!("{}:{}", self.file.display(), self.line(a.name.span().start)),
            name,
            description: a.description,
            projects: sorted(a.projects),
            risks,
            allow: a
                .allow
                .iter()
                .map(|m| self.matcher(m))
                .collect::<Result<_, _>>()?,
            deny: a
                .deny
                .iter()
                .map(|m| self.matcher(m))
                .collect::<Result<_, _>>()?,
            gates: defaults.overridden(&a.gates),
            prompts: self.named_access(&a.prompts, false)?,
            resources: self.named_access(&a.resources, true)?,
            self_approval: a.self_approval,
            max_steps: a.max_steps,
            max_cost: a.max_cost,
            calls_per_s: a.calls_per_s,
        })
    }

    fn cel(&self, s: &Spanned<String>) -> Result<Program, PolicyError> {
        let src = s.get_ref().as_str();
        // A parser bug must not take the firewall down on a policy reload.
        let compiled = std::panic::catch_unwind(|| Program::compile(src));
        match compiled {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(e)) => Err(self.err(
                s.span(),
                format!("CEL expression {src:?} does not compile: {e}"),
            )),
            Err(_) => Err(self.err(
                s.span(),
                format!("CEL expression {src:?} crashed the parser"),
            )),
        }
    }

    fn condition(&self, c: RawCondition) -> Result<Condition, PolicyError> {
        if c.tools.is_empty() {
            return Err(self.err(
                c.require.span(),
                "[[conditions]] needs at least one tool in `tools`",
            ));
        }
        let when = c.when.as_ref().map(|w| self.cel(w)).transpose()?;
        let require = self.cel(&c.require)?;
        Ok(Condition {
            vars: super::referenced(&require) | when.as_ref().map_or(0, super::referenced),
            upstream: self.glob(&c.upstream)?,
            tools: self.name_set(&c.tools)?,
            agents: c.agents.as_deref().map(|a| self.name_set(a)).transpose()?,
            when,
            require,
            require_text: c.require.get_ref().clone(),
            reason: c.reason,
            origin: format!(
                "{}:{}",
                self.file.display(),
                self.line(c.require.span().start)
            ),
        })
    }
}

/// `[server_requests]` compiled: unset keys are refusals; an upstream's
/// table inherits what it leaves out; every origin must be one.
fn server_requests(
    raw: crate::policy::file::RawServerRequests,
    file: &std::path::Path,
) -> Result<ServerRequests, PolicyError> {
    let origins = |list: Vec<String>| -> Result<Vec<String>, PolicyError> {
        list.into_iter()
            .map(|o| {
                crate::http_util::origin_of(&o, true).ok_or_else(|| PolicyError::Invalid {
                    file: file.to_owned(),
                    line: 0,
                    message: format!(
                        "[server_requests] elicitation_url_origins: {o:?} is not an http(s) origin (scheme://host[:port])"
                    ),
                })
            })
            .collect()
    };
    let all = ServerRequestRules {
        sampling: raw.sampling.unwrap_or(false),
        elicitation: raw.elicitation.unwrap_or(false),
        roots: raw.roots.unwrap_or(false),
        elicitation_url_origins: origins(raw.elicitation_url_origins.unwrap_or_default())?,
    };
    let mut upstreams = HashMap::new();
    for (name, u) in raw.upstreams {
        let rules = ServerRequestRules {
            sampling: u.sampling.unwrap_or(all.sampling),
            elicitation: u.elicitation.unwrap_or(all.elicitation),
            roots: u.roots.unwrap_or(all.roots),
            elicitation_url_origins: match u.elicitation_url_origins {
                Some(list) => origins(list)?,
                None => all.elicitation_url_origins.clone(),
            },
        };
        upstreams.insert(name, rules);
    }
    Ok(ServerRequests { all, upstreams })
}

fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '[', '{'])
}

/// Globs match whole names, case-sensitively, and `*` crosses `/` (tool and
/// resource names are not paths).
fn build_glob(s: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(s).literal_separator(false).build()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

// === conversions ===

impl From<RiskName> for Risk {
    fn from(r: RiskName) -> Risk {
        match r {
            RiskName::Read => Risk::Read,
            RiskName::Write => Risk::Write,
            RiskName::Destructive => Risk::Destructive,
        }
    }
}

impl From<GateName> for Gate {
    fn from(g: GateName) -> Gate {
        match g {
            GateName::Allow => Gate::Allow,
            GateName::Approve => Gate::Approve,
            GateName::Deny => Gate::Deny,
        }
    }
}

impl Gates {
    fn overridden(self, g: &RawGates) -> Gates {
        let mut out = self;
        if let Some(x) = g.read {
            out.0[Risk::Read as usize] = x.into();
        }
        if let Some(x) = g.write {
            out.0[Risk::Write as usize] = x.into();
        }
        if let Some(x) = g.destructive {
            out.0[Risk::Destructive as usize] = x.into();
        }
        out
    }
}
