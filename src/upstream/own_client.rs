//! The firewall as a small MCP client of its upstreams, for the two things it
//! asks on its own behalf:
//! * an upstream's read-only preview tool for an approver (e.g.
//!   `preview_remediation` for `rollback_deployment`), so the person deciding
//!   sees what the gated call would do ([`call_tool`]);
//! * an upstream's `tools/list`, when a call names a tool the catalog has not
//!   seen ([`list_tools`], used by [`super::refill`]).
//!
//! Each request tries the stateless 2026-07-28 revision first (one POST), and
//! falls back to a session (`initialize`, `notifications/initialized`, the
//! request, `DELETE`) for servers that only speak the session-based
//! revisions. The upstream's injected credentials apply as for any forwarded
//! request; no run's identity is sent (the firewall asks as itself).
//!
//! Every request it sends is on record like a forwarded one ([`OnBehalf`]):
//! an intent row before it leaves, its completion when the answer comes,
//! attributed to whoever made the firewall ask (the approver who opened a
//! preview, or the firewall itself for a catalog refill).

use std::net::SocketAddr;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{header, Method};
use serde_json::{json, Value};

use crate::audit::{AuditRow, Auditor, JsonPayload};
use crate::mcp::sse;
use crate::outcome::{DecisionKind, StopReason};
use crate::server::listener::ConnInfo;

use super::body::{Collected, UpstreamBody};
use super::client::{Forward, UpstreamClient};
use super::failure::UpstreamFailure;
use crate::http_util::mime_is;

/// Why one of the firewall's own requests to an upstream failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnCallError {
    /// The request did not get an answer (connect, timeout, status, size).
    #[error(transparent)]
    Upstream(#[from] UpstreamFailure),
    /// The firewall's own token for the upstream could not be had.
    #[error("upstream credential unavailable: {0}")]
    Credential(#[from] crate::credential::CredentialError),
    /// The answer's event stream could not be read.
    #[error("invalid event stream from the upstream: {0}")]
    EventStream(#[from] sse::SseError),
    /// The answer is not JSON.
    #[error("invalid JSON from the upstream: {0}")]
    Json(#[from] serde_json::Error),
    /// The event stream carried no JSON-RPC answer.
    #[error("no answer in the upstream's event stream")]
    NoAnswerInStream,
    /// The body was empty where an answer was due.
    #[error("the upstream sent no answer")]
    NoAnswer,
    /// The upstream answered with a JSON-RPC error.
    #[error("the upstream refused: {0}")]
    Refused(Value),
    /// A JSON-RPC answer with neither `result` nor `error`.
    #[error("the upstream's answer has no result")]
    NoResult,
    /// The audit trail refused the request's row (fail-closed).
    #[error("the audit trail cannot record the request: {0}")]
    Audit(String),
    /// A listing that did not end within [`MAX_LIST_PAGES`] pages.
    #[error("{method} has more than {MAX_LIST_PAGES} pages; stopped there")]
    TooManyPages {
        /// The list method.
        method: &'static str,
    },
}

/// Whom one of the firewall's own requests is on record for.
#[derive(Clone, Copy)]
pub(crate) struct OnBehalf<'a> {
    /// Where the rows go (a disabled auditor records nothing).
    pub auditor: &'a Auditor,
    /// The tenant it is for (empty: the firewall's own business).
    pub tenant: &'a str,
    /// Who made the firewall ask (an approver's subject, or `mcp-firewall`).
    pub subject: &'a str,
    /// The run it concerns, if any.
    pub run_id: &'a str,
    /// Why the firewall asks.
    pub reason: &'a str,
    /// The run's verified principal whose request made the firewall ask:
    /// an upstream of users' own accounts is asked with that user's token
    /// (never another's); other upstreams ignore it.
    pub user: Option<&'a crate::auth::Claims>,
}

impl OnBehalf<'_> {
    /// The intent row of one request about to be sent.
    fn intent(
        &self,
        up: &UpstreamClient,
        method: &str,
        tool: Option<&str>,
        body: &Bytes,
    ) -> AuditRow {
        let mut row = AuditRow::new();
        row.tenant = self.tenant.to_owned();
        row.subject = self.subject.to_owned();
        row.run_id = self.run_id.to_owned();
        row.upstream = up.config.name.clone();
        row.method = method.to_owned().into();
        row.tool = tool.unwrap_or("").to_owned();
        row.decision = DecisionKind::Allow.as_str().into();
        row.reason = format!("the firewall's own request: {}", self.reason);
        row.row_version = 0;
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            if let Some(id) = v.get("id") {
                row.jsonrpc_id = id.to_string();
            }
            if let Some(args) = v.pointer("/params/arguments") {
                row.arguments = JsonPayload::Value(args.clone());
            }
        }
        row
    }

    /// Writes `row` (a disabled auditor skips it); an audit trail that
    /// refuses it (fail-closed) refuses the request.
    async fn write(&self, row: AuditRow) -> Result<(), OwnCallError> {
        self.auditor
            .record_or_fail(row)
            .await
            .map(|_| ())
            .map_err(|e| OwnCallError::Audit(e.to_string()))
    }
}

