//! Virtual servers (issue 34) against three recording upstreams, two of
//! which (alpha, beta) list the same tool (`search`), prompt (`brief`) and
//! resource URI (`file:///shared.txt`): per collision mode, what is listed,
//! what each name reaches and that the other member received nothing; that
//! a policy hiding one twin from a principal does not send its name to the
//! other; that a member's request to the client is answered to that member
//! only; `list_changed` on the merged stream; both eras; rows naming the
//! virtual server, the member and the member's own tool; a slow member left
//! out of a list page within the deadline and a down member on `/readyz`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};

use crate::common::clickhouse::ClickHouse;
use crate::common::{self, raw, Firewall, TestConfig};

const POLICY: &str = r#"
[[agents]]
name = "vs-all"
description = "Every read tool of the virtual server's members"
projects = ["sre"]
risks = ["read"]
allow = [{}]

[[agents]]
name = "vs-narrow"
description = "Every read tool but alpha's search"
projects = ["sre"]
risks = ["read"]
allow = [{}]
deny = [{ upstream = "alpha", tools = ["search"] }]

[[agents]]
name = "vs-capped"
description = "Two steps per run, whichever members they reach"
projects = ["sre"]
risks = ["read"]
allow = [{}]
max_steps = 2

[[tools]]
upstream = "alpha"
match = ["search", "alpha_only"]
risk = "read"

[[tools]]
upstream = "beta"
match = ["search", "beta_only", "ask", "slow"]
risk = "read"

[[tools]]
upstream = "gamma"
match = ["gamma_only"]
risk = "read"

[server_requests]
sampling = false
elicitation = false
roots = false

[server_requests.upstreams.beta]
sampling = true
"#;

/// What member `name` lists.
fn tools_of(name: &str) -> Vec<&'static str> {
    match name {
        "alpha" => vec!["search", "alpha_only"],
        "beta" => vec!["search", "beta_only", "ask", "slow"],
        _ => vec!["gamma_only"],
    }
}

fn prompts_of(name: &str) -> Vec<&'static str> {
    match name {
        "alpha" | "beta" => vec!["brief"],
        _ => vec![],
    }
}

fn uris_of(name: &str) -> Vec<&'static str> {
    match name {
        "alpha" => vec!["file:///shared.txt", "file:///alpha.txt"],
        "beta" => vec!["file:///shared.txt"],
        _ => vec![],
    }
}

