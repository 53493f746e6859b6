//! The canned upstream's tool catalog: names, risk classes, realistic input
//! schemas, and the pre-rendered `tools/list` and `tools/call` results.
//!
//! Invariants:
//! - the catalog is a pure function of the tool count and the result size, so
//!   the upstream, the scenarios (which must know how many tools a role may
//!   see) and the bench policies agree without talking to each other;
//! - classes come in the proportions 50 % read, 30 % write, 15 % destructive,
//!   5 % unclassified, interleaved, and the bench policy (`bench/policies/`)
//!   classifies them by verb prefix exactly as [`Class`] says;
//! - the tools the scenarios call ([`CALL_TOOL`], [`LIST_TOOL`],
//!   [`DENIED_TOOL`], [`GATED_TOOL`]) exist for every allowed count;
//! - rendered JSON contains no newline (it goes into one SSE `data:` line) and
//!   never the text `skipped` or the key `"error"` (the load generator
//!   classifies answers by scanning for them).

use std::fmt::Write as _;

/// Fewest tools a catalog may have: room for every scenario tool.
pub const MIN_TOOLS: usize = 10;
/// Most tools a catalog may have (names stay unique well beyond this).
pub const MAX_TOOLS: usize = 2_000;

/// The read tool of the allowed-call scenarios (has a passing condition).
pub const CALL_TOOL: &str = "get_service";
/// A second read tool, used inside batches.
pub const LIST_TOOL: &str = "list_incidents";
/// A read tool whose condition the denied scenario fails (`region`).
pub const DENIED_TOOL: &str = "query_metrics";
/// A write tool behind the `approve` gate.
pub const GATED_TOOL: &str = "create_ticket";

const READ_VERBS: [&str; 5] = ["get", "list", "search", "describe", "query"];
const WRITE_VERBS: [&str; 3] = ["create", "update", "annotate"];
const DESTRUCTIVE_VERBS: [&str; 3] = ["delete", "restart", "rollback"];
const NOUNS: [&str; 10] = [
    "incident",
    "deployment",
    "service",
    "metrics",
    "logs",
    "alert",
    "runbook",
    "dashboard",
    "trace",
    "ticket",
];

/// How the bench policy classifies a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `get_*`, `list_*`, `search_*`, `describe_*`, `query_*`: risk read.
    Read,
    /// `create_*`, `update_*`, `annotate_*`: risk write.
    Write,
    /// `delete_*`, `restart_*`, `rollback_*`: risk destructive.
    Destructive,
    /// `vendor_*`: named by no policy rule, so destructive by default, while
    /// its vendor annotations claim it only reads.
    Unclassified,
}

/// One tool of the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// Its class under the bench policy.
    pub class: Class,
}

/// Why a catalog cannot be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// The tool count is outside [`MIN_TOOLS`]..=[`MAX_TOOLS`].
    #[error("tool count {count} is outside {min}..={max}")]
    ToolCount {
        /// Requested count.
        count: usize,
        /// Smallest allowed.
        min: usize,
        /// Largest allowed.
        max: usize,
    },
    /// The result size is too small to hold a `tools/call` result.
    #[error("result size {bytes} B is below the {min} B a tools/call result needs")]
    ResultSize {
        /// Requested bytes.
        bytes: usize,
        /// Smallest allowed.
        min: usize,
    },
}

/// The whole catalog with its rendered answers.
#[derive(Debug, Clone)]
pub struct Catalog {
    /// The tools in list order.
    pub tools: Vec<Tool>,
    /// `{"tools":[...]}`: the `result` of `tools/list`.
    pub list_result: String,
    /// The `result` of every `tools/call`.
    pub call_result: String,
}

// === impl Catalog ===

