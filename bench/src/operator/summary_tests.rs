use super::*;

fn target(p99: f64, errors: f64, rate: f64) -> TargetSummary {
    TargetSummary {
        label: "t".into(),
        url: "http://x".into(),
        answers: 100,
        messages: 100,
        seconds: 1.0,
        rate,
        p50_ms: p99 / 2.0,
        p90_ms: p99,
        p95_ms: p99,
        p99_ms: p99,
        max_ms: p99,
        ok_pct: 100.0 - errors,
        refused_pct: 0.0,
        tool_error_pct: 0.0,
        error_pct: errors,
        outcomes: Vec::new(),
        timeline: Vec::new(),
        metrics: Vec::new(),
        audit: None,
    }
}

#[test]
fn thresholds_parse_units_and_judge() {
    let t = Threshold::parse("p99<250ms").unwrap();
    assert!(t.judge(&target(100.0, 0.0, 1.0)).ok);
    assert!(!t.judge(&target(300.0, 0.0, 1.0)).ok);
    let t = Threshold::parse("p99 < 0.25s").unwrap();
    assert!(!t.judge(&target(300.0, 0.0, 1.0)).ok);
    let t = Threshold::parse("errors<0.1%").unwrap();
    assert!(t.judge(&target(1.0, 0.05, 1.0)).ok);
    assert!(!t.judge(&target(1.0, 0.2, 1.0)).ok);
    let t = Threshold::parse("errors<0.001").unwrap();
    assert!(
        !t.judge(&target(1.0, 0.2, 1.0)).ok,
        "a fraction is a share too"
    );
    let t = Threshold::parse("rate>=2000").unwrap();
    assert!(t.judge(&target(1.0, 0.0, 2000.0)).ok);
    assert!(!t.judge(&target(1.0, 0.0, 1999.0)).ok);
    let t = Threshold::parse("audit_missing==0").unwrap();
    assert!(
        !t.judge(&target(1.0, 0.0, 1.0)).ok,
        "no audit check: not met"
    );
    for bad in ["p99", "p98<1ms", "p99<1h", "rate>=fast", "errors<1ms"] {
        assert!(Threshold::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn stats_count_kinds_apart_and_percentiles() {
    use super::super::client::{Answer, Category, Outcome};
    let mut s = Stats::new().unwrap();
    let answer = |ms: u64, label: &str, category| Answer {
        outcomes: vec![Outcome {
            label: label.into(),
            category,
        }],
        latency: Duration::from_millis(ms),
        answered_calls: vec![ms],
    };
    for i in 1..=98 {
        s.record(
            Duration::from_millis(i * 10),
            &answer(1, "ok", Category::Ok),
        );
    }
    s.record(
        Duration::from_secs(1),
        &answer(50, "step_cap", Category::Refused),
    );
    s.record(
        Duration::from_secs(1),
        &answer(100, "http 503", Category::Error),
    );
    s.set_elapsed(Duration::from_secs(2));
    let t = s.summary("t", "u");
    assert_eq!(t.answers, 100);
    assert!((t.rate - 50.0).abs() < 1e-9);
    assert!((t.refused_pct - 1.0).abs() < 1e-9);
    assert!((t.error_pct - 1.0).abs() < 1e-9);
    assert!(t.p50_ms < 1.1, "{}", t.p50_ms);
    assert!(t.max_ms >= 99.0, "{}", t.max_ms);
    assert_eq!(t.timeline.len(), 2);
    assert_eq!(s.answered_calls().len(), 100);
    let text = Report {
        started: "now".into(),
        plan: String::new(),
        identities: "x".into(),
        targets: vec![t],
        verdicts: Vec::new(),
    };
    assert!(text.svg().unwrap().starts_with("<svg"));
    assert!(text.markdown().contains("| `step_cap` | 1 |"));
}
