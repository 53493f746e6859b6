//! The request path. [`handle`] runs the steps of every MCP request in a fixed
//! order, so every decision the firewall makes is visible here in one look:
//!
//! 0. **per-address limit** (coarse, before any signature is checked);
//! 1. **authenticate**: a tool token for the MCP audience, or 401 with
//!    `WWW-Authenticate` (before routing, so an unauthenticated caller learns
//!    nothing about which upstreams exist);
//! 2. **authority**: the run's role and effective projects from the policy;
//!    an upstream outside them answers 404 exactly like one that does not
//!    exist (fail closed: no role, no projects, no upstream);
//! 3. **read**: `Content-Type: application/json`, body bounded by the limit;
//! 4. **parse** once into the JSON-RPC model (strict: duplicate keys, depth,
//!    batch rules per protocol revision, `Mcp-*` headers against the body);
//! 5. **decide** each message ([`decide`]) against the upstream's catalog
//!    (refilled by the firewall's own `tools/list` when a call names a tool
//!    not seen listed: [`refill`]): policy (authority, risk, role,
//!    gate, conditions), arguments against the tool's schema, then budgets
//!    (rate limits, step and cost caps, reserved before forwarding): forward,
//!    or answer here; the firewall's own answers are audited before they
//!    leave;
//! 6. **forward** what may go upstream, with clean headers;
//! 7. **relay** the answer ([`relay`]): JSON inspected whole, SSE event by
//!    event; `tools/list` filtered and re-annotated for this run; each
//!    answer's audit row is spooled and its budget settled before it reaches
//!    the client.
//!
//! Nothing on this path waits on I/O it does not need: no config reads, no
//! key fetches (the verifier caches and refreshes off the path), no ClickHouse.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::approval::Approvals;
use crate::audit::{Auditor, Redactor};
use crate::auth::{self, Audience, Claims, Verifier};
use crate::budget::Budgets;
use crate::catalog::Catalogs;
use crate::config::{Config, IdentityClaim};
use crate::mcp::headers;
use crate::mcp::jsonrpc::{self, Envelope, Kind};
use crate::policy::reload::PolicyStore;
use crate::server::listener::ConnInfo;
use crate::telemetry::Metrics;

pub mod approvals;
pub mod body;
pub mod decide;
pub mod error;
pub mod h2pool;
pub mod hold;
pub mod own_client;
pub mod record;
pub mod refill;
pub mod relay;
pub mod upstream;
pub mod version;

use body::Body;
use decide::{Outcome, RunContext, Verdict};
use error::ProxyError;
use record::Recorder;
use relay::{mime_is, Exchange, Pending};
use upstream::{Forward, UpstreamClient};
use version::ProtocolVersion;

/// Shared state of the request path.
pub struct State {
    /// The validated configuration.
    pub config: Arc<Config>,
    /// One pooled client per upstream, by route name.
    pub upstreams: HashMap<String, Arc<UpstreamClient>>,
    /// JSON-RPC parse limits.
    pub limits: jsonrpc::Limits,
    /// Tool-token verification (cached).
    pub verifier: Verifier,
    /// The policy, hot-reloaded.
    pub policy: Arc<PolicyStore>,
    /// What each upstream offers.
    pub catalogs: Arc<Catalogs>,
    /// Where audit rows go (a no-op when audit is off).
    pub auditor: Auditor,
    /// Rate limits and caps.
    pub budgets: Arc<Budgets>,
    /// Request-path metrics.
    pub metrics: Arc<Metrics>,
    /// Human approvals, when configured.
    pub approvals: Option<Arc<Approvals>>,
    /// Masks secrets in arguments shown to approvers.
    pub redactor: Arc<Redactor>,
    /// Catalog refills for calls naming tools not seen listed.
    pub refills: refill::Refills,
}

// === impl State ===

