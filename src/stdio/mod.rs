//! Stdio upstreams (`transport = "stdio"`): MCP servers the firewall starts
//! itself, each confined by [`crate::sandbox`], spoken to over their stdin
//! and stdout, and served to the request path as if they were streamable
//! HTTP servers.
//!
//! The request path does not know the difference: an upstream client's
//! transport for a stdio upstream ([`connector::Local`]) opens in-memory
//! connections to this upstream's [`Bridge`], which speaks streamable HTTP
//! on one side and newline-delimited JSON-RPC on the other. Everything the
//! firewall decides (authority, gates, approvals, budgets, pins, screening,
//! audit) happens before a message reaches the bridge and after its answer
//! leaves it, exactly as for an HTTP upstream; no port is opened for it.
//!
//! Which process a message reaches ([`Instances`]): with `per_session`
//! (the default), every client session (`initialize`) gets a process of
//! its own, and a 2026-07-28 request (no session) the process of its
//! principal and run; with `shared`, one process serves everyone. The
//! bridge renumbers the requests it writes to a process, so two sessions'
//! ids never meet, and routes what the process writes back by those
//! numbers (answers), progress tokens (progress) or the open streams
//! (everything else). Lifecycle (spawned on first use, reaped when idle, a
//! crash answering the calls in flight and restarting with backoff, the
//! close sequence) is in [`instance`] and [`process`]; the egress proxy of
//! an allow-list in [`egress`].

pub(crate) mod connector;
pub(crate) mod egress;
pub(crate) mod instance;
pub(crate) mod process;
pub(crate) mod uids;
pub(crate) use crate::sandbox::which;
mod bridge;
mod host;
pub(crate) use self::bridge::*;
pub use self::host::*;
