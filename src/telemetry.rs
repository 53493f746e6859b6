//! Logging and metrics plumbing: the `tracing` subscriber (text or JSON) and
//! the Prometheus registry every subsystem registers its metrics into.
//!
//! Tokens and injected credentials are never logged: they live in types whose
//! `Debug` redacts them, and the request path logs names and reasons, not
//! header values.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, serde::Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. `RUST_LOG` overrides `level`. Calling it
/// twice is harmless (the second call is ignored), which tests rely on.
pub fn init_logging(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// A new registry with the `mcp_firewall` prefix.
pub(crate) fn registry() -> Registry {
    Registry::with_prefix("mcp_firewall")
}

/// Labels of the per-call counter. Cardinality is bounded: upstreams are
/// the configured ones, tools those the upstream listed (anything else is
/// counted as `_unknown`), stop reasons a fixed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct CallLabels {
    /// Upstream name.
    pub upstream: String,
    /// Tool name, or `_unknown`.
    pub tool: String,
    /// The stop reason (`done`, `step_cap`, ...).
    pub stop_reason: String,
}

/// Labels of the shared-store fallback counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct FallbackLabels {
    /// `budgets`, or `labels` (a run's labels read for a `[taint]` gate).
    pub store: &'static str,
    /// The call's risk.
    pub risk: &'static str,
    /// `open` (admitted by this replica) or `closed` (refused).
    pub fallback: &'static str,
}

/// Labels of the upstream exchange counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct UpstreamLabels {
    /// Upstream name.
    pub upstream: String,
    /// `2xx`, `3xx`, `4xx`, `5xx`, or `error` (no answer: connect, timeout,
    /// transport).
    pub outcome: &'static str,
}

/// Labels of the upstream latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct UpstreamName {
    /// Upstream name.
    pub upstream: String,
}

/// Labels of the policy-hash gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct PolicyLabels {
    /// SHA-256 of the policy files as loaded (hex, first 16 bytes).
    pub sha256: String,
}

/// Labels of the screening findings counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct FindingLabels {
    /// Upstream name.
    pub upstream: String,
    /// What was found (`aws_access_key_id`, `card_number`, `hidden_characters`, …).
    pub kind: &'static str,
    /// What the answer path did: `flag`, `redact`, `block`.
    pub action: &'static str,
}

/// Labels of the upstream credentials' counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct CredentialLabels {
    /// Upstream name.
    pub upstream: String,
    /// `run` (a run's token) or `own` (the firewall's own calls).
    pub purpose: &'static str,
    /// `ok`, `refused` (the provider said no), `unavailable` (it could
    /// not be asked) or `invalid` (its answer could not be read).
    pub outcome: &'static str,
}

/// Labels of the shadow policy's differences counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ShadowLabels {
    /// What the live policy decided (`allow`, `approve`, `deny`, `hidden`,
    /// `invalid`).
    pub live: &'static str,
    /// What the shadow policy would have decided.
    pub shadow: &'static str,
    /// Upstream name.
    pub upstream: String,
}

/// Labels of the taint gate counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct TaintLabels {
    /// `trifecta` or `after_untrusted`.
    pub rule: &'static str,
    /// `approve` or `deny`.
    pub gate: &'static str,
}

/// Labels of the run labels counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct RunLabelLabels {
    /// `untrusted` or `private`.
    pub label: &'static str,
}

/// Labels of a virtual server's member.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct MemberLabels {
    /// The virtual server.
    pub virtual_server: String,
    /// The member upstream.
    pub upstream: String,
}

/// Labels of a virtual server's name space.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct DroppedLabels {
    /// The virtual server.
    pub virtual_server: String,
    /// tool, prompt, resource template, resource.
    pub kind: &'static str,
}

/// Labels of a stdio upstream's counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct StdioLabels {
    /// The upstream.
    pub upstream: String,
}