impl Catalog {
    /// Builds the catalog of `count` tools whose `tools/call` result is about
    /// `result_bytes` long.
    pub fn new(count: usize, result_bytes: usize) -> Result<Catalog, CatalogError> {
        if !(MIN_TOOLS..=MAX_TOOLS).contains(&count) {
            return Err(CatalogError::ToolCount {
                count,
                min: MIN_TOOLS,
                max: MAX_TOOLS,
            });
        }
        let tools = tools(count);
        let mut list_result = String::with_capacity(count * 700);
        list_result.push_str("{\"tools\":[");
        for (i, t) in tools.iter().enumerate() {
            if i > 0 {
                list_result.push(',');
            }
            render_tool(t, &mut list_result);
        }
        list_result.push_str("]}");
        let call_result = call_result(result_bytes)?;
        Ok(Catalog {
            tools,
            list_result,
            call_result,
        })
    }

    /// How many tools a role that may use only `read` tools sees.
    pub fn reads(&self) -> usize {
        self.tools.iter().filter(|t| t.class == Class::Read).count()
    }
}

/// The tool names and classes, interleaved so any prefix has every class.
fn tools(count: usize) -> Vec<Tool> {
    let reads = count / 2;
    let writes = count * 3 / 10;
    let destructive = count * 3 / 20;
    let unclassified = count - reads - writes - destructive;
    let mut by_class = [
        (
            Class::Read,
            names(&READ_VERBS, &[CALL_TOOL, DENIED_TOOL, LIST_TOOL], reads),
        ),
        (Class::Write, names(&WRITE_VERBS, &[GATED_TOOL], writes)),
        (
            Class::Destructive,
            names(&DESTRUCTIVE_VERBS, &[], destructive),
        ),
        (
            Class::Unclassified,
            (0..unclassified)
                .map(|i| format!("vendor_sync_{i}"))
                .collect(),
        ),
    ]
    .map(|(class, names)| (class, names.into_iter()));
    // Round-robin weighted by the class's share: reads come up most often.
    let mut out = Vec::with_capacity(count);
    let totals = [reads, writes, destructive, unclassified];
    let mut taken = [0usize; 4];
    while out.len() < count {
        // The class furthest behind its share goes next.
        let Some(next) = (0..4).filter(|&c| taken[c] < totals[c]).min_by(|&a, &b| {
            let ka = (taken[a] as u64 + 1) * totals[b] as u64;
            let kb = (taken[b] as u64 + 1) * totals[a] as u64;
            ka.cmp(&kb)
        }) else {
            break;
        };
        let (class, names) = &mut by_class[next];
        if let Some(name) = names.next() {
            out.push(Tool {
                name,
                class: *class,
            });
        }
        taken[next] += 1;
    }
    out
}

/// `count` distinct `verb_noun` names, `first` leading.
fn names(verbs: &[&str], first: &[&str], count: usize) -> Vec<String> {
    let mut v: Vec<String> = first.iter().map(|s| (*s).to_owned()).collect();
    let mut j = 0usize;
    while v.len() < count {
        let name = compose(verbs[j % verbs.len()], j / verbs.len());
        if !v.contains(&name) {
            v.push(name);
        }
        j += 1;
    }
    v.truncate(count);
    v
}

fn noun(i: usize) -> String {
    let base = NOUNS[i % NOUNS.len()];
    match i / NOUNS.len() {
        0 => base.to_owned(),
        n => format!("{base}_{n}"),
    }
}

fn compose(verb: &str, noun_index: usize) -> String {
    let n = noun(noun_index);
    let plural = matches!(verb, "list" | "search") && !n.ends_with('s');
    if plural {
        format!("{verb}_{n}s")
    } else {
        format!("{verb}_{n}")
    }
}

