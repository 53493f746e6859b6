//! Tests of medians, ratios, curves and the renderings.

use super::*;

fn figures(rps: f64, p99: f64) -> Figures {
    Figures {
        rps,
        p99_ms: p99,
        ok: 10,
        failed: 1,
        cpu_s_per_10k: Some(rps / 10_000.0),
        peak_rss_mb: Some(rps / 1000.0),
        ..Figures::default()
    }
}

fn target(name: &str, rps: f64) -> TargetReport {
    TargetReport {
        target: name.to_owned(),
        median: figures(rps, 1.0),
        ratio_direct: None,
        ratio_nginx: None,
        rounds: vec![figures(rps, 1.0)],
        errors: BTreeMap::new(),
        outcomes: BTreeMap::new(),
        curve: Vec::new(),
        scale: None,
    }
}

fn cell() -> CellReport {
    let mut c = CellReport {
        scenario: "call".into(),
        proto: "h1".into(),
        concurrency: 16,
        rate: None,
        targets: vec![
            target("direct", 10_000.0),
            target("nginx", 5_000.0),
            target("firewall", 6_000.0),
        ],
    };
    c.targets[2]
        .errors
        .insert("denied: got result, expected rpc error -31001".into(), 3);
    c.compute_ratios();
    c
}

#[test]
fn median_of_odd_and_even_lists() {
    assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    assert_eq!(median(Vec::new()), 0.0);
}

#[test]
fn figure_medians_sum_counts_and_keep_the_peak_rss() {
    let m = Figures::median(&[
        figures(100.0, 3.0),
        figures(300.0, 1.0),
        figures(200.0, 2.0),
    ]);
    assert_eq!(m.rps, 200.0);
    assert_eq!(m.p99_ms, 2.0);
    assert_eq!((m.ok, m.failed), (30, 3));
    assert_eq!(m.peak_rss_mb, Some(0.3));
    assert_eq!(m.cpu_s_per_10k, Some(0.02));
    assert_eq!(m.upstream_cpu, None);
}

#[test]
fn ratios_are_against_direct_and_nginx_of_the_same_cell() {
    let c = cell();
    let fw = &c.targets[2];
    assert!((fw.ratio_direct.unwrap() - 0.6).abs() < 1e-9);
    assert!((fw.ratio_nginx.unwrap() - 1.2).abs() < 1e-9);
    assert_eq!(c.targets[0].ratio_direct, Some(1.0));
}

#[test]
fn figures_from_a_histogram() {
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    for us in 1..=1000u64 {
        h.record(us * 10).unwrap();
    }
    let f = Figures::from_histogram(&h, 2.0, 990, 10);
    assert_eq!(f.rps, 500.0);
    assert!((f.p50_ms - 5.0).abs() < 0.05, "{}", f.p50_ms);
    assert!((f.p99_ms - 9.9).abs() < 0.05, "{}", f.p99_ms);
    assert!((f.max_ms - 10.0).abs() < 0.05);
    let points = curve(&h);
    assert_eq!(points.len(), 17);
    assert_eq!(points[0].percentile, 0.0);
    assert!(points.windows(2).all(|w| w[0].ms <= w[1].ms));
}

#[test]
fn renderings_carry_every_target_and_the_errors() {
    let r = Report {
        meta: Meta {
            profile: "test".into(),
            rounds: 3,
            ..Meta::default()
        },
        cells: vec![cell()],
        audit: Some(AuditSummary {
            rows_spooled: 10,
            rows_sent: 10,
            rows_in_clickhouse: Some(10),
            ..AuditSummary::default()
        }),
        notes: vec!["a note".into()],
        instances: Vec::new(),
        verdicts: Vec::new(),
        step_verdicts: Vec::new(),
    };
    let t = table(&r);
    assert!(t.contains("call h1 c=16"));
    assert!(t.contains("firewall"));
    assert!(t.contains("3 (denied: got result"));
    assert!(t.contains("10 rows spooled"));
    let md = markdown(&r);
    assert!(md.contains("| call h1 c=16 | 10.0k (1.00) | 5.00k (0.50) | 6.00k (0.60) |"));
    assert!(md.contains("- a note"));
    assert!(md.contains("## Audit pipeline"));
}

