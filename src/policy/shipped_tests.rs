//! Decision tests over the shipped policies (`policies/`) and the upstreams of
//! the shipped example config, plus one test per file-validation rule.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::*;
use crate::config::{self, Upstream};

fn shipped() -> Policy {
    load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies"))
        .expect("shipped policies compile")
}

/// The upstreams of config/example.toml (projects, categories, trust), in a
/// plaintext config so no certificate or secret is needed.
fn upstreams() -> Vec<Arc<Upstream>> {
    let text = r#"
[server]
listen = "127.0.0.1:0"
plaintext = true

[auth]
mcp_audience = "mcp-firewall"
admin_audience = "mcp-firewall-admin"
issuers = ["https://idp.test"]
[[auth.keys]]
alg = "HS256"
secret = "test-secret-that-is-long-enough-for-hs256!"
[[upstream]]
name = "incidents"
url = "http://x/mcp"
projects = ["sre"]
categories = ["incidents"]
[[upstream]]
name = "k8s-prod"
url = "http://x/mcp"
projects = ["platform"]
categories = ["kubernetes"]
[[upstream]]
name = "prometheus"
url = "http://x/mcp"
projects = ["sre", "platform", "data"]
categories = ["metrics"]
[[upstream]]
name = "grafana"
url = "http://x/mcp"
projects = ["sre", "platform"]
categories = ["dashboards"]
[[upstream]]
name = "warehouse"
url = "http://x/mcp"
projects = ["data"]
categories = ["database"]
[[upstream]]
name = "docs"
url = "http://x/mcp"
projects = ["sre", "platform", "data"]
categories = ["knowledge"]
trust_annotations = true
[[upstream]]
name = "files"
url = "http://x/mcp"
projects = ["data"]
categories = ["filesystem"]
[[upstream]]
name = "bastion"
url = "http://x/mcp"
projects = ["platform"]
categories = ["ssh"]
"#;
    config::load_str(text, Path::new("t.toml"), Path::new("."), &|_| None)
        .unwrap()
        .upstreams
}

use std::sync::Arc;

struct Run {
    agent: &'static str,
    mode: Mode,
    projects: Vec<String>,
    ceiling: Option<Vec<String>>,
    subject: &'static str,
    service_issuer: bool,
}

fn caller(agent: &'static str, projects: &[&str]) -> Run {
    Run {
        agent,
        mode: Mode::Caller,
        projects: projects.iter().map(|s| s.to_string()).collect(),
        ceiling: None,
        subject: "alice",
        service_issuer: false,
    }
}

impl Run {
    fn identity(&self) -> Identity<'_> {
        Identity {
            subject: self.subject,
            tenant: "acme",
            agent: self.agent,
            run_id: "run-1",
            mode: self.mode,
            projects: &self.projects,
            ceiling: self.ceiling.as_deref(),
            service_issuer: self.service_issuer,
        }
    }
}

#[derive(Debug, PartialEq)]
enum Want {
    Allow(Risk),
    Approve(Risk),
    Deny,
    Hidden(Hidden),
}

fn decide(p: &Policy, run: &Run, upstream: &str, tool: &str, args: Value) -> Want {
    let ups = upstreams();
    let up = ups.iter().find(|u| u.name == upstream).unwrap();
    let id = run.identity();
    let auth = p.authority(&id).unwrap();
    let d = p.decide(
        &Call {
            identity: &id,
            authority: &auth,
            upstream: up.facts(),
            tool,
            arguments: &args,
            hints: None,
        },
        None,
    );
    match d {
        Decision::Allow { risk } => Want::Allow(risk),
        Decision::Approve { risk } => Want::Approve(risk),
        Decision::Deny { .. } => Want::Deny,
        Decision::Unknown(h) => Want::Hidden(h),
    }
}

#[test]
fn policy_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Policy>();
}

/// One case of the four-role matrix: upstream, tool, arguments, and the
/// decision wanted.
type Case = (&'static str, &'static str, Value, Want);

