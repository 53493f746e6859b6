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
fn design_targets_are_judged_from_the_cells() {
    let mut call16 = cell();
    call16.targets[2].median.rps = 30_000.0; // firewall above nginx (5k)
    let mut call1 = cell();
    call1.concurrency = 1;
    call1.targets[0].median.p99_ms = 0.06;
    call1.targets[2].median.p99_ms = 0.72;
    let mut streams = cell();
    streams.scenario = "streams".into();
    streams.concurrency = 1000;
    streams.targets[2].median.peak_rss_mb = Some(50.0);
    let notes = design_targets(&[call16, call1, streams]);
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(notes[0].contains("c=16: met"), "{}", notes[0]);
    assert!(
        notes[1].contains("MISSED") && notes[1].contains("+0.66 ms"),
        "{}",
        notes[1]
    );
    assert!(notes[2].contains("met (50.0 MB"), "{}", notes[2]);
}

#[test]
fn the_hyper_floor_is_reported_next_to_the_throughput_target() {
    let mut call16 = cell();
    call16.targets.push(target("hyper", 4_000.0));
    let notes = design_targets(&[call16]);
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].contains("c=16: met"), "{}", notes[0]);
    // hyper 4k against nginx 5k, the firewall's 6k against hyper's 4k.
    assert!(
        notes[1].contains("4.00k rps (x0.80 nginx)") && notes[1].contains("x1.50 of it"),
        "{}",
        notes[1]
    );
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
    };
    let json = serde_json::to_string(&r).unwrap();
    let back: Report = serde_json::from_str(&json).unwrap();
    assert_eq!(markdown(&back), markdown(&r));
    // Older reports without newer fields still load.
    let old = json.replace(",\"clickhouse_cpu\":null", "");
    assert_ne!(old, json);
    let back: Report = serde_json::from_str(&old).unwrap();
    assert_eq!(back.cells[0].targets[0].median.clickhouse_cpu, None);
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
