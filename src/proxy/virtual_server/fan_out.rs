//! One request to every member reached, in parallel, each within the
//! deadline ([`Cx::fan_out`]): what each answered ([`Fanned`]), and the
//! answer when none gave a result.

use bytes::Bytes;
use http::header::HeaderMap;
use http::{Method, Response, StatusCode};
use serde_json::Value;

use super::member::{final_message, Answer};
use super::reply::{answer, rpc_error, status_only};
use super::{merge, Cx};
use crate::http_util::Body;
use crate::mcp::jsonrpc::Id;
use crate::proxy::error::{json_response, ProxyError};

/// What one member answered to a request every member gets.
pub(super) enum Fanned {
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
pub(super) fn streamed(answers: &[(usize, Fanned)]) -> bool {
    answers
        .iter()
        .any(|(_, a)| matches!(a, Fanned::Message(_, true)))
}

impl Fanned {
    /// The answer's parts, unread.
    pub(super) fn reply(&self) -> Option<merge::Reply<'_>> {
        match self {
            Fanned::Message(b, _) => merge::reply(b),
            _ => None,
        }
    }

    pub(super) fn has_result(&self) -> bool {
        self.reply().is_some_and(|r| r.result.is_some())
    }

    pub(super) fn is_error(&self) -> bool {
        self.reply().is_some_and(|r| r.error.is_some())
    }

    /// The result, read (for the small answers merged as values).
    pub(super) fn result(&self) -> Option<Value> {
        serde_json::from_str(self.reply()?.result?.get()).ok()
    }
}

/// The answer when no member gave a result: the first member's JSON-RPC
/// error, else its HTTP refusal, else that nobody answered in time.
pub(super) fn no_result(id: Option<&Id>, answers: Vec<(usize, Fanned)>) -> Response<Body> {
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
            crate::proxy::answer::codes::UPSTREAM_ERROR,
            "no member of the virtual server answered within list_timeout_ms",
        )
    })
}

impl Cx<'_> {
    /// A request every member reached gets (`logging/setLevel`); answered
    /// with the first member's result.
    pub(super) async fn broadcast_request(
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
    pub(super) async fn fan_out(
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
}
