//! The upstream client: everything the firewall needs to reach an upstream
//! MCP server, below both the request path ([`crate::proxy`]) and the
//! command line ([`crate::cli`]: `pins`, `explain`), which share it.
//!
//! | module | owns |
//! |---|---|
//! | [`client`] | the pooled hyper client of one upstream (HTTP/1.1 or HTTP/2, TLS) and the header hygiene of every forwarded request |
//! | [`h2pool`] | HTTP/2 over a small, growing set of connections |
//! | [`body`] | an upstream's body: its stream slot, read frame by frame under an idle timeout; the client's body read under its limit |
//! | [`failure`] | why a forwarded request failed, as one type |
//! | [`own_client`] | the firewall as an MCP client of its upstreams on its own behalf (listings, approvers' previews) |
//! | [`opening`] | the order of a session's GET stream and its POSTs on their way upstream |
//! | [`refill`] | refilling a tool catalog from the upstream's own `tools/list` |
//! | [`members`] | what each member of a virtual server offers in full (listed by the firewall's own client, not as any principal is shown it) and the names resolved over those lists |
//!
//! Nothing here decides: what may be sent is decided before it reaches
//! this module, and what comes back is decided by [`crate::verdict`].

pub(crate) mod body;
pub(crate) mod client;
pub(crate) mod failure;
pub(crate) mod h2pool;
pub(crate) mod members;
pub(crate) mod opening;
pub(crate) mod own_client;
pub(crate) mod refill;
