//! `mcp-firewall demo`: the firewall on its shipped demo config and policies,
//! in front of the sample SRE estate, with ready-to-use tokens and the audit
//! trail printed as it lands.
//!
//! The estate is not in this crate: it is the workspace member
//! `mcp-demo-upstream` (an rmcp server), started by [`upstream`] as a child
//! process or reached at a URL the operator gives. The firewall library thus
//! depends on no MCP server framework; it treats the estate as it treats any
//! vendor's MCP server.
//!
//! - [`run`] owns the demo: config, tokens, start, the printed guide.
//! - [`upstream`] owns finding, starting and stopping the estate's process.
//! - [`clickhouse`] owns the throwaway ClickHouse the audit trail goes to.

pub(crate) mod clickhouse;
pub mod run;
pub(crate) mod upstream;

use std::path::PathBuf;

/// The first file called `name` in a directory of `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
