//! The `mcp-firewall` command: parse the command line, load the config, run.
//! Nothing else lives here.
#![warn(clippy::too_many_lines)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use mcp_firewall::auth::{Audience, Mode};
use mcp_firewall::internals::init_logging;
use mcp_firewall::{app, cli, config};

/// A reverse proxy that decides what AI agents may do with MCP servers.
#[derive(Parser)]
#[command(name = "mcp-firewall", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve with a config file.
    Serve {
        /// The TOML config file.
        #[arg(long, short, env = "MCP_FIREWALL_CONFIG")]
        config: PathBuf,
    },
    /// Run the sample SRE incident upstream with the firewall in front of it,
    /// on the shipped demo config and policies, and print ready-to-use tokens.
    Demo {
        /// Where the firewall listens.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Where the admin endpoints listen.
        #[arg(long, default_value = "127.0.0.1:9090")]
        admin: SocketAddr,
        /// Put the firewall in front of the sample estate already running at
        /// this MCP endpoint (e.g. `mcp-demo-upstream --listen ...`) instead
        /// of starting one.
        #[arg(long, value_name = "URL", conflicts_with = "upstream_bin")]
        upstream: Option<String>,
        /// The `mcp-demo-upstream` binary to start (default: the one next to
        /// this executable, else on PATH).
        #[arg(long, value_name = "PATH")]
        upstream_bin: Option<PathBuf>,
        /// Where approvals, pins and the audit spool live (default: a new
        /// directory under the temporary directory, kept afterwards).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Keep the audit rows in the local spool even when ClickHouse is
        /// installed (no throwaway ClickHouse is started).
        #[arg(long)]
        spool_only: bool,
    },
    /// Validate a config file and its policies without serving; print what
    /// each role may call.
    Check {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Also list every upstream with pinning on and compare its tools
        /// with the pins.
        #[arg(long)]
        live: bool,
    },
    /// Explain the decision for one call and the rules that produced it.
    Explain {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
        /// A tool token (verified).
        #[arg(long, conflicts_with = "claims")]
        token: Option<String>,
        /// A JSON file of claims (not verified: what-if).
        #[arg(long)]
        claims: Option<PathBuf>,
        /// The upstream.
        #[arg(long)]
        upstream: String,
        /// The tool.
        #[arg(long)]
        tool: String,
        /// The call's arguments, as JSON.
        #[arg(long)]
        arguments: Option<String>,
        /// The run's labels, what-if (`private,untrusted`); without it they
        /// are read from Redis when state is shared.
        #[arg(long)]
        labels: Option<String>,
    },
    /// Run policy tests (TOML `[[case]]` files): each case's call or list
    /// decided as `serve` decides it, against what the case expects. Exits
    /// 1 when a case fails.
    Test {
        /// The TOML config file (upstreams, projects and categories as
        /// `serve` sees them).
        #[arg(long, short, env = "MCP_FIREWALL_CONFIG")]
        config: PathBuf,
        /// Test this policy directory instead of the config's (a candidate
        /// set, e.g. the shadow set).
        #[arg(long)]
        policy_dir: Option<PathBuf>,
        /// Also write the results as JUnit XML.
        #[arg(long)]
        junit: Option<PathBuf>,
        /// List the rules, roles and gates no case exercised.
        #[arg(long)]
        coverage: bool,
        /// Test files or directories; default `<policy dir>/tests/*.toml`.
        paths: Vec<PathBuf>,
    },
    /// The audit trail for people: tail, a run's timeline, denials, stats.
    Audit(mcp_firewall::cli::audit::AuditArgs),
    /// Approvals on a running firewall: list, show, approve, deny.
    Approvals(mcp_firewall::approval::client::ApprovalsArgs),
    /// Tool-definition pins: review drift on a running firewall (diff,
    /// accept, reject), or pin a live upstream's tools (record).
    Pins(mcp_firewall::cli::pins::PinsArgs),
    /// Users' own upstream tokens (`auth = "oauth_user"`): list (never
    /// their values), revoke.
    Credentials(mcp_firewall::cli::credentials::CredentialsArgs),
    /// Development tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Create or upgrade the PostgreSQL approvals schema (`serve` does it
    /// too at start) and exit.
    Migrate {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Confine this process as the JSON sandbox spec says, then execute
    /// COMMAND (how the firewall starts a stdio server); with `--probe`,
    /// print which layers applied instead. Exits 126 when a required layer
    /// is unavailable, 127 when COMMAND cannot be executed.
    #[command(hide = true)]
    SandboxExec {
        /// The sandbox spec (`[upstream.sandbox]` as JSON).
        #[arg(long)]
        spec: String,
        /// Apply the layers, print the report as JSON, and exit.
        #[arg(long)]
        probe: bool,
        /// With a network allow-list: the firewall's egress proxy (a UNIX
        /// socket), the server's only way out of its network namespace.
        #[arg(long)]
        egress_socket: Option<PathBuf>,
        /// A root firewall: the uid (and gid) the server runs as (default
        /// `nobody`).
        #[arg(long)]
        uid: Option<u32>,
        /// A root firewall: the gid the server runs as (default: the uid).
        #[arg(long)]
        gid: Option<u32>,
        /// An empty directory the private root is mounted on (default: a
        /// new temporary one).
        #[arg(long)]
        root: Option<PathBuf>,
        /// The server's environment is the first line of stdin (a JSON
        /// object), applied only when the server starts.
        #[arg(long)]
        env_stdin: bool,
        /// Internal: the init step inside the new PID namespace.
        #[arg(long, hide = true)]
        init_of: Option<String>,
        /// Internal: the firewall's uid when it is not root.
        #[arg(long, hide = true)]
        outer_uid: Option<u32>,
        /// The server's command and its arguments.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Inside a sandbox's network namespace: join connections on the
    /// listener given as stdin to the firewall's egress proxy (started by
    /// `sandbox-exec`; not for direct use).
    #[command(hide = true)]
    EgressForward {
        /// The egress proxy's UNIX socket.
        #[arg(long)]
        to: PathBuf,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Mint a token with the config's HS256 development key.
    Mint {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
        /// `mcp` (tool token) or `admin`.
        #[arg(long, default_value = "mcp")]
        audience: String,
        /// Subject.
        #[arg(long, default_value = "dev-user")]
        sub: String,
        /// Tenant.
        #[arg(long, default_value = "dev")]
        tenant: String,
        /// Agent role.
        #[arg(long)]
        agent: String,
        /// Run id.
        #[arg(long, default_value = "run-dev")]
        run: String,
        /// `caller`, `agent` or `service_account`.
        #[arg(long, default_value = "caller")]
        mode: String,
        /// The caller's projects (comma-separated).
        #[arg(long, value_delimiter = ',')]
        projects: Vec<String>,
        /// Project ceiling (comma-separated).
        #[arg(long, value_delimiter = ',')]
        ceiling: Option<Vec<String>>,
        /// Scopes (comma-separated; default: the audience's required scope).
        #[arg(long, value_delimiter = ',')]
        scope: Vec<String>,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 900)]
        lifetime_s: u64,
    },
    /// Decode a token and say whether (and why not) it is accepted.
    Inspect {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
        /// The token.
        token: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any thread exists: namespaces and user changes need a
    // single-threaded process, and every later thread inherits the rest.
    if let Command::SandboxExec {
        spec,
        probe,
        egress_socket,
        uid,
        gid,
        root,
        env_stdin,
        init_of,
        outer_uid,
        command,
    } = &cli.command
    {
        use mcp_firewall::sandbox::launch;
        return ExitCode::from(launch::main(&launch::Args {
            spec: spec.clone(),
            probe: *probe,
            egress_socket: egress_socket.clone(),
            uid: *uid,
            gid: *gid,
            root: root.clone(),
            env_stdin: *env_stdin,
            init_of: init_of.clone(),
            outer_uid: *outer_uid,
            command: command.clone(),
        }));
    }
    if let Command::EgressForward { to } = &cli.command {
        return match mcp_firewall::sandbox::net::forward(to) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mcp-firewall {e}");
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mcp-firewall: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp-firewall: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::SandboxExec { .. } | Command::EgressForward { .. } => Ok(()),
        Command::Serve { config } => {
            let cfg = config::load(&config)?;
            init_logging(cfg.log_format, &cfg.log_level);
            let running = app::start(Arc::new(cfg)).await?;
            running.until_signal().await;
            Ok(())
        }
        Command::Demo {
            listen,
            admin,
            upstream,
            upstream_bin,
            data_dir,
            spool_only,
        } => demo(listen, admin, upstream, upstream_bin, data_dir, spool_only).await,
        Command::Audit(args) => {
            let mut out = std::io::stdout();
            mcp_firewall::cli::audit::run(&args, &mut out).await
        }
        Command::Approvals(args) => {
            print!("{}", mcp_firewall::approval::client::run(&args).await?);
            Ok(())
        }
        Command::Check { config, live } => check(&config, live).await,
        Command::Credentials(args) => {
            print!("{}", mcp_firewall::cli::credentials::run(&args).await?);
            Ok(())
        }
        Command::Pins(args) => {
            print!("{}", mcp_firewall::cli::pins::run(&args).await?);
            Ok(())
        }
        Command::Migrate { config } => {
            let cfg = config::load(&config)?;
            println!("{}", cli::migrate(&cfg).await?);
            Ok(())
        }
        Command::Explain {
            config,
            token,
            claims,
            upstream,
            tool,
            arguments,
            labels,
        } => {
            let cfg = config::load(&config)?;
            let args = cli::ExplainArgs {
                token: token.as_deref(),
                claims: claims.as_deref(),
                upstream: &upstream,
                tool: &tool,
                arguments: arguments.as_deref(),
                labels: labels.as_deref(),
            };
            print!("{}", cli::explain(&cfg, args).await?);
            Ok(())
        }
        Command::Test {
            config,
            policy_dir,
            junit,
            coverage,
            paths,
        } => {
            let args = cli::policy_test::TestArgs {
                policy_dir,
                paths,
                junit,
                coverage,
            };
            policy_tests(&config, &args)
        }
        Command::Token(command) => token(command).await,
    }
}

/// `mcp-firewall demo`: the sample estate with the firewall in front.
async fn demo(
    listen: SocketAddr,
    admin: SocketAddr,
    upstream: Option<String>,
    upstream_bin: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    spool_only: bool,
) -> anyhow::Result<()> {
    use mcp_firewall::demo::run::{self, Options, UpstreamSource};
    let mut opts = Options::new(listen, admin);
    opts.upstream = match upstream {
        Some(url) => UpstreamSource::Url(url),
        None => UpstreamSource::Binary(upstream_bin),
    };
    opts.data_dir = data_dir;
    opts.clickhouse = !spool_only;
    run::run(opts).await
}

/// `mcp-firewall check`: the config and its policies, the stores, the pins,
/// the virtual servers and the sandboxes; fails on the first that cannot
/// serve.
async fn check(config: &std::path::Path, live: bool) -> anyhow::Result<()> {
    let cfg = config::load(config)?;
    print!("{}", cli::check(&cfg)?);
    let (report, reachable) = cli::check_stores(&cfg).await;
    print!("{report}");
    let (report, pins_ok) = cli::check_pins(&cfg, live).await;
    print!("{report}");
    print!("{}", cli::check_virtual_servers(&cfg).await);
    let (report, sandboxes_ok) = cli::check_sandboxes(&cfg);
    print!("{report}");
    if !sandboxes_ok {
        anyhow::bail!("a stdio upstream's required sandbox cannot be applied on this machine");
    }
    if !reachable {
        anyhow::bail!("a configured store cannot be reached");
    }
    if !pins_ok {
        anyhow::bail!("pins do not match the live upstreams");
    }
    Ok(())
}

/// `mcp-firewall test`: the policy cases; fails when one fails.
fn policy_tests(config: &std::path::Path, args: &cli::policy_test::TestArgs) -> anyhow::Result<()> {
    let cfg = config::load(config)?;
    let report = cli::policy_test::run(&cfg, args)?;
    print!("{}", report.text);
    if report.failed > 0 {
        anyhow::bail!("{} of {} policy cases failed", report.failed, report.total);
    }
    Ok(())
}

/// `mcp-firewall token inspect|mint`.
async fn token(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Inspect { config, token } => {
            let cfg = config::load(&config)?;
            println!("{}", cli::inspect(&cfg, &token).await?);
            Ok(())
        }
        TokenCommand::Mint {
            config,
            audience,
            sub,
            tenant,
            agent,
            run,
            mode,
            projects,
            ceiling,
            scope,
            lifetime_s,
        } => {
            let cfg = config::load(&config)?;
            let audience = match audience.as_str() {
                "mcp" => Audience::Mcp,
                "admin" => Audience::Admin,
                other => anyhow::bail!("--audience must be mcp or admin, not {other:?}"),
            };
            let mode = Mode::from_name(&mode).ok_or_else(|| {
                anyhow::anyhow!("--mode must be caller, agent or service_account")
            })?;
            let token = cli::mint(
                &cfg,
                cli::MintArgs {
                    audience,
                    sub,
                    tenant,
                    agent,
                    run,
                    mode,
                    projects,
                    ceiling,
                    scopes: scope,
                    lifetime: std::time::Duration::from_secs(lifetime_s),
                },
            )?;
            println!("{token}");
            Ok(())
        }
    }
}
