//! `mcp-demo-upstream`: serves the sample SRE estate on one address until
//! Ctrl-C or SIGTERM. Its first line on stdout is `listening on <url>` (the
//! MCP endpoint), which is what `mcp-firewall demo` waits for when it starts
//! this binary as its child; with `--exit-with-stdin` it also stops when its
//! standard input closes, so it never outlives a parent that was killed.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use tokio::io::AsyncReadExt as _;

/// The sample MCP server behind `mcp-firewall demo`.
#[derive(Parser)]
#[command(name = "mcp-demo-upstream", version)]
struct Args {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// Stop when standard input reaches its end (the parent went away).
    #[arg(long)]
    exit_with_stdin: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mcp-demo-upstream: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp-demo-upstream: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let upstream =
        mcp_demo_upstream::spawn(listener, mcp_demo_upstream::UpstreamOptions::default()).await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {}", upstream.url())?;
    out.flush()?;
    drop(out);
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminated() => {}
        _ = stdin_closed(), if args.exit_with_stdin => {}
    }
    upstream.shutdown().await;
    Ok(())
}

/// SIGTERM (what `docker stop` and Kubernetes send); never on other platforms.
async fn terminated() {
    #[cfg(unix)]
    if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    {
        term.recv().await;
        return;
    }
    std::future::pending::<()>().await;
}

/// Standard input reached its end (or failed): the parent is gone.
async fn stdin_closed() {
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    while let Ok(n) = stdin.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}
