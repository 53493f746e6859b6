//! mcp-bench: what putting mcp-firewall in front of an MCP server costs,
//! measured as ratios within one run.
//!
//! The harness starts a canned upstream ([`upstream`]), the real firewall
//! binary ([`firewall`]), nginx as the reference proxy ([`nginx`]), a
//! throwaway ClickHouse for audit ([`clickhouse`]) and a throwaway Redis
//! for shared budgets ([`redis`]); drives them with its own
//! load generator ([`load`]) in interleaved short rounds ([`runner`]), with
//! idle client connections held open where a cell asks ([`idle`]); and
//! writes a terminal table, JSON, Markdown and an SVG plot ([`report`],
//! [`plot`]).
//!
//! `mcp-bench load` ([`operator`]) points the same kind of load at any MCP
//! deployment an operator names.
//!
//! `mcp-bench virtual` ([`vserver`]) measures `tools/list` through the
//! firewall's virtual servers (one member against three) and checks that a
//! merged list keeps its deadline when a member is slow.
//!
//! Invariant: every process the harness starts is stopped by PID when the
//! run ends, and killed by a watchdog if the harness itself dies.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod catalog;
pub mod clickhouse;
pub mod firewall;
pub mod idle;
pub mod instructions;
pub mod load;
pub mod nginx;
pub mod operator;
pub mod outcome;
pub mod passthrough;
pub mod pipeline;
pub mod plot;
pub mod probe;
pub mod procs;
pub mod redis;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod stdio;
pub mod tls;
pub mod token_endpoint;
pub mod tokens;
pub mod upstream;
pub mod vserver;
