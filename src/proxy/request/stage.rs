//! The stages of a POST between reading its body and forwarding it, one
//! type each: [`Parsed`] (the body read once and checked as a whole),
//! [`Decided`] (a ruling per message, without I/O), [`Admitted`] (a final
//! verdict per message once gates and budgets were asked), and what
//! [`Admitted::record`] makes of them once every decision is on record
//! ([`Next`]: the firewall's own answer, a hold, or an [`Outgoing`] body for
//! the upstream). The order is in [`super::super::post`].

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use serde_json::Value;

use crate::audit::AuditRow;
use crate::http_util::accepts;
use crate::mcp::headers;
use crate::mcp::jsonrpc::{self, Envelope, Kind, Message};
use crate::mcp::methods::{self, Class, Shape};
use crate::mcp::version::ProtocolVersion;
use crate::server::listener::ConnInfo;

use super::super::decision::{
    ApprovalNote, Around, Forwarding, Gated, Outcome, Ruling, RunContext, Verdict,
};
use super::super::error::{json_response, ProxyError};
use super::super::outbound::Due;
use super::super::record::Recorder;
use super::super::{answer, tool_label, State};
use super::hold::Held;
use crate::http_util::{self, Body};

/// A POST body read once, parsed strictly, and checked as a whole.
pub(crate) struct Parsed {
    /// The request head.
    pub head: Parts,
    /// The body.
    pub bytes: Bytes,
    /// Its messages.
    pub env: Envelope,
}

/// A ruling for every message of a [`Parsed`] body.
pub(crate) struct Decided {
    parsed: Parsed,
    rulings: Vec<Ruling>,
    /// Per message, what the shadow policy would decide where it differs.
    shadows: Vec<Option<&'static str>>,
}

/// A final verdict for every message of a [`Parsed`] body.
pub(crate) struct Admitted {
    parsed: Parsed,
    verdicts: Vec<Verdict>,
    shadows: Vec<Option<&'static str>>,
}

/// What follows once every decision is on record.
pub(crate) enum Next {
    /// The firewall answers everything itself.
    Answer(Response<Body>),
    /// A single gated call waits for a person.
    Hold(Box<Held>),
    /// Something goes upstream.
    Forward(Box<Outgoing>),
}

/// What goes upstream, and what waits for its answer.
pub(crate) struct Outgoing {
    /// The request head (headers are cleaned when forwarded).
    pub head: Parts,
    /// The body to send: the client's bytes, or the allowed part of a batch.
    pub body: Bytes,
    /// What the relay completes.
    pub due: Vec<Due>,
    /// The firewall's answers for refused elements of a batch.
    pub local: Vec<Bytes>,
    /// The rows of this request.
    pub recorder: Recorder,
    /// What `Mcp-Name` says upstream instead of the client's value (a task's
    /// own id in place of its sealed one).
    pub mcp_name: Option<String>,
    /// What it reaches the upstream with ([`crate::credential`]).
    pub credential: Option<crate::credential::Credential>,
}

// === impl Parsed ===

impl Parsed {
    /// Reads and checks the body: `Content-Type: application/json`, the
    /// size limit, strict JSON-RPC ([`jsonrpc::parse`]), the revision's rules
    /// for the whole body, and the mirrored headers that need no catalog.
    /// Sets the run's protocol revision from what the request says.
    pub(crate) async fn read(
        state: &State,
        run: &mut RunContext,
        req: Request<crate::upstream::body::ClientBody>,
    ) -> Result<Parsed, ProxyError> {
        let (head, body) = req.into_parts();
        check_content_type(&head.headers)?;
        let limit = run.upstream.config.max_request_bytes;
        let bytes = read_bounded(body, &head.headers, limit).await?;
        let env =
            jsonrpc::parse(&bytes, &state.limits).map_err(|e| parse_error(e, &head.headers))?;
        run.version = ProtocolVersion::of_request(&head.headers, &env);
        check_envelope(&env, run)?;
        match env.messages.as_slice() {
            [one] if !env.batch => headers::check(&head.headers, one, None).map_err(|source| {
                ProxyError::HeaderMismatch {
                    id: one.id.clone(),
                    source,
                }
            })?,
            _ => headers::check_batch(&head.headers)
                .map_err(|source| ProxyError::HeaderMismatch { id: None, source })?,
        }
        Ok(Parsed { head, bytes, env })
    }

