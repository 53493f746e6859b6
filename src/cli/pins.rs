//! `mcp-firewall pins …`: reviewing tool definitions from a terminal.
//!
//! - `pins diff` lists the definitions waiting for review on a running
//!   firewall, each with a diff against its pin;
//! - `pins accept UPSTREAM TOOL SHA256` / `pins reject …` decide one (the
//!   hash is the one `diff` showed, so nothing unseen is accepted);
//! - `pins record --config FILE --upstream NAME` lists the live upstream
//!   itself (with the config's credentials) and writes a pin for every
//!   tool into `pins/NAME.toml` for the security team to review and commit.

use std::fmt::Write as _;

use bytes::Bytes;
use http::Method;
use serde_json::Value;

use crate::approval::client::{AdminClient, ClientError};
use crate::config::Config;

use crate::pins::api::{ReviewBody, ReviewList};
use crate::pins::Subject;

/// `mcp-firewall pins …`.
#[derive(clap::Args)]
pub struct PinsArgs {
    /// The firewall's admin listener (diff, accept, reject).
    #[arg(
        long,
        env = "MCP_FIREWALL_ADMIN_URL",
        default_value = "http://127.0.0.1:9090"
    )]
    pub admin: String,
    /// An admin token with the `pins` scope (diff, accept, reject).
    #[arg(
        long,
        env = "MCP_FIREWALL_ADMIN_TOKEN",
        hide_env_values = true,
        default_value = ""
    )]
    pub token: String,
    /// What to do.
    #[command(subcommand)]
    pub command: PinsCommand,
}

/// The pins subcommands.
#[derive(clap::Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum PinsCommand {
    /// Show the definitions waiting for review, with a diff against the pin.
    Diff,
    /// Pin a pending definition.
    Accept {
        /// The upstream.
        upstream: String,
        /// The tool (or prompt, or URI template).
        tool: String,
        /// The definition's SHA-256, as `diff` shows it.
        sha256: String,
        /// `tool`, `prompt` or `resource_template`.
        #[arg(long, default_value = "tool")]
        subject: String,
    },
    /// Keep a pending definition refused.
    Reject {
        /// The upstream.
        upstream: String,
        /// The tool (or prompt, or URI template).
        tool: String,
        /// The definition's SHA-256, as `diff` shows it.
        sha256: String,
        /// `tool`, `prompt` or `resource_template`.
        #[arg(long, default_value = "tool")]
        subject: String,
    },
    /// List a live upstream and write a pin for each of its tools.
    Record {
        /// The TOML config file.
        #[arg(long, short)]
        config: std::path::PathBuf,
        /// The upstream's route name.
        #[arg(long)]
        upstream: String,
        /// Who pins (recorded in the file).
        #[arg(long, env = "USER", default_value = "mcp-firewall pins record")]
        by: String,
    },
}

/// Runs one subcommand and returns the text to print.
pub async fn run(args: &PinsArgs) -> anyhow::Result<String> {
    match &args.command {
        PinsCommand::Record {
            config,
            upstream,
            by,
        } => {
            let cfg = crate::config::load(config)?;
            record(&cfg, upstream, by).await
        }
        PinsCommand::Diff => {
            let client = AdminClient::new(&args.admin, &args.token)?;
            let list: ReviewList = client.call(Method::GET, "/pins", None).await?;
            Ok(render(&list))
        }
        PinsCommand::Accept {
            upstream,
            tool,
            sha256,
            subject,
        }
        | PinsCommand::Reject {
            upstream,
            tool,
            sha256,
            subject,
        } => {
            let subject = Subject::parse(subject).ok_or_else(|| {
                anyhow::anyhow!("--subject must be tool, prompt or resource_template")
            })?;
            let action = match args.command {
                PinsCommand::Accept { .. } => "accept",
                _ => "reject",
            };
            let client = AdminClient::new(&args.admin, &args.token)?;
            let body = serde_json::to_vec(&ReviewBody {
                sha256: sha256.clone(),
                subject,
            })?;
            let path = format!("/pins/{}/{}/{action}", encode(upstream), encode(tool));
            let v: Value = client
                .call(Method::POST, &path, Some(Bytes::from(body)))
                .await
                .map_err(|e: ClientError| anyhow::anyhow!(e))?;
            Ok(format!(
                "{upstream}/{tool} {sha256}: {}\n",
                v["status"].as_str().unwrap_or("done")
            ))
        }
    }
}

