//! Every JSON text the upstream sends (a whole answer, an SSE event's
//! data, a batch) read once by the strict reader and inspected message by
//! message ([`Exchange::inspect`], each through `on_message`), a
//! `tools/list` answer seen before relayed as remembered; a whole JSON
//! answer ([`Exchange::whole`]) merged with the firewall's own answers.

use super::*;

impl Exchange {
    /// A whole JSON answer (read up to `max_response_bytes`): inspected,
    /// merged with the firewall's own answers, and every request it did
    /// not answer answered with an error of its own; with the rows to
    /// write before it leaves.
    pub(super) fn whole(
        &mut self,
        bytes: Bytes,
    ) -> Result<(Bytes, Vec<AuditRow>), UpstreamFailure> {
        let Ok(text) = std::str::from_utf8(&bytes) else {
            return Err(UpstreamFailure::Invalid("answer is not UTF-8".to_owned()));
        };
        let (out, mut rows) = self.inspect(text)?;
        let out = match out {
            Pass::Same => bytes,
            Pass::Replaced(t) => Bytes::from(t),
            Pass::Dropped => Bytes::new(),
        };
        let out = merge_json(&out, &self.local);
        self.bytes_out = out.len();
        if self.due.is_empty() {
            return Ok((out, rows));
        }
        // Requests the answer did not answer get an error of their own.
        let unanswered: Vec<Id> = self.due.iter().filter_map(|d| d.id.clone()).collect();
        let failure = UpstreamFailure::Invalid("the answer did not answer this request".to_owned());
        rows.extend(self.end_all(
            StopReason::UpstreamIncomplete,
            &failure.to_string(),
            Settle::Executed { reported: None },
        ));
        let name = self.run.upstream.config.name.clone();
        let extra: Vec<Bytes> = unanswered
            .iter()
            .map(|id| answer::upstream_error(Some(id), &name, &failure))
            .collect();
        let out = if extra.is_empty() {
            out
        } else {
            merge_json(&out, &extra)
        };
        Ok((out, rows))
    }

    /// Inspects one complete upstream JSON text (a message or a batch):
    /// what to send instead, and the rows it completes.
    pub(super) fn inspect(&mut self, text: &str) -> Result<(Pass, Vec<AuditRow>), UpstreamFailure> {
        if let Some(remembered) = self.remembered_list_answer(text) {
            return Ok(remembered);
        }
        // A whole tools/list answer is remembered with what the run was
        // given for it: the catalog's epoch is read before it is filtered.
        let epoch = self.run.catalogs.epoch();
        // An answer to a tools/list this exchange sent: the tools the
        // upstream listed last time are not read again where they are the
        // same bytes.
        let lists_tools = self
            .due
            .iter()
            .any(|d| d.class == Class::List(ListKind::Tools));
        let upstream = &self.run.upstream.config.name;
        let known = lists_tools
            .then(|| self.run.catalogs.known_tools(upstream))
            .flatten();
        let (env, learned) = jsonrpc::parse_upstream_known(text.as_bytes(), known.as_deref())
            .map_err(|e| UpstreamFailure::Invalid(e.to_string()))?;
        if let Some(learned) = learned.filter(|_| lists_tools) {
            self.run.catalogs.remember_known_tools(upstream, learned);
        }
        self.list_view_reused = false;
        let list_answer = match env.messages.as_slice() {
            [m] if !env.batch && m.kind == Kind::Response && !m.is_error => self
                .due
                .iter()
                .any(|d| d.class == Class::List(ListKind::Tools) && d.id.is_some() && d.id == m.id),
            _ => false,
        };
        let mut rows = Vec::new();
        let mut parts: Vec<(std::ops::Range<usize>, Pass)> = Vec::with_capacity(env.messages.len());
        let read = env.tape.as_ref().map(|tape| Read { text, tape });
        for m in &env.messages {
            let raw = text.get(m.span.clone()).unwrap_or("");
            let pass = self.on_message(m, raw, read, &mut rows)?;
            parts.push((m.span.clone(), pass));
        }
        // Only a result seen twice (a view reused): one that changes with
        // every answer is not worth the two extra reads.
        if let (true, true, [(_, Pass::Replaced(relayed))]) =
            (list_answer, self.list_view_reused, parts.as_slice())
        {
            let cx = &self.run;
            cx.catalogs.remember_answer(
                &cx.upstream.config.name,
                cx.view_generation(),
                &cx.authority,
                epoch,
                text,
                relayed,
            );
        }
        if parts.iter().all(|(_, p)| matches!(p, Pass::Same)) {
            return Ok((Pass::Same, rows));
        }
        if !env.batch {
            return Ok((parts.pop().map_or(Pass::Dropped, |(_, p)| p), rows));
        }
        let kept: Vec<&str> = parts
            .iter()
            .filter_map(|(span, p)| match p {
                Pass::Same => text.get(span.clone()),
                Pass::Replaced(t) => Some(t.as_str()),
                Pass::Dropped => None,
            })
            .collect();
        if kept.is_empty() {
            return Ok((Pass::Dropped, rows));
        }
        Ok((Pass::Replaced(format!("[{}]", kept.join(","))), rows))
    }

    /// A whole `tools/list` answer the firewall validated and filtered for
    /// this run's authority before, byte for byte but for its id
    /// ([`crate::catalog::Catalogs::remembered_answer`]): relayed as it was
    /// then, and on record like any answer.
    fn remembered_list_answer(&mut self, text: &str) -> Option<(Pass, Vec<AuditRow>)> {
        let cx = self.run.clone();
        let (pos, relayed) = self.due.iter().enumerate().find_map(|(pos, d)| {
            let id =
                d.id.as_ref()
                    .filter(|_| d.class == Class::List(ListKind::Tools))?;
            cx.catalogs
                .remembered_answer(
                    &cx.upstream.config.name,
                    cx.view_generation(),
                    &cx.authority,
                    text,
                    id,
                )
                .map(|relayed| (pos, relayed))
        })?;
        let (relayed, result) = relayed;
        let parts = AnswerParts {
            result: result.and_then(|r| relayed.get(r)),
            error: None,
            is_error: None,
        };
        let rows = self
            .answered(pos, &relayed, Some(parts))
            .into_iter()
            .collect();
        Some((Pass::Replaced(relayed), rows))
    }
}

/// The upstream's JSON answer (an object, an array or nothing) merged with
/// the firewall's own answers; unchanged when there are none.
pub(super) fn merge_json(upstream: &Bytes, local: &[Bytes]) -> Bytes {
    if local.is_empty() {
        return upstream.clone();
    }
    let mut out = Vec::with_capacity(
        upstream.len() + local.iter().map(Bytes::len).sum::<usize>() + local.len() + 2,
    );
    out.push(b'[');
    let mut first = true;
    let t = upstream.trim_ascii();
    let inner = match (t.first(), t.last()) {
        (Some(b'['), Some(b']')) => t[1..t.len() - 1].trim_ascii(),
        _ => t,
    };
    if !inner.is_empty() {
        out.extend_from_slice(inner);
        first = false;
    }
    for a in local {
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(a);
        first = false;
    }
    out.push(b']');
    Bytes::from(out)
}
