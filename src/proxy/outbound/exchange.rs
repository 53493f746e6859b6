//! One forwarded exchange's answer (`Exchange`): read whole or streamed, every
//! message through the gate, rows completed before the answer leaves.

use super::*;

/// What kind of HTTP exchange this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExchangeKind {
    /// A POST of messages.
    Post,
    /// A GET stream (new or resumed).
    Get,
    /// A DELETE ending the session.
    Delete,
}

/// How to answer the upstream in the client's place (refused server-to-client
/// requests) on the client's session.
pub(super) struct Reply {
    pub(super) headers: HeaderMap,
    pub(super) conn: ConnInfo,
    pub(super) identity: Vec<(HeaderName, HeaderValue)>,
}

/// A held call's progress: the hold sent `after` notifications with the
/// client's token; the upstream's progress on that token is shifted past
/// them (progress must increase).
pub(super) struct ProgressShift {
    pub(super) token: Value,
    pub(super) offset: f64,
}

/// One exchange with the upstream, from forwarding to the end of the answer.
pub(crate) struct Exchange {
    pub(super) run: Arc<RunContext>,
    pub(super) recorder: Recorder,
    pub(super) kind: ExchangeKind,
    pub(super) due: Vec<Due>,
    /// The firewall's own answers for parts of a batch, merged in.
    pub(super) local: Vec<Bytes>,
    /// The upstream's session id (unsealed), if any.
    pub(super) session: Option<Vec<u8>>,
    pub(super) reply: Option<Reply>,
    pub(super) progress: Option<ProgressShift>,
    pub(super) max_sse_event_bytes: usize,
    pub(super) upstream_started: Instant,
    pub(super) status: u16,
    pub(super) bytes_out: usize,
    /// The last `tools/list` answer inspected reused a remembered view.
    pub(super) list_view_reused: bool,
    /// What screening found in the definitions of the tools listed.
    pub(super) listed_found: std::sync::Mutex<crate::screen::content::Report>,
    /// What the gate read of this answer's earlier events (an SSE answer
    /// only): a token split across two of them is found in both.
    pub(super) carry: Option<Carry>,
    /// Settlements in a shared budget store not yet confirmed: awaited
    /// (briefly) before the answers they belong to leave, so the caller's
    /// next call is admitted against them.
    pub(super) settling: Vec<tokio::task::JoinHandle<()>>,
}
/// An upstream answer as the strict reader read it: its text and the
/// tape of its first levels ([`jsonrpc::parse_upstream`]).
#[derive(Clone, Copy)]
pub(super) struct Read<'a> {
    pub(super) text: &'a str,
    pub(super) tape: &'a crate::mcp::tape::Tape,
}

/// What an upstream message becomes.
pub(super) enum Pass {
    /// Relayed as it is.
    Same,
    /// Relayed as this text.
    Replaced(String),
    /// Not relayed.
    Dropped,
}

// === impl Exchange ===

impl Exchange {
    /// An exchange of `kind` for `due`, of the run in `run`.
    pub(crate) fn new(
        run: Arc<RunContext>,
        recorder: Recorder,
        kind: ExchangeKind,
        due: Vec<Due>,
        session: Option<Vec<u8>>,
        max_sse_event_bytes: usize,
    ) -> Self {
        Exchange {
            run,
            recorder,
            kind,
            due,
            local: Vec::new(),
            session,
            reply: None,
            progress: None,
            max_sse_event_bytes,
            upstream_started: Instant::now(),
            status: 0,
            bytes_out: 0,
            settling: Vec::new(),
            list_view_reused: false,
            listed_found: Default::default(),
            carry: None,
        }
    }

    /// The firewall's own answers for the parts of a batch it refused.
    pub(crate) fn with_local(mut self, local: Vec<Bytes>) -> Self {
        self.local = local;
        self
    }

