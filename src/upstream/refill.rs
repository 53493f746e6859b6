//! Refilling an upstream's tool catalog. The catalog is learned from the
//! `tools/list` answers the firewall relays, so after a restart, on a replica
//! that never relayed this run's list, or after the upstream announced
//! `notifications/tools/list_changed`, a `tools/call` can name a tool the
//! firewall has not seen. Instead of calling it unknown, the firewall asks
//! the upstream for its `tools/list` itself ([`super::own_client`]) and then
//! decides as usual.
//!
//! Bounded, so an agent inventing tool names cannot turn into load on the
//! upstream: one refill per upstream at a time (concurrent callers wait for
//! it), at most one per [`MIN_INTERVAL`] per upstream, each bounded by the
//! upstream's request timeout per page; a catalog cleared since the last
//! refill (`list_changed`, its ttl) is refilled whatever the interval. A
//! failed refill leaves the catalog as
//! it was, and the call is answered "Unknown tool" as before: the firewall
//! never decides on a tool it has not seen listed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio::sync::Mutex;

use crate::catalog::Catalogs;
use crate::mcp::rewrite;

use super::client::UpstreamClient;
use super::own_client;

/// Least time between two refills of one upstream.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(10);

/// When each upstream was last refilled (by route name).
pub struct Refills {
    last: DashMap<String, Arc<Mutex<Option<Instant>>>>,
    /// The refills' own requests are on record.
    auditor: crate::audit::Auditor,
}

impl Refills {
    /// Refills whose requests are recorded by `auditor`.
    pub fn new(auditor: crate::audit::Auditor) -> Refills {
        Refills {
            last: DashMap::new(),
            auditor,
        }
    }

    /// Fetches the upstream's tool list into `catalogs`, unless a refill of
    /// this upstream ran less than [`MIN_INTERVAL`] ago. Returns how many
    /// tools were recorded (0 when skipped or failed).
    pub async fn refill(
        &self,
        catalogs: &Catalogs,
        up: &UpstreamClient,
        pins: &crate::pins::PinStore,
        user: Option<&crate::auth::Claims>,
    ) -> usize {
        let name = &up.config.name;
        let gate = match self.last.get(name) {
            Some(g) => g.clone(),
            None => self.last.entry(name.clone()).or_default().clone(),
        };
        // Waiting here is the single flight: whoever holds the lock is
        // refilling; the others find a fresh timestamp and return.
        let mut last = gate.lock().await;
        // A catalog cleared by `list_changed` (here or on another replica)
        // or by its ttl is refilled at once: the interval only bounds what
        // invented tool names can cost the upstream.
        let stale = catalogs.take_stale(name);
        if !stale && last.is_some_and(|t| t.elapsed() < MIN_INTERVAL) {
            return 0;
        }
        *last = Some(Instant::now());
        let on_behalf = own_client::OnBehalf {
            auditor: &self.auditor,
            tenant: "",
            subject: "mcp-firewall",
            run_id: "",
            user,
            reason: "catalog refill (a call named a tool not seen listed, or the list changed)",
        };
        let pages = match own_client::list_tools(up, on_behalf).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(upstream = %name, error = %e, "catalog refill: tools/list failed");
                return 0;
            }
        };
        let mut recorded = 0;
        for page in &pages {
            let outcome = rewrite::tools_list(page, |t| {
                let entry = catalogs.record_listed(name, t);
                // Drift is noticed here too, not only when a client lists.
                let _ = pins.observe(
                    up.config.pinning,
                    name,
                    t.name,
                    &entry.sha256,
                    &entry.definition,
                );
                recorded += 1;
                None
            });
            if let Err(e) = outcome {
                tracing::warn!(upstream = %name, error = %e, "catalog refill: unreadable tools/list");
            }
        }
        tracing::info!(upstream = %name, tools = recorded, "catalog refilled from the upstream's tools/list");
        recorded
    }
}
