//! Request-level tests of the API's edges (authentication, routing,
//! bodies) with real tokens and a real verifier; the flows over real HTTP
//! are in `tests/integration/approvals_api.rs`.

use std::time::Duration;

use http_body_util::Full;
use serde_json::json;

use super::super::service::tests::{clock_at, key, new_approval, open_in, T0};
use super::*;
use crate::auth::{mint, AuthConfig, MintClaims, Mode};

const SECRET: &str = "api-tests-secret-that-is-long-enough-for-hs256";

fn auth_config() -> AuthConfig {
    toml::from_str(&format!(
        "mcp_audience = \"mcp-firewall\"\nadmin_audience = \"mcp-firewall-admin\"\nissuers = [\"https://idp.test\"]\n[[keys]]\nalg = \"HS256\"\nsecret = \"{SECRET}\"\n"
    ))
    .expect("auth config")
}

fn token(audience: Audience, sub: &str) -> String {
    let claims = MintClaims {
        audience,
        issuer: None,
        sub: sub.to_owned(),
        tenant_id: "acme".to_owned(),
        agent: "console".to_owned(),
        run_id: "admin".to_owned(),
        mode: Mode::Caller,
        projects: vec!["sre".to_owned()],
        project_ceiling: None,
        scopes: Vec::new(),
        jti: None,
        run_exp: None,
    };
    mint(&auth_config(), &claims, Duration::from_secs(300)).expect("mint")
}

struct Api {
    approvals: Arc<Approvals>,
    verifier: Verifier,
    _dir: tempfile::TempDir,
}

impl Api {
    async fn new() -> Api {
        let dir = tempfile::tempdir().expect("dir");
        let (approvals, _r) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
        let verifier = Verifier::new(&auth_config()).await.expect("verifier");
        Api {
            approvals,
            verifier,
            _dir: dir,
        }
    }

    async fn send(&self, req: Request<Full<Bytes>>) -> Option<(StatusCode, HeaderMap, Value)> {
        let resp = handle(self.approvals.clone(), self.verifier.clone(), req).await?;
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.expect("body").to_bytes();
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Some((parts.status, parts.headers, v))
    }
}

fn get(path: &str, bearer: Option<&str>) -> Request<Full<Bytes>> {
    let mut b = Request::get(path);
    if let Some(t) = bearer {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    b.body(Full::new(Bytes::new())).expect("request")
}

fn post(path: &str, bearer: &str, content_type: &str, body: &[u8]) -> Request<Full<Bytes>> {
    Request::post(path)
        .header(header::AUTHORIZATION, format!("Bearer {bearer}"))
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::copy_from_slice(body)))
        .expect("request")
}

#[test]
fn owns_only_its_paths() {
    for p in [
        "/console",
        "/approvals",
        "/approvals/",
        "/approvals/ap_x/deny",
    ] {
        assert!(owns(p), "{p}");
    }
    for p in ["/healthz", "/metrics", "/approvalsx", "/console/x", "/"] {
        assert!(!owns(p), "{p}");
    }
}

#[tokio::test]
async fn other_paths_fall_through() {
    let api = Api::new().await;
    assert!(api.send(get("/metrics", None)).await.is_none());
}

#[tokio::test]
async fn missing_or_malformed_credentials_are_401_with_a_challenge() {
    let api = Api::new().await;
    let (status, headers, body) = api.send(get("/approvals", None)).await.expect("ours");
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        headers[header::WWW_AUTHENTICATE],
        "Bearer realm=\"mcp-firewall-admin\""
    );
    assert_eq!(body["error"], "unauthorized");

    let basic = Request::get("/approvals/ap_x")
        .header(header::AUTHORIZATION, "Basic YWxpY2U6cHc=")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let (status, headers, _) = api.send(basic).await.expect("ours");
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers[header::WWW_AUTHENTICATE]
        .to_str()
        .expect("ascii")
        .contains("error=\"invalid_token\""));

    // Unknown paths are not revealed before authentication either.
    let (status, _, _) = api.send(get("/approvals/a/b/c", None)).await.expect("ours");
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_tool_token_is_refused_on_the_admin_api() {
    let api = Api::new().await;
    let tool = token(Audience::Mcp, "bob");
    let (status, headers, body) = api
        .send(get("/approvals", Some(&tool)))
        .await
        .expect("ours");
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers.contains_key(header::WWW_AUTHENTICATE));
    let msg = body["message"].as_str().expect("message");
    assert!(msg.starts_with("admin token refused:"), "{msg}");
}

#[tokio::test]
async fn routing_errors_name_what_is_wrong() {
    let api = Api::new().await;
    let admin = token(Audience::Admin, "bob");
    let (status, _, _) = api
        .send(get("/approvals/ap_x/nothing", Some(&admin)))
        .await
        .expect("ours");
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, headers, _) = api
        .send(get("/approvals/ap_x/approve", Some(&admin)))
        .await
        .expect("ours");
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers[header::ALLOW], "POST");

    let (status, _, body) = api
        .send(get("/approvals?status=maybe", Some(&admin)))
        .await
        .expect("ours");
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["message"]
        .as_str()
        .expect("message")
        .contains("\"maybe\""));

    let (status, _, _) = api
        .send(get("/approvals?tenant=globex", Some(&admin)))
        .await
        .expect("ours");
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "the tenant comes from the token"
    );

    let console_post = Request::post("/console")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let (status, headers, _) = api.send(console_post).await.expect("ours");
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers[header::ALLOW], "GET");
}

#[tokio::test]
async fn decision_bodies_are_checked() {
    let api = Api::new().await;
    let p = api
        .approvals
        .request(new_approval(key("restart", &json!({}))))
        .await
        .expect("request");
    let admin = token(Audience::Admin, "bob");
    let path = format!("/approvals/{}/deny", p.id);

    let (status, _, _) = api
        .send(post(&path, &admin, "text/plain", b"{\"reason\":\"x\"}"))
        .await
        .expect("ours");
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let (status, _, body) = api
        .send(post(
            &path,
            &admin,
            "application/json",
            b"{\"reason\":\"x\",\"approve\":true}",
        ))
        .await
        .expect("ours");
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["message"]
        .as_str()
        .expect("message")
        .contains("approve"));

    let big = format!("{{\"reason\":\"{}\"}}", "x".repeat(MAX_BODY_BYTES));
    let (status, _, _) = api
        .send(post(&path, &admin, "application/json", big.as_bytes()))
        .await
        .expect("ours");
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    let (status, _, body) = api
        .send(post(&path, &admin, "application/json", b""))
        .await
        .expect("ours");
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid_reason");
    assert_eq!(
        api.approvals
            .get("acme", p.id.as_str())
            .await
            .ok()
            .flatten()
            .expect("get")
            .status,
        Status::Pending,
        "nothing was decided by refused requests"
    );

    let (status, headers, body) = api
        .send(post(
            &path,
            &admin,
            "application/json; charset=utf-8",
            b"{\"reason\":\"freeze\"}",
        ))
        .await
        .expect("ours");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[header::CACHE_CONTROL], "no-store");
    assert_eq!(body["status"], "denied");
    assert_eq!(body["decision"]["reason"], "freeze");
}
