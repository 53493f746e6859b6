//! Human approval gates: a `tools/call` behind an `approve` gate waits until a
//! person approves **that exact call**.
//!
//! The request path calls [`Approvals::request`] (a pending approval bound to
//! the run, the tool and the SHA-256 of the canonical arguments),
//! [`Approvals::wait`] while it holds the call, and [`Approvals::consume`]
//! before the call finally runs. The approver's side is [`api`] (admin HTTP
//! API and the [`console`] page), [`client`] (the CLI) and [`webhook`]
//! (notifications).
//!
//! Invariants:
//! - an approval id carries 128 bits from the OS RNG and is only ever
//!   resolved within its tenant: another tenant's id is indistinguishable
//!   from one that does not exist;
//! - status moves `pending → approved | denied | expired`, `approved →
//!   consumed | expired`, nothing else; every move is atomic (one lock) and
//!   durable (journaled and fsynced by [`store`]) before anyone observes it;
//! - an approval never outlives the tool token of the call it approves, and
//!   is consumed at most once, so one human "yes" runs one call;
//! - expiry is decided by the clock on every read, whether or not the
//!   background sweeper has journaled it yet.
#![deny(missing_docs)]

use std::fmt;
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use prometheus_client::registry::Registry;
use serde_json::Value;

pub mod api;
pub mod client;
mod config;
pub mod console;
mod error;
mod metrics;
mod model;
pub(crate) mod postgres;
pub mod store;
pub mod webhook;

use store::Store;

pub use config::*;
pub use error::*;
use metrics::{Metrics, OutcomeLabel};
pub use model::*;

/// How long a failed preview is remembered before it is tried again, so a
/// console refreshing every 2 s does not hammer a failing upstream.
const PREVIEW_ERROR_TTL: Duration = Duration::from_secs(15);
/// Longest a preview call may take before it is reported as failed.
const PREVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the sweeper journals expiries and compacts.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Longest reason an approver may give, in bytes.
pub const MAX_REASON_BYTES: usize = 2000;

// ---------------------------------------------------------------------------
// The subsystem

/// The subsystem's notion of now. Tests move a manual clock to cross
/// deadlines without sleeping.
#[derive(Clone)]
pub(crate) enum Clock {
    System,
    #[cfg(any(test, feature = "fault-injection"))]
    Manual(Arc<std::sync::atomic::AtomicU64>),
}

impl Clock {
    pub(crate) fn now_ms(&self) -> u64 {
        match self {
            // A clock before 1970 reads as 0: everything looks young, which
            // only delays expiry until the clock is fixed.
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            #[cfg(any(test, feature = "fault-injection"))]
            Clock::Manual(ms) => ms.load(std::sync::atomic::Ordering::SeqCst),
        }
    }
}

type PreviewSlot = Arc<tokio::sync::Mutex<Option<(Instant, PreviewResult)>>>;

/// The approvals subsystem, shared via `Arc`. Every method is safe to call
/// concurrently, from any replica when the store is PostgreSQL. The ones the
/// request path calls ([`Approvals::request`], [`Approvals::consume`]) cost a
/// lock and a lookup (file) or one statement (PostgreSQL) unless they change
/// state.
pub struct Approvals {
    cfg: ApprovalsConfig,
    backend: Backend,
    clock: Clock,
    metrics: Metrics,
    hooks: RwLock<Vec<TransitionHook>>,
    preview: RwLock<Option<PreviewFn>>,
    labels: RwLock<Option<LabelsFn>>,
    previews: dashmap::DashMap<ApprovalId, PreviewSlot>,
    public_url: ArcSwap<String>,
    webhook: Option<webhook::Webhook>,
}

/// Where approvals live.
enum Backend {
    /// A journal in `store_dir`, this replica only.
    File(Box<Store>),
    /// PostgreSQL, every replica.
    Postgres(postgres::PgStore),
}

