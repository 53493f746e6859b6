//! The calls held for approval right now: who holds which (principal,
//! session, request id), so a `notifications/cancelled` from the same
//! principal ends the hold and withdraws its approval. The hold stage itself
//! is `super::request::hold`; this registry is below it and below the decision.
//!
//! A call's approval is filed (and visible to approvers) a moment before its
//! hold is registered here, and a cancel served on another connection, on
//! another serving thread, can fall in between. Such a cancel matches
//! nothing, so it is remembered briefly ([`EARLY_CANCEL_FOR`]): the hold
//! that registers under its key afterwards is cancelled at once and its
//! approval withdrawn, so a call its client cancelled never runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// How long a cancel that matched no held call is remembered for a hold
/// that registers under its key afterwards (the gap between filing an
/// approval and registering its hold is a few milliseconds).
pub(crate) const EARLY_CANCEL_FOR: Duration = Duration::from_secs(2);

/// Most cancels remembered at once; past that the oldest are forgotten
/// first (they are the likeliest to have lapsed).
const EARLY_CANCELS_MAX: usize = 4096;

/// The calls held for approval right now, by [`HoldKey`].
pub struct Holds {
    held: DashMap<HoldKey, HoldEntry>,
    /// Cancels that matched no held call, and when they came.
    early: DashMap<HoldKey, Instant>,
    approvals: Option<Arc<Approvals>>,
}

impl Holds {
    /// Holds whose cancellation withdraws approvals from `approvals`.
    pub fn new(approvals: Option<Arc<Approvals>>) -> Holds {
        Holds {
            held: DashMap::new(),
            early: DashMap::new(),
            approvals,
        }
    }

    /// Cancels the held call `key`, if there is one waiting: its approval is
    /// withdrawn and its stream ends. Returns the approval's id.
    /// A cancel that matches nothing is remembered for a hold that
    /// registers under `key` within [`EARLY_CANCEL_FOR`] ([`Self::insert`]).
    pub fn cancel(&self, key: &HoldKey) -> Option<String> {
        let Some((tenant, approval)) = self
            .held
            .get(key)
            .map(|e| (e.tenant.clone(), e.approval.clone()))
        else {
            self.remember_early(key);
            return None;
        };
        // Withdrawn before it leaves the registry: a hold gone from here has
        // its withdrawal done (journal) or under way (PostgreSQL);
        // withdrawing twice is harmless. The withdrawal may end the hold's
        // wait, and the hold leave the registry, before the line below: the
        // cancel was matched all the same (it must not be forwarded).
        self.withdraw(&tenant, &approval);
        if let Some((_, entry)) = self.held.remove(key) {
            entry.cancel.notify_one();
        }
        Some(approval.as_str().to_owned())
    }

    /// Registers the held call `key`: `cancel` ends its wait. If its client
    /// cancelled it already (a cancel that came before the hold registered,
    /// within [`EARLY_CANCEL_FOR`]), its approval is withdrawn and `cancel`
    /// notified at once, and false returned.
    pub fn insert(
        &self,
        key: HoldKey,
        cancel: Arc<Notify>,
        approval: ApprovalId,
        tenant: String,
    ) -> bool {
        if let Some((_, at)) = self.early.remove(&key) {
            if at.elapsed() <= EARLY_CANCEL_FOR {
                self.withdraw(&tenant, &approval);
                cancel.notify_one();
                return false;
            }
        }
        self.held.insert(
            key,
            HoldEntry {
                cancel,
                approval,
                tenant,
            },
        );
        true
    }

    /// Remembers a cancel that matched no held call; lapsed ones are
    /// dropped first, and the map never holds more than
    /// [`EARLY_CANCELS_MAX`].
    fn remember_early(&self, key: &HoldKey) {
        if self.early.len() >= EARLY_CANCELS_MAX {
            self.early.retain(|_, at| at.elapsed() <= EARLY_CANCEL_FOR);
            if self.early.len() >= EARLY_CANCELS_MAX {
                self.early.clear();
            }
        }
        self.early.insert(key.clone(), Instant::now());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Principal;

    fn key(id: i64) -> HoldKey {
        let p = Principal {
            issuer: "iss",
            tenant: "acme",
            subject: "user:olga",
            upstream: "incidents",
            run: "r1",
        };
        HoldKey::new(&p, Some(b"s1"), &Id::Number(id))
    }

    #[tokio::test]
    async fn a_cancel_before_the_hold_registers_cancels_the_hold() {
        let holds = Holds::new(None);
        // The cancel comes first (the approval was filed, the hold not yet
        // registered): it matches nothing.
        assert_eq!(holds.cancel(&key(11)), None);
        let cancel = Arc::new(Notify::new());
        let registered = holds.insert(
            key(11),
            Arc::clone(&cancel),
            ApprovalId::parse("a-1").unwrap(),
            "acme".to_owned(),
        );
        assert!(!registered, "a cancelled call is not held");
        assert!(!holds.is_held(&key(11)));
        // The hold's wait ends at once.
        tokio::time::timeout(Duration::from_secs(1), cancel.notified())
            .await
            .expect("notified");
        // Another id is held as usual, and the remembered cancel is spent.
        let other = Arc::new(Notify::new());
        assert!(holds.insert(
            key(12),
            other,
            ApprovalId::parse("a-2").unwrap(),
            "acme".to_owned()
        ));
        assert!(holds.is_held(&key(12)));
        assert!(holds.insert(
            key(11),
            Arc::new(Notify::new()),
            ApprovalId::parse("a-3").unwrap(),
            "acme".to_owned()
        ));
        assert!(holds.is_held(&key(11)));
    }
}
