//! `mcp-bench load`: a load test of any MCP deployment, for the operator who
//! has one (the firewall in front of real servers, or an upstream to size
//! before it goes behind the firewall).
//!
//! Order of a run: the plan ([`plan`]: scenario file and flags, checked
//! against the safety bounds) and the identities ([`identity`]: tokens given
//! or minted) are settled first, and `--dry-run` stops there; then per
//! target the tools are discovered ([`client`]), `/metrics` is read
//! ([`checks`]), the rounds run interleaved across targets ([`drive`]),
//! `/metrics` is read again and `--verify-audit` looks for every answered
//! call's row; last the report is written and the thresholds judged
//! ([`summary`]). Exit status: 0, 2 when a threshold failed, 1 on error.

pub mod checks;
pub mod client;
pub mod drive;
pub mod identity;
pub mod plan;
pub mod summary;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use self::client::{Ids, User};
use self::identity::{Identities, MintKey};
use self::plan::{Bounds, Era, Overrides};
use self::summary::{Report, Stats, Threshold};

/// `mcp-bench load`.
#[derive(Args, Clone, Debug)]
pub struct LoadArgs {
    /// An MCP endpoint to load (repeat to compare several in interleaved
    /// rounds). Nothing is sent anywhere else.
    #[arg(long = "target", required = true)]
    pub targets: Vec<String>,
    /// A label per target, in order (default: the URL).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// The scenario (TOML): mix, arguments, arrival, stages.
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// `auto` (server/discover, else initialize), `2025-03-26`,
    /// `2025-11-25` or `2026-07-28`.
    #[arg(long)]
    pub era: Option<String>,
    /// Closed loop: this many users (open loop: users carrying the rate).
    #[arg(long)]
    pub vus: Option<usize>,
    /// Open loop: requests per second.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Length of each round (e.g. 30s, 2m).
    #[arg(long)]
    pub duration: Option<String>,
    /// Stop a round after this many answers.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Pause after each answer (closed loop).
    #[arg(long)]
    pub think: Option<String>,
    /// Calls a user makes with one run token before taking the next.
    #[arg(long)]
    pub calls_per_run: Option<u64>,
    /// The tool to call when the scenario has no mix (default: drawn from
    /// the target's tools/list).
    #[arg(long)]
    pub tool: Option<String>,
    /// Rounds per target.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// A run token (repeat: one run each).
    #[arg(long = "token")]
    pub tokens: Vec<String>,
    /// Run tokens, one per line.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Mint run tokens with this private key (PEM; see --mint-alg).
    #[arg(long)]
    pub mint_key: Option<PathBuf>,
    /// Mint run tokens with this HS256 secret (a file).
    #[arg(long)]
    pub mint_secret_file: Option<PathBuf>,
    /// ES256 or RS256, for --mint-key.
    #[arg(long, default_value = "ES256")]
    pub mint_alg: String,
    /// `kid` header of minted tokens.
    #[arg(long)]
    pub kid: Option<String>,
    /// Claims of minted tokens (TOML: issuer, audience, tenant, agent,
    /// projects, lifetime_s, ...).
    #[arg(long)]
    pub claims: Option<PathBuf>,
    /// Runs (tokens) to mint.
    #[arg(long, default_value_t = 16)]
    pub runs: usize,
    /// Send no token at all (an upstream without authentication).
    #[arg(long)]
    pub anonymous: bool,
    /// Extra CA certificate(s) to trust, PEM.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// `h1` (HTTP/1.1) or `h2` (ALPN over TLS, prior knowledge in clear).
    #[arg(long, default_value = "h1")]
    pub http: String,
    /// Per-request timeout.
    #[arg(long, default_value = "30s")]
    pub timeout: String,
    /// A fail condition for CI (repeat): `p99<250ms`, `errors<0.1%`,
    /// `rate>=2000`, `refused<5%`, `audit_missing==0`.
    #[arg(long = "threshold")]
    pub thresholds: Vec<String>,
    /// The firewall's `/metrics` (one per target, in order, or one for all).
    #[arg(long = "metrics")]
    pub metrics: Vec<String>,
    /// ClickHouse HTTP URL: check that every answered call has its row.
    #[arg(long)]
    pub verify_audit: Option<String>,
    /// The audit database.
    #[arg(long, default_value = "mcp_firewall")]
    pub audit_database: String,
    /// The audit table.
    #[arg(long, default_value = "audit_events")]
    pub audit_table: String,
    /// ClickHouse user.
    #[arg(long, default_value = "default")]
    pub audit_user: String,
    /// How long to wait for audit rows still shipping.
    #[arg(long, default_value = "30s")]
    pub audit_wait: String,
    /// Where the reports go (default: `load-results/<time>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the plan and exit without sending anything.
    #[arg(long)]
    pub dry_run: bool,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
    /// Most users (a safety bound).
    #[arg(long, default_value_t = 256)]
    pub max_vus: usize,
    /// Most requests per second, all users together (a safety bound).
    #[arg(long, default_value_t = 1000.0)]
    pub max_rate: f64,
    /// Longest round (a safety bound).
    #[arg(long, default_value = "5m")]
    pub max_duration: String,
}

