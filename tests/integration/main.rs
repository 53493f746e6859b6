//! The integration suite: one test binary, real peers (MCP servers and
//! clients from the official Rust SDK, scripted raw HTTP upstreams for failure
//! modes, a real ClickHouse server), no mocks of MCP.

mod auth_keys;
mod common;
mod demo_upstream;
mod input;
mod through_firewall;
mod upstream_failures;
