//! Calls held for approval behave like any other call: after approval they
//! pass the same inspection (server-to-client requests, upstream failures,
//! reported cost, budgets), a cancelled call never runs, a multi-round
//! (2026-07-28) retry stays bound to its approval, progress keeps
//! increasing, and an approval is one caller's. The upstream records every
//! request, so "never ran" means it received nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::common::{self, raw, Firewall};
use mcp_firewall::approval::{Approval, Approver, Status};

const RESTART: &str = r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"restart_service","arguments":{"service":"db"},"_meta":{"progressToken":"p-1"}}}"#;
const LIST: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;

/// A firewall with approvals in front of `up`, with the
/// shipped policies plus `policy` files.
async fn start(up: &raw::RawUpstream, policy: &[(&str, &str)]) -> (Firewall, tempfile::TempDir) {
    start_with(up, policy, |c| c).await
}

/// [`start`], with `extra` applied to the config.
async fn start_with(
    up: &raw::RawUpstream,
    policy: &[(&str, &str)],
    extra: impl FnOnce(common::TestConfig) -> common::TestConfig,
) -> (Firewall, tempfile::TempDir) {
    let dir = common::policy_dir(policy);
    let store = tempfile::tempdir().unwrap();
    let text = extra(
        common::TestConfig::new()
            .policies(dir.path())
            .upstream("incidents", &up.url())
            .set("approvals.store_dir", common::toml_path(store.path()))
            .set("approvals.hold_s", 20)
            .set("approvals.expiry_s", 60)
            .set("approvals.progress_interval_s", 1),
    )
    .text();
    let fw = common::firewall(&text).await;
    // Keep the policy dir alive with the store.
    std::mem::forget(dir);
    (fw, store)
}

fn url(fw: &Firewall) -> String {
    fw.mcp_url("incidents")
}

