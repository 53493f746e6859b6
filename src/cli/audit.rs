//! `mcp-firewall audit`: an auditor's first questions without learning the
//! schema. `tail` follows new rows (from ClickHouse, or from a local spool
//! when no ClickHouse is at hand), `run RUN_ID` is a run's timeline (every
//! call, decision, stop reason and approval: which one, who gave it and
//! when, the policy set that decided and the pin the call matched, who
//! acted for the principal), `denials --since 1h` groups
//! refusals by role and reason, `flagged --since 1h` lists the answers
//! content screening found something in (kinds and action, never the
//! text) with the run's labels, `stats --days 7` reads the daily aggregate,
//! `shadow --since 24h` the calls a shadow policy would decide otherwise,
//! and `replay --policy-dir DIR` re-decides recorded calls under a
//! candidate ([`super::replay`]).
//! Tables for people, `--json` for scripts.
//!
//! Invariants: the SQL each command runs is [`query`]'s, and the auditor's
//! guide's queries (`docs/auditors.md`) are these texts (a test holds them
//! together); values are
//! bound by the client library (escaped), never spliced; a spool is read,
//! never written or locked, so it can be read while the firewall runs.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::audit::ClickHouseConfig;

/// `mcp-firewall audit …`.
#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    /// Read `[audit]` from this firewall config (ClickHouse, or its spool;
    /// `replay` also reads its upstreams). Options may follow the command.
    #[arg(long, short, global = true, env = "MCP_FIREWALL_CONFIG")]
    pub config: Option<PathBuf>,
    /// ClickHouse's HTTP interface (overrides the config).
    #[arg(long, global = true)]
    pub clickhouse: Option<String>,
    /// The audit database.
    #[arg(long, global = true)]
    pub database: Option<String>,
    /// The audit table.
    #[arg(long, global = true)]
    pub table: Option<String>,
    /// ClickHouse user.
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// Environment variable holding the ClickHouse password.
    #[arg(long, global = true)]
    pub password_env: Option<String>,
    /// Read a local spool directory instead of ClickHouse (`tail` only).
    #[arg(long, global = true)]
    pub spool: Option<PathBuf>,
    /// JSON (one object per line) instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to ask.
    #[command(subcommand)]
    pub command: AuditCommand,
}

