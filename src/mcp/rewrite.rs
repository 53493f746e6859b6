//! Rewriting an upstream's `tools/list` answer for one run.
//!
//! - Only tools the run may call are kept (the caller decides per tool).
//! - Each kept tool's `annotations` are **derived from the policy's risk**:
//!   read → `readOnlyHint: true`; write → `readOnlyHint: false,
//!   destructiveHint: false`; destructive → `readOnlyHint: false,
//!   destructiveHint: true`. The vendor's hints are dropped (only its display
//!   `title` is kept); the gate is shown under `_meta` (`mcp-firewall/risk`,
//!   `mcp-firewall/gate`).
//! - The list now depends on who asked, so it must never be cached as shared:
//!   `cacheScope` becomes `"private"` and `ttlMs` is capped (2026-07-28).
//!
//! The answer is read as borrowed raw JSON, off the strict reader's tape
//! when it has one ([`tools_result_on`]: no second walk) or parsed from its
//! bytes: untouched fields (input schemas, descriptions, cursors) are copied
//! as the bytes they were, and only the small objects that change are
//! rebuilt. Both ways write the same output (members in key order). This keeps a 100-tool list well
//! inside the latency budget. Anything that cannot be read this way makes the
//! rewrite fail, and the caller answers with an error: an unfiltered list
//! never passes.

use std::cell::Cell;
use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use serde_json::value::RawValue;

use super::tape::{Folded, Kind, NodeId, Tape};

use crate::policy::{Gate, Risk};

/// Longest `ttlMs` a filtered list may carry: policy reloads and token
/// expiry change what a run may see.
pub const MAX_TTL_MS: u64 = 60_000;

/// One tool of the upstream's list, as the caller sees it to decide.
pub struct ListedTool<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its whole JSON text (for change detection).
    pub raw: &'a str,
    /// The text of its `annotations`, if any.
    pub annotations: Option<&'a str>,
    /// The text of its `inputSchema`, if any.
    pub input_schema: Option<&'a str>,
}

/// Why a list could not be rewritten.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    /// Not a JSON-RPC response object.
    #[error("tools/list answer is not a JSON-RPC response: {0}")]
    NotResponse(String),
    /// `result.tools` missing or not an array of objects.
    #[error("tools/list result has no valid `tools` array: {0}")]
    NoTools(String),
    /// A tool without a string `name`.
    #[error("a listed tool has no name")]
    NoName,
    /// Two entries of one name (tool, prompt, resource URI or template):
    /// which of them a client uses, and which the firewall checked, would
    /// be anyone's guess.
    #[error("the list names {0:?} more than once")]
    DuplicateName(String),
}

/// Rewrites a complete JSON-RPC response to `tools/list`. `decide` returns
/// the risk and gate of tools to keep, `None` for tools to drop.
pub fn tools_list(
    response: &str,
    mut decide: impl FnMut(&ListedTool<'_>) -> Option<(Risk, Gate)>,
) -> Result<String, RewriteError> {
    with_result(response, |result, out| {
        rewrite_result(
            Raw,
            result,
            &mut |at, out| write_raw_tools(at, &mut decide, out),
            out,
        )
    })
}

/// Rewrites the `result` of a `tools/list` answer (the object holding
/// `tools`), as [`tools_list`] does inside a whole response.
pub fn tools_result(
    result: &str,
    mut decide: impl FnMut(&ListedTool<'_>) -> Option<(Risk, Gate)>,
) -> Result<String, RewriteError> {
    let mut out = String::with_capacity(result.len());
    rewrite_result(
        Raw,
        result,
        &mut |at, out| write_raw_tools(at, &mut decide, out),
        &mut out,
    )?;
    Ok(out)
}

/// [`tools_result`] for a `result` the strict reader put on a tape
/// (value `result` of `tape`, read from `text`): the members and tools are
/// read off the tape, not parsed again. The rewritten `tools` array comes
/// from `tools` ([`ToolsArray::rewrite`], or a view remembered for the
/// same array's bytes); the rest of the result is rewritten here. The
/// output is [`tools_result`]'s.
pub fn tools_result_on(
    text: &str,
    tape: &Tape,
    result: NodeId,
    mut tools: impl FnMut(ToolsArray<'_>) -> Result<Arc<str>, RewriteError>,
) -> Result<String, RewriteError> {
    let doc = OnTape { text, tape };
    let mut out = String::with_capacity(tape.span(result).len());
    let mut write = |at: At<'_>, out: &mut String| {
        out.push_str(&tools(ToolsArray { doc, at })?);
        Ok(())
    };
    rewrite_result(doc, At::Node(result), &mut write, &mut out)?;
    Ok(out)
}

/// The `tools` array of a result on a tape, to rewrite for one run.
pub struct ToolsArray<'a> {
    doc: OnTape<'a>,
    at: At<'a>,
}

/// A rewritten `tools` array, and per tool where it was in the upstream's
/// array, its name, and where its view is in the rewritten one: what the
/// next rewrite for the same run authority takes unchanged tools from.
#[derive(Debug)]
pub struct ToolsView {
    /// The rewritten array.
    pub text: Arc<str>,
    parts: Vec<ToolPart>,
}

/// One tool of a [`ToolsView`].
#[derive(Debug)]
struct ToolPart {
    /// Its bytes in the upstream's array (`None`: not taken again).
    element: Option<Range<usize>>,
    name: Arc<str>,
    /// The stamp of the catalog entry it was decided on.
    stamp: Option<u64>,
    /// Its view in the rewritten array (`None`: hidden).
    view: Option<Range<usize>>,
}

/// The upstream's previous `tools` array and its view, decided for the
/// same run authority under the same policy, pins and catalog epoch.
#[derive(Clone, Copy)]
pub struct Prior<'p> {
    /// The previous array's bytes.
    pub bytes: &'p str,
    /// Its view.
    pub view: &'p ToolsView,
}