impl State {
    /// Builds the request-path state.
    pub fn new(
        config: Arc<Config>,
        verifier: Verifier,
        policy: Arc<PolicyStore>,
        auditor: Auditor,
        metrics: Arc<Metrics>,
        approvals: Option<Arc<Approvals>>,
    ) -> Result<State, upstream::ClientError> {
        let token_header = verifier.header_name().clone();
        let mut upstreams = HashMap::with_capacity(config.upstreams.len());
        for u in &config.upstreams {
            // The token header and the identity headers the firewall owns are
            // removed from what the client sent.
            let mut strip = vec![token_header.clone()];
            strip.extend(u.identity_headers.iter().map(|(h, _)| h.clone()));
            let client = UpstreamClient::new(u.clone(), Arc::from(strip))?;
            upstreams.insert(u.name.clone(), Arc::new(client));
        }
        let limits = jsonrpc::Limits {
            max_depth: config.server.max_json_depth,
            max_batch: config.server.max_batch,
        };
        let budgets = Arc::new(Budgets::new(
            config.limits.clone(),
            std::time::Duration::from_secs(config.auth.leeway_s),
        ));
        let redactor = Arc::new(redactor(&config));
        Ok(State {
            config,
            upstreams,
            limits,
            verifier,
            policy,
            catalogs: Arc::new(Catalogs::default()),
            auditor,
            budgets,
            metrics,
            approvals,
            redactor,
            refills: refill::Refills::default(),
        })
    }
}

/// The redactor of the audit config (or the default patterns).
fn redactor(config: &Config) -> Redactor {
    let patterns = config
        .audit
        .as_ref()
        .map(|a| a.redact.key_patterns.clone())
        .unwrap_or_else(|| crate::audit::RedactConfig::default().key_patterns);
    Redactor::new(&patterns).unwrap_or_else(|_| Redactor::none())
}

/// Serves one request on the MCP listener.
pub async fn handle(state: Arc<State>, conn: ConnInfo, req: Request<Incoming>) -> Response<Body> {
    match route(&state, conn, req).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(error = %e, "request refused");
            e.into_response()
        }
    }
}

async fn route(
    state: &State,
    conn: ConnInfo,
    req: Request<Incoming>,
) -> Result<Response<Body>, ProxyError> {
    let path = req.uri().path();
    if let Some(rest) = path.strip_prefix("/.well-known/oauth-protected-resource") {
        return protected_resource_metadata(state, rest);
    }
    let name = path
        .strip_prefix("/mcp/")
        .ok_or(ProxyError::NotFound)?
        .to_owned();

    // Step 1: authenticate.
    let claims = authenticate(state, req.headers(), &name).await?;

    // Step 2: authority. Every way of not having it looks like a 404.
    let policy = state.policy.load_full();
    let service_issuer =
        state.config.auth.service_account_issuer.as_deref() == Some(claims.iss.as_str());
    let identity = decide::identity(&claims, service_issuer);
    let authority = match policy.authority(&identity) {
        Ok(a) => a,
        Err(why) => {
            tracing::info!(run = %claims.run_id, agent = %claims.agent, reason = %why, "run has no authority");
            return Err(ProxyError::UnknownUpstream(name));
        }
    };
    let up = state
        .upstreams
        .get(&name)
        .filter(|u| policy.reaches(&authority, &u.config))
        .ok_or_else(|| ProxyError::UnknownUpstream(name.clone()))?
        .clone();
    let cx = RunContext {
        policy,
        claims,
        authority,
        service_issuer,
        upstream: up,
        catalogs: state.catalogs.clone(),
        version: ProtocolVersion::V2025_03_26,
        budgets: state.budgets.clone(),
        metrics: state.metrics.clone(),
        approvals: state.approvals.clone(),
        redactor: state.redactor.clone(),
    };
    match *req.method() {
        Method::POST => post(state, conn, cx, req).await,
        Method::GET | Method::DELETE => stream(state, conn, cx, req).await,
        ref m => Err(ProxyError::MethodNotAllowed(m.clone())),
    }
}

