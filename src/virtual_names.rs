//! A virtual server's section of the config (`[[virtual_server]]`) and the
//! names it exposes: several member upstreams behind one endpoint, each
//! member's tools (or prompts, or resource templates, or resource URIs)
//! under one name space, and the member every exposed name reaches. It is
//! served by [`crate::proxy::virtual_server`].
//!
//! Invariants:
//! - Names are resolved over the members' **full** lists, before any
//!   principal's filtering: what a name reaches never depends on who asks,
//!   so hiding one twin from a principal cannot send its name to the other.
//! - An exposed name reaches exactly one member, under that member's own
//!   name; a name nothing exposes reaches nothing.
//! - Every name left out is reported with why ([`Dropped`]).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Deserialize;

/// `[[virtual_server]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVirtualServer {
    /// Served at `/mcp/<name>`.
    pub name: String,
    /// The member upstreams, in priority order.
    pub upstreams: Vec<String>,
    /// `prefix`, `priority` or `reject` (default).
    #[serde(default)]
    pub collisions: Collisions,
    /// Between the member's name and its own name, in `prefix` mode.
    #[serde(default = "default_separator")]
    pub separator: String,
    /// How long a merged list waits for each member. Default 2,000 ms.
    #[serde(default = "default_list_timeout_ms")]
    pub list_timeout_ms: u64,
}

fn default_separator() -> String {
    "__".to_owned()
}

fn default_list_timeout_ms() -> u64 {
    2_000
}

/// A validated `[[virtual_server]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServer {
    /// Its route name.
    pub name: String,
    /// Its members' upstream names, in priority order (each a configured
    /// upstream, none twice).
    pub members: Vec<String>,
    /// The collision rule.
    pub collisions: Collisions,
    /// The prefix separator.
    pub separator: String,
    /// The per-member deadline of merged lists.
    pub list_timeout: Duration,
}

impl VirtualServer {
    /// How member `member`'s own `name` is spelled on this virtual server,
    /// for the kinds of names its mode prefixes (tools, prompts, resource
    /// templates).
    pub fn spelling(&self, member: usize, name: &str) -> String {
        match self.collisions {
            Collisions::Prefix => prefixed(
                self.members.get(member).map_or("", String::as_str),
                &self.separator,
                name,
            ),
            Collisions::Priority | Collisions::Reject => name.to_owned(),
        }
    }
}

/// `<upstream><separator><name>`.
fn prefixed(upstream: &str, separator: &str, name: &str) -> String {
    format!("{upstream}{separator}{name}")
}

/// Most members of one virtual server.
pub(crate) const MAX_MEMBERS: usize = 32;

impl RawVirtualServer {
    /// Validates against the configured upstream names; the error names the
    /// key (`virtual_server[0].upstreams`) and why.
    pub fn validate(self, i: usize, upstreams: &[&str]) -> Result<VirtualServer, (String, String)> {
        let key = |k: &str| format!("virtual_server[{i}].{k}");
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name_ok {
            return Err((
                key("name"),
                format!("{:?} must be 1-64 characters of [A-Za-z0-9_-]", self.name),
            ));
        }
        if upstreams.contains(&self.name.as_str()) {
            return Err((
                key("name"),
                format!("{:?} is already an upstream's name", self.name),
            ));
        }
        if self.upstreams.is_empty() || self.upstreams.len() > MAX_MEMBERS {
            return Err((
                key("upstreams"),
                format!("needs 1 to {MAX_MEMBERS} member upstreams"),
            ));
        }
        for (j, m) in self.upstreams.iter().enumerate() {
            if !upstreams.contains(&m.as_str()) {
                return Err((
                    format!("{}[{j}]", key("upstreams")),
                    format!("{m:?} is not a configured [[upstream]]"),
                ));
            }
            if self.upstreams[..j].contains(m) {
                return Err((
                    format!("{}[{j}]", key("upstreams")),
                    format!("{m:?} is a member twice"),
                ));
            }
        }
        let sep_ok = !self.separator.is_empty()
            && self.separator.len() <= 8
            && self
                .separator
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.:/".contains(&b));
        if !sep_ok {
            return Err((
                key("separator"),
                format!(
                    "{:?} must be 1-8 characters of [A-Za-z0-9_-.:/]",
                    self.separator
                ),
            ));
        }
        if !(1..=60_000).contains(&self.list_timeout_ms) {
            return Err((key("list_timeout_ms"), "must be 1 to 60000".to_owned()));
        }
        Ok(VirtualServer {
            name: self.name,
            members: self.upstreams,
            collisions: self.collisions,
            separator: self.separator,
            list_timeout: Duration::from_millis(self.list_timeout_ms),
        })
    }
}

