//! A virtual server (`[[virtual_server]]`, `/mcp/<name>`): several member
//! upstreams behind one endpoint. Each client message goes to the member
//! that owns its name, URI or id, **on that member's own request path**
//! (steps 4 on of [`super`]: authority, session, strict parse, decision,
//! gates, budgets, record, relay, screening): a virtual-server tool is
//! decided exactly as the member's tool is, rows name the member upstream
//! and the member's own tool name, plus the virtual server (`via`).
//!
//! What is this module's own:
//! - **Names** ([`index`]): resolved over the members' full lists, before
//!   any principal's filtering; a name no member exposes (unknown, or left
//!   out by the collision rule) reaches nothing.
//! - **Sessions**: one client session (a sealed `Mcp-Session-Id` bound to
//!   the principal and run) holds one session per member, opened by
//!   `initialize` for every member in parallel (within `list_timeout_ms`),
//!   and lazily for a member that was down; a member that cannot be opened
//!   is left out, not fatal. 2026-07-28 requests have no sessions.
//! - **Lists**: the four lists (and `tasks/list`) asked of every member in
//!   parallel, each within the deadline; a late member's items are missing
//!   from that page and asked again on the next (one sealed cursor holds
//!   every member's place).
//! - **Ids** ([`rewrite`]): a member's requests to the client, its task ids
//!   and the client's progress tokens are sealed per member; an answer, a
//!   task call or a progress report reaches only the member it is for.
//! - **Streams**: a member's event stream (an answer's, the GET stream) is
//!   relayed event by event with those rewrites; the GET stream is the
//!   members' streams merged. `list_changed` of a member is the virtual
//!   server's (and re-lists the member's names).

pub mod merge;
pub mod rewrite;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use dashmap::DashMap;
use futures_util::StreamExt;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::auth::Claims;
use crate::http_util::{mime_is, Body, BoxError};
use crate::mcp::jsonrpc::{self, Id, Kind};
use crate::mcp::sse;
use crate::mcp::version::ProtocolVersion;
use crate::server::listener::ConnInfo;
use crate::session::VirtualKind;
use crate::virtual_server::VirtualServer;

use super::error::{json_response, ProxyError};
use super::State;
use crate::upstream::body::ClientBody;
use crate::upstream::members::{self, Index, Space};
use rewrite::{Outward, Seal};

/// Most client sessions a virtual server keeps on this replica; past it the
/// oldest is let go (its client's next request opens the members again).
const MAX_SESSIONS: usize = 50_000;
/// Largest client `initialize` params carried inside the sealed session id
/// (so another replica can open the members for it).
const MAX_INIT_IN_ID: usize = 2_048;
/// Largest client `initialize` params a virtual server keeps for a session
/// (members opened later are opened with them).
const MAX_INIT: usize = 16 * 1024;
/// How many times a late member is asked again through the cursor.
const LATE_RETRIES: u32 = 1;

/// A virtual server: its config, its names, its client sessions.
pub struct Virtual {
    /// As configured.
    pub config: Arc<VirtualServer>,
    /// The members' full lists and the names resolved over them.
    pub index: Index,
    /// The members' upstream clients, in member order (what the firewall
    /// lists them with).
    clients: Vec<Arc<crate::upstream::client::UpstreamClient>>,
    sessions: DashMap<[u8; 16], Arc<VSession>>,
    /// Sessions the client ended here (DELETE): 404 from then on.
    ended: DashMap<[u8; 16], ()>,
    via: Arc<str>,
}

/// One client session: the client's `initialize` params and each member's
/// (sealed) session id, once opened.
struct VSession {
    key: [u8; 16],
    init: Value,
    members: Vec<tokio::sync::Mutex<Option<HeaderValue>>>,
    /// Requests in flight, by the client's id: where a cancellation goes.
    inflight: Mutex<HashMap<Id, usize>>,
    seq: u64,
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
pub(super) async fn serve(
    state: &State,
    conn: ConnInfo,
    claims: Arc<Claims>,
    vs: Arc<Virtual>,
    req: Request<ClientBody>,
) -> Result<Response<Body>, ProxyError> {
    // Authority: the members this run may reach. None looks like an
    // unknown path, as for a plain upstream.
    let reach = super::reaches(state, &claims, &vs.config.members);
    if !reach.iter().any(|r| *r) {
        return Err(ProxyError::UnknownUpstream(vs.config.name.clone()));
    }
    let seal = Seal::new(state.sessions.clone(), claims.clone(), vs.via.clone());
    let version = super::header_version(req.headers());
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

/// The client's sealed session, this replica's copy (or a new copy made
/// from what the id carries: its members open again lazily).
fn open_session(
    vs: &Virtual,
    seal: &Seal,
    headers: &HeaderMap,
) -> Result<Option<Arc<VSession>>, ProxyError> {
    let mut values = headers.get_all("mcp-session-id").iter();
    let Some(sealed) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ProxyError::SessionNotFound);
    }
    let payload = sealed
        .to_str()
        .ok()
        .and_then(|s| seal.open(VirtualKind::Session, s))
        .ok_or(ProxyError::SessionNotFound)?;
    let (key, init) = payload
        .split_first_chunk::<16>()
        .ok_or(ProxyError::SessionNotFound)?;
    if let Some(s) = vs.sessions.get(key) {
        return Ok(Some(s.clone()));
    }
    if vs.ended.contains_key(key) {
        return Err(ProxyError::SessionNotFound);
    }
    let init: Value = serde_json::from_slice(init).unwrap_or(Value::Null);
    if !init.is_object() {
        // Ended here (DELETE), or too large to travel in the id.
        return Err(ProxyError::SessionNotFound);
    }
    Ok(Some(insert_session(vs, *key, init)))
}

