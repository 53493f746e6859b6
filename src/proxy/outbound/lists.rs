//! List answers (`tools/list`, `prompts/list`, `resources/list`,
//! `resources/templates/list`) kept to the run's view: each item decided
//! ([`crate::verdict::answer::tool_visible`], [`crate::verdict::answer::item_visible`]),
//! compared with its pin, and hidden where its definition carries a kind
//! `[screen]` blocks.

use super::*;

impl Exchange {
    /// The answer to a `tools/list` this exchange sent: its `result` is
    /// replaced by the run's view of it (remembered by the catalog when the
    /// upstream repeats itself), the rest of the message is kept as is.
    /// With it comes where the view is in it (for the completion row).
    pub(super) fn filter_listed_tools(
        &mut self,
        m: &Message,
        raw: &str,
        read: Option<Read<'_>>,
    ) -> Result<(String, Option<std::ops::Range<usize>>), UpstreamFailure> {
        let Some(at) = m.result.as_ref().and_then(|r| {
            Some(r.start.checked_sub(m.span.start)?..r.end.checked_sub(m.span.start)?)
        }) else {
            return Ok((self.filter_tools(raw)?, None));
        };
        let (Some(head), Some(result), Some(tail)) =
            (raw.get(..at.start), raw.get(at.clone()), raw.get(at.end..))
        else {
            return Ok((self.filter_tools(raw)?, None));
        };
        let cx = &self.run;
        let rewritten = std::cell::Cell::new(false);
        let view = cx
            .catalogs
            .view(
                &cx.upstream.config.name,
                cx.view_generation(),
                &cx.authority,
                result,
                || {
                    rewritten.set(true);
                    // Off the strict reader's tape when the answer was read
                    // onto one: the tools are not walked again.
                    // Its tools keep their view when only what is around
                    // them changed (a cursor, `_meta`), and each unchanged
                    // tool its own when others changed.
                    let on_tape = read.zip(m.node).and_then(|(r, n)| {
                        let result = r.tape.member(r.text, n, "result")?;
                        Some(rewrite::tools_result_on(r.text, r.tape, result, |tools| {
                            let up = &cx.upstream.config.name;
                            let stamps = cx.catalogs.stamps(up);
                            cx.catalogs.tools_view(
                                up,
                                cx.view_generation(),
                                &cx.authority,
                                tools.text(),
                                |prior| {
                                    tools.rewrite(
                                        prior,
                                        |name| stamps.of(name),
                                        |t| self.decide_listed_tool(t),
                                    )
                                },
                            )
                        }))
                    });
                    on_tape
                        .unwrap_or_else(|| rewrite::tools_result(result, |t| self.listed_tool(t)))
                },
            )
            .map_err(|e| UpstreamFailure::Invalid(e.to_string()))?;
        // A result seen before: the whole answer is worth remembering.
        self.list_view_reused = !rewritten.get();
        let mut out = String::with_capacity(head.len() + view.len() + tail.len());
        out.push_str(head);
        out.push_str(&view);
        out.push_str(tail);
        Ok((out, Some(head.len()..head.len() + view.len())))
    }

    pub(super) fn filter_tools(&self, raw: &str) -> Result<String, UpstreamFailure> {
        rewrite::tools_list(raw, |t| self.listed_tool(t))
            .map_err(|e| UpstreamFailure::Invalid(e.to_string()))
    }

    /// Records one listed tool in the catalog and compares it with its pin;
    /// the decision whether (and with which risk and gate) the run sees it
    /// is [`verdict::answer::tool_visible`].
    pub(super) fn listed_tool(
        &self,
        t: &rewrite::ListedTool<'_>,
    ) -> Option<(crate::policy::Risk, crate::policy::Gate)> {
        self.decide_listed_tool(t).0
    }

