//! Everything that can go wrong on the request path, and the one place where an
//! error becomes an HTTP response.
//!
//! Rules (from the product brief and the MCP transport spec):
//! - bad input is refused before anything reaches the upstream, with a precise
//!   JSON-RPC error: malformed JSON `-32700` / not JSON-RPC `-32600` with HTTP
//!   400, oversized body 413, wrong content type 415;
//! - decisions (denials, caps, approvals) are never errors here: they are
//!   JSON-RPC answers with HTTP 200, built by the decision step;
//! - upstream failures become a JSON-RPC error naming the upstream and the
//!   cause, HTTP 200 when there is a request id to answer (so MCP clients
//!   read it as an answer, not a transport failure), 502 otherwise;
//! - only a missing or invalid token is a 401 (with `WWW-Authenticate`).
//!
//! [`ProxyError::into_response`] is an exhaustive `match`: a new variant does
//! not compile until someone decides its status.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::json;

use crate::http_util::{full, Body};
use crate::mcp::jsonrpc::{self, Id, ParseError};

use super::answer::codes;
use crate::upstream::failure::UpstreamFailure;

/// An error on the request path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    /// `/mcp/<name>` names no upstream this caller may reach.
    #[error("no upstream named {0:?}")]
    UnknownUpstream(String),
    /// A path the firewall does not serve.
    #[error("not found")]
    NotFound,
    /// An HTTP method the MCP endpoint does not accept.
    #[error("method {0} is not allowed on an MCP endpoint")]
    MethodNotAllowed(http::Method),
    /// POST without `Content-Type: application/json`.
    #[error("content type must be application/json, got {0:?}")]
    UnsupportedMediaType(String),
    /// The request body is larger than the configured limit.
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge {
        /// The limit.
        limit: usize,
    },
    /// The client's body could not be read.
    #[error("cannot read request body: {0}")]
    BodyRead(String),
    /// The body is not acceptable JSON-RPC.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// A JSON-RPC rule that holds for the whole body (batches in a revision
    /// without them, a response-only POST in 2026-07-28...).
    #[error("{message}")]
    InvalidRequest {
        /// What is wrong.
        message: String,
    },
    /// `MCP-Protocol-Version` / `Mcp-Method` / `Mcp-Name` / `Mcp-Param-*`
    /// disagree with the body (or are missing where 2026-07-28 requires them).
    #[error("{source}")]
    HeaderMismatch {
        /// The id of the request, when it has one.
        id: Option<Id>,
        /// Which header, which values.
        source: crate::mcp::headers::HeaderMismatch,
    },
    /// The upstream failed; `ids` are the requests left unanswered.
    #[error("upstream {upstream:?}: {failure}")]
    Upstream {
        /// The upstream's name.
        upstream: String,
        /// What happened.
        failure: UpstreamFailure,
        /// Requests to answer with an error.
        ids: Vec<Id>,
    },
    /// No token, or a token that does not verify for the MCP audience.
    #[error("{}", .error.as_ref().map_or_else(|| "a tool token is required".to_owned(), |e| e.to_string()))]
    Unauthorized {
        /// URL of the protected-resource metadata for this endpoint.
        resource_metadata: String,
        /// The scope MCP calls need.
        scope: String,
        /// Why the token was refused (`None`: there was none).
        error: Option<crate::auth::TokenError>,
    },
    /// The client's address is over the coarse per-IP limit.
    #[error("too many requests from this address; retry in {} ms", .retry_after.as_millis().max(1))]
    RateLimited {
        /// When a retry can succeed.
        retry_after: std::time::Duration,
    },
    /// The server is at its concurrency limit.
    #[error("overloaded")]
    Overloaded,
    /// An `Mcp-Session-Id` this caller does not own: forged, altered,
    /// another principal's, or from a firewall with other keys.
    #[error("session not found")]
    SessionNotFound,
    /// A DELETE without a session to end.
    #[error("DELETE needs the Mcp-Session-Id of the session to end")]
    SessionRequired,
    /// A `Last-Event-ID` that was not issued on this caller's session.
    #[error("Last-Event-ID was not issued on this session")]
    UnknownEventId,
    /// A browser `Origin` that is not allowed (DNS rebinding, CSRF).
    #[error("origin {0:?} is not allowed")]
    OriginNotAllowed(String),
    /// A method the revision in use does not define, refused before its
    /// params were read.
    #[error("Method not found: {method}")]
    UnknownMethod {
        /// The request id.
        id: Option<Id>,
        /// The method.
        method: String,
        /// 2026-07-28 answers it with 404.
        stateless: bool,
    },
    /// A `Host` the firewall does not serve (DNS rebinding).
    #[error("host {0:?} is not served here")]
    HostNotAllowed(String),
    /// No credential for the upstream could be had for this run (a GET or
    /// DELETE; a POST's messages are answered `-31007` one by one).
    #[error("upstream credential unavailable: {0}")]
    CredentialUnavailable(String),
}