/// The matrix's cases of the sre-lead: every tool under the gates.
fn sre_lead_cases() -> Vec<Case> {
    use super::Hidden as H;
    use Want::*;
    vec![
        ("incidents", "get_incident", json!({}), Allow(Risk::Read)),
        (
            "incidents",
            "post_incident_note",
            json!({}),
            Approve(Risk::Write),
        ),
        (
            "incidents",
            "rollback_deployment",
            json!({"deployment_id": "dep-42"}),
            Approve(Risk::Destructive),
        ),
        (
            "incidents",
            "rollback_deployment_unsafe",
            json!({"deployment_id": "dep-42"}),
            Approve(Risk::Destructive),
        ),
        (
            "k8s-prod",
            "get_pods",
            json!({"namespace": "platform"}),
            Allow(Risk::Read),
        ),
        (
            "k8s-prod",
            "scale_deployment",
            json!({"namespace": "platform"}),
            Approve(Risk::Write),
        ),
        (
            "k8s-prod",
            "delete_pod",
            json!({"namespace": "platform"}),
            Approve(Risk::Destructive),
        ),
        (
            "bastion",
            "run_command",
            json!({}),
            Approve(Risk::Destructive),
        ),
        ("warehouse", "query", json!({}), Hidden(H::Unreachable)),
    ]
}

/// The matrix's cases of the observability: metrics, dashboards, read-only cluster tools.
fn observability_cases() -> Vec<Case> {
    use super::Hidden as H;
    use Want::*;
    vec![
        ("prometheus", "query", json!({}), Allow(Risk::Read)),
        ("grafana", "search_dashboards", json!({}), Allow(Risk::Read)),
        (
            "grafana",
            "create_dashboard",
            json!({}),
            Approve(Risk::Write),
        ),
        (
            "grafana",
            "delete_dashboard",
            json!({}),
            Hidden(H::Risk(Risk::Destructive)),
        ),
        (
            "k8s-prod",
            "get_pods",
            json!({"namespace": "platform"}),
            Allow(Risk::Read),
        ),
        (
            "k8s-prod",
            "logs",
            json!({"namespace": "platform"}),
            Allow(Risk::Read),
        ),
        (
            "k8s-prod",
            "scale_deployment",
            json!({"namespace": "platform"}),
            Hidden(H::Denied),
        ),
        (
            "k8s-prod",
            "apply_manifest",
            json!({"namespace": "platform"}),
            Hidden(H::Denied),
        ),
        (
            "k8s-prod",
            "patch_deployment",
            json!({"namespace": "platform"}),
            Hidden(H::Denied),
        ),
        (
            "k8s-prod",
            "restart_deployment",
            json!({"namespace": "platform"}),
            Hidden(H::Risk(Risk::Destructive)),
        ),
        (
            "k8s-prod",
            "delete_pod",
            json!({"namespace": "platform"}),
            Hidden(H::Risk(Risk::Destructive)),
        ),
        ("bastion", "list_hosts", json!({}), Hidden(H::NotAllowed)),
        ("incidents", "get_incident", json!({}), Allow(Risk::Read)),
        (
            "incidents",
            "rollback_deployment",
            json!({"deployment_id": "dep-42"}),
            Hidden(H::Risk(Risk::Destructive)),
        ),
    ]
}

/// The matrix's cases of the data-analyst: warehouse, docs, files, metrics; nothing on clusters or hosts.
fn data_analyst_cases() -> Vec<Case> {
    use super::Hidden as H;
    use Want::*;
    vec![
        ("warehouse", "query", json!({}), Allow(Risk::Read)),
        ("warehouse", "execute", json!({}), Approve(Risk::Write)),
        (
            "warehouse",
            "drop_table",
            json!({}),
            Hidden(H::Risk(Risk::Destructive)),
        ),
        ("docs", "search", json!({}), Allow(Risk::Read)),
        ("files", "write_file", json!({}), Approve(Risk::Write)),
        ("prometheus", "query_range", json!({}), Allow(Risk::Read)),
        (
            "k8s-prod",
            "get_pods",
            json!({"namespace": "platform"}),
            Hidden(H::Unreachable),
        ),
        (
            "incidents",
            "get_incident",
            json!({}),
            Hidden(H::NotAllowed),
        ),
    ]
}