#[test]
fn reports_round_trip_through_json_for_re_rendering() {
    let r = Report {
        meta: Meta {
            profile: "test".into(),
            ..Meta::default()
        },
        cells: vec![cell()],
        audit: None,
        notes: Vec::new(),
        instances: vec![instance("firewall", 20.0, 30.0, 25_000)],
        verdicts: Vec::new(),
        step_verdicts: Vec::new(),
    };
    let mut r = r;
    r.verdicts = targets(&r);
    let json = serde_json::to_string(&r).unwrap();
    let back: Report = serde_json::from_str(&json).unwrap();
    assert_eq!(markdown(&back), markdown(&r));
    // Older reports without newer fields still load.
    let old = json.replace(",\"clickhouse_cpu\":null", "");
    assert_ne!(old, json);
    let back: Report = serde_json::from_str(&old).unwrap();
    assert_eq!(back.cells[0].targets[0].median.clickhouse_cpu, None);
    // Reports from before the targets of issue 20 load without them.
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let obj = v.as_object_mut().unwrap();
    obj.remove("instances");
    obj.remove("verdicts");
    let older: Report = serde_json::from_value(v).unwrap();
    assert!(older.instances.is_empty() && older.verdicts.is_empty());
    assert_eq!(targets(&older).len(), r.verdicts.len());
}

#[test]
fn the_shared_state_note_compares_firewall_redis_with_firewall_in_call_cells() {
    let mut call16 = cell();
    let mut redis = target("firewall-redis", 4_500.0);
    // firewall: 6k rps, p50 0.40 ms, p99 1.00 ms, 0.60 CPU s / 10k.
    call16.targets[2].median.p50_ms = 0.40;
    redis.median.p50_ms = 0.47;
    redis.median.p99_ms = 1.25;
    redis.median.cpu_s_per_10k = Some(0.70);
    redis.median.redis_cpu = Some(0.2);
    redis.median.redis_cpu_s_per_10k = Some(0.30);
    redis.median.redis_peak_rss_mb = Some(9.5);
    redis.median.redis_scripts_per_answer = Some(2.0);
    redis.median.redis_commands_per_answer = Some(19.0);
    call16.targets.push(redis);
    call16.compute_ratios();
    // Not a call cell, or no firewall-redis: no note.
    let mut list = call16.clone();
    list.scenario = "list".into();
    let notes = shared_state(&[call16.clone(), list, cell()]);
    assert_eq!(notes.len(), 1, "{notes:?}");
    let n = &notes[0];
    assert!(n.starts_with(SHARED_STATE_NOTE), "{n}");
    assert!(
        n.contains("call h1 c=16: x0.75 throughput (4.50k vs 6.00k rps)"),
        "{n}"
    );
    assert!(n.contains("+70 µs p50 and +250 µs p99 per call"), "{n}");
    // Redis's CPU is added to the firewall-redis process's.
    assert!(
        n.contains("1.00 (firewall-redis 0.70 + its Redis 0.30) vs firewall 0.60, x1.67"),
        "{n}"
    );
    assert!(n.contains("2.00 Redis scripts (EVALSHA) per call"), "{n}");
    assert!(n.contains("measured apart like ClickHouse's"), "{n}");
    // The renderings show the target and its Redis.
    let r = Report {
        meta: Meta {
            profile: "test".into(),
            redis: Some("throwaway Redis".into()),
            ..Meta::default()
        },
        cells: vec![call16],
        audit: None,
        notes,
        instances: Vec::new(),
        verdicts: Vec::new(),
        step_verdicts: Vec::new(),
    };
    let md = markdown(&r);
    assert!(md.contains("| firewall-redis |"), "{md}");
    assert!(md.contains("| shared state (firewall-redis) | throwaway Redis |"));
    assert!(md.contains(
        "Redis (same machine, for firewall-redis): 20 % of a core, 0.30 CPU s per 10k answers, peak RSS 9.5 MB; per answer 2.00 scripts (EVALSHA), 19.0 commands with those the scripts ran."
    ));
    assert!(md.contains("- firewall-redis vs firewall, call h1 c=16"));
    let t = table(&r);
    assert!(t.contains("firewall-redis") && t.contains("Redis (same machine"));
}

