//! `mcp-firewall audit replay`: the recorded `tools/call` decisions
//! re-decided under a candidate policy directory, by the code `serve`
//! decides with ([`crate::verdict::call`]), with each call's principal
//! claims, tool and arguments as recorded and each tool's definition as
//! `mcp-firewall test` takes it (the candidate's pins, else an empty one).
//! A call whose arguments were redacted or cut, or whose row lacks the
//! principal's claims, is reported as not replayable, never guessed; so is
//! a row no policy verdict is on record for (a budget's `skip`, an audit
//! `error`, a cancelled hold). Changes are grouped by tool and by recorded
//! and candidate decision.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde_json::{Map, Value};

use crate::audit::REDACTED;
use crate::config::Config;
use crate::pins::PinStore;
use crate::policy;
use crate::verdict::call::{Judge, Kind};

/// What replay found.
#[derive(Debug, Default)]
pub(crate) struct ReplayReport {
    /// The candidate directory.
    pub policy_dir: String,
    /// Its content hash.
    pub policy_sha256: String,
    /// Rows read.
    pub rows: u64,
    /// Calls re-decided.
    pub replayed: u64,
    /// Of those, decided as recorded.
    pub unchanged: u64,
    /// Calls that would change, by (upstream, tool, recorded, candidate).
    pub changes: BTreeMap<(String, String, Kind, Kind), Change>,
    /// Rows not re-decided, by why.
    pub not_replayable: BTreeMap<String, u64>,
}

/// One group of calls that would change.
#[derive(Debug, Default)]
pub(crate) struct Change {
    /// How many.
    pub calls: u64,
    /// Whose (tenant/subject).
    pub principals: BTreeSet<String>,
    /// The candidate's reason and rule for the first of them.
    pub why: String,
    /// Up to three of their event ids.
    pub examples: Vec<String>,
}

/// A replay in progress: the candidate loaded, rows fed one at a time (as
/// [`super::audit::Question::Replay`] selects them, streamed: memory stays
/// the groups', not the rows').
pub(crate) struct Replay {
    candidate: policy::Policy,
    pins: std::sync::Arc<PinStore>,
    definitions: super::policy_test::Definitions,
    report: ReplayReport,
}

impl Replay {
    /// Loads the candidate policy in `dir` and its pins.
    ///
    /// # Errors
    /// The candidate policy or its pins do not load.
    pub(crate) fn new(dir: &Path) -> anyhow::Result<Replay> {
        let candidate =
            policy::load_dir(dir).with_context(|| format!("candidate policy {}", dir.display()))?;
        let pins = PinStore::open(dir, &mut prometheus_client::registry::Registry::default())
            .with_context(|| format!("pins of {}", dir.display()))?;
        let report = ReplayReport {
            policy_dir: dir.display().to_string(),
            policy_sha256: candidate.content_hash().to_owned(),
            ..ReplayReport::default()
        };
        Ok(Replay {
            candidate,
            definitions: super::policy_test::Definitions::new(pins.clone()),
            pins,
            report,
        })
    }

    /// Re-decides one recorded row.
    pub(crate) fn row(&mut self, cfg: &Config, row: &Map<String, Value>) {
        let report = &mut self.report;
        report.rows += 1;
        match redecide(cfg, &self.candidate, &self.pins, &self.definitions, row) {
            Err(why) => *report.not_replayable.entry(why).or_default() += 1,
            Ok((recorded, got)) => {
                report.replayed += 1;
                if recorded == got.kind {
                    report.unchanged += 1;
                    return;
                }
                let s = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                let group = report
                    .changes
                    .entry((s("upstream"), s("tool"), recorded, got.kind))
                    .or_default();
                group.calls += 1;
                group
                    .principals
                    .insert(format!("{}/{}", s("tenant"), s("subject")));
                if group.why.is_empty() {
                    group.why = match (got.reason.is_empty(), got.rule.is_empty()) {
                        (false, false) => format!("{} [{}]", got.reason, got.rule),
                        (false, true) => got.reason.clone(),
                        _ => got.rule.clone(),
                    };
                }
                if group.examples.len() < 3 {
                    group.examples.push(s("event_id"));
                }
            }
        }
    }

    /// What it found.
    pub(crate) fn finish(self) -> ReplayReport {
        self.report
    }
}