impl ToolsView {
    /// A view of `text` with nothing to take tools from (for tests).
    #[cfg(test)]
    pub fn of(text: &str) -> Self {
        ToolsView {
            text: text.into(),
            parts: Vec::new(),
        }
    }

    /// What it holds, in bytes (to bound what is remembered).
    pub fn size(&self) -> usize {
        self.text.len() + self.parts.len() * std::mem::size_of::<ToolPart>()
    }
}

impl ToolsArray<'_> {
    /// The array's text as the upstream sent it.
    pub fn text(&self) -> &str {
        self.doc.text(self.at)
    }

    /// The array rewritten: only the tools `decide` keeps, each with the
    /// annotations of its risk and gate; `decide` also gives the stamp of
    /// the catalog entry it decided on. A tool whose bytes are those of the
    /// tool at the same index of `prior`, and whose catalog entry is still
    /// the one that was decided (`stamp` gives the entry's stamp now, by
    /// name), keeps its view from `prior` without being decided again (its
    /// decision depends on nothing but its bytes and what `prior` was
    /// decided under).
    pub fn rewrite(
        &self,
        prior: Option<Prior<'_>>,
        mut stamp: impl FnMut(&str) -> Option<u64>,
        mut decide: impl FnMut(&ListedTool<'_>) -> (Option<(Risk, Gate)>, u64),
    ) -> Result<ToolsView, RewriteError> {
        let mut out = String::with_capacity(self.text().len());
        let mut parts = Vec::new();
        let decided = Cell::new(None);
        let mut decide = |t: &ListedTool<'_>| {
            let (shown, stamp) = decide(t);
            decided.set(Some(stamp));
            shown
        };
        let mut memo = Memo {
            prior,
            stamp: &mut stamp,
            decided: &decided,
            parts: &mut parts,
        };
        write_tools(self.doc, self.at, &mut decide, &mut memo, &mut out)?;
        Ok(ToolsView {
            text: out.into(),
            parts,
        })
    }
}

/// What a rewrite of a `tools` array takes from the last one and records
/// for the next ([`ToolsArray::rewrite`]).
struct Memo<'m, 'p> {
    prior: Option<Prior<'p>>,
    stamp: &'m mut dyn FnMut(&str) -> Option<u64>,
    /// The stamp of the entry the last tool decided was decided on.
    decided: &'m Cell<Option<u64>>,
    parts: &'m mut Vec<ToolPart>,
}

impl<'p> Memo<'_, 'p> {
    /// The view of the tool at `index`, whose bytes are `raw`, from the
    /// prior rewrite, when it may be taken from there.
    fn taken(&mut self, index: usize, raw: &str) -> Option<(&'p ToolPart, &'p str)> {
        let prior = self.prior?;
        let part = prior.view.parts.get(index)?;
        let before = prior.bytes.get(part.element.clone()?)?;
        if before != raw || part.stamp.is_none() || (self.stamp)(&part.name) != part.stamp {
            return None;
        }
        let view = match &part.view {
            Some(at) => prior.view.text.get(at.clone())?,
            None => "",
        };
        Some((part, view))
    }
}

