//! The gate: the one place every upstream message passes on its way to
//! the client. Whatever its method, HTTP status, content type or framing
//! (a JSON answer, each SSE event, each message of a batch, an error, a
//! 4xx body, a server-to-client request, a task's outcome or its input
//! requests, `initialize`, a list), the text that is about to leave is
//! screened here as one unit ([`crate::screen::content::screen_message`]:
//! every string decoded and folded, member names with their values,
//! consecutive parts and events read across their boundaries) and gives
//! the run the labels of its source before any byte of it leaves. What the
//! gate cannot hold whole is not relayed ([`may_stream`]).
//!
//! Where each model-visible field is, and how it is treated, is
//! [`FIELDS`]: the screening table of `docs/security.md` is this one (a
//! test in `tests/integration/docs.rs` holds them together).

use crate::mcp::jsonrpc::{Kind, Message};
use crate::mcp::methods::Class;
use crate::policy::Labels;
use crate::screen::content::{self, Action, Carry};

use super::{stamp, Exchange, Pass};
use crate::audit::AuditRow;
use crate::proxy::answer;
use crate::upstream::failure::UpstreamFailure;
use crate::verdict::answer::{result_text, Answering, Content, Scope};

/// How the gate treats a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treated {
    /// Content for the model: screened (flag, redact, block withholds the
    /// message) and labels the run with its source.
    Content,
    /// A definition the model reads (a tool, prompt or resource as
    /// listed): screened (block hides the item, redact redacts), pinned,
    /// and gives no labels (it is no content the run took in).
    Definition,
    /// Protocol, not read by the model: screened all the same (the gate
    /// reads every string), labels nothing.
    Protocol,
}

/// One row of the table of what reaches the client.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The message.
    pub message: &'static str,
    /// The field, as a JSON path.
    pub field: &'static str,
    /// How it is treated.
    pub treated: Treated,
    /// Why.
    pub why: &'static str,
}

/// Every field of an upstream message that a client may show its model,
/// and the rest: how each is treated. Every string of every message is
/// screened by the same gate; this says which labels what.
pub const FIELDS: &[Field] = &[
    Field {
        message: "tools/call result",
        field:
            "result.content[*] (text, resource text, image/audio data), result.structuredContent",
        treated: Treated::Content,
        why: "the tool's output: the model reads it; labels of the tool and its upstream",
    },
    Field {
        message: "tools/call, prompts/get, resources/read, tasks/* error",
        field: "error.message, error.data",
        treated: Treated::Content,
        why: "clients hand error text to the model; labels of the tool or upstream",
    },
    Field {
        message: "HTTP 4xx body",
        field: "the whole body (JSON-RPC errors, or text)",
        treated: Treated::Content,
        why: "relayed with its status; the client may show it; labels of the upstream",
    },
    Field {
        message: "prompts/get result",
        field: "result.messages[*].content, result.description",
        treated: Treated::Content,
        why: "the prompt is put before the model; labels of the upstream",
    },
    Field {
        message: "resources/read result",
        field: "result.contents[*].text, .blob",
        treated: Treated::Content,
        why: "the resource is read into the context; labels of the upstream",
    },
    Field {
        message: "tasks/result, tasks/get (terminal) result",
        field: "result (the call's outcome), result.result",
        treated: Treated::Content,
        why: "a task's outcome is its call's result; labels of the task's tool",
    },
    Field {
        message: "input-required result, tasks/get (input_required)",
        field: "result.inputRequests[*].params (messages, elicitation message, schema)",
        treated: Treated::Content,
        why: "asks the client's model or user; labels of the upstream",
    },
    Field {
        message: "sampling/createMessage, elicitation/create (server-to-client requests)",
        field: "params (messages, systemPrompt, message, requestedSchema)",
        treated: Treated::Content,
        why: "put to the client's model or user; block refuses the request upstream",
    },
    Field {
        message: "initialize result",
        field: "result.instructions",
        treated: Treated::Content,
        why: "goes into the model's system prompt; labels of the upstream when present",
    },
    Field {
        message: "initialize result",
        field: "result.serverInfo (name, title, description)",
        treated: Treated::Protocol,
        why: "shown to the user; screened, labels nothing",
    },
    Field {
        message: "tools/list, prompts/list, resources/list, resources/templates/list",
        field: "each item's name, title, description, inputSchema, outputSchema, annotations",
        treated: Treated::Definition,
        why:
            "read by the model to choose; an item with a blocked kind is hidden, the rest redacted",
    },
    Field {
        message: "notifications/message, notifications/progress",
        field: "params.data, params.message",
        treated: Treated::Protocol,
        why: "logs and progress, shown to the user; screened, labels nothing",
    },
    Field {
        message: "completion/complete result",
        field: "result.completion.values",
        treated: Treated::Protocol,
        why: "suggestions for the user's input; screened, labels nothing",
    },
    Field {
        message: "every message",
        field: "jsonrpc, id, method, _meta, task ids, cursors",
        treated: Treated::Protocol,
        why: "protocol; screened with the rest of the message",
    },
];

