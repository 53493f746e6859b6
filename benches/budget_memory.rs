//! Memory held by budget state for many distinct runs (issue: bounded
//! memory). Run with `cargo bench --bench budget_memory`; prints the resident
//! set growth per run for one million runs, with the default limits (per-run
//! and per-run-and-tool rate limiters on, as in production).

use mcp_firewall::internals::{CallBudget, LimitsConfig, Local};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    // Tenant and IP limits off so that every run gets state; the per-run and
    // per-run-and-tool limiters stay on (each holds a key per run).
    let cfg = LimitsConfig {
        per_tenant_per_s: 0,
        per_ip_per_s: 0,
        ..LimitsConfig::default()
    };
    let budgets = Local::new(cfg);
    let before = rss_kib();
    let started = std::time::Instant::now();
    for i in 0..runs {
        let run = format!("run-{i:08}");
        let tenant = format!("tenant-{}", i % 100);
        let call = CallBudget {
            tenant: &tenant,
            run: &run,
            upstream: "incidents",
            tool: "get_incident",
            run_exp: None,
            price: 0.01,
            max_steps: 8,
            max_cost: Some(1.0),
            run_per_s: None,
            upstream_per_s: None,
        };
        let _ = budgets.admit(&call);
    }
    let after = rss_kib();
    let grown = after.saturating_sub(before);
    println!(
        "{runs} runs: resident set grew {:.1} MiB ({:.0} bytes per run) in {:.1} s; {} runs tracked",
        grown as f64 / 1024.0,
        grown as f64 * 1024.0 / runs as f64,
        started.elapsed().as_secs_f64(),
        budgets.runs()
    );
}
