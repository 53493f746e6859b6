//! The request path: every POST, GET and DELETE on `/mcp/<upstream>` passes
//! the same stages, in this order, each a type of its own. A newcomer finds
//! every check a message passes in this file, top to bottom.
//!
//! Before [`handle`] (the tower stack, [`crate::proxy::stack`]): the
//! concurrency permit (held until the response body ends), the client
//! address (`X-Forwarded-For` only from trusted proxies) and its coarse
//! per-address limit, before any signature is checked.
//!
//! 1. **Route**: `/mcp/<name>`, or the RFC 9728 metadata.
//! 2. **Browser checks**: `Host` and `Origin` against the allowed ones (403):
//!    the firewall validates them itself, so the upstream needs neither.
//! 3. **Authenticate** ([`authenticate`]): a tool token for the MCP audience,
//!    or 401 with `WWW-Authenticate`, before anything reveals which
//!    upstreams exist.
//! 4. **Authority** ([`authorize`] → [`decision::RunContext`]): the run's role
//!    and effective projects; an upstream outside them answers 404 exactly
//!    like one that does not exist.
//! 5. **Session** ([`session`](mod@crate::session)): a sealed
//!    `Mcp-Session-Id` opens only for the principal it was issued to, else
//!    404 and nothing is forwarded; 2026-07-28 requests have no sessions.
//! 6. **Parse** (POST, [`stage::Parsed`]): `application/json`, size, strict
//!    JSON-RPC (duplicates, case twins, depth, invisible characters), the
//!    revision's whole-body rules (batches, responses, request methods
//!    without an id), the mirrored `Mcp-*` headers.
//! 7. **Catalog**: a call naming a tool not seen listed refills the catalog
//!    first ([`refill`](mod@crate::upstream::refill)).
//! 8. **Decide** each message ([`stage::Decided`], [`request::decide`]), without I/O:
//!    method table, policy, exact numbers, input schema, `Mcp-Param-*`.
//! 9. **Admit** ([`stage::Admitted`], [`request::admit`]): the calls the policy let
//!    through pass their approval gate (consumed or filed in the approvals
//!    store), then their budget (reserved in memory or in Redis).
//! 10. **On record** ([`stage::Admitted::record`], [`record`]): the
//!     firewall's answers are written before they leave; every forwarded
//!     message's intent row is written before it is sent (the admission
//!     check of fail-closed audit).
//! 11. **Hold** ([`hold`]): a gated call waits for a person, then rejoins at
//!     budgets and record.
//! 12. **Forward** ([`upstream`](mod@crate::upstream)): only the allowed
//!     headers, the upstream's own session id, its credentials; a session's
//!     POST after the GET stream the client opened first, or is opening
//!     ([`opening`]).
//! 13. **Relay** ([`relay`]): JSON whole or streamed, SSE event by event,
//!     lists filtered, server requests policed, rows completed before
//!     answers leave.
//!
//! Nothing on this path waits on I/O it does not need: no config reads, no
//! key fetches (the verifier caches and refreshes off the path), no
//! ClickHouse; the spool write is the one local write, and the shared
//! stores (Redis for budgets, PostgreSQL for approvals) are asked only when
//! configured, only for the calls that need them, within a bounded time.

use super::decision::RunContext;
use super::error::ProxyError;
use super::outbound::{Due, Exchange, ExchangeKind};
use super::record::Recorder;
use super::request::{hold, stage};
use super::*;
use crate::auth::{self, Audience, Claims};
use crate::config::IdentityClaim;
use crate::http_util::Body;
use crate::mcp::jsonrpc;
use crate::mcp::version::ProtocolVersion;
use crate::server::listener::ConnInfo;
use crate::upstream::body::{self, ClientBody};
use crate::upstream::client::Forward;
use crate::upstream::{failure, opening};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use stage::{Decided, Next, Parsed};
use std::sync::Arc;

/// Serves one request on the MCP listener.
pub(crate) async fn handle(
    state: Arc<State>,
    conn: ConnInfo,
    req: Request<ClientBody>,
) -> Response<Body> {
    match serve(&state, conn, req).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(error = %e, "request refused");
            e.into_response()
        }
    }
}