/// Waits for the one pending approval of tenant `acme`.
async fn pending(fw: &Firewall) -> Approval {
    let approvals = fw
        .running
        .state
        .approvals
        .clone()
        .expect("approvals configured");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(a) = approvals
            .list("acme", Some(Status::Pending))
            .await
            .unwrap()
            .into_iter()
            .next()
        {
            return a;
        }
        assert!(Instant::now() < deadline, "no approval was requested");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn approve(fw: &Firewall, a: &Approval) -> Result<Approval, String> {
    let approvals = fw.running.state.approvals.clone().expect("approvals");
    approvals
        .decide(
            "acme",
            a.id.as_str(),
            &Approver {
                subject: "bob".into(),
                tenant: "acme".into(),
                scopes: vec!["approvals".into()],
            },
            true,
            "ok",
        )
        .await
        .map_err(|e| e.to_string())
}

async fn status(fw: &Firewall, a: &Approval) -> Status {
    let approvals = fw.running.state.approvals.clone().expect("approvals");
    approvals
        .get("acme", a.id.as_str())
        .await
        .ok()
        .flatten()
        .expect("known")
        .status
}

/// Starts a held POST; the stream's text is collected by the task.
fn held(
    fw: &Firewall,
    token: &str,
    headers: &[(&'static str, String)],
    body: &str,
) -> tokio::task::JoinHandle<String> {
    held_live(fw, token, headers, body).0
}

/// [`held`], plus the text received so far, updated chunk by chunk.
fn held_live(
    fw: &Firewall,
    token: &str,
    headers: &[(&'static str, String)],
    body: &str,
) -> (
    tokio::task::JoinHandle<String>,
    tokio::sync::watch::Receiver<String>,
) {
    let mut req = common::http()
        .post(url(fw))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, v.clone());
    }
    let (seen, live) = tokio::sync::watch::channel(String::new());
    let task = tokio::spawn(async move {
        let resp = req.send().await.expect("sent");
        let mut text = String::new();
        let mut s = resp.bytes_stream();
        while let Some(Ok(chunk)) = s.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            seen.send_replace(text.clone());
        }
        text
    });
    (task, live)
}

/// Waits until `fw` holds exactly `n` calls (a hold registers once its
/// stream starts, and leaves once the firewall has seen it end).
async fn holding(fw: &Firewall, n: usize, what: &str) {
    common::wait_until(what, Duration::from_secs(10), || {
        fw.running.state.holds.len() == n
    })
    .await;
}

/// The JSON data of each SSE event of `text`.
fn events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// A recording upstream whose `restart_service` answers with `answer`.
async fn upstream_answering(
    answer: impl Fn(&raw::Seen) -> http::Response<raw::RawBody> + Send + Sync + 'static,
) -> raw::RawUpstream {
    let answer = Arc::new(answer);
    raw::upstream(move |seen| {
        let answer = answer.clone();
        async move {
            let v: Value = serde_json::from_slice(&seen.body).unwrap_or_default();
            if v["params"]["name"] == "restart_service" {
                answer(&seen)
            } else {
                raw::mcp_answer(&seen)
            }
        }
    })
    .await
}

fn sse_of(messages: &[Value]) -> http::Response<raw::RawBody> {
    let chunks = messages
        .iter()
        .map(|m| bytes::Bytes::from(format!("data: {m}\n\n")))
        .collect();
    raw::sse(chunks, Duration::from_millis(20), false)
}

#[tokio::test]
async fn an_approved_call_passes_the_same_inspection_as_any_other() {
    let up = upstream_answering(|_| {
        sse_of(&[
            json!({"jsonrpc":"2.0","id":99,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":5}}),
            json!({"jsonrpc":"2.0","id":11,"result":{"content":[{"type":"text","text":"restarted"}],"_meta":{"mcp-firewall/cost":3.0}}}),
        ])
    })
    .await;
    let no_sampling = "[server_requests]\nsampling = false\nelicitation = true\nroots = false\n";
    let dir = common::policy_dir(&[]);
    std::fs::write(
        dir.path().join("00-gates.toml"),
        format!("[gates]\nread = \"allow\"\nwrite = \"approve\"\ndestructive = \"approve\"\n{no_sampling}"),
    )
    .unwrap();
    let store = tempfile::tempdir().unwrap();
    let text = common::TestConfig::new()
        .policies(dir.path())
        .upstream("incidents", &up.url())
        .set("approvals.store_dir", common::toml_path(store.path()))
        .set("approvals.hold_s", 20)
        .set("approvals.progress_interval_s", 1)
        .text();
    let fw = common::firewall(&text).await;
    let claims = common::claims("sre-lead", &["sre"]);
    let token = common::sign(&claims);
    common::post(&url(&fw), &token, &[], LIST).await;
    let stream = held(&fw, &token, &[], RESTART);
    let a = pending(&fw).await;
    assert_eq!(
        up.count("POST", "tools/call"),
        0,
        "nothing ran before approval"
    );
    approve(&fw, &a).await.unwrap();
    let text = tokio::time::timeout(Duration::from_secs(10), stream)
        .await
        .expect("the held stream ends")
        .unwrap();
    assert!(
        !text.contains("sampling/createMessage"),
        "a refused server request reached the client: {text}"
    );
    let last = events(&text).pop().expect("an answer");
    assert_eq!(last["result"]["content"][0]["text"], "restarted", "{text}");
    // The upstream got the refusal in the client's place.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !up.seen().iter().any(|s| {
        let v: Value = serde_json::from_slice(&s.body).unwrap_or_default();
        v["id"] == 99 && v["error"]["code"] == -32601
    }) {
        assert!(Instant::now() < deadline, "no refusal sent upstream");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The reported cost settled the run's budget.
    let budgets = &fw.running.state.budgets;
    assert_eq!(budgets.local().cost("acme", &claims.run_id), 3.0);
    assert_eq!(status(&fw, &a).await, Status::Consumed);
    fw.stop().await;
}

#[tokio::test]
async fn an_approved_call_whose_upstream_fails_answers_with_the_upstream_error() {
    let up = upstream_answering(|_| raw::full(503, "text/plain", "down")).await;
    let (fw, _store) = start(&up, &[]).await;
    let token = common::token();
    common::post(&url(&fw), &token, &[], LIST).await;
    let stream = held(&fw, &token, &[], RESTART);
    let a = pending(&fw).await;
    approve(&fw, &a).await.unwrap();
    let text = stream.await.unwrap();
    let last = events(&text).pop().expect("an answer");
    assert_eq!(last["id"], 11);
    assert_eq!(last["error"]["code"], -31004, "{text}");
    assert_eq!(last["error"]["data"]["stop_reason"], "upstream_error");
    fw.stop().await;
}

#[tokio::test]
async fn a_budget_that_refuses_after_approval_answers_with_the_skipped_result() {
    let up = raw::mcp().await;
    let capped = "[[agents]]\nname = \"capped\"\nprojects = [\"sre\"]\nrisks = [\"read\", \"write\", \"destructive\"]\nallow = [{}]\nmax_steps = 1\n";
    let (fw, _store) = start(&up, &[("90-capped.toml", capped)]).await;
    let token = common::sign(&common::claims("capped", &["sre"]));
    common::post(&url(&fw), &token, &[], LIST).await;
    let stream = held(&fw, &token, &[], RESTART);
    let a = pending(&fw).await;
    // The run's one step goes to a read while the call waits.
    let r = common::post(
        &url(&fw),
        &token,
        &[],
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_incident","arguments":{"incident_id":"INC-1"}}}"#,
    )
    .await;
    assert!(r.json()["result"].is_object(), "{}", r.text);
    approve(&fw, &a).await.unwrap();
    let text = stream.await.unwrap();
    let last = events(&text).pop().expect("an answer");
    assert_eq!(last["result"]["isError"], true, "{text}");
    assert_eq!(
        last["result"]["structuredContent"]["stop_reason"],
        "step_cap"
    );
    assert_eq!(up.count("POST", "tools/call"), 1, "only the read ran");
    fw.stop().await;
}

#[tokio::test]
async fn cancelling_a_held_call_withdraws_its_approval_and_it_never_runs() {
    let up = raw::mcp().await;
    let (fw, _store) = start(&up, &[]).await;
    let token = common::token();
    let init = common::post(
        &url(&fw),
        &token,
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    )
    .await;
    let sid = init.headers["mcp-session-id"].to_str().unwrap().to_owned();
    let session = vec![
        ("mcp-session-id", sid.clone()),
        ("mcp-protocol-version", "2025-11-25".to_owned()),
    ];
    let h: Vec<(&str, &str)> = session.iter().map(|(k, v)| (*k, v.as_str())).collect();
    common::post(&url(&fw), &token, &h, LIST).await;
    let stream = held(&fw, &token, &session, RESTART);
    let a = pending(&fw).await;
    // The approval is filed a moment before the hold registers (a cancel in
    // between is `proxy::holds`' unit test's): wait for the hold, so that the cancel
    // below is matched here, not forwarded.
    let holds = fw.running.state.holds.clone();
    common::wait_until("the call is held", Duration::from_secs(5), || {
        holds.len() == 1
    })
    .await;
    // Another principal's cancel, or another id, cancels nothing.
    let cancel = |id: u64| {
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id},"reason":"timeout"}}}}"#
        )
    };
    let r = common::post(&url(&fw), &token, &h, &cancel(12)).await;
    assert_eq!(r.status, 202);
    assert_eq!(status(&fw, &a).await, Status::Pending);
    let r = common::post(&url(&fw), &token, &h, &cancel(11)).await;
    assert_eq!(r.status, 202, "{}", r.text);
    let text = tokio::time::timeout(Duration::from_secs(5), stream)
        .await
        .expect("the held stream ends on cancel")
        .unwrap();
    assert!(
        events(&text).iter().all(|e| e.get("id").is_none()),
        "no answer after a cancel: {text}"
    );
    assert_eq!(status(&fw, &a).await, Status::Withdrawn);
    assert!(
        approve(&fw, &a).await.is_err(),
        "a withdrawn approval cannot be approved"
    );
    // The matched cancel was the firewall's to handle; the upstream never
    // heard of the held call.
    assert_eq!(up.count("POST", "tools/call"), 0);
    assert_eq!(
        up.count("POST", "notifications/cancelled"),
        1,
        "only the unmatched one: {:?}",
        up.seen()
            .iter()
            .filter(|s| s.rpc_method() == "notifications/cancelled")
            .map(|s| String::from_utf8_lossy(&s.body).into_owned())
            .collect::<Vec<_>>()
    );
    fw.stop().await;
}

