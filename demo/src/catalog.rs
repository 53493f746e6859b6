//! The estate's fixed data: services' baselines, deployments with their
//! diffs, incidents with their seeded notes, and the metric series, plus the
//! renderings of it that never change (built once per process).
//!
//! Invariants: nothing here changes after start-up and nothing reads the
//! clock; deployments are listed in chronological order, so per service
//! instance the last one is live until something is rolled back; metric
//! samples are a pure function of (instance, index).

use std::fmt::Write as _;
use std::sync::LazyLock;

use serde_json::{json, Value};

use super::model::{
    IncidentStatus, Namespace, Service, ToolOutput, METRICS_CSV_HEADER, METRICS_START_UNIX,
    METRICS_STEP_SECS,
};

/// Rows precomputed per series. Exports up to this many points are a single
/// copy of a prefix of the cached text, which keeps the bench's read path
/// free of formatting work; longer exports format the remaining rows.
pub(super) const CACHED_POINTS: usize = 2_880;

/// Rough size of one CSV row, used to size the output buffer up front so a
/// large export does not reallocate while it grows.
pub(super) const ROW_BYTES_ESTIMATE: usize = 52;

/// Normal operating numbers of a service in `prod` (staging serves a
/// twentieth of the traffic).
pub(super) fn baseline(service: Service) -> Baseline {
    match service {
        Service::Checkout => Baseline {
            p50_ms: 38,
            p99_ms: 210,
            errors_per_10k: 12,
            rps: 850,
            replicas: 6,
            team: "storefront",
        },
        Service::Payments => Baseline {
            p50_ms: 55,
            p99_ms: 340,
            errors_per_10k: 6,
            rps: 420,
            replicas: 4,
            team: "payments-core",
        },
        Service::Search => Baseline {
            p50_ms: 24,
            p99_ms: 480,
            errors_per_10k: 4,
            rps: 2_300,
            replicas: 8,
            team: "discovery",
        },
        Service::Auth => Baseline {
            p50_ms: 9,
            p99_ms: 60,
            errors_per_10k: 3,
            rps: 3_100,
            replicas: 5,
            team: "identity",
        },
    }
}

/// See [`baseline`].
pub(super) struct Baseline {
    pub(super) p50_ms: u64,
    pub(super) p99_ms: u64,
    pub(super) errors_per_10k: u64,
    pub(super) rps: u64,
    pub(super) replicas: u32,
    pub(super) team: &'static str,
}

/// One deployment of a version to a service instance.
pub(super) struct DeploymentRecord {
    pub(super) id: &'static str,
    pub(super) service: Service,
    pub(super) namespace: Namespace,
    pub(super) version: &'static str,
    pub(super) author: &'static str,
    pub(super) deployed_at: &'static str,
    pub(super) commit: &'static str,
    pub(super) summary: &'static str,
    pub(super) diff: &'static str,
    /// Why this version misbehaves while it is live, if it does.
    pub(super) defect: Option<&'static str>,
}

impl DeploymentRecord {
    pub(super) fn instance(&self) -> usize {
        instance_index(self.service, self.namespace)
    }
}

/// How an open incident becomes mitigated by an action in the estate.
pub(super) enum Mitigation {
    None,
    /// Rolling this deployment back mitigates the incident.
    Rollback(&'static str),
    /// Restarting the incident's service instance (which clears its stale
    /// cache) mitigates the incident.
    Restart,
}

/// One incident as it was opened; its notes are the seeded ones.
pub(super) struct IncidentRecord {
    pub(super) id: &'static str,
    pub(super) title: &'static str,
    pub(super) severity: &'static str,
    pub(super) service: Service,
    pub(super) namespace: Namespace,
    pub(super) opened_at: &'static str,
    pub(super) summary: &'static str,
    pub(super) suspected_deployment: Option<&'static str>,
    pub(super) status: IncidentStatus,
    pub(super) mitigation: Mitigation,
    pub(super) notes: &'static [(&'static str, &'static str, &'static str)],
}

