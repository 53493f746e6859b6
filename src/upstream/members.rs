//! What each member of a virtual server offers in full (every tool, prompt,
//! resource and resource template, as the firewall itself lists them, not as
//! any principal is shown them) and the names resolved over those lists
//! ([`crate::virtual_names::Names`]). A name therefore reaches the same
//! member whoever asks: hiding one twin from a principal never sends its
//! name to the other.
//!
//! A member's lists are fetched by the firewall's own client (on record as
//! its own requests, [`crate::upstream::own_client`]) when first needed, when
//! the member announces `notifications/*/list_changed`, and when a name or
//! item is met that the lists do not know (at most once per
//! [`MIN_INTERVAL`] per member). A member that cannot be listed keeps its
//! last lists; one never listed contributes nothing (and is reported down).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::audit::Auditor;
use crate::virtual_names::{Collisions, Dropped, Member, Names, VirtualServer};

use crate::upstream::client::UpstreamClient;
use crate::upstream::own_client::{self, OnBehalf};

/// Least time between two fetches of one member's lists (a `list_changed`
/// is let through at once).
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(10);

/// What kind of name a [`Names`] space holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// Tool names.
    Tools,
    /// Prompt names.
    Prompts,
    /// Resource template names.
    Templates,
    /// Resource URIs (never prefixed: in `prefix` mode a URI two members
    /// list is ambiguous).
    Uris,
}

impl Space {
    /// The label used in logs, metrics and `check`.
    pub fn as_str(self) -> &'static str {
        match self {
            Space::Tools => "tool",
            Space::Prompts => "prompt",
            Space::Templates => "resource template",
            Space::Uris => "resource",
        }
    }

    /// Every space.
    pub const ALL: [Space; 4] = [Space::Tools, Space::Prompts, Space::Templates, Space::Uris];
}

/// One member's full lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Lists {
    /// Tool names.
    pub tools: Vec<String>,
    /// Prompt names.
    pub prompts: Vec<String>,
    /// Resource template names, with their `uriTemplate`.
    pub templates: Vec<(String, String)>,
    /// Resource URIs.
    pub uris: Vec<String>,
}

impl Lists {
    fn names(&self, space: Space) -> Vec<String> {
        match space {
            Space::Tools => self.tools.clone(),
            Space::Prompts => self.prompts.clone(),
            Space::Templates => self.templates.iter().map(|(n, _)| n.clone()).collect(),
            Space::Uris => self.uris.clone(),
        }
    }
}

/// The resolved name spaces of a virtual server.
#[derive(Debug, Default)]
pub struct Resolved {
    /// Tools.
    pub tools: Names,
    /// Prompts.
    pub prompts: Names,
    /// Resource templates.
    pub templates: Names,
    /// Resource URIs.
    pub uris: Names,
    /// Each member's templates' literal beginnings (before the first `{`),
    /// for URIs no member listed; only templates the member keeps.
    template_prefixes: Vec<(usize, String)>,
    /// Which members were ever listed.
    pub listed: Vec<bool>,
    /// The lists' generation it was resolved from.
    generation: u64,
}

impl Resolved {
    /// The name space of `space`.
    pub fn names(&self, space: Space) -> &Names {
        match space {
            Space::Tools => &self.tools,
            Space::Prompts => &self.prompts,
            Space::Templates => &self.templates,
            Space::Uris => &self.uris,
        }
    }

