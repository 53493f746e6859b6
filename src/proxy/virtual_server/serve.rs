//! One virtual server's exchange: a request routed to its members, fanned out
//! where it must be, and the answers merged into one.

use super::super::error::ProxyError;
use super::super::State;
use super::reply::answer;
use super::rewrite::Seal;
use super::session::{open_session, VSession};
use super::*;
use crate::auth::Claims;
use crate::http_util::{mime_is, Body};
use crate::mcp::jsonrpc::{self, Id, Kind};
use crate::mcp::version::ProtocolVersion;
use crate::server::listener::ConnInfo;
use crate::upstream::body::ClientBody;
use crate::upstream::members::Index;
use crate::virtual_names::VirtualServer;
use bytes::Bytes;
use dashmap::DashMap;
use http::header::HeaderMap;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A virtual server: its config, its names, its client sessions.
pub struct Virtual {
    /// As configured.
    pub config: Arc<VirtualServer>,
    /// The members' full lists and the names resolved over them.
    pub index: Index,
    /// The members' upstream clients, in member order (what the firewall
    /// lists them with).
    pub(super) clients: Vec<Arc<crate::upstream::client::UpstreamClient>>,
    pub(super) sessions: DashMap<[u8; 16], Arc<VSession>>,
    /// Sessions the client ended here (DELETE): 404 from then on.
    pub(super) ended: DashMap<[u8; 16], ()>,
    pub(super) via: Arc<str>,
}

impl Virtual {
    /// A virtual server with no sessions and nothing listed yet, over the
    /// configured upstreams' clients.
    pub fn new(
        config: Arc<VirtualServer>,
        upstreams: &HashMap<String, Arc<crate::upstream::client::UpstreamClient>>,
        metrics: Arc<crate::telemetry::Metrics>,
    ) -> Virtual {
        Virtual {
            // Config validation proved every member is a configured upstream.
            clients: config
                .members
                .iter()
                .filter_map(|m| upstreams.get(m).cloned())
                .collect(),
            index: Index::new(config.clone(), metrics),
            via: Arc::from(config.name.as_str()),
            sessions: DashMap::new(),
            ended: DashMap::new(),
            config,
        }
    }

    /// Lists every member now (at start, and for `/readyz`), within the
    /// deadline; logs every name left out.
    pub async fn warm(&self, state: &State) {
        self.index
            .refresh(
                &self.clients,
                &state.auditor,
                None,
                true,
                self.config.list_timeout,
            )
            .await;
    }
}

/// One client request on a virtual server, after authentication.
pub(in crate::proxy) async fn serve(
    state: &State,
    conn: ConnInfo,
    claims: Arc<Claims>,
    vs: Arc<Virtual>,
    req: Request<ClientBody>,
) -> Result<Response<Body>, ProxyError> {
    // Authority: the members this run may reach. None looks like an
    // unknown path, as for a plain upstream.
    let reach = super::super::reaches(state, &claims, &vs.config.members);
    if !reach.iter().any(|r| *r) {
        return Err(ProxyError::UnknownUpstream(vs.config.name.clone()));
    }
    let seal = Seal::new(state.sessions.clone(), claims.clone(), vs.via.clone());
    let version = super::super::header_version(req.headers());
    let session = if version.is_stateless() {
        None
    } else {
        open_session(&vs, &seal, req.headers())?
    };
    let cx = Cx {
        state,
        conn,
        claims,
        vs: &vs,
        seal,
        reach,
        session,
    };
    match *req.method() {
        Method::POST => cx.post(req).await,
        Method::GET | Method::DELETE if version.is_stateless() => {
            Err(ProxyError::MethodNotAllowed(req.method().clone()))
        }
        Method::GET => cx.get(req).await,
        Method::DELETE => cx.delete(req).await,
        ref m => Err(ProxyError::MethodNotAllowed(m.clone())),
    }
}

/// What one client request on a virtual server works with.
pub(super) struct Cx<'a> {
    pub(super) state: &'a State,
    pub(super) conn: ConnInfo,
    pub(super) claims: Arc<Claims>,
    pub(super) vs: &'a Arc<Virtual>,
    pub(super) seal: Seal,
    pub(super) reach: Vec<bool>,
    pub(super) session: Option<Arc<VSession>>,
}