/// What a finished load test says.
pub struct Outcome {
    /// The report.
    pub report: Report,
    /// Where it was written.
    pub dir: Option<PathBuf>,
}

/// Runs `mcp-bench load`; `Ok(None)` for a dry run.
pub async fn run(args: &LoadArgs) -> anyhow::Result<Option<Outcome>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    for t in &args.targets {
        let u: http::Uri = t.parse().with_context(|| format!("--target {t:?}"))?;
        anyhow::ensure!(
            matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some(),
            "--target {t:?}: an http:// or https:// URL"
        );
    }
    let bounds = Bounds {
        max_vus: args.max_vus,
        max_rate: args.max_rate,
        max_duration: plan::parse_duration(&args.max_duration)?,
    };
    let over = Overrides {
        era: args.era.as_deref().map(Era::parse).transpose()?,
        vus: args.vus,
        rate: args.rate,
        duration: args
            .duration
            .as_deref()
            .map(plan::parse_duration)
            .transpose()?,
        requests: args.requests,
        think_time: args
            .think
            .as_deref()
            .map(plan::parse_duration)
            .transpose()?,
        calls_per_run: args.calls_per_run,
        tool: args.tool.clone(),
    };
    let plan = plan::build(args.scenario.as_deref(), &over, bounds)?;
    let thresholds = args
        .thresholds
        .iter()
        .map(|t| Threshold::parse(t))
        .collect::<Result<Vec<_>, _>>()?;
    let identities = Arc::new(identities(args)?);
    let who = if args.anonymous {
        "no token".to_owned()
    } else if identities.minted {
        format!("{} run tokens minted here", identities.len())
    } else {
        format!("{} run tokens given", identities.len())
    };
    let labels: Vec<String> = args
        .targets
        .iter()
        .enumerate()
        .map(|(i, t)| args.labels.get(i).cloned().unwrap_or_else(|| t.clone()))
        .collect();
    let mut described = plan.describe();
    described.push_str(&format!(
        "  targets: {}\n  rounds: {} per target, interleaved\n",
        labels.join(", "),
        args.rounds
    ));
    if args.dry_run {
        println!("mcp-bench load (dry run: nothing sent)\n{described}  users: {who}");
        for t in &thresholds {
            println!("  threshold: {}", t.text);
        }
        return Ok(None);
    }

    let http_factory = client_factory(args)?;
    let control = (http_factory)();
    let ids = Arc::new(Ids::new());
    // Discover each target's tools once, with the first run's token.
    let mut tools = Vec::new();
    for url in &args.targets {
        let mut user = User::open((http_factory)(), url, identities.take(), plan.era, &ids)
            .await
            .map_err(|e| anyhow::anyhow!("{url}: {}", e.0))?;
        let listed = user
            .list_tools(&ids)
            .await
            .map_err(|e| anyhow::anyhow!("{url}: {}", e.0))?;
        eprintln!(
            "{url}: speaks {} over {}, lists {} tools",
            user.version(),
            user.transport(),
            listed.len()
        );
        user.close().await;
        tools.push(listed);
    }
    let metrics_url = |i: usize| -> Option<&String> {
        args.metrics
            .get(i)
            .or_else(|| (args.metrics.len() == 1).then(|| &args.metrics[0]))
    };
    let mut before = Vec::new();
    for i in 0..args.targets.len() {
        before.push(match metrics_url(i) {
            Some(u) => Some(
                checks::scrape(&control, u)
                    .await
                    .map_err(anyhow::Error::msg)?,
            ),
            None => None,
        });
    }
    let mut totals: Vec<Stats> = Vec::new();
    for _ in &args.targets {
        totals.push(Stats::new()?);
    }
    for _ in 0..args.rounds.max(1) {
        for (i, url) in args.targets.iter().enumerate() {
            let target = drive::Target {
                label: labels[i].clone(),
                url: url.clone(),
                client: http_factory.clone(),
                tools: tools[i].clone(),
            };
            let stats =
                drive::round(&plan, target, identities.clone(), ids.clone(), !args.quiet).await?;
            totals[i].merge(&stats);
        }
    }
    let mut summaries = Vec::new();
    for (i, url) in args.targets.iter().enumerate() {
        let mut s = totals[i].summary(&labels[i], url);
        if let (Some(u), Some(Some(b))) = (metrics_url(i), before.get(i)) {
            let after = checks::scrape(&control, u)
                .await
                .map_err(anyhow::Error::msg)?;
            s.metrics = checks::deltas(b, &after);
        }
        if let Some(ch) = &args.verify_audit {
            let target = checks::AuditTarget {
                url: ch.clone(),
                database: args.audit_database.clone(),
                table: args.audit_table.clone(),
                user: args.audit_user.clone(),
                password: std::env::var("MCP_BENCH_CLICKHOUSE_PASSWORD").unwrap_or_default(),
                wait: plan::parse_duration(&args.audit_wait)?,
            };
            let check = checks::verify_audit(&control, &target, totals[i].answered_calls()).await;
            if let Some(e) = &check.error {
                eprintln!("mcp-bench load: the audit check could not run: {e}");
            }
            s.audit = Some(check);
        }
        summaries.push(s);
    }
    let verdicts = thresholds
        .iter()
        .flat_map(|t| summaries.iter().map(|s| t.judge(s)))
        .collect();
    let report = Report {
        started: mcp_firewall::internals::fmt_ms(now_ms()),
        plan: described,
        identities: who,
        targets: summaries,
        verdicts,
    };
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("load-results/{}", now_ms() / 1000)));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(dir.join("report.md"), report.markdown())?;
    std::fs::write(
        dir.join("report.svg"),
        report.svg().map_err(anyhow::Error::msg)?,
    )?;
    Ok(Some(Outcome {
        report,
        dir: Some(dir),
    }))
}

