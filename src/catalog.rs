//! What tools each upstream offers, as the firewall last saw them in a
//! `tools/list` answer: their input schemas (to validate `tools/call`
//! arguments before anything reaches the upstream) and their annotations
//! (untrusted risk hints).
//!
//! The catalog is learned from traffic, one entry per tool name, and updated
//! only when a tool's bytes change, so a busy `tools/list` costs a hash per
//! tool. A JSON Schema is compiled on the first call that needs it and
//! cached with the entry. `notifications/tools/list_changed` from an upstream
//! clears its catalog; the next `tools/list` fills it again.
//!
//! It also remembers, per upstream, the last `tools/list` result and the view
//! of it each run authority was shown ([`Catalogs::view`]): upstreams answer
//! the same list again and again, and rewriting a 100-tool list means reading
//! ~100 KB of JSON, where a repeat is a byte comparison and a copy. A view is
//! reused only when everything it was computed from is unchanged: the
//! result's bytes (compared in full, not by hash), the policy generation, the
//! authority (role and effective projects), and the catalog (a clear starts
//! over, so the next list records every tool again).
//!
//! Per upstream and authority, the `tools` array last shown and its view
//! ([`Catalogs::tools_view`]): the same array in a result that changed
//! around it keeps its view, and a changed array takes each tool that is
//! byte for byte the one at the same index (and still the catalog's copy)
//! from it; only the tools that changed are decided again.
//!
//! And, per upstream, the tools of the last list as the strict reader
//! accepted them ([`Catalogs::known_tools`]): an answer that differs only
//! around its tools (a cursor, `_meta`) is read without reading its tools
//! again ([`crate::mcp::tape::Known`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use dashmap::DashMap;
use serde_json::Value;

use crate::mcp::headers::ParamHeaders;
use crate::mcp::rewrite::{ListedTool, Prior, ToolsView};
use crate::mcp::tape::Known;
use crate::policy::{Authority, Hints};

/// Views remembered per listing; past it, further authorities are computed
/// each time (a flood of distinct project sets cannot grow memory).
const MAX_VIEWS: usize = 64;
/// Larger results are rewritten every time instead of remembered.
const MAX_LISTING_BYTES: usize = 4 << 20;
/// What the `tools` arrays remembered per upstream, one per authority, may
/// hold in all; past it, further authorities are computed each time.
const MAX_TOOL_VIEWS_BYTES: usize = 16 << 20;

/// One upstream tool as last listed.
pub struct ToolEntry {
    /// The tool's JSON text as listed, to skip unchanged re-listings. The
    /// text itself, not a hash of it: a 64-bit hash an upstream can collide
    /// (its keys are fixed) would let a changed definition reuse the entry,
    /// and the pin verdict, of the reviewed one.
    listed: Box<str>,
    /// Unique to this entry among the catalogs' entries: a view decided on
    /// it may be shown again while the catalog still holds the entry with
    /// this stamp ([`Catalogs::stamps`]).
    stamp: u64,
    /// Its `inputSchema`.
    pub input_schema: Value,
    /// Its annotations as risk hints (untrusted).
    pub hints: Option<Hints>,
    /// Its whole definition as listed (what a pin covers).
    pub definition: Value,
    /// The pin hash of `definition` ([`crate::canonical::sha256`]).
    pub sha256: [u8; 32],
    validator: OnceLock<Result<jsonschema::Validator, String>>,
    param_headers: OnceLock<ParamHeaders>,
}

/// Why arguments were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgumentsError {
    /// The upstream's schema itself does not compile.
    #[error("the tool's input schema is invalid: {0}")]
    BadSchema(String),
    /// The arguments do not satisfy the schema.
    #[error("invalid arguments: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// Catalogs of all upstreams.
