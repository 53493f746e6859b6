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
        Ok(json_to_cel(call.arguments))
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

/// A JSON value as CEL sees it: exactly what `cel::to_value` makes of it
/// through serde (a non-negative integer is `uint`, a negative one `int`,
/// any other number `double`; objects are maps keyed by string), built
/// directly, without serde's round of keys and values. The arguments are
/// converted on every call a condition applies to; the tests hold this to
/// `cel::to_value` over generated values.
pub(super) fn json_to_cel(v: &serde_json::Value) -> CelValue {
    use serde_json::Value;
    use std::sync::Arc;
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => CelValue::UInt(u),
            (None, Some(i), _) => CelValue::Int(i),
            (None, None, Some(f)) => CelValue::Float(f),
            (None, None, None) => CelValue::Null,
        },
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(json_to_cel).collect())),
        Value::Object(members) => CelValue::Map(cel::objects::Map {
            map: Arc::new(
                members
                    .iter()
                    .map(|(k, v)| {
                        (
                            cel::objects::Key::String(Arc::new(k.clone())),
                            json_to_cel(v),
                        )
                    })
                    .collect(),
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::json_to_cel;
    use proptest::prelude::*;
    use serde_json::Value;

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            Just(serde_json::json!(0.0)),
            Just(serde_json::json!(-0.0)),
            Just(serde_json::json!(u64::MAX)),
            Just(serde_json::json!(i64::MIN)),
            ".{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_direct_conversion_is_what_serde_makes(v in json()) {
            let want = cel::to_value(&v).unwrap();
            prop_assert_eq!(json_to_cel(&v), want);
        }
    }

    #[test]
    fn numbers_keep_their_cel_type() {
        // As JSON text reads them, too (what arguments are).
        for (text, want) in [
            ("7", cel::Value::UInt(7)),
            ("-7", cel::Value::Int(-7)),
            ("7.0", cel::Value::Float(7.0)),
            ("1e3", cel::Value::Float(1000.0)),
            ("18446744073709551615", cel::Value::UInt(u64::MAX)),
        ] {
            let v: Value = serde_json::from_str(text).unwrap();
            assert_eq!(json_to_cel(&v), want, "{text}");
            assert_eq!(cel::to_value(&v).unwrap(), want, "{text}");
        }
    }
}
