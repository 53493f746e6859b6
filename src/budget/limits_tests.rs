use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use governor::clock::FakeRelativeClock;

use super::*;

const DAY: u64 = 86_400_000;

struct Fixture {
    budgets: Arc<Local<FakeRelativeClock>>,
    clock: FakeRelativeClock,
    wall: Arc<AtomicU64>,
}

fn fixture(cfg: LimitsConfig) -> Fixture {
    let clock = FakeRelativeClock::default();
    let wall = Arc::new(AtomicU64::new(10 * DAY + 1_000));
    let w = wall.clone();
    let budgets = Local::with_clock(
        cfg,
        clock.clone(),
        Arc::new(move || w.load(Ordering::SeqCst)),
    );
    Fixture {
        budgets: Arc::new(budgets),
        clock,
        wall,
    }
}

fn unlimited() -> LimitsConfig {
    LimitsConfig {
        per_ip_per_s: 0,
        per_tenant_per_s: 0,
        per_run_per_s: 0,
        per_run_tool_per_s: 0,
        ..LimitsConfig::default()
    }
}

fn call<'a>(run: &'a str, tool: &'a str) -> CallBudget<'a> {
    CallBudget {
        tenant: "acme",
        run,
        upstream: "incidents",
        tool,
        run_exp: None,
        price: 0.0,
        max_steps: 8,
        max_cost: None,
        run_per_s: None,
        upstream_per_s: None,
    }
}

#[test]
fn step_cap_is_exact_under_100_concurrent_calls() {
    let f = fixture(unlimited());
    let admitted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..100 {
            let (b, a, r) = (f.budgets.clone(), admitted.clone(), refused.clone());
            s.spawn(move || match b.admit(&call("run-1", "get_incident")) {
                Ok(_) => a.fetch_add(1, Ordering::SeqCst),
                Err(Refusal::StepCap { max: 8, .. }) => r.fetch_add(1, Ordering::SeqCst),
                Err(other) => panic!("unexpected refusal {other:?}"),
            });
        }
    });
    assert_eq!(admitted.load(Ordering::SeqCst), 8);
    assert_eq!(refused.load(Ordering::SeqCst), 92);
    assert_eq!(f.budgets.steps("acme", "run-1"), 8);
    // Another run is not affected.
    assert!(f.budgets.admit(&call("run-2", "get_incident")).is_ok());
}

#[test]
fn a_call_that_never_reached_the_upstream_is_refunded() {
    let f = fixture(unlimited());
    let mut c = call("r", "t");
    c.max_steps = 1;
    let r = f.budgets.admit(&c).unwrap();
    assert_eq!(r.steps_used, 1);
    assert!(matches!(
        f.budgets.admit(&c),
        Err(Refusal::StepCap { used: 1, max: 1 })
    ));
    f.budgets.settle(&r, Settle::NotExecuted);
    assert_eq!(f.budgets.steps("acme", "r"), 0);
    let r = f.budgets.admit(&c).unwrap();
    // Executed (even if it failed upstream): the step stays spent.
    f.budgets.settle(&r, Settle::Executed { reported: None });
    assert!(f.budgets.admit(&c).is_err());
}

#[test]
fn cost_cap_with_price_table_and_reported_cost() {
    let f = fixture(unlimited());
    let mut c = call("r", "query");
    c.price = 0.4;
    c.max_cost = Some(1.0);
    let a = f.budgets.admit(&c).unwrap();
    let _b = f.budgets.admit(&c).unwrap();
    // 0.8 spent; 0.4 more would pass 1.0.
    match f.budgets.admit(&c) {
        Err(Refusal::CostCap {
            scope: "run", cap, ..
        }) => assert_eq!(cap, 1.0),
        other => panic!("expected cost_cap, got {other:?}"),
    }
    // The upstream reports the first call cost only 0.1: room for one more.
    f.budgets.settle(
        &a,
        Settle::Executed {
            reported: Some(0.1),
        },
    );
    assert!((f.budgets.cost("acme", "r") - 0.5).abs() < 1e-9);
    assert!(f.budgets.admit(&c).is_ok());
    assert!(f.budgets.admit(&c).is_err());
}