#[test]
fn a_faster_shared_store_shows_as_negative_added_latency() {
    let mut c = cell();
    let mut redis = target("firewall-redis", 6_000.0);
    redis.median.p99_ms = 0.5;
    redis.median.cpu_s_per_10k = None;
    c.targets.push(redis);
    let notes = shared_state(&[c]);
    assert!(notes[0].contains("x1.00 throughput"), "{}", notes[0]);
    assert!(
        notes[0].contains("+0 µs p50 and -500 µs p99"),
        "{}",
        notes[0]
    );
    assert!(!notes[0].contains("CPU s per 10k"), "{}", notes[0]);
}

// === the targets of issue 20 ===

/// A cell of `scenario` at `c` with `(target, rps, CPU s per 10k)`.
fn cell_of(scenario: &str, c: usize, targets: &[(&str, f64, f64)]) -> CellReport {
    let mut cell = CellReport {
        scenario: scenario.into(),
        proto: "h1".into(),
        concurrency: c,
        rate: None,
        targets: targets
            .iter()
            .map(|&(name, rps, cpu)| {
                let mut t = target(name, rps);
                t.median.cpu_s_per_10k = Some(cpu);
                t
            })
            .collect(),
    };
    cell.compute_ratios();
    cell
}

fn instance(target: &str, fresh: f64, end: f64, runs: u64) -> InstanceReport {
    InstanceReport {
        name: "firewall-audit".into(),
        target: target.into(),
        tls: false,
        scope: WHOLE_RUN.into(),
        fresh_rss_mb: Some(fresh),
        end_rss_mb: Some(end),
        requests: runs * 20,
        runs,
    }
}

fn report_of(cells: Vec<CellReport>, instances: Vec<InstanceReport>) -> Report {
    Report {
        meta: Meta {
            profile: "test".into(),
            firewall_upstream: "HTTP/1.1 keep-alive".into(),
            ..Meta::default()
        },
        cells,
        audit: None,
        notes: Vec::new(),
        instances,
        verdicts: Vec::new(),
        step_verdicts: Vec::new(),
    }
}

/// The verdict whose target text contains every one of `parts`.
fn verdict<'a>(v: &'a [Verdict], parts: &[&str]) -> &'a Verdict {
    v.iter()
        .find(|x| parts.iter().all(|p| x.target.contains(p)))
        .unwrap_or_else(|| panic!("no target with {parts:?} in {v:#?}"))
}

#[test]
fn a_run_that_measured_nothing_says_so_for_every_target() {
    let v = targets(&report_of(Vec::new(), Vec::new()));
    // 6 call, 2 list, c=1, 3 streams, end-of-run RSS, scale.
    assert_eq!(v.len(), 14, "{v:#?}");
    for x in &v {
        assert_eq!(x.status, Status::NotMeasured, "{x:?}");
        assert!(
            x.line().contains(": not measured in this run ("),
            "{}",
            x.line()
        );
    }
}

