//! The policy's verdict on one `tools/call` of a tool its upstream listed,
//! made without I/O or run state: the pin check, the definition's
//! `x-mcp-header` annotations, screening's `block`, the
//! policy's decision ([`Policy::decide`]) and the arguments' check. `serve`
//! makes it here ([`crate::proxy::request::decide`]); `mcp-firewall test`, `audit replay` and
//! the shadow policy re-make it here, so none of them is a second evaluator.
//!
//! What is left to admission (the approval itself, budgets, rate limits,
//! the run's labels as the store holds them) is not part of it; a caller
//! that knows the labels asks [`Judge::verdict`] with them.

use serde_json::Value;

use crate::catalog::{ArgumentsError, ToolEntry};
use crate::config::Upstream;
use crate::mcp::numbers;
use crate::outcome::DecisionKind;
use crate::pins::PinStore;
use crate::policy::{Authority, Call, Decision, Gate, Hidden, Identity, Labels, Policy, Risk};

/// Why a call is refused before (or instead of) the policy's decision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refused {
    /// A tool that does not exist for the run (hidden by the policy, or
    /// its definition blocked by screening).
    Unknown(Option<Hidden>),
    /// Its definition is not pinned as listed.
    Pin(crate::pins::Refusal),
    /// Its arguments fail the tool's input schema or hold an inexact
    /// number.
    Arguments(String),
}

/// What a verdict is made with: one policy snapshot, the run as that
/// policy sees it, the upstream and the pins in force.
#[derive(Clone, Copy)]
pub(crate) struct Judge<'a> {
    /// The policy.
    pub policy: &'a Policy,
    /// The run's verified identity.
    pub identity: &'a Identity<'a>,
    /// The run's authority under `policy`.
    pub authority: &'a Authority,
    /// The upstream the call goes to.
    pub upstream: &'a Upstream,
    /// Reviewed tool definitions.
    pub pins: &'a PinStore,
}

/// What a call comes to, in the words `test`, `audit replay` and the shadow
/// policy compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// Runs unattended.
    Allow,
    /// Waits for a person.
    Approve,
    /// Refused, visibly (a condition, a `deny` gate of the run's labels).
    Deny,
    /// Answered as a tool that does not exist (not the run's, unpinned,
    /// blocked by screening).
    Hidden,
    /// Refused for its arguments (the tool's input schema, an inexact
    /// number).
    Invalid,
}

/// A verdict with what decided it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    /// What the call comes to.
    pub kind: Kind,
    /// The tool's risk, when the policy got that far.
    pub risk: Option<Risk>,
    /// Why it is refused (empty when it is not).
    pub reason: String,
    /// The rule or step that decided.
    pub rule: String,
}

impl Kind {
    /// Every kind.
    pub(crate) const ALL: [Kind; 5] = [
        Kind::Allow,
        Kind::Approve,
        Kind::Deny,
        Kind::Hidden,
        Kind::Invalid,
    ];

    /// `allow`, `approve`, `deny`, `hidden` or `invalid`: the words of the
    /// audit row's `decision` column, which `shadow_decision` is read
    /// beside.
    pub(crate) fn as_str(self) -> &'static str {
        DecisionKind::from(self).as_str()
    }

    /// The kind named `s`.
    pub(crate) fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether the call is refused (`deny`, `hidden`, `invalid`).
    pub(crate) fn refused(self) -> bool {
        matches!(self, Kind::Deny | Kind::Hidden | Kind::Invalid)
    }
}