/// [`write_tools`] of an array parsed from its bytes, with no prior
/// rewrite to take tools from.
fn write_raw_tools(
    at: &str,
    decide: &mut impl FnMut(&ListedTool<'_>) -> Option<(Risk, Gate)>,
    out: &mut String,
) -> Result<(), RewriteError> {
    let mut never = |_: &str| None;
    let mut memo = Memo {
        prior: None,
        stamp: &mut never,
        decided: &Cell::new(None),
        parts: &mut Vec::new(),
    };
    write_tools(Raw, at, decide, &mut memo, out)
}

/// Where `part` (a slice of `whole`) is in it.
fn offset_in(whole: &str, part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= whole.len()).then_some(start..end)
}

/// Where the rewrite reads a JSON text's parts from: the bytes (parsed as
/// borrowed raw JSON) or the strict reader's tape of them.
trait Doc<'a>: Copy {
    /// A value of the document.
    type Value: Copy;
    /// Its text.
    fn text(self, v: Self::Value) -> &'a str;
    /// The members of an object, in key order (keys as written; a key
    /// with an escape, or a value that is not an object, is an error).
    fn members(self, v: Self::Value) -> Result<Vec<(&'a str, Self::Value)>, String>;
    /// The elements of an array (a value that is not one is an error).
    fn elements(self, v: Self::Value) -> Result<Vec<Self::Value>, String>;
}

/// Parts parsed from the bytes.
#[derive(Clone, Copy)]
struct Raw;

impl<'a> Doc<'a> for Raw {
    type Value = &'a str;

    fn text(self, v: &'a str) -> &'a str {
        v
    }

    fn members(self, v: &'a str) -> Result<Vec<(&'a str, &'a str)>, String> {
        let map: BTreeMap<&'a str, &'a RawValue> =
            serde_json::from_str(v).map_err(|e| e.to_string())?;
        Ok(map.into_iter().map(|(k, v)| (k, v.get())).collect())
    }

    fn elements(self, v: &'a str) -> Result<Vec<&'a str>, String> {
        let items: Vec<&'a RawValue> = serde_json::from_str(v).map_err(|e| e.to_string())?;
        Ok(items.into_iter().map(RawValue::get).collect())
    }
}

/// Parts read off a tape; a value below the tape's levels is parsed from
/// its bytes like [`Raw`].
#[derive(Clone, Copy)]
struct OnTape<'a> {
    text: &'a str,
    tape: &'a Tape,
}

/// A value on the tape, or one below its levels.
#[derive(Clone, Copy)]
enum At<'a> {
    Node(NodeId),
    Text(&'a str),
}

impl<'a> Doc<'a> for OnTape<'a> {
    type Value = At<'a>;