// === impl ProxyError ===

impl ProxyError {
    /// The JSON-RPC method of the refused message, when the refusal knows it.
    pub(crate) fn method(&self) -> Option<&str> {
        match self {
            ProxyError::Parse(e) => e.method(),
            ProxyError::UnknownMethod { method, .. } => Some(method.as_str()),
            _ => None,
        }
    }

    /// The JSON-RPC id of the refused message, when the refusal knows it.
    pub(crate) fn id(&self) -> Option<&Id> {
        match self {
            ProxyError::Parse(e) => e.id(),
            ProxyError::UnknownMethod { id, .. } | ProxyError::HeaderMismatch { id, .. } => {
                id.as_ref()
            }
            _ => None,
        }
    }

    /// The HTTP response for this error. The single status mapping.
    // An exhaustive match: every `ProxyError` to its HTTP response.
    #[allow(clippy::too_many_lines)]
    pub(crate) fn into_response(self) -> Response<Body> {
        let message = self.to_string();
        match self {
            ProxyError::UnknownUpstream(name) => plain_json(
                StatusCode::NOT_FOUND,
                json!({"error": "unknown_upstream", "message": format!("no upstream named {name:?}")}),
            ),
            ProxyError::NotFound => plain_json(
                StatusCode::NOT_FOUND,
                json!({"error": "not_found", "message": "MCP endpoints are served at /mcp/<upstream>"}),
            ),
            ProxyError::MethodNotAllowed(_) => {
                let mut r = rpc(
                    StatusCode::METHOD_NOT_ALLOWED,
                    None,
                    jsonrpc::INVALID_REQUEST,
                    &message,
                    None,
                );
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
                r
            }
            ProxyError::UnsupportedMediaType(_) => rpc(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                None,
                jsonrpc::INVALID_REQUEST,
                &message,
                None,
            ),
            ProxyError::BodyTooLarge { limit } => rpc(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                jsonrpc::INVALID_REQUEST,
                &message,
                Some(&json!({ "limit_bytes": limit })),
            ),
            ProxyError::CredentialUnavailable(why) => rpc(
                StatusCode::BAD_GATEWAY,
                None,
                crate::proxy::answer::codes::CREDENTIAL_UNAVAILABLE,
                "upstream credential unavailable",
                Some(&json!({ "reason": why })),
            ),
            ProxyError::BodyRead(_) => rpc(
                StatusCode::BAD_REQUEST,
                None,
                jsonrpc::PARSE_ERROR,
                &message,
                None,
            ),
            ProxyError::Parse(e) => rpc(StatusCode::BAD_REQUEST, e.id(), e.code(), &message, None),
            ProxyError::InvalidRequest { .. } => rpc(
                StatusCode::BAD_REQUEST,
                None,
                jsonrpc::INVALID_REQUEST,
                &message,
                None,
            ),
            ProxyError::HeaderMismatch { id, source } => rpc(
                source.http_status(),
                id.as_ref(),
                source.code(),
                &message,
                None,
            ),
            ProxyError::Upstream {
                upstream,
                failure,
                ids,
            } => upstream_failed(&upstream, &failure, &ids),
            ProxyError::Unauthorized {
                resource_metadata,
                scope,
                error,
            } => unauthorized(&resource_metadata, &scope, error.as_ref(), &message),
            ProxyError::RateLimited { retry_after } => rate_limited(retry_after, &message),
            ProxyError::SessionNotFound => {
                json_response(StatusCode::NOT_FOUND, super::answer::session_not_found())
            }
            ProxyError::SessionRequired | ProxyError::UnknownEventId => rpc(
                StatusCode::BAD_REQUEST,
                None,
                jsonrpc::INVALID_REQUEST,
                &message,
                None,
            ),
            ProxyError::UnknownMethod {
                id,
                method,
                stateless,
            } => rpc(
                if stateless {
                    StatusCode::NOT_FOUND
                } else {
                    StatusCode::OK
                },
                id.as_ref(),
                jsonrpc::METHOD_NOT_FOUND,
                &message,
                Some(&json!({ "method": method })),
            ),
            ProxyError::OriginNotAllowed(_) | ProxyError::HostNotAllowed(_) => rpc(
                StatusCode::FORBIDDEN,
                None,
                jsonrpc::INVALID_REQUEST,
                &message,
                None,
            ),
            ProxyError::Overloaded => {
                let mut r = rpc(
                    StatusCode::SERVICE_UNAVAILABLE,
                    None,
                    jsonrpc::INTERNAL_ERROR,
                    "the firewall is at its concurrency limit; retry shortly",
                    None,
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
        }
    }
}

/// The upstream failed: a JSON-RPC error per request left unanswered
/// (HTTP 200, a batch of them for several), or 502 when there is none.
fn upstream_failed(upstream: &str, failure: &UpstreamFailure, ids: &[Id]) -> Response<Body> {
    let answer = |id| super::answer::upstream_error(id, upstream, failure);
    match ids {
        [] => json_response(StatusCode::BAD_GATEWAY, answer(None)),
        [one] => json_response(StatusCode::OK, answer(Some(one))),
        many => {
            let mut out = Vec::with_capacity(many.len() * 160);
            out.push(b'[');
            for (i, id) in many.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&answer(Some(id)));
            }
            out.push(b']');
            json_response(StatusCode::OK, Bytes::from(out))
        }
    }
}

