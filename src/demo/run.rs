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
    /// Where the audit rows go.
    pub audit: AuditSink,
    _approvals_dir: tempfile::TempDir,
}

/// Where the demo's audit rows go.
pub struct AuditSink {
    /// The throwaway ClickHouse (`None`: not installed, rows stay in the spool).
    pub clickhouse: Option<super::clickhouse::ThrowawayClickHouse>,
    /// Why there is none.
    pub why_not: Option<String>,
    /// The local spool.
    pub spool: PathBuf,
    /// The audit database.
    pub database: &'static str,
}

/// The demo's audit database.
pub const AUDIT_DATABASE: &str = "mcp_firewall";

/// Starts the demo: upstream first, then the firewall in front of it,
/// auditing into a throwaway ClickHouse when one is installed.
pub async fn start(listen: SocketAddr, admin: SocketAddr) -> anyhow::Result<Demo> {
    start_with(listen, admin, true).await
}

/// [`start`]; `clickhouse = false` keeps the rows in the local spool even
/// when ClickHouse is installed.
pub async fn start_with(
    listen: SocketAddr,
    admin: SocketAddr,
    clickhouse: bool,
) -> anyhow::Result<Demo> {
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
    // The audit trail: into a throwaway ClickHouse when one is installed,
    // else kept in the local spool.
    let started = if clickhouse {
        tokio::task::spawn_blocking(super::clickhouse::ThrowawayClickHouse::start)
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
    } else {
        Err("asked to keep the rows in the spool".to_owned())
    };
    let spool = approvals_dir.path().join("audit-spool");
    let (clickhouse, why_not) = match started {
        Ok(ch) => (Some(ch), None),
        Err(why) => (None, Some(why)),
    };
    let text = format!(
        "{text}\n[audit]\nenabled = true\ninstance = \"demo\"\n{}\n[audit.clickhouse]\nurl = \"{}\"\ndatabase = \"{AUDIT_DATABASE}\"\n[audit.spool]\ndir = \"{}\"\n[audit.batch]\nmax_age_ms = 200\n",
        // Without a ClickHouse the backlog only grows: not a reason to
        // call the demo unready.
        if clickhouse.is_some() { "" } else { "max_backlog_age_s = 0" },
        clickhouse
            .as_ref()
            .map_or_else(|| "http://127.0.0.1:9".to_owned(), |c| c.http_url.clone()),
        spool.display()
    );
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
        audit: AuditSink {
            clickhouse,
            why_not,
            spool,
            database: AUDIT_DATABASE,
        },
        _approvals_dir: approvals_dir,
    })
}

/// What the demo says about its audit trail: where rows go and the
/// auditor's first commands.
pub fn audit_help(a: &AuditSink) -> String {
    let db = a.database;
    match &a.clickhouse {
        Some(ch) => {
            let at = format!("--clickhouse {} --database {db}", ch.http_url);
            format!(
                "Audit: every decision is a row in a throwaway ClickHouse ({url}, database {db}),\n\
                 printed below as it lands. An auditor's first questions:\n\n  \
                 mcp-firewall audit {at} run run-investigate-1     # the run's timeline\n  \
                 mcp-firewall audit {at} denials --since 1h        # refusals by role and reason\n  \
                 mcp-firewall audit {at} stats --days 1            # calls, denials, p95 per tool\n  \
                 mcp-firewall audit {at} tail                      # follow new rows\n\n\
                 or in SQL: clickhouse-client --port {port} --query \\\n    \
                 \"SELECT time_ms, run_id, tool, decision, stop_reason FROM {db}.audit_events FINAL ORDER BY time_ms\"\n",
                url = ch.http_url,
                port = ch.tcp_port,
            )
        }
        None => format!(
            "Audit: no ClickHouse here ({why}), so rows stay in the local spool\n\
             {spool} (printed below as they are written).\n\
             Read it with: mcp-firewall audit --spool {spool} tail\n\
             For the whole audit trail install ClickHouse (Debian/Ubuntu: apt install clickhouse-server)\n\
             and run the demo again: it starts a throwaway server of its own.\n",
            why = a.why_not.as_deref().unwrap_or("not started"),
            spool = a.spool.display(),
        ),
    }
}

/// `audit tail` over the demo's audit sink, following from now.
fn feed_args(a: &AuditSink) -> crate::audit::cli::AuditArgs {
    crate::audit::cli::AuditArgs {
        config: None,
        clickhouse: a.clickhouse.as_ref().map(|c| c.http_url.clone()),
        database: Some(a.database.to_owned()),
        table: None,
        user: None,
        password_env: None,
        spool: a.clickhouse.is_none().then(|| a.spool.clone()),
        json: false,
        command: crate::audit::cli::AuditCommand::Tail {
            lines: 0,
            once: false,
        },
    }
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

and a call (`Mcp-Name` names the tool):

  curl -s {url} -H "Authorization: Bearer $TOKEN" \
    -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
    -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: tools/call' -H 'Mcp-Name: get_incident' \
    -d '{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"get_incident","arguments":{{"incident_id":"INC-1001"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}'

Approve or deny it in the console: http://{admin}/console
with this approver token (an on-call engineer, admin audience):
  {approver}

{audit}
Ctrl-C stops the demo."#,
        admin = demo.firewall.admin_addr,
        upstream = demo.upstream.url(),
        inv = demo.investigator_token,
        op = demo.operator_token,
        approver = demo.approver_token,
        audit = audit_help(&demo.audit),
    );
    // The audit trail as it lands, read back from where it went.
    let feed = feed_args(&demo.audit);
    tokio::spawn(async move {
        let mut out = std::io::stdout();
        if let Err(e) = crate::audit::cli::run(&feed, &mut out).await {
            tracing::warn!(error = %e, "demo: the audit feed stopped");
        }
    });
    demo.firewall.until_signal().await;
    demo.upstream.shutdown().await;
    Ok(())
}