/// What happens when two members expose the same name
/// (`[[virtual_server]] collisions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Collisions {
    /// Every name is exposed as `<upstream><separator><name>`.
    Prefix,
    /// Names are kept; of twins, the earlier member in `upstreams` wins.
    Priority,
    /// Names are kept; a name two members expose is exposed by none
    /// (ambiguous). The default.
    #[default]
    Reject,
}

impl Collisions {
    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Collisions::Prefix => "prefix",
            Collisions::Priority => "priority",
            Collisions::Reject => "reject",
        }
    }
}

/// One member's full list, in the virtual server's member order.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    /// The member's upstream name.
    pub upstream: &'a str,
    /// Every name it lists.
    pub names: &'a [String],
}

/// Where an exposed name goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The member's index in the virtual server's `upstreams`.
    pub member: usize,
    /// The member's own name for it.
    pub name: String,
}

/// A member's name the virtual server does not expose, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// The member's index.
    pub member: usize,
    /// The member's own name.
    pub name: String,
    /// Why (for `check`, logs and `explain`).
    pub why: String,
}

/// The resolved name space.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    exposed: BTreeMap<String, Route>,
    /// (member, own name) → exposed name.
    by_member: HashMap<(usize, String), String>,
    dropped: Vec<Dropped>,
}

