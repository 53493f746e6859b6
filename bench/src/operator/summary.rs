//! What a load test found, per target: latency percentiles (HDR histogram),
//! rate, outcomes by label and kind, a per-second timeline; rendered for a
//! person (terminal, Markdown, an SVG plot) and for scripts (JSON); and
//! the thresholds a CI gate sets, each met or failed with its figure.
//!
//! Invariant: error shares count only [`Category::Error`]; refusals and
//! tool errors have their own shares and thresholds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::client::{Answer, Category};

/// Counts while a target runs (one per target; users lock it per answer).
pub struct Stats {
    latency: Histogram<u64>,
    outcomes: BTreeMap<(Category, String), u64>,
    seconds: Vec<Second>,
    answered_calls: Vec<u64>,
    elapsed: Duration,
}

/// One second of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Second {
    /// Answers in this second.
    pub answers: u64,
    /// Errors in this second.
    pub errors: u64,
    /// Slowest answer of the second, ms.
    pub max_ms: f64,
    /// Sum of latencies, ms (for the mean).
    pub sum_ms: f64,
}

impl Stats {
    /// Empty.
    pub fn new() -> Result<Stats, hdrhistogram::CreationError> {
        Ok(Stats {
            // 1 µs .. 1 h, 3 significant digits.
            latency: Histogram::new_with_bounds(1, 3_600_000_000, 3)?,
            outcomes: BTreeMap::new(),
            seconds: Vec::new(),
            answered_calls: Vec::new(),
            elapsed: Duration::ZERO,
        })
    }

    /// Records one answer `at` into the run.
    pub fn record(&mut self, at: Duration, answer: &Answer) {
        let us = (answer.latency.as_micros() as u64).max(1);
        let _ = self.latency.record(us.min(3_600_000_000));
        let s = at.as_secs() as usize;
        if self.seconds.len() <= s {
            self.seconds.resize(s + 1, Second::default());
        }
        let sec = &mut self.seconds[s];
        let ms = answer.latency.as_secs_f64() * 1e3;
        sec.answers += 1;
        sec.sum_ms += ms;
        sec.max_ms = sec.max_ms.max(ms);
        for o in &answer.outcomes {
            if o.category == Category::Error {
                sec.errors += 1;
            }
            *self
                .outcomes
                .entry((o.category, o.label.clone()))
                .or_default() += 1;
        }
        self.answered_calls
            .extend_from_slice(&answer.answered_calls);
    }

    /// Adds another round's counts.
    pub fn merge(&mut self, other: &Stats) {
        let _ = self.latency.add(&other.latency);
        for (k, v) in &other.outcomes {
            *self.outcomes.entry(k.clone()).or_default() += v;
        }
        self.seconds.extend(other.seconds.iter().cloned());
        self.answered_calls.extend_from_slice(&other.answered_calls);
        self.elapsed += other.elapsed;
    }

    /// Sets how long the measured part took.
    pub fn set_elapsed(&mut self, d: Duration) {
        self.elapsed = d;
    }

    /// Answers so far.
    pub fn answers(&self) -> u64 {
        self.latency.len()
    }

    /// The p-th percentile latency so far, ms.
    pub fn percentile_ms(&self, p: f64) -> f64 {
        self.latency.value_at_quantile(p / 100.0) as f64 / 1e3
    }

    /// Messages of `category` so far.
    pub fn count(&self, category: Category) -> u64 {
        self.outcomes
            .iter()
            .filter(|((c, _), _)| *c == category)
            .map(|(_, n)| n)
            .sum()
    }

    /// JSON-RPC ids of the answered `tools/call` requests.
    pub fn answered_calls(&self) -> &[u64] {
        &self.answered_calls
    }