    /// Whether a `tools/call` names a tool the catalog has not seen.
    pub(crate) fn calls_unseen_tools(&self, run: &RunContext) -> bool {
        let up = &run.upstream.config.name;
        self.env.messages.iter().any(|m| {
            m.call
                .as_ref()
                .is_some_and(|c| run.catalogs.get(up, &c.name).is_none())
        })
    }

    /// The body as text (validated UTF-8 by the parser).
    fn text(&self) -> &str {
        std::str::from_utf8(&self.bytes).unwrap_or("")
    }
}

/// A body the strict reader refused: a method the revision does not define
/// is unknown there, before anything its params might have been.
pub(crate) fn parse_error(e: jsonrpc::ParseError, headers: &HeaderMap) -> ProxyError {
    let version = super::super::header_version(headers);
    match e.method() {
        Some(m) if methods::lookup(m, version).is_none() => ProxyError::UnknownMethod {
            id: e.id().cloned(),
            method: m.to_owned(),
            stateless: version.is_stateless(),
        },
        _ => ProxyError::Parse(e),
    }
}

/// Rules about the whole body that depend on the protocol revision.
fn check_envelope(env: &Envelope, run: &RunContext) -> Result<(), ProxyError> {
    let version = run.version;
    if env.batch && !version.allows_batches() {
        // Batches were removed in 2025-06-18; a batch in a later revision is
        // either a confused client or an attempt to hide a call from
        // per-message checks.
        return Err(ProxyError::InvalidRequest {
            message: format!("JSON-RPC batches are not allowed in protocol version {version}"),
        });
    }
    // Two requests (or two responses) of one batch with the same id: their
    // answers cannot be told apart, and an approval or a cancellation
    // could be applied to the wrong one.
    if env.batch {
        let mut seen = std::collections::HashSet::with_capacity(env.messages.len());
        for m in &env.messages {
            let Some(id) = &m.id else { continue };
            if !seen.insert((m.kind == Kind::Response, id)) {
                return Err(ProxyError::InvalidRequest {
                    message: format!("the batch has two messages with id {id}; ids must be unique"),
                });
            }
        }
    }
    if version.is_stateless() && env.messages.iter().any(|m| m.kind == Kind::Response) {
        return Err(ProxyError::InvalidRequest {
            message: format!(
                "clients must not send JSON-RPC responses in protocol version {version}"
            ),
        });
    }
    // A request method without an id would pass as a notification: no
    // answer, and to a careless upstream still an action.
    for m in env.messages.iter().filter(|m| m.kind == Kind::Notification) {
        let name = m.method.as_deref().unwrap_or("");
        let request_only = methods::lookup(name, version)
            .is_some_and(|d| d.shape == Shape::Request)
            || run
                .upstream
                .config
                .extra_methods
                .iter()
                .any(|x| x.name == name && x.shape == Shape::Request);
        if request_only {
            return Err(ProxyError::InvalidRequest {
                message: format!("{name} is a request and needs an \"id\""),
            });
        }
    }
    Ok(())
}

fn check_content_type(headers: &HeaderMap) -> Result<(), ProxyError> {
    let ct = headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    if crate::http_util::mime_is(&ct, "application/json") {
        Ok(())
    } else {
        Err(ProxyError::UnsupportedMediaType(ct))
    }
}

/// Reads the body, refusing it as soon as it is known to exceed `limit`.
async fn read_bounded(
    body: crate::upstream::body::ClientBody,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, ProxyError> {
    use http_body_util::{BodyExt, Limited};
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ProxyError::BodyTooLarge { limit })
        }
        Err(e) => Err(ProxyError::BodyRead(e.to_string())),
    }
}

// === impl Decided ===

