//! Human approvals through the firewall, on both stores (a journal file, and
//! PostgreSQL as replicas share it), with a real MCP client and the sample
//! upstream (which counts executions): hold then approve, hold then deny,
//! resume with an identical retry (runs once), changed arguments, expiry,
//! who may approve, a restart with a pending approval, the console clicked in
//! headless Chromium, the audit rows of every transition, and the row of an
//! approved, pinned call standing on its own (approval, approver, when, the
//! policy set that decided, the pin it matched, the token's `act` chain and
//! `jti`) in ClickHouse and in `mcp-firewall audit`.

use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{json, Value};

use crate::common::backend::{Backend, Scope};
use crate::common::browser::Browser;
use crate::common::clickhouse::ClickHouse;
use crate::common::{self, mcp::*, Firewall, TestConfig};
use crate::on_both_backends;
use mcp_demo_upstream::DemoUpstream;
use mcp_firewall::auth::Audience;

on_both_backends!(
    hold_then_approve_runs_the_call_once_on_the_held_stream,
    hold_then_deny_ends_with_the_reason,
    resume_after_the_hold_window_runs_an_identical_retry_exactly_once,
    an_approval_nobody_decides_expires,
    who_may_approve,
    a_pending_approval_survives_a_restart,
    approver_sees_the_preview_and_clicks_approve_in_a_browser,
    every_transition_is_an_audit_row,
    an_approved_pinned_call_stands_on_its_own_in_clickhouse_and_the_cli,
);

const ROLLBACK: &str = "rollback_deployment";

fn rollback_args() -> Value {
    json!({"deployment_id": "dep-1042", "reason": "checkout errors after deploy"})
}

async fn start(
    upstream: &DemoUpstream,
    scope: &Scope,
    hold_s: u64,
    expiry_s: u64,
    extra: impl FnOnce(TestConfig) -> TestConfig,
) -> Firewall {
    let cfg = scope
        .approvals_store(TestConfig::new())
        .set("approvals.hold_s", hold_s as i64)
        .set("approvals.expiry_s", expiry_s as i64)
        .set("approvals.progress_interval_s", 1)
        .upstream("incidents", &upstream.url());
    common::firewall(&extra(cfg).text()).await
}

fn admin_token(tenant: &str, sub: &str) -> String {
    let mut c = common::claims("sre-lead", &["sre"]);
    c.audience = Audience::Admin;
    c.tenant_id = tenant.to_owned();
    c.sub = sub.to_owned();
    common::sign(&c)
}

async fn client(fw: &Firewall, token: &str) -> Client {
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(fw.mcp_url("incidents"));
    cfg.auth_header = Some(token.to_owned());
    let c = connect_with(TestClient::new(Era::V2026_07_28), cfg).await;
    c.list_all_tools().await.unwrap();
    c
}