/// Finds and verifies the tool token; the error carries what the 401 needs.
async fn authenticate(
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

/// A client-to-server message: read, parse, decide, forward, relay.
async fn post(
    state: &State,
    conn: ConnInfo,
    mut cx: RunContext,
    req: Request<Incoming>,
) -> Result<Response<Body>, ProxyError> {
    // Step 3: read.
    let (parts, body) = req.into_parts();
    check_content_type(&parts.headers)?;
    let limit = cx.upstream.config.max_request_bytes;
    let bytes = read_bounded(body, &parts.headers, limit).await?;

    // Step 4: parse once; everything after decides on this model.
    let env = jsonrpc::parse(&bytes, &state.limits)?;
    cx.version = ProtocolVersion::of_request(&parts.headers, &env);
    check_envelope(&env, cx.version)?;
    check_mirrored_headers(&parts.headers, &env, &cx)?;

    // Step 5: decide each message on its own, against a catalog that knows
    // the tools called (refilled from the upstream when it does not).
    let upstream_name = &cx.upstream.config.name;
    let unseen = env.messages.iter().any(|m| {
        m.call
            .as_ref()
            .is_some_and(|c| cx.catalogs.get(upstream_name, &c.name).is_none())
    });
    if unseen {
        state.refills.refill(&cx.catalogs, &cx.upstream).await;
    }
    let recorder = Recorder::new(
        state.auditor.clone(),
        &cx,
        &parts.headers,
        conn.remote.ip(),
        bytes.len(),
    );
    let mut forward = Vec::with_capacity(env.messages.len());
    let mut local_answers = Vec::new();
    let mut pending = Vec::new();
    let mut open_rows = Vec::new();
    let mut local_rows = Vec::new();
    let mut held: Option<hold::Held> = None;
    for m in &env.messages {
        let verdict = match cx.decide(m) {
            // Nothing runs that the audit trail cannot record, when the
            // risk is fail-closed.
            Verdict::Forward { risk, reservation } => match recorder
                .auditor()
                .admit(risk.unwrap_or(crate::policy::Risk::Read))
            {
                Ok(()) => Verdict::Forward { risk, reservation },
                Err(e) => {
                    if let Some(r) = &reservation {
                        cx.budgets.settle(r, crate::budget::Settle::NotExecuted);
                    }
                    Verdict::Answer {
                        body: m.id.as_ref().map(|id| {
                            jsonrpc::error_body(
                                Some(id),
                                error::codes::AUDIT_UNAVAILABLE,
                                "the audit trail cannot record this call; it was not executed",
                                None,
                            )
                        }),
                        outcome: Outcome::AuditUnavailable {
                            risk: risk.unwrap_or(crate::policy::Risk::Read),
                            error: e.to_string(),
                        },
                    }
                }
            },
            answer => answer,
        };
        match verdict {
            Verdict::Forward { risk, reservation } => {
                forward.push(&m.span);
                open_rows.push(recorder.forwarded(m, risk));
                if let (Kind::Request, Some(id), Some(method)) = (m.kind, &m.id, &m.method) {
                    pending.push(Pending {
                        id: id.clone(),
                        method: method.clone(),
                        tool: m.call.as_ref().map(|c| c.name.clone()),
                        reservation,
                    });
                }
            }
            Verdict::Hold {
                approval,
                key,
                risk,
            } => {
                let Some(approvals) = state.approvals.clone() else {
                    continue;
                };
                let (Some(id), Some(call)) = (&m.id, &m.call) else {
                    continue;
                };
                let outcome = Outcome::ApprovalRequired { risk };
                local_rows.push(recorder.answered(m, &outcome));
                let can_hold = !env.batch
                    && approvals.config().hold_s > 0
                    && accepts(&parts.headers, "text/event-stream");
                if can_hold {
                    held = Some(hold::Held {
                        approval: *approval,
                        key,
                        id: id.clone(),
                        progress_token: progress_token(m),
                        tool: call.name.clone(),
                        body: bytes.clone(),
                        headers: parts.headers.clone(),
                        identity: identity_headers(&cx),
                        conn,
                    });
                } else {
                    local_answers.push(approvals::approval_required(
                        id, &call.name, &approvals, &approval, risk,
                    ));
                }
            }
            Verdict::Answer { body, outcome } => {
                if let (Some(call), (_, Some(stop), _, _)) = (&m.call, outcome.audit()) {
                    cx.metrics
                        .call(&cx.upstream.config.name, &tool_label(&cx, &call.name), stop);
                }
                tracing::info!(
                    run = %cx.claims.run_id,
                    agent = %cx.claims.agent,
                    upstream = %cx.upstream.config.name,
                    method = m.method.as_deref().unwrap_or(""),
                    tool = m.call.as_ref().map_or("", |c| c.name.as_str()),
                    outcome = ?outcome,
                    "answered by the firewall"
                );
                local_rows.push(recorder.answered(m, &outcome));
                local_answers.extend(body);
            }
        }
    }
    // The firewall's own answers are on record before any answer leaves.
    recorder.write(local_rows).await;
    if let (Some(held), Some(approvals)) = (held, state.approvals.clone()) {
        // A single gated call, and the client can wait: hold it open.
        return Ok(hold::respond(Arc::new(cx), approvals, recorder, held));
    }
    if forward.is_empty() {
        return Ok(local_response(env.batch, local_answers));
    }
    let upstream_body = if forward.len() == env.messages.len() {
        bytes
    } else {
        // A denied element never travels upstream inside an allowed batch.
        let spliced = jsonrpc::splice_batch(&bytes, forward);
        // Like the head below: the original shares the connection's buffer.
        drop(bytes);
        spliced
    };

    // Step 6: forward.
    let identity_headers = identity_headers(&cx);
    let fwd = Forward {
        method: Method::POST,
        headers: &parts.headers,
        query: parts.uri.query(),
        body: upstream_body,
        conn,
        set: &identity_headers,
    };
    let up = cx.upstream.clone();
    let exchange = Exchange::new(
        Arc::new(cx),
        pending,
        state.config.server.max_sse_event_bytes,
        local_answers,
    )
    .with_reply(&parts.headers, conn, identity_headers.clone())
    .with_audit(recorder, open_rows);
    let sending = up.send(fwd);
    // The head's values share the client connection's read buffer: let it go
    // now rather than hold it for as long as the upstream takes to answer.
    drop(parts);
    let resp = match sending.await {
        Ok(r) => r,
        Err(failure) => return Err(exchange.fail(failure).await),
    };

    // Step 7: relay.
    exchange.respond(resp).await
}

/// GET (the server's stream, resumption with `Last-Event-ID`) and DELETE
/// (session end): no body to decide on; the answer is relayed and its
/// server-to-client messages inspected.
async fn stream(
    state: &State,
    conn: ConnInfo,
    cx: RunContext,
    req: Request<Incoming>,
) -> Result<Response<Body>, ProxyError> {
    let (parts, _body) = req.into_parts();
    let identity_headers = identity_headers(&cx);
    let fwd = Forward {
        method: parts.method.clone(),
        headers: &parts.headers,
        query: parts.uri.query(),
        body: Bytes::new(),
        conn,
        set: &identity_headers,
    };
    let up = cx.upstream.clone();
    let exchange = Exchange::new(
        Arc::new(cx),
        Vec::new(),
        state.config.server.max_sse_event_bytes,
        Vec::new(),
    )
    .with_reply(&parts.headers, conn, identity_headers.clone());
    let sending = up.send(fwd);
    drop(parts);
    let resp = match sending.await {
        Ok(r) => r,
        Err(failure) => return Err(exchange.fail(failure).await),
    };
    exchange.respond(resp).await
}

/// Whether the client's `Accept` header allows `media`.
fn accepts(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| mime_is(m, media) || m.trim().starts_with("*/*"))
}