/// A recording member: answers as an MCP server named `name` would (a
/// session per `initialize`, its lists, `<name>:<what>` for a call, a
/// prompt or a read); `ask` answers with a sampling request and then its
/// result on one stream; the GET stream carries `tools/list_changed`;
/// `tools/list` waits `slow` first.
async fn member(name: &'static str, slow: Duration) -> raw::RawUpstream {
    raw::upstream(move |seen| async move {
        match seen.method.as_str() {
            "GET" => {
                return raw::sse(
                    vec![Bytes::from_static(
                        b"id: g1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n",
                    )],
                    Duration::from_millis(1),
                    false,
                )
            }
            "DELETE" => return raw::full(200, "text/plain", ""),
            _ => {}
        }
        let body: Value = serde_json::from_slice(&seen.body).unwrap_or_default();
        let method = body["method"].as_str().unwrap_or("").to_owned();
        if body.get("id").is_none() || method.is_empty() {
            return raw::full(202, "text/plain", "");
        }
        let p = &body["params"];
        let item = |n: &&str| json!({"name": n, "description": format!("{name}'s {n}"), "inputSchema": {"type": "object"}});
        let result = match method.as_str() {
            "initialize" => json!({
                "protocolVersion": p["protocolVersion"].as_str().unwrap_or("2025-11-25"),
                "capabilities": {"tools": {"listChanged": true}, "prompts": {}, "resources": {}},
                "serverInfo": {"name": name, "version": "1"},
                "instructions": format!("{name}'s own instructions"),
            }),
            "tools/list" => {
                tokio::time::sleep(slow).await;
                json!({"tools": tools_of(name).iter().map(item).collect::<Vec<_>>()})
            }
            "prompts/list" => json!({"prompts": prompts_of(name).iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}),
            "resources/list" => json!({"resources": uris_of(name).iter().map(|u| json!({"uri": u, "name": u})).collect::<Vec<_>>()}),
            "resources/templates/list" => json!({"resourceTemplates": []}),
            "tools/call" if p["name"] == "ask" => {
                let ask = json!({"jsonrpc": "2.0", "id": 91, "method": "sampling/createMessage",
                    "params": {"messages": [{"role": "user", "content": {"type": "text", "text": "summarize"}}], "maxTokens": 10}});
                let done = json!({"jsonrpc": "2.0", "id": body["id"], "result": {"content": [{"type": "text", "text": format!("{name}:ask")}]}});
                return raw::sse(
                    vec![
                        Bytes::from(format!("id: a1\ndata: {ask}\n\n")),
                        Bytes::from(format!("id: a2\ndata: {done}\n\n")),
                    ],
                    Duration::from_millis(1),
                    false,
                );
            }
            "server/discover" if name == "gamma" => {
                // A session-only server.
                return raw::full(
                    400,
                    "application/json",
                    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Bad Request: Server not initialized"}}"#,
                );
            }
            "server/discover" => json!({
                "supportedVersions": if name == "alpha" { json!(["2026-07-28", "2025-11-25"]) } else { json!(["2026-07-28"]) },
                "capabilities": {"tools": {"listChanged": name == "beta"}},
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": name, "version": "1"}},
            }),
            "subscriptions/listen" => {
                let note = json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": format!("file:///{name}.txt")}});
                let done = json!({"jsonrpc": "2.0", "id": body["id"], "result": {}});
                return raw::sse(
                    vec![
                        Bytes::from(format!("data: {note}\n\n")),
                        Bytes::from(format!("data: {done}\n\n")),
                    ],
                    Duration::from_millis(1),
                    false,
                );
            }
            "tools/call" if p["name"] == "slow" => {
                // An answer that takes a while (the client cancels it).
                let done = json!({"jsonrpc": "2.0", "id": body["id"], "result": {"content": [{"type": "text", "text": format!("{name}:slow")}]}});
                return raw::sse(
                    vec![
                        Bytes::from_static(b": working\n\n"),
                        Bytes::from(format!("id: s1\ndata: {done}\n\n")),
                    ],
                    Duration::from_secs(2),
                    false,
                );
            }
            "tools/call" => json!({"content": [{"type": "text", "text": format!("{name}:{}", p["name"].as_str().unwrap_or(""))}]}),
            "prompts/get" => json!({"messages": [{"role": "user", "content": {"type": "text", "text": format!("{name}:{}", p["name"].as_str().unwrap_or(""))}}]}),
            "resources/read" => json!({"contents": [{"uri": p["uri"], "text": format!("{name}:{}", p["uri"].as_str().unwrap_or(""))}]}),
            _ => json!({}),
        };
        let mut r = raw::full(
            200,
            "application/json",
            json!({"jsonrpc": "2.0", "id": body["id"], "result": result}).to_string(),
        );
        if method == "initialize" {
            r.headers_mut()
                .insert("mcp-session-id", format!("{name}-session").parse().unwrap());
        }
        r
    })
    .await
}

struct Estate {
    alpha: raw::RawUpstream,
    beta: raw::RawUpstream,
    gamma: raw::RawUpstream,
    policy: tempfile::TempDir,
}

impl Estate {
    async fn new(gamma_slow: Duration) -> Estate {
        Estate {
            alpha: member("alpha", Duration::ZERO).await,
            beta: member("beta", Duration::ZERO).await,
            gamma: member("gamma", gamma_slow).await,
            policy: common::policy_dir(&[("90-virtual.toml", POLICY)]),
        }
    }

    fn config(&self, collisions: &str) -> TestConfig {
        TestConfig::new()
            .policies(self.policy.path())
            .upstream("alpha", &self.alpha.url())
            .upstream("beta", &self.beta.url())
            .upstream("gamma", &self.gamma.url())
            .virtual_server("ops", &["alpha", "beta", "gamma"], collisions)
    }

    fn members(&self) -> [(&'static str, &raw::RawUpstream); 3] {
        [
            ("alpha", &self.alpha),
            ("beta", &self.beta),
            ("gamma", &self.gamma),
        ]
    }
}

fn token(role: &str) -> String {
    common::sign(&common::claims(role, &["sre"]))
}

/// A client session on the virtual server: `initialize`, `initialized`.
async fn open(fw: &Firewall, token: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"sampling": {}},
        "clientInfo": {"name": "test", "version": "1"}}});
    let a = common::post(&fw.mcp_url("ops"), token, &[], &init.to_string()).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let v = a.json();
    assert_eq!(v["result"]["serverInfo"]["name"], "ops", "{v}");
    assert!(v["result"]["capabilities"]["tools"].is_object(), "{v}");
    let sid = a.headers["mcp-session-id"].to_str().unwrap().to_owned();
    assert!(sid.starts_with("vs1."), "a sealed id: {sid}");
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let a = rpc(fw, token, &sid, &note).await;
    assert_eq!(a.status, 202, "{}", a.text);
    sid
}