/// The questions.
#[derive(clap::Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum AuditCommand {
    /// The newest rows, then every new one as it lands (Ctrl-C ends).
    Tail {
        /// Rows shown before following.
        #[arg(long, short = 'n', default_value_t = 20)]
        lines: usize,
        /// Print the newest rows and exit.
        #[arg(long)]
        once: bool,
    },
    /// A run's timeline: every call, decision, stop reason and approval.
    Run {
        /// The run id (the token's `run_id`).
        run_id: String,
    },
    /// Refusals (deny, hidden, invalid) by role, stop reason and reason.
    Denials {
        /// How far back (`30m`, `1h`, `7d`).
        #[arg(long, default_value = "1h")]
        since: String,
    },
    /// Answers content screening found something in: what (kinds, never
    /// the text), what it did (flag, redact, block), the run's labels.
    Flagged {
        /// How far back (`30m`, `1h`, `7d`).
        #[arg(long, default_value = "1h")]
        since: String,
    },
    /// What the shadow policy (`[policy] shadow_dir`) would have decided
    /// otherwise: the top differing tools and principals.
    Shadow {
        /// How far back (`30m`, `1h`, `7d`).
        #[arg(long, default_value = "24h")]
        since: String,
    },
    /// Re-decides the recorded `tools/call` under a candidate policy
    /// directory and prints how many would change and which, grouped by
    /// tool and decision (needs --config: upstreams as `serve` sees them).
    Replay {
        /// The candidate policy directory.
        #[arg(long)]
        policy_dir: PathBuf,
        /// How far back (`30m`, `1h`, `7d`).
        #[arg(long, default_value = "24h")]
        since: String,
        /// Most calls re-decided (newest first).
        #[arg(long, default_value_t = 1_000_000)]
        limit: u64,
    },
    /// Calls, denials, errors, runs and latency per day and tool, from the
    /// daily aggregate.
    Stats {
        /// Days back, today included.
        #[arg(long, default_value_t = 7)]
        days: u32,
    },
    /// Writes a new Ed25519 key for signing audit checkpoints (PKCS#8 PEM,
    /// mode 0600; an existing file is never overwritten).
    Keygen {
        /// The key file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Prints the public key of a checkpoint signing key, to publish
    /// (`ed25519:<base64>`).
    Pubkey {
        /// The signing key file.
        #[arg(long)]
        key: PathBuf,
    },
    /// Proves the audit trail complete and unaltered: every writer's hash
    /// chain, its signed checkpoints, and every row against its chain
    /// entry. Names each deleted, altered or forged row; exits 0 only when
    /// everything checked holds.
    Verify {
        /// Chain entries from this instant (RFC 3339, `YYYY-MM-DD` UTC, or
        /// ms since the epoch); default: each chain's start.
        #[arg(long)]
        from: Option<String>,
        /// Up to this instant (a day means its end); default: each chain's
        /// end (and signed rows past it are a cut tail).
        #[arg(long)]
        to: Option<String>,
        /// One writer only.
        #[arg(long)]
        writer: Option<String>,
        /// A public key whose checkpoint signatures count (`ed25519:…` as
        /// `audit pubkey` prints it, or a file holding that); repeatable.
        /// Default: the config's `audit.signing_key_file`'s.
        #[arg(long = "public-key")]
        public_keys: Vec<String>,
        /// A writer's local checkpoint file, checked besides the table;
        /// repeatable. Default: the config's `audit.checkpoint_file` (or
        /// `<spool.dir>/checkpoints.jsonl`), which must exist when the
        /// config signs checkpoints.
        #[arg(long = "checkpoints")]
        checkpoint_files: Vec<PathBuf>,
        /// Do not require checkpoints: a writer no trusted checkpoint
        /// signs, or a tail unsigned past `checkpoint_every`, is reported
        /// but not a failure.
        #[arg(long)]
        allow_unsigned: bool,
        /// Also write every verified row, with its writer, seq and hashes,
        /// as JSON lines to this file (for a SIEM).
        #[arg(long)]
        export: Option<PathBuf>,
    },
}

/// `audit keygen` and `audit pubkey`: no audit store involved.
fn keys(command: &AuditCommand, out: &mut (dyn std::io::Write + Send)) -> anyhow::Result<()> {
    use crate::audit::chain::Signer;
    use anyhow::Context as _;
    match command {
        AuditCommand::Keygen { out: path } => {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt;
            let pem = Signer::generate_pem()?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| {
                    format!(
                        "writing {} (an existing key is never overwritten)",
                        path.display()
                    )
                })?;
            f.write_all(pem.as_bytes())?;
            f.sync_all()?;
            let signer = Signer::from_pem(&pem)?;
            writeln!(
                out,
                "wrote {}; its public key, to publish:\n{}",
                path.display(),
                signer.public_key_text()
            )?;
            Ok(())
        }
        AuditCommand::Pubkey { key } => {
            let pem = std::fs::read_to_string(key)
                .with_context(|| format!("reading {}", key.display()))?;
            let signer = Signer::from_pem(&pem).with_context(|| key.display().to_string())?;
            writeln!(out, "{}", signer.public_key_text())?;
            Ok(())
        }
        other => anyhow::bail!("{other:?} is not a key command"),
    }
}

/// Which question, for [`query`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Question {
    /// Rows from a time on (`?` = `time_ms`).
    Tail,
    /// A run's timeline (`?` = the run id).
    Run,
    /// Refusals since (`?` = `time_ms`).
    Denials,
    /// Screened content since (`?` = `time_ms`).
    Flagged,
    /// The daily aggregate (`?` = days back).
    Stats,
    /// Tools whose calls the shadow policy would decide otherwise (`?` =
    /// `time_ms`).
    ShadowTools,
    /// Principals whose calls the shadow policy would decide otherwise
    /// (`?` = `time_ms`).
    ShadowPrincipals,
    /// The recorded `tools/call` decisions to re-decide (`?` = `time_ms`,
    /// then the limit).
    Replay,
}

