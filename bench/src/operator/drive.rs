//! Driving one target for one round: the users (closed loop: each sends
//! its next request when the last was answered and it thought; open loop:
//! requests due at a rate, latency counted from when each was due), the
//! ramp stages, the rate bound, the run tokens each user moves through,
//! and the live progress line.
//!
//! Invariants: no user sends past the round's end or its answer budget; the
//! total rate never exceeds `--max-rate` (a shared pacer); a user that
//! cannot open its session counts the failure and tries again a moment
//! later, so a target that refuses to start is reported, not hung on.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::client::{Answer, Category, Ids, Outcome, ToolInfo, User};
use super::identity::Identities;
use super::plan::{Action, Arrival, Plan};
use super::summary::Stats;

/// One target as the drivers see it.
pub struct Target {
    /// Its label.
    pub label: String,
    /// Its MCP endpoint.
    pub url: String,
    /// Builds each user's HTTP client (one connection pool per user).
    pub client: Arc<dyn Fn() -> reqwest::Client + Send + Sync>,
    /// The tools it lists (for drawn tools and argument defaults).
    pub tools: Vec<ToolInfo>,
}

/// Shared by the users of a round.
struct Shared {
    plan: Plan,
    target: Target,
    identities: Arc<Identities>,
    ids: Arc<Ids>,
    stats: Mutex<Stats>,
    start: Instant,
    end: Instant,
    answered: AtomicU64,
    /// Position in the mix, shared so the proportions hold overall.
    turn: AtomicU64,
    /// Next free send slot of the rate bound (ns since `start`).
    pacer: AtomicU64,
    pace_ns: u64,
    stop: AtomicBool,
}

impl Shared {
    fn done(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
            || Instant::now() >= self.end
            || self
                .plan
                .requests
                .is_some_and(|n| self.answered.load(Ordering::Relaxed) >= n)
    }

    fn record(&self, at: Instant, answer: &Answer) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.stats.lock() {
            s.record(at.saturating_duration_since(self.start), answer);
        }
    }

    /// Waits for the next slot under `--max-rate`.
    async fn pace(&self) {
        if self.pace_ns == 0 {
            return;
        }
        let now = self.start.elapsed().as_nanos() as u64;
        let mut slot = self.pacer.load(Ordering::Relaxed);
        loop {
            let mine = slot.max(now);
            match self.pacer.compare_exchange_weak(
                slot,
                mine + self.pace_ns,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if mine > now {
                        tokio::time::sleep(Duration::from_nanos(mine - now)).await;
                    }
                    return;
                }
                Err(s) => slot = s,
            }
        }
    }
}

/// A user's session and how many calls it made with its run token.
struct Seat {
    user: Option<User>,
    calls: u64,
    n: u64,
}

/// Runs `plan` against `target` once; returns the round's counts.
pub async fn round(
    plan: &Plan,
    target: Target,
    identities: Arc<Identities>,
    ids: Arc<Ids>,
    progress: bool,
) -> Result<Stats, hdrhistogram::CreationError> {
    let start = Instant::now();
    let shared = Arc::new(Shared {
        plan: plan.clone(),
        target,
        identities,
        ids,
        stats: Mutex::new(Stats::new()?),
        start,
        end: start + plan.duration,
        answered: AtomicU64::new(0),
        turn: AtomicU64::new(0),
        pacer: AtomicU64::new(0),
        pace_ns: (1e9 / plan.bounds.max_rate.max(1e-3)) as u64,
        stop: AtomicBool::new(false),
    });
    let ticker = progress.then(|| tokio::spawn(show_progress(shared.clone())));
    let mut users = Vec::new();
    match plan.arrival.clone() {
        Arrival::Closed { vus, .. } => {
            for i in 0..vus {
                users.push(tokio::spawn(closed_user(shared.clone(), i)));
            }
        }
        Arrival::Open { rate, users: n, .. } => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Instant>(n.max(1) * 2);
            let rx = Arc::new(tokio::sync::Mutex::new(rx));
            for _ in 0..n {
                users.push(tokio::spawn(open_user(shared.clone(), rx.clone())));
            }
            users.push(tokio::spawn(dispatch(shared.clone(), rate, tx)));
        }
    }
    for u in users {
        let _ = u.await;
    }
    shared.stop.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        let _ = t.await;
    }
    let elapsed = start.elapsed();
    let fresh = Stats::new()?;
    let mut stats = {
        let mut guard = shared.stats.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *guard, fresh)
    };
    stats.set_elapsed(elapsed);
    Ok(stats)
}

