//! Tests of the catalog: counts, classes, scenario tools, valid JSON.

use super::*;

#[test]
fn hundred_tools_split_fifty_thirty_fifteen_five() {
    let c = Catalog::new(100, 310).unwrap();
    let count = |class| c.tools.iter().filter(|t| t.class == class).count();
    assert_eq!(c.tools.len(), 100);
    assert_eq!(count(Class::Read), 50);
    assert_eq!(count(Class::Write), 30);
    assert_eq!(count(Class::Destructive), 15);
    assert_eq!(count(Class::Unclassified), 5);
    assert_eq!(c.reads(), 50);
}

#[test]
fn names_are_unique_and_scenario_tools_exist_at_every_size() {
    for n in [MIN_TOOLS, 13, 20, 100, 317, MAX_TOOLS] {
        let c = Catalog::new(n, 310).unwrap();
        let mut names: Vec<&str> = c.tools.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate names at {n}");
        for (tool, class) in [
            (CALL_TOOL, Class::Read),
            (LIST_TOOL, Class::Read),
            (DENIED_TOOL, Class::Read),
            (GATED_TOOL, Class::Write),
        ] {
            let t = c.tools.iter().find(|t| t.name == tool);
            assert_eq!(t.map(|t| t.class), Some(class), "{tool} at {n}");
        }
    }
}

#[test]
fn class_follows_the_verb_the_bench_policy_matches() {
    let c = Catalog::new(200, 310).unwrap();
    for t in &c.tools {
        let verb = t.name.split('_').next().unwrap();
        let expected = match verb {
            "get" | "list" | "search" | "describe" | "query" => Class::Read,
            "create" | "update" | "annotate" => Class::Write,
            "delete" | "restart" | "rollback" => Class::Destructive,
            "vendor" => Class::Unclassified,
            other => panic!("unexpected verb {other}"),
        };
        assert_eq!(t.class, expected, "{}", t.name);
    }
}

#[test]
fn list_result_is_json_with_every_tool_and_its_schema() {
    let c = Catalog::new(100, 310).unwrap();
    let v: serde_json::Value = serde_json::from_str(&c.list_result).unwrap();
    let tools = v["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 100);
    for (t, spec) in tools.iter().zip(&c.tools) {
        assert_eq!(t["name"], spec.name.as_str());
        assert_eq!(t["inputSchema"]["type"], "object");
        assert!(t["description"].as_str().unwrap().len() > 60);
    }
    assert!(!c.list_result.contains('\n'));
    assert!(!c.list_result.contains("skipped"));
    assert!(!c.list_result.contains("\"error\""));
    // Realistic size: several hundred bytes per tool.
    assert!(c.list_result.len() > 100 * 500, "{}", c.list_result.len());
}

#[test]
fn call_result_has_the_requested_size_and_shape() {
    for bytes in [200, 310, 4096, 65_536] {
        let c = Catalog::new(MIN_TOOLS, bytes).unwrap();
        assert_eq!(c.call_result.len(), bytes);
        let v: serde_json::Value = serde_json::from_str(&c.call_result).unwrap();
        assert_eq!(v["isError"], false);
        assert_eq!(v["content"][0]["type"], "text");
    }
}

#[test]
fn out_of_range_sizes_are_refused() {
    assert!(matches!(
        Catalog::new(MIN_TOOLS - 1, 310),
        Err(CatalogError::ToolCount { count: 9, .. })
    ));
    assert!(matches!(
        Catalog::new(100, 20),
        Err(CatalogError::ResultSize { bytes: 20, .. })
    ));
}
