//! The MCP wire formats the firewall understands: JSON-RPC 2.0 messages, the
//! Server-Sent Events framing of streamable HTTP, and the HTTP headers that
//! mirror the body in the 2026-07-28 revision.

pub mod headers;
pub mod jsonrpc;
pub mod methods;
pub mod numbers;
pub mod rewrite;
pub mod scan;
pub mod sse;
pub mod tape;
pub mod version;
