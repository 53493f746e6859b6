//! What `mcp-bench load` will do: the scenario file (TOML) merged with the
//! command line, checked against the safety bounds, and the pieces the
//! drivers read (the weighted mix, argument templates, the arrival profile).
//!
//! Invariants: a plan is fully validated before anything is sent (a typo in
//! a scenario is an error, not a silent default); rate, concurrency and
//! duration never exceed their bounds; the mix is expanded into a fixed
//! interleaved sequence, so every run sends the same proportions.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a plan is refused.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The scenario file cannot be read or parsed.
    #[error("scenario {path}: {error}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        error: String,
    },
    /// A value is out of range or contradicts another.
    #[error("{0}")]
    Invalid(String),
}

/// The protocol era to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Era {
    /// `server/discover` first; the `initialize` handshake when it fails.
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// Sessions (`initialize`, `Mcp-Session-Id`), 2025-03-26 (batches).
    #[serde(rename = "2025-03-26")]
    V20250326,
    /// Sessions, 2025-11-25.
    #[serde(rename = "2025-11-25")]
    V20251125,
    /// Stateless, 2026-07-28.
    #[serde(rename = "2026-07-28")]
    V20260728,
}

impl Era {
    /// Parses the `--era` value.
    pub fn parse(s: &str) -> Result<Era, PlanError> {
        serde_json::from_value(Value::String(s.to_owned())).map_err(|_| {
            PlanError::Invalid(format!(
                "--era {s:?}: expected auto, 2025-03-26, 2025-11-25 or 2026-07-28"
            ))
        })
    }

    /// The revision string (none for `auto`).
    pub fn version(self) -> Option<&'static str> {
        match self {
            Era::Auto => None,
            Era::V20250326 => Some("2025-03-26"),
            Era::V20251125 => Some("2025-11-25"),
            Era::V20260728 => Some("2026-07-28"),
        }
    }
}

/// One argument of a call, as templated in the scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ArgTemplate {
    /// `{ pick = [...] }`: one of the values, round robin per user.
    Pick {
        /// The values.
        pick: Vec<Value>,
    },
    /// `{ sequence = true, prefix = "n-", start = 1 }`: a counter, as a
    /// number, or as a string when a prefix is given.
    Sequence {
        /// Must be `true`.
        sequence: bool,
        /// Text before the number (a string then).
        #[serde(default)]
        prefix: Option<String>,
        /// The first number.
        #[serde(default)]
        start: u64,
    },
    /// Any other value: sent as it is.
    Fixed(Value),
}

impl ArgTemplate {
    /// The value for the `n`th call of this item.
    pub fn render(&self, n: u64) -> Value {
        match self {
            ArgTemplate::Pick { pick } if !pick.is_empty() => {
                pick[(n as usize) % pick.len()].clone()
            }
            ArgTemplate::Pick { .. } => Value::Null,
            ArgTemplate::Sequence { prefix, start, .. } => match prefix {
                Some(p) => Value::String(format!("{p}{}", start + n)),
                None => Value::from(start + n),
            },
            ArgTemplate::Fixed(v) => v.clone(),
        }
    }
}

/// What one item of the mix sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// `tools/list` (every page).
    ToolsList,
    /// `tools/call` of `tool` (or of a tool drawn from the target's list).
    ToolsCall {
        /// The tool; `None`: drawn from the target's `tools/list`.
        tool: Option<String>,
        /// Argument templates; missing ones are filled from the schema.
        arguments: BTreeMap<String, ArgTemplate>,
    },
    /// `size` calls in one JSON-RPC batch (2025-03-26 only).
    Batch {
        /// The tool; `None`: drawn.
        tool: Option<String>,
        /// Calls per batch.
        size: usize,
        /// Argument templates.
        arguments: BTreeMap<String, ArgTemplate>,
    },
    /// A server stream held open for `hold` (GET on the session, or
    /// `subscriptions/listen` on 2026-07-28).
    Stream {
        /// How long to hold it.
        hold_ms: u64,
    },
}

impl Action {
    /// A short label for reports.
    pub fn label(&self) -> String {
        match self {
            Action::ToolsList => "tools/list".to_owned(),
            Action::ToolsCall { tool, .. } => {
                format!("tools/call {}", tool.as_deref().unwrap_or("(any)"))
            }
            Action::Batch { size, .. } => format!("batch of {size}"),
            Action::Stream { hold_ms } => format!("stream held {hold_ms} ms"),
        }
    }
}