/// No token, or a refused one: the token error's status (401 without
/// one), an OAuth error body, and the `WWW-Authenticate` challenge naming
/// the protected-resource metadata (not on a 400).
fn unauthorized(
    resource_metadata: &str,
    scope: &str,
    error: Option<&crate::auth::TokenError>,
    message: &str,
) -> Response<Body> {
    let status = error.map_or(StatusCode::UNAUTHORIZED, |e| e.status());
    let mut challenge =
        format!("Bearer resource_metadata=\"{resource_metadata}\", scope=\"{scope}\"");
    if let Some(e) = error {
        // TokenError messages hold no quote or backslash.
        challenge.push_str(&format!(
            ", error=\"{}\", error_description=\"{}\"",
            e.oauth_error(),
            e
        ));
    }
    let body = json!({
        "error": error.map_or("invalid_request", |e| e.oauth_error()),
        "error_description": message,
    });
    let mut r = plain_json(status, body);
    if status != StatusCode::BAD_REQUEST {
        if let Ok(v) = HeaderValue::from_str(&challenge) {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
    }
    r
}

/// The client's address is over its limit: a JSON-RPC error (HTTP 200)
/// saying when to retry, and `Retry-After` in whole seconds.
fn rate_limited(retry_after: std::time::Duration, message: &str) -> Response<Body> {
    let ms = retry_after.as_millis().max(1) as u64;
    let mut r = rpc(
        StatusCode::OK,
        None,
        codes::RATE_LIMITED,
        message,
        Some(
            &json!({ "stop_reason": crate::outcome::StopReason::RateLimited.as_str(), "scope": "client_ip", "retry_after_ms": ms }),
        ),
    );
    if let Ok(v) = HeaderValue::from_str(&ms.div_ceil(1000).to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// A JSON-RPC error response.
pub(crate) fn rpc(
    status: StatusCode,
    id: Option<&Id>,
    code: i32,
    message: &str,
    data: Option<&serde_json::Value>,
) -> Response<Body> {
    json_response(status, super::answer::error(id, code, message, data))
}

/// A response with an `application/json` body.
pub(crate) fn json_response(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn plain_json(status: StatusCode, v: serde_json::Value) -> Response<Body> {
    json_response(status, Bytes::from(v.to_string()))
}