#[test]
fn forwarded_calls_are_judged_against_hyper_in_throughput_and_own_cpu() {
    let c16 = cell_of(
        "call",
        16,
        &[
            ("nginx", 9_000.0, 0.25),
            ("hyper", 10_000.0, 0.20),
            ("firewall", 7_000.0, 0.30),
            ("firewall-noaudit", 8_000.0, 0.26),
        ],
    );
    let c64 = cell_of(
        "call",
        64,
        &[
            ("hyper", 10_000.0, 0.20),
            ("firewall", 6_500.0, 0.35),
            ("firewall-noaudit", 9_000.0, 0.25),
        ],
    );
    let v = targets(&report_of(vec![c16, c64], Vec::new()));
    // Exactly 0.70x is met; 0.65x is not.
    let t16 = verdict(&v, &["call h1 c=16", "firewall (verification"]);
    assert_eq!(t16.status, Status::Met, "{t16:?}");
    assert!(
        t16.figure
            .starts_with("x0.70: firewall 7.00k rps, hyper 10.0k rps"),
        "{}",
        t16.figure
    );
    // nginx as information.
    assert!(
        t16.figure
            .contains("nginx 9.00k rps: firewall x0.78 of nginx, hyper x1.11"),
        "{}",
        t16.figure
    );
    let t64 = verdict(&v, &["call h1 c=64", "firewall (verification"]);
    assert_eq!(t64.status, Status::Missed);
    assert!(t64.line().contains(": MISSED (x0.65"), "{}", t64.line());
    // Own CPU: (0.30 - 0.20) s per 10k = 10 µs per call, met; 15 µs missed.
    let cpu16 = verdict(&v, &["c=16", "own CPU"]);
    assert_eq!(cpu16.status, Status::Met, "{cpu16:?}");
    assert!(
        cpu16
            .figure
            .starts_with("10.0 µs: firewall 30.0 µs per call, hyper 20.0 µs"),
        "{}",
        cpu16.figure
    );
    let cpu64 = verdict(&v, &["c=64", "own CPU"]);
    assert_eq!(cpu64.status, Status::Missed);
    assert!(cpu64.figure.starts_with("15.0 µs"), "{}", cpu64.figure);
    // Audit off: 0.80x < 0.85 missed, 0.90x met.
    assert_eq!(
        verdict(&v, &["c=16", "firewall-noaudit"]).status,
        Status::Missed
    );
    assert_eq!(
        verdict(&v, &["c=64", "firewall-noaudit"]).status,
        Status::Met
    );
}

#[test]
fn without_hyper_the_call_targets_are_not_measured() {
    let c16 = cell_of(
        "call",
        16,
        &[("nginx", 9_000.0, 0.2), ("firewall", 9_500.0, 0.3)],
    );
    let v = targets(&report_of(vec![c16], Vec::new()));
    let t = verdict(&v, &["call h1 c=16", "firewall (verification"]);
    assert_eq!(t.status, Status::NotMeasured);
    assert!(t.figure.contains("hyper not measured"), "{}", t.figure);
    assert_eq!(
        verdict(&v, &["c=16", "own CPU"]).status,
        Status::NotMeasured
    );
    // No call/h1/64 cell at all.
    let t64 = verdict(&v, &["call h1 c=64", "firewall (verification"]);
    assert_eq!(t64.figure, "no call/h1/64 cell");
}

#[test]
fn warm_and_cold_lists_are_named_and_judged_apart() {
    let warm = cell_of(
        "list",
        16,
        &[("hyper", 4_000.0, 0.5), ("firewall", 3_000.0, 0.9)],
    );
    let cold = cell_of(
        "list-cold",
        16,
        &[("hyper", 4_000.0, 0.5), ("firewall", 2_000.0, 1.9)],
    );
    let v = targets(&report_of(vec![warm.clone(), cold.clone()], Vec::new()));
    let w = verdict(&v, &["list (warm view cache) h1 c=16"]);
    assert_eq!(w.status, Status::Met, "{w:?}");
    assert!(w.figure.starts_with("x0.75"), "{}", w.figure);
    let c = verdict(&v, &["list-cold (view rebuilt per request) h1 c=16"]);
    assert_eq!(c.status, Status::Missed, "{c:?}");
    // Only the warm cell: the cold one is not measured, not met.
    let v = targets(&report_of(vec![warm.clone()], Vec::new()));
    let c = verdict(&v, &["list-cold (view rebuilt per request)"]);
    assert_eq!(c.status, Status::NotMeasured);
    assert_eq!(c.figure, "no list-cold/h1/16 cell");
    // A list cell at another concurrency is judged there.
    let mut c8 = cold;
    c8.concurrency = 8;
    let v = targets(&report_of(vec![c8], Vec::new()));
    assert_eq!(
        verdict(&v, &["list-cold (view rebuilt per request) h1 c=8"]).status,
        Status::Missed
    );
    // The titles carry the labels too.
    assert_eq!(warm.title(), "list (warm view cache) h1 c=16");
}

