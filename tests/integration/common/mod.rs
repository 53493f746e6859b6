//! Shared test harness: start the firewall in-process on free ports, start
//! scripted raw HTTP upstreams, and send requests.

#![allow(dead_code)]

pub mod backend;
pub mod browser;
pub mod clickhouse;
pub mod config_builder;
pub mod idp;
pub mod mcp;
pub mod postgres;
pub mod raw;
pub mod redis;
pub mod wait;
pub mod watchdog;

pub use config_builder::{path as toml_path, table, TestConfig};
pub use wait::{eventually, wait_until};

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mcp_firewall::auth::{mint, Audience, AuthConfig, MintClaims, Mode};

use mcp_firewall::app::{self, Running};
use mcp_firewall::config;

/// A firewall running in this process.
pub struct Firewall {
    pub running: Running,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    /// `http://127.0.0.1:ADMINPORT`
    pub admin: String,
}

impl Firewall {
    /// `<base>/mcp/<name>`
    pub fn mcp_url(&self, name: &str) -> String {
        format!("{}/mcp/{name}", self.base)
    }

    pub async fn stop(self) {
        self.running.shutdown().await;
    }

    /// The admin listener's Prometheus text.
    pub async fn metrics(&self) -> String {
        http()
            .get(format!("{}/metrics", self.admin))
            .send()
            .await
            .expect("metrics answered")
            .text()
            .await
            .expect("metrics text")
    }
}

/// The HS256 development secret of test configs.
pub const SECRET: &str = "test-secret-that-is-long-enough-for-hs256!";
/// The MCP audience of test configs.
pub const AUDIENCE: &str = "mcp-firewall";
/// The trusted issuer of test configs.
pub const ISSUER: &str = "https://idp.test";

/// The shipped policies.
pub fn shipped_policies() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")
}

/// A temporary policy directory: the shipped files (and pins) plus `extra`
/// (name, text).
pub fn policy_dir(extra: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_policies(&shipped_policies(), dir.path());
    for (name, text) in extra {
        std::fs::write(dir.path().join(name), text).expect("write policy");
    }
    dir
}

/// Copies a policy directory (files, and the `pins/` directory).
pub fn copy_policies(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("policy dir");
    for e in std::fs::read_dir(from).expect("policies/") {
        let p = e.expect("entry").path();
        let target = to.join(p.file_name().expect("name"));
        if p.is_dir() {
            copy_policies(&p, &target);
        } else {
            std::fs::copy(&p, target).expect("copy policy");
        }
    }
}

/// Claims for a test token: a caller run of `agent` over `projects`.
pub fn claims(agent: &str, projects: &[&str]) -> MintClaims {
    MintClaims {
        audience: Audience::Mcp,
        issuer: None,
        sub: "alice".to_owned(),
        tenant_id: "acme".to_owned(),
        agent: agent.to_owned(),
        run_id: format!("run-{}", uuid::Uuid::new_v4()),
        mode: Mode::Caller,
        projects: projects.iter().map(|p| p.to_string()).collect(),
        project_ceiling: None,
        scopes: Vec::new(),
        jti: None,
        run_exp: None,
    }
}

/// Signs claims with the test key.
pub fn sign(claims: &MintClaims) -> String {
    let cfg: AuthConfig = config_builder::auth().try_into().expect("test auth config");
    mint(&cfg, claims, Duration::from_secs(600)).expect("mint")
}

/// A token for the `sre-lead` role over project `sre` (reaches test upstreams).
pub fn token() -> String {
    sign(&claims("sre-lead", &["sre"]))
}

/// The runtime of the property tests: their cases run inside a
/// proptest closure, which is not async, against one world each.
pub static PROPERTY_RT: std::sync::LazyLock<tokio::runtime::Runtime> =
    std::sync::LazyLock::new(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    });

/// Starts a firewall from config text; relative paths resolve against `base`.
pub async fn firewall_in(text: &str, base: &Path) -> Firewall {
    mcp_firewall::internals::init_logging(config::LogFormat::Text, "warn");
    let cfg = config::load_str(text, Path::new("test.toml"), base, &|k| {
        std::env::var(k).ok()
    })
    .unwrap_or_else(|e| panic!("test config invalid: {e}\n{text}"));
    let running = app::start(Arc::new(cfg)).await.expect("firewall starts");
    let base = format!("http://{}", running.mcp_addr);
    let admin = format!("http://{}", running.admin_addr);
    Firewall {
        running,
        base,
        admin,
    }
}