impl Decided {
    /// Decides each message on its own ([`RunContext::decide`]). Mirrored
    /// tool parameters that disagree with the arguments refuse the request
    /// (HTTP 400), as the transport spec requires.
    pub(crate) fn decide(
        parsed: Parsed,
        run: &RunContext,
        session: Option<&[u8]>,
        state: &State,
    ) -> Result<Decided, ProxyError> {
        let around = Around {
            body: parsed.text(),
            session,
            holds: &state.holds,
            headers: &parsed.head.headers,
        };
        let mut rulings = Vec::with_capacity(parsed.env.messages.len());
        let mut shadows = Vec::new();
        for m in &parsed.env.messages {
            let ruling = run.decide(m, &around);
            if run.shadow.is_some() {
                shadows.push(run.shadow(m, &ruling));
            }
            if let Ruling::Final(Verdict::Answer(Outcome::HeaderMismatch(source))) = ruling {
                return Err(ProxyError::HeaderMismatch {
                    id: m.id.clone(),
                    source,
                });
            }
            rulings.push(ruling);
        }
        Ok(Decided {
            parsed,
            rulings,
            shadows,
        })
    }

    /// Admits the calls the policy let through ([`super::admit`]): their
    /// approval gates, then their budgets, in message order.
    pub(crate) async fn admit(self, run: &RunContext) -> Admitted {
        let Decided {
            parsed,
            rulings,
            shadows,
        } = self;
        let mut verdicts = Vec::with_capacity(rulings.len());
        for r in rulings {
            verdicts.push(match r {
                Ruling::Final(v) => v,
                Ruling::Admit(a) => a.admit(run).await,
            });
        }
        Admitted {
            parsed,
            verdicts,
            shadows,
        }
    }
}

// === impl Admitted ===

impl Admitted {
    /// Puts every decision on record: the firewall's answers are written
    /// before they leave, the intent of every forwarded message before it
    /// is sent (a fail-closed risk the spool refuses is not sent:
    /// `-31005`). Then says what follows.
    pub(crate) async fn record(
        self,
        state: &State,
        run: &Arc<RunContext>,
        conn: ConnInfo,
        session: Option<&[u8]>,
    ) -> Next {
        let Admitted {
            parsed,
            verdicts,
            shadows,
        } = self;
        let shadow_of = |i: usize| shadows.get(i).copied().flatten().unwrap_or("");
        let Parsed { head, bytes, env } = parsed;
        let text = std::str::from_utf8(&bytes).unwrap_or("");
        let session_name = session
            .map(|s| run.sessions.audit_name(&run.principal(), s))
            .unwrap_or_default();
        let recorder = Recorder::new(
            state.auditor.clone(),
            run,
            &head.headers,
            conn.client,
            bytes.len(),
            session_name,
        );
        let can_hold = !env.batch
            && run
                .approvals
                .as_ref()
                .is_some_and(|a| a.config().hold_s > 0)
            && accepts(&head.headers, "text/event-stream");

        // What each message becomes, before the intent rows are written.
        let mut plans = Vec::with_capacity(env.messages.len());
        let mut mcp_name = None;
        for (i, (m, verdict)) in env.messages.iter().zip(verdicts).enumerate() {
            plans.push(match verdict {
                Verdict::Forward(f) => send_plan(m, f, run, &recorder, shadow_of(i), &mut mcp_name),
                Verdict::Hold(g) if can_hold => Plan::Hold(g),
                Verdict::Hold(g) => Plan::Answer(Outcome::ApprovalRequired {
                    risk: g.risk,
                    approval: run
                        .approvals
                        .as_ref()
                        .map(|a| Box::new(ApprovalNote::of(&g.approval, a))),
                }),
                Verdict::Answer(o) => Plan::Answer(o),
            });
        }
        if run.upstream.users.is_some() {
            // What the run's client takes, for its consent links.
            for m in &env.messages {
                if m.method.as_deref() == Some("initialize") {
                    state
                        .url_clients
                        .initialize(&run.claims, m.params.as_deref());
                }
            }
        }
        let credential = credential_for(run, state, &mut plans).await;
        write_intents(&recorder, run, &mut plans).await;

        let mut out = Gathered::default();
        for (i, (m, plan)) in env.messages.iter().zip(plans).enumerate() {
            match plan {
                Plan::Send { part, due, .. } => {
                    out.parts.push(part);
                    out.due.push(*due);
                }
                Plan::Hold(gated) => {
                    out.rows.push(held_row(&recorder, m, &gated, shadow_of(i)));
                    out.held = Some(held_call(
                        run,
                        &recorder,
                        &head.headers,
                        text,
                        m,
                        *gated,
                        conn,
                        session,
                        state,
                    ));
                }
                Plan::Answer(outcome) => out.answer(run, &recorder, m, outcome, shadow_of(i)),
            }
        }
        // The firewall's own answers are on record before any answer leaves.
        recorder.write(std::mem::take(&mut out.rows)).await;
        out.credential = credential;
        out.next(head, bytes, &env, recorder, run, mcp_name)
    }
}

