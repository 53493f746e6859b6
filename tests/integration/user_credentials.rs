//! Each user's own upstream account (issue 59, `auth = "oauth_user"`)
//! against a real authorization server (`tests/idp/as.py`, Authlib:
//! authorization code with PKCE, refresh rotation, RFC 7009 revocation,
//! RFC 8414 metadata) and a recording upstream that reads the bearer it
//! receives: a run whose user has not connected gets a consent link
//! (`-32042` to a client that takes URL elicitation, else `-31007` with
//! the link) and the upstream receives nothing; the consent (in headless
//! Chromium, and by its HTTP steps) keeps the user's token sealed; their
//! runs, in both eras, reach the upstream with it; another principal's run
//! never does; the token is refreshed before it expires, a refused refresh
//! asks again, and `credentials revoke` (CLI and admin API) removes and
//! revokes it; in PostgreSQL, replicas share tokens and consents.

use std::path::PathBuf;
use std::time::Duration;

use mcp_firewall::auth::{Audience, MintClaims};
use serde_json::{json, Value};

use crate::common::clickhouse::ClickHouse;
use crate::common::idp::{self, Idp, IdpConfig};
use crate::common::postgres::Postgres;
use crate::common::watchdog::free_port;
use crate::common::{self, Firewall, TestConfig};
use crate::credentials::{bearers, credential_id_of, get_ticket, tickets, POLICY};
use crate::screening::Era;

const CLIENT: &str = "fw-tickets";
const SECRET: &str = "the firewall's client at the tickets provider";
const RESOURCE: &str = "tickets-api";

async fn provider(lifetime_s: u64, callbacks: &[u16]) -> Idp {
    Idp::start(IdpConfig {
        clients: vec![json!({
            "client_id": CLIENT,
            "client_secret": SECRET,
            "grant_types": ["authorization_code", "refresh_token"],
            "token_endpoint_auth_method": "client_secret_basic",
            "redirect_uris": callbacks
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}/connect/tickets/callback"))
                .collect::<Vec<_>>(),
            "scope": "tickets:read",
        })],
        subject_issuer: common::ISSUER.to_owned(),
        subject_jwks: idp::hs256_jwks(common::SECRET.as_bytes(), None),
        default_audience: "nobody".to_owned(),
        token_lifetime_s: lifetime_s,
    })
    .await
}

/// Files a firewall of the rig reads: the client secret and the key.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new(key: u8) -> Files {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        let key_file = dir.path().join("credentials.key");
        std::fs::write(&key_file, hex::encode([key; 32])).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        Files { dir }
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("credentials.key")
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }
}

/// `cfg` with `tickets` at `url` taking users' own tokens from `idp`,
/// the admin listener on `admin_port` (the redirect URI's).
fn user_config(
    cfg: TestConfig,
    url: &str,
    idp: &Idp,
    files: &Files,
    admin_port: u16,
) -> TestConfig {
    let section = toml::Value::Table(common::table([
        ("authorization_server", idp.issuer.as_str().into()),
        ("client_id", CLIENT.into()),
        (
            "client_secret",
            toml::Value::Table(common::table([(
                "file",
                files.dir.path().join("secret").display().to_string().into(),
            )])),
        ),
        ("scopes", toml::Value::Array(vec!["tickets:read".into()])),
        ("resource", RESOURCE.into()),
        ("timeout_ms", 3000.into()),
    ]));
    cfg.upstream("tickets", url)
        .upstream_set("tickets", "auth", "oauth_user")
        .upstream_set("tickets", "oauth_user", section)
        .set("admin.listen", format!("127.0.0.1:{admin_port}"))
        .set("credentials.key_file", files.key().display().to_string())
}

fn local(cfg: TestConfig, files: &Files) -> TestConfig {
    cfg.set("credentials.dir", files.store().display().to_string())
}

/// A provider, the recording upstream, and a firewall's config with the
/// local store (not started).
struct Rig {
    admin_port: u16,
    idp: Idp,
    up: crate::common::raw::RawUpstream,
    files: Files,
    policy: tempfile::TempDir,
    cfg: TestConfig,
}