/// The matrix's cases of the auditor: read-only everywhere.
fn auditor_cases() -> Vec<Case> {
    use super::Hidden as H;
    use Want::*;
    vec![
        ("warehouse", "query", json!({}), Allow(Risk::Read)),
        (
            "k8s-prod",
            "get_pods",
            json!({"namespace": "platform"}),
            Allow(Risk::Read),
        ),
        (
            "k8s-prod",
            "delete_pod",
            json!({"namespace": "platform"}),
            Hidden(H::Risk(Risk::Destructive)),
        ),
        (
            "incidents",
            "post_incident_note",
            json!({}),
            Hidden(H::Risk(Risk::Write)),
        ),
        (
            "incidents",
            "rollback_deployment_unsafe",
            json!({"deployment_id": "dep-42"}),
            Hidden(H::Risk(Risk::Destructive)),
        ),
        ("files", "read_file", json!({}), Allow(Risk::Read)),
    ]
}

#[test]
fn four_role_matrix_over_shipped_policies() {
    let p = shipped();
    let roles = [
        (caller("sre-lead", &["sre", "platform"]), sre_lead_cases()),
        (
            caller("observability", &["sre", "platform"]),
            observability_cases(),
        ),
        (
            caller("data-analyst", &["data", "sre"]),
            data_analyst_cases(),
        ),
        (
            caller("auditor", &["sre", "platform", "data"]),
            auditor_cases(),
        ),
    ];
    let mut failures = Vec::new();
    for (run, cases) in &roles {
        for (up, tool, args, want) in cases {
            let got = decide(&p, run, up, tool, args.clone());
            if got != *want {
                failures.push(format!(
                    "{} {up}/{tool}: want {want:?}, got {got:?}",
                    run.agent
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "decision table mismatches:\n{}",
        failures.join("\n")
    );
}

#[test]
fn unannotated_unnamed_tool_is_destructive() {
    let p = shipped();
    let ups = upstreams();
    let incidents = ups.iter().find(|u| u.name == "incidents").unwrap();
    assert_eq!(
        p.risk(incidents.facts(), "rollback_deployment_unsafe", None),
        (Risk::Destructive, RiskSource::Default)
    );
    // Annotations of an untrusted upstream do not lower it.
    let hints = Some(Hints {
        read_only: Some(true),
        destructive: Some(false),
    });
    assert_eq!(
        p.risk(incidents.facts(), "brand_new_tool", hints).0,
        Risk::Destructive
    );
}

#[test]
fn trusted_annotations_count_only_where_policy_is_silent() {
    let p = shipped();
    let ups = upstreams();
    let docs = ups.iter().find(|u| u.name == "docs").unwrap();
    let read = Some(Hints {
        read_only: Some(true),
        destructive: None,
    });
    assert_eq!(
        p.risk(docs.facts(), "summarize_space", read),
        (Risk::Read, RiskSource::Annotations)
    );
    let write = Some(Hints {
        read_only: Some(false),
        destructive: Some(false),
    });
    assert_eq!(p.risk(docs.facts(), "archive_space", write).0, Risk::Write);
    // Policy names `create_page` as write: a vendor claiming read-only changes nothing.
    assert_eq!(p.risk(docs.facts(), "create_page", read).0, Risk::Write);
    // Trusted but no annotations: destructive.
    assert_eq!(p.risk(docs.facts(), "mystery", None).0, Risk::Destructive);
}

#[test]
fn exact_names_beat_globs() {
    let p = compile(&[(
        PathBuf::from("p.toml"),
        r#"
[[tools]]
match = ["get_*"]
risk = "read"
[[tools]]
match = ["get_and_delete"]
risk = "destructive"
"#
        .to_owned(),
    )])
    .unwrap();
    let ups = upstreams();
    let u = &ups[0];
    assert_eq!(p.risk(u.facts(), "get_thing", None).0, Risk::Read);
    assert_eq!(
        p.risk(u.facts(), "get_and_delete", None).0,
        Risk::Destructive
    );
}

#[test]
fn conditions_on_arguments_deny_with_reason() {
    let p = shipped();
    let lead = caller("sre-lead", &["sre", "platform"]);
    assert_eq!(
        decide(
            &p,
            &lead,
            "incidents",
            "rollback_deployment",
            json!({"deployment_id": "prod; drop"})
        ),
        Want::Deny
    );
    // A missing field denies.
    assert_eq!(
        decide(&p, &lead, "incidents", "rollback_deployment", json!({})),
        Want::Deny
    );
    // Namespace outside the run's projects.
    assert_eq!(
        decide(
            &p,
            &lead,
            "k8s-prod",
            "delete_pod",
            json!({"namespace": "kube-system"})
        ),
        Want::Deny
    );
    // `when` false: the namespace condition does not apply.
    assert_eq!(
        decide(&p, &lead, "k8s-prod", "list_nodes", json!({})),
        Want::Allow(Risk::Read)
    );
}

#[test]
fn deny_reason_names_rule_and_reason() {
    let p = shipped();
    let lead = caller("sre-lead", &["sre"]);
    let ups = upstreams();
    let id = lead.identity();
    let auth = p.authority(&id).unwrap();
    let args = json!({"deployment_id": "nope"});
    let mut trace = Vec::new();
    let d = p.decide(
        &Call {
            identity: &id,
            authority: &auth,
            upstream: (ups[0]).facts(),
            tool: "rollback_deployment",
            arguments: &args,
            hints: None,
        },
        Some(&mut trace),
    );
    match d {
        Decision::Deny { reason, rule, risk } => {
            assert_eq!(risk, Risk::Destructive);
            assert!(reason.contains("dep-<number>"), "{reason}");
            assert!(rule.contains("30-conditions.toml:"), "{rule}");
        }
        other => panic!("expected a denial, got {other:?}"),
    }
    assert!(trace.iter().any(|t| t.contains("is false")), "{trace:?}");
}

#[test]
fn authority_modes() {
    let p = shipped();
    // caller: memberships ∩ caller's projects.
    let id = caller("sre-lead", &["platform", "marketing"]);
    assert_eq!(
        p.authority(&id.identity()).unwrap().projects,
        vec!["platform"]
    );
    // caller with a ceiling.
    let mut id = caller("sre-lead", &["sre", "platform"]);
    id.ceiling = Some(vec!["sre".into()]);
    assert_eq!(p.authority(&id.identity()).unwrap().projects, vec!["sre"]);
    // agent: memberships (∩ ceiling), the token's projects are not needed.
    let mut id = caller("sre-lead", &[]);
    id.mode = Mode::Agent;
    assert_eq!(
        p.authority(&id.identity()).unwrap().projects,
        vec!["data", "platform", "sre"]
    );
    id.ceiling = Some(vec!["data".into(), "other".into()]);
    assert_eq!(p.authority(&id.identity()).unwrap().projects, vec!["data"]);
    // empty intersection: no upstream reachable.
    let id = caller("sre-lead", &["marketing"]);
    let auth = p.authority(&id.identity()).unwrap();
    assert!(auth.projects.is_empty());
    assert!(upstreams().iter().all(|u| !p.reaches(&auth, u.facts())));
    // unknown role.
    let id = caller("root", &["sre"]);
    assert_eq!(
        p.authority(&id.identity()),
        Err(NoAuthority::UnknownAgent("root".into()))
    );
}

#[test]
fn service_accounts_get_exactly_their_bindings() {
    let p = shipped();
    let mut run = caller("reporter", &["sre", "platform", "data"]);
    run.mode = Mode::ServiceAccount;
    run.subject = "svc-nightly-report";
    run.service_issuer = true;
    assert_eq!(
        p.authority(&run.identity()).unwrap(),
        Authority {
            agent: "reporter".into(),
            projects: vec!["sre".into()]
        }
    );
    run.service_issuer = false;
    assert_eq!(
        p.authority(&run.identity()),
        Err(NoAuthority::ServiceIssuer)
    );
    run.service_issuer = true;
    run.subject = "svc-unknown";
    assert!(matches!(
        p.authority(&run.identity()),
        Err(NoAuthority::UnknownServiceAccount(_))
    ));
    run.subject = "svc-nightly-report";
    run.agent = "sre-lead";
    assert!(matches!(
        p.authority(&run.identity()),
        Err(NoAuthority::ServiceAgentMismatch { .. })
    ));
}

#[test]
fn gates_per_role_and_risk() {
    let text = r#"
[gates]
read = "allow"
write = "deny"
destructive = "approve"
[[tools]]
match = ["r"]
risk = "read"
[[tools]]
match = ["w"]
risk = "write"
[[tools]]
match = ["d"]
risk = "destructive"
[[agents]]
name = "strict"
projects = ["sre"]
risks = ["read", "write", "destructive"]
allow = [{}]
[[agents]]
name = "loose"
projects = ["sre"]
risks = ["read", "write", "destructive"]
allow = [{}]
gates = { read = "approve", write = "allow", destructive = "deny" }
"#;
    let p = compile(&[(PathBuf::from("g.toml"), text.to_owned())]).unwrap();
    let strict = caller("strict", &["sre"]);
    let loose = caller("loose", &["sre"]);
    let none = json!({});
    assert_eq!(
        decide(&p, &strict, "incidents", "r", none.clone()),
        Want::Allow(Risk::Read)
    );
    assert_eq!(
        decide(&p, &strict, "incidents", "w", none.clone()),
        Want::Hidden(Hidden::GateDeny(Risk::Write))
    );
    assert_eq!(
        decide(&p, &strict, "incidents", "d", none.clone()),
        Want::Approve(Risk::Destructive)
    );
    assert_eq!(
        decide(&p, &loose, "incidents", "r", none.clone()),
        Want::Approve(Risk::Read)
    );
    assert_eq!(
        decide(&p, &loose, "incidents", "w", none.clone()),
        Want::Allow(Risk::Write)
    );
    assert_eq!(
        decide(&p, &loose, "incidents", "d", none),
        Want::Hidden(Hidden::GateDeny(Risk::Destructive))
    );
}

#[test]
fn prompts_and_resources_follow_membership_and_rules() {
    let p = shipped();
    let ups = upstreams();
    let incidents = ups.iter().find(|u| u.name == "incidents").unwrap();
    let k8s = ups.iter().find(|u| u.name == "k8s-prod").unwrap();
    let auditor = caller("auditor", &["sre"]);
    let auth = p.authority(&auditor.identity()).unwrap();
    assert!(p.prompt_allowed(&auth, incidents.facts(), "triage"));
    assert!(
        !p.prompt_allowed(&auth, k8s.facts(), "triage"),
        "unreachable upstream"
    );
    assert!(p.resource_allowed(&auth, incidents.facts(), "incident://INC-1001"));
    assert!(!p.resource_allowed(&auth, incidents.facts(), "secret://db-password"));
}

fn compile_err(text: &str) -> String {
    match compile(&[(PathBuf::from("bad.toml"), text.to_owned())]) {
        Ok(_) => panic!("policy unexpectedly valid:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_key_names_file_and_line() {
    let e = compile_err("[[agents]]\nname = \"a\"\nallow = [{}]\nmax_stepz = 3\n");
    assert!(e.starts_with("bad.toml: "), "{e}");
    assert!(e.contains("max_stepz") && e.contains("line 4"), "{e}");
}

#[test]
fn bad_cel_names_file_and_line() {
    let e = compile_err(
        "\n\n[[conditions]]\ntools = [\"x\"]\nrequire = \"arguments.a ==\"\nreason = \"r\"\n",
    );
    assert!(e.starts_with("bad.toml:5: CEL expression"), "{e}");
}

#[test]
fn bad_risk_value_is_rejected() {
    let e = compile_err("[[tools]]\nmatch = [\"x\"]\nrisk = \"harmless\"\n");
    assert!(e.contains("harmless"), "{e}");
}

#[test]
fn duplicate_agents_are_rejected() {
    let e = compile_err("[[agents]]\nname = \"a\"\n[[agents]]\nname = \"a\"\n");
    assert!(e.contains("defined twice"), "{e}");
}

#[test]
fn service_account_with_unknown_agent_is_rejected() {
    let e = compile_err("[[service_accounts]]\nname = \"svc\"\nagent = \"ghost\"\nprojects = []\n");
    assert!(e.contains("unknown agent \"ghost\""), "{e}");
}

#[test]
fn bad_glob_is_rejected() {
    let e = compile_err("[[tools]]\nmatch = [\"get_[\"]\nrisk = \"read\"\n");
    assert!(e.contains("bad glob"), "{e}");
}

#[test]
fn gates_twice_is_rejected() {
    let r = compile(&[
        (
            PathBuf::from("a.toml"),
            "[gates]\nread = \"allow\"\n".to_owned(),
        ),
        (
            PathBuf::from("b.toml"),
            "[gates]\nread = \"deny\"\n".to_owned(),
        ),
    ]);
    assert!(r
        .err()
        .unwrap()
        .to_string()
        .contains("already set in a.toml"));
}

#[test]
fn memoized_decisions_match_fresh_ones_in_any_order() {
    // One policy answers many runs: the memo must key on everything the
    // rules read (role, upstream, tool, hints) and nothing run-specific
    // may leak through it (projects, arguments).
    let ups = upstreams();
    let docs = ups.iter().find(|u| u.name == "docs").unwrap();
    let runs = [
        caller("sre-lead", &["sre", "platform"]),
        caller("auditor", &["sre", "platform", "data"]),
        caller("observability", &["data"]),
        caller("data-analyst", &["data", "sre"]),
    ];
    let hints = [
        None,
        Some(Hints {
            read_only: Some(true),
            destructive: None,
        }),
        Some(Hints {
            read_only: Some(false),
            destructive: Some(true),
        }),
    ];
    let tools = ["summarize_space", "create_page", "mystery", "search"];
    let warm = shipped();
    let mut seen = 0;
    for pass in 0..2 {
        for run in &runs {
            for tool in tools {
                for h in hints {
                    let id = run.identity();
                    let fresh = shipped();
                    let Ok(auth) = fresh.authority(&id) else {
                        continue;
                    };
                    let want = fresh.access(&auth, docs.facts(), tool, h);
                    let got = warm.access(&auth, docs.facts(), tool, h);
                    assert_eq!(got, want, "pass {pass}: {} {tool} {h:?}", run.agent);
                    if matches!(want, Access::Visible { .. }) {
                        seen += 1;
                    }
                }
            }
        }
    }
    assert!(seen > 0, "some combination must be visible");
    // A run that does not reach the upstream is refused whatever the memo holds.
    let outsider = caller("sre-lead", &["platform"]);
    let id = outsider.identity();
    let auth = warm.authority(&id).unwrap();
    let files = ups.iter().find(|u| u.name == "files").unwrap();
    assert_eq!(
        warm.access(&auth, files.facts(), "read_file", None),
        Access::Hidden(Hidden::Unreachable)
    );
}

#[test]
fn the_memo_stops_growing_at_its_bound() {
    let p = shipped();
    let ups = upstreams();
    let docs = ups.iter().find(|u| u.name == "docs").unwrap();
    let run = caller("sre-lead", &["sre", "platform"]);
    let id = run.identity();
    let auth = p.authority(&id).unwrap();
    for i in 0..MEMO_MAX + 100 {
        let _ = p.access(&auth, docs.facts(), &format!("invented_{i}"), None);
    }
    assert_eq!(p.memo.entries.len(), MEMO_MAX);
    // Past the bound, answers are still computed correctly.
    assert_eq!(
        p.access(&auth, docs.facts(), "create_page", None),
        shipped().access(&auth, docs.facts(), "create_page", None)
    );
}