/// One weighted item of the scenario's `[[mix]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct MixItem {
    #[serde(default = "one")]
    weight: u32,
    /// `tools/list`, `tools/call`, `batch` or `stream`.
    method: String,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    arguments: BTreeMap<String, ArgTemplate>,
    #[serde(default = "default_batch")]
    size: usize,
    #[serde(default)]
    hold: Option<String>,
}

fn one() -> u32 {
    1
}

fn default_batch() -> usize {
    4
}

/// A ramp stage: reach `target` (users, or requests/s in open loop) by the
/// end of `duration`, linearly from the previous stage's target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// How long.
    #[serde(with = "millis")]
    pub duration: Duration,
    /// Users (closed loop) or requests per second (open loop).
    pub target: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct StageFile {
    duration: String,
    target: f64,
}

/// The scenario file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    #[serde(default)]
    era: Option<Era>,
    #[serde(default)]
    vus: Option<usize>,
    #[serde(default)]
    rate: Option<f64>,
    #[serde(default)]
    duration: Option<String>,
    #[serde(default)]
    requests: Option<u64>,
    #[serde(default)]
    think_time: Option<String>,
    #[serde(default)]
    calls_per_run: Option<u64>,
    #[serde(default)]
    stages: Vec<StageFile>,
    #[serde(default)]
    mix: Vec<MixItem>,
}

/// How requests arrive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrival {
    /// Closed loop: `vus` users, each sending its next request when the
    /// last one was answered (and it thought); `stages` ramp the count.
    Closed {
        /// Users (the most any stage reaches).
        vus: usize,
        /// Ramp stages (empty: `vus` for the whole duration).
        stages: Vec<Stage>,
    },
    /// Open loop: requests due at a rate, whatever the answers take;
    /// `users` sessions carry them; `stages` ramp the rate.
    Open {
        /// Requests per second (the most any stage reaches).
        rate: f64,
        /// Users carrying the requests (the most in flight).
        users: usize,
        /// Ramp stages.
        stages: Vec<Stage>,
    },
}

/// The safety bounds (flags with conservative defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bounds {
    /// Most users.
    pub max_vus: usize,
    /// Most requests per second (open loop, and the closed loop's pacing).
    pub max_rate: f64,
    /// Longest run per target.
    #[serde(with = "millis")]
    pub max_duration: Duration,
}

/// Everything a run needs besides targets and identities.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// The era to speak.
    pub era: Era,
    /// How requests arrive.
    pub arrival: Arrival,
    /// Run time per target and round.
    #[serde(with = "millis")]
    pub duration: Duration,
    /// Stop after this many answers per target and round (if set).
    pub requests: Option<u64>,
    /// Pause after each answer (closed loop).
    #[serde(with = "millis")]
    pub think_time: Duration,
    /// Calls a user makes with one run token before taking the next.
    pub calls_per_run: Option<u64>,
    /// The weighted mix, expanded into its interleaved order.
    pub sequence: Vec<Action>,
    /// The mix as given (label, weight), for the report.
    pub mix: Vec<(String, u32)>,
    /// The bounds it was checked against.
    pub bounds: Bounds,
}

/// What the command line says about the plan (each overrides the file).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--era`.
    pub era: Option<Era>,
    /// `--vus`.
    pub vus: Option<usize>,
    /// `--rate`.
    pub rate: Option<f64>,
    /// `--duration`.
    pub duration: Option<Duration>,
    /// `--requests`.
    pub requests: Option<u64>,
    /// `--think`.
    pub think_time: Option<Duration>,
    /// `--calls-per-run`.
    pub calls_per_run: Option<u64>,
    /// `--tool` (a call mix of this one tool when the file names none).
    pub tool: Option<String>,
}