impl Names {
    /// Resolves the members' full lists under `mode` (`separator` for
    /// [`Collisions::Prefix`]).
    pub fn resolve(mode: Collisions, separator: &str, members: &[Member<'_>]) -> Names {
        // Every candidate exposed name, with every (member, own name) that
        // would claim it, in member order.
        let mut claims: BTreeMap<String, Vec<(usize, &str)>> = BTreeMap::new();
        for (i, m) in members.iter().enumerate() {
            let mut seen: HashMap<&str, ()> = HashMap::with_capacity(m.names.len());
            for name in m.names {
                // A member listing a name twice claims it once.
                if seen.insert(name.as_str(), ()).is_some() {
                    continue;
                }
                let exposed = match mode {
                    Collisions::Prefix => prefixed(m.upstream, separator, name),
                    Collisions::Priority | Collisions::Reject => name.clone(),
                };
                claims.entry(exposed).or_default().push((i, name.as_str()));
            }
        }
        let mut out = Names::default();
        for (exposed, claimants) in claims {
            let [(first, own), rest @ ..] = claimants.as_slice() else {
                continue;
            };
            if rest.is_empty() {
                out.exposed.insert(
                    exposed,
                    Route {
                        member: *first,
                        name: (*own).to_owned(),
                    },
                );
                continue;
            }
            let upstream = |i: usize| members.get(i).map_or("", |m| m.upstream);
            match mode {
                Collisions::Priority => {
                    out.exposed.insert(
                        exposed.clone(),
                        Route {
                            member: *first,
                            name: (*own).to_owned(),
                        },
                    );
                    for (i, name) in rest {
                        out.dropped.push(Dropped {
                            member: *i,
                            name: (*name).to_owned(),
                            why: format!(
                                "{exposed:?} is {}'s, listed earlier in upstreams",
                                upstream(*first)
                            ),
                        });
                    }
                }
                // Reject, and Prefix where two prefixed names coincide
                // (`a__b` + `c` and `a` + `b__c`): nobody gets it.
                Collisions::Reject | Collisions::Prefix => {
                    let owners: Vec<&str> = claimants.iter().map(|(i, _)| upstream(*i)).collect();
                    for (i, name) in &claimants {
                        out.dropped.push(Dropped {
                            member: *i,
                            name: (*name).to_owned(),
                            why: format!(
                                "{exposed:?} is ambiguous: {} expose it",
                                owners.join(", ")
                            ),
                        });
                    }
                }
            }
        }
        out.dropped
            .sort_by(|a, b| (a.member, &a.name).cmp(&(b.member, &b.name)));
        out.by_member = out
            .exposed
            .iter()
            .map(|(e, r)| ((r.member, r.name.clone()), e.clone()))
            .collect();
        out
    }

    /// Where `exposed` goes, if anywhere.
    pub fn route(&self, exposed: &str) -> Option<&Route> {
        self.exposed.get(exposed)
    }

    /// The name `member` exposes for its own `name`, if it does.
    pub fn exposed_as(&self, member: usize, name: &str) -> Option<&str> {
        self.by_member
            .get(&(member, name.to_owned()))
            .map(String::as_str)
    }

    /// Every exposed name and where it goes, in name order.
    pub fn exposed(&self) -> impl Iterator<Item = (&str, &Route)> {
        self.exposed.iter().map(|(e, r)| (e.as_str(), r))
    }

    /// What is not exposed, and why, by member.
    pub fn dropped(&self) -> &[Dropped] {
        &self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Three members; `incidents` and `k8s` both list `restart`.
    fn members<'a>(lists: &'a [Vec<String>; 3]) -> [Member<'a>; 3] {
        [
            Member {
                upstream: "incidents",
                names: &lists[0],
            },
            Member {
                upstream: "k8s",
                names: &lists[1],
            },
            Member {
                upstream: "metrics",
                names: &lists[2],
            },
        ]
    }

    fn lists() -> [Vec<String>; 3] {
        [
            names(&["get_incident", "restart"]),
            names(&["restart", "scale", "scale"]),
            names(&["query"]),
        ]
    }

    #[test]
    fn reject_exposes_no_twin() {
        let l = lists();
        let n = Names::resolve(Collisions::Reject, "__", &members(&l));
        assert_eq!(n.route("restart"), None);
        // A member listing a name twice is not its own twin.
        assert_eq!(n.route("scale").map(|r| r.member), Some(1));
        assert_eq!(n.route("query").map(|r| r.member), Some(2));
        let dropped: Vec<(usize, &str)> = n
            .dropped()
            .iter()
            .map(|d| (d.member, d.name.as_str()))
            .collect();
        assert_eq!(dropped, [(0, "restart"), (1, "restart")]);
        assert!(
            n.dropped()[0].why.contains("incidents, k8s"),
            "{:?}",
            n.dropped()
        );
    }

    #[test]
    fn priority_gives_a_twin_to_the_earlier_member_only() {
        let l = lists();
        let n = Names::resolve(Collisions::Priority, "__", &members(&l));
        assert_eq!(
            n.route("restart"),
            Some(&Route {
                member: 0,
                name: "restart".into()
            })
        );
        assert_eq!(n.dropped().len(), 1);
        assert_eq!(n.dropped()[0].member, 1);
        assert_eq!(n.exposed_as(1, "restart"), None);
    }

    #[test]
    fn prefix_keeps_every_name_apart_and_refuses_coinciding_spellings() {
        let l = lists();
        let n = Names::resolve(Collisions::Prefix, "__", &members(&l));
        assert_eq!(n.route("incidents__restart").map(|r| r.member), Some(0));
        assert_eq!(n.route("k8s__restart").map(|r| r.member), Some(1));
        assert_eq!(n.route("restart"), None, "no bare names");
        assert_eq!(n.exposed_as(2, "query"), Some("metrics__query"));
        assert!(n.dropped().is_empty());
        // `a__b` + `c` and `a` + `b__c` spell the same prefixed name.
        let (x, y) = (names(&["c"]), names(&["b__c"]));
        let m = [
            Member {
                upstream: "a__b",
                names: &x,
            },
            Member {
                upstream: "a",
                names: &y,
            },
        ];
        let n = Names::resolve(Collisions::Prefix, "__", &m);
        assert_eq!(n.route("a__b__c"), None);
        assert_eq!(n.dropped().len(), 2);
    }
}