async fn pending(fw: &Firewall, token: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v: Value = common::http()
            .get(format!("{}/approvals?status=pending", fw.admin))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let list = v["approvals"].as_array().cloned().unwrap_or_default();
        if !list.is_empty() || Instant::now() > deadline {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn decide(fw: &Firewall, token: &str, id: &str, action: &str, reason: &str) -> (u16, Value) {
    let resp = common::http()
        .post(format!("{}/approvals/{id}/{action}", fw.admin))
        .bearer_auth(token)
        .json(&json!({"reason": reason}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A rollback the firewall holds for approval (the call runs in a task), the
/// on-call approver's token, and the id of the pending approval.
async fn held_rollback(
    fw: &Firewall,
) -> (
    tokio::task::JoinHandle<Result<rmcp::model::CallToolResult, rmcp::ErrorData>>,
    String,
    String,
) {
    let c = client(fw, &common::token()).await;
    let call = tokio::spawn(async move { call_raw(&c, ROLLBACK, rollback_args()).await });
    let oncall = admin_token("acme", "oncall");
    let id = pending(fw, &oncall).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    (call, oncall, id)
}

async fn call_raw(
    client: &Client,
    tool: &str,
    args: Value,
) -> Result<rmcp::model::CallToolResult, rmcp::ErrorData> {
    let params =
        CallToolRequestParams::new(tool.to_owned()).with_arguments(crate::common::mcp::args(args));
    match tokio::time::timeout(Duration::from_secs(30), client.call_tool(params))
        .await
        .expect("no hang")
    {
        Ok(r) => Ok(r),
        Err(rmcp::ServiceError::McpError(e)) => Err(e),
        Err(other) => panic!("transport failure: {other:?}"),
    }
}

async fn hold_then_approve_runs_the_call_once_on_the_held_stream(b: Backend) {
    let scope = b.scope().await;
    let upstream = upstream(options(true)).await;
    let fw = start(&upstream, &scope, 30, 600, |c| c).await;
    let c = client(&fw, &common::token()).await;
    let call = tokio::spawn(async move {
        let r = call_raw(&c, ROLLBACK, rollback_args()).await;
        (r, c)
    });
    let oncall = admin_token("acme", "oncall");
    let list = pending(&fw, &oncall).await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["tool"], ROLLBACK);
    assert_eq!(
        upstream.calls(ROLLBACK),
        0,
        "nothing runs before the approval"
    );
    let id = list[0]["id"].as_str().unwrap().to_owned();
    let (status, _) = decide(&fw, &oncall, &id, "approve", "looks right").await;
    assert_eq!(status, 200);
    let (result, c) = call.await.unwrap();
    let result = result.expect("the held call completes with the upstream's result");
    assert!(result.is_error != Some(true), "{result:?}");
    assert_eq!(upstream.calls(ROLLBACK), 1);
    // The identical call again needs a new approval.
    drop(c);
    fw.stop().await;
}

async fn hold_then_deny_ends_with_the_reason(b: Backend) {
    let scope = b.scope().await;
    let upstream = upstream(options(true)).await;
    let fw = start(&upstream, &scope, 30, 600, |c| c).await;
    let (call, oncall, id) = held_rollback(&fw).await;
    let (status, _) = decide(&fw, &oncall, &id, "deny", "not during the freeze").await;
    assert_eq!(status, 200);
    let e = call.await.unwrap().expect_err("denied");
    assert_eq!(e.code.0, -31001, "{e:?}");
    assert!(e.message.contains("not during the freeze"), "{e:?}");
    assert_eq!(upstream.calls(ROLLBACK), 0);
    fw.stop().await;
}

async fn resume_after_the_hold_window_runs_an_identical_retry_exactly_once(b: Backend) {
    let scope = b.scope().await;
    let upstream = upstream(options(true)).await;
    let fw = start(&upstream, &scope, 1, 600, |c| c).await;
    let c = client(&fw, &common::token()).await;
    let e = call_raw(&c, ROLLBACK, rollback_args())
        .await
        .expect_err("approval required after the hold");
    assert_eq!(e.code.0, -31002);
    let data = e.data.clone().unwrap();
    let id = data["approval_id"].as_str().unwrap().to_owned();
    assert!(
        data["status_url"].as_str().unwrap().ends_with(&id),
        "{data}"
    );
    assert!(data["expires_at_ms"].as_u64().unwrap() > 0);
    let oncall = admin_token("acme", "oncall");
    assert_eq!(decide(&fw, &oncall, &id, "approve", "ok").await.0, 200);
    // Changed arguments are not covered by the approval.
    let e = call_raw(
        &c,
        ROLLBACK,
        json!({"deployment_id": "dep-1041", "reason": "other"}),
    )
    .await
    .expect_err("not covered");
    assert_eq!(e.code.0, -31002);
    assert_ne!(e.data.unwrap()["approval_id"], id.as_str());
    assert_eq!(upstream.calls(ROLLBACK), 0);
    // The identical retry runs once.
    let r = call_raw(&c, ROLLBACK, rollback_args())
        .await
        .expect("approved retry runs");
    assert!(r.is_error != Some(true));
    assert_eq!(upstream.calls(ROLLBACK), 1);
    // A second identical retry does not run again.
    let e = call_raw(&c, ROLLBACK, rollback_args())
        .await
        .expect_err("needs a new approval");
    assert_eq!(e.code.0, -31002);
    assert_eq!(upstream.calls(ROLLBACK), 1);
    fw.stop().await;
}

async fn an_approval_nobody_decides_expires(b: Backend) {
    let scope = b.scope().await;
    let upstream = upstream(options(true)).await;
    let fw = start(&upstream, &scope, 10, 1, |c| c).await;
    let c = client(&fw, &common::token()).await;
    let started = Instant::now();
    let e = call_raw(&c, ROLLBACK, rollback_args())
        .await
        .expect_err("expired");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "ends at expiry, not at the hold window"
    );
    assert_eq!(e.code.0, -31002);
    assert_eq!(e.data.unwrap()["status"], "expired");
    assert_eq!(upstream.calls(ROLLBACK), 0);
    fw.stop().await;
}

async fn who_may_approve(b: Backend) {
    let scope = b.scope().await;
    let upstream = upstream(options(true)).await;
    let fw = start(&upstream, &scope, 0, 600, |c| c).await;
    let c = client(&fw, &common::token()).await;
    let e = call_raw(&c, ROLLBACK, rollback_args())
        .await
        .expect_err("approval required");
    let id = e.data.unwrap()["approval_id"].as_str().unwrap().to_owned();
    // A tool token can never approve.
    let (status, _) = decide(&fw, &common::token(), &id, "approve", "me").await;
    assert_eq!(status, 401);
    // Another tenant: as if it did not exist.
    let (status, _) = decide(
        &fw,
        &admin_token("other-corp", "oncall"),
        &id,
        "approve",
        "x",
    )
    .await;
    assert_eq!(status, 404);
    // The run's own caller (alice) may not approve by default.
    let (status, body) = decide(&fw, &admin_token("acme", "alice"), &id, "approve", "mine").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(upstream.calls(ROLLBACK), 0);
    fw.stop().await;
}

async fn a_pending_approval_survives_a_restart(b: Backend) {
    let scope = b.scope().await;
    let upstream = upstream(options(true)).await;
    let token = common::token();
    let fw = start(&upstream, &scope, 0, 600, |c| c).await;
    let c = client(&fw, &token).await;
    let e = call_raw(&c, ROLLBACK, rollback_args())
        .await
        .expect_err("approval required");
    let id = e.data.unwrap()["approval_id"].as_str().unwrap().to_owned();
    drop(c);
    fw.stop().await;

    let fw = start(&upstream, &scope, 0, 600, |c| c).await;
    let oncall = admin_token("acme", "oncall");
    let list = pending(&fw, &oncall).await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["id"], id.as_str());
    assert_eq!(
        decide(&fw, &oncall, &id, "approve", "after restart")
            .await
            .0,
        200
    );
    let c = client(&fw, &token).await;
    call_raw(&c, ROLLBACK, rollback_args())
        .await
        .expect("runs after the restart");
    assert_eq!(upstream.calls(ROLLBACK), 1);
    fw.stop().await;
}

async fn approver_sees_the_preview_and_clicks_approve_in_a_browser(b: Backend) {
    let scope = b.scope().await;
    let upstream = upstream(options(true)).await;
    let fw = start(&upstream, &scope, 60, 600, |c| c).await;
    let (call, oncall, id) = held_rollback(&fw).await;

    // The approver's view carries the read-only preview of the call.
    let shown: Value = common::http()
        .get(format!("{}/approvals/{id}", fw.admin))
        .bearer_auth(&oncall)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let preview = shown["preview"].to_string();
    assert!(
        preview.contains("dep-1042") || preview.contains("rollback"),
        "{shown}"
    );
    assert_eq!(upstream.calls("preview_remediation"), 1);

    let browser = Browser::start().await;
    browser.goto(&format!("{}/console#{id}", fw.admin)).await;
    let field = browser.wait_for("#token", Duration::from_secs(10)).await;
    browser.send_keys(&field, &oncall).await;
    browser
        .click(
            &browser
                .wait_for("#save-token", Duration::from_secs(5))
                .await,
        )
        .await;
    let card = format!("section.approval[data-id=\"{id}\"]");
    browser.wait_for(&card, Duration::from_secs(10)).await;
    let approve = browser
        .wait_for(&format!("{card} button.approve"), Duration::from_secs(5))
        .await;
    browser.click(&approve).await;
    browser.click(&approve).await;
    let result = call
        .await
        .unwrap()
        .expect("the held call completes after the click");
    assert!(result.is_error != Some(true));
    assert_eq!(upstream.calls(ROLLBACK), 1);
    fw.stop().await;
}

async fn every_transition_is_an_audit_row(b: Backend) {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let scope = b.scope().await;
    let spool = tempfile::tempdir().unwrap();
    let upstream = upstream(options(true)).await;
    let fw = start(&upstream, &scope, 30, 600, |c| {
        c.set("audit.enabled", true)
            .set("audit.clickhouse.url", ch.http_url.as_str())
            .set("audit.clickhouse.database", db.as_str())
            .set("audit.spool.dir", common::toml_path(spool.path()))
            .set("audit.batch.max_age_ms", 50)
    })
    .await;
    let (call, oncall, id) = held_rollback(&fw).await;
    // The approver opens the approval: its preview is the firewall's own
    // call of the upstream, on record and attributed to that approver.
    let shown = common::http()
        .get(format!("{}/approvals/{id}", fw.admin))
        .bearer_auth(&oncall)
        .send()
        .await
        .unwrap();
    assert_eq!(shown.status(), 200);
    assert_eq!(upstream.calls("preview_remediation"), 1);
    decide(&fw, &oncall, &id, "approve", "go").await;
    call.await.unwrap().expect("runs");
    let preview_sql = format!(
        "SELECT count() FROM {db}.audit_events FINAL WHERE method = 'tools/call' AND tool = 'preview_remediation' \
         AND subject = 'oncall' AND tenant = 'acme' AND row_version = 1 AND position(reason, 'opened by oncall') > 0"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut previews = 0;
    while Instant::now() < deadline && previews == 0 {
        previews = ch
            .try_query(&preview_sql)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        previews,
        1,
        "the preview call is on record: {}",
        ch.try_query(&format!(
            "SELECT method, tool, subject, reason FROM {db}.audit_events"
        ))
        .unwrap_or_default()
    );
    let sql = format!("SELECT groupArray(decision) FROM (SELECT decision FROM {db}.audit_events FINAL WHERE method = 'approval' ORDER BY time_ms)");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = String::new();
    while Instant::now() < deadline {
        got = ch.try_query(&sql).unwrap_or_default();
        if got.contains("consumed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        got.contains("pending") && got.contains("approved") && got.contains("consumed"),
        "{got}\nall rows: {}",
        ch.try_query(&format!(
            "SELECT method, decision, reason FROM {db}.audit_events"
        ))
        .unwrap_or_default()
    );
    let who = ch.query(&format!("SELECT subject, reason FROM {db}.audit_events FINAL WHERE method = 'approval' AND decision = 'approved'"));
    assert!(who.contains("oncall") && who.contains("go"), "{who}");
    // The executed call is on record with the approver.
    let ran_sql = format!("SELECT reason FROM {db}.audit_events FINAL WHERE method = 'tools/call' AND decision = 'allow' AND tool = '{ROLLBACK}'");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ran = String::new();
    while Instant::now() < deadline && !ran.contains("approved by") {
        ran = ch.try_query(&ran_sql).unwrap_or_default();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ran.contains("approved by oncall"),
        "{ran}\nall rows: {}",
        ch.try_query(&format!(
            "SELECT method, tool, decision, reason FROM {db}.audit_events"
        ))
        .unwrap_or_default()
    );
    fw.stop().await;
}

/// `token` with an RFC 8693 `act` claim added (re-signed with the test key).
fn with_act(token: &str, act: Value) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let payload = token.split('.').nth(1).unwrap();
    let mut claims: Value = serde_json::from_slice(&b64.decode(payload).unwrap()).unwrap();
    claims["act"] = act;
    mcp_firewall::auth::SigningKey::from_secret(common::SECRET.as_bytes(), None)
        .unwrap()
        .sign(&claims)
        .unwrap()
}

/// The policy set's hash `mcp_firewall_policy_info{sha256}` shows.
async fn running_policy(fw: &common::Firewall) -> Option<String> {
    let metrics = fw.metrics().await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("mcp_firewall_policy_info{"))?;
    let start = line.find("sha256=\"")? + 8;
    Some(line[start..start + line[start..].find('"')?].to_owned())
}

/// Waits until the running policy set's hash is `want`.
async fn policy_in_force(fw: &common::Firewall, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let got = running_policy(fw).await;
        if got.as_deref() == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "policy in force {got:?}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `mcp-firewall audit <command>` against `db`.
async fn audit_cli(
    ch: &ClickHouse,
    db: &str,
    json: bool,
    command: mcp_firewall::cli::audit::AuditCommand,
) -> String {
    crate::common::clickhouse::audit_cli(ch, db, None, json, command).await
}

async fn an_approved_pinned_call_stands_on_its_own_in_clickhouse_and_the_cli(b: Backend) {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let scope = b.scope().await;
    let spool = tempfile::tempdir().unwrap();
    // The shipped policies and their pins, enforced.
    let policies = common::policy_dir(&[]);
    let upstream = upstream(options(true)).await;
    let fw = start(&upstream, &scope, 30, 600, |c| {
        c.policies(policies.path())
            .upstream_set("incidents", "pinning", "enforce")
            .set("audit.enabled", true)
            .set("audit.clickhouse.url", ch.http_url.as_str())
            .set("audit.clickhouse.database", db.as_str())
            .set("audit.spool.dir", common::toml_path(spool.path()))
            .set("audit.batch.max_age_ms", 50)
    })
    .await;
    let pins: toml::Table = toml::from_str(
        &std::fs::read_to_string(policies.path().join("pins/incidents.toml")).unwrap(),
    )
    .unwrap();
    let pin = pins["tools"][ROLLBACK]["sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let deciding = mcp_firewall::policy::load_dir(policies.path())
        .unwrap()
        .content_hash()
        .to_owned();
    assert_eq!(deciding.len(), 64, "a whole SHA-256");
    policy_in_force(&fw, &deciding).await;

    // An agent acting for a planner acting for Olga, with its own token id.
    let mut claims = common::claims("sre-lead", &["sre"]);
    let jti = format!("jti-{}", uuid::Uuid::new_v4().simple());
    claims.jti = Some(jti.clone());
    let run_id = claims.run_id.clone();
    let token = with_act(
        &common::sign(&claims),
        json!({"sub": "agent:planner", "act": {"sub": "user:olga", "iss": "https://idp.test"}}),
    );
    let c = client(&fw, &token).await;
    let call = tokio::spawn(async move { call_raw(&c, ROLLBACK, rollback_args()).await });
    let oncall = admin_token("acme", "oncall");
    let id = pending(&fw, &oncall).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The policy changes while the call is held: the call was decided by
    // the set before, and its rows say so.
    std::fs::write(
        policies.path().join("99-reviewed.toml"),
        "# reviewed after the rollback was held\n",
    )
    .unwrap();
    let reloaded = mcp_firewall::policy::load_dir(policies.path())
        .unwrap()
        .content_hash()
        .to_owned();
    assert_ne!(reloaded, deciding);
    policy_in_force(&fw, &reloaded).await;
    let before = mcp_firewall::internals::now_ms();
    let (status, decided) = decide(&fw, &oncall, &id, "approve", "go").await;
    assert_eq!(status, 200, "{decided}");
    let after = mcp_firewall::internals::now_ms();
    let approved_ms = decided["decision"]["at_ms"].as_u64().unwrap();
    assert!((before..=after).contains(&approved_ms), "{decided}");
    call.await.unwrap().expect("runs");
    assert_eq!(upstream.calls(ROLLBACK), 1);

    // Its final row in ClickHouse.
    let sql = format!(
        "SELECT approval_id, approver, approved_ms, policy_sha256, pin_sha256, delegation, token_jti, token_id, \
         subject, reason, row_version FROM {db}.audit_events FINAL \
         WHERE run_id = '{run_id}' AND method = 'tools/call' AND tool = '{ROLLBACK}' AND decision = 'allow' FORMAT JSONEachRow"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        let got = ch.try_query(&sql).unwrap_or_default();
        if let Some(row) = got
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|r| r["row_version"] == 1)
        {
            break row;
        }
        assert!(
            Instant::now() < deadline,
            "no final row: {got}\n{}",
            ch.try_query(&format!(
                "SELECT method, tool, decision, row_version, reason FROM {db}.audit_events"
            ))
            .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let num = |v: &Value| v.as_u64().or_else(|| v.as_str()?.parse().ok());
    assert_eq!(row["approval_id"], id.as_str(), "{row}");
    assert_eq!(row["approver"], "oncall");
    assert_eq!(num(&row["approved_ms"]), Some(approved_ms));
    assert_eq!(
        row["policy_sha256"],
        deciding.as_str(),
        "the set that decided, not {reloaded}"
    );
    assert_eq!(row["pin_sha256"], pin.as_str());
    assert_eq!(row["delegation"], json!(["agent:planner", "user:olga"]));
    assert_eq!(row["token_jti"], jti.as_str());
    assert_eq!(row["token_id"], jti.as_str());
    assert_eq!(row["subject"], "alice", "the principal stays the subject");
    // Its intent row (written when it was released) says the same; the
    // row of its hold, the pin and the policy set.
    let rows = ch.query(&format!(
        "SELECT decision, row_version, approval_id, approver, policy_sha256, pin_sha256, delegation \
         FROM {db}.audit_events WHERE run_id = '{run_id}' AND method = 'tools/call' AND tool = '{ROLLBACK}' \
         ORDER BY time_ms, row_version FORMAT JSONEachRow"
    ));
    let rows: Vec<Value> = rows
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let intent = rows
        .iter()
        .find(|r| r["decision"] == "allow" && r["row_version"] == 0)
        .unwrap_or_else(|| panic!("an intent row in {rows:?}"));
    assert_eq!(intent["approval_id"], id.as_str());
    assert_eq!(intent["approver"], "oncall");
    assert_eq!(intent["pin_sha256"], pin.as_str());
    let held = rows
        .iter()
        .find(|r| r["decision"] == "approve")
        .unwrap_or_else(|| panic!("the hold's row in {rows:?}"));
    assert_eq!(held["approval_id"], "", "not approved yet");
    assert_eq!(held["policy_sha256"], deciding.as_str());
    assert_eq!(held["pin_sha256"], pin.as_str());
    assert_eq!(held["delegation"], json!(["agent:planner", "user:olga"]));
    // The approval's own row names it too.
    let transition = ch.query(&format!(
        "SELECT approver, approved_ms FROM {db}.audit_events FINAL \
         WHERE method = 'approval' AND decision = 'approved' AND approval_id = '{id}' FORMAT TSV"
    ));
    assert_eq!(transition.trim(), format!("oncall\t{approved_ms}"));
    // The auditor's guide's question "who approved which call" finds it.
    let who = crate::modern_clickhouse::auditors_sql_after("More questions in SQL:")
        .into_iter()
        .find(|q| q.contains("approval_id != ''"))
        .expect("the auditor's guide asks who approved which call")
        .replace("mcp_firewall.", &format!("{db}."));
    let answer = ch.query(&format!("{who} FORMAT JSONEachRow"));
    assert!(
        answer.lines().any(|l| l.contains(&id)
            && l.contains("\"oncall\"")
            && l.contains(&deciding)
            && l.contains(&pin)),
        "{answer}"
    );

    // `mcp-firewall audit run RUN_ID` shows them: whole with --json...
    use mcp_firewall::cli::audit::AuditCommand;
    let run = || AuditCommand::Run {
        run_id: run_id.clone(),
    };
    let out = audit_cli(ch, &db, true, run()).await;
    let shown: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ran = shown
        .iter()
        .find(|r| r["decision"] == "allow" && r["tool"] == ROLLBACK)
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(ran["approval_id"], id.as_str());
    assert_eq!(ran["approver"], "oncall");
    assert_eq!(ran["approved_ms"], approved_ms);
    assert_eq!(ran["policy_sha256"], deciding.as_str());
    assert_eq!(ran["pin_sha256"], pin.as_str());
    assert_eq!(ran["delegation"], json!(["agent:planner", "user:olga"]));
    assert_eq!(ran["token_jti"], jti.as_str());
    // ... and in the table people read (hashes by their first 12 digits).
    let table = audit_cli(ch, &db, false, run()).await;
    let line = table
        .lines()
        .find(|l| l.contains(&format!(" {ROLLBACK} ")) && l.contains(" allow "))
        .unwrap_or_else(|| panic!("{table}"));
    let when = mcp_firewall::internals::fmt_ms(approved_ms);
    for want in [
        "oncall",
        id.as_str(),
        when.as_str(),
        &deciding[..12],
        &pin[..12],
        "agent:planner <- user:olga",
        jti.as_str(),
    ] {
        assert!(line.contains(want), "{want} not in\n{table}");
    }
    let header = table.lines().next().unwrap();
    for column in [
        "approver",
        "approved_ms",
        "approval_id",
        "policy_sha256",
        "pin_sha256",
        "delegation",
        "token_jti",
    ] {
        assert!(header.contains(column), "{header}");
    }
    // `tail` says who approved each released call.
    let tail = audit_cli(
        ch,
        &db,
        false,
        AuditCommand::Tail {
            lines: 100,
            once: true,
        },
    )
    .await;
    assert!(
        tail.lines()
            .any(|l| l.contains(ROLLBACK) && l.contains(&format!("oncall ({id})"))),
        "{tail}"
    );
    fw.stop().await;
}