/// Parses `500ms`, `2s`, `1.5s`, `3m`, `1h`, or a number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, PlanError> {
    let t = s.trim();
    let bad = || PlanError::Invalid(format!("{s:?} is not a duration (e.g. 500ms, 30s, 2m)"));
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: f64 = num.trim().parse().map_err(|_| bad())?;
    if !n.is_finite() || n < 0.0 {
        return Err(bad());
    }
    let secs = match unit {
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(bad()),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// Reads `path` (if given) and merges `over`, then checks the bounds.
pub fn build(path: Option<&Path>, over: &Overrides, bounds: Bounds) -> Result<Plan, PlanError> {
    let file: ScenarioFile = match path {
        None => ScenarioFile::default(),
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| PlanError::File {
                path: p.display().to_string(),
                error: e.to_string(),
            })?;
            toml::from_str(&text).map_err(|e| PlanError::File {
                path: p.display().to_string(),
                error: e.to_string(),
            })?
        }
    };
    let era = over.era.or(file.era).unwrap_or_default();
    let stages = file
        .stages
        .iter()
        .map(|s| {
            Ok(Stage {
                duration: parse_duration(&s.duration)?,
                target: s.target,
            })
        })
        .collect::<Result<Vec<_>, PlanError>>()?;
    if stages
        .iter()
        .any(|s| !(s.target >= 0.0 && s.target.is_finite()))
    {
        return Err(PlanError::Invalid("a stage's target must be ≥ 0".into()));
    }
    let staged: Duration = stages.iter().map(|s| s.duration).sum();
    let duration = match (over.duration, &file.duration) {
        (Some(d), _) => d,
        (None, Some(d)) => parse_duration(d)?,
        (None, None) if !stages.is_empty() => staged,
        (None, None) => Duration::from_secs(10),
    };
    if duration.is_zero() {
        return Err(PlanError::Invalid("the duration must be above 0".into()));
    }
    if duration > bounds.max_duration {
        return Err(PlanError::Invalid(format!(
            "a run of {} s exceeds --max-duration {} s",
            duration.as_secs_f64(),
            bounds.max_duration.as_secs_f64()
        )));
    }
    let peak = stages.iter().map(|s| s.target).fold(0.0_f64, f64::max);
    let rate = over.rate.or(file.rate);
    let arrival = match rate {
        Some(r) => {
            let rate = if stages.is_empty() { r } else { peak.max(r) };
            if !(rate > 0.0 && rate.is_finite()) {
                return Err(PlanError::Invalid("--rate must be above 0".into()));
            }
            if rate > bounds.max_rate {
                return Err(PlanError::Invalid(format!(
                    "a rate of {rate}/s exceeds --max-rate {}/s",
                    bounds.max_rate
                )));
            }
            let users = over.vus.or(file.vus).unwrap_or(64);
            Arrival::Open {
                rate,
                users,
                stages: stages.clone(),
            }
        }
        None => {
            let given = over.vus.or(file.vus);
            let vus = match (given, stages.is_empty()) {
                (Some(v), true) => v,
                (Some(v), false) => v.max(peak.ceil() as usize),
                (None, true) => 4,
                (None, false) => peak.ceil() as usize,
            };
            Arrival::Closed {
                vus,
                stages: stages.clone(),
            }
        }
    };
    let users = match &arrival {
        Arrival::Closed { vus, .. } => *vus,
        Arrival::Open { users, .. } => *users,
    };
    if users == 0 {
        return Err(PlanError::Invalid("at least one user".into()));
    }
    if users > bounds.max_vus {
        return Err(PlanError::Invalid(format!(
            "{users} users exceed --max-vus {}",
            bounds.max_vus
        )));
    }
    let think_time = match (over.think_time, &file.think_time) {
        (Some(t), _) => t,
        (None, Some(t)) => parse_duration(t)?,
        (None, None) => Duration::ZERO,
    };
    let mut items = Vec::new();
    for m in &file.mix {
        let action = match m.method.as_str() {
            "tools/list" => Action::ToolsList,
            "tools/call" => Action::ToolsCall {
                tool: m.tool.clone(),
                arguments: m.arguments.clone(),
            },
            "batch" => {
                if m.size == 0 {
                    return Err(PlanError::Invalid("a batch needs size ≥ 1".into()));
                }
                Action::Batch {
                    tool: m.tool.clone(),
                    size: m.size,
                    arguments: m.arguments.clone(),
                }
            }
            "stream" => Action::Stream {
                hold_ms: parse_duration(m.hold.as_deref().unwrap_or("5s"))?.as_millis() as u64,
            },
            other => {
                return Err(PlanError::Invalid(format!(
                    "mix method {other:?}: expected tools/list, tools/call, batch or stream"
                )))
            }
        };
        if m.weight == 0 {
            continue;
        }
        items.push((action, m.weight));
    }
    if items.is_empty() {
        items.push((
            Action::ToolsCall {
                tool: over.tool.clone(),
                arguments: BTreeMap::new(),
            },
            1,
        ));
    }
    let batches = items.iter().any(|(a, _)| matches!(a, Action::Batch { .. }));
    if batches && era != Era::V20250326 {
        return Err(PlanError::Invalid(
            "batches exist only in MCP 2025-03-26: set era = \"2025-03-26\"".into(),
        ));
    }
    let mix = items.iter().map(|(a, w)| (a.label(), *w)).collect();
    Ok(Plan {
        era,
        arrival,
        duration,
        requests: over.requests.or(file.requests),
        think_time,
        calls_per_run: over.calls_per_run.or(file.calls_per_run),
        sequence: interleave(&items),
        mix,
        bounds,
    })
}

