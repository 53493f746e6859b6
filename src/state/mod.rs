//! What several replicas of the firewall share, and how each behaves when
//! the store holding it is slow or down.
//!
//! One process needs nothing external: `[state] backend = "memory"` (the
//! default) keeps budgets and rate limits in the process. With `backend =
//! "redis"`, budgets, rate limits and the tenant's daily cost live in one
//! Redis ([`crate::budget::shared`]), so every replica admits against the
//! same counts; approvals have their own store (`[approvals] store`).
//!
//! A shared store is asked through [`Redis::run`]: a bounded timeout per
//! command (tens of milliseconds) and a [`breaker::Breaker`]. When the store
//! does not answer, what happens depends on the call's risk, as configured
//! in `on_store_unavailable`: `open` admits it against this replica's own
//! memory budgets (bounded per replica, not fleet-wide), `closed` refuses
//! it with `-31006`. Both are counted in metrics and the open breaker is
//! named by `/readyz`.
//!
//! Everything else stays per replica and says so: the token cache, key
//! sets, the tool catalog and its views (cleared across replicas through
//! Redis pub/sub when an upstream announces `list_changed`), the policy
//! (its hash is a metric, so replicas that disagree show it), the per-IP
//! limiter.

pub(crate) mod breaker;
mod store;
pub use self::store::*;