fn insert_session(vs: &Virtual, key: [u8; 16], init: Value) -> Arc<VSession> {
    // Past the cap by a margin, the oldest sessions go down to the cap: one
    // pass over the map per margin's worth of new sessions.
    if vs.sessions.len() >= MAX_SESSIONS + MAX_SESSIONS / 64 {
        crate::budget::evict_oldest(&vs.sessions, MAX_SESSIONS, |s| s.seq);
    }
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let s = Arc::new(VSession {
        key,
        init,
        members: (0..vs.config.members.len())
            .map(|_| tokio::sync::Mutex::new(None))
            .collect(),
        inflight: Mutex::new(HashMap::new()),
        seq: SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    });
    vs.sessions.insert(key, s.clone());
    s
}

/// A member's answer, read.
enum Answer {
    /// One JSON-RPC message, its bytes (or none: 202).
    Json(StatusCode, Option<Bytes>),
    /// An event stream, still flowing.
    Stream(Body),
    /// Anything else, relayed as it is (an HTTP error of the member path).
    Other(Response<Body>),
}

/// What one client request on a virtual server works with.
struct Cx<'a> {
    state: &'a State,
    conn: ConnInfo,
    claims: Arc<Claims>,
    vs: &'a Arc<Virtual>,
    seal: Seal,
    reach: Vec<bool>,
    session: Option<Arc<VSession>>,
}

