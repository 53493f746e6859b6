//! One upstream message: the answer-side verdict
//! ([`crate::verdict::answer::decide`]) carried out (lists filtered, input
//! requests refused, request states and task ids sealed, progress
//! shifted, server requests refused upstream), then the gate, then the
//! row of the request it answers.

use super::*;

impl Exchange {
    /// Carries out the answer-side decision
    /// ([`decide`](crate::verdict::answer::decide)) on one upstream message;
    /// `raw` is its text. What is to leave then passes the gate
    /// ([`Exchange::gate`]) before its row is completed.
    pub(super) fn on_message(
        &mut self,
        m: &Message,
        raw: &str,
        read: Option<Read<'_>>,
        rows: &mut Vec<AuditRow>,
    ) -> Result<Pass, UpstreamFailure> {
        let pos =
            m.id.as_ref()
                .filter(|_| m.kind == Kind::Response)
                .and_then(|id| self.due.iter().position(|d| d.id.as_ref() == Some(id)));
        let run = self.run.clone();
        let answering = pos.map(|p| Answering {
            class: &self.due[p].class,
            tool: self.due[p].tool.as_deref(),
            approved: self.due[p].granted.is_some(),
        });
        let verdict = verdict::answer::decide(run.answer_scope(), m, raw, answering)?;
        let lists = matches!(verdict, Verdict::Filter(_));
        let Some(Carried {
            pass,
            mut view_at,
            own,
        }) = self.carry_out(verdict, m, raw, read, pos, rows)?
        else {
            return Ok(Pass::Dropped);
        };
        let (pass, mut screened) = if own {
            (pass, None)
        } else {
            self.gate(m, raw, pos, pass, rows)?
        };
        if screened.as_ref().is_some_and(|c| c.redacted.is_some()) {
            view_at = None;
        }
        if lists {
            self.add_listed_found(&mut screened);
        }
        if let Some(pos) = pos {
            let row = self.complete(pos, m, raw, read, &pass, view_at);
            rows.extend(row.map(|mut row| {
                if let Some(c) = &screened {
                    stamp(&mut row, c);
                }
                row
            }));
        }
        Ok(pass)
    }

    /// What the verdict makes of the message (`pos`: the due it answers);
    /// `None` when it is dropped here, before the gate (nothing of it
    /// leaves).
    fn carry_out(
        &mut self,
        verdict: Verdict,
        m: &Message,
        raw: &str,
        read: Option<Read<'_>>,
        pos: Option<usize>,
        rows: &mut Vec<AuditRow>,
    ) -> Result<Option<Carried>, UpstreamFailure> {
        // Where a filtered list's view is in what is relayed.
        let mut view_at = None;
        // An answer the firewall made in the upstream's place: nothing of
        // the upstream's reaches the client.
        let mut own = false;
        let pass = match verdict {
            Verdict::Relay => Pass::Same,
            Verdict::Unsolicited => {
                tracing::info!(upstream = %self.run.upstream.config.name, id = ?m.id, "dropped an answer to a request this exchange did not send");
                return Ok(None);
            }
            Verdict::Filter(kind) => Pass::Replaced(match kind {
                ListKind::Tools => {
                    let (out, at) = self.filter_listed_tools(m, raw, read)?;
                    view_at = at;
                    out
                }
                ListKind::Prompts => self.filter_named(raw, kind, "prompts", "name")?,
                ListKind::Resources => self.filter_named(raw, kind, "resources", "uri")?,
                ListKind::ResourceTemplates => {
                    self.filter_named(raw, kind, "resourceTemplates", "uriTemplate")?
                }
            }),
            Verdict::RefuseInputRequests(refused) => {
                for r in &refused {
                    tracing::info!(upstream = %self.run.upstream.config.name, method = %r.method, reason = %r.why, "input request refused");
                }
                let methods: Vec<String> = refused.into_iter().map(|r| r.method).collect();
                let body = answer::refused_input_request(m.id.as_ref(), &methods);
                own = true;
                Pass::Replaced(String::from_utf8_lossy(&body).into_owned())
            }
            Verdict::SealState(state) => {
                let granted = pos.and_then(|p| self.due[p].granted.clone());
                self.seal_request_state(m, raw, granted.as_deref(), state)?
            }
            Verdict::TaskCreated(task) => match pos {
                Some(p) => self.task_created(p, raw, task)?,
                None => Pass::Same,
            },
            Verdict::Task(method) => match pos {
                Some(p) => self.task_answer(p, method, raw)?,
                None => Pass::Same,
            },
            Verdict::RefuseServerRequest(why) => {
                if self.recorder.enabled() {
                    rows.push(self.recorder.refused_server_request(m, why.clone()));
                }
                self.refuse_server_request(m, &why);
                return Ok(None);
            }
            Verdict::ListChanged => {
                list_changed(&self.run);
                Pass::Same
            }
            Verdict::Progress => self.shift_progress(raw),
            Verdict::SealTasks(at) => self.seal_task_ids(raw, at)?,
            Verdict::ForeignTask => {
                tracing::debug!(upstream = %self.run.upstream.config.name, "dropped a notification about another run's task");
                return Ok(None);
            }
        };
        Ok(Some(Carried { pass, view_at, own }))
    }

