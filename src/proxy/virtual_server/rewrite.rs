//! The virtual server's rewrites of single messages, without I/O: what a
//! member's message becomes on the client's side (its request ids, task ids
//! and the client's progress tokens sealed per member), and what the
//! client's becomes on the member's (the member's own names, its own ids
//! back). A value sealed for one member opens for no other ([`Seal::open`]),
//! so no answer, cancellation, task call or progress report crosses members.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::auth::Claims;
use crate::session::{Principal, Sessions, VirtualKind};

/// The key under `_meta` naming a message's task.
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// Seals and opens per-member values for one principal on one virtual
/// server.
pub(crate) struct Seal {
    sessions: Arc<Sessions>,
    claims: Arc<Claims>,
    server: Arc<str>,
}

impl Seal {
    /// For `claims` on the virtual server `server`.
    pub(crate) fn new(sessions: Arc<Sessions>, claims: Arc<Claims>, server: Arc<str>) -> Seal {
        Seal {
            sessions,
            claims,
            server,
        }
    }

    /// The principal the values are bound to.
    pub(crate) fn who(&self) -> Principal<'_> {
        Principal {
            issuer: &self.claims.iss,
            tenant: &self.claims.tenant_id,
            subject: &self.claims.sub,
            upstream: &self.server,
            run: &self.claims.run_id,
        }
    }

    /// `payload` sealed under `kind`.
    pub(crate) fn seal(&self, kind: VirtualKind, payload: &[u8]) -> String {
        self.sessions.seal_virtual(kind, &self.who(), payload)
    }

    /// What `sealed` holds, if it was sealed for this principal under `kind`.
    pub(crate) fn open(&self, kind: VirtualKind, sealed: &str) -> Option<Vec<u8>> {
        self.sessions
            .open_virtual(kind, &self.who(), sealed.as_bytes())
            .ok()
    }

    /// A member's JSON value (an id, a task id, a token) as the client
    /// sees it.
    pub(crate) fn seal_for_client(&self, kind: VirtualKind, member: usize, value: &Value) -> Value {
        let mut payload = (member as u32).to_be_bytes().to_vec();
        payload.extend_from_slice(value.to_string().as_bytes());
        Value::String(self.seal(kind, &payload))
    }

    /// The member and its own value inside a value [`Seal::seal_for_client`] made.
    pub(crate) fn open_from_client(
        &self,
        kind: VirtualKind,
        value: &Value,
    ) -> Option<(usize, Value)> {
        let payload = self.open(kind, value.as_str()?)?;
        let (m, rest) = payload.split_first_chunk::<4>()?;
        let member = u32::from_be_bytes(*m) as usize;
        Some((member, serde_json::from_slice(rest).ok()?))
    }
}

/// What to do with a member's message on its way to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outward {
    /// Relay it (rewritten).
    Relay,
    /// Relay it, and the member's lists changed.
    ListChanged,
    /// Drop it (a progress report for a token this member was not given).
    Drop,
}

/// Rewrites a member's message for the client: its requests' ids and the
/// ids its cancellations name, task ids, the client's progress tokens back.
pub(crate) fn outward(v: &mut Value, member: usize, seal: &Seal) -> Outward {
    let method = v.get("method").and_then(Value::as_str).map(str::to_owned);
    let has_id = v.get("id").is_some_and(|i| !i.is_null());
    match method.as_deref() {
        Some(_) if has_id => {
            if let Some(id) = v.get_mut("id") {
                *id = seal.seal_for_client(VirtualKind::Request, member, id);
            }
            wrap_related_task(v.get_mut("params"), member, seal);
            Outward::Relay
        }
        Some("notifications/progress") => {
            let token = v.pointer_mut("/params/progressToken");
            let Some(token) = token else {
                return Outward::Drop;
            };
            match seal.open_from_client(VirtualKind::Progress, token) {
                Some((m, own)) if m == member => {
                    *token = own;
                    Outward::Relay
                }
                _ => Outward::Drop,
            }
        }
        Some("notifications/cancelled") => {
            if let Some(id) = v.pointer_mut("/params/requestId") {
                *id = seal.seal_for_client(VirtualKind::Request, member, id);
            }
            Outward::Relay
        }
        Some(m) if m.ends_with("/list_changed") => Outward::ListChanged,
        Some(_) => {
            if let Some(id) = v.pointer_mut("/params/taskId") {
                *id = seal.seal_for_client(VirtualKind::Task, member, id);
            }
            wrap_related_task(v.get_mut("params"), member, seal);
            Outward::Relay
        }
        None => {
            if let Some(r) = v.get_mut("result") {
                wrap_result_tasks(r, member, seal);
            }
            Outward::Relay
        }
    }
}

