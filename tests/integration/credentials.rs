//! Delegated upstream credentials (issue 59, `auth = "token_exchange"`)
//! against a real authorization server (`tests/idp/as.py`, built on
//! Authlib: RFC 8693, client credentials) and a recording upstream that
//! reads the bearer it receives: each run reaches the upstream with its
//! own exchanged token (the upstream's audience, the firewall as actor,
//! the run's id), a run's second call reuses it, an expired one is
//! exchanged again, the firewall's own calls use its own token, and an
//! identity provider that refuses, fails or cannot be reached gives
//! `-31007` with nothing sent; in both eras, and on record.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::clickhouse::ClickHouse;
use crate::common::idp::{self, Idp, IdpConfig};
use crate::common::{self, raw, Firewall, TestConfig};
use crate::screening::{call, Era};

pub(crate) const POLICY: &str = r#"
[[agents]]
name = "assistant"
description = "Reads tickets"
projects = ["sre"]
risks = ["read"]
allow = [{}]

[[tools]]
upstream = "tickets"
match = ["get_ticket"]
risk = "read"
"#;

pub(crate) const CLIENT_SECRET: &str = "s3cret: the firewall's own";

/// The upstream: one read tool; every request's `Authorization` kept.
pub(crate) async fn tickets() -> raw::RawUpstream {
    raw::upstream(|seen| async move {
        let body: Value = serde_json::from_slice(&seen.body).unwrap_or_default();
        match body["method"].as_str() {
            Some("tools/list") => raw::result_for(
                &seen,
                json!({"tools": [{"name": "get_ticket", "description": "Reads a ticket", "inputSchema": {"type": "object"}}]}),
            ),
            Some("tools/call") => raw::result_for(
                &seen,
                json!({"content": [{"type": "text", "text": "ticket 42: printer on fire"}]}),
            ),
            _ => raw::result_for(&seen, json!({})),
        }
    })
    .await
}

pub(crate) async fn provider(lifetime_s: u64) -> Idp {
    Idp::start(IdpConfig {
        clients: vec![json!({
            "client_id": "mcp-firewall",
            "client_secret": CLIENT_SECRET,
            "grant_types": ["urn:ietf:params:oauth:grant-type:token-exchange", "client_credentials"],
            "token_endpoint_auth_method": "client_secret_basic",
            "scope": "tickets:read tickets:write",
        })],
        subject_issuer: common::ISSUER.to_owned(),
        subject_jwks: idp::hs256_jwks(common::SECRET.as_bytes(), None),
        default_audience: "nobody".to_owned(),
        token_lifetime_s: lifetime_s,
    })
    .await
}

struct Rig {
    idp: Idp,
    up: raw::RawUpstream,
    fw: Firewall,
    _policy: tempfile::TempDir,
    _secret: tempfile::TempDir,
}

pub(crate) fn exchange_section(token_endpoint: &str, secret_file: &std::path::Path) -> toml::Value {
    toml::Value::Table(common::table([
        ("token_endpoint", token_endpoint.into()),
        ("client_id", "mcp-firewall".into()),
        (
            "client_secret",
            toml::Value::Table(common::table([(
                "file",
                secret_file.display().to_string().into(),
            )])),
        ),
        ("audience", "tickets".into()),
        ("scope", "tickets:read".into()),
        ("timeout_ms", 2000.into()),
    ]))
}

async fn rig_with(lifetime_s: u64, audit: Option<(&ClickHouse, &str, &std::path::Path)>) -> Rig {
    let idp = provider(lifetime_s).await;
    let up = tickets().await;
    let policy = common::policy_dir(&[("90-tickets.toml", POLICY)]);
    let secret = tempfile::tempdir().unwrap();
    let secret_file = secret_file(secret.path());
    let mut cfg = exchanging(
        TestConfig::new().policies(policy.path()),
        "tickets",
        &up.url(),
        exchange_section(&idp.token_endpoint, &secret_file),
    );
    if let Some((ch, db, spool)) = audit {
        cfg = cfg.audit("fw-credentials", &ch.http_url, db, spool);
    }
    let fw = common::firewall(&cfg.text()).await;
    Rig {
        idp,
        up,
        fw,
        _policy: policy,
        _secret: secret,
    }
}

