//! The policy's content settings, compiled: what screening does with what
//! it finds per upstream and tool (`[screen]`, `[[screen.rule]]`), the
//! labels a run takes in ([`Labels`], from `[[tools]] labels` and the
//! upstream's `trust` and `data`), and what those labels do to the run's
//! later calls (`[taint]`, [`Taint::gate`]).

use globset::GlobMatcher;

use crate::screen::content::{Action, Actions};
use crate::screen::Scanner;

use super::{Gate, NameSet, Risk, UpstreamFacts};

/// What a run has taken in: a set of labels, kept for the run's lifetime
/// (labels are only ever added).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Labels(u8);

impl Labels {
    /// Nothing.
    pub const NONE: Labels = Labels(0);
    /// Content from outside, or content where an injection cue was found.
    pub const UNTRUSTED: Labels = Labels(1);
    /// Private data.
    pub const PRIVATE: Labels = Labels(2);
    /// Every label, in record order.
    pub const ALL: [(Labels, &'static str); 2] = [
        (Labels::PRIVATE, "private"),
        (Labels::UNTRUSTED, "untrusted"),
    ];

    /// Whether every label of `other` is here.
    pub fn contains(self, other: Labels) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets.
    pub fn union(self, other: Labels) -> Labels {
        Labels(self.0 | other.0)
    }

    /// The labels of `self` not in `other`.
    pub fn without(self, other: Labels) -> Labels {
        Labels(self.0 & !other.0)
    }

    /// Whether there is none.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The labels' names (`private`, `untrusted`).
    pub fn names(self) -> Vec<&'static str> {
        Labels::ALL
            .iter()
            .filter(|(l, _)| self.contains(*l))
            .map(|(_, n)| *n)
            .collect()
    }

    /// The label named `name`.
    pub fn named(name: &str) -> Option<Labels> {
        Labels::ALL
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(l, _)| *l)
    }

    /// The bits, for stores.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// From stored bits (unknown bits dropped).
    pub fn from_bits(bits: u8) -> Labels {
        Labels(bits & 3)
    }
}

/// Screening as the policy configures it.
pub struct Screening {
    scanner: Scanner,
    base: Actions,
    rules: Vec<ScreenRule>,
}

/// A compiled `[[screen.rule]]`.
pub(super) struct ScreenRule {
    pub(super) upstream: GlobMatcher,
    pub(super) names: Option<NameSet>,
    pub(super) secrets: Option<Action>,
    pub(super) pii: Option<Action>,
    pub(super) injection: Option<Action>,
}

impl Screening {
    /// Screening with `base` actions, links allowed to `link_hosts`, and
    /// narrower rules.
    pub(super) fn new(
        base: Actions,
        link_hosts: &[String],
        rules: Vec<ScreenRule>,
    ) -> Result<Screening, String> {
        let scanner = Scanner::new(link_hosts).map_err(|e| e.to_string())?;
        Ok(Screening {
            scanner,
            base,
            rules,
        })
    }

    /// The detectors.
    pub fn scanner(&self) -> &Scanner {
        &self.scanner
    }

    /// The actions for content from `upstream` (a result of `tool`, when it
    /// is one): `[screen]`, then each matching rule in file order.
    pub fn actions(&self, upstream: &str, tool: Option<&str>) -> Actions {
        let mut a = self.base;
        for r in &self.rules {
            let names_match = match (&r.names, tool) {
                (None, _) => true,
                (Some(names), Some(tool)) => names.matches(tool),
                (Some(_), None) => false,
            };
            if names_match && r.upstream.is_match(upstream) {
                a.secrets = r.secrets.unwrap_or(a.secrets);
                a.pii = r.pii.unwrap_or(a.pii);
                a.injection = r.injection.unwrap_or(a.injection);
            }
        }
        a
    }
}

/// `[taint]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taint {
    /// Write and destructive calls after untrusted content.
    pub after_untrusted: Gate,
    /// Egress calls of a run holding private data and untrusted content.
    pub trifecta: Gate,
}

