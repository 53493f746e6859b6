//! The demo estate: a small SRE incident-response world (services, deployments,
//! incidents, diffs, metric samples) that the sample upstream's tools read and
//! change.
//!
//! Invariants:
//! - Everything is deterministic. Catalog data (deployments, incidents, diffs,
//!   timestamps) is fixed in the private `catalog` module, metric samples come
//!   from a seeded formula, and nothing reads the clock or a random source.
//!   The same call on the same state returns the same bytes, on every machine
//!   and every run.
//! - Catalog data is immutable and shared by every [`Estate`] in the process
//!   (built once, lazily). Mutable state (notes, findings, rollbacks,
//!   restarts) lives in one [`Estate`], so two spawned upstreams never see each
//!   other's writes.
//! - A deployment can only be rolled back while it is the live deployment of
//!   its service instance and an earlier deployment exists to return to.
//! - Every write validates its input before it changes anything: an error
//!   leaves the state exactly as it was.

use std::fmt::Write as _;
use std::sync::{LazyLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde_json::json;

use super::catalog::{
    baseline, find_deployment, find_incident, instance_index, instance_of, predecessor, write_row,
    DeploymentRecord, IncidentRecord, Mitigation, Sample, DEPLOYMENTS, INCIDENTS, INSTANCES,
    PRECOMPUTED, ROW_BYTES_ESTIMATE, STALE_AT_START,
};

pub use crate::model::*;

/// Why an estate operation refused to run. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EstateError {
    /// No incident has this id.
    #[error("unknown incident `{id}`; known incidents are INC-1001 to INC-1004")]
    UnknownIncident {
        /// The id asked for.
        id: String,
    },
    /// No deployment has this id.
    #[error("unknown deployment `{id}`; use list_recent_deployments to see valid ids")]
    UnknownDeployment {
        /// The id asked for.
        id: String,
    },
    /// No finding has this id.
    #[error("unknown finding `{id}`; record_finding returns the ids of new findings")]
    UnknownFinding {
        /// The id asked for.
        id: String,
    },
    /// Only the live deployment of an instance can be rolled back.
    #[error("deployment {id} is not live on {service}/{namespace} (live: {live}); only the live deployment can be rolled back")]
    NotLive {
        /// The deployment asked for.
        id: &'static str,
        /// Its service.
        service: Service,
        /// Its namespace.
        namespace: Namespace,
        /// The deployment that is live instead.
        live: &'static str,
    },
    /// The deployment is the oldest one of its instance.
    #[error("deployment {id} is the oldest deployment of {service}/{namespace}; there is no earlier version to roll back to")]
    NoEarlierVersion {
        /// The deployment asked for.
        id: &'static str,
        /// Its service.
        service: Service,
        /// Its namespace.
        namespace: Namespace,
    },
    /// A numeric argument is outside its allowed range.
    #[error("`{field}` must be between {min} and {max}, got {got}")]
    OutOfRange {
        /// The argument name.
        field: &'static str,
        /// The value given.
        got: u64,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// A required text argument is empty or only whitespace.
    #[error("`{field}` must not be empty")]
    EmptyText {
        /// The argument name.
        field: &'static str,
    },
    /// A text argument is too long.
    #[error("`{field}` is {chars} characters long; the limit is {max}")]
    TextTooLong {
        /// The argument name.
        field: &'static str,
        /// Its length in characters.
        chars: usize,
        /// The limit.
        max: usize,
    },
    /// Too many evidence items.
    #[error("`evidence` has {items} items; the limit is {max}")]
    TooManyEvidenceItems {
        /// Items given.
        items: usize,
        /// The limit.
        max: usize,
    },
    /// A remediation preview lacks the argument that names its target.
    #[error("a {action} preview needs `{field}`")]
    MissingTarget {
        /// The previewed action.
        action: RemediationAction,
        /// The missing argument.
        field: &'static str,
    },
}

// ---------------------------------------------------------------------------
// Mutable state.
// ---------------------------------------------------------------------------

struct Note {
    author: String,
    at: Option<&'static str>,
    text: String,
}

struct Finding {
    incident: usize,
    summary: String,
    severity: FindingSeverity,
    evidence: Vec<String>,
    audit: Option<(Verdict, AuditSource)>,
}

struct State {
    /// Per instance, the applied deployments (indices into [`DEPLOYMENTS`]),
    /// live last.
    stacks: Vec<Vec<usize>>,
    /// Per deployment, whether it was rolled back.
    rolled_back: Vec<bool>,
    stale_cache: [bool; INSTANCES],
    restarts: [u32; INSTANCES],
    /// Per incident, its notes in posting order.
    notes: Vec<Vec<Note>>,
    /// Findings in recording order; `F-<n>` is `findings[n - 1]`.
    findings: Vec<Finding>,
}

impl State {
    fn initial() -> State {
        let mut stacks = vec![Vec::new(); INSTANCES];
        for (index, deployment) in DEPLOYMENTS.iter().enumerate() {
            if let Some(stack) = stacks.get_mut(deployment.instance()) {
                stack.push(index);
            }
        }
        let mut stale_cache = [false; INSTANCES];
        for (service, namespace) in STALE_AT_START {
            stale_cache[instance_index(service, namespace)] = true;
        }
        State {
            stacks,
            rolled_back: vec![false; DEPLOYMENTS.len()],
            stale_cache,
            restarts: [0; INSTANCES],
            notes: INCIDENTS
                .iter()
                .map(|incident| {
                    incident
                        .notes
                        .iter()
                        .map(|(author, at, text)| Note {
                            author: (*author).to_owned(),
                            at: Some(at),
                            text: (*text).to_owned(),
                        })
                        .collect()
                })
                .collect(),
            findings: Vec::new(),
        }
    }

    fn live(&self, instance: usize) -> Option<&'static DeploymentRecord> {
        let index = *self.stacks.get(instance)?.last()?;
        DEPLOYMENTS.get(index)
    }

    fn deployment_status(&self, index: usize) -> &'static str {
        if self.rolled_back.get(index).copied().unwrap_or(false) {
            return "rolled_back";
        }
        let Some(deployment) = DEPLOYMENTS.get(index) else {
            return "unknown";
        };
        match self
            .stacks
            .get(deployment.instance())
            .and_then(|s| s.last())
        {
            Some(&live) if live == index => "live",
            _ => "superseded",
        }
    }

    fn incident_status(&self, incident: &IncidentRecord) -> IncidentStatus {
        if incident.status != IncidentStatus::Open {
            return incident.status;
        }
        let mitigated = match incident.mitigation {
            Mitigation::None => false,
            Mitigation::Rollback(id) => find_deployment(id)
                .and_then(|(index, _)| self.rolled_back.get(index).copied())
                .unwrap_or(false),
            Mitigation::Restart => {
                !self.stale_cache[instance_index(incident.service, incident.namespace)]
            }
        };
        if mitigated {
            IncidentStatus::Mitigated
        } else {
            IncidentStatus::Open
        }
    }

    /// Current health numbers of an instance: its baseline plus the penalty of
    /// every condition that is active now.
    fn health(&self, instance: usize) -> (Sample, Vec<&'static str>) {
        let (service, namespace) = instance_of(instance);
        let base = baseline(service);
        let mut s = Sample {
            p50_ms: base.p50_ms,
            p99_ms: base.p99_ms,
            errors_per_10k: base.errors_per_10k,
            rps: if namespace == Namespace::Staging {
                base.rps / 20 + 1
            } else {
                base.rps
            },
        };
        let mut reasons = Vec::new();
        if let Some(defect) = self.live(instance).and_then(|d| d.defect) {
            s.errors_per_10k += 830;
            s.p99_ms += 380;
            reasons.push(defect);
        }
        if self.stale_cache[instance] {
            s.p50_ms += 40;
            s.p99_ms += 1_900;
            reasons.push("result cache serves stale shards; hit ratio 31%");
        }
        (s, reasons)
    }
}

