//! The approver's HTTP API on the admin listener, and the console page.
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /console` | the console page ([`super::console`]); no token needed to load it |
//! | `GET /approvals[?status=S]` | the tenant's approvals, newest first, pending ones with their preview |
//! | `GET /approvals/{id}` | one approval with its preview |
//! | `POST /approvals/{id}/approve` | approve; body `{"reason": "..."}` optional |
//! | `POST /approvals/{id}/deny` | deny; body `{"reason": "..."}` required |
//!
//! Invariants:
//! - every `/approvals` request needs `Authorization: Bearer <admin token>`
//!   verified for the admin audience (which refuses tool tokens and demands
//!   the approvals scope); anything else is a 401 with `WWW-Authenticate`,
//!   decided before the path is looked at, so an unauthenticated caller
//!   learns nothing;
//! - the approver's tenant comes from the token only; another tenant's
//!   approval is a 404 identical to a missing one;
//! - answers are JSON, `Cache-Control: no-store` (they carry arguments);
//! - no CORS headers: only same-origin pages (the console) can read them.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::auth::{Audience, TokenError, Verifier};
use crate::http_util::{full, Body, BoxError};

use super::{console, Approval, ApprovalError, Approvals, Approver, RunLabel, Status};

/// Largest request body accepted (a reason and some slack).
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// Why an API request was refused. [`ApiError::into_response`] is an
/// exhaustive match, so a new variant must be given a status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No `Authorization: Bearer` header.
    #[error("an admin token is required: send Authorization: Bearer <token>")]
    MissingToken,
    /// Several `Authorization` headers, or an unreadable one.
    #[error("send exactly one Authorization: Bearer <token> header")]
    MalformedAuthorization,
    /// The token failed verification for the admin audience.
    #[error("admin token refused: {0}")]
    BadToken(#[source] TokenError),
    /// No such endpoint.
    #[error("no such endpoint; see GET /approvals")]
    NotFound,
    /// Wrong method for the path.
    #[error("method {method} is not allowed here; use {allow}")]
    MethodNotAllowed {
        /// The method used.
        method: Method,
        /// The methods the path takes.
        allow: &'static str,
    },
    /// `?status=` is not a status.
    #[error("unknown status {0:?}; use pending, approved, denied, expired or consumed")]
    UnknownStatus(String),
    /// A query parameter the endpoint does not take.
    #[error("unknown query parameter {0:?}")]
    UnknownParameter(String),
    /// A non-empty body that is not `application/json`.
    #[error("the request body must be application/json")]
    UnsupportedMediaType,
    /// The body exceeds [`MAX_BODY_BYTES`].
    #[error("the request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The limit.
        limit: usize,
    },
    /// The body could not be read.
    #[error("cannot read the request body: {0}")]
    BodyRead(#[source] BoxError),
    /// The body is not `{"reason": "..."}`.
    #[error("the request body must be {{\"reason\": \"...\"}}: {0}")]
    BadBody(#[source] serde_json::Error),
    /// The approvals subsystem refused.
    #[error(transparent)]
    Approval(#[from] ApprovalError),
}

impl ApiError {
    /// The HTTP answer: `{"error": <code>, "message": <text>}`.
    pub fn into_response(self) -> Response<Body> {
        let (status, code) = match &self {
            ApiError::MissingToken | ApiError::MalformedAuthorization | ApiError::BadToken(_) => {
                (StatusCode::UNAUTHORIZED, "unauthorized")
            }
            ApiError::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::MethodNotAllowed { .. } => {
                (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
            }
            ApiError::UnknownStatus(_)
            | ApiError::UnknownParameter(_)
            | ApiError::BodyRead(_)
            | ApiError::BadBody(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            ApiError::Approval(e) => match e {
                ApprovalError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
                ApprovalError::SelfApproval { .. } => (StatusCode::FORBIDDEN, "self_approval"),
                ApprovalError::NotPending { .. } => (StatusCode::CONFLICT, "not_pending"),
                ApprovalError::Expired { .. } => (StatusCode::GONE, "expired"),
                ApprovalError::ReasonRequired
                | ApprovalError::ReasonTooLong { .. }
                | ApprovalError::ReasonControlCharacter => {
                    (StatusCode::BAD_REQUEST, "invalid_reason")
                }
                ApprovalError::TokenExpired { .. } => (StatusCode::BAD_REQUEST, "token_expired"),
                ApprovalError::TooManyPending { .. } => {
                    (StatusCode::TOO_MANY_REQUESTS, "too_many_pending")
                }
                ApprovalError::Unavailable(_) => {
                    (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable")
                }
                ApprovalError::Store(_)
                | ApprovalError::Random(_)
                | ApprovalError::InvalidConfig { .. } => {
                    (StatusCode::INTERNAL_SERVER_ERROR, "internal")
                }
            },
        };
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %self, "approvals API failed");
            "the approvals store cannot record this right now; see the firewall's log".to_owned()
        } else {
            self.to_string()
        };
        let mut r = json_response(status, &json!({ "error": code, "message": message }));
        match &self {
            ApiError::MissingToken => {
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"mcp-firewall-admin\""),
                );
            }
            ApiError::MalformedAuthorization | ApiError::BadToken(_) => {
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(
                        "Bearer realm=\"mcp-firewall-admin\", error=\"invalid_token\"",
                    ),
                );
            }
            ApiError::MethodNotAllowed { allow, .. } => {
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            _ => {}
        }
        r
    }
}

/// An approval as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalView {
    /// The approval (its fields at the top level).
    #[serde(flatten)]
    pub approval: Approval,
    /// Where this view is served.
    pub status_url: String,
    /// The console focused on it.
    pub console_url: String,
    /// The preview, for pending approvals that name a preview tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<PreviewView>,
    /// The labels the run holds now (a pending approval's), with what
    /// brought each in: what the call will be judged against again when
    /// it is released.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub run_labels: Vec<RunLabel>,
}

/// A preview's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviewView {
    /// The preview tool called.
    pub tool: String,
    /// What it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why there is no result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /approvals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListView {
    /// The server's clock, ms since the epoch (countdowns use it, not the
    /// viewer's clock).
    pub now_ms: u64,
    /// The approvals, newest first.
    pub approvals: Vec<ApprovalView>,
}

/// The body of `approve` and `deny`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    /// Why (required to deny).
    #[serde(default)]
    pub reason: String,
}

/// Whether [`handle`] serves `path`.
pub fn owns(path: &str) -> bool {
    path == "/console" || path == "/approvals" || path.starts_with("/approvals/")
}

/// Serves one admin request if its path is the approvals API's or the
/// console's; `None` otherwise (the admin listener answers it).
pub async fn handle<B>(
    approvals: Arc<Approvals>,
    verifier: Verifier,
    req: Request<B>,
) -> Option<Response<Body>>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let path = req.uri().path();
    if !owns(path) {
        return None;
    }
    if path == "/console" {
        return Some(match *req.method() {
            Method::GET | Method::HEAD => console::page(),
            ref m => ApiError::MethodNotAllowed {
                method: m.clone(),
                allow: "GET",
            }
            .into_response(),
        });
    }
    Some(match api(&approvals, &verifier, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    })
}

async fn api<B>(
    approvals: &Approvals,
    verifier: &Verifier,
    req: Request<B>,
) -> Result<Response<Body>, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    // Authentication first: the path's shape is nobody's business before.
    let approver = authenticate(verifier, req.headers()).await?;
    let path = req.uri().path().to_owned();
    let rest = path
        .strip_prefix("/approvals")
        .unwrap_or_default()
        .trim_start_matches('/');
    let segments: Vec<&str> = if rest.is_empty() {
        Vec::new()
    } else {
        rest.split('/').collect()
    };
    let method = req.method().clone();
    match (segments.as_slice(), &method) {
        ([], &Method::GET) => list(approvals, &approver, req.uri().query()).await,
        ([], m) => Err(not_allowed(m, "GET")),
        ([id], &Method::GET) => show(approvals, &approver, id).await,
        ([_], m) => Err(not_allowed(m, "GET")),
        ([id, action @ ("approve" | "deny")], &Method::POST) => {
            let id = (*id).to_owned();
            let approve = *action == "approve";
            let body = read_body(req).await?;
            let approval = approvals
                .decide(&approver.tenant, &id, &approver, approve, &body.reason)
                .await?;
            Ok(json_response(
                StatusCode::OK,
                &view(approvals, approval, None),
            ))
        }
        ([_, "approve" | "deny"], m) => Err(not_allowed(m, "POST")),
        _ => Err(ApiError::NotFound),
    }
}

fn not_allowed(method: &Method, allow: &'static str) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.clone(),
        allow,
    }
}

/// The approver behind the request's admin token.
pub(crate) async fn authenticate(
    verifier: &Verifier,
    headers: &HeaderMap,
) -> Result<Approver, ApiError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(ApiError::MissingToken);
    };
    if values.next().is_some() {
        return Err(ApiError::MalformedAuthorization);
    }
    let text = value
        .to_str()
        .map_err(|_| ApiError::MalformedAuthorization)?;
    let token = match text.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
        _ => return Err(ApiError::MalformedAuthorization),
    };
    if token.is_empty() {
        return Err(ApiError::MissingToken);
    }
    let claims = verifier
        .verify(token, Audience::Admin)
        .await
        .map_err(ApiError::BadToken)?;
    Ok(Approver {
        subject: claims.sub.to_string(),
        tenant: claims.tenant_id.to_string(),
        scopes: claims.scopes.to_vec(),
    })
}

async fn list(
    approvals: &Approvals,
    approver: &Approver,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let mut status = None;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=') {
            Some(("status", "all" | "")) => status = None,
            Some(("status", s)) => {
                status = Some(
                    Status::from_name(s).ok_or_else(|| ApiError::UnknownStatus(s.to_owned()))?,
                );
            }
            _ => return Err(ApiError::UnknownParameter(pair.to_owned())),
        }
    }
    let items = approvals.list(&approver.tenant, status).await?;
    // Previews of pending approvals are fetched concurrently; each is cached
    // after its first success, so a refreshing console costs lookups.
    let previews = futures_util::future::join_all(
        items
            .iter()
            .map(|a| preview_view(approvals, a, &approver.subject)),
    )
    .await;
    let approvals_out = items
        .into_iter()
        .zip(previews)
        .map(|(a, p)| view(approvals, a, p))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &ListView {
            now_ms: approvals.now_ms(),
            approvals: approvals_out,
        },
    ))
}

async fn show(
    approvals: &Approvals,
    approver: &Approver,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let approval = approvals
        .get(&approver.tenant, id)
        .await?
        .ok_or_else(|| ApprovalError::NotFound { id: id.to_owned() })?;
    let preview = preview_view(approvals, &approval, &approver.subject).await;
    Ok(json_response(
        StatusCode::OK,
        &view(approvals, approval, preview),
    ))
}

async fn preview_view(approvals: &Approvals, a: &Approval, by: &str) -> Option<PreviewView> {
    let tool = a.preview_tool.clone()?;
    let result = approvals.preview(a, by).await?;
    Some(match result {
        Ok(v) => PreviewView {
            tool,
            result: Some((*v).clone()),
            error: None,
        },
        Err(e) => PreviewView {
            tool,
            result: None,
            error: Some(e),
        },
    })
}

fn view(approvals: &Approvals, approval: Approval, preview: Option<PreviewView>) -> ApprovalView {
    let run_labels = if approval.status == Status::Pending {
        approvals.run_labels(&approval.key)
    } else {
        Vec::new()
    };
    ApprovalView {
        status_url: approvals.status_url(&approval.id),
        console_url: approvals.console_url(&approval.id),
        approval,
        preview,
        run_labels,
    }
}

async fn read_body<B>(req: Request<B>) -> Result<DecideBody, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(ApiError::BodyTooLarge {
            limit: MAX_BODY_BYTES,
        });
    }
    let bytes = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(ApiError::BodyTooLarge {
                limit: MAX_BODY_BYTES,
            })
        }
        Err(e) => return Err(ApiError::BodyRead(e)),
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(DecideBody::default());
    }
    let json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiError::UnsupportedMediaType);
    }
    serde_json::from_slice(&bytes).map_err(ApiError::BadBody)
}

pub(crate) fn json_response(status: StatusCode, value: &impl Serialize) -> Response<Body> {
    let (status, bytes) = match serde_json::to_vec(value) {
        Ok(b) => (status, Bytes::from(b)),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Bytes::from_static(
                b"{\"error\":\"internal\",\"message\":\"cannot encode the answer\"}",
            ),
        ),
    };
    let mut r = Response::new(full(bytes));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