/// One row: its recorded decision and the candidate's verdict, or why it
/// cannot be re-decided.
fn redecide(
    cfg: &Config,
    candidate: &policy::Policy,
    pins: &PinStore,
    definitions: &super::policy_test::Definitions,
    row: &Map<String, Value>,
) -> Result<(Kind, crate::verdict::call::Verdict), String> {
    let s = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or("");
    if !s("approval_id").is_empty() {
        return Err("the run of an approved call (its approval request is re-decided)".to_owned());
    }
    let recorded = match Kind::parse(s("decision")) {
        Some(k) => k,
        None => {
            return Err(format!(
            "no policy verdict on record (decision {:?}: budgets, the audit or the client decided)",
            s("decision")
        ))
        }
    };
    let claims_text = s("principal_claims");
    if claims_text.is_empty() {
        return Err("recorded before rows kept the principal's claims".to_owned());
    }
    let mut claims: Map<String, Value> = serde_json::from_str(claims_text)
        .map_err(|_| "the principal's claims on record are not JSON".to_owned())?;
    for (k, col) in [
        ("sub", "subject"),
        ("tenant_id", "tenant"),
        ("run_id", "run_id"),
    ] {
        claims.insert(k.to_owned(), Value::String(s(col).to_owned()));
    }
    let arguments = match s("arguments") {
        "" => Value::Object(Map::new()),
        text => serde_json::from_str::<Value>(text)
            .map_err(|_| "arguments cut at the audit's max_bytes (not guessed)".to_owned())?,
    };
    if redacted(&arguments) {
        return Err(format!("arguments redacted ({REDACTED}; not guessed)"));
    }
    let up = cfg
        .upstreams
        .iter()
        .find(|u| u.name == s("upstream"))
        .ok_or_else(|| format!("upstream {:?} is not in the config", s("upstream")))?;
    let claims = super::claims_from_value(&Value::Object(claims));
    let service_issuer = cfg.auth.service_account_issuer.as_deref() == Some(&*claims.iss);
    let identity = crate::verdict::identity(&claims, service_issuer);
    let tool = s("tool");
    let entry = definitions.get(up, tool, None).map_err(|e| e.to_string())?;
    let verdict = match candidate.authority(&identity) {
        Err(e) => super::policy_test::no_authority(&e),
        Ok(authority) => {
            let judge = Judge {
                policy: candidate,
                identity: &identity,
                authority: &authority,
                upstream: up,
                pins,
            };
            let raw = arguments.to_string();
            judge.verdict(tool, &entry, Some(&raw), &arguments, None)
        }
    };
    Ok((recorded, verdict))
}

/// Whether any value in `v` is the audit's redaction mark.
fn redacted(v: &Value) -> bool {
    match v {
        Value::String(s) => s == REDACTED,
        Value::Array(a) => a.iter().any(redacted),
        Value::Object(o) => o.values().any(redacted),
        _ => false,
    }
}

impl ReplayReport {
    /// Calls that would change.
    pub(crate) fn changed(&self) -> u64 {
        self.changes.values().map(|c| c.calls).sum()
    }

    /// For people.
    pub(crate) fn render(&self, since: &str) -> String {
        let mut out = String::new();
        let skipped: u64 = self.not_replayable.values().sum();
        let _ = writeln!(
            out,
            "re-decided {} of {} recorded tools/call since {since} under {} (sha256 {}):",
            self.replayed,
            self.rows,
            self.policy_dir,
            self.policy_sha256.get(..16).unwrap_or(&self.policy_sha256)
        );
        let _ = writeln!(
            out,
            "  {} unchanged, {} would change, {skipped} not replayable",
            self.unchanged,
            self.changed()
        );
        if !self.changes.is_empty() {
            let _ = writeln!(out, "\nwould change (by tool and decision):");
            let mut groups: Vec<_> = self.changes.iter().collect();
            groups.sort_by(|a, b| b.1.calls.cmp(&a.1.calls).then(a.0.cmp(b.0)));
            for ((upstream, tool, from, to), c) in groups {
                let _ = writeln!(
                    out,
                    "  {:>6} calls  {:>4} principals  {upstream}/{tool}: {from} -> {to}  ({})",
                    c.calls,
                    c.principals.len(),
                    c.why
                );
                let _ = writeln!(out, "         e.g. event {}", c.examples.join(", "));
            }
        }
        if !self.not_replayable.is_empty() {
            let _ = writeln!(out, "\nnot replayable:");
            for (why, n) in &self.not_replayable {
                let _ = writeln!(out, "  {n:>6}  {why}");
            }
        }
        out
    }

    /// For scripts.
    pub(crate) fn json(&self) -> Value {
        let changes: Vec<Value> = self
            .changes
            .iter()
            .map(|((upstream, tool, from, to), c)| {
                serde_json::json!({
                    "upstream": upstream,
                    "tool": tool,
                    "recorded": from.as_str(),
                    "candidate": to.as_str(),
                    "calls": c.calls,
                    "principals": c.principals,
                    "why": c.why,
                    "examples": c.examples,
                })
            })
            .collect();
        serde_json::json!({
            "policy_dir": self.policy_dir,
            "policy_sha256": self.policy_sha256,
            "rows": self.rows,
            "replayed": self.replayed,
            "unchanged": self.unchanged,
            "changed": self.changed(),
            "changes": changes,
            "not_replayable": self.not_replayable,
        })
    }
}