    /// The member a resource URI goes to: the member that listed it (under
    /// the collision rule), else the one member whose resource template it
    /// matches; a URI that two members' templates match is nobody's.
    pub fn uri_owner(&self, uri: &str) -> Result<usize, String> {
        // Compared normalized (RFC 3986 §6.2.2), as the policy reads them:
        // another spelling of a listed URI is that URI.
        let uri = crate::policy::uri::normalize(uri)
            .map_err(|e| format!("the resource URI {uri:?} is not acceptable: {e}"))?;
        let uri = uri.as_str();
        if let Some(r) = self.uris.route(uri) {
            return Ok(r.member);
        }
        if let Some(d) = self.uris.dropped().iter().find(|d| d.name == uri) {
            return Err(d.why.clone());
        }
        let mut owners: Vec<usize> = self
            .template_prefixes
            .iter()
            .filter(|(_, p)| !p.is_empty() && uri.starts_with(p.as_str()))
            .map(|(m, _)| *m)
            .collect();
        owners.sort_unstable();
        owners.dedup();
        match owners.as_slice() {
            [one] => Ok(*one),
            [] => Err(format!("no member lists the resource {uri:?}")),
            _ => Err(format!(
                "the resource {uri:?} matches templates of several members"
            )),
        }
    }

    /// Every name left out, by space.
    pub fn dropped(&self) -> impl Iterator<Item = (Space, &Dropped)> {
        Space::ALL
            .into_iter()
            .flat_map(move |s| self.names(s).dropped().iter().map(move |d| (s, d)))
    }
}

/// One member's lists: read without waiting; fetched one at a time.
struct Slot {
    lists: Mutex<Option<Arc<Lists>>>,
    /// When the member was last asked (held while asking: one fetch at a
    /// time, the others wait for its outcome).
    fetched: tokio::sync::Mutex<Option<Instant>>,
    /// It announced `list_changed` since.
    stale: AtomicBool,
    /// Names its lists for clients showed that its lists for the firewall
    /// did not (a server may list by the client's capabilities).
    learned: Mutex<Lists>,
}

/// Most names learned per member and kind.
const MAX_LEARNED: usize = 10_000;

impl Slot {
    fn lists(&self) -> Option<Arc<Lists>> {
        match self.lists.lock() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Its lists with what was learned (`None`: never listed, nothing learned).
    fn with_learned(&self) -> Option<Arc<Lists>> {
        let lists = self.lists();
        let learned = match self.learned.lock() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        };
        if learned == Lists::default() {
            return lists;
        }
        let mut out = lists.as_deref().cloned().unwrap_or_default();
        out.tools.extend(learned.tools);
        out.prompts.extend(learned.prompts);
        out.templates.extend(learned.templates);
        out.uris.extend(learned.uris);
        Some(Arc::new(out))
    }

    fn set_lists(&self, lists: Lists) -> bool {
        let mut l = match self.lists.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        if l.as_deref() == Some(&lists) {
            return false;
        }
        *l = Some(Arc::new(lists));
        true
    }
}

/// The members' lists and the names resolved over them.
pub struct Index {
    config: Arc<VirtualServer>,
    slots: Vec<Slot>,
    resolved: Mutex<Arc<Resolved>>,
    /// Whether each member answered its last listing or session opening.
    up: Vec<AtomicBool>,
    metrics: Arc<crate::telemetry::Metrics>,
    /// Bumped whenever a member's lists change.
    generation: std::sync::atomic::AtomicU64,
}

impl Index {
    /// An index that has listed nothing yet.
    pub fn new(config: Arc<VirtualServer>, metrics: Arc<crate::telemetry::Metrics>) -> Index {
        let n = config.members.len();
        for m in &config.members {
            metrics.virtual_member(&config.name, m, true);
        }
        Index {
            generation: std::sync::atomic::AtomicU64::new(0),
            metrics,
            slots: (0..n)
                .map(|_| Slot {
                    lists: Mutex::new(None),
                    fetched: tokio::sync::Mutex::new(None),
                    stale: AtomicBool::new(true),
                    learned: Mutex::new(Lists::default()),
                })
                .collect(),
            resolved: Mutex::new(Arc::new(Resolved {
                listed: vec![false; n],
                ..Resolved::default()
            })),
            up: (0..n).map(|_| AtomicBool::new(true)).collect(),
            config,
        }
    }