pub(super) async fn serve(
    state: &State,
    conn: ConnInfo,
    req: Request<ClientBody>,
) -> Result<Response<Body>, ProxyError> {
    // Step 1: route.
    let path = req.uri().path();
    if let Some(rest) = path.strip_prefix("/.well-known/oauth-protected-resource") {
        return protected_resource_metadata(state, rest);
    }
    let name = path
        .strip_prefix("/mcp/")
        .ok_or(ProxyError::NotFound)?
        .to_owned();

    // Step 2: browsers (DNS rebinding, cross-site requests).
    check_host_and_origin(&state.config.server, req.uri(), req.headers())?;

    // Step 3: authenticate.
    let claims = authenticate(state, req.headers(), &name).await?;

    // A virtual server: each message goes to the member that owns its name,
    // on that member's own path from step 4 on ([`virtual_server`]).
    if let Some(vs) = state.virtuals.get(&name) {
        return Box::pin(virtual_server::serve(state, conn, claims, vs.clone(), req)).await;
    }
    serve_upstream(state, conn, claims, &name, None, req).await
}

/// Steps 4 on, for one upstream: a client's request, or a virtual server's
/// message to one of its members (`via`: the virtual server, on record).
pub(crate) async fn serve_upstream(
    state: &State,
    conn: ConnInfo,
    claims: Arc<Claims>,
    name: &str,
    via: Option<Arc<str>>,
    req: Request<ClientBody>,
) -> Result<Response<Body>, ProxyError> {
    // Step 4: authority. Every way of not having it looks like a 404.
    let mut run = authorize(state, claims, name)?;
    // Activity keeps the run's labels ([`crate::budget::labels`]).
    run.budgets
        .labels()
        .touch(&run.claims.tenant_id, &run.claims.run_id);
    run.version = header_version(req.headers());
    run.via = via;
    if run.upstream.credentials.is_some() {
        // Exchanged for the upstream's token: kept for this request only.
        run.subject_token = auth::extract(req.headers(), state.verifier.header_name())
            .ok()
            .flatten()
            .map(Arc::from);
    }

    // Step 5: the session, the caller's own or none.
    let session = open_session(&run, req.headers())?;

    // GET and DELETE are boxed: once per session each, their futures would
    // otherwise make every POST's future as large as theirs.
    match *req.method() {
        Method::POST => post(state, conn, run, session, req).await,
        Method::GET | Method::DELETE if run.version.is_stateless() => {
            // 2026-07-28 has neither the GET stream nor sessions to end.
            Err(ProxyError::MethodNotAllowed(req.method().clone()))
        }
        Method::GET => {
            run.trace = start_trace(state, &run, req.headers(), None, "GET");
            Box::pin(get(state, conn, Arc::new(run), session, req)).await
        }
        Method::DELETE => {
            run.trace = start_trace(state, &run, req.headers(), None, "DELETE");
            Box::pin(delete(state, conn, Arc::new(run), session, req)).await
        }
        ref m => Err(ProxyError::MethodNotAllowed(m.clone())),
    }
}