#[derive(Default)]
pub struct Catalogs {
    by_upstream: DashMap<String, Arc<DashMap<String, Arc<ToolEntry>>>>,
    /// Bumped by every [`Catalogs::clear`]: a remembered view is only valid
    /// while the tools it recorded are still in the catalog.
    epoch: AtomicU64,
    /// The last `tools/list` result of each upstream and its views.
    listings: DashMap<String, Arc<Listing>>,
    /// Per upstream, the last `tools` array each authority was shown and
    /// its view ([`Catalogs::tools_view`]).
    tool_views: DashMap<String, Arc<ToolViews>>,
    /// Upstreams cleared since their last refill: the next refill runs
    /// whenever the last one was (the upstream said its list changed).
    stale: dashmap::DashSet<String>,
    /// The tools of each upstream's last list as the strict reader read them.
    known: DashMap<String, Arc<Known>>,
    /// The last [`ToolEntry::stamp`] given.
    stamps: AtomicU64,
}

/// The stamps of one upstream's catalog entries ([`Catalogs::stamps`]).
pub struct Stamps(Option<Arc<DashMap<String, Arc<ToolEntry>>>>);

impl Stamps {
    /// The stamp of the catalog's entry for `name`, if it has one.
    pub fn of(&self, name: &str) -> Option<u64> {
        self.0.as_ref()?.get(name).map(|e| e.stamp)
    }
}

/// A `tools/list` result an upstream sent and the view of it each
/// authority was given, under one policy generation and catalog epoch.
struct Viewed {
    /// The upstream's bytes.
    bytes: Box<str>,
    /// The policy generation the views were decided under.
    policy: u64,
    /// The catalog epoch when the tools were recorded.
    epoch: u64,
    /// The rewritten bytes per authority.
    views: DashMap<Authority, Arc<str>>,
}

/// The last `tools` array of one upstream each authority was shown.
#[derive(Default)]
struct ToolViews {
    by_authority: DashMap<Authority, Arc<ToolsViewed>>,
    /// What they hold, in bytes (about).
    held: AtomicUsize,
}

/// A `tools` array, and its view for one authority under one policy
/// generation and catalog epoch.
struct ToolsViewed {
    bytes: Box<str>,
    policy: u64,
    epoch: u64,
    view: ToolsView,
}

impl ToolsViewed {
    fn size(&self) -> usize {
        self.bytes.len() + self.view.size()
    }
}

/// One upstream's last `tools/list` result and what each authority saw of it.
struct Listing {
    /// The result, byte for byte, and its views.
    viewed: Viewed,
    /// When it was first seen.
    seen: std::time::Instant,
    /// Whole answers carrying this result, as the upstream sent them and as
    /// each authority was given them ([`Catalogs::remembered_answer`]).
    answers: DashMap<Authority, Arc<Remembered>>,
}

impl AsRef<Viewed> for Listing {
    fn as_ref(&self) -> &Viewed {
        &self.viewed
    }
}

/// A `tools/list` answer, as the upstream sent it and as one authority was
/// given it, each with the span of its `id` token.
struct Remembered {
    upstream: Box<str>,
    upstream_id: std::ops::Range<usize>,
    relayed: Box<str>,
    relayed_id: std::ops::Range<usize>,
    /// The relayed answer's `result` (for the completion row).
    relayed_result: Option<std::ops::Range<usize>>,
}

// === impl Catalogs ===

impl Catalogs {
    /// The entry for a tool, if the upstream listed it.
    pub fn get(&self, upstream: &str, tool: &str) -> Option<Arc<ToolEntry>> {
        self.by_upstream.get(upstream)?.get(tool).map(|e| e.clone())
    }

    /// Whether the firewall has seen any `tools/list` of the upstream.
    pub fn knows(&self, upstream: &str) -> bool {
        self.by_upstream
            .get(upstream)
            .is_some_and(|c| !c.is_empty())
    }

    /// Records a listed tool; `raw` is its JSON text (for change detection),
    /// parsed (into the whole definition) only when it changed.
    pub fn record(
        &self,
        upstream: &str,
        name: &str,
        raw: &str,
        parse: impl FnOnce() -> Value,
    ) -> Arc<ToolEntry> {
        let catalog = match self.by_upstream.get(upstream) {
            Some(c) => c.clone(),
            None => self
                .by_upstream
                .entry(upstream.to_owned())
                .or_default()
                .clone(),
        };
        if let Some(e) = catalog.get(name).filter(|e| *e.listed == *raw) {
            return e.clone();
        }
        let mut entry = ToolEntry::of(parse());
        entry.listed = raw.into();
        entry.stamp = self.stamps.fetch_add(1, Ordering::Relaxed) + 1;
        let entry = Arc::new(entry);
        catalog.insert(name.to_owned(), entry.clone());
        entry
    }

