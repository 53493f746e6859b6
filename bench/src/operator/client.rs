//! One virtual user's MCP client: the era found by `server/discover` (or
//! the `initialize` handshake, one session per user), requests shaped as
//! the revision wants (`Mcp-Method`, `Mcp-Name`, `Mcp-Param-*` headers on
//! 2026-07-28; `Mcp-Session-Id` and `MCP-Protocol-Version` before), answers
//! read whole (JSON, or SSE until the response to our id), and each answer
//! classified into one [`Outcome`].
//!
//! Invariant: "the firewall refused it" (a stop reason, a 401 or 429) is
//! never counted as "it failed" (transport errors, other HTTP statuses,
//! JSON-RPC errors without a stop reason, unreadable answers), and a tool
//! that answered `isError` is counted apart from both.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::plan::Era;

/// What kind of outcome an answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Answered as asked.
    Ok,
    /// Refused by the firewall (or another gateway) on purpose.
    Refused,
    /// The tool ran and reported an error (`isError`).
    ToolError,
    /// Failed: transport, HTTP, protocol.
    Error,
}

impl Category {
    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Ok => "ok",
            Category::Refused => "refused",
            Category::ToolError => "tool error",
            Category::Error => "error",
        }
    }
}

/// One classified answer (one per JSON-RPC message; a batch has several).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Outcome {
    /// `ok`, a stop reason (`step_cap`, `rate_limited`, ...), `http 503`,
    /// `rpc -32602`, `tool_error`, `transport: ...`.
    pub label: String,
    /// Its kind.
    pub category: Category,
}

impl Outcome {
    fn new(label: impl Into<String>, category: Category) -> Outcome {
        Outcome {
            label: label.into(),
            category,
        }
    }

    fn error(label: impl Into<String>) -> Outcome {
        Outcome::new(label, Category::Error)
    }
}

/// What one exchange gave.
#[derive(Debug, Clone)]
pub struct Answer {
    /// One per message answered (or one for the exchange when it failed).
    pub outcomes: Vec<Outcome>,
    /// Whole exchange: request sent → answer read.
    pub latency: Duration,
    /// JSON-RPC ids of the `tools/call` requests that got an answer.
    pub answered_calls: Vec<u64>,
}

/// A tool as the target lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolInfo {
    /// Its name.
    pub name: String,
    /// Its `inputSchema`.
    pub schema: Value,
}

impl ToolInfo {
    /// `(argument, header name)` of its `x-mcp-header` parameters.
    fn header_params(&self) -> Vec<(String, String)> {
        self.schema["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| {
                v.get("x-mcp-header")
                    .and_then(Value::as_str)
                    .map(|h| (k.clone(), format!("mcp-param-{}", h.to_ascii_lowercase())))
            })
            .collect()
    }

    /// Arguments for a call: `given` first, then every required property
    /// the schema describes, filled from its `default`, `examples`, `enum`
    /// or type.
    pub fn arguments(&self, mut given: Map<String, Value>) -> Value {
        let props = self.schema["properties"].as_object();
        let required = self.schema["required"].as_array();
        for name in required.into_iter().flatten().filter_map(Value::as_str) {
            if given.contains_key(name) {
                continue;
            }
            let p = props
                .and_then(|p| p.get(name))
                .cloned()
                .unwrap_or(Value::Null);
            given.insert(name.to_owned(), example(&p));
        }
        Value::Object(given)
    }
}

/// A value a property's schema accepts, as far as can be told without a
/// JSON Schema engine.
fn example(p: &Value) -> Value {
    if let Some(d) = p.get("default").filter(|d| !d.is_null()) {
        return d.clone();
    }
    if let Some(e) = p["examples"].as_array().and_then(|e| e.first()) {
        return e.clone();
    }
    if let Some(e) = p["enum"]
        .as_array()
        .and_then(|e| e.iter().find(|v| !v.is_null()))
    {
        return e.clone();
    }
    let ty = match &p["type"] {
        Value::String(t) => t.as_str(),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("string"),
        _ => "string",
    };
    match ty {
        "integer" | "number" => p.get("minimum").cloned().unwrap_or(json!(1)),
        "boolean" => json!(false),
        "array" => json!([]),
        "object" => json!({}),
        _ => json!("load-test"),
    }
}

