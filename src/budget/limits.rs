//! The `[limits]` section and the budgets it builds: rate limits per address,
//! tenant, run and tool, per-run step and cost caps, reservations and settling.

use super::*;
use crate::outcome::StopReason;
use crate::policy::Risk;
use crate::state::{Fallback, OnUnavailable};
use dashmap::DashMap;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use serde::Deserialize;
use std::hash::{BuildHasher, Hash};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

pub(super) type Keyed<K, C> =
    RateLimiter<K, DashMapStateStore<K>, C, NoOpMiddleware<<C as Clock>::Instant>>;
/// Keyed limiters by their rate (roles and upstreams choose rates).
pub(super) type ByRate<K, C> = DashMap<u32, Arc<Keyed<K, C>>>;
/// A run, as a keyed 64-bit hash of (tenant, run id): budget state for a
/// million runs must fit in memory, and strings would triple it. The hash is
/// keyed per process (SipHash with a random key), so run ids cannot be chosen
/// to collide.
pub(super) type RunKey = u64;

/// `[limits]`: defaults for every run; roles and upstreams refine them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Requests per second per client IP, checked before token verification
    /// (protects the CPU spent on signatures). Default 1000; 0 disables.
    #[serde(default = "default_per_ip")]
    pub per_ip_per_s: u32,
    /// `tools/call` per second per tenant. Default 200; 0 disables.
    #[serde(default = "default_per_tenant")]
    pub per_tenant_per_s: u32,
    /// `tools/call` per second per run (roles may set `calls_per_s`). Default 20.
    #[serde(default = "default_per_run")]
    pub per_run_per_s: u32,
    /// `tools/call` per second per run and tool. Default 10.
    #[serde(default = "default_per_run_tool")]
    pub per_run_tool_per_s: u32,
    /// Most `tools/call` per run unless the role says otherwise. Default 8.
    #[serde(default = "default_max_steps")]
    pub default_max_steps: u32,
    /// Largest total price per run unless the role says otherwise. Default: none.
    pub default_max_cost: Option<f64>,
    /// Largest total price per tenant per UTC day. Default: none.
    pub tenant_daily_cost: Option<f64>,
    /// The `_meta` key under which an upstream may report a call's actual cost.
    #[serde(default = "default_cost_key")]
    pub cost_meta_key: String,
    /// How long a run's steps and cost are kept after its last call,
    /// independent of its tokens' expiry. Default 86 400 (24 h).
    #[serde(default = "default_run_state_ttl_s")]
    pub run_state_ttl_s: u64,
    /// Most runs tracked at once; past it the longest idle are evicted.
    /// Default 1 000 000.
    #[serde(default = "default_max_tracked_runs")]
    pub max_tracked_runs: usize,
}

pub(super) fn default_per_ip() -> u32 {
    1000
}
pub(super) fn default_per_tenant() -> u32 {
    200
}
pub(super) fn default_per_run() -> u32 {
    20
}
pub(super) fn default_per_run_tool() -> u32 {
    10
}
pub(super) fn default_max_steps() -> u32 {
    8
}
pub(super) fn default_cost_key() -> String {
    "mcp-firewall/cost".to_owned()
}
pub(super) fn default_run_state_ttl_s() -> u64 {
    86_400
}
pub(super) fn default_max_tracked_runs() -> usize {
    1_000_000
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            per_ip_per_s: default_per_ip(),
            per_tenant_per_s: default_per_tenant(),
            per_run_per_s: default_per_run(),
            per_run_tool_per_s: default_per_run_tool(),
            default_max_steps: default_max_steps(),
            default_max_cost: None,
            tenant_daily_cost: None,
            cost_meta_key: default_cost_key(),
            run_state_ttl_s: default_run_state_ttl_s(),
            max_tracked_runs: default_max_tracked_runs(),
        }
    }
}

/// One `tools/call` asking for budget.
#[derive(Debug, Clone)]
pub struct CallBudget<'a> {
    /// Tenant.
    pub tenant: &'a str,
    /// Run.
    pub run: &'a str,
    /// Upstream name.
    pub upstream: &'a str,
    /// Tool name.
    pub tool: &'a str,
    /// When the token says the run ends (`run_exp`, seconds since the
    /// epoch), if it does.
    pub run_exp: Option<u64>,
    /// Price of this call.
    pub price: f64,
    /// Step cap for the run (role or default).
    pub max_steps: u32,
    /// Cost cap for the run, if any.
    pub max_cost: Option<f64>,
    /// Per-run rate for the role, if it overrides the default.
    pub run_per_s: Option<u32>,
    /// The upstream's own rate limit, if configured.
    pub upstream_per_s: Option<u32>,
}

