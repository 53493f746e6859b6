//! The request path's shared state (`State`): the config, the upstream clients,
//! the verifier, the policy, the catalogs, the auditor, budgets and approvals.

use super::held_calls::Holds;
use super::*;
use crate::approval::Approvals;
use crate::audit::{Auditor, Redactor};
use crate::auth::Verifier;
use crate::catalog::Catalogs;
use crate::config::Config;
use crate::mcp::jsonrpc;
use crate::policy::reload::PolicyStore;
use crate::session::Sessions;
use crate::tasks;
use crate::telemetry::Metrics;
use crate::upstream::client::UpstreamClient;
use crate::upstream::{opening, refill};
use std::collections::HashMap;
use std::sync::Arc;

/// Shared state of the request path.
pub struct State {
    /// The validated configuration.
    pub config: Arc<Config>,
    /// One pooled client per upstream, by route name.
    pub upstreams: HashMap<String, Arc<UpstreamClient>>,
    /// JSON-RPC parse limits.
    pub limits: jsonrpc::Limits,
    /// Tool-token verification (cached).
    pub verifier: Verifier,
    /// The policy, hot-reloaded.
    pub policy: Arc<PolicyStore>,
    /// What each upstream offers.
    pub catalogs: Arc<Catalogs>,
    /// Where audit rows go (a no-op when audit is off).
    pub auditor: Auditor,
    /// Rate limits and caps.
    pub budgets: Arc<crate::budget::Budgets>,
    /// Request-path metrics.
    pub metrics: Arc<Metrics>,
    /// Human approvals, when configured.
    pub approvals: Option<Arc<Approvals>>,
    /// Masks secrets in arguments shown to approvers.
    pub redactor: Arc<Redactor>,
    /// Catalog refills for calls naming tools not seen listed.
    pub refills: Arc<refill::Refills>,
    /// The runs whose (2025-11-25) client said at `initialize` that it
    /// takes URL-mode elicitation.
    pub(crate) url_clients: crate::credential::user::UrlClients,
    /// The tracer, when `[telemetry.otlp]` is set.
    pub traces: Option<crate::trace::Traces>,
    /// Reviewed tool definitions.
    pub pins: Arc<crate::pins::PinStore>,
    /// Seals session ids, event ids and request states.
    pub sessions: Arc<Sessions>,
    /// Calls held for approval.
    pub holds: Arc<Holds>,
    /// Turns true just before the drain deadline: open streams end with a
    /// final error event instead of being cut.
    pub closing: tokio::sync::watch::Sender<bool>,
    /// The tasks this replica saw created (whose they are, what they hold).
    pub tasks: Arc<tasks::Tasks>,
    /// Sessions whose GET stream is on its way upstream: their POSTs wait
    /// for it, so the upstream has the stream before the calls the client
    /// sent after it.
    pub opening: Arc<opening::Opening>,
    /// How many rows of refused messages each principal may leave per
    /// second (a flood of hostile bodies cannot fill the spool).
    pub refused_rows: governor::DefaultKeyedRateLimiter<String>,
    /// The virtual servers, by route name, and their sessions.
    pub virtuals: HashMap<String, Arc<virtual_server::Virtual>>,
}

/// Rows of messages refused before a decision, per principal: 10 a second,
/// bursts of 20.
pub(super) fn refused_rows_quota() -> governor::Quota {
    governor::Quota::per_second(std::num::NonZeroU32::MIN.saturating_add(9))
        .allow_burst(std::num::NonZeroU32::MIN.saturating_add(19))
}

/// Why the request-path state could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StateError {
    /// An upstream client.
    #[error(transparent)]
    Client(#[from] crate::upstream::client::ClientError),
    /// No random session key could be made.
    #[error("cannot generate a session key: the system's random source failed")]
    SessionKey,
    /// The shared state store's settings are unusable.
    #[error("{0}")]
    Store(String),
}

// === impl State ===

impl State {
    /// Builds the request-path state.
    // Each part is built elsewhere at start; bundling them would only move
    // the list.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: Arc<Config>,
        verifier: Verifier,
        policy: Arc<PolicyStore>,
        auditor: Auditor,
        metrics: Arc<Metrics>,
        approvals: Option<Arc<Approvals>>,
        pins: Arc<crate::pins::PinStore>,
        keeper: Option<&Arc<crate::credential::Keeper>>,
    ) -> Result<State, StateError> {
        let mut upstreams = HashMap::with_capacity(config.upstreams.len());
        for u in &config.upstreams {
            let mut client = UpstreamClient::new(u.clone(), metrics.clone())?;
            if let Some(k) = keeper {
                client = client.with_users(k, metrics.clone())?;
            }
            upstreams.insert(u.name.clone(), Arc::new(client));
        }
        let limits = jsonrpc::Limits {
            max_depth: config.server.max_json_depth,
            max_batch: config.server.max_batch,
        };
        metrics.prepare_upstreams(config.upstreams.iter().map(|u| u.name.as_str()));
        let budgets = Arc::new(budgets(&config).map_err(|e| StateError::Store(e.to_string()))?);
        let redactor = Arc::new(redactor(&config).map_err(|e| {
            StateError::Store(format!(
                "audit.redact.key_patterns: {e}; redaction cannot be turned off by a typo"
            ))
        })?);
        let sessions =
            Arc::new(Sessions::new(&config.session_keys).map_err(|_| StateError::SessionKey)?);
        if !sessions.shared() {
            tracing::info!("sessions are sealed with a key of this process: configure [sessions] keys for several replicas");
        }
        let refills = Arc::new(refill::Refills::new(auditor.clone()));
        let virtuals = config
            .virtual_servers
            .iter()
            .map(|v| {
                let vs = virtual_server::Virtual::new(v.clone(), &upstreams, metrics.clone());
                (v.name.clone(), Arc::new(vs))
            })
            .collect();
        Ok(State {
            url_clients: crate::credential::user::UrlClients::default(),
            holds: Arc::new(Holds::new(approvals.clone())),
            config,
            upstreams,
            limits,
            verifier,
            policy,
            catalogs: Arc::new(Catalogs::default()),
            auditor,
            budgets,
            metrics,
            approvals,
            redactor,
            refills,
            traces: None,
            pins,
            sessions,
            closing: tokio::sync::watch::Sender::new(false),
            refused_rows: governor::RateLimiter::keyed(refused_rows_quota()),
            tasks: Arc::new(tasks::Tasks::default()),
            opening: Arc::new(opening::Opening::default()),
            virtuals,
        })
    }
}

/// The budgets of `[state]`: in memory, or in Redis for every replica.
pub(super) fn budgets(config: &Config) -> anyhow::Result<crate::budget::Budgets> {
    use crate::budget::{shared::RedisBudgets, Budgets};
    Ok(match config.state.backend {
        crate::state::Backend::Memory => Budgets::new(config.limits.clone()),
        crate::state::Backend::Redis => {
            let redis = crate::state::Redis::connect(&config.state)?;
            Budgets::shared(
                config.limits.clone(),
                RedisBudgets::new(redis, &config.limits),
                config.state.on_store_unavailable,
            )
        }
    })
}

/// The redactor of the audit config (or the default patterns); a pattern
/// that does not compile is an error, never a redactor that masks nothing.
pub(super) fn redactor(config: &Config) -> Result<Redactor, crate::audit::RedactError> {
    let patterns = config
        .audit
        .as_ref()
        .map(|a| a.redact.key_patterns.clone())
        .unwrap_or_else(|| crate::audit::RedactConfig::default().key_patterns);
    Redactor::new(&patterns)
}