/// Where the content a message carries comes from: the labels it gives
/// the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source<'a> {
    /// A tool's output (its labels and its upstream's).
    Tool(&'a str),
    /// The upstream's (its labels).
    Upstream,
    /// Definitions or protocol: no labels.
    Nothing,
}

impl<'a> Source<'a> {
    /// The labels content from this source gives the run.
    pub(crate) fn labels(self, s: Scope<'_>) -> Labels {
        match self {
            Source::Tool(tool) => s.policy.traits(s.upstream.facts(), tool).labels,
            Source::Upstream => s.policy.content_labels(s.upstream.facts()),
            Source::Nothing => Labels::NONE,
        }
    }

    /// The tool, for the actions of its `[[screen.rule]]`.
    pub(crate) fn tool(self) -> Option<&'a str> {
        match self {
            Source::Tool(t) => Some(t),
            _ => None,
        }
    }
}

/// The source of one upstream message: what it answers (`answering`, with
/// the tool of a task's call as its tool) and what it is.
pub(crate) fn source_of<'a>(
    m: &Message,
    result: Option<&str>,
    answering: Option<Answering<'a>>,
) -> Source<'a> {
    match m.kind {
        Kind::Request => Source::Upstream,
        Kind::Notification => Source::Nothing,
        Kind::Response => {
            let Some(a) = answering else {
                return Source::Nothing;
            };
            let by_tool = a.tool.map_or(Source::Upstream, Source::Tool);
            if m.is_error {
                return match a.class {
                    Class::List(_) | Class::Pass | Class::Completion | Class::Listen => {
                        Source::Upstream
                    }
                    _ => by_tool,
                };
            }
            // An empty result (`{}`: a subscription acknowledged) carries
            // nothing.
            let empty = result.is_none_or(|r| r.trim().len() <= 2);
            match a.class {
                _ if empty => Source::Nothing,
                Class::ToolCall | Class::Task(_) => by_tool,
                Class::Prompt | Class::Resource => Source::Upstream,
                Class::Pass if result.is_some_and(has_instructions) => Source::Upstream,
                _ => Source::Nothing,
            }
        }
    }
}

/// Whether a result carries `instructions` (an `initialize` answer's,
/// for the model's system prompt).
fn has_instructions(result: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe<'a> {
        #[serde(borrow)]
        instructions: Option<std::borrow::Cow<'a, str>>,
    }
    result.contains("instructions")
        && serde_json::from_str::<Probe>(result)
            .ok()
            .and_then(|p| p.instructions)
            .is_some_and(|i| !i.trim().is_empty())
}

/// Screens `text`, one upstream message as it is about to leave (JSON),
/// from `source`, continuing `carry` (the earlier events of the same
/// answer): `None` when nothing was found and it gives no labels. A list
/// answer's definitions are screened with their scans remembered
/// (`recall`: [`content::Recall::Remembered`]).
///
/// # Errors
/// Text that is not JSON (the strict reader accepted it: never).
pub(crate) fn screen(
    s: Scope<'_>,
    source: Source<'_>,
    text: &str,
    carry: Option<&mut Carry>,
    recall: content::Recall,
) -> Result<Option<Content>, UpstreamFailure> {
    let screening = s.policy.screening();
    let actions = screening.actions(&s.upstream.name, source.tool());
    let found = content::screen_message(screening.scanner(), actions, text, carry, recall)
        .map_err(|e| UpstreamFailure::Invalid(format!("unreadable content: {e}")))?;
    Ok(content_of(
        found.report,
        found.redacted,
        actions,
        source.labels(s),
    ))
}

/// Screens a body that is not JSON (a 4xx text body) from `source`.
pub(crate) fn screen_text(s: Scope<'_>, source: Source<'_>, text: &str) -> Option<Content> {
    let screening = s.policy.screening();
    let actions = screening.actions(&s.upstream.name, source.tool());
    let found = content::screen_text(screening.scanner(), actions, text);
    content_of(found.report, found.redacted, actions, source.labels(s))
}

fn content_of(
    report: content::Report,
    redacted: Option<String>,
    actions: content::Actions,
    labels: Labels,
) -> Option<Content> {
    let labels = if report.injection() {
        labels.union(Labels::UNTRUSTED)
    } else {
        labels
    };
    if report.is_empty() && labels.is_empty() {
        return None;
    }
    Some(Content {
        report,
        actions,
        redacted,
        labels,
    })
}

/// Whether an answer too large to hold whole (answering `tools`) may
/// stream past the gate: only when screening looks for nothing on this
/// upstream and its content gives the run no labels. Anything else is
/// refused, never relayed unscreened.
pub(crate) fn may_stream(s: Scope<'_>, tools: &[Option<&str>]) -> bool {
    let screening = s.policy.screening();
    if !s.policy.content_labels(s.upstream.facts()).is_empty() {
        return false;
    }
    std::iter::once(None)
        .chain(tools.iter().copied())
        .all(|tool| {
            screening.actions(&s.upstream.name, tool).all_off()
                && tool.is_none_or(|t| Source::Tool(t).labels(s).is_empty())
        })
}

// === the gate carried out on the relay ===