impl fmt::Debug for Approvals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Approvals")
            .field("store", &self.cfg.store)
            .field("pending", &self.pending())
            .finish_non_exhaustive()
    }
}

impl Approvals {
    /// Validates `cfg`, opens the store (replaying and compacting the
    /// journal in `store_dir`, or migrating the PostgreSQL schema),
    /// registers the metrics and starts the sweeper and the webhook sender.
    /// Must run inside a Tokio runtime; the background tasks stop when the
    /// last `Arc` is dropped.
    pub async fn open(
        cfg: &ApprovalsConfig,
        registry: &mut Registry,
    ) -> anyhow::Result<Arc<Approvals>> {
        Self::open_with_clock(cfg, registry, Clock::System).await
    }

    /// [`Approvals::open`] on a clock the caller moves (milliseconds since
    /// the epoch), so the test suite crosses expiries without sleeping. Test
    /// builds only (feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub async fn open_with_manual_clock(
        cfg: &ApprovalsConfig,
        registry: &mut Registry,
        now_ms: Arc<std::sync::atomic::AtomicU64>,
    ) -> anyhow::Result<Arc<Approvals>> {
        Self::open_with_clock(cfg, registry, Clock::Manual(now_ms)).await
    }

    pub(crate) async fn open_with_clock(
        cfg: &ApprovalsConfig,
        registry: &mut Registry,
        clock: Clock,
    ) -> anyhow::Result<Arc<Approvals>> {
        cfg.validate()?;
        let metrics = Metrics::register(registry);
        let now = clock.now_ms();
        let history_ms = cfg.history_s.saturating_mul(1000);
        let backend = match cfg.store {
            StoreKind::File => {
                let dir = cfg.store_dir.clone();
                // Replay reads and fsyncs files: off the runtime's worker threads.
                let store = tokio::task::spawn_blocking(move || Store::open(&dir, now, history_ms))
                    .await
                    .map_err(|e| anyhow::anyhow!("approvals store replay task failed: {e}"))??;
                Backend::File(Box::new(store))
            }
            StoreKind::Postgres => Backend::Postgres(postgres::PgStore::open(cfg).await?),
        };
        let webhook = cfg
            .webhook
            .as_ref()
            .map(|w| webhook::Webhook::start(w, metrics.clone()))
            .transpose()?;
        let public_url = cfg
            .public_url
            .clone()
            .unwrap_or_else(|| "http://127.0.0.1:9090".to_owned());
        let approvals = Arc::new(Approvals {
            cfg: cfg.clone(),
            backend,
            clock,
            metrics,
            hooks: RwLock::new(Vec::new()),
            preview: RwLock::new(None),
            labels: RwLock::new(None),
            previews: dashmap::DashMap::new(),
            public_url: ArcSwap::from_pointee(public_url.trim_end_matches('/').to_owned()),
            webhook,
        });
        approvals.metrics.pending.set(approvals.pending() as i64);
        tokio::spawn(sweeper(Arc::downgrade(&approvals)));
        Ok(approvals)
    }

    /// The configuration it was opened with (the proxy reads `hold_s`,
    /// `progress_interval_s`, `self_approval_default`).
    pub fn config(&self) -> &ApprovalsConfig {
        &self.cfg
    }

    /// The file store (tests).
    #[cfg(test)]
    pub(crate) fn file_store(&self) -> &Store {
        match &self.backend {
            Backend::File(s) => s,
            Backend::Postgres(_) => panic!("not a file store"),
        }
    }

    /// Pending approvals (as of the last sweep for PostgreSQL).
    pub fn pending(&self) -> usize {
        match &self.backend {
            Backend::File(s) => s.pending(),
            Backend::Postgres(p) => p.pending(),
        }
    }

    /// Whether the shared store cannot be asked now (for `/readyz`).
    pub fn unavailable(&self) -> bool {
        match &self.backend {
            Backend::File(_) => false,
            Backend::Postgres(p) => p.unavailable(),
        }
    }

    /// Sets the admin listener's external base URL when the config gave
    /// none (the firewall knows it once the listener is bound).
    pub fn set_public_url(&self, base: &str) {
        self.public_url
            .store(Arc::new(base.trim_end_matches('/').to_owned()));
    }

    /// Adds a hook that sees every transition this replica made, after it
    /// is durable (the audit trail). Hooks run on the caller's thread,
    /// outside any lock; they must be quick.
    pub fn on_transition(&self, hook: TransitionHook) {
        if let Ok(mut hooks) = self.hooks.write() {
            hooks.push(hook);
        }
    }

    /// Sets how previews are computed.
    pub fn set_preview(&self, f: PreviewFn) {
        if let Ok(mut p) = self.preview.write() {
            *p = Some(f);
        }
    }

    /// Sets how the labels a run holds now are read (the request path's
    /// store), for the card of an approval of that run.
    pub fn set_labels(&self, f: LabelsFn) {
        if let Ok(mut l) = self.labels.write() {
            *l = Some(f);
        }
    }

    /// The labels the approval's run holds now, each with what brought it
    /// in: the card shows them, so a person deciding sees what the run took
    /// in since the call was held (the call is judged against them again
    /// when it is released).
    pub fn run_labels(&self, key: &CallKey) -> Vec<RunLabel> {
        let f = self.labels.read().ok().and_then(|l| l.clone());
        f.map(|f| f(&key.tenant, &key.run_id)).unwrap_or_default()
    }

    /// The pending or approved approval for exactly this call, or a new
    /// pending one. Idempotent for identical calls, across replicas with
    /// PostgreSQL: retries of a held call find the same approval.
    pub async fn request(&self, new: NewApproval) -> Result<Approval, ApprovalError> {
        let now = self.clock.now_ms();
        let expiry_ms = self.cfg.expiry_s.saturating_mul(1000);
        let max = self.cfg.max_pending_per_tenant;
        let mut transitions = Vec::new();
        let result = match &self.backend {
            Backend::File(s) => s.request(new, now, expiry_ms, max, &mut transitions),
            Backend::Postgres(p) => p.request(new, now, expiry_ms, max, &mut transitions).await,
        };
        self.emit(&transitions);
        result
    }

    /// If an approved, unconsumed, unexpired approval exists for exactly this
    /// call, marks it consumed (durably) and returns it. Exactly once: of
    /// concurrent identical calls, on any replica, one gets it. A store
    /// failure returns `None` (the call does not run).
    pub async fn consume(&self, key: &CallKey) -> Option<Approval> {
        let now = self.clock.now_ms();
        let mut transitions = Vec::new();
        let approval = match &self.backend {
            Backend::File(s) => s.consume(key, now, &mut transitions),
            Backend::Postgres(p) => match p.consume(key, now, &mut transitions).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot consume an approval; the call does not run");
                    None
                }
            },
        };
        self.emit(&transitions);
        approval
    }

    /// Spends round `round` (1, 2, …) of the consumed approval `id` of
    /// `tenant`: the retry of a multi-round call that carries the state
    /// sealed for that round runs, once. Exactly once across replicas: of
    /// two retries carrying the same state, one gets it; a store failure
    /// refuses it.
    pub async fn spend_round(
        &self,
        tenant: &str,
        id: &ApprovalId,
        round: u32,
    ) -> Result<(), RoundRefused> {
        let now = self.clock.now_ms();
        match &self.backend {
            Backend::File(s) => s.spend_round(tenant, id, round, now),
            Backend::Postgres(p) => p.spend_round(tenant, id, round).await,
        }
    }

    /// Withdraws the live approval `id` of `tenant` (its call was cancelled
    /// by the caller before it ran): it can no longer be decided or
    /// consumed. Returns it when it was live.
    pub async fn withdraw(&self, tenant: &str, id: &ApprovalId) -> Option<Approval> {
        let now = self.clock.now_ms();
        let mut transitions = Vec::new();
        let approval = match &self.backend {
            Backend::File(s) => s.withdraw(tenant, id, now, &mut transitions),
            Backend::Postgres(p) => match p.withdraw(tenant, id, now, &mut transitions).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(approval = %id, error = %e, "cannot withdraw an approval; it expires at its deadline");
                    None
                }
            },
        };
        self.emit(&transitions);
        approval
    }

    /// Withdraws from a synchronous caller (a drop guard): at once with the
    /// file store, on a task with PostgreSQL.
    pub fn withdraw_now_or_soon(self: &Arc<Self>, tenant: &str, id: &ApprovalId) {
        match &self.backend {
            Backend::File(s) => {
                let mut transitions = Vec::new();
                s.withdraw(tenant, id, self.clock.now_ms(), &mut transitions);
                self.emit(&transitions);
            }
            Backend::Postgres(_) => {
                let me = self.clone();
                let (tenant, id) = (tenant.to_owned(), id.clone());
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        me.withdraw(&tenant, &id).await;
                    });
                }
            }
        }
    }

    /// Resolves when the approval leaves `pending` (whichever replica
    /// decided it), at its deadline, or at `until`, whichever is first,
    /// returning its status then. An unknown id reads as expired (purged
    /// approvals are long past their deadline).
    pub async fn wait(&self, id: &ApprovalId, until: Instant) -> Status {
        let now = self.clock.now_ms();
        let subscribed = match &self.backend {
            Backend::File(s) => s.subscribe(id, now),
            Backend::Postgres(p) => match p.subscribe(id, now).await {
                Ok(sub) => sub,
                // Unknown while the database is down: still pending as far
                // as anyone can tell; the hold ends at `until`.
                Err(_) => {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
                    return self.status(id).await.unwrap_or(Status::Pending);
                }
            },
        };
        let (mut rx, expires_ms) = match subscribed {
            Ok(sub) => sub,
            Err(status) => return status,
        };
        let to_expiry = Duration::from_millis(expires_ms.saturating_sub(now));
        let deadline =
            tokio::time::Instant::from_std(until).min(tokio::time::Instant::now() + to_expiry);
        loop {
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let status = *rx.borrow_and_update();
                    if status != Status::Pending {
                        return status;
                    }
                }
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        self.status(id).await.unwrap_or(Status::Expired)
    }

    /// The status of `id` now, any tenant; `None` when unknown or when the
    /// store cannot be asked.
    async fn status(&self, id: &ApprovalId) -> Option<Status> {
        let now = self.clock.now_ms();
        match &self.backend {
            Backend::File(s) => s.status(id.as_str(), now),
            Backend::Postgres(p) => p.status(id.as_str(), now).await.ok().flatten(),
        }
    }

    /// One approval of `tenant`; another tenant's id reads as absent.
    pub async fn get(&self, tenant: &str, id: &str) -> Result<Option<Approval>, ApprovalError> {
        let now = self.clock.now_ms();
        match &self.backend {
            Backend::File(s) => Ok(s.get(tenant, id, now)),
            Backend::Postgres(p) => p.get(tenant, id, now).await,
        }
    }

    /// The tenant's approvals (optionally of one status), newest first;
    /// from every replica with PostgreSQL.
    pub async fn list(
        &self,
        tenant: &str,
        status: Option<Status>,
    ) -> Result<Vec<Approval>, ApprovalError> {
        let now = self.clock.now_ms();
        match &self.backend {
            Backend::File(s) => Ok(s.list(tenant, status, now)),
            Backend::Postgres(p) => p.list(tenant, status, now).await,
        }
    }

    /// Approves or denies a pending approval of the approver's tenant.
    /// Refuses: another tenant's or unknown id ([`ApprovalError::NotFound`]),
    /// the requester deciding without `self_approval`
    /// ([`ApprovalError::SelfApproval`]), not pending
    /// ([`ApprovalError::NotPending`]), past the deadline
    /// ([`ApprovalError::Expired`]), a denial without reason.
    pub async fn decide(
        &self,
        tenant: &str,
        id: &str,
        by: &Approver,
        approve: bool,
        reason: &str,
    ) -> Result<Approval, ApprovalError> {
        if by.tenant != tenant {
            return Err(ApprovalError::NotFound { id: id.to_owned() });
        }
        check_reason(approve, reason)?;
        let now = self.clock.now_ms();
        let mut transitions = Vec::new();
        let result = match &self.backend {
            Backend::File(s) => s.decide(id, by, approve, reason, now, &mut transitions),
            Backend::Postgres(p) => {
                p.decide(id, by, approve, reason, now, &mut transitions)
                    .await
            }
        };
        self.emit(&transitions);
        result
    }

    /// Where the approval's status is served on the admin listener.
    pub fn status_url(&self, id: &ApprovalId) -> String {
        format!("{}/approvals/{id}", self.public_url.load())
    }

    /// Sends another event through the approvals webhook, if one is
    /// configured (never waits). `delivery_id` stays the same across
    /// retries.
    pub fn notify(&self, event: &'static str, delivery_id: String, body: Value) {
        if let Some(w) = &self.webhook {
            w.notify_event(event, delivery_id, &body);
        }
    }

    /// The console page (for links to its other sections).
    pub fn console_url_base(&self) -> String {
        format!("{}/console", self.public_url.load())
    }

    /// The console page focused on the approval (for a person).
    pub fn console_url(&self, id: &ApprovalId) -> String {
        format!("{}/console#{id}", self.public_url.load())
    }

    /// The preview of a pending approval: `None` when it names no preview
    /// tool, no preview function is set, or it is no longer pending (its
    /// effect is history). Computed once per approval and cached; a failure
    /// is cached for 15 s, a slow preview fails after 10 s.
    pub async fn preview(&self, approval: &Approval, opened_by: &str) -> Option<PreviewResult> {
        let tool = approval.preview_tool.as_ref()?;
        if approval.status_at(self.clock.now_ms()) != Status::Pending {
            return None;
        }
        let f = self.preview.read().ok()?.clone()?;
        let slot = self
            .previews
            .entry(approval.id.clone())
            .or_default()
            .clone();
        // One computation per approval at a time: concurrent viewers wait
        // for the first one's result.
        let mut cached = slot.lock().await;
        if let Some((at, result)) = cached.as_ref() {
            if result.is_ok() || at.elapsed() < PREVIEW_ERROR_TTL {
                return Some(result.clone());
            }
        }
        let result = match tokio::time::timeout(PREVIEW_TIMEOUT, f(approval, opened_by)).await {
            Ok(Ok(v)) => Ok(Arc::new(v)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!(
                "preview tool {tool} did not answer within {} s",
                PREVIEW_TIMEOUT.as_secs()
            )),
        };
        *cached = Some((Instant::now(), result.clone()));
        Some(result)
    }

    /// Records expiries that are due, forgets old history, compacts the
    /// journal when it has grown; the sweeper calls it every second. With
    /// PostgreSQL, each due expiry is made (and emitted) by one replica.
    pub async fn sweep(&self) {
        let now = self.clock.now_ms();
        let history_ms = self.cfg.history_s.saturating_mul(1000);
        let transitions = match &self.backend {
            Backend::File(_) => return self.sweep_file(),
            Backend::Postgres(p) => {
                let t = p.sweep(now, history_ms).await.unwrap_or_default();
                if !self.previews.is_empty() {
                    let ids: Vec<ApprovalId> =
                        self.previews.iter().map(|e| e.key().clone()).collect();
                    for id in ids {
                        if p.status(id.as_str(), now).await.ok().flatten() != Some(Status::Pending)
                        {
                            self.previews.remove(&id);
                        }
                    }
                }
                t
            }
        };
        self.metrics.pending.set(self.pending() as i64);
        self.set_oldest_pending(now);
        self.emit(&transitions);
    }

    /// The oldest pending approval's age, for the dashboard.
    fn set_oldest_pending(&self, now: u64) {
        let oldest = match &self.backend {
            Backend::File(s) => s.oldest_pending_ms(now),
            Backend::Postgres(p) => p.oldest_pending_ms(),
        };
        let age_s = oldest.map_or(0, |created| now.saturating_sub(created) / 1000);
        self.metrics
            .oldest_pending_age
            .set(i64::try_from(age_s).unwrap_or(i64::MAX));
    }

    /// [`Approvals::sweep`] of the file store (blocking: it may compact).
    fn sweep_file(&self) {
        let Backend::File(s) = &self.backend else {
            return;
        };
        let now = self.clock.now_ms();
        let transitions = s.sweep(now, self.cfg.history_s.saturating_mul(1000));
        self.set_oldest_pending(now);
        // Previews are only shown while pending.
        self.previews
            .retain(|id, _| s.status(id.as_str(), now) == Some(Status::Pending));
        self.emit(&transitions);
    }

    /// Hands transitions to metrics, waiters are already woken by the store,
    /// then hooks and the webhook.
    fn emit(&self, transitions: &[Transition]) {
        if transitions.is_empty() {
            return;
        }
        if let Backend::File(s) = &self.backend {
            self.metrics.pending.set(s.pending() as i64);
        }
        let hooks = self.hooks.read().ok();
        for t in transitions {
            match t.to {
                Status::Pending => {
                    self.metrics.created.inc();
                }
                other => {
                    self.metrics
                        .decisions
                        .get_or_create(&OutcomeLabel {
                            outcome: other.as_str(),
                        })
                        .inc();
                }
            }
            tracing::info!(
                approval = %t.approval.id,
                tenant = %t.approval.key.tenant,
                run = %t.approval.key.run_id,
                tool = %t.approval.key.tool,
                from = t.from.map_or("none", Status::as_str),
                to = %t.to,
                by = t.approval.decision.as_ref().map_or("", |d| d.by.as_str()),
                "approval transition"
            );
            if let Some(hooks) = &hooks {
                for hook in hooks.iter() {
                    hook(t);
                }
            }
            if let Some(w) = &self.webhook {
                if t.to != Status::Consumed {
                    w.notify(
                        t,
                        &self.status_url(&t.approval.id),
                        &self.console_url(&t.approval.id),
                    );
                }
            }
        }
    }
}