/// Labels of a stdio server's exits.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ExitLabels {
    /// The upstream.
    pub upstream: String,
    /// `crashed`, `start_failed` (it ended before it wrote a message) or
    /// `stopped` (idle, session ended, shutdown).
    pub reason: &'static str,
}

/// Labels of a sandbox layer a stdio server runs without.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct LayerLabels {
    /// The upstream.
    pub upstream: String,
    /// The layer (`net_namespace`, `landlock_fs`, …).
    pub layer: String,
}

type Fam<L, M> = prometheus_client::metrics::family::Family<L, M>;
type Counter = prometheus_client::metrics::counter::Counter;
type Gauge = prometheus_client::metrics::gauge::Gauge;

/// Request-path metrics.
pub struct Metrics {
    /// Stdio server processes running, per upstream.
    pub stdio_instances: Fam<StdioLabels, Gauge>,
    /// Stdio server processes started.
    pub stdio_starts: Fam<StdioLabels, Counter>,
    /// Time to start a stdio server process (spawn and sandbox).
    pub stdio_start_seconds: Fam<StdioLabels, prometheus_client::metrics::histogram::Histogram>,
    /// Stdio server processes that ended, by reason.
    pub stdio_exits: Fam<ExitLabels, Counter>,
    /// Connections a stdio server's egress proxy refused.
    pub stdio_egress_refused: Fam<StdioLabels, Counter>,
    /// 1 for each sandbox layer a stdio upstream runs without
    /// (`required = false`).
    pub sandbox_layer_missing: Fam<LayerLabels, Gauge>,
    /// Members that answered a merged request later than its deadline.
    pub virtual_late: prometheus_client::metrics::family::Family<
        MemberLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    /// Whether each member of a virtual server answered when last asked.
    pub virtual_member_up: prometheus_client::metrics::family::Family<
        MemberLabels,
        prometheus_client::metrics::gauge::Gauge,
    >,
    /// Names a virtual server leaves out (collisions), by kind.
    pub virtual_dropped: prometheus_client::metrics::family::Family<
        DroppedLabels,
        prometheus_client::metrics::gauge::Gauge,
    >,
    /// Token exchanges with an upstream's identity provider, by outcome.
    pub credential_exchanges: prometheus_client::metrics::family::Family<
        CredentialLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    /// Forwarded requests that used a cached exchanged token.
    pub credential_cache_hits: prometheus_client::metrics::family::Family<
        UpstreamName,
        prometheus_client::metrics::counter::Counter,
    >,
    /// What screening found in answers, by kind and action.
    pub screen_findings: prometheus_client::metrics::family::Family<
        FindingLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    /// `tools/call` the shadow policy would decide otherwise.
    pub shadow_differences: prometheus_client::metrics::family::Family<
        ShadowLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    /// Calls a `[taint]` gate held for approval or refused.
    pub taint_gates: prometheus_client::metrics::family::Family<
        TaintLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    /// Answers that gave their run a label.
    pub run_labels: prometheus_client::metrics::family::Family<
        RunLabelLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    /// Labels that could not be stored in (or read from) Redis.
    pub label_store_errors: prometheus_client::metrics::counter::Counter,
    /// Calls a shared store could not admit, by what they got instead.
    pub store_fallback: prometheus_client::metrics::family::Family<
        FallbackLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    /// 1 for the hash of the policy this replica decides with (replicas
    /// that disagree show two series).
    pub policy: prometheus_client::metrics::family::Family<
        PolicyLabels,
        prometheus_client::metrics::gauge::Gauge,
    >,
    /// `tools/call` outcomes.
    pub calls: prometheus_client::metrics::family::Family<
        CallLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    /// Runs whose budget state is held in memory.
    pub budget_runs: prometheus_client::metrics::gauge::Gauge,
    /// Runs evicted to stay under `limits.max_tracked_runs`.
    pub budget_runs_evicted: prometheus_client::metrics::counter::Counter,
    /// Requests refused by the per-address limit before token verification.
    pub refused_ip: prometheus_client::metrics::counter::Counter,
    /// Connections closed at once because `max_connections` were open.
    pub refused_connections: prometheus_client::metrics::counter::Counter,
    /// Connections closed because the client stopped reading.
    pub write_idle_closed: prometheus_client::metrics::counter::Counter,
    /// Rows of refused messages not written: the principal was over its
    /// rate of such rows.
    pub refused_rows_dropped: prometheus_client::metrics::counter::Counter,
    /// Requests sent upstream, by the class of their answer.
    pub upstream_requests: prometheus_client::metrics::family::Family<
        UpstreamLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    /// Time from sending to the upstream's response headers.
    pub upstream_latency: prometheus_client::metrics::family::Family<
        UpstreamName,
        prometheus_client::metrics::histogram::Histogram,
        fn() -> prometheus_client::metrics::histogram::Histogram,
    >,
    /// The series of each configured upstream, resolved once
    /// ([`Metrics::prepare_upstreams`]): no label allocation per request.
    upstream_series: std::sync::OnceLock<std::collections::HashMap<String, UpstreamSeries>>,
}