    /// Lets the relay answer refused server-to-client requests on the
    /// client's session.
    pub(crate) fn with_reply(
        mut self,
        client: &HeaderMap,
        conn: ConnInfo,
        identity: Vec<(HeaderName, HeaderValue)>,
    ) -> Self {
        let mut headers = crate::upstream::client::own_post_headers();
        if let Some(v) = client
            .get(crate::mcp::headers::PROTOCOL_VERSION)
            .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok())
        {
            // Copied, not cloned: a clone shares the client connection's read
            // buffer, which would then stay allocated for the stream's life.
            headers.insert(crate::mcp::headers::PROTOCOL_VERSION, v);
        }
        self.reply = Some(Reply {
            headers,
            conn,
            identity,
        });
        self
    }

    /// Shifts the upstream's progress on `token` past the `after`
    /// notifications a hold already sent.
    pub(crate) fn with_progress(mut self, token: Option<Value>, after: u64) -> Self {
        if let (Some(token), true) = (token, after > 0) {
            self.progress = Some(ProgressShift {
                token,
                offset: after as f64 + 1.0,
            });
        }
        self
    }

    /// Starts the upstream clock (when the request is sent).
    pub(crate) fn started(mut self) -> Self {
        self.upstream_started = Instant::now();
        self
    }

    /// Whether some answer due is a list rewritten for the run.
    pub(super) fn filters(&self) -> bool {
        self.due.iter().any(|d| matches!(d.class, Class::List(_)))
    }

    /// Whether an answer too large to hold may stream past the gate
    /// ([`gate::may_stream`]): never when screening or labels apply.
    fn may_stream(&self) -> bool {
        let tools: Vec<Option<&str>> = self
            .due
            .iter()
            .filter(|d| d.id.is_some())
            .map(|d| {
                d.tool
                    .as_deref()
                    .or_else(|| d.task.as_ref().map(|t| t.tool.as_str()))
            })
            .collect();
        gate::may_stream(self.run.answer_scope(), &tools)
    }

    pub(super) fn requests_due(&self) -> bool {
        self.due.iter().any(|d| d.id.is_some())
    }

    /// Turns the upstream's response into the client's.
    pub(crate) async fn respond(
        mut self,
        resp: Response<UpstreamIncoming>,
    ) -> Result<Response<Body>, ProxyError> {
        let (parts, incoming) = resp.into_parts();
        self.status = parts.status.as_u16();
        let idle = self.run.upstream.config.idle_timeout;
        let mut body = UpstreamBody::new(incoming, idle);
        let status = parts.status;

        if status.is_server_error()
            || status == StatusCode::UNAUTHORIZED
            || status == StatusCode::PROXY_AUTHENTICATION_REQUIRED
        {
            // Drain a little so the pooled connection can be reused; the
            // content is the upstream's business, the status is the cause.
            let _ = body.collect_bounded(64 * 1024).await;
            return Err(self.fail(UpstreamFailure::Status(status.as_u16())).await);
        }

        let headers = self.client_headers(&parts.headers);
        if status.is_client_error() {
            return Ok(self.client_error(status, headers, body).await);
        }
        let ct = content_type(&parts.headers).to_owned();
        let is_sse = mime_is(&ct, "text/event-stream");
        let is_json = mime_is(&ct, "application/json");

        if status == StatusCode::ACCEPTED
            || status == StatusCode::NO_CONTENT
            || self.kind == ExchangeKind::Delete
        {
            let _ = body.collect_bounded(64 * 1024).await;
            return self.accepted(status, headers).await;
        }
        if is_sse {
            return Ok(self.stream(status, headers, body));
        }
        if !is_json {
            // An empty answer to notifications and responses is an acceptance.
            if !self.requests_due() && self.kind == ExchangeKind::Post {
                if let Ok(Collected::Complete(b)) = body.collect_bounded(1024).await {
                    if b.is_empty() {
                        return self.accepted(status, headers).await;
                    }
                }
            }
            let what = if ct.is_empty() { "none".to_owned() } else { ct };
            return Err(self
                .fail(UpstreamFailure::Invalid(format!(
                    "the firewall cannot inspect an answer of content type {what}"
                )))
                .await);
        }

        let limit = self.run.upstream.config.max_response_bytes;
        let collected = match body.collect_bounded(limit).await {
            Ok(c) => c,
            Err(f) => return Err(self.fail(f).await),
        };
        match collected {
            Collected::Complete(bytes) => {
                let (out, rows) = match self.whole(bytes) {
                    Ok(x) => x,
                    Err(f) => return Err(self.fail(f).await),
                };
                // The answers are on record before they leave.
                self.write(rows).await;
                if out.is_empty() {
                    return Err(self
                        .fail(UpstreamFailure::Invalid(
                            "the answer answered nothing".to_owned(),
                        ))
                        .await);
                }
                Ok(json_with(status, headers, out))
            }
            Collected::Partial(prefix) => {
                // A list is filtered whole; whatever the gate screens or
                // labels by is held whole: neither passes as a stream.
                if self.filters() || !self.may_stream() {
                    return Err(self.fail(UpstreamFailure::TooLarge(limit)).await);
                }
                Ok(self.large(status, headers, prefix, body))
            }
        }
    }

    /// The headers the client gets: the upstream's that may pass, its
    /// session id sealed, and `private, no-store` on an answer rewritten
    /// for the run.
    fn client_headers(&self, upstream: &HeaderMap) -> HeaderMap {
        let mut headers = response_headers(upstream);
        self.seal_session_header(upstream, &mut headers);
        if self.filters() {
            // The answer now depends on who asked.
            headers.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, no-store"),
            );
            headers.insert(
                header::VARY,
                HeaderValue::from_static("authorization, x-tool-token"),
            );
        }
        headers
    }

    /// The session id an `initialize` answer carries, sealed for the caller
    /// (session revisions); never passed on a 2026-07-28 exchange.
    fn seal_session_header(&self, upstream: &HeaderMap, out: &mut HeaderMap) {
        if self.run.version.is_stateless() {
            return;
        }
        if let Some(sid) = upstream.get("mcp-session-id") {
            let sealed = self
                .run
                .sessions
                .seal(&self.run.principal(), sid.as_bytes());
            if let Ok(v) = HeaderValue::from_str(&sealed) {
                out.insert(HeaderName::from_static("mcp-session-id"), v);
            }
        }
    }
}

/// Puts what screening found and the labels it brought on a row.
pub(super) fn stamp(row: &mut AuditRow, c: &Content) {
    row.screen_kinds = c.report.names();
    if !c.report.is_empty() {
        row.screen_action = c.report.action.as_str();
    }
    row.run_labels = row.run_labels.union(c.labels);
}

pub(super) fn json_with(status: StatusCode, mut headers: HeaderMap, body: Bytes) -> Response<Body> {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    r
}

impl RunContext {
    /// What the upstream's answers to this run are decided against.
    pub(crate) fn answer_scope(&self) -> crate::verdict::answer::Scope<'_> {
        crate::verdict::answer::Scope {
            policy: &self.policy,
            authority: &self.authority,
            upstream: &self.upstream.config,
            stateless: self.version.is_stateless(),
            tasks: &self.tasks,
            principal: self.principal(),
        }
    }
}