fn run_token() -> (String, String) {
    let claims = common::claims("assistant", &["sre"]);
    let run = claims.run_id.clone();
    (common::sign(&claims), run)
}

/// `cfg` with upstream `name` at `url` taking exchanged tokens
/// (`section`: its `[upstream.token_exchange]`).
pub(crate) fn exchanging(
    cfg: TestConfig,
    name: &str,
    url: &str,
    section: toml::Value,
) -> TestConfig {
    cfg.upstream(name, url)
        .upstream_set(name, "auth", "token_exchange")
        .upstream_set(name, "token_exchange", section)
}

/// The client secret, in a file of `dir`.
pub(crate) fn secret_file(dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join("client-secret");
    std::fs::write(&file, format!("{CLIENT_SECRET}\n")).unwrap();
    file
}

/// `get_ticket` on `tickets`, in `era`, as the holder of `token`.
pub(crate) async fn get_ticket(fw: &Firewall, era: Era, token: &str) -> common::Answer {
    call(fw, era, token, "tickets", "get_ticket", json!({})).await
}

/// The bearers the upstream received with `method`, in order.
pub(crate) fn bearers(up: &raw::RawUpstream, method: &str) -> Vec<String> {
    up.seen()
        .iter()
        .filter(|s| {
            serde_json::from_slice::<Value>(&s.body).unwrap_or_default()["method"] == method
        })
        .map(|s| {
            s.headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or_else(|| panic!("no bearer on a {method}: {:?}", s.headers))
                .to_owned()
        })
        .collect()
}

fn exchanges_for(log: &[Value], run: &str) -> usize {
    log.iter()
        .filter(|e| {
            e["grant_type"] == "urn:ietf:params:oauth:grant-type:token-exchange"
                && e["subject_run_id"] == run
                && e["ok"] == true
        })
        .count()
}

fn text_of(a: &common::Answer) -> String {
    a.json()["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no result text: {}", a.text))
        .to_owned()
}

