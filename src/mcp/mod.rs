//! The MCP wire formats the firewall understands: JSON-RPC 2.0 messages, the
//! Server-Sent Events framing of streamable HTTP, and the HTTP headers that
//! mirror the body in the 2026-07-28 revision.

mod extract;
pub mod headers;
pub mod jsonrpc;
mod message;
pub(crate) mod methods;
pub mod numbers;
mod parse_error;
pub mod rewrite;
pub mod scan;
pub mod sse;
pub(crate) mod tape;
mod validator;
pub(crate) mod version;
