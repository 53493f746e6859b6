//! Tests of [`effect`] and [`summary`]: two policies compiled from TOML
//! texts, and the exact changes in effect between them.

use std::path::{Path, PathBuf};

use super::*;
use crate::policy::{compile, load_dir, Gate, Policy, Risk, UpstreamFacts};

fn policy(text: &str) -> Policy {
    compile(&[(PathBuf::from("p.toml"), text.to_owned())]).expect("test policy compiles")
}

/// Route names and projects of the upstreams the tests compare over.
struct Estate(Vec<(&'static str, Vec<String>)>);

impl Estate {
    fn new(ups: &[(&'static str, &[&str])]) -> Estate {
        Estate(
            ups.iter()
                .map(|(name, projects)| (*name, projects.iter().map(|p| p.to_string()).collect()))
                .collect(),
        )
    }

    fn facts(&self) -> Vec<UpstreamFacts<'_>> {
        self.0
            .iter()
            .map(|(name, projects)| UpstreamFacts {
                name,
                projects,
                categories: &[],
                trust_annotations: false,
                untrusted: false,
                private: false,
                egress: false,
            })
            .collect()
    }
}

/// `incidents` in project sre, `k8s-prod` in project platform.
fn estate() -> Estate {
    Estate::new(&[("incidents", &["sre"]), ("k8s-prod", &["platform"])])
}

fn diff(old: &str, new: &str) -> Vec<Change> {
    let ups = estate();
    effect(&policy(old), &policy(new), &ups.facts())
}

fn access(
    role: &str,
    upstream: &str,
    tool: &str,
    old: Option<(Risk, Gate)>,
    new: Option<(Risk, Gate)>,
) -> Change {
    Change::Access {
        role: role.to_owned(),
        upstream: upstream.to_owned(),
        tool: tool.to_owned(),
        old,
        new,
    }
}

const TOOLS: &str = r#"
[[tools]]
upstream = "incidents"
match = ["get_incident"]
risk = "read"

[[tools]]
upstream = "incidents"
match = ["rollback_deployment"]
risk = "destructive"
"#;

#[test]
fn roles_added_and_removed() {
    let old = format!(
        r#"{TOOLS}
[[agents]]
name = "auditor"
projects = ["sre"]
risks = ["read"]
allow = [{{}}]

[[agents]]
name = "legacy-bot"
projects = ["sre"]
risks = ["read", "write", "destructive"]
allow = [{{}}]
"#
    );
    let new = format!(
        r#"{TOOLS}
[[agents]]
name = "auditor"
projects = ["sre"]
risks = ["read"]
allow = [{{}}]

[[agents]]
name = "observability"
projects = ["sre", "platform"]
risks = ["read"]
allow = [{{}}]
"#
    );
    let changes = diff(&old, &new);
    assert_eq!(
        changes,
        vec![
            Change::RoleAdded("observability".to_owned()),
            Change::RoleRemoved("legacy-bot".to_owned()),
        ]
    );
    assert_eq!(
        summary(&changes),
        r#"role "observability" added; role "legacy-bot" removed"#
    );
}

#[test]
fn role_projects_changed_and_what_they_reach() {
    let tools = r#"
[[tools]]
upstream = "incidents"
match = ["get_incident"]
risk = "read"

[[tools]]
upstream = "k8s-prod"
match = ["get_pods"]
risk = "read"
"#;
    let role = |projects: &str| {
        format!(
            r#"{tools}
[[agents]]
name = "observability"
projects = {projects}
risks = ["read"]
allow = [{{}}]
"#
        )
    };
    let changes = diff(&role(r#"["sre"]"#), &role(r#"["platform", "data"]"#));
    let read = Some((Risk::Read, Gate::Allow));
    assert_eq!(
        changes,
        vec![
            Change::RoleProjects {
                role: "observability".to_owned(),
                gained: vec!["data".to_owned(), "platform".to_owned()],
                lost: vec!["sre".to_owned()],
            },
            // Lost sre: incidents is out of reach.
            access("observability", "incidents", "get_incident", read, None),
            // Gained platform: k8s-prod is in reach.
            access("observability", "k8s-prod", "get_pods", None, read),
        ]
    );
    assert_eq!(
        changes[0].to_string(),
        r#"role "observability" gained projects data, platform, lost projects sre"#
    );
    assert_eq!(
        changes[1].to_string(),
        "role observability, tool incidents/get_incident: allow (read) -> hidden"
    );
}

#[test]
fn risk_change_changes_gates_and_visibility() {
    let with_risk = |risk: &str| {
        format!(
            r#"
[gates]
read = "allow"
write = "approve"
destructive = "approve"

[[tools]]
upstream = "incidents"
match = ["get_incident"]
risk = "read"

[[tools]]
upstream = "incidents"
match = ["restart_service"]
risk = "{risk}"

[[agents]]
name = "sre-lead"
projects = ["sre"]
risks = ["read", "write", "destructive"]
allow = [{{}}]

[[agents]]
name = "auditor"
projects = ["sre"]
risks = ["read"]
allow = [{{}}]
"#
        )
    };
    let changes = diff(&with_risk("read"), &with_risk("destructive"));
    assert_eq!(
        changes,
        vec![
            Change::Risk {
                upstream: "incidents".to_owned(),
                tool: "restart_service".to_owned(),
                old: Risk::Read,
                new: Risk::Destructive,
            },
            // The auditor may not use destructive tools: hidden now.
            access(
                "auditor",
                "incidents",
                "restart_service",
                Some((Risk::Read, Gate::Allow)),
                None
            ),
            // The lead still sees it, but a person must approve it now.
            access(
                "sre-lead",
                "incidents",
                "restart_service",
                Some((Risk::Read, Gate::Allow)),
                Some((Risk::Destructive, Gate::Approve))
            ),
        ]
    );
    assert_eq!(
        summary(&changes),
        "tool incidents/restart_service: risk read -> destructive; \
         role auditor, tool incidents/restart_service: allow (read) -> hidden; \
         role sre-lead, tool incidents/restart_service: allow (read) -> approve (destructive)"
    );
}

#[test]
fn tool_newly_denied_to_a_role_is_hidden() {
    let lead = |deny: &str| {
        format!(
            r#"{TOOLS}
[[agents]]
name = "sre-lead"
projects = ["sre"]
risks = ["read", "write", "destructive"]
allow = [{{}}]
{deny}
"#
        )
    };
    let changes = diff(
        &lead(""),
        &lead(r#"deny = [{ tools = ["rollback_deployment"] }]"#),
    );
    assert_eq!(
        changes,
        vec![access(
            "sre-lead",
            "incidents",
            "rollback_deployment",
            Some((Risk::Destructive, Gate::Approve)),
            None
        )]
    );
    assert_eq!(
        summary(&changes),
        "role sre-lead, tool incidents/rollback_deployment: approve (destructive) -> hidden"
    );
}

#[test]
fn a_tool_named_only_in_the_new_policy_is_compared_too() {
    // Unnamed before, the tool was destructive by default.
    let old = format!(
        r#"{TOOLS}
[[agents]]
name = "auditor"
projects = ["sre"]
risks = ["read"]
allow = [{{}}]
"#
    );
    let new = format!(
        r#"{old}
[[tools]]
upstream = "incidents"
match = ["export_metrics_csv"]
risk = "read"
"#
    );
    assert_eq!(
        diff(&old, &new),
        vec![
            Change::Risk {
                upstream: "incidents".to_owned(),
                tool: "export_metrics_csv".to_owned(),
                old: Risk::Destructive,
                new: Risk::Read,
            },
            access(
                "auditor",
                "incidents",
                "export_metrics_csv",
                None,
                Some((Risk::Read, Gate::Allow))
            ),
        ]
    );
}

#[test]
fn globs_are_not_expanded() {
    let glob = |risk: &str| {
        format!(
            r#"
[[tools]]
upstream = "k8s-*"
match = ["delete_*"]
risk = "{risk}"

[[agents]]
name = "auditor"
projects = ["platform"]
risks = ["read"]
allow = [{{}}]
"#
        )
    };
    assert_eq!(diff(&glob("destructive"), &glob("read")), vec![]);
}

#[test]
fn identical_policies_change_nothing() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let old = load_dir(&dir).expect("shipped policies compile");
    let new = load_dir(&dir).expect("shipped policies compile");
    let ups = Estate::new(&[
        ("incidents", &["sre"]),
        ("k8s-prod", &["platform"]),
        ("prometheus", &["sre", "platform", "data"]),
        ("warehouse", &["data"]),
        ("docs", &["sre", "platform", "data"]),
    ]);
    // The shipped policy names tools for these upstreams: the comparison
    // below is over something.
    assert!(!new.named_tools(ups.facts()[0]).is_empty());
    let changes = effect(&old, &new, &ups.facts());
    assert_eq!(changes, vec![]);
    assert_eq!(summary(&changes), "no change in effect");
}