/// Task ids in a result: a created task, a task's status, a task list.
fn wrap_result_tasks(r: &mut Value, member: usize, seal: &Seal) {
    if let Some(id) = r.pointer_mut("/task/taskId") {
        *id = seal.seal_for_client(VirtualKind::Task, member, id);
    }
    if let Some(id) = r.get_mut("taskId") {
        *id = seal.seal_for_client(VirtualKind::Task, member, id);
    }
    if let Some(tasks) = r.get_mut("tasks").and_then(Value::as_array_mut) {
        for t in tasks {
            if let Some(id) = t.get_mut("taskId") {
                *id = seal.seal_for_client(VirtualKind::Task, member, id);
            }
        }
    }
    wrap_related_task(Some(r), member, seal);
}

fn wrap_related_task(v: Option<&mut Value>, member: usize, seal: &Seal) {
    let Some(id) = v
        .and_then(|v| v.get_mut("_meta"))
        .and_then(|m| m.get_mut(RELATED_TASK))
        .and_then(|t| t.get_mut("taskId"))
    else {
        return;
    };
    *id = seal.seal_for_client(VirtualKind::Task, member, id);
}

/// Why a client's message cannot go to a member.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InwardError {
    /// A task id this principal was not given on this virtual server (or
    /// one of another member than the message goes to).
    #[error("unknown task id")]
    UnknownTask,
}

/// The member a client's task id belongs to, with the member's own id put
/// back in its place (`params.taskId`, and the related task in `_meta`).
pub(crate) fn inward_tasks(
    v: &mut Value,
    seal: &Seal,
    member: Option<usize>,
) -> Result<Option<usize>, InwardError> {
    let mut owner = member;
    let mut put = |slot: &mut Value| -> Result<(), InwardError> {
        let (m, own) = seal
            .open_from_client(VirtualKind::Task, slot)
            .ok_or(InwardError::UnknownTask)?;
        if owner.is_some_and(|o| o != m) {
            return Err(InwardError::UnknownTask);
        }
        owner = Some(m);
        *slot = own;
        Ok(())
    };
    if let Some(id) = v.pointer_mut("/params/taskId") {
        put(id)?;
    }
    if let Some(id) = v
        .pointer_mut("/params/_meta")
        .and_then(|m| m.get_mut(RELATED_TASK))
        .and_then(|t| t.get_mut("taskId"))
    {
        put(id)?;
    }
    Ok(owner)
}

/// The client's progress token, sealed for `member`: a report the member
/// makes comes back only for its own requests.
pub(crate) fn inward_progress(v: &mut Value, member: usize, seal: &Seal) {
    if let Some(t) = v.pointer_mut("/params/_meta/progressToken") {
        *t = seal.seal_for_client(VirtualKind::Progress, member, t);
    }
}

/// Sets `params.<field>` (a name or URI) to the member's own spelling.
pub(crate) fn set_param(v: &mut Value, pointer: &str, to: &str) {
    if let Some(slot) = v.pointer_mut(pointer) {
        *slot = Value::String(to.to_owned());
    }
}

