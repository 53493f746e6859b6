//! Tests of the generated firewall config and the bench policies, checked by
//! the firewall's own loader and policy engine.

use std::path::Path;

use mcp_firewall::policy::{self, Access, Decision, Identity, Mode, Risk};

use super::*;
use crate::catalog::{self, Catalog, Class};

fn layout(dir: &Path) -> Layout {
    Layout {
        listen: "127.0.0.1:18080".parse().unwrap(),
        admin: "127.0.0.1:19090".parse().unwrap(),
        upstream: "127.0.0.1:18081".parse().unwrap(),
        key_file: dir.join("k.pem"),
        policy_dir: dir.join("policies"),
        shadow_dir: None,
        spool_dir: dir.join("spool"),
        signing_key: dir.join("audit.key"),
    }
}

fn load(dir: &Path, spec: &Spec) -> mcp_firewall::config::Config {
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    write_policies(&dir.join("policies")).unwrap();
    let issuer = tokens::Issuer::generate().unwrap();
    std::fs::write(dir.join("k.pem"), issuer.public_pem()).unwrap();
    let text = config_text(spec, &layout(dir));
    mcp_firewall::config::load_str(&text, Path::new("bench.toml"), dir, &|_| None)
        .unwrap_or_else(|e| panic!("generated config refused: {e}\n{text}"))
}

fn spec(audit: bool, tls: Option<(PathBuf, PathBuf)>) -> Spec {
    Spec {
        name: "fw".into(),
        tls,
        audit: audit.then(|| AuditSink {
            url: "http://127.0.0.1:1".into(),
            database: "bench_x".into(),
            chain: true,
        }),
        log_level: "warn".into(),
        upstream_http2: false,
        state: None,
        screening: true,
        shadow: false,
        virtual_servers: None,
        stdio: None,
        token_exchange: None,
    }
}

#[test]
fn generated_configs_load_with_and_without_audit() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = load(dir.path(), &spec(true, None));
    assert_eq!(cfg.upstreams.len(), ROUTES.len());
    assert!(cfg.audit.as_ref().is_some_and(|a| a.enabled));
    // Limits stay on, far above any bench load (the defaults, 8 steps and
    // 20 calls/s per run, would turn most bench calls into skipped results).
    assert_eq!(cfg.limits.default_max_steps, 1_000_000_000);
    assert!(cfg.limits.per_run_per_s >= 1_000_000);
    assert!(cfg.limits.per_tenant_per_s >= 1_000_000);
    assert_eq!(
        cfg.upstreams[1].url.to_string(),
        "http://127.0.0.1:18081/mcp/bench-sse"
    );
    assert!(cfg.upstreams.iter().all(|u| !u.http2));
    let cfg = load(dir.path(), &spec(false, None));
    assert!(cfg.audit.as_ref().is_some_and(|a| !a.enabled));
    assert!(cfg.server.tls.is_none());
    let mut h2 = spec(false, None);
    h2.upstream_http2 = true;
    let cfg = load(dir.path(), &h2);
    assert!(cfg
        .upstreams
        .iter()
        .all(|u| u.http2 && u.http2_max_streams == 100));
}

#[test]
fn the_stdio_upstreams_load_per_run_and_shared() {
    use mcp_firewall::internals::Instances;
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(false, None);
    s.stdio = Some(vec!["/bin/sh".into(), "-c".into(), "exit 0".into()]);
    let cfg = load(dir.path(), &s);
    let of = |name: &str| {
        cfg.upstreams
            .iter()
            .find(|u| u.name == name)
            .and_then(|u| u.stdio.clone())
            .unwrap_or_else(|| panic!("{name} is a stdio upstream"))
    };
    let per_run = of(STDIO_ROUTE);
    assert_eq!(per_run.instances, Instances::PerSession);
    assert_eq!(per_run.command, ["/bin/sh", "-c", "exit 0"]);
    assert_eq!(per_run.sandbox, mcp_firewall::sandbox::Spec::default());
    assert_eq!(of(STDIO_SHARED_ROUTE).instances, Instances::Shared);
}

#[test]
fn the_redis_target_shares_budgets_in_redis_and_fails_closed() {
    use mcp_firewall::internals::{Fallback, StateBackend as Backend};
    let dir = tempfile::tempdir().unwrap();
    let cfg = load(dir.path(), &spec(true, None));
    assert_eq!(cfg.state.backend, Backend::Memory);
    let mut shared = spec(true, None);
    shared.state = Some(SharedState {
        redis_url: "redis://127.0.0.1:6390".into(),
        key_prefix: "bench".into(),
    });
    let cfg = load(dir.path(), &shared);
    assert_eq!(cfg.state.backend, Backend::Redis);
    assert_eq!(
        cfg.state.redis_url.as_deref(),
        Some("redis://127.0.0.1:6390")
    );
    assert_eq!(cfg.state.key_prefix, "bench");
    // Everything else is the audited firewall's config.
    assert!(cfg.audit.as_ref().is_some_and(|a| a.enabled));
    assert_eq!(cfg.limits.default_max_steps, 1_000_000_000);
    let u = cfg.state.on_store_unavailable;
    assert!([u.read, u.write, u.destructive]
        .iter()
        .all(|f| *f == Fallback::Closed));
    let plain = config_text(&spec(true, None), &layout(dir.path()));
    let redis = config_text(&shared, &layout(dir.path()));
    assert!(redis.starts_with(&plain), "only [state] is added");
}