/// The SQL of a question, with `?` where the value is bound.
pub fn query(q: Question, database: &str, table: &str) -> String {
    let t = format!("{database}.{table}");
    match q {
        Question::Tail => format!(
            "SELECT toString(event_id) AS event_id, time_ms, tenant, run_id, agent_role, method, tool, decision, stop_reason, latency_us, row_version, \
             approval_id, approver, approved_ms, policy_sha256, pin_sha256, delegation, token_jti \
             FROM {t} WHERE time_ms >= ? ORDER BY time_ms LIMIT 1000"
        ),
        Question::Run => format!(
            "SELECT time_ms, method, tool, risk, decision, stop_reason, reason, upstream_status, latency_us, \
             approval_id, approver, approved_ms, policy_sha256, pin_sha256, delegation, token_jti \
             FROM {t} FINAL WHERE run_id = ? ORDER BY time_ms"
        ),
        Question::Denials => format!(
            "SELECT agent_role, decision, stop_reason, reason, uniqExact(event_id) AS n \
             FROM {t} WHERE time_ms >= ? AND decision IN ('deny', 'hidden', 'invalid') \
             GROUP BY agent_role, decision, stop_reason, reason ORDER BY n DESC"
        ),
        Question::Flagged => format!(
            "SELECT time_ms, run_id, upstream, method, tool, screen_kinds, screen_action, run_labels \
             FROM {t} FINAL WHERE time_ms >= ? AND screen_action != '' ORDER BY time_ms"
        ),
        Question::Stats => format!(
            "SELECT day, tool, uniqExactMerge(calls) AS calls, uniqExactIfMerge(denials) AS denials, \
             uniqExactIfMerge(errors) AS errors, uniqExactMerge(runs) AS runs, \
             quantilesMerge(0.5, 0.95, 0.99)(latency_quantiles)[2] AS p95_us \
             FROM {t}_daily_stats WHERE day > today() - ? GROUP BY day, tool ORDER BY day, tool"
        ),
        Question::ShadowTools => format!(
            "SELECT upstream, tool, decision, shadow_decision, uniqExact(event_id) AS calls, uniqExact(subject) AS principals \
             FROM {t} WHERE time_ms >= ? AND shadow_decision != '' \
             GROUP BY upstream, tool, decision, shadow_decision ORDER BY calls DESC, upstream, tool LIMIT 50"
        ),
        Question::ShadowPrincipals => format!(
            "SELECT tenant, subject, agent_role, decision, shadow_decision, uniqExact(event_id) AS calls, uniqExact(tool) AS tools \
             FROM {t} WHERE time_ms >= ? AND shadow_decision != '' \
             GROUP BY tenant, subject, agent_role, decision, shadow_decision ORDER BY calls DESC, subject LIMIT 50"
        ),
        Question::Replay => format!(
            "SELECT toString(event_id) AS event_id, time_ms, tenant, subject, run_id, upstream, tool, decision, approval_id, arguments, principal_claims \
             FROM {t} FINAL WHERE time_ms >= ? AND method = 'tools/call' \
             ORDER BY time_ms DESC LIMIT ?"
        ),
    }
}

/// Where the rows are.
enum Source {
    ClickHouse {
        client: Box<clickhouse::Client>,
        database: String,
        table: String,
    },
    Spool(PathBuf),
}

/// Runs one `audit` command, writing to `out` (stdout in the binary).
pub async fn run(args: &AuditArgs, out: &mut (dyn std::io::Write + Send)) -> anyhow::Result<()> {
    if matches!(
        args.command,
        AuditCommand::Keygen { .. } | AuditCommand::Pubkey { .. }
    ) {
        return keys(&args.command, out);
    }
    if let AuditCommand::Verify { .. } = &args.command {
        return verify(args, out).await;
    }
    let source = source(args)?;
    let json = args.json;
    match (&args.command, &source) {
        (AuditCommand::Tail { lines, once }, _) => tail(&source, *lines, *once, json, out).await,
        (_, Source::Spool(_)) => anyhow::bail!(
            "a spool holds rows not yet in ClickHouse; `run`, `denials`, `flagged` and `stats` ask ClickHouse (--clickhouse or --config)"
        ),
        (
            command,
            Source::ClickHouse {
                client,
                database,
                table,
            },
        ) => {
            let t = Table {
                client,
                database,
                table,
            };
            ask(args, command, &source, &t, out).await
        }
    }
}