/// Lists `upstream` and writes a pin for every tool (and every prompt and
/// resource template, when it lists them) into the config's policy
/// directory.
pub async fn record(cfg: &Config, upstream: &str, by: &str) -> anyhow::Result<String> {
    let client = upstream_client(cfg, upstream)?;
    let mut pins: Vec<(Subject, String, crate::pins::Pin)> = Vec::new();
    let mut counts = Vec::new();
    for subject in [Subject::Tool, Subject::Prompt, Subject::ResourceTemplate] {
        let listed = match live(&client, subject).await {
            Ok(v) => v,
            // Tools are required; the rest only when the upstream has them.
            Err(e) if subject == Subject::Tool => return Err(e),
            Err(_) => continue,
        };
        counts.push(format!("{} {}s", listed.len(), subject.as_str()));
        pins.extend(
            listed
                .iter()
                .map(|(name, def)| (subject, name.clone(), crate::pins::pin_of(def, by))),
        );
    }
    let dir = cfg.policy_dir.join(crate::pins::PINS_DIR);
    crate::pins::write_pins(&dir, upstream, pins)?;
    Ok(format!(
        "{} of {upstream} pinned in {}: review and commit it\n",
        counts.join(", "),
        dir.join(format!("{upstream}.toml")).display()
    ))
}

pub(crate) fn upstream_client(
    cfg: &Config,
    upstream: &str,
) -> anyhow::Result<crate::upstream::client::UpstreamClient> {
    let up = cfg
        .upstreams
        .iter()
        .find(|u| u.name == upstream)
        .ok_or_else(|| anyhow::anyhow!("no upstream {upstream:?} in the config"))?;
    let metrics = crate::telemetry::Metrics::register(&mut Default::default());
    Ok(crate::upstream::client::UpstreamClient::new(
        up.clone(),
        metrics,
    )?)
}

/// Every tool of the live upstream (all pages), by name.
pub async fn live_tools(cfg: &Config, upstream: &str) -> anyhow::Result<Vec<(String, Value)>> {
    live(&upstream_client(cfg, upstream)?, Subject::Tool).await
}

/// Every definition of `subject` the live upstream lists (all pages), by
/// name.
async fn live(
    client: &crate::upstream::client::UpstreamClient,
    subject: Subject,
) -> anyhow::Result<Vec<(String, Value)>> {
    let (method, array) = match subject {
        Subject::Tool => ("tools/list", "tools"),
        Subject::Prompt => ("prompts/list", "prompts"),
        Subject::ResourceTemplate => ("resources/templates/list", "resourceTemplates"),
    };
    // The operator's command, not the serving firewall: no audit pipeline
    // runs here.
    let auditor = crate::audit::Auditor::disabled();
    let on_behalf = crate::upstream::own_client::OnBehalf {
        auditor: &auditor,
        tenant: "",
        subject: "mcp-firewall pins",
        run_id: "",
        user: None,
        reason: "pins record",
    };
    let pages = crate::upstream::own_client::list_pages(client, on_behalf, method)
        .await
        .map_err(|e| anyhow::anyhow!("{method}: {e}"))?;
    let mut out = Vec::new();
    for page in pages {
        let v: Value = serde_json::from_str(&page)?;
        for t in v["result"][array].as_array().into_iter().flatten() {
            if let Some(name) = t[subject.key()].as_str() {
                out.push((name.to_owned(), t.clone()));
            }
        }
    }
    Ok(out)
}

fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The pending reviews as text.
pub fn render(list: &ReviewList) -> String {
    if list.pending.is_empty() {
        return "no tool definitions waiting for review\n".to_owned();
    }
    let mut out = String::new();
    for r in &list.pending {
        let subject = match r.subject.as_str() {
            "tool" => String::new(),
            other => format!("{other} "),
        };
        let _ = writeln!(
            out,
            "{subject}{}/{}  {}  sha256 {}{}",
            r.upstream,
            r.tool,
            r.kind,
            r.sha256,
            r.pinned_by
                .as_ref()
                .map(|b| format!("  (pinned by {b})"))
                .unwrap_or_default()
        );
        for line in r.diff.lines() {
            let _ = writeln!(out, "    {line}");
        }
        let flag = match r.subject.as_str() {
            "tool" => String::new(),
            other => format!(" --subject {other}"),
        };
        let _ = writeln!(
            out,
            "  accept: mcp-firewall pins accept {} {} {}{flag}\n",
            r.upstream, r.tool, r.sha256
        );
    }
    out
}