    /// What screening found in the definitions of the tools a list
    /// answer names, added to what the gate found in the answer.
    fn add_listed_found(&self, screened: &mut Option<Box<Content>>) {
        let found = self
            .listed_found
            .lock()
            .map(|mut f| std::mem::take(&mut *f))
            .unwrap_or_default();
        if found.is_empty() {
            return;
        }
        match screened {
            Some(c) => c.report.merge(&found),
            None => {
                *screened = Some(Box::new(Content {
                    report: found,
                    actions: self
                        .run
                        .policy
                        .screening()
                        .actions(&self.run.upstream.config.name, None),
                    redacted: None,
                    labels: Labels::NONE,
                }))
            }
        }
    }

    /// The completion row of the due at `pos`, answered by `m` as it is
    /// relayed: a replaced text (the list's view at `view_at` in it), or
    /// the message as read off the tape (its result's span known, its
    /// error a member of its node).
    fn complete(
        &mut self,
        pos: usize,
        m: &Message,
        raw: &str,
        read: Option<Read<'_>>,
        pass: &Pass,
        view_at: Option<std::ops::Range<usize>>,
    ) -> Option<AuditRow> {
        let (relayed, parts) = match pass {
            Pass::Replaced(t) => (
                t.as_str(),
                view_at.and_then(|at| {
                    Some(AnswerParts {
                        result: Some(t.get(at)?),
                        error: None,
                        is_error: None,
                    })
                }),
            ),
            _ => (
                raw,
                read.zip(m.node).map(|(r, n)| AnswerParts {
                    result: m.result.clone().and_then(|at| r.text.get(at)),
                    error: m
                        .is_error
                        .then(|| r.tape.member(r.text, n, "error"))
                        .flatten()
                        .map(|x| r.tape.text(r.text, x)),
                    is_error: (!m.is_error)
                        .then(|| result_is_error(r.tape, r.text, n))
                        .flatten(),
                }),
            ),
        };
        self.answered(pos, relayed, parts)
    }

    /// Keeps a held call's progress increasing past what the hold sent.
    fn shift_progress(&self, raw: &str) -> Pass {
        let Some(shift) = &self.progress else {
            return Pass::Same;
        };
        let Ok(mut v) = serde_json::from_str::<Value>(raw) else {
            return Pass::Same;
        };
        let Some(params) = v.get_mut("params").and_then(Value::as_object_mut) else {
            return Pass::Same;
        };
        if params.get("progressToken") != Some(&shift.token) {
            return Pass::Same;
        }
        for key in ["progress", "total"] {
            if let Some(n) = params.get(key).and_then(Value::as_f64) {
                params.insert(key.to_owned(), Value::from(n + shift.offset));
            }
        }
        Pass::Replaced(v.to_string())
    }

    /// An input-required result of a call that ran under an approval: the
    /// approval (and the upstream's own `state`) is sealed into the
    /// `requestState`, so the retry runs under it.
    fn seal_request_state(
        &self,
        m: &Message,
        raw: &str,
        granted: Option<&Granted>,
        state: Option<String>,
    ) -> Result<Pass, UpstreamFailure> {
        let (Some(granted), Some(result)) = (granted, result_text(m, raw)) else {
            // Nothing to seal (never for a call that ran under an approval).
            return Ok(Pass::Same);
        };
        let sealed = self.run.seal_granted(granted, state);
        let new_result = set_member(result, "requestState", &Value::String(sealed).to_string())
            .ok_or_else(|| {
                UpstreamFailure::Invalid("unreadable input-required result".to_owned())
            })?;
        let (Some(r), start) = (m.result.as_ref(), m.span.start) else {
            return Ok(Pass::Same);
        };
        let (head, tail) = (
            raw.get(..r.start - start).unwrap_or(""),
            raw.get(r.end - start..).unwrap_or(""),
        );
        Ok(Pass::Replaced(format!("{head}{new_result}{tail}")))
    }