    /// The stamps of `upstream`'s entries as they are now: a view decided
    /// on an entry may be shown again while its stamp is the catalog's
    /// (looked up once per list, not once per tool).
    pub fn stamps(&self, upstream: &str) -> Stamps {
        Stamps(self.by_upstream.get(upstream).map(|c| Arc::clone(&c)))
    }

    /// Records one tool of a `tools/list` answer.
    pub fn record_listed(&self, upstream: &str, t: &ListedTool<'_>) -> Arc<ToolEntry> {
        self.record(upstream, t.name, t.raw, || {
            serde_json::from_str(t.raw).unwrap_or(Value::Null)
        })
    }

    /// Forgets an upstream's tools (its list changed).
    pub fn clear(&self, upstream: &str) {
        self.stale.insert(upstream.to_owned());
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.listings.remove(upstream);
        self.tool_views.remove(upstream);
        if let Some(c) = self.by_upstream.get(upstream) {
            c.clear();
        }
    }

    /// Whether `upstream` was cleared since this was last asked (a refill
    /// asks before it decides whether it may run).
    pub fn take_stale(&self, upstream: &str) -> bool {
        self.stale.remove(upstream).is_some()
    }

    /// Forgets the tools of upstreams whose listing is older than `ttl`: a
    /// replica that missed a `list_changed` learns the list again within a
    /// `ttl`. Returns the upstreams cleared.
    pub fn expire(&self, ttl: std::time::Duration) -> Vec<String> {
        let old: Vec<String> = self
            .listings
            .iter()
            .filter(|l| l.seen.elapsed() >= ttl)
            .map(|l| l.key().clone())
            .collect();
        for up in &old {
            self.clear(up);
        }
        old
    }

    /// The view of an upstream's `tools/list` `result` for one authority under
    /// policy generation `policy`: remembered from an identical earlier
    /// result, or computed by `rewrite` (which records the listed tools as
    /// a side effect) and remembered. On a remembered view nothing is recorded:
    /// the same bytes were recorded when it was computed, and no clear happened
    /// since.
    pub fn view<E>(
        &self,
        upstream: &str,
        policy: u64,
        authority: &Authority,
        result: &str,
        rewrite: impl FnOnce() -> Result<String, E>,
    ) -> Result<Arc<str>, E> {
        let make = |viewed| Listing {
            viewed,
            seen: std::time::Instant::now(),
            answers: DashMap::new(),
        };
        Self::view_in(
            &self.listings,
            &self.epoch,
            upstream,
            policy,
            authority,
            result,
            rewrite,
            make,
        )
    }

