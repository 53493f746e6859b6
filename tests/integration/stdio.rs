//! Stdio upstreams (issue 35) through the firewall: a real stdio server
//! (`tests/stdio/box_server.py` on Debian's `/usr/bin/python3`) started,
//! confined and supervised by the firewall, reached by MCP clients over
//! streamable HTTP. The sandbox table (files outside `read`/`write`,
//! `ptrace`, a fork bomb, a memory hog, a TCP connection under `network =
//! "none"` and through the egress proxy of an allow-list); isolation (a
//! process per session, per principal and run without sessions); the
//! lifecycle (a crash mid-call answered with an error and a row, then a
//! restart; stdout that is not JSON-RPC; idle reaping; `max_instances`;
//! DELETE and shutdown leave no process); configuration errors naming the
//! key.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::clickhouse::ClickHouse;
use crate::common::{self, Answer, TestConfig};

const POLICY: &str = r#"
[[agents]]
name = "box-all"
description = "Every tool of the stdio test server"
projects = ["sre"]
risks = ["read"]
allow = [{ upstream = "box" }]
deny = [{ upstream = "box", tools = ["forbidden"] }]
max_steps = 1000

[[tools]]
upstream = "box"
match = ["*"]
risk = "read"
"#;

/// A directory every user may enter (the server runs as a uid of its own when
/// the tests run as root), removed afterwards.
fn open_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix("mcpfw-stdio-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn mode(p: &Path, m: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// The test server and the directories the sandbox is about.
struct Box {
    root: tempfile::TempDir,
}

impl Box {
    fn new() -> Box {
        let root = open_dir();
        let r = root.path();
        // In a directory of its own: the command's directory is readable.
        std::fs::create_dir(r.join("server")).unwrap();
        mode(&r.join("server"), 0o755);
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/stdio/box_server.py"),
            r.join("server/box_server.py"),
        )
        .unwrap();
        mode(&r.join("server/box_server.py"), 0o644);
        for d in ["docs", "other", "out", "elsewhere"] {
            std::fs::create_dir(r.join(d)).unwrap();
            // Open to everyone: only the sandbox stands in the way.
            mode(&r.join(d), 0o777);
        }
        std::fs::write(r.join("docs/readme.txt"), "the docs").unwrap();
        std::fs::write(r.join("other/secret.txt"), "not for the server").unwrap();
        mode(&r.join("docs/readme.txt"), 0o644);
        mode(&r.join("other/secret.txt"), 0o644);
        Box { root }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.path().join(p)
    }

    fn script(&self) -> String {
        self.path("server/box_server.py").display().to_string()
    }
}

fn config(b: &Box, policies: &Path) -> TestConfig {
    let sandbox = toml::Table::from_iter([
        (
            "read".to_owned(),
            toml::Value::Array(vec![b.path("docs").display().to_string().into()]),
        ),
        (
            "write".to_owned(),
            toml::Value::Array(vec![b.path("out").display().to_string().into()]),
        ),
        ("memory_mb".to_owned(), 512.into()),
        ("processes".to_owned(), 24.into()),
    ]);
    TestConfig::new()
        .policies(policies)
        .stdio_upstream("box", &["/usr/bin/python3", &b.script()])
        .upstream_set(
            "box",
            "env",
            toml::Value::Table(toml::Table::from_iter([(
                "LOG_LEVEL".to_owned(),
                "info".into(),
            )])),
        )
        .upstream_set("box", "sandbox", toml::Value::Table(sandbox))
}

fn token() -> String {
    common::sign(&common::claims("box-all", &["sre"]))
}

/// A session of the 2025-11-25 era: initialize, initialized.
struct Session {
    url: String,
    token: String,
    id: String,
    next: u64,
}

impl Session {
    async fn open(url: &str, token: &str) -> Session {
        let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
        let a = common::post(url, token, &[], init).await;
        assert_eq!(a.status, 200, "{}", a.text);
        let id = a
            .headers
            .get("mcp-session-id")
            .unwrap_or_else(|| panic!("a session id: {}", a.text))
            .to_str()
            .unwrap()
            .to_owned();
        let s = Session {
            url: url.to_owned(),
            token: token.to_owned(),
            id,
            next: 1,
        };
        let n = common::post(
            url,
            token,
            &s.headers(),
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        )
        .await;
        assert_eq!(n.status, 202, "{}", n.text);
        s
    }