    /// The summary of a target.
    pub fn summary(&self, label: &str, url: &str) -> TargetSummary {
        let messages: u64 = self.outcomes.values().sum();
        let share = |c: Category| {
            if messages == 0 {
                0.0
            } else {
                self.count(c) as f64 / messages as f64 * 100.0
            }
        };
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        TargetSummary {
            label: label.to_owned(),
            url: url.to_owned(),
            answers: self.answers(),
            messages,
            seconds: self.elapsed.as_secs_f64(),
            rate: self.answers() as f64 / secs,
            p50_ms: self.percentile_ms(50.0),
            p90_ms: self.percentile_ms(90.0),
            p95_ms: self.percentile_ms(95.0),
            p99_ms: self.percentile_ms(99.0),
            max_ms: self.latency.max() as f64 / 1e3,
            ok_pct: share(Category::Ok),
            refused_pct: share(Category::Refused),
            tool_error_pct: share(Category::ToolError),
            error_pct: share(Category::Error),
            outcomes: self
                .outcomes
                .iter()
                .map(|((c, l), n)| OutcomeCount {
                    label: l.clone(),
                    category: *c,
                    count: *n,
                })
                .collect(),
            timeline: self.seconds.clone(),
            metrics: Vec::new(),
            audit: None,
        }
    }
}

/// How often one outcome happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutcomeCount {
    /// `ok`, a stop reason, `http 503`, ...
    pub label: String,
    /// Its kind.
    pub category: Category,
    /// Messages.
    pub count: u64,
}

/// A metric's change over the run, from the target's `/metrics`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricDelta {
    /// The series, `name{labels}`.
    pub series: String,
    /// Before the run.
    pub before: f64,
    /// After the run.
    pub after: f64,
}

/// What `--verify-audit` found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditCheck {
    /// Answered `tools/call` requests.
    pub answered: u64,
    /// Of those, with a row in ClickHouse.
    pub found: u64,
    /// A few ids without a row.
    pub missing_sample: Vec<u64>,
    /// Why the check could not run (ClickHouse unreachable until the
    /// wait ran out): the load's figures stand, this check has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One target's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetSummary {
    /// Its label.
    pub label: String,
    /// Its URL.
    pub url: String,
    /// Exchanges answered.
    pub answers: u64,
    /// JSON-RPC messages answered (a batch counts each).
    pub messages: u64,
    /// Measured seconds.
    pub seconds: f64,
    /// Exchanges per second.
    pub rate: f64,
    /// Latency percentiles, ms.
    pub p50_ms: f64,
    /// p90.
    pub p90_ms: f64,
    /// p95.
    pub p95_ms: f64,
    /// p99.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
    /// Shares of messages, %.
    pub ok_pct: f64,
    /// Refused by the firewall.
    pub refused_pct: f64,
    /// Tool errors.
    pub tool_error_pct: f64,
    /// Failures.
    pub error_pct: f64,
    /// Every outcome.
    pub outcomes: Vec<OutcomeCount>,
    /// Per second.
    pub timeline: Vec<Second>,
    /// Metric deltas from `--metrics`.
    pub metrics: Vec<MetricDelta>,
    /// `--verify-audit`.
    pub audit: Option<AuditCheck>,
}

/// A threshold (`p99<250ms`, `errors<0.1%`, `rate>=2000`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    /// As given.
    pub text: String,
    metric: String,
    op: String,
    value: f64,
}

/// A threshold's verdict on one target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Verdict {
    /// The threshold.
    pub threshold: String,
    /// The target.
    pub target: String,
    /// The figure.
    pub actual: f64,
    /// Its unit.
    pub unit: String,
    /// Met.
    pub ok: bool,
}

/// Why a threshold does not parse.
#[derive(Debug, thiserror::Error)]
#[error("threshold {0:?}: {1}")]
pub struct ThresholdError(String, String);

impl Threshold {
    /// Parses `METRIC OP VALUE[UNIT]`: `p50|p90|p95|p99|max` with `ms`,
    /// `s` or `us`; `errors|refused|tool_errors` with `%`; `rate` (answers
    /// per second); `audit_missing` (rows).
    pub fn parse(text: &str) -> Result<Threshold, ThresholdError> {
        let t: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let bad = |why: &str| ThresholdError(text.to_owned(), why.to_owned());
        let at = t
            .find(['<', '>', '='])
            .ok_or_else(|| bad("expected <, <=, >, >= or =="))?;
        let metric = t[..at].to_ascii_lowercase();
        let rest = &t[at..];
        let op = ["<=", ">=", "==", "<", ">"]
            .into_iter()
            .find(|o| rest.starts_with(o))
            .ok_or_else(|| bad("expected <, <=, >, >= or =="))?;
        let raw = &rest[op.len()..];
        let num_end = raw
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(raw.len());
        let n: f64 = raw[..num_end].parse().map_err(|_| bad("no number"))?;
        let unit = &raw[num_end..];
        let value = match metric.as_str() {
            "p50" | "p90" | "p95" | "p99" | "max" => match unit {
                "ms" | "" => n,
                "s" => n * 1e3,
                "us" | "µs" => n / 1e3,
                _ => return Err(bad("latency units are us, ms or s")),
            },
            "errors" | "refused" | "tool_errors" => match unit {
                "%" => n,
                "" => n * 100.0,
                _ => return Err(bad("shares are given in % (or as a fraction)")),
            },
            "rate" | "audit_missing" => {
                if !unit.is_empty() && unit != "/s" {
                    return Err(bad("rate is answers per second"));
                }
                n
            }
            _ => {
                return Err(bad(
                    "metrics: p50, p90, p95, p99, max, rate, errors, refused, tool_errors, audit_missing",
                ))
            }
        };
        Ok(Threshold {
            text: text.to_owned(),
            metric,
            op: op.to_owned(),
            value,
        })
    }