const LOCAL: ConnInfo = ConnInfo {
    remote: SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0),
    client: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    tls: false,
};

/// Calls `tool` with `arguments`; returns the tool's result object.
pub(crate) async fn call_tool(
    up: &UpstreamClient,
    by: OnBehalf<'_>,
    tool: &str,
    arguments: Value,
) -> Result<Value, OwnCallError> {
    let params = json!({"name": tool, "arguments": arguments});
    request(up, by, "tools/call", Some(tool), params).await
}

/// Most pages of a `tools/list` the firewall follows.
const MAX_LIST_PAGES: usize = 20;

/// Every page of the upstream's `tools/list`, as complete JSON-RPC
/// responses (what [`crate::mcp::rewrite::tools_list`] reads).
pub(crate) async fn list_tools(
    up: &UpstreamClient,
    by: OnBehalf<'_>,
) -> Result<Vec<String>, OwnCallError> {
    list_pages(up, by, "tools/list").await
}

/// Every page of a paginated list (`tools/list`, `prompts/list`,
/// `resources/templates/list`), as complete JSON-RPC responses.
pub(crate) async fn list_pages(
    up: &UpstreamClient,
    by: OnBehalf<'_>,
    method: &'static str,
) -> Result<Vec<String>, OwnCallError> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_LIST_PAGES {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let result = request(up, by, method, None, params).await?;
        cursor = result
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        pages.push(json!({"jsonrpc": "2.0", "id": "mcp-firewall", "result": result}).to_string());
        if cursor.is_none() {
            return Ok(pages);
        }
    }
    Err(OwnCallError::TooManyPages { method })
}

/// Sends one request as the firewall's own client; returns its result.
async fn request(
    up: &UpstreamClient,
    by: OnBehalf<'_>,
    method: &'static str,
    name: Option<&str>,
    params: Value,
) -> Result<Value, OwnCallError> {
    match stateless(up, by, method, name, params.clone()).await {
        Ok(v) => Ok(v),
        // The audit trail refusing is no reason to try another revision.
        Err(e @ OwnCallError::Audit(_)) => Err(e),
        Err(_) => session(up, by, method, name, params).await,
    }
}

async fn stateless(
    up: &UpstreamClient,
    by: OnBehalf<'_>,
    method: &'static str,
    name: Option<&str>,
    mut params: Value,
) -> Result<Value, OwnCallError> {
    let version = "2026-07-28";
    if let Some(p) = params.as_object_mut() {
        p.insert(
            "_meta".to_owned(),
            json!({
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "mcp-firewall", "version": env!("CARGO_PKG_VERSION")},
            }),
        );
    }
    let body = json!({"jsonrpc": "2.0", "id": "mcp-firewall", "method": method, "params": params});
    let mut headers = base_headers(version);
    headers.insert(
        HeaderName::from_static("mcp-method"),
        HeaderValue::from_static(method),
    );
    if let Some(v) = name.and_then(|n| HeaderValue::from_str(n).ok()) {
        headers.insert(HeaderName::from_static("mcp-name"), v);
    }
    let (_, answer) = post(
        up,
        by,
        (method, name),
        &headers,
        None,
        Bytes::from(body.to_string()),
    )
    .await?;
    result_of(answer)
}