fn check_text(field: &'static str, value: &str, max: usize) -> Result<(), EstateError> {
    if value.trim().is_empty() {
        return Err(EstateError::EmptyText { field });
    }
    let chars = value.chars().count();
    if chars > max {
        return Err(EstateError::TextTooLong { field, chars, max });
    }
    Ok(())
}

fn error_rate(errors_per_10k: u64) -> String {
    format!("{}.{:04}", errors_per_10k / 10_000, errors_per_10k % 10_000)
}

/// One estate: the shared catalog plus this estate's own mutable state.
pub struct Estate {
    state: RwLock<State>,
}

impl Default for Estate {
    fn default() -> Self {
        Self::new()
    }
}

impl Estate {
    /// A fresh estate in its initial state (no findings, no rollbacks, the
    /// seeded notes only).
    pub fn new() -> Estate {
        // Build the shared renderings now rather than inside the first call.
        LazyLock::force(&PRECOMPUTED);
        Estate {
            state: RwLock::new(State::initial()),
        }
    }

    // A panic while holding the lock cannot leave `State` half-updated: every
    // write validates first and then mutates with infallible operations. So a
    // poisoned lock still guards consistent data and is safe to use.
    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Incidents, optionally filtered by status and service, in id order.
    pub fn list_incidents(
        &self,
        status: Option<IncidentStatus>,
        service: Option<Service>,
    ) -> ToolOutput {
        let state = self.read();
        let mut text = String::with_capacity(512);
        let mut items = Vec::with_capacity(INCIDENTS.len());
        for incident in INCIDENTS {
            let current = state.incident_status(incident);
            if status.is_some_and(|s| s != current)
                || service.is_some_and(|s| s != incident.service)
            {
                continue;
            }
            let _ = writeln!(
                text,
                "{} {} {} {}/{}: {}",
                incident.id,
                incident.severity,
                current.as_str(),
                incident.service,
                incident.namespace,
                incident.title
            );
            items.push(json!({
                "incident_id": incident.id,
                "title": incident.title,
                "severity": incident.severity,
                "status": current.as_str(),
                "service": incident.service.as_str(),
                "namespace": incident.namespace.as_str(),
                "opened_at": incident.opened_at,
            }));
        }
        if items.is_empty() {
            text.push_str("No incidents match.\n");
        }
        let count = items.len();
        ToolOutput {
            text,
            structured: Some(json!({"incidents": items, "count": count})),
        }
    }

