//! Hostile input against the request path, each case in front of an upstream
//! that records every request it receives: the attempt is refused with a
//! specific answer, and the upstream received nothing of it.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{self, raw, Firewall, TestConfig};

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
const LIST: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
const CALL: &str = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_incident","arguments":{"incident_id":"INC-1"}}}"#;
const V1125: (&str, &str) = ("mcp-protocol-version", "2025-11-25");

/// A firewall (with `extra` config) in front of a recording MCP upstream
/// named `incidents`.
async fn setup(extra: impl FnOnce(TestConfig) -> TestConfig) -> (Firewall, raw::RawUpstream) {
    let up = raw::mcp().await;
    let fw = firewall_for(&up, extra).await;
    (fw, up)
}

async fn firewall_for(
    up: &raw::RawUpstream,
    extra: impl FnOnce(TestConfig) -> TestConfig,
) -> Firewall {
    common::firewall(&extra(TestConfig::new().upstream("incidents", &up.url())).text()).await
}

fn url(fw: &Firewall) -> String {
    fw.mcp_url("incidents")
}

/// Opens a session as the holder of `token`: the sealed id it got.
async fn session(fw: &Firewall, token: &str) -> String {
    let a = common::post(&url(fw), token, &[], INIT).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let sealed = a
        .headers
        .get("mcp-session-id")
        .expect("a session id")
        .to_str()
        .unwrap()
        .to_owned();
    assert!(sealed.starts_with("s1."), "{sealed}");
    assert!(
        !sealed.contains(raw::UPSTREAM_SESSION),
        "the upstream's id is not shown as it is"
    );
    sealed
}

// --- 1. sessions are bound to the principal -------------------------------

#[tokio::test]
async fn another_principals_session_is_unknown_on_post_get_and_delete() {
    let (fw, up) = setup(|c| c).await;
    let alice = common::token();
    let sid = session(&fw, &alice).await;
    // Alice's own calls run in her session, with the upstream's own id.
    let a = common::post(&url(&fw), &alice, &[("mcp-session-id", &sid), V1125], LIST).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let last = up.seen().last().cloned().unwrap();
    assert!(last.headers["mcp-session-id"]
        .to_str()
        .unwrap()
        .starts_with(raw::UPSTREAM_SESSION));
    let before = up.hits();

    let mallory = common::other_token();
    let headers = [("mcp-session-id", sid.as_str()), V1125];
    let a = common::post(&url(&fw), &mallory, &headers, CALL).await;
    assert_eq!(a.status, 404, "{}", a.text);
    assert_eq!(a.code(), -32001);
    let a = common::send(Method::GET, &url(&fw), Some(&mallory), &headers, None).await;
    assert_eq!(a.status, 404, "{}", a.text);
    let a = common::send(Method::DELETE, &url(&fw), Some(&mallory), &headers, None).await;
    assert_eq!(a.status, 404, "{}", a.text);
    // Invented, raw upstream, altered and doubled ids are unknown too.
    // Another valid last character (unpadded base64 of 16 bytes ends in
    // one of A, Q, g, w), so the MAC really differs.
    let last = if sid.ends_with('A') { 'Q' } else { 'A' };
    let altered = format!("{}{last}", &sid[..sid.len() - 1]);
    for bad in [
        "invented",
        raw::UPSTREAM_SESSION,
        altered.as_str(),
        "s1.local.dXBzdHJlYW0tc2Vzc2lvbi0x.AAAAAAAAAAAAAAAAAAAAAA",
    ] {
        let a = common::post(&url(&fw), &alice, &[("mcp-session-id", bad), V1125], CALL).await;
        assert_eq!(a.status, 404, "{bad}: {}", a.text);
    }
    let a = common::http()
        .post(url(&fw))
        .bearer_auth(&alice)
        .header("content-type", "application/json")
        .header("mcp-session-id", &sid)
        .header("mcp-session-id", &sid)
        .body(LIST)
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 404);
    assert_eq!(up.hits(), before, "the upstream received none of it");

    // A DELETE without a session means nothing: never forwarded.
    let a = common::send(Method::DELETE, &url(&fw), Some(&alice), &[], None).await;
    assert_eq!(a.status, 400, "{}", a.text);
    assert_eq!(up.hits(), before);
    // Alice ends her own session: the upstream gets its own id.
    let a = common::send(
        Method::DELETE,
        &url(&fw),
        Some(&alice),
        &[("mcp-session-id", &sid)],
        None,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let del = up.seen().last().cloned().unwrap();
    assert_eq!(del.method, "DELETE");
    assert!(del.headers["mcp-session-id"]
        .to_str()
        .unwrap()
        .starts_with(raw::UPSTREAM_SESSION));
    fw.stop().await;
}

