//! Tasks bound to the principal and run that created them: 2025-11-25
//! task-augmented `tools/call` (`tasks/get|result|list|cancel`) and the
//! 2026-07-28 tasks extension (`tasks/get|update|cancel`).
//!
//! The upstream sees only the firewall's credentials, so it cannot tell
//! whose task is whose: anyone who knows a task id could read, answer or
//! cancel it. The firewall therefore never shows a client the upstream's
//! task id. A task created by a call is handed out **sealed**
//! ([`crate::session::Sessions::seal_task`]): the upstream's id and the tool
//! of its call, bound to the principal and run. `tasks/*` open it for the
//! caller, or answer exactly like an unknown task; the upstream gets its own
//! id back. Every answer that names a task (the created task, `tasks/get`,
//! `tasks/cancel`, the `related-task` of `tasks/result`, task status
//! notifications) names the sealed id; `tasks/list` keeps only the run's
//! own tasks ([`Tasks`], the tasks this replica saw created).
//!
//! A task's outcome is its call's: `tasks/result` (2025-11-25) and a
//! completed `tasks/get` (2026-07-28) are inspected, on record with the
//! task's tool, and settle the budget the call reserved (kept here until
//! the outcome comes, or the task's time runs out). Input requests a task
//! carries (2026-07-28 `tasks/get` of an input-required task) pass the same
//! `[server_requests]` policy as any other.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::budget::{Budgets, Reservation, Settle};
use crate::session::{Principal, Sessions};

/// What a sealed task id names: the upstream's task and its call's tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskRef {
    /// The upstream's task id.
    pub upstream_id: String,
    /// The tool whose call created it.
    pub tool: String,
}

/// Longest the firewall remembers a task (and holds its call's budget)
/// when the upstream names no ttl, or a longer one.
pub(crate) const MAX_TASK_TTL: Duration = Duration::from_secs(24 * 3600);

/// Most tasks remembered at once; past it the oldest are let go (their
/// budgets settled as run).
const MAX_TASKS: usize = 100_000;

#[derive(Serialize, Deserialize)]
struct Payload<'a> {
    v: u8,
    #[serde(borrow)]
    u: Cow<'a, str>,
    #[serde(borrow)]
    n: Cow<'a, str>,
}

/// One task this replica saw created.
struct Entry {
    owner: String,
    tool: String,
    until: Instant,
    reservation: Option<Reservation>,
}

/// The tasks this replica saw created, by (upstream, upstream task id):
/// whose they are (for `tasks/list`) and the budget their call reserved.
#[derive(Default)]
pub struct Tasks {
    by_id: DashMap<(String, String), Entry>,
}

// === impl Tasks ===

impl Tasks {
    /// Remembers a task `owner` created, holding its call's `reservation`
    /// until its outcome (or `ttl`).
    pub fn created(
        &self,
        budgets: &Budgets,
        key: (String, String),
        owner: String,
        tool: String,
        reservation: Option<Reservation>,
        ttl: Duration,
    ) {
        if self.by_id.len() >= MAX_TASKS {
            self.sweep(budgets, true);
        }
        let until = Instant::now() + ttl.min(MAX_TASK_TTL);
        if let Some(old) = self.by_id.insert(
            key,
            Entry {
                owner,
                tool,
                until,
                reservation,
            },
        ) {
            settle(budgets, old.reservation, None);
        }
    }

    /// The tool of the upstream's task `id`, when `owner` created it.
    pub fn tool_of(&self, upstream: &str, id: &str, owner: &str) -> Option<String> {
        self.by_id
            .get(&(upstream.to_owned(), id.to_owned()))
            .filter(|e| e.owner == owner && e.until > Instant::now())
            .map(|e| e.tool.clone())
    }

