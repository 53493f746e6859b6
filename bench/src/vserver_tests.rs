//! Tests of `mcp-bench virtual`: judging the fan-out answer, ratios and
//! rendering (pure), the slow upstream, and the whole path through an
//! in-process firewall on the generated config.

use std::path::Path;

use super::*;
use crate::firewall::{Layout, Spec};

fn tools(member: &str, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"name": format!("{member}__t{i}"), "inputSchema": {"type": "object"}}))
        .collect()
}

fn answer(tools: Vec<Value>, cursor: bool) -> Vec<u8> {
    let mut result = json!({ "tools": tools });
    if cursor {
        result["nextCursor"] = json!("sealed");
    }
    json!({"jsonrpc": "2.0", "id": 1, "result": result})
        .to_string()
        .into_bytes()
}

fn judge(elapsed_ms: u64, status: u16, body: &[u8]) -> FanOut {
    let case = FanOutCase {
        deadline: Duration::from_millis(2_000),
        slow_delay: SLOW_DELAY,
        fast: "bench",
        slow: "bench-slow",
        visible: 50,
    };
    FanOut::judge(&case, Duration::from_millis(elapsed_ms), status, body)
}

#[test]
fn a_list_within_the_deadline_without_the_late_member_and_with_a_cursor_passes() {
    let f = judge(2_010, 200, &answer(tools("bench", 50), true));
    assert!(f.passed, "{:?}", f.failures());
    assert_eq!(f.limit_ms, 3_000);
    assert_eq!(f.tools_by_member.get("bench"), Some(&50));
    assert!(f.next_cursor && f.unreadable.is_none());
    assert_eq!(f.checks.len(), 4);
}

#[test]
fn each_fan_out_check_fails_on_its_own() {
    let good = answer(tools("bench", 50), true);
    // Too late.
    let f = judge(3_001, 200, &good);
    assert!(!f.passed);
    assert_eq!(f.failures().len(), 1);
    assert!(f.failures()[0].contains("within list_timeout_ms + 1 s"));
    // The late member's tools are there: it was waited for.
    let mut t = tools("bench", 50);
    t.extend(tools("bench-slow", 2));
    let f = judge(2_000, 200, &answer(t, true));
    assert_eq!(
        f.failures(),
        ["no tool of bench-slow (it answers after the deadline)"]
    );
    assert_eq!(f.tools_by_member.get("bench-slow"), Some(&2));
    // No cursor to ask it again.
    let f = judge(2_000, 200, &answer(tools("bench", 50), false));
    assert_eq!(f.failures(), ["a nextCursor to ask the late member again"]);
    // Some of bench's tools missing, or unprefixed.
    let f = judge(2_000, 200, &answer(tools("", 50), true));
    assert_eq!(f.failures().len(), 1);
    assert!(f.failures()[0].starts_with("bench's 50 visible tools"));
    // An error answer fails everything but the time, and keeps its code.
    let err = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"x"}}"#;
    let f = judge(100, 200, err);
    assert_eq!(f.error_code, Some(-32000));
    assert_eq!(f.failures().len(), 2, "{:?}", f.failures());
    // Nothing readable.
    let f = judge(100, 502, b"<html>bad gateway</html>");
    assert_eq!(f.unreadable.as_deref(), Some("<html>bad gateway</html>"));
    assert_eq!(f.failures().len(), 3);
}

#[test]
fn event_stream_answers_are_read_from_their_last_message() {
    let json = String::from_utf8(answer(tools("bench", 50), true)).unwrap();
    let sse = format!(
        ": working\n\nevent: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{}}}}\n\nevent: message\ndata: {json}\n\n"
    );
    let f = judge(1_000, 200, sse.as_bytes());
    assert!(f.passed, "{:?}", f.failures());
    assert_eq!(message(b"  no json"), None);
    let l = listed(&message(json.as_bytes()).unwrap());
    assert_eq!(l.names.len(), 50);
    assert_eq!(l.next_cursor.as_deref(), Some("sealed"));
    assert_eq!(member_of("bench-slow__slow_lookup"), "bench-slow");
    assert_eq!(member_of("get_service"), "");
}

