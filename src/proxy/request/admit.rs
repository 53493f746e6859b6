//! The admission step: the I/O a `tools/call` needs once the policy let it
//! through, before it may run. In order:
//!
//! 0. the run's labels (`[taint]`), for a call they can gate: read from the
//!    budget store (memory, or Redis when shared; a store that cannot be
//!    asked refuses the call or decides on this replica's labels, per
//!    `on_store_unavailable`); `trifecta` / `after_untrusted`
//!    may refuse the call or put an `approve` gate on it whose approval
//!    says why;
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

use super::super::decision::Granted;
use super::super::decision::{
    Admission, Forwarding, Outcome, Recheck, RunContext, TaintCheck, Verdict,
};
use crate::policy::{Gate, Labels, Risk, TaintRule};

impl Admission {
    /// What the call becomes: forwarded with its reservation, held for a
    /// person, or answered here.
    pub(crate) async fn admit(self, run: &RunContext) -> Verdict {
        let Admission {
            tool,
            risk,
            mut gate,
            mut granted,
            rewrite,
            taint,
            pin,
        } = self;
        let mut why = None;
        let mut recheck = taint.as_ref().map(|c| Recheck {
            egress: c.egress,
            held_for: None,
        });
        if let Some(check) = taint {
            match Box::pin(taint_gate(run, &tool, risk, &check)).await {
                Err(refusal) => return Verdict::Answer(Outcome::Skipped { risk, refusal }),
                Ok(None) => {}
                Ok(Some((Gate::Deny, rule, reason))) => {
                    tracing::info!(tool, rule = rule.as_str(), reason = %reason, "refused by the run's labels");
                    return Verdict::Answer(Outcome::Denied {
                        risk,
                        reason,
                        rule: rule.as_str().to_owned(),
                    });
                }
                Ok(Some((_, rule, reason))) => {
                    if gate.is_none() {
                        gate = check.arguments;
                    }
                    if let Some(r) = recheck.as_mut() {
                        r.held_for = Some(rule);
                    }
                    why = Some(format!("{reason} ({})", rule.as_str()));
                }
            }
        }
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
            match Box::pin(run.gate(&tool, &arguments, hash, risk, why)).await {
                Ok(Ok(g)) => {
                    tracing::info!(tool, approval = %g.approval, "running an approved call");
                    granted = Some(Arc::new(g));
                }
                Ok(Err(mut gated)) => {
                    gated.pin = pin;
                    gated.recheck = recheck;
                    return Verdict::Hold(Box::new(gated));
                }
                Err(why) => return Verdict::Answer(Outcome::ApprovalUnavailable { risk, why }),
            }
        }
        let mut verdict = admit_budget(run, &tool, risk, granted, rewrite).await;
        if let Verdict::Forward(f) = &mut verdict {
            f.pin = pin;
        }
        verdict
    }
}

/// A held call, approved, about to run: the run's labels are judged again
/// (it may have taken in private or untrusted content while the call
/// waited). A `[taint]` rule that would now refuse it, or would have put
/// an approval on it for a reason the person who approved was not shown,
/// refuses it.
///
/// # Errors
/// The outcome the client gets instead of the call.
pub(crate) async fn recheck(
    run: &RunContext,
    tool: &str,
    risk: Risk,
    r: Recheck,
) -> Result<(), Outcome> {
    let check = TaintCheck {
        egress: r.egress,
        arguments: None,
    };
    match Box::pin(taint_gate(run, tool, risk, &check)).await {
        Err(refusal) => Err(Outcome::Skipped { risk, refusal }),
        Ok(None) => Ok(()),
        Ok(Some((gate, rule, _))) if gate != Gate::Deny && r.held_for == Some(rule) => Ok(()),
        Ok(Some((_, rule, reason))) => {
            tracing::info!(tool, rule = rule.as_str(), reason = %reason, "a held call refused at release by the run's labels");
            Err(Outcome::Denied {
                risk,
                reason: format!(
                    "{reason}; the run took this in while the call was held for approval"
                ),
                rule: rule.as_str().to_owned(),
            })
        }
    }
}

/// The gate the run's labels put on a call of `tool` (`None`: none), with
/// its rule and the sentence that says why.
async fn taint_gate(
    run: &RunContext,
    tool: &str,
    risk: Risk,
    check: &TaintCheck,
) -> Result<Option<(Gate, TaintRule, String)>, crate::budget::Refusal> {
    let held = match run
        .budgets
        .labels()
        .held(&run.claims.tenant_id, &run.claims.run_id)
        .await
    {
        Ok(h) => h,
        // The operator keeps calls of this risk going while the store is
        // away (`on_store_unavailable`): on what this replica knows.
        Err(e) if run.budgets.open_when_unavailable(risk) => {
            run.metrics.label_store_errors.inc();
            run.metrics.store_fallback("labels", risk, "open");
            tracing::debug!(error = %e, "the run's labels could not be read; deciding on this replica's");
            run.budgets
                .labels()
                .known_held(&run.claims.tenant_id, &run.claims.run_id)
        }
        Err(e) => {
            // Fail closed: the call cannot be decided, as its budget
            // could not be either (-31006).
            run.metrics.label_store_errors.inc();
            run.metrics.store_fallback("labels", risk, "closed");
            tracing::warn!(error = %e, "the run's labels could not be read; the call is refused");
            return Err(crate::budget::Refusal::Unavailable {
                why: format!("the run's labels could not be read: {e}"),
            });
        }
    };
    let Some((gate, rule)) = run.policy.taint().gate(risk, check.egress, held.labels) else {
        return Ok(None);
    };
    let from = |l: Labels| held.source(l).unwrap_or("an earlier answer").to_owned();
    let reason = match rule {
        TaintRule::Trifecta => format!(
            "this run has read private data (from {}) and taken in untrusted content (from {}), and {tool} can send data out",
            from(Labels::PRIVATE),
            from(Labels::UNTRUSTED)
        ),
        TaintRule::AfterUntrusted => format!(
            "this run has taken in untrusted content (from {}), and {tool} is a {risk} call",
            from(Labels::UNTRUSTED)
        ),
    };
    run.metrics.taint_gate(
        match rule {
            TaintRule::Trifecta => "trifecta",
            TaintRule::AfterUntrusted => "after_untrusted",
        },
        match gate {
            Gate::Deny => "deny",
            _ => "approve",
        },
    );
    Ok(Some((gate, rule, reason)))
}

/// Reserves the budget of a call that is allowed to run.
pub(crate) async fn admit_budget(
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
                pin: None,
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