#[tokio::test]
async fn a_refreshed_token_of_the_same_run_keeps_its_session_another_run_does_not() {
    let (fw, up) = setup(|c| c).await;
    let claims = common::claims("sre-lead", &["sre"]);
    let sid = session(&fw, &common::sign(&claims)).await;
    // A refreshed token: another token of the same run.
    let mut refreshed = claims.clone();
    refreshed.jti = Some("refreshed".to_owned());
    let fresh = common::sign(&refreshed);
    let a = common::post(&url(&fw), &fresh, &[("mcp-session-id", &sid), V1125], LIST).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert!(up.seen().last().unwrap().headers["mcp-session-id"]
        .to_str()
        .unwrap()
        .starts_with(raw::UPSTREAM_SESSION));
    // Another run of the same subject: the session is not its own.
    let before = up.hits();
    let other_run = common::token();
    let a = common::post(
        &url(&fw),
        &other_run,
        &[("mcp-session-id", &sid), V1125],
        LIST,
    )
    .await;
    assert_eq!(a.status, 404, "{}", a.text);
    assert_eq!(up.hits(), before, "nothing forwarded");
    fw.stop().await;
}

#[tokio::test]
async fn event_ids_resume_only_the_callers_own_stream() {
    let (fw, up) = setup(|c| c).await;
    let alice = common::token();
    let sid = session(&fw, &alice).await;
    // The GET stream's event id reaches the client sealed.
    let a = common::send(
        Method::GET,
        &url(&fw),
        Some(&alice),
        &[("mcp-session-id", &sid), ("accept", "text/event-stream")],
        None,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let eid = a
        .text
        .lines()
        .find_map(|l| l.strip_prefix("id: "))
        .expect("an event id")
        .to_owned();
    assert!(eid.starts_with("e1.") && !eid.contains("up-e1"), "{eid}");
    // Alice resumes: the upstream gets its own event id and session.
    let a = common::send(
        Method::GET,
        &url(&fw),
        Some(&alice),
        &[("mcp-session-id", &sid), ("last-event-id", &eid)],
        None,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let resumed = up.seen().last().cloned().unwrap();
    assert_eq!(resumed.headers["last-event-id"], "up-e1");
    let before = up.hits();
    // Mallory, in a session of her own, cannot resume Alice's stream.
    let mallory = common::other_token();
    let msid = session(&fw, &mallory).await;
    let before = before + 1;
    let a = common::send(
        Method::GET,
        &url(&fw),
        Some(&mallory),
        &[("mcp-session-id", &msid), ("last-event-id", &eid)],
        None,
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text);
    assert!(a.text.contains("Last-Event-ID"), "{}", a.text);
    // Nor can Alice replay it in another session of hers, or forge one.
    let sid2 = session(&fw, &alice).await;
    let before = before + 1;
    for (s, e) in [(sid2.as_str(), eid.as_str()), (sid.as_str(), "up-e1")] {
        let a = common::send(
            Method::GET,
            &url(&fw),
            Some(&alice),
            &[("mcp-session-id", s), ("last-event-id", e)],
            None,
        )
        .await;
        assert_eq!(a.status, 400, "{}", a.text);
    }
    assert_eq!(up.hits(), before, "no refused resumption was forwarded");
    fw.stop().await;
}

#[tokio::test]
async fn stateless_requests_carry_no_session_either_way() {
    let (fw, up) = setup(|c| c).await;
    let body = r#"{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
    let a = common::post(
        &url(&fw),
        &common::token(),
        &[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/list"),
            ("mcp-session-id", "forged-or-not"),
        ],
        body,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert!(a.headers.get("mcp-session-id").is_none());
    let seen = up.seen().last().cloned().unwrap();
    assert!(
        seen.headers.get("mcp-session-id").is_none(),
        "Mcp-Session-Id is ignored and not forwarded on 2026-07-28"
    );
    // No GET stream and no DELETE in 2026-07-28.
    for m in [Method::GET, Method::DELETE] {
        let a = common::send(
            m,
            &url(&fw),
            Some(&common::token()),
            &[("mcp-protocol-version", "2026-07-28")],
            None,
        )
        .await;
        assert_eq!(a.status, 405, "{}", a.text);
    }
    assert_eq!(up.hits(), 1);
    fw.stop().await;
}

#[tokio::test]
async fn replicas_sharing_the_session_key_accept_each_others_sessions() {
    let up = raw::mcp().await;
    let keys = |c: TestConfig| {
        c.set(
            "sessions.keys",
            toml::Value::Array(vec![toml::Value::Table(common::table([
                ("id", "k1".into()),
                ("value", "a-shared-session-key-for-every-replica".into()),
            ]))]),
        )
    };
    let a = firewall_for(&up, keys).await;
    let b = firewall_for(&up, keys).await;
    let other = firewall_for(&up, |c| c).await;
    let alice = common::token();
    let sid = session(&a, &alice).await;
    assert!(sid.starts_with("s1.k1."));
    let r = common::post(&url(&b), &alice, &[("mcp-session-id", &sid), V1125], LIST).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(up.seen().last().unwrap().headers["mcp-session-id"]
        .to_str()
        .unwrap()
        .starts_with(raw::UPSTREAM_SESSION));
    // A replica with other keys does not know it; nor does B for Mallory.
    let before = up.hits();
    let r = common::post(
        &url(&other),
        &alice,
        &[("mcp-session-id", &sid), V1125],
        LIST,
    )
    .await;
    assert_eq!(r.status, 404);
    let r = common::post(
        &url(&b),
        &common::other_token(),
        &[("mcp-session-id", &sid), V1125],
        LIST,
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(up.hits(), before);
    for fw in [a, b, other] {
        fw.stop().await;
    }
}

// --- 2, 3, 4: messages that are not what they seem ------------------------

#[tokio::test]
async fn a_request_method_without_an_id_is_invalid() {
    let (fw, up) = setup(|c| c).await;
    for body in [
        r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"restart_service","arguments":{}}}"#,
        r#"{"jsonrpc":"2.0","method":"resources/read","params":{"uri":"file:///etc/passwd"}}"#,
        r#"[{"jsonrpc":"2.0","method":"tools/call","params":{"name":"restart_service"}},{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
    ] {
        let a = common::post(&url(&fw), &common::token(), &[], body).await;
        assert_eq!(a.status, 400, "{body}: {}", a.text);
        assert_eq!(a.code(), -32600, "{}", a.text);
        assert!(a.text.contains("needs an"), "{}", a.text);
    }
    assert_eq!(up.hits(), 0);
    fw.stop().await;
}

#[tokio::test]
async fn methods_are_matched_exactly_and_unknown_ones_never_forwarded() {
    let (fw, up) = setup(|c| c).await;
    for method in [
        "Tools/Call",
        "tools/call ",
        "tools/call\\u0000",
        "admin/shutdown",
        "sampling/createMessage",
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"{method}","params":{{"name":"restart_service"}}}}"#
        );
        let a = common::post(&url(&fw), &common::token(), &[], &body).await;
        assert_eq!(a.status, 200, "{method}: {}", a.text);
        assert_eq!(a.code(), -32601, "{method}: {}", a.text);
    }
    // A notification of no known method is refused with an HTTP error.
    let a = common::post(
        &url(&fw),
        &common::token(),
        &[],
        r#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#,
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text);
    // 2026-07-28 answers an unknown method with 404 and -32601; and methods
    // of earlier revisions are unknown there.
    for method in ["no/such", "initialize", "ping", "resources/subscribe"] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"{method}","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}}}}"#
        );
        let a = common::post(
            &url(&fw),
            &common::token(),
            &[
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", method),
            ],
            &body,
        )
        .await;
        assert_eq!(a.status, 404, "{method}: {}", a.text);
        assert_eq!(a.code(), -32601);
    }
    assert_eq!(up.hits(), 0, "the upstream received none of them");
    fw.stop().await;
}