/// Creates or upgrades the PostgreSQL schema of `cfg`; returns its version.
pub async fn migrate(cfg: &ApprovalsConfig) -> anyhow::Result<u32> {
    postgres::migrate(cfg).await
}

/// Connects to the PostgreSQL store of `cfg` and reads its schema version
/// (0: not created yet), changing nothing.
pub async fn probe(cfg: &ApprovalsConfig) -> anyhow::Result<u32> {
    postgres::probe(cfg).await
}

fn check_reason(approve: bool, reason: &str) -> Result<(), ApprovalError> {
    if !approve && reason.trim().is_empty() {
        return Err(ApprovalError::ReasonRequired);
    }
    if reason.len() > MAX_REASON_BYTES {
        return Err(ApprovalError::ReasonTooLong {
            len: reason.len(),
            max: MAX_REASON_BYTES,
        });
    }
    if reason
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(ApprovalError::ReasonControlCharacter);
    }
    Ok(())
}

async fn sweeper(approvals: Weak<Approvals>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(a) = approvals.upgrade() else {
            return;
        };
        match a.backend {
            // Compaction fsyncs: keep it off the async workers.
            Backend::File(_) => {
                let _ = tokio::task::spawn_blocking(move || a.sweep_file()).await;
            }
            Backend::Postgres(_) => a.sweep().await,
        }
    }
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