/// The weighted items as one sequence, spread evenly (smooth weighted
/// round robin), so a mix of 3:1 sends a b a a, a b a a, ...
fn interleave(items: &[(Action, u32)]) -> Vec<Action> {
    let total: i64 = items.iter().map(|(_, w)| i64::from(*w)).sum();
    let mut current = vec![0_i64; items.len()];
    let mut out = Vec::with_capacity(total as usize);
    for _ in 0..total {
        for (c, (_, w)) in current.iter_mut().zip(items) {
            *c += i64::from(*w);
        }
        let Some((best, _)) = current
            .iter()
            .enumerate()
            .max_by_key(|(i, c)| (**c, -(*i as i64)))
        else {
            break;
        };
        current[best] -= total;
        out.push(items[best].0.clone());
    }
    out
}

impl Plan {
    /// The stages (empty: constant).
    pub fn stages(&self) -> &[Stage] {
        match &self.arrival {
            Arrival::Closed { stages, .. } | Arrival::Open { stages, .. } => stages,
        }
    }

    /// Users the run needs.
    pub fn users(&self) -> usize {
        match &self.arrival {
            Arrival::Closed { vus, .. } => *vus,
            Arrival::Open { users, .. } => *users,
        }
    }

    /// The target (users or rate) `elapsed` into the run: ramps linearly
    /// through the stages from 0; after the last stage, its target; with
    /// no stages, `flat`.
    pub fn target_at(&self, elapsed: Duration, flat: f64) -> f64 {
        let stages = self.stages();
        if stages.is_empty() {
            return flat;
        }
        let mut from = 0.0;
        let mut at = Duration::ZERO;
        for s in stages {
            if elapsed < at + s.duration {
                let f = (elapsed - at).as_secs_f64() / s.duration.as_secs_f64().max(1e-9);
                return from + (s.target - from) * f;
            }
            at += s.duration;
            from = s.target;
        }
        from
    }

    /// A human description, printed by `--dry-run` and at the start.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        let arrival = match &self.arrival {
            Arrival::Closed { vus, .. } => format!("closed loop, {vus} users"),
            Arrival::Open { rate, users, .. } => {
                format!("open loop, {rate} requests/s carried by up to {users} users")
            }
        };
        s.push_str(&format!(
            "  arrival: {arrival}; think {} ms\n  length: {} s{}\n  era: {}\n",
            self.think_time.as_millis(),
            self.duration.as_secs_f64(),
            self.requests
                .map(|n| format!(" or {n} answers, whichever comes first"))
                .unwrap_or_default(),
            self.era
                .version()
                .unwrap_or("auto (server/discover, else initialize)")
        ));
        if !self.stages().is_empty() {
            s.push_str("  stages:");
            for st in self.stages() {
                s.push_str(&format!(" {} s → {}", st.duration.as_secs_f64(), st.target));
            }
            s.push('\n');
        }
        s.push_str("  mix:");
        for (label, w) in &self.mix {
            s.push_str(&format!(" {w}× {label};"));
        }
        s.push('\n');
        if let Some(n) = self.calls_per_run {
            s.push_str(&format!("  {n} calls per run token, then the next token\n"));
        }
        s.push_str(&format!(
            "  bounds: ≤ {} users, ≤ {}/s, ≤ {} s\n",
            self.bounds.max_vus,
            self.bounds.max_rate,
            self.bounds.max_duration.as_secs_f64()
        ));
        s
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
