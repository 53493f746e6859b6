//! The one interface [`super::Approvals`] holds its store by: every
//! operation the journal file ([`super::store`]) and PostgreSQL
//! ([`super::postgres`]) each implement, so the service never asks which
//! one it has.
//!
//! The service owns the clock and the configuration: it passes `now` (ms
//! since the epoch) and the limits in, and hands the transitions a backend
//! pushes to `out` to metrics, hooks and the webhook once they are durable.
//! A backend applies the shared rules ([`super::rules`]) to the approval it
//! loaded, and wakes its own waiters.

use futures_util::future::BoxFuture;
use tokio::sync::watch;

use super::{
    Approval, ApprovalError, ApprovalId, Approver, CallKey, NewApproval, RoundRefused, Status,
    Transition,
};

/// What a backend operation resolves to.
pub(crate) type Answer<'a, T> = BoxFuture<'a, Result<T, ApprovalError>>;

/// What waiting on an approval starts from: a receiver of its status
/// changes and its deadline (ms since the epoch) while it is pending, or its
/// status when it is not (expired when it is unknown).
pub(crate) type Subscription = Result<(watch::Receiver<Status>, u64), Status>;

/// Where approvals live. Every method is safe to call concurrently; every
/// transition is atomic and durable before its future resolves.
pub(crate) trait ApprovalBackend: Send + Sync {
    /// Whether the backend does its work in the call itself (a lock and an
    /// fsync), so every future it returns is complete when first polled.
    /// Such a backend is swept on a blocking thread, and a synchronous
    /// caller (a drop guard) withdraws through it at once.
    fn blocking(&self) -> bool {
        false
    }

    /// Pending approvals (a shared store: as of its last sweep).
    fn pending(&self) -> usize;

    /// Whether the store cannot be asked now (for `/readyz`).
    fn unavailable(&self) -> bool {
        false
    }

    /// When the oldest approval still pending at `now` was filed (a shared
    /// store: as of its last sweep).
    fn oldest_pending_ms(&self, now: u64) -> Option<u64>;

    /// The live approval of exactly this call, or a new pending one expiring
    /// `expiry_ms` after `now` (never after the tool token), unless the
    /// tenant already has `max_pending` pending.
    fn request<'a>(
        &'a self,
        new: NewApproval,
        now: u64,
        expiry_ms: u64,
        max_pending: usize,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Approval>;

    /// Marks the approved, unexpired approval of `key` consumed and returns
    /// it; `Ok(None)` when there is none (or another consumer won).
    fn consume<'a>(
        &'a self,
        key: &'a CallKey,
        now: u64,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Option<Approval>>;

    /// Spends round `round` of the consumed approval `id` of `tenant`, once.
    fn spend_round<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a ApprovalId,
        round: u32,
        now: u64,
    ) -> BoxFuture<'a, Result<(), RoundRefused>>;

    /// Withdraws the live approval `id` of `tenant`; `Ok(None)` when it was
    /// not live.
    fn withdraw<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a ApprovalId,
        now: u64,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Option<Approval>>;

    /// Approves or denies the pending approval `id` of the approver's
    /// tenant (the request itself was checked by the caller).
    fn decide<'a>(
        &'a self,
        id: &'a str,
        by: &'a Approver,
        approve: bool,
        reason: &'a str,
        now: u64,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Approval>;

    /// What waiting on `id` starts from (see [`Subscription`]).
    fn subscribe<'a>(&'a self, id: &'a ApprovalId, now: u64) -> Answer<'a, Subscription>;

    /// The status of `id` at `now`, any tenant (internal use).
    fn status<'a>(&'a self, id: &'a str, now: u64) -> Answer<'a, Option<Status>>;

    /// One approval of `tenant`, as it reads at `now`.
    fn get<'a>(&'a self, tenant: &'a str, id: &'a str, now: u64) -> Answer<'a, Option<Approval>>;

    /// The tenant's approvals (optionally of one status at `now`), newest
    /// first.
    fn list<'a>(
        &'a self,
        tenant: &'a str,
        status: Option<Status>,
        now: u64,
    ) -> Answer<'a, Vec<Approval>>;

    /// Expires what is due, forgets history older than `history_ms`, keeps
    /// the store compact; the expiries it made.
    fn sweep(&self, now: u64, history_ms: u64) -> Answer<'_, Vec<Transition>>;

    /// The backend itself, for tests that look inside it.
    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any;
}
