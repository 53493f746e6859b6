//! The integration suite: one test binary, real peers (MCP servers and
//! clients from the official Rust SDK, scripted raw HTTP upstreams for failure
//! modes, a real ClickHouse server), no mocks of MCP.

mod answer_path;
mod approvals_api;
mod approvals_e2e;
mod architecture;
mod audit;
mod audit_chain;
mod audit_e2e;
mod auth_keys;
mod batch;
mod budgets;
mod bypass;
mod cli;
mod common;
mod content_gate;
mod credential_gate;
mod credentials;
mod dashboard;
mod demo_command;
mod demo_upstream;
mod deploy;
mod docs;
mod holds;
mod input;
mod lifecycle;
mod modern_clickhouse;
mod pins;
mod policy_assurance;
mod reload;
mod replicas;
mod sandbox;
mod screening;
mod spool_faults;
mod stdio;
mod through_firewall;
mod tls;
mod tokens;
mod traces;
mod upstream_failures;
mod upstream_h2;
mod user_credentials;
mod virtual_servers;
