//! Policy assurance (issue 37): `mcp-firewall test` on the shipped
//! policies' tests (and a changed rule failing the case it breaks, with the
//! diff; coverage naming what no case exercised; JUnit that validates); a
//! shadow set beside the live one while `serve` runs (the live answer
//! unchanged, the difference counted and on record, a broken set left out);
//! `audit replay` of recorded calls against ClickHouse, agreeing with
//! `mcp-firewall test` on the same calls.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::clickhouse::ClickHouse;
use crate::common::{self, raw, Firewall, TestConfig};

fn firewall_cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
}

/// Exit code and stdout + stderr.
fn run(cmd: &mut Command) -> (i32, String) {
    let out = cmd.output().expect("run mcp-firewall");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The estate the shipped policies' tests are decided against.
fn estate_config() -> PathBuf {
    root().join("config/policy-tests.toml")
}

/// Checks `xml` against the JUnit XML schema's structure: `testsuites` of
/// `testsuite` (name, tests, failures, errors, time) of `testcase` (name,
/// classname, time), each with at most one `failure` (message, type);
/// counts that add up. Returns the failed cases' names.
fn junit_failures(xml: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(xml).expect("JUnit output is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites");
    let num = |n: roxmltree::Node, a: &str| -> u64 {
        n.attribute(a)
            .unwrap_or_else(|| panic!("<{}> has no {a}", n.tag_name().name()))
            .parse()
            .unwrap_or_else(|_| panic!("<{}> {a} is not a count", n.tag_name().name()))
    };
    let secs = |n: roxmltree::Node| {
        let t: f64 = n
            .attribute("time")
            .expect("time")
            .parse()
            .expect("time is seconds");
        assert!(t >= 0.0);
    };
    secs(root);
    let mut failed = Vec::new();
    let (mut all_tests, mut all_failures) = (0, 0);
    for suite in root.children().filter(|n| n.is_element()) {
        assert_eq!(suite.tag_name().name(), "testsuite");
        assert!(suite.attribute("name").is_some_and(|n| !n.is_empty()));
        secs(suite);
        assert_eq!(num(suite, "errors"), 0);
        let cases: Vec<_> = suite.children().filter(|n| n.is_element()).collect();
        assert_eq!(num(suite, "tests"), cases.len() as u64);
        let mut suite_failures = 0;
        for case in cases {
            assert_eq!(case.tag_name().name(), "testcase");
            let name = case.attribute("name").expect("testcase name");
            assert!(case.attribute("classname").is_some());
            secs(case);
            let children: Vec<_> = case.children().filter(|n| n.is_element()).collect();
            assert!(children.len() <= 1, "{name}: one failure at most");
            if let Some(f) = children.first() {
                assert_eq!(f.tag_name().name(), "failure");
                assert!(f.attribute("message").is_some_and(|m| !m.is_empty()));
                assert!(f.attribute("type").is_some());
                suite_failures += 1;
                failed.push(name.to_owned());
            }
        }
        assert_eq!(num(suite, "failures"), suite_failures);
        all_tests += num(suite, "tests");
        all_failures += suite_failures;
    }
    assert_eq!(num(root, "tests"), all_tests);
    assert_eq!(num(root, "failures"), all_failures);
    failed
}

#[test]
fn the_shipped_policies_pass_their_tests_with_junit_that_validates() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("policy-tests.xml");
    let (code, out) = run(firewall_cmd()
        .args(["test", "--config"])
        .arg(estate_config())
        .arg("--junit")
        .arg(&junit)
        .arg("--coverage"));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("test result: ok."), "{out}");
    assert!(
        out.contains("case the SRE lead may read incidents ... ok"),
        "{out}"
    );
    // Every role of the shipped policies is exercised.
    assert!(out.contains("coverage: "), "{out}");
    assert!(
        !out.contains("\n  role "),
        "a shipped role no case exercises: {out}"
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(junit_failures(&xml).is_empty(), "{xml}");
    assert!(xml.contains("tests=\""), "{xml}");
}

