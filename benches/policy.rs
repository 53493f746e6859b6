//! Cost of the policy on the request path, against the shipped policies
//! (`policies/`): one `tools/call` decision (authority, risk, role, gate,
//! CEL conditions; target: well under 10 µs), the same with the per-call
//! arguments parse the decide step does, and filtering plus re-serializing
//! a 100-tool `tools/list` with `rewrite::tools_list` and `Policy::access`
//! (target: well under 200 µs), with and without the catalog bookkeeping the
//! relay adds per listed tool.

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mcp_firewall::config::{self, Config};
use mcp_firewall::internals::Catalogs;
use mcp_firewall::mcp::rewrite;
use mcp_firewall::policy::{self, Access, Call, Decision, Identity, Mode, Policy};
use serde_json::{json, Value};
use std::hint::black_box;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A config with the upstreams the shipped policies talk about.
fn config() -> Config {
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
plaintext = true
[auth]
mcp_audience = "mcp-firewall"
admin_audience = "mcp-firewall-admin"
issuers = ["https://idp.bench"]
[[auth.keys]]
alg = "HS256"
secret = "bench-secret-that-is-long-enough-for-hs256!"
[policy]
dir = "{}"
[[upstream]]
name = "incidents"
url = "http://127.0.0.1:1/mcp"
projects = ["sre"]
categories = ["incidents"]
[[upstream]]
name = "k8s-prod"
url = "http://127.0.0.1:1/mcp"
projects = ["sre", "platform"]
categories = ["kubernetes"]
"#,
        root().join("policies").display()
    );
    config::load_str(&text, Path::new("bench.toml"), root(), &|_| None).expect("bench config")
}

fn identity<'a>(agent: &'a str, projects: &'a [String]) -> Identity<'a> {
    Identity {
        subject: "alice",
        tenant: "acme",
        agent,
        run_id: "run-1",
        mode: Mode::Caller,
        projects,
        ceiling: None,
        service_issuer: false,
    }
}

fn decide(
    policy: &Policy,
    id: &Identity<'_>,
    up: &config::Upstream,
    tool: &str,
    args: &Value,
) -> Decision {
    let authority = policy.authority(id).expect("authority");
    policy.decide(
        &Call {
            identity: id,
            authority: &authority,
            upstream: up.facts(),
            tool,
            arguments: args,
            hints: None,
        },
        None,
    )
}

/// One decision to measure and the verdict it must get.
struct Case<'a> {
    name: &'static str,
    id: &'a Identity<'a>,
    up: &'a config::Upstream,
    tool: &'static str,
    args: Value,
    expect: fn(&Decision) -> bool,
}

fn decisions(c: &mut Criterion) {
    let cfg = config();
    let policy = policy::load_dir(&root().join("policies")).expect("shipped policies");
    let incidents = &cfg.upstreams[0];
    let k8s = &cfg.upstreams[1];
    let projects = vec!["sre".to_owned(), "platform".to_owned()];
    let lead = identity("sre-lead", &projects);
    let investigator = identity("incident-investigator", &projects);
    let cases = [
        Case {
            name: "allow_no_condition",
            id: &investigator,
            up: incidents,
            tool: "get_incident",
            args: json!({"incident_id": "INC-1001"}),
            expect: |d| matches!(d, Decision::Allow { .. }),
        },
        Case {
            name: "allow_cel_regex_condition",
            id: &lead,
            up: incidents,
            tool: "get_deployment",
            args: json!({"deployment_id": "dep-1042"}),
            expect: |d| matches!(d, Decision::Allow { .. }),
        },
        Case {
            name: "deny_by_condition",
            id: &lead,
            up: incidents,
            tool: "get_deployment",
            args: json!({"deployment_id": "latest"}),
            expect: |d| matches!(d, Decision::Deny { .. }),
        },
        Case {
            name: "approve_gate_after_condition",
            id: &lead,
            up: incidents,
            tool: "rollback_deployment",
            args: json!({"deployment_id": "dep-1042", "reason": "bad deploy"}),
            expect: |d| matches!(d, Decision::Approve { .. }),
        },
        Case {
            name: "hidden_by_role",
            id: &investigator,
            up: incidents,
            tool: "restart_service",
            args: json!({"service": "checkout"}),
            expect: |d| matches!(d, Decision::Unknown(_)),
        },
        Case {
            name: "allow_k8s_namespace_condition",
            id: &lead,
            up: k8s,
            tool: "get_pods",
            args: json!({"namespace": "sre"}),
            expect: |d| matches!(d, Decision::Allow { .. }),
        },
    ];
    let mut group = c.benchmark_group("policy_decide");
    for case in &cases {
        let decision = decide(&policy, case.id, case.up, case.tool, &case.args);
        assert!((case.expect)(&decision), "{}: got {decision:?}", case.name);
        group.bench_function(case.name, |b| {
            b.iter(|| {
                decide(
                    &policy,
                    black_box(case.id),
                    case.up,
                    black_box(case.tool),
                    black_box(&case.args),
                )
            })
        });
    }
    // What the decide step does per call: parse the raw arguments into a
    // Value, then decide (the authority is computed once per request).
    let raw = r#"{"deployment_id":"dep-1042"}"#;
    group.bench_function("parse_arguments_then_decide", |b| {
        b.iter(|| {
            let args: Value = serde_json::from_str(black_box(raw)).unwrap_or(Value::Null);
            decide(&policy, &lead, incidents, "get_deployment", &args)
        })
    });
    group.finish();
}