/// A client-to-server message: parse, decide, record, then answer, hold or
/// forward and relay.
pub(super) async fn post(
    state: &State,
    conn: ConnInfo,
    mut run: RunContext,
    session: Option<Vec<u8>>,
    req: Request<ClientBody>,
) -> Result<Response<Body>, ProxyError> {
    // Step 6: read and parse once; everything after decides on this model.
    // A refusal here is on record too (rate-limited per principal).
    let parsed = match Parsed::read(state, &mut run, req).await {
        Ok(p) => p,
        Err(e) => {
            record_refused(state, &run, conn, session.as_deref(), &e).await;
            return Err(e);
        }
    };
    if state.traces.is_some() {
        let meta = parsed
            .env
            .messages
            .first()
            .and_then(|m| m.params.as_deref())
            .and_then(meta_traceparent);
        run.trace = start_trace(state, &run, &parsed.head.headers, meta.as_deref(), "POST");
    }
    let session = session.filter(|_| !run.version.is_stateless());

    // Step 7: a catalog that knows the tools called.
    if parsed.calls_unseen_tools(&run) {
        // Boxed: the refill (a whole MCP client exchange) is rare and its
        // state is larger than the rest of this function's; inline it would
        // be allocated and copied with every request's future.
        Box::pin(
            state
                .refills
                .refill(&run.catalogs, &run.upstream, &run.pins, Some(&run.claims)),
        )
        .await;
    }

    // Step 8: decide each message on its own, without I/O.
    // A refusal here (mirrored parameters that disagree with the
    // arguments) is on record like the parse's.
    let decided = match Decided::decide(parsed, &run, session.as_deref(), state) {
        Ok(d) => d,
        Err(e) => {
            record_refused(state, &run, conn, session.as_deref(), &e).await;
            return Err(e);
        }
    };

    // Step 9: admit the calls the policy let through: gates, budgets.
    let admitted = decided.admit(&run).await;

    // Step 10: on record before anything is answered or sent.
    let run = Arc::new(run);
    let outgoing = match admitted.record(state, &run, conn, session.as_deref()).await {
        Next::Answer(response) => return Ok(response),
        // Step 11: a gated call waits for a person.
        Next::Hold(held) => return Ok(hold::respond(run, state.holds.clone(), *held)),
        Next::Forward(outgoing) => *outgoing,
    };

    // Step 12: forward what may go upstream, after the session's GET
    // stream when the client opened that first (or is opening it now).
    if let Some(s) = session.as_deref() {
        state
            .opening
            .before_post(&run.upstream.config.name, s)
            .await;
    }
    // An accepted `notifications/initialized` announces the client's GET
    // stream, where this upstream may ask it something.
    let expect_get = session.clone().filter(|_| {
        asks_client(&run)
            && outgoing
                .due
                .iter()
                .any(|d| d.method == "notifications/initialized")
    });
    let mut identity = identity_headers(&run);
    if let Some(c) = &outgoing.credential {
        c.add_to(&mut identity);
    }
    let mut set = identity.clone();
    if let Some(v) = outgoing
        .mcp_name
        .as_deref()
        .and_then(|n| HeaderValue::from_str(n).ok())
    {
        set.push((HeaderName::from_static("mcp-name"), v));
    }
    let fwd = Forward {
        method: Method::POST,
        headers: &outgoing.head.headers,
        query: outgoing.head.uri.query(),
        body: outgoing.body,
        conn,
        set: &set,
        session: session.as_deref(),
        last_event_id: None,
    };
    let sent_at = std::time::Instant::now();
    let sending = run.upstream.send(fwd);
    let exchange = Exchange::new(
        run.clone(),
        outgoing.recorder,
        ExchangeKind::Post,
        outgoing.due,
        session,
        state.config.server.max_sse_event_bytes,
    )
    .with_local(outgoing.local)
    .with_reply(&outgoing.head.headers, conn, identity.clone())
    .started();
    // The head's values share the client connection's read buffer: let it go
    // now rather than hold it for as long as the upstream takes to answer.
    drop(outgoing.head);

    // Step 13: relay.
    let answer = relay(&run, exchange, sending, sent_at).await;
    if let (Some(s), Ok(r)) = (&expect_get, &answer) {
        if r.status() == StatusCode::ACCEPTED {
            state.opening.initialized(&run.upstream.config.name, s);
        }
    }
    answer
}

/// Whether the policy lets this upstream ask the client anything
/// (sampling, elicitation, roots): only then is a request lost on a GET
/// stream not open yet worth a POST's wait ([`opening`]).
pub(super) fn asks_client(run: &RunContext) -> bool {
    let rules = run.policy.server_requests();
    let r = rules
        .upstreams
        .get(&run.upstream.config.name)
        .unwrap_or(&rules.all);
    r.sampling || r.elicitation || r.roots
}

/// The row of a message refused before any decision (unreadable, smuggling,
/// headers that disagree with the body): one per refused request, at most
/// [`refused_rows_quota`] per principal, the rest counted as dropped.
pub(super) async fn record_refused(
    state: &State,
    run: &RunContext,
    conn: ConnInfo,
    session: Option<&[u8]>,
    e: &ProxyError,
) {
    record_refusal(
        state,
        run,
        conn,
        session,
        e.method(),
        e.id(),
        e.to_string(),
        |_| {},
    )
    .await;
}

