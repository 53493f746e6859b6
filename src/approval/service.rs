//! [`Approvals`], the approvals service the firewall shares: it opens the
//! configured backend ([`super::backend`]), reads the clock, and turns every
//! transition a backend made into metrics, log lines, hooks (the audit
//! trail) and webhook notifications. It also keeps the previews approvers
//! see, the URLs it links to, and the sweeper that expires what is due.

use std::fmt;
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use futures_util::FutureExt;
use prometheus_client::registry::Registry;
use serde_json::Value;

use super::backend::ApprovalBackend;
use super::clock::Clock;
use super::metrics::{Metrics, OutcomeLabel};
use super::postgres::PgStore;
use super::store::Store;
use super::{
    rules, webhook, Approval, ApprovalError, ApprovalId, ApprovalsConfig, Approver, CallKey,
    LabelsFn, NewApproval, PreviewFn, PreviewResult, RoundRefused, RunLabel, Status, StoreKind,
    Transition, TransitionHook,
};

/// How long a failed preview is remembered before it is tried again, so a
/// console refreshing every 2 s does not hammer a failing upstream.
const PREVIEW_ERROR_TTL: Duration = Duration::from_secs(15);
/// Longest a preview call may take before it is reported as failed.
const PREVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the sweeper journals expiries and compacts.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

type PreviewSlot = Arc<tokio::sync::Mutex<Option<(Instant, PreviewResult)>>>;

/// The approvals subsystem, shared via `Arc`. Every method is safe to call
/// concurrently, from any replica when the store is PostgreSQL. The ones the
/// request path calls ([`Approvals::request`], [`Approvals::consume`]) cost a
/// lock and a lookup (file) or one statement (PostgreSQL) unless they change
/// state.
pub struct Approvals {
    cfg: ApprovalsConfig,
    /// Where approvals live: a journal in `store_dir` (this replica only) or
    /// PostgreSQL (every replica).
    backend: Box<dyn ApprovalBackend>,
    clock: Clock,
    metrics: Metrics,
    hooks: RwLock<Vec<TransitionHook>>,
    preview: RwLock<Option<PreviewFn>>,
    labels: RwLock<Option<LabelsFn>>,
    previews: dashmap::DashMap<ApprovalId, PreviewSlot>,
    public_url: ArcSwap<String>,
    webhook: Option<webhook::Webhook>,
}

impl fmt::Debug for Approvals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Approvals")
            .field("store", &self.cfg.store)
            .field("pending", &self.pending())
            .finish_non_exhaustive()
    }
}