#[tokio::test]
async fn each_run_reaches_the_upstream_with_its_own_exchanged_token_in_both_eras() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let rig = rig_with(300, Some((ch, &db, spool.path()))).await;
    let jwks = rig.idp.public_jwks().await;
    let (token_a, run_a) = run_token();
    let (token_b, run_b) = run_token();

    // Run A in sessions, run B stateless; each calls twice.
    for _ in 0..2 {
        let a = get_ticket(&rig.fw, Era::Sessions, &token_a).await;
        assert_eq!(text_of(&a), "ticket 42: printer on fire");
        let b = get_ticket(&rig.fw, Era::Stateless, &token_b).await;
        assert_eq!(text_of(&b), "ticket 42: printer on fire");
    }
    let calls = bearers(&rig.up, "tools/call");
    assert_eq!(calls.len(), 4);
    // A run's second call uses its first call's token; the runs' differ.
    assert_eq!(calls[0], calls[2], "run A reuses its token");
    assert_eq!(calls[1], calls[3], "run B reuses its token");
    assert_ne!(calls[0], calls[1], "two runs, two tokens");
    for (bearer, run) in [(&calls[0], &run_a), (&calls[1], &run_b)] {
        let c = idp::verify(bearer, &jwks, "tickets");
        assert_eq!(c["aud"], "tickets", "{c}");
        assert_eq!(c["act"]["sub"], "mcp-firewall", "the firewall acts: {c}");
        assert_eq!(c["sub"], "alice", "for the user: {c}");
        assert_eq!(c["run_id"], run.as_str(), "{c}");
        assert_eq!(c["scope"], "tickets:read", "{c}");
        assert_eq!(c["iss"], rig.idp.issuer.as_str());
    }
    // Another principal whose token names run A's id: its own exchange,
    // never run A's token.
    let mut other = common::claims("assistant", &["sre"]);
    other.run_id = run_a.clone();
    other.tenant_id = "globex".to_owned();
    other.sub = "mallory".to_owned();
    let m = call(
        &rig.fw,
        Era::Sessions,
        &common::sign(&other),
        "tickets",
        "get_ticket",
        json!({}),
    )
    .await;
    assert_eq!(text_of(&m), "ticket 42: printer on fire");
    let calls = bearers(&rig.up, "tools/call");
    assert_eq!(calls.len(), 5);
    assert!(
        !calls[..4].contains(&calls[4]),
        "another principal's run has its own token"
    );
    assert_eq!(idp::verify(&calls[4], &jwks, "tickets")["sub"], "mallory");
    // One exchange per run, the tool token as subject.
    let log = rig.idp.log().await;
    assert_eq!(
        exchanges_for(&log, &run_a),
        2,
        "alice's and mallory's: {log:?}"
    );
    assert_eq!(exchanges_for(&log, &run_b), 1, "{log:?}");
    // The firewall's own listing went with its own token (client
    // credentials): no run, no user.
    let lists = bearers(&rig.up, "tools/list");
    assert!(!lists.is_empty(), "the catalog was filled");
    for l in &lists {
        let c = idp::verify(l, &jwks, "tickets");
        assert_eq!(c["sub"], "mcp-firewall", "{c}");
        assert!(c.get("run_id").is_none(), "{c}");
        assert!(!calls.contains(l));
    }
    let metrics = rig.fw.metrics().await;
    assert!(
        metrics.contains(r#"upstream_credential_exchanges_total{upstream="tickets",purpose="run",outcome="ok"} 3"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"upstream_credential_cache_hits_total{upstream="tickets"} 2"#),
        "{metrics}"
    );

    // On record: what each call reached the upstream with, by id only.
    let id_a = credential_id(&calls[0]);
    let sql = format!(
        "SELECT count() FROM {db}.audit_events FINAL WHERE tool = 'get_ticket' AND run_id = '{run_a}' AND upstream_auth = 'exchange' AND credential_id = '{id_a}' AND row_version = 1"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while ch.try_query(&sql).map(|t| t.trim().to_owned()) != Ok("2".to_owned()) {
        assert!(Instant::now() < deadline, "{sql}: {:?}", ch.try_query(&format!("SELECT run_id, tool, upstream_auth, credential_id, row_version FROM {db}.audit_events FORMAT TSV")));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The token itself is nowhere on record.
    let leaked = ch.query_u64(&format!(
        "SELECT count() FROM {db}.audit_events WHERE position(arguments, '{t}') > 0 OR position(result_summary, '{t}') > 0 OR position(reason, '{t}') > 0 OR credential_id = '{t}'",
        t = &calls[0][..40]
    ));
    assert_eq!(leaked, 0);
    rig.fw.stop().await;
}

/// The id the firewall records of an exchanged token (as
/// `credential::credential_id` makes it).
fn credential_id(token: &str) -> String {
    credential_id_of("exchange", token)
}

/// The id the firewall records of a token of `kind` (`exchange`, `user`).
pub(crate) fn credential_id_of(kind: &str, token: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"mcp-firewall credential id v1\0");
    h.update((kind.len() as u64).to_be_bytes());
    h.update(kind.as_bytes());
    h.update(token.as_bytes());
    hex::encode(&h.finalize()[..16])
}

#[tokio::test]
async fn an_expired_exchanged_token_is_exchanged_again() {
    // Tokens of 6 s are sent for 1 s (a tenth, at least five seconds,
    // kept back).
    let rig = rig_with(6, None).await;
    let (token, run) = run_token();
    let a = get_ticket(&rig.fw, Era::Sessions, &token).await;
    assert_eq!(text_of(&a), "ticket 42: printer on fire");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let a = get_ticket(&rig.fw, Era::Sessions, &token).await;
    assert_eq!(text_of(&a), "ticket 42: printer on fire");
    let calls = bearers(&rig.up, "tools/call");
    assert_eq!(calls.len(), 2);
    assert_ne!(
        calls[0], calls[1],
        "a fresh token after the first one's time"
    );
    assert_eq!(exchanges_for(&rig.idp.log().await, &run), 2);
    rig.fw.stop().await;
}

#[tokio::test]
async fn a_provider_that_refuses_fails_or_is_gone_gives_31007_and_nothing_is_sent() {
    let rig = rig_with(300, None).await;
    // The catalog is filled first (the firewall's own token), so that what
    // follows is the run's exchange alone.
    let (warm, _) = run_token();
    let a = get_ticket(&rig.fw, Era::Sessions, &warm).await;
    assert_eq!(text_of(&a), "ticket 42: printer on fire");
    let sent = bearers(&rig.up, "tools/call").len();
    for (mode, outcome) in [
        ("refuse", "refused"),
        ("error500", "unavailable"),
        ("garbage", "invalid"),
        ("slow", "unavailable"),
    ] {
        rig.idp.set_mode(mode).await;
        for era in [Era::Sessions, Era::Stateless] {
            let (token, _) = run_token();
            let a = get_ticket(&rig.fw, era, &token).await;
            assert_eq!(a.status, 200, "{mode}: {}", a.text);
            let v = a.json();
            assert_eq!(v["error"]["code"], -31007, "{mode} {era:?}: {}", a.text);
            assert_eq!(v["error"]["message"], "upstream credential unavailable");
            assert!(
                !a.text.contains(CLIENT_SECRET) && !a.text.contains(&token),
                "{}",
                a.text
            );
        }
        assert_eq!(
            bearers(&rig.up, "tools/call").len(),
            sent,
            "{mode}: nothing reached the upstream"
        );
        let metrics = rig.fw.metrics().await;
        assert!(
            metrics.contains(&format!(r#"upstream_credential_exchanges_total{{upstream="tickets",purpose="run",outcome="{outcome}"}}"#)),
            "{mode}: {metrics}"
        );
    }
    // While it fails the firewall says it is degraded (not unready: every
    // replica asks the same provider); one exchange that succeeds ends it.
    let ready = readyz(&rig.fw).await;
    assert!(
        ready.contains("degraded: upstream_credentials_unavailable"),
        "{ready}"
    );
    rig.idp.set_mode("ok").await;
    let (token, _) = run_token();
    let a = get_ticket(&rig.fw, Era::Sessions, &token).await;
    assert_eq!(text_of(&a), "ticket 42: printer on fire");
    let ready = readyz(&rig.fw).await;
    assert!(
        !ready.contains("upstream_credentials_unavailable"),
        "{ready}"
    );
    let sent = sent + 1;
    // A provider that is gone.
    drop(rig.idp);
    let (token, _) = run_token();
    let a = get_ticket(&rig.fw, Era::Sessions, &token).await;
    assert_eq!(a.json()["error"]["code"], -31007, "{}", a.text);
    assert_eq!(bearers(&rig.up, "tools/call").len(), sent);
    rig.fw.stop().await;
}

/// A session's GET stream and DELETE reach the upstream with the run's
/// exchanged token too, and get HTTP 502 with `-31007` (nothing sent) when
/// none can be had.
#[tokio::test]
async fn a_sessions_get_stream_and_delete_use_the_runs_token_or_are_refused() {
    // Tokens of 6 s are kept for 1 s: the GET after the wait exchanges again.
    let idp = provider(6).await;
    let up = raw::mcp().await;
    let secret = tempfile::tempdir().unwrap();
    let secret_file = secret_file(secret.path());
    let cfg = exchanging(
        TestConfig::new(),
        "incidents",
        &up.url(),
        exchange_section(&idp.token_endpoint, &secret_file),
    );
    let fw = common::firewall(&cfg.text()).await;
    let jwks = idp.public_jwks().await;
    let claims = common::claims("sre-lead", &["sre"]);
    let token = common::sign(&claims);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let a = common::post(&fw.mcp_url("incidents"), &token, &[], init).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let sid = a.headers["mcp-session-id"].to_str().unwrap().to_owned();
    let stream = [
        ("mcp-session-id", sid.as_str()),
        ("accept", "text/event-stream"),
    ];
    let a = common::send(
        reqwest::Method::GET,
        &fw.mcp_url("incidents"),
        Some(&token),
        &stream,
        None,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let get = up
        .seen()
        .into_iter()
        .rfind(|s| s.method == "GET")
        .expect("the GET went");
    let bearer = get.headers["authorization"]
        .to_str()
        .unwrap()
        .strip_prefix("Bearer ")
        .unwrap()
        .to_owned();
    let c = idp::verify(&bearer, &jwks, "tickets");
    assert_eq!(c["run_id"], claims.run_id.as_str(), "{c}");

    // The kept token's time is up and the provider refuses: refused here.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    idp.set_mode("refuse").await;
    let hits = up.hits();
    let a = common::send(
        reqwest::Method::GET,
        &fw.mcp_url("incidents"),
        Some(&token),
        &stream,
        None,
    )
    .await;
    assert_eq!(a.status, 502, "{}", a.text);
    assert_eq!(a.json()["error"]["code"], -31007, "{}", a.text);
    let a = common::send(
        reqwest::Method::DELETE,
        &fw.mcp_url("incidents"),
        Some(&token),
        &[("mcp-session-id", sid.as_str())],
        None,
    )
    .await;
    assert_eq!(a.status, 502, "{}", a.text);
    assert_eq!(up.hits(), hits, "nothing reached the upstream");
    fw.stop().await;
}

async fn readyz(fw: &Firewall) -> String {
    common::http()
        .get(format!("{}/readyz", fw.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The firewall authenticates with a private key instead of a secret
/// (`private_key_jwt`, RFC 7523): the provider checks its assertion against
/// the registered public key, and a key it does not know gets nothing.
#[tokio::test]
async fn a_private_key_client_exchanges_and_an_unknown_key_is_refused() {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let jwk_of = |k: &rcgen::KeyPair| {
        let raw = k.public_key_raw();
        json!({"kty": "EC", "crv": "P-256", "x": b64(&raw[1..33]), "y": b64(&raw[33..65]), "alg": "ES256", "use": "sig"})
    };
    let registered = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let stranger = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let idp = Idp::start(IdpConfig {
        clients: vec![json!({
            "client_id": "mcp-firewall",
            "jwks": {"keys": [jwk_of(&registered)]},
            "grant_types": ["urn:ietf:params:oauth:grant-type:token-exchange", "client_credentials"],
            "token_endpoint_auth_method": "private_key_jwt",
            "scope": "tickets:read tickets:write",
        })],
        subject_issuer: common::ISSUER.to_owned(),
        subject_jwks: idp::hs256_jwks(common::SECRET.as_bytes(), None),
        default_audience: "nobody".to_owned(),
        token_lifetime_s: 300,
    })
    .await;
    let jwks = idp.public_jwks().await;
    let policy = common::policy_dir(&[("90-tickets.toml", POLICY)]);
    let keys = tempfile::tempdir().unwrap();
    for (key, name) in [(&registered, "tickets"), (&stranger, "stranger")] {
        let pem = keys.path().join(format!("{name}.pem"));
        std::fs::write(&pem, key.serialize_pem()).unwrap();
    }
    let up = tickets().await;
    let section = |pem: &str| {
        toml::Value::Table(common::table([
            ("token_endpoint", idp.token_endpoint.as_str().into()),
            ("client_id", "mcp-firewall".into()),
            (
                "private_key_file",
                keys.path().join(pem).display().to_string().into(),
            ),
            ("audience", "tickets".into()),
            ("scope", "tickets:read".into()),
        ]))
    };
    let cfg = exchanging(
        TestConfig::new().policies(policy.path()),
        "tickets",
        &up.url(),
        section("tickets.pem"),
    );
    let fw = common::firewall(&cfg.text()).await;
    let (token, run) = run_token();
    let a = get_ticket(&fw, Era::Stateless, &token).await;
    assert_eq!(text_of(&a), "ticket 42: printer on fire");
    let c = idp::verify(&bearers(&up, "tools/call")[0], &jwks, "tickets");
    assert_eq!(c["run_id"], run.as_str(), "{c}");
    assert_eq!(c["act"]["sub"], "mcp-firewall", "{c}");
    fw.stop().await;

    // The same client with a key the provider does not know.
    let cfg = exchanging(
        TestConfig::new().policies(policy.path()),
        "tickets",
        &up.url(),
        section("stranger.pem"),
    );
    let fw = common::firewall(&cfg.text()).await;
    let hits = up.hits();
    let (token, _) = run_token();
    // (Its own listing fails the same way, so a call finds no tool; a
    // ping goes where a run's token is needed.)
    let ping = r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#;
    let a = common::post(&fw.mcp_url("tickets"), &token, &[], ping).await;
    assert_eq!(a.json()["error"]["code"], -31007, "{}", a.text);
    assert!(a.text.contains("invalid_client"), "{}", a.text);
    assert_eq!(up.hits(), hits, "nothing was sent");
    let a = get_ticket(&fw, Era::Sessions, &token).await;
    assert!(a.json().get("error").is_some(), "{}", a.text);
    assert_eq!(up.hits(), hits, "nothing was sent");
    fw.stop().await;
}