/// Why a call is not executed.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// Over a rate limit; retry after the duration.
    RateLimited {
        /// `tenant`, `upstream`, `run` or `run_tool`.
        scope: &'static str,
        /// When a retry can succeed.
        retry_after: Duration,
    },
    /// The run used all its steps.
    StepCap {
        /// Steps used.
        used: u32,
        /// The cap.
        max: u32,
    },
    /// The run has ended (`run_exp`).
    RunEnded {
        /// When, seconds since the epoch.
        at_s: u64,
    },
    /// The shared budget store cannot be asked and the call's risk is
    /// configured `closed` (`[state] on_store_unavailable`).
    Unavailable {
        /// Why.
        why: String,
    },
    /// The call's price would pass a cost cap.
    CostCap {
        /// `run` or `tenant_day`.
        scope: &'static str,
        /// Spent (and reserved) so far.
        spent: f64,
        /// This call's price.
        price: f64,
        /// The cap.
        cap: f64,
    },
}

/// A reservation to settle once the call's outcome is known.
#[derive(Debug, Clone)]
pub struct Reservation {
    held: Held,
    /// Steps used by the run including this call.
    pub steps_used: u32,
    /// The run's cap.
    pub max_steps: u32,
    /// Admitted by this replica's memory budgets because the shared store
    /// could not be asked (`on_store_unavailable = "open"`).
    pub fallback: bool,
}

/// Where a reservation is held.
#[derive(Debug, Clone)]
pub(super) enum Held {
    Local(LocalReservation),
    Shared(shared::SharedReservation),
}

/// A reservation in this process's memory.
#[derive(Debug, Clone)]
pub struct LocalReservation {
    run_key: RunKey,
    tenant_day: Option<(String, u32)>,
    price: f64,
    /// Steps used by the run including this call.
    pub steps_used: u32,
}

/// How a reserved call ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Settle {
    /// The upstream may have acted; keep the step. `reported` replaces the
    /// reserved price when the upstream reported its cost.
    Executed {
        /// Cost the upstream reported, if any.
        reported: Option<f64>,
    },
    /// It never reached the upstream: refund step and price.
    NotExecuted,
}

#[derive(Debug, Clone)]
pub(super) struct RunState {
    cost: f64,
    /// The last call (ms since the epoch): the state lives `run_state_ttl_s`
    /// past it.
    last_ms: u64,
    /// The run's end, the earliest `run_exp` seen (ms; `u64::MAX`: none).
    ends_ms: u64,
    steps: u32,
}

/// Budget state in this process: every budget when `[state] backend =
/// "memory"`, and the fallback for calls a shared store cannot admit.
pub struct Local<C: Clock = DefaultClock> {
    cfg: LimitsConfig,
    clock: C,
    now_ms: Arc<dyn Fn() -> u64 + Send + Sync>,
    ttl_ms: u64,
    evicted: std::sync::atomic::AtomicU64,
    ip: Option<Keyed<IpAddr, C>>,
    tenant: Option<Keyed<String, C>>,
    upstream: ByRate<String, C>,
    run: ByRate<RunKey, C>,
    run_tool: Option<Keyed<u64, C>>,
    runs: DashMap<RunKey, RunState>,
    hasher: std::collections::hash_map::RandomState,
    tenant_days: DashMap<(String, u32), f64>,
}

// === impl Local ===

impl Local<DefaultClock> {
    /// Budgets on the real clocks.
    pub fn new(cfg: LimitsConfig) -> Self {
        Local::with_clock(cfg, DefaultClock::default(), Arc::new(unix_ms))
    }
}