/// [`record_refused`] for any refusal: its method, id and reason, and what
/// `edit` changes of the row.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn record_refusal(
    state: &State,
    run: &RunContext,
    conn: ConnInfo,
    session: Option<&[u8]>,
    method: Option<&str>,
    id: Option<&jsonrpc::Id>,
    reason: String,
    edit: impl FnOnce(&mut crate::audit::AuditRow),
) {
    if !state.auditor.is_enabled() {
        return;
    }
    let c = &run.claims;
    let key = format!("{}\u{0}{}\u{0}{}", c.tenant_id, c.sub, c.run_id);
    if state.refused_rows.check_key(&key).is_err() {
        state.metrics.refused_rows_dropped.inc();
        return;
    }
    if state.refused_rows.len() > 100_000 {
        state.refused_rows.retain_recent();
    }
    let session_name = session
        .map(|s| run.sessions.audit_name(&run.principal(), s))
        .unwrap_or_default();
    let recorder = Recorder::new(
        state.auditor.clone(),
        run,
        &HeaderMap::new(),
        conn.client,
        0,
        session_name,
    );
    let mut row = recorder.refused_message(method, id, reason);
    edit(&mut row);
    recorder.write(vec![row]).await;
}

/// Waits for the upstream's answer (counted in the upstream metrics) and
/// relays it, or the failure.
pub(super) async fn relay(
    run: &RunContext,
    exchange: Exchange,
    sending: impl std::future::Future<
        Output = Result<Response<body::UpstreamIncoming>, failure::UpstreamFailure>,
    >,
    sent_at: std::time::Instant,
) -> Result<Response<Body>, ProxyError> {
    let answered = sending.await;
    run.metrics.upstream(
        &run.upstream.config.name,
        answered.as_ref().ok().map(|r| r.status().as_u16()),
        sent_at.elapsed(),
    );
    match answered {
        Ok(resp) => exchange.respond(resp).await,
        Err(failure) => Err(exchange.fail(failure).await),
    }
}

/// GET: the server's stream of a session, or its resumption with
/// `Last-Event-ID` (only an id sealed on the caller's own session).
pub(super) async fn get(
    state: &State,
    conn: ConnInfo,
    run: Arc<RunContext>,
    session: Option<Vec<u8>>,
    req: Request<ClientBody>,
) -> Result<Response<Body>, ProxyError> {
    // From now until the upstream answers this GET's headers, the
    // session's POSTs wait ([`opening`]).
    let opened = session
        .as_deref()
        .map(|s| state.opening.get(&run.upstream.config.name, s));
    let (head, _body) = req.into_parts();
    let mut due = Vec::new();
    let mut last_event_id = None;
    let mut reason = "server stream opened".to_owned();
    if let Some(v) = head.headers.get("last-event-id") {
        let context = run
            .sessions
            .open_event(&run.principal(), session.as_deref(), v.as_bytes())
            .map_err(|e| {
                tracing::info!(error = %e, "Last-Event-ID refused");
                ProxyError::UnknownEventId
            })?;
        reason = format!("stream resumed; {} answers still due", context.due.len());
        due.extend(
            context
                .due
                .into_iter()
                .map(|d| Due::resumed(d.id, d.method)),
        );
        last_event_id = Some(context.upstream_event_id);
    }
    transport(
        state,
        conn,
        run,
        session,
        head,
        Method::GET,
        reason,
        due,
        last_event_id,
        opened,
    )
    .await
}

/// DELETE: ends the caller's own session.
pub(super) async fn delete(
    state: &State,
    conn: ConnInfo,
    run: Arc<RunContext>,
    session: Option<Vec<u8>>,
    req: Request<ClientBody>,
) -> Result<Response<Body>, ProxyError> {
    if session.is_none() {
        return Err(ProxyError::SessionRequired);
    }
    let (head, _body) = req.into_parts();
    let reason = "session ended by the client".to_owned();
    transport(
        state,
        conn,
        run,
        session,
        head,
        Method::DELETE,
        reason,
        Vec::new(),
        None,
        None,
    )
    .await
}

