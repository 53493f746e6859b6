//! The workloads: what each request of a scenario looks like (route, body,
//! token pool, protocol revision) and what answer it must get from a plain
//! target (direct, nginx: the upstream answers everything) and from the
//! firewall (which decides).
//!
//! Invariants:
//! - bodies are rendered once per run and shared (`Bytes`); the JSON-RPC id
//!   is fixed, since the upstream only echoes it;
//! - single messages speak 2025-11-25 (`MCP-Protocol-Version` header), the
//!   batch 2025-03-26 (no header: batches exist only there);
//! - arguments satisfy the catalog's input schemas, so only the policy
//!   decides (the firewall validates arguments before gates);
//! - a mix is a fixed interleaved sequence, so every run sends the same
//!   proportions in the same order;
//! - `list` and `list-cold` send the same request and expect the same tools;
//!   only the upstream route differs (`list-cold`'s answers, and the
//!   `tools` arrays in them, are never byte-identical: one tool changes,
//!   so the firewall cannot reuse a remembered view);
//! - `streams` and `scale` say how their firewall instances are started
//!   ([`Instances`]): memory per stream and growth with runs are measured
//!   from a fresh instance, not one every earlier cell has used.

use std::fmt;

use bytes::Bytes;
use http::HeaderValue;
use serde_json::{json, Value};

use crate::catalog::{Catalog, CALL_TOOL, DENIED_TOOL, GATED_TOOL, LIST_TOOL};
use crate::outcome::Expect;

/// The firewall's code for a call refused by a condition.
pub const DENIED: i32 = -31001;
/// The firewall's code for a call behind an `approve` gate.
pub const APPROVAL_REQUIRED: i32 = -31002;
/// The revision single messages speak.
pub const REVISION: &str = "2025-11-25";

/// A scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scenario {
    /// An allowed read `tools/call`, JSON answer.
    Call,
    /// The same, answered as SSE.
    CallSse,
    /// `tools/list` of the whole catalog, filtered by the firewall.
    List,
    /// A call refused by a condition (`-31001`).
    Denied,
    /// A write call behind an `approve` gate (`-31002`).
    Gated,
    /// Calls of runs capped at five steps (skipped past the cap once
    /// budgets exist; allowed today).
    StepCapped,
    /// A 2025-03-26 batch: two reads, one denied call, one ping.
    Batch,
    /// A realistic mix of all of the above plus pings.
    Mix,
    /// Allowed calls whose SSE answer is held open (memory at many
    /// concurrent streams), on firewall instances started fresh for each
    /// round.
    Streams,
    /// `tools/list` as in [`Scenario::List`], but the upstream's result
    /// differs on every request (a counter in its `_meta`), so the firewall
    /// rebuilds the filtered view every time (its remembered view is cold).
    ListCold,
    /// Allowed reads of many distinct runs (their own token pool, a few
    /// calls each) while thousands of idle client connections are held open
    /// to the target, on firewall instances started fresh for the cell.
    Scale,
}

/// How the firewall instances of a scenario's cells are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instances {
    /// One long-lived instance per firewall target, shared with every other
    /// cell of the run that uses it.
    Shared,
    /// A fresh instance per round, stopped after it.
    FreshPerRound,
    /// A fresh instance per cell, kept over its rounds, stopped after it.
    FreshPerCell,
}

/// Which upstream route a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// JSON answers.
    Json,
    /// SSE answers.
    Sse,
    /// Held SSE answers.
    Hold,
    /// JSON answers whose `tools/list` result differs on every request.
    Fresh,
}

/// Which token pool a request draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// `bench-reader`.
    Reader,
    /// `bench-operator`.
    Operator,
    /// `bench-capped`.
    Capped,
    /// `bench-reader` tokens of the scale scenario's own pool (one run
    /// each, minted only when a scale cell is planned).
    Scale,
}

/// One kind of request.
#[derive(Debug, Clone)]
pub struct Template {
    /// Short name (mix breakdowns).
    pub label: &'static str,
    /// Route.
    pub route: Route,
    /// The JSON-RPC body.
    pub body: Bytes,
    /// Token pool.
    pub pool: Pool,
    /// `MCP-Protocol-Version`, if sent.
    pub version: Option<HeaderValue>,
    /// What direct and nginx must answer.
    pub plain: Expect,
    /// What the firewall must answer.
    pub firewall: Expect,
}

/// A scenario's requests, ready to send.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The scenario.
    pub scenario: Scenario,
    /// Its request kinds.
    pub templates: Vec<Template>,
    sequence: Vec<u8>,
}