/// The table a question is asked of.
struct Table<'a> {
    client: &'a clickhouse::Client,
    database: &'a str,
    table: &'a str,
}

impl Table<'_> {
    /// The query of question `q` on this table, values still to bind.
    fn query(&self, q: Question) -> clickhouse::query::Query {
        self.client.query(&query(q, self.database, self.table))
    }
}

/// Runs a command that asks ClickHouse's table `t` (of `source`).
async fn ask(
    args: &AuditArgs,
    command: &AuditCommand,
    source: &Source,
    t: &Table<'_>,
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<()> {
    let json = args.json;
    match command {
        AuditCommand::Run { run_id } => run_timeline(t, run_id, json, out).await,
        AuditCommand::Denials { since } => {
            let rows = fetch(t.query(Question::Denials).bind(since_ms(since)?)).await?;
            print_rows(
                &rows,
                &["n", "agent_role", "decision", "stop_reason", "reason"],
                json,
                out,
            )
        }
        AuditCommand::Flagged { since } => {
            let rows = fetch(t.query(Question::Flagged).bind(since_ms(since)?)).await?;
            print_rows(
                &rows,
                &[
                    "time_ms",
                    "run_id",
                    "upstream",
                    "method",
                    "tool",
                    "screen_kinds",
                    "screen_action",
                    "run_labels",
                ],
                json,
                out,
            )
        }
        AuditCommand::Shadow { since } => shadow(t, since, json, out).await,
        AuditCommand::Replay {
            policy_dir,
            since,
            limit,
        } => replay(args, t, policy_dir, since, *limit, out).await,
        AuditCommand::Stats { days } => {
            let rows = fetch(t.query(Question::Stats).bind(*days)).await?;
            print_rows(
                &rows,
                &[
                    "day", "tool", "calls", "denials", "errors", "runs", "p95_us",
                ],
                json,
                out,
            )
        }
        AuditCommand::Tail { lines, once } => tail(source, *lines, *once, json, out).await,
        AuditCommand::Keygen { .. } | AuditCommand::Pubkey { .. } => keys(command, out),
        AuditCommand::Verify { .. } => verify(args, out).await,
    }
}

/// The instant `since` (`30m`, `1h`, `7d`) before now, in ms.
fn since_ms(since: &str) -> anyhow::Result<u64> {
    let back =
        parse_since(since).ok_or_else(|| anyhow::anyhow!("--since {since:?}: e.g. 30m, 1h, 7d"))?;
    Ok(crate::clock::now_ms().saturating_sub(back.as_millis() as u64))
}

/// `audit run RUN_ID`: the run's timeline.
async fn run_timeline(
    t: &Table<'_>,
    run_id: &str,
    json: bool,
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<()> {
    let rows = fetch(t.query(Question::Run).bind(run_id)).await?;
    if rows.is_empty() && !json {
        writeln!(out, "no rows for run {run_id:?}")?;
        return Ok(());
    }
    print_rows(
        &rows,
        &[
            "time_ms",
            "method",
            "tool",
            "risk",
            "decision",
            "stop_reason",
            "latency_us",
            "approver",
            "approved_ms",
            "approval_id",
            "policy_sha256",
            "pin_sha256",
            "delegation",
            "token_jti",
            "reason",
        ],
        json,
        out,
    )
}

/// `audit shadow --since`: the calls the shadow policy would decide
/// otherwise, by tool and by principal.
async fn shadow(
    t: &Table<'_>,
    since: &str,
    json: bool,
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<()> {
    let from = since_ms(since)?;
    let tools = fetch(t.query(Question::ShadowTools).bind(from)).await?;
    let principals = fetch(t.query(Question::ShadowPrincipals).bind(from)).await?;
    if !json {
        writeln!(out, "calls the shadow policy would decide otherwise, since {since} (decision: live; shadow_decision: the shadow set's)")?;
        if tools.is_empty() {
            writeln!(out, "none")?;
            return Ok(());
        }
        writeln!(out, "\nby tool:")?;
    }
    print_rows(
        &tools,
        &[
            "calls",
            "principals",
            "upstream",
            "tool",
            "decision",
            "shadow_decision",
        ],
        json,
        out,
    )?;
    if !json {
        writeln!(out, "\nby principal:")?;
    }
    print_rows(
        &principals,
        &[
            "calls",
            "tools",
            "tenant",
            "subject",
            "agent_role",
            "decision",
            "shadow_decision",
        ],
        json,
        out,
    )
}

/// `audit replay`: re-decides the recorded calls since `since` (at most
/// `limit`, newest first) under the policy in `policy_dir`.
async fn replay(
    args: &AuditArgs,
    t: &Table<'_>,
    policy_dir: &Path,
    since: &str,
    limit: u64,
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<()> {
    let cfg = match &args.config {
        Some(path) => crate::config::load(path)?,
        None => anyhow::bail!("replay needs --config: the upstreams as `serve` sees them"),
    };
    let from = since_ms(since)?;
    let mut replay = super::replay::Replay::new(policy_dir)?;
    let rows = t
        .query(Question::Replay)
        .bind(from)
        .bind(limit)
        .fetch_bytes("JSONEachRow")?;
    let mut lines = tokio::io::AsyncBufReadExt::lines(rows);
    while let Some(line) = lines
        .next_line()
        .await
        .map_err(|e| anyhow::anyhow!("ClickHouse: {e}"))?
    {
        if line.trim().is_empty() {
            continue;
        }
        let row: Map<String, Value> = serde_json::from_str(&line)
            .map_err(|e| anyhow::anyhow!("ClickHouse answered {line:?}: {e}"))?;
        replay.row(&cfg, &row);
    }
    let report = replay.finish();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report.json())?)?;
    } else {
        write!(out, "{}", report.render(since))?;
    }
    Ok(())
}

/// `audit verify`: the report, then `Err` unless the trail holds.
async fn verify(args: &AuditArgs, out: &mut (dyn std::io::Write + Send)) -> anyhow::Result<()> {
    use crate::audit::verify::{self, Options, Target};
    let AuditCommand::Verify {
        from,
        to,
        writer,
        public_keys,
        checkpoint_files,
        export,
        allow_unsigned,
    } = &args.command
    else {
        anyhow::bail!("not a verify command");
    };
    let mut keys = read_public_keys(public_keys)?;
    let cfg = match &args.config {
        Some(path) => Some(crate::config::load(path)?),
        None => None,
    };
    let audit = cfg.as_ref().and_then(|c| c.audit.as_ref());
    if keys.is_empty() {
        if let Some(path) = audit.and_then(|a| a.signing_key_file.as_ref()) {
            let signer = crate::audit::load_signer(path)?;
            keys.extend(crate::audit::chain::parse_public_key(
                &signer.public_key_text(),
            ));
        }
    }
    let files = checkpoint_files_to_read(checkpoint_files, audit)?;
    let every = audit.map_or_else(
        || crate::audit::CheckpointEvery::default().limits(),
        |a| a.checkpoint_every.limits(),
    );
    let opts = Options {
        from_ms: instant("--from", from.as_deref(), false)?,
        to_ms: instant("--to", to.as_deref(), true)?,
        writer: writer.clone(),
        require_signed: (!keys.is_empty() && !allow_unsigned).then_some(every),
        keys,
        checkpoint_files: files,
        export: export.clone(),
    };
    let Source::ClickHouse {
        client,
        database,
        table,
    } = source(args)?
    else {
        anyhow::bail!("verify reads ClickHouse: --clickhouse URL or --config FILE");
    };
    let client = client.with_compression(clickhouse::Compression::None);
    let report = verify::verify(
        &Target {
            client: &client,
            database: &database,
            table: &table,
        },
        &opts,
    )
    .await?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        write!(out, "{}", verify::render(&report))?;
    }
    if !report.holds {
        anyhow::bail!("the audit trail does not hold: see the findings above");
    }
    Ok(())
}