    /// Judges `t`.
    pub fn judge(&self, t: &TargetSummary) -> Verdict {
        let (actual, unit) = match self.metric.as_str() {
            "p50" => (t.p50_ms, "ms"),
            "p90" => (t.p90_ms, "ms"),
            "p95" => (t.p95_ms, "ms"),
            "p99" => (t.p99_ms, "ms"),
            "max" => (t.max_ms, "ms"),
            "errors" => (t.error_pct, "%"),
            "refused" => (t.refused_pct, "%"),
            "tool_errors" => (t.tool_error_pct, "%"),
            "rate" => (t.rate, "/s"),
            _ => (
                t.audit
                    .as_ref()
                    .filter(|a| a.error.is_none())
                    .map_or(f64::INFINITY, |a| (a.answered - a.found) as f64),
                "rows",
            ),
        };
        let ok = match self.op.as_str() {
            "<" => actual < self.value,
            "<=" => actual <= self.value,
            ">" => actual > self.value,
            ">=" => actual >= self.value,
            _ => (actual - self.value).abs() < 1e-9,
        };
        Verdict {
            threshold: self.text.clone(),
            target: t.label.clone(),
            actual,
            unit: unit.to_owned(),
            ok,
        }
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// When it ran (RFC 3339).
    pub started: String,
    /// The plan, described.
    pub plan: String,
    /// Who the users were.
    pub identities: String,
    /// Per target.
    pub targets: Vec<TargetSummary>,
    /// Thresholds judged.
    pub verdicts: Vec<Verdict>,
}

impl Report {
    /// Whether every threshold was met.
    pub fn passed(&self) -> bool {
        self.verdicts.iter().all(|v| v.ok)
            && self
                .targets
                .iter()
                .all(|t| t.audit.as_ref().is_none_or(|a| a.error.is_none()))
    }

    /// For the terminal.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "mcp-bench load, {}", self.started);
        s.push_str(&self.plan);
        let _ = writeln!(s, "  users: {}", self.identities);
        for t in &self.targets {
            let _ = writeln!(
                s,
                "\n{} ({})\n  {} answers in {:.1} s: {:.0}/s; latency p50 {:.2} ms, p90 {:.2}, p99 {:.2}, max {:.2}",
                t.label, t.url, t.answers, t.seconds, t.rate, t.p50_ms, t.p90_ms, t.p99_ms, t.max_ms
            );
            let _ = writeln!(
                s,
                "  ok {:.2} %, refused by the firewall {:.2} %, tool errors {:.2} %, errors {:.2} %",
                t.ok_pct, t.refused_pct, t.tool_error_pct, t.error_pct
            );
            for o in &t.outcomes {
                let _ = writeln!(
                    s,
                    "    {:<12} {:<28} {:>9}",
                    o.category.as_str(),
                    o.label,
                    o.count
                );
            }
            for m in &t.metrics {
                let _ = writeln!(
                    s,
                    "    metric {} {} → {} ({:+})",
                    m.series,
                    m.before,
                    m.after,
                    m.after - m.before
                );
            }
            if let Some(e) = t.audit.as_ref().and_then(|a| a.error.as_ref()) {
                let _ = writeln!(s, "  audit: could not be checked: {e}");
            } else if let Some(a) = &t.audit {
                let _ = writeln!(
                    s,
                    "  audit: {} of {} answered calls have their row in ClickHouse{}",
                    a.found,
                    a.answered,
                    if a.missing_sample.is_empty() {
                        String::new()
                    } else {
                        format!(" (missing, e.g. ids {:?})", a.missing_sample)
                    }
                );
            }
        }
        if !self.verdicts.is_empty() {
            s.push('\n');
        }
        for v in &self.verdicts {
            let _ = writeln!(
                s,
                "threshold {} on {}: {} ({:.3} {})",
                v.threshold,
                v.target,
                if v.ok { "met" } else { "FAILED" },
                v.actual,
                v.unit
            );
        }
        s
    }

