//! `mcp-firewall demo`: the firewall in front of the sample upstream, on the
//! shipped demo config and policies (both embedded in the binary, so the
//! command works from any directory). Prints the URL and
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

use super::upstream::{self, UpstreamProcess};

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

/// Where the demo's upstream comes from.
pub enum UpstreamSource {
    /// An estate already running at this MCP endpoint (not stopped by the demo).
    Url(String),
    /// Start the estate's binary as a child ([`upstream::locate`] finds it
    /// when `None`).
    Binary(Option<PathBuf>),
}

/// What [`start`] is asked for.
pub struct Options {
    /// The firewall's MCP listener.
    pub listen: SocketAddr,
    /// The admin listener (health, metrics, console).
    pub admin: SocketAddr,
    /// The estate behind the firewall.
    pub upstream: UpstreamSource,
    /// Audit into a throwaway ClickHouse when one is installed (`false`: the
    /// rows stay in the local spool).
    pub clickhouse: bool,
    /// Where approvals, pins and the audit spool live (created if absent).
    /// `None`: a new directory under the system's temporary directory, kept
    /// after the demo so its spool can still be read.
    pub data_dir: Option<PathBuf>,
}

impl Options {
    /// The defaults of `mcp-firewall demo` on these listeners.
    pub fn new(listen: SocketAddr, admin: SocketAddr) -> Options {
        Options {
            listen,
            admin,
            upstream: UpstreamSource::Binary(None),
            clickhouse: true,
            data_dir: None,
        }
    }
}

/// A running demo.
pub struct Demo {
    /// The firewall.
    pub firewall: Running,
    /// The estate's MCP endpoint, behind the firewall.
    pub upstream_url: String,
    /// A read-only investigator's token.
    pub investigator_token: String,
    /// An operator's token (writes and destructive calls need approval).
    pub operator_token: String,
    /// An on-call approver's admin token (for the console).
    pub approver_token: String,
    /// Where the audit rows go.
    pub audit: AuditSink,
    /// Where approvals, pins and the spool live.
    pub data_dir: PathBuf,
    /// The estate's process, when the demo started it.
    process: Option<UpstreamProcess>,
}

impl Demo {
    /// Stops the firewall on a signal, then the estate it started.
    pub async fn until_signal(self) {
        self.firewall.until_signal().await;
        if let Some(p) = self.process {
            p.stop().await;
        }
    }
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

/// A new directory for a demo's state under the system's temporary directory.
fn fresh_data_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "mcp-firewall-demo-{}",
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Starts the demo: the estate first (started, or reached at its URL), then
/// the firewall in front of it, auditing into a throwaway ClickHouse when one
/// is installed and asked for.
pub async fn start(opts: Options) -> anyhow::Result<Demo> {
    let Options {
        listen,
        admin,
        upstream,
        clickhouse,
        data_dir,
    } = opts;
    let (upstream_url, process) = start_estate(upstream).await?;
    let data_dir = match data_dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            dir
        }
        None => fresh_data_dir()?,
    };
    let text = config_text(listen, admin, &upstream_url, &data_dir)?;
    let audit = start_audit_sink(clickhouse, &data_dir).await;
    let text = with_audit(&text, &audit);
    let mut cfg = config::load_str(
        &text,
        Path::new("config/demo.toml"),
        Path::new("config"),
        &|_| None,
    )?;
    cfg.policy_dir = write_pins(&data_dir)?;
    telemetry::init_logging(cfg.log_format, &cfg.log_level);

    let sources: Vec<(PathBuf, String)> = POLICIES
        .iter()
        .map(|(name, text)| (PathBuf::from("policies").join(name), (*text).to_owned()))
        .collect();
    let policy = crate::policy::compile(&sources).context("compiling the embedded policies")?;
    let mut registry = telemetry::registry();
    let store = PolicyStore::fixed(policy, &mut registry);
    let verifier = Verifier::new(&cfg.auth).await?;
    let tokens = Tokens::mint(&cfg.auth)?;

    let firewall = app::start_with(Arc::new(cfg), verifier, store, registry).await?;
    Ok(Demo {
        firewall,
        upstream_url,
        investigator_token: tokens.investigator,
        operator_token: tokens.operator,
        approver_token: tokens.approver,
        audit,
        data_dir,
        process,
    })
}

/// The estate's MCP endpoint, and its process when the demo starts it.
async fn start_estate(
    upstream: UpstreamSource,
) -> anyhow::Result<(String, Option<UpstreamProcess>)> {
    match upstream {
        UpstreamSource::Url(url) => Ok((url, None)),
        UpstreamSource::Binary(bin) => {
            let bin = upstream::locate(bin.as_deref())?;
            let process = upstream::launch(&bin).await?;
            Ok((process.url().to_owned(), Some(process)))
        }
    }
}

/// The demo config with its placeholders filled: the listeners, a fresh
/// signing secret, the approvals directory (created) and the estate.
fn config_text(
    listen: SocketAddr,
    admin: SocketAddr,
    upstream_url: &str,
    data_dir: &Path,
) -> anyhow::Result<String> {
    let mut secret = [0u8; 32];
    rand::rng().fill_bytes(&mut secret);
    let secret = hex::encode(secret);
    let approvals_dir = data_dir.join("approvals");
    std::fs::create_dir_all(&approvals_dir).context("a directory for approvals")?;
    Ok(DEMO_CONFIG
        .replace("{{APPROVALS_DIR}}", &approvals_dir.display().to_string())
        .replace("{{LISTEN}}", &listen.to_string())
        .replace("{{ADMIN}}", &admin.to_string())
        .replace("{{SECRET}}", &secret)
        .replace("{{UPSTREAM_URL}}", upstream_url))
}