    /// One incident with its notes and findings.
    pub fn get_incident(&self, incident_id: &str) -> Result<ToolOutput, EstateError> {
        let (index, incident) =
            find_incident(incident_id).ok_or_else(|| EstateError::UnknownIncident {
                id: incident_id.to_owned(),
            })?;
        let state = self.read();
        let status = state.incident_status(incident);
        let mut text = String::with_capacity(1024);
        let _ = writeln!(
            text,
            "{} [{}, {}] {}",
            incident.id,
            incident.severity,
            status.as_str(),
            incident.title
        );
        let _ = writeln!(
            text,
            "Service: {}/{}  Opened: {}",
            incident.service, incident.namespace, incident.opened_at
        );
        if let Some(suspect) = incident.suspected_deployment.and_then(find_deployment) {
            let _ = writeln!(
                text,
                "Suspected deployment: {} ({} {} by {}, {})",
                suspect.1.id,
                suspect.1.service,
                suspect.1.version,
                suspect.1.author,
                state.deployment_status(suspect.0)
            );
        }
        let _ = writeln!(text, "Summary: {}", incident.summary);
        let notes = state.notes.get(index).map(Vec::as_slice).unwrap_or(&[]);
        let _ = writeln!(text, "Notes ({}):", notes.len());
        let mut note_values = Vec::with_capacity(notes.len());
        for (number, note) in notes.iter().enumerate() {
            let number = number + 1;
            let _ = writeln!(
                text,
                "  #{} {} {}: {}",
                number,
                note.at.unwrap_or("(posted during this session)"),
                note.author,
                note.text
            );
            note_values.push(json!({
                "number": number,
                "author": note.author,
                "at": note.at,
                "text": note.text,
            }));
        }
        let mut finding_values = Vec::new();
        for (n, finding) in state.findings.iter().enumerate() {
            if finding.incident != index {
                continue;
            }
            let verdict = finding.audit.as_ref().map(|(v, _)| v.as_str());
            let _ = writeln!(
                text,
                "  Finding F-{} [{}] {} (audit: {})",
                n + 1,
                finding.severity.as_str(),
                finding.summary,
                verdict.unwrap_or("pending")
            );
            finding_values.push(json!({
                "finding_id": format!("F-{}", n + 1),
                "severity": finding.severity.as_str(),
                "summary": finding.summary,
                "verdict": verdict,
            }));
        }
        Ok(ToolOutput {
            text,
            structured: Some(json!({
                "incident_id": incident.id,
                "title": incident.title,
                "severity": incident.severity,
                "status": status.as_str(),
                "service": incident.service.as_str(),
                "namespace": incident.namespace.as_str(),
                "opened_at": incident.opened_at,
                "suspected_deployment": incident.suspected_deployment,
                "summary": incident.summary,
                "notes": note_values,
                "findings": finding_values,
            })),
        })
    }