async fn rpc(fw: &Firewall, token: &str, sid: &str, body: &Value) -> common::Answer {
    common::post(
        &fw.mcp_url("ops"),
        token,
        &[
            ("mcp-session-id", sid),
            ("mcp-protocol-version", "2025-11-25"),
        ],
        &body.to_string(),
    )
    .await
}

async fn request(fw: &Firewall, token: &str, sid: &str, method: &str, params: Value) -> Value {
    let a = rpc(
        fw,
        token,
        sid,
        &json!({"jsonrpc": "2.0", "id": 5, "method": method, "params": params}),
    )
    .await;
    assert_eq!(a.status, 200, "{method}: {}", a.text);
    a.json()
}

/// Every page of a list: the names (or URIs) of its items.
async fn listed(
    fw: &Firewall,
    token: &str,
    sid: &str,
    method: &str,
    key: &str,
) -> BTreeSet<String> {
    let field = if key == "resources" { "uri" } else { "name" };
    let mut out = BTreeSet::new();
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let v = request(fw, token, sid, method, params).await;
        for item in v["result"][key].as_array().unwrap_or_else(|| panic!("{v}")) {
            let name = item[field].as_str().unwrap().to_owned();
            assert!(out.insert(name), "listed once: {v}");
        }
        cursor = v["result"]["nextCursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    out
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// How many `method` requests naming `name` (tool, prompt, URI) a member got.
fn got(up: &raw::RawUpstream, method: &str, name: &str) -> usize {
    up.seen()
        .iter()
        .filter(|s| {
            let v: Value = serde_json::from_slice(&s.body).unwrap_or_default();
            v["method"] == method && (v["params"]["name"] == name || v["params"]["uri"] == name)
        })
        .count()
}

/// `(text, error message)` of an answer.
fn outcome(v: &Value) -> (String, String) {
    let r = &v["result"];
    let text = r["content"][0]["text"]
        .as_str()
        .or(r["messages"][0]["content"]["text"].as_str())
        .or(r["contents"][0]["text"].as_str())
        .unwrap_or("")
        .to_owned();
    (
        text,
        v["error"]["message"].as_str().unwrap_or("").to_owned(),
    )
}

async fn call(fw: &Firewall, token: &str, sid: &str, method: &str, name: &str) -> (String, String) {
    let params = match method {
        "resources/read" => json!({"uri": name}),
        "tools/call" => json!({"name": name, "arguments": {}}),
        _ => json!({"name": name}),
    };
    outcome(&request(fw, token, sid, method, params).await)
}

#[allow(clippy::too_many_arguments)]
/// A 2026-07-28 request to `/mcp/<vs>`: `Mcp-Name` is `name` (none when
/// empty), `headers` replaced where `with` says.
async fn modern_post(
    fw: &Firewall,
    vs: &str,
    token: &str,
    method: &str,
    name: &str,
    id: u64,
    params: Value,
    with: &[(&str, &str)],
) -> common::Answer {
    let (headers, body) = crate::answer_path::modern(method, name, id, params);
    let mut h: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| !(k == "mcp-name" && name.is_empty()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for (k, v) in with {
        match h.iter_mut().find(|(hk, _)| hk == k) {
            Some(slot) => slot.1 = v,
            None => h.push((k, v)),
        }
    }
    common::post(&fw.mcp_url(vs), token, &h, &body).await
}

#[tokio::test]
async fn each_collision_mode_lists_and_routes_and_never_redirects_a_name() {
    for mode in ["prefix", "priority", "reject"] {
        let estate = Estate::new(Duration::ZERO).await;
        let fw = common::firewall(&estate.config(mode).text()).await;
        let all = token("vs-all");
        let sid = open(&fw, &all).await;
        let tools = listed(&fw, &all, &sid, "tools/list", "tools").await;
        let prompts = listed(&fw, &all, &sid, "prompts/list", "prompts").await;
        let uris = listed(&fw, &all, &sid, "resources/list", "resources").await;
        let (want_tools, want_prompts, want_uris) = match mode {
            "prefix" => (
                set(&[
                    "alpha__search",
                    "alpha__alpha_only",
                    "beta__search",
                    "beta__beta_only",
                    "beta__ask",
                    "beta__slow",
                    "gamma__gamma_only",
                ]),
                set(&["alpha__brief", "beta__brief"]),
                // A URI cannot be prefixed: two members' URI is ambiguous.
                set(&["file:///alpha.txt"]),
            ),
            "priority" => (
                set(&[
                    "search",
                    "alpha_only",
                    "beta_only",
                    "ask",
                    "slow",
                    "gamma_only",
                ]),
                set(&["brief"]),
                set(&["file:///shared.txt", "file:///alpha.txt"]),
            ),
            _ => (
                set(&["alpha_only", "beta_only", "ask", "slow", "gamma_only"]),
                set(&[]),
                set(&["file:///alpha.txt"]),
            ),
        };
        assert_eq!(tools, want_tools, "{mode}");
        assert_eq!(prompts, want_prompts, "{mode}");
        assert_eq!(uris, want_uris, "{mode}");

        // What each name reaches; the twin's member hears nothing.
        let twin = match mode {
            "prefix" => "beta__search",
            _ => "search",
        };
        let (text, error) = call(&fw, &all, &sid, "tools/call", twin).await;
        let (prompt_text, prompt_error) = call(
            &fw,
            &all,
            &sid,
            "prompts/get",
            if mode == "prefix" {
                "beta__brief"
            } else {
                "brief"
            },
        )
        .await;
        let (read_text, read_error) =
            call(&fw, &all, &sid, "resources/read", "file:///shared.txt").await;
        match mode {
            "prefix" => {
                assert_eq!(text, "beta:search", "{error}");
                assert_eq!(got(&estate.alpha, "tools/call", "search"), 0);
                assert_eq!(prompt_text, "beta:brief", "{prompt_error}");
                assert_eq!(got(&estate.alpha, "prompts/get", "brief"), 0);
                assert!(read_error.contains("ambiguous"), "{read_error}");
                // The bare name is nobody's.
                let (t, e) = call(&fw, &all, &sid, "tools/call", "search").await;
                assert!(t.is_empty() && e.contains("Unknown tool"), "{e}");
            }
            "priority" => {
                assert_eq!(text, "alpha:search", "{error}");
                assert_eq!(got(&estate.beta, "tools/call", "search"), 0);
                assert_eq!(prompt_text, "alpha:brief", "{prompt_error}");
                assert_eq!(got(&estate.beta, "prompts/get", "brief"), 0);
                assert_eq!(read_text, "alpha:file:///shared.txt", "{read_error}");
                assert_eq!(got(&estate.beta, "resources/read", "file:///shared.txt"), 0);
            }
            _ => {
                assert!(text.is_empty() && error.contains("ambiguous"), "{error}");
                assert!(prompt_error.contains("ambiguous"), "{prompt_error}");
                assert!(read_error.contains("ambiguous"), "{read_error}");
                for (_, up) in estate.members() {
                    assert_eq!(got(up, "tools/call", "search"), 0);
                    assert_eq!(got(up, "prompts/get", "brief"), 0);
                    assert_eq!(got(up, "resources/read", "file:///shared.txt"), 0);
                }
            }
        }
        let (t, e) = call(&fw, &all, &sid, "resources/read", "file:///alpha.txt").await;
        assert_eq!(t, "alpha:file:///alpha.txt", "{mode}: {e}");

        // A principal the policy hides alpha's search from.
        let narrow = token("vs-narrow");
        let nsid = open(&fw, &narrow).await;
        let ntools = listed(&fw, &narrow, &nsid, "tools/list", "tools").await;
        let before = (
            got(&estate.alpha, "tools/call", "search"),
            got(&estate.beta, "tools/call", "search"),
        );
        match mode {
            "prefix" => {
                let mut want = want_tools.clone();
                want.remove("alpha__search");
                assert_eq!(ntools, want);
                let (t, e) = call(&fw, &narrow, &nsid, "tools/call", "alpha__search").await;
                assert!(t.is_empty() && e.contains("Unknown tool"), "{e}");
            }
            "priority" => {
                // `search` is alpha's whoever asks: hidden, and refused,
                // never sent to beta's visible twin.
                let mut want = want_tools.clone();
                want.remove("search");
                assert_eq!(ntools, want);
                let (t, e) = call(&fw, &narrow, &nsid, "tools/call", "search").await;
                assert!(t.is_empty() && e.contains("Unknown tool"), "{e}");
            }
            _ => {
                assert_eq!(ntools, want_tools);
                let (_, e) = call(&fw, &narrow, &nsid, "tools/call", "search").await;
                assert!(e.contains("ambiguous"), "{e}");
            }
        }
        assert_eq!(
            (
                got(&estate.alpha, "tools/call", "search"),
                got(&estate.beta, "tools/call", "search"),
            ),
            before,
            "{mode}: nobody received the hidden twin's call"
        );
        // The dropped names are counted.
        let metrics = fw.metrics().await;
        let dropped_tools = match mode {
            "reject" => 2,
            "priority" => 1,
            _ => 0,
        };
        assert!(
            metrics.contains(&format!(
                r#"mcp_firewall_virtual_server_names_dropped{{virtual_server="ops",kind="tool"}} {dropped_tools}"#
            )),
            "{mode}: {metrics}"
        );
        fw.stop().await;
    }
}

#[tokio::test]
async fn a_members_request_is_answered_to_that_member_and_list_changed_reaches_the_client() {
    let estate = Estate::new(Duration::ZERO).await;
    let fw = common::firewall(&estate.config("prefix").text()).await;
    let all = token("vs-all");
    let sid = open(&fw, &all).await;
    let a = rpc(
        &fw,
        &all,
        &sid,
        &json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "beta__ask", "arguments": {}, "_meta": {"progressToken": "p-8"}}}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let events: Vec<Value> = a
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let ask = events
        .iter()
        .find(|e| e["method"] == "sampling/createMessage")
        .unwrap_or_else(|| panic!("{}", a.text));
    let id = ask["id"].as_str().unwrap().to_owned();
    assert!(
        id.starts_with("vr1."),
        "a sealed id, not the member's 91: {id}"
    );
    assert_eq!(
        events.last().unwrap()["result"]["content"][0]["text"],
        "beta:ask"
    );
    // The member's progress token is the client's own again.
    let beta_call = estate
        .beta
        .seen()
        .into_iter()
        .find(|s| s.rpc_method() == "tools/call")
        .unwrap();
    let sent: Value = serde_json::from_slice(&beta_call.body).unwrap();
    assert_eq!(sent["params"]["name"], "ask");
    assert_ne!(
        sent["params"]["_meta"]["progressToken"], "p-8",
        "sealed per member"
    );

    let answers = |up: &raw::RawUpstream| {
        up.seen()
            .iter()
            .filter(|s| {
                let v: Value = serde_json::from_slice(&s.body).unwrap_or_default();
                v.get("result").is_some() && v.get("method").is_none()
            })
            .count()
    };
    // Forged, the member's own and another principal's answers reach nobody.
    let other = common::other_token();
    let osid = {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "o", "version": "1"}}});
        let a = common::post(&fw.mcp_url("ops"), &other, &[], &init.to_string()).await;
        a.headers["mcp-session-id"].to_str().unwrap().to_owned()
    };
    let reply = |id: Value| json!({"jsonrpc": "2.0", "id": id, "result": {"role": "assistant", "content": {"type": "text", "text": "done"}, "model": "m"}});
    for (who, s, id) in [
        (&all, &sid, json!(91)),
        (
            &all,
            &sid,
            json!("vr1.local.eyJ4Ijo.AAAAAAAAAAAAAAAAAAAAAA"),
        ),
        (&other, &osid, json!(id)),
    ] {
        let a = rpc(&fw, who, s, &reply(id.clone())).await;
        assert_eq!(a.status, 400, "{id}: {}", a.text);
        assert!(a.text.contains("answers no request"), "{}", a.text);
    }
    for (_, up) in estate.members() {
        assert_eq!(answers(up), 0, "no member received a forged answer");
    }
    // The real answer: to beta only, with beta's own id.
    let a = rpc(&fw, &all, &sid, &reply(json!(id))).await;
    assert_eq!(a.status, 202, "{}", a.text);
    assert_eq!(answers(&estate.beta), 1);
    assert_eq!(answers(&estate.alpha) + answers(&estate.gamma), 0);
    let answered = estate
        .beta
        .seen()
        .into_iter()
        .rev()
        .find(|s| serde_json::from_slice::<Value>(&s.body).is_ok_and(|v| v.get("result").is_some()))
        .unwrap();
    let v: Value = serde_json::from_slice(&answered.body).unwrap();
    assert_eq!(v["id"], 91);
    assert_eq!(answered.headers["mcp-session-id"], "beta-session");

    // The GET stream: every member's, merged; list_changed passes.
    let a = common::send(
        reqwest::Method::GET,
        &fw.mcp_url("ops"),
        Some(&all),
        &[
            ("mcp-session-id", &sid),
            ("mcp-protocol-version", "2025-11-25"),
            ("accept", "text/event-stream"),
        ],
        None,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(
        a.text.matches("notifications/tools/list_changed").count(),
        3,
        "{}",
        a.text
    );
    for (_, up) in estate.members() {
        assert_eq!(up.count("GET", ""), 1, "each member's stream opened once");
    }
    // Another principal cannot use the session.
    let a = rpc(
        &fw,
        &other,
        &sid,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    .await;
    assert_eq!(a.status, 404, "{}", a.text);
    // DELETE ends every member's session.
    let a = common::send(
        reqwest::Method::DELETE,
        &fw.mcp_url("ops"),
        Some(&all),
        &[
            ("mcp-session-id", &sid),
            ("mcp-protocol-version", "2025-11-25"),
        ],
        None,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    for (_, up) in estate.members() {
        assert_eq!(up.count("DELETE", ""), 1);
    }
    fw.stop().await;
}

#[tokio::test]
async fn the_stateless_era_routes_by_the_exposed_name_and_rows_name_the_member() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let estate = Estate::new(Duration::ZERO).await;
    let fw = common::firewall(
        &estate
            .config("prefix")
            .audit("fw-vs", &ch.http_url, &db, spool.path())
            .text(),
    )
    .await;
    let all = token("vs-all");
    let call = json!({"name": "beta__search", "arguments": {}});
    let a = modern_post(
        &fw,
        "ops",
        &all,
        "tools/call",
        "beta__search",
        3,
        call.clone(),
        &[],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(outcome(&a.json()).0, "beta:search", "{}", a.text);
    let seen = estate
        .beta
        .seen()
        .into_iter()
        .find(|s| s.rpc_method() == "tools/call")
        .unwrap();
    assert_eq!(seen.headers["mcp-name"], "search", "the member's own name");
    assert!(seen.headers.get("mcp-session-id").is_none());
    assert_eq!(got(&estate.alpha, "tools/call", "search"), 0);
    // A body naming one tool and a header naming another: refused.
    let forged = [("mcp-name", "alpha__search")];
    let a = modern_post(
        &fw,
        "ops",
        &all,
        "tools/call",
        "beta__search",
        3,
        call,
        &forged,
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text);
    assert_eq!(got(&estate.alpha, "tools/call", "search"), 0);
    assert_eq!(got(&estate.beta, "tools/call", "search"), 1);
    // The merged list in the stateless era.
    let a = modern_post(&fw, "ops", &all, "tools/list", "", 4, json!({}), &[]).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(
        a.json()["result"]["tools"].as_array().map(Vec::len),
        Some(7),
        "{}",
        a.text
    );

    // A name no member exposes is refused by the virtual server itself,
    // and that is on record too (no member upstream).
    let call = json!({"name": "search", "arguments": {}});
    let a = modern_post(&fw, "ops", &all, "tools/call", "search", 6, call, &[]).await;
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Unknown tool"),
        "{}",
        a.text
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    for (sql, want) in [
        (format!("SELECT count() FROM {db}.audit_events FINAL WHERE virtual_server = 'ops' AND upstream = 'beta' AND tool = 'search' AND method = 'tools/call'"), "1"),
        (format!("SELECT count() FROM {db}.audit_events FINAL WHERE virtual_server = 'ops' AND upstream = '' AND tool = 'search' AND method = 'tools/call' AND decision = 'invalid' AND position(reason, 'Unknown tool') > 0"), "1"),
        // The member's rows of a plain upstream carry no virtual server.
        (format!("SELECT countIf(virtual_server = '') FROM {db}.audit_events FINAL WHERE method = 'tools/call' AND tool = 'search'"), "0"),
    ] {
        while ch.try_query(&sql).map(|t| t.trim().to_owned()) != Ok(want.to_owned()) {
            assert!(Instant::now() < deadline, "{sql}: {:?}", ch.try_query(&sql));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    fw.stop().await;
}

#[tokio::test]
async fn a_slow_member_is_left_out_of_the_page_and_a_down_member_is_on_readyz() {
    let estate = Estate::new(Duration::from_secs(5)).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}/mcp", closed.local_addr().unwrap());
    drop(closed);
    let fw = common::firewall(
        &TestConfig::new()
            .policies(estate.policy.path())
            .upstream("alpha", &estate.alpha.url())
            .upstream("beta", &estate.beta.url())
            .upstream("gamma", &estate.gamma.url())
            .upstream("delta", &down)
            .virtual_server("ops", &["alpha", "beta", "gamma", "delta"], "prefix")
            .virtual_server_set("list_timeout_ms", 500)
            .text(),
    )
    .await;
    let all = token("vs-all");
    let sid = open(&fw, &all).await;
    let started = Instant::now();
    let v = request(&fw, &all, &sid, "tools/list", json!({})).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "the list waited {took:?}");
    let names: BTreeSet<&str> = v["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains("alpha__search") && names.contains("beta__ask"),
        "{v}"
    );
    assert!(!names.iter().any(|n| n.starts_with("gamma__")), "{v}");
    // The late member is asked again on the next page.
    let cursor = v["result"]["nextCursor"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_owned();
    let before = estate.gamma.count("POST", "tools/list");
    let v = request(&fw, &all, &sid, "tools/list", json!({"cursor": cursor})).await;
    assert!(v["result"]["tools"].is_array(), "{v}");
    assert!(estate.gamma.count("POST", "tools/list") > before);
    // Another principal's cursor is not one.
    let other = token("vs-narrow");
    let osid = open(&fw, &other).await;
    let v = request(&fw, &other, &osid, "tools/list", json!({"cursor": cursor})).await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
    // The down member: the session works without it, /readyz names it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = reqwest::get(format!("{}/readyz", fw.admin)).await.unwrap();
        let text = r.text().await.unwrap();
        if text.contains("virtual_server_member_down") && text.contains("ops/delta") {
            assert!(!text.contains("ops/alpha"), "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = fw.metrics().await;
    assert!(
        metrics.contains(
            r#"mcp_firewall_virtual_server_member_up{virtual_server="ops",upstream="delta"} 0"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"mcp_firewall_virtual_server_late_members_total{virtual_server="ops",upstream="gamma"}"#),
        "{metrics}"
    );
    fw.stop().await;
}

#[tokio::test]
async fn check_and_explain_show_where_each_name_goes_and_what_is_left_out() {
    let estate = Estate::new(Duration::ZERO).await;
    for (mode, want, gone) in [
        (
            "reject",
            vec!["tool alpha_only -> alpha", "tool beta_only -> beta"],
            vec![
                "left out: tool search of alpha: \"search\" is ambiguous: alpha, beta expose it",
                "left out: prompt brief of beta: \"brief\" is ambiguous: alpha, beta expose it",
                "left out: resource file:///shared.txt of alpha",
            ],
        ),
        (
            "priority",
            vec!["tool search -> alpha", "prompt brief -> alpha"],
            vec![
                "left out: tool search of beta: \"search\" is alpha's, listed earlier in upstreams",
            ],
        ),
        (
            "prefix",
            vec![
                "tool alpha__search -> alpha search",
                "tool beta__search -> beta search",
            ],
            vec!["left out: resource file:///shared.txt of beta"],
        ),
    ] {
        let cfg = mcp_firewall::config::load_str(
            &estate.config(mode).text(),
            std::path::Path::new("t.toml"),
            std::path::Path::new("."),
            &|_| None,
        )
        .unwrap();
        let out = mcp_firewall::cli::check_virtual_servers(&cfg).await;
        assert!(
            out.contains(&format!(
                "virtual server ops (/mcp/ops): collisions = {mode}, members: alpha, beta, gamma"
            )),
            "{out}"
        );
        for line in want.iter().chain(&gone) {
            assert!(out.contains(line), "{mode}: {line:?} in\n{out}");
        }
        let claims = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            claims.path(),
            json!({"sub": "alice", "tenant_id": "acme", "agent": "vs-narrow", "run_id": "r", "mode": "caller", "projects": ["sre"]}).to_string(),
        )
        .unwrap();
        let name = if mode == "prefix" {
            "alpha__search"
        } else {
            "search"
        };
        let out = mcp_firewall::cli::explain(
            &cfg,
            mcp_firewall::cli::ExplainArgs {
                token: None,
                claims: Some(claims.path()),
                upstream: "ops",
                tool: name,
                arguments: None,
                labels: Some(""),
            },
        )
        .await
        .unwrap();
        match mode {
            "reject" => assert!(
                out.contains("is left out (\"search\" is ambiguous"),
                "{out}"
            ),
            // The name reaches alpha's search, which the policy denies the
            // narrow role: never beta's.
            _ => {
                assert!(
                    out.contains(&format!("tool {name:?} reaches member alpha as \"search\"")),
                    "{out}"
                );
                assert!(out.contains("decision: Unknown(Denied)"), "{out}");
                assert!(
                    out.contains("hidden: a deny rule of the role matches"),
                    "{out}"
                );
            }
        }
    }
    // The firewall's own listings left no client call on any member.
    for (_, up) in estate.members() {
        assert_eq!(up.count("POST", "tools/call"), 0);
    }
}

#[tokio::test]
async fn a_cancellation_reaches_the_member_its_call_went_to_and_steps_count_across_members() {
    let estate = Estate::new(Duration::ZERO).await;
    let fw = common::firewall(&estate.config("prefix").text()).await;
    let all = token("vs-all");
    let sid = open(&fw, &all).await;
    let call = json!({"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {"name": "beta__slow", "arguments": {}}});
    let pending = {
        let (url, all, sid) = (fw.mcp_url("ops"), all.clone(), sid.clone());
        tokio::spawn(async move {
            common::post(
                &url,
                &all,
                &[
                    ("mcp-session-id", &sid),
                    ("mcp-protocol-version", "2025-11-25"),
                ],
                &call.to_string(),
            )
            .await
        })
    };
    // Once beta has the call, the client cancels it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while got(&estate.beta, "tools/call", "slow") == 0 {
        assert!(Instant::now() < deadline, "the call never reached beta");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 77, "reason": "changed my mind"}});
    let a = rpc(&fw, &all, &sid, &cancel).await;
    assert_eq!(a.status, 202, "{}", a.text);
    let cancelled = |up: &raw::RawUpstream| {
        up.seen()
            .iter()
            .filter(|s| s.rpc_method() == "notifications/cancelled")
            .map(|s| serde_json::from_slice::<Value>(&s.body).unwrap())
            .collect::<Vec<_>>()
    };
    let to_beta = cancelled(&estate.beta);
    assert_eq!(to_beta.len(), 1, "{to_beta:?}");
    assert_eq!(to_beta[0]["params"]["requestId"], 77);
    assert!(cancelled(&estate.alpha).is_empty() && cancelled(&estate.gamma).is_empty());
    let _ = pending.await;
    // A cancellation of a request that is not in flight goes nowhere.
    let a = rpc(&fw, &all, &sid, &cancel).await;
    assert_eq!(a.status, 202);
    assert_eq!(cancelled(&estate.beta).len(), 1);

    // The run's step cap counts calls on every member.
    let capped = token("vs-capped");
    let csid = open(&fw, &capped).await;
    let mut results = Vec::new();
    for name in ["alpha__alpha_only", "beta__beta_only", "gamma__gamma_only"] {
        let v = request(
            &fw,
            &capped,
            &csid,
            "tools/call",
            json!({"name": name, "arguments": {}}),
        )
        .await;
        results.push(v);
    }
    assert_eq!(outcome(&results[0]).0, "alpha:alpha_only");
    assert_eq!(outcome(&results[1]).0, "beta:beta_only");
    assert_eq!(
        results[2]["result"]["structuredContent"]["skipped"], true,
        "{}",
        results[2]
    );
    assert_eq!(got(&estate.gamma, "tools/call", "gamma_only"), 0);
    fw.stop().await;
}

#[tokio::test]
async fn discovery_speaks_for_every_member_and_a_subscription_stream_merges_them() {
    let estate = Estate::new(Duration::ZERO).await;
    let fw = common::firewall(
        &estate
            .config("prefix")
            .virtual_server("pair", &["alpha", "beta"], "prefix")
            .text(),
    )
    .await;
    let all = token("vs-all");
    let post = |vs: &'static str, method: &'static str, id: u64| {
        modern_post(&fw, vs, &all, method, "", id, json!({}), &[])
    };
    // gamma only speaks the session era: the virtual server does not offer
    // 2026-07-28 on its behalf; the client falls back to initialize.
    let a = post("ops", "server/discover", 1).await;
    assert_eq!(a.status, 400, "{}", a.text);
    assert!(a.text.contains("Server not initialized"), "{}", a.text);
    // alpha and beta both do: the revisions both support, the virtual
    // server's identity, every member's capabilities.
    let a = post("pair", "server/discover", 2).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let r = &a.json()["result"];
    assert_eq!(r["supportedVersions"], json!(["2026-07-28"]), "{r}");
    assert_eq!(
        r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "pair",
        "{r}"
    );
    assert_eq!(r["capabilities"]["tools"]["listChanged"], true, "{r}");
    assert!(r.get("serverInfo").is_none(), "{r}");

    let a = post("pair", "subscriptions/listen", 3).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let events: Vec<Value> = a
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let updated: BTreeSet<&str> = events
        .iter()
        .filter(|e| e["method"] == "notifications/resources/updated")
        .map(|e| e["params"]["uri"].as_str().unwrap())
        .collect();
    assert_eq!(
        updated,
        set(&["file:///alpha.txt", "file:///beta.txt"])
            .iter()
            .map(String::as_str)
            .collect()
    );
    let answers: Vec<&Value> = events
        .iter()
        .filter(|e| e.get("method").is_none())
        .collect();
    assert_eq!(answers.len(), 1, "one answer, at the end: {}", a.text);
    assert_eq!(answers[0]["id"], 3);
    assert_eq!(events.last().unwrap()["id"], 3);
    assert_eq!(estate.gamma.count("POST", "subscriptions/listen"), 0);
    fw.stop().await;
}

#[tokio::test]
async fn merged_instructions_keep_each_members_name_when_one_is_out_of_reach() {
    let estate = Estate::new(Duration::ZERO).await;
    // alpha is in another project: this run reaches beta and gamma only.
    let fw = common::firewall(
        &estate
            .config("prefix")
            .upstream_set("alpha", "projects", vec!["finance"])
            .text(),
    )
    .await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}});
    let a = common::post(&fw.mcp_url("ops"), &token("vs-all"), &[], &init.to_string()).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let instructions = a.json()["result"]["instructions"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", a.text))
        .to_owned();
    assert_eq!(
        instructions,
        "beta: beta's own instructions\n\ngamma: gamma's own instructions"
    );
    assert_eq!(
        estate.alpha.count("POST", "initialize"),
        0,
        "alpha was not opened"
    );
    fw.stop().await;
}