#[tokio::test]
async fn methods_an_upstream_adds_pass_only_when_configured_with_a_risk() {
    let up = raw::mcp().await;
    let method = |name: &str, risk: &str| {
        toml::Value::Table(common::table([
            ("name", name.into()),
            ("risk", risk.into()),
        ]))
    };
    let text = common::TestConfig::new()
        .upstream("incidents", &up.url())
        .upstream_set(
            "incidents",
            "extra_methods",
            vec![
                method("vendor/stats", "read"),
                method("vendor/wipe", "destructive"),
            ],
        )
        .text();
    let fw = common::firewall(&text).await;
    let a = common::post(
        &url(&fw),
        &common::token(),
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"vendor/stats"}"#,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(up.count("POST", "vendor/stats"), 1);
    // A destructive one meets its gate (approve, without approvals: refused).
    let a = common::post(
        &url(&fw),
        &common::token(),
        &[],
        r#"{"jsonrpc":"2.0","id":2,"method":"vendor/wipe"}"#,
    )
    .await;
    assert_eq!(a.code(), -31002, "{}", a.text);
    assert_eq!(up.count("POST", "vendor/wipe"), 0);
    fw.stop().await;
}

#[tokio::test]
async fn members_in_another_letter_case_are_refused() {
    let (fw, up) = setup(|c| c).await;
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call","params":{"name":"restart_service"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_incident","Name":"restart_service"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_incident","arguments":{"incident_id":"a","INCIDENT_ID":"b"}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","PARAMS":{}}"#,
    ] {
        let a = common::post(&url(&fw), &common::token(), &[], body).await;
        assert_eq!(a.status, 400, "{body}: {}", a.text);
        assert!(a.text.contains("letter case"), "{}", a.text);
    }
    assert_eq!(up.hits(), 0);
    fw.stop().await;
}

