//! The rules every approvals backend applies alike: until when a new
//! approval lives and whether its token allows one at all, how many may wait
//! per tenant, who may decide what with which reason, which round of an
//! approved call runs next, what waiting starts from, and how a stored
//! approval reads at a given moment.
//!
//! Each rule is a pure function of the approval as loaded and `now`. The
//! file store applies them under its lock. PostgreSQL states the same
//! conditions in its conditional `UPDATE … WHERE` (so of racing replicas one
//! wins) and applies these functions to what it reads back, so a refusal is
//! the same error on either store.

use super::{Approval, ApprovalError, Approver, NewApproval, RoundRefused, Status};

/// Longest reason an approver may give, in bytes.
pub const MAX_REASON_BYTES: usize = 2000;

/// The deadline of an approval filed for `new` at `now`: `expiry_ms` later,
/// never past the tool token's expiry. Refuses a token already expired:
/// nothing may be approved for it.
pub(super) fn deadline(new: &NewApproval, now: u64, expiry_ms: u64) -> Result<u64, ApprovalError> {
    let token_exp_ms = new.token_exp.saturating_mul(1000);
    if token_exp_ms <= now {
        return Err(ApprovalError::TokenExpired {
            token_exp: new.token_exp,
            now_s: now / 1000,
        });
    }
    Ok(now.saturating_add(expiry_ms).min(token_exp_ms))
}

/// Refuses another pending approval for `tenant`, which has `pending` now,
/// when that reaches `max`.
pub(super) fn check_room(tenant: &str, pending: usize, max: usize) -> Result<(), ApprovalError> {
    if pending >= max {
        return Err(ApprovalError::TooManyPending {
            tenant: tenant.to_owned(),
            pending,
            max,
        });
    }
    Ok(())
}

/// Refuses a decision before any approval is read: an approver of another
/// tenant than the one asked for (the id does not exist for them), or a
/// reason [`check_reason`] refuses.
pub(super) fn check_decision(
    tenant: &str,
    id: &str,
    by: &Approver,
    approve: bool,
    reason: &str,
) -> Result<(), ApprovalError> {
    if by.tenant != tenant {
        return Err(ApprovalError::NotFound { id: id.to_owned() });
    }
    check_reason(approve, reason)
}

/// A denial needs a reason; any reason is at most [`MAX_REASON_BYTES`] and
/// has no control characters but newline and tab.
fn check_reason(approve: bool, reason: &str) -> Result<(), ApprovalError> {
    if !approve && reason.trim().is_empty() {
        return Err(ApprovalError::ReasonRequired);
    }
    if reason.len() > MAX_REASON_BYTES {
        return Err(ApprovalError::ReasonTooLong {
            len: reason.len(),
            max: MAX_REASON_BYTES,
        });
    }
    if reason
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(ApprovalError::ReasonControlCharacter);
    }
    Ok(())
}

/// Whether `by` may decide `a` at `now`: it must still be pending (one past
/// its deadline is expired), and not be the approver's own call unless it
/// allows self-approval.
pub(super) fn check_decidable(a: &Approval, by: &Approver, now: u64) -> Result<(), ApprovalError> {
    match a.status_at(now) {
        Status::Pending => {}
        Status::Expired => {
            return Err(ApprovalError::Expired {
                id: a.id.clone(),
                expires_ms: a.expires_ms,
            })
        }
        status => {
            return Err(ApprovalError::NotPending {
                id: a.id.clone(),
                status,
            })
        }
    }
    if by.subject == a.key.subject && !a.self_approval {
        return Err(ApprovalError::SelfApproval {
            subject: by.subject.clone(),
        });
    }
    Ok(())
}

/// Why a store refused `by`'s decision on `a` (as read after the refusal):
/// the error [`check_decidable`] gives, or, for an approval it would still
/// allow, that it is not pending any more.
pub(super) fn refusal(a: Approval, by: &Approver, now: u64) -> ApprovalError {
    match check_decidable(&a, by, now) {
        Err(e) => e,
        Ok(()) => ApprovalError::NotPending {
            id: a.id,
            status: Status::Pending,
        },
    }
}

/// How many rounds an approval must have spent for `round` to run next.
/// Round 0 never runs (the first run is the consumption itself).
pub(super) fn rounds_before(round: u32) -> Result<u32, RoundRefused> {
    round.checked_sub(1).ok_or(RoundRefused::Spent)
}

/// Whether round `round` of `a` may run for `tenant`: unknown unless `a` is
/// that tenant's and consumed, spent unless `round` is the next one.
pub(super) fn check_round(a: &Approval, tenant: &str, round: u32) -> Result<(), RoundRefused> {
    if a.key.tenant != tenant || a.status != Status::Consumed {
        return Err(RoundRefused::Unknown);
    }
    if a.rounds != rounds_before(round)? {
        return Err(RoundRefused::Spent);
    }
    Ok(())
}

/// What waiting on `a` starts from at `now`: its deadline while it is
/// pending, else its status. An unknown approval reads as expired (purged
/// approvals are long past their deadline).
pub(super) fn wait_from(a: Option<&Approval>, now: u64) -> Result<u64, Status> {
    let a = a.ok_or(Status::Expired)?;
    match a.status_at(now) {
        Status::Pending => Ok(a.expires_ms),
        other => Err(other),
    }
}

/// `a` as `tenant` reads it at `now`; another tenant's approval does not
/// exist for them.
pub(super) fn visible(a: &Approval, tenant: &str, now: u64) -> Option<Approval> {
    (a.key.tenant == tenant).then(|| as_of(a, now))
}

/// `a` with its status as of `now` (a live approval past its deadline
/// reads as expired, swept or not).
pub(super) fn as_of(a: &Approval, now: u64) -> Approval {
    let mut out = a.clone();
    out.status = a.status_at(now);
    out
}