    /// Current health of a service instance.
    pub fn service_health(&self, service: Service, namespace: Namespace) -> ToolOutput {
        let instance = instance_index(service, namespace);
        let state = self.read();
        let (now, reasons) = state.health(instance);
        let status = if reasons.is_empty() {
            "healthy"
        } else {
            "degraded"
        };
        let live = state.live(instance);
        let base = baseline(service);
        let open: Vec<&str> = INCIDENTS
            .iter()
            .filter(|i| {
                i.service == service
                    && i.namespace == namespace
                    && state.incident_status(i) == IncidentStatus::Open
            })
            .map(|i| i.id)
            .collect();
        let mut text = String::with_capacity(384);
        let _ = writeln!(
            text,
            "{service}/{namespace}: {status}, version {} ({}), {}/{} replicas ready, {} restarts",
            live.map_or("none", |d| d.version),
            live.map_or("none", |d| d.id),
            base.replicas,
            base.replicas,
            state.restarts[instance]
        );
        let _ = writeln!(
            text,
            "p50 {} ms, p99 {} ms, error rate {}, {} req/s; owner: {}",
            now.p50_ms,
            now.p99_ms,
            error_rate(now.errors_per_10k),
            now.rps,
            base.team
        );
        for reason in &reasons {
            let _ = writeln!(text, "Degraded: {reason}");
        }
        if !open.is_empty() {
            let _ = writeln!(text, "Open incidents: {}", open.join(", "));
        }
        ToolOutput {
            text,
            structured: Some(json!({
                "service": service.as_str(),
                "namespace": namespace.as_str(),
                "status": status,
                "version": live.map(|d| d.version),
                "live_deployment": live.map(|d| d.id),
                "replicas": {"desired": base.replicas, "ready": base.replicas},
                "restarts": state.restarts[instance],
                "latency_p50_ms": now.p50_ms,
                "latency_p99_ms": now.p99_ms,
                "error_rate": error_rate(now.errors_per_10k),
                "requests_per_s": now.rps,
                "owner_team": base.team,
                "degraded_reasons": reasons,
                "open_incidents": open,
            })),
        }
    }

    /// The most recent deployments first, optionally filtered.
    pub fn list_recent_deployments(
        &self,
        service: Option<Service>,
        namespace: Option<Namespace>,
        limit: u32,
    ) -> Result<ToolOutput, EstateError> {
        if !(1..=MAX_DEPLOYMENT_LIMIT).contains(&limit) {
            return Err(EstateError::OutOfRange {
                field: "limit",
                got: u64::from(limit),
                min: 1,
                max: u64::from(MAX_DEPLOYMENT_LIMIT),
            });
        }
        let state = self.read();
        let mut text = String::with_capacity(128 * limit.min(16) as usize);
        let mut items = Vec::new();
        let matching = DEPLOYMENTS.iter().enumerate().rev().filter(|(_, d)| {
            service.is_none_or(|s| s == d.service) && namespace.is_none_or(|n| n == d.namespace)
        });
        for (index, d) in matching.take(limit as usize) {
            let status = state.deployment_status(index);
            let _ = writeln!(
                text,
                "{} {} {}/{} {} by {} [{}]: {}",
                d.id, d.deployed_at, d.service, d.namespace, d.version, d.author, status, d.summary
            );
            items.push(json!({
                "deployment_id": d.id,
                "service": d.service.as_str(),
                "namespace": d.namespace.as_str(),
                "version": d.version,
                "author": d.author,
                "deployed_at": d.deployed_at,
                "status": status,
                "summary": d.summary,
            }));
        }
        if items.is_empty() {
            text.push_str("No deployments match.\n");
        }
        let count = items.len();
        Ok(ToolOutput {
            text,
            structured: Some(json!({"deployments": items, "count": count})),
        })
    }

