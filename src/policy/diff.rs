//! What a policy change changes *in effect*: given the policy before and
//! after a reload and the configured upstreams, the roles added or removed,
//! the roles whose project memberships changed, the tools whose risk changed
//! and, per role, the tools whose access (hidden, or visible at a risk and
//! gate) changed. The reload's log line says this rather than "files
//! changed", so an operator sees what a policy edit did to the estate.
//!
//! Only tools the policy *names exactly* (in the old or the new policy) are
//! compared: glob rules are not expanded (the firewall does not know which
//! names an upstream will list), and annotations are not consulted (the
//! tools are compared as if their upstream gave no hints). A change that
//! only affects tools matched by globs therefore shows through the tools
//! named exactly, or not at all. Conditions (CEL) are not compared either:
//! they decide single calls, not what a role may see.

use std::fmt;

use super::{Access, Authority, Gate, Policy, Risk, UpstreamFacts};

/// One change in effect between two policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A role only the new policy defines.
    RoleAdded(String),
    /// A role only the old policy defines.
    RoleRemoved(String),
    /// A role's memberships changed: (role, projects gained, projects lost).
    RoleProjects {
        /// The role.
        role: String,
        /// Projects the new policy adds to it (sorted).
        gained: Vec<String>,
        /// Projects the new policy takes from it (sorted).
        lost: Vec<String>,
    },
    /// A tool (named by some `[[tools]]` rule for that upstream, in old or new) whose risk changed for the upstream.
    Risk {
        /// The upstream's route name.
        upstream: String,
        /// The tool.
        tool: String,
        /// Its risk under the old policy.
        old: Risk,
        /// Its risk under the new policy.
        new: Risk,
    },
    /// What a role may do with a tool changed: old/new are `None` when hidden, else `Some((risk, gate))`.
    Access {
        /// The role (defined by both policies).
        role: String,
        /// The upstream's route name.
        upstream: String,
        /// The tool.
        tool: String,
        /// Under the old policy, with the role's old memberships.
        old: Option<(Risk, Gate)>,
        /// Under the new policy, with the role's new memberships.
        new: Option<(Risk, Gate)>,
    },
}

/// The changes in effect from `old` to `new` for the given upstreams.
///
/// Roles are compared by name: first the roles added, then those removed,
/// then the project memberships of roles both define (each group by role
/// name). Then, per upstream in the order given, the tools whose risk
/// changed (by tool name). Last, per role both define (by name), per
/// upstream (in the order given), per tool (by name), the tools whose access
/// changed. The tools compared for an upstream are those either policy
/// names exactly for it ([`Policy::named_tools`]); globs are not expanded
/// and no annotation hints are assumed.
///
/// A role's access is computed with the role's own memberships as its
/// projects (the widest any run of it may reach), the old policy's for the
/// old side and the new one's for the new side, so a lost membership shows
/// as the upstream's tools turning hidden. Added and removed roles get no
/// access lines: their `RoleAdded`/`RoleRemoved` line covers them.
pub(crate) fn effect(old: &Policy, new: &Policy, upstreams: &[UpstreamFacts<'_>]) -> Vec<Change> {
    let mut changes = Vec::new();
    let old_roles = old.agents();
    let new_roles = new.agents();

    changes.extend(
        new_roles
            .iter()
            .filter(|r| old.agent(&r.name).is_none())
            .map(|r| Change::RoleAdded(r.name.clone())),
    );
    changes.extend(
        old_roles
            .iter()
            .filter(|r| new.agent(&r.name).is_none())
            .map(|r| Change::RoleRemoved(r.name.clone())),
    );
    // Roles both define, by name: (old, new).
    let both: Vec<_> = old_roles
        .iter()
        .filter_map(|o| new.agent(&o.name).map(|n| (*o, n)))
        .collect();
    for (o, n) in &both {
        let gained = missing_from(&n.projects, &o.projects);
        let lost = missing_from(&o.projects, &n.projects);
        if !gained.is_empty() || !lost.is_empty() {
            changes.push(Change::RoleProjects {
                role: o.name.clone(),
                gained,
                lost,
            });
        }
    }

    let tools: Vec<Vec<String>> = upstreams
        .iter()
        .map(|&up| {
            let mut t = old.named_tools(up);
            t.extend(new.named_tools(up));
            t.sort();
            t.dedup();
            t
        })
        .collect();

    for (&up, names) in upstreams.iter().zip(&tools) {
        for tool in names {
            let (before, after) = (old.risk(up, tool, None).0, new.risk(up, tool, None).0);
            if before != after {
                changes.push(Change::Risk {
                    upstream: up.name.to_owned(),
                    tool: tool.clone(),
                    old: before,
                    new: after,
                });
            }
        }
    }

    for (o, n) in &both {
        let old_auth = Authority {
            agent: o.name.clone(),
            projects: o.projects.clone(),
        };
        let new_auth = Authority {
            agent: n.name.clone(),
            projects: n.projects.clone(),
        };
        for (&up, names) in upstreams.iter().zip(&tools) {
            for tool in names {
                let before = visible(old.access(&old_auth, up, tool, None));
                let after = visible(new.access(&new_auth, up, tool, None));
                if before != after {
                    changes.push(Change::Access {
                        role: o.name.clone(),
                        upstream: up.name.to_owned(),
                        tool: tool.clone(),
                        old: before,
                        new: after,
                    });
                }
            }
        }
    }
    changes
}

/// The changes as one log line: each change's text, joined by `"; "`, or
/// `"no change in effect"` when there is none.
pub(crate) fn summary(changes: &[Change]) -> String {
    if changes.is_empty() {
        return "no change in effect".to_owned();
    }
    changes
        .iter()
        .map(Change::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The items of `a` (sorted) that `b` (sorted) lacks, in order.
fn missing_from(a: &[String], b: &[String]) -> Vec<String> {
    a.iter()
        .filter(|p| b.binary_search(p).is_err())
        .cloned()
        .collect()
}

/// An access as the diff compares it: hidden (for whatever reason) or the
/// risk and gate it is visible at.
fn visible(a: Access) -> Option<(Risk, Gate)> {
    match a {
        Access::Visible { risk, gate, .. } => Some((risk, gate)),
        Access::Hidden(_) => None,
    }
}

/// `approve (destructive)`, or `hidden`.
struct ShowAccess(Option<(Risk, Gate)>);

impl fmt::Display for ShowAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some((risk, gate)) => write!(f, "{gate} ({risk})"),
            None => f.write_str("hidden"),
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::RoleAdded(role) => write!(f, "role {role:?} added"),
            Change::RoleRemoved(role) => write!(f, "role {role:?} removed"),
            Change::RoleProjects { role, gained, lost } => {
                write!(f, "role {role:?}")?;
                if !gained.is_empty() {
                    write!(f, " gained projects {}", gained.join(", "))?;
                }
                if !gained.is_empty() && !lost.is_empty() {
                    f.write_str(",")?;
                }
                if !lost.is_empty() {
                    write!(f, " lost projects {}", lost.join(", "))?;
                }
                Ok(())
            }
            Change::Risk {
                upstream,
                tool,
                old,
                new,
            } => write!(f, "tool {upstream}/{tool}: risk {old} -> {new}"),
            Change::Access {
                role,
                upstream,
                tool,
                old,
                new,
            } => write!(
                f,
                "role {role}, tool {upstream}/{tool}: {} -> {}",
                ShowAccess(*old),
                ShowAccess(*new)
            ),
        }
    }
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;