impl<C: Clock + Clone> Local<C> {
    /// Budgets on injected clocks: `clock` for rate limits, `now_ms` (Unix
    /// milliseconds) for days and expiry.
    pub fn with_clock(
        cfg: LimitsConfig,
        clock: C,
        now_ms: Arc<dyn Fn() -> u64 + Send + Sync>,
    ) -> Self {
        Local {
            ip: keyed(cfg.per_ip_per_s, &clock),
            tenant: keyed(cfg.per_tenant_per_s, &clock),
            run_tool: keyed(cfg.per_run_tool_per_s, &clock),
            upstream: DashMap::new(),
            run: DashMap::new(),
            runs: DashMap::new(),
            tenant_days: DashMap::new(),
            hasher: std::collections::hash_map::RandomState::new(),
            ttl_ms: cfg.run_state_ttl_s.saturating_mul(1000),
            evicted: std::sync::atomic::AtomicU64::new(0),
            clock,
            now_ms,
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LimitsConfig {
        &self.cfg
    }

    /// The coarse per-IP limit, before anything else is spent on a request.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Duration> {
        match &self.ip {
            Some(l) => l
                .check_key(&ip)
                .map_err(|n| n.wait_time_from(self.clock.now())),
            None => Ok(()),
        }
    }

    /// Rate limits, then step and cost caps; reserves on success.
    pub fn admit(&self, call: &CallBudget<'_>) -> Result<LocalReservation, Refusal> {
        let limited = |scope: &'static str, wait: Duration| Refusal::RateLimited {
            scope,
            retry_after: wait,
        };
        let now = self.clock.now();
        if let Some(l) = &self.tenant {
            l.check_key(&call.tenant.to_owned())
                .map_err(|n| limited("tenant", n.wait_time_from(now)))?;
        }
        if let Some(per_s) = call.upstream_per_s {
            check(
                &self.upstream,
                per_s,
                &call.upstream.to_owned(),
                &self.clock,
            )
            .map_err(|w| limited("upstream", w))?;
        }
        let run_key = self.run_key(call.tenant, call.run);
        let run_rate = call.run_per_s.unwrap_or(self.cfg.per_run_per_s);
        if run_rate > 0 {
            check(&self.run, run_rate, &run_key, &self.clock).map_err(|w| limited("run", w))?;
        }
        if let Some(l) = &self.run_tool {
            let key = self.hasher.hash_one((call.tenant, call.run, call.tool));
            l.check_key(&key)
                .map_err(|n| limited("run_tool", n.wait_time_from(now)))?;
        }

        let now_ms = (self.now_ms)();
        let ends_ms = call.run_exp.map_or(u64::MAX, |s| s.saturating_mul(1000));
        if !self.runs.contains_key(&run_key) {
            // Outside any entry's lock: eviction walks the whole map.
            self.bound_runs();
        }
        let steps_used;
        {
            let mut state = self.runs.entry(run_key).or_insert_with(|| RunState {
                steps: 0,
                cost: 0.0,
                last_ms: now_ms,
                ends_ms,
            });
            state.last_ms = state.last_ms.max(now_ms);
            // The earliest end any token named; none extends it.
            state.ends_ms = state.ends_ms.min(ends_ms);
            if now_ms >= state.ends_ms {
                return Err(Refusal::RunEnded {
                    at_s: state.ends_ms / 1000,
                });
            }
            if state.steps >= call.max_steps {
                return Err(Refusal::StepCap {
                    used: state.steps,
                    max: call.max_steps,
                });
            }
            if let Some(cap) = call.max_cost {
                if state.cost + call.price > cap + f64::EPSILON {
                    return Err(Refusal::CostCap {
                        scope: "run",
                        spent: state.cost,
                        price: call.price,
                        cap,
                    });
                }
            }
            state.steps += 1;
            state.cost += call.price;
            steps_used = state.steps;
        }
        let mut reservation = LocalReservation {
            run_key,
            tenant_day: None,
            price: call.price,
            steps_used,
        };
        if let Some(cap) = self.cfg.tenant_daily_cost {
            let day = (now_ms / 86_400_000) as u32;
            let key = (call.tenant.to_owned(), day);
            let mut spent = self.tenant_days.entry(key.clone()).or_insert(0.0);
            if *spent + call.price > cap + f64::EPSILON {
                let refused = Refusal::CostCap {
                    scope: "tenant_day",
                    spent: *spent,
                    price: call.price,
                    cap,
                };
                drop(spent);
                self.release(&reservation);
                return Err(refused);
            }
            *spent += call.price;
            reservation.tenant_day = Some(key);
        }
        Ok(reservation)
    }