    fn text(self, v: At<'a>) -> &'a str {
        match v {
            At::Node(n) => self.tape.text(self.text, n),
            At::Text(t) => t,
        }
    }

    fn members(self, v: At<'a>) -> Result<Vec<(&'a str, At<'a>)>, String> {
        let n = match v {
            At::Node(n) => n,
            At::Text(t) => {
                let m = Raw.members(t)?;
                return Ok(m.into_iter().map(|(k, v)| (k, At::Text(v))).collect());
            }
        };
        if self.tape.kind(n) != Some(Kind::Object) {
            return Err("expected an object".to_owned());
        }
        let Some(children) = self.tape.children(n) else {
            return self.members(At::Text(self.text(v)));
        };
        let mut out = Vec::new();
        for c in children {
            let key = self
                .tape
                .plain_key(self.text, c)
                .ok_or_else(|| "a member name with an escape".to_owned())?;
            out.push((key, At::Node(c)));
        }
        // Keys are unique (the strict reader refused twins).
        out.sort_unstable_by(|a, b| a.0.cmp(b.0));
        Ok(out)
    }

    fn elements(self, v: At<'a>) -> Result<Vec<At<'a>>, String> {
        let n = match v {
            At::Node(n) => n,
            At::Text(t) => return Ok(Raw.elements(t)?.into_iter().map(At::Text).collect()),
        };
        if self.tape.kind(n) != Some(Kind::Array) {
            return Err("expected an array".to_owned());
        }
        match self.tape.children(n) {
            Some(children) => Ok(children.map(At::Node).collect()),
            None => self.elements(At::Text(self.text(v))),
        }
    }
}

/// The member `key` of `members` (sorted by key).
fn get<V: Copy>(members: &[(&str, V)], key: &str) -> Option<V> {
    members
        .binary_search_by(|(k, _)| (*k).cmp(key))
        .ok()
        .and_then(|i| members.get(i))
        .map(|(_, v)| *v)
}

/// Copies a JSON-RPC response, letting `rewrite` write its `result`. Error
/// answers (no `result`) are returned unchanged.
fn with_result(
    response: &str,
    rewrite: impl FnOnce(&str, &mut String) -> Result<(), RewriteError>,
) -> Result<String, RewriteError> {
    let top: BTreeMap<&str, &RawValue> =
        serde_json::from_str(response).map_err(|e| RewriteError::NotResponse(e.to_string()))?;
    if top.contains_key("error") || !top.contains_key("result") {
        // An error answer carries no list: relay it as is.
        return Ok(response.to_owned());
    }
    let mut out = String::with_capacity(response.len());
    out.push('{');
    let mut first = true;
    let mut rewrite = Some(rewrite);
    for (k, v) in &top {
        sep(&mut out, &mut first);
        push_key(&mut out, k);
        match (*k, rewrite.take()) {
            ("result", Some(f)) => f(v.get(), &mut out)?,
            (_, f) => {
                rewrite = f;
                out.push_str(v.get());
            }
        }
    }
    out.push('}');
    Ok(out)
}

/// Writes a result's `tools` array (given where it is) into `out`.
type WriteTools<'w, V> = dyn FnMut(V, &mut String) -> Result<(), RewriteError> + 'w;

/// Writes the rewritten `result`: its `tools` by `tools`, the cache
/// members made private, the rest as they were.
fn rewrite_result<'a, D: Doc<'a>>(
    doc: D,
    result: D::Value,
    tools: &mut WriteTools<'_, D::Value>,
    out: &mut String,
) -> Result<(), RewriteError> {
    let fields = doc.members(result).map_err(RewriteError::NoTools)?;
    if get(&fields, "tools").is_none() {
        return Err(RewriteError::NoTools("missing".to_owned()));
    }
    let mut has_scope = false;
    out.push('{');
    let mut first = true;
    for (k, v) in &fields {
        match *k {
            "tools" => {
                sep(out, &mut first);
                push_key(out, "tools");
                tools(*v, out)?;
            }
            "cacheScope" => {
                has_scope = true;
                sep(out, &mut first);
                out.push_str("\"cacheScope\":\"private\"");
            }
            "ttlMs" => {
                sep(out, &mut first);
                let ttl = doc
                    .text(*v)
                    .parse::<f64>()
                    .ok()
                    .filter(|t| t.is_finite() && *t >= 0.0);
                let capped = ttl.map_or(0, |t| (t as u64).min(MAX_TTL_MS));
                out.push_str("\"ttlMs\":");
                out.push_str(&capped.to_string());
            }
            _ => {
                sep(out, &mut first);
                push_key(out, k);
                out.push_str(doc.text(*v));
            }
        }
    }
    if !has_scope && (get(&fields, "ttlMs").is_some() || get(&fields, "resultType").is_some()) {
        // A 2026-07-28 result without a scope: say it is private.
        sep(out, &mut first);
        out.push_str("\"cacheScope\":\"private\"");
    }
    out.push('}');
    Ok(())
}

/// Writes the `tools` array `at`, keeping only what `decide` keeps (or,
/// for a tool unchanged since `memo`'s prior rewrite, what that kept).
fn write_tools<'a, D: Doc<'a>>(
    doc: D,
    at: D::Value,
    decide: &mut impl FnMut(&ListedTool<'_>) -> Option<(Risk, Gate)>,
    memo: &mut Memo<'_, '_>,
    out: &mut String,
) -> Result<(), RewriteError> {
    let array = doc.text(at);
    let tools = doc.elements(at).map_err(RewriteError::NoTools)?;
    memo.parts.reserve(tools.len());
    out.push('[');
    let mut first_tool = true;
    let mut names: HashSet<Arc<str>> = HashSet::with_capacity(tools.len());
    for (index, t) in tools.iter().enumerate() {
        let raw = doc.text(*t);
        let element = offset_in(array, raw);
        let (name, stamp, view) = match memo.taken(index, raw) {
            Some((part, view)) => {
                let name = Arc::clone(&part.name);
                let kept = part.view.is_some();
                if !names.insert(Arc::clone(&name)) {
                    return Err(RewriteError::DuplicateName(name.to_string()));
                }
                let view = kept.then(|| {
                    sep(out, &mut first_tool);
                    let start = out.len();
                    out.push_str(view);
                    start..out.len()
                });
                (name, part.stamp, view)
            }
            None => {
                memo.decided.set(None);
                let (name, view) = rewrite_tool(doc, *t, decide, out, &mut first_tool, &mut names)?;
                (name, memo.decided.take(), view)
            }
        };
        memo.parts.push(ToolPart {
            element,
            name,
            stamp,
            view,
        });
    }
    out.push(']');
    Ok(())
}

/// Writes one tool as `decide` decides it, after the separator; returns its
/// name and where its view was written (`None`: hidden).
fn rewrite_tool<'a, D: Doc<'a>>(
    doc: D,
    tool: D::Value,
    decide: &mut impl FnMut(&ListedTool<'_>) -> Option<(Risk, Gate)>,
    out: &mut String,
    first_tool: &mut bool,
    names: &mut HashSet<Arc<str>>,
) -> Result<(Arc<str>, Option<Range<usize>>), RewriteError> {
    let raw = doc.text(tool);
    let fields = doc.members(tool).map_err(RewriteError::NoTools)?;
    let name_at = get(&fields, "name").ok_or(RewriteError::NoName)?;
    let name: String = serde_json::from_str(doc.text(name_at)).map_err(|_| RewriteError::NoName)?;
    // Refused before the second one is recorded or decided.
    if names.contains(name.as_str()) {
        return Err(RewriteError::DuplicateName(name));
    }
    let annotations = get(&fields, "annotations");
    let listed = ListedTool {
        name: &name,
        raw,
        annotations: annotations.map(|a| doc.text(a)),
        input_schema: get(&fields, "inputSchema").map(|s| doc.text(s)),
    };
    let decided = decide(&listed);
    let name: Arc<str> = name.into();
    names.insert(Arc::clone(&name));
    let Some((risk, gate)) = decided else {
        return Ok((name, None));
    };
    sep(out, first_tool);
    let start = out.len();
    out.push('{');
    let mut first = true;
    for (k, v) in &fields {
        // The members the firewall writes, in any spelling a
        // case-insensitive client would read as them (`Annotations`,
        // `_META`): the vendor's never pass beside the firewall's (found
        // by the `tools_rewrite` fuzz target).
        if Folded::eq_str(k, "annotations") || Folded::eq_str(k, "_meta") {
            continue;
        }
        sep(out, &mut first);
        push_key(out, k);
        out.push_str(doc.text(*v));
    }
    // Annotations: derived from the policy's risk; only the vendor's display
    // title (a string) survives. Written straight into `out`: a list of 100
    // tools must not cost 200 JSON maps.
    let title = annotations
        .and_then(|a| doc.members(a).ok())
        .and_then(|a| get(&a, "title"))
        .map(|t| doc.text(t))
        .filter(|t| t.starts_with('"'));
    sep(out, &mut first);
    out.push_str("\"annotations\":{");
    if let Some(t) = title {
        out.push_str("\"title\":");
        out.push_str(t);
        out.push(',');
    }
    out.push_str(if risk == Risk::Read {
        "\"readOnlyHint\":true,"
    } else {
        "\"readOnlyHint\":false,"
    });
    out.push_str(if risk == Risk::Destructive {
        "\"destructiveHint\":true}"
    } else {
        "\"destructiveHint\":false}"
    });
    // _meta: the vendor's entries, plus the firewall's risk and gate (which
    // overwrite any vendor entry of the same name), keys in sorted order.
    let mut meta: BTreeMap<&str, &str> = get(&fields, "_meta")
        .and_then(|m| doc.members(m).ok())
        .map(|m| m.into_iter().map(|(k, v)| (k, doc.text(v))).collect())
        .unwrap_or_default();
    meta.insert("mcp-firewall/risk", risk_json(risk));
    meta.insert("mcp-firewall/gate", gate_json(gate));
    sep(out, &mut first);
    out.push_str("\"_meta\":{");
    let mut first_meta = true;
    for (k, v) in &meta {
        sep(out, &mut first_meta);
        push_key(out, k);
        out.push_str(v);
    }
    out.push('}');
    out.push('}');
    Ok((name, Some(start..out.len())))
}

/// Rewrites a complete JSON-RPC response to a `prompts/list`,
/// `resources/list` or `resources/templates/list`: keeps the entries of
/// `array` whose string `key` (name, uri, uriTemplate) `keep` accepts (given
/// the name and the entry's JSON). Other
/// fields are copied; `cacheScope` becomes private like for tools.
pub fn named_list(
    response: &str,
    array: &str,
    key: &str,
    mut keep: impl FnMut(&str, &RawValue) -> bool,
) -> Result<String, RewriteError> {
    with_result(response, |result, out| {
        let fields: BTreeMap<&str, &RawValue> =
            serde_json::from_str(result).map_err(|e| RewriteError::NoTools(e.to_string()))?;
        let items_raw = fields
            .get(array)
            .ok_or_else(|| RewriteError::NoTools(format!("missing `{array}`")))?;
        let items: Vec<&RawValue> = serde_json::from_str(items_raw.get())
            .map_err(|e| RewriteError::NoTools(e.to_string()))?;
        out.push('{');
        let mut first_field = true;
        for (fk, fv) in &fields {
            sep(out, &mut first_field);
            push_key(out, fk);
            match *fk {
                f if f == array => {
                    out.push('[');
                    let mut first_item = true;
                    let mut names = std::collections::HashSet::with_capacity(items.len());
                    for item in &items {
                        let obj: BTreeMap<&str, &RawValue> = serde_json::from_str(item.get())
                            .map_err(|e| RewriteError::NoTools(e.to_string()))?;
                        let name: String = obj
                            .get(key)
                            .and_then(|n| serde_json::from_str(n.get()).ok())
                            .ok_or(RewriteError::NoName)?;
                        if names.contains(&name) {
                            return Err(RewriteError::DuplicateName(name));
                        }
                        let kept = keep(&name, item);
                        names.insert(name);
                        if kept {
                            sep(out, &mut first_item);
                            out.push_str(item.get());
                        }
                    }
                    out.push(']');
                }
                "cacheScope" => out.push_str("\"private\""),
                _ => out.push_str(fv.get()),
            }
        }
        out.push('}');
        Ok(())
    })
}

/// The risk as a JSON string literal.
fn risk_json(risk: Risk) -> &'static str {
    match risk {
        Risk::Read => "\"read\"",
        Risk::Write => "\"write\"",
        Risk::Destructive => "\"destructive\"",
    }
}

/// The gate as a JSON string literal.
fn gate_json(gate: Gate) -> &'static str {
    match gate {
        Gate::Allow => "\"allow\"",
        Gate::Approve => "\"approve\"",
        Gate::Deny => "\"deny\"",
    }
}

fn sep(out: &mut String, first: &mut bool) {
    if !*first {
        out.push(',');
    }
    *first = false;
}

/// Keys come from borrowed `&str` deserialization, which fails for keys with
/// escape sequences, so they need no escaping here.
fn push_key(out: &mut String, k: &str) {
    out.push('"');
    out.push_str(k);
    out.push_str("\":");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn list() -> String {
        json!({
            "jsonrpc": "2.0", "id": 3,
            "result": {
                "tools": [
                    {"name": "get_incident", "description": "d", "inputSchema": {"type": "object"},
                     "annotations": {"title": "Get", "readOnlyHint": true, "openWorldHint": true}},
                    {"name": "rollback_deployment", "inputSchema": {"type": "object"},
                     "annotations": {"readOnlyHint": true, "destructiveHint": false}, "_meta": {"vendor/x": 1}},
                    {"name": "restart_service", "inputSchema": {"type": "object"}}
                ],
                "nextCursor": "abc", "ttlMs": 3600000, "cacheScope": "public"
            }
        })
        .to_string()
    }

    #[test]
    fn drops_hidden_tools_and_derives_annotations_from_risk() {
        let out = tools_list(&list(), |t| match t.name {
            "get_incident" => Some((Risk::Read, Gate::Allow)),
            "rollback_deployment" => Some((Risk::Destructive, Gate::Approve)),
            _ => None,
        })
        .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        let tools = v["result"]["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[0]["name"], "get_incident");
        assert_eq!(
            tools[0]["annotations"],
            json!({"title": "Get", "readOnlyHint": true, "destructiveHint": false})
        );
        assert_eq!(tools[0]["description"], "d");
        assert_eq!(
            tools[1]["annotations"],
            json!({"readOnlyHint": false, "destructiveHint": true}),
            "the vendor's claim of read-only must not survive"
        );
        assert_eq!(tools[1]["_meta"]["mcp-firewall/gate"], "approve");
        assert_eq!(tools[1]["_meta"]["mcp-firewall/risk"], "destructive");
        assert_eq!(tools[1]["_meta"]["vendor/x"], 1);
        assert_eq!(v["result"]["nextCursor"], "abc");
        assert_eq!(v["result"]["cacheScope"], "private");
        assert_eq!(v["result"]["ttlMs"], MAX_TTL_MS);
        assert_eq!(v["id"], 3);
    }

    #[test]
    fn vendor_meta_cannot_spoof_the_firewall_entries_and_odd_titles_are_dropped() {
        let raw = json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [
            {"name": "a", "inputSchema": {"type": "object"},
             "annotations": {"title": {"not": "a string"}, "readOnlyHint": true},
             "_meta": {"mcp-firewall/risk": "read", "mcp-firewall/gate": "allow", "z/last": [1, 2], "a/first": null}},
            {"name": "b", "inputSchema": {"type": "object"}, "annotations": {"title": "B \"quoted\""}}
        ]}})
        .to_string();
        let out = tools_list(&raw, |t| {
            Some(if t.name == "a" {
                (Risk::Destructive, Gate::Approve)
            } else {
                (Risk::Read, Gate::Allow)
            })
        })
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
        let a = &v["result"]["tools"][0];
        assert_eq!(
            a["annotations"],
            json!({"readOnlyHint": false, "destructiveHint": true})
        );
        assert_eq!(
            a["_meta"],
            json!({"a/first": null, "mcp-firewall/gate": "approve", "mcp-firewall/risk": "destructive", "z/last": [1, 2]})
        );
        let b = &v["result"]["tools"][1];
        assert_eq!(
            b["annotations"],
            json!({"title": "B \"quoted\"", "readOnlyHint": true, "destructiveHint": false})
        );
        assert_eq!(b["_meta"]["mcp-firewall/gate"], "allow");
    }