/// The revision a user speaks, once open.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Speaking {
    /// 2026-07-28: no session, every request says its version.
    Stateless,
    /// A session of `version`.
    Session {
        /// `Mcp-Session-Id`, when the server gave one.
        id: Option<String>,
        /// The negotiated `protocolVersion`.
        version: String,
    },
}

/// Why a user could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OpenError(pub String);

/// JSON-RPC ids: unique across users, runs and processes (a random base),
/// and below 2^53 so every JSON parser reads them exactly.
#[derive(Debug)]
pub struct Ids {
    base: u64,
    next: AtomicU64,
}

impl Default for Ids {
    fn default() -> Ids {
        Ids::new()
    }
}

impl Ids {
    /// A fresh random base.
    pub fn new() -> Ids {
        let r = u64::from(rand::random::<u32>() & 0xF_FFFF);
        Ids {
            base: r << 32,
            next: AtomicU64::new(1),
        }
    }

    fn take(&self) -> u64 {
        self.base + self.next.fetch_add(1, Ordering::Relaxed)
    }
}

/// One virtual user: its HTTP client, token and session.
pub struct User {
    http: reqwest::Client,
    url: String,
    token: String,
    speaking: Speaking,
    /// The HTTP version the first answer came in (`HTTP/1.1`, `HTTP/2.0`).
    transport: String,
}

const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CAPS: &str = "io.modelcontextprotocol/clientCapabilities";
const MODERN: &str = "2026-07-28";