/// A closed-loop user: send, wait for the answer, think, repeat; idle while
/// the stage's user count is below its index.
async fn closed_user(sh: Arc<Shared>, index: usize) {
    let mut seat = Seat {
        user: None,
        calls: 0,
        n: index as u64,
    };
    let vus = sh.plan.users() as f64;
    while !sh.done() {
        let active = sh.plan.target_at(sh.start.elapsed(), vus);
        if (index as f64) >= active.ceil() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        sh.pace().await;
        if sh.done() {
            break;
        }
        let sent = Instant::now();
        let answer = one(&sh, &mut seat).await;
        sh.record(sent, &answer);
        if !sh.plan.think_time.is_zero() {
            tokio::time::sleep(sh.plan.think_time).await;
        }
    }
    if let Some(u) = seat.user.take() {
        u.close().await;
    }
}

/// Open loop: hands out due times at the (ramped) rate until the end.
async fn dispatch(sh: Arc<Shared>, flat: f64, tx: tokio::sync::mpsc::Sender<Instant>) {
    let mut due = sh.start;
    while !sh.done() {
        let rate = sh
            .plan
            .target_at(due.saturating_duration_since(sh.start), flat)
            .min(sh.plan.bounds.max_rate);
        if rate <= 0.0 {
            due += Duration::from_millis(10);
            tokio::time::sleep_until(due.into()).await;
            continue;
        }
        tokio::time::sleep_until(due.into()).await;
        if tx.send(due).await.is_err() {
            break;
        }
        due += Duration::from_secs_f64(1.0 / rate);
    }
}

/// An open-loop user: takes the next due request, sends it when due, and
/// counts its latency from when it was due.
async fn open_user(
    sh: Arc<Shared>,
    rx: Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Instant>>>,
) {
    let mut seat = Seat {
        user: None,
        calls: 0,
        n: 0,
    };
    loop {
        let due = {
            let mut r = rx.lock().await;
            tokio::select! {
                d = r.recv() => d,
                _ = tokio::time::sleep_until(sh.end.into()) => None,
            }
        };
        let Some(due) = due else { break };
        if sh.done() {
            break;
        }
        let mut answer = one(&sh, &mut seat).await;
        // Latency from when it was due: a stall shows in the requests
        // that waited behind it.
        answer.latency = due.elapsed();
        sh.record(due, &answer);
    }
    if let Some(u) = seat.user.take() {
        u.close().await;
    }
}

