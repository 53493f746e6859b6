//! The sample estate as a child process: where its binary is, starting it on
//! a free loopback port, reading the URL it prints, and stopping it.
//!
//! Invariants: the child is killed when its handle drops (and, started with
//! `--exit-with-stdin`, stops by itself when this process dies and its stdin
//! closes); a binary that is missing, exits, or does not say where it listens
//! within [`READY_WITHIN`] is an error that names the binary and what to do.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// The estate's executable name (the `mcp-demo-upstream` workspace member).
pub(crate) const BINARY: &str = "mcp-demo-upstream";

/// How long the estate may take to say where it listens.
pub(crate) const READY_WITHIN: Duration = Duration::from_secs(15);

/// What the estate's first stdout line starts with, before its URL.
const READY_PREFIX: &str = "listening on ";

/// A running estate process; killed on drop.
pub(crate) struct UpstreamProcess {
    url: String,
    child: Child,
}

impl UpstreamProcess {
    /// The estate's MCP endpoint.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Stops the estate and waits for it to exit.
    pub(crate) async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// The estate's binary: `explicit` when given, else the one next to this
/// executable (where `cargo build` and the container image put it), else the
/// first on `PATH`.
pub(crate) fn locate(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        bail!(
            "the sample upstream binary {} does not exist",
            path.display()
        );
    }
    let name = format!("{BINARY}{}", std::env::consts::EXE_SUFFIX);
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(&name)));
    beside
        .filter(|p| p.is_file())
        .or_else(|| super::on_path(&name))
        .with_context(|| {
            format!(
                "the sample upstream ({BINARY}) is neither next to this executable nor on PATH: \
                 build it with `cargo build --release -p {BINARY}`, pass --upstream-bin, \
                 or point --upstream at a running one"
            )
        })
}

/// Starts `bin` on a free loopback port and waits until it says where.
pub(crate) async fn launch(bin: &Path) -> anyhow::Result<UpstreamProcess> {
    let mut child = Command::new(bin)
        .args(["--listen", "127.0.0.1:0", "--exit-with-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting the sample upstream {}", bin.display()))?;
    let stdout = child
        .stdout
        .take()
        .context("the sample upstream's stdout is not a pipe")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(READY_WITHIN, lines.next_line()).await;
    let url = match first {
        Ok(Ok(Some(line))) => match line.strip_prefix(READY_PREFIX) {
            Some(url) => url.trim().to_owned(),
            None => bail!(
                "the sample upstream {} said {line:?} instead of where it listens",
                bin.display()
            ),
        },
        Ok(Ok(None)) => {
            let status = child.wait().await.ok();
            bail!(
                "the sample upstream {} exited before listening ({})",
                bin.display(),
                status.map_or_else(|| "no status".to_owned(), |s| s.to_string())
            )
        }
        Ok(Err(e)) => bail!("reading the sample upstream's stdout: {e}"),
        Err(_) => bail!(
            "the sample upstream {} did not say where it listens within {} s",
            bin.display(),
            READY_WITHIN.as_secs()
        ),
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(UpstreamProcess { url, child })
}