fn column(def: &ColumnDef, rps: f64, p50: f64, p99: f64, cpu: Option<f64>) -> ColumnReport {
    let f = Figures {
        rps,
        p50_ms: p50,
        p99_ms: p99,
        cpu_s_per_10k: cpu,
        ok: 100,
        ..Figures::default()
    };
    ColumnReport {
        name: def.name.to_owned(),
        path: def.path.to_owned(),
        what: def.what.to_owned(),
        members: def.members,
        tools: u32::try_from(50 * def.members).unwrap(),
        rounds: vec![f, f],
        median: f,
        errors: BTreeMap::new(),
    }
}

#[test]
fn ratios_divide_medians_of_the_same_run() {
    assert_eq!(ratio(1.0, 0.0), None);
    assert_eq!(ratio(f64::NAN, 1.0), None);
    assert_eq!(ratio(3.0, 4.0), Some(0.75));
    let cols = vec![
        column(&PLAIN, 4_000.0, 3.0, 6.0, Some(2.0)),
        column(&VS1, 2_000.0, 6.0, 9.0, Some(4.0)),
        column(&VS3, 1_000.0, 12.0, 27.0, None),
    ];
    let r = ratios(&cols);
    let names: Vec<(&str, &str)> = r
        .iter()
        .map(|q| (q.numerator.as_str(), q.denominator.as_str()))
        .collect();
    assert_eq!(
        names,
        [("vs3", "vs1"), ("vs1", "firewall"), ("vs3", "firewall")]
    );
    assert_eq!(r[0].rps, Some(0.5));
    assert_eq!(r[0].p50, Some(2.0));
    assert_eq!(r[0].p99, Some(3.0));
    assert_eq!(r[0].cpu, None);
    assert_eq!(r[1].rps, Some(0.5));
    assert_eq!(r[1].cpu, Some(2.0));
    assert_eq!(r[2].rps, Some(0.25));
    // A column missing: its ratios are left out.
    assert_eq!(ratios(&cols[..2]).len(), 1);
}

fn report(fan_out: FanOut) -> Report {
    let columns = vec![
        column(&PLAIN, 4_000.0, 3.0, 6.0, Some(2.0)),
        column(&VS1, 2_000.0, 6.0, 9.0, Some(4.0)),
        column(&VS3, 1_000.0, 12.0, 27.0, Some(10.0)),
    ];
    Report {
        meta: Meta {
            cpus: 2,
            rounds: 2,
            warmup_s: 1.0,
            duration_s: 3.0,
            concurrency: 16,
            tools: 100,
            visible_tools: 50,
            list_timeout_ms: 2_000,
            slow_delay_ms: 5_000,
            firewall_bin: "/x/target/release/mcp-firewall".into(),
            build: build_of("/x/target/release/mcp-firewall").into(),
            ..Meta::default()
        },
        ratios: ratios(&columns),
        columns,
        fan_out,
        notes: vec!["a note".into()],
    }
}

#[test]
fn the_markdown_gives_every_column_the_ratios_and_the_fan_out_verdict() {
    let mut fan_out = judge(2_004, 200, &answer(tools("bench", 50), true));
    fan_out.next_page = Some(NextPage {
        elapsed_ms: 2_003.0,
        status: 200,
        tools: 0,
        next_cursor: false,
        error_code: None,
    });
    let md = markdown(&report(fan_out));
    assert!(
        md.contains("| vs3 | `/mcp/vs3` | 3 | 150 | 1000 | 12.00 | 27.00 | 10.00 |"),
        "{md}"
    );
    assert!(md.contains("| firewall | `/mcp/bench` | 1 | 50 | 4000 |"));
    assert!(md.contains(
        "- **vs3 / vs1**: throughput x0.50, p50 x2.00, p99 x3.00, firewall CPU per list x2.50"
    ));
    assert!(md.contains("- **vs1 / firewall**: throughput x0.50"));
    assert!(md.contains("(release)"));
    assert!(md.contains("2 × 3 s measured after 1 s warm-up"));
    assert!(md.contains("**passed** in 2004 ms (limit 3000 ms), HTTP 200"));
    assert!(md.contains("Listed: 50 of bench; nextCursor present."));
    assert!(md.contains("2003 ms, HTTP 200, 0 tools, nextCursor absent."));
    assert!(md.contains("- a note"));
    assert!(!md.contains("FAILED"));
    let md = markdown(&report(judge(
        5_010,
        200,
        &answer(tools("bench-slow", 2), false),
    )));
    assert!(md.contains("**FAILED** in 5010 ms"));
    assert_eq!(md.matches(": FAILED").count(), 4, "{md}");
    assert!(md.contains("Listed: 2 of bench-slow; nextCursor absent."));
    // The JSON keeps every round.
    let r = report(judge(2_000, 200, b""));
    let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back.columns, r.columns);
    assert_eq!(back.fan_out, r.fan_out);
}