/// Which `[taint]` gate applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintRule {
    /// `[taint] trifecta`.
    Trifecta,
    /// `[taint] after_untrusted`.
    AfterUntrusted,
}

impl TaintRule {
    /// How the rule is written.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintRule::Trifecta => "[taint] trifecta",
            TaintRule::AfterUntrusted => "[taint] after_untrusted",
        }
    }
}

impl Taint {
    /// `after_untrusted = "approve"`, `trifecta = "deny"`.
    pub const DEFAULT: Taint = Taint {
        after_untrusted: Gate::Approve,
        trifecta: Gate::Deny,
    };

    /// Whether the run's labels can matter to a call of `risk` (`egress`:
    /// it can carry data out): only then are they read.
    pub fn applies(self, risk: Risk, egress: bool) -> bool {
        (egress && self.trifecta != Gate::Allow)
            || (risk >= Risk::Write && self.after_untrusted != Gate::Allow)
    }

    /// The strictest gate the run's labels `held` put on a call of `risk`,
    /// and which rule it is: `None` when they put none.
    pub fn gate(self, risk: Risk, egress: bool, held: Labels) -> Option<(Gate, TaintRule)> {
        let mut out: Option<(Gate, TaintRule)> = None;
        let mut consider = |gate: Gate, rule: TaintRule| {
            let stricter = match (out.map(|o| o.0), gate) {
                (_, Gate::Allow) => false,
                (None, _) => true,
                (Some(Gate::Approve), Gate::Deny) => true,
                _ => false,
            };
            if stricter {
                out = Some((gate, rule));
            }
        };
        if egress && held.contains(Labels::PRIVATE.union(Labels::UNTRUSTED)) {
            consider(self.trifecta, TaintRule::Trifecta);
        }
        if risk >= Risk::Write && held.contains(Labels::UNTRUSTED) {
            consider(self.after_untrusted, TaintRule::AfterUntrusted);
        }
        out
    }
}

/// What a tool's results give the run, and whether it can carry data out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traits {
    /// Labels its results give the run.
    pub labels: Labels,
    /// It can carry data out.
    pub egress: bool,
}

/// The labels any content from `up` gives the run (`trust`, `data`).
pub(crate) fn upstream_labels(up: UpstreamFacts<'_>) -> Labels {
    let mut l = Labels::NONE;
    if up.untrusted {
        l = l.union(Labels::UNTRUSTED);
    }
    if up.private {
        l = l.union(Labels::PRIVATE);
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trifecta_needs_both_labels_and_egress() {
        let t = Taint::DEFAULT;
        let both = Labels::PRIVATE.union(Labels::UNTRUSTED);
        assert_eq!(
            t.gate(Risk::Write, true, both),
            Some((Gate::Deny, TaintRule::Trifecta))
        );
        assert_eq!(
            t.gate(Risk::Read, true, Labels::PRIVATE),
            None,
            "private alone"
        );
        assert_eq!(t.gate(Risk::Read, false, both), None, "no egress, a read");
        assert_eq!(
            t.gate(Risk::Write, false, Labels::UNTRUSTED),
            Some((Gate::Approve, TaintRule::AfterUntrusted))
        );
        let open = Taint {
            after_untrusted: Gate::Allow,
            trifecta: Gate::Approve,
        };
        assert_eq!(
            open.gate(Risk::Read, true, both),
            Some((Gate::Approve, TaintRule::Trifecta))
        );
        assert!(!open.applies(Risk::Destructive, false));
        assert!(open.applies(Risk::Read, true));
    }

    #[test]
    fn labels_are_a_set() {
        let l = Labels::UNTRUSTED.union(Labels::PRIVATE);
        assert_eq!(l.names(), ["private", "untrusted"]);
        assert_eq!(Labels::named("private"), Some(Labels::PRIVATE));
        assert_eq!(Labels::from_bits(l.bits()), l);
        assert_eq!(l.without(Labels::PRIVATE), Labels::UNTRUSTED);
    }
}
