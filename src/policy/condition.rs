//! `[[conditions]]` at decision time: which variables a CEL expression
//! reads, the context it is evaluated in (only those variables, built per
//! call), and the evaluation of a call's applicable conditions in order.

use cel::{Context, Program, Value as CelValue};
use globset::GlobMatcher;

use super::{Call, NameSet};

/// A `[[conditions]]` entry, compiled.
pub(super) struct Condition {
    /// Which variables its expressions read ([`VAR_ARGUMENTS`], ...).
    pub(super) vars: u8,
    pub(super) upstream: GlobMatcher,
    pub(super) tools: NameSet,
    pub(super) agents: Option<NameSet>,
    pub(super) when: Option<Program>,
    pub(super) require: Program,
    pub(super) require_text: String,
    pub(super) reason: String,
    pub(super) origin: String,
}

thread_local! {
    /// The CEL standard environment (functions), built once per thread: each
    /// evaluation only adds its variables in an inner scope.
    pub(super) static CEL_ROOT: Context<'static, 'static> = Context::default();
}

/// Bits of [`Condition::vars`]: which variables an expression reads.
pub(super) const VAR_ARGUMENTS: u8 = 1;
pub(super) const VAR_TOKEN: u8 = 2;
pub(super) const VAR_UPSTREAM: u8 = 4;
pub(super) const VAR_PROJECTS: u8 = 8;
pub(super) const VAR_TOOL: u8 = 16;

/// The variables a program references.
pub(super) fn referenced(p: &Program) -> u8 {
    let r = p.references();
    [
        ("arguments", VAR_ARGUMENTS),
        ("token", VAR_TOKEN),
        ("upstream", VAR_UPSTREAM),
        ("projects", VAR_PROJECTS),
        ("tool", VAR_TOOL),
    ]
    .iter()
    .filter(|(name, _)| r.has_variable(name))
    .fold(0, |acc, (_, bit)| acc | bit)
}

/// Evaluates conditions in order; the first that refuses gives its reason and rule.
pub(super) fn evaluate(
    conditions: &[&Condition],
    cx: &Context<'_, '_>,
    note: &mut impl FnMut(&dyn Fn() -> String),
) -> Option<(String, String)> {
    for c in conditions {
        if let Some(when) = &c.when {
            match when.execute(cx) {
                Ok(CelValue::Bool(true)) => {}
                Ok(CelValue::Bool(false)) => {
                    note(&|| format!("condition {} does not apply (`when` is false)", c.origin));
                    continue;
                }
                other => {
                    note(&|| {
                        format!(
                            "condition {}: `when` did not evaluate to a boolean: {other:?}",
                            c.origin
                        )
                    });
                    return Some((
                        format!("{} (condition could not be evaluated)", c.reason),
                        c.origin.clone(),
                    ));
                }
            }
        }
        match c.require.execute(cx) {
            Ok(CelValue::Bool(true)) => {
                note(&|| format!("condition {} holds: {}", c.origin, c.require_text))
            }
            outcome => {
                let why = match outcome {
                    Ok(CelValue::Bool(false)) => "is false".to_owned(),
                    Ok(v) => format!("is not a boolean ({v:?})"),
                    Err(e) => format!("failed: {e}"),
                };
                note(&|| format!("condition {} {why}: {}", c.origin, c.require_text));
                return Some((c.reason.clone(), c.origin.clone()));
            }
        }
    }
    None
}

/// Variables CEL expressions see: `arguments`, `tool`, `upstream`
/// (`name`, `projects`, `categories`), `projects` (effective) and `token`
/// (`sub`, `tenant_id`, `agent`, `run_id`, `mode`, `projects`, `project_ceiling`).
pub(super) fn cel_context<'a>(
    root: &'a Context<'static, 'static>,
    call: &Call<'_>,
    needs: u8,
) -> Context<'a, 'static> {
    let mut cx = root.new_inner_scope();
    let mut add =
        |bit: u8, name: &str, make: &dyn Fn() -> Result<CelValue, cel::SerializationError>| {
            if needs & bit == 0 {
                return;
            }
            // A value CEL cannot represent leaves the variable unset, so any
            // expression using it fails and the call is denied.
            if let Ok(cv) = make() {
                cx.add_variable_from_value(name, cv);
            }
        };
    add(VAR_ARGUMENTS, "arguments", &|| {
        cel::to_value(call.arguments)
    });
    add(VAR_TOKEN, "token", &|| {
        cel::to_value(serde_json::json!({
            "sub": call.identity.subject,
            "tenant_id": call.identity.tenant,
            "agent": call.identity.agent,
            "run_id": call.identity.run_id,
            "mode": call.identity.mode.as_str(),
            "projects": call.identity.projects,
            "project_ceiling": call.identity.ceiling,
        }))
    });
    add(VAR_UPSTREAM, "upstream", &|| {
        cel::to_value(serde_json::json!({
            "name": call.upstream.name,
            "projects": call.upstream.projects,
            "categories": call.upstream.categories,
        }))
    });
    add(VAR_PROJECTS, "projects", &|| {
        cel::to_value(&call.authority.projects)
    });
    add(VAR_TOOL, "tool", &|| cel::to_value(call.tool));
    cx
}
