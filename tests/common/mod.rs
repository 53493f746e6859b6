//! Test harness shared by the integration test binaries.

pub mod clickhouse;