#[test]
fn a_changed_rule_fails_the_case_it_breaks_with_the_diff_and_the_deciding_rule() {
    // get_incident falls out of the read rule: destructive by default.
    let policies = common::policy_dir(&[]);
    let tools = policies.path().join("10-tools.toml");
    let text = std::fs::read_to_string(&tools).unwrap();
    let changed = text.replacen("match = [\"get_incident\", ", "match = [", 1);
    assert_ne!(
        text, changed,
        "the shipped read rule names get_incident first"
    );
    std::fs::write(&tools, changed).unwrap();
    let junit = policies.path().join("out.xml");
    let (code, out) = run(firewall_cmd()
        .args(["test", "--config"])
        .arg(estate_config())
        .arg("--policy-dir")
        .arg(policies.path())
        .arg("--junit")
        .arg(&junit));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("case the SRE lead may read incidents ... FAILED"),
        "{out}"
    );
    // The failure names the case and the line its `[[case]]` starts on.
    let cases = std::fs::read_to_string(policies.path().join("tests/incidents.toml")).unwrap();
    let line = cases
        .lines()
        .position(|l| l == "name = \"the SRE lead may read incidents\"")
        .expect("the case")
        - 1;
    assert_eq!(cases.lines().nth(line), Some("[[case]]"));
    assert!(
        out.contains(&format!(
            "---- the SRE lead may read incidents ({}:{}) ----",
            policies.path().join("tests/incidents.toml").display(),
            line + 1
        )),
        "{out}"
    );
    assert!(out.contains("  expected: allow\n"), "{out}");
    assert!(out.contains("       got: approve (destructive)\n"), "{out}");
    assert!(
        out.contains("decided by: risk destructive (no [[tools]] rule: destructive by default)"),
        "{out}"
    );
    assert!(out.contains("test result: FAILED."), "{out}");
    assert!(out.contains("policy cases failed"), "{out}");
    let failed = junit_failures(&std::fs::read_to_string(&junit).unwrap());
    assert!(
        failed.contains(&"the SRE lead may read incidents".to_owned()),
        "{failed:?}"
    );
    // Cases the change does not touch still pass.
    assert!(
        out.contains("case a rollback waits for a person ... ok"),
        "{out}"
    );
}

#[test]
fn coverage_names_the_rules_roles_and_gates_no_case_exercised() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("one.toml");
    std::fs::write(
        &file,
        r#"
[[case]]
name = "the SRE lead reads pods"
claims = { sub = "user:olga", agent = "sre-lead", projects = ["platform"] }
upstream = "k8s-prod"
call = { name = "get_pods", arguments = { namespace = "platform" } }
expect = "allow"
"#,
    )
    .unwrap();
    let (code, out) = run(firewall_cmd()
        .args(["test", "--coverage", "--config"])
        .arg(estate_config())
        .arg(&file));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("test result: ok. 1 passed; 0 failed"), "{out}");
    // The namespace condition applied; the deployment one did not.
    assert!(!out.contains("(arguments.namespace in projects)"), "{out}");
    assert!(
        out.contains("30-conditions.toml:8 (arguments.deployment_id.matches(\"^dep-[0-9]+$\"))"),
        "{out}"
    );
    assert!(out.contains("  role data-analyst ("), "{out}");
    assert!(
        out.contains("  gate destructive = approve of role sre-lead"),
        "{out}"
    );
    assert!(
        out.contains("  rule [[tools]] at ") && out.contains("(destructive run_command, copy_*)"),
        "{out}"
    );
    assert!(!out.contains("  role sre-lead ("), "exercised: {out}");
}

#[test]
fn a_test_file_that_is_not_one_is_named_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    for (text, says) in [
        (
            "[[case]]\nname = \"x\"\nclaims = {}\nupstream = \"incidents\"\ncall = { name = \"get_incident\" }\nexpect = \"maybe\"\n",
            ["bad.toml:1: case \"x\"", "expect = \"maybe\""],
        ),
        (
            "[[case]]\nname = \"x\"\nclaims = {}\nupstream = \"nowhere\"\nlist = true\nexpect_hidden = [\"a\"]\n",
            ["bad.toml:1: case \"x\"", "no upstream named \"nowhere\""],
        ),
        (
            "[[case]]\nname = \"x\"\nclaims = {}\nupstream = \"incidents\"\nexpect = \"allow\"\n",
            ["bad.toml:1: case \"x\"", "needs `call"],
        ),
        ("[[case]]\nname = \"x\"\ncolour = 1\n", ["bad.toml: not a test file", "colour"]),
    ] {
        std::fs::write(&file, text).unwrap();
        let (code, out) = run(firewall_cmd()
            .args(["test", "--config"])
            .arg(estate_config())
            .arg(&file));
        assert_eq!(code, 1, "{out}");
        for s in says {
            assert!(out.contains(s), "{s:?} in {out}");
        }
    }
}

/// A copy of the shipped policies plus `extra` (a candidate set).
fn candidate(extra: &str) -> tempfile::TempDir {
    common::policy_dir(&[("95-candidate.toml", extra)])
}

