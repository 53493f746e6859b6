//! The calls held for approval right now: who holds which (principal,
//! session, request id), so a `notifications/cancelled` from the same
//! principal ends the hold and withdraws its approval. The hold stage itself
//! is `super::hold`; this registry is below it and below the decision.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::Notify;

use crate::approval::{ApprovalId, Approvals};
use crate::mcp::jsonrpc::Id;
use crate::session::Principal;

/// Which held call a `notifications/cancelled` names: the caller's
/// principal, its session, and the request id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HoldKey {
    principal: String,
    session: Option<Vec<u8>>,
    id: Id,
}

impl HoldKey {
    /// The key of request `id` of the run of principal `p` on `session`.
    pub fn new(p: &Principal<'_>, session: Option<&[u8]>, id: &Id) -> HoldKey {
        HoldKey {
            principal: format!("{}\0{}\0{}\0{}", p.issuer, p.tenant, p.subject, p.upstream),
            session: session.map(<[u8]>::to_vec),
            id: id.clone(),
        }
    }
}

struct HoldEntry {
    cancel: Arc<Notify>,
    approval: ApprovalId,
    tenant: String,
}

/// The calls held for approval right now, by [`HoldKey`].
pub struct Holds {
    held: DashMap<HoldKey, HoldEntry>,
    approvals: Option<Arc<Approvals>>,
}

impl Holds {
    /// Holds whose cancellation withdraws approvals from `approvals`.
    pub fn new(approvals: Option<Arc<Approvals>>) -> Holds {
        Holds {
            held: DashMap::new(),
            approvals,
        }
    }

    /// Cancels the held call `key`, if there is one waiting: its approval is
    /// withdrawn and its stream ends. Returns the approval's id.
    pub fn cancel(&self, key: &HoldKey) -> Option<String> {
        let (tenant, approval) = self
            .held
            .get(key)
            .map(|e| (e.tenant.clone(), e.approval.clone()))?;
        // Withdrawn before it leaves the registry: a hold gone from here has
        // its withdrawal done (journal) or under way (PostgreSQL);
        // withdrawing twice is harmless.
        self.withdraw(&tenant, &approval);
        let (_, entry) = self.held.remove(key)?;
        entry.cancel.notify_one();
        Some(approval.as_str().to_owned())
    }

    /// Registers the held call `key`: `cancel` ends its wait.
    pub fn insert(&self, key: HoldKey, cancel: Arc<Notify>, approval: ApprovalId, tenant: String) {
        self.held.insert(
            key,
            HoldEntry {
                cancel,
                approval,
                tenant,
            },
        );
    }

    /// Forgets the held call `key`; whether it was still registered.
    pub fn release(&self, key: &HoldKey) -> bool {
        self.held.remove(key).is_some()
    }

    /// Whether the call `key` is still held (not cancelled, not released).
    pub fn is_held(&self, key: &HoldKey) -> bool {
        self.held.contains_key(key)
    }

    /// Withdraws `approval` of `tenant` (its call will not run).
    pub fn withdraw(&self, tenant: &str, approval: &ApprovalId) {
        if let Some(a) = &self.approvals {
            a.withdraw_now_or_soon(tenant, approval);
        }
    }

    /// Calls held now.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no call is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}