#[tokio::test]
async fn numbers_the_firewall_cannot_hold_exactly_are_invalid_arguments() {
    let (fw, up) = setup(|c| c).await;
    common::post(&url(&fw), &common::token(), &[], LIST).await;
    let listed = up.hits();
    // Out of a double's range: not even JSON the firewall accepts.
    let a = common::post(
        &url(&fw),
        &common::token(),
        &[V1125],
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"get_incident","arguments":{"n":1e400}}}"#,
    )
    .await;
    assert_eq!(a.status, 400);
    assert_eq!(a.code(), -32700);
    for n in [
        "10.0000000000000000001",
        "123456789012345678901234567890",
        "1e-400",
        // Below the smallest normal double: fewer digits than written.
        "9659199e-329",
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"get_incident","arguments":{{"incident_id":"INC-1","n":{n}}}}}}}"#
        );
        let a = common::post(&url(&fw), &common::token(), &[V1125], &body).await;
        let v = a.json();
        assert_eq!(v["result"]["isError"], true, "{n}: {v}");
        assert!(
            v["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("send it as a string"),
            "{v}"
        );
    }
    assert_eq!(up.hits(), listed, "no call reached the upstream");
    fw.stop().await;
}

// --- 7, 13: answers pass the same inspection ------------------------------