/// One request of the mix by this user (opening or renewing its session).
async fn one(sh: &Shared, seat: &mut Seat) -> Answer {
    if let Some(limit) = sh.plan.calls_per_run {
        if seat.calls >= limit {
            if let Some(u) = seat.user.take() {
                u.close().await;
            }
            seat.calls = 0;
        }
    }
    if seat.user.is_none() {
        let token = sh.identities.take();
        let started = Instant::now();
        match User::open(
            (sh.target.client)(),
            &sh.target.url,
            token,
            sh.plan.era,
            &sh.ids,
        )
        .await
        {
            Ok(u) => seat.user = Some(u),
            Err(e) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Answer {
                    outcomes: vec![Outcome {
                        label: format!("open: {}", first_words(&e.0)),
                        category: Category::Error,
                    }],
                    latency: started.elapsed(),
                    answered_calls: Vec::new(),
                };
            }
        }
    }
    let Some(user) = seat.user.as_mut() else {
        return Answer {
            outcomes: Vec::new(),
            latency: Duration::ZERO,
            answered_calls: Vec::new(),
        };
    };
    let turn = sh.turn.fetch_add(1, Ordering::Relaxed);
    let seq = &sh.plan.sequence;
    let action = &seq[(turn as usize) % seq.len().max(1)];
    seat.n += 1;
    let answer = match action {
        Action::ToolsList => user.measure_list(&sh.ids).await,
        Action::ToolsCall { tool, arguments } => {
            let Some(info) = pick_tool(&sh.target.tools, tool.as_deref(), turn) else {
                return missing_tool(tool.as_deref());
            };
            let args = info.arguments(render(arguments, turn));
            user.call(&sh.ids, &info, args).await
        }
        Action::Batch {
            tool,
            size,
            arguments,
        } => {
            let mut calls = Vec::with_capacity(*size);
            let mut infos = Vec::with_capacity(*size);
            for k in 0..*size as u64 {
                let Some(info) = pick_tool(&sh.target.tools, tool.as_deref(), turn + k) else {
                    return missing_tool(tool.as_deref());
                };
                let args = info.arguments(render(arguments, turn * (*size as u64) + k));
                infos.push(info);
                calls.push(args);
            }
            let pairs = infos.iter().zip(calls).collect();
            user.batch(&sh.ids, pairs).await
        }
        Action::Stream { hold_ms } => {
            let hold = Duration::from_millis(*hold_ms)
                .min(sh.end.saturating_duration_since(Instant::now()));
            user.stream(&sh.ids, hold).await
        }
    };
    if matches!(action, Action::ToolsCall { .. } | Action::Batch { .. }) {
        seat.calls += 1;
    }
    answer
}

fn render(
    templates: &std::collections::BTreeMap<String, super::plan::ArgTemplate>,
    n: u64,
) -> Map<String, Value> {
    templates
        .iter()
        .map(|(k, t)| (k.clone(), t.render(n)))
        .collect()
}

/// The named tool, or one drawn round robin from the list.
fn pick_tool(tools: &[ToolInfo], name: Option<&str>, turn: u64) -> Option<ToolInfo> {
    match name {
        Some(n) => Some(
            tools
                .iter()
                .find(|t| t.name == n)
                .cloned()
                // A tool the target does not list is still sent: what the
                // target answers (unknown tool) is the measurement.
                .unwrap_or_else(|| ToolInfo {
                    name: n.to_owned(),
                    schema: Value::Null,
                }),
        ),
        None if tools.is_empty() => None,
        None => tools.get((turn as usize) % tools.len()).cloned(),
    }
}

fn missing_tool(name: Option<&str>) -> Answer {
    Answer {
        outcomes: vec![Outcome {
            label: format!(
                "no tool to call{}",
                name.map(|n| format!(" ({n})")).unwrap_or_default()
            ),
            category: Category::Error,
        }],
        latency: Duration::ZERO,
        answered_calls: Vec::new(),
    }
}

fn first_words(s: &str) -> String {
    s.split(':').next().unwrap_or(s).chars().take(60).collect()
}

/// The live line: rate, p50 / p99, errors and refusals, once a second.
async fn show_progress(sh: Arc<Shared>) {
    let mut last = 0u64;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    while !sh.stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let (answers, p50, p99, errors, refused) = match sh.stats.lock() {
            Ok(s) => (
                s.answers(),
                s.percentile_ms(50.0),
                s.percentile_ms(99.0),
                s.count(Category::Error),
                s.count(Category::Refused),
            ),
            Err(_) => continue,
        };
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r{:<24} {:>6.1} s  {:>7}/s  p50 {:>7.2} ms  p99 {:>7.2} ms  errors {:<6} refused {:<6}",
            sh.target.label,
            sh.start.elapsed().as_secs_f64(),
            answers - last,
            p50,
            p99,
            errors,
            refused
        );
        let _ = err.flush();
        last = answers;
    }
    let _ = writeln!(std::io::stderr());
}
