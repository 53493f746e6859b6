//! The approvals subsystem's metrics: requests, decisions and outcomes by
//! kind, and the pending gauge.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabel {
    pub(super) kind: &'static str,
}

/// The subsystem's metrics (prefix `approvals_`). Cheap clones of atomics.
#[derive(Clone, Debug, Default)]
pub(crate) struct Metrics {
    pub(super) pending: Gauge,
    pub(super) oldest_pending_age: Gauge,
    pub(super) created: Counter,
    pub(super) decisions: Family<OutcomeLabel, Counter>,
    pub(super) webhook_failures: Family<KindLabel, Counter>,
    pub(super) webhook_sent: Counter<u64, AtomicU64>,
}

impl Metrics {
    pub(super) fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::default();
        let r = registry.sub_registry_with_prefix("approvals");
        r.register(
            "pending",
            "Approvals waiting for a person",
            m.pending.clone(),
        );
        r.register(
            "oldest_pending_age_seconds",
            "Age of the oldest approval still waiting for a person (0: none), as of the last sweep",
            m.oldest_pending_age.clone(),
        );
        r.register(
            "created",
            "Approvals requested (new pending approvals)",
            m.created.clone(),
        );
        r.register(
            "decisions",
            "Approvals leaving pending or approved, by outcome (approved, denied, expired, consumed)",
            m.decisions.clone(),
        );
        r.register(
            "webhook_failures",
            "Webhook notifications that failed: kind=attempt per failed try, kind=dropped when given up",
            m.webhook_failures.clone(),
        );
        r.register(
            "webhook_sent",
            "Webhook notifications delivered (2xx)",
            m.webhook_sent.clone(),
        );
        m
    }

    pub(crate) fn webhook_attempt_failed(&self) {
        self.webhook_failures
            .get_or_create(&KindLabel { kind: "attempt" })
            .inc();
    }

    pub(crate) fn webhook_dropped(&self) {
        self.webhook_failures
            .get_or_create(&KindLabel { kind: "dropped" })
            .inc();
    }

    pub(crate) fn webhook_delivered(&self) {
        self.webhook_sent.inc();
    }
}