/// Deep union of capability objects: objects merge, a `true` anywhere wins.
pub(crate) fn merge_capabilities(into: &mut Map<String, Value>, from: &Map<String, Value>) {
    for (k, v) in from {
        match (into.get_mut(k), v) {
            (Some(Value::Object(a)), Value::Object(b)) => merge_capabilities(a, b),
            (Some(Value::Bool(a)), Value::Bool(b)) => *a = *a || *b,
            (Some(_), _) => {}
            (None, v) => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn seal(run: &str) -> Seal {
        let sessions = Arc::new(Sessions::new(&[]).expect("key"));
        let claims = Claims {
            sub: "alice".into(),
            tenant_id: "acme".into(),
            agent: "ops-agent".into(),
            run_id: run.into(),
            mode: crate::auth::Mode::Agent,
            projects: Vec::new().into(),
            project_ceiling: None,
            scopes: vec!["mcp:tools".to_owned()].into(),
            jti: "j".into(),
            iss: "https://issuer".into(),
            exp: 4_000_000_000,
            iat: 1,
            nbf: None,
            run_exp: None,
            audience: crate::auth::Audience::Mcp,
            kid: None,
            delegation: Vec::new().into(),
        };
        Seal::new(sessions, Arc::new(claims), Arc::from("ops"))
    }

    #[test]
    fn a_members_request_id_comes_back_to_that_member_only() {
        let s = seal("r1");
        let mut req = json!({"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{}});
        assert_eq!(outward(&mut req, 2, &s), Outward::Relay);
        let id = req["id"].clone();
        assert!(id.is_string());
        assert_eq!(
            s.open_from_client(VirtualKind::Request, &id),
            Some((2, json!(7)))
        );
        // Not a task id, not another kind.
        assert_eq!(s.open_from_client(VirtualKind::Task, &id), None);
        // Another member's id for the same request differs.
        let mut other = json!({"jsonrpc":"2.0","id":7,"method":"ping"});
        outward(&mut other, 1, &s);
        assert_ne!(other["id"], id);
    }

    #[test]
    fn progress_reports_pass_only_for_the_members_own_tokens() {
        let s = seal("r1");
        let mut call =
            json!({"method":"tools/call","params":{"name":"x","_meta":{"progressToken":"p1"}}});
        inward_progress(&mut call, 0, &s);
        let token = call["params"]["_meta"]["progressToken"].clone();
        let mut report = json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken": token.clone(),"progress":1}});
        assert_eq!(outward(&mut report, 0, &s), Outward::Relay);
        assert_eq!(report["params"]["progressToken"], json!("p1"));
        // The same token reported by another member, or an invented one.
        let mut spoof = json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken": token,"progress":1}});
        assert_eq!(outward(&mut spoof, 1, &s), Outward::Drop);
        let mut raw = json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p1","progress":1}});
        assert_eq!(outward(&mut raw, 0, &s), Outward::Drop);
    }

    #[test]
    fn task_ids_are_sealed_per_member_and_run() {
        let s = seal("r1");
        let mut created = json!({"jsonrpc":"2.0","id":1,"result":{"task":{"taskId":"t1.abc","status":"working"}}});
        outward(&mut created, 1, &s);
        let id = created["result"]["task"]["taskId"].clone();
        let mut get = json!({"method":"tasks/get","params":{"taskId": id.clone()}});
        assert_eq!(inward_tasks(&mut get, &s, None), Ok(Some(1)));
        assert_eq!(get["params"]["taskId"], json!("t1.abc"));
        // Routed to another member: refused.
        let mut wrong = json!({"method":"tasks/get","params":{"taskId": id.clone()}});
        assert_eq!(
            inward_tasks(&mut wrong, &s, Some(0)),
            Err(InwardError::UnknownTask)
        );
        // Another run's principal cannot open it.
        let other = seal("r2");
        let mut theirs = json!({"method":"tasks/get","params":{"taskId": id}});
        assert_eq!(
            inward_tasks(&mut theirs, &other, None),
            Err(InwardError::UnknownTask)
        );
    }

    #[test]
    fn capabilities_merge_as_a_union() {
        let mut a = json!({"tools":{"listChanged":false},"logging":{}});
        let b = json!({"tools":{"listChanged":true},"prompts":{"listChanged":true}});
        if let (Value::Object(a), Value::Object(b)) = (&mut a, &b) {
            merge_capabilities(a, b);
        }
        assert_eq!(
            a,
            json!({"tools":{"listChanged":true},"logging":{},"prompts":{"listChanged":true}})
        );
    }
}
