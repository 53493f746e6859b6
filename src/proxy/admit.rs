//! The admission step: the I/O a `tools/call` needs once the policy let it
//! through, before it may run. In order:
//!
//! 1. its `approve` gate, when it has one: an approval granted for exactly
//!    this call is consumed (once, across replicas), otherwise one is filed
//!    and the call is held or answered "approval required";
//! 2. its budget: rate limits, step and cost caps, reserved in the budget
//!    store (this process, or Redis for every replica). A shared store that
//!    cannot be asked admits or refuses the call by its risk
//!    (`[state] on_store_unavailable`).
//!
//! A multi-round retry carrying a sealed `requestState` spends that state's
//! round in the approvals store first: an approval releases each round
//! once, so a replayed state is refused before it can run again.
//!
//! Only a call that would run spends budget, so the gate comes first.

use std::sync::Arc;

use super::decide::Granted;
use super::decide::{Admission, Forwarding, Outcome, RunContext, Verdict};

impl Admission {
    /// What the call becomes: forwarded with its reservation, held for a
    /// person, or answered here.
    pub async fn admit(self, run: &RunContext) -> Verdict {
        let Admission {
            tool,
            risk,
            gate,
            mut granted,
            rewrite,
        } = self;
        // The approvals store is asked only for gated calls and retries:
        // those awaits are boxed so that every call's future does not carry
        // their few KB.
        // A multi-round retry under an approval: its round runs once.
        if let Some(g) = granted.as_deref().filter(|g| g.round > 0) {
            if let Err(why) = Box::pin(run.spend_round(g)).await {
                tracing::info!(tool, approval = %g.approval, round = g.round, reason = %why, "retry refused");
                return Verdict::Answer(Outcome::BadRequestState(why));
            }
        }
        if let Some((arguments, hash)) = gate {
            match Box::pin(run.gate(&tool, &arguments, hash, risk)).await {
                Ok(Ok(g)) => {
                    tracing::info!(tool, approval = %g.approval, "running an approved call");
                    granted = Some(Arc::new(g));
                }
                Ok(Err(gated)) => return Verdict::Hold(Box::new(gated)),
                Err(why) => return Verdict::Answer(Outcome::ApprovalUnavailable { risk, why }),
            }
        }
        admit_budget(run, &tool, risk, granted, rewrite).await
    }
}

/// Reserves the budget of a call that is allowed to run.
pub async fn admit_budget(
    run: &RunContext,
    tool: &str,
    risk: crate::policy::Risk,
    granted: Option<Arc<Granted>>,
    rewrite: Option<String>,
) -> Verdict {
    match run.budgets.admit(&run.call_budget(tool), risk).await {
        Ok(reservation) => {
            if reservation.fallback {
                run.metrics.store_fallback("budgets", risk, "open");
            }
            Verdict::Forward(Forwarding {
                risk: Some(risk),
                reservation: Some(reservation),
                granted,
                rewrite,
                task: None,
            })
        }
        Err(refusal) => {
            if matches!(refusal, crate::budget::Refusal::Unavailable { .. }) {
                run.metrics.store_fallback("budgets", risk, "closed");
            }
            Verdict::Answer(Outcome::Skipped { risk, refusal })
        }
    }
}