/// GET and DELETE after their own checks: on record, forwarded, relayed.
/// `opened` (a GET's) is let go when the upstream answered the headers.
#[allow(clippy::too_many_arguments)]
pub(super) async fn transport(
    state: &State,
    conn: ConnInfo,
    run: Arc<RunContext>,
    session: Option<Vec<u8>>,
    head: http::request::Parts,
    method: Method,
    reason: String,
    mut due: Vec<Due>,
    last_event_id: Option<String>,
    opened: Option<opening::GetGuard>,
) -> Result<Response<Body>, ProxyError> {
    let session_name = session
        .as_deref()
        .map(|s| run.sessions.audit_name(&run.principal(), s))
        .unwrap_or_default();
    let recorder = Recorder::new(
        state.auditor.clone(),
        &run,
        &head.headers,
        conn.client,
        0,
        session_name,
    );
    let label: &'static str = if method == Method::GET {
        "GET"
    } else {
        "DELETE"
    };
    // What it reaches the upstream with: none, none sent.
    let credential = match run.credential().await {
        Ok(c) => c,
        Err(e) => {
            if recorder.enabled() {
                let mut row =
                    recorder.transport(label, format!("upstream credential unavailable: {e}"));
                row.decision = crate::outcome::DecisionKind::Error.as_str().into();
                // Final: nothing follows it.
                row.row_version = 1;
                recorder.write(vec![row]).await;
            }
            return Err(ProxyError::CredentialUnavailable(e.to_string()));
        }
    };
    let row = recorder.enabled().then(|| {
        let mut row = recorder.transport(label, reason);
        credential.stamp(&mut row);
        row
    });
    if let Some(row) = &row {
        // Read risk: follows the audit's fail mode for reads.
        if let Err(e) = recorder.write_ahead(row).await {
            tracing::error!(error = %e, "audit refused the row of a {label}");
        }
    }
    due.insert(0, Due::transport(&method, row));
    let mut identity = identity_headers(&run);
    credential.add_to(&mut identity);
    let kind = if method == Method::GET {
        ExchangeKind::Get
    } else {
        ExchangeKind::Delete
    };
    let fwd = Forward {
        method,
        headers: &head.headers,
        query: head.uri.query(),
        body: Bytes::new(),
        conn,
        set: &identity,
        session: session.as_deref(),
        last_event_id: last_event_id.as_deref(),
    };
    let sent_at = std::time::Instant::now();
    let sending = run.upstream.send(fwd);
    // With its answer's headers the upstream has the stream: the session's
    // POSTs may go.
    let sending = async move {
        let answered = sending.await;
        drop(opened);
        answered
    };
    let exchange = Exchange::new(
        run.clone(),
        recorder,
        kind,
        due,
        session,
        state.config.server.max_sse_event_bytes,
    )
    .with_reply(&head.headers, conn, identity.clone())
    .started();
    drop(head);
    relay(&run, exchange, sending, sent_at).await
}

/// `Host` and `Origin` as a browser would send them, against the allowed
/// ones; a request without `Origin` (every non-browser client) passes that
/// check.
pub(super) fn check_host_and_origin(
    server: &crate::config::ServerConfig,
    uri: &http::Uri,
    headers: &HeaderMap,
) -> Result<(), ProxyError> {
    // An empty list allows any name.
    let hosts = &server.allowed_hosts;
    crate::http_util::check_hosts(uri, headers, |name| {
        hosts.is_empty() || hosts.iter().any(|h| h == name)
    })
    .map_err(ProxyError::HostNotAllowed)?;
    for origin in headers.get_all(header::ORIGIN) {
        let text = String::from_utf8_lossy(origin.as_bytes()).into_owned();
        let normalized = crate::http_util::origin_of(&text, true);
        let ok = normalized
            .as_ref()
            .is_some_and(|o| server.allowed_origins.iter().any(|a| a == o));
        if !ok {
            return Err(ProxyError::OriginNotAllowed(text));
        }
    }
    Ok(())
}

/// Finds and verifies the tool token; the error carries what the 401 needs.
pub(super) async fn authenticate(
    state: &State,
    headers: &HeaderMap,
    upstream: &str,
) -> Result<Arc<Claims>, ProxyError> {
    // Built only when refusing: the success path formats nothing.
    let unauthorized = |error: Option<auth::TokenError>| ProxyError::Unauthorized {
        resource_metadata: format!(
            "{}/.well-known/oauth-protected-resource/mcp/{upstream}",
            state.config.server.public_url
        ),
        scope: state.config.auth.required_scope.clone(),
        error,
    };
    let token = auth::extract(headers, state.verifier.header_name())
        .map_err(|e| unauthorized(Some(e)))?
        .ok_or_else(|| unauthorized(None))?;
    state
        .verifier
        .verify(token, Audience::Mcp)
        .await
        .map_err(|e| unauthorized(Some(e)))
}

