//! Where a client's request goes on a virtual server: the member that owns
//! the name, URI or task it names (resolved over the members' full lists,
//! listed again once when a name is not found), the message rewritten to
//! the member's own name, task ids and progress token.

use std::sync::Arc;

use serde_json::Value;

use super::rewrite;
use super::Cx;
use crate::mcp::version::ProtocolVersion;
use crate::upstream::members::{self, Space};

impl Cx<'_> {
    /// The member a request goes to, its message rewritten to the member's
    /// own names; the error is the client's answer (-32602).
    pub(super) async fn target(
        &self,
        method: &str,
        v: &mut Value,
        _version: ProtocolVersion,
    ) -> Result<usize, String> {
        let text = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_owned);
        match method {
            "tools/call" | "prompts/get" => {
                let (space, what) = if method == "tools/call" {
                    (Space::Tools, "tool")
                } else {
                    (Space::Prompts, "prompt")
                };
                let name = text(v, "/params/name").unwrap_or_default();
                let (m, own) = self.route(space, &name).await.map_err(|why| match why {
                    Some(why) => format!("Unknown {what}: {name} ({why})"),
                    None => format!(
                        "Unknown {}: {name}",
                        if what == "tool" { "tool" } else { "prompt" }
                    ),
                })?;
                rewrite::set_param(v, "/params/name", &own);
                rewrite::inward_progress(v, m, &self.seal);
                self.inward_tasks(v, Some(m))?;
                Ok(m)
            }
            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
                let uri = text(v, "/params/uri").unwrap_or_default();
                let m = self.uri_owner(&uri).await?;
                rewrite::inward_progress(v, m, &self.seal);
                Ok(m)
            }
            "completion/complete" => {
                let kind = text(v, "/params/ref/type").unwrap_or_default();
                let m = if kind == "ref/prompt" {
                    let name = text(v, "/params/ref/name").unwrap_or_default();
                    let (m, own) = self
                        .route(Space::Prompts, &name)
                        .await
                        .map_err(|_| format!("Unknown prompt: {name}"))?;
                    rewrite::set_param(v, "/params/ref/name", &own);
                    m
                } else {
                    let uri = text(v, "/params/ref/uri").unwrap_or_default();
                    self.uri_owner(&uri).await?
                };
                rewrite::inward_progress(v, m, &self.seal);
                Ok(m)
            }
            m if m.starts_with("tasks/") => {
                let member = self.inward_tasks(v, None)?;
                member.ok_or_else(|| "Unknown task: the request names no task".to_owned())
            }
            _ => {
                // A method the virtual server does not route by name: the
                // only member, else nobody.
                match self.vs.config.members.len() {
                    1 => {
                        rewrite::inward_progress(v, 0, &self.seal);
                        Ok(0)
                    }
                    _ => Err(format!(
                        "{method} names no tool, prompt or resource: a virtual server of several members cannot route it"
                    )),
                }
            }
        }
    }

    pub(super) fn inward_tasks(
        &self,
        v: &mut Value,
        member: Option<usize>,
    ) -> Result<Option<usize>, String> {
        rewrite::inward_tasks(v, &self.seal, member)
            .map_err(|_| "Unknown task: no task of this run has that id here".to_owned())
    }

    /// The member and own name of an exposed name; `Err(Some(why))` when
    /// the name is left out by the collision rule, `Err(None)` when no
    /// member lists it (after listing the members again, at most once per
    /// interval).
    pub(super) async fn route(
        &self,
        space: Space,
        name: &str,
    ) -> Result<(usize, String), Option<String>> {
        let mut resolved = self.vs.index.resolved();
        for attempt in 0..2 {
            if let Some(r) = resolved.names(space).route(name) {
                return Ok((r.member, r.name.clone()));
            }
            let dropped = resolved
                .names(space)
                .dropped()
                .iter()
                .find(|d| self.exposed_spelling(space, d.member, &d.name) == name);
            if let Some(d) = dropped {
                return Err(Some(d.why.clone()));
            }
            if attempt == 0 {
                resolved = self.refresh(true).await;
            }
        }
        // One member has no twin to be confused with: its path decides
        // (as the plain upstream's would: refill, or Unknown tool).
        if self.vs.config.members.len() == 1 {
            return Ok((0, name.to_owned()));
        }
        Err(None)
    }

    /// How a member's own name would be spelled on this virtual server.
    pub(super) fn exposed_spelling(&self, space: Space, member: usize, own: &str) -> String {
        match space {
            Space::Uris => own.to_owned(),
            Space::Tools | Space::Prompts | Space::Templates => {
                self.vs.config.spelling(member, own)
            }
        }
    }

    pub(super) async fn uri_owner(&self, uri: &str) -> Result<usize, String> {
        if self.vs.config.members.len() == 1 {
            return Ok(0);
        }
        let resolved = self.vs.index.resolved();
        match resolved.uri_owner(uri) {
            Ok(m) => Ok(m),
            Err(_) => self.refresh(true).await.uri_owner(uri),
        }
    }

    pub(super) async fn refresh(&self, force: bool) -> Arc<members::Resolved> {
        self.vs
            .index
            .refresh(
                &self.vs.clients,
                &self.state.auditor,
                None,
                force,
                self.deadline(),
            )
            .await
    }
}
