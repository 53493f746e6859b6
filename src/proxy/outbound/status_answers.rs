//! The answers their status decides: a 202/204 (and a DELETE's answer)
//! accepts what was forwarded; a 4xx reaches the client with its status,
//! its body through the gate (JSON only when it is JSON-RPC errors, text
//! capped).

use super::inspect::merge_json;
use super::*;

/// Most bytes of an upstream 4xx body relayed to the client.
const MAX_ERROR_BODY: usize = 64 * 1024;

impl Exchange {
    /// 202/204 (and DELETE's answer): what was forwarded is accepted.
    pub(super) fn accepted(
        mut self,
        status: StatusCode,
        headers: HeaderMap,
    ) -> BoxFuture<'static, Result<Response<Body>, ProxyError>> {
        Box::pin(async move {
            if self.requests_due() {
                return Err(self
                    .fail(UpstreamFailure::Invalid(
                        "the upstream accepted a request without answering it".to_owned(),
                    ))
                    .await);
            }
            let rows: Vec<AuditRow> = std::mem::take(&mut self.due)
                .into_iter()
                .filter_map(|d| d.row)
                .map(|row| {
                    self.recorder
                        .complete(row, None, self.status, self.upstream_started, 0)
                })
                .collect();
            self.write(rows).await;
            if !self.local.is_empty() {
                // The upstream accepted the notifications/responses of a batch;
                // the firewall still owes answers for what it refused.
                let merged = merge_json(&Bytes::new(), &self.local);
                return Ok(json_with(StatusCode::OK, headers, merged));
            }
            let mut r = Response::new(crate::http_util::empty());
            *r.status_mut() = status;
            *r.headers_mut() = headers;
            Ok(r)
        })
    }

    /// A 4xx answer, relayed with its status: JSON bodies only when they are
    /// JSON-RPC errors, text bodies capped.
    pub(super) fn client_error(
        mut self,
        status: StatusCode,
        mut headers: HeaderMap,
        mut body: UpstreamBody,
    ) -> BoxFuture<'static, Response<Body>> {
        Box::pin(async move {
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let bytes = match body.collect_bounded(MAX_ERROR_BODY).await {
                Ok(Collected::Complete(b)) => Some(b),
                _ => None,
            };
            let cause = format!("upstream answered HTTP {}", status.as_u16());
            // JSON-RPC error responses only (their id may be null: the
            // upstream could not tell which request failed).
            let errors_only = |b: &Bytes| {
                let is_error = |v: &Value| {
                    v.get("error").is_some_and(Value::is_object)
                        && v.get("result").is_none()
                        && v.get("method").is_none()
                };
                match serde_json::from_slice::<Value>(b) {
                    Ok(Value::Array(items)) => !items.is_empty() && items.iter().all(is_error),
                    Ok(v) => is_error(&v),
                    Err(_) => false,
                }
            };
            let is_json = mime_is(&ct, "application/json");
            let body = match bytes {
                Some(b) if b.is_empty() => Some(b),
                Some(b) if is_json && errors_only(&b) => Some(b),
                Some(b) if !is_json && !mime_is(&ct, "text/event-stream") => Some(b),
                _ => None,
            };
            // The body passes the gate like any answer: screened, and the
            // run labelled by its source, before it leaves.
            let run = self.run.clone();
            let scope = run.answer_scope();
            let tool = self.due.iter().find_map(|d| d.tool.clone());
            let source = tool
                .as_deref()
                .map_or(gate::Source::Upstream, gate::Source::Tool);
            let text = body
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned());
            let screened = match text.as_deref().filter(|t| !t.is_empty()) {
                // Not JSON after all: withheld below as unreadable.
                Some(t) if is_json => {
                    gate::screen(scope, source, t, None, Recall::Fresh).unwrap_or_default()
                }
                Some(t) => gate::screen_text(scope, source, t),
                None => None,
            };
            let mut withheld = None;
            let body = match (&screened, body) {
                (Some(c), _) if c.report.action == Action::Block => {
                    withheld = Some(c.report.names_for(c.actions, Action::Block).join(", "));
                    None
                }
                (Some(c), Some(_)) if c.report.action == Action::Redact => {
                    c.redacted.clone().map(Bytes::from)
                }
                (_, body) => body,
            };
            let method = self
                .due
                .first()
                .map(|d| d.method.clone())
                .unwrap_or_default();
            if let Some(c) = &screened {
                self.note_content(c, &method, tool.as_deref());
            }
            // It refused: nothing ran.
            let mut rows = self.end_all(StopReason::UpstreamError, &cause, Settle::NotExecuted);
            if let Some(c) = &screened {
                rows.iter_mut().for_each(|row| stamp(row, c));
            }
            self.write(rows).await;
            let body = match body {
                Some(b) => b,
                None => {
                    headers.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    let what = match &withheld {
                        Some(kinds) => {
                            format!("{cause}; the body carried {kinds}, which [screen] blocks")
                        }
                        None => cause,
                    };
                    answer::error(
                        None,
                        crate::proxy::answer::codes::UPSTREAM_ERROR,
                        &format!("upstream {:?}: {what}", self.run.upstream.config.name),
                        None,
                    )
                }
            };
            let mut r = Response::new(full(body));
            *r.status_mut() = status;
            *r.headers_mut() = headers;
            r
        })
    }
}