/// The instant `text` names (`end`: the end of a day it names), in ms;
/// errors name `flag`.
fn instant(flag: &str, text: Option<&str>, end: bool) -> anyhow::Result<Option<u64>> {
    text.map(|t| {
        crate::clock::parse_instant_ms(t, end).ok_or_else(|| {
            anyhow::anyhow!("{flag} {t:?}: RFC 3339, YYYY-MM-DD or ms since the epoch")
        })
    })
    .transpose()
}

/// The `--public-key` values: a key itself (`ed25519:…`) or a file that
/// holds one.
fn read_public_keys(public_keys: &[String]) -> anyhow::Result<Vec<[u8; 32]>> {
    let mut keys = Vec::new();
    for k in public_keys {
        let text = if k.starts_with("ed25519:") {
            k.clone()
        } else {
            std::fs::read_to_string(k).map_err(|e| anyhow::anyhow!("--public-key {k}: {e}"))?
        };
        keys.push(crate::audit::chain::parse_public_key(&text).ok_or_else(|| {
            anyhow::anyhow!("--public-key {k}: not `ed25519:<base64 of 32 bytes>`")
        })?);
    }
    Ok(keys)
}

/// The checkpoint files to read: the auditor's (`named`), else the
/// writer's own copy when the config signs: a configured file that is
/// missing is an error, not an empty list.
fn checkpoint_files_to_read(
    named: &[PathBuf],
    audit: Option<&crate::audit::AuditConfig>,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = named.to_vec();
    if files.is_empty() {
        if let Some(a) = audit.filter(|a| a.signing_key_file.is_some()) {
            let path = a
                .checkpoint_file
                .clone()
                .unwrap_or_else(|| a.spool.dir.join("checkpoints.jsonl"));
            anyhow::ensure!(
                path.is_file(),
                "the config's checkpoint file {} is missing: pass the writer's copy with --checkpoints FILE",
                path.display()
            );
            files.push(path);
        }
    }
    Ok(files)
}

