//! One message to one member, on the member's own request path (steps 4
//! on of [`crate::proxy`]): the member's session opened when needed
//! ([`Cx::ensure`]), the request built with the member's session id and
//! `Mcp-Name`, its answer read ([`Answer`]) and relayed with the member's
//! ids sealed; the client's answers and notifications to the members
//! they are for.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::reply::{rpc_error, sse_response};
use super::rewrite::{self, Outward};
use super::session::{Inflight, VSession};
use super::{merge, Cx};
use crate::http_util::{mime_is, Body};
use crate::mcp::jsonrpc::{self, Id};
use crate::mcp::sse;
use crate::proxy::error::{json_response, ProxyError};
use crate::session::VirtualKind;
use crate::upstream::body::ClientBody;

/// A member's answer, read.
pub(super) enum Answer {
    /// One JSON-RPC message, its bytes (or none: 202).
    Json(StatusCode, Option<Bytes>),
    /// An event stream, still flowing.
    Stream(Body),
    /// Anything else, relayed as it is (an HTTP error of the member path).
    Other(Response<Body>),
}

impl Cx<'_> {
    /// A request to one member; its answer relayed with the member's ids
    /// sealed.
    pub(super) async fn forward(
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

    /// The member's answer, rewritten for the client.
    pub(super) fn relay(
        &self,
        answer: Answer,
        m: usize,
        guard: Option<Inflight>,
    ) -> Response<Body> {
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

    /// One message to one member on its own request path: the member's
    /// session (opened now if it is not), the client's headers but the
    /// member's session id and `Mcp-Name`. A member session the member path
    /// no longer knows is opened again once.
    pub(super) async fn call(
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
    pub(super) async fn send(
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
        crate::proxy::serve_upstream(
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
    pub(super) async fn ensure(
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

    /// A client's notification: a cancellation to the member its request
    /// went to, `roots/list_changed` to every member, the rest answered here.
    pub(super) async fn notification(
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
    pub(super) async fn answer_member(
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
pub(super) async fn read_answer(resp: Response<Body>) -> Answer {
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
pub(super) async fn final_message(mut body: Body, max: usize) -> Option<Bytes> {
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