/// Service instances: every service in every namespace.
pub(super) const INSTANCES: usize = 8;

/// The index of a service instance, as used by per-instance arrays.
pub(super) fn instance_index(service: Service, namespace: Namespace) -> usize {
    service.index() * 2 + namespace.index()
}

/// Inverse of [`instance_index`].
pub(super) fn instance_of(index: usize) -> (Service, Namespace) {
    let service = Service::ALL[(index / 2) % Service::ALL.len()];
    let namespace = if index % 2 == 0 {
        Namespace::Prod
    } else {
        Namespace::Staging
    };
    (service, namespace)
}

const BUMP_DIFF: &str = "\
diff --git a/Cargo.toml b/Cargo.toml
--- a/Cargo.toml
+++ b/Cargo.toml
@@ -1,4 +1,4 @@
 [package]
-version = \"previous\"
+version = \"next\"
 edition = \"2021\"
 publish = false
diff --git a/CHANGELOG.md b/CHANGELOG.md
--- a/CHANGELOG.md
+++ b/CHANGELOG.md
@@ -1,3 +1,5 @@
 # Changelog
+
+- Routine dependency and version bump.
";

/// Deployments in chronological order; per instance, the last one is live
/// until something is rolled back.
pub(super) const DEPLOYMENTS: &[DeploymentRecord] = &[
    DeploymentRecord {
        id: "dep-1029",
        service: Service::Payments,
        namespace: Namespace::Prod,
        version: "v5.2.3",
        author: "lena.fischer",
        deployed_at: "2026-02-27T10:02:00Z",
        commit: "4be1c07",
        summary: "Retry card-network timeouts once with jitter",
        diff: "\
diff --git a/src/network/retry.rs b/src/network/retry.rs
--- a/src/network/retry.rs
+++ b/src/network/retry.rs
@@ -12,7 +12,9 @@ pub fn policy() -> RetryPolicy {
     RetryPolicy {
-        attempts: 1,
+        attempts: 2,
+        jitter_ms: 40..120,
         retry_on: &[Status::Timeout],
+        idempotency: Idempotency::Required,
     }
 }
",
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1030",
        service: Service::Auth,
        namespace: Namespace::Prod,
        version: "v3.0.6",
        author: "omar.haddad",
        deployed_at: "2026-03-01T09:30:00Z",
        commit: "91d0e3a",
        summary: "Rotate signing keys every 12h instead of 24h",
        diff: "\
diff --git a/config/keys.toml b/config/keys.toml
--- a/config/keys.toml
+++ b/config/keys.toml
@@ -1,3 +1,3 @@
 [signing]
-rotate_every = \"24h\"
+rotate_every = \"12h\"
 overlap = \"1h\"
",
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1031",
        service: Service::Checkout,
        namespace: Namespace::Prod,
        version: "v2.13.0",
        author: "maria.chen",
        deployed_at: "2026-03-02T14:05:00Z",
        commit: "c3a9f12",
        summary: "Show delivery estimates on the review step",
        diff: "\
diff --git a/src/review.rs b/src/review.rs
--- a/src/review.rs
+++ b/src/review.rs
@@ -40,6 +40,8 @@ fn render_review(cart: &Cart) -> Page {
     page.section(totals(cart));
+    let estimate = delivery::estimate(cart.address(), cart.items());
+    page.section(delivery_block(estimate));
     page.section(payment_block(cart));
     page
 }
",
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1033",
        service: Service::Search,
        namespace: Namespace::Prod,
        version: "v1.9.1",
        author: "yuki.tanaka",
        deployed_at: "2026-03-03T11:12:00Z",
        commit: "7f2ab90",
        summary: "Tune BM25 field weights for titles",
        diff: "\
diff --git a/ranking/weights.yaml b/ranking/weights.yaml
--- a/ranking/weights.yaml
+++ b/ranking/weights.yaml
@@ -1,4 +1,4 @@
 fields:
-  title: 2.0
+  title: 2.6
   description: 1.0
   brand: 1.4
",
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1034",
        service: Service::Auth,
        namespace: Namespace::Staging,
        version: "v3.1.0-rc.1",
        author: "omar.haddad",
        deployed_at: "2026-03-04T15:20:00Z",
        commit: "aa61c2e",
        summary: "Passkey login behind a feature flag",
        diff: BUMP_DIFF,
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1035",
        service: Service::Auth,
        namespace: Namespace::Prod,
        version: "v3.0.7",
        author: "priya.raman",
        deployed_at: "2026-03-07T13:40:00Z",
        commit: "e02d5b4",
        summary: "Fix refresh-token clock skew tolerance",
        diff: "\
diff --git a/src/token/refresh.rs b/src/token/refresh.rs
--- a/src/token/refresh.rs
+++ b/src/token/refresh.rs
@@ -22,5 +22,5 @@ fn still_valid(token: &Refresh, now: Instant) -> bool {
-    token.expires_at > now
+    token.expires_at + CLOCK_SKEW > now
 }
",
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1036",
        service: Service::Payments,
        namespace: Namespace::Prod,
        version: "v5.3.0",
        author: "lena.fischer",
        deployed_at: "2026-03-08T08:55:00Z",
        commit: "5d77e81",
        summary: "Move webhook delivery to the shared queue",
        diff: "\
diff --git a/src/webhooks/deliver.rs b/src/webhooks/deliver.rs
--- a/src/webhooks/deliver.rs
+++ b/src/webhooks/deliver.rs
@@ -8,6 +8,6 @@ pub async fn deliver(event: Event) -> Result<()> {
-    let queue = Queue::dedicated(\"webhooks\");
+    let queue = Queue::shared(\"events\");
     queue.push(event.encode()?).await
 }
",
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1037",
        service: Service::Search,
        namespace: Namespace::Staging,
        version: "v1.10.0-beta.2",
        author: "yuki.tanaka",
        deployed_at: "2026-03-09T09:00:00Z",
        commit: "0b8d3f6",
        summary: "Vector re-ranking experiment",
        diff: BUMP_DIFF,
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1038",
        service: Service::Checkout,
        namespace: Namespace::Prod,
        version: "v2.14.0",
        author: "dev.patel",
        deployed_at: "2026-03-09T10:20:00Z",
        commit: "19ce4a0",
        summary: "Send an idempotency key with every payment authorization",
        diff: "\
diff --git a/src/payment/client.rs b/src/payment/client.rs
--- a/src/payment/client.rs
+++ b/src/payment/client.rs
@@ -30,6 +30,7 @@ pub async fn authorize(order: &Order) -> Result<Authorization> {
     let request = http::Request::post(AUTHORIZE_URL)
         .header(\"content-type\", \"application/json\")
+        .header(\"idempotency-key\", order.id().to_string())
         .body(order.authorization_body()?)?;
     send_with_retry(request).await
 }
",
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1039",
        service: Service::Search,
        namespace: Namespace::Prod,
        version: "v1.9.2",
        author: "ana.souza",
        deployed_at: "2026-03-10T16:10:00Z",
        commit: "d41f7c3",
        summary: "Raise result cache TTL from 5 to 30 minutes",
        diff: "\
diff --git a/config/cache.toml b/config/cache.toml
--- a/config/cache.toml
+++ b/config/cache.toml
@@ -1,3 +1,3 @@
 [results]
-ttl = \"5m\"
+ttl = \"30m\"
 max_entries = 200000
",
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1040",
        service: Service::Checkout,
        namespace: Namespace::Staging,
        version: "v2.14.1",
        author: "sam.okafor",
        deployed_at: "2026-03-11T09:10:00Z",
        commit: "8a1e6d9",
        summary: "Refactor payment retries into a shared helper",
        diff: BUMP_DIFF,
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1041",
        service: Service::Payments,
        namespace: Namespace::Staging,
        version: "v5.4.0-rc.1",
        author: "lena.fischer",
        deployed_at: "2026-03-11T12:00:00Z",
        commit: "f9b20c1",
        summary: "3-D Secure v2.3 challenge flow",
        diff: BUMP_DIFF,
        defect: None,
    },
    DeploymentRecord {
        id: "dep-1042",
        service: Service::Checkout,
        namespace: Namespace::Prod,
        version: "v2.14.1",
        author: "sam.okafor",
        deployed_at: "2026-03-11T16:45:00Z",
        commit: "8a1e6d9",
        summary: "Refactor payment retries into a shared helper",
        diff: "\
diff --git a/src/payment/client.rs b/src/payment/client.rs
--- a/src/payment/client.rs
+++ b/src/payment/client.rs
@@ -30,7 +30,6 @@ pub async fn authorize(order: &Order) -> Result<Authorization> {
     let request = http::Request::post(AUTHORIZE_URL)
         .header(\"content-type\", \"application/json\")
-        .header(\"idempotency-key\", order.id().to_string())
         .body(order.authorization_body()?)?;
-    send_with_retry(request).await
+    retry::with_backoff(3, || send(request.clone())).await
 }
diff --git a/src/payment/retry.rs b/src/payment/retry.rs
--- /dev/null
+++ b/src/payment/retry.rs
@@ -0,0 +1,9 @@
+pub async fn with_backoff<F, Fut, T>(attempts: u32, f: F) -> Result<T>
+where
+    F: Fn() -> Fut,
+    Fut: Future<Output = Result<T>>,
+{
+    let mut last = f().await;
+    for _ in 1..attempts { if last.is_ok() { break; } last = f().await; }
+    last
+}
",
        defect: Some(
            "payment authorizations are retried without an idempotency key; duplicate authorizations are declined with HTTP 502",
        ),
    },
];

pub(super) const INCIDENTS: &[IncidentRecord] = &[
    IncidentRecord {
        id: "INC-1001",
        title: "Checkout error rate above 8% after the 16:45 deploy",
        severity: "sev1",
        service: Service::Checkout,
        namespace: Namespace::Prod,
        opened_at: "2026-03-11T17:02:00Z",
        summary: "Checkout returns HTTP 502 for about 8% of orders since 16:45 UTC. Payment authorization is declined as a duplicate.",
        suspected_deployment: Some("dep-1042"),
        status: IncidentStatus::Open,
        mitigation: Mitigation::Rollback("dep-1042"),
        notes: &[
            (
                "pagerduty",
                "2026-03-11T17:02:00Z",
                "Alert CheckoutErrorRateHigh fired: 8.3% over 10 minutes.",
            ),
            (
                "maria.chen",
                "2026-03-11T17:09:00Z",
                "Errors started right after dep-1042. Payments sees duplicate authorizations.",
            ),
        ],
    },
    IncidentRecord {
        id: "INC-1002",
        title: "Search p99 latency at 2.4s (SLO 800ms)",
        severity: "sev2",
        service: Service::Search,
        namespace: Namespace::Prod,
        opened_at: "2026-03-11T08:30:00Z",
        summary: "Search p99 latency climbed from 07:30 UTC. The result cache serves stale shards after the TTL change; cache hit ratio fell to 31%.",
        suspected_deployment: Some("dep-1039"),
        status: IncidentStatus::Open,
        mitigation: Mitigation::Restart,
        notes: &[(
            "yuki.tanaka",
            "2026-03-11T08:41:00Z",
            "A rolling restart should rebuild the cache; rollback is not needed.",
        )],
    },
    IncidentRecord {
        id: "INC-1003",
        title: "Intermittent 401s on token refresh",
        severity: "sev3",
        service: Service::Auth,
        namespace: Namespace::Prod,
        opened_at: "2026-03-07T11:15:00Z",
        summary: "About 0.2% of refreshes failed with 401 because of clock skew between regions. Fixed by dep-1035.",
        suspected_deployment: Some("dep-1030"),
        status: IncidentStatus::Resolved,
        mitigation: Mitigation::None,
        notes: &[(
            "priya.raman",
            "2026-03-07T14:02:00Z",
            "dep-1035 adds clock skew tolerance; error rate back to baseline.",
        )],
    },
    IncidentRecord {
        id: "INC-1004",
        title: "Payment webhooks delayed by about 4 minutes",
        severity: "sev2",
        service: Service::Payments,
        namespace: Namespace::Prod,
        opened_at: "2026-03-10T21:40:00Z",
        summary: "Merchant webhooks arrive late since webhook delivery moved to the shared event queue.",
        suspected_deployment: Some("dep-1036"),
        status: IncidentStatus::Mitigated,
        mitigation: Mitigation::None,
        notes: &[(
            "lena.fischer",
            "2026-03-10T22:15:00Z",
            "Scaled queue consumers from 4 to 12; delay is under 30 seconds now.",
        )],
    },
];

/// Instances whose result cache is stale when an estate is created; a restart
/// clears it.
pub(super) const STALE_AT_START: [(Service, Namespace); 1] = [(Service::Search, Namespace::Prod)];

/// A deployment and its index in [`DEPLOYMENTS`].
pub(super) fn find_deployment(id: &str) -> Option<(usize, &'static DeploymentRecord)> {
    DEPLOYMENTS.iter().enumerate().find(|(_, d)| d.id == id)
}

/// An incident and its index in [`INCIDENTS`].
pub(super) fn find_incident(id: &str) -> Option<(usize, &'static IncidentRecord)> {
    INCIDENTS.iter().enumerate().find(|(_, i)| i.id == id)
}

/// The deployment that preceded `index` on the same instance, in catalog
/// order (independent of rollbacks).
pub(super) fn predecessor(index: usize) -> Option<&'static DeploymentRecord> {
    let target = DEPLOYMENTS.get(index)?;
    DEPLOYMENTS
        .get(..index)?
        .iter()
        .rev()
        .find(|d| d.instance() == target.instance())
}

/// Precomputed renderings of the immutable parts of the catalog.
pub(super) struct Precomputed {
    /// `get_deployment_diff` answers, indexed like [`DEPLOYMENTS`].
    pub(super) diffs: Vec<ToolOutput>,
    /// Metric series, indexed by instance.
    pub(super) series: Vec<Series>,
}

/// One instance's metric series: the header plus [`CACHED_POINTS`] rows, and
/// the byte offset where each row ends so any prefix is one slice.
pub(super) struct Series {
    pub(super) csv: String,
    pub(super) row_ends: Vec<usize>,
}

/// Built on first use and shared by every estate in the process.
pub(super) static PRECOMPUTED: LazyLock<Precomputed> = LazyLock::new(|| Precomputed {
    diffs: DEPLOYMENTS.iter().map(render_diff).collect(),
    series: (0..INSTANCES).map(build_series).collect(),
});

fn render_diff(deployment: &DeploymentRecord) -> ToolOutput {
    let mut files: Vec<Value> = Vec::new();
    let (mut path, mut additions, mut deletions) = (None::<&str>, 0u64, 0u64);
    let (mut total_add, mut total_del) = (0u64, 0u64);
    for line in deployment.diff.lines() {
        if let Some(rest) = line.strip_prefix("diff --git a/") {
            if let Some(done) = path.take() {
                files.push(json!({"path": done, "additions": additions, "deletions": deletions}));
            }
            path = Some(rest.split(" b/").next().unwrap_or(rest));
            additions = 0;
            deletions = 0;
        } else if line.starts_with("+++") || line.starts_with("---") {
            continue;
        } else if line.starts_with('+') {
            additions += 1;
            total_add += 1;
        } else if line.starts_with('-') {
            deletions += 1;
            total_del += 1;
        }
    }
    if let Some(done) = path {
        files.push(json!({"path": done, "additions": additions, "deletions": deletions}));
    }
    let mut text = String::with_capacity(deployment.diff.len() + 128);
    let _ = writeln!(
        text,
        "{} {}/{} {} ({}, commit {}): +{} -{}",
        deployment.id,
        deployment.service,
        deployment.namespace,
        deployment.version,
        deployment.author,
        deployment.commit,
        total_add,
        total_del
    );
    text.push_str(deployment.diff);
    ToolOutput {
        text,
        structured: Some(json!({
            "deployment_id": deployment.id,
            "commit": deployment.commit,
            "files": files,
            "additions": total_add,
            "deletions": total_del,
            "diff": deployment.diff,
        })),
    }
}

/// SplitMix64: a tiny, well-mixed seeded generator, so samples look noisy but
/// are a pure function of (instance, index).
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One metric sample (or current reading) of an instance.
pub(super) struct Sample {
    pub(super) p50_ms: u64,
    pub(super) p99_ms: u64,
    pub(super) errors_per_10k: u64,
    pub(super) rps: u64,
}

/// Minute-of-day windows (on 2026-03-11) in which an incident shows up in the
/// metrics of an instance: (instance, first minute, end minute, extra p50,
/// extra p99, extra errors per 10k).
const METRIC_INCIDENTS: [(Service, Namespace, u64, u64, u64, u64, u64); 2] = [
    // INC-1001: dep-1042 went live at 16:45.
    (
        Service::Checkout,
        Namespace::Prod,
        1_005,
        1_440,
        6,
        380,
        830,
    ),
    // INC-1002: the stale cache degraded search from 07:30.
    (Service::Search, Namespace::Prod, 450, 1_440, 40, 1_900, 0),
];

fn sample(instance: usize, index: u64) -> Sample {
    let (service, namespace) = instance_of(instance);
    let base = baseline(service);
    let noise = splitmix64(((instance as u64) << 40) ^ index);
    let minute = index % 1_440;
    // A triangle wave peaking at 14:00 gives traffic a daily shape.
    let distance = minute.abs_diff(840);
    let mut rps = base.rps * (1_440 - distance) / 1_440 + noise % (base.rps / 10 + 1);
    if namespace == Namespace::Staging {
        rps = rps / 20 + 1;
    }
    let mut s = Sample {
        p50_ms: base.p50_ms + (noise >> 8) % 7,
        p99_ms: base.p99_ms + (noise >> 16) % 40,
        errors_per_10k: base.errors_per_10k + (noise >> 24) % 3,
        rps,
    };
    for (svc, ns, from, to, p50, p99, errors) in METRIC_INCIDENTS {
        if svc == service && ns == namespace && (from..to).contains(&index) {
            s.p50_ms += p50;
            s.p99_ms += p99;
            s.errors_per_10k += errors;
        }
    }
    s
}

/// Appends sample `index` of `instance` as one CSV row.
pub(super) fn write_row(out: &mut String, instance: usize, index: u64) {
    let (service, namespace) = instance_of(instance);
    let s = sample(instance, index);
    let _ = writeln!(
        out,
        "{},{},{},{},{},{}.{:04},{}",
        METRICS_START_UNIX + index * METRICS_STEP_SECS,
        service,
        namespace,
        s.p50_ms,
        s.p99_ms,
        s.errors_per_10k / 10_000,
        s.errors_per_10k % 10_000,
        s.rps
    );
}

fn build_series(instance: usize) -> Series {
    let mut csv = String::with_capacity(METRICS_CSV_HEADER.len() + 1 + CACHED_POINTS * 48);
    csv.push_str(METRICS_CSV_HEADER);
    csv.push('\n');
    let mut row_ends = Vec::with_capacity(CACHED_POINTS);
    for index in 0..CACHED_POINTS as u64 {
        write_row(&mut csv, instance, index);
        row_ends.push(csv.len());
    }
    Series { csv, row_ends }
}