    /// One deployment's record and current status.
    pub fn get_deployment(&self, deployment_id: &str) -> Result<ToolOutput, EstateError> {
        let (index, d) =
            find_deployment(deployment_id).ok_or_else(|| EstateError::UnknownDeployment {
                id: deployment_id.to_owned(),
            })?;
        let status = self.read().deployment_status(index);
        let previous = predecessor(index);
        let stats = PRECOMPUTED
            .diffs
            .get(index)
            .and_then(|diff| diff.structured.as_ref());
        let additions = stats.and_then(|s| s.get("additions")).cloned();
        let deletions = stats.and_then(|s| s.get("deletions")).cloned();
        let mut text = String::with_capacity(384);
        let _ = writeln!(
            text,
            "{} {}/{} {} [{}]",
            d.id, d.service, d.namespace, d.version, status
        );
        let _ = writeln!(
            text,
            "Deployed {} by {} (commit {}): {}",
            d.deployed_at, d.author, d.commit, d.summary
        );
        match previous {
            Some(p) => {
                let _ = writeln!(text, "Previous: {} {}", p.id, p.version);
            }
            None => text.push_str("Previous: none (first deployment of this instance)\n"),
        }
        Ok(ToolOutput {
            text,
            structured: Some(json!({
                "deployment_id": d.id,
                "service": d.service.as_str(),
                "namespace": d.namespace.as_str(),
                "version": d.version,
                "author": d.author,
                "deployed_at": d.deployed_at,
                "commit": d.commit,
                "summary": d.summary,
                "status": status,
                "previous_deployment": previous.map(|p| p.id),
                "previous_version": previous.map(|p| p.version),
                "additions": additions,
                "deletions": deletions,
            })),
        })
    }

    /// A deployment's diff. Precomputed: the answer is a copy of fixed text.
    pub fn deployment_diff(&self, deployment_id: &str) -> Result<ToolOutput, EstateError> {
        find_deployment(deployment_id)
            .and_then(|(index, _)| PRECOMPUTED.diffs.get(index))
            .cloned()
            .ok_or_else(|| EstateError::UnknownDeployment {
                id: deployment_id.to_owned(),
            })
    }

    /// Raw metric samples as CSV: the header, then `points` rows, one per
    /// minute from 2026-03-11T00:00:00Z. Independent of the estate's state, so
    /// the same arguments always give the same bytes.
    pub fn metrics_csv(
        &self,
        service: Service,
        namespace: Namespace,
        points: u64,
    ) -> Result<String, EstateError> {
        if !(1..=MAX_METRIC_POINTS).contains(&points) {
            return Err(EstateError::OutOfRange {
                field: "points",
                got: points,
                min: 1,
                max: MAX_METRIC_POINTS,
            });
        }
        let instance = instance_index(service, namespace);
        let wanted = usize::try_from(points).unwrap_or(usize::MAX);
        let Some(series) = PRECOMPUTED.series.get(instance) else {
            return Ok(String::new());
        };
        let cached = wanted.min(series.row_ends.len());
        let cached_end = match cached.checked_sub(1) {
            Some(last) => series.row_ends.get(last).copied().unwrap_or(0),
            None => 0,
        };
        let prefix = series.csv.get(..cached_end).unwrap_or("");
        if cached == wanted {
            return Ok(prefix.to_owned());
        }
        let mut out = String::with_capacity(prefix.len() + (wanted - cached) * ROW_BYTES_ESTIMATE);
        out.push_str(prefix);
        for index in cached as u64..points {
            write_row(&mut out, instance, index);
        }
        Ok(out)
    }