#[test]
fn p99_added_at_c1_is_met_up_to_a_quarter_millisecond() {
    let mut c1 = cell_of(
        "call",
        1,
        &[("direct", 5_000.0, 0.0), ("firewall", 3_000.0, 0.3)],
    );
    c1.targets[0].median.p99_ms = 0.10;
    c1.targets[1].median.p99_ms = 0.34;
    let v = targets(&report_of(vec![c1.clone()], Vec::new()));
    let t = verdict(&v, &["call h1 c=1", "p99"]);
    assert_eq!(t.status, Status::Met, "{t:?}");
    assert!(t.target.contains("≤ 0.25 ms"), "{}", t.target);
    assert!(
        t.figure
            .starts_with("+0.24 ms: firewall p99 0.34 ms, direct 0.10 ms"),
        "{}",
        t.figure
    );
    c1.targets[1].median.p99_ms = 0.40;
    let v = targets(&report_of(vec![c1], Vec::new()));
    let t = verdict(&v, &["call h1 c=1", "p99"]);
    assert_eq!(t.status, Status::Missed);
    assert!(t.figure.starts_with("+0.30 ms"), "{}", t.figure);
}

/// A streams cell of `n` streams; `(target, peak MB, fresh MB)`.
fn streams_cell(n: usize, rss: &[(&str, f64, Option<f64>)]) -> CellReport {
    let mut c = cell_of(
        "streams",
        n,
        &rss.iter()
            .map(|&(t, _, _)| (t, 900.0, 1.0))
            .collect::<Vec<_>>(),
    );
    for (t, &(_, peak, fresh)) in c.targets.iter_mut().zip(rss) {
        t.median.peak_rss_mb = Some(peak);
        t.median.fresh_rss_mb = fresh;
    }
    c
}

#[test]
fn stream_memory_is_judged_per_stream_and_per_fresh_instance() {
    // (45 - 22) MB * 1024 / 1000 = 23.6 KB per stream.
    let cell = streams_cell(
        1000,
        &[
            ("firewall", 45.0, Some(22.0)),
            ("firewall-h2up", 46.0, Some(21.0)),
        ],
    );
    let v = targets(&report_of(vec![cell], Vec::new()));
    let per = verdict(&v, &["KB per held SSE stream"]);
    assert_eq!(per.status, Status::Met, "{per:?}");
    assert!(
        per.figure
            .starts_with("23.6 KB per stream: (45.0 MB peak − 22.0 MB fresh) / 1000"),
        "{}",
        per.figure
    );
    let h1 = verdict(&v, &["1,000 held streams ≤ 60 MB"]);
    assert_eq!(h1.status, Status::Met);
    assert_eq!(h1.figure, "45.0 MB peak, 22.0 MB fresh");
    let h2 = verdict(&v, &["≤ 45 MB", "HTTP/2 upstream"]);
    assert_eq!(h2.status, Status::Missed, "{h2:?}");
    assert!(
        h2.figure
            .starts_with("46.0 MB peak, 21.0 MB fresh, 25.6 KB per stream"),
        "{}",
        h2.figure
    );
    // Over the per-stream bound and the 60 MB, under 45 MB with HTTP/2.
    let cell = streams_cell(
        1000,
        &[
            ("firewall", 61.0, Some(30.0)),
            ("firewall-h2up", 40.0, Some(21.0)),
        ],
    );
    let v = targets(&report_of(vec![cell], Vec::new()));
    assert_eq!(
        verdict(&v, &["KB per held SSE stream"]).status,
        Status::Missed
    );
    assert_eq!(verdict(&v, &["≤ 60 MB"]).status, Status::Missed);
    assert_eq!(verdict(&v, &["≤ 45 MB"]).status, Status::Met);
}