    /// The outcome of a task came: its call's budget is settled with the
    /// cost the upstream reported.
    pub fn outcome(&self, budgets: &Budgets, upstream: &str, id: &str, reported: Option<f64>) {
        if let Some(mut e) = self.by_id.get_mut(&(upstream.to_owned(), id.to_owned())) {
            settle(budgets, e.reservation.take(), reported);
        }
    }

    /// Lets go of tasks past their time (and, when `crowded`, of the older
    /// half), settling the budgets they held as run.
    pub fn sweep(&self, budgets: &Budgets, crowded: bool) {
        let now = Instant::now();
        let mut cut = now;
        if crowded {
            let mut untils: Vec<Instant> = self.by_id.iter().map(|e| e.until).collect();
            untils.sort();
            if let Some(median) = untils.get(untils.len() / 2) {
                cut = cut.max(*median);
            }
        }
        self.by_id.retain(|_, e| {
            let keep = e.until > cut;
            if !keep {
                settle(budgets, e.reservation.take(), None);
            }
            keep
        });
    }
}

fn settle(budgets: &Budgets, r: Option<Reservation>, reported: Option<f64>) {
    if let Some(r) = r {
        // Off the caller's path when the store is shared.
        let _ = budgets.settle(&r, Settle::Executed { reported });
    }
}

/// Who owns what a run creates: its principal and run.
pub(crate) fn owner(who: &Principal<'_>) -> String {
    format!(
        "{}\u{0}{}\u{0}{}\u{0}{}",
        who.issuer, who.tenant, who.subject, who.run
    )
}

/// The sealed id of the upstream's task `upstream_id`, created by a call of
/// `tool`, for `who`.
pub(crate) fn seal(
    sessions: &Sessions,
    who: &Principal<'_>,
    upstream_id: &str,
    tool: &str,
) -> String {
    let payload = Payload {
        v: 1,
        u: Cow::Borrowed(upstream_id),
        n: Cow::Borrowed(tool),
    };
    let bytes = serde_json::to_vec(&payload).unwrap_or_default();
    sessions.seal_task(who, &bytes)
}

/// The task a sealed id names, if it was sealed for `who`; `None` is
/// answered like a task that does not exist.
pub(crate) fn open(sessions: &Sessions, who: &Principal<'_>, sealed: &str) -> Option<TaskRef> {
    let bytes = sessions.open_task(who, sealed.as_bytes()).ok()?;
    let p: Payload<'_> = serde_json::from_slice(&bytes).ok()?;
    (p.v == 1).then(|| TaskRef {
        upstream_id: p.u.into_owned(),
        tool: p.n.into_owned(),
    })
}

/// The upstream's task id of a `CreateTaskResult` (`result.task.taskId` in
/// 2025-11-25, `result.taskId` with `resultType: "task"` in 2026-07-28),
/// and the task's ttl in ms when it names one.
pub(crate) fn created(result: &Value) -> Option<(String, Option<u64>)> {
    if let Some(task) = result.get("task").filter(|t| t.is_object()) {
        let id = task.get("taskId")?.as_str()?.to_owned();
        return Some((id, task.get("ttl").and_then(Value::as_u64)));
    }
    if result.get("resultType").and_then(Value::as_str) == Some("task") {
        let id = result.get("taskId")?.as_str()?.to_owned();
        return Some((id, result.get("ttlMs").and_then(Value::as_u64)));
    }
    None
}

/// Replaces the string at `path` (object members) of `v` with `f` of it;
/// false when there is none.
pub(crate) fn replace_at(v: &mut Value, path: &[&str], f: impl FnOnce(&str) -> String) -> bool {
    let mut at = v;
    for key in path {
        match at.get_mut(*key) {
            Some(next) => at = next,
            None => return false,
        }
    }
    match at.as_str() {
        Some(s) => {
            *at = Value::String(f(s));
            true
        }
        None => false,
    }
}

/// The cost the upstream reported under `key` of a result's `_meta`.
pub(crate) fn reported_cost(result: &Value, key: &str) -> Option<f64> {
    result.get("_meta")?.get(key)?.as_f64()
}