#[tokio::test]
async fn an_answer_the_firewall_cannot_inspect_never_reaches_the_client() {
    let up = raw::upstream(|seen| async move {
        if seen.rpc_method() == "tools/list" {
            // Every tool, as text/plain: filtering would be skipped.
            raw::full(
                200,
                "text/plain",
                json!({"jsonrpc": "2.0", "id": 2, "result": {"tools": raw::tools()}}).to_string(),
            )
        } else {
            raw::mcp_answer(&seen)
        }
    })
    .await;
    let fw = firewall_for(&up, |c| c).await;
    let a = common::post(&url(&fw), &common::token(), &[], LIST).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.code(), -31004, "{}", a.text);
    assert!(a.text.contains("cannot inspect"), "{}", a.text);
    assert!(
        !a.text.contains("restart_service"),
        "no tool leaked: {}",
        a.text
    );
    fw.stop().await;
}

#[tokio::test]
async fn an_answer_with_a_case_twin_of_what_is_filtered_is_refused() {
    let up = raw::upstream(|seen| async move {
        if seen.rpc_method() == "tools/list" {
            // "Tools" would be read by a case-insensitive client.
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":2,"result":{{"tools":[],"Tools":{}}}}}"#,
                raw::tools()
            );
            raw::full(200, "application/json", body)
        } else {
            raw::mcp_answer(&seen)
        }
    })
    .await;
    let fw = firewall_for(&up, |c| c).await;
    let a = common::post(&url(&fw), &common::token(), &[], LIST).await;
    assert_eq!(a.code(), -31004, "{}", a.text);
    assert!(!a.text.contains("restart_service"), "{}", a.text);
    fw.stop().await;
}

#[tokio::test]
async fn upstream_http_errors_reach_the_client_with_their_status() {
    let up = raw::upstream(|seen| async move {
        match seen.rpc_method().as_str() {
            "tools/list" => raw::full(
                404,
                "application/json",
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}"#,
            ),
            "prompts/list" => raw::full(400, "text/plain", "Bad Request: no session"),
            // A "404" that carries a result is not relayed as one.
            "resources/list" => raw::full(
                404,
                "application/json",
                r#"{"jsonrpc":"2.0","id":2,"result":{"resources":[{"uri":"file:///secret"}]}}"#,
            ),
            _ => raw::mcp_answer(&seen),
        }
    })
    .await;
    let fw = firewall_for(&up, |c| c).await;
    let a = common::post(&url(&fw), &common::token(), &[], LIST).await;
    assert_eq!(a.status, 404, "{}", a.text);
    assert_eq!(a.code(), -32001);
    let a = common::post(
        &url(&fw),
        &common::token(),
        &[],
        r#"{"jsonrpc":"2.0","id":2,"method":"prompts/list"}"#,
    )
    .await;
    assert_eq!(a.status, 400);
    assert_eq!(a.text, "Bad Request: no session");
    let a = common::post(
        &url(&fw),
        &common::token(),
        &[],
        r#"{"jsonrpc":"2.0","id":2,"method":"resources/list"}"#,
    )
    .await;
    assert_eq!(a.status, 404);
    assert!(!a.text.contains("secret"), "{}", a.text);
    fw.stop().await;
}