fn source(args: &AuditArgs) -> anyhow::Result<Source> {
    let cfg = match &args.config {
        Some(path) => Some(crate::config::load(path)?),
        None => None,
    };
    if let Some(dir) = &args.spool {
        return Ok(Source::Spool(dir.clone()));
    }
    let mut ch: ClickHouseConfig = cfg
        .as_ref()
        .and_then(|c| c.audit.as_ref())
        .map(|a| a.clickhouse.clone())
        .unwrap_or_default();
    match (&args.clickhouse, &cfg) {
        (Some(url), _) => ch.url = url.clone(),
        (None, Some(c)) if c.audit.is_some() => {}
        (None, Some(_)) => anyhow::bail!("the config has no [audit] section"),
        (None, None) => {
            anyhow::bail!("say where the rows are: --clickhouse URL, --config FILE or --spool DIR")
        }
    }
    if let Some(d) = &args.database {
        ch.database = d.clone();
    }
    if let Some(t) = &args.table {
        ch.table = t.clone();
    }
    if let Some(u) = &args.user {
        ch.user = u.clone();
    }
    if let Some(p) = &args.password_env {
        ch.password_env = Some(p.clone());
    }
    for (what, v) in [("database", &ch.database), ("table", &ch.table)] {
        if !crate::audit::is_identifier(v) {
            anyhow::bail!("{what} {v:?} is not an identifier");
        }
    }
    // 64-bit numbers as JSON numbers, not strings.
    let client = crate::audit::build_client(&ch)?
        .with_setting("output_format_json_quote_64bit_integers", "0");
    Ok(Source::ClickHouse {
        client: Box::new(client),
        database: ch.database,
        table: ch.table,
    })
}

async fn fetch(q: clickhouse::query::Query) -> anyhow::Result<Vec<Map<String, Value>>> {
    let bytes = q
        .fetch_bytes("JSONEachRow")?
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("ClickHouse: {e}"))?;
    let text = String::from_utf8_lossy(&bytes);
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).map_err(|e| anyhow::anyhow!("ClickHouse answered {l:?}: {e}"))
        })
        .collect()
}

