//! An SSE answer, relayed event by event: each event's messages inspected
//! and passed through the gate as they arrive (the gate's carry reads
//! consecutive events as one text), the upstream's event ids sealed.

use super::settle::settle_for;
use super::*;

impl Exchange {
    /// An SSE answer, relayed event by event.
    pub(super) fn stream(
        mut self,
        status: StatusCode,
        mut headers: HeaderMap,
        body: UpstreamBody,
    ) -> Response<Body> {
        // The gate reads consecutive events as one text.
        self.carry = Some(Carry::default());
        headers.insert(
            HeaderName::from_static("x-accel-buffering"),
            HeaderValue::from_static("no"),
        );
        let relay = SseRelay {
            decoder: sse::Decoder::new(self.max_sse_event_bytes),
            body,
            closing: self.run.closing.clone(),
            ex: self,
            done: false,
            started: false,
        };
        let stream = futures_util::stream::unfold(relay, |mut relay| async move {
            let next = relay.next().await?;
            Some((Ok::<_, BoxError>(Frame::data(next)), relay))
        });
        let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
        *r.status_mut() = status;
        *r.headers_mut() = headers;
        r
    }
}

struct SseRelay {
    body: UpstreamBody,
    decoder: sse::Decoder,
    /// Shutdown: end with a final error event.
    closing: tokio::sync::watch::Receiver<bool>,
    ex: Exchange,
    done: bool,
    started: bool,
}

impl SseRelay {
    /// The next bytes to send to the client; `None` when the stream is over.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            let mut out = BytesMut::new();
            if !self.started {
                self.started = true;
                for answer in std::mem::take(&mut self.ex.local) {
                    sse::encode_message(None, &answer, &mut out);
                }
                if !out.is_empty() {
                    return Some(out.freeze());
                }
            }
            let next = tokio::select! {
                next = self.body.chunk() => next,
                _ = self.closing.wait_for(|closing| *closing) => Err(UpstreamFailure::ShuttingDown),
            };
            match next {
                Ok(Some(chunk)) => {
                    if let Err(e) = self.decoder.push(&chunk) {
                        return self.end(UpstreamFailure::Invalid(e.to_string())).await;
                    }
                    let mut rows = Vec::new();
                    while let Some(ev) = self.decoder.next_event() {
                        if let Err(f) = self.on_event(ev, &mut out, &mut rows) {
                            // Whatever was decided so far still goes out first.
                            self.ex.write(rows).await;
                            let tail = self.end(f).await;
                            out.extend_from_slice(&tail.unwrap_or_default());
                            return Some(out.freeze());
                        }
                    }
                    self.ex.bytes_out += out.len();
                    // Answers are on record before they are relayed.
                    self.ex.write(rows).await;
                    if !out.is_empty() {
                        return Some(out.freeze());
                    }
                }
                Ok(None) => {
                    self.done = true;
                    return self.finish().await;
                }
                Err(f) => return self.end(f).await,
            }
        }
    }

    fn on_event(
        &mut self,
        ev: sse::Event,
        out: &mut BytesMut,
        rows: &mut Vec<AuditRow>,
    ) -> Result<(), UpstreamFailure> {
        if !ev.has_data || ev.data.is_empty() {
            // Priming events (an id, a retry hint) and keep-alive comments.
            match ev.id.as_deref() {
                Some(id) => {
                    let sealed = self.ex.seal_event_id(id);
                    sse::encode(&sse::Event { id: sealed, ..ev }, out);
                }
                None => out.extend_from_slice(&ev.raw),
            }
            return Ok(());
        }
        let pass = match self.ex.inspect(&ev.data) {
            Ok((pass, done)) => {
                rows.extend(done);
                pass
            }
            Err(f) => {
                if self.ex.filters() {
                    return Err(f);
                }
                // What the firewall cannot read does not reach the client.
                tracing::warn!(upstream = %self.ex.run.upstream.config.name, error = %f, "dropped an unreadable SSE event");
                Pass::Dropped
            }
        };
        let id = ev.id.as_deref().and_then(|id| self.ex.seal_event_id(id));
        match pass {
            Pass::Same if id.is_none() && ev.id.is_none() => out.extend_from_slice(&ev.raw),
            Pass::Same => sse::encode(&sse::Event { id, ..ev }, out),
            Pass::Replaced(data) => sse::encode(&sse::Event { id, data, ..ev }, out),
            // Keep the cursor: the event's id still marks the position.
            Pass::Dropped if id.is_some() => sse::encode(
                &sse::Event {
                    id,
                    event: None,
                    data: String::new(),
                    retry: ev.retry,
                    comments: Vec::new(),
                    has_data: false,
                    raw: Bytes::new(),
                },
                out,
            ),
            Pass::Dropped => {}
        }
        Ok(())
    }

    /// The stream ended cleanly. Session revisions may close a stream
    /// before its answer and let the client resume; 2026-07-28 streams
    /// cannot resume, so a request still waiting gets an error.
    async fn finish(&mut self) -> Option<Bytes> {
        let stateless = self.ex.run.version.is_stateless();
        let waiting: Vec<Id> = self.ex.due.iter().filter_map(|d| d.id.clone()).collect();
        let (stop, cause) = match self.ex.kind {
            ExchangeKind::Get => (StopReason::Done, "the upstream closed the stream"),
            _ => (
                StopReason::UpstreamIncomplete,
                "the stream ended before the answer",
            ),
        };
        let rows = self
            .ex
            .end_all(stop, cause, Settle::Executed { reported: None });
        self.ex.write(rows).await;
        if !stateless || waiting.is_empty() {
            return None;
        }
        let failure = UpstreamFailure::Invalid(cause.to_owned());
        let name = self.ex.run.upstream.config.name.clone();
        let mut out = BytesMut::new();
        for id in waiting {
            sse::encode_message(
                None,
                &answer::upstream_error(Some(&id), &name, &failure),
                &mut out,
            );
        }
        Some(out.freeze())
    }

    /// Ends a broken stream: every request still waiting gets an error event.
    async fn end(&mut self, failure: UpstreamFailure) -> Option<Bytes> {
        self.done = true;
        let waiting: Vec<Id> = self.ex.due.iter().filter_map(|d| d.id.clone()).collect();
        let stop = match failure {
            UpstreamFailure::ShuttingDown => StopReason::UpstreamIncomplete,
            _ => StopReason::UpstreamError,
        };
        let rows = self
            .ex
            .end_all(stop, &failure.to_string(), settle_for(&failure));
        self.ex.write(rows).await;
        let name = self.ex.run.upstream.config.name.clone();
        tracing::warn!(upstream = %name, error = %failure, "upstream stream failed");
        let mut out = BytesMut::new();
        for id in waiting {
            sse::encode_message(
                None,
                &answer::upstream_error(Some(&id), &name, &failure),
                &mut out,
            );
        }
        if out.is_empty() {
            None
        } else {
            Some(out.freeze())
        }
    }
}

impl Exchange {
    /// The sealed form of an upstream event id, carrying the requests still
    /// due on this stream; `None`: relay the event without an id.
    pub(super) fn seal_event_id(&self, id: &str) -> Option<String> {
        if self.run.version.is_stateless() || id.is_empty() {
            return None;
        }
        let context = EventContext {
            due: self
                .due
                .iter()
                .filter_map(|d| {
                    Some(crate::session::Due {
                        id: d.id.clone()?,
                        method: d.method.clone(),
                    })
                })
                .collect(),
            upstream_event_id: id.to_owned(),
        };
        self.run
            .sessions
            .seal_event(&self.run.principal(), self.session.as_deref(), &context)
    }
}