impl Rig {
    async fn local(lifetime_s: u64, key: u8) -> Rig {
        let admin_port = free_port();
        let idp = provider(lifetime_s, &[admin_port]).await;
        let up = tickets().await;
        let files = Files::new(key);
        let policy = common::policy_dir(&[("90-tickets.toml", POLICY)]);
        let cfg = local(
            user_config(
                TestConfig::new().policies(policy.path()),
                &up.url(),
                &idp,
                &files,
                admin_port,
            ),
            &files,
        );
        Rig {
            admin_port,
            idp,
            up,
            files,
            policy,
            cfg,
        }
    }
}

/// An admin token of the security team with `scopes`.
fn admin_token(scopes: &[&str]) -> String {
    let mut c: MintClaims = common::claims("console", &["sre"]);
    c.audience = Audience::Admin;
    c.sub = "sam".to_owned();
    c.scopes = scopes.iter().map(|s| (*s).to_owned()).collect();
    common::sign(&c)
}

fn run_of(sub: &str) -> (String, MintClaims) {
    let mut c = common::claims("assistant", &["sre"]);
    c.sub = sub.to_owned();
    (common::sign(&c), c)
}

/// A 2026-07-28 `tools/list` whose client says it takes URL-mode
/// elicitation.
async fn list_eliciting(fw: &Firewall, token: &str) -> common::Answer {
    let (mut headers, body) = crate::answer_path::modern("tools/list", "", 7, json!({}));
    headers.retain(|(k, _)| k != "mcp-name");
    let mut body: Value = serde_json::from_str(&body).unwrap();
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"elicitation": {"url": {}}});
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    common::post(&fw.mcp_url("tickets"), token, &h, &body.to_string()).await
}

/// `tools/list` on `tickets` (2025-11-25), as the holder of `token`: what
/// a client asks first (the firewall learns the tools from the answer).
async fn list(fw: &Firewall, token: &str) -> common::Answer {
    common::post(
        &fw.mcp_url("tickets"),
        token,
        &[("mcp-protocol-version", "2025-11-25")],
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#,
    )
    .await
}

/// Lists, which must go through (the user is connected).
async fn listed(fw: &Firewall, token: &str) {
    let a = list(fw, token).await;
    assert_eq!(
        a.json()["result"]["tools"][0]["name"],
        "get_ticket",
        "{}",
        a.text
    );
}

fn text_of(a: &common::Answer) -> String {
    a.json()["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no result text: {}", a.text))
        .to_owned()
}

