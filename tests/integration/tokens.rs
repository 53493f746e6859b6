//! Tool tokens at the HTTP level: what a client sees for a missing, invalid,
//! misdirected or insufficient token, OAuth discovery metadata, and authority
//! (an upstream outside the run's projects does not exist).

use serde_json::{json, Value};

use crate::common::{self, raw};
use mcp_firewall::auth::{Audience, Mode};

const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

async fn setup() -> (common::Firewall, raw::RawUpstream) {
    let up = raw::upstream(|seen| async move { raw::result_for(&seen, json!({})) }).await;
    let fw = common::firewall(&common::TestConfig::new().upstream("u", &up.url()).text()).await;
    (fw, up)
}

async fn post_with(fw: &common::Firewall, headers: &[(&str, String)]) -> reqwest::Response {
    let mut req = common::http()
        .post(fw.mcp_url("u"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    req.body(PING).send().await.unwrap()
}

fn challenge(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("www-authenticate")
        .expect("WWW-Authenticate present")
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn missing_token_is_401_with_resource_metadata() {
    let (fw, up) = setup().await;
    let resp = post_with(&fw, &[]).await;
    assert_eq!(resp.status(), 401);
    let c = challenge(&resp);
    assert!(c.starts_with("Bearer "), "{c}");
    assert!(
        c.contains(&format!(
            "resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp/u\"",
            fw.base
        )),
        "{c}"
    );
    assert!(c.contains("scope=\"mcp:tools\""), "{c}");
    assert!(!c.contains("error="), "no error code without a token: {c}");
    assert_eq!(up.hits(), 0);
    fw.stop().await;
}

#[tokio::test]
async fn forged_token_is_401_invalid_token() {
    let (fw, up) = setup().await;
    let token = common::token();
    // Flip a character of the signature.
    let mut forged = token.clone().into_bytes();
    let last = forged.len() - 2;
    forged[last] = if forged[last] == b'A' { b'B' } else { b'A' };
    let resp = post_with(
        &fw,
        &[(
            "authorization",
            format!("Bearer {}", String::from_utf8(forged).unwrap()),
        )],
    )
    .await;
    assert_eq!(resp.status(), 401);
    let c = challenge(&resp);
    assert!(c.contains("error=\"invalid_token\""), "{c}");
    assert!(c.contains("error_description="), "{c}");
    assert_eq!(up.hits(), 0);
    fw.stop().await;
}

#[tokio::test]
async fn expired_token_is_refused() {
    let (fw, up) = setup().await;
    // A token minted for 1 s, used after the leeway (30 s) would be needed;
    // instead mint with a lifetime beyond the maximum: refused as too long.
    let mut auth = common::config_builder::auth();
    auth.insert("max_lifetime_s".to_owned(), 86400.into());
    let cfg: mcp_firewall::auth::AuthConfig = auth.try_into().unwrap();
    let long = mcp_firewall::auth::mint(
        &cfg,
        &common::claims("sre-lead", &["sre"]),
        std::time::Duration::from_secs(3600),
    )
    .unwrap();
    let resp = post_with(&fw, &[("authorization", format!("Bearer {long}"))]).await;
    assert_eq!(resp.status(), 401);
    assert!(challenge(&resp).contains("invalid_token"));
    assert_eq!(up.hits(), 0);
    fw.stop().await;
}

#[tokio::test]
async fn admin_token_is_refused_on_the_mcp_path() {
    let (fw, up) = setup().await;
    let mut claims = common::claims("sre-lead", &["sre"]);
    claims.audience = Audience::Admin;
    let admin = common::sign(&claims);
    let resp = post_with(&fw, &[("authorization", format!("Bearer {admin}"))]).await;
    assert_eq!(resp.status(), 401);
    assert!(challenge(&resp).contains("invalid_token"));
    assert_eq!(up.hits(), 0);
    fw.stop().await;
}

#[tokio::test]
async fn two_different_tokens_are_400() {
    let (fw, up) = setup().await;
    let a = common::token();
    let b = common::token();
    assert_ne!(a, b);
    let resp = post_with(
        &fw,
        &[
            ("authorization", format!("Bearer {a}")),
            ("x-tool-token", b),
        ],
    )
    .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(up.hits(), 0);
    // The same token in both places is fine.
    let resp = post_with(
        &fw,
        &[
            ("authorization", format!("Bearer {a}")),
            ("x-tool-token", a.clone()),
        ],
    )
    .await;
    assert_eq!(resp.status(), 200);
    fw.stop().await;
}

#[tokio::test]
async fn token_in_the_tool_token_header_works() {
    let (fw, up) = setup().await;
    let resp = post_with(&fw, &[("x-tool-token", common::token())]).await;
    assert_eq!(resp.status(), 200);
    assert!(up.seen()[0].headers.get("x-tool-token").is_none());
    fw.stop().await;
}

#[tokio::test]
async fn missing_scope_is_403_insufficient_scope() {
    let (fw, up) = setup().await;
    let mut claims = common::claims("sre-lead", &["sre"]);
    claims.scopes = vec!["profile".into()];
    let resp = post_with(
        &fw,
        &[("authorization", format!("Bearer {}", common::sign(&claims)))],
    )
    .await;
    assert_eq!(resp.status(), 403);
    assert!(challenge(&resp).contains("insufficient_scope"));
    assert_eq!(up.hits(), 0);
    fw.stop().await;
}

#[tokio::test]
async fn upstream_outside_the_runs_projects_looks_like_no_upstream() {
    let (fw, up) = setup().await;
    let unknown = common::http()
        .post(fw.mcp_url("nope"))
        .bearer_auth(common::token())
        .header("content-type", "application/json")
        .body(PING)
        .send()
        .await
        .unwrap();
    let unknown_status = unknown.status();
    let unknown_body: Value = unknown.json().await.unwrap();
    // data-analyst's memberships (data, sre) ∩ caller's projects (data) = data;
    // upstream u is in project sre.
    for token in [
        common::sign(&common::claims("data-analyst", &["data"])),
        common::sign(&common::claims("no-such-role", &["sre"])),
        common::sign(&common::claims("sre-lead", &["marketing"])),
    ] {
        let resp = common::http()
            .post(fw.mcp_url("u"))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(PING)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), unknown_status);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"], unknown_body["error"]);
        assert_eq!(
            v["message"].as_str().unwrap().replace("\"u\"", "X"),
            unknown_body["message"]
                .as_str()
                .unwrap()
                .replace("\"nope\"", "X")
        );
    }
    assert_eq!(up.hits(), 0);
    fw.stop().await;
}

#[tokio::test]
async fn agent_mode_and_ceiling_shape_authority() {
    let (fw, up) = setup().await;
    // Scheduled agent run: no caller projects needed, memberships apply.
    let mut c = common::claims("incident-investigator", &[]);
    c.mode = Mode::Agent;
    let resp = post_with(
        &fw,
        &[("authorization", format!("Bearer {}", common::sign(&c)))],
    )
    .await;
    assert_eq!(resp.status(), 200);
    // The same run with a ceiling that excludes sre reaches nothing.
    c.project_ceiling = Some(vec!["data".into()]);
    let resp = post_with(
        &fw,
        &[("authorization", format!("Bearer {}", common::sign(&c)))],
    )
    .await;
    assert_eq!(resp.status(), 404);
    // Service accounts: exactly their bindings, from the service issuer.
    let mut sa = common::claims("reporter", &[]);
    sa.mode = Mode::ServiceAccount;
    sa.sub = "svc-nightly-report".into();
    let resp = post_with(
        &fw,
        &[("authorization", format!("Bearer {}", common::sign(&sa)))],
    )
    .await;
    assert_eq!(resp.status(), 200);
    sa.sub = "svc-impostor".into();
    let resp = post_with(
        &fw,
        &[("authorization", format!("Bearer {}", common::sign(&sa)))],
    )
    .await;
    assert_eq!(resp.status(), 404);
    assert_eq!(up.hits(), 2);
    fw.stop().await;
}

#[tokio::test]
async fn protected_resource_metadata_is_served() {
    let (fw, _up) = setup().await;
    for path in [
        "/.well-known/oauth-protected-resource/mcp/u",
        "/.well-known/oauth-protected-resource/mcp/anything",
    ] {
        let v: Value = common::http()
            .get(format!("{}{path}", fw.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(v["resource"]
            .as_str()
            .unwrap()
            .ends_with(path.trim_start_matches("/.well-known/oauth-protected-resource")));
        assert_eq!(v["authorization_servers"], json!([common::ISSUER]));
        assert_eq!(v["scopes_supported"], json!(["mcp:tools"]));
    }
    let root: Value = common::http()
        .get(format!("{}/.well-known/oauth-protected-resource", fw.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(root["resource"], fw.base);
    fw.stop().await;
}