/// A `tools/call` of `tool` with `arguments` on `incidents`, 2025-11-25.
async fn call(fw: &Firewall, token: &str, tool: &str, arguments: Value) -> common::Answer {
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": tool, "arguments": arguments}});
    common::post(
        &fw.mcp_url("incidents"),
        token,
        &[("mcp-protocol-version", "2025-11-25")],
        &body.to_string(),
    )
    .await
}

/// Waits until `sql` answers `want`.
async fn until_rows(ch: &ClickHouse, sql: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while ch.try_query(sql).map(|t| t.trim().to_owned()) != Ok(want.to_owned()) {
        assert!(
            Instant::now() < deadline,
            "{sql}: {:?}\n{}",
            ch.try_query(sql),
            ch.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The shadow-differences series of `metrics` for `(live, shadow)`.
fn differences(metrics: &str, live: &str, shadow: &str) -> u64 {
    let series = format!(
        "mcp_firewall_shadow_differences_total{{live=\"{live}\",shadow=\"{shadow}\",upstream=\"incidents\"}} "
    );
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

const DENY_GET_INCIDENT: &str = r#"
[[conditions]]
upstream = "incidents"
tools = ["get_incident"]
require = 'false'
reason = "candidate: incidents are read through the portal"
"#;

#[tokio::test]
async fn a_shadow_set_that_denies_a_tool_changes_no_answer_and_the_difference_is_counted_and_on_record(
) {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let up = raw::mcp().await;
    let shadow = candidate(DENY_GET_INCIDENT);
    let fw = common::firewall(
        &TestConfig::new()
            .upstream("incidents", &up.url())
            .set("policy.shadow_dir", common::toml_path(shadow.path()))
            .audit("fw-shadow", &ch.http_url, &db, spool.path())
            .text(),
    )
    .await;
    let token = common::token();
    for i in 0..3 {
        let a = call(
            &fw,
            &token,
            "get_incident",
            json!({"incident_id": format!("INC-{i}")}),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text);
        assert_eq!(
            a.json()["result"]["content"][0]["text"],
            "ok",
            "the live answer: {}",
            a.text
        );
    }
    assert_eq!(up.calls_of("get_incident"), 3, "every live call ran, once");
    for _ in 0..2 {
        let a = call(
            &fw,
            &token,
            "get_deployment",
            json!({"deployment_id": "dep-1"}),
        )
        .await;
        assert_eq!(a.json()["result"]["content"][0]["text"], "ok", "{}", a.text);
    }
    // A call both sets refuse the same way is no difference.
    let a = call(
        &fw,
        &token,
        "get_deployment",
        json!({"deployment_id": "nope"}),
    )
    .await;
    assert_eq!(a.json()["error"]["code"], -31001, "{}", a.text);

    let metrics = fw.metrics().await;
    assert_eq!(differences(&metrics, "allow", "deny"), 3, "{metrics}");
    assert_eq!(
        metrics
            .matches("mcp_firewall_shadow_differences_total{")
            .count(),
        1,
        "only get_incident differs: {metrics}"
    );
    until_rows(
        ch,
        &format!("SELECT count() FROM {db}.audit_events FINAL WHERE method = 'tools/call' AND tool = 'get_incident' AND decision = 'allow' AND shadow_decision = 'deny'"),
        "3",
    )
    .await;
    until_rows(
        ch,
        &format!("SELECT count() FROM {db}.audit_events FINAL WHERE method = 'tools/call' AND tool = 'get_deployment' AND shadow_decision = ''"),
        "3",
    )
    .await;
    let out = common::clickhouse::audit_cli(
        ch,
        &db,
        None,
        true,
        mcp_firewall::cli::audit::AuditCommand::Shadow { since: "1h".into() },
    )
    .await;
    let rows: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        rows.iter().any(|r| r["tool"] == "get_incident"
            && r["decision"] == "allow"
            && r["shadow_decision"] == "deny"
            && r["calls"] == 3
            && r["principals"] == 1),
        "by tool: {out}"
    );
    assert!(
        rows.iter()
            .any(|r| r["subject"] == "alice" && r["calls"] == 3 && r["tools"] == 1),
        "by principal: {out}"
    );
    assert!(!out.contains("get_deployment"), "{out}");

    // A broken shadow set: reported, left out, never fatal.
    std::fs::write(
        shadow.path().join("96-broken.toml"),
        "[[agents]]\nname = 3\n",
    )
    .unwrap();
    common::eventually(
        "the shadow set is reported broken",
        Duration::from_secs(10),
        || async {
            fw.metrics()
                .await
                .contains("\nmcp_firewall_policy_shadow_error 1\n")
        },
    )
    .await;
    let a = call(&fw, &token, "get_incident", json!({"incident_id": "INC-9"})).await;
    assert_eq!(a.json()["result"]["content"][0]["text"], "ok", "{}", a.text);
    assert_eq!(up.calls_of("get_incident"), 4);
    assert_eq!(
        differences(&fw.metrics().await, "allow", "deny"),
        3,
        "no shadow, no difference"
    );
    // Fixed: differences resume, under the set as it is now.
    std::fs::remove_file(shadow.path().join("96-broken.toml")).unwrap();
    common::eventually(
        "the shadow set is back",
        Duration::from_secs(10),
        || async {
            fw.metrics()
                .await
                .contains("\nmcp_firewall_policy_shadow_error 0\n")
        },
    )
    .await;
    call(
        &fw,
        &token,
        "get_incident",
        json!({"incident_id": "INC-10"}),
    )
    .await;
    assert_eq!(differences(&fw.metrics().await, "allow", "deny"), 4);
    assert_eq!(up.calls_of("get_incident"), 5);
    fw.stop().await;
}

#[tokio::test]
async fn audit_replay_re_decides_recorded_calls_and_agrees_with_policy_tests() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let up = raw::mcp().await;
    let config = TestConfig::new().upstream("incidents", &up.url()).audit(
        "fw-replay",
        &ch.http_url,
        &db,
        spool.path(),
    );
    let fw = common::firewall(&config.text()).await;
    let lead = common::token();
    let mut obs = common::claims("observability", &["sre"]);
    obs.sub = "bob".to_owned();
    let obs = common::sign(&obs);
    // The recorded load: reads by two roles, a refused deployment read,
    // and a call whose arguments are redacted on record.
    for i in 0..4 {
        call(
            &fw,
            &lead,
            "get_incident",
            json!({"incident_id": format!("INC-{i}")}),
        )
        .await;
    }
    for i in 0..2 {
        call(
            &fw,
            &obs,
            "get_incident",
            json!({"incident_id": format!("INC-{i}")}),
        )
        .await;
    }
    let a = call(
        &fw,
        &lead,
        "get_deployment",
        json!({"deployment_id": "nope"}),
    )
    .await;
    assert_eq!(a.json()["error"]["code"], -31001, "{}", a.text);
    call(
        &fw,
        &lead,
        "get_incident",
        json!({"incident_id": "INC-5", "password": "hunter2"}),
    )
    .await;
    until_rows(
        ch,
        &format!("SELECT count() FROM {db}.audit_events FINAL WHERE method = 'tools/call'"),
        "8",
    )
    .await;
    fw.stop().await;

    // The candidate: observability no longer reads incidents; a
    // deployment read of any id is allowed.
    let next = candidate(
        r#"
[[conditions]]
upstream = "incidents"
tools = ["get_incident"]
agents = ["observability"]
require = 'false'
reason = "candidate: observability reads incidents through the portal"
"#,
    );
    let conditions = next.path().join("30-conditions.toml");
    let text = std::fs::read_to_string(&conditions).unwrap();
    std::fs::write(&conditions, text.replace("\"get_deployment\", ", "")).unwrap();
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg_file = cfg_dir.path().join("firewall.toml");
    std::fs::write(&cfg_file, config.text()).unwrap();
    let replay = || mcp_firewall::cli::audit::AuditCommand::Replay {
        policy_dir: next.path().to_owned(),
        since: "1h".into(),
        limit: 1000,
    };
    let out = common::clickhouse::audit_cli(ch, &db, Some(cfg_file.clone()), true, replay()).await;
    let report: Value = serde_json::from_str(&out).expect("replay --json");
    assert_eq!(report["rows"], 8, "{out}");
    assert_eq!(report["replayed"], 7, "{out}");
    assert_eq!(report["changed"], 3, "{out}");
    assert_eq!(report["unchanged"], 4, "{out}");
    assert_eq!(
        report["not_replayable"]["arguments redacted ([REDACTED]; not guessed)"], 1,
        "{out}"
    );
    let changes = report["changes"].as_array().unwrap();
    let change = |tool: &str, from: &str, to: &str| {
        changes
            .iter()
            .find(|c| c["tool"] == tool && c["recorded"] == from && c["candidate"] == to)
            .unwrap_or_else(|| panic!("no {tool} {from} -> {to} in {out}"))
    };
    let obs_reads = change("get_incident", "allow", "deny");
    assert_eq!(obs_reads["calls"], 2);
    assert_eq!(obs_reads["principals"], json!(["acme/bob"]));
    assert!(obs_reads["why"]
        .as_str()
        .unwrap()
        .contains("through the portal"));
    // No condition refuses it now; the candidate's pinned definition
    // (policies/pins, as `test` reads it) refuses the id itself.
    assert_eq!(change("get_deployment", "deny", "invalid")["calls"], 1);

    // The same calls as policy tests, each expecting what replay says the
    // candidate decides: `mcp-firewall test` agrees, call by call.
    let replayed = |sub: &str, tool: &str, recorded: &str| -> String {
        changes
            .iter()
            .find(|c| {
                c["tool"] == tool
                    && c["recorded"] == recorded
                    && c["principals"]
                        .as_array()
                        .unwrap()
                        .contains(&json!(format!("acme/{sub}")))
            })
            .map_or(recorded.to_owned(), |c| {
                c["candidate"].as_str().unwrap().to_owned()
            })
    };
    let mut cases = String::new();
    let mut case = |name: &str, sub: &str, agent: &str, tool: &str, args: &str, recorded: &str| {
        cases.push_str(&format!(
            "[[case]]\nname = {name:?}\nclaims = {{ sub = {sub:?}, agent = {agent:?}, projects = [\"sre\"], tenant_id = \"acme\" }}\nupstream = \"incidents\"\ncall = {{ name = {tool:?}, arguments = {args} }}\nexpect = {:?}\n\n",
            replayed(sub, tool, recorded)
        ));
    };
    for i in 0..4 {
        case(
            &format!("lead read {i}"),
            "alice",
            "sre-lead",
            "get_incident",
            &format!("{{ incident_id = \"INC-{i}\" }}"),
            "allow",
        );
    }
    for i in 0..2 {
        case(
            &format!("observability read {i}"),
            "bob",
            "observability",
            "get_incident",
            &format!("{{ incident_id = \"INC-{i}\" }}"),
            "allow",
        );
    }
    case(
        "lead deployment read",
        "alice",
        "sre-lead",
        "get_deployment",
        "{ deployment_id = \"nope\" }",
        "deny",
    );
    let file = cfg_dir.path().join("replayed.toml");
    std::fs::write(&file, &cases).unwrap();
    let (code, tested) = run(firewall_cmd()
        .args(["test", "--config"])
        .arg(&cfg_file)
        .arg("--policy-dir")
        .arg(next.path())
        .arg(&file));
    assert_eq!(code, 0, "{cases}\n{tested}");
    assert!(
        tested.contains("test result: ok. 7 passed; 0 failed"),
        "{tested}"
    );
    assert!(
        cases.contains("expect = \"deny\""),
        "the changed calls are among them: {cases}"
    );
    // Under the live policy, the same cases fail exactly where replay said
    // a decision changes.
    let (code, live) = run(firewall_cmd()
        .args(["test", "--config"])
        .arg(&cfg_file)
        .arg(&file));
    assert_eq!(code, 1, "{live}");
    assert!(
        live.contains("test result: FAILED. 4 passed; 3 failed"),
        "{live}"
    );

    // The people's report says the same.
    let text = common::clickhouse::audit_cli(ch, &db, Some(cfg_file), false, replay()).await;
    assert!(
        text.contains("re-decided 7 of 8 recorded tools/call since 1h"),
        "{text}"
    );
    assert!(
        text.contains("4 unchanged, 3 would change, 1 not replayable"),
        "{text}"
    );
    assert!(
        text.contains("incidents/get_incident: allow -> deny"),
        "{text}"
    );
    assert!(
        text.contains("incidents/get_deployment: deny -> invalid"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_logs_what_the_change_does_in_effect_by_name() {
    let policies = common::policy_dir(&[]);
    let up = raw::mcp().await;
    let port = crate::audit_e2e::free_port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("firewall.toml");
    std::fs::write(
        &cfg,
        TestConfig::new()
            .policies(policies.path())
            .upstream("incidents", &up.url())
            .set("server.listen", format!("127.0.0.1:{port}"))
            .set("log.level", "info")
            .text(),
    )
    .unwrap();
    let log = dir.path().join("serve.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    crate::audit_e2e::wait_listening(port).await;
    // restart_service becomes a write; the auditor role goes.
    let tools = policies.path().join("10-tools.toml");
    let text = std::fs::read_to_string(&tools).unwrap();
    std::fs::write(
        &tools,
        text.replacen(
            "match = [\"restart_service\"]\nrisk = \"destructive\"",
            "match = [\"restart_service\"]\nrisk = \"write\"",
            1,
        ),
    )
    .unwrap();
    let agents = policies.path().join("20-agents.toml");
    let text = std::fs::read_to_string(&agents).unwrap();
    let start = text.find("# Read-only everywhere it can reach.").unwrap();
    let end = text.find("# The demo's investigating agent").unwrap();
    std::fs::write(&agents, format!("{}{}", &text[..start], &text[end..])).unwrap();
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    common::wait_until(
        "the reload's effect in the log",
        Duration::from_secs(15),
        || {
            logged().contains("role \\\"auditor\\\" removed")
                || logged().contains("role \"auditor\" removed")
        },
    )
    .await;
    let out = logged();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(out.contains("policy reloaded"), "{out}");
    assert!(
        out.contains("tool incidents/restart_service: risk destructive -> write"),
        "{out}"
    );
    assert!(
        out.contains("role sre-lead, tool incidents/restart_service: approve (destructive) -> approve (write)"),
        "{out}"
    );
    assert!(
        !out.contains("incidents/get_incident"),
        "an unchanged tool is not named: {out}"
    );
}

/// A tool whose `x-mcp-header` annotation is not a header name: left out
/// of the run's list and, as the property test in `src/proxy/judge_tests.rs`
/// requires, refused as an unknown tool in both eras; the upstream never
/// hears of the calls, and both refusals are on record.
#[tokio::test]
async fn a_tool_with_invalid_header_annotations_is_neither_listed_nor_callable() {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let up = raw::upstream(|seen| async move {
        let body: Value = serde_json::from_slice(&seen.body).unwrap_or_default();
        let result = match body["method"].as_str() {
            Some("tools/list") => json!({"tools": [
                {"name": "get_incident", "inputSchema": {"type": "object", "properties": {
                    "incident_id": {"type": "string", "x-mcp-header": "not a token"}}}},
                {"name": "list_incidents", "inputSchema": {"type": "object"}},
            ]}),
            Some("tools/call") => json!({"content": [{"type": "text", "text": "ran"}]}),
            Some(_) if body.get("id").is_some() => json!({}),
            _ => return raw::full(202, "text/plain", ""),
        };
        raw::full(
            200,
            "application/json",
            json!({"jsonrpc": "2.0", "id": body["id"], "result": result}).to_string(),
        )
    })
    .await;
    let fw = common::firewall(
        &TestConfig::new()
            .upstream("incidents", &up.url())
            .audit("fw-headers", &ch.http_url, &db, spool.path())
            .text(),
    )
    .await;
    let token = common::token();
    let list = common::post(
        &fw.mcp_url("incidents"),
        &token,
        &[("mcp-protocol-version", "2025-11-25")],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string(),
    )
    .await;
    let listed = list.json();
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", list.text))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["list_incidents"], "{}", list.text);
    let args = json!({"name": "get_incident", "arguments": {"incident_id": "INC-1"}});
    let old = call(&fw, &token, "get_incident", json!({"incident_id": "INC-1"})).await;
    assert_eq!(old.json()["error"]["code"], -32602, "{}", old.text);
    let (headers, body) = crate::answer_path::modern("tools/call", "get_incident", 8, args);
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let new = common::post(&fw.mcp_url("incidents"), &token, &h, &body).await;
    assert_eq!(new.json()["error"]["code"], -32602, "{}", new.text);
    assert_eq!(
        up.calls_of("get_incident"),
        0,
        "a refused call never arrives"
    );
    // The listed tool still runs, once.
    let ran = call(&fw, &token, "list_incidents", json!({})).await;
    assert_eq!(
        ran.json()["result"]["content"][0]["text"],
        "ran",
        "{}",
        ran.text
    );
    assert_eq!(up.calls_of("list_incidents"), 1);
    until_rows(
        ch,
        &format!("SELECT count() FROM {db}.audit_events FINAL WHERE method = 'tools/call' AND tool = 'get_incident' AND decision = 'hidden'"),
        "2",
    )
    .await;
    until_rows(
        ch,
        &format!("SELECT count() FROM {db}.audit_events FINAL WHERE method = 'tools/call' AND tool = 'list_incidents' AND decision = 'allow'"),
        "1",
    )
    .await;
    fw.stop().await;
}