    /// The view of the `tools` array of an upstream's `tools/list` result for
    /// one authority under policy generation `policy`: the one shown last
    /// when the array's bytes are the same (whatever changed around it: a
    /// cursor, `_meta`), else computed by `rewrite`, given the last array
    /// and view of this authority under the same policy and catalog epoch
    /// to take unchanged tools from ([`crate::mcp::rewrite::ToolsArray::rewrite`]).
    pub fn tools_view<E>(
        &self,
        upstream: &str,
        policy: u64,
        authority: &Authority,
        tools: &str,
        rewrite: impl FnOnce(Option<Prior<'_>>) -> Result<ToolsView, E>,
    ) -> Result<Arc<str>, E> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let views = self.tool_views.get(upstream).map(|v| Arc::clone(&v));
        let last = views
            .as_ref()
            .and_then(|v| v.by_authority.get(authority).map(|p| Arc::clone(&p)));
        let replaces = last.as_ref().map(|p| p.size());
        let prior = last.filter(|p| p.policy == policy && p.epoch == epoch);
        if let Some(p) = prior.as_ref().filter(|p| *p.bytes == *tools) {
            return Ok(Arc::clone(&p.view.text));
        }
        let view = rewrite(prior.as_deref().map(|p| Prior {
            bytes: &p.bytes,
            view: &p.view,
        }))?;
        let text = Arc::clone(&view.text);
        // Remember it only if no clear raced with the recording.
        if self.epoch.load(Ordering::Acquire) != epoch || tools.len() > MAX_LISTING_BYTES {
            return Ok(text);
        }
        let views = match views {
            Some(v) => v,
            None => Arc::clone(&self.tool_views.entry(upstream.to_owned()).or_default()),
        };
        let viewed = ToolsViewed {
            bytes: tools.into(),
            policy,
            epoch,
            view,
        };
        let size = viewed.size();
        let room = views.held.load(Ordering::Relaxed) + size
            <= MAX_TOOL_VIEWS_BYTES + replaces.unwrap_or(0);
        let counted = replaces.is_some() || views.by_authority.len() < MAX_VIEWS;
        if room && counted {
            views.held.fetch_add(size, Ordering::Relaxed);
            if let Some(old) = views
                .by_authority
                .insert(authority.clone(), Arc::new(viewed))
            {
                views.held.fetch_sub(
                    old.size().min(views.held.load(Ordering::Relaxed)),
                    Ordering::Relaxed,
                );
            }
        }
        Ok(text)
    }

    /// The view of `bytes` in `table` (see [`Catalogs::view`]); a new entry
    /// is made by `make`.
    #[allow(clippy::too_many_arguments)]
    fn view_in<T: AsRef<Viewed>, E>(
        table: &DashMap<String, Arc<T>>,
        epochs: &AtomicU64,
        upstream: &str,
        policy: u64,
        authority: &Authority,
        bytes: &str,
        rewrite: impl FnOnce() -> Result<String, E>,
        make: impl FnOnce(Viewed) -> T,
    ) -> Result<Arc<str>, E> {
        let epoch = epochs.load(Ordering::Acquire);
        let entry = table.get(upstream).map(|l| Arc::clone(&l)).filter(|l| {
            let v = (**l).as_ref();
            v.policy == policy && v.epoch == epoch && *v.bytes == *bytes
        });
        if let Some(view) = entry
            .as_ref()
            .and_then(|l| (**l).as_ref().views.get(authority).map(|v| Arc::clone(&v)))
        {
            return Ok(view);
        }
        let view: Arc<str> = rewrite()?.into();
        // Remember it only if no clear raced with the recording.
        if epochs.load(Ordering::Acquire) != epoch {
            return Ok(view);
        }
        match entry {
            Some(l) if (*l).as_ref().views.len() < MAX_VIEWS => {
                (*l).as_ref()
                    .views
                    .insert(authority.clone(), Arc::clone(&view));
            }
            // Past the bound: computed each time.
            Some(_) => {}
            None if bytes.len() <= MAX_LISTING_BYTES => {
                let views = DashMap::new();
                views.insert(authority.clone(), Arc::clone(&view));
                let viewed = Viewed {
                    bytes: bytes.into(),
                    policy,
                    epoch,
                    views,
                };
                table.insert(upstream.to_owned(), Arc::new(make(viewed)));
            }
            None => {}
        }
        Ok(view)
    }
}

impl Catalogs {
    /// The tools of `upstream`'s last `tools/list` answer as the strict
    /// reader accepted them (syntax only: nothing here says what a run may
    /// see, so no policy or clear invalidates them).
    pub fn known_tools(&self, upstream: &str) -> Option<Arc<Known>> {
        self.known.get(upstream).map(|k| Arc::clone(&k))
    }

    /// Remembers the tools a read of `upstream`'s answer found different
    /// from the known ones.
    pub fn remember_known_tools(&self, upstream: &str, known: Known) {
        match self.known.get_mut(upstream) {
            Some(mut k) => *k = Arc::new(known),
            None => {
                self.known.insert(upstream.to_owned(), Arc::new(known));
            }
        }
    }