impl From<Kind> for DecisionKind {
    fn from(k: Kind) -> DecisionKind {
        match k {
            Kind::Allow => DecisionKind::Allow,
            Kind::Approve => DecisionKind::Approve,
            Kind::Deny => DecisionKind::Deny,
            Kind::Hidden => DecisionKind::Hidden,
            Kind::Invalid => DecisionKind::Invalid,
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Judge<'_> {
    /// The policy's decision on a call of `tool`, listed as `entry`, with
    /// `arguments`: `Ok` is `Allow`, `Approve` or `Deny` (a condition
    /// refused) with the pin the definition matched; `Err` is what the
    /// firewall answers instead (an unknown tool, a pin refusal).
    ///
    /// # Errors
    /// The answer for a tool the run may not see.
    pub(crate) fn decide(
        &self,
        tool: &str,
        entry: &ToolEntry,
        arguments: &Value,
    ) -> Result<(Decision, Option<[u8; 32]>), Refused> {
        let up = self.upstream;
        // A definition nobody reviewed (or a name imitating a reviewed one)
        // does not exist for the run.
        let pin = self
            .pins
            .check(up.pinning, &up.name, tool, &entry.sha256)
            .map_err(Refused::Pin)?;
        // A definition whose `x-mcp-header` annotations are invalid is
        // dropped from every list (clients must drop it too): it is not
        // callable either, in any revision.
        if entry.param_headers().violation().is_some() {
            return Err(Refused::Unknown(None));
        }
        // A definition screening withholds from the list (`block`) is not
        // callable either (asked only where a rule blocks).
        let screening = self.policy.screening();
        let actions = screening.actions(&up.name, Some(tool));
        if actions.blocks_any()
            && crate::screen::content::screen_value(screening.scanner(), actions, &entry.definition)
                .action
                == crate::screen::content::Action::Block
        {
            return Err(Refused::Unknown(None));
        }
        let decision = self.policy.decide(
            &Call {
                identity: self.identity,
                authority: self.authority,
                upstream: up.facts(),
                tool,
                arguments,
                hints: entry.hints,
            },
            None,
        );
        match decision {
            Decision::Unknown(h) => Err(Refused::Unknown(Some(h))),
            d => Ok((d, pin)),
        }
    }

    /// [`Judge::decide`], then (for a call the policy lets through) its
    /// arguments ([`check_arguments`]): what [`Judge::kind`] and
    /// [`Judge::verdict`] both stand on.
    fn ruled(
        &self,
        tool: &str,
        entry: &ToolEntry,
        raw: Option<&str>,
        arguments: &Value,
    ) -> Result<(Risk, Gate), Verdict> {
        let (decision, _) = self
            .decide(tool, entry, arguments)
            .map_err(|r| self.refusal(tool, entry, &r))?;
        let passed = match decision {
            Decision::Deny { risk, reason, rule } => {
                return Err(Verdict {
                    kind: Kind::Deny,
                    risk: Some(risk),
                    reason,
                    rule,
                })
            }
            Decision::Approve { risk } => (risk, Gate::Approve),
            Decision::Allow { risk } => (risk, Gate::Allow),
            Decision::Unknown(h) => {
                return Err(self.refusal(tool, entry, &Refused::Unknown(Some(h))))
            }
        };
        check_arguments(raw, entry, arguments).map_err(|r| Verdict {
            risk: Some(passed.0),
            ..refusal(&r)
        })?;
        Ok(passed)
    }

    /// [`refusal`], with the rule that hid the tool named where the policy
    /// hid it (a role's `deny` rule and its `file:line`, the role whose
    /// `allow` rules missed, the gate that is `deny`).
    fn refusal(&self, tool: &str, entry: &ToolEntry, r: &Refused) -> Verdict {
        let mut verdict = refusal(r);
        if let Refused::Unknown(Some(hidden)) = r {
            verdict.rule = self.policy.hiding_rule(
                self.authority,
                self.upstream.facts(),
                tool,
                entry.hints,
                hidden,
            );
        }
        verdict
    }

    /// What a call comes to without the run's labels, and without the
    /// words that explain it (the shadow policy's question, asked per call).
    pub(crate) fn kind(
        &self,
        tool: &str,
        entry: &ToolEntry,
        raw: Option<&str>,
        arguments: &Value,
    ) -> Kind {
        match self.ruled(tool, entry, raw, arguments) {
            Ok((_, Gate::Approve)) => Kind::Approve,
            Ok((_, Gate::Deny)) => Kind::Deny,
            Ok((_, Gate::Allow)) => Kind::Allow,
            Err(v) => v.kind,
        }
    }

    /// The whole verdict on a call: [`Judge::decide`], then (for a call the
    /// policy lets through) its arguments ([`check_arguments`]), then, when
    /// the run's `labels` are known, the `[taint]` gate they put on it.
    /// `raw` is the arguments' JSON text as sent, when there is one.
    pub(crate) fn verdict(
        &self,
        tool: &str,
        entry: &ToolEntry,
        raw: Option<&str>,
        arguments: &Value,
        labels: Option<Labels>,
    ) -> Verdict {
        let (risk, gate) = match self.ruled(tool, entry, raw, arguments) {
            Ok(passed) => passed,
            Err(v) => return v,
        };
        let agent = self.policy.agent(&self.authority.agent);
        let mut rule = format!(
            "risk {risk} ({}), gate {gate} ({})",
            self.policy
                .risk_origin(self.upstream.facts(), tool, entry.hints),
            match agent {
                Some(a) if a.gates.get(risk) != self.policy.gates().get(risk) =>
                    format!("role {}'s [agents.gates]", a.name),
                _ => "[gates]".to_owned(),
            }
        );
        let mut gate = gate;
        if let Some(labels) = labels {
            let traits = self.policy.traits(self.upstream.facts(), tool);
            if let Some((g, t)) = self.policy.taint().gate(risk, traits.egress, labels) {
                let tighter = matches!(
                    (gate, g),
                    (Gate::Allow, Gate::Approve | Gate::Deny) | (Gate::Approve, Gate::Deny)
                );
                if tighter {
                    gate = g;
                    rule = format!(
                        "[taint] {} = {g} (the run holds {:?})",
                        t.as_str(),
                        labels.names()
                    );
                }
            }
        }
        match gate {
            Gate::Allow => Verdict {
                kind: Kind::Allow,
                risk: Some(risk),
                reason: String::new(),
                rule,
            },
            Gate::Approve => Verdict {
                kind: Kind::Approve,
                risk: Some(risk),
                reason: String::new(),
                rule,
            },
            Gate::Deny => Verdict {
                kind: Kind::Deny,
                risk: Some(risk),
                reason: "the run's labels deny this call ([taint])".to_owned(),
                rule,
            },
        }
    }
}

/// A call's arguments, after the policy let it through: only numbers the
/// firewall can hold exactly (a condition read them as the model holds
/// them), and valid for the tool's input schema. Checked before any gate:
/// an approver is never asked about a call the upstream would reject.
///
/// # Errors
/// What is wrong with the arguments.
pub(crate) fn check_arguments(
    raw: Option<&str>,
    entry: &ToolEntry,
    arguments: &Value,
) -> Result<(), Refused> {
    if let Some(why) = raw.and_then(numbers::first_inexact) {
        return Err(Refused::Arguments(why));
    }
    entry.validate(arguments).map_err(|e| {
        Refused::Arguments(match e {
            ArgumentsError::BadSchema(s) => s,
            ArgumentsError::Invalid(list) => list.join("; "),
        })
    })
}

/// The verdict for a refusal.
pub(crate) fn refusal(r: &Refused) -> Verdict {
    match r {
        Refused::Unknown(h) => Verdict {
            kind: Kind::Hidden,
            risk: None,
            reason: match h {
                Some(h) => format!("Unknown tool (hidden: {h})"),
                None => "Unknown tool (the upstream does not list it, or screening blocks its definition)".to_owned(),
            },
            rule: match h {
                Some(h) => format!("hidden: {h}"),
                None => "catalog / screening".to_owned(),
            },
        },
        Refused::Pin(p) => Verdict {
            kind: Kind::Hidden,
            risk: None,
            reason: format!("Unknown tool (pins: {p:?})"),
            rule: "pins".to_owned(),
        },
        Refused::Arguments(why) => Verdict {
            kind: Kind::Invalid,
            risk: None,
            reason: format!("invalid arguments: {why}"),
            rule: "the tool's inputSchema".to_owned(),
        },
    }
}

#[cfg(test)]
#[path = "call_tests.rs"]
mod tests;