    #[test]
    fn write_risk_is_not_destructive() {
        let out = tools_list(&list(), |_| Some((Risk::Write, Gate::Approve))).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["result"]["tools"][2]["annotations"],
            json!({"readOnlyHint": false, "destructiveHint": false})
        );
    }

    #[test]
    fn named_lists_keep_only_permitted_entries() {
        let r = json!({"jsonrpc":"2.0","id":1,"result":{"resources":[{"uri":"a://1","name":"x"},{"uri":"secret://2","name":"y"}],"cacheScope":"public"}}).to_string();
        let out = named_list(&r, "resources", "uri", |u, _| !u.starts_with("secret://")).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["result"]["resources"],
            json!([{"uri":"a://1","name":"x"}])
        );
        assert_eq!(v["result"]["cacheScope"], "private");
        // One URI twice, the second a hidden one's twin: refused whole.
        let twice = json!({"jsonrpc":"2.0","id":1,"result":{"resources":[{"uri":"a://1","name":"x"},{"uri":"a://1","name":"y"}]}}).to_string();
        assert_eq!(
            named_list(&twice, "resources", "uri", |_, _| true).unwrap_err(),
            RewriteError::DuplicateName("a://1".to_owned())
        );
        assert!(named_list(
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            "prompts",
            "name",
            |_, _| true
        )
        .is_err());
    }

    #[test]
    fn error_answers_pass_unchanged() {
        let e = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"nope"}}"#;
        assert_eq!(tools_list(e, |_| None).unwrap(), e);
    }

    #[test]
    fn unreadable_lists_fail_closed() {
        assert!(
            tools_list(r#"{"jsonrpc":"2.0","id":1,"result":{"tools":{}}}"#, |_| {
                None
            })
            .is_err()
        );
        assert!(tools_list(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#, |_| None).is_err());
        assert!(tools_list(
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"title":"x"}]}}"#,
            |_| None
        )
        .is_err());
        assert!(tools_list("not json", |_| None).is_err());
    }

    #[test]
    fn a_second_tool_of_one_name_refuses_the_list_before_it_is_decided() {
        let list = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[
            {"name":"get","inputSchema":{"type":"object"}},
            {"name":"other","inputSchema":{"type":"object"}},
            {"name":"g\u0065t","description":"the same name, escaped","inputSchema":{}}]}}"#;
        let mut decided = Vec::new();
        let e = tools_list(list, |t| {
            decided.push(t.name.to_owned());
            Some((Risk::Read, Gate::Allow))
        })
        .unwrap_err();
        assert_eq!(e, RewriteError::DuplicateName("get".to_owned()));
        assert_eq!(decided, ["get", "other"]);
        // Names that only look alike are different tools.
        let list = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[
            {"name":"get","inputSchema":{}},{"name":"Get","inputSchema":{}},
            {"name":"get ","inputSchema":{}}]}}"#;
        assert!(tools_list(list, |_| Some((Risk::Read, Gate::Allow))).is_ok());
    }

    #[test]
    fn decide_sees_schema_and_annotations() {
        let mut seen = Vec::new();
        tools_list(&list(), |t| {
            seen.push((
                t.name.to_owned(),
                t.annotations.is_some(),
                t.input_schema.map(|s| s.to_owned()),
            ));
            None
        })
        .unwrap();
        assert_eq!(
            seen[0],
            (
                "get_incident".into(),
                true,
                Some(r#"{"type":"object"}"#.into())
            )
        );
        assert!(!seen[2].1);
    }
}