/// The credential the forwarded messages reach the upstream with, asked
/// once for the request (a token exchanged for the run, or kept from an
/// earlier exchange), on each message's intent row. When none can be had,
/// every message that would have gone is answered `-31007` instead, its
/// budget released: nothing is sent, never with another credential.
async fn credential_for(
    run: &RunContext,
    state: &State,
    plans: &mut [Plan],
) -> Option<crate::credential::Credential> {
    if !plans.iter().any(|p| matches!(p, Plan::Send { .. })) {
        return None;
    }
    match run.credential().await {
        Ok(c) => {
            for p in plans.iter_mut() {
                if let Plan::Send { due, .. } = p {
                    if let Some(row) = due.row.as_mut() {
                        c.stamp(row);
                    }
                }
            }
            Some(c)
        }
        Err(mut e) => {
            tracing::warn!(run = %run.claims.run_id, upstream = %run.upstream.config.name, error = %e, "no upstream credential for the run; nothing sent");
            if let crate::credential::CredentialError::ConsentRequired { url_client, .. } = &mut e {
                *url_client = state.url_clients.takes(&run.claims);
            }
            for plan in plans.iter_mut() {
                answer_instead(run, plan, |risk| Outcome::CredentialUnavailable {
                    risk,
                    why: e.clone(),
                })
                .await;
            }
            None
        }
    }
}

/// What a message of a recorded body becomes, before the intent rows are
/// written.
enum Plan {
    /// Forwarded: its part of the body, what its answer completes.
    Send {
        part: Part,
        due: Box<Due>,
        risk: Option<crate::policy::Risk>,
    },
    /// Answered by the firewall.
    Answer(Outcome),
    /// Held for a person.
    Hold(Box<Gated>),
}

/// A forwarded message's plan: its part of the body, and what its answer
/// completes (its intent row, on record as a step of its task when it
/// names one). A task's own id is what `Mcp-Name` says upstream.
fn send_plan(
    m: &Message,
    f: Forwarding,
    run: &RunContext,
    recorder: &Recorder,
    shadow: &'static str,
    mcp_name: &mut Option<String>,
) -> Plan {
    let class = class_of(m, run);
    if let Some(t) = &f.task {
        // Mcp-Name mirrors params.taskId (2026-07-28).
        *mcp_name = Some(t.upstream_id.clone());
    }
    let row = recorder.enabled().then(|| {
        let mut row = recorder.intent(m, f.risk, String::new());
        if let Some(g) = &f.granted {
            g.stamp(&mut row);
        }
        row.pin_sha256 = f.pin.as_ref().map(hex::encode).unwrap_or_default();
        row.shadow_decision = shadow;
        row
    });
    let part = match f.rewrite {
        Some(t) => Part::Replaced(t),
        None => Part::Span(m.span.clone()),
    };
    let mut due = Due::message(m, class, f.reservation, f.granted, row);
    if let Some(t) = f.task {
        // On record as a step of its call's task.
        if let Some(row) = due.row.as_mut() {
            row.tool = t.tool.clone();
            row.reason = format!("task of a {} call", t.tool);
        }
        due.task = Some(t);
    }
    Plan::Send {
        part,
        due: Box::new(due),
        risk: f.risk,
    }
}

/// The intent rows, all at once (group commit); a refused one turns its
/// message into the firewall's answer, its budget released.
async fn write_intents(recorder: &Recorder, run: &RunContext, plans: &mut [Plan]) {
    let writes = plans.iter().map(|p| async {
        match p {
            Plan::Send { due, .. } => match &due.row {
                Some(row) => recorder.write_ahead(row).await,
                None => Ok(()),
            },
            _ => Ok(()),
        }
    });
    let admitted = futures_util::future::join_all(writes).await;
    for (plan, admitted) in plans.iter_mut().zip(admitted) {
        if let Err(e) = admitted {
            answer_instead(run, plan, |risk| Outcome::AuditUnavailable {
                risk,
                error: e.into(),
            })
            .await;
        }
    }
}

