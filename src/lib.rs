//! mcp-firewall: a reverse proxy that decides what AI agents may do with MCP servers.
//!
//! The request path lives in [`proxy`]: one function, [`proxy::handle`], runs the
//! ordered steps (route, authenticate, parse, decide, forward, rewrite, audit) so a
//! reader finds every decision in one place. Everything else is either a step used
//! there or a background task started by [`app`].
#![forbid(unsafe_code)]
#![warn(clippy::too_many_lines)]

pub mod admin;
pub mod app;
pub mod approval;
pub mod audit;
pub mod auth;
pub mod backoff;
pub mod budget;
pub mod canonical;
pub mod catalog;
pub mod cli;
pub mod clock;
pub mod config;
pub mod demo;
pub mod http_util;
pub mod mcp;
pub mod outcome;
pub mod pins;
pub mod policy;
pub mod proxy;
pub mod sandbox;
pub mod screen;
pub mod server;
pub mod session;
pub mod state;
pub mod stdio;
pub mod tasks;
pub mod telemetry;
pub mod trace;
pub mod upstream;
pub mod verdict;
pub mod virtual_server;