    /// Describes what rolling back `deployment_id` would do. Changes nothing.
    pub fn preview_rollback(&self, deployment_id: &str) -> Result<ToolOutput, EstateError> {
        let state = self.read();
        let plan = plan_rollback(&state, deployment_id)?;
        let replicas = baseline(plan.from.service).replicas;
        let incidents = incidents_mitigated_by_rollback(plan.from.id);
        let mut text = String::with_capacity(320);
        let _ = write!(
            text,
            "Preview only; nothing was changed. Rolling back {} would move {}/{} from {} ({}) to {} ({}), replacing {} replicas one at a time.",
            plan.from.id,
            plan.from.service,
            plan.from.namespace,
            plan.from.version,
            plan.from.id,
            plan.to.version,
            plan.to.id,
            replicas
        );
        if !incidents.is_empty() {
            let _ = write!(text, " Expected to mitigate: {}.", incidents.join(", "));
        }
        text.push('\n');
        Ok(ToolOutput {
            text,
            structured: Some(json!({
                "action": "rollback",
                "changed": false,
                "service": plan.from.service.as_str(),
                "namespace": plan.from.namespace.as_str(),
                "from_deployment": plan.from.id,
                "from_version": plan.from.version,
                "to_deployment": plan.to.id,
                "to_version": plan.to.version,
                "replicas": replicas,
                "would_mitigate": incidents,
            })),
        })
    }

    /// Describes what restarting a service instance would do. Changes nothing.
    pub fn preview_restart(&self, service: Service, namespace: Namespace) -> ToolOutput {
        let instance = instance_index(service, namespace);
        let state = self.read();
        let replicas = baseline(service).replicas;
        let clears_cache = state.stale_cache[instance];
        let incidents: Vec<&str> = INCIDENTS
            .iter()
            .filter(|i| {
                clears_cache
                    && matches!(i.mitigation, Mitigation::Restart)
                    && i.service == service
                    && i.namespace == namespace
                    && state.incident_status(i) == IncidentStatus::Open
            })
            .map(|i| i.id)
            .collect();
        let mut text = String::with_capacity(256);
        let _ = write!(
            text,
            "Preview only; nothing was changed. Restarting {service}/{namespace} would restart {replicas} replicas one at a time (restarts so far: {}).",
            state.restarts[instance]
        );
        if clears_cache {
            text.push_str(" It would rebuild the stale result cache.");
        }
        if !incidents.is_empty() {
            let _ = write!(text, " Expected to mitigate: {}.", incidents.join(", "));
        }
        text.push('\n');
        ToolOutput {
            text,
            structured: Some(json!({
                "action": "restart",
                "changed": false,
                "service": service.as_str(),
                "namespace": namespace.as_str(),
                "replicas": replicas,
                "clears_stale_cache": clears_cache,
                "would_mitigate": incidents,
            })),
        }
    }

    /// Appends a note to an incident.
    pub fn post_note(
        &self,
        incident_id: &str,
        author: &str,
        note: &str,
    ) -> Result<ToolOutput, EstateError> {
        let (index, incident) =
            find_incident(incident_id).ok_or_else(|| EstateError::UnknownIncident {
                id: incident_id.to_owned(),
            })?;
        check_text("note", note, MAX_NOTE_CHARS)?;
        check_text("author", author, MAX_SHORT_TEXT_CHARS)?;
        let mut state = self.write();
        let Some(notes) = state.notes.get_mut(index) else {
            return Err(EstateError::UnknownIncident {
                id: incident_id.to_owned(),
            });
        };
        notes.push(Note {
            author: author.to_owned(),
            at: None,
            text: note.to_owned(),
        });
        let number = notes.len();
        Ok(ToolOutput {
            text: format!("Posted note #{number} to {} as {author}.\n", incident.id),
            structured: Some(json!({
                "incident_id": incident.id,
                "note_number": number,
                "author": author,
                "posted": true,
            })),
        })
    }

    /// Checks that a note could be posted, without posting it. Lets a tool
    /// refuse bad input before it asks a human to confirm it.
    pub fn check_note(
        &self,
        incident_id: &str,
        author: &str,
        note: &str,
    ) -> Result<(), EstateError> {
        find_incident(incident_id).ok_or_else(|| EstateError::UnknownIncident {
            id: incident_id.to_owned(),
        })?;
        check_text("note", note, MAX_NOTE_CHARS)?;
        check_text("author", author, MAX_SHORT_TEXT_CHARS)
    }