#[test]
fn stream_memory_needs_a_thousand_streams_fresh_instances_and_the_h2_target() {
    // 64 streams (the smoke profile): figures given, no verdict.
    let small = streams_cell(
        64,
        &[
            ("firewall", 30.0, Some(25.0)),
            ("firewall-h2up", 28.0, Some(25.0)),
        ],
    );
    let v = targets(&report_of(vec![small], Vec::new()));
    for parts in [&["KB per held SSE stream"][..], &["≤ 60 MB"], &["≤ 45 MB"]] {
        let t = verdict(&v, parts);
        assert_eq!(t.status, Status::NotMeasured, "{t:?}");
        assert!(
            t.figure
                .starts_with("the cell held 64 streams, fewer than 1,000; "),
            "{}",
            t.figure
        );
    }
    // Not a fresh instance (an older report): no verdict; no h2 target.
    let stale = streams_cell(1000, &[("firewall", 50.0, None)]);
    let v = targets(&report_of(vec![stale], Vec::new()));
    let t = verdict(&v, &["≤ 60 MB"]);
    assert_eq!(t.status, Status::NotMeasured);
    assert!(
        t.figure.contains("not measured on a fresh instance"),
        "{}",
        t.figure
    );
    let h2 = verdict(&v, &["≤ 45 MB"]);
    assert_eq!(h2.status, Status::NotMeasured);
    assert!(
        h2.figure.contains("streams/h1/1000+firewall-h2up"),
        "{}",
        h2.figure
    );
    // --firewall-upstream-http2: the firewall itself stands for HTTP/2.
    let mut r = report_of(
        vec![streams_cell(1000, &[("firewall", 40.0, Some(20.0))])],
        Vec::new(),
    );
    r.meta.firewall_upstream = "HTTP/2 (h2c)".into();
    let v = targets(&r);
    assert_eq!(verdict(&v, &["≤ 60 MB"]).status, Status::NotMeasured);
    assert_eq!(
        verdict(&v, &["KB per held SSE stream"]).status,
        Status::NotMeasured
    );
    assert_eq!(verdict(&v, &["≤ 45 MB"]).status, Status::Met);
}

#[test]
fn end_of_run_memory_is_judged_after_enough_runs() {
    let judge = |i: Vec<InstanceReport>| {
        let v = targets(&report_of(Vec::new(), i));
        verdict(&v, &["end-of-run VmRSS"]).clone()
    };
    let met = judge(vec![instance("firewall", 20.0, 39.5, 20_000)]);
    assert_eq!(met.status, Status::Met, "{met:?}");
    assert!(
        met.target.contains("≤ fresh + 20 MB after 20,000 runs"),
        "{}",
        met.target
    );
    assert_eq!(
        met.figure,
        "+19.5 MB: 20.0 MB fresh, 39.5 MB at the end, after 20,000 runs and 400,000 requests"
    );
    assert_eq!(
        judge(vec![instance("firewall", 20.0, 40.5, 30_000)]).status,
        Status::Missed
    );
    // Too few runs (the smoke and quick profiles): the figure, no verdict.
    let few = judge(vec![instance("firewall", 20.0, 25.0, 300)]);
    assert_eq!(few.status, Status::NotMeasured);
    assert!(
        few.figure
            .starts_with("it met fewer than 20,000 runs; +5.0 MB"),
        "{}",
        few.figure
    );
    // Only a TLS, an unaudited or a fresh instance: not this target.
    let mut tls = instance("firewall", 20.0, 25.0, 30_000);
    tls.tls = true;
    let mut fresh = instance("firewall", 20.0, 25.0, 30_000);
    fresh.scope = "streams h1 c=1000, round 1".into();
    let none = judge(vec![
        tls,
        fresh,
        instance("firewall-noaudit", 20.0, 25.0, 30_000),
    ]);
    assert_eq!(none.status, Status::NotMeasured);
    assert_eq!(none.figure, "no long-lived plain audited firewall");
}