impl Exchange {
    /// The gate ([`gate`](mod@crate::proxy::outbound::gate)): one upstream
    /// message about to leave, screened whole as it would leave (after the
    /// verdict's rewrites), the run given the labels of its source before
    /// any byte of it leaves, and screening's verdict carried out (flagged:
    /// relayed; redacted; blocked: a response withheld, a server request
    /// refused upstream, a notification dropped).
    pub(super) fn gate(
        &mut self,
        m: &Message,
        raw: &str,
        pos: Option<usize>,
        pass: Pass,
        rows: &mut Vec<AuditRow>,
    ) -> Result<(Pass, Option<Box<Content>>), UpstreamFailure> {
        let text = match &pass {
            Pass::Same => raw,
            Pass::Replaced(t) => t.as_str(),
            Pass::Dropped => return Ok((pass, None)),
        };
        let run = self.run.clone();
        // A task's outcome is its call's: the task's tool is its source.
        let tool = pos.and_then(|p| {
            let d = &self.due[p];
            d.tool
                .clone()
                .or_else(|| d.task.as_ref().map(|t| t.tool.clone()))
                .filter(|t| !t.is_empty())
        });
        let answering = pos.map(|p| Answering {
            class: &self.due[p].class,
            tool: tool.as_deref(),
            approved: self.due[p].granted.is_some(),
        });
        // A list's definitions recur answer after answer: their scans are
        // remembered (the whole text is still screened here).
        let listing = !m.is_error
            && answering
                .as_ref()
                .is_some_and(|a| matches!(a.class, Class::List(_)));
        let recall = if listing {
            content::Recall::Remembered
        } else {
            content::Recall::Fresh
        };
        let source = source_of(m, result_text(m, raw), answering);
        let Some(c) = screen(
            run.answer_scope(),
            source,
            text,
            self.carry.as_mut(),
            recall,
        )?
        else {
            return Ok((pass, None));
        };
        let method = pos
            .map(|p| self.due[p].method.clone())
            .or_else(|| m.method.clone())
            .unwrap_or_default();
        self.note_content(&c, &method, tool.as_deref());
        let pass = match c.report.action {
            Action::Block => {
                let kinds = c.report.names_for(c.actions, Action::Block);
                match m.kind {
                    Kind::Response => Pass::Replaced(
                        String::from_utf8_lossy(&answer::withheld(
                            m.id.as_ref(),
                            tool.as_deref(),
                            &kinds,
                        ))
                        .into_owned(),
                    ),
                    Kind::Request => {
                        let why = format!("it carried {}, which [screen] blocks", kinds.join(", "));
                        if self.recorder.enabled() {
                            let mut row = self.recorder.refused_server_request(m, why.clone());
                            stamp(&mut row, &c);
                            rows.push(row);
                        }
                        self.refuse_server_request(m, &why);
                        Pass::Dropped
                    }
                    Kind::Notification => {
                        tracing::info!(upstream = %run.upstream.config.name, method = %method, found = ?kinds, "dropped a notification [screen] blocks");
                        Pass::Dropped
                    }
                }
            }
            Action::Redact => match &c.redacted {
                Some(r) => Pass::Replaced(r.clone()),
                None => {
                    return Err(UpstreamFailure::Invalid(
                        "content that could not be redacted".to_owned(),
                    ))
                }
            },
            _ => pass,
        };
        if m.kind == Kind::Request && !matches!(pass, Pass::Dropped) && self.recorder.enabled() {
            // A server-to-client request with content: its own row.
            let mut row = self.recorder.relayed_server_request(m);
            stamp(&mut row, &c);
            rows.push(row);
        }
        Ok((pass, Some(Box::new(c))))
    }

    /// Screened content's effects beside the message: counted, logged,
    /// the run's labels taken.
    pub(super) fn note_content(&mut self, c: &Content, method: &str, tool: Option<&str>) {
        let cx = self.run.clone();
        let upstream = &cx.upstream.config.name;
        for k in &c.report.kinds {
            cx.metrics
                .finding(upstream, k.name(), c.actions.for_kind(*k).as_str());
        }
        if !c.report.is_empty() {
            tracing::info!(
                upstream = %upstream,
                method = %method,
                tool = tool.unwrap_or(""),
                found = ?c.report.names(),
                action = %c.report.action,
                "screening found content"
            );
        }
        self.take_labels(c.labels, method, tool);
    }

    /// The run took in content with `labels`: stored (in Redis too, when
    /// shared) before the answer leaves.
    pub(super) fn take_labels(&mut self, labels: Labels, method: &str, tool: Option<&str>) {
        if labels.is_empty() {
            return;
        }
        let cx = &self.run;
        for name in labels.names() {
            cx.metrics.run_label(name);
        }
        let upstream = &cx.upstream.config.name;
        let stored = cx.budgets.labels().take(
            &cx.claims.tenant_id,
            &cx.claims.run_id,
            labels,
            || match tool {
                Some(tool) => format!("{upstream}: {method} {tool}"),
                None => format!("{upstream}: {method}"),
            },
            &cx.metrics,
        );
        self.settling.extend(stored);
    }
}