/// Opens the backend `cfg` names (`now` and `history_ms` for the journal's
/// replay).
async fn open_backend(
    cfg: &ApprovalsConfig,
    now: u64,
    history_ms: u64,
) -> anyhow::Result<Box<dyn ApprovalBackend>> {
    Ok(match cfg.store {
        StoreKind::File => {
            let dir = cfg.store_dir.clone();
            // Replay reads and fsyncs files: off the runtime's worker threads.
            let store = tokio::task::spawn_blocking(move || Store::open(&dir, now, history_ms))
                .await
                .map_err(|e| anyhow::anyhow!("approvals store replay task failed: {e}"))??;
            Box::new(store)
        }
        StoreKind::Postgres => Box::new(PgStore::open(cfg).await?),
    })
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
        let history_ms = cfg.history_s.saturating_mul(1000);
        let backend = open_backend(cfg, clock.now_ms(), history_ms).await?;
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

    /// Now by the subsystem's clock, ms since the epoch (what "expired"
    /// is judged against).
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The file store (tests; panics on another backend).
    #[cfg(test)]
    pub(crate) fn file_store(&self) -> &Store {
        self.backend
            .as_any()
            .downcast_ref::<Store>()
            .expect("not a file store")
    }

    /// Pending approvals (as of the last sweep for PostgreSQL).
    pub fn pending(&self) -> usize {
        self.backend.pending()
    }

    /// Whether the shared store cannot be asked now (for `/readyz`).
    pub fn unavailable(&self) -> bool {
        self.backend.unavailable()
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
        let result = self
            .backend
            .request(new, now, expiry_ms, max, &mut transitions)
            .await;
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
        let approval = match self.backend.consume(key, now, &mut transitions).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "cannot consume an approval; the call does not run");
                None
            }
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
        self.backend.spend_round(tenant, id, round, now).await
    }

    /// Withdraws the live approval `id` of `tenant` (its call was cancelled
    /// by the caller before it ran): it can no longer be decided or
    /// consumed. Returns it when it was live.
    pub async fn withdraw(&self, tenant: &str, id: &ApprovalId) -> Option<Approval> {
        let now = self.clock.now_ms();
        let mut transitions = Vec::new();
        let approval = match self
            .backend
            .withdraw(tenant, id, now, &mut transitions)
            .await
        {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(approval = %id, error = %e, "cannot withdraw an approval; it expires at its deadline");
                None
            }
        };
        self.emit(&transitions);
        approval
    }

    /// Withdraws from a synchronous caller (a drop guard): at once with the
    /// file store, on a task with PostgreSQL.
    pub fn withdraw_now_or_soon(self: &Arc<Self>, tenant: &str, id: &ApprovalId) {
        if self.backend.blocking() {
            // The backend works in the call: the future is complete when
            // first polled, so this withdraws now.
            let _ = self.withdraw(tenant, id).now_or_never();
            return;
        }
        let me = self.clone();
        let (tenant, id) = (tenant.to_owned(), id.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                me.withdraw(&tenant, &id).await;
            });
        }
    }

    /// Resolves when the approval leaves `pending` (whichever replica
    /// decided it), at its deadline, or at `until`, whichever is first,
    /// returning its status then. An unknown id reads as expired (purged
    /// approvals are long past their deadline).
    pub async fn wait(&self, id: &ApprovalId, until: Instant) -> Status {
        let now = self.clock.now_ms();
        let subscribed = match self.backend.subscribe(id, now).await {
            Ok(sub) => sub,
            // Unknown while the database is down: still pending as far
            // as anyone can tell; the hold ends at `until`.
            Err(_) => {
                tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
                return self.status(id).await.unwrap_or(Status::Pending);
            }
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
        self.backend.status(id.as_str(), now).await.ok().flatten()
    }

    /// One approval of `tenant`; another tenant's id reads as absent.
    pub async fn get(&self, tenant: &str, id: &str) -> Result<Option<Approval>, ApprovalError> {
        let now = self.clock.now_ms();
        self.backend.get(tenant, id, now).await
    }

    /// The tenant's approvals (optionally of one status), newest first;
    /// from every replica with PostgreSQL.
    pub async fn list(
        &self,
        tenant: &str,
        status: Option<Status>,
    ) -> Result<Vec<Approval>, ApprovalError> {
        let now = self.clock.now_ms();
        self.backend.list(tenant, status, now).await
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
        rules::check_decision(tenant, id, by, approve, reason)?;
        let now = self.clock.now_ms();
        let mut transitions = Vec::new();
        let result = self
            .backend
            .decide(id, by, approve, reason, now, &mut transitions)
            .await;
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
        let transitions = self
            .backend
            .sweep(now, history_ms)
            .await
            .unwrap_or_default();
        self.forget_previews(now).await;
        self.metrics.pending.set(self.pending() as i64);
        self.set_oldest_pending(now);
        self.emit(&transitions);
    }

    /// Drops the previews of approvals no longer pending: previews are only
    /// shown while pending.
    async fn forget_previews(&self, now: u64) {
        if self.previews.is_empty() {
            return;
        }
        let ids: Vec<ApprovalId> = self.previews.iter().map(|e| e.key().clone()).collect();
        for id in ids {
            let status = self.backend.status(id.as_str(), now).await.ok().flatten();
            if status != Some(Status::Pending) {
                self.previews.remove(&id);
            }
        }
    }

    /// The oldest pending approval's age, for the dashboard.
    fn set_oldest_pending(&self, now: u64) {
        let oldest = self.backend.oldest_pending_ms(now);
        let age_s = oldest.map_or(0, |created| now.saturating_sub(created) / 1000);
        self.metrics
            .oldest_pending_age
            .set(i64::try_from(age_s).unwrap_or(i64::MAX));
    }

    /// Hands transitions to metrics, waiters are already woken by the store,
    /// then hooks and the webhook.
    fn emit(&self, transitions: &[Transition]) {
        if transitions.is_empty() {
            return;
        }
        self.metrics.pending.set(self.pending() as i64);
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

/// Sweeps every [`SWEEP_INTERVAL`] until the last `Arc` is dropped.
async fn sweeper(approvals: Weak<Approvals>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(a) = approvals.upgrade() else {
            return;
        };
        if a.backend.blocking() {
            // Compaction fsyncs: keep it off the async workers.
            let rt = tokio::runtime::Handle::current();
            let _ = tokio::task::spawn_blocking(move || rt.block_on(a.sweep())).await;
        } else {
            a.sweep().await;
        }
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
pub(super) mod tests;
