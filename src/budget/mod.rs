//! Budgets: rate limits and per-run caps, enforced in the graph of calls the
//! firewall sees, not in a prompt.
//!
//! For every `tools/call` the policy lets through, [`Budgets::admit`] checks,
//! in order, and stops at the first refusal:
//!
//! 1. rate limits (governor, keyed): per tenant, per upstream (protecting a
//!    vendor), per run, per run and tool;
//! 2. the run's step cap (at most N `tools/call` per run);
//! 3. the run's cost cap and the tenant's daily cost cap, for the call's
//!    price from the policy's price table.
//!
//! Steps and cost are **reserved** before the call is forwarded, under the
//! run's map entry lock, so 100 concurrent calls of one run with a cap of 8
//! execute exactly 8. [`Budgets::settle`] closes the reservation when the
//! answer is known: a call that never reached the upstream (connect refused)
//! is refunded; any other outcome keeps its step and cost (the upstream may
//! have acted), and an upstream-reported cost replaces the reserved price.
//!
//! A run's budget lasts for the **run**, not for its token: tool tokens are
//! short-lived and a long investigation gets fresh ones for the same
//! `run_id`, so the run's steps and cost are kept for `run_state_ttl_s`
//! (default 24 h) after its last call, whatever its tokens' expiry. A run
//! that reached a cap stays capped for that lifetime. A token may end its run
//! earlier (claim `run_exp`): the earliest end any of the run's tokens named
//! holds, and nothing a client sends extends it; past it every call of the
//! run is skipped (`run_ended`).
//!
//! Memory stays bounded: runs idle past the lifetime are dropped by
//! [`Budgets::sweep`] (a background task), tenant-day totals after two days,
//! idle limiter keys likewise; and at most `max_tracked_runs` runs are
//! tracked: past it the runs idle the longest are evicted first (counted in
//! [`Budgets::evicted`]). An evicted run that calls again starts from zero,
//! so the cap should exceed the runs active within one lifetime.
//!
//! Time is injectable (governor's clock for limits, a wall-clock function for
//! days and expiry), so tests are deterministic.
//!
//! That is [`Local`]: one process. [`Budgets`] is what the request path
//! asks: [`Local`] alone (`[state] backend = "memory"`), or Redis shared by
//! every replica ([`shared`]: the same checks in one Lua step) with
//! [`Local`] as the fallback for the risks `on_store_unavailable` keeps
//! open while Redis cannot be asked.

pub(crate) mod labels;
mod limits;
pub(crate) mod shared;
pub use self::limits::*;
