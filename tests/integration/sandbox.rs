//! The sandbox a stdio server is started in (issue 35, first part), as
//! `mcp-firewall sandbox-exec` applies it before executing the server: each
//! layer against what it must stop, with the real binary and real
//! processes (`/bin/sh`, Debian's `/usr/bin/python3`).

use std::io::Read;
use std::process::{Command, Output};

fn sandboxed(spec: &str, command: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args(["sandbox-exec", "--spec", spec, "--"])
        .args(command)
        .output()
        .expect("sandbox-exec runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The layers this machine cannot apply (a probe with `required = false`).
/// Where one is missing, a required sandbox must refuse to start the
/// server, naming it: the behaviour tests then check that instead.
fn missing_here() -> Vec<String> {
    let o = Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args([
            "sandbox-exec",
            "--probe",
            "--spec",
            r#"{"network":"none","memory_mb":256,"processes":32,"required":false}"#,
        ])
        .output()
        .expect("probe runs");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    report["missing"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|x| x[0].as_str().unwrap_or("").to_owned())
                // Best effort: never a refusal.
                .filter(|l| l != "landlock_scope")
                .collect()
        })
        .unwrap_or_default()
}

/// True when every layer applies here; else asserts that a required
/// sandbox refuses to run anything (exit 126, the layer named) and false.
fn layers_here_or_refused() -> bool {
    let missing = missing_here();
    if missing.is_empty() {
        return true;
    }
    let o = sandboxed(r#"{"network":"none"}"#, &["/bin/true"]);
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(text(&o).contains("is unavailable"), "{}", text(&o));
    eprintln!("sandbox layers missing on this machine: {missing:?}; checked that a required sandbox refuses");
    false
}

fn python(spec: &str, code: &str) -> String {
    text(&sandboxed(spec, &["/usr/bin/python3", "-c", code]))
}

#[test]
fn every_layer_applies_here_and_is_reported() {
    if !layers_here_or_refused() {
        return;
    }
    let o = Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args([
            "sandbox-exec",
            "--probe",
            "--spec",
            r#"{"network":"none","memory_mb":256,"cpu_s":60,"processes":32}"#,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Landlock scopes are best effort (Linux 6.12+): applied or reported
    // missing, never a refusal.
    let scope = serde_json::json!("landlock_scope");
    let scoped = report["applied"]
        .as_array()
        .is_some_and(|a| a.contains(&scope));
    let mut applied = report["applied"].clone();
    if let Some(a) = applied.as_array_mut() {
        a.retain(|l| *l != scope);
    }
    let mut missing = report["missing"].clone();
    if let Some(m) = missing.as_array_mut() {
        m.retain(|l| l[0] != scope);
        assert!(scoped || m.len() < report["missing"].as_array().unwrap().len());
    }
    assert_eq!(
        applied,
        serde_json::json!([
            "net_namespace",
            "rlimits",
            "unprivileged",
            "no_new_privs",
            "landlock_fs",
            "landlock_net",
            "seccomp"
        ]),
        "{}",
        text(&o)
    );
    assert_eq!(missing, serde_json::json!([]));
    // A spec that is not one is refused before anything runs.
    let o = sandboxed(r#"{"network":"everywhere"}"#, &["/bin/true"]);
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(text(&o).contains("invalid --spec"), "{}", text(&o));
}

#[test]
fn files_outside_read_and_write_are_refused() {
    if !layers_here_or_refused() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (docs, other) = (dir.path().join("docs"), dir.path().join("other"));
    for d in [&docs, &other] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("f.txt"), "content").unwrap();
    }
    // The server runs as nobody: the test's files must not be what stops it.
    Command::new("chmod")
        .args(["-R", "a+rwX"])
        .arg(dir.path())
        .status()
        .unwrap();
    let spec = serde_json::json!({"read": [docs], "write": []}).to_string();
    let script = format!(
        "cat {d}/f.txt && echo; cat {o}/f.txt; echo x > {d}/new; echo x > {o}/new; id -u",
        d = docs.display(),
        o = other.display()
    );
    let o = sandboxed(&spec, &["/bin/sh", "-c", &script]);
    let out = text(&o);
    assert!(out.contains("content"), "a read in docs works: {out}");
    assert!(
        out.contains(&format!("{}/f.txt: Permission denied", other.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "cannot create {}/new: Permission denied",
            docs.display()
        )),
        "read is not write: {out}"
    );
    assert!(
        out.contains(&format!(
            "cannot create {}/new: Permission denied",
            other.display()
        )),
        "{out}"
    );
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .trim_end()
            .ends_with("65534"),
        "not root: {out}"
    );
    assert!(!docs.join("new").exists() && !other.join("new").exists());
    // With `write`, writing there works.
    let spec = serde_json::json!({"read": [], "write": [docs]}).to_string();
    let out = text(&sandboxed(
        &spec,
        &[
            "/bin/sh",
            "-c",
            &format!("echo x > {}/new && echo wrote", docs.display()),
        ],
    ));
    assert!(out.contains("wrote"), "{out}");
}

#[test]
fn ptrace_is_refused_memory_and_processes_are_bounded() {
    if !layers_here_or_refused() {
        return;
    }
    let out = python(
        "{}",
        "import ctypes,errno\nlibc=ctypes.CDLL(None,use_errno=True)\nr=libc.ptrace(0,0,0,0)\nprint('ptrace',r,errno.errorcode.get(ctypes.get_errno()))",
    );
    assert!(out.contains("ptrace -1 EPERM"), "{out}");
    let out = python(
        r#"{"memory_mb":128}"#,
        "try:\n  b=bytearray(512*1024*1024); print('ALLOCATED')\nexcept MemoryError: print('memory refused')",
    );
    assert!(out.contains("memory refused"), "{out}");
    // A fork bomb stops at `processes`.
    let o = sandboxed(
        r#"{"processes":8}"#,
        &[
            "/bin/sh",
            "-c",
            "for i in $(seq 1 40); do sleep 2 & done; echo spawned",
        ],
    );
    let out = text(&o);
    assert!(
        out.contains("Cannot fork") || out.contains("Resource temporarily unavailable"),
        "{out}"
    );
}

#[test]
fn network_none_reaches_nothing_and_an_allow_list_only_its_ports() {
    if !layers_here_or_refused() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other_port = other.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    other.set_nonblocking(true).unwrap();
    let connect = |p: u16| {
        format!("import socket\ntry:\n  socket.create_connection(('127.0.0.1',{p}),timeout=2); print('{p} connected')\nexcept Exception as e: print('{p} refused', e)")
    };
    let out = python(r#"{"network":"none"}"#, &connect(port));
    assert!(out.contains(&format!("{port} refused")), "{out}");
    assert!(listener.accept().is_err(), "the listener saw nothing");
    let spec = serde_json::json!({"network": [format!("localhost:{port}")]}).to_string();
    let out = python(
        &spec,
        &format!("{}\n{}", connect(port), connect(other_port)),
    );
    assert!(out.contains(&format!("{port} connected")), "{out}");
    assert!(out.contains(&format!("{other_port} refused")), "{out}");
    let mut buf = [0u8; 1];
    let seen = listener.accept().map(|(mut s, _)| s.read(&mut buf)).is_ok();
    assert!(seen, "the listed port was reached");
    assert!(other.accept().is_err(), "the other listener saw nothing");
}
