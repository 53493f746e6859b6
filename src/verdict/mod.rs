//! The pure verdicts: what the policy rules on a call and on an answer,
//! made without I/O or run state, so that `serve` ([`crate::proxy`]),
//! `mcp-firewall test`, `audit replay` and the shadow policy all decide with
//! the same code and none of them is a second evaluator.
//!
//! | module | rules on |
//! |---|---|
//! | [`call`] | one `tools/call`: pins, `x-mcp-header` annotations, screening's `block`, the policy's decision, the arguments |
//! | [`answer`] | each upstream-to-client message: list views, input requests, tasks, server-to-client requests |
//! | [`identity`] | the policy's view of a verified token |
//!
//! What is left to admission (approvals, budgets, rate limits, the run's
//! labels as the store holds them) and everything that does I/O lives in
//! [`crate::proxy`].

use crate::auth::Claims;
use crate::policy::Identity;

pub(crate) mod answer;
pub(crate) mod call;

/// The policy's view of verified claims.
pub(crate) fn identity(claims: &Claims, service_issuer: bool) -> Identity<'_> {
    Identity {
        subject: &claims.sub,
        tenant: &claims.tenant_id,
        agent: &claims.agent,
        run_id: &claims.run_id,
        mode: match claims.mode {
            crate::auth::Mode::Caller => crate::policy::Mode::Caller,
            crate::auth::Mode::Agent => crate::policy::Mode::Agent,
            crate::auth::Mode::ServiceAccount => crate::policy::Mode::ServiceAccount,
        },
        projects: &claims.projects,
        ceiling: claims.project_ceiling.as_deref(),
        service_issuer,
    }
}
