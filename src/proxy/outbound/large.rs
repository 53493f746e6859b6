//! A JSON answer larger than the firewall holds (only where the gate
//! screens and labels nothing: [`super::gate::may_stream`]): scanned as it
//! streams, its last chunk held back until the scan has seen it all, cut
//! off instead of completed when it must not pass.

use super::*;

impl Exchange {
    /// A JSON answer larger than the firewall holds: scanned as it streams,
    /// the last chunk held back until the scan has seen the whole answer.
    pub(super) fn large(
        self,
        status: StatusCode,
        mut headers: HeaderMap,
        prefix: Bytes,
        body: UpstreamBody,
    ) -> Response<Body> {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let mut scan = Scan::new(&self.run.budgets.config().cost_meta_key);
        let first = scan.push(&prefix).err();
        let state = LargeRelay {
            ex: self,
            body,
            scan: Some(scan),
            held: Some(prefix),
            failed: first,
        };
        let stream = futures_util::stream::unfold(state, |mut s| async move {
            let next = s.next().await?;
            Some((next, s))
        });
        let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
        *r.status_mut() = status;
        *r.headers_mut() = headers;
        r
    }

    /// Completes the rows of a streamed answer from its scanned facts; an
    /// error when the answer must not be completed.
    pub(super) fn finish_large(&mut self, facts: &[Facts]) -> Result<Vec<AuditRow>, String> {
        let mut rows = Vec::new();
        for f in facts {
            let pos =
                f.id.as_ref()
                    .and_then(|id| self.due.iter().position(|d| d.id.as_ref() == Some(id)));
            let answering = pos.map(|p| Answering {
                class: &self.due[p].class,
                tool: self.due[p].tool.as_deref(),
                approved: self.due[p].granted.is_some(),
            });
            verdict::answer::streamed(self.run.answer_scope(), f, answering)?;
            let Some(pos) = pos else {
                return Err("the answer answers a request this exchange did not send".to_owned());
            };
            let mut d = self.due.swap_remove(pos);
            if let Some(r) = d.reservation.take() {
                let settling = self
                    .run
                    .budgets
                    .settle(&r, Settle::Executed { reported: f.cost });
                self.settling.extend(settling);
            }
            if let Some(tool) = &d.tool {
                let cx = &self.run;
                cx.metrics.call(
                    &cx.upstream.config.name,
                    &crate::proxy::tool_label(cx, tool),
                    StopReason::Done,
                );
            }
            if let Some(mut row) = d.row.take() {
                row = self.recorder.complete(
                    row,
                    None,
                    self.status,
                    self.upstream_started,
                    self.bytes_out,
                );
                row.is_error = f.error || f.is_error;
                row.result = JsonPayload::Value(serde_json::json!({
                    "streamed": true,
                    "bytes": self.bytes_out,
                    "is_error": row.is_error,
                }));
                rows.push(row);
            }
        }
        if self.requests_due() {
            return Err("the answer did not answer every request".to_owned());
        }
        Ok(rows)
    }
}

/// Streams a large JSON answer through a scan, one chunk behind.
struct LargeRelay {
    ex: Exchange,
    body: UpstreamBody,
    scan: Option<Scan>,
    held: Option<Bytes>,
    failed: Option<String>,
}

impl LargeRelay {
    async fn next(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        if let Some(why) = self.failed.take() {
            return Some(Err(self.cut(why).await));
        }
        loop {
            self.scan.as_ref()?;
            match self.body.chunk().await {
                Ok(Some(chunk)) => {
                    if let Some(scan) = self.scan.as_mut() {
                        if let Err(why) = scan.push(&chunk) {
                            return Some(Err(self.cut(why).await));
                        }
                    }
                    self.ex.bytes_out += chunk.len();
                    if let Some(prev) = self.held.replace(chunk) {
                        return Some(Ok(Frame::data(prev)));
                    }
                }
                Ok(None) => {
                    let scan = self.scan.take()?;
                    self.ex.bytes_out = scan.bytes();
                    let rows = match scan.finish() {
                        Ok(facts) => match self.ex.finish_large(&facts) {
                            Ok(rows) => rows,
                            Err(why) => return Some(Err(self.cut(why).await)),
                        },
                        Err(why) => return Some(Err(self.cut(why).await)),
                    };
                    // On record before the answer completes.
                    self.ex.write(rows).await;
                    return self.held.take().map(|b| Ok(Frame::data(b)));
                }
                Err(f) => return Some(Err(self.cut(f.to_string()).await)),
            }
        }
    }

    /// Cuts the answer off: the client gets an incomplete body, never a
    /// complete answer the firewall could not pass.
    async fn cut(&mut self, why: String) -> BoxError {
        self.scan = None;
        self.held = None;
        let failure = UpstreamFailure::Invalid(why);
        tracing::warn!(upstream = %self.ex.run.upstream.config.name, error = %failure, "streamed answer cut off");
        let rows = self.ex.end_all(
            StopReason::UpstreamError,
            &failure.to_string(),
            Settle::Executed { reported: None },
        );
        self.ex.write(rows).await;
        Box::new(failure)
    }
}
