//! mcp-firewall: a reverse proxy that decides what AI agents may do with MCP servers.
//!
//! The request path lives in `src/proxy/path.rs`: one function, `handle`, runs the
//! ordered stages (route, authenticate, authorize, parse, decide, admit, record,
//! hold, forward, relay) so a reader finds every decision in one place.
//! Everything else is either a stage used there or a background task started
//! by [`app`]. ARCHITECTURE.md draws the modules and the order they depend in.
//!
//! # What is public, and for whom
//! Everything is `pub(crate)` unless something outside the crate uses it
//! (`#![warn(unreachable_pub)]` below, with clippy's `-D warnings`, keeps it so):
//! - **the binary** (`src/main.rs`): [`app`] (`serve`), [`cli`] (the other
//!   commands), [`config`], [`demo`], [`auth`] (`token mint`), [`approval`]
//!   (`approvals`), [`sandbox`] (`sandbox-exec`, how a stdio server starts);
//! - **the bench harness** (`bench/`) and the criterion benches (`benches/`):
//!   [`app`], [`config`], [`audit`], [`auth`], [`policy`], [`mcp`] and what
//!   [`internals`] names;
//! - **the integration tests** (`tests/integration/`): the same modules, to
//!   start a firewall and read its audit, and [`internals`];
//! - **the fuzz targets** (`fuzz/`): [`mcp`]'s readers, [`policy`]'s URI
//!   normalizer and CEL, [`auth`]'s verifier, [`audit`]'s rows, chain and
//!   spool, and [`internals`].
#![forbid(unsafe_code)]
#![warn(clippy::too_many_lines)]
#![warn(unreachable_pub)]
// The docs are for the crate's own readers (`cargo doc --document-private-items`):
// a public item may name the private one that bounds it.
#![allow(rustdoc::private_intra_doc_links)]

mod admin;
pub mod app;
pub mod approval;
pub mod audit;
pub mod auth;
mod backoff;
mod budget;
mod canonical;
mod catalog;
pub mod cli;
mod clock;
pub mod config;
mod credential;
pub mod demo;
mod digest;
mod http_util;
pub mod mcp;
mod outcome;
mod pins;
pub mod policy;
mod proxy;
pub mod sandbox;
mod screen;
mod server;
mod session;
mod state;
mod stdio;
mod tasks;
mod telemetry;
mod trace;
mod upstream;
mod verdict;
mod virtual_names;

/// The crate's own parts that the integration tests, the benches and the
/// fuzz targets reach into, white-box. Everything else under a private
/// module above is `pub(crate)` (`unreachable_pub` holds it so).
pub mod internals {
    pub use crate::budget::{CallBudget, LimitsConfig, Local};
    pub use crate::catalog::Catalogs;
    pub use crate::clock::{fmt_ms, now_ms};
    pub use crate::credential::exchange::read_token_answer;
    pub use crate::http_util::full;
    pub use crate::proxy::outbound::gate::{Treated, FIELDS as GATED_FIELDS};
    pub use crate::screen::content::{screen_json, Action, Actions};
    pub use crate::screen::normalize::fold;
    pub use crate::screen::Scanner;
    pub use crate::server::tls::load_certified_key;
    pub use crate::session::{Due, EventContext, Principal, SessionKey, Sessions};
    pub use crate::state::{Backend as StateBackend, Fallback};
    pub use crate::stdio::egress::parse_pair;
    pub use crate::stdio::Instances;
    pub use crate::telemetry::init_logging;
    pub use crate::virtual_names::Collisions;
}