    fn headers(&self) -> Vec<(&str, &str)> {
        vec![
            ("mcp-session-id", self.id.as_str()),
            ("mcp-protocol-version", "2025-11-25"),
        ]
    }

    async fn call(&mut self, tool: &str, arguments: Value) -> Answer {
        self.next += 1;
        let body = json!({"jsonrpc": "2.0", "id": self.next, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": {"progressToken": format!("p{}", self.next)}}});
        common::post(&self.url, &self.token, &self.headers(), &body.to_string()).await
    }

    /// The tool result's text (the test fails on a JSON-RPC error).
    async fn text(&mut self, tool: &str, arguments: Value) -> String {
        let a = self.call(tool, arguments).await;
        let v = a.json();
        v["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{tool}: no result text in {v}"))
            .to_owned()
    }

    async fn end(&self) {
        let a = common::send(
            reqwest::Method::DELETE,
            &self.url,
            Some(&self.token),
            &self.headers(),
            None,
        )
        .await;
        assert!(a.status < 300, "DELETE: {} {}", a.status, a.text);
    }
}

/// The host's pid of the server process that named itself `token` (its
/// command name; every server is pid 2 of its own PID namespace).
pub fn host_pid(token: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found: Vec<u32> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim_end() == token)
            })
            .collect();
        match found.as_slice() {
            [one] => return *one,
            [] if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("processes named {token}: {other:?}"),
        }
    }
}

/// The process group of `pid` (the server's launcher's, on the host).
fn pgid_of(pid: u32) -> u32 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &st[st.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(2).unwrap().parse().unwrap()
}

fn alive(pid: u32) -> bool {
    // A zombie is not alive: it has exited and waits to be reaped.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

async fn gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Processes of group `pgid`, zombies included.
fn group_of(pgid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|st| {
                    let rest = st.get(st.rfind(')')? + 1..)?.to_owned();
                    rest.split_whitespace().nth(2)?.parse::<u32>().ok()
                })
                == Some(pgid)
        })
        .collect()
}

/// The layers this machine cannot apply (where one is missing, the
/// firewall must refuse to start the server, naming it).
fn missing_layers() -> Vec<String> {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args(["sandbox-exec", "--probe", "--spec", r#"{"required":false}"#])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    report["missing"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|x| x[0].as_str().map(str::to_owned))
                .filter(|l| l != "landlock_scope")
                .collect()
        })
        .unwrap_or_default()
}