    /// [`Exchange::listed_tool`], with the stamp of the catalog entry it
    /// was decided on (a view of it may be shown again while the catalog
    /// holds that entry).
    pub(super) fn decide_listed_tool(
        &self,
        t: &rewrite::ListedTool<'_>,
    ) -> (Option<(crate::policy::Risk, crate::policy::Gate)>, u64) {
        let cx = &self.run;
        let up = &cx.upstream.config;
        let entry = cx.catalogs.record_listed(&up.name, t);
        let pinned = cx
            .pins
            .observe(
                up.pinning,
                &up.name,
                t.name,
                &entry.sha256,
                &entry.definition,
            )
            .is_ok();
        let valid_headers = entry.param_headers().violation().is_none();
        let mut shown = verdict::answer::tool_visible(
            cx.answer_scope(),
            t.name,
            entry.hints,
            pinned,
            valid_headers,
        );
        // What the model would read in the definition (poisoning cues):
        // reported, and the tool hidden where `block` applies.
        if shown.is_some() {
            let found =
                verdict::answer::listed_screen(cx.answer_scope(), Some(t.name), &entry.definition);
            if !found.is_empty() {
                let hidden = found.action == Action::Block;
                let action = if hidden { Action::Block } else { Action::Flag };
                for k in &found.kinds {
                    cx.metrics.finding(&up.name, k.name(), action.as_str());
                }
                tracing::warn!(upstream = %up.name, tool = t.name, found = ?found.names(), hidden, "screening found content in a listed tool's definition");
                if hidden {
                    shown = None;
                }
                if let Ok(mut listed) = self.listed_found.lock() {
                    listed.merge(&crate::screen::content::Report {
                        kinds: found.kinds,
                        action,
                    });
                }
            }
        }
        (shown, entry.stamp())
    }

    /// A prompts, resources or resource templates list, kept to the run's
    /// view ([`verdict::answer::item_visible`]); prompts and templates are
    /// compared with their pins like tools (their descriptions reach the
    /// model too).
    pub(super) fn filter_named(
        &self,
        raw: &str,
        kind: ListKind,
        array: &str,
        key: &str,
    ) -> Result<String, UpstreamFailure> {
        let cx = &self.run;
        let up = &cx.upstream.config;
        let subject = match kind {
            ListKind::Prompts => Some(crate::pins::Subject::Prompt),
            ListKind::ResourceTemplates => Some(crate::pins::Subject::ResourceTemplate),
            ListKind::Tools | ListKind::Resources => None,
        };
        rewrite::named_list(raw, array, key, |name, item| {
            let pinned = match subject.filter(|_| cx.pins.applies(up.pinning, &up.name)) {
                None => true,
                Some(subject) => {
                    serde_json::from_str::<Value>(item.get()).is_ok_and(|definition| {
                        let sha256 = crate::canonical::sha256(&definition);
                        cx.pins
                            .observe_of(up.pinning, &up.name, subject, name, &sha256, &definition)
                            .is_ok()
                    })
                }
            };
            verdict::answer::item_visible(cx.answer_scope(), kind, name, pinned)
                && !self.item_blocked(kind, name, item)
        })
        .map_err(|e| UpstreamFailure::Invalid(e.to_string()))
    }

    /// Whether a listed prompt, resource or template carries a kind
    /// `[screen]` blocks: hidden from the run like a poisoned tool (what
    /// is only redacted or flagged, the gate does on the whole list).
    pub(super) fn item_blocked(&self, kind: ListKind, name: &str, item: &RawValue) -> bool {
        let cx = &self.run;
        let up = &cx.upstream.config.name;
        if !cx.policy.screening().actions(up, None).blocks_any() {
            return false;
        }
        let Ok(definition) = serde_json::from_str::<Value>(item.get()) else {
            return false;
        };
        let found = verdict::answer::listed_screen(cx.answer_scope(), None, &definition);
        if found.action != Action::Block {
            return false;
        }
        for k in &found.kinds {
            cx.metrics.finding(up, k.name(), Action::Block.as_str());
        }
        tracing::warn!(upstream = %up, list = ?kind, name, found = ?found.names(), "screening hid a listed item");
        if let Ok(mut listed) = self.listed_found.lock() {
            listed.merge(&found);
        }
        true
    }
}