    /// A legacy server-to-client request the policy refuses: the client never
    /// sees it; the upstream gets an error answer on the client's session.
    pub(super) fn refuse_server_request(&self, m: &Message, why: &str) {
        let method = m.method.as_deref().unwrap_or("");
        tracing::info!(upstream = %self.run.upstream.config.name, method, reason = why, "server-to-client request refused by policy");
        let (Some(id), Some(reply)) = (&m.id, &self.reply) else {
            return;
        };
        let body = answer::refused_server_request(id, method);
        let up = self.run.upstream.clone();
        let headers = reply.headers.clone();
        let conn = reply.conn;
        let identity = reply.identity.clone();
        let session = self.session.clone();
        crate::server::shards::spawn_detached(async move {
            let fwd = Forward {
                method: Method::POST,
                headers: &headers,
                query: None,
                body,
                conn,
                set: &identity,
                session: session.as_deref(),
                last_event_id: None,
            };
            if let Err(e) = up.send(fwd).await {
                tracing::warn!(upstream = %up.config.name, error = %e, "could not answer a refused server request");
            }
        });
    }
}

/// What a verdict made of a message, before the gate.
struct Carried {
    /// What is relayed.
    pass: Pass,
    /// Where a filtered list's view is in what is relayed.
    view_at: Option<std::ops::Range<usize>>,
    /// The firewall answered in the upstream's place: nothing of the
    /// upstream's reaches the client, so nothing passes the gate.
    own: bool,
}

/// The upstream's lists changed: the catalog forgets them (on every
/// replica), and with pinning on they are listed again at once, so a
/// changed definition is compared with its pin before any client lists
/// again.
fn list_changed(run: &Arc<RunContext>) {
    let upstream = &run.upstream.config.name;
    run.catalogs.clear(upstream);
    if let Some(shared) = run.budgets.store() {
        crate::catalog::announce_list_changed(shared.redis(), upstream);
    }
    if run.upstream.config.pinning != crate::pins::Mode::Off {
        let run = run.clone();
        tokio::spawn(async move {
            run.refills
                .refill(&run.catalogs, &run.upstream, &run.pins, Some(&run.claims))
                .await;
        });
    }
}

/// `json` (an object) with member `key` set to the raw JSON `value`.
fn set_member(json: &str, key: &str, value: &str) -> Option<String> {
    let map: std::collections::BTreeMap<&str, &RawValue> = serde_json::from_str(json).ok()?;
    let mut out = String::with_capacity(json.len() + value.len() + key.len() + 4);
    out.push('{');
    let mut first = true;
    let mut put = |out: &mut String, k: &str, v: &str| {
        if !std::mem::take(&mut first) {
            out.push(',');
        }
        out.push_str(&Value::String(k.to_owned()).to_string());
        out.push(':');
        out.push_str(v);
    };
    for (k, v) in &map {
        if *k != key {
            put(&mut out, k, v.get());
        }
    }
    put(&mut out, key, value);
    out.push('}');
    Some(out)
}

/// Whether the result of answer `n` says `"isError": true`, read off the
/// strict reader's tape (`None` when the tape does not hold the result's
/// members, or there is no result).
fn result_is_error(tape: &crate::mcp::tape::Tape, text: &str, n: usize) -> Option<bool> {
    let result = tape.member(text, n, "result")?;
    tape.children(result)?;
    Some(tape.member(text, result, "isError").is_some_and(|x| {
        tape.kind(x) == Some(crate::mcp::tape::Kind::Bool) && tape.text(text, x) == "true"
    }))
}

#[cfg(test)]
mod tests {
    use super::result_is_error;

    /// What the audit row's `is_error` was before the tape was asked: a
    /// typed read of `result`.
    fn by_serde(result: &str) -> bool {
        #[derive(serde::Deserialize)]
        struct IsError {
            #[serde(rename = "isError")]
            is_error: Option<bool>,
        }
        serde_json::from_str::<IsError>(result)
            .ok()
            .and_then(|x| x.is_error)
            .unwrap_or(false)
    }

    #[test]
    fn is_error_off_the_tape_is_what_a_typed_read_of_the_result_says() {
        for result in [
            r#"{"content":[],"isError":true}"#,
            r#"{"content":[],"isError":false}"#,
            r#"{"content":[]}"#,
            r#"{"isError":"true"}"#,
            r#"{"isError":null}"#,
            r#"{"isError":1}"#,
            r#"{"\u0069sError":true}"#,
            r#"{"content":[{"type":"text","text":"\"isError\":true"}]}"#,
            r#"{"nested":{"isError":true}}"#,
            r#"{}"#,
        ] {
            let text = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#);
            let env = crate::mcp::jsonrpc::parse_upstream(text.as_bytes()).unwrap();
            let tape = env.tape.as_ref().expect("an answer on the tape");
            let node = env.messages[0].node.unwrap();
            assert_eq!(
                result_is_error(tape, &text, node),
                Some(by_serde(result)),
                "{result}"
            );
        }
        // No result (an error answer): nothing to say.
        let text = r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"}}"#;
        let env = crate::mcp::jsonrpc::parse_upstream(text.as_bytes()).unwrap();
        let node = env.messages[0].node.unwrap();
        assert_eq!(
            result_is_error(env.tape.as_ref().unwrap(), text, node),
            None
        );
    }
}
