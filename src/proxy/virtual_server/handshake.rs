//! What opens a client session on a virtual server and says what it is:
//! `initialize` (every member reached opened in parallel, within the
//! deadline) and `server/discover`, each answered with the members'
//! results merged; and the virtual server's own identity where several
//! members stand behind it.

use http::header::{HeaderMap, HeaderValue};
use http::Response;
use serde_json::{json, Value};

use super::fan_out::{no_result, streamed, Fanned};
use super::reply::answer;
use super::rewrite;
use super::session::insert_session;
use super::Cx;
use crate::http_util::Body;
use crate::mcp::jsonrpc::Id;
use crate::proxy::error::ProxyError;
use crate::session::VirtualKind;

/// Largest client `initialize` params carried inside the sealed session id
/// (so another replica can open the members for it).
const MAX_INIT_IN_ID: usize = 2_048;
/// Largest client `initialize` params a virtual server keeps for a session
/// (members opened later are opened with them).
const MAX_INIT: usize = 16 * 1024;

impl Cx<'_> {
    /// `initialize`: a new client session; every member reached by the run
    /// opened in parallel within the deadline; the capabilities merged.
    pub(super) async fn initialize(
        &self,
        headers: &HeaderMap,
        id: Option<&Id>,
        v: Value,
    ) -> Result<Response<Body>, ProxyError> {
        let params = v.get("params").cloned().unwrap_or_else(|| json!({}));
        if params.to_string().len() > MAX_INIT {
            return Err(ProxyError::InvalidRequest {
                message: format!(
                    "initialize params larger than {MAX_INIT} bytes: a virtual server keeps them for the session's lifetime"
                ),
            });
        }
        let mut key = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key).map_err(
            |_| ProxyError::InvalidRequest {
                message: "cannot make a session id".to_owned(),
            },
        )?;
        let session = insert_session(self.vs, key, params.clone());
        let mut payload = key.to_vec();
        let init_text = params.to_string();
        if init_text.len() <= MAX_INIT_IN_ID {
            payload.extend_from_slice(init_text.as_bytes());
        }
        let sealed = self.seal.seal(VirtualKind::Session, &payload);
        let opens = (0..self.vs.config.members.len())
            .filter(|m| self.reach.get(*m).copied().unwrap_or(false))
            .map(|m| {
                let session = session.clone();
                async move {
                    let r = tokio::time::timeout(self.deadline(), self.ensure(&session, headers, m)).await;
                    match r {
                        Ok(Ok((_, result))) => result.map(|r| (m, r)),
                        Ok(Err(_)) => None,
                        Err(_) => {
                            tracing::warn!(virtual_server = %self.vs.config.name, upstream = %self.member_name(m), "virtual server: a member did not answer initialize within list_timeout_ms; it is opened again when needed");
                            None
                        }
                    }
                }
            });
        let (results, _) =
            futures_util::future::join(futures_util::future::join_all(opens), self.refresh(false))
                .await;
        let requested = params
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let result = self.merged(
            &results.into_iter().flatten().collect::<Vec<_>>(),
            requested,
        );
        let mut r = answer(id, result, false);
        if let Ok(v) = HeaderValue::from_str(&sealed) {
            r.headers_mut().insert("mcp-session-id", v);
        }
        Ok(r)
    }

    /// The merged answer of `initialize` / `server/discover`: the first
    /// member's result (its other fields kept) with every member's
    /// capabilities; with several members, the virtual server's own name,
    /// and each member's instructions under its name.
    /// Each result comes with the member (its index) that gave it, so that
    /// its instructions keep their provenance whoever else answered.
    pub(super) fn merged(&self, results: &[(usize, Value)], requested: &str) -> Value {
        let mut caps = serde_json::Map::new();
        let mut version: Option<String> = None;
        for (_, r) in results {
            if let Some(c) = r.get("capabilities").and_then(Value::as_object) {
                rewrite::merge_capabilities(&mut caps, c);
            }
            let v = r.get("protocolVersion").and_then(Value::as_str);
            if version.is_none() || v == Some(requested) {
                version = v.map(str::to_owned);
            }
        }
        let mut out = results
            .first()
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| json!({}));
        let several = self.vs.config.members.len() > 1;
        if several {
            // A member down now may come back with tools: the client is
            // told when the lists change.
            for k in ["tools", "prompts", "resources"] {
                if let Some(Value::Object(o)) = caps.get_mut(k) {
                    o.insert("listChanged".to_owned(), Value::Bool(true));
                }
            }
            if !caps.contains_key("tools") {
                caps.insert("tools".to_owned(), json!({"listChanged": true}));
            }
        }
        let Some(o) = out.as_object_mut() else {
            return out;
        };
        o.insert("capabilities".to_owned(), Value::Object(caps));
        if o.contains_key("protocolVersion") || !requested.is_empty() {
            if let Some(v) =
                version.or_else(|| (!requested.is_empty()).then(|| requested.to_owned()))
            {
                o.insert("protocolVersion".to_owned(), Value::String(v));
            }
        }
        if several || results.is_empty() {
            o.insert("serverInfo".to_owned(), self.server_info());
            let instructions: Vec<String> = results
                .iter()
                .filter_map(|(m, r)| {
                    r.get("instructions")
                        .and_then(Value::as_str)
                        .map(|i| format!("{}: {i}", self.member_name(*m)))
                })
                .collect();
            if instructions.is_empty() {
                o.remove("instructions");
            } else {
                o.insert(
                    "instructions".to_owned(),
                    Value::String(instructions.join("\n\n")),
                );
            }
        }
        out
    }

    /// With several members, a result's server identity in `_meta`
    /// (2026-07-28) is the virtual server's, not the first member's.
    pub(super) fn restamp(&self, result: &mut Value) {
        if let Some(meta) = result.get_mut("_meta") {
            self.restamp_meta(meta);
        }
    }

    /// [`Cx::restamp`] of a `_meta` object.
    pub(super) fn restamp_meta(&self, meta: &mut Value) {
        if self.vs.config.members.len() < 2 {
            return;
        }
        if let Some(info) = meta.get_mut("io.modelcontextprotocol/serverInfo") {
            *info = self.server_info();
        }
    }

    pub(super) fn server_info(&self) -> Value {
        json!({
            "name": self.vs.config.name,
            "title": format!("{} (virtual server: {})", self.vs.config.name, self.vs.config.members.join(", ")),
            "version": env!("CARGO_PKG_VERSION"),
        })
    }

    /// `server/discover` (2026-07-28): every member's, merged.
    pub(super) async fn discover(
        &self,
        headers: &HeaderMap,
        id: Option<&Id>,
        v: Value,
    ) -> Result<Response<Body>, ProxyError> {
        let answers = self.fan_out(headers, &v, None, |_, v| v.clone()).await;
        // The virtual server speaks this revision only if every member that
        // answered does: a member that refuses discovery (a session-only
        // server) makes the client fall back to `initialize`, where every
        // member can be opened. A member that is down is left out.
        let refused = answers.iter().position(|(_, a)| match a {
            a @ Fanned::Message(..) => a.is_error(),
            Fanned::Http(r) => r.status().is_client_error(),
            Fanned::Late => false,
        });
        if let Some(i) = refused {
            let (m, _) = answers[i];
            tracing::info!(virtual_server = %self.vs.config.name, upstream = %self.member_name(m), "virtual server: a member refused server/discover; the client is refused too (it falls back to initialize)");
            let refusal: Vec<(usize, Fanned)> = answers.into_iter().skip(i).take(1).collect();
            return Ok(no_result(id, refusal));
        }
        let results: Vec<(usize, Value)> = answers
            .iter()
            .filter_map(|(m, a)| a.result().map(|r| (*m, r)))
            .collect();
        if results.is_empty() {
            return Ok(no_result(id, answers));
        }
        let requested = headers
            .get(crate::mcp::headers::PROTOCOL_VERSION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let mut merged = self.merged(&results, requested);
        if let Some(o) = merged.as_object_mut() {
            if !results
                .iter()
                .any(|(_, r)| r.get("protocolVersion").is_some())
            {
                o.remove("protocolVersion");
            }
            // DiscoverResult has no serverInfo of its own: the identity is
            // in `_meta` (restamped below).
            if !results.iter().any(|(_, r)| r.get("serverInfo").is_some()) {
                o.remove("serverInfo");
            }
            // The revisions every member supports.
            let lists: Vec<Vec<Value>> = results
                .iter()
                .filter_map(|(_, r)| r.get("supportedVersions")?.as_array().cloned())
                .collect();
            if let Some((first, rest)) = lists.split_first() {
                let shared: Vec<Value> = first
                    .iter()
                    .filter(|v| rest.iter().all(|l| l.contains(v)))
                    .cloned()
                    .collect();
                o.insert("supportedVersions".to_owned(), Value::Array(shared));
            }
        }
        self.restamp(&mut merged);
        Ok(answer(id, merged, streamed(&answers)))
    }
}