#[test]
fn builds_are_named_by_path_and_warnings_are_counted_by_line() {
    assert_eq!(build_of("/w/target/dist/mcp-firewall"), "dist");
    assert_eq!(build_of("/w/target/debug/mcp-firewall"), "debug");
    assert_eq!(build_of("/usr/bin/mcp-firewall"), "unknown");
    let log = "\u{1b}[2m2026-12-05T17:59:13.228949Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m \u{1b}[2mmcp_firewall::app\u{1b}[0m\u{1b}[2m:\u{1b}[0m audit is disabled\n\
               2026-12-05T17:59:14Z  INFO mcp_firewall::app: listening\n\
               2026-12-05T17:59:15Z  WARN mcp_firewall::app: audit is disabled\n\
               2026-12-05T17:59:16Z ERROR mcp_firewall::proxy: boom\n";
    assert_eq!(
        log_warnings(log),
        [
            ("WARN mcp_firewall::app: audit is disabled".to_owned(), 2),
            ("ERROR mcp_firewall::proxy: boom".to_owned(), 1)
        ]
    );
}

#[test]
fn the_workload_expects_every_members_visible_tools() {
    let catalog = Catalog::new(100, 310).unwrap();
    assert_eq!(expected_tools(&catalog, &PLAIN), 50);
    assert_eq!(expected_tools(&catalog, &VS1), 50);
    assert_eq!(expected_tools(&catalog, &VS3), 150);
    let w = workload(&catalog, &VS3);
    assert_eq!(w.scenario, Scenario::List);
    assert_eq!(w.templates[0].firewall, Expect::Tools(150));
    // What a plain target must answer is the list scenario's.
    assert_eq!(w.templates[0].plain, Expect::Tools(100));
}

