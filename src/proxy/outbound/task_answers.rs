//! The answers to `tools/call` that create tasks and to `tasks/*`: the
//! upstream's task ids sealed for the run, `tasks/list` kept to the run's
//! own tasks, a task's outcome settled as its call's (the gate screens it
//! with the task's tool as its source).

use super::*;

impl Exchange {
    /// The answer to a `tools/call` that created a task: the client gets the
    /// task's sealed id, and the call's budget waits for the task's outcome.
    pub(super) fn task_created(
        &mut self,
        pos: usize,
        raw: &str,
        task: NewTask,
    ) -> Result<Pass, UpstreamFailure> {
        let NewTask {
            upstream_id,
            ttl_ms,
        } = task;
        let tool = self.due[pos].tool.clone().unwrap_or_default();
        let cx = self.run.clone();
        let who = cx.principal();
        let sealed = tasks::seal(&cx.sessions, &who, &upstream_id, &tool);
        let tool = tool.clone();
        let mut v: Value = serde_json::from_str(raw)
            .map_err(|e| UpstreamFailure::Invalid(format!("unreadable task: {e}")))?;
        let sealed_ok =
            tasks::replace_at(&mut v, &["result", "task", "taskId"], |_| sealed.clone())
                || tasks::replace_at(&mut v, &["result", "taskId"], |_| sealed.clone());
        if !sealed_ok {
            return Err(UpstreamFailure::Invalid(
                "a task without a readable id".to_owned(),
            ));
        }
        // The call's budget is settled by the task's outcome.
        let reservation = self.due[pos].reservation.take();
        cx.tasks.created(
            &cx.budgets,
            (cx.upstream.config.name.clone(), upstream_id),
            tasks::owner(&who),
            tool,
            reservation,
            ttl_ms.map_or(tasks::MAX_TASK_TTL, std::time::Duration::from_millis),
        );
        Ok(Pass::Replaced(v.to_string()))
    }

    /// The answer to a `tasks/*` request of the run's own task: ids sealed,
    /// `tasks/list` kept to the run's own tasks, a task's outcome inspected
    /// and settled as its call's, its input requests policed.
    pub(super) fn task_answer(
        &mut self,
        pos: usize,
        method: TaskMethod,
        raw: &str,
    ) -> Result<Pass, UpstreamFailure> {
        let cx = self.run.clone();
        let who = cx.principal();
        let owner = tasks::owner(&who);
        let upstream = cx.upstream.config.name.clone();
        let task = self.due[pos].task.clone();
        let tool = task.as_ref().map_or("", |t| t.tool.as_str()).to_owned();
        let mut v: Value = serde_json::from_str(raw)
            .map_err(|e| UpstreamFailure::Invalid(format!("unreadable task answer: {e}")))?;
        let seal = |id: &str| tasks::seal(&cx.sessions, &who, id, &tool);
        match method {
            TaskMethod::List => {
                if let Some(list) = v.pointer_mut("/result/tasks").and_then(Value::as_array_mut) {
                    let mut kept = Vec::with_capacity(list.len());
                    for mut t in list.drain(..) {
                        let id = t.get("taskId").and_then(Value::as_str).unwrap_or("");
                        if let Some(tool) = cx.tasks.tool_of(&upstream, id, &owner) {
                            tasks::replace_at(&mut t, &["taskId"], |id| {
                                tasks::seal(&cx.sessions, &who, id, &tool)
                            });
                            kept.push(t);
                        }
                    }
                    *list = kept;
                }
            }
            TaskMethod::Result => {
                let upstream_id = task
                    .as_ref()
                    .map(|t| t.upstream_id.clone())
                    .unwrap_or_default();
                tasks::replace_at(
                    &mut v,
                    &[
                        "result",
                        "_meta",
                        "io.modelcontextprotocol/related-task",
                        "taskId",
                    ],
                    |id| seal(id),
                );
                if let Some(result) = v.get("result") {
                    let cost = tasks::reported_cost(result, &cx.budgets.config().cost_meta_key);
                    cx.tasks.outcome(&cx.budgets, &upstream, &upstream_id, cost);
                }
            }
            TaskMethod::Get | TaskMethod::Cancel | TaskMethod::Update => {
                tasks::replace_at(&mut v, &["result", "taskId"], |id| seal(id));
                // 2026-07-28: a completed task carries its call's outcome
                // (its input requests were decided on).
                let terminal = matches!(
                    v.pointer("/result/status").and_then(Value::as_str),
                    Some("completed" | "failed" | "cancelled")
                );
                if terminal {
                    if let Some(t) = &task {
                        let cost = v.pointer("/result/result").and_then(|r| {
                            tasks::reported_cost(r, &cx.budgets.config().cost_meta_key)
                        });
                        cx.tasks
                            .outcome(&cx.budgets, &upstream, &t.upstream_id, cost);
                    }
                }
            }
        }
        // A task's outcome is its call's result: the gate screens it, with
        // the task's tool as its source.
        Ok(Pass::Replaced(v.to_string()))
    }

    /// A message naming the run's own tasks, relayed with their ids sealed
    /// (those of an acknowledgement: only the run's own, decided on).
    pub(super) fn seal_task_ids(&self, raw: &str, at: TaskIds) -> Result<Pass, UpstreamFailure> {
        let cx = &self.run;
        let who = cx.principal();
        let owner = tasks::owner(&who);
        let upstream = &cx.upstream.config.name;
        let seal = |id: &str| {
            let tool = cx.tasks.tool_of(upstream, id, &owner).unwrap_or_default();
            tasks::seal(&cx.sessions, &who, id, &tool)
        };
        let mut v: Value = serde_json::from_str(raw)
            .map_err(|e| UpstreamFailure::Invalid(format!("unreadable task message: {e}")))?;
        let sealed = match at {
            TaskIds::Status => tasks::replace_at(&mut v, &["params", "taskId"], seal),
            TaskIds::Related => tasks::replace_at(
                &mut v,
                &[
                    "params",
                    "_meta",
                    "io.modelcontextprotocol/related-task",
                    "taskId",
                ],
                seal,
            ),
            TaskIds::Acknowledged(kept) => {
                let ids: Vec<Value> = kept.iter().map(|id| Value::String(seal(id))).collect();
                match v.pointer_mut("/params/notifications") {
                    Some(Value::Object(n)) => {
                        n.insert("taskIds".to_owned(), Value::Array(ids));
                        true
                    }
                    _ => false,
                }
            }
        };
        if !sealed {
            return Err(UpstreamFailure::Invalid(
                "a task message without a readable task id".to_owned(),
            ));
        }
        Ok(Pass::Replaced(v.to_string()))
    }
}