#[test]
fn tenant_daily_cap_rolls_over_at_the_day_boundary() {
    let f = fixture(LimitsConfig {
        tenant_daily_cost: Some(1.0),
        ..unlimited()
    });
    let mut c = call("r1", "query");
    c.price = 0.6;
    c.max_steps = 100;
    assert!(f.budgets.admit(&c).is_ok());
    let mut other_run = c.clone();
    other_run.run = "r2";
    match f.budgets.admit(&other_run) {
        Err(Refusal::CostCap {
            scope: "tenant_day",
            ..
        }) => {}
        other => panic!("expected the tenant's daily cap, got {other:?}"),
    }
    // The refused call did not keep a step in its run.
    assert_eq!(f.budgets.steps("acme", "r2"), 0);
    // Next UTC day.
    f.wall.store(11 * DAY, Ordering::SeqCst);
    assert!(f.budgets.admit(&other_run).is_ok());
}

#[test]
fn rate_limits_give_retry_after_and_recover_with_time() {
    let f = fixture(LimitsConfig {
        per_ip_per_s: 0,
        per_tenant_per_s: 0,
        per_run_per_s: 2,
        per_run_tool_per_s: 0,
        default_max_steps: 100,
        ..LimitsConfig::default()
    });
    let mut c = call("r", "t");
    c.max_steps = 100;
    assert!(f.budgets.admit(&c).is_ok());
    assert!(f.budgets.admit(&c).is_ok());
    match f.budgets.admit(&c) {
        Err(Refusal::RateLimited {
            scope: "run",
            retry_after,
        }) => {
            assert!(
                retry_after > Duration::ZERO && retry_after <= Duration::from_millis(500),
                "{retry_after:?}"
            );
        }
        other => panic!("expected rate_limited, got {other:?}"),
    }
    f.clock.advance(Duration::from_millis(500));
    assert!(f.budgets.admit(&c).is_ok());
    // A role override applies per run.
    let mut slow = call("r-slow", "t");
    slow.run_per_s = Some(1);
    assert!(f.budgets.admit(&slow).is_ok());
    assert!(matches!(
        f.budgets.admit(&slow),
        Err(Refusal::RateLimited { scope: "run", .. })
    ));
}

#[test]
fn per_ip_upstream_and_tenant_limits() {
    let f = fixture(LimitsConfig {
        per_ip_per_s: 1,
        per_tenant_per_s: 3,
        per_run_per_s: 0,
        per_run_tool_per_s: 0,
        ..LimitsConfig::default()
    });
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    assert!(f.budgets.check_ip(ip).is_ok());
    assert!(f.budgets.check_ip(ip).is_err());
    assert!(f.budgets.check_ip("10.0.0.2".parse().unwrap()).is_ok());
    let mut c = call("a", "t");
    c.upstream_per_s = Some(2);
    c.max_steps = 100;
    assert!(f.budgets.admit(&c).is_ok());
    assert!(f.budgets.admit(&c).is_ok());
    assert!(matches!(
        f.budgets.admit(&c),
        Err(Refusal::RateLimited {
            scope: "upstream",
            ..
        })
    ));
    c.upstream_per_s = None;
    assert!(matches!(
        f.budgets.admit(&c),
        Err(Refusal::RateLimited {
            scope: "tenant",
            ..
        })
    ));
}

/// What a run's budget has after one call with a `run_exp` claim.
fn call_until<'a>(run: &'a str, run_exp: Option<u64>) -> CallBudget<'a> {
    CallBudget {
        run_exp,
        ..call(run, "get_incident")
    }
}

#[test]
fn a_capped_run_stays_capped_past_its_tokens_expiry() {
    let f = fixture(unlimited());
    for _ in 0..8 {
        f.budgets.admit(&call("run-8", "get_incident")).unwrap();
    }
    assert!(matches!(
        f.budgets.admit(&call("run-8", "get_incident")),
        Err(Refusal::StepCap { used: 8, max: 8 })
    ));
    // Its 15-minute token expires; 20 minutes later the agent comes back
    // with a fresh token for the same run: still capped, same stop reason.
    f.wall.fetch_add(35 * 60_000, Ordering::SeqCst);
    f.budgets.sweep();
    let again = f.budgets.admit(&call("run-8", "get_incident"));
    assert!(
        matches!(again, Err(Refusal::StepCap { used: 8, max: 8 })),
        "{again:?}"
    );
    assert_eq!(again.unwrap_err().stop_reason(), StopReason::StepCap);
    // Another run of the tenant is not.
    assert!(f.budgets.admit(&call("run-9", "get_incident")).is_ok());
}

