//! The request path. [`handle`] runs the steps of every MCP request in a fixed
//! order, so every decision the firewall makes is visible here in one look:
//!
//! 1. **route**: `/mcp/<upstream>`; an unknown name is a 404;
//! 2. **read**: `Content-Type: application/json`, body bounded by the limit;
//! 3. **parse** once into the JSON-RPC model (strict: duplicate keys, depth,
//!    batch rules per protocol revision, `Mcp-*` headers against the body);
//! 4. **forward** what may go upstream, with clean headers;
//! 5. **relay** the answer: JSON inspected whole, SSE event by event.
//!
//! Nothing on this path waits on I/O it does not need: no config reads, no
//! key fetches, no ClickHouse.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::config::Config;
use crate::mcp::headers;
use crate::mcp::jsonrpc::{self, Envelope, Kind};
use crate::server::listener::ConnInfo;

pub mod body;
pub mod error;
pub mod relay;
pub mod upstream;
pub mod version;

use body::Body;
use error::ProxyError;
use relay::{mime_is, Exchange, Pending};
use upstream::{Forward, UpstreamClient};
use version::ProtocolVersion;

/// Shared, read-only state of the request path.
pub struct State {
    /// The validated configuration.
    pub config: Arc<Config>,
    /// One pooled client per upstream, by route name.
    pub upstreams: HashMap<String, Arc<UpstreamClient>>,
    /// JSON-RPC parse limits.
    pub limits: jsonrpc::Limits,
}

// === impl State ===

impl State {
    /// Builds the request-path state from a validated config.
    pub fn new(config: Arc<Config>) -> Result<State, upstream::ClientError> {
        let strip: Arc<[header::HeaderName]> = Arc::from(Vec::new());
        let mut upstreams = HashMap::with_capacity(config.upstreams.len());
        for u in &config.upstreams {
            let client = UpstreamClient::new(u.clone(), strip.clone())?;
            upstreams.insert(u.name.clone(), Arc::new(client));
        }
        let limits = jsonrpc::Limits {
            max_depth: config.server.max_json_depth,
            max_batch: config.server.max_batch,
        };
        Ok(State {
            config,
            upstreams,
            limits,
        })
    }
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
    // Step 1: route.
    let name = req
        .uri()
        .path()
        .strip_prefix("/mcp/")
        .ok_or(ProxyError::NotFound)?;
    let up = state
        .upstreams
        .get(name)
        .ok_or_else(|| ProxyError::UnknownUpstream(name.to_owned()))?
        .clone();
    match *req.method() {
        Method::POST => post(state, conn, up, req).await,
        Method::GET | Method::DELETE => stream(state, conn, up, req).await,
        ref m => Err(ProxyError::MethodNotAllowed(m.clone())),
    }
}

/// A client-to-server message: read, parse, forward, relay.
async fn post(
    state: &State,
    conn: ConnInfo,
    up: Arc<UpstreamClient>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ProxyError> {
    // Step 2: read.
    let (parts, body) = req.into_parts();
    check_content_type(&parts.headers)?;
    let limit = up.config.max_request_bytes;
    let bytes = read_bounded(body, &parts.headers, limit).await?;

    // Step 3: parse once; everything after decides on this model.
    let env = jsonrpc::parse(&bytes, &state.limits)?;
    let version = ProtocolVersion::of_request(&parts.headers, &env);
    check_envelope(&env, version)?;
    check_mirrored_headers(&parts.headers, &env)?;

    // Step 4: forward.
    let pending: Vec<Pending> = env
        .messages
        .iter()
        .filter(|m| m.kind == Kind::Request)
        .filter_map(|m| {
            Some(Pending {
                id: m.id.clone()?,
                method: m.method.clone()?,
            })
        })
        .collect();
    let fwd = Forward {
        method: Method::POST,
        headers: &parts.headers,
        query: parts.uri.query(),
        body: bytes,
        conn,
        set: &[],
    };
    let exchange = Exchange {
        upstream: up.clone(),
        pending,
        max_sse_event_bytes: state.config.server.max_sse_event_bytes,
        local_answers: Vec::new(),
    };
    let resp = match up.send(fwd).await {
        Ok(r) => r,
        Err(failure) => {
            return Err(ProxyError::Upstream {
                upstream: up.config.name.clone(),
                failure,
                ids: exchange.pending.iter().map(|p| p.id.clone()).collect(),
            })
        }
    };

    // Step 5: relay.
    exchange.respond(resp).await
}

/// GET (the server's stream, resumption with `Last-Event-ID`) and DELETE
/// (session end): no body to decide on; the answer is relayed and its
/// server-to-client messages inspected.
async fn stream(
    state: &State,
    conn: ConnInfo,
    up: Arc<UpstreamClient>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ProxyError> {
    let (parts, _body) = req.into_parts();
    let fwd = Forward {
        method: parts.method.clone(),
        headers: &parts.headers,
        query: parts.uri.query(),
        body: Bytes::new(),
        conn,
        set: &[],
    };
    let exchange = Exchange {
        upstream: up.clone(),
        pending: Vec::new(),
        max_sse_event_bytes: state.config.server.max_sse_event_bytes,
        local_answers: Vec::new(),
    };
    let resp = up.send(fwd).await.map_err(|failure| ProxyError::Upstream {
        upstream: up.config.name.clone(),
        failure,
        ids: Vec::new(),
    })?;
    exchange.respond(resp).await
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
fn check_mirrored_headers(headers: &HeaderMap, env: &Envelope) -> Result<(), ProxyError> {
    let result = match env.messages.as_slice() {
        [one] if !env.batch => {
            headers::check(headers, one, None).map_err(|source| ProxyError::HeaderMismatch {
                id: one.id.clone(),
                source,
            })
        }
        _ => headers::check_batch(headers)
            .map_err(|source| ProxyError::HeaderMismatch { id: None, source }),
    };
    result
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