/// The `progressToken` a request carries in `params._meta`.
fn progress_token(m: &jsonrpc::Message) -> Option<serde_json::Value> {
    let meta: serde_json::Value = serde_json::from_str(m.meta.as_ref()?.get()).ok()?;
    meta.get("progressToken").cloned()
}

/// The tool as a metric label: its name when the upstream listed it (a
/// bounded set), else `_unknown` (invented names must not grow the series).
pub fn tool_label(cx: &RunContext, tool: &str) -> String {
    if cx.catalogs.get(&cx.upstream.config.name, tool).is_some() {
        tool.to_owned()
    } else {
        "_unknown".to_owned()
    }
}

/// The headers the upstream gets from the verified token (never from the
/// client: same-named client headers were stripped).
fn identity_headers(cx: &RunContext) -> Vec<(HeaderName, HeaderValue)> {
    let c = &cx.claims;
    cx.upstream
        .config
        .identity_headers
        .iter()
        .filter_map(|(name, claim)| {
            let value = match claim {
                IdentityClaim::Subject => c.sub.clone(),
                IdentityClaim::Tenant => c.tenant_id.clone(),
                IdentityClaim::Agent => c.agent.clone(),
                IdentityClaim::Run => c.run_id.clone(),
                IdentityClaim::Mode => c.mode.name().to_owned(),
                IdentityClaim::TokenId => c.jti.clone(),
                IdentityClaim::Issuer => c.iss.clone(),
                IdentityClaim::Projects => cx.authority.projects.join(","),
            };
            // Claims are verified to hold no control characters; a value a
            // header cannot carry is left out rather than mangled.
            HeaderValue::from_str(&value)
                .ok()
                .map(|v| (name.clone(), v))
        })
        .collect()
}

