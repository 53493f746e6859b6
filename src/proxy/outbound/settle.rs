//! How what was forwarded ends: each due's budget settled and its call
//! counted, its row completed ([`Exchange::answered`], [`Exchange::end_all`])
//! and written once the settlements its answer waits for are in; a failed
//! upstream answered in every waiting request's place ([`Exchange::fail`]);
//! and the drop guard that ends what is still open when the client goes
//! away.

use super::*;

/// Longest an answer waits for its budget settlement in a shared store.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

impl Exchange {
    /// Writes rows, once the budget settlements of the answers about to
    /// leave are in (each bounded by [`SETTLE_WAIT`]).
    pub(super) async fn write(&mut self, rows: Vec<AuditRow>) {
        for h in self.settling.drain(..) {
            let _ = tokio::time::timeout(SETTLE_WAIT, h).await;
        }
        self.recorder.write(rows).await;
    }

    /// The error for a failed upstream, answering every waiting request;
    /// the open rows are written as failed first.
    ///
    /// Boxed, like the other rare ends of an exchange ([`Exchange::accepted`],
    /// [`Exchange::client_error`]): awaited inline, each would make the
    /// future of every request, which holds the largest of its awaits, a few
    /// KB larger (allocated and copied per request, and resident for every
    /// one in flight).
    pub(crate) fn fail(mut self, failure: UpstreamFailure) -> BoxFuture<'static, ProxyError> {
        Box::pin(async move {
            let ids: Vec<Id> = self.due.iter().filter_map(|d| d.id.clone()).collect();
            let rows = self.end_all(
                StopReason::UpstreamError,
                &failure.to_string(),
                settle_for(&failure),
            );
            self.write(rows).await;
            ProxyError::Upstream {
                upstream: self.run.upstream.config.name.clone(),
                failure,
                ids,
            }
        })
    }

    /// Ends every open due: rows completed with `stop`, budgets settled.
    pub(super) fn end_all(&mut self, stop: StopReason, cause: &str, how: Settle) -> Vec<AuditRow> {
        let mut rows = Vec::new();
        for mut d in std::mem::take(&mut self.due) {
            self.settle(&mut d, how, stop, None);
            if let Some(row) = d.row.take() {
                rows.push(self.recorder.fail(
                    row,
                    stop,
                    cause,
                    self.status,
                    self.upstream_started,
                    self.bytes_out,
                ));
            }
        }
        rows
    }

    /// Closes a due's reservation and counts its outcome.
    pub(super) fn settle(
        &mut self,
        d: &mut Due,
        how: Settle,
        stop: StopReason,
        answer: Option<&str>,
    ) {
        let how = match (how, answer) {
            (Settle::Executed { .. }, Some(raw)) => Settle::Executed {
                reported: reported_cost(raw, &self.run.budgets.config().cost_meta_key),
            },
            (how, _) => how,
        };
        if let Some(r) = d.reservation.take() {
            self.settling.extend(self.run.budgets.settle(&r, how));
        }
        if let (Some(tool), false) = (&d.tool, d.resumed) {
            let cx = &self.run;
            cx.metrics.call(
                &cx.upstream.config.name,
                &crate::proxy::tool_label(cx, tool),
                stop,
            );
        }
    }

    /// Completes the due answering `id` with `answer` (as relayed).
    /// `parts` locate its `result` or `error` when they are known
    /// already; else the completion row reads them out of `answer`.
    pub(super) fn answered(
        &mut self,
        pos: usize,
        answer: &str,
        parts: Option<AnswerParts<'_>>,
    ) -> Option<AuditRow> {
        let mut d = self.due.swap_remove(pos);
        self.settle(
            &mut d,
            Settle::Executed { reported: None },
            StopReason::Done,
            Some(answer),
        );
        let row = match d.row.take() {
            Some(row) => Some(row),
            None if d.resumed && self.recorder.enabled() => {
                let mut row = self.recorder.transport("GET", String::new());
                row.method = d.method.clone().into();
                row.jsonrpc_id = d.id.as_ref().map(|i| i.to_string()).unwrap_or_default();
                row.reason = "answer delivered on a resumed stream".to_owned();
                Some(row)
            }
            None => None,
        };
        row.map(|row| {
            let parts = parts.unwrap_or_else(|| AnswerParts::of(answer));
            self.recorder.complete_with(
                row,
                Some(parts),
                self.status,
                self.upstream_started,
                self.bytes_out,
            )
        })
    }
}

impl Drop for Exchange {
    /// The client went away (or the firewall is dropping the answer): what
    /// is still open ends as `client_gone`, its budget kept (the upstream
    /// may have acted), its row written off the request's task.
    fn drop(&mut self) {
        if self.due.is_empty() {
            return;
        }
        let stop = match self.kind {
            ExchangeKind::Get => StopReason::Done,
            _ => StopReason::ClientGone,
        };
        let cause = match self.kind {
            ExchangeKind::Get => "the client closed the stream",
            _ => "the client went away before the answer reached it",
        };
        let rows = self.end_all(stop, cause, Settle::Executed { reported: None });
        if rows.is_empty() {
            return;
        }
        let auditor = self.recorder.auditor().clone();
        let n = rows.len();
        if !crate::server::shards::spawn_detached(async move { write_rows(&auditor, rows).await }) {
            tracing::error!(rows = n, "completion rows lost: no runtime");
        }
    }
}

/// How a failed call's budget is settled: refunded only when it certainly
/// never reached the upstream.
pub(super) fn settle_for(failure: &UpstreamFailure) -> Settle {
    match failure {
        UpstreamFailure::Connect(_) => Settle::NotExecuted,
        _ => Settle::Executed { reported: None },
    }
}

/// The cost an upstream reports in a `tools/call` result's `_meta[key]`.
pub(super) fn reported_cost(raw: &str, key: &str) -> Option<f64> {
    if raw.is_empty() || !raw.contains(key) {
        return None;
    }
    let v: Value = serde_json::from_str(raw).ok()?;
    v.get("result")?.get("_meta")?.get(key)?.as_f64()
}
