//! Listed ⇔ callable: for generated policies, runs and tool lists, a tool
//! is in the run's `tools/list` exactly when a `tools/call` of it would not
//! be answered as an unknown tool, in every run mode and both eras; and a
//! call the policy lets through is judged the same by the verdict `test`,
//! `audit replay` and the shadow policy use.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::auth::{Audience, Claims, Mode};
use crate::config::{self, Upstream};
use crate::session::Principal;
use crate::tasks::Tasks;
use crate::verdict::answer::{tool_visible, Scope};

const PROJECTS: [&str; 3] = ["sre", "platform", "data"];
const TOOLS: [&str; 8] = [
    "get_pods",
    "list_nodes",
    "delete_pod",
    "restart_service",
    "apply_manifest",
    "query",
    "run_command",
    "export_csv",
];
const GLOBS: [&str; 6] = ["get_*", "list_*", "delete_*", "*_service", "*", "query"];
const RISKS: [&str; 3] = ["read", "write", "destructive"];
const GATES: [&str; 3] = ["allow", "approve", "deny"];

/// Two upstreams: `a` (projects sre, platform; category ops), `b` (data;
/// trusts annotations).
fn upstreams() -> Vec<Arc<Upstream>> {
    let text = r#"
[server]
listen = "127.0.0.1:0"
plaintext = true
[auth]
mcp_audience = "mcp-firewall"
admin_audience = "mcp-firewall-admin"
issuers = ["https://idp.test"]
service_account_issuer = "https://idp.test"
[[auth.keys]]
alg = "HS256"
secret = "test-secret-that-is-long-enough-for-hs256!"
[[upstream]]
name = "a"
url = "http://x/mcp"
projects = ["sre", "platform"]
categories = ["ops"]
[[upstream]]
name = "b"
url = "http://x/mcp"
projects = ["data"]
categories = ["warehouse"]
trust_annotations = true
"#;
    match config::load_str(text, Path::new("t.toml"), Path::new("."), &|_| None) {
        Ok(c) => c.upstreams,
        Err(e) => panic!("test config: {e}"),
    }
}

/// A generated role.
#[derive(Debug, Clone)]
struct Role {
    projects: Vec<usize>,
    risks: Vec<usize>,
    allow: Vec<(Option<usize>, Option<usize>)>,
    deny: Vec<(Option<usize>, Option<usize>)>,
    gates: Vec<Option<usize>>,
}

fn role() -> impl Strategy<Value = Role> {
    let rule = (
        proptest::option::of(0..2usize),
        proptest::option::of(0..GLOBS.len()),
    );
    (
        proptest::collection::vec(0..PROJECTS.len(), 0..3),
        proptest::collection::vec(0..3usize, 0..4),
        proptest::collection::vec(rule.clone(), 0..3),
        proptest::collection::vec(rule, 0..2),
        proptest::collection::vec(proptest::option::of(0..3usize), 3),
    )
        .prop_map(|(projects, risks, allow, deny, gates)| Role {
            projects,
            risks,
            allow,
            deny,
            gates,
        })
}

fn list(items: impl IntoIterator<Item = String>) -> String {
    let v: Vec<String> = items.into_iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", v.join(", "))
}

fn rule_text(r: &(Option<usize>, Option<usize>)) -> String {
    let mut parts = Vec::new();
    if let Some(u) = r.0 {
        parts.push(format!("upstream = {:?}", ["a", "b"][u]));
    }
    if let Some(g) = r.1 {
        parts.push(format!("tools = [{:?}]", GLOBS[g]));
    }
    format!("{{ {} }}", parts.join(", "))
}

/// The policy text: default gates, `[[tools]]` risks for some tools, the
/// roles, a service account bound to the first role.
fn policy_text(gates: &[usize], tool_risks: &[(usize, usize)], roles: &[Role]) -> String {
    let mut t = format!(
        "[gates]\nread = {:?}\nwrite = {:?}\ndestructive = {:?}\n",
        GATES[gates[0]], GATES[gates[1]], GATES[gates[2]]
    );
    for (tool, risk) in tool_risks {
        t.push_str(&format!(
            "\n[[tools]]\nupstream = \"*\"\nmatch = [{:?}]\nrisk = {:?}\n",
            TOOLS[*tool], RISKS[*risk]
        ));
    }
    for (i, r) in roles.iter().enumerate() {
        t.push_str(&format!(
            "\n[[agents]]\nname = \"role{i}\"\nprojects = {}\nrisks = {}\nallow = [{}]\ndeny = [{}]\n",
            list(r.projects.iter().map(|p| PROJECTS[*p].to_owned())),
            list(r.risks.iter().map(|k| RISKS[*k].to_owned())),
            r.allow.iter().map(rule_text).collect::<Vec<_>>().join(", "),
            r.deny.iter().map(rule_text).collect::<Vec<_>>().join(", "),
        ));
        let overrides: Vec<String> = r
            .gates
            .iter()
            .enumerate()
            .filter_map(|(k, g)| g.map(|g| format!("{} = {:?}", RISKS[k], GATES[g])))
            .collect();
        if !overrides.is_empty() {
            t.push_str(&format!("[agents.gates]\n{}\n", overrides.join("\n")));
        }
    }
    t.push_str("\n[[service_accounts]]\nname = \"svc\"\nagent = \"role0\"\nprojects = [\"sre\", \"data\"]\n");
    t
}

/// A generated run: which role, mode, the caller's projects and ceiling.
#[derive(Debug, Clone)]
struct RunSpec {
    role: usize,
    mode: usize,
    projects: Vec<usize>,
    ceiling: Option<Vec<usize>>,
}