async fn tail(
    source: &Source,
    lines: usize,
    once: bool,
    json: bool,
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<()> {
    let mut seen: HashMap<(String, u64), ()> = HashMap::new();
    let mut from_ms = 0u64;
    let mut first = true;
    let mut failing: Option<std::time::Instant> = None;
    loop {
        let fetched = match source {
            Source::ClickHouse {
                client,
                database,
                table,
            } => {
                fetch(
                    client
                        .query(&query(Question::Tail, database, table))
                        .bind(from_ms),
                )
                .await
            }
            Source::Spool(dir) => spool_rows(dir, from_ms),
        };
        let mut rows = match fetched {
            Ok(rows) => {
                failing = None;
                rows
            }
            // Following: the table may not exist yet (a firewall that just
            // started creates it), ClickHouse may be restarting; say so
            // once it lasts, and keep trying.
            Err(e) if !once => {
                let since = *failing.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= Duration::from_secs(3)
                    && since.elapsed() < Duration::from_millis(3500)
                {
                    eprintln!("audit tail: {e:#}; still trying");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        rows.sort_by_key(|r| num(r.get("time_ms")).unwrap_or(0));
        rows.retain(|r| {
            let id = r
                .get("event_id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let v = num(r.get("row_version")).unwrap_or(0);
            seen.insert((id, v), ()).is_none()
        });
        if first && rows.len() > lines {
            rows.drain(..rows.len() - lines);
        }
        if let Some(last) = rows.last().and_then(|r| num(r.get("time_ms"))) {
            from_ms = last;
        }
        if !rows.is_empty() || first {
            print_tail(&rows, json, first, out)?;
            out.flush()?;
        }
        first = false;
        if once {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One JSON object per line.
fn print_json(
    rows: &[Map<String, Value>],
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<()> {
    for r in rows {
        writeln!(out, "{}", Value::Object(r.clone()))?;
    }
    Ok(())
}

fn print_tail(
    rows: &[Map<String, Value>],
    json: bool,
    header: bool,
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<()> {
    if json {
        return print_json(rows, out);
    }
    if header {
        writeln!(
            out,
            "{:<24} {:<22} {:<22} {:<12} {:<24} {:<8} {:<18} {:>9}  approved by",
            "time", "run", "role", "method", "tool", "decision", "stop reason", "µs"
        )?;
    }
    for r in rows {
        let s = |k: &str| cell(r.get(k));
        writeln!(
            out,
            "{:<24} {:<22} {:<22} {:<12} {:<24} {:<8} {:<18} {:>9}  {}",
            time_text(r.get("time_ms")),
            s("run_id"),
            s("agent_role"),
            s("method"),
            s("tool"),
            s("decision"),
            // The intent row, written before the call was forwarded.
            if num(r.get("row_version")) == Some(0) && s("stop_reason").is_empty() {
                "(forwarding)".to_owned()
            } else {
                s("stop_reason")
            },
            s("latency_us"),
            approved_by(r),
        )?;
    }
    Ok(())
}

fn print_rows(
    rows: &[Map<String, Value>],
    columns: &[&str],
    json: bool,
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<()> {
    if json {
        return print_json(rows, out);
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|c| shown(c, r.get(*c))).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|row| row[i].chars().count())
                .chain(std::iter::once(c.len()))
                .max()
                .unwrap_or(0)
                .min(60)
        })
        .collect();
    let mut line = String::new();
    for (c, w) in columns.iter().zip(&widths) {
        let _ = write!(line, "{c:<w$}  ");
    }
    writeln!(out, "{}", line.trim_end())?;
    for row in &cells {
        line.clear();
        for (v, w) in row.iter().zip(&widths) {
            let v: String = v.chars().take(*w).collect();
            let _ = write!(line, "{v:<w$}  ");
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    if rows.is_empty() {
        writeln!(out, "(no rows)")?;
    }
    Ok(())
}

/// A column's value as a table shows it: times as dates (an `approved_ms`
/// of 0 as nothing), hashes by their first 12 hex digits (`--json` has them
/// whole), the delegation chain as `actor <- actor`, current actor first.
fn shown(column: &str, v: Option<&Value>) -> String {
    match column {
        "time_ms" => time_text(v),
        "approved_ms" if num(v).unwrap_or(0) == 0 => String::new(),
        "approved_ms" => time_text(v),
        c if c.ends_with("_sha256") => cell(v).chars().take(12).collect(),
        "delegation" => match v {
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| cell(Some(i)))
                .collect::<Vec<_>>()
                .join(" <- "),
            other => cell(other),
        },
        _ => cell(v),
    }
}

/// The tail's `approved by` cell: who, and which approval.
fn approved_by(r: &Map<String, Value>) -> String {
    let who = cell(r.get("approver"));
    if who.is_empty() {
        return String::new();
    }
    format!("{who} ({})", cell(r.get("approval_id")))
}

fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// A number, also when ClickHouse quoted it.
fn num(v: Option<&Value>) -> Option<u64> {
    match v {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.parse().ok(),
        _ => None,
    }
}

fn time_text(v: Option<&Value>) -> String {
    num(v).map(crate::clock::fmt_ms).unwrap_or_default()
}

/// The encoded rows (RowBinary, [`crate::audit::COLUMNS`] order) of a spool
/// directory, in write order, read without locking.
pub fn spool_payloads(dir: &Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let segments = crate::audit::list_segments(dir)
        .map_err(|e| anyhow::anyhow!("spool {}: {e}", dir.display()))?;
    for seq in segments {
        if let Ok(data) = std::fs::read(crate::audit::segment_path(dir, seq)) {
            out.extend(
                crate::audit::payloads(&data)
                    .into_iter()
                    .map(<[u8]>::to_vec),
            );
        }
    }
    Ok(out)
}

/// Every row of a spool directory from `from_ms` on, read without locking.
pub fn spool_rows(dir: &Path, from_ms: u64) -> anyhow::Result<Vec<Map<String, Value>>> {
    let mut rows = Vec::new();
    let segments = crate::audit::list_segments(dir)
        .map_err(|e| anyhow::anyhow!("spool {}: {e}", dir.display()))?;
    for seq in segments {
        let path = crate::audit::segment_path(dir, seq);
        let Ok(data) = std::fs::read(&path) else {
            // Shipped and deleted meanwhile.
            continue;
        };
        for payload in crate::audit::payloads(&data) {
            if let Some(row) = crate::audit::decode_row(payload) {
                if row.get("time_ms").and_then(Value::as_u64).unwrap_or(0) >= from_ms {
                    rows.push(row);
                }
            }
        }
    }
    Ok(rows)
}

/// `90s`, `30m`, `1h`, `7d`.
fn parse_since(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let n: u64 = s[..split].parse().ok()?;
    let unit = match &s[split..] {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(n.checked_mul(unit)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The auditor's guide's queries are what the commands run.
    #[test]
    fn the_auditors_guide_shows_the_sql_each_command_runs() {
        let guide = include_str!("../../docs/auditors.md");
        for (q, value) in [
            (Question::Tail, "{from_ms}"),
            (Question::Run, "'RUN_ID'"),
            (Question::Denials, "{since_ms}"),
            (Question::Flagged, "{since_ms}"),
            (Question::Stats, "{days}"),
            (Question::ShadowTools, "{since_ms}"),
            (Question::ShadowPrincipals, "{since_ms}"),
            (Question::Replay, "{since_ms}"),
        ] {
            let sql = query(q, "mcp_firewall", "audit_events")
                .replacen('?', value, 1)
                .replace('?', "{limit}");
            assert!(
                guide.contains(&sql),
                "docs/auditors.md lacks the {q:?} query:\n{sql}"
            );
        }
    }

    #[test]
    fn since_takes_seconds_minutes_hours_days() {
        assert_eq!(parse_since("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_since("30m"), Some(Duration::from_secs(1800)));
        assert_eq!(parse_since("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_since("7d"), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_since("1w"), None);
        assert_eq!(parse_since("h"), None);
    }
}
