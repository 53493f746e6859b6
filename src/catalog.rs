//! What tools each upstream offers, as the firewall last saw them in a
//! `tools/list` answer: their input schemas (to validate `tools/call`
//! arguments before anything reaches the upstream) and their annotations
//! (untrusted risk hints).
//!
//! The catalog is learned from traffic, one entry per tool name, and updated
//! only when a tool's bytes change, so a busy `tools/list` costs a hash per
//! tool. A JSON Schema is compiled on the first call that needs it and
//! cached with the entry. `notifications/tools/list_changed` from an upstream
//! clears its catalog; the next `tools/list` fills it again.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};

use dashmap::DashMap;
use serde_json::Value;

use crate::mcp::headers::ParamHeaders;
use crate::mcp::rewrite::ListedTool;
use crate::policy::Hints;

/// One upstream tool as last listed.
pub struct ToolEntry {
    /// Hash of the tool's JSON, to skip unchanged re-listings.
    fingerprint: u64,
    /// Its `inputSchema`.
    pub input_schema: Value,
    /// Its annotations as risk hints (untrusted).
    pub hints: Option<Hints>,
    validator: OnceLock<Result<jsonschema::Validator, String>>,
    param_headers: OnceLock<ParamHeaders>,
}

/// Why arguments were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgumentsError {
    /// The upstream's schema itself does not compile.
    #[error("the tool's input schema is invalid: {0}")]
    BadSchema(String),
    /// The arguments do not satisfy the schema.
    #[error("invalid arguments: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// Catalogs of all upstreams.
#[derive(Default)]
pub struct Catalogs {
    by_upstream: DashMap<String, Arc<DashMap<String, Arc<ToolEntry>>>>,
}

// === impl Catalogs ===

impl Catalogs {
    /// The entry for a tool, if the upstream listed it.
    pub fn get(&self, upstream: &str, tool: &str) -> Option<Arc<ToolEntry>> {
        self.by_upstream.get(upstream)?.get(tool).map(|e| e.clone())
    }

    /// Whether the firewall has seen any `tools/list` of the upstream.
    pub fn knows(&self, upstream: &str) -> bool {
        self.by_upstream
            .get(upstream)
            .is_some_and(|c| !c.is_empty())
    }

    /// Records a listed tool; `raw` is its JSON text (for change detection),
    /// `schema` and `annotations` are parsed only when it changed.
    pub fn record(
        &self,
        upstream: &str,
        name: &str,
        raw: &str,
        parse: impl FnOnce() -> (Value, Option<Value>),
    ) -> Arc<ToolEntry> {
        let mut h = DefaultHasher::new();
        raw.hash(&mut h);
        let fingerprint = h.finish();
        let catalog = match self.by_upstream.get(upstream) {
            Some(c) => c.clone(),
            None => self
                .by_upstream
                .entry(upstream.to_owned())
                .or_default()
                .clone(),
        };
        if let Some(e) = catalog.get(name).filter(|e| e.fingerprint == fingerprint) {
            return e.clone();
        }
        let (input_schema, annotations) = parse();
        let entry = ToolEntry {
            fingerprint,
            input_schema,
            hints: Hints::from_annotations(annotations.as_ref()),
            validator: OnceLock::new(),
            param_headers: OnceLock::new(),
        };
        let entry = Arc::new(entry);
        catalog.insert(name.to_owned(), entry.clone());
        entry
    }

    /// Records one tool of a `tools/list` answer.
    pub fn record_listed(&self, upstream: &str, t: &ListedTool<'_>) -> Arc<ToolEntry> {
        self.record(upstream, t.name, t.raw, || {
            let schema = t
                .input_schema
                .and_then(|s| serde_json::from_str(s.get()).ok())
                .unwrap_or(Value::Null);
            let ann = t
                .annotations
                .and_then(|a| serde_json::from_str(a.get()).ok());
            (schema, ann)
        })
    }

    /// Forgets an upstream's tools (its list changed).
    pub fn clear(&self, upstream: &str) {
        if let Some(c) = self.by_upstream.get(upstream) {
            c.clear();
        }
    }
}

// === impl ToolEntry ===

impl ToolEntry {
    /// The `x-mcp-header` parameters of the tool (2026-07-28), from its schema.
    pub fn param_headers(&self) -> &ParamHeaders {
        self.param_headers
            .get_or_init(|| ParamHeaders::from_input_schema(&self.input_schema))
    }

    /// Validates arguments against the tool's input schema.
    pub fn validate(&self, arguments: &Value) -> Result<(), ArgumentsError> {
        let validator = self.validator.get_or_init(|| {
            jsonschema::options()
                .should_validate_formats(true)
                .build(&self.input_schema)
                .map_err(|e| e.to_string())
        });
        let validator = validator
            .as_ref()
            .map_err(|e| ArgumentsError::BadSchema(e.clone()))?;
        let errors: Vec<String> = validator
            .iter_errors(arguments)
            .take(5)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ArgumentsError::Invalid(errors))
        }
    }
}