fn identities(args: &LoadArgs) -> anyhow::Result<Identities> {
    if args.anonymous {
        return Ok(Identities::anonymous());
    }
    let key = match (&args.mint_key, &args.mint_secret_file) {
        (Some(_), Some(_)) => anyhow::bail!("--mint-key or --mint-secret-file, not both"),
        (Some(pem), None) => Some(MintKey::Pem(
            identity::parse_alg(&args.mint_alg)?,
            std::fs::read(pem).with_context(|| format!("--mint-key {}", pem.display()))?,
        )),
        (None, Some(f)) => Some(MintKey::Secret(
            std::fs::read_to_string(f)
                .with_context(|| format!("--mint-secret-file {}", f.display()))?
                .trim()
                .as_bytes()
                .to_vec(),
        )),
        (None, None) => None,
    };
    if let Some(key) = key {
        let claims = args
            .claims
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("minting needs --claims FILE"))?;
        let template = Identities::template(claims)?;
        return Ok(Identities::mint(
            &key,
            args.kid.as_deref(),
            &template,
            args.runs,
        )?);
    }
    let mut tokens = args.tokens.clone();
    if let Some(f) = &args.token_file {
        tokens.extend(Identities::from_file(f)?);
    }
    Ok(Identities::given(tokens)?)
}

type Factory = Arc<dyn Fn() -> reqwest::Client + Send + Sync>;

fn client_factory(args: &LoadArgs) -> anyhow::Result<Factory> {
    let timeout = plan::parse_duration(&args.timeout)?;
    let ca = match &args.ca {
        Some(p) => {
            let pem = std::fs::read(p).with_context(|| format!("--ca {}", p.display()))?;
            Some(
                reqwest::Certificate::from_pem_bundle(&pem)
                    .with_context(|| format!("--ca {}: not PEM certificates", p.display()))?,
            )
        }
        None => None,
    };
    let h2 = match args.http.as_str() {
        "h1" => false,
        "h2" => true,
        other => anyhow::bail!("--http {other}: h1 or h2"),
    };
    let build = move || -> Result<reqwest::Client, reqwest::Error> {
        let mut b = reqwest::Client::builder()
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(4);
        if h2 {
            b = b.http2_prior_knowledge();
        } else {
            b = b.http1_only();
        }
        for c in ca.iter().flatten() {
            b = b.add_root_certificate(c.clone());
        }
        b.build()
    };
    // Fail now, not in every user, when the TLS setup is refused.
    let first = build().context("building the HTTP client")?;
    let fallback = first.clone();
    Ok(Arc::new(move || {
        build().unwrap_or_else(|_| fallback.clone())
    }))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