/// The audit trail: into a throwaway ClickHouse when one is installed and
/// `clickhouse` asks for it, else kept in the local spool.
async fn start_audit_sink(clickhouse: bool, data_dir: &Path) -> AuditSink {
    let started = if clickhouse {
        let dir = data_dir.join("clickhouse");
        tokio::task::spawn_blocking(move || super::clickhouse::ThrowawayClickHouse::start(dir))
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
    } else {
        Err("asked to keep the rows in the spool".to_owned())
    };
    let (clickhouse, why_not) = match started {
        Ok(ch) => (Some(ch), None),
        Err(why) => (None, Some(why)),
    };
    AuditSink {
        clickhouse,
        why_not,
        spool: data_dir.join("audit-spool"),
        database: AUDIT_DATABASE,
    }
}

/// The config `text` with the `[audit]` sections that write to `audit`.
fn with_audit(text: &str, audit: &AuditSink) -> String {
    format!(
        "{text}\n[audit]\nenabled = true\ninstance = \"demo\"\n{}\n[audit.clickhouse]\nurl = \"{}\"\ndatabase = \"{AUDIT_DATABASE}\"\n[audit.spool]\ndir = \"{}\"\n[audit.batch]\nmax_age_ms = 200\n",
        // Without a ClickHouse the backlog only grows: not a reason to
        // call the demo unready.
        if audit.clickhouse.is_some() { "" } else { "max_backlog_age_s = 0" },
        audit
            .clickhouse
            .as_ref()
            .map_or_else(|| "http://127.0.0.1:9".to_owned(), |c| c.http_url.clone()),
        audit.spool.display()
    )
}

/// Writes the embedded pins, where accepting a change in the console
/// writes; the policy directory that holds them.
fn write_pins(data_dir: &Path) -> anyhow::Result<PathBuf> {
    let pins_dir = data_dir.join("policy");
    std::fs::create_dir_all(pins_dir.join(crate::pins::PINS_DIR))
        .context("a directory for the demo's pins")?;
    std::fs::write(
        pins_dir.join(crate::pins::PINS_DIR).join("incidents.toml"),
        DEMO_PINS,
    )
    .context("writing the demo's pins")?;
    Ok(pins_dir)
}

/// The tokens the demo prints.
struct Tokens {
    investigator: String,
    operator: String,
    approver: String,
}

impl Tokens {
    /// Mints the investigator's, the operator's and the approver's tokens,
    /// valid for an hour.
    fn mint(auth_cfg: &auth::AuthConfig) -> anyhow::Result<Tokens> {
        let lifetime = Duration::from_secs(3600);
        let mint = |audience: Audience, sub: &str, agent: &str, projects: &[&str], run: &str| {
            auth::mint(
                auth_cfg,
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
        Ok(Tokens {
            investigator: mint(
                Audience::Mcp,
                "demo-user",
                "incident-investigator",
                &["sre"],
                "run-investigate-1",
            )?,
            operator: mint(
                Audience::Mcp,
                "demo-user",
                "sre-lead",
                &["sre", "platform"],
                "run-operate-1",
            )?,
            // A different person: the run's own caller may not approve its calls.
            approver: mint(
                Audience::Admin,
                "on-call-engineer",
                "sre-lead",
                &["sre"],
                "console",
            )?,
        })
    }
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
fn feed_args(a: &AuditSink) -> crate::cli::audit::AuditArgs {
    crate::cli::audit::AuditArgs {
        config: None,
        clickhouse: a.clickhouse.as_ref().map(|c| c.http_url.clone()),
        database: Some(a.database.to_owned()),
        table: None,
        user: None,
        password_env: None,
        spool: a.clickhouse.is_none().then(|| a.spool.clone()),
        json: false,
        command: crate::cli::audit::AuditCommand::Tail {
            lines: 0,
            once: false,
        },
    }
}

/// `mcp-firewall demo`: start, print how to connect, run until Ctrl-C.
pub async fn run(opts: Options) -> anyhow::Result<()> {
    let demo = start(opts).await?;
    let url = format!("http://{}/mcp/incidents", demo.firewall.mcp_addr);
    println!(
        r#"
mcp-firewall demo is running.

  MCP endpoint   {url}
  admin          http://{admin}/healthz  /readyz  /metrics
  upstream       {upstream} (the sample SRE incident estate, behind the firewall)
  state          {data_dir} (approvals, pins, the audit spool; kept after the demo)

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
        upstream = demo.upstream_url,
        data_dir = demo.data_dir.display(),
        inv = demo.investigator_token,
        op = demo.operator_token,
        approver = demo.approver_token,
        audit = audit_help(&demo.audit),
    );
    // The audit trail as it lands, read back from where it went.
    let feed = feed_args(&demo.audit);
    tokio::spawn(async move {
        let mut out = std::io::stdout();
        if let Err(e) = crate::cli::audit::run(&feed, &mut out).await {
            tracing::warn!(error = %e, "demo: the audit feed stopped");
        }
    });
    demo.until_signal().await;
    Ok(())
}
