use super::*;

fn bounds() -> Bounds {
    Bounds {
        max_vus: 100,
        max_rate: 1000.0,
        max_duration: Duration::from_secs(60),
    }
}

fn plan_of(toml_text: &str, over: &Overrides) -> Result<Plan, PlanError> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.toml");
    std::fs::write(&p, toml_text).unwrap();
    build(Some(&p), over, bounds())
}

#[test]
fn durations_parse_in_every_unit() {
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
    assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
    assert_eq!(parse_duration("3m").unwrap(), Duration::from_secs(180));
    assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
    assert!(parse_duration("soon").is_err());
    assert!(parse_duration("-1s").is_err());
    assert!(parse_duration("3d").is_err());
}

#[test]
fn a_weighted_mix_is_interleaved_in_its_proportions() {
    let p = plan_of(
        "[[mix]]\nweight = 3\nmethod = \"tools/call\"\ntool = \"a\"\n[[mix]]\nweight = 1\nmethod = \"tools/list\"\n",
        &Overrides::default(),
    )
    .unwrap();
    let labels: Vec<String> = p.sequence.iter().map(Action::label).collect();
    assert_eq!(labels.len(), 4);
    assert_eq!(labels.iter().filter(|l| *l == "tools/list").count(), 1);
    assert_eq!(labels[0], "tools/call a");
}

#[test]
fn stages_ramp_linearly_and_hold_their_last_target() {
    let p = plan_of(
        "[[stages]]\nduration = \"10s\"\ntarget = 10\n[[stages]]\nduration = \"10s\"\ntarget = 0\n",
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(p.duration, Duration::from_secs(20), "the stages' length");
    assert_eq!(p.users(), 10, "the peak");
    assert!((p.target_at(Duration::from_secs(5), 0.0) - 5.0).abs() < 1e-9);
    assert!((p.target_at(Duration::from_secs(15), 0.0) - 5.0).abs() < 1e-9);
    assert_eq!(p.target_at(Duration::from_secs(30), 0.0), 0.0);
}

#[test]
fn bounds_and_typos_are_refused_before_anything_is_sent() {
    let over = Overrides {
        rate: Some(5000.0),
        ..Overrides::default()
    };
    assert!(plan_of("", &over)
        .unwrap_err()
        .to_string()
        .contains("--max-rate"));
    let over = Overrides {
        vus: Some(500),
        ..Overrides::default()
    };
    assert!(plan_of("", &over)
        .unwrap_err()
        .to_string()
        .contains("--max-vus"));
    assert!(plan_of("vus = 2\nduraton = \"1s\"\n", &Overrides::default()).is_err());
    assert!(
        plan_of("[[mix]]\nmethod = \"tools/cal\"\n", &Overrides::default())
            .unwrap_err()
            .to_string()
            .contains("tools/cal")
    );
    let e = plan_of("[[mix]]\nmethod = \"batch\"\n", &Overrides::default()).unwrap_err();
    assert!(e.to_string().contains("2025-03-26"), "{e}");
    let ok = plan_of(
        "era = \"2025-03-26\"\n[[mix]]\nmethod = \"batch\"\nsize = 3\n",
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(ok.sequence[0].label(), "batch of 3");
}

#[test]
fn argument_templates_render_picks_sequences_and_fixed_values() {
    let p = plan_of(
        "[[mix]]\nmethod = \"tools/call\"\ntool = \"t\"\n[mix.arguments]\nid = { pick = [\"a\", \"b\"] }\nn = { sequence = true, start = 10 }\ns = { sequence = true, prefix = \"r-\" }\nfixed = { deep = 1 }\n",
        &Overrides::default(),
    )
    .unwrap();
    let Action::ToolsCall { arguments, .. } = &p.sequence[0] else {
        panic!("a call");
    };
    let at = |k: &str, n| arguments[k].render(n);
    assert_eq!(at("id", 0), serde_json::json!("a"));
    assert_eq!(at("id", 3), serde_json::json!("b"));
    assert_eq!(at("n", 2), serde_json::json!(12));
    assert_eq!(at("s", 5), serde_json::json!("r-5"));
    assert_eq!(at("fixed", 9), serde_json::json!({"deep": 1}));
}

#[test]
fn the_readme_scenario_is_a_valid_plan() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme
        .find("# scenario.toml\n")
        .expect("the walk-through's scenario");
    let block = &readme[start..];
    let block = &block[..block.find("```").expect("end of block")];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scenario.toml");
    std::fs::write(&path, block).unwrap();
    let defaults = Bounds {
        max_vus: 256,
        max_rate: 1000.0,
        max_duration: Duration::from_secs(300),
    };
    let p = build(Some(&path), &Overrides::default(), defaults).unwrap();
    assert_eq!(p.users(), 20);
    assert_eq!(p.duration, Duration::from_secs(105));
    assert_eq!(p.sequence.len(), 10);
    assert_eq!(p.calls_per_run, Some(30));
}