    /// Closes a reservation.
    pub fn settle(&self, r: &LocalReservation, how: Settle) {
        match how {
            Settle::NotExecuted => self.release(r),
            Settle::Executed {
                reported: Some(cost),
            } if cost.is_finite() && cost >= 0.0 => {
                let delta = cost - r.price;
                if let Some(mut s) = self.runs.get_mut(&r.run_key) {
                    s.cost = (s.cost + delta).max(0.0);
                }
                if let Some(k) = &r.tenant_day {
                    if let Some(mut t) = self.tenant_days.get_mut(k) {
                        *t = (*t + delta).max(0.0);
                    }
                }
            }
            Settle::Executed { .. } => {}
        }
    }

    fn release(&self, r: &LocalReservation) {
        if let Some(mut s) = self.runs.get_mut(&r.run_key) {
            s.steps = s.steps.saturating_sub(1);
            s.cost = (s.cost - r.price).max(0.0);
        }
        if let Some(k) = &r.tenant_day {
            if let Some(mut t) = self.tenant_days.get_mut(k) {
                *t = (*t - r.price).max(0.0);
            }
        }
    }

    /// Drops state that can no longer matter: runs idle past their
    /// lifetime, tenant-days older than yesterday, idle limiter keys.
    pub fn sweep(&self) {
        let now = (self.now_ms)();
        let ttl = self.ttl_ms;
        self.runs.retain(|_, s| s.last_ms.saturating_add(ttl) > now);
        self.evict_idlest(self.cfg.max_tracked_runs);
        let today = (now / 86_400_000) as u32;
        self.tenant_days.retain(|(_, day), _| *day + 1 >= today);
        if let Some(l) = &self.ip {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some(l) = &self.tenant {
            l.retain_recent();
        }
        if let Some(l) = &self.run_tool {
            l.retain_recent();
            l.shrink_to_fit();
        }
        for l in self.run.iter() {
            l.retain_recent();
            l.shrink_to_fit();
        }
        self.runs.shrink_to_fit();
    }

    /// Keeps the tracked runs near `max_tracked_runs`: once past it by a
    /// margin (1/64 of the cap), the runs idle the longest are evicted down
    /// to the cap. One pass over the map per margin's worth of new runs.
    fn bound_runs(&self) {
        let cap = self.cfg.max_tracked_runs;
        if self.runs.len() >= cap.saturating_add((cap / 64).max(1)) {
            self.evict_idlest(cap);
        }
    }

    /// Evicts the longest idle runs until at most `cap` remain.
    fn evict_idlest(&self, cap: usize) {
        let evicted = evict_oldest(&self.runs, cap, |s| s.last_ms);
        self.evicted
            .fetch_add(evicted as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs evicted so far to stay under `max_tracked_runs`.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn run_key(&self, tenant: &str, run: &str) -> RunKey {
        self.hasher.hash_one((tenant, run))
    }

    /// Runs currently tracked.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Steps used by a run so far.
    pub fn steps(&self, tenant: &str, run: &str) -> u32 {
        self.runs
            .get(&self.run_key(tenant, run))
            .map_or(0, |s| s.steps)
    }

    /// Cost spent by a run so far.
    pub fn cost(&self, tenant: &str, run: &str) -> f64 {
        self.runs
            .get(&self.run_key(tenant, run))
            .map_or(0.0, |s| s.cost)
    }
}

/// The budgets the request path asks: this process's [`Local`] budgets, or
/// Redis shared by every replica with the local ones as the fallback for
/// risks configured `open` while Redis cannot be asked.
pub struct Budgets {
    local: Local,
    shared: Option<Arc<shared::RedisBudgets>>,
    on_unavailable: OnUnavailable,
    labels: labels::RunLabels,
}

impl Budgets {
    /// Budgets in this process only.
    pub fn new(cfg: LimitsConfig) -> Self {
        Budgets {
            labels: run_labels(&cfg, None),
            local: Local::new(cfg),
            shared: None,
            on_unavailable: OnUnavailable::default(),
        }
    }

    /// Budgets in Redis, falling back to memory per `on_unavailable`.
    pub fn shared(
        cfg: LimitsConfig,
        shared: shared::RedisBudgets,
        on_unavailable: OnUnavailable,
    ) -> Self {
        let shared = Arc::new(shared);
        Budgets {
            labels: run_labels(&cfg, Some(shared.clone())),
            shared: Some(shared),
            local: Local::new(cfg),
            on_unavailable,
        }
    }

    /// Whether calls of `risk` go on (on this replica's memory) while the
    /// shared store cannot be asked (`[state] on_store_unavailable`).
    pub fn open_when_unavailable(&self, risk: Risk) -> bool {
        self.on_unavailable.for_risk(risk) == Fallback::Open
    }

    /// The runs' labels, in the same store.
    pub fn labels(&self) -> &labels::RunLabels {
        &self.labels
    }

    /// The configuration.
    pub fn config(&self) -> &LimitsConfig {
        self.local.config()
    }

    /// The shared store, if budgets are shared.
    pub fn store(&self) -> Option<&Arc<shared::RedisBudgets>> {
        self.shared.as_ref()
    }

    /// This process's budgets (all of them in memory mode).
    pub fn local(&self) -> &Local {
        &self.local
    }

    /// The coarse per-IP limit (always per replica).
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Duration> {
        self.local.check_ip(ip)
    }

    /// Rate limits, then step and cost caps, for a call of `risk`;
    /// reserves on success.
    pub async fn admit(&self, call: &CallBudget<'_>, risk: Risk) -> Result<Reservation, Refusal> {
        let Some(shared) = &self.shared else {
            return self.admit_locally(call, false);
        };
        match shared.admit(call).await {
            Ok(shared::Admitted::Reserved {
                reservation,
                steps_used,
            }) => Ok(Reservation {
                held: Held::Shared(reservation),
                steps_used,
                max_steps: call.max_steps,
                fallback: false,
            }),
            Ok(shared::Admitted::Refused(r)) => Err(r),
            Err(e) => match self.on_unavailable.for_risk(risk) {
                Fallback::Open => {
                    tracing::debug!(error = %e, %risk, "budget store unavailable; admitted by this replica");
                    self.admit_locally(call, true)
                }
                Fallback::Closed => Err(Refusal::Unavailable { why: e.to_string() }),
            },
        }
    }

    fn admit_locally(&self, call: &CallBudget<'_>, fallback: bool) -> Result<Reservation, Refusal> {
        self.local.admit(call).map(|r| Reservation {
            steps_used: r.steps_used,
            held: Held::Local(r),
            max_steps: call.max_steps,
            fallback,
        })
    }

    /// Closes a reservation. A shared one is settled on a task, retried
    /// until Redis takes it (settling is idempotent) for at most a minute;
    /// its handle lets an answer wait for it before it leaves.
    #[must_use = "an answer should wait for its settlement (or drop the handle to not wait)"]
    pub fn settle(&self, r: &Reservation, how: Settle) -> Option<tokio::task::JoinHandle<()>> {
        match &r.held {
            Held::Local(l) => {
                self.local.settle(l, how);
                None
            }
            Held::Shared(s) => {
                let shared = self.shared.clone()?;
                let s = s.clone();
                let rt = tokio::runtime::Handle::try_current().ok()?;
                // Keeping a reservation as charged changes no count: only a
                // refund or a reported cost is worth waiting for.
                let changes_counts = !matches!(how, Settle::Executed { reported: None });
                let task = rt.spawn(async move {
                    let mut wait = Duration::from_millis(20);
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                    loop {
                        match shared.settle(&s, how).await {
                            Ok(_) => return,
                            Err(e) if tokio::time::Instant::now() >= deadline => {
                                tracing::warn!(error = %e, "a budget reservation could not be settled in Redis; it stays charged");
                                return;
                            }
                            Err(_) => {
                                tokio::time::sleep(wait).await;
                                wait = (wait * 2).min(Duration::from_secs(2));
                            }
                        }
                    }
                });
                changes_counts.then_some(task)
            }
        }
    }

    /// [`Budgets::settle`], waiting (at most 250 ms) until it is in.
    pub async fn settle_now(&self, r: &Reservation, how: Settle) {
        if let Some(h) = self.settle(r, how) {
            let _ = tokio::time::timeout(Duration::from_millis(250), h).await;
        }
    }

    /// See [`Local::sweep`].
    pub fn sweep(&self) {
        self.local.sweep();
        self.labels.sweep();
    }

    /// Runs tracked in this process.
    pub fn runs(&self) -> usize {
        self.local.runs()
    }

    /// Runs evicted from this process's memory.
    pub fn evicted(&self) -> u64 {
        self.local.evicted()
    }
}

/// Removes the entries of `map` past `cap` whose `last_ms` is oldest (the
/// longest idle); how many it removed.
pub(crate) fn evict_oldest<K: Eq + Hash + Clone, V>(
    map: &DashMap<K, V>,
    cap: usize,
    last_ms: impl Fn(&V) -> u64,
) -> usize {
    let excess = map.len().saturating_sub(cap);
    if excess == 0 {
        return 0;
    }
    let mut by_age: Vec<(u64, K)> = map
        .iter()
        .map(|e| (last_ms(e.value()), e.key().clone()))
        .collect();
    let excess = excess.min(by_age.len());
    if excess < by_age.len() {
        by_age.select_nth_unstable_by_key(excess, |(age, _)| *age);
    }
    for (_, key) in &by_age[..excess] {
        map.remove(key);
    }
    excess
}

/// The labels' store: the budgets' lifetime and bound.
pub(super) fn run_labels(
    cfg: &LimitsConfig,
    shared: Option<Arc<shared::RedisBudgets>>,
) -> labels::RunLabels {
    labels::RunLabels::new(
        Duration::from_secs(cfg.run_state_ttl_s),
        cfg.max_tracked_runs,
        shared,
    )
}

/// A keyed limiter allowing `per_s` per second (bursts of `per_s`); none for 0.
pub(super) fn keyed<K: Hash + Eq + Clone, C: Clock + Clone>(
    per_s: u32,
    clock: &C,
) -> Option<Keyed<K, C>> {
    NonZeroU32::new(per_s)
        .map(|n| RateLimiter::dashmap_with_clock(Quota::per_second(n), clock.clone()))
}

/// Checks `key` against the limiter for `per_s`, creating it on first use.
pub(super) fn check<K: Hash + Eq + Clone, C: Clock + Clone>(
    limiters: &ByRate<K, C>,
    per_s: u32,
    key: &K,
    clock: &C,
) -> Result<(), Duration> {
    let Some(n) = NonZeroU32::new(per_s) else {
        return Ok(());
    };
    let limiter = match limiters.get(&per_s) {
        Some(l) => l.clone(),
        None => limiters
            .entry(per_s)
            .or_insert_with(|| {
                Arc::new(RateLimiter::dashmap_with_clock(
                    Quota::per_second(n),
                    clock.clone(),
                ))
            })
            .clone(),
    };
    limiter
        .check_key(key)
        .map_err(|n| n.wait_time_from(clock.now()))
}

// === impl Refusal ===

impl Refusal {
    /// The stop reason it records.
    pub fn stop_reason(&self) -> StopReason {
        match self {
            Refusal::RateLimited { .. } => StopReason::RateLimited,
            Refusal::StepCap { .. } => StopReason::StepCap,
            Refusal::RunEnded { .. } => StopReason::RunEnded,
            Refusal::CostCap { .. } => StopReason::CostCap,
            Refusal::Unavailable { .. } => StopReason::StoreUnavailable,
        }
    }

    /// A sentence the agent reads.
    pub fn describe(&self) -> String {
        match self {
            Refusal::RateLimited { scope, retry_after } => format!(
                "rate limit ({scope}) reached; retry in {} ms",
                retry_after.as_millis().max(1)
            ),
            Refusal::StepCap { used, max } => {
                format!("skipped: step_cap ({used} of {max} tool calls used in this run)")
            }
            Refusal::Unavailable { why } => {
                format!("budget store unavailable: {why}; calls of this risk are refused until it is back")
            }
            Refusal::RunEnded { at_s } => {
                format!("skipped: run_ended (the run ended at {at_s}, the end its token set)")
            }
            Refusal::CostCap {
                scope,
                spent,
                price,
                cap,
            } => format!(
                "skipped: cost_cap ({scope}: {spent} spent, this call costs {price}, cap {cap})"
            ),
        }
    }
}

pub(super) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
#[path = "limits_tests.rs"]
mod tests;