#[tokio::test]
async fn a_large_answer_is_inspected_as_it_streams() {
    let big = "x".repeat(300_000);
    let up = raw::upstream(move |seen| {
        let big = big.clone();
        async move {
            let v: Value = serde_json::from_slice(&seen.body).unwrap_or_default();
            match v["params"]["arguments"]["incident_id"].as_str() {
                // A large input-required result asking for roots, which the
                // shipped policy refuses.
                Some("roots") => raw::full(
                    200,
                    "application/json",
                    json!({"jsonrpc": "2.0", "id": v["id"], "result": {
                        "content": [{"type": "text", "text": big}],
                        "resultType": "input_required",
                        "inputRequests": {"r": {"method": "roots/list"}},
                    }})
                    .to_string(),
                ),
                Some(_) => raw::full(
                    200,
                    "application/json",
                    json!({"jsonrpc": "2.0", "id": v["id"], "result": {
                        "content": [{"type": "text", "text": big}],
                    }})
                    .to_string(),
                ),
                None => raw::mcp_answer(&seen),
            }
        }
    })
    .await;
    let call = |arg: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"get_incident","arguments":{{"incident_id":"{arg}"}}}}}}"#
        )
    };
    // A firewall whose `[screen]` sets every family to `action` (`None`:
    // as shipped), the catalog listed.
    let start = |action: Option<&'static str>| {
        let up = up.url();
        async move {
            let dir = common::policy_dir(&[(
                "90-screen.toml",
                &action.map_or(String::new(), |a| {
                    format!("[screen]\nsecrets = \"{a}\"\npii = \"{a}\"\ninjection = \"{a}\"\n")
                }),
            )]);
            let text = common::TestConfig::new()
                .policies(dir.path())
                .upstream("incidents", &up)
                .upstream_set("incidents", "max_response_bytes", 65536)
                .text();
            let fw = common::firewall(&text).await;
            common::post(&url(&fw), &common::token(), &[], LIST).await;
            (fw, dir)
        }
    };
    // Screening as shipped redacts secrets, and where it only flags it
    // still reads: an answer it cannot hold whole is not relayed
    // unscreened.
    for action in [None, Some("flag")] {
        let (fw, _dir) = start(action).await;
        let a = common::post(&url(&fw), &common::token(), &[], &call("INC-1")).await;
        assert_eq!(a.code(), -31004, "{action:?}: {}", a.text);
        assert!(!a.text.contains("xxxxxxxx"), "nothing of it passed");
        fw.stop().await;
    }
    // Where screening looks for nothing (and the upstream labels nothing),
    // it streams.
    let (fw, _dir) = start(Some("off")).await;
    // Passed on whole, though larger than the firewall holds.
    let a = common::post(&url(&fw), &common::token(), &[], &call("INC-1")).await;
    assert_eq!(a.status, 200);
    let v: Value = serde_json::from_str(&a.text).expect("a complete answer");
    assert_eq!(
        v["result"]["content"][0]["text"].as_str().unwrap().len(),
        300_000
    );
    // An answer that must not pass is cut off, never completed.
    let r = common::http()
        .post(url(&fw))
        .bearer_auth(common::token())
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "get_incident")
        .body(call("roots").replace(
            r#""arguments""#,
            r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"arguments""#,
        ))
        .send()
        .await
        .unwrap();
    let body = r.bytes().await;
    let complete = body
        .as_ref()
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(b).ok());
    assert!(complete.is_none(), "a refused answer was completed");
    fw.stop().await;
}

// --- 8, 9, 10, 11: the transport around the messages ---------------------