/// A message that was to be sent is answered by the firewall instead
/// (`outcome` of its risk, read where it has none), its budget released.
async fn answer_instead(
    run: &RunContext,
    plan: &mut Plan,
    outcome: impl FnOnce(crate::policy::Risk) -> Outcome,
) {
    if let Plan::Send { due, risk, .. } = plan {
        if let Some(r) = due.reservation.take() {
            run.budgets
                .settle_now(&r, crate::budget::Settle::NotExecuted)
                .await;
        }
        *plan = Plan::Answer(outcome(risk.unwrap_or(crate::policy::Risk::Read)));
    }
}

/// The row of a call held for a person: waiting for an approval.
fn held_row(recorder: &Recorder, m: &Message, gated: &Gated, shadow: &'static str) -> AuditRow {
    let mut row = recorder.answered(
        m,
        &Outcome::ApprovalRequired {
            risk: gated.risk,
            approval: None,
        },
    );
    row.pin_sha256 = gated.pin.as_ref().map(hex::encode).unwrap_or_default();
    row.shadow_decision = shadow;
    row
}

/// What the messages of a body add up to once each has its plan.
#[derive(Default)]
struct Gathered {
    /// The forwarded parts of the body.
    parts: Vec<Part>,
    /// What the relay completes.
    due: Vec<Due>,
    /// The firewall's own answers.
    local: Vec<Bytes>,
    /// The rows of what the firewall answered or holds.
    rows: Vec<AuditRow>,
    /// The single call held for a person.
    held: Option<Held>,
    /// A notification was refused (and has no answer to carry it).
    refused_notification: bool,
    /// A method the revision in use does not define was answered.
    unknown_method: bool,
    /// What the forwarded messages reach the upstream with.
    credential: Option<crate::credential::Credential>,
}

impl Gathered {
    /// The firewall's own answer to `m`: counted, logged, its row kept for
    /// the record, its answer (for a request) kept for the client.
    fn answer(
        &mut self,
        run: &RunContext,
        recorder: &Recorder,
        m: &Message,
        outcome: Outcome,
        shadow: &'static str,
    ) {
        if let (Some(call), stop) = (&m.call, outcome.audit().stop) {
            run.metrics.call(
                &run.upstream.config.name,
                &tool_label(run, &call.name),
                stop,
            );
        }
        tracing::info!(
            run = %run.claims.run_id,
            agent = %run.claims.agent,
            upstream = %run.upstream.config.name,
            method = m.method.as_deref().unwrap_or(""),
            tool = m.call.as_ref().map_or("", |c| c.name.as_str()),
            outcome = ?outcome,
            "answered by the firewall"
        );
        let mut row = recorder.answered(m, &outcome);
        row.shadow_decision = shadow;
        self.rows.push(row);
        self.unknown_method |= outcome == Outcome::UnknownMethod;
        match answer::for_outcome(m, &outcome, run.version) {
            Some(body) => self.local.push(body),
            None => {
                self.refused_notification |=
                    m.kind == Kind::Notification && !matches!(outcome, Outcome::Cancelled { .. });
            }
        }
    }

    /// What follows once the rows are written: the held call, the
    /// firewall's own answer when nothing goes upstream, else the body to
    /// forward (a batch's denied elements cut out).
    fn next(
        self,
        head: Parts,
        bytes: Bytes,
        env: &Envelope,
        recorder: Recorder,
        run: &RunContext,
        mcp_name: Option<String>,
    ) -> Next {
        let Gathered {
            mut parts,
            due,
            local,
            held,
            refused_notification,
            unknown_method,
            credential,
            ..
        } = self;
        if let Some(held) = held {
            return Next::Hold(Box::new(held));
        }
        if parts.is_empty() {
            return Next::Answer(local_response(
                env.batch,
                local,
                refused_notification,
                unknown_method && run.version.is_stateless(),
            ));
        }
        let body = if !env.batch {
            match parts.pop() {
                Some(Part::Replaced(t)) => Bytes::from(t),
                _ => bytes,
            }
        } else if parts.len() == env.messages.len()
            && parts.iter().all(|p| matches!(p, Part::Span(_)))
        {
            bytes
        } else {
            // A denied element never travels upstream inside an allowed batch.
            splice(&bytes, &parts)
        };
        Next::Forward(Box::new(Outgoing {
            head,
            body,
            due,
            local,
            recorder,
            mcp_name: mcp_name.filter(|_| !env.batch),
            credential,
        }))
    }
}