impl User {
    /// Opens a user on `url` with `token` (empty: none), speaking `era`.
    pub async fn open(
        http: reqwest::Client,
        url: &str,
        token: &str,
        era: Era,
        ids: &Ids,
    ) -> Result<User, OpenError> {
        let mut user = User {
            http,
            url: url.to_owned(),
            token: token.to_owned(),
            speaking: Speaking::Stateless,
            transport: String::new(),
        };
        if matches!(era, Era::Auto | Era::V20260728) {
            let id = ids.take();
            let body = json!({"jsonrpc": "2.0", "id": id, "method": "server/discover",
                              "params": {"_meta": {META_VERSION: MODERN, META_CAPS: {}}}});
            let sent = user
                .send(&body, "server/discover", None, &[])
                .await
                .map_err(|e| OpenError(format!("server/discover: {e}")))?;
            user.transport = sent.version.clone();
            let modern = sent.status == 200
                && find_response(&sent, id).is_some_and(|m| m.get("result").is_some());
            if modern {
                return Ok(user);
            }
            if era == Era::V20260728 {
                return Err(OpenError(format!(
                    "server/discover was answered HTTP {} without a result: {}",
                    sent.status,
                    snippet(&sent.body)
                )));
            }
        }
        let version = era
            .version()
            .filter(|v| *v != MODERN)
            .unwrap_or("2025-11-25");
        user.speaking = Speaking::Session {
            id: None,
            version: version.to_owned(),
        };
        let id = ids.take();
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "mcp-bench load", "version": env!("CARGO_PKG_VERSION")}}});
        let (sent, result) = user.ask(&body, id, "initialize").await?;
        user.transport = sent.version.clone();
        let negotiated = result["protocolVersion"]
            .as_str()
            .unwrap_or(version)
            .to_owned();
        user.speaking = Speaking::Session {
            id: sent.session,
            version: negotiated,
        };
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        user.send(&note, "notifications/initialized", None, &[])
            .await
            .map_err(|e| OpenError(format!("notifications/initialized: {e}")))?;
        Ok(user)
    }

    /// The revision it speaks.
    pub fn version(&self) -> &str {
        match &self.speaking {
            Speaking::Stateless => MODERN,
            Speaking::Session { version, .. } => version,
        }
    }

    /// The HTTP version it was answered in.
    pub fn transport(&self) -> &str {
        &self.transport
    }

    /// Ends the session (DELETE), if there is one.
    pub async fn close(self) {
        if let Speaking::Session { id: Some(id), .. } = &self.speaking {
            let mut req = self.http.delete(&self.url).header("mcp-session-id", id);
            if !self.token.is_empty() {
                req = req.bearer_auth(&self.token);
            }
            let _ = req.send().await;
        }
    }

    /// Every tool the target lists (all pages).
    pub async fn list_tools(&mut self, ids: &Ids) -> Result<Vec<ToolInfo>, OpenError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..100 {
            let id = ids.take();
            let mut params = json!({});
            if let Some(c) = &cursor {
                params["cursor"] = json!(c);
            }
            let body = self.request(id, "tools/list", params);
            let (_, result) = self.ask(&body, id, "tools/list").await?;
            for t in result["tools"].as_array().into_iter().flatten() {
                if let Some(name) = t["name"].as_str() {
                    tools.push(ToolInfo {
                        name: name.to_owned(),
                        schema: t["inputSchema"].clone(),
                    });
                }
            }
            cursor = result["nextCursor"].as_str().map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
        Ok(tools)
    }

    /// `tools/list` as a measured request (first page).
    pub async fn measure_list(&mut self, ids: &Ids) -> Answer {
        let id = ids.take();
        let body = self.request(id, "tools/list", json!({}));
        self.measured(&body, "tools/list", None, &[], &[id], false)
            .await
    }

    /// One `tools/call`.
    pub async fn call(&mut self, ids: &Ids, tool: &ToolInfo, arguments: Value) -> Answer {
        let id = ids.take();
        let headers = self.param_headers(tool, &arguments);
        let body = self.request(
            id,
            "tools/call",
            json!({"name": tool.name, "arguments": arguments}),
        );
        self.measured(&body, "tools/call", Some(&tool.name), &headers, &[id], true)
            .await
    }

    /// `calls.len()` calls in one batch (2025-03-26).
    pub async fn batch(&mut self, ids: &Ids, calls: Vec<(&ToolInfo, Value)>) -> Answer {
        let mut sent_ids = Vec::with_capacity(calls.len());
        let items: Vec<Value> = calls
            .into_iter()
            .map(|(tool, arguments)| {
                let id = ids.take();
                sent_ids.push(id);
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                       "params": {"name": tool.name, "arguments": arguments}})
            })
            .collect();
        self.measured(&Value::Array(items), "", None, &[], &sent_ids, true)
            .await
    }

    /// Holds a server stream for `hold`: the GET stream of the session, or
    /// `subscriptions/listen` on 2026-07-28. Latency is the time to the
    /// stream's headers; the outcome is `ok` when it stayed open.
    pub async fn stream(&mut self, ids: &Ids, hold: Duration) -> Answer {
        let start = Instant::now();
        let req = match &self.speaking {
            Speaking::Stateless => {
                let id = ids.take();
                let body = self.request(
                    id,
                    "subscriptions/listen",
                    json!({"notifications": {"toolsListChanged": true}}),
                );
                self.builder(&body, "subscriptions/listen", None, &[])
            }
            Speaking::Session { id, version } => {
                let mut r = self
                    .http
                    .get(&self.url)
                    .header("accept", "text/event-stream");
                if version != "2025-03-26" {
                    r = r.header("mcp-protocol-version", version.as_str());
                }
                if let Some(s) = id {
                    r = r.header("mcp-session-id", s.as_str());
                }
                if !self.token.is_empty() {
                    r = r.bearer_auth(&self.token);
                }
                r
            }
        };
        let outcome = match req.send().await {
            Err(e) => Outcome::error(transport(&e)),
            Ok(mut resp) => {
                let latency = start.elapsed();
                let status = resp.status().as_u16();
                let sse = resp
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|c| c.starts_with("text/event-stream"));
                if status != 200 || !sse {
                    let body = resp.bytes().await.unwrap_or_default();
                    return Answer {
                        outcomes: vec![http_outcome(status, &body)],
                        latency,
                        answered_calls: Vec::new(),
                    };
                }
                let deadline = tokio::time::Instant::now() + hold;
                let outcome = loop {
                    match tokio::time::timeout_at(deadline, resp.chunk()).await {
                        Err(_) => break Outcome::new("ok", Category::Ok),
                        Ok(Ok(Some(_))) => continue,
                        Ok(Ok(None)) => break Outcome::error("stream ended early"),
                        Ok(Err(e)) => break Outcome::error(transport(&e)),
                    }
                };
                return Answer {
                    outcomes: vec![outcome],
                    latency,
                    answered_calls: Vec::new(),
                };
            }
        };
        Answer {
            outcomes: vec![outcome],
            latency: start.elapsed(),
            answered_calls: Vec::new(),
        }
    }

    /// Sends a control request (not measured) and returns its result.
    async fn ask(&self, body: &Value, id: u64, method: &str) -> Result<(Sent, Value), OpenError> {
        let sent = self
            .send(body, method, None, &[])
            .await
            .map_err(|e| OpenError(format!("{method}: {e}")))?;
        let result = find_response(&sent, id)
            .and_then(|m| m.get("result").cloned())
            .ok_or_else(|| {
                OpenError(format!(
                    "{method} was answered HTTP {}: {}",
                    sent.status,
                    snippet(&sent.body)
                ))
            })?;
        Ok((sent, result))
    }

    fn request(&self, id: u64, method: &str, mut params: Value) -> Value {
        if self.speaking == Speaking::Stateless {
            params["_meta"] = json!({ META_VERSION: MODERN, META_CAPS: {} });
        }
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    }

    /// `Mcp-Param-*` headers for a call's arguments (2026-07-28).
    fn param_headers(&self, tool: &ToolInfo, arguments: &Value) -> Vec<(String, String)> {
        if self.speaking != Speaking::Stateless {
            return Vec::new();
        }
        tool.header_params()
            .into_iter()
            .filter_map(|(arg, header)| {
                let v = match &arguments[&arg] {
                    Value::String(s) => header_text(s),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    _ => return None,
                };
                Some((header, v))
            })
            .collect()
    }

    fn builder(
        &self,
        body: &Value,
        method: &str,
        name: Option<&str>,
        extra: &[(String, String)],
    ) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        if !self.token.is_empty() {
            req = req.bearer_auth(&self.token);
        }
        match &self.speaking {
            Speaking::Stateless => {
                req = req.header("mcp-protocol-version", MODERN);
                if !method.is_empty() {
                    req = req.header("mcp-method", method);
                }
                if let Some(n) = name {
                    req = req.header("mcp-name", header_text(n));
                }
                for (h, v) in extra {
                    req = req.header(h.as_str(), v.as_str());
                }
            }
            Speaking::Session { id, version } => {
                // The header exists from 2025-06-18 on.
                if method != "initialize" && version != "2025-03-26" {
                    req = req.header("mcp-protocol-version", version.as_str());
                }
                if let Some(s) = id {
                    req = req.header("mcp-session-id", s.as_str());
                }
            }
        }
        req
    }

    async fn send(
        &self,
        body: &Value,
        method: &str,
        name: Option<&str>,
        extra: &[(String, String)],
    ) -> Result<Sent, String> {
        let resp = self
            .builder(body, method, name, extra)
            .send()
            .await
            .map_err(|e| transport(&e))?;
        let status = resp.status().as_u16();
        let version = format!("{:?}", resp.version());
        let session = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = resp.bytes().await.map_err(|e| transport(&e))?.to_vec();
        Ok(Sent {
            status,
            version,
            session,
            content_type,
            body,
        })
    }

    async fn measured(
        &self,
        body: &Value,
        method: &str,
        name: Option<&str>,
        extra: &[(String, String)],
        ids: &[u64],
        calls: bool,
    ) -> Answer {
        let start = Instant::now();
        let sent = self.send(body, method, name, extra).await;
        let latency = start.elapsed();
        let sent = match sent {
            Ok(s) => s,
            Err(e) => {
                return Answer {
                    outcomes: vec![Outcome::error(e)],
                    latency,
                    answered_calls: Vec::new(),
                }
            }
        };
        let mut outcomes = Vec::with_capacity(ids.len());
        let mut answered = Vec::new();
        for &id in ids {
            match find_response(&sent, id) {
                Some(m) => {
                    outcomes.push(classify(&m));
                    if calls {
                        answered.push(id);
                    }
                }
                None => outcomes.push(http_outcome(sent.status, &sent.body)),
            }
        }
        Answer {
            outcomes,
            latency,
            answered_calls: answered,
        }
    }
}