/// A 100-tool `tools/list` answer for a Kubernetes MCP server: names the
/// shipped policy classifies (reads, writes, destructive) and schemas of
/// realistic size.
fn k8s_list() -> String {
    let verbs = [
        "get", "list", "describe", "logs", "events", "apply", "patch", "scale", "annotate",
        "label", "delete", "restart", "exec", "drain", "cordon",
    ];
    let kinds = [
        "pod",
        "deployment",
        "service",
        "node",
        "configmap",
        "secret",
        "job",
        "ingress",
    ];
    let mut tools = Vec::new();
    'outer: for kind in kinds {
        for verb in verbs {
            if tools.len() == 100 {
                break 'outer;
            }
            let name = if matches!(verb, "logs" | "events") {
                format!("{verb}_{kind}")
            } else if verb == "list" {
                format!("list_{kind}s")
            } else {
                format!("{verb}_{kind}")
            };
            tools.push(json!({
                "name": name,
                "title": format!("{verb} {kind}"),
                "description": format!("{verb} a Kubernetes {kind} in a namespace of the cluster. Returns the object as YAML with status and recent events; respects RBAC of the service account."),
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "namespace": {"type": "string", "description": "Namespace", "pattern": "^[a-z0-9-]{1,63}$"},
                        "name": {"type": "string", "description": format!("Name of the {kind}")},
                        "labelSelector": {"type": "string", "description": "Label selector, e.g. app=web"},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}
                    },
                    "required": ["namespace"],
                    "additionalProperties": false
                },
                "annotations": {"readOnlyHint": matches!(verb, "get" | "list" | "describe" | "logs" | "events")}
            }));
        }
    }
    json!({"jsonrpc": "2.0", "id": 7, "result": {"tools": tools}}).to_string()
}

fn tools_list(c: &mut Criterion) {
    let cfg = config();
    let policy = policy::load_dir(&root().join("policies")).expect("shipped policies");
    let k8s = &cfg.upstreams[1];
    let projects = vec!["sre".to_owned(), "platform".to_owned()];
    let list = k8s_list();
    let mut group = c.benchmark_group("policy_tools_list");
    group.throughput(Throughput::Bytes(list.len() as u64));
    for role in ["observability", "sre-lead"] {
        let authority = policy
            .authority(&identity(role, &projects))
            .expect("authority");
        let filter = |list: &str| {
            rewrite::tools_list(list, |t| {
                match policy.access(&authority, k8s.facts(), t.name, None) {
                    Access::Visible { risk, gate, .. } => Some((risk, gate)),
                    Access::Hidden(_) => None,
                }
            })
            .expect("rewrite")
        };
        let kept = filter(&list).matches("\"inputSchema\"").count();
        assert!(kept > 0 && kept <= 100, "{role}: kept {kept}");
        group.bench_function(format!("100_tools_{role}_keeps_{kept}"), |b| {
            b.iter(|| filter(black_box(&list)))
        });
    }
    // As the relay does it: each listed tool also goes through the catalog
    // (hash of its bytes; parsed only when changed) and its x-mcp-header
    // check, before the policy.
    let catalogs = Catalogs::default();
    let authority = policy
        .authority(&identity("observability", &projects))
        .expect("authority");
    let relay = |list: &str| {
        rewrite::tools_list(list, |t| {
            let entry = catalogs.record_listed(&k8s.name, t);
            if entry.param_headers().violation().is_some() {
                return None;
            }
            match policy.access(&authority, k8s.facts(), t.name, entry.hints) {
                Access::Visible { risk, gate, .. } => Some((risk, gate)),
                Access::Hidden(_) => None,
            }
        })
        .expect("rewrite")
    };
    relay(&list);
    group.bench_function("100_tools_observability_with_catalog", |b| {
        b.iter(|| relay(black_box(&list)))
    });
    group.finish();
}

criterion_group!(benches, decisions, tools_list);
criterion_main!(benches);