fn run_spec() -> impl Strategy<Value = RunSpec> {
    (
        0..3usize,
        0..3usize,
        proptest::collection::vec(0..PROJECTS.len(), 0..3),
        proptest::option::of(proptest::collection::vec(0..PROJECTS.len(), 0..3)),
    )
        .prop_map(|(role, mode, projects, ceiling)| RunSpec {
            role,
            mode,
            projects,
            ceiling,
        })
}

fn claims(spec: &RunSpec) -> Claims {
    let names =
        |v: &[usize]| -> Vec<String> { v.iter().map(|p| PROJECTS[*p].to_owned()).collect() };
    let mode = [Mode::Caller, Mode::Agent, Mode::ServiceAccount][spec.mode];
    Claims {
        sub: if mode == Mode::ServiceAccount {
            "svc"
        } else {
            "alice"
        }
        .into(),
        tenant_id: "acme".into(),
        agent: format!("role{}", spec.role).into(),
        run_id: "run-1".to_owned(),
        mode,
        projects: names(&spec.projects).into(),
        project_ceiling: spec.ceiling.as_deref().map(|c| names(c).into()),
        scopes: Vec::new().into(),
        jti: "j".to_owned(),
        iss: "https://idp.test".into(),
        exp: 0,
        iat: 0,
        nbf: None,
        run_exp: None,
        audience: Audience::Mcp,
        kid: None,
        delegation: Vec::new().into(),
    }
}

/// A listed tool: its name, its annotations (none, read-only, not
/// destructive, destructive) and its schema (plain, a valid
/// `x-mcp-header` parameter, an invalid one).
fn definition(tool: usize, hint: usize, schema: usize) -> Value {
    let annotations = match hint {
        1 => json!({"readOnlyHint": true}),
        2 => json!({"readOnlyHint": false, "destructiveHint": false}),
        3 => json!({"destructiveHint": true}),
        _ => json!({}),
    };
    let input_schema = match schema {
        1 => {
            json!({"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}})
        }
        2 => {
            json!({"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "not a token"}}})
        }
        _ => json!({"type": "object"}),
    };
    json!({
        "name": TOOLS[tool],
        "annotations": annotations,
        "inputSchema": input_schema,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_tool_is_listed_exactly_when_a_call_of_it_is_not_an_unknown_tool(
        gates in proptest::collection::vec(0..3usize, 3),
        tool_risks in proptest::collection::vec((0..TOOLS.len(), 0..3usize), 0..6),
        roles in proptest::collection::vec(role(), 3),
        run in run_spec(),
        hints in proptest::collection::vec((0..4usize, 0..3usize), TOOLS.len()),
    ) {
        let text = policy_text(&gates, &tool_risks, &roles);
        let policy = match crate::policy::compile(&[(PathBuf::from("p.toml"), text.clone())]) {
            Ok(p) => p,
            // Generated text the compiler refuses (a role with no risks is
            // fine; duplicate names cannot happen): nothing to check.
            Err(e) => return Err(TestCaseError::reject(format!("{e}"))),
        };
        let pins = crate::pins::PinStore::empty();
        let tasks = Tasks::default();
        let claims = claims(&run);
        let identity = crate::verdict::identity(&claims, true);
        let authority = match policy.authority(&identity) {
            Ok(a) => a,
            // No authority: nothing is listed and every upstream is a 404.
            Err(_) => return Ok(()),
        };
        for up in upstreams() {
            for (tool, (hint, schema)) in hints.iter().enumerate() {
                let entry = crate::catalog::ToolEntry::of(definition(tool, *hint, *schema));
                let name = TOOLS[tool];
                let judge = Judge {
                    policy: &policy,
                    identity: &identity,
                    authority: &authority,
                    upstream: &up,
                    pins: &pins,
                };
                let args = json!({});
                let called = judge.decide(name, &entry, &args);
                let callable = !matches!(called, Err(Refused::Unknown(_)) | Err(Refused::Pin(_)));
                for stateless in [false, true] {
                    let scope = Scope {
                        policy: &policy,
                        authority: &authority,
                        upstream: &up,
                        stateless,
                        tasks: &tasks,
                        principal: Principal {
                            issuer: &claims.iss,
                            tenant: &claims.tenant_id,
                            subject: &claims.sub,
                            upstream: &up.name,
                            run: &claims.run_id,
                        },
                    };
                    // As the relay lists it: pinned (no pins here), its
                    // x-mcp-header annotations checked.
                    let valid_headers = entry.param_headers().violation().is_none();
                    let listed = tool_visible(scope, name, entry.hints, true, valid_headers);
                    prop_assert_eq!(
                        listed.is_some(),
                        callable,
                        "{} on {} (stateless {}): listed {:?}, call {:?}\n{}",
                        name, up.name, stateless, listed, called, text
                    );
                    // What the list shows is what the call is judged at.
                    if let (Some((risk, gate)), Ok((decision, _))) = (listed, &called) {
                        let (r, g) = match decision {
                            Decision::Allow { risk } => (*risk, Gate::Allow),
                            Decision::Approve { risk } => (*risk, Gate::Approve),
                            Decision::Deny { risk, .. } => (*risk, gate),
                            Decision::Unknown(_) => unreachable!("decide never returns Unknown in Ok"),
                        };
                        prop_assert_eq!((risk, gate), (r, g));
                    }
                }
                // The verdict `test`, replay and the shadow use agrees.
                let v = judge.verdict(name, &entry, Some("{}"), &args, None);
                prop_assert_eq!(v.kind == Kind::Hidden, !callable);
                prop_assert_eq!(judge.kind(name, &entry, Some("{}"), &args), v.kind);
            }
        }
    }
}