/// The link a `-31007` consent answer carries (and its message says).
fn link_of_error(a: &common::Answer) -> String {
    assert_eq!(a.code(), -31007, "{}", a.text);
    let e = &a.json()["error"];
    assert_eq!(e["data"]["reason"], "consent_required", "{e}");
    let url = e["data"]["connect_url"].as_str().unwrap().to_owned();
    assert!(
        e["message"].as_str().unwrap().contains(&url),
        "the message carries the link: {e}"
    );
    url
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn location(r: &reqwest::Response) -> String {
    r.headers()
        .get("location")
        .unwrap_or_else(|| panic!("no Location: {r:?}"))
        .to_str()
        .unwrap()
        .to_owned()
}

/// The consent by its HTTP steps, as `login` at the provider: the page,
/// its button (on `post_to`'s listener), the provider, the callback.
/// Returns the callback page's status and text.
async fn consent_via(link: &str, post_to: &str, login: &str) -> (u16, String) {
    let c = no_redirects();
    let page = c.get(link).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    assert_eq!(page.headers()["referrer-policy"], "no-referrer");
    assert_eq!(page.headers()["cache-control"], "no-store");
    let page = page.text().await.unwrap();
    assert!(page.contains("Connect my tickets account"), "{page}");
    let ticket = link.split_once("ticket=").unwrap().1;
    let r = c
        .post(format!("{post_to}/connect/tickets"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("ticket={ticket}"))
        .send()
        .await
        .unwrap();
    if r.status() != 303 {
        let status = r.status().as_u16();
        return (status, r.text().await.unwrap());
    }
    let authorize = location(&r);
    assert!(
        authorize.contains("code_challenge_method=S256"),
        "{authorize}"
    );
    assert!(authorize.contains("resource=tickets-api"), "{authorize}");
    let r = c
        .get(format!("{authorize}&login_hint={login}"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_redirection(), "{r:?}");
    let back = location(&r);
    assert!(back.contains("/connect/tickets/callback?"), "{back}");
    let r = c.get(&back).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

fn cli(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn a_user_connects_once_and_only_their_runs_reach_the_upstream_with_their_token() {
    let Rig {
        admin_port,
        idp,
        up,
        files,
        policy,
        cfg,
    } = Rig::local(300, 7).await;
    let jwks = idp.public_jwks().await;
    let config_file = files.dir.path().join("firewall.toml");
    std::fs::write(&config_file, cfg.text()).unwrap();
    let fw = common::firewall(&cfg.text()).await;
    let (alice, alice_claims) = run_of("alice");

    // Not connected: the list is answered with the link, nothing sent.
    let l = list(&fw, &alice).await;
    let _ = link_of_error(&l);
    assert!(
        up.seen().is_empty(),
        "nothing reached the upstream: {:?}",
        up.seen().len()
    );
    // A URL-mode elicitation to a client that takes one (the link in an
    // error to one that does not, above); nothing sent.
    let a = list_eliciting(&fw, &alice).await;
    assert_eq!(a.code(), -32042, "{}", a.text);
    let el = &a.json()["error"]["data"]["elicitations"][0];
    assert_eq!(el["mode"], "url", "{el}");
    let link = el["url"].as_str().unwrap().to_owned();
    assert!(
        link.starts_with(&format!(
            "http://127.0.0.1:{admin_port}/connect/tickets?ticket="
        )),
        "{link}"
    );
    assert!(!el["elicitationId"].as_str().unwrap().is_empty());
    let link_b = link_of_error(&l);
    assert_ne!(link, link_b, "each answer its own link");
    // A 2025-11-25 client says it takes URL elicitation at `initialize`:
    // that answer and its run's later requests get the elicitation.
    let mut init_run = alice_claims.clone();
    init_run.run_id = "run-alice-init".to_owned();
    let init_token = common::sign(&init_run);
    let i = common::post(
        &fw.mcp_url("tickets"),
        &init_token,
        &[("mcp-protocol-version", "2025-11-25")],
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{"url":{}}},"clientInfo":{"name":"t","version":"1"}}}"#,
    )
    .await;
    assert_eq!(i.code(), -32042, "{}", i.text);
    assert_eq!(list(&fw, &init_token).await.code(), -32042);
    assert!(up.seen().is_empty(), "nothing reached the upstream");

    // A tampered link and one of another upstream's name are refused.
    let c = no_redirects();
    let bent = format!("{}A", &link[..link.len() - 1]);
    let r = c.get(&bent).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("not valid"));

    // The consent in a real browser: the page, its button, the provider's
    // redirect back, the callback.
    {
        let browser = crate::common::browser::Browser::start().await;
        browser.goto(&link).await;
        let button = browser.wait_for("#connect", Duration::from_secs(10)).await;
        browser.click(&button).await;
        let done = browser
            .wait_for("#connected", Duration::from_secs(15))
            .await;
        assert!(browser.text(&done).await.contains("alice"));
    }
    // The link is spent.
    let (status, page) = consent_via(&link, &fw.admin, "alice").await;
    assert_eq!(status, 409, "{page}");
    assert!(page.contains("already used"), "{page}");

    // Alice's runs, in both eras and another run of hers, reach the
    // upstream with her own token: her subject at the provider, the
    // upstream's resource as audience; the provider was asked once.
    let mut other_run = alice_claims.clone();
    other_run.run_id = "run-alice-2".to_owned();
    listed(&fw, &alice).await;
    for (era, token) in [
        (Era::Sessions, alice.clone()),
        (Era::Stateless, alice.clone()),
        (Era::Stateless, common::sign(&other_run)),
    ] {
        let a = get_ticket(&fw, era, &token).await;
        assert_eq!(text_of(&a), "ticket 42: printer on fire", "{era:?}");
    }
    let calls = bearers(&up, "tools/call");
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|c| c == &calls[0]), "one token: hers");
    assert_eq!(
        bearers(&up, "tools/list"),
        vec![calls[0].clone()],
        "her list too"
    );
    let claims = idp::verify(&calls[0], &jwks, RESOURCE);
    assert_eq!(claims["sub"], "alice", "{claims}");
    assert_eq!(claims["client_id"], CLIENT, "{claims}");
    assert!(
        claims.get("act").is_none(),
        "her own token, no actor: {claims}"
    );
    let log = idp.log().await;
    let codes: Vec<_> = log
        .iter()
        .filter(|e| e["grant_type"] == "authorization_code")
        .collect();
    assert_eq!(codes.len(), 1, "{log:?}");
    assert_eq!(codes[0]["ok"], true);

    // Bob, same tenant, naming Alice's run: his own consent, never her
    // token; and so for another tenant's "alice".
    let (bob, _) = run_of("bob");
    let mut bob_claims = common::claims("assistant", &["sre"]);
    bob_claims.sub = "bob".to_owned();
    bob_claims.run_id = alice_claims.run_id.clone();
    for token in [bob, common::sign(&bob_claims), {
        let mut c = alice_claims.clone();
        c.tenant_id = "globex".to_owned();
        common::sign(&c)
    }] {
        let a = get_ticket(&fw, Era::Stateless, &token).await;
        let _ = link_of_error(&a);
    }
    assert_eq!(bearers(&up, "tools/call").len(), 3, "nothing sent for them");

    // At rest: sealed, the file the owner's only, no token in it.
    let entries: Vec<_> = std::fs::read_dir(files.store())
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(entries.len(), 1, "one record");
    // The spent link and no consent in flight are kept beside it.
    let consents: Vec<String> = std::fs::read_dir(files.store().join("consents"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !consents.is_empty() && consents.iter().all(|n| n.starts_with("n-")),
        "{consents:?}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        entries[0].metadata().unwrap().permissions().mode() & 0o777,
        0o600
    );
    let stored = std::fs::read_to_string(entries[0].path()).unwrap();
    assert!(
        !stored.contains(&calls[0]),
        "the access token is not readable at rest"
    );
    let part = calls[0].split('.').nth(1).unwrap();
    assert!(!stored.contains(part), "nor its claims");
    // Under another key the store is unreadable: the call is refused with
    // the reason, and nothing is sent.
    let other_files = Files::new(9);
    let other_cfg = local(
        user_config(
            TestConfig::new().policies(policy.path()),
            &up.url(),
            &idp,
            &other_files,
            free_port(),
        ),
        &files,
    );
    {
        let wrong = common::firewall(&other_cfg.text()).await;
        let a = list(&wrong, &alice).await;
        assert_eq!(a.code(), -31007, "{}", a.text);
        assert!(a.text.contains("another key"), "{}", a.text);
        assert_eq!(bearers(&up, "tools/list").len(), 1, "nothing sent");
    }

    // Listed without its value; revoked from the command line, and at the
    // provider.
    let config = config_file.display().to_string();
    let (ok, listed) = cli(&["credentials", "--config", &config, "list"]);
    assert!(ok, "{listed}");
    assert!(listed.contains("tickets\tacme\talice\t"), "{listed}");
    assert!(listed.contains("1 kept"), "{listed}");
    assert!(!listed.contains(&calls[0]), "{listed}");
    let (ok, out) = cli(&[
        "credentials",
        "--config",
        &config,
        "revoke",
        "--upstream",
        "tickets",
        "--tenant",
        &alice_claims.tenant_id,
        "--subject",
        "alice",
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("revoked 1"), "{out}");
    let revoked = idp.log().await;
    assert!(
        revoked.iter().any(|e| e["endpoint"] == "revoke"
            && e["ok"] == true
            && e["token_type_hint"] == "refresh_token"),
        "revoked at the provider: {revoked:?}"
    );
    let a = get_ticket(&fw, Era::Sessions, &alice).await;
    let _ = link_of_error(&a);
    assert_eq!(bearers(&up, "tools/call").len(), 3);
    let metrics = fw.metrics().await;
    assert!(
        metrics.contains(r#"mcp_firewall_upstream_credential_exchanges_total{upstream="tickets",purpose="consent",outcome="ok"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"purpose="consent",outcome="consent_required"}"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_token_near_its_end_is_refreshed_and_a_refused_refresh_asks_again() {
    let Rig {
        idp,
        up,
        cfg,
        files: _files,
        policy: _policy,
        ..
    } = Rig::local(4, 3).await;
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let cfg = cfg.audit("fw-user-credentials", &ch.http_url, &db, spool.path());
    let fw = common::firewall(&cfg.text()).await;
    let (alice, alice_claims) = run_of("alice");
    let a = list(&fw, &alice).await;
    let (status, page) = consent_via(&link_of_error(&a), &fw.admin, "alice").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("id=\"connected\""), "{page}");

    listed(&fw, &alice).await;
    let first = get_ticket(&fw, Era::Stateless, &alice).await;
    assert_eq!(text_of(&first), "ticket 42: printer on fire");
    // Past half of its 4 s: refreshed before it is sent.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for era in [Era::Sessions, Era::Stateless] {
        let a = get_ticket(&fw, era, &alice).await;
        assert_eq!(text_of(&a), "ticket 42: printer on fire");
    }
    let calls = bearers(&up, "tools/call");
    assert_eq!(calls.len(), 3);
    assert_ne!(calls[0], calls[1], "a new token after the refresh");
    assert_eq!(calls[1], calls[2], "the refreshed token is kept");
    let log = idp.log().await;
    let refreshes: Vec<_> = log
        .iter()
        .filter(|e| e["grant_type"] == "refresh_token")
        .collect();
    assert_eq!(refreshes.len(), 1, "one refresh: {log:?}");
    assert_eq!(refreshes[0]["ok"], true);
    assert_ne!(refreshes[0]["refresh_reuse"], true);

    // The provider refuses the next refresh: the token is dropped and the
    // user asked to connect again; nothing sent.
    idp.set_mode_with(json!({"mode": "refuse", "times": 1}))
        .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let a = get_ticket(&fw, Era::Stateless, &alice).await;
    let _ = link_of_error(&a);
    assert_eq!(bearers(&up, "tools/call").len(), 3);
    let metrics = fw.metrics().await;
    assert!(
        metrics.contains(r#"purpose="refresh",outcome="ok"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"purpose="refresh",outcome="refused"} 1"#),
        "{metrics}"
    );

    // On record: each call with the id of the token it went with (the
    // first, then the refreshed one), the refused call as an error naming
    // the consent link by id; neither token nor link anywhere.
    let run = &alice_claims.run_id;
    let sql = format!(
        "SELECT credential_id, count() FROM {db}.audit_events FINAL WHERE tool = 'get_ticket' AND run_id = '{run}' AND upstream_auth = 'user' AND row_version = 1 GROUP BY credential_id ORDER BY count() FORMAT TSV"
    );
    let want = format!(
        "{}\t1\n{}\t2\n",
        credential_id_of("user", &calls[0]),
        credential_id_of("user", &calls[1])
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while ch.try_query(&sql).as_deref() != Ok(want.as_str()) {
        assert!(
            std::time::Instant::now() < deadline,
            "{sql}: {:?}",
            ch.try_query(&format!("SELECT run_id, tool, decision, upstream_auth, credential_id, row_version, reason FROM {db}.audit_events FORMAT TSV"))
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sql = format!(
        "SELECT count() FROM {db}.audit_events FINAL WHERE tool = 'get_ticket' AND run_id = '{run}' AND decision = 'error' AND position(reason, 'consent link') > 0 FORMAT TSV"
    );
    while ch.try_query(&sql).as_deref() != Ok("1\n") {
        assert!(
            std::time::Instant::now() < deadline,
            "the refused call is on record: {:?}",
            ch.try_query(&format!("SELECT run_id, tool, decision, upstream_auth, row_version, reason FROM {db}.audit_events FORMAT TSV"))
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let leaked = ch.query_u64(&format!(
        "SELECT count() FROM {db}.audit_events WHERE position(reason, 'ticket=') > 0 OR position(reason, '{a}') > 0 OR position(result_summary, '{a}') > 0 OR position(reason, '{b}') > 0",
        a = &calls[0][..40],
        b = &calls[1][..40],
    ));
    assert_eq!(leaked, 0, "no token and no link on record");
}

/// Two replicas on one PostgreSQL store: a consent begun on one completes
/// on the other (the redirect URI's), both use the token, the admin API
/// revokes it for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_consents_and_tokens_in_postgres() {
    let pg = Postgres::shared().await;
    let db = pg.create_random_database();
    let port_a = free_port();
    let idp = provider(300, &[port_a]).await;
    let up = tickets().await;
    let files = Files::new(5);
    let policy = common::policy_dir(&[("90-tickets.toml", POLICY)]);
    let replica = |port: u16| {
        user_config(
            TestConfig::new().policies(policy.path()),
            &up.url(),
            &idp,
            &files,
            port,
        )
        .set("approvals.store", "postgres")
        .set("approvals.postgres_url", db.as_str())
        .set("credentials.store", "postgres")
        .set(
            "credentials.public_url",
            format!("http://127.0.0.1:{port_a}"),
        )
        .text()
    };
    let a = common::firewall(&replica(port_a)).await;
    let b = common::firewall(&replica(free_port())).await;
    let (alice, claims) = run_of("alice");

    // The link from replica B, its button on B, the callback on A.
    let r = list(&b, &alice).await;
    let link = link_of_error(&r);
    assert!(
        link.starts_with(&format!("http://127.0.0.1:{port_a}/")),
        "{link}"
    );
    let (status, page) = consent_via(&link, &b.admin, "alice").await;
    assert_eq!(status, 200, "{page}");
    let rows = pg.psql(
        &db,
        "SELECT subject, upstream, length(sealed) > 0 FROM mcp_firewall_user_credentials",
    );
    assert!(rows.contains("alice") && rows.contains("tickets"), "{rows}");

    // A lists; B has never seen the tools: its refill asks the upstream
    // with her token (the firewall's own call, for her request).
    listed(&a, &alice).await;
    for fw in [&a, &b] {
        let r = get_ticket(fw, Era::Sessions, &alice).await;
        assert_eq!(text_of(&r), "ticket 42: printer on fire");
    }
    let calls = bearers(&up, "tools/call");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0], calls[1], "both replicas use her one token");
    assert_eq!(
        bearers(&up, "tools/list"),
        vec![calls[0].clone(), calls[0].clone()],
        "A's relayed list and B's refill, both with her token"
    );
    let sealed = pg.psql(
        &db,
        "SELECT encode(sealed, 'escape') FROM mcp_firewall_user_credentials",
    );
    assert!(
        !sealed.contains(calls[0].split('.').nth(1).unwrap()),
        "sealed in the database"
    );

    // The admin API: listed for the admin's tenant without values, and
    // revoked on A for both replicas.
    let admin = admin_token(&["approvals", "credentials"]);
    let listed: Value = common::http()
        .get(format!("{}/credentials", b.admin))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["credentials"][0]["subject"], "alice", "{listed}");
    assert!(!listed.to_string().contains(&calls[0]), "{listed}");
    let r = common::http()
        .get(format!("{}/credentials", a.admin))
        .bearer_auth(admin_token(&["approvals"]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = common::http()
        .delete(format!(
            "{}/credentials/tickets/{}/alice",
            a.admin, claims.tenant_id
        ))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["revoked"], 1);
    let r = get_ticket(&b, Era::Stateless, &alice).await;
    let _ = link_of_error(&r);
    assert_eq!(
        bearers(&up, "tools/call").len(),
        2,
        "nothing sent after the revocation"
    );
}