/// An HTTP answer, read whole.
struct Sent {
    status: u16,
    version: String,
    session: Option<String>,
    content_type: String,
    body: Vec<u8>,
}

/// The JSON-RPC response to `id` in an answer (JSON, a batch, or SSE).
fn find_response(sent: &Sent, id: u64) -> Option<Value> {
    let matches = |m: &Value| {
        m.get("id").and_then(Value::as_u64) == Some(id)
            && (m.get("result").is_some() || m.get("error").is_some())
    };
    let pick = |v: Value| -> Option<Value> {
        match v {
            Value::Array(items) => items.into_iter().find(|m| matches(m)),
            m if matches(&m) => Some(m),
            _ => None,
        }
    };
    if sent.content_type.starts_with("text/event-stream") {
        let text = String::from_utf8_lossy(&sent.body);
        let mut data = String::new();
        for line in text.lines().chain(std::iter::once("")) {
            if let Some(d) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
            } else if line.is_empty() && !data.is_empty() {
                if let Some(m) = serde_json::from_str(&data).ok().and_then(pick) {
                    return Some(m);
                }
                data.clear();
            }
        }
        return None;
    }
    serde_json::from_slice(&sent.body).ok().and_then(pick)
}

/// One JSON-RPC response as an outcome.
fn classify(m: &Value) -> Outcome {
    if let Some(e) = m.get("error") {
        if let Some(stop) = e["data"]["stop_reason"].as_str() {
            return Outcome::new(stop, Category::Refused);
        }
        let code = e["code"].as_i64().unwrap_or(0);
        return Outcome::error(format!("rpc {code}"));
    }
    let r = &m["result"];
    if r["structuredContent"]["skipped"] == json!(true) {
        let stop = r["structuredContent"]["stop_reason"]
            .as_str()
            .unwrap_or("skipped");
        return Outcome::new(stop, Category::Refused);
    }
    if r["isError"] == json!(true) {
        return Outcome::new("tool_error", Category::ToolError);
    }
    Outcome::new("ok", Category::Ok)
}

/// An answer with no JSON-RPC response to our id.
fn http_outcome(status: u16, body: &[u8]) -> Outcome {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if v.get("error").is_some() {
            let o = classify(&v);
            if o.category == Category::Refused {
                return o;
            }
        }
    }
    match status {
        401 | 403 | 429 => Outcome::new(format!("http {status}"), Category::Refused),
        200 | 202 => Outcome::error("no response to the request"),
        s => Outcome::error(format!("http {s}")),
    }
}

fn transport(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else {
        "request"
    };
    format!("transport: {kind}")
}

/// A header value as the 2026-07-28 transport wants it: visible ASCII as
/// is, anything else in the `=?base64?...?=` form.
fn header_text(s: &str) -> String {
    let plain = s.bytes().all(|b| (0x20..0x7f).contains(&b) || b == b'\t')
        && !s.starts_with("=?base64?")
        && s.trim() == s;
    if plain {
        s.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
        )
    }
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let t: String = text.chars().take(200).collect();
    t.replace('\n', " ")
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