/// An unknown scenario name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scenario {0:?} (known: call, call-sse, list, list-cold, denied, gated, step-capped, batch, mix, streams, scale)")]
pub struct UnknownScenario(pub String);

// === impl Scenario ===

impl Scenario {
    /// Every scenario, in report order.
    pub const ALL: [Scenario; 11] = [
        Scenario::Call,
        Scenario::CallSse,
        Scenario::List,
        Scenario::ListCold,
        Scenario::Denied,
        Scenario::Gated,
        Scenario::StepCapped,
        Scenario::Batch,
        Scenario::Mix,
        Scenario::Streams,
        Scenario::Scale,
    ];

    /// Its command-line and report name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Call => "call",
            Scenario::CallSse => "call-sse",
            Scenario::List => "list",
            Scenario::Denied => "denied",
            Scenario::Gated => "gated",
            Scenario::StepCapped => "step-capped",
            Scenario::Batch => "batch",
            Scenario::Mix => "mix",
            Scenario::Streams => "streams",
            Scenario::ListCold => "list-cold",
            Scenario::Scale => "scale",
        }
    }

    /// How reports name it: the two lists say which view they measure.
    pub fn label(self) -> &'static str {
        label(self.name())
    }

    /// How its cells' firewall instances are started.
    pub fn instances(self) -> Instances {
        match self {
            Scenario::Streams => Instances::FreshPerRound,
            Scenario::Scale => Instances::FreshPerCell,
            _ => Instances::Shared,
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Result<Scenario, UnknownScenario> {
        Scenario::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| UnknownScenario(s.to_owned()))
    }
}

/// The report label of a scenario name (unknown names as they are).
pub fn label(name: &str) -> &str {
    match name {
        "list" => "list (warm view cache)",
        "list-cold" => "list-cold (view rebuilt per request)",
        other => other,
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every route.
pub const ROUTES: [Route; 4] = [Route::Json, Route::Sse, Route::Hold, Route::Fresh];

// === impl Route ===

impl Route {
    /// The request path (identical on every target).
    pub fn path(self) -> &'static str {
        match self {
            Route::Json => crate::upstream::ROUTE_JSON,
            Route::Sse => crate::upstream::ROUTE_SSE,
            Route::Hold => crate::upstream::ROUTE_HOLD,
            Route::Fresh => crate::upstream::ROUTE_FRESH,
        }
    }

    /// Its index in [`ROUTES`].
    pub fn index(self) -> usize {
        match self {
            Route::Json => 0,
            Route::Sse => 1,
            Route::Hold => 2,
            Route::Fresh => 3,
        }
    }
}

// === impl Workload ===

impl Workload {
    /// The workload of `scenario` against `catalog`.
    pub fn new(scenario: Scenario, catalog: &Catalog) -> Workload {
        let t = Templates::new(catalog);
        let (templates, weights): (Vec<Template>, Vec<u32>) = match scenario {
            Scenario::Call => (vec![t.call], vec![1]),
            Scenario::CallSse => (vec![t.call_sse], vec![1]),
            Scenario::List => (vec![t.list], vec![1]),
            Scenario::Denied => (vec![t.denied], vec![1]),
            Scenario::Gated => (vec![t.gated], vec![1]),
            Scenario::StepCapped => (vec![t.capped], vec![1]),
            Scenario::Batch => (vec![t.batch], vec![1]),
            Scenario::Streams => (vec![t.hold], vec![1]),
            Scenario::ListCold => (
                vec![Template {
                    label: "list-cold",
                    route: Route::Fresh,
                    ..t.list
                }],
                vec![1],
            ),
            Scenario::Scale => (
                vec![Template {
                    label: "scale",
                    pool: Pool::Scale,
                    ..t.call
                }],
                vec![1],
            ),
            // An agent lists once, then mostly reads; a few calls are
            // refused or wait for approval, some runs hit their cap.
            Scenario::Mix => (
                vec![
                    t.call, t.call_sse, t.list, t.denied, t.gated, t.capped, t.batch, t.ping,
                ],
                vec![50, 10, 5, 5, 5, 10, 5, 10],
            ),
        };
        Workload {
            scenario,
            templates,
            sequence: interleave(&weights),
        }
    }

    /// The template of request number `ticket`.
    pub fn pick(&self, ticket: u64) -> (usize, &Template) {
        let i = self
            .sequence
            .get((ticket % self.sequence.len().max(1) as u64) as usize)
            .map_or(0, |&i| usize::from(i));
        (i, &self.templates[i.min(self.templates.len() - 1)])
    }
}

/// A sequence in which index `i` appears `weights[i]` times, spread evenly
/// (smooth weighted round robin).
fn interleave(weights: &[u32]) -> Vec<u8> {
    let total: i64 = weights.iter().map(|&w| i64::from(w)).sum();
    let mut current = vec![0i64; weights.len()];
    let mut out = Vec::with_capacity(total.max(0) as usize);
    for _ in 0..total {
        for (c, &w) in current.iter_mut().zip(weights) {
            *c += i64::from(w);
        }
        let Some((best, _)) = current
            .iter()
            .enumerate()
            .max_by_key(|(i, &c)| (c, -(*i as i64)))
        else {
            break;
        };
        current[best] -= total;
        out.push(u8::try_from(best).unwrap_or(0));
    }
    out
}

/// Arguments of the allowed call (pass the namespace condition).
pub fn call_arguments() -> Value {
    json!({ "service": "checkout", "namespace": "prod" })
}

/// Arguments that fail the region condition.
pub fn denied_arguments() -> Value {
    json!({ "service": "checkout", "namespace": "prod", "region": "ap-south-1" })
}

/// Arguments of the gated write.
pub fn gated_arguments() -> Value {
    json!({ "service": "checkout", "namespace": "prod", "note": "Customer-facing 5xx on checkout since 09:12 UTC; paging the owning team." })
}

/// The body of a JSON-RPC `ping` (what an idle connection of the scale
/// scenario sends before it falls silent).
pub fn ping_body() -> Bytes {
    body(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
}

fn call(id: u32, tool: &str, arguments: Value) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": { "name": tool, "arguments": arguments, "_meta": { "progressToken": format!("p-{id}") } }
    })
}

