//! Logging and metrics plumbing: the `tracing` subscriber (text or JSON) and
//! the Prometheus registry every subsystem registers its metrics into.
//!
//! Tokens and injected credentials are never logged: they live in types whose
//! `Debug` redacts them, and the request path logs names and reasons, not
//! header values.

use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. `RUST_LOG` overrides `level`. Calling it
/// twice is harmless (the second call is ignored), which tests rely on.
pub fn init_logging(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The registry behind `/metrics`, shared by everything that exports metrics.
pub type SharedRegistry = Arc<Mutex<Registry>>;

/// A new registry with the `mcp_firewall` prefix.
pub fn registry() -> Registry {
    Registry::with_prefix("mcp_firewall")
}
