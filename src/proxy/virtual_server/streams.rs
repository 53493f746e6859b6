//! A virtual server's event streams: a member's relayed event by event
//! with its messages rewritten for the client ([`Cx::rewrite_stream`]),
//! and the members' streams merged into one: the GET stream and
//! `subscriptions/listen`.

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::header::HeaderMap;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::member::Answer;
use super::reply::{rpc_error, sse_response};
use super::rewrite::{self, Outward, Seal};
use super::session::Inflight;
use super::Cx;
use crate::http_util::{Body, BoxError};
use crate::mcp::jsonrpc::Id;
use crate::mcp::sse;
use crate::proxy::error::ProxyError;
use crate::upstream::body::ClientBody;

impl Cx<'_> {
    /// A member's event stream, event by event, with its messages rewritten
    /// for the client (ids of events are not carried: the virtual server's
    /// streams are not resumable).
    /// Without `answers`, the member's responses are left out (a merged
    /// stream answers once, itself).
    pub(super) fn rewrite_stream(
        &self,
        body: Body,
        m: usize,
        guard: Option<Inflight>,
        answers: bool,
    ) -> Body {
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

    /// `subscriptions/listen` (2026-07-28): every member's stream, merged,
    /// each message rewritten; one answer, the virtual server's, when every
    /// member's stream has ended.
    pub(super) async fn listen(
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
                    crate::proxy::answer::codes::UPSTREAM_ERROR,
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

    /// GET: the members' streams, merged, each message rewritten.
    pub(super) async fn get(&self, req: Request<ClientBody>) -> Result<Response<Body>, ProxyError> {
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