    /// The catalog's epoch (bumped by every [`Catalogs::clear`]), read before
    /// a `tools/list` answer is filtered and handed to
    /// [`Catalogs::remember_answer`] after.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The answer to give for `text`, a whole `tools/list` answer of
    /// `upstream` to the request with id `id`, when an earlier answer was
    /// byte for byte the same but for its `id` token, under the same policy
    /// generation and catalog: that one was validated by the strict reader
    /// and filtered for `authority`, and the same bytes get the same
    /// verdict. The `id` token must read (JSON) as `id`; it is relayed as
    /// the upstream spelled it, like every other byte of the envelope.
    /// With the answer comes where its `result` is.
    pub fn remembered_answer(
        &self,
        upstream: &str,
        policy: u64,
        authority: &Authority,
        text: &str,
        id: &crate::mcp::jsonrpc::Id,
    ) -> Option<(String, Option<std::ops::Range<usize>>)> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let listing = self
            .listings
            .get(upstream)
            .map(|l| Arc::clone(&l))
            .filter(|l| l.viewed.policy == policy && l.viewed.epoch == epoch)?;
        let r = listing.answers.get(authority).map(|r| Arc::clone(&r))?;
        let before = r.upstream.get(..r.upstream_id.start)?;
        let after = r.upstream.get(r.upstream_id.end..)?;
        if text.len() <= before.len() + after.len()
            || !text.starts_with(before)
            || !text.ends_with(after)
        {
            return None;
        }
        let token = text.get(before.len()..text.len() - after.len())?;
        // Only a plain token: digits, or a string without escapes (what the
        // firewall forwards), never anything that could open or close
        // another member.
        let read = match token.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
            Some(inner) if !inner.contains(['"', '\\']) && !inner.chars().any(char::is_control) => {
                Some(crate::mcp::jsonrpc::Id::String(inner.to_owned()))
            }
            Some(_) => None,
            None if !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit() || b == b'-') => {
                // The strict reader's canonical integer spelling only.
                token
                    .parse::<i64>()
                    .ok()
                    .filter(|n| n.to_string() == token)
                    .map(crate::mcp::jsonrpc::Id::Number)
            }
            None => None,
        };
        if read.as_ref() != Some(id) {
            return None;
        }
        let head = r.relayed.get(..r.relayed_id.start)?;
        let tail = r.relayed.get(r.relayed_id.end..)?;
        let mut out = String::with_capacity(head.len() + token.len() + tail.len());
        out.push_str(head);
        out.push_str(token);
        out.push_str(tail);
        // The result moves with the id's new length when it comes after it.
        let result = r.relayed_result.clone().and_then(|res| {
            if res.end <= r.relayed_id.start {
                Some(res)
            } else if res.start >= r.relayed_id.end {
                let at = res.start - r.relayed_id.end + head.len() + token.len();
                Some(at..at + res.len())
            } else {
                None
            }
        });
        Some((out, result))
    }

    /// Remembers a `tools/list` answer `text` of `upstream` and what
    /// `authority` was given for it (`relayed`), when the listing its result
    /// made is still current (`epoch` read before it was filtered) under
    /// `policy`. Both must carry a top-level `id` member.
    pub fn remember_answer(
        &self,
        upstream: &str,
        policy: u64,
        authority: &Authority,
        epoch: u64,
        text: &str,
        relayed: &str,
    ) {
        if self.epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        let Some(listing) = self
            .listings
            .get(upstream)
            .map(|l| Arc::clone(&l))
            .filter(|l| l.viewed.policy == policy && l.viewed.epoch == epoch)
        else {
            return;
        };
        if listing.answers.len() >= MAX_VIEWS && !listing.answers.contains_key(authority) {
            return;
        }
        let (Some((upstream_id, _)), Some((relayed_id, relayed_result))) =
            (spans(text), spans(relayed))
        else {
            return;
        };
        listing.answers.insert(
            authority.clone(),
            Arc::new(Remembered {
                upstream: text.into(),
                upstream_id,
                relayed: relayed.into(),
                relayed_id,
                relayed_result,
            }),
        );
    }
}

/// The byte ranges of the top-level `id` member's value in a JSON-RPC
/// message, and of its `result`'s.
type Spans = (std::ops::Range<usize>, Option<std::ops::Range<usize>>);

