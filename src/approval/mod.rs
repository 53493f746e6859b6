//! Human approval gates: a `tools/call` behind an `approve` gate waits until a
//! person approves **that exact call**.
//!
//! The request path calls [`Approvals::request`] (a pending approval bound to
//! the run, the tool and the SHA-256 of the canonical arguments),
//! [`Approvals::wait`] while it holds the call, and [`Approvals::consume`]
//! before the call finally runs. The approver's side is [`api`] (admin HTTP
//! API and the [`console`] page), [`client`] (the CLI) and [`webhook`]
//! (notifications).
//!
//! Where things are:
//! - `service`: [`Approvals`], the service everyone shares: the clock, the
//!   metrics, hooks, webhook, previews and the sweeper;
//! - `backend`: the one trait both stores implement, so the service never
//!   asks which store it has; `rules`: the checks both stores apply alike
//!   (deadlines, limits, who may decide what, rounds);
//! - [`store`]: the journal file (one replica); `postgres`: PostgreSQL
//!   (every replica, [`migrate`] and [`probe`] for its schema);
//! - `model`, `config`, `error`: what an approval is, the `[approvals]`
//!   section, what can go wrong.
//!
//! Invariants:
//! - an approval id carries 128 bits from the OS RNG and is only ever
//!   resolved within its tenant: another tenant's id is indistinguishable
//!   from one that does not exist;
//! - status moves `pending → approved | denied | expired | withdrawn`,
//!   `approved → consumed | expired | withdrawn`, nothing else; every move
//!   is atomic (one lock, or one conditional `UPDATE`) and durable
//!   (journaled and fsynced by [`store`], or committed) before anyone
//!   observes it;
//! - an approval never outlives the tool token of the call it approves, and
//!   is consumed at most once, so one human "yes" runs one call;
//! - expiry is decided by the clock on every read, whether or not the
//!   background sweeper has recorded it yet.
#![deny(missing_docs)]

pub mod api;
mod backend;
pub mod client;
mod clock;
mod config;
pub mod console;
mod error;
mod metrics;
mod model;
pub(crate) mod postgres;
mod rules;
mod service;
pub(crate) mod store;
pub(crate) mod webhook;

pub use config::*;
pub use error::*;
pub use model::*;
pub use postgres::{migrate, probe};
pub use rules::MAX_REASON_BYTES;
pub use service::Approvals;