/// One upstream's request counters (by answer class) and latency histogram.
struct UpstreamSeries {
    /// `error`, `2xx`, `3xx`, `4xx`, `5xx`.
    requests: [prometheus_client::metrics::counter::Counter; 5],
    latency: prometheus_client::metrics::histogram::Histogram,
}

const UPSTREAM_OUTCOMES: [&str; 5] = ["error", "2xx", "3xx", "4xx", "5xx"];

fn latency_histogram() -> prometheus_client::metrics::histogram::Histogram {
    // 100 µs .. ~13 s.
    prometheus_client::metrics::histogram::Histogram::new(
        prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 18),
    )
}

impl Metrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &mut Registry) -> Arc<Metrics> {
        let m = Metrics {
            stdio_instances: Default::default(),
            stdio_starts: Default::default(),
            stdio_start_seconds: Fam::new_with_constructor(latency_histogram),
            stdio_exits: Default::default(),
            stdio_egress_refused: Default::default(),
            sandbox_layer_missing: Default::default(),
            virtual_late: Default::default(),
            virtual_member_up: Default::default(),
            virtual_dropped: Default::default(),
            screen_findings: Default::default(),
            credential_exchanges: Default::default(),
            credential_cache_hits: Default::default(),
            shadow_differences: Default::default(),
            taint_gates: Default::default(),
            run_labels: Default::default(),
            label_store_errors: Default::default(),
            store_fallback: Default::default(),
            policy: Default::default(),
            calls: Default::default(),
            budget_runs: Default::default(),
            budget_runs_evicted: Default::default(),
            refused_ip: Default::default(),
            refused_connections: Default::default(),
            write_idle_closed: Default::default(),
            refused_rows_dropped: Default::default(),
            upstream_requests: Default::default(),
            upstream_latency: prometheus_client::metrics::family::Family::new_with_constructor(
                latency_histogram,
            ),
            upstream_series: std::sync::OnceLock::new(),
        };
        m.register_upstream(registry);
        m.register_admission(registry);
        m.register_refusals(registry);
        m.register_calls(registry);
        m.register_virtual_servers(registry);
        m.register_stdio(registry);
        Arc::new(m)
    }

    /// Registers the per-upstream request counts and latencies.
    fn register_upstream(&self, registry: &mut Registry) {
        registry.register(
            "upstream_requests",
            "Requests sent to an upstream, by answer class (2xx, 4xx, 5xx; error: no answer)",
            self.upstream_requests.clone(),
        );
        registry.register(
            "upstream_latency_seconds",
            "Time from sending a request to the upstream's response headers",
            self.upstream_latency.clone(),
        );
    }

    /// Registers what admission relies on: shared stores, shadow policy, policy, budgets.
    fn register_admission(&self, registry: &mut Registry) {
        registry.register(
            "store_fallback",
            "tools/call a shared store could not admit: fallback=open admitted by this replica's memory budgets, fallback=closed refused (-31006)",
            self.store_fallback.clone(),
        );
        registry.register(
            "shadow_differences",
            "tools/call the shadow policy ([policy] shadow_dir) would decide otherwise than the live one, by both decisions",
            self.shadow_differences.clone(),
        );
        registry.register(
            "policy_info",
            "1 for the SHA-256 (first 16 bytes) of the policy this replica decides with",
            self.policy.clone(),
        );
        registry.register(
            "budget_runs_evicted",
            "Runs whose budget state was evicted (the longest idle first) to stay under limits.max_tracked_runs",
            self.budget_runs_evicted.clone(),
        );
        registry.register(
            "budget_runs",
            "Runs whose step and cost budgets are tracked in memory",
            self.budget_runs.clone(),
        );
    }

    /// Registers what is refused or dropped before a decision.
    fn register_refusals(&self, registry: &mut Registry) {
        registry.register(
            "refused_ip",
            "Requests refused by the per-address limit (before token verification)",
            self.refused_ip.clone(),
        );
        registry.register(
            "refused_connections",
            "Connections closed at once because server.max_connections were open",
            self.refused_connections.clone(),
        );
        registry.register(
            "write_idle_closed",
            "Connections closed because the client stopped reading (server.write_idle_timeout_ms)",
            self.write_idle_closed.clone(),
        );
        registry.register(
            "refused_rows_dropped",
            "Audit rows of messages refused before a decision that were not written (the principal sent more than 10 per second)",
            self.refused_rows_dropped.clone(),
        );
    }

    /// Registers what calls and answers did: stop reasons, findings, taint gates, labels.
    fn register_calls(&self, registry: &mut Registry) {
        registry.register(
            "tool_calls",
            "tools/call messages by upstream, tool and stop reason",
            self.calls.clone(),
        );
        registry.register(
            "upstream_credential_exchanges",
            "Token exchanges (RFC 8693; client credentials for the firewall's own calls) with an upstream's identity provider, by upstream, purpose (run, own) and outcome (ok, refused, unavailable, invalid)",
            self.credential_exchanges.clone(),
        );
        registry.register(
            "upstream_credential_cache_hits",
            "Requests forwarded with a run's exchanged token from the cache, by upstream",
            self.credential_cache_hits.clone(),
        );
        registry.register(
            "screen_findings",
            "What content screening found in upstream answers, by upstream, kind and action (flag, redact, block)",
            self.screen_findings.clone(),
        );
        registry.register(
            "taint_gates",
            "Calls a [taint] gate held for approval or refused, by rule (trifecta, after_untrusted) and gate",
            self.taint_gates.clone(),
        );
        registry.register(
            "run_labels",
            "Answers that gave their run a label (untrusted, private)",
            self.run_labels.clone(),
        );
        registry.register(
            "label_store_errors",
            "Run labels that could not be stored in or read from Redis (reads fail closed)",
            self.label_store_errors.clone(),
        );
    }

    /// Registers virtual servers' members: late, up or down, names left out.
    fn register_virtual_servers(&self, registry: &mut Registry) {
        registry.register(
            "virtual_server_late_members",
            "Members of a virtual server that answered a merged request (a list, initialize) later than list_timeout_ms",
            self.virtual_late.clone(),
        );
        registry.register(
            "virtual_server_member_up",
            "1 when a virtual server's member answered when last asked, 0 when it is down",
            self.virtual_member_up.clone(),
        );
        registry.register(
            "virtual_server_names_dropped",
            "Names a virtual server leaves out by its collision rule, by kind (tool, prompt, resource template, resource)",
            self.virtual_dropped.clone(),
        );
    }

    /// Registers stdio server processes and their sandboxes.
    fn register_stdio(&self, registry: &mut Registry) {
        registry.register(
            "stdio_instances",
            "Stdio server processes running, per upstream",
            self.stdio_instances.clone(),
        );
        registry.register(
            "stdio_starts",
            "Stdio server processes started (first use, new session, restart after a crash)",
            self.stdio_starts.clone(),
        );
        registry.register(
            "stdio_start_seconds",
            "Time to start a stdio server process, sandbox included",
            self.stdio_start_seconds.clone(),
        );
        registry.register(
            "stdio_exits",
            "Stdio server processes that ended, by reason (crashed, stopped)",
            self.stdio_exits.clone(),
        );
        registry.register(
            "stdio_egress_refused",
            "Connections a stdio server's egress proxy refused (not in its network allow-list)",
            self.stdio_egress_refused.clone(),
        );
        registry.register(
            "sandbox_layer_missing",
            "1 for each sandbox layer a stdio upstream runs without (required = false)",
            self.sandbox_layer_missing.clone(),
        );
    }

    /// Counts a call a shared store could not admit.
    pub fn store_fallback(
        &self,
        store: &'static str,
        risk: crate::policy::Risk,
        fallback: &'static str,
    ) {
        self.store_fallback
            .get_or_create(&FallbackLabels {
                store,
                risk: risk.as_str(),
                fallback,
            })
            .inc();
    }

    /// Publishes the hash of the policy now in force (the previous one's
    /// series is removed).
    pub fn set_policy(&self, sha256: &str) {
        self.policy.clear();
        self.policy
            .get_or_create(&PolicyLabels {
                sha256: sha256.to_owned(),
            })
            .set(1);
    }

    /// Resolves the series of the configured upstreams once, so that
    /// [`Metrics::upstream`] allocates nothing per request.
    pub fn prepare_upstreams<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let series = names
            .into_iter()
            .map(|name| {
                let requests = UPSTREAM_OUTCOMES.map(|outcome| {
                    self.upstream_requests
                        .get_or_create(&UpstreamLabels {
                            upstream: name.to_owned(),
                            outcome,
                        })
                        .clone()
                });
                let latency = self
                    .upstream_latency
                    .get_or_create(&UpstreamName {
                        upstream: name.to_owned(),
                    })
                    .clone();
                (name.to_owned(), UpstreamSeries { requests, latency })
            })
            .collect();
        let _ = self.upstream_series.set(series);
    }

    /// Counts one upstream exchange: `status` of its answer (`None`: none
    /// came), `latency` to its headers.
    pub fn upstream(&self, upstream: &str, status: Option<u16>, latency: std::time::Duration) {
        let class = match status {
            None => 0,
            Some(200..=299) => 1,
            Some(300..=399) => 2,
            Some(400..=499) => 3,
            Some(_) => 4,
        };
        let Some(series) = self.upstream_series.get().and_then(|m| m.get(upstream)) else {
            // Not prepared (an upstream added outside the config): by label.
            self.upstream_requests
                .get_or_create(&UpstreamLabels {
                    upstream: upstream.to_owned(),
                    outcome: UPSTREAM_OUTCOMES[class],
                })
                .inc();
            if status.is_some() {
                self.upstream_latency
                    .get_or_create(&UpstreamName {
                        upstream: upstream.to_owned(),
                    })
                    .observe(latency.as_secs_f64());
            }
            return;
        };
        series.requests[class].inc();
        if status.is_some() {
            series.latency.observe(latency.as_secs_f64());
        }
    }

    /// Counts one exchange with an upstream's identity provider.
    pub fn credential_exchange(
        &self,
        upstream: &str,
        purpose: &'static str,
        outcome: &'static str,
    ) {
        self.credential_exchanges
            .get_or_create(&CredentialLabels {
                upstream: upstream.to_owned(),
                purpose,
                outcome,
            })
            .inc();
    }

    /// Counts one request forwarded with a cached exchanged token.
    pub fn credential_cache_hit(&self, upstream: &str) {
        self.credential_cache_hits
            .get_or_create(&UpstreamName {
                upstream: upstream.to_owned(),
            })
            .inc();
    }

    /// Counts one screening finding.
    pub fn finding(&self, upstream: &str, kind: &'static str, action: &'static str) {
        self.screen_findings
            .get_or_create(&FindingLabels {
                upstream: upstream.to_owned(),
                kind,
                action,
            })
            .inc();
    }

    /// Counts a call the shadow policy would decide otherwise.
    pub fn shadow_difference(&self, upstream: &str, live: &'static str, shadow: &'static str) {
        self.shadow_differences
            .get_or_create(&ShadowLabels {
                live,
                shadow,
                upstream: upstream.to_owned(),
            })
            .inc();
    }

    /// Counts a call a `[taint]` gate held or refused.
    pub fn taint_gate(&self, rule: &'static str, gate: &'static str) {
        self.taint_gates
            .get_or_create(&TaintLabels { rule, gate })
            .inc();
    }

    /// Sets how many processes a stdio upstream runs.
    pub fn stdio_instances(&self, upstream: &str, n: usize) {
        self.stdio_instances
            .get_or_create(&StdioLabels {
                upstream: upstream.to_owned(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts a stdio server started, and how long it took.
    pub fn stdio_started(&self, upstream: &str, took: std::time::Duration) {
        let l = StdioLabels {
            upstream: upstream.to_owned(),
        };
        self.stdio_starts.get_or_create(&l).inc();
        self.stdio_start_seconds
            .get_or_create(&l)
            .observe(took.as_secs_f64());
    }

    /// Counts a stdio server that ended.
    pub fn stdio_exit(&self, upstream: &str, reason: &'static str) {
        self.stdio_exits
            .get_or_create(&ExitLabels {
                upstream: upstream.to_owned(),
                reason,
            })
            .inc();
    }

    /// Counts a connection the egress proxy refused.
    pub fn stdio_egress_refused(&self, upstream: &str) {
        self.stdio_egress_refused
            .get_or_create(&StdioLabels {
                upstream: upstream.to_owned(),
            })
            .inc();
    }

    /// Sets whether a stdio upstream runs without a sandbox layer.
    pub fn sandbox_layer_missing(&self, upstream: &str, layer: &str, missing: bool) {
        self.sandbox_layer_missing
            .get_or_create(&LayerLabels {
                upstream: upstream.to_owned(),
                layer: layer.to_owned(),
            })
            .set(i64::from(missing));
    }

    /// Counts a member that missed a merged request's deadline.
    pub fn virtual_late(&self, virtual_server: &str, upstream: &str) {
        self.virtual_late
            .get_or_create(&MemberLabels {
                virtual_server: virtual_server.to_owned(),
                upstream: upstream.to_owned(),
            })
            .inc();
    }

    /// Sets whether a virtual server's member is up.
    pub fn virtual_member(&self, virtual_server: &str, upstream: &str, up: bool) {
        self.virtual_member_up
            .get_or_create(&MemberLabels {
                virtual_server: virtual_server.to_owned(),
                upstream: upstream.to_owned(),
            })
            .set(i64::from(up));
    }

    /// Sets how many names of `kind` a virtual server leaves out.
    pub fn virtual_dropped(&self, virtual_server: &str, kind: &'static str, n: usize) {
        self.virtual_dropped
            .get_or_create(&DroppedLabels {
                virtual_server: virtual_server.to_owned(),
                kind,
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts an answer that gave its run `label`.
    pub fn run_label(&self, label: &'static str) {
        self.run_labels
            .get_or_create(&RunLabelLabels { label })
            .inc();
    }

    /// Counts one `tools/call` outcome.
    pub fn call(&self, upstream: &str, tool: &str, stop: crate::outcome::StopReason) {
        self.calls
            .get_or_create(&CallLabels {
                upstream: upstream.to_owned(),
                tool: tool.to_owned(),
                stop_reason: stop.as_str().to_owned(),
            })
            .inc();
    }
}