fn spans(text: &str) -> Option<Spans> {
    #[derive(serde::Deserialize)]
    struct Id<'a> {
        #[serde(borrow)]
        id: &'a serde_json::value::RawValue,
        #[serde(borrow)]
        result: Option<&'a serde_json::value::RawValue>,
    }
    let parsed = serde_json::from_str::<Id>(text).ok()?;
    let span = |v: &str| {
        let start = (v.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
        Some(start..start + v.len())
    };
    Some((
        span(parsed.id.get())?,
        parsed.result.and_then(|r| span(r.get())),
    ))
}

/// The Redis channel announcing that an upstream's tool list changed.
pub(crate) const LIST_CHANGED_CHANNEL: &str = "list_changed";

/// Tells the other replicas that `upstream`'s tool list changed (they clear
/// their catalog of it), off the caller's path.
pub(crate) fn announce_list_changed(redis: &Arc<crate::state::Redis>, upstream: &str) {
    let redis = redis.clone();
    let channel = format!("{}:{LIST_CHANGED_CHANNEL}", redis.prefix());
    let upstream = upstream.to_owned();
    tokio::spawn(async move {
        let published = redis
            .run(|mut c| async move {
                redis::cmd("PUBLISH")
                    .arg(&channel)
                    .arg(&upstream)
                    .query_async::<i64>(&mut c)
                    .await
            })
            .await;
        if let Err(e) = published {
            tracing::warn!(error = %e, "list_changed not announced to other replicas; they relearn the list within the catalog ttl");
        }
    });
}

/// Clears the local catalog of every upstream another replica announces as
/// changed; resubscribes after a second when the connection is lost.
pub(crate) async fn follow_list_changed(redis: Arc<crate::state::Redis>, catalogs: Arc<Catalogs>) {
    use futures_util::StreamExt;
    let channel = format!("{}:{LIST_CHANGED_CHANNEL}", redis.prefix());
    loop {
        match redis.pubsub().await {
            Ok(mut ps) => {
                if ps.subscribe(&channel).await.is_ok() {
                    let mut messages = ps.on_message();
                    while let Some(m) = messages.next().await {
                        if let Ok(upstream) = m.get_payload::<String>() {
                            tracing::debug!(%upstream, "tool list changed on another replica");
                            catalogs.clear(&upstream);
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "list_changed subscription unavailable"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

// === impl ToolEntry ===

impl ToolEntry {
    /// The entry of a tool defined as `definition` (its whole `tools/list`
    /// object), in no catalog (`mcp-firewall test`, `audit replay`).
    pub fn of(definition: Value) -> ToolEntry {
        let input_schema = definition
            .get("inputSchema")
            .cloned()
            .unwrap_or(Value::Null);
        ToolEntry {
            listed: Box::from(""),
            stamp: 0,
            input_schema,
            hints: Hints::from_annotations(definition.get("annotations")),
            sha256: crate::canonical::sha256(&definition),
            definition,
            validator: OnceLock::new(),
            param_headers: OnceLock::new(),
        }
    }

    /// Unique to this entry ([`Catalogs::stamps`]).
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// The `x-mcp-header` parameters of the tool (2026-07-28), from its schema.
    pub fn param_headers(&self) -> &ParamHeaders {
        self.param_headers
            .get_or_init(|| ParamHeaders::from_input_schema(&self.input_schema))
    }

    /// Validates arguments against the tool's input schema.
    pub fn validate(&self, arguments: &Value) -> Result<(), ArgumentsError> {
        let validator = self.validator.get_or_init(|| {
            jsonschema::options()
                .should_validate_formats(true)
                .build(&self.input_schema)
                .map_err(|e| e.to_string())
        });
        let validator = validator
            .as_ref()
            .map_err(|e| ArgumentsError::BadSchema(e.clone()))?;
        let errors: Vec<String> = validator
            .iter_errors(arguments)
            .take(5)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ArgumentsError::Invalid(errors))
        }
    }
}

#[cfg(test)]
#[path = "catalog_tests.rs"]
mod tests;