fn scale_cell(runs: u64, runs_met: u64, idle: u64, held: u64) -> CellReport {
    let mut c = cell_of(
        "scale",
        16,
        &[("hyper", 8_000.0, 0.2), ("firewall", 3_000.0, 0.5)],
    );
    c.targets[1].median.peak_rss_mb = Some(180.0);
    c.targets[1].median.p50_ms = 1.2;
    c.targets[1].median.p99_ms = 3.4;
    c.targets[1].scale = Some(ScaleFigures {
        runs,
        runs_met,
        calls_per_run: 2,
        idle_wanted: idle,
        idle_opened: idle,
        idle_held: held,
        idle_lost: if held < idle {
            BTreeMap::from([("closed by the target".to_owned(), idle - held)])
        } else {
            BTreeMap::new()
        },
        rss_before_mb: Some(24.0),
        rss_after_mb: Some(64.0),
    });
    c
}

#[test]
fn the_scale_cell_reports_growth_against_the_plain_call_and_holds_every_idle_connection() {
    let mut call16 = cell_of(
        "call",
        16,
        &[("hyper", 10_000.0, 0.2), ("firewall", 6_000.0, 0.3)],
    );
    call16.targets[1].median.peak_rss_mb = Some(40.0);
    let judge = |scale: CellReport| {
        let v = targets(&report_of(vec![call16.clone(), scale], Vec::new()));
        verdict(&v, &["scale: 100,000 runs with 10,000 idle connections"]).clone()
    };
    let met = judge(scale_cell(100_000, 100_000, 10_000, 10_000));
    assert_eq!(met.status, Status::Met, "{met:?}");
    assert_eq!(
        met.figure,
        "3.00k rps, p50 1.20 ms, p99 3.40 ms (x0.50 of its call h1 c=16, 6.00k rps); \
         RSS 24.0 MB before, peak 180.0 MB, 64.0 MB after (+40.0 MB, 0.41 KB per run met); \
         call h1 c=16 peak 40.0 MB; idle connections: 10,000 held of 10,000 asked (10,000 opened); \
         runs: 100,000 of 100,000 met, 2 calls each"
    );
    // The target closed idle connections.
    let lost = judge(scale_cell(100_000, 100_000, 10_000, 9_990));
    assert_eq!(lost.status, Status::Missed);
    assert!(
        lost.figure.ends_with("(lost: 10 closed by the target)"),
        "{}",
        lost.figure
    );
    // Too few calls to reach every run.
    let short = judge(scale_cell(100_000, 60_000, 10_000, 10_000));
    assert_eq!(short.status, Status::NotMeasured);
    assert!(
        short
            .figure
            .starts_with("only 60,000 of its runs were reached"),
        "{}",
        short.figure
    );
    // The smoke profile's small scale cell.
    let small = judge(scale_cell(1_000, 1_000, 200, 200));
    assert_eq!(small.status, Status::NotMeasured);
    assert!(
        small
            .figure
            .starts_with("the cell ran with 1,000 runs and 200 idle connections; 3.00k rps"),
        "{}",
        small.figure
    );
}