fn body(v: &Value) -> Bytes {
    Bytes::from(v.to_string())
}

struct Templates {
    call: Template,
    call_sse: Template,
    hold: Template,
    list: Template,
    denied: Template,
    gated: Template,
    capped: Template,
    batch: Template,
    ping: Template,
}

impl Templates {
    fn new(catalog: &Catalog) -> Templates {
        let version = Some(HeaderValue::from_static(REVISION));
        let single = |label, route, v: Value, pool, firewall| Template {
            label,
            route,
            body: body(&v),
            pool,
            version: version.clone(),
            plain: Expect::Result,
            firewall,
        };
        let call_body = call(1, CALL_TOOL, call_arguments());
        let all = u32::try_from(catalog.tools.len()).unwrap_or(u32::MAX);
        let reads = u32::try_from(catalog.reads()).unwrap_or(u32::MAX);
        Templates {
            call: single(
                "call",
                Route::Json,
                call_body.clone(),
                Pool::Reader,
                Expect::Result,
            ),
            call_sse: single(
                "call-sse",
                Route::Sse,
                call_body.clone(),
                Pool::Reader,
                Expect::Result,
            ),
            hold: single(
                "hold",
                Route::Hold,
                call_body.clone(),
                Pool::Reader,
                Expect::Result,
            ),
            list: Template {
                plain: Expect::Tools(all),
                ..single(
                    "list",
                    Route::Json,
                    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}),
                    Pool::Reader,
                    Expect::Tools(reads),
                )
            },
            denied: single(
                "denied",
                Route::Json,
                call(1, DENIED_TOOL, denied_arguments()),
                Pool::Reader,
                Expect::Error(DENIED),
            ),
            gated: single(
                "gated",
                Route::Json,
                call(1, GATED_TOOL, gated_arguments()),
                Pool::Operator,
                Expect::Error(APPROVAL_REQUIRED),
            ),
            capped: single(
                "step-capped",
                Route::Json,
                call_body,
                Pool::Capped,
                Expect::ResultOrSkipped,
            ),
            batch: Template {
                label: "batch",
                route: Route::Json,
                body: body(&json!([
                    call(1, CALL_TOOL, call_arguments()),
                    call(2, LIST_TOOL, json!({ "service": "checkout", "namespace": "prod", "limit": 20 })),
                    call(3, DENIED_TOOL, denied_arguments()),
                    { "jsonrpc": "2.0", "id": 4, "method": "ping" },
                ])),
                pool: Pool::Reader,
                version: None,
                plain: Expect::Batch {
                    results: 4,
                    errors: 0,
                },
                firewall: Expect::Batch {
                    results: 3,
                    errors: 1,
                },
            },
            ping: single(
                "ping",
                Route::Json,
                json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
                Pool::Reader,
                Expect::Result,
            ),
        }
    }
}

#[cfg(test)]
#[path = "scenario_tests.rs"]
mod tests;