#[test]
fn tls_config_names_the_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let m = crate::tls::Material::generate(dir.path()).unwrap();
    let cfg = load(
        dir.path(),
        &spec(false, Some((m.cert_file.clone(), m.key_file.clone()))),
    );
    assert!(cfg.server.tls.is_some());
}

#[test]
fn virtual_servers_load_with_their_members_and_deadline() {
    use mcp_firewall::internals::Collisions;
    let dir = tempfile::tempdir().unwrap();
    let mut vs = spec(false, None);
    vs.virtual_servers = Some(Virtuals {
        slow_upstream: "127.0.0.1:18082".parse().unwrap(),
    });
    let cfg = load(dir.path(), &vs);
    let names: Vec<&str> = cfg.upstreams.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "bench",
            "bench-sse",
            "bench-hold",
            "bench-fresh",
            "bench-b",
            "bench-c",
            "bench-slow"
        ]
    );
    let url = |name: &str| {
        cfg.upstreams
            .iter()
            .find(|u| u.name == name)
            .unwrap()
            .url
            .to_string()
    };
    // The twins are the canned upstream's `/mcp/bench`; the slow one is
    // the slow upstream's.
    assert_eq!(url("bench-b"), url("bench"));
    assert_eq!(url("bench-c"), "http://127.0.0.1:18081/mcp/bench");
    assert_eq!(url("bench-slow"), "http://127.0.0.1:18082/mcp/bench-slow");
    assert_eq!(cfg.virtual_servers.len(), VIRTUAL_SERVERS.len());
    for (got, want) in cfg.virtual_servers.iter().zip(VIRTUAL_SERVERS) {
        assert_eq!(got.name, want.name);
        assert_eq!(got.members, want.members);
        assert_eq!(got.collisions, Collisions::Prefix);
        assert_eq!(got.separator, VS_SEPARATOR);
        assert_eq!(got.list_timeout, Duration::from_millis(VS_LIST_TIMEOUT_MS));
    }
    assert_eq!(
        cfg.virtual_servers[1].members,
        ["bench", "bench-b", "bench-c"]
    );
    assert_eq!(cfg.virtual_servers[2].members, ["bench", "bench-slow"]);
    // Only added: the plain config is the same without them.
    let plain = config_text(&spec(false, None), &layout(dir.path()));
    let with = config_text(&vs, &layout(dir.path()));
    assert!(with.starts_with(plain.split("[audit]").next().unwrap()));
    assert!(with.ends_with(&virtual_servers_text()));
    // Every member shows a reader the tools `bench` shows (the policies name
    // `bench*`), so vs3 lists three times as many.
    let policy = policy::load_dir(&dir.path().join("policies")).unwrap();
    let projects = vec![tokens::PROJECT.to_owned()];
    let reader = policy
        .authority(&id(tokens::ROLE_READER, &projects))
        .unwrap();
    let cat = Catalog::new(100, 310).unwrap();
    for up in &cfg.upstreams {
        let visible = cat
            .tools
            .iter()
            .filter(|t| {
                matches!(
                    policy.access(&reader, up.facts(), &t.name, None),
                    Access::Visible { .. }
                )
            })
            .count();
        assert_eq!(visible, cat.reads(), "{}", up.name);
    }
}

fn id<'a>(agent: &'a str, projects: &'a [String]) -> Identity<'a> {
    Identity {
        subject: "bench-user-1",
        tenant: "bench-tenant",
        agent,
        run_id: "r1",
        mode: Mode::Caller,
        projects,
        ceiling: None,
        service_issuer: false,
    }
}

#[test]
fn bench_policy_classifies_the_catalog_as_the_scenarios_expect() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = load(dir.path(), &spec(false, None));
    let policy = policy::load_dir(&dir.path().join("policies")).unwrap();
    let projects = vec![tokens::PROJECT.to_owned()];
    let reader = policy
        .authority(&id(tokens::ROLE_READER, &projects))
        .unwrap();
    let operator = policy
        .authority(&id(tokens::ROLE_OPERATOR, &projects))
        .unwrap();
    let cat = Catalog::new(100, 310).unwrap();
    for up in &cfg.upstreams {
        let mut visible = 0;
        for t in &cat.tools {
            let want = match t.class {
                Class::Read => Risk::Read,
                Class::Write => Risk::Write,
                Class::Destructive | Class::Unclassified => Risk::Destructive,
            };
            assert_eq!(policy.risk(up.facts(), &t.name, None).0, want, "{}", t.name);
            if matches!(
                policy.access(&reader, up.facts(), &t.name, None),
                Access::Visible { .. }
            ) {
                visible += 1;
            }
            assert!(matches!(
                policy.access(&operator, up.facts(), &t.name, None),
                Access::Visible { .. }
            ));
        }
        assert_eq!(visible, cat.reads());
    }
}