/// The answer when nothing went upstream.
fn local_response(batch: bool, answers: Vec<Bytes>) -> Response<Body> {
    match (batch, answers.as_slice()) {
        (_, []) => {
            // Only notifications, all refused: accepted, nothing to say.
            let mut r = Response::new(body::empty());
            *r.status_mut() = StatusCode::ACCEPTED;
            r
        }
        (false, [one]) => error::json_response(StatusCode::OK, one.clone()),
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
            error::json_response(StatusCode::OK, Bytes::from(out))
        }
    }
}

/// RFC 9728 protected-resource metadata, at the root and per MCP endpoint.
fn protected_resource_metadata(state: &State, rest: &str) -> Result<Response<Body>, ProxyError> {
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

fn check_content_type(headers: &HeaderMap) -> Result<(), ProxyError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    if mime_is(&ct, "application/json") {
        Ok(())
    } else {
        Err(ProxyError::UnsupportedMediaType(ct))
    }
}

/// Reads the body, refusing it as soon as it is known to exceed `limit`.
async fn read_bounded(
    body: Incoming,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, ProxyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
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

/// The 2026-07-28 `Mcp-*` headers must say what the body says: the firewall
/// decides on the body, and no upstream may act on a value it did not see.
fn check_mirrored_headers(
    headers: &HeaderMap,
    env: &Envelope,
    cx: &RunContext,
) -> Result<(), ProxyError> {
    match env.messages.as_slice() {
        [one] if !env.batch => {
            let params = one
                .call
                .as_ref()
                .and_then(|c| cx.catalogs.get(&cx.upstream.config.name, &c.name));
            headers::check(headers, one, params.as_ref().map(|e| e.param_headers())).map_err(
                |source| ProxyError::HeaderMismatch {
                    id: one.id.clone(),
                    source,
                },
            )
        }
        _ => headers::check_batch(headers)
            .map_err(|source| ProxyError::HeaderMismatch { id: None, source }),
    }
}

/// Rules about the whole body that depend on the protocol revision.
fn check_envelope(env: &Envelope, version: ProtocolVersion) -> Result<(), ProxyError> {
    if env.batch && !version.allows_batches() {
        // Batches were removed in 2025-06-18; a batch in a later revision is
        // either a confused client or an attempt to hide a call from
        // per-message checks.
        return Err(ProxyError::InvalidRequest {
            message: format!("JSON-RPC batches are not allowed in protocol version {version}"),
        });
    }
    if version.is_stateless() && env.messages.iter().any(|m| m.kind == Kind::Response) {
        return Err(ProxyError::InvalidRequest {
            message: format!(
                "clients must not send JSON-RPC responses in protocol version {version}"
            ),
        });
    }
    Ok(())
}