#[tokio::test]
async fn the_query_string_and_unlisted_headers_stay_behind() {
    let (fw, up) = setup(|c| c).await;
    let a = common::post(
        &format!("{}?token=leak&debug=1", url(&fw)),
        &common::token(),
        &[("origin", "http://127.0.0.1"), ("x-custom", "1")],
        LIST,
    )
    .await;
    // Origin of another port than the firewall's: refused first.
    assert_eq!(a.status, 403, "{}", a.text);
    let a = common::post(
        &format!("{}?token=leak&debug=1", url(&fw)),
        &common::token(),
        &[
            ("x-custom", "1"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ],
        LIST,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let seen = up.seen().last().cloned().unwrap();
    assert_eq!(seen.uri.query(), None, "the query string is dropped");
    assert!(seen.headers.get("x-custom").is_none());
    assert!(seen.headers.get("origin").is_none());
    assert!(seen.headers.get("traceparent").is_some());
    assert_eq!(seen.headers["host"], up.addr.to_string());
    fw.stop().await;
}

#[tokio::test]
async fn foreign_origins_and_hosts_are_refused_before_anything_else() {
    let (fw, up) = setup(|c| c).await;
    let own = fw.base.clone();
    for (k, v) in [
        ("origin", "http://evil.example.com"),
        ("origin", "null"),
        ("host", "evil.example.com"),
    ] {
        let a = common::post(&url(&fw), &common::token(), &[(k, v)], LIST).await;
        assert_eq!(a.status, 403, "{k}: {v}: {}", a.text);
    }
    // The firewall's own origin, and no Origin at all, pass.
    let a = common::post(&url(&fw), &common::token(), &[("origin", &own)], LIST).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(up.hits(), 1);
    fw.stop().await;
}

#[tokio::test]
async fn the_per_address_limit_applies_before_any_token_is_verified() {
    let (fw, up) = setup(|c| c.set("limits.per_ip_per_s", 3)).await;
    let mut codes = Vec::new();
    for _ in 0..6 {
        let a = common::post(&url(&fw), "not-a-token", &[], LIST).await;
        codes.push(a.status);
        if a.status == 200 {
            assert_eq!(a.code(), -31003, "{}", a.text);
            assert!(a.headers.get("retry-after").is_some());
        }
    }
    assert_eq!(codes.iter().filter(|c| **c == 401).count(), 3, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 200).count(), 3, "{codes:?}");
    assert_eq!(up.hits(), 0);
    fw.stop().await;
}

#[tokio::test]
async fn a_hidden_tool_answers_like_an_invented_one_whatever_its_headers() {
    // observability may not see restart_service; its x-mcp-header would
    // reveal it if checked before the policy.
    let (fw, up) = setup(|c| c).await;
    let mut c = common::claims("observability", &["sre"]);
    c.sub = "olly".into();
    let token = common::sign(&c);
    let body = |tool: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"{tool}","arguments":{{"service":"db"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}}}}"#
        )
    };
    let headers = |tool: &'static str| {
        [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", tool),
            ("mcp-param-service", "not-db"),
        ]
    };
    // Cold catalog: the firewall lists the upstream first.
    let hidden = common::post(
        &url(&fw),
        &token,
        &headers("restart_service"),
        &body("restart_service"),
    )
    .await;
    let invented = common::post(
        &url(&fw),
        &token,
        &headers("no_such_tool"),
        &body("no_such_tool"),
    )
    .await;
    assert_eq!(hidden.status, invented.status);
    assert_eq!(hidden.code(), -32602);
    assert_eq!(
        hidden.text.replace("restart_service", "X"),
        invented.text.replace("no_such_tool", "X")
    );
    // A visible tool with a mismatching mirrored parameter: 400, -32020.
    let a = common::post(
        &url(&fw),
        &token,
        &[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "get_deployment"),
            ("mcp-param-deployment", "dep-2"),
        ],
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_deployment","arguments":{"deployment_id":"dep-1"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text);
    assert_eq!(a.code(), -32020);
    assert_eq!(up.count("POST", "tools/call"), 0);
    fw.stop().await;
}

#[tokio::test]
async fn a_mirrored_number_passes_only_with_the_bodys_exact_value() {
    let (fw, up) = setup(|c| c).await;
    let call = |revision: &str, header: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"get_deployment","arguments":{{"deployment_id":"dep-1","revision":{revision}}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}}}}"#
        );
        let header = header.to_owned();
        let fw = &fw;
        async move {
            common::post(
                &url(fw),
                &common::token(),
                &[
                    ("mcp-protocol-version", "2026-07-28"),
                    ("mcp-method", "tools/call"),
                    ("mcp-name", "get_deployment"),
                    ("mcp-param-deployment", "dep-1"),
                    ("mcp-param-revision", header.as_str()),
                ],
                &body,
            )
            .await
        }
    };
    // Another spelling of the same value is the same value: forwarded once.
    let a = call("42", "4.2e1").await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert!(a.json().get("error").is_none(), "{}", a.text);
    assert_eq!(up.count("POST", "tools/call"), 1);
    // Equal as doubles, not as decimals; past 2^53 - 1 a JavaScript reader
    // holds another value: refused, never forwarded.
    for (revision, header) in [
        ("4503599627370496", "4503599627370496.25"),
        ("9007199254740993", "9007199254740993"),
    ] {
        let a = call(revision, header).await;
        assert_eq!(a.status, 400, "{revision} / {header}: {}", a.text);
        assert_eq!(a.code(), -32020, "{}", a.text);
    }
    assert_eq!(
        up.count("POST", "tools/call"),
        1,
        "the refused calls never arrived"
    );
    fw.stop().await;
}