#[test]
fn renderings_carry_the_targets_the_instances_and_the_fresh_and_scale_figures() {
    let mut r = report_of(
        vec![
            cell_of(
                "call",
                16,
                &[("hyper", 10_000.0, 0.2), ("firewall", 8_000.0, 0.25)],
            ),
            streams_cell(1000, &[("firewall", 45.0, Some(22.0))]),
            scale_cell(100_000, 100_000, 10_000, 10_000),
        ],
        vec![instance("firewall", 20.0, 30.0, 25_000)],
    );
    r.verdicts = targets(&r);
    let t = table(&r);
    assert!(
        t.contains("\nTargets (issue 20), against the hyper pass-through:\n"),
        "{t}"
    );
    assert!(t.contains("  call h1 c=16: firewall (verification, CEL policy, limits, audit) ≥ 0.70× hyper: met (x0.80"), "{t}");
    assert!(t.contains("end-of-run VmRSS of the audited firewall ≤ fresh + 20 MB after 20,000 runs: met (+10.0 MB"), "{t}");
    assert!(t.contains("list-cold (view rebuilt per request) h1 c=16: firewall ≥ 0.70× hyper: not measured in this run (no list-cold/h1/16 cell)"), "{t}");
    assert!(t.contains("firewall-audit (firewall, whole run): 20.0 MB fresh, 30.0 MB at the end (+10.0 MB); 500,000 requests, 25,000 runs"), "{t}");
    assert!(t.contains("firewall on instances started fresh for each round: 22.0 MB fresh, 45.0 MB peak with 1000 held streams: 23.6 KB per stream"), "{t}");
    assert!(t.contains("scale, firewall: 3.00k rps"), "{t}");
    let md = markdown(&r);
    assert!(md.contains("## Targets (issue 20)"), "{md}");
    assert!(md.contains("- call h1 c=16: the firewall's own CPU per call (firewall − hyper) ≤ 10 µs: met (5.0 µs"), "{md}");
    assert!(md.contains("## Firewall instances"), "{md}");
    assert!(md.contains("- scale, firewall: 3.00k rps"), "{md}");
    // Every target any cell measured is a summary column.
    assert!(md.contains("| cell | hyper | firewall |"), "{md}");
}

#[test]
fn issue_32_step_targets_are_judged_at_their_own_thresholds() {
    let cold = cell_of(
        "list-cold",
        16,
        &[("hyper", 4_000.0, 0.5), ("firewall", 1_600.0, 1.9)],
    );
    let call = cell_of(
        "call",
        16,
        &[("hyper", 10_000.0, 0.5), ("firewall", 5_500.0, 0.8)],
    );
    let r = report_of(vec![cold, call], Vec::new());
    let standing = targets(&r);
    let step = targets_for(&r, &STEP);
    assert_eq!(standing.len(), step.len());
    // x0.40 of hyper: past the step's 0.35, short of the standing 0.70.
    let title = ["list-cold (view rebuilt per request) h1 c=16"];
    assert_eq!(verdict(&standing, &title).status, Status::Missed);
    let c = verdict(&step, &title);
    assert_eq!(c.status, Status::Met, "{c:?}");
    assert!(c.target.contains("≥ 0.35× hyper"), "{}", c.target);
    // x0.55 audited calls: the step's 0.50 met, the standing 0.70 missed.
    let call = ["call h1 c=16", "firewall (verification"];
    assert_eq!(verdict(&standing, &call).status, Status::Missed);
    assert_eq!(verdict(&step, &call).status, Status::Met);
    let own = verdict(&step, &["own CPU", "c=16"]);
    assert!(own.target.contains("≤ 40 µs"), "{}", own.target);
    // Both sets are rendered, the step's first.
    let mut r = r;
    r.verdicts = standing;
    r.step_verdicts = step;
    let md = markdown(&r);
    let step_at = md.find("## Targets of issue 32").expect("step section");
    let standing_at = md.find("## Targets (issue 20)").expect("standing section");
    assert!(step_at < standing_at);
    assert!(table(&r).contains("Targets of issue 32 (this step)"));
}