async fn session(
    up: &UpstreamClient,
    by: OnBehalf<'_>,
    method: &str,
    name: Option<&str>,
    params: Value,
) -> Result<Value, OwnCallError> {
    let version = "2025-06-18";
    let init = json!({
        "jsonrpc": "2.0", "id": "mcp-firewall-init", "method": "initialize",
        "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "mcp-firewall", "version": env!("CARGO_PKG_VERSION")}},
    });
    let mut headers = base_headers(version);
    headers.remove("mcp-protocol-version");
    let (resp_headers, answer) = post(
        up,
        by,
        ("initialize", None),
        &headers,
        None,
        Bytes::from(init.to_string()),
    )
    .await?;
    result_of(answer)?;
    headers.insert(
        HeaderName::from_static("mcp-protocol-version"),
        HeaderValue::from_static(version),
    );
    let sid = resp_headers
        .get("mcp-session-id")
        .map(|v| v.as_bytes().to_vec());
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(
        up,
        by,
        ("notifications/initialized", None),
        &headers,
        sid.as_deref(),
        Bytes::from(initialized.to_string()),
    )
    .await?;
    let call = json!({"jsonrpc": "2.0", "id": "mcp-firewall", "method": method, "params": params});
    let outcome = post(
        up,
        by,
        (method, name),
        &headers,
        sid.as_deref(),
        Bytes::from(call.to_string()),
    )
    .await;
    if sid.is_some() {
        let mut row = by.intent(up, "DELETE", None, &Bytes::new());
        let mut set = Vec::new();
        // Without the firewall's own token the session is left to expire.
        let credential = up.credential(None).await.ok();
        if let Some(c) = &credential {
            c.stamp(&mut row);
            c.add_to(&mut set);
        }
        if credential.is_some() && by.write(row.clone()).await.is_ok() {
            let fwd = Forward {
                method: Method::DELETE,
                headers: &headers,
                query: None,
                body: Bytes::new(),
                conn: LOCAL,
                set: &set,
                session: sid.as_deref(),
                last_event_id: None,
            };
            let ended = up.send(fwd).await;
            let status = ended.as_ref().map_or(0, |r| r.status().as_u16());
            let _ = by.write(completed(row, status, ended.is_err(), None)).await;
        }
    }
    result_of(outcome?.1)
}

/// The completion of an own request's intent row.
fn completed(mut row: AuditRow, status: u16, failed: bool, answer: Option<&Value>) -> AuditRow {
    row.row_version = 1;
    row.upstream_status = status;
    row.is_error = failed
        || answer.is_some_and(|a| {
            a.get("error").is_some() || a.pointer("/result/isError") == Some(&Value::Bool(true))
        });
    row.stop_reason = if failed {
        StopReason::UpstreamError
    } else {
        StopReason::Done
    }
    .as_str()
    .into();
    if let Some(a) = answer {
        row.result = JsonPayload::Value(
            a.get("result")
                .or(a.get("error"))
                .cloned()
                .unwrap_or(Value::Null),
        );
    }
    row
}

fn base_headers(version: &'static str) -> HeaderMap {
    let mut h = super::client::own_post_headers();
    h.insert(
        HeaderName::from_static("mcp-protocol-version"),
        HeaderValue::from_static(version),
    );
    h
}

