//! The approver's side over real HTTP: the approvals API and console served
//! by `approval::api::handle` on a hyper listener (as the admin listener
//! mounts it), real admin and tool tokens, the CLI client, and the console
//! driven by headless chromium.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use mcp_firewall::approval::api::{self, ApprovalView, ListView};
use mcp_firewall::approval::client::{self, AdminClient, ClientError};
use mcp_firewall::approval::{
    args_sha256, console, Approvals, ApprovalsConfig, CallKey, NewApproval, Status,
};
use mcp_firewall::auth::{Audience, AuthConfig, MintClaims, Verifier};
use mcp_firewall::policy::Risk;

use crate::common::{self, browser::Browser};

/// The approvals API on its own listener, like the admin listener.
struct Admin {
    base: String,
    approvals: Arc<Approvals>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for Admin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn auth_config() -> AuthConfig {
    common::config_builder::auth()
        .try_into()
        .expect("auth config")
}

async fn admin(tweak: impl FnOnce(&mut ApprovalsConfig)) -> Admin {
    admin_on(tweak, None).await
}

/// [`admin`] on a clock the test moves (ms since the epoch), when given.
async fn admin_on(
    tweak: impl FnOnce(&mut ApprovalsConfig),
    clock: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
) -> Admin {
    let dir = tempfile::tempdir().expect("store dir");
    let mut cfg = ApprovalsConfig {
        store_dir: dir.path().join("approvals"),
        ..ApprovalsConfig::default()
    };
    tweak(&mut cfg);
    let mut registry = Registry::default();
    let approvals = match clock {
        Some(now) => Approvals::open_with_manual_clock(&cfg, &mut registry, now).await,
        None => Approvals::open(&cfg, &mut registry).await,
    }
    .expect("open");
    let verifier = Verifier::new(&auth_config()).await.expect("verifier");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    approvals.set_public_url(&base);
    let served = approvals.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (a, v) = (served.clone(), verifier.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let (a, v) = (a.clone(), v.clone());
                    async move {
                        let resp = api::handle(a, v, req).await.unwrap_or_else(|| {
                            let mut r =
                                http::Response::new(mcp_firewall::internals::full("not found\n"));
                            *r.status_mut() = http::StatusCode::NOT_FOUND;
                            r
                        });
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Admin {
        base,
        approvals,
        task,
        _dir: dir,
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// A gated call of `tenant`'s run by `sub`, as the request path would
/// record it.
fn gated(tenant: &str, sub: &str, tool: &str, args: Value) -> NewApproval {
    NewApproval {
        key: CallKey {
            tenant: tenant.to_owned(),
            run_id: "run-incident-4711".to_owned(),
            subject: sub.to_owned(),
            upstream: "incidents".to_owned(),
            tool: tool.to_owned(),
            args_sha256: args_sha256(&args),
        },
        agent: "sre-lead".to_owned(),
        risk: Risk::Destructive,
        arguments: args,
        token_exp: now_s() + 600,
        preview_tool: None,
        self_approval: false,
        why: None,
    }
}

fn admin_token(tenant: &str, sub: &str) -> String {
    let mut c: MintClaims = common::claims("console", &["sre"]);
    c.audience = Audience::Admin;
    c.tenant_id = tenant.to_owned();
    c.sub = sub.to_owned();
    common::sign(&c)
}

async fn get(url: &str, token: Option<&str>) -> (u16, http::HeaderMap, Value) {
    let mut req = common::http().get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let v = resp.json().await.unwrap_or(Value::Null);
    (status, headers, v)
}

async fn decide(base: &str, token: &str, id: &str, action: &str, body: Value) -> (u16, Value) {
    let resp = common::http()
        .post(format!("{base}/approvals/{id}/{action}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_list_shows_only_the_tenants_approvals() {
    let a = admin(|_| {}).await;
    let one = a
        .approvals
        .request(gated(
            "acme",
            "alice",
            "rollback_deployment",
            json!({"deployment": "checkout", "to": "v41"}),
        ))
        .await
        .expect("request");
    let two = a
        .approvals
        .request(gated(
            "acme",
            "alice",
            "restart_service",
            json!({"service": "search"}),
        ))
        .await
        .expect("request");
    a.approvals
        .request(gated("globex", "gina", "rollback_deployment", json!({})))
        .await
        .expect("request");
    a.approvals
        .decide(
            "acme",
            two.id.as_str(),
            &approver("bob", "acme"),
            false,
            "no",
        )
        .await
        .expect("deny");

    let bob = admin_token("acme", "bob");
    let (status, headers, v) =
        get(&format!("{}/approvals?status=pending", a.base), Some(&bob)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(headers["cache-control"], "no-store");
    let list: ListView = serde_json::from_value(v).expect("list shape");
    assert_eq!(list.approvals.len(), 1);
    let item = &list.approvals[0];
    assert_eq!(item.approval.id, one.id);
    assert_eq!(item.approval.key.tool, "rollback_deployment");
    assert_eq!(item.approval.risk, Risk::Destructive);
    assert_eq!(item.approval.arguments["to"], "v41");
    assert_eq!(item.approval.key.run_id, "run-incident-4711");
    assert_eq!(item.approval.agent, "sre-lead");
    assert_eq!(item.approval.key.subject, "alice");
    assert_eq!(item.status_url, format!("{}/approvals/{}", a.base, one.id));
    assert!(list.now_ms > 0 && item.approval.expires_ms > list.now_ms);

    let (_, _, all) = get(&format!("{}/approvals", a.base), Some(&bob)).await;
    let all: ListView = serde_json::from_value(all).expect("list shape");
    assert_eq!(all.approvals.len(), 2, "pending and denied, not globex's");
    assert!(all
        .approvals
        .iter()
        .all(|v| v.approval.key.tenant == "acme"));
}

fn approver(sub: &str, tenant: &str) -> mcp_firewall::approval::Approver {
    mcp_firewall::approval::Approver {
        subject: sub.to_owned(),
        tenant: tenant.to_owned(),
        scopes: vec!["approvals".to_owned()],
    }
}

#[tokio::test]
async fn show_includes_the_preview_computed_once() {
    let a = admin(|_| {}).await;
    let calls = Arc::new(AtomicUsize::new(0));
    {
        let calls = calls.clone();
        a.approvals.set_preview(Arc::new(move |ap, _by| {
            calls.fetch_add(1, Ordering::SeqCst);
            let tool = ap.preview_tool.clone().unwrap_or_default();
            let args = (*ap.arguments).clone();
            Box::pin(
                async move { Ok(json!({"preview_of": tool, "pods_restarted": 12, "args": args})) },
            )
        }));
    }
    let mut n = gated(
        "acme",
        "alice",
        "rollback_deployment",
        json!({"deployment": "checkout"}),
    );
    n.preview_tool = Some("preview_remediation".to_owned());
    let p = a.approvals.request(n).await.expect("request");
    let bob = admin_token("acme", "bob");
    let url = format!("{}/approvals/{}", a.base, p.id);
    let (status, _, v) = get(&url, Some(&bob)).await;
    assert_eq!(status, 200, "{v}");
    let view: ApprovalView = serde_json::from_value(v).expect("view shape");
    let preview = view.preview.expect("preview present");
    assert_eq!(preview.tool, "preview_remediation");
    assert_eq!(preview.result.expect("result")["pods_restarted"], 12);
    assert_eq!(view.approval.status, Status::Pending);
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    assert!(
        now_ms.abs_diff(view.approval.created_ms) < 60_000,
        "created just now"
    );
    get(&url, Some(&bob)).await;
    get(&format!("{}/approvals?status=pending", a.base), Some(&bob)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "cached per approval");
}

#[tokio::test]
async fn approving_lets_the_call_run_once() {
    let a = admin(|_| {}).await;
    let p = a
        .approvals
        .request(gated(
            "acme",
            "alice",
            "rollback_deployment",
            json!({"deployment": "checkout"}),
        ))
        .await
        .expect("request");
    let bob = admin_token("acme", "bob");
    let (status, v) = decide(
        &a.base,
        &bob,
        p.id.as_str(),
        "approve",
        json!({"reason": "runbook step 3"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "approved");
    assert_eq!(v["decision"]["by"], "bob");
    assert_eq!(v["decision"]["reason"], "runbook step 3");
    let ran = a
        .approvals
        .consume(&p.key)
        .await
        .expect("approved call runs");
    assert_eq!(ran.id, p.id);
    assert!(a.approvals.consume(&p.key).await.is_none(), "once");
}

#[tokio::test]
async fn denying_needs_a_reason() {
    let a = admin(|_| {}).await;
    let p = a
        .approvals
        .request(gated(
            "acme",
            "alice",
            "delete_namespace",
            json!({"ns": "prod"}),
        ))
        .await
        .expect("request");
    let bob = admin_token("acme", "bob");
    let (status, v) = decide(&a.base, &bob, p.id.as_str(), "deny", json!({})).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"], "invalid_reason");
    let (status, v) = decide(
        &a.base,
        &bob,
        p.id.as_str(),
        "deny",
        json!({"reason": "prod freeze"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "denied");
    assert!(a.approvals.consume(&p.key).await.is_none());
}

#[tokio::test]
async fn a_tool_token_or_no_token_gets_401() {
    let a = admin(|_| {}).await;
    let p = a
        .approvals
        .request(gated("acme", "alice", "rollback_deployment", json!({})))
        .await
        .expect("request");
    // The run's own tool token, valid on /mcp, is worthless here.
    let mut tool_claims = common::claims("sre-lead", &["sre"]);
    tool_claims.sub = "bob".to_owned();
    let tool = common::sign(&tool_claims);
    let (status, v) = decide(&a.base, &tool, p.id.as_str(), "approve", json!({})).await;
    assert_eq!(status, 401, "{v}");
    let (status, headers, _) = get(&format!("{}/approvals", a.base), Some(&tool)).await;
    assert_eq!(status, 401);
    assert!(headers["www-authenticate"]
        .to_str()
        .expect("ascii")
        .starts_with("Bearer realm=\"mcp-firewall-admin\""));
    let (status, headers, _) = get(&format!("{}/approvals", a.base), None).await;
    assert_eq!(status, 401);
    assert!(headers.contains_key("www-authenticate"));
    assert_eq!(
        a.approvals
            .get("acme", p.id.as_str())
            .await
            .ok()
            .flatten()
            .expect("known")
            .status,
        Status::Pending
    );
}

#[tokio::test]
async fn another_tenants_approval_does_not_exist() {
    let a = admin(|_| {}).await;
    let p = a
        .approvals
        .request(gated("acme", "alice", "rollback_deployment", json!({})))
        .await
        .expect("request");
    let gina = admin_token("globex", "gina");
    let (status, _, v) = get(&format!("{}/approvals/{}", a.base, p.id), Some(&gina)).await;
    assert_eq!(status, 404);
    let (missing_status, _, missing) = get(
        &format!("{}/approvals/ap_AAAAAAAAAAAAAAAAAAAAAA", a.base),
        Some(&gina),
    )
    .await;
    assert_eq!(missing_status, 404);
    assert_eq!(v["error"], missing["error"], "same answer as a missing id");
    let (status, _) = decide(&a.base, &gina, p.id.as_str(), "approve", json!({})).await;
    assert_eq!(status, 404);
    assert_eq!(
        a.approvals
            .get("acme", p.id.as_str())
            .await
            .ok()
            .flatten()
            .expect("known")
            .status,
        Status::Pending
    );
}

#[tokio::test]
async fn self_approval_is_refused_by_default() {
    let a = admin(|_| {}).await;
    let mut n = gated("acme", "alice", "rollback_deployment", json!({}));
    n.self_approval = a.approvals.config().self_approval_default;
    let p = a.approvals.request(n).await.expect("request");
    let alice = admin_token("acme", "alice");
    let (status, v) = decide(&a.base, &alice, p.id.as_str(), "approve", json!({})).await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"], "self_approval");
    assert!(v["message"]
        .as_str()
        .expect("message")
        .contains("self-approval is not allowed"));
}

#[tokio::test]
async fn self_approval_is_allowed_when_configured() {
    let a = admin(|c| c.self_approval_default = true).await;
    let mut n = gated("acme", "alice", "rollback_deployment", json!({}));
    n.self_approval = a.approvals.config().self_approval_default;
    let p = a.approvals.request(n).await.expect("request");
    let alice = admin_token("acme", "alice");
    let (status, v) = decide(&a.base, &alice, p.id.as_str(), "approve", json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["decision"]["by"], "alice");
}

#[tokio::test]
async fn a_second_decision_is_a_conflict() {
    let a = admin(|_| {}).await;
    let p = a
        .approvals
        .request(gated("acme", "alice", "rollback_deployment", json!({})))
        .await
        .expect("request");
    let (bob, carol) = (admin_token("acme", "bob"), admin_token("acme", "carol"));
    let (status, _) = decide(&a.base, &bob, p.id.as_str(), "approve", json!({})).await;
    assert_eq!(status, 200);
    let (status, v) = decide(
        &a.base,
        &carol,
        p.id.as_str(),
        "deny",
        json!({"reason": "late"}),
    )
    .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"], "not_pending");
    assert!(v["message"]
        .as_str()
        .expect("message")
        .contains("already approved"));
}

#[tokio::test]
async fn an_expired_approval_is_gone() {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let clock = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(now_ms));
    let a = admin_on(|_| {}, Some(clock.clone())).await;
    let mut n = gated("acme", "alice", "rollback_deployment", json!({}));
    // The tool token dies in a second; so does the approval.
    n.token_exp = now_s() + 1;
    let p = a.approvals.request(n).await.expect("request");
    assert!(p.expires_ms <= (now_s() + 1) * 1000, "capped by the token");
    // Past the token's end.
    clock.store(p.expires_ms + 100, std::sync::atomic::Ordering::SeqCst);
    let bob = admin_token("acme", "bob");
    let (status, v) = decide(&a.base, &bob, p.id.as_str(), "approve", json!({})).await;
    assert_eq!(status, 410, "{v}");
    assert_eq!(v["error"], "expired");
    let (_, _, shown) = get(&format!("{}/approvals/{}", a.base, p.id), Some(&bob)).await;
    assert_eq!(shown["status"], "expired");
}

#[tokio::test]
async fn the_cli_lists_shows_and_decides() {
    let a = admin(|_| {}).await;
    a.approvals.set_preview(Arc::new(|_, _| {
        Box::pin(async { Ok(json!({"would_roll_back": "v42 -> v41"})) })
    }));
    let mut n = gated(
        "acme",
        "alice",
        "rollback_deployment",
        json!({"deployment": "checkout"}),
    );
    n.preview_tool = Some("preview_remediation".to_owned());
    let p = a.approvals.request(n).await.expect("request");
    let q = a
        .approvals
        .request(gated(
            "acme",
            "alice",
            "restart_service",
            json!({"service": "search"}),
        ))
        .await
        .expect("request");
    let bob = AdminClient::new(&a.base, &admin_token("acme", "bob")).expect("client");

    let listed = client::render_list(&bob.list(Some(Status::Pending)).await.expect("list"));
    assert!(
        listed.contains(p.id.as_str()) && listed.contains(q.id.as_str()),
        "{listed}"
    );
    assert!(
        listed.contains("rollback_deployment on incidents"),
        "{listed}"
    );
    assert!(listed.contains("asked by alice"), "{listed}");

    let shown = client::render_approval(&bob.show(p.id.as_str()).await.expect("show"), 0);
    assert!(shown.contains("status    PENDING"), "{shown}");
    assert!(shown.contains("\"deployment\": \"checkout\""), "{shown}");
    assert!(shown.contains("preview (preview_remediation):"), "{shown}");
    assert!(shown.contains("v42 -> v41"), "{shown}");

    let args = client::ApprovalsArgs {
        admin: a.base.clone(),
        token: admin_token("acme", "bob"),
        command: client::ApprovalsCommand::Approve {
            id: p.id.to_string(),
            reason: "ok".to_owned(),
        },
    };
    let out = client::run(&args).await.expect("approve");
    assert!(out.starts_with(&format!("approved {}", p.id)), "{out}");
    assert_eq!(
        a.approvals
            .get("acme", p.id.as_str())
            .await
            .ok()
            .flatten()
            .expect("known")
            .status,
        Status::Approved
    );

    match bob.decide(p.id.as_str(), false, "too late").await {
        Err(ClientError::Refused {
            status: 409,
            code,
            message,
        }) => {
            assert_eq!(code, "not_pending");
            assert!(message.contains("already approved"), "{message}");
        }
        other => panic!("expected a 409 refusal, got {other:?}"),
    }
    let denied = bob
        .decide(q.id.as_str(), false, "not now")
        .await
        .expect("deny");
    assert_eq!(denied.approval.status, Status::Denied);
    let gina = AdminClient::new(&a.base, &admin_token("globex", "gina")).expect("client");
    assert!(matches!(
        gina.show(q.id.as_str()).await,
        Err(ClientError::Refused { status: 404, .. })
    ));
}

#[tokio::test]
async fn the_console_is_static_and_locked_down() {
    let a = admin(|_| {}).await;
    let resp = common::http()
        .get(format!("{}/console", a.base))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200, "no token needed to load the page");
    let h = resp.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    let csp = h["content-security-policy"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(csp.contains("script-src 'sha256-"), "{csp}");
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    assert!(csp.contains("require-trusted-types-for 'script'"), "{csp}");
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(h["x-frame-options"], "DENY");
    let body = resp.text().await.expect("body");
    assert_eq!(
        body,
        console::HTML,
        "served byte for byte: no data spliced in"
    );
}

#[tokio::test]
async fn the_console_approves_in_headless_chromium() {
    let a = admin(|_| {}).await;
    // Arguments an attacker controls: must show as text, never as markup.
    let hostile = "<img src=x onerror=document.title='pwned'>";
    let p = a
        .approvals
        .request(gated(
            "acme",
            "alice",
            "rollback_deployment",
            json!({"deployment": "checkout", "note": hostile}),
        ))
        .await
        .expect("request");
    let browser = Browser::start().await;
    browser
        .sign_in(
            &format!("{}/console#{}", a.base, p.id),
            &admin_token("acme", "bob"),
        )
        .await;

    let card_css = format!("section.approval[data-id=\"{}\"]", p.id);
    let card = browser.wait_for(&card_css, Duration::from_secs(10)).await;
    let text = browser.text(&card).await;
    assert!(text.contains("rollback_deployment"), "{text}");
    assert!(text.to_lowercase().contains("destructive"), "{text}");
    assert!(text.contains("run-incident-4711"), "{text}");
    assert!(
        text.contains(hostile),
        "hostile argument shown as text: {text}"
    );
    assert!(text.contains("expires in"), "countdown: {text}");
    browser.assert_no_markup_injected().await;

    let approve = browser
        .wait_for(
            &format!("{card_css} button.approve"),
            Duration::from_secs(5),
        )
        .await;
    browser.click(&approve).await;
    let armed = browser.text(&approve).await;
    assert!(armed.starts_with("Click again to approve"), "{armed}");
    assert_eq!(
        a.approvals
            .get("acme", p.id.as_str())
            .await
            .ok()
            .flatten()
            .expect("known")
            .status,
        Status::Pending,
        "one click does not approve"
    );
    browser.record_status().await;
    browser.click(&approve).await;

    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = a
            .approvals
            .get("acme", p.id.as_str())
            .await
            .ok()
            .flatten()
            .expect("known")
            .status;
        if status == Status::Approved {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {status} after clicking approve; page: {}",
            browser.page_text().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let decided = a
        .approvals
        .get("acme", p.id.as_str())
        .await
        .ok()
        .flatten()
        .expect("known");
    assert_eq!(decided.decision.expect("decision").by, "bob");
    browser
        .wait_said("ok", "Approved rollback_deployment", Duration::from_secs(5))
        .await;
    assert!(
        a.approvals.consume(&p.key).await.is_some(),
        "the held call may now run"
    );
}