    /// Records a finding against an incident and returns its new id.
    pub fn record_finding(
        &self,
        incident_id: &str,
        summary: &str,
        severity: FindingSeverity,
        evidence: &[String],
    ) -> Result<ToolOutput, EstateError> {
        let (index, incident) =
            find_incident(incident_id).ok_or_else(|| EstateError::UnknownIncident {
                id: incident_id.to_owned(),
            })?;
        check_text("summary", summary, MAX_SHORT_TEXT_CHARS)?;
        if evidence.len() > MAX_EVIDENCE_ITEMS {
            return Err(EstateError::TooManyEvidenceItems {
                items: evidence.len(),
                max: MAX_EVIDENCE_ITEMS,
            });
        }
        for item in evidence {
            check_text("evidence", item, MAX_SHORT_TEXT_CHARS)?;
        }
        let mut state = self.write();
        state.findings.push(Finding {
            incident: index,
            summary: summary.to_owned(),
            severity,
            evidence: evidence.to_vec(),
            audit: None,
        });
        let finding_id = format!("F-{}", state.findings.len());
        Ok(ToolOutput {
            text: format!(
                "Recorded finding {finding_id} [{}] on {}: {summary}\n",
                severity.as_str(),
                incident.id
            ),
            structured: Some(json!({
                "finding_id": finding_id,
                "incident_id": incident.id,
                "severity": severity.as_str(),
                "summary": summary,
                "evidence_items": evidence.len(),
            })),
        })
    }

    /// What an audit needs to know about a finding.
    pub fn finding_brief(&self, finding_id: &str) -> Result<FindingBrief, EstateError> {
        let state = self.read();
        let finding = parse_finding_id(finding_id)
            .and_then(|n| state.findings.get(n))
            .ok_or_else(|| EstateError::UnknownFinding {
                id: finding_id.to_owned(),
            })?;
        Ok(FindingBrief {
            finding_id: finding_id.to_owned(),
            incident_id: INCIDENTS.get(finding.incident).map_or("", |i| i.id),
            summary: finding.summary.clone(),
            severity: finding.severity,
            evidence: finding.evidence.clone(),
        })
    }

    /// The verdict used when the client cannot sample: a finding with
    /// evidence is confirmed, one without needs more.
    pub fn rule_verdict(brief: &FindingBrief) -> Verdict {
        if brief.evidence.is_empty() {
            Verdict::NeedsMoreEvidence
        } else {
            Verdict::Confirmed
        }
    }

    /// Stores an audit verdict on a finding (replacing an earlier one).
    pub fn record_audit(
        &self,
        finding_id: &str,
        verdict: Verdict,
        source: AuditSource,
    ) -> Result<ToolOutput, EstateError> {
        let mut state = self.write();
        let finding = parse_finding_id(finding_id)
            .and_then(|n| state.findings.get_mut(n))
            .ok_or_else(|| EstateError::UnknownFinding {
                id: finding_id.to_owned(),
            })?;
        let (source_name, model, why) = match &source {
            AuditSource::Sampling { model } => ("sampling", Some(model.clone()), None),
            AuditSource::Rule { why } => ("rule", None, Some(*why)),
        };
        let text = match (&model, why) {
            (Some(model), _) => format!(
                "Audit of {finding_id}: {} (decided by the client's model {model}).\n",
                verdict.as_str()
            ),
            (None, why) => format!(
                "Audit of {finding_id}: {} (decided by the built-in rule because {}).\n",
                verdict.as_str(),
                why.unwrap_or("sampling was not used")
            ),
        };
        finding.audit = Some((verdict, source));
        Ok(ToolOutput {
            text,
            structured: Some(json!({
                "finding_id": finding_id,
                "verdict": verdict.as_str(),
                "source": source_name,
                "model": model,
                "rule_reason": why,
            })),
        })
    }

