//! A merged list (`tools/list`, `prompts/list`, `resources/list`,
//! `resources/templates/list`, `tasks/list`): every member still to be
//! asked, in parallel, within the deadline; each item as the virtual
//! server exposes it (renamed, its task id sealed, or left out); one
//! sealed cursor holding every member's place, a late member asked again
//! through it.

use std::collections::HashMap;
use std::sync::Arc;

use http::header::HeaderMap;
use http::Response;
use serde_json::{json, Value};

use super::fan_out::{no_result, streamed, Fanned};
use super::reply::{raw_answer, rpc_error};
use super::{merge, Cx};
use crate::http_util::Body;
use crate::mcp::jsonrpc::Id;
use crate::proxy::error::ProxyError;
use crate::session::VirtualKind;
use crate::upstream::members::{self, Space};

/// How many times a late member is asked again through the cursor.
const LATE_RETRIES: u32 = 1;

impl Cx<'_> {
    /// A merged list: every member still to be asked (all, or those the
    /// cursor names), in parallel, within the deadline; items renamed to
    /// the virtual server's names, those it does not expose left out.
    pub(super) async fn list(
        &self,
        headers: &HeaderMap,
        id: Option<&Id>,
        method: &str,
        key: &str,
        v: Value,
    ) -> Result<Response<Body>, ProxyError> {
        let Some(mut places) = self.places(method, &v) else {
            return Ok(rpc_error(id, -32602, "Invalid cursor"));
        };
        places.retain(|p| self.reach.get(p.m).copied().unwrap_or(false));
        let asked: Vec<usize> = places.iter().map(|p| p.m).collect();
        let by_member: HashMap<usize, Option<String>> =
            places.iter().map(|p| (p.m, p.cursor.clone())).collect();
        let per = |m: usize, v: &Value| {
            let mut v = v.clone();
            if let Some(p) = v.get_mut("params").and_then(Value::as_object_mut) {
                p.remove("cursor");
                if let Some(Some(c)) = by_member.get(&m) {
                    p.insert("cursor".to_owned(), Value::String(c.clone()));
                }
            } else if let Some(Some(c)) = by_member.get(&m) {
                v["params"] = json!({"cursor": c});
            }
            v
        };
        let (answers, resolved) = futures_util::future::join(
            self.fan_out(headers, &v, Some(&asked), per),
            self.refresh(false),
        )
        .await;
        if !answers.iter().any(|(_, a)| a.has_result())
            && answers.iter().all(|(_, a)| !matches!(a, Fanned::Late))
        {
            // Nobody listed anything: the members' own refusal (or HTTP
            // error) is the answer.
            return Ok(no_result(id, answers));
        }
        // Each member's page, its items left as the member wrote them.
        let pages: Vec<merge::Page<'_>> = answers
            .iter()
            .filter_map(|(m, a)| match a {
                Fanned::Message(b, _) => merge::page(*m, merge::reply(b)?.result?, key),
                _ => None,
            })
            .collect();
        let resolved = self.learn_unknown(resolved, key, &pages).await;
        let mut next = late_places(&answers, &places, &by_member);
        let merged = self.merge_pages(&resolved, key, &pages, &mut next);
        let result = self.list_result(method, key, &pages, &merged, &next);
        Ok(raw_answer(id, &result, streamed(&answers)))
    }

    /// Where the list starts for each member: the places the client's
    /// cursor holds, or every member from its start; `None` for a cursor
    /// this virtual server did not seal for `method`.
    fn places(&self, method: &str, v: &Value) -> Option<Vec<Place>> {
        match v.pointer("/params/cursor").and_then(Value::as_str) {
            Some(c) => self.open_cursor(method, c),
            None => Some(
                (0..self.vs.config.members.len())
                    .map(|m| Place {
                        m,
                        cursor: None,
                        late: 0,
                    })
                    .collect(),
            ),
        }
    }

    /// An item the names do not know yet: its member is listed again
    /// (bounded per interval); what the member shows a client but not
    /// the firewall's own listing (servers may list by the client's
    /// capabilities) is learned from this list, for every caller.
    async fn learn_unknown(
        &self,
        mut resolved: Arc<members::Resolved>,
        key: &str,
        pages: &[merge::Page<'_>],
    ) -> Arc<members::Resolved> {
        let unknown: Vec<usize> = pages
            .iter()
            .filter(|p| {
                p.items.iter().any(|i| {
                    i.name
                        .as_deref()
                        .is_some_and(|n| !self.known(&resolved, key, p.member, n))
                })
            })
            .map(|p| p.member)
            .collect();
        if unknown.is_empty() {
            return resolved;
        }
        resolved = self
            .vs
            .index
            .refresh(
                &self.vs.clients,
                &self.state.auditor,
                Some(&unknown),
                true,
                self.deadline(),
            )
            .await;
        if let Some(space) = Self::space(key) {
            for p in pages {
                let names: Vec<String> = p
                    .items
                    .iter()
                    .filter_map(|i| i.name.clone())
                    .filter(|n| !self.known(&resolved, key, p.member, n))
                    .collect();
                if !names.is_empty() {
                    resolved = self.vs.index.learn(p.member, space, &names);
                }
            }
        }
        resolved
    }

    /// Every page's items as the virtual server lists them, with the
    /// shortest cache time and the narrowest scope of their results; each
    /// member's next cursor is added to `next`.
    fn merge_pages<'a>(
        &self,
        resolved: &members::Resolved,
        key: &str,
        pages: &[merge::Page<'a>],
        next: &mut Vec<Place>,
    ) -> Merged<'a> {
        let mut items: Vec<std::borrow::Cow<'a, str>> = Vec::new();
        let mut ttl: Option<u64> = None;
        let mut private = false;
        for p in pages {
            for item in &p.items {
                if let Some(item) = self.exposed_item(resolved, key, p.member, item) {
                    items.push(item);
                }
            }
            let field = |k: &str| -> Option<Value> {
                p.fields
                    .get(k)
                    .and_then(|r| serde_json::from_str(r.get()).ok())
            };
            if let Some(Value::String(c)) = field("nextCursor") {
                next.push(Place {
                    m: p.member,
                    cursor: Some(c),
                    late: 0,
                });
            }
            if let Some(t) = field("ttlMs").and_then(|t| t.as_u64()) {
                ttl = Some(ttl.map_or(t, |x| x.min(t)));
            }
            private |= field("cacheScope").and_then(|c| c.as_str().map(str::to_owned))
                == Some("private".to_owned());
        }
        Merged {
            items,
            ttl,
            private,
        }
    }

    /// The merged result (JSON text): the first member's result keeps its
    /// other fields (`resultType`, `_meta`); the shortest cache time and
    /// the narrowest scope win; one sealed cursor holds every member's
    /// next place.
    fn list_result(
        &self,
        method: &str,
        key: &str,
        pages: &[merge::Page<'_>],
        merged: &Merged<'_>,
        next: &[Place],
    ) -> String {
        let mut fields: Vec<(String, String)> = pages
            .first()
            .map(|p| {
                p.fields
                    .iter()
                    .filter(|(k, _)| {
                        !matches!(k.as_str(), "nextCursor" | "ttlMs" | "cacheScope") && *k != key
                    })
                    .map(|(k, v)| (k.clone(), v.get().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        if let Some((_, meta)) = fields.iter_mut().find(|(k, _)| k == "_meta") {
            if let Ok(mut m) = serde_json::from_str::<Value>(meta) {
                self.restamp_meta(&mut m);
                *meta = m.to_string();
            }
        }
        if let Some(t) = merged.ttl {
            fields.push(("ttlMs".to_owned(), t.to_string()));
        }
        if merged.private {
            fields.push(("cacheScope".to_owned(), r#""private""#.to_owned()));
        } else if let Some(c) = pages.first().and_then(|p| p.fields.get("cacheScope")) {
            fields.push(("cacheScope".to_owned(), c.get().to_owned()));
        }
        fields.push((
            key.to_owned(),
            merge::array(merged.items.iter().map(|i| i.as_ref())),
        ));
        if !next.is_empty() {
            fields.push((
                "nextCursor".to_owned(),
                Value::String(self.seal_cursor(method, next)).to_string(),
            ));
        }
        merge::object(fields.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    fn space(key: &str) -> Option<Space> {
        match key {
            "tools" => Some(Space::Tools),
            "prompts" => Some(Space::Prompts),
            "resourceTemplates" => Some(Space::Templates),
            "resources" => Some(Space::Uris),
            _ => None,
        }
    }

    fn known(&self, r: &members::Resolved, key: &str, m: usize, name: &str) -> bool {
        let Some(space) = Self::space(key) else {
            return true;
        };
        let names = r.names(space);
        names.exposed_as(m, name).is_some()
            || names
                .dropped()
                .iter()
                .any(|d| d.member == m && d.name == name)
    }

    /// An item of member `m`'s list as the virtual server lists it (the
    /// member's bytes, or the item renamed, or its task id sealed), or
    /// `None` when the virtual server does not expose it.
    fn exposed_item<'a>(
        &self,
        r: &members::Resolved,
        key: &str,
        m: usize,
        item: &merge::Item<'a>,
    ) -> Option<std::borrow::Cow<'a, str>> {
        use std::borrow::Cow;
        match Self::space(key) {
            Some(Space::Uris) => {
                let own = item.name.as_deref()?;
                r.names(Space::Uris).exposed_as(m, own)?;
                Some(Cow::Borrowed(item.raw.get()))
            }
            Some(space) => {
                let own = item.name.as_deref()?;
                let exposed = r.names(space).exposed_as(m, own)?;
                if exposed == own {
                    Some(Cow::Borrowed(item.raw.get()))
                } else {
                    merge::with_field(item.raw, "name", &Value::String(exposed.to_owned()))
                        .map(Cow::Owned)
                }
            }
            None => {
                // tasks/list: each task id sealed for its member.
                #[derive(serde::Deserialize)]
                struct Task {
                    #[serde(rename = "taskId")]
                    task_id: Option<Value>,
                }
                let t: Task = serde_json::from_str(item.raw.get()).ok()?;
                match t.task_id {
                    Some(tid) => {
                        let sealed = self.seal.seal_for_client(VirtualKind::Task, m, &tid);
                        merge::with_field(item.raw, "taskId", &sealed).map(Cow::Owned)
                    }
                    None => Some(Cow::Borrowed(item.raw.get())),
                }
            }
        }
    }

    fn seal_cursor(&self, method: &str, places: &[Place]) -> String {
        let v = json!({
            "m": method,
            "p": places.iter().map(|p| json!([p.m, p.cursor, p.late])).collect::<Vec<_>>(),
        });
        self.seal
            .seal(VirtualKind::Cursor, v.to_string().as_bytes())
    }

    fn open_cursor(&self, method: &str, sealed: &str) -> Option<Vec<Place>> {
        let payload = self.seal.open(VirtualKind::Cursor, sealed)?;
        let v: Value = serde_json::from_slice(&payload).ok()?;
        if v.get("m").and_then(Value::as_str) != Some(method) {
            return None;
        }
        v.get("p")?
            .as_array()?
            .iter()
            .map(|p| {
                Some(Place {
                    m: usize::try_from(p.get(0)?.as_u64()?).ok()?,
                    cursor: p.get(1)?.as_str().map(str::to_owned),
                    late: u32::try_from(p.get(2)?.as_u64()?).ok()?,
                })
            })
            .collect()
    }
}

/// Where a merged list stands for one member.
struct Place {
    m: usize,
    cursor: Option<String>,
    late: u32,
}

/// The items of every member's page as the virtual server lists them, and
/// what their results say of caching.
struct Merged<'a> {
    items: Vec<std::borrow::Cow<'a, str>>,
    ttl: Option<u64>,
    private: bool,
}

/// The members late this time, asked again through the cursor (at most
/// [`LATE_RETRIES`] times) from where they were.
fn late_places(
    answers: &[(usize, Fanned)],
    places: &[Place],
    by_member: &HashMap<usize, Option<String>>,
) -> Vec<Place> {
    let mut next: Vec<Place> = Vec::new();
    for (m, a) in answers {
        let late = places.iter().find(|p| p.m == *m).map_or(0, |p| p.late);
        if matches!(a, Fanned::Late) && late < LATE_RETRIES {
            next.push(Place {
                m: *m,
                cursor: by_member.get(m).cloned().flatten(),
                late: late + 1,
            });
        }
    }
    next
}