/// Starts a firewall from config text.
pub async fn firewall(text: &str) -> Firewall {
    firewall_in(text, Path::new(".")).await
}

/// Waits for the first pending approval on the admin listener `admin`
/// (`http://host:port`) and approves it as the holder of `token`.
pub async fn approve_first_pending(admin: &str, token: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let id = loop {
        let v: serde_json::Value = http()
            .get(format!("{admin}/approvals?status=pending"))
            .bearer_auth(token)
            .send()
            .await
            .expect("list approvals")
            .json()
            .await
            .expect("json");
        if let Some(id) = v["approvals"][0]["id"].as_str() {
            break id.to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no pending approval: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let approved = http()
        .post(format!("{admin}/approvals/{id}/approve"))
        .bearer_auth(token)
        .json(&serde_json::json!({"reason": "approved by the test"}))
        .send()
        .await
        .expect("approve");
    assert_eq!(approved.status(), 200);
    id
}

/// A plain HTTP client (no connection reuse surprises between tests).
pub fn http() -> reqwest::Client {
    install_crypto();
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("reqwest client")
}

/// POSTs a JSON-RPC body the way MCP clients do, with a valid token.
pub async fn post_json(url: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
    http()
        .post(url)
        .bearer_auth(token())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body)
        .send()
        .await
        .expect("request sent")
}

/// reqwest is built without a default TLS provider; use ring like the firewall.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A response as the test saw it.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Answer {
    /// The body as JSON (the JSON-RPC message of an SSE body's last data
    /// event when it is a stream).
    pub fn json(&self) -> serde_json::Value {
        if let Ok(v) = serde_json::from_str(&self.text) {
            return v;
        }
        self.text
            .lines()
            .rev()
            .filter_map(|l| l.strip_prefix("data: "))
            .find_map(|d| serde_json::from_str(d).ok())
            .unwrap_or_else(|| panic!("no JSON in answer: {}", self.text))
    }

    /// `error.code` of the JSON-RPC answer.
    pub fn code(&self) -> i64 {
        let v = self.json();
        v["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("no error code in {v}"))
    }
}

/// Sends one request to `url` with `token` and extra headers; a POST when
/// `body` is given.
pub async fn send(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Answer {
    let mut req = http().request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if body.is_some() {
        req = req
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.body(b.to_owned());
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap_or_default();
    Answer {
        status,
        headers,
        text,
    }
}

/// POSTs a JSON-RPC body with `token` and extra headers.
pub async fn post(url: &str, token: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    send(reqwest::Method::POST, url, Some(token), headers, Some(body)).await
}

/// A token of another principal (tenant `globex`, subject `mallory`) that
/// reaches the same upstreams.
pub fn other_token() -> String {
    let mut c = claims("sre-lead", &["sre"]);
    c.tenant_id = "globex".to_owned();
    c.sub = "mallory".to_owned();
    sign(&c)
}

/// `mcp-firewall demo` as the command starts it, but in front of an estate in
/// this process (so a test can read its counters and change its tools), with
/// its state in a directory removed afterwards.
pub struct DemoUnderTest {
    /// The demo.
    pub demo: mcp_firewall::demo::run::Demo,
    /// The estate behind it.
    pub upstream: mcp_demo_upstream::DemoUpstream,
    /// The demo's state (bind it: dropping it removes the directory).
    pub _dir: tempfile::TempDir,
}

/// Starts a [`DemoUnderTest`]; `clickhouse = false` keeps the rows in the
/// local spool.
pub async fn start_demo(clickhouse: bool) -> DemoUnderTest {
    use mcp_firewall::demo::run::{self, Options, UpstreamSource};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = mcp_demo_upstream::spawn(listener, Default::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut opts = Options::new(any, any);
    opts.upstream = UpstreamSource::Url(upstream.url());
    opts.clickhouse = clickhouse;
    opts.data_dir = Some(dir.path().to_path_buf());
    let demo = run::start(opts).await.expect("demo starts");
    DemoUnderTest {
        demo,
        upstream,
        _dir: dir,
    }
}

/// The estate's binary where `cargo build` / `cargo test --workspace` put
/// it: next to the firewall's.
pub fn estate_binary() -> std::path::PathBuf {
    let firewall = std::path::Path::new(env!("CARGO_BIN_EXE_mcp-firewall"));
    let bin = firewall.with_file_name(format!("mcp-demo-upstream{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: run the tests with `cargo test --workspace` (it builds the demo crate's binary)",
        bin.display()
    );
    bin
}