#[test]
fn the_slow_upstream_answers_what_the_firewall_asks() {
    let req = |method: &str| json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": {}});
    let (a, wait) = slow_answer(&req("tools/list"));
    assert!(wait);
    assert_eq!(a.unwrap()["result"]["tools"].as_array().unwrap().len(), 2);
    for (method, key) in [
        ("prompts/list", "prompts"),
        ("resources/list", "resources"),
        ("resources/templates/list", "resourceTemplates"),
    ] {
        let (a, wait) = slow_answer(&req(method));
        assert!(!wait);
        assert_eq!(a.unwrap()["result"][key], json!([]));
    }
    let (a, _) = slow_answer(
        &json!({"jsonrpc": "2.0", "id": "i", "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}),
    );
    let a = a.unwrap();
    assert_eq!(a["id"], "i");
    assert_eq!(a["result"]["protocolVersion"], "2025-06-18");
    let (a, _) = slow_answer(&req("server/discover"));
    assert_eq!(a.unwrap()["error"]["code"], -32601);
    assert_eq!(
        slow_answer(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
        (None, false)
    );
}

#[tokio::test]
async fn the_slow_upstream_waits_on_tools_list_only() {
    let slow = SlowUpstream::start(Duration::from_millis(300), 2).unwrap();
    let t = Duration::from_secs(5);
    let a = post(slow.addr, "/mcp/bench-slow", None, list_body(1, None), t)
        .await
        .unwrap();
    assert!(a.elapsed >= Duration::from_millis(300), "{:?}", a.elapsed);
    assert_eq!(listed(&message(&a.body).unwrap()).names, SLOW_TOOLS);
    assert_eq!(slow.lists_asked(), 1);
    let prompts = Bytes::from_static(br#"{"jsonrpc":"2.0","id":2,"method":"prompts/list"}"#);
    let a = post(slow.addr, "/mcp/bench-slow", None, prompts, t)
        .await
        .unwrap();
    assert!(a.elapsed < Duration::from_millis(300));
    assert_eq!(a.status, 200);
    let note = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let a = post(slow.addr, "/mcp/bench-slow", None, note, t)
        .await
        .unwrap();
    assert_eq!(a.status, 202);
    let a = post(slow.addr, "/", None, Bytes::from_static(b"not json"), t)
        .await
        .unwrap();
    assert_eq!(a.status, 400);
    let addr = slow.addr;
    drop(slow);
    assert!(post(
        addr,
        "/",
        None,
        list_body(3, None),
        Duration::from_millis(500)
    )
    .await
    .is_err());
}

/// The generated config with its virtual servers, in this process: `vs3`
/// lists three members' visible tools to the load generator, and `vs-slow`
/// answers within its deadline without the slow member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_an_in_process_firewall_vs3_lists_three_members_and_vs_slow_keeps_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::new(100, 310).unwrap();
    let answers = Arc::new(crate::upstream::Answers::new(
        &catalog,
        Duration::from_millis(100),
    ));
    let (stop, rx) = watch::channel(false);
    let (listener, upstream) = crate::upstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    tokio::spawn(crate::upstream::serve(listener, None, answers, rx));
    let slow = SlowUpstream::start(SLOW_DELAY, 2).unwrap();
    let issuer = Issuer::generate().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    firewall::write_policies(&policies).unwrap();
    let key_file = dir.path().join("k.pem");
    std::fs::write(&key_file, issuer.public_pem()).unwrap();
    let spec = Spec {
        name: "fw".into(),
        tls: None,
        audit: None,
        log_level: "warn".into(),
        upstream_http2: false,
        state: None,
        screening: true,
        shadow: false,
        virtual_servers: Some(Virtuals {
            slow_upstream: slow.addr,
        }),
        stdio: None,
        token_exchange: None,
    };
    let layout = Layout {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin: "127.0.0.1:0".parse().unwrap(),
        upstream,
        key_file,
        policy_dir: policies,
        shadow_dir: None,
        spool_dir: dir.path().join("spool"),
        signing_key: dir.path().join("audit.key"),
    };
    let text = firewall::config_text(&spec, &layout);
    let cfg = mcp_firewall::config::load_str(&text, Path::new("bench.toml"), dir.path(), &|_| None)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let fw = mcp_firewall::app::start(Arc::new(cfg)).await.unwrap();
    let tokens = Arc::new(issuer.tokens(4, Duration::from_secs(600)).unwrap());
    for c in COLUMNS {
        let spec = LoadSpec {
            endpoint: Endpoint {
                addr: fw.mcp_addr,
                proto: Proto::H1,
                tls: None,
                path: Some(Arc::from(c.path)),
            },
            workload: Arc::new(workload(&catalog, &c)),
            tokens: tokens.clone(),
            firewall: true,
            concurrency: 2,
            h2_connections: 1,
            rate: None,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(30),
            requests: Some(6),
            timeout: Duration::from_secs(10),
            ticket_base: 0,
            calls_per_run: 1,
        };
        let r = load::run(spec, |_| {}).await.unwrap();
        assert_eq!(r.ok, 6, "{}: {:?} {:?}", c.name, r.errors, r.outcomes);
    }
    let a = post(
        fw.mcp_addr,
        SLOW_PATH,
        tokens.reader.first(),
        list_body(1, None),
        Duration::from_secs(15),
    )
    .await
    .unwrap();
    let case = FanOutCase {
        deadline: Duration::from_millis(firewall::VS_LIST_TIMEOUT_MS),
        slow_delay: SLOW_DELAY,
        fast: "bench",
        slow: firewall::SLOW_ROUTE,
        visible: catalog.reads(),
    };
    let f = FanOut::judge(&case, a.elapsed, a.status, &a.body);
    assert!(
        f.passed,
        "{:?} in {:?}: {}",
        f.failures(),
        a.elapsed,
        String::from_utf8_lossy(&a.body)
    );
    let _ = stop.send(true);
}
