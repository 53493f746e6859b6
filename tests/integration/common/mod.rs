//! Shared test harness: start the firewall in-process on free ports, start
//! scripted raw HTTP upstreams, and send requests.

#![allow(dead_code)]

pub mod raw;

use std::path::Path;
use std::sync::Arc;

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
}

/// Config text for a plaintext firewall on free ports in front of `upstreams`
/// (name, url), followed by `extra` TOML.
pub fn config_text(upstreams: &[(&str, &str)], extra: &str) -> String {
    let mut s = String::from(
        "[server]\nlisten = \"127.0.0.1:0\"\nplaintext = true\ndrain_timeout_ms = 2000\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n",
    );
    for (name, url) in upstreams {
        s.push_str(&format!(
            "[[upstream]]\nname = \"{name}\"\nurl = \"{url}\"\nconnect_timeout_ms = 1000\nrequest_timeout_ms = 5000\nidle_timeout_ms = 5000\n\n"
        ));
    }
    s.push_str(extra);
    s
}

/// Starts a firewall from config text; relative paths resolve against `base`.
pub async fn firewall_in(text: &str, base: &Path) -> Firewall {
    mcp_firewall::telemetry::init_logging(config::LogFormat::Text, "warn");
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

/// A plain HTTP client (no connection reuse surprises between tests).
pub fn http() -> reqwest::Client {
    install_crypto();
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("reqwest client")
}

/// POSTs a JSON-RPC body the way MCP clients do.
pub async fn post_json(url: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
    http()
        .post(url)
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