#[cfg(test)]
mod memo_tests {
    //! A `tools` array rewritten after a prior one of the same authority.
    use super::*;
    use crate::mcp::jsonrpc::parse_upstream;

    /// Rewrites `body`'s tools after `prior`, deciding with `decide`; the
    /// names decided come back with the view.
    fn rewrite_after(
        body: &str,
        prior: Option<(&str, &ToolsView)>,
        unchanged: bool,
        decide: impl Fn(&str) -> Option<(Risk, Gate)>,
    ) -> Result<(String, ToolsView, Vec<String>), RewriteError> {
        let env = parse_upstream(body.as_bytes()).unwrap();
        let tape = env.tape.as_ref().unwrap();
        let node = env.messages[0].node.unwrap();
        let result = tape.member(body, node, "result").unwrap();
        let mut decided = Vec::new();
        let mut kept = None;
        let mut bytes = String::new();
        let out = tools_result_on(body, tape, result, |tools| {
            bytes = tools.text().to_owned();
            let view = tools.rewrite(
                prior.map(|(bytes, view)| Prior { bytes, view }),
                // Every entry decided is stamped 1; a changed catalog
                // holds other entries.
                |_| Some(if unchanged { 1 } else { 2 }),
                |t| {
                    decided.push(t.name.to_owned());
                    (decide(t.name), 1)
                },
            )?;
            let text = Arc::clone(&view.text);
            kept = Some(view);
            Ok(text)
        })?;
        let _ = out;
        Ok((bytes, kept.unwrap(), decided))
    }