/// The policy in force, the run's authority under it (role ∩ projects ∩
/// ceiling) and whether the token is a service account's; `None` (logged)
/// when the run has none.
pub(super) fn authority(
    state: &State,
    claims: &Claims,
) -> Option<(Arc<crate::policy::Policy>, crate::policy::Authority, bool)> {
    let policy = state.policy.load_full();
    let service_issuer = state.config.auth.service_account_issuer.as_deref() == Some(&*claims.iss);
    let identity = crate::verdict::identity(claims, service_issuer);
    match policy.authority(&identity) {
        Ok(a) => Some((policy, a, service_issuer)),
        Err(why) => {
            tracing::info!(run = %claims.run_id, agent = %claims.agent, reason = %why, "run has no authority");
            None
        }
    }
}

/// Which of `names` (upstreams) the run may reach: [`authorize`]'s answer
/// for each, the authority worked out once.
pub(super) fn reaches(state: &State, claims: &Claims, names: &[String]) -> Vec<bool> {
    let Some((policy, authority, _)) = authority(state, claims) else {
        return vec![false; names.len()];
    };
    names
        .iter()
        .map(|n| {
            state
                .upstreams
                .get(n)
                .is_some_and(|u| policy.reaches(&authority, u.config.facts()))
        })
        .collect()
}

/// The run's authority over the named upstream, or 404.
pub(super) fn authorize(
    state: &State,
    claims: Arc<Claims>,
    name: &str,
) -> Result<RunContext, ProxyError> {
    let (policy, authority, service_issuer) =
        authority(state, &claims).ok_or_else(|| ProxyError::UnknownUpstream(name.to_owned()))?;
    let upstream = state
        .upstreams
        .get(name)
        .filter(|u| policy.reaches(&authority, u.config.facts()))
        .ok_or_else(|| ProxyError::UnknownUpstream(name.to_owned()))?
        .clone();
    Ok(RunContext {
        policy,
        shadow: state.policy.shadow(),
        claims,
        authority,
        service_issuer,
        upstream,
        catalogs: state.catalogs.clone(),
        version: ProtocolVersion::V2025_03_26,
        budgets: state.budgets.clone(),
        metrics: state.metrics.clone(),
        approvals: state.approvals.clone(),
        redactor: state.redactor.clone(),
        sessions: state.sessions.clone(),
        closing: state.closing.subscribe(),
        pins: state.pins.clone(),
        refills: state.refills.clone(),
        tasks: state.tasks.clone(),
        trace: None,
        via: None,
        subject_token: None,
    })
}

/// The revision the headers name (`MCP-Protocol-Version`), else 2025-03-26;
/// a POST refines it from its body.
pub(crate) fn header_version(headers: &HeaderMap) -> ProtocolVersion {
    headers
        .get(crate::mcp::headers::PROTOCOL_VERSION)
        .and_then(|v| v.to_str().ok())
        .map_or(ProtocolVersion::V2025_03_26, |v| {
            ProtocolVersion::parse(v.trim())
        })
}

/// The upstream's session id inside the caller's sealed `Mcp-Session-Id`:
/// `None` without one (and always on 2026-07-28, which has no sessions),
/// 404 for one this caller does not own.
pub(super) fn open_session(
    run: &RunContext,
    headers: &HeaderMap,
) -> Result<Option<Vec<u8>>, ProxyError> {
    if run.version.is_stateless() {
        return Ok(None);
    }
    let mut values = headers.get_all("mcp-session-id").iter();
    let Some(sealed) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ProxyError::SessionNotFound);
    }
    run.sessions
        .open(&run.principal(), sealed.as_bytes())
        .map(Some)
        .map_err(|e| {
            tracing::info!(run = %run.claims.run_id, error = %e, "Mcp-Session-Id refused");
            ProxyError::SessionNotFound
        })
}

/// The tool as a metric label: its name when the upstream listed it (a
/// bounded set), else `_unknown` (invented names must not grow the series).
pub(crate) fn tool_label(cx: &RunContext, tool: &str) -> String {
    if cx.catalogs.get(&cx.upstream.config.name, tool).is_some() {
        tool.to_owned()
    } else {
        "_unknown".to_owned()
    }
}