    /// Markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# mcp-bench load, {}\n", self.started);
        let _ = writeln!(s, "```\n{}  users: {}\n```\n", self.plan, self.identities);
        let _ = writeln!(
            s,
            "| target | answers | rate /s | p50 ms | p90 ms | p99 ms | max ms | ok % | refused % | tool errors % | errors % |\n|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for t in &self.targets {
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                t.label,
                t.answers,
                t.rate,
                t.p50_ms,
                t.p90_ms,
                t.p99_ms,
                t.max_ms,
                t.ok_pct,
                t.refused_pct,
                t.tool_error_pct,
                t.error_pct
            );
        }
        for t in &self.targets {
            let _ = writeln!(
                s,
                "\n## {}\n\n| kind | outcome | messages |\n|---|---|---|",
                t.label
            );
            for o in &t.outcomes {
                let _ = writeln!(
                    s,
                    "| {} | `{}` | {} |",
                    o.category.as_str(),
                    o.label,
                    o.count
                );
            }
            if !t.metrics.is_empty() {
                let _ = writeln!(s, "\n| metric | before | after |\n|---|---|---|");
                for m in &t.metrics {
                    let _ = writeln!(s, "| `{}` | {} | {} |", m.series, m.before, m.after);
                }
            }
            if let Some(e) = t.audit.as_ref().and_then(|a| a.error.as_ref()) {
                let _ = writeln!(s, "\nAudit: could not be checked: {e}.");
            } else if let Some(a) = &t.audit {
                let _ = writeln!(
                    s,
                    "\nAudit: {} of {} answered calls have their row.",
                    a.found, a.answered
                );
            }
        }
        if !self.verdicts.is_empty() {
            let _ = writeln!(
                s,
                "\n| threshold | target | figure | verdict |\n|---|---|---|---|"
            );
            for v in &self.verdicts {
                let _ = writeln!(
                    s,
                    "| `{}` | {} | {:.3} {} | {} |",
                    v.threshold,
                    v.target,
                    v.actual,
                    v.unit,
                    if v.ok { "met" } else { "**failed**" }
                );
            }
        }
        s
    }

    /// An SVG: answers per second and the slowest answer of each second,
    /// per target.
    pub fn svg(&self) -> Result<String, String> {
        use plotters::prelude::*;
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (900, 520)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            let (top, bottom) = root.split_vertically(260);
            self.panel(&top, "answers per second", |s| s.answers as f64, true)?;
            self.panel(
                &bottom,
                "slowest answer of each second, ms",
                |s| s.max_ms,
                false,
            )?;
            root.present().map_err(|e| e.to_string())?;
        }
        Ok(out)
    }

    /// One chart of `value` per second, a line per target.
    fn panel<DB: plotters::prelude::DrawingBackend>(
        &self,
        area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
        caption: &str,
        value: impl Fn(&Second) -> f64,
        legend: bool,
    ) -> Result<(), String> {
        use plotters::prelude::*;
        let secs = self
            .targets
            .iter()
            .map(|t| t.timeline.len())
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let peak = self
            .targets
            .iter()
            .flat_map(|t| t.timeline.iter().map(&value))
            .fold(1.0, f64::max);
        let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(24)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..secs, 0.0..peak * 1.1)
            .map_err(|e| e.to_string())?;
        chart.configure_mesh().draw().map_err(|e| e.to_string())?;
        for (i, t) in self.targets.iter().enumerate() {
            let c = colors[i % colors.len()];
            chart
                .draw_series(LineSeries::new(
                    t.timeline
                        .iter()
                        .enumerate()
                        .map(|(s, x)| (s as f64, value(x))),
                    c,
                ))
                .map_err(|e| e.to_string())?
                .label(t.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c));
        }
        if legend {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
