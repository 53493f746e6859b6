//! Reloads: what a change does in effect, and a shadow set that breaks
//! and recovers without touching the live policy.

use std::path::Path;

use super::*;
use crate::policy::diff::Change;
use crate::policy::{Gate, Risk};

const TOOLS: &str = r#"
[[tools]]
upstream = "incidents"
match = ["get_incident"]
risk = "read"

[[tools]]
upstream = "incidents"
match = ["restart_service"]
risk = "write"
"#;

const AGENTS: &str = r#"
[[agents]]
name = "sre"
projects = ["sre"]
risks = ["read", "write", "destructive"]
allow = [{}]
"#;

fn facts() -> Vec<Facts> {
    vec![Facts {
        name: "incidents".into(),
        projects: vec!["sre".into()],
        categories: vec!["incidents".into()],
        ..Facts::default()
    }]
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn a_reload_says_which_tools_and_roles_it_changes_by_name() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "10-tools.toml", TOOLS);
    write(dir.path(), "20-agents.toml", AGENTS);
    let store =
        PolicyStore::load_with_shadow(dir.path(), None, facts(), &mut Registry::default()).unwrap();
    // restart_service becomes destructive; a role is added.
    write(
        dir.path(),
        "10-tools.toml",
        &TOOLS.replace("risk = \"write\"", "risk = \"destructive\""),
    );
    write(
        dir.path(),
        "20-agents.toml",
        &format!("{AGENTS}\n[[agents]]\nname = \"auditor\"\nprojects = [\"sre\"]\nrisks = [\"read\"]\nallow = [{{}}]\n"),
    );
    let changes = store.reload().unwrap();
    assert!(
        changes.contains(&Change::RoleAdded("auditor".into())),
        "{changes:?}"
    );
    assert!(
        changes.contains(&Change::Risk {
            upstream: "incidents".into(),
            tool: "restart_service".into(),
            old: Risk::Write,
            new: Risk::Destructive,
        }),
        "{changes:?}"
    );
    assert!(
        changes.contains(&Change::Access {
            role: "sre".into(),
            upstream: "incidents".into(),
            tool: "restart_service".into(),
            old: Some((Risk::Write, Gate::Approve)),
            new: Some((Risk::Destructive, Gate::Approve)),
        }),
        "{changes:?}"
    );
    assert!(
        !changes
            .iter()
            .any(|c| c.to_string().contains("get_incident")),
        "an unchanged tool is not named: {changes:?}"
    );
    // Nothing changed: nothing said.
    assert_eq!(store.reload().unwrap(), Vec::new());
}

#[test]
fn a_broken_shadow_set_is_left_out_and_a_fixed_one_comes_back() {
    let live = tempfile::tempdir().unwrap();
    write(live.path(), "10-tools.toml", TOOLS);
    write(live.path(), "20-agents.toml", AGENTS);
    let shadow = tempfile::tempdir().unwrap();
    write(shadow.path(), "10-tools.toml", "this is not toml = [");
    let mut registry = Registry::default();
    let store =
        PolicyStore::load_with_shadow(live.path(), Some(shadow.path()), facts(), &mut registry)
            .expect("a broken shadow set is not fatal");
    assert!(store.shadow().is_none());
    let metrics = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    };
    assert!(
        metrics().contains("\npolicy_shadow_error 1\n"),
        "{}",
        metrics()
    );
    write(shadow.path(), "10-tools.toml", TOOLS);
    write(shadow.path(), "20-agents.toml", AGENTS);
    store.reload_shadow();
    let loaded = store.shadow().expect("a fixed shadow set is used");
    assert!(loaded.agent("sre").is_some());
    assert!(
        metrics().contains("\npolicy_shadow_error 0\n"),
        "{}",
        metrics()
    );
    // Broken again: left out again; the live policy never moved.
    write(shadow.path(), "20-agents.toml", "[[agents]]\nname = 3\n");
    store.reload_shadow();
    assert!(store.shadow().is_none());
    assert!(store.load_full().agent("sre").is_some());
}