impl Cx<'_> {
    pub(super) fn deadline(&self) -> Duration {
        self.vs.config.list_timeout
    }

    pub(super) fn member_name(&self, m: usize) -> &str {
        self.vs.config.members.get(m).map_or("", String::as_str)
    }

    /// POST: one JSON-RPC message, to the member that owns it (or to every
    /// member, for what the virtual server merges). What the virtual server
    /// refuses itself is on record like any refused message.
    async fn post(&self, req: Request<ClientBody>) -> Result<Response<Body>, ProxyError> {
        let headers = req.headers().clone();
        let answered = self.post_message(req).await;
        if let Err(e) = &answered {
            self.on_record(&headers, e.method(), e.id(), e.to_string(), None)
                .await;
        }
        answered
    }

    /// A refusal of the virtual server's own (not of a member's path), on
    /// record: `virtual_server` set, no member upstream, `tool` the name the
    /// client used.
    async fn on_record(
        &self,
        headers: &HeaderMap,
        method: Option<&str>,
        id: Option<&Id>,
        reason: String,
        tool: Option<&str>,
    ) {
        if !self.state.auditor.is_enabled() {
            return;
        }
        let Some(m) = self.reach.iter().position(|r| *r) else {
            return;
        };
        let Ok(mut run) =
            super::super::authorize(self.state, self.claims.clone(), self.member_name(m))
        else {
            return;
        };
        run.version = super::super::header_version(headers);
        run.via = Some(self.vs.via.clone());
        let reason = format!("virtual server {}: {reason}", self.vs.config.name);
        super::super::record_refusal(
            self.state,
            &run,
            self.conn,
            None,
            method,
            id,
            reason,
            |row| {
                row.upstream = String::new();
                if let Some(t) = tool {
                    row.tool = t.to_owned();
                }
            },
        )
        .await;
    }

    /// One POST's message, read as every request path reads it, then by
    /// kind: an answer to a member's request, a notification, or a request.
    async fn post_message(&self, req: Request<ClientBody>) -> Result<Response<Body>, ProxyError> {
        let (head, body) = req.into_parts();
        let bytes = self.read_body(&head.headers, body).await?;
        // The same strict reader as every request path; the member's path
        // reads the rewritten message again.
        let env = jsonrpc::parse(&bytes, &self.state.limits)
            .map_err(|e| super::super::request::stage::parse_error(e, &head.headers))?;
        let [msg] = env.messages.as_slice() else {
            return Err(one_message_only());
        };
        if env.batch {
            return Err(one_message_only());
        }
        let version = ProtocolVersion::of_request(&head.headers, &env);
        // The client's mirrored headers against its body, as on any path
        // (the member's path checks the rewritten ones again).
        crate::mcp::headers::check(&head.headers, msg, None).map_err(|source| {
            ProxyError::HeaderMismatch {
                id: msg.id.clone(),
                source,
            }
        })?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| ProxyError::InvalidRequest {
            message: format!("unreadable message: {e}"),
        })?;
        let headers = head.headers;
        match msg.kind {
            Kind::Response => self.answer_member(&headers, v).await,
            Kind::Notification => self.notification(&headers, msg.method.as_deref(), v).await,
            Kind::Request => {
                let id = msg.id.clone();
                let method = msg.method.clone().unwrap_or_default();
                self.request(&headers, id, method, v, version).await
            }
        }
    }

    /// A POST's body: `application/json`, within the size limit.
    async fn read_body(&self, headers: &HeaderMap, body: ClientBody) -> Result<Bytes, ProxyError> {
        let ct = crate::http_util::content_type(headers).to_owned();
        if !mime_is(&ct, "application/json") {
            return Err(ProxyError::UnsupportedMediaType(ct));
        }
        let limit = self.state.config.server.max_request_bytes;
        match http_body_util::Limited::new(body, limit).collect().await {
            Ok(c) => Ok(c.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                Err(ProxyError::BodyTooLarge { limit })
            }
            Err(e) => Err(ProxyError::BodyRead(e.to_string())),
        }
    }

    /// A client's request: what the virtual server merges, answers or
    /// sends to every member, by its method; anything else to the member
    /// that owns what it names.
    async fn request(
        &self,
        headers: &HeaderMap,
        id: Option<Id>,
        method: String,
        mut v: Value,
        version: ProtocolVersion,
    ) -> Result<Response<Body>, ProxyError> {
        // A method this revision does not have is the member's to
        // refuse (or serve, as an extra method) when it is the only
        // one; several members cannot all be asked.
        if crate::mcp::methods::lookup(&method, version).is_none() {
            if self.vs.config.members.len() == 1 {
                rewrite::inward_progress(&mut v, 0, &self.seal);
                return self.forward(headers, 0, id, v).await;
            }
            return Err(ProxyError::UnknownMethod {
                id,
                method,
                stateless: version.is_stateless(),
            });
        }
        match method.as_str() {
            "initialize" => self.initialize(headers, id.as_ref(), v).await,
            "server/discover" => self.discover(headers, id.as_ref(), v).await,
            "ping" => Ok(answer(id.as_ref(), json!({}), false)),
            "tools/list" => self.list(headers, id.as_ref(), &method, "tools", v).await,
            "prompts/list" => self.list(headers, id.as_ref(), &method, "prompts", v).await,
            "resources/list" => {
                self.list(headers, id.as_ref(), &method, "resources", v)
                    .await
            }
            "resources/templates/list" => {
                self.list(headers, id.as_ref(), &method, "resourceTemplates", v)
                    .await
            }
            "tasks/list" => self.list(headers, id.as_ref(), &method, "tasks", v).await,
            "logging/setLevel" => self.broadcast_request(headers, id.as_ref(), v).await,
            "subscriptions/listen" => self.listen(headers, id.as_ref(), v).await,
            _ => self.routed(headers, id, &method, v, version).await,
        }
    }

    /// A request to the member that owns the name, URI or task it names,
    /// rewritten to the member's own; when none does, the client's answer
    /// is `-32602`, on record.
    async fn routed(
        &self,
        headers: &HeaderMap,
        id: Option<Id>,
        method: &str,
        mut v: Value,
        version: ProtocolVersion,
    ) -> Result<Response<Body>, ProxyError> {
        let target = match self.target(method, &mut v, version).await {
            Ok(t) => t,
            Err(message) => {
                let name = v
                    .pointer("/params/name")
                    .or(v.pointer("/params/uri"))
                    .and_then(Value::as_str);
                self.on_record(headers, Some(method), id.as_ref(), message.clone(), name)
                    .await;
                // A resource nobody (or more than one member)
                // lists: named in `data.uri`, as servers do.
                let data = v.pointer("/params/uri").map(|u| json!({"uri": u}));
                return Ok(super::super::error::rpc(
                    StatusCode::OK,
                    id.as_ref(),
                    -32602,
                    &message,
                    data.as_ref(),
                ));
            }
        };
        self.forward(headers, target, id, v).await
    }
}

/// The refusal of a batch, or of a body that is not one message.
pub(super) fn one_message_only() -> ProxyError {
    ProxyError::InvalidRequest {
        message: "a virtual server takes one JSON-RPC message per request (no batches)".to_owned(),
    }
}