/// The headers the upstream gets from the verified token (never from the
/// client: client headers are not forwarded unless allowed).
/// `params._meta.traceparent` of a message, if it carries one.
pub(super) fn meta_traceparent(params: &serde_json::value::RawValue) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow, rename = "_meta")]
        meta: Option<Meta<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Meta<'a> {
        #[serde(borrow)]
        traceparent: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_str::<Params>(params.get())
        .ok()?
        .meta?
        .traceparent
        .map(|t| t.into_owned())
}

/// The request's span, child of the agent's `traceparent` (header, else
/// the first message's `_meta`), when traces are on.
pub(super) fn start_trace(
    state: &State,
    run: &RunContext,
    headers: &HeaderMap,
    meta_traceparent: Option<&str>,
    method: &str,
) -> Option<Arc<crate::trace::RequestTrace>> {
    let traces = state.traces.as_ref()?;
    Some(Arc::new(traces.request(
        headers,
        meta_traceparent,
        method,
        &run.upstream.config.name,
    )))
}

pub(super) fn identity_headers(cx: &RunContext) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = claim_headers(cx);
    // The upstream continues the trace under the firewall's span.
    if let Some(tp) = cx.trace.as_ref().and_then(|t| t.traceparent()) {
        out.push((HeaderName::from_static("traceparent"), tp));
    }
    out
}

pub(super) fn claim_headers(cx: &RunContext) -> Vec<(HeaderName, HeaderValue)> {
    let c = &cx.claims;
    // A stdio upstream's process, without a session, is the principal's
    // and run's own.
    let instance = cx.upstream.config.stdio.as_ref().and_then(|_| {
        let mut h = crate::digest::Sha256::new();
        for part in [
            &*c.iss,
            &*c.tenant_id,
            &*c.sub,
            &*c.agent,
            c.run_id.as_str(),
        ] {
            h.update(part.len().to_be_bytes());
            h.update(part.as_bytes());
        }
        HeaderValue::from_str(&hex::encode(h.finalize())).ok()
    });
    let mut out: Vec<(HeaderName, HeaderValue)> = instance
        .map(|v| (HeaderName::from_static(crate::stdio::INSTANCE_HEADER), v))
        .into_iter()
        .collect();
    out.extend(
        cx.upstream
            .config
            .identity_headers
            .iter()
            .filter_map(|(name, claim)| {
                let value = match claim {
                    IdentityClaim::Subject => c.sub.to_string(),
                    IdentityClaim::Tenant => c.tenant_id.to_string(),
                    IdentityClaim::Agent => c.agent.to_string(),
                    IdentityClaim::Run => c.run_id.clone(),
                    IdentityClaim::Mode => c.mode.name().to_owned(),
                    IdentityClaim::TokenId => c.jti.clone(),
                    IdentityClaim::Issuer => c.iss.to_string(),
                    IdentityClaim::Projects => cx.authority.projects.join(","),
                };
                // Claims are verified to hold no control characters; a value a
                // header cannot carry is left out rather than mangled.
                HeaderValue::from_str(&value)
                    .ok()
                    .map(|v| (name.clone(), v))
            }),
    );
    out
}

/// RFC 9728 protected-resource metadata, at the root and per MCP endpoint.
pub(super) fn protected_resource_metadata(
    state: &State,
    rest: &str,
) -> Result<Response<Body>, ProxyError> {
    let base = &state.config.server.public_url;
    let resource = match rest {
        "" | "/" => base.clone(),
        r => {
            // Any well-formed name answers, so the metadata reveals nothing
            // about which upstreams exist.
            let name = r.strip_prefix("/mcp/").ok_or(ProxyError::NotFound)?;
            let ok = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                return Err(ProxyError::NotFound);
            }
            format!("{base}/mcp/{name}")
        }
    };
    let doc = serde_json::json!({
        "resource": resource,
        "authorization_servers": state.config.authorization_servers,
        "scopes_supported": [state.config.auth.required_scope],
        "bearer_methods_supported": ["header"],
        "resource_name": "mcp-firewall",
    });
    let mut r = error::json_response(StatusCode::OK, Bytes::from(doc.to_string()));
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    Ok(r)
}