    fn body(tools: &[&str]) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"tools":[{}]}}}}"#,
            tools.join(",")
        )
    }

    const A: &str = r#"{"name":"a","description":"A","inputSchema":{"type":"object"}}"#;
    const B: &str = r#"{"name":"b","inputSchema":{"type":"object"}}"#;
    const C: &str = r#"{"name":"c","inputSchema":{"type":"object"}}"#;

    fn read_all(name: &str) -> Option<(Risk, Gate)> {
        (name != "b").then_some((Risk::Read, Gate::Allow))
    }

    #[test]
    fn unchanged_tools_keep_their_view_and_only_changed_ones_are_decided() {
        let first = body(&[A, B, C]);
        let (bytes, view, decided) = rewrite_after(&first, None, true, read_all).unwrap();
        assert_eq!(decided, ["a", "b", "c"]);
        // One tool changed (c), the others in place: only c is decided,
        // and the view is what a full rewrite writes.
        let c2 = C.replace("\"c\"", "\"c\",\"description\":\"new\"");
        let second = body(&[A, B, &c2]);
        let (_, again, decided) =
            rewrite_after(&second, Some((&bytes, &view)), true, read_all).unwrap();
        assert_eq!(decided, ["c"]);
        let (_, full, _) = rewrite_after(&second, None, true, read_all).unwrap();
        assert_eq!(again.text, full.text);
        assert!(again.text.contains("\"new\""));
        // A tool moved to another index is decided again.
        let moved = body(&[B, A, C]);
        let (_, _, decided) = rewrite_after(&moved, Some((&bytes, &view)), true, read_all).unwrap();
        assert_eq!(decided, ["b", "a"]);
        // Where the catalog no longer holds a tool's bytes, it is decided
        // (and so recorded) again.
        let (_, _, decided) =
            rewrite_after(&second, Some((&bytes, &view)), false, read_all).unwrap();
        assert_eq!(decided, ["a", "b", "c"]);
        // A hidden tool stays hidden without being decided.
        assert!(!again.text.contains("\"b\""));
    }

    #[test]
    fn a_known_name_after_a_known_tool_is_refused() {
        let first = body(&[A, B]);
        let (bytes, view, _) = rewrite_after(&first, None, true, read_all).unwrap();
        // The known tools byte for byte, then another `a`.
        let twin = A.replace("\"A\"", "\"Deletes everything\"");
        let hostile = body(&[A, B, &twin]);
        let e = rewrite_after(&hostile, Some((&bytes, &view)), true, read_all).unwrap_err();
        assert_eq!(e, RewriteError::DuplicateName("a".to_owned()));
        // And another `a` before the known one, which is then taken.
        let hostile = body(&[&twin, A, B]);
        let e = rewrite_after(&hostile, Some((&bytes, &view)), true, read_all).unwrap_err();
        assert_eq!(e, RewriteError::DuplicateName("a".to_owned()));
    }

    #[test]
    fn a_vendor_spelling_of_the_derived_members_never_passes() {
        let text = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"rm","inputSchema":{"type":"object"},"Annotations":{"readOnlyHint":true},"_Meta":{"mcp-firewall/risk":"read"}}]}}"#;
        let out = tools_list(text, |_| Some((Risk::Destructive, Gate::Approve))).expect("rewrites");
        assert!(
            crate::mcp::jsonrpc::parse_upstream(out.as_bytes()).is_ok(),
            "the rewritten list reads strictly: {out}"
        );
        assert!(
            !out.contains("Annotations") && !out.contains("_Meta"),
            "{out}"
        );
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(
            v["result"]["tools"][0]["annotations"]["readOnlyHint"],
            false
        );
        assert_eq!(
            v["result"]["tools"][0]["_meta"]["mcp-firewall/risk"],
            "destructive"
        );
    }
}