    /// Rolls the live deployment `deployment_id` back to its predecessor.
    pub fn rollback(&self, deployment_id: &str, reason: &str) -> Result<ToolOutput, EstateError> {
        check_text("reason", reason, MAX_SHORT_TEXT_CHARS)?;
        let mut state = self.write();
        let plan = plan_rollback(&state, deployment_id)?;
        let instance = plan.from.instance();
        if let Some(stack) = state.stacks.get_mut(instance) {
            stack.pop();
        }
        if let Some(flag) = state.rolled_back.get_mut(plan.from_index) {
            *flag = true;
        }
        let mitigated = incidents_mitigated_by_rollback(plan.from.id);
        let mut text = format!(
            "Rolled back {} on {}/{}: {} -> {}. Live deployment is now {}.",
            plan.from.id,
            plan.from.service,
            plan.from.namespace,
            plan.from.version,
            plan.to.version,
            plan.to.id
        );
        if !mitigated.is_empty() {
            let _ = write!(text, " Mitigated: {}.", mitigated.join(", "));
        }
        text.push('\n');
        Ok(ToolOutput {
            text,
            structured: Some(json!({
                "deployment_id": plan.from.id,
                "service": plan.from.service.as_str(),
                "namespace": plan.from.namespace.as_str(),
                "from_version": plan.from.version,
                "to_version": plan.to.version,
                "live_deployment": plan.to.id,
                "reason": reason,
                "mitigated_incidents": mitigated,
            })),
        })
    }

    /// Checks that `deployment_id` could be rolled back, without doing it.
    pub fn check_rollback(&self, deployment_id: &str, reason: &str) -> Result<(), EstateError> {
        check_text("reason", reason, MAX_SHORT_TEXT_CHARS)?;
        plan_rollback(&self.read(), deployment_id).map(|_| ())
    }

    /// Restarts every replica of a service instance, which also rebuilds a
    /// stale cache.
    pub fn restart(
        &self,
        service: Service,
        namespace: Namespace,
        reason: &str,
    ) -> Result<ToolOutput, EstateError> {
        check_text("reason", reason, MAX_SHORT_TEXT_CHARS)?;
        let instance = instance_index(service, namespace);
        let mut state = self.write();
        let cleared = std::mem::replace(&mut state.stale_cache[instance], false);
        state.restarts[instance] += 1;
        let restarts = state.restarts[instance];
        let replicas = baseline(service).replicas;
        let mut text = format!(
            "Restarted {replicas} replicas of {service}/{namespace} (restart #{restarts})."
        );
        if cleared {
            text.push_str(" The result cache was rebuilt.");
        }
        text.push('\n');
        Ok(ToolOutput {
            text,
            structured: Some(json!({
                "service": service.as_str(),
                "namespace": namespace.as_str(),
                "replicas": replicas,
                "restarts": restarts,
                "cleared_stale_cache": cleared,
                "reason": reason,
            })),
        })
    }
}

/// `F-<n>` to the index of the finding.
fn parse_finding_id(finding_id: &str) -> Option<usize> {
    let n: usize = finding_id.strip_prefix("F-")?.parse().ok()?;
    n.checked_sub(1)
}

struct RollbackPlan {
    from_index: usize,
    from: &'static DeploymentRecord,
    to: &'static DeploymentRecord,
}

fn plan_rollback(state: &State, deployment_id: &str) -> Result<RollbackPlan, EstateError> {
    let (from_index, from) =
        find_deployment(deployment_id).ok_or_else(|| EstateError::UnknownDeployment {
            id: deployment_id.to_owned(),
        })?;
    let stack = state
        .stacks
        .get(from.instance())
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    match stack {
        [.., to, live] if *live == from_index => {
            let to = DEPLOYMENTS
                .get(*to)
                .ok_or_else(|| EstateError::UnknownDeployment {
                    id: deployment_id.to_owned(),
                })?;
            Ok(RollbackPlan {
                from_index,
                from,
                to,
            })
        }
        [live] if *live == from_index => Err(EstateError::NoEarlierVersion {
            id: from.id,
            service: from.service,
            namespace: from.namespace,
        }),
        _ => Err(EstateError::NotLive {
            id: from.id,
            service: from.service,
            namespace: from.namespace,
            live: state.live(from.instance()).map_or("none", |d| d.id),
        }),
    }
}

fn incidents_mitigated_by_rollback(deployment_id: &str) -> Vec<&'static str> {
    INCIDENTS
        .iter()
        .filter(|i| {
            i.status == IncidentStatus::Open
                && matches!(i.mitigation, Mitigation::Rollback(id) if id == deployment_id)
        })
        .map(|i| i.id)
        .collect()
}

#[cfg(test)]
#[path = "estate_tests.rs"]
mod tests;