#[tokio::test]
async fn closing_the_stream_cancels_on_2026_07_28_but_not_on_session_revisions() {
    let up = raw::mcp().await;
    let (fw, _store) = start(&up, &[]).await;
    let token = common::token();
    common::post(&url(&fw), &token, &[], LIST).await;
    let body_2026 = r#"{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"restart_service","arguments":{"service":"db"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
    let stateless = vec![
        ("mcp-protocol-version", "2026-07-28".to_owned()),
        ("mcp-method", "tools/call".to_owned()),
        ("mcp-name", "restart_service".to_owned()),
        ("mcp-param-service", "db".to_owned()),
    ];
    let stream = held(&fw, &token, &stateless, body_2026);
    let a = pending(&fw).await;
    stream.abort();
    let deadline = Instant::now() + Duration::from_secs(5);
    while status(&fw, &a).await != Status::Withdrawn {
        assert!(
            Instant::now() < deadline,
            "closing a 2026-07-28 stream withdraws its approval"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A session revision's disconnect is not a cancel: the approval stays
    // for the retry.
    let stream = held(&fw, &token, &[], RESTART);
    let b = pending(&fw).await;
    holding(&fw, 1, "the session call is held").await;
    stream.abort();
    // The firewall has seen the stream close once the hold is released, and
    // a hold withdraws (if it does) before it is released.
    holding(&fw, 0, "the closed stream is released").await;
    assert_eq!(status(&fw, &b).await, Status::Pending);
    assert_eq!(up.count("POST", "tools/call"), 0);
    fw.stop().await;
}

#[tokio::test]
async fn a_multi_round_call_stays_bound_to_its_approval() {
    multi_round_bound(
        r#"{"service":"db"}"#,
        (r#""service":"db""#, r#""service":"api""#),
    )
    .await;
}

/// Integers a double cannot hold: an approval for one id never runs a call
/// on its neighbour, though RFC 8785 prints both alike.
#[tokio::test]
async fn a_multi_round_call_stays_bound_to_its_exact_large_integers() {
    multi_round_bound(
        r#"{"service":"db","replicas":9007199254740993}"#,
        ("9007199254740993", "9007199254740992"),
    )
    .await;
}

/// A gated 2026-07-28 call with `args` is approved, answers `input_required`,
/// and its retry runs under the same approval; the retry tampered, from
/// another caller, or with `other` (a text replacement) applied to its
/// arguments is refused and never reaches the upstream.
async fn multi_round_bound(args: &str, other: (&str, &str)) {
    let up = upstream_answering(|seen| {
        let v: Value = serde_json::from_slice(&seen.body).unwrap_or_default();
        let result = if v["params"]["requestState"] == "up-state-1" {
            json!({"content": [{"type": "text", "text": "restarted"}], "resultType": "complete"})
        } else {
            json!({
                "resultType": "input_required",
                "inputRequests": {"confirm": {"method": "elicitation/create", "params": {"message": "sure?", "requestedSchema": {"type": "object"}}}},
                "requestState": "up-state-1",
            })
        };
        raw::full(
            200,
            "application/json",
            json!({"jsonrpc": "2.0", "id": v["id"], "result": result}).to_string(),
        )
    })
    .await;
    // Rows stay in the spool (nothing listens at that ClickHouse).
    let spool = tempfile::tempdir().unwrap();
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let (fw, _store) = start_with(&up, &[], |c| {
        c.audit("fw-holds", &dead, "mcp_firewall", spool.path())
    })
    .await;
    let token = common::token();
    common::post(&url(&fw), &token, &[], LIST).await;
    let call = |id: u64, extra: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"restart_service","arguments":{args}{extra},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}}}}"#
        )
    };
    let headers = vec![
        ("mcp-protocol-version", "2026-07-28".to_owned()),
        ("mcp-method", "tools/call".to_owned()),
        ("mcp-name", "restart_service".to_owned()),
        ("mcp-param-service", "db".to_owned()),
    ];
    let stream = held(&fw, &token, &headers, &call(31, ""));
    let a = pending(&fw).await;
    let approved = approve(&fw, &a).await.unwrap();
    let text = stream.await.unwrap();
    let first = events(&text).pop().expect("an answer");
    assert_eq!(first["result"]["resultType"], "input_required", "{text}");
    let state = first["result"]["requestState"].as_str().unwrap().to_owned();
    assert!(
        state.starts_with("r1."),
        "the firewall sealed the approval in: {state}"
    );
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let state_json = Value::String(state.clone()).to_string();
    // The retry runs under the same approval: no new one, the upstream gets
    // its own state back.
    let retry = call(
        32,
        &format!(
            r#","inputResponses":{{"confirm":{{"action":"accept","content":{{}}}}}},"requestState":{state_json}"#
        ),
    );
    let before = up.count("POST", "tools/call");
    // Sent twice at once: the state releases one execution, so exactly one
    // of the two runs and the other is refused as already used.
    let u = url(&fw);
    let (r1, r2) = tokio::join!(
        common::post(&u, &token, &h, &retry),
        common::post(&u, &token, &h, &retry)
    );
    let (r, refused) = if r1.text.contains("restarted") {
        (r1, r2)
    } else {
        (r2, r1)
    };
    assert_eq!(
        r.json()["result"]["content"][0]["text"],
        "restarted",
        "{}",
        r.text
    );
    assert_eq!(refused.json()["error"]["code"], -32602, "{}", refused.text);
    assert!(refused.text.contains("already used"), "{}", refused.text);
    assert_eq!(
        up.count("POST", "tools/call"),
        before + 1,
        "the approved round ran exactly once"
    );
    let last = up.seen().last().cloned().unwrap();
    let sent: Value = serde_json::from_slice(&last.body).unwrap();
    assert_eq!(sent["params"]["requestState"], "up-state-1");
    let want: Value = serde_json::from_str(args).unwrap();
    assert_eq!(
        sent["params"]["arguments"], want,
        "the arguments as approved"
    );
    let approvals = fw.running.state.approvals.clone().unwrap();
    assert!(
        approvals
            .list("acme", Some(Status::Pending))
            .await
            .unwrap()
            .is_empty(),
        "no second approval"
    );
    let runs = up.count("POST", "tools/call");
    // Tampered, or for other arguments, or another caller's: refused.
    let tampered = format!("{}x", &state[..state.len() - 1]);
    let other_args = retry.replace(other.0, other.1);
    assert_ne!(other_args, retry);
    for (tok, body) in [
        (token.clone(), retry.replace(&state, &tampered)),
        (token.clone(), other_args),
        (common::other_token(), retry.clone()),
    ] {
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| {
                (
                    *k,
                    if *k == "mcp-param-service" && body.contains("api") {
                        "api"
                    } else {
                        v.as_str()
                    },
                )
            })
            .collect();
        let r = common::post(&url(&fw), &tok, &h, &body).await;
        assert!(
            r.text.contains("requestState") && r.json()["error"]["code"] == -32602,
            "{}",
            r.text
        );
    }
    assert_eq!(up.count("POST", "tools/call"), runs, "no refused retry ran");
    // Replayed later, once more: the round already ran; nothing is sent.
    let r = common::post(&url(&fw), &token, &h, &retry).await;
    assert_eq!(r.json()["error"]["code"], -32602, "{}", r.text);
    assert!(r.text.contains("already used"), "{}", r.text);
    assert_eq!(
        up.count("POST", "tools/call"),
        runs,
        "the replay did not run"
    );
    // Both rounds are on record under the approval: which one, who gave
    // it and when (the retry's from its sealed state).
    let at = approved.decision.as_ref().unwrap().at_ms;
    let rows = mcp_firewall::cli::audit::spool_rows(spool.path(), 0).unwrap();
    let ran: Vec<_> = rows
        .iter()
        .filter(|r| {
            r["tool"] == "restart_service" && r["decision"] == "allow" && r["row_version"] == 1
        })
        .collect();
    assert_eq!(ran.len(), 2, "{rows:#?}");
    for r in ran {
        assert_eq!(r["approval_id"], a.id.as_str(), "{r:?}");
        assert_eq!(r["approver"], "bob");
        assert_eq!(r["approved_ms"], at);
    }
    fw.stop().await;
}