/// A TCP listener that records whether anyone connected.
fn listener() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let mut c = c;
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = String::new();
            let _ = c.read_to_string(&mut buf);
            s.lock().unwrap().push(buf);
        }
    });
    (port, seen)
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_table_through_the_firewall() {
    let b = Box::new();
    let policies = common::policy_dir(&[("box.toml", POLICY)]);
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let cfg = config(&b, policies.path()).audit("fw-stdio", &ch.http_url, &db, spool.path());
    let fw = common::firewall(&cfg.text()).await;
    let url = fw.mcp_url("box");
    let missing = missing_layers();
    if !missing.is_empty() {
        // A required sandbox that cannot be applied starts nothing, and
        // says which layer is missing.
        let a = common::post(
            &url,
            &token(),
            &[],
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        )
        .await;
        assert!(a.text.contains("is unavailable"), "{}", a.text);
        let ready = common::http()
            .get(format!("{}/readyz", fw.admin))
            .send()
            .await
            .unwrap();
        assert!(ready
            .text()
            .await
            .unwrap()
            .contains("stdio_sandbox_unavailable"));
        eprintln!("sandbox layers missing here: {missing:?}; checked the refusal");
        fw.stop().await;
        return;
    }
    let mut s = Session::open(&url, &token()).await;
    let pid = host_pid(&s.text("pid", json!({})).await);
    assert!(alive(pid));
    let pgid = pgid_of(pid);

    // Files: docs readable, other not (though its permissions allow it:
    // it is not in the server's view), out writable, elsewhere not.
    let docs = b.path("docs/readme.txt").display().to_string();
    assert_eq!(s.text("read_file", json!({"path": docs})).await, "the docs");
    let other = b.path("other/secret.txt").display().to_string();
    let t = s.text("read_file", json!({"path": other})).await;
    assert!(t.contains("No such file or directory (2)"), "{t}");
    let out = b.path("out/w.txt").display().to_string();
    assert_eq!(s.text("write_file", json!({"path": out})).await, "written");
    let elsewhere = b.path("elsewhere/w.txt").display().to_string();
    let t = s.text("write_file", json!({"path": elsewhere})).await;
    assert!(t.contains("No such file or directory (2)"), "{t}");
    assert!(!b.path("elsewhere/w.txt").exists());

    // System configuration beyond what runtimes read is out of reach (the
    // firewall's own config and keys often live under /etc).
    if Path::new("/etc/hostname").exists() {
        let t = s.text("read_file", json!({"path": "/etc/hostname"})).await;
        assert!(t.contains("No such file or directory (2)"), "{t}");
    }

    // The firewall is not among the processes it can see: only its init
    // (the sandbox's) and itself.
    let ppid = s.text("ppid", json!({})).await;
    assert_eq!(ppid, "1", "its parent is the sandbox's init");
    let seen: Vec<(u32, String)> =
        serde_json::from_str(&s.text("processes", json!({})).await).unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0].1.contains("sandbox-exec"), "{seen:?}");
    assert!(seen[1].1.contains("box_server.py"), "{seen:?}");

    // ptrace, a fork bomb, a memory hog.
    let t = s.text("ptrace", json!({})).await;
    assert!(t.contains("errno=1"), "ptrace refused with EPERM: {t}");
    let t = s.text("fork_bomb", json!({})).await;
    assert!(t.starts_with("stopped after"), "{t}");
    let t = s.text("hog", json!({"mb": 2048})).await;
    assert!(t.contains("MemoryError"), "{t}");

    // No network: a local listener sees nothing.
    let (port, seen) = listener();
    let t = s
        .text("connect", json!({"host": "127.0.0.1", "port": port}))
        .await;
    assert!(t.starts_with("error"), "{t}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(seen.lock().unwrap().is_empty(), "the listener saw nothing");

    // Only the environment it was given.
    let env: Vec<String> = serde_json::from_str(&s.text("env", json!({})).await).unwrap();
    for k in &env {
        assert!(
            ["PATH", "HOME", "TMPDIR", "LOG_LEVEL", "LC_CTYPE"].contains(&k.as_str()),
            "unexpected variable {k} in {env:?}"
        );
    }
    assert!(env.contains(&"LOG_LEVEL".to_owned()));

    // Progress reaches the call that carries its token.
    let a = s.call("progress", json!({})).await;
    assert_eq!(
        a.text.matches("notifications/progress").count(),
        2,
        "{}",
        a.text
    );

    // A second session gets a process of its own.
    let mut s2 = Session::open(&url, &token()).await;
    let pid2 = host_pid(&s2.text("pid", json!({})).await);
    assert_ne!(pid, pid2, "two sessions, two processes");

    // A crash mid-call: an error answer, then the same session goes on in
    // a new process.
    let a = s.call("crash", json!({})).await;
    let v = a.json();
    let msg = v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(msg.contains("exited during the call"), "{msg}");
    assert!(gone(pid).await);
    // What it started (the fork bomb's children) went with it, reaped: no
    // zombie of its group is left (they would count against `processes`).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !group_of(pgid).is_empty() {
        assert!(
            Instant::now() < deadline,
            "left of the group: {:?}",
            group_of(pgid)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = host_pid(&s.text("pid", json!({})).await);
    assert_ne!(again, pid, "restarted");
    assert_eq!(s.text("echo", json!({"text": "hi"})).await, "hi");

    // Stdout that is not JSON-RPC ends the process, clearly.
    let a = s.call("garbage", json!({})).await;
    let v = a.json();
    let msg = v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(msg.contains("not JSON-RPC"), "{msg}");

    let m = fw.metrics().await;
    assert!(
        metric(
            &m,
            "mcp_firewall_stdio_exits_total{upstream=\"box\",reason=\"crashed\"}"
        ) >= 2.0,
        "{m}"
    );
    assert!(
        metric(&m, "mcp_firewall_stdio_starts_total{upstream=\"box\"}") >= 3.0,
        "{m}"
    );

    // The crash is on record: the call's row is an error.
    let deadline = Instant::now() + Duration::from_secs(20);
    let sql = format!(
        "SELECT count() FROM {db}.audit_events FINAL WHERE tool = 'crash' AND is_error = 1 AND row_version = 1"
    );
    while ch
        .try_query(&sql)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(0)
        < 1
    {
        assert!(
            Instant::now() < deadline,
            "no error row for the crashed call"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // DELETE ends the session's process and what it started, even when it
    // ignores its closed stdin and SIGTERM (the close sequence ends in
    // SIGKILL to the whole group); shutdown ends the rest.
    let last = host_pid(&s.text("pid", json!({})).await);
    let child = host_pid(&s.text("spawn_child", json!({})).await);
    assert!(alive(child));
    assert_eq!(s.text("stubborn", json!({})).await, "stubborn");
    let asked = Instant::now();
    s.end().await;
    assert!(gone(last).await, "the session's process ended with it");
    assert!(gone(child).await, "and so did its child");
    assert!(
        asked.elapsed() >= Duration::from_secs(4),
        "stdin closed, 2 s, SIGTERM (ignored), 2 s, SIGKILL: {:?}",
        asked.elapsed()
    );
    assert!(alive(pid2));
    fw.stop().await;
    assert!(gone(pid2).await, "shutdown leaves no process");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_never_reaches_the_process_and_both_are_on_record() {
    if !missing_layers().is_empty() {
        return;
    }
    let b = Box::new();
    let policies = common::policy_dir(&[("box.toml", POLICY)]);
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let spool = tempfile::tempdir().unwrap();
    let cfg =
        config(&b, policies.path()).audit("fw-stdio-refused", &ch.http_url, &db, spool.path());
    let fw = common::firewall(&cfg.text()).await;
    let mut s = Session::open(&fw.mcp_url("box"), &token()).await;
    assert_eq!(s.text("echo", json!({"text": "ran"})).await, "ran");
    let refused = s.call("forbidden", json!({})).await;
    assert!(
        !refused.text.contains("\"ran\""),
        "the denied tool must not run: {}",
        refused.text
    );
    let got: Vec<String> = serde_json::from_str(&s.text("received", json!({})).await).unwrap();
    assert_eq!(
        got,
        ["echo", "received"],
        "the process never saw the denied call"
    );
    // Both on record: the call that ran and the one refused.
    let deadline = Instant::now() + Duration::from_secs(20);
    let sql = format!(
        "SELECT count() FROM {db}.audit_events FINAL WHERE upstream = 'box' AND row_version = 1 AND ((tool = 'echo' AND decision = 'allow') OR (tool = 'forbidden' AND decision != 'allow'))"
    );
    while ch
        .try_query(&sql)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(0)
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "rows of the allowed and the refused call"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_list_reaches_only_the_listed_port_through_the_egress_proxy() {
    if !missing_layers().is_empty() {
        return;
    }
    let b = Box::new();
    let policies = common::policy_dir(&[("box.toml", POLICY)]);
    let (allowed, seen_allowed) = listener();
    let (other, seen_other) = listener();
    let cfg = config(&b, policies.path()).upstream_set(
        "box",
        "sandbox.network",
        toml::Value::Array(vec![format!("127.0.0.1:{allowed}").into()]),
    );
    let fw = common::firewall(&cfg.text()).await;
    let mut s = Session::open(&fw.mcp_url("box"), &token()).await;
    let t = s
        .text(
            "connect_via_proxy",
            json!({"host": "127.0.0.1", "port": allowed}),
        )
        .await;
    assert!(t.contains(" 200 "), "{t}");
    let t = s
        .text(
            "connect_via_proxy",
            json!({"host": "127.0.0.1", "port": other}),
        )
        .await;
    assert!(t.contains(" 403 "), "{t}");
    // Around the proxy: nothing, not the listed port directly, not another
    // host on the forwarder's port (the server has a network namespace of
    // its own: its loopback and the forwarder, no route out).
    let t = s
        .text("connect", json!({"host": "127.0.0.1", "port": allowed}))
        .await;
    assert!(t.starts_with("error"), "{t}");
    let t = s
        .text("connect", json!({"host": "192.0.2.1", "port": 3128}))
        .await;
    assert!(t.starts_with("error"), "{t}");
    let t = s
        .text("connect", json!({"host": "127.0.0.1", "port": 3129}))
        .await;
    assert!(t.starts_with("error"), "{t}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        seen_allowed.lock().unwrap().as_slice(),
        ["hello through the proxy\n"],
        "the listed port saw the tunnel only"
    );
    assert!(
        seen_other.lock().unwrap().is_empty(),
        "the other port saw nothing"
    );
    let m = fw.metrics().await;
    assert_eq!(
        metric(
            &m,
            "mcp_firewall_stdio_egress_refused_total{upstream=\"box\"}"
        ),
        1.0,
        "{m}"
    );
    fw.stop().await;
}

/// A 2026-07-28 call of `pid` (no session) with `token`.
async fn call_2026(url: &str, token: &str) -> Answer {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pid","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
    common::post(
        url,
        token,
        &[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "pid"),
        ],
        body,
    )
    .await
}

/// A 2026-07-28 call (no session) of `token`: the process id.
async fn pid_2026(url: &str, token: &str) -> u32 {
    host_pid(&token_2026(url, token).await)
}

async fn token_2026(url: &str, token: &str) -> String {
    let v = call_2026(url, token).await.json();
    v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_are_per_principal_and_run_without_sessions_and_reaped_when_idle() {
    if !missing_layers().is_empty() {
        return;
    }
    let b = Box::new();
    let policies = common::policy_dir(&[("box.toml", POLICY)]);
    let cfg = config(&b, policies.path())
        .upstream_set("box", "idle_timeout_s", 1)
        .upstream_set("box", "max_instances", 3);
    let fw = common::firewall(&cfg.text()).await;
    let url = fw.mcp_url("box");
    let alice = token();
    let mut c = common::claims("box-all", &["sre"]);
    c.sub = "bob".to_owned();
    let bob = common::sign(&c);
    let a1 = pid_2026(&url, &alice).await;
    let a2 = pid_2026(&url, &alice).await;
    let b1 = pid_2026(&url, &bob).await;
    assert_eq!(a1, a2, "one principal and run, one process");
    assert_ne!(a1, b1, "another principal, another process");
    // max_instances = 3: alice's, bob's and the firewall's own listing
    // (or carol's); dave's is refused, clearly.
    let who = |sub: &str| {
        let mut c = common::claims("box-all", &["sre"]);
        c.sub = sub.to_owned();
        common::sign(&c)
    };
    let _ = call_2026(&url, &who("carol")).await;
    let a = call_2026(&url, &who("dave")).await;
    assert!(a.text.contains("max_instances"), "{}", a.text);
    // Idle for a second: reaped, every instance (carol's and the
    // listing's are reaped on their own idle clocks, a moment later under
    // load).
    assert!(gone(a1).await, "idle process reaped");
    assert!(gone(b1).await, "idle process reaped");
    crate::common::wait::eventually(
        "every idle instance reaped",
        Duration::from_secs(10),
        || async {
            metric(
                &fw.metrics().await,
                "mcp_firewall_stdio_instances{upstream=\"box\"}",
            ) == 0.0
        },
    )
    .await;
    fw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_process_serves_every_session_only_when_configured() {
    if !missing_layers().is_empty() {
        return;
    }
    let b = Box::new();
    let policies = common::policy_dir(&[("box.toml", POLICY)]);
    let cfg = config(&b, policies.path()).upstream_set("box", "instances", "shared");
    let fw = common::firewall(&cfg.text()).await;
    let url = fw.mcp_url("box");
    let mut s1 = Session::open(&url, &token()).await;
    let mut c = common::claims("box-all", &["sre"]);
    c.sub = "bob".to_owned();
    let mut s2 = Session::open(&url, &common::sign(&c)).await;
    let p1 = host_pid(&s1.text("pid", json!({})).await);
    let p2 = host_pid(&s2.text("pid", json!({})).await);
    assert_eq!(p1, p2, "one process for every session");
    // Ids of two sessions never meet: both send id 2, each gets its own.
    let (a, b2) = tokio::join!(
        s1.text("echo", json!({"text": "one"})),
        s2.text("echo", json!({"text": "two"}))
    );
    assert_eq!((a.as_str(), b2.as_str()), ("one", "two"));
    // Ending one session leaves the process to the other.
    s1.end().await;
    assert_eq!(s2.text("echo", json!({"text": "still"})).await, "still");
    assert!(alive(p1));
    fw.stop().await;
    assert!(gone(p1).await);
}

#[test]
fn bad_stdio_configuration_names_the_key() {
    let b = Box::new();
    let policies = common::policy_dir(&[("box.toml", POLICY)]);
    let load = |cfg: TestConfig| {
        mcp_firewall::config::load_str(&cfg.text(), Path::new("t.toml"), Path::new("."), &|_| None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    // Each bad value, the key the error must name, and a word of why.
    let list = |v: &str| toml::Value::Array(vec![v.into()]);
    for (key, value, named, why) in [
        (
            "command",
            list("no-such-program-here"),
            "upstream[0].command",
            "not an executable",
        ),
        (
            "sandbox.read",
            list("/no/such/dir"),
            "upstream[0].sandbox.read[0]",
            "does not exist",
        ),
        (
            "sandbox.network",
            list("api.example.com"),
            "upstream[0].sandbox.network[0]",
            "host:port",
        ),
        (
            "env_from",
            list("MCPFW_SURELY_UNSET_VARIABLE"),
            "upstream[0].env_from[0]",
            "not set",
        ),
        // A client may not pick the process.
        (
            "forward_headers",
            list("X-Mcp-Firewall-Instance"),
            "upstream[0].forward_headers[0]",
            "managed by the firewall",
        ),
    ] {
        let e = load(config(&b, policies.path()).upstream_set("box", key, value));
        assert!(e.contains(named) && e.contains(why), "{key}: {e}");
    }
    let e = load(config(&b, policies.path()).upstream_set("box", "url", "http://x/"));
    assert!(e.contains("upstream[0].url"), "{e}");
    // A stdio key on an HTTP upstream.
    let e = load(
        TestConfig::new()
            .upstream("web", "http://127.0.0.1:9/mcp")
            .upstream_set("web", "max_instances", 3),
    );
    assert!(
        e.contains("upstream[0].max_instances") && e.contains("stdio"),
        "{e}"
    );
    // check reports the layers.
    let cfg = mcp_firewall::config::load_str(
        &config(&b, policies.path()).text(),
        Path::new("t.toml"),
        Path::new("."),
        &|_| None,
    )
    .unwrap();
    let out = mcp_firewall::cli::check(&cfg).unwrap();
    assert!(
        out.contains("upstream box -> stdio: /usr/bin/python3"),
        "{out}"
    );
    let (report, ok) = mcp_firewall::cli::check_sandboxes(&cfg);
    if missing_layers().is_empty() {
        assert!(ok, "{report}");
        assert!(
            report.contains(
                "sandbox box: net_namespace, pid_namespace, mount_namespace, ipc_namespace, rlimits"
            ),
            "{report}"
        );
        assert!(report.contains("seccomp"), "{report}");
    } else {
        assert!(!ok && report.contains("error"), "{report}");
    }
}

const ESCAPES_POLICY: &str = r#"
[[agents]]
name = "box-all"
description = "Every tool of the stdio test servers"
projects = ["sre"]
risks = ["read"]
allow = [{ upstream = "box" }, { upstream = "open" }, { upstream = "broken" }]
max_steps = 1000

[[tools]]
upstream = "box"
match = ["*"]
risk = "read"

[[tools]]
upstream = "open"
match = ["*"]
risk = "read"

[[tools]]
upstream = "broken"
match = ["*"]
risk = "read"
"#;

/// A UNIX listener at `path` (mode 0777) that records what arrives.
fn unix_listener(path: &Path) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use std::os::unix::fs::PermissionsExt;
    let l = std::os::unix::net::UnixListener::bind(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let mut c = c;
            let mut buf = [0u8; 256];
            let n = c.read(&mut buf).unwrap_or(0);
            s.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    });
    seen
}

/// A hostile server run by the firewall (started as `serve`, as root and
/// as the unprivileged firewall user) tries each way out the sandbox had:
/// one principal's fork bomb against other principals' new sessions; a
/// host UNIX socket and another upstream's egress socket under `network =
/// "none"`; the predictable runtime directory a local user prepared with a
/// proxy of their own; and a server that cannot start, whose client must
/// be answered at once. Every target records that nothing arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_server_escapes_nothing_through_the_firewall() {
    use std::os::unix::fs::PermissionsExt;
    if !missing_layers().is_empty() {
        eprintln!("sandbox layers missing here: the refusal is checked by the_sandbox_table_through_the_firewall");
        return;
    }
    for user in crate::sandbox::launcher_users() {
        let b = Box::new();
        let policies = b.path("policies");
        common::copy_policies(&common::shipped_policies(), &policies);
        std::fs::write(policies.join("box.toml"), ESCAPES_POLICY).unwrap();
        std::process::Command::new("chmod")
            .args(["-R", "a+rX"])
            .arg(&policies)
            .status()
            .unwrap();
        // The listed target of `open`, and a port it may not reach.
        let (target, target_seen) = listener();
        let (unlisted, unlisted_seen) = listener();
        // A server whose script its user cannot reach.
        let locked = b.path("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::copy(b.script(), locked.join("box_server.py")).unwrap();
        std::os::unix::fs::chown(&locked, Some(4343), Some(4343)).unwrap();
        mode(&locked, 0o700);
        let (port, admin) = (crate::audit_e2e::free_port(), crate::audit_e2e::free_port());
        let cfg = TestConfig::new()
            .policies(&policies)
            .set("server.listen", format!("127.0.0.1:{port}"))
            .set("admin.listen", format!("127.0.0.1:{admin}"))
            .set("log.level", "info")
            .stdio_upstream("box", &["/usr/bin/python3", &b.script()])
            .upstream_set(
                "box",
                "sandbox",
                toml::Value::Table(toml::Table::from_iter([
                    ("network".to_owned(), "none".into()),
                    ("processes".to_owned(), 16.into()),
                ])),
            )
            .stdio_upstream("open", &["/usr/bin/python3", &b.script()])
            .upstream_set(
                "open",
                "sandbox",
                toml::Value::Table(toml::Table::from_iter([(
                    "network".to_owned(),
                    toml::Value::Array(vec![format!("127.0.0.1:{target}").into()]),
                )])),
            )
            .stdio_upstream(
                "broken",
                &[
                    "/usr/bin/python3",
                    &locked.join("box_server.py").display().to_string(),
                ],
            );
        let file = b.path("firewall.toml");
        std::fs::write(&file, cfg.text()).unwrap();
        mode(&file, 0o644);
        let log = b.path("serve.log");
        let mut cmd = match user {
            None => std::process::Command::new(env!("CARGO_BIN_EXE_mcp-firewall")),
            Some(uid) => {
                let mut c = std::process::Command::new("setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"))
                    .arg("--clear-groups")
                    .arg(crate::sandbox::shared_binary());
                c
            }
        };
        let mut fw = cmd
            .args(["serve", "--config"])
            .arg(&file)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // A local user prepares the runtime directory the firewall used to
        // pick (`/tmp/mcp-firewall-stdio-<pid>-<upstream>`), with a proxy
        // of their own where the egress socket would go.
        let fw_pid = fw.id();
        let trap = PathBuf::from(format!("/tmp/mcp-firewall-stdio-{fw_pid}-open"));
        let _ = std::fs::remove_dir_all(&trap);
        std::fs::create_dir(&trap).unwrap();
        mode(&trap, 0o777);
        let trap_seen = unix_listener(&trap.join("egress.sock"));
        std::os::unix::fs::chown(&trap, Some(4344), Some(4344)).unwrap();
        crate::audit_e2e::wait_listening(port).await;
        let logged = || std::fs::read_to_string(&log).unwrap_or_default();
        let who = format!("firewall as {user:?}");
        let url = |u: &str| format!("http://127.0.0.1:{port}/mcp/{u}");

        // 1. One principal's server forks to its limit and holds; three new
        //    sessions of another principal start and work.
        let mut a = Session::open(&url("box"), &token()).await;
        let held = a.text("hold_processes", json!({})).await;
        assert!(
            held.starts_with("holding ") && held.contains("Resource temporarily unavailable"),
            "{who}: {held}"
        );
        let mut bob = common::claims("box-all", &["sre"]);
        bob.sub = "bob".to_owned();
        let bob = common::sign(&bob);
        let sessions = futures_util::future::join_all((0..3).map(|_| async {
            let mut s = Session::open(&url("box"), &bob).await;
            s.text("echo", json!({"text": "started"})).await
        }))
        .await;
        assert_eq!(sessions, vec!["started"; 3], "{who}");

        // 2. What the server sees: its init and itself; not the firewall.
        let mut s = Session::open(&url("box"), &bob).await;
        let seen: Vec<(u32, String)> =
            serde_json::from_str(&s.text("processes", json!({})).await).unwrap();
        assert_eq!(seen.len(), 2, "{who}: {seen:?}");
        assert!(
            !format!("{seen:?}").contains("serve --config"),
            "{who}: {seen:?}"
        );
        let mounts = s
            .text("read_file", json!({"path": "/proc/self/mountinfo"}))
            .await;
        assert!(
            !mounts.contains(&file.display().to_string()),
            "{who}: {mounts}"
        );
        assert!(!mounts.contains("/policies"), "{who}: {mounts}");

        // 3. An allow-listed server reaches its target through its own
        //    proxy, nothing else; the prepared directory is never used.
        let mut o = Session::open(&url("open"), &bob).await;
        let t = o
            .text(
                "connect_via_proxy",
                json!({"host": "127.0.0.1", "port": unlisted}),
            )
            .await;
        assert!(t.contains("403"), "{who}: {t}");
        let t = o
            .text(
                "connect_via_proxy",
                json!({"host": "127.0.0.1", "port": target}),
            )
            .await;
        assert!(t.contains("200"), "{who}: {t}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(target_seen.lock().unwrap().len(), 1, "{who}");
        assert!(unlisted_seen.lock().unwrap().is_empty(), "{who}");
        assert!(
            trap_seen.lock().unwrap().is_empty(),
            "{who}: the prepared proxy was used"
        );
        // Its egress socket is in a directory of its own: unguessable,
        // 0700, owned by the firewall's user.
        let text = logged();
        let socket = text
            .lines()
            .find(|l| l.contains("stdio egress proxy listening") && l.contains("upstream=\"open\""))
            .and_then(|l| l.split("socket=").nth(1))
            .map(|s| {
                s.split_whitespace()
                    .next()
                    .unwrap_or("")
                    .trim_matches('"')
                    .to_owned()
            })
            .unwrap_or_else(|| panic!("{who}: no egress socket in the log: {text}"));
        let dir = Path::new(&socket).parent().unwrap();
        let meta = std::fs::metadata(dir).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            meta.permissions().mode() & 0o777,
            0o700,
            "{who}: {}",
            dir.display()
        );
        assert_eq!(meta.uid(), user.unwrap_or(0), "{who}");
        assert!(!dir.starts_with(&trap), "{who}");

        // 4. Under `network = "none"`: neither another upstream's egress
        //    socket nor a host socket is reachable.
        let host_dir = b.path("sockets");
        std::fs::create_dir(&host_dir).unwrap();
        mode(&host_dir, 0o777);
        let host_seen = unix_listener(&host_dir.join("host.sock"));
        for path in [
            socket.clone(),
            host_dir.join("host.sock").display().to_string(),
        ] {
            let t = s.text("connect_unix", json!({"path": path})).await;
            assert!(t.starts_with("error"), "{who}: {path}: {t}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            target_seen.lock().unwrap().len(),
            1,
            "{who}: tunnelled through open's proxy"
        );
        assert!(host_seen.lock().unwrap().is_empty(), "{who}");

        // 5. A server that cannot start: its client is answered at once,
        //    naming why; /readyz and the metric say so.
        let asked = Instant::now();
        let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
        let answer = common::post(&url("broken"), &bob, &[], init).await;
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{who}: {:?}",
            asked.elapsed()
        );
        let v = answer.json();
        let msg = v["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{who}: {v}"));
        assert!(msg.contains("could not start"), "{who}: {msg}");
        assert!(
            msg.contains("box_server.py"),
            "{who}: names the cause: {msg}"
        );
        let admin_get = |path: &str| {
            let u = format!("http://127.0.0.1:{admin}{path}");
            async move {
                common::http()
                    .get(u)
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap()
            }
        };
        let ready = admin_get("/readyz").await;
        assert!(ready.contains("stdio_start_failed"), "{who}: {ready}");
        let m = admin_get("/metrics").await;
        assert!(
            metric(
                &m,
                "mcp_firewall_stdio_exits_total{upstream=\"broken\",reason=\"start_failed\"}"
            ) >= 1.0,
            "{who}: {m}"
        );

        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(fw_pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = fw.wait();
        let _ = std::fs::remove_dir_all(&trap);
        drop(a);
    }
}