/// POSTs one message (`what`: its method and the tool it names), on record
/// before it is sent and completed when it is answered; returns the
/// response headers and the JSON-RPC answer (from a JSON body or the SSE
/// event carrying it), if any.
async fn post(
    up: &UpstreamClient,
    by: OnBehalf<'_>,
    what: (&str, Option<&str>),
    headers: &HeaderMap,
    session: Option<&[u8]>,
    body: Bytes,
) -> Result<(HeaderMap, Option<Value>), OwnCallError> {
    let mut row = by.intent(up, what.0, what.1, &body);
    // The firewall's own token (client credentials) where the upstream
    // takes exchanged tokens; none, nothing sent (and on record).
    let asked = match by.user {
        Some(claims) if matches!(up.config.auth, crate::config::UpstreamAuth::User(_)) => {
            up.user_credential(claims).await
        }
        _ => up.credential(None).await,
    };
    let credential = match asked {
        Ok(c) => c,
        Err(e) => {
            row.decision = crate::outcome::DecisionKind::Error.as_str().into();
            row.reason = format!("upstream credential unavailable: {e}");
            row.row_version = 1;
            by.write(row).await?;
            return Err(e.into());
        }
    };
    credential.stamp(&mut row);
    by.write(row.clone()).await?;
    let started = std::time::Instant::now();
    let mut set = Vec::new();
    credential.add_to(&mut set);
    let answered = send(up, headers, session, body, &set).await;
    let mut done = match &answered {
        Ok((_, answer)) => completed(row, 200, false, answer.as_ref()),
        Err(OwnCallError::Upstream(UpstreamFailure::Status(s))) => completed(row, *s, true, None),
        Err(_) => completed(row, 0, true, None),
    };
    done.upstream_latency_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    done.latency_us = done.upstream_latency_us;
    if let Err(e) = by.write(done).await {
        tracing::error!(upstream = %up.config.name, error = %e, "completion row of the firewall's own request not written");
    }
    answered
}

/// Sends one POST and reads its answer.
async fn send(
    up: &UpstreamClient,
    headers: &HeaderMap,
    session: Option<&[u8]>,
    body: Bytes,
    set: &[(HeaderName, HeaderValue)],
) -> Result<(HeaderMap, Option<Value>), OwnCallError> {
    let fwd = Forward {
        method: Method::POST,
        headers,
        query: None,
        body,
        conn: LOCAL,
        set,
        session,
        last_event_id: None,
    };
    let resp = up.send(fwd).await?;
    let status = resp.status();
    let (parts, incoming) = resp.into_parts();
    if !status.is_success() {
        return Err(UpstreamFailure::Status(status.as_u16()).into());
    }
    let ct = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut body = UpstreamBody::new(incoming, up.config.request_timeout);
    let limit = up.config.max_response_bytes;
    let bytes = match body.collect_bounded(limit).await? {
        Collected::Complete(b) => b,
        Collected::Partial(_) => return Err(UpstreamFailure::TooLarge(limit).into()),
    };
    if bytes.is_empty() {
        return Ok((parts.headers, None));
    }
    if mime_is(&ct, "text/event-stream") {
        let mut d = sse::Decoder::new(limit);
        d.push(&bytes)?;
        while let Some(ev) = d.next_event() {
            if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                if v.get("id").is_some() && (v.get("result").is_some() || v.get("error").is_some())
                {
                    return Ok((parts.headers, Some(v)));
                }
            }
        }
        return Err(OwnCallError::NoAnswerInStream);
    }
    let v: Value = serde_json::from_slice(&bytes)?;
    Ok((parts.headers, Some(v)))
}

fn result_of(answer: Option<Value>) -> Result<Value, OwnCallError> {
    let answer = answer.ok_or(OwnCallError::NoAnswer)?;
    if let Some(e) = answer.get("error") {
        return Err(OwnCallError::Refused(e.clone()));
    }
    answer.get("result").cloned().ok_or(OwnCallError::NoResult)
}

/// The preview tool's arguments: the gated call's arguments that the preview
/// tool's schema knows, plus the policy's fixed `preview_arguments`.
pub(crate) fn arguments(
    gated: &Value,
    preview_schema: Option<&Value>,
    fixed: Option<&Value>,
) -> Value {
    let mut out = serde_json::Map::new();
    let known = preview_schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    if let (Some(args), Some(known)) = (gated.as_object(), known) {
        for (k, v) in args {
            if known.contains_key(k) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(fixed) = fixed.and_then(Value::as_object) {
        for (k, v) in fixed {
            out.insert(k.clone(), v.clone());
        }
    }
    Value::Object(out)
}