/// Appends one tool object: name, title, description, input schema and the
/// vendor's annotations (honest, except for the unclassified ones).
fn render_tool(t: &Tool, out: &mut String) {
    let (verb, object) = t.name.split_once('_').unwrap_or((t.name.as_str(), "item"));
    let object = object.replace('_', " ");
    let mut letters = verb.chars();
    let title = match letters.next() {
        Some(first) => format!(
            "{}{} {object}",
            first.to_ascii_uppercase(),
            letters.as_str()
        ),
        None => object.clone(),
    };
    let (description, annotations, extra_props, required) = match t.class {
        Class::Read => (
            format!("{title} for one service and namespace. Returns a compact summary with status, owners and the most recent events; read-only, safe to call repeatedly."),
            "{\"readOnlyHint\":true,\"openWorldHint\":false}",
            "",
            "[\"service\"]",
        ),
        Class::Write => (
            format!("{title} in the incident tracker. Records who asked and why; visible to the on-call rotation and reversible by an operator."),
            "{\"readOnlyHint\":false,\"destructiveHint\":false,\"idempotentHint\":false,\"openWorldHint\":false}",
            ",\"note\":{\"type\":\"string\",\"description\":\"What to record, in plain text\",\"maxLength\":2000}",
            "[\"service\",\"note\"]",
        ),
        Class::Destructive => (
            format!("{title} in production. Takes effect immediately and cannot be undone from this tool; preview first and state the reason."),
            "{\"readOnlyHint\":false,\"destructiveHint\":true,\"openWorldHint\":false}",
            ",\"reason\":{\"type\":\"string\",\"description\":\"Why this is necessary\",\"minLength\":10,\"maxLength\":500},\"confirm\":{\"type\":\"boolean\",\"description\":\"Must be true\"}",
            "[\"service\",\"reason\",\"confirm\"]",
        ),
        Class::Unclassified => (
            format!("{title} with the vendor's control plane. Synchronises state both ways; the vendor documents it as harmless."),
            "{\"readOnlyHint\":true}",
            "",
            "[\"service\"]",
        ),
    };
    // Writing into a String cannot fail.
    let _ = write!(
        out,
        "{{\"name\":\"{name}\",\"title\":\"{title}\",\"description\":\"{description}\",\
\"inputSchema\":{{\"type\":\"object\",\"properties\":{{\
\"service\":{{\"type\":\"string\",\"description\":\"Service name as registered in the service catalog\",\"enum\":[\"checkout\",\"search\",\"payments\",\"identity\",\"inventory\"]}},\
\"namespace\":{{\"type\":\"string\",\"description\":\"Kubernetes namespace of the service\",\"enum\":[\"prod\",\"staging\",\"dev\"]}},\
\"region\":{{\"type\":\"string\",\"description\":\"Cloud region, for example eu-west-1\",\"pattern\":\"^[a-z]{{2}}-[a-z]+-[0-9]$\"}},\
\"limit\":{{\"type\":\"integer\",\"description\":\"Most items to return\",\"minimum\":1,\"maximum\":500,\"default\":50}}{extra_props}}},\
\"required\":{required},\"additionalProperties\":false}},\
\"annotations\":{annotations}}}",
        name = t.name,
    );
}

/// A `CallToolResult` of about `bytes` bytes: one text block plus a small
/// structured summary, the shape real read tools answer with.
fn call_result(bytes: usize) -> Result<String, CatalogError> {
    const HEAD: &str = "{\"content\":[{\"type\":\"text\",\"text\":\"";
    const TAIL: &str = "\"}],\"structuredContent\":{\"service\":\"checkout\",\"namespace\":\"prod\",\"status\":\"healthy\"},\"isError\":false}";
    let min = HEAD.len() + TAIL.len() + 16;
    if bytes < min {
        return Err(CatalogError::ResultSize { bytes, min });
    }
    const FILLER: &str = "checkout/prod healthy; p99 182 ms; 0.02 % 5xx over 15 min; 12 pods ready; last deploy dep-1042 at 09:12 UTC by alice; no open incidents. ";
    let want = bytes - HEAD.len() - TAIL.len();
    let mut text = String::with_capacity(want);
    while text.len() < want {
        let room = want - text.len();
        // FILLER is ASCII, so every prefix is on a char boundary.
        text.push_str(FILLER.get(..room.min(FILLER.len())).unwrap_or(FILLER));
    }
    Ok(format!("{HEAD}{text}{TAIL}"))
}

#[cfg(test)]
#[path = "catalog_tests.rs"]
mod tests;
