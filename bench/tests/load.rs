//! `mcp-bench load` driven as an operator would: against the demo (both
//! eras) with a scenario file of a mix and ramp stages; against the canned
//! upstream without tokens; against a firewall whose run tokens it mints
//! (a run's step cap shows as `step_cap` outcomes, and `--verify-audit`
//! finds every answered call's row in a throwaway ClickHouse); a failing
//! threshold exits non-zero; `--dry-run` and the safety bounds send nothing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcp-bench"))
}

fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
    report: Option<Value>,
}

/// Runs `mcp-bench load <args> --out <dir> --quiet` on a blocking thread.
async fn load(args: Vec<String>, out: &Path) -> Ran {
    let out = out.to_owned();
    tokio::task::spawn_blocking(move || {
        let o = bench()
            .arg("load")
            .args(&args)
            .arg("--out")
            .arg(&out)
            .arg("--quiet")
            .output()
            .expect("run mcp-bench");
        let report = std::fs::read_to_string(out.join("report.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        Ran {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            report,
        }
    })
    .await
    .expect("join")
}

fn outcome(report: &Value, target: usize, label: &str) -> u64 {
    report["targets"][target]["outcomes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["label"] == label)
        .map(|o| o["count"].as_u64().unwrap_or(0))
        .sum()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

const MIX: &str = r#"
vus = 3
think_time = "5ms"

[[stages]]
duration = "1s"
target = 1

[[stages]]
duration = "1s"
target = 3

[[mix]]
weight = 6
method = "tools/call"
tool = "get_incident"
arguments = { incident_id = { pick = ["INC-1001", "INC-1002", "INC-1003"] } }

[[mix]]
weight = 2
method = "tools/list"

[[mix]]
weight = 1
method = "stream"
hold = "300ms"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mix_with_ramp_stages_against_the_demo_in_both_eras() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let estate = mcp_demo_upstream::spawn(listener, Default::default())
        .await
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut opts = mcp_firewall::demo::run::Options::new(any_port(), any_port());
    opts.upstream = mcp_firewall::demo::run::UpstreamSource::Url(estate.url());
    opts.data_dir = Some(state.path().to_path_buf());
    let demo = mcp_firewall::demo::run::start(opts)
        .await
        .expect("demo starts");
    let url = format!("http://{}/mcp/incidents", demo.firewall.mcp_addr);
    let metrics = format!("http://{}/metrics", demo.firewall.admin_addr);
    let dir = tempfile::tempdir().unwrap();
    let scenario = write(dir.path(), "mix.toml", MIX);
    for era in ["2026-07-28", "2025-11-25"] {
        let out = dir.path().join(era);
        let ran = load(
            vec![
                "--target".into(),
                url.clone(),
                "--token".into(),
                demo.investigator_token.clone(),
                "--scenario".into(),
                scenario.display().to_string(),
                "--era".into(),
                era.into(),
                "--metrics".into(),
                metrics.clone(),
            ],
            &out,
        )
        .await;
        assert_eq!(ran.code, 0, "{era}: {}\n{}", ran.stdout, ran.stderr);
        assert!(
            ran.stderr
                .contains(&format!("speaks {era} over HTTP/1.1, lists 8 tools")),
            "{era}: {}",
            ran.stderr
        );
        let r = ran.report.expect("report.json");
        let t = &r["targets"][0];
        assert!(outcome(&r, 0, "ok") > 10, "{era}: {t:#}");
        // The investigator's rate limit refuses some calls: counted as the
        // firewall's refusal, never as an error.
        let rate_limited = outcome(&r, 0, "rate_limited");
        assert!(rate_limited > 0, "{era}: {t:#}");
        assert_eq!(t["error_pct"].as_f64(), Some(0.0), "{era}: {t:#}");
        assert!(t["refused_pct"].as_f64().unwrap() > 0.0);
        // Two seconds of stages: a timeline of at least two seconds, ramping.
        let timeline = t["timeline"].as_array().unwrap();
        assert!(timeline.len() >= 2, "{era}: {timeline:?}");
        let first = timeline[0]["answers"].as_u64().unwrap();
        let second = timeline[1]["answers"].as_u64().unwrap();
        assert!(second > first, "{era}: the ramp adds users: {timeline:?}");
        // The firewall's own counts moved the same way.
        let deltas: Vec<&Value> = t["metrics"].as_array().unwrap().iter().collect();
        assert!(
            deltas.iter().any(|m| m["series"]
                .as_str()
                .unwrap()
                .contains("stop_reason=\"rate_limited\"")),
            "{era}: {deltas:?}"
        );
        for f in ["report.md", "report.svg", "report.json"] {
            let text = std::fs::read_to_string(out.join(f)).unwrap();
            assert!(text.len() > 200, "{f}");
        }
        assert!(std::fs::read_to_string(out.join("report.svg"))
            .unwrap()
            .starts_with("<svg"));
        assert!(
            ran.stdout.contains("refused by the firewall"),
            "{}",
            ran.stdout
        );
    }
    demo.firewall.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canned_upstream_without_tokens_in_an_open_loop() {
    let catalog = mcp_bench::catalog::Catalog::new(20, 512).expect("catalog");
    let answers = Arc::new(mcp_bench::upstream::Answers::new(
        &catalog,
        Duration::from_millis(10),
    ));
    let (listener, addr) = mcp_bench::upstream::bind(any_port()).await.unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(mcp_bench::upstream::serve(listener, None, answers, stop));
    let dir = tempfile::tempdir().unwrap();
    let ran = load(
        vec![
            "--target".into(),
            format!("http://{addr}/mcp/bench"),
            "--target".into(),
            format!("http://{addr}/mcp/bench-sse"),
            "--label".into(),
            "json".into(),
            "--label".into(),
            "sse".into(),
            "--anonymous".into(),
            "--rate".into(),
            "200".into(),
            "--vus".into(),
            "8".into(),
            "--duration".into(),
            "1s".into(),
            "--rounds".into(),
            "2".into(),
            "--threshold".into(),
            "errors<1%".into(),
            "--threshold".into(),
            "rate>=150".into(),
        ],
        dir.path(),
    )
    .await;
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    let r = ran.report.expect("report.json");
    for (i, label) in ["json", "sse"].iter().enumerate() {
        let t = &r["targets"][i];
        assert_eq!(t["label"], *label);
        // Two rounds of one second at 200/s.
        let answers = t["answers"].as_u64().unwrap();
        assert!((360..=420).contains(&answers), "{label}: {answers}");
        assert_eq!(outcome(&r, i, "ok"), answers, "{label}: {t:#}");
    }
    assert!(
        ran.stdout.contains("threshold rate>=150 on json: met"),
        "{}",
        ran.stdout
    );

    // Batches (2025-03-26): each message of a batch is an outcome.
    let scenario = write(
        dir.path(),
        "batches.toml",
        "era = \"2025-03-26\"\n[[mix]]\nmethod = \"batch\"\nsize = 3\n[[mix]]\nmethod = \"tools/call\"\n",
    );
    let ran = load(
        vec![
            "--target".into(),
            format!("http://{addr}/mcp/bench"),
            "--anonymous".into(),
            "--scenario".into(),
            scenario.display().to_string(),
            "--requests".into(),
            "40".into(),
            "--vus".into(),
            "2".into(),
        ],
        &dir.path().join("batches"),
    )
    .await;
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    let r = ran.report.expect("report.json");
    let t = &r["targets"][0];
    let answers = t["answers"].as_u64().unwrap();
    assert!((40..=41).contains(&answers), "{t:#}");
    // Half the exchanges are batches of 3.
    assert!(outcome(&r, 0, "ok") >= answers * 2 - 2, "{t:#}");
    assert_eq!(t["messages"].as_u64(), Some(outcome(&r, 0, "ok")));
    let _ = stop_tx.send(true);
    server.abort();
}

/// A firewall in front of the demo upstream, HS256 tokens with `secret`, a
/// role capped at 5 steps per run, auditing into `audit` when given.
async fn capped_firewall(
    dir: &Path,
    secret: &str,
    audit: Option<(&str, &str)>,
) -> (mcp_firewall::app::Running, mcp_demo_upstream::DemoUpstream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = mcp_demo_upstream::spawn(listener, Default::default())
        .await
        .unwrap();
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    for (name, text) in mcp_firewall::demo::run::POLICIES {
        std::fs::write(policies.join(name), text).unwrap();
    }
    std::fs::write(
        policies.join("90-load.toml"),
        "[[agents]]\nname = \"load-capped\"\nprojects = [\"sre\"]\nrisks = [\"read\"]\nallow = [{ upstream = \"incidents\" }]\nmax_steps = 5\ncalls_per_s = 10000\n",
    )
    .unwrap();
    let audit = match audit {
        Some((url, db)) => format!(
            "[audit]\nenabled = true\n[audit.clickhouse]\nurl = \"{url}\"\ndatabase = \"{db}\"\n[audit.spool]\ndir = \"{}\"\nfsync_interval_ms = 20\n[audit.batch]\nmax_rows = 1000\nmax_age_ms = 50\n\n",
            dir.join("spool").display()
        ),
        None => String::new(),
    };
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nplaintext = true\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [auth]\nmcp_audience = \"mcp-firewall\"\nadmin_audience = \"mcp-firewall-admin\"\nissuers = [\"https://idp.load.test\"]\n\
         [[auth.keys]]\nalg = \"HS256\"\nsecret = \"{secret}\"\n\n[policy]\ndir = \"{}\"\n\n\
         [limits]\nper_run_tool_per_s = 0\nper_ip_per_s = 0\n\n{audit}\
         [[upstream]]\nname = \"incidents\"\nurl = \"{}\"\nprojects = [\"sre\"]\n",
        policies.display(),
        upstream.url()
    );
    let cfg = mcp_firewall::config::load_str(&text, Path::new("load.toml"), dir, &|k| {
        std::env::var(k).ok()
    })
    .unwrap_or_else(|e| panic!("config: {e}\n{text}"));
    let running = mcp_firewall::app::start(Arc::new(cfg))
        .await
        .expect("firewall");
    (running, upstream)
}

const CLAIMS: &str = r#"
issuer = "https://idp.load.test"
audience = "mcp-firewall"
tenant = "acme"
agent = "load-capped"
projects = ["sre"]
lifetime_s = 600
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minted_runs_meet_their_step_cap_and_every_answered_call_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "load-test-secret-that-is-long-enough-for-hs256";
    let ch = mcp_bench::clickhouse::ClickHouse::available().then(|| {
        mcp_bench::clickhouse::ClickHouse::start(
            &dir.path().join("ch"),
            &mcp_bench::procs::Placement::default(),
        )
        .expect("clickhouse starts")
    });
    let ch_url = ch.as_ref().map(|c| c.url());
    let (fw, upstream) = capped_firewall(
        dir.path(),
        secret,
        ch_url.as_deref().map(|u| (u, "load_audit")),
    )
    .await;
    let url = format!("http://{}/mcp/incidents", fw.mcp_addr);
    let secret_file = write(dir.path(), "secret", secret);
    let claims = write(dir.path(), "claims.toml", CLAIMS);
    let scenario = write(
        dir.path(),
        "deployments.toml",
        "[[mix]]\nmethod = \"tools/call\"\ntool = \"get_deployment\"\narguments = { deployment_id = { pick = [\"dep-1042\", \"dep-1041\"] } }\n",
    );
    // Four runs of 8 calls each; the role allows 5 steps per run.
    let mut args = vec![
        "--target".to_string(),
        url,
        "--mint-secret-file".into(),
        secret_file.display().to_string(),
        "--claims".into(),
        claims.display().to_string(),
        "--runs".into(),
        "4".into(),
        "--calls-per-run".into(),
        "8".into(),
        "--vus".into(),
        "1".into(),
        "--requests".into(),
        "32".into(),
        "--duration".into(),
        "20s".into(),
        "--scenario".into(),
        scenario.display().to_string(),
        "--era".into(),
        "2025-11-25".into(),
    ];
    if let Some(u) = &ch_url {
        args.extend([
            "--verify-audit".into(),
            u.clone(),
            "--audit-database".into(),
            "load_audit".into(),
            "--threshold".into(),
            "audit_missing==0".into(),
        ]);
    }
    let ran = load(args, &dir.path().join("out")).await;
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    let r = ran.report.expect("report.json");
    assert_eq!(outcome(&r, 0, "ok"), 20, "{:#}", r["targets"][0]);
    assert_eq!(outcome(&r, 0, "step_cap"), 12, "{:#}", r["targets"][0]);
    assert_eq!(
        upstream.calls("get_deployment"),
        20,
        "the cap held at the upstream"
    );
    assert!(r["identities"]
        .as_str()
        .unwrap()
        .contains("4 run tokens minted"));
    if ch_url.is_some() {
        let a = &r["targets"][0]["audit"];
        assert_eq!(a["answered"], 32, "{a}");
        assert_eq!(a["found"], 32, "{a}");
    } else {
        eprintln!("clickhouse-server not installed: --verify-audit not exercised");
    }

    // A threshold that cannot hold fails the run with its line.
    let ran = load(
        vec![
            "--target".into(),
            format!("http://{}/mcp/incidents", fw.mcp_addr),
            "--mint-secret-file".into(),
            secret_file.display().to_string(),
            "--claims".into(),
            claims.display().to_string(),
            "--duration".into(),
            "1s".into(),
            "--vus".into(),
            "2".into(),
            "--tool".into(),
            "get_deployment".into(),
            "--threshold".into(),
            "p99<1us".into(),
            "--threshold".into(),
            "refused<100%".into(),
        ],
        &dir.path().join("out2"),
    )
    .await;
    assert_eq!(ran.code, 2, "{}\n{}", ran.stdout, ran.stderr);
    assert!(
        ran.stderr.contains("threshold failed: p99<1us on http://"),
        "{}",
        ran.stderr
    );
    assert!(
        ran.stdout.contains("threshold refused<100% on"),
        "{}",
        ran.stdout
    );
    fw.shutdown().await;
}

#[tokio::test]
async fn a_dry_run_and_the_safety_bounds_send_nothing() {
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let s = seen.clone();
    let accept = tokio::spawn(async move {
        while let Ok((_c, _)) = listener.accept().await {
            s.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let scenario = write(dir.path(), "mix.toml", MIX);
    let target = format!("http://{addr}/mcp");
    let ran = load(
        vec![
            "--target".into(),
            target.clone(),
            "--token".into(),
            "t".into(),
            "--scenario".into(),
            scenario.display().to_string(),
            "--dry-run".into(),
            "--threshold".into(),
            "p99<250ms".into(),
        ],
        dir.path(),
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    for line in [
        "dry run: nothing sent",
        "closed loop, 3 users",
        "stages: 1 s → 1 1 s → 3",
        "6× tools/call get_incident",
        "threshold: p99<250ms",
    ] {
        assert!(ran.stdout.contains(line), "{line:?} in {}", ran.stdout);
    }
    for (args, why) in [
        (vec!["--rate", "5000"], "exceeds --max-rate"),
        (vec!["--vus", "1000"], "exceed --max-vus"),
        (vec!["--duration", "1h"], "exceeds --max-duration"),
        (vec!["--threshold", "p99 about 3"], "threshold"),
    ] {
        let mut a = vec![
            "--target".to_string(),
            target.clone(),
            "--token".into(),
            "t".into(),
        ];
        a.extend(args.iter().map(|s| s.to_string()));
        let ran = load(a, dir.path()).await;
        assert_eq!(ran.code, 1, "{args:?}: {}", ran.stdout);
        assert!(ran.stderr.contains(why), "{args:?}: {}", ran.stderr);
    }
    let ran = load(vec!["--token".into(), "t".into()], dir.path()).await;
    assert_ne!(ran.code, 0, "a target must be named");
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing was sent"
    );
    accept.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_with_a_custom_ca_and_http2() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let tls = mcp_bench::tls::Material::generate(dir.path()).expect("certificates");
    let catalog = mcp_bench::catalog::Catalog::new(10, 256).expect("catalog");
    let answers = Arc::new(mcp_bench::upstream::Answers::new(
        &catalog,
        Duration::from_millis(10),
    ));
    let (listener, addr) = mcp_bench::upstream::bind(any_port()).await.unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server().unwrap());
    let server = tokio::spawn(mcp_bench::upstream::serve(
        listener,
        Some(acceptor),
        answers,
        stop,
    ));
    let url = format!("https://localhost:{}/mcp/bench", addr.port());
    let base = vec![
        "--target".to_string(),
        url,
        "--anonymous".into(),
        "--vus".into(),
        "2".into(),
        "--duration".into(),
        "1s".into(),
        "--http".into(),
        "h2".into(),
    ];
    let mut args = base.clone();
    args.extend(["--ca".into(), tls.cert_file.display().to_string()]);
    let ran = load(args, &dir.path().join("ok")).await;
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stderr.contains("over HTTP/2.0"), "{}", ran.stderr);
    let r = ran.report.expect("report.json");
    assert!(outcome(&r, 0, "ok") > 10, "{:#}", r["targets"][0]);
    assert_eq!(r["targets"][0]["error_pct"].as_f64(), Some(0.0));
    // Without the CA the server is not trusted: a clear failure.
    let ran = load(base, &dir.path().join("untrusted")).await;
    assert_eq!(ran.code, 1, "{}", ran.stdout);
    assert!(ran.stderr.contains("server/discover"), "{}", ran.stderr);
    let _ = stop_tx.send(true);
    server.abort();
}