#[test]
fn run_state_lives_for_its_lifetime_after_the_last_call() {
    let f = fixture(LimitsConfig {
        run_state_ttl_s: 3600,
        ..unlimited()
    });
    f.budgets.admit(&call("r", "t")).unwrap();
    // Activity keeps it: 50 minutes, a call, 50 more minutes.
    f.wall.fetch_add(50 * 60_000, Ordering::SeqCst);
    f.budgets.sweep();
    f.budgets.admit(&call("r", "t")).unwrap();
    f.wall.fetch_add(50 * 60_000, Ordering::SeqCst);
    f.budgets.sweep();
    assert_eq!(f.budgets.steps("acme", "r"), 2, "kept while active");
    // An hour idle: gone.
    f.wall.fetch_add(11 * 60_000, Ordering::SeqCst);
    f.budgets.sweep();
    assert_eq!(f.budgets.runs(), 0);
}

#[test]
fn a_tokens_run_exp_ends_the_run_and_nothing_extends_it() {
    let f = fixture(unlimited());
    let now_s = f.wall.load(Ordering::SeqCst) / 1000;
    f.budgets.admit(&call_until("r", Some(now_s + 60))).unwrap();
    // A later token cannot push the end out.
    f.budgets
        .admit(&call_until("r", Some(now_s + 3600)))
        .unwrap();
    f.wall.fetch_add(61_000, Ordering::SeqCst);
    for run_exp in [Some(now_s + 3600), None] {
        let r = f.budgets.admit(&call_until("r", run_exp));
        assert!(
            matches!(r, Err(Refusal::RunEnded { at_s }) if at_s == now_s + 60),
            "{r:?}"
        );
    }
    assert_eq!(
        Refusal::RunEnded { at_s: 1 }.stop_reason(),
        StopReason::RunEnded
    );
    // The ended run stays ended for its lifetime: a sweep does not forget it.
    f.budgets.sweep();
    assert!(f
        .budgets
        .admit(&call_until("r", Some(now_s + 7200)))
        .is_err());
}

#[test]
fn past_the_cap_the_longest_idle_runs_are_evicted_first() {
    let f = fixture(LimitsConfig {
        max_tracked_runs: 128,
        ..unlimited()
    });
    for i in 0..128 {
        f.budgets.admit(&call(&format!("r{i}"), "t")).unwrap();
        f.wall.fetch_add(1, Ordering::SeqCst);
    }
    // r0 is busy again: the youngest activity.
    f.budgets.admit(&call("r0", "t")).unwrap();
    for i in 128..200 {
        f.budgets.admit(&call(&format!("r{i}"), "t")).unwrap();
        f.wall.fetch_add(1, Ordering::SeqCst);
    }
    f.budgets.sweep();
    assert_eq!(f.budgets.runs(), 128);
    assert!(f.budgets.evicted() >= 72);
    assert_eq!(f.budgets.steps("acme", "r0"), 2, "recent activity is kept");
    assert_eq!(f.budgets.steps("acme", "r1"), 0, "the idlest went first");
    assert_eq!(f.budgets.steps("acme", "r199"), 1);
}

#[test]
fn refusals_name_their_stop_reason() {
    assert_eq!(
        Refusal::StepCap { used: 8, max: 8 }.stop_reason().as_str(),
        "step_cap"
    );
    assert!(Refusal::StepCap { used: 8, max: 8 }
        .describe()
        .contains("8 of 8"));
    let r = Refusal::RateLimited {
        scope: "run",
        retry_after: Duration::from_millis(250),
    };
    assert_eq!(r.stop_reason().as_str(), "rate_limited");
    assert!(r.describe().contains("250 ms"));
}