impl Cx<'_> {
    fn deadline(&self) -> Duration {
        self.vs.config.list_timeout
    }

    fn member_name(&self, m: usize) -> &str {
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
        let Ok(mut run) = super::authorize(self.state, self.claims.clone(), self.member_name(m))
        else {
            return;
        };
        run.version = super::header_version(headers);
        run.via = Some(self.vs.via.clone());
        let reason = format!("virtual server {}: {reason}", self.vs.config.name);
        super::record_refusal(
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

    async fn post_message(&self, req: Request<ClientBody>) -> Result<Response<Body>, ProxyError> {
        let (head, body) = req.into_parts();
        let ct = crate::http_util::content_type(&head.headers).to_owned();
        if !mime_is(&ct, "application/json") {
            return Err(ProxyError::UnsupportedMediaType(ct));
        }
        let limit = self.state.config.server.max_request_bytes;
        let bytes = match http_body_util::Limited::new(body, limit).collect().await {
            Ok(c) => c.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(ProxyError::BodyTooLarge { limit })
            }
            Err(e) => return Err(ProxyError::BodyRead(e.to_string())),
        };
        // The same strict reader as every request path; the member's path
        // reads the rewritten message again.
        let env = jsonrpc::parse(&bytes, &self.state.limits)
            .map_err(|e| super::stage::parse_error(e, &head.headers))?;
        let [msg] = env.messages.as_slice() else {
            return Err(ProxyError::InvalidRequest {
                message: "a virtual server takes one JSON-RPC message per request (no batches)"
                    .to_owned(),
            });
        };
        if env.batch {
            return Err(ProxyError::InvalidRequest {
                message: "a virtual server takes one JSON-RPC message per request (no batches)"
                    .to_owned(),
            });
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
        let mut v: Value =
            serde_json::from_slice(&bytes).map_err(|e| ProxyError::InvalidRequest {
                message: format!("unreadable message: {e}"),
            })?;
        let headers = head.headers;
        match msg.kind {
            Kind::Response => self.answer_member(&headers, v).await,
            Kind::Notification => self.notification(&headers, msg.method.as_deref(), v).await,
            Kind::Request => {
                let id = msg.id.clone();
                let method = msg.method.clone().unwrap_or_default();
                // A method this revision does not have is the member's to
                // refuse (or serve, as an extra method) when it is the only
                // one; several members cannot all be asked.
                if crate::mcp::methods::lookup(&method, version).is_none() {
                    if self.vs.config.members.len() == 1 {
                        rewrite::inward_progress(&mut v, 0, &self.seal);
                        return self.forward(&headers, 0, id, v).await;
                    }
                    return Err(ProxyError::UnknownMethod {
                        id,
                        method,
                        stateless: version.is_stateless(),
                    });
                }
                match method.as_str() {
                    "initialize" => self.initialize(&headers, id.as_ref(), v).await,
                    "server/discover" => self.discover(&headers, id.as_ref(), v).await,
                    "ping" => Ok(answer(id.as_ref(), json!({}), false)),
                    "tools/list" => self.list(&headers, id.as_ref(), &method, "tools", v).await,
                    "prompts/list" => {
                        self.list(&headers, id.as_ref(), &method, "prompts", v)
                            .await
                    }
                    "resources/list" => {
                        self.list(&headers, id.as_ref(), &method, "resources", v)
                            .await
                    }
                    "resources/templates/list" => {
                        self.list(&headers, id.as_ref(), &method, "resourceTemplates", v)
                            .await
                    }
                    "tasks/list" => self.list(&headers, id.as_ref(), &method, "tasks", v).await,
                    "logging/setLevel" => self.broadcast_request(&headers, id.as_ref(), v).await,
                    "subscriptions/listen" => self.listen(&headers, id.as_ref(), v).await,
                    _ => {
                        let target = match self.target(&method, &mut v, version).await {
                            Ok(t) => t,
                            Err(message) => {
                                let name = v
                                    .pointer("/params/name")
                                    .or(v.pointer("/params/uri"))
                                    .and_then(Value::as_str);
                                self.on_record(
                                    &headers,
                                    Some(&method),
                                    id.as_ref(),
                                    message.clone(),
                                    name,
                                )
                                .await;
                                // A resource nobody (or more than one member)
                                // lists: named in `data.uri`, as servers do.
                                let data = v.pointer("/params/uri").map(|u| json!({"uri": u}));
                                return Ok(super::error::rpc(
                                    StatusCode::OK,
                                    id.as_ref(),
                                    -32602,
                                    &message,
                                    data.as_ref(),
                                ));
                            }
                        };
                        self.forward(&headers, target, id, v).await
                    }
                }
            }
        }
    }

    /// The member a request goes to, its message rewritten to the member's
    /// own names; the error is the client's answer (-32602).
    async fn target(
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

    fn inward_tasks(&self, v: &mut Value, member: Option<usize>) -> Result<Option<usize>, String> {
        rewrite::inward_tasks(v, &self.seal, member)
            .map_err(|_| "Unknown task: no task of this run has that id here".to_owned())
    }

    /// The member and own name of an exposed name; `Err(Some(why))` when
    /// the name is left out by the collision rule, `Err(None)` when no
    /// member lists it (after listing the members again, at most once per
    /// interval).
    async fn route(&self, space: Space, name: &str) -> Result<(usize, String), Option<String>> {
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
    fn exposed_spelling(&self, space: Space, member: usize, own: &str) -> String {
        match space {
            Space::Uris => own.to_owned(),
            Space::Tools | Space::Prompts | Space::Templates => {
                self.vs.config.spelling(member, own)
            }
        }
    }

    async fn uri_owner(&self, uri: &str) -> Result<usize, String> {
        if self.vs.config.members.len() == 1 {
            return Ok(0);
        }
        let resolved = self.vs.index.resolved();
        match resolved.uri_owner(uri) {
            Ok(m) => Ok(m),
            Err(_) => self.refresh(true).await.uri_owner(uri),
        }
    }

    async fn refresh(&self, force: bool) -> Arc<members::Resolved> {
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

    /// A request to one member; its answer relayed with the member's ids
    /// sealed.
    async fn forward(
        &self,
        headers: &HeaderMap,
        m: usize,
        id: Option<Id>,
        v: Value,
    ) -> Result<Response<Body>, ProxyError> {
        if !self.reach.get(m).copied().unwrap_or(false) {
            // Outside the run's authority: like a name that does not exist.
            let method = v.get("method").and_then(Value::as_str).unwrap_or("");
            let what = if method == "tools/call" {
                "tool"
            } else {
                "name"
            };
            return Ok(rpc_error(id.as_ref(), -32602, &format!("Unknown {what}")));
        }
        let name = v
            .get("method")
            .and_then(Value::as_str)
            .and_then(jsonrpc::name_field)
            .and_then(|f| v.pointer(&format!("/params/{f}")))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let body = Bytes::from(v.to_string());
        let guard = self.track(id.as_ref(), m);
        let answer = self
            .call(headers, m, Method::POST, Some(body), name.as_deref())
            .await?;
        Ok(self.relay(answer, m, guard))
    }

    /// Remembers where a client's request went (for its cancellation) until
    /// the guard is dropped.
    fn track(&self, id: Option<&Id>, m: usize) -> Option<Inflight> {
        let (s, id) = (self.session.clone()?, id?.clone());
        if let Ok(mut f) = s.inflight.lock() {
            if f.len() < 10_000 {
                f.insert(id.clone(), m);
            }
        }
        Some(Inflight { session: s, id })
    }

    /// The member's answer, rewritten for the client.
    fn relay(&self, answer: Answer, m: usize, guard: Option<Inflight>) -> Response<Body> {
        match answer {
            Answer::Json(status, None) => {
                let mut r = Response::new(crate::http_util::empty());
                *r.status_mut() = status;
                r
            }
            Answer::Json(status, Some(bytes)) if !needs_rewrite(&bytes) => {
                json_response(status, bytes)
            }
            Answer::Json(status, Some(bytes)) => {
                let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) else {
                    return json_response(status, bytes);
                };
                if rewrite::outward(&mut v, m, &self.seal) == Outward::ListChanged {
                    self.vs.index.stale(m);
                }
                json_response(status, Bytes::from(v.to_string()))
            }
            Answer::Stream(body) => sse_response(self.rewrite_stream(body, m, guard, true)),
            Answer::Other(r) => r,
        }
    }

    /// A member's event stream, event by event, with its messages rewritten
    /// for the client (ids of events are not carried: the virtual server's
    /// streams are not resumable).
    /// Without `answers`, the member's responses are left out (a merged
    /// stream answers once, itself).
    fn rewrite_stream(&self, body: Body, m: usize, guard: Option<Inflight>, answers: bool) -> Body {
        let seal = Seal::new(
            self.state.sessions.clone(),
            self.claims.clone(),
            self.vs.via.clone(),
        );
        let vs = self.vs.clone();
        let max = self.state.config.server.max_sse_event_bytes;
        let stream = futures_util::stream::unfold(
            (body, sse::Decoder::new(max), seal, vs, guard, false),
            move |(mut body, mut dec, seal, vs, guard, done)| async move {
                if done {
                    return None;
                }
                loop {
                    let mut out = BytesMut::new();
                    while let Some(ev) = dec.next_event() {
                        if !ev.has_data {
                            continue;
                        }
                        let Ok(mut v) = serde_json::from_str::<Value>(&ev.data) else {
                            continue;
                        };
                        if !answers && v.get("method").is_none() {
                            continue;
                        }
                        match rewrite::outward(&mut v, m, &seal) {
                            Outward::Drop => continue,
                            Outward::ListChanged => vs.index.stale(m),
                            Outward::Relay => {}
                        }
                        sse::encode_message(None, v.to_string().as_bytes(), &mut out);
                    }
                    if !out.is_empty() {
                        let frame = http_body::Frame::data(out.freeze());
                        return Some((
                            Ok::<_, BoxError>(frame),
                            (body, dec, seal, vs, guard, false),
                        ));
                    }
                    match body.frame().await {
                        Some(Ok(f)) => {
                            if let Some(d) = f.data_ref() {
                                if let Err(e) = dec.push(d) {
                                    return Some((
                                        Err(Box::new(e) as BoxError),
                                        (body, dec, seal, vs, guard, true),
                                    ));
                                }
                            }
                        }
                        Some(Err(e)) => return Some((Err(e), (body, dec, seal, vs, guard, true))),
                        None => return None,
                    }
                }
            },
        );
        http_body_util::StreamBody::new(stream).boxed_unsync()
    }

    /// One message to one member on its own request path: the member's
    /// session (opened now if it is not), the client's headers but the
    /// member's session id and `Mcp-Name`. A member session the member path
    /// no longer knows is opened again once.
    async fn call(
        &self,
        headers: &HeaderMap,
        m: usize,
        method: Method,
        body: Option<Bytes>,
        mcp_name: Option<&str>,
    ) -> Result<Answer, ProxyError> {
        for attempt in 0..2 {
            let session = match &self.session {
                Some(s) => match self.ensure(s, headers, m).await {
                    Ok((sid, _)) => Some(sid),
                    Err(e) => return Err(e),
                },
                None => None,
            };
            let r = self
                .send(
                    m,
                    headers,
                    method.clone(),
                    session.as_ref(),
                    body.clone(),
                    mcp_name,
                )
                .await;
            let lost = matches!(&r, Err(ProxyError::SessionNotFound))
                || matches!(&r, Ok(resp) if resp.status() == StatusCode::NOT_FOUND && session.is_some());
            if lost && attempt == 0 {
                if let Some(s) = &self.session {
                    if let Some(slot) = s.members.get(m) {
                        *slot.lock().await = None;
                    }
                    continue;
                }
            }
            return match r {
                Ok(resp) => Ok(read_answer(resp).await),
                Err(ProxyError::UnknownUpstream(_)) => Ok(Answer::Json(StatusCode::OK, None)),
                Err(e) => Ok(Answer::Other(e.into_response())),
            };
        }
        Ok(Answer::Other(ProxyError::SessionNotFound.into_response()))
    }

    /// One request to member `m`'s own path (steps 4 on), as the client's
    /// but for the member's session and `Mcp-Name`.
    async fn send(
        &self,
        m: usize,
        headers: &HeaderMap,
        method: Method,
        session: Option<&HeaderValue>,
        body: Option<Bytes>,
        mcp_name: Option<&str>,
    ) -> Result<Response<Body>, ProxyError> {
        let member = self.member_name(m);
        let req = member_request(member, headers, method, session, body, mcp_name);
        super::serve_upstream(
            self.state,
            self.conn,
            self.claims.clone(),
            member,
            Some(self.vs.via.clone()),
            req,
        )
        .await
    }

    /// The member's session on this client session, opened now if needed
    /// (`initialize` with the client's params, then `initialized`); the
    /// second value is the member's initialize result when opened now.
    async fn ensure(
        &self,
        s: &VSession,
        headers: &HeaderMap,
        m: usize,
    ) -> Result<(HeaderValue, Option<Value>), ProxyError> {
        let slot = s.members.get(m).ok_or(ProxyError::SessionNotFound)?;
        let mut slot = slot.lock().await;
        if let Some(sid) = slot.as_ref() {
            return Ok((sid.clone(), None));
        }
        let init = json!({
            "jsonrpc": "2.0", "id": "mcp-firewall-virtual", "method": "initialize",
            "params": s.init,
        });
        let mut h = headers.clone();
        h.remove("mcp-protocol-version");
        h.remove("mcp-method");
        h.remove("mcp-name");
        let down = |why: String| {
            tracing::warn!(virtual_server = %self.vs.config.name, upstream = %self.member_name(m), error = %why, "virtual server: cannot open a session with a member");
            self.vs.index.set_up(m, false);
            ProxyError::Upstream {
                upstream: self.member_name(m).to_owned(),
                failure: crate::upstream::failure::UpstreamFailure::Invalid(why),
                ids: Vec::new(),
            }
        };
        let init = Some(Bytes::from(init.to_string()));
        let resp = self
            .send(m, &h, Method::POST, None, init, None)
            .await
            .map_err(|e| down(e.to_string()))?;
        let sid = resp.headers().get("mcp-session-id").cloned();
        let status = resp.status();
        let bytes = match read_answer(resp).await {
            Answer::Json(_, Some(b)) => Some(b),
            Answer::Stream(body) => {
                final_message(body, self.state.config.server.max_sse_event_bytes).await
            }
            _ => None,
        };
        let result: Value = bytes
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        let Some(result) = result.get("result").cloned() else {
            return Err(down(format!("initialize answered {status}: {result}")));
        };
        let Some(sid) = sid else {
            return Err(down("initialize answered no session id".to_owned()));
        };
        // `initialized`, in the revision the member chose.
        let mut h = h;
        if let Some(v) = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            h.insert("mcp-protocol-version", v);
        }
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let note = Some(Bytes::from(note.to_string()));
        let _ = self.send(m, &h, Method::POST, Some(&sid), note, None).await;
        self.vs.index.set_up(m, true);
        *slot = Some(sid.clone());
        Ok((sid, Some(result)))
    }

    /// `initialize`: a new client session; every member reached by the run
    /// opened in parallel within the deadline; the capabilities merged.
    async fn initialize(
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
    fn merged(&self, results: &[(usize, Value)], requested: &str) -> Value {
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
    fn restamp(&self, result: &mut Value) {
        if let Some(meta) = result.get_mut("_meta") {
            self.restamp_meta(meta);
        }
    }

    /// [`Cx::restamp`] of a `_meta` object.
    fn restamp_meta(&self, meta: &mut Value) {
        if self.vs.config.members.len() < 2 {
            return;
        }
        if let Some(info) = meta.get_mut("io.modelcontextprotocol/serverInfo") {
            *info = self.server_info();
        }
    }

    fn server_info(&self) -> Value {
        json!({
            "name": self.vs.config.name,
            "title": format!("{} (virtual server: {})", self.vs.config.name, self.vs.config.members.join(", ")),
            "version": env!("CARGO_PKG_VERSION"),
        })
    }

    /// `server/discover` (2026-07-28): every member's, merged.
    async fn discover(
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

    /// `subscriptions/listen` (2026-07-28): every member's stream, merged,
    /// each message rewritten; one answer, the virtual server's, when every
    /// member's stream has ended.
    async fn listen(
        &self,
        headers: &HeaderMap,
        id: Option<&Id>,
        v: Value,
    ) -> Result<Response<Body>, ProxyError> {
        let members: Vec<usize> = (0..self.vs.config.members.len())
            .filter(|m| self.reach.get(*m).copied().unwrap_or(false))
            .collect();
        let opens = members.into_iter().map(|m| {
            let body = Bytes::from(v.to_string());
            async move {
                let r = tokio::time::timeout(
                    self.deadline(),
                    self.call(headers, m, Method::POST, Some(body), None),
                )
                .await;
                match r {
                    Ok(Ok(Answer::Stream(b))) => Ok(self.rewrite_stream(b, m, None, false)),
                    Ok(Ok(other)) => Err(Some(self.relay(other, m, None))),
                    _ => Err(None),
                }
            }
        });
        let mut streams = Vec::new();
        let mut refusal = None;
        for r in futures_util::future::join_all(opens).await {
            match r {
                Ok(s) => streams.push(s),
                Err(Some(resp)) if refusal.is_none() => refusal = Some(resp),
                Err(_) => {}
            }
        }
        if streams.is_empty() {
            return Ok(refusal.unwrap_or_else(|| {
                rpc_error(
                    id,
                    super::answer::codes::UPSTREAM_ERROR,
                    "no member of the virtual server opened a subscription stream",
                )
            }));
        }
        let done = json!({"jsonrpc": "2.0", "id": id, "result": {}});
        let mut last = BytesMut::new();
        sse::encode_message(None, done.to_string().as_bytes(), &mut last);
        let merged =
            http_body_util::BodyStream::new(merge(streams)).chain(futures_util::stream::once(
                std::future::ready(Ok::<_, BoxError>(http_body::Frame::data(last.freeze()))),
            ));
        Ok(sse_response(
            http_body_util::StreamBody::new(merged).boxed_unsync(),
        ))
    }

    /// A request every member reached gets (`logging/setLevel`); answered
    /// with the first member's result.
    async fn broadcast_request(
        &self,
        headers: &HeaderMap,
        id: Option<&Id>,
        v: Value,
    ) -> Result<Response<Body>, ProxyError> {
        let answers = self.fan_out(headers, &v, None, |_, v| v.clone()).await;
        let result = answers.iter().find_map(|(_, a)| a.result());
        Ok(match result {
            Some(r) => answer(id, r, streamed(&answers)),
            None => no_result(id, answers),
        })
    }

    /// One request per member reached (of `only`, when given), in
    /// parallel, each within the deadline: what each answered.
    async fn fan_out(
        &self,
        headers: &HeaderMap,
        v: &Value,
        only: Option<&[usize]>,
        per_member: impl Fn(usize, &Value) -> Value,
    ) -> Vec<(usize, Fanned)> {
        let members: Vec<usize> = (0..self.vs.config.members.len())
            .filter(|m| self.reach.get(*m).copied().unwrap_or(false))
            .filter(|m| only.is_none_or(|o| o.contains(m)))
            .collect();
        let calls = members.into_iter().map(|m| {
            let body = Bytes::from(per_member(m, v).to_string());
            async move {
                let ask = async {
                    match self.call(headers, m, Method::POST, Some(body), None).await {
                        Ok(Answer::Json(_, Some(v))) => Fanned::Message(v, false),
                        Ok(Answer::Json(status, None)) => Fanned::Http(status_only(status)),
                        Ok(Answer::Stream(b)) => {
                            match final_message(b, self.state.config.server.max_sse_event_bytes)
                                .await
                            {
                                Some(v) => Fanned::Message(v, true),
                                None => Fanned::Late,
                            }
                        }
                        Ok(Answer::Other(r)) => Fanned::Http(r),
                        Err(e) => Fanned::Http(e.into_response()),
                    }
                };
                match tokio::time::timeout(self.deadline(), ask).await {
                    Ok(v) => (m, v),
                    Err(_) => {
                        tracing::warn!(virtual_server = %self.vs.config.name, upstream = %self.member_name(m), "virtual server: a member answered later than list_timeout_ms; left out of this answer");
                        self.state
                            .metrics
                            .virtual_late(&self.vs.config.name, self.member_name(m));
                        (m, Fanned::Late)
                    }
                }
            }
        });
        futures_util::future::join_all(calls).await
    }

    /// A merged list: every member still to be asked (all, or those the
    /// cursor names), in parallel, within the deadline; items renamed to
    /// the virtual server's names, those it does not expose left out.
    async fn list(
        &self,
        headers: &HeaderMap,
        id: Option<&Id>,
        method: &str,
        key: &str,
        v: Value,
    ) -> Result<Response<Body>, ProxyError> {
        let mut places: Vec<Place> = match v.pointer("/params/cursor").and_then(Value::as_str) {
            Some(c) => match self.open_cursor(method, c) {
                Some(p) => p,
                None => return Ok(rpc_error(id, -32602, "Invalid cursor")),
            },
            None => (0..self.vs.config.members.len())
                .map(|m| Place {
                    m,
                    cursor: None,
                    late: 0,
                })
                .collect(),
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
        let (answers, mut resolved) = futures_util::future::join(
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
        // An item the names do not know yet: its member is listed again
        // (bounded per interval); what the member shows a client but not
        // the firewall's own listing (servers may list by the client's
        // capabilities) is learned from this list, for every caller.
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
        if !unknown.is_empty() {
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
                for p in &pages {
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
        }
        let mut next: Vec<Place> = Vec::new();
        for (m, a) in &answers {
            let late = places.iter().find(|p| p.m == *m).map_or(0, |p| p.late);
            if matches!(a, Fanned::Late) && late < LATE_RETRIES {
                next.push(Place {
                    m: *m,
                    cursor: by_member.get(m).cloned().flatten(),
                    late: late + 1,
                });
            }
        }
        let mut items: Vec<std::borrow::Cow<'_, str>> = Vec::new();
        let mut ttl: Option<u64> = None;
        let mut private = false;
        for p in &pages {
            for item in &p.items {
                if let Some(item) = self.exposed_item(&resolved, key, p.member, item) {
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
        // The first member's result keeps its other fields (`resultType`,
        // `_meta`); the shortest cache time and the narrowest scope win.
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
        if let Some(t) = ttl {
            fields.push(("ttlMs".to_owned(), t.to_string()));
        }
        if private {
            fields.push(("cacheScope".to_owned(), r#""private""#.to_owned()));
        } else if let Some(c) = pages.first().and_then(|p| p.fields.get("cacheScope")) {
            fields.push(("cacheScope".to_owned(), c.get().to_owned()));
        }
        fields.push((
            key.to_owned(),
            merge::array(items.iter().map(|i| i.as_ref())),
        ));
        if !next.is_empty() {
            fields.push((
                "nextCursor".to_owned(),
                Value::String(self.seal_cursor(method, &next)).to_string(),
            ));
        }
        let result = merge::object(fields.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        Ok(raw_answer(id, &result, streamed(&answers)))
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

    /// A client's notification: a cancellation to the member its request
    /// went to, `roots/list_changed` to every member, the rest answered here.
    async fn notification(
        &self,
        headers: &HeaderMap,
        method: Option<&str>,
        v: Value,
    ) -> Result<Response<Body>, ProxyError> {
        let accepted = || {
            let mut r = Response::new(crate::http_util::empty());
            *r.status_mut() = StatusCode::ACCEPTED;
            r
        };
        match method {
            Some("notifications/cancelled") => {
                let id = v.pointer("/params/requestId").and_then(id_of);
                let m = match (&self.session, id) {
                    (Some(s), Some(id)) => s.inflight.lock().ok().and_then(|f| f.get(&id).copied()),
                    _ => None,
                };
                if let Some(m) = m {
                    let body = Bytes::from(v.to_string());
                    let _ = self
                        .call(headers, m, Method::POST, Some(body), None)
                        .await?;
                }
                Ok(accepted())
            }
            Some("notifications/roots/list_changed") => {
                let body = Bytes::from(v.to_string());
                for m in self.opened_members().await {
                    let _ = self
                        .call(headers, m, Method::POST, Some(body.clone()), None)
                        .await;
                }
                Ok(accepted())
            }
            _ => Ok(accepted()),
        }
    }

    /// The client's answer to a member's request: to that member only,
    /// with the member's own id.
    async fn answer_member(
        &self,
        headers: &HeaderMap,
        mut v: Value,
    ) -> Result<Response<Body>, ProxyError> {
        let id = v.get("id").cloned().unwrap_or(Value::Null);
        let Some((m, own)) = self.seal.open_from_client(VirtualKind::Request, &id) else {
            return Err(ProxyError::InvalidRequest {
                message: "the response answers no request of this virtual server's members"
                    .to_owned(),
            });
        };
        v["id"] = own;
        let body = Bytes::from(v.to_string());
        let answer = self
            .call(headers, m, Method::POST, Some(body), None)
            .await?;
        Ok(self.relay(answer, m, None))
    }

    /// The members with a session open on this client session.
    async fn opened_members(&self) -> Vec<usize> {
        let Some(s) = &self.session else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (m, slot) in s.members.iter().enumerate() {
            if slot.lock().await.is_some() {
                out.push(m);
            }
        }
        out
    }

    /// GET: the members' streams, merged, each message rewritten.
    async fn get(&self, req: Request<ClientBody>) -> Result<Response<Body>, ProxyError> {
        if self.session.is_none() {
            return Err(ProxyError::SessionRequired);
        }
        let mut headers = req.headers().clone();
        // The virtual server's streams carry no event ids to resume from.
        headers.remove("last-event-id");
        let members: Vec<usize> = (0..self.vs.config.members.len())
            .filter(|m| self.reach.get(*m).copied().unwrap_or(false))
            .collect();
        let opens = members.into_iter().map(|m| {
            let headers = &headers;
            async move {
                let r = tokio::time::timeout(
                    self.deadline(),
                    self.call(headers, m, Method::GET, None, None),
                )
                .await;
                match r {
                    Ok(Ok(Answer::Stream(b))) => Some(self.rewrite_stream(b, m, None, true)),
                    _ => None,
                }
            }
        });
        let streams: Vec<Body> = futures_util::future::join_all(opens)
            .await
            .into_iter()
            .flatten()
            .collect();
        if streams.is_empty() {
            return Err(ProxyError::MethodNotAllowed(Method::GET));
        }
        Ok(sse_response(merge(streams)))
    }

    /// DELETE: every member's session ended, then the client's.
    async fn delete(&self, req: Request<ClientBody>) -> Result<Response<Body>, ProxyError> {
        let Some(s) = &self.session else {
            return Err(ProxyError::SessionRequired);
        };
        let headers = req.headers().clone();
        for m in self.opened_members().await {
            let _ = self.call(&headers, m, Method::DELETE, None, None).await;
        }
        self.vs.sessions.remove(&s.key);
        if self.vs.ended.len() >= MAX_SESSIONS {
            self.vs.ended.clear();
        }
        self.vs.ended.insert(s.key, ());
        let mut r = Response::new(crate::http_util::empty());
        *r.status_mut() = StatusCode::OK;
        Ok(r)
    }
}

/// What one member answered to a request every member gets.
enum Fanned {
    /// A JSON-RPC message (a result or an error), its bytes, and whether
    /// it came as an event stream.
    Message(Bytes, bool),
    /// An HTTP answer without one (the member path refused the request).
    Http(Response<Body>),
    /// Nothing within the deadline.
    Late,
}

/// Whether any member answered with an event stream: the merged answer
/// is one too (a client sees the shape its server would have used).
fn streamed(answers: &[(usize, Fanned)]) -> bool {
    answers
        .iter()
        .any(|(_, a)| matches!(a, Fanned::Message(_, true)))
}

/// A result (JSON text) as JSON, or as a one-event stream.
fn raw_answer(id: Option<&Id>, result: &str, stream: bool) -> Response<Body> {
    let message = merge::response(id, result);
    if !stream {
        return json_response(StatusCode::OK, Bytes::from(message));
    }
    let mut out = BytesMut::new();
    sse::encode_message(None, message.as_bytes(), &mut out);
    sse_response(crate::http_util::full(out.freeze()))
}

/// A result as JSON, or as a one-event stream.
fn answer(id: Option<&Id>, result: Value, stream: bool) -> Response<Body> {
    raw_answer(id, &result.to_string(), stream)
}

impl Fanned {
    /// The answer's parts, unread.
    fn reply(&self) -> Option<merge::Reply<'_>> {
        match self {
            Fanned::Message(b, _) => merge::reply(b),
            _ => None,
        }
    }

    fn has_result(&self) -> bool {
        self.reply().is_some_and(|r| r.result.is_some())
    }

    fn is_error(&self) -> bool {
        self.reply().is_some_and(|r| r.error.is_some())
    }

    /// The result, read (for the small answers merged as values).
    fn result(&self) -> Option<Value> {
        serde_json::from_str(self.reply()?.result?.get()).ok()
    }
}

/// The answer when no member gave a result: the first member's JSON-RPC
/// error, else its HTTP refusal, else that nobody answered in time.
fn no_result(id: Option<&Id>, answers: Vec<(usize, Fanned)>) -> Response<Body> {
    let mut http = None;
    for (_, a) in answers {
        match a {
            Fanned::Message(b, _) if merge::reply(&b).is_some_and(|r| r.error.is_some()) => {
                return json_response(StatusCode::OK, b)
            }
            Fanned::Http(r) if http.is_none() => http = Some(r),
            _ => {}
        }
    }
    http.unwrap_or_else(|| {
        rpc_error(
            id,
            super::answer::codes::UPSTREAM_ERROR,
            "no member of the virtual server answered within list_timeout_ms",
        )
    })
}

fn status_only(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(crate::http_util::empty());
    *r.status_mut() = status;
    r
}

/// Where a merged list stands for one member.
struct Place {
    m: usize,
    cursor: Option<String>,
    late: u32,
}

/// A client's request in flight to a member (for its cancellation).
struct Inflight {
    session: Arc<VSession>,
    id: Id,
}

impl Drop for Inflight {
    fn drop(&mut self) {
        if let Ok(mut f) = self.session.inflight.lock() {
            f.remove(&self.id);
        }
    }
}

/// The request a member's path gets: the client's headers, but the
/// member's session, `Mcp-Name` and a fresh length.
fn member_request(
    member: &str,
    headers: &HeaderMap,
    method: Method,
    session: Option<&HeaderValue>,
    body: Option<Bytes>,
    mcp_name: Option<&str>,
) -> Request<ClientBody> {
    let body = body.unwrap_or_default();
    let mut req = Request::new(http_body_util::Either::Right(http_body_util::Full::new(
        body.clone(),
    )));
    *req.method_mut() = method;
    if let Ok(uri) = format!("/mcp/{member}").parse() {
        *req.uri_mut() = uri;
    }
    let h = req.headers_mut();
    for (k, v) in headers {
        if k == header::CONTENT_LENGTH
            || k == header::HOST
            || k.as_str() == "mcp-session-id"
            || k.as_str() == "mcp-name"
            || k.as_str() == "last-event-id"
        {
            continue;
        }
        h.append(k.clone(), v.clone());
    }
    if let Some(s) = session {
        h.insert(HeaderName::from_static("mcp-session-id"), s.clone());
    }
    if let Some(v) = mcp_name.and_then(|n| HeaderValue::from_str(n).ok()) {
        h.insert(HeaderName::from_static("mcp-name"), v);
    }
    if !body.is_empty() {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    req
}

/// A member path's response, read: JSON whole, a stream as it is.
async fn read_answer(resp: Response<Body>) -> Answer {
    let status = resp.status();
    let ct = crate::http_util::content_type(resp.headers()).to_owned();
    if status == StatusCode::ACCEPTED {
        return Answer::Json(status, None);
    }
    if status.is_success() && mime_is(&ct, "text/event-stream") {
        return Answer::Stream(resp.into_body());
    }
    if status.is_success() && mime_is(&ct, "application/json") {
        let (parts, body) = resp.into_parts();
        // The member's path wrote it: read only where it is rewritten.
        drop(parts);
        return match body.collect().await {
            Ok(b) => Answer::Json(status, Some(b.to_bytes())),
            Err(_) => {
                Answer::Other(ProxyError::BodyRead("member answer".to_owned()).into_response())
            }
        };
    }
    Answer::Other(resp)
}

/// The JSON-RPC response at the end of a member's answer stream (server
/// requests on it are not relayed: used for merged answers only).
async fn final_message(mut body: Body, max: usize) -> Option<Bytes> {
    let mut dec = sse::Decoder::new(max);
    loop {
        while let Some(ev) = dec.next_event() {
            let data = Bytes::from(ev.data);
            let answer =
                merge::reply(&data).is_some_and(|r| r.result.is_some() || r.error.is_some());
            // A request or notification has a method; an answer has none.
            if answer && !has_method(&data) {
                return Some(data);
            }
        }
        match body.frame().await {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    dec.push(d).ok()?;
                }
            }
            _ => return None,
        }
    }
}

/// Whether a message has a `method` (a request or notification).
fn has_method(bytes: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct M<'a> {
        #[serde(borrow, default)]
        method: Option<&'a serde_json::value::RawValue>,
    }
    serde_json::from_slice::<M>(bytes).is_ok_and(|m| m.method.is_some())
}

/// Whether a member's answer holds anything [`rewrite::outward`] changes in
/// an answer (task ids), or escapes that could spell it.
fn needs_rewrite(bytes: &[u8]) -> bool {
    memchr::memmem::find(bytes, b"taskId").is_some()
        || memchr::memmem::find(bytes, b"related-task").is_some()
        || memchr::memmem::find(bytes, b"\\u").is_some()
}

/// A JSON-RPC id as the strict reader would take it.
fn id_of(v: &Value) -> Option<Id> {
    match v {
        Value::String(s) => Some(Id::String(s.clone())),
        Value::Number(n) => n.as_i64().map(Id::Number),
        _ => None,
    }
}

/// Event streams merged into one, as their events come; a stream that
/// fails ends alone (the others go on), logged.
fn merge(streams: Vec<Body>) -> Body {
    let merged = futures_util::stream::select_all(streams.into_iter().map(|b| {
        StreamExt::boxed(
            http_body_util::BodyStream::new(b).scan((), |_, frame| {
                std::future::ready(match frame {
                    Ok(f) => Some(Ok::<_, BoxError>(f)),
                    Err(e) => {
                        tracing::info!(error = %e, "virtual server: a member's stream ended with an error; the others go on");
                        None
                    }
                })
            }),
        )
    }));
    http_body_util::StreamBody::new(merged).boxed_unsync()
}

fn sse_response(body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// A JSON-RPC error, HTTP 200 (what MCP clients read as the answer).
fn rpc_error(id: Option<&Id>, code: i32, message: &str) -> Response<Body> {
    super::error::rpc(StatusCode::OK, id, code, message, None)
}