    /// The names as last resolved.
    pub fn resolved(&self) -> Arc<Resolved> {
        match self.resolved.lock() {
            Ok(r) => r.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Adds names a member listed to a client that its own lists lack;
    /// returns the names resolved again.
    pub fn learn(&self, member: usize, space: Space, names: &[String]) -> Arc<Resolved> {
        if let Some(slot) = self.slots.get(member) {
            let mut l = match slot.learned.lock() {
                Ok(l) => l,
                Err(p) => p.into_inner(),
            };
            let list = match space {
                Space::Tools => &mut l.tools,
                Space::Prompts => &mut l.prompts,
                Space::Uris => &mut l.uris,
                // Templates are learned with their URI template only from
                // the member's own lists.
                Space::Templates => return self.resolved(),
            };
            for n in names {
                if list.len() < MAX_LEARNED && !list.contains(n) {
                    list.push(n.clone());
                }
            }
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        self.resolve();
        self.resolved()
    }

    /// Marks a member's lists out of date (it announced `list_changed`).
    pub fn stale(&self, member: usize) {
        if let Some(s) = self.slots.get(member) {
            s.stale.store(true, Ordering::Release);
        }
    }

    /// Whether a member answered last time it was asked.
    pub fn is_up(&self, member: usize) -> bool {
        self.up
            .get(member)
            .is_some_and(|u| u.load(Ordering::Relaxed))
    }

    /// Records whether a member answered.
    pub fn set_up(&self, member: usize, up: bool) {
        if let Some(u) = self.up.get(member) {
            let was = u.swap(up, Ordering::Relaxed);
            let name = self.config.members.get(member).map_or("", String::as_str);
            self.metrics.virtual_member(&self.config.name, name, up);
            if was && !up {
                tracing::warn!(
                    virtual_server = %self.config.name,
                    upstream = %self.config.members.get(member).map_or("", String::as_str),
                    "virtual server member is down: its tools, prompts and resources are left out until it answers"
                );
            }
        }
    }

    /// The members that are down, by name.
    pub fn down(&self) -> Vec<&str> {
        self.config
            .members
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.is_up(*i))
            .map(|(_, m)| m.as_str())
            .collect()
    }

    /// Lists the members that were never listed, are stale, or (with
    /// `force`) were not listed within [`MIN_INTERVAL`], in parallel, each
    /// within `deadline`; then resolves the names again if anything
    /// changed. Returns the names in force.
    pub async fn refresh(
        &self,
        members: &[Arc<UpstreamClient>],
        auditor: &Auditor,
        which: Option<&[usize]>,
        force: bool,
        deadline: Duration,
    ) -> Arc<Resolved> {
        let all: Vec<usize> = (0..self.slots.len()).collect();
        let which = which.unwrap_or(&all);
        let fetches = which.iter().filter_map(|&i| {
            let slot = self.slots.get(i)?;
            let up = members.get(i)?;
            Some(async move {
                let mut fetched = slot.fetched.lock().await;
                // A member listed (or tried) within the interval is not
                // asked again unless it announced a change.
                let recent = fetched.is_some_and(|t| t.elapsed() < MIN_INTERVAL);
                let stale = slot.stale.load(Ordering::Acquire);
                let due = stale || (!recent && (slot.lists().is_none() || force));
                if !due {
                    return;
                }
                *fetched = Some(Instant::now());
                slot.stale.store(false, Ordering::Release);
                match tokio::time::timeout(deadline, fetch(up, auditor)).await {
                    Ok(Ok(lists)) => {
                        self.set_up(i, true);
                        if slot.set_lists(lists) {
                            self.generation.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(virtual_server = %self.config.name, upstream = %up.config.name, error = %e, "virtual server: cannot list a member");
                        self.set_up(i, false);
                    }
                    Err(_) => {
                        tracing::warn!(virtual_server = %self.config.name, upstream = %up.config.name, "virtual server: a member's lists took longer than list_timeout_ms");
                    }
                }
            })
        });
        futures_util::future::join_all(fetches).await;
        // Whoever changed the lists (this call, or one running beside it)
        // may not have resolved them yet: the names are never older than
        // the lists.
        if self.resolved().generation != self.generation.load(Ordering::Acquire) {
            self.resolve();
        }
        self.resolved()
    }

    /// Resolves the names over the lists held now; logs what a change
    /// newly leaves out.
    fn resolve(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        let lists: Vec<Option<Arc<Lists>>> = self.slots.iter().map(Slot::with_learned).collect();
        let mut next = resolve(&self.config, &lists);
        next.generation = generation;
        let before = self.resolved();
        let known: HashSet<(Space, usize, &str)> = before
            .dropped()
            .map(|(s, d)| (s, d.member, d.name.as_str()))
            .collect();
        for (space, d) in next.dropped() {
            if !known.contains(&(space, d.member, d.name.as_str())) {
                tracing::warn!(
                    virtual_server = %self.config.name,
                    upstream = %self.config.members.get(d.member).map_or("", String::as_str),
                    kind = space.as_str(),
                    name = %d.name,
                    why = %d.why,
                    "virtual server leaves a name out"
                );
            }
        }
        for space in Space::ALL {
            self.metrics.virtual_dropped(
                &self.config.name,
                space.as_str(),
                next.names(space).dropped().len(),
            );
        }
        match self.resolved.lock() {
            Ok(mut r) => *r = Arc::new(next),
            Err(p) => *p.into_inner() = Arc::new(next),
        }
    }
}

/// The names of `config`'s members' `lists` (a member never listed lists
/// nothing).
pub(crate) fn resolve(config: &VirtualServer, lists: &[Option<Arc<Lists>>]) -> Resolved {
    let empty = Lists::default();
    let of = |i: usize| lists.get(i).and_then(|l| l.as_deref()).unwrap_or(&empty);
    let space = |space: Space, mode: Collisions| {
        let owned: Vec<Vec<String>> = (0..config.members.len())
            .map(|i| of(i).names(space))
            .collect();
        let members: Vec<Member<'_>> = config
            .members
            .iter()
            .zip(&owned)
            .map(|(upstream, names)| Member { upstream, names })
            .collect();
        Names::resolve(mode, &config.separator, &members)
    };
    let uri_mode = match config.collisions {
        Collisions::Prefix => Collisions::Reject,
        m => m,
    };
    let templates = space(Space::Templates, config.collisions);
    let mut template_prefixes = Vec::new();
    for i in 0..config.members.len() {
        for (name, uri_template) in &of(i).templates {
            if templates.exposed_as(i, name).is_some() {
                let literal = uri_template.split('{').next().unwrap_or("");
                template_prefixes.push((i, literal.to_owned()));
            }
        }
    }
    Resolved {
        tools: space(Space::Tools, config.collisions),
        prompts: space(Space::Prompts, config.collisions),
        templates,
        uris: space(Space::Uris, uri_mode),
        template_prefixes,
        listed: (0..config.members.len())
            .map(|i| lists.get(i).is_some_and(|l| l.is_some()))
            .collect(),
        generation: 0,
    }
}

/// A listed URI as names compare it: normalized, or as it is when it
/// cannot be (no request can name it then but by the same bytes).
pub(crate) fn normal_uri(uri: &str) -> String {
    crate::policy::uri::normalize(uri).unwrap_or_else(|_| uri.to_owned())
}

/// Why a member's lists could not be fetched.
#[derive(Debug, thiserror::Error)]
#[error("{method}: {source}")]
pub(crate) struct FetchError {
    method: &'static str,
    #[source]
    source: own_client::OwnCallError,
}

/// Every page of the member's four lists; a list the member does not
/// offer (it refuses the method) is empty, anything else fails the fetch.
async fn fetch(up: &UpstreamClient, auditor: &Auditor) -> Result<Lists, FetchError> {
    let by = OnBehalf {
        auditor,
        tenant: "",
        subject: "mcp-firewall",
        run_id: "",
        user: None,
        reason: "virtual server: the member's full lists, to resolve its names",
    };
    let mut out = Lists::default();
    for (method, key) in [
        ("tools/list", "tools"),
        ("prompts/list", "prompts"),
        ("resources/list", "resources"),
        ("resources/templates/list", "resourceTemplates"),
    ] {
        let pages = match own_client::list_pages(up, by, method).await {
            Ok(p) => p,
            // A server without prompts or resources may refuse those lists
            // any way it likes (an error, a 404): it offers none.
            Err(own_client::OwnCallError::Audit(e)) => {
                return Err(FetchError {
                    method,
                    source: own_client::OwnCallError::Audit(e),
                })
            }
            Err(_) if method != "tools/list" => continue,
            Err(source) => return Err(FetchError { method, source }),
        };
        for page in pages {
            let Ok(v) = serde_json::from_str::<Value>(&page) else {
                continue;
            };
            let items = v
                .pointer(&format!("/result/{key}"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for item in items {
                let text = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_owned);
                match method {
                    "tools/list" => out.tools.extend(text("name")),
                    "prompts/list" => out.prompts.extend(text("name")),
                    "resources/list" => out.uris.extend(text("uri").map(|u| normal_uri(&u))),
                    _ => {
                        if let (Some(n), Some(t)) = (text("name"), text("uriTemplate")) {
                            out.templates.push((n, t));
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vs(mode: Collisions) -> VirtualServer {
        VirtualServer {
            name: "ops".into(),
            members: vec!["a".into(), "b".into()],
            collisions: mode,
            separator: "__".into(),
            list_timeout: Duration::from_secs(2),
        }
    }

    fn lists(uris: &[&str], templates: &[(&str, &str)]) -> Option<Arc<Lists>> {
        Some(Arc::new(Lists {
            tools: vec!["t".into()],
            prompts: vec![],
            templates: templates
                .iter()
                .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
                .collect(),
            uris: uris.iter().map(|u| (*u).to_owned()).collect(),
        }))
    }

    #[test]
    fn uris_follow_the_rule_and_prefix_mode_makes_a_shared_uri_ambiguous() {
        let l = [
            lists(
                &["file:///shared", "file:///a"],
                &[("logs", "logs://a/{id}")],
            ),
            lists(&["file:///shared"], &[("logs", "logs://b/{id}")]),
        ];
        let r = resolve(&vs(Collisions::Priority), &l);
        assert_eq!(r.uri_owner("file:///shared"), Ok(0));
        assert_eq!(r.uri_owner("logs://a/1"), Ok(0));
        // b's template is hidden (its name is a's), so its URIs are nobody's.
        assert!(r.uri_owner("logs://b/1").is_err());
        let r = resolve(&vs(Collisions::Prefix), &l);
        assert!(r.uri_owner("file:///shared").is_err());
        assert_eq!(r.uri_owner("file:///a"), Ok(0));
        assert_eq!(r.uri_owner("logs://b/1"), Ok(1));
        assert_eq!(r.tools.route("b__t").map(|x| x.member), Some(1));
        let r = resolve(&vs(Collisions::Reject), &l);
        assert!(r
            .uri_owner("file:///shared")
            .unwrap_err()
            .contains("ambiguous"));
        assert!(r.tools.route("t").is_none());
        assert!(r.uri_owner("nothing://x").is_err());
        // Another spelling of an ambiguous URI is the same URI, not a way
        // around the rule through a member's template.
        for spelled in [
            "file:///./shared",
            "FILE:///shared",
            "file:///%73hared",
            "file:///x/../shared",
        ] {
            assert!(
                r.uri_owner(spelled).unwrap_err().contains("ambiguous"),
                "{spelled}"
            );
        }
        assert!(r.uri_owner("file:///a\\..\\shared").is_err());
    }
}