#[test]
fn scenario_calls_get_the_decisions_the_scenarios_expect() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = load(dir.path(), &spec(false, None));
    let policy = policy::load_dir(&dir.path().join("policies")).unwrap();
    let projects = vec![tokens::PROJECT.to_owned()];
    let up = &cfg.upstreams[0];
    let decide = |role: &str, tool: &str, args: serde_json::Value| {
        let identity = id(role, &projects);
        let authority = policy.authority(&identity).unwrap();
        policy.decide(
            &policy::Call {
                identity: &identity,
                authority: &authority,
                upstream: up.facts(),
                tool,
                arguments: &args,
                hints: None,
            },
            None,
        )
    };
    let call_args = crate::scenario::call_arguments();
    assert_eq!(
        decide(tokens::ROLE_READER, catalog::CALL_TOOL, call_args.clone()),
        Decision::Allow { risk: Risk::Read }
    );
    assert_eq!(
        decide(tokens::ROLE_CAPPED, catalog::CALL_TOOL, call_args),
        Decision::Allow { risk: Risk::Read }
    );
    assert!(matches!(
        decide(
            tokens::ROLE_READER,
            catalog::DENIED_TOOL,
            crate::scenario::denied_arguments()
        ),
        Decision::Deny { .. }
    ));
    assert_eq!(
        decide(
            tokens::ROLE_OPERATOR,
            catalog::GATED_TOOL,
            crate::scenario::gated_arguments()
        ),
        Decision::Approve { risk: Risk::Write }
    );
}

#[test]
fn the_unscreened_target_turns_every_family_off_and_the_canned_result_is_clean() {
    use mcp_firewall::internals::{screen_json, Action, Actions};
    let dir = tempfile::tempdir().unwrap();
    write_policies(dir.path()).unwrap();
    let shipped = policy::load_dir(dir.path()).unwrap();
    assert_eq!(
        shipped.screening().actions("bench", Some("x")),
        Actions::DEFAULT
    );
    std::fs::write(dir.path().join(SCREEN_OFF.0), SCREEN_OFF.1).unwrap();
    let off = policy::load_dir(dir.path()).unwrap();
    assert!(off.screening().actions("bench", Some("x")).all_off());
    // The 4 KB result of the screening cell is screened whole and found
    // clean: the cell measures screening, not redaction.
    let catalog = Catalog::new(100, 4096).unwrap();
    let s = screen_json(
        shipped.screening().scanner(),
        Actions::DEFAULT,
        &catalog.call_result,
    )
    .unwrap();
    assert!(s.report.is_empty(), "{:?}", s.report);
    assert_eq!(s.report.action, Action::Off);
}

#[test]
fn the_shadow_target_decides_with_a_set_that_compiles_and_agrees_with_the_live_one() {
    let dir = tempfile::tempdir().unwrap();
    let shadow = dir.path().join("policies-next");
    std::fs::create_dir_all(&shadow).unwrap();
    write_policies(&shadow).unwrap();
    std::fs::write(shadow.join(SHADOW_CANDIDATE.0), SHADOW_CANDIDATE.1).unwrap();
    std::fs::create_dir_all(dir.path().join("policies")).unwrap();
    write_policies(&dir.path().join("policies")).unwrap();
    let issuer = tokens::Issuer::generate().unwrap();
    std::fs::write(dir.path().join("k.pem"), issuer.public_pem()).unwrap();
    let mut l = layout(dir.path());
    l.shadow_dir = Some(shadow.clone());
    let text = config_text(&spec(true, None), &l);
    let cfg = mcp_firewall::config::load_str(&text, Path::new("bench.toml"), dir.path(), &|_| None)
        .unwrap_or_else(|e| panic!("generated config refused: {e}\n{text}"));
    assert_eq!(cfg.shadow_dir.as_deref(), Some(shadow.as_path()));
    // The shadow set compiles (a broken one would silently measure nothing)
    // and differs from the live set only by the candidate rule.
    let next = policy::load_dir(&shadow).expect("the shadow set compiles");
    let live = policy::load_dir(&dir.path().join("policies")).unwrap();
    assert_ne!(next.content_hash(), live.content_hash());
    assert_eq!(next.files().len(), live.files().len() + 1);
}
