//! The `mcp-firewall` command: parse the command line, load the config, run.
//! Nothing else lives here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use mcp_firewall::{app, config, telemetry};

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
    },
    /// Approvals on a running firewall: list, show, approve, deny.
    Approvals(mcp_firewall::approval::client::ApprovalsArgs),
    /// Validate a config file (and everything it names) without serving.
    Check {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
        Command::Serve { config } => {
            let cfg = config::load(&config)?;
            telemetry::init_logging(cfg.log_format, &cfg.log_level);
            let running = app::start(Arc::new(cfg)).await?;
            running.until_signal().await;
            Ok(())
        }
        Command::Demo { listen, admin } => mcp_firewall::demo::run::run(listen, admin).await,
        Command::Approvals(args) => {
            print!("{}", mcp_firewall::approval::client::run(&args).await?);
            Ok(())
        }
        Command::Check { config } => {
            let cfg = config::load(&config)?;
            println!("{}: ok", cfg.source.display());
            println!(
                "  listen {} ({})",
                cfg.server.listen,
                if cfg.server.tls.is_some() {
                    "TLS"
                } else {
                    "plaintext"
                }
            );
            println!("  admin  {}", cfg.admin_listen);
            for u in &cfg.upstreams {
                println!("  upstream {:<20} {}", u.name, u.url);
            }
            Ok(())
        }
    }
}