#[tokio::test]
async fn progress_keeps_increasing_across_the_hold() {
    let up = upstream_answering(|_| {
        sse_of(&[
            json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p-1","progress":0,"total":2}}),
            json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p-1","progress":1,"total":2}}),
            json!({"jsonrpc":"2.0","id":11,"result":{"content":[]}}),
        ])
    })
    .await;
    let (fw, _store) = start(&up, &[]).await;
    let token = common::token();
    common::post(&url(&fw), &token, &[], LIST).await;
    let (stream, mut live) = held_live(&fw, &token, &[], RESTART);
    let a = pending(&fw).await;
    // The hold sends two progress notifications of its own first.
    tokio::time::timeout(
        Duration::from_secs(10),
        live.wait_for(|text| {
            events(text)
                .iter()
                .filter(|e| e["method"] == "notifications/progress")
                .count()
                >= 2
        }),
    )
    .await
    .expect("the hold sends progress while it waits")
    .expect("the stream is open");
    approve(&fw, &a).await.unwrap();
    let text = stream.await.unwrap();
    let progress: Vec<f64> = events(&text)
        .iter()
        .filter(|e| e["method"] == "notifications/progress")
        .map(|e| e["params"]["progress"].as_f64().unwrap())
        .collect();
    assert!(progress.len() >= 4, "hold and upstream progress: {text}");
    assert!(
        progress.windows(2).all(|w| w[0] < w[1]),
        "progress must increase: {progress:?}"
    );
    fw.stop().await;
}

