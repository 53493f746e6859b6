//! `mcp-firewall demo`: the sample upstream and the firewall in front of it,
//! in one process, on the shipped demo config and policies (both embedded in
//! the binary, so the command works from any directory). Prints the URL and
//! ready-to-use tokens for two runs: an investigating agent with read-only
//! reach, and an operator whose writes and destructive calls are gated.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rand::RngCore;

use crate::app::{self, Running};
use crate::auth::{self, Audience, MintClaims, Mode, Verifier};
use crate::config;
use crate::policy::reload::PolicyStore;
use crate::telemetry;

use super::{spawn, DemoUpstream, UpstreamOptions};

/// The demo config, with placeholders.
pub const DEMO_CONFIG: &str = include_str!("../../config/demo.toml");

/// The reviewed definitions of the sample upstream's tools.
pub const DEMO_PINS: &str = include_str!("../../policies/pins/incidents.toml");

/// The shipped policies, embedded.
pub const POLICIES: [(&str, &str); 4] = [
    (
        "00-gates.toml",
        include_str!("../../policies/00-gates.toml"),
    ),
    (
        "10-tools.toml",
        include_str!("../../policies/10-tools.toml"),
    ),
    (
        "20-agents.toml",
        include_str!("../../policies/20-agents.toml"),
    ),
    (
        "30-conditions.toml",
        include_str!("../../policies/30-conditions.toml"),
    ),
];

/// A running demo.
pub struct Demo {
    /// The firewall.
    pub firewall: Running,
    /// The sample upstream behind it.
    pub upstream: DemoUpstream,
    /// A read-only investigator's token.
    pub investigator_token: String,
    /// An operator's token (writes and destructive calls need approval).
    pub operator_token: String,
    /// An on-call approver's admin token (for the console).
    pub approver_token: String,
    _approvals_dir: tempfile::TempDir,
}

/// Starts the demo: upstream first, then the firewall in front of it.
pub async fn start(listen: SocketAddr, admin: SocketAddr) -> anyhow::Result<Demo> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the sample upstream")?;
    let upstream = spawn(listener, UpstreamOptions::default()).await?;

    let mut secret = [0u8; 32];
    rand::rng().fill_bytes(&mut secret);
    let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let approvals_dir = tempfile::tempdir().context("a temporary directory for approvals")?;
    let text = DEMO_CONFIG
        .replace(
            "{{APPROVALS_DIR}}",
            &approvals_dir.path().display().to_string(),
        )
        .replace("{{LISTEN}}", &listen.to_string())
        .replace("{{ADMIN}}", &admin.to_string())
        .replace("{{SECRET}}", &secret)
        .replace("{{UPSTREAM_URL}}", &upstream.url());
    let mut cfg = config::load_str(
        &text,
        Path::new("config/demo.toml"),
        Path::new("config"),
        &|_| None,
    )?;
    // The embedded pins, where accepting a change in the console writes.
    let pins_dir = approvals_dir.path().join("policy");
    std::fs::create_dir_all(pins_dir.join(crate::pins::PINS_DIR))
        .context("a directory for the demo's pins")?;
    std::fs::write(
        pins_dir.join(crate::pins::PINS_DIR).join("incidents.toml"),
        DEMO_PINS,
    )
    .context("writing the demo's pins")?;
    cfg.policy_dir = pins_dir;
    telemetry::init_logging(cfg.log_format, &cfg.log_level);

    let sources: Vec<(PathBuf, String)> = POLICIES
        .iter()
        .map(|(name, text)| (PathBuf::from("policies").join(name), (*text).to_owned()))
        .collect();
    let policy = crate::policy::compile(&sources).context("compiling the embedded policies")?;
    let mut registry = telemetry::registry();
    let store = PolicyStore::fixed(policy, &mut registry);
    let verifier = Verifier::new(&cfg.auth).await?;

    let lifetime = Duration::from_secs(3600);
    let mint = |audience: Audience, sub: &str, agent: &str, projects: &[&str], run: &str| {
        auth::mint(
            &cfg.auth,
            &MintClaims {
                audience,
                issuer: None,
                sub: sub.to_owned(),
                tenant_id: "demo".to_owned(),
                agent: agent.to_owned(),
                run_id: run.to_owned(),
                mode: Mode::Caller,
                projects: projects.iter().map(|p| (*p).to_owned()).collect(),
                project_ceiling: None,
                scopes: Vec::new(),
                jti: None,
                run_exp: None,
            },
            lifetime,
        )
    };
    let investigator_token = mint(
        Audience::Mcp,
        "demo-user",
        "incident-investigator",
        &["sre"],
        "run-investigate-1",
    )?;
    let operator_token = mint(
        Audience::Mcp,
        "demo-user",
        "sre-lead",
        &["sre", "platform"],
        "run-operate-1",
    )?;
    // A different person: the run's own caller may not approve its calls.
    let approver_token = mint(
        Audience::Admin,
        "on-call-engineer",
        "sre-lead",
        &["sre"],
        "console",
    )?;

    let firewall = app::start_with(Arc::new(cfg), verifier, store, registry).await?;
    Ok(Demo {
        firewall,
        upstream,
        investigator_token,
        operator_token,
        approver_token,
        _approvals_dir: approvals_dir,
    })
}

/// `mcp-firewall demo`: start, print how to connect, run until Ctrl-C.
pub async fn run(listen: SocketAddr, admin: SocketAddr) -> anyhow::Result<()> {
    let demo = start(listen, admin).await?;
    let url = format!("http://{}/mcp/incidents", demo.firewall.mcp_addr);
    println!(
        r#"
mcp-firewall demo is running.

  MCP endpoint   {url}
  admin          http://{admin}/healthz  /readyz  /metrics
  upstream       {upstream} (the sample SRE incident estate, behind the firewall)

Two runs, two tokens (valid for one hour):

  investigator   incident-investigator role: read-only tools only
  {inv}

  operator       sre-lead role: every tool; writes and destructive calls need approval
  {op}

Try it with curl (the 2026-07-28 stateless revision):

  curl -s {url} -H "Authorization: Bearer $TOKEN" \
    -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
    -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: tools/list' \
    -d '{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}'

Or point any MCP client (streamable HTTP) at {url} with the header
"Authorization: Bearer <token>". The investigator lists 8 read-only tools;
the operator lists all 14, and `rollback_deployment` waits for a person.

Approve or deny it in the console: http://{admin}/console
with this approver token (an on-call engineer, admin audience):
  {approver}

Ctrl-C stops the demo."#,
        admin = demo.firewall.admin_addr,
        upstream = demo.upstream.url(),
        inv = demo.investigator_token,
        op = demo.operator_token,
        approver = demo.approver_token,
    );
    demo.firewall.until_signal().await;
    demo.upstream.shutdown().await;
    Ok(())
}