/// One forwarded message of the body.
enum Part {
    /// Its own bytes.
    Span(std::ops::Range<usize>),
    /// A rewritten text.
    Replaced(String),
}

/// The forwarded parts of a batch as a batch (spans of `body`, which the
/// strict reader found on character boundaries).
fn splice(body: &[u8], parts: &[Part]) -> Bytes {
    let mut out = Vec::with_capacity(body.len() + 2);
    out.push(b'[');
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match p {
            Part::Span(s) => out.extend_from_slice(body.get(s.clone()).unwrap_or(b"")),
            Part::Replaced(t) => out.extend_from_slice(t.as_bytes()),
        }
    }
    out.push(b']');
    Bytes::from(out)
}

/// What the answer to a forwarded message needs (by method).
fn class_of(m: &Message, run: &RunContext) -> Class {
    match (m.kind, m.method.as_deref()) {
        (Kind::Response, _) | (_, None) => Class::Pass,
        (_, Some(name)) => methods::lookup(name, run.version).map_or(Class::Pass, |d| d.class),
    }
}

/// A single gated call to hold: what forwarding it needs later.
#[allow(clippy::too_many_arguments)]
fn held_call(
    run: &Arc<RunContext>,
    recorder: &Recorder,
    client: &HeaderMap,
    text: &str,
    m: &Message,
    gated: Gated,
    conn: ConnInfo,
    session: Option<&[u8]>,
    state: &State,
) -> Held {
    let tool = m.call.as_ref().map_or_else(String::new, |c| c.name.clone());
    Held {
        intent: recorder.enabled().then(|| {
            let mut row = recorder.intent(m, Some(gated.risk), String::new());
            row.pin_sha256 = gated.pin.as_ref().map(hex::encode).unwrap_or_default();
            row
        }),
        id: m.id.clone().unwrap_or(jsonrpc::Id::Number(0)),
        progress_token: progress_token(m),
        body: Bytes::copy_from_slice(text.get(m.span.clone()).unwrap_or("").as_bytes()),
        headers: copy_headers(client),
        identity: super::super::identity_headers(run),
        conn,
        session: session.map(<[u8]>::to_vec),
        recorder: recorder.clone(),
        max_sse_event_bytes: state.config.server.max_sse_event_bytes,
        tool,
        gated,
    }
}

/// The client's headers, copied: a clone would share the connection's read
/// buffer for as long as the hold lasts.
fn copy_headers(h: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(h.len());
    for (k, v) in h {
        if let Ok(v) = HeaderValue::from_bytes(v.as_bytes()) {
            out.append(HeaderName::from(k), v);
        }
    }
    out
}

/// The `progressToken` a request carries in `params._meta`.
fn progress_token(m: &Message) -> Option<Value> {
    let meta: Value = serde_json::from_str(m.meta.as_ref()?.get()).ok()?;
    meta.get("progressToken").cloned()
}

/// The answer when nothing went upstream.
fn local_response(
    batch: bool,
    answers: Vec<Bytes>,
    refused_notification: bool,
    not_found: bool,
) -> Response<Body> {
    match (batch, answers.as_slice()) {
        (false, []) if refused_notification => json_response(
            StatusCode::BAD_REQUEST,
            answer::error(
                None,
                jsonrpc::METHOD_NOT_FOUND,
                "Method not found: the notification is not defined by the protocol revision in use",
                None,
            ),
        ),
        (_, []) => {
            // Only notifications, all handled: accepted, nothing to say.
            let mut r = Response::new(http_util::empty());
            *r.status_mut() = StatusCode::ACCEPTED;
            r
        }
        // 2026-07-28: an unknown method is a 404 with -32601.
        (false, [one]) if not_found => json_response(StatusCode::NOT_FOUND, one.clone()),
        (false, [one]) => json_response(StatusCode::OK, one.clone()),
        _ => {
            let mut out = Vec::with_capacity(
                answers.iter().map(Bytes::len).sum::<usize>() + answers.len() + 1,
            );
            out.push(b'[');
            for (i, a) in answers.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(a);
            }
            out.push(b']');
            json_response(StatusCode::OK, Bytes::from(out))
        }
    }
}