#[tokio::test]
async fn an_approval_is_for_one_caller_of_the_run() {
    let up = raw::mcp().await;
    let (fw, _store) = start(&up, &[]).await;
    let alice = common::claims("sre-lead", &["sre"]);
    let mut bob = alice.clone();
    bob.sub = "carol".into();
    let (alice, bob) = (common::sign(&alice), common::sign(&bob));
    common::post(&url(&fw), &alice, &[], LIST).await;
    // Alice's call, approved and not yet run (she was not holding).
    let r = json_only(&fw, &alice).await;
    assert_eq!(r["error"]["code"], -31002, "{r}");
    let a = pending(&fw).await;
    approve(&fw, &a).await.unwrap();
    // Carol's identical call in the same run does not use Alice's approval.
    let r = json_only(&fw, &bob).await;
    assert_eq!(r["error"]["code"], -31002, "{r}");
    assert_ne!(
        r["error"]["data"]["approval_id"],
        a.id.as_str(),
        "a new approval for Carol"
    );
    assert_eq!(up.count("POST", "tools/call"), 0);
    assert_eq!(status(&fw, &a).await, Status::Approved);
    fw.stop().await;
}

/// The restart call from a client that accepts JSON only (it cannot be held).
async fn json_only(fw: &Firewall, token: &str) -> Value {
    common::http()
        .post(url(fw))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(RESTART)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A held call takes its upstream credential when it is released, not
/// when it was held: with a token exchanged for its run then; with none
/// (the identity provider refuses by then), `-31007` and nothing runs.
#[tokio::test]
async fn a_released_call_reaches_its_upstream_with_the_runs_exchanged_token_or_not_at_all() {
    let up = upstream_answering(raw::mcp_answer).await;
    let idp = crate::credentials::provider(300).await;
    let secret = tempfile::tempdir().unwrap();
    let secret_file = crate::credentials::secret_file(secret.path());
    let (fw, _store) = start_with(&up, &[], |c| {
        c.upstream_set("incidents", "auth", "token_exchange")
            .upstream_set(
                "incidents",
                "token_exchange",
                crate::credentials::exchange_section(&idp.token_endpoint, &secret_file),
            )
    })
    .await;
    let jwks = idp.public_jwks().await;
    let claims = common::claims("sre-lead", &["sre"]);
    let token = common::sign(&claims);
    common::post(&url(&fw), &token, &[], LIST).await;
    let stream = held(&fw, &token, &[], RESTART);
    let a = pending(&fw).await;
    assert_eq!(
        up.count("POST", "tools/call"),
        0,
        "nothing ran before approval"
    );
    approve(&fw, &a).await.unwrap();
    let (text, last) = released(stream).await;
    assert!(last.get("result").is_some(), "{text}");
    let ran: Vec<raw::Seen> = up
        .seen()
        .into_iter()
        .filter(|s| s.rpc_method() == "tools/call")
        .collect();
    assert_eq!(ran.len(), 1);
    let bearer = ran[0].headers["authorization"]
        .to_str()
        .unwrap()
        .strip_prefix("Bearer ")
        .unwrap()
        .to_owned();
    let c = crate::common::idp::verify(&bearer, &jwks, "tickets");
    assert_eq!(c["run_id"], claims.run_id.as_str(), "{c}");
    assert_eq!(c["act"]["sub"], "mcp-firewall", "{c}");

    // Held again in another run; the provider refuses by the release.
    let token = common::sign(&common::claims("sre-lead", &["sre"]));
    let stream = held(&fw, &token, &[], RESTART);
    let a = pending(&fw).await;
    idp.set_mode("refuse").await;
    approve(&fw, &a).await.unwrap();
    let (text, last) = released(stream).await;
    assert_eq!(last["id"], 11, "{text}");
    assert_eq!(last["error"]["code"], -31007, "{text}");
    assert_eq!(
        up.count("POST", "tools/call"),
        1,
        "the refused release sent nothing"
    );
    fw.stop().await;
}

/// The text of a held call's stream once it ends, and its last event.
async fn released(stream: tokio::task::JoinHandle<String>) -> (String, Value) {
    let text = tokio::time::timeout(Duration::from_secs(10), stream)
        .await
        .expect("the held stream ends")
        .unwrap();
    let last = events(&text).pop().expect("an answer");
    (text, last)
}