#[tokio::test]
async fn a_held_stream_counts_against_the_concurrency_limit_until_it_ends() {
    let up = raw::upstream(|seen| async move {
        if seen.rpc_method() == "tools/call" {
            raw::sse(
                vec![
                    bytes::Bytes::from_static(b": keep\n\n"),
                    bytes::Bytes::from(format!(
                        "data: {}\n\n",
                        json!({"jsonrpc":"2.0","id":3,"result":{"content":[]}})
                    )),
                ],
                Duration::from_millis(800),
                false,
            )
        } else {
            raw::mcp_answer(&seen)
        }
    })
    .await;
    let text = common::TestConfig::new()
        .upstream("incidents", &up.url())
        .set("server.max_concurrent_requests", 1)
        .text();
    let fw = common::firewall(&text).await;
    common::post(&url(&fw), &common::token(), &[], LIST).await;
    let streaming = common::http()
        .post(url(&fw))
        .bearer_auth(common::token())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(CALL)
        .send()
        .await
        .unwrap();
    assert_eq!(streaming.status(), 200);
    // Headers are out, the body still streams: the permit is still held.
    let a = common::post(&url(&fw), &common::token(), &[], LIST).await;
    assert_eq!(a.status, 503, "{}", a.text);
    let _ = streaming.bytes().await;
    let a = common::post(&url(&fw), &common::token(), &[], LIST).await;
    assert_eq!(a.status, 200, "{}", a.text);
    fw.stop().await;
}

#[tokio::test]
async fn connections_past_the_cap_are_closed_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (fw, _up) = setup(|c| c).await;
    drop(fw);
    let up = raw::mcp().await;
    let text = common::TestConfig::new()
        .upstream("incidents", &up.url())
        .set("server.max_connections", 1)
        .text();
    let fw = common::firewall(&text).await;
    let addr = fw.running.mcp_addr;
    // The first connection is served (so the firewall counts it) and stays
    // open, idle.
    let mut first = tokio::net::TcpStream::connect(addr).await.unwrap();
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    first
        .write_all(
            format!(
                "POST /mcp/incidents HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {}\r\n\r\n{ping}",
                common::token(),
                ping.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), first.read_exact(&mut head))
        .await
        .expect("the first connection is answered")
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "the first connection is served");
    let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = second
        .write_all(b"GET /mcp/incidents HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), second.read(&mut buf))
        .await
        .expect("closed, not left hanging")
        .unwrap_or(0);
    assert_eq!(n, 0, "the second connection was closed without an answer");
    fw.stop().await;
}

#[tokio::test]
async fn a_client_that_stops_reading_is_dropped_after_the_write_idle_timeout() {
    use tokio::io::AsyncWriteExt;
    let up = raw::upstream(|seen| async move {
        if seen.rpc_method() == "tools/call" {
            // An endless stream of large events.
            let chunk = bytes::Bytes::from(format!(
                "data: {}\n\n",
                json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"y".repeat(60_000)}})
            ));
            raw::sse(vec![chunk; 2000], Duration::from_millis(1), false)
        } else {
            raw::mcp_answer(&seen)
        }
    })
    .await;
    let text = common::TestConfig::new()
        .upstream("incidents", &up.url())
        .set("server.write_idle_timeout_ms", 500)
        .text();
    let fw = common::firewall(&text).await;
    common::post(&url(&fw), &common::token(), &[], LIST).await;
    let mut s = tokio::net::TcpStream::connect(fw.running.mcp_addr)
        .await
        .unwrap();
    let req = format!(
        "POST /mcp/incidents HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\naccept: text/event-stream, application/json\r\ncontent-length: {}\r\n\r\n{CALL}",
        common::token(),
        CALL.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    // Never read. The firewall's writes block; it gives up.
    let metrics = format!("{}/metrics", fw.admin);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let text = common::http()
            .get(&metrics)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let closed = text
            .lines()
            .find(|l| l.starts_with("mcp_firewall_write_idle_closed_total"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        if closed >= 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never closed:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(s);
    fw.stop().await;
}
