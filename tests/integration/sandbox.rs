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
            "pid_namespace",
            "mount_namespace",
            "ipc_namespace",
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
    // Outside the lists, nothing exists for it.
    assert!(
        out.contains(&format!("{}/f.txt: No such file", other.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "cannot create {}/new: Read-only file system",
            docs.display()
        )),
        "read is not write: {out}"
    );
    assert!(
        out.contains(&format!(
            "cannot create {}/new: Directory nonexistent",
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

/// An unprivileged firewall user (the Kubernetes setup runs the firewall
/// as uid 10001): the launcher is run as this uid too when the tests run
/// as root.
pub const FIREWALL_USER: u32 = 10_001;

/// Who runs the launcher: the tests' own user and, when that is root, the
/// unprivileged firewall user as well.
pub fn launcher_users() -> Vec<Option<u32>> {
    if nix::unistd::getuid().is_root() {
        vec![None, Some(FIREWALL_USER)]
    } else {
        vec![None]
    }
}

/// The firewall binary at a path every user may execute (the build may be
/// under a directory only root can enter): a hard link, or a copy, in a
/// directory of /tmp.
pub fn shared_binary() -> std::path::PathBuf {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let src = std::path::Path::new(env!("CARGO_BIN_EXE_mcp-firewall"));
        let dir = std::path::PathBuf::from(format!("/tmp/mcpfw-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.join("mcp-firewall");
        let _ = std::fs::remove_file(&bin);
        if std::fs::hard_link(src, &bin).is_err() {
            std::fs::copy(src, &bin).unwrap();
        }
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        bin
    })
    .clone()
}

/// `mcp-firewall ARGS` as `user` (`None`: this process's user), with
/// `stdin`.
pub fn firewall_as(user: Option<u32>, args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut cmd = match user {
        None => Command::new(env!("CARGO_BIN_EXE_mcp-firewall")),
        Some(uid) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg(shared_binary());
            c
        }
    };
    let mut child = cmd
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mcp-firewall runs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

/// `code` run by Python in a `network = "none"` sandbox launched by
/// `user`: the JSON it printed, and everything it printed.
fn python_report(user: Option<u32>, code: &str) -> (serde_json::Value, String) {
    let o = firewall_as(
        user,
        &[
            "sandbox-exec",
            "--spec",
            r#"{"network":"none"}"#,
            "--",
            "/usr/bin/python3",
            "-c",
            code,
        ],
        b"",
    );
    let out = text(&o);
    let got =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("as {user:?}: {e}: {out}"));
    (got, out)
}

/// A directory of /tmp every user may enter, with mode `mode`.
fn open_tmp(mode: u32) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix("mcpfw-sandbox-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    d
}

/// System calls on neither list: the allow-list's default (`ENOSYS`)
/// stops them (x86_64 numbers: `iopl`, `ioperm`, `uselib`, `getpid`
/// through the x32 ABI).
#[cfg(target_arch = "x86_64")]
const UNLISTED: &[(&str, i64)] = &[
    ("iopl", 172),
    ("ioperm", 173),
    ("uselib", 134),
    ("getpid (x32 ABI)", 39 | 0x4000_0000),
];
#[cfg(not(target_arch = "x86_64"))]
const UNLISTED: &[(&str, i64)] = &[];

/// Every entry of the seccomp table, made from inside a sandbox with the
/// arguments that make it: each fails with EPERM (one assertion per
/// entry). What the runtimes need still works (fork, TCP and UNIX
/// sockets, netlink routing, the personality query), and `clone3` fails
/// with ENOSYS so the libc falls back to `clone`.
#[test]
fn every_refusal_of_the_seccomp_table_is_refused() {
    if !layers_here_or_refused() {
        return;
    }
    use mcp_firewall::sandbox::seccomp::REFUSED;
    let calls: Vec<serde_json::Value> = REFUSED
        .iter()
        .map(|r| serde_json::json!([r.name, r.nr, r.probe]))
        .collect();
    let code = format!(
        r#"
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {{}}
def make(name, nr, args):
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args], ctypes.c_long(0), ctypes.c_long(0))
    out[name] = "ok" if rc >= 0 else os.strerror(ctypes.get_errno())
for name, nr, args in json.loads({calls:?}):
    make(name, nr, args)
make("clone3", {clone3}, [0, 0, 0, 0])
for name, nr in {unlisted}:
    make(name, nr, [3, 0, 0, 0])
make("personality(query)", {personality}, [0xffffffff, 0, 0, 0])
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
out["fork"] = "ok"
for fam, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_DGRAM), (socket.AF_UNIX, socket.SOCK_STREAM)):
    socket.socket(fam, kind).close()
out["tcp, udp, unix sockets"] = "ok"
socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
out["netlink routing"] = "ok"
print(json.dumps(out))
"#,
        calls = serde_json::Value::from(calls).to_string(),
        clone3 = libc::SYS_clone3,
        personality = libc::SYS_personality,
        unlisted = serde_json::json!(UNLISTED),
    );
    for user in launcher_users() {
        let (got, out) = python_report(user, &code);
        for r in REFUSED {
            assert_eq!(
                got[r.name], "Operation not permitted",
                "as {user:?}: {} ({}) must be refused with EPERM: {out}",
                r.name, r.why
            );
        }
        assert_eq!(got["clone3"], "Function not implemented", "{out}");
        // Default deny: what is not on the allow-list does not run.
        for (name, _) in UNLISTED {
            assert_eq!(
                got[*name], "Function not implemented",
                "as {user:?}: {name}: {out}"
            );
        }
        for allowed in [
            "personality(query)",
            "fork",
            "tcp, udp, unix sockets",
            "netlink routing",
        ] {
            assert_eq!(got[allowed], "ok", "as {user:?}: {allowed}: {out}");
        }
    }
}

/// The filesystem view: a host UNIX socket (mode 0777) is not reachable
/// under `network = "none"` and its listener receives nothing; `/proc`
/// shows only the sandbox's own processes (not the firewall's command
/// line), and `/proc/self/mountinfo` only the sandbox's own mounts.
#[test]
fn host_sockets_other_processes_and_the_hosts_files_are_out_of_view() {
    if !layers_here_or_refused() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = open_tmp(0o755);
    let path = dir.path().join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let me = std::fs::read_to_string("/proc/self/cmdline")
        .unwrap()
        .replace('\0', " ");
    let code = format!(
        r#"
import json, os, socket
out = {{}}
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect({path:?})
    s.sendall(b"escaped")
    out["socket"] = "connected"
except OSError as e:
    out["socket"] = e.strerror
out["proc"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["cmdlines"] = [open(f"/proc/{{p}}/cmdline", "rb").read().decode(errors="replace") for p in out["proc"]]
out["mountinfo"] = open("/proc/self/mountinfo").read()
out["root"] = sorted(os.listdir("/run")) if os.path.exists("/run") else None
print(json.dumps(out))
"#,
        path = path.display().to_string()
    );
    for user in launcher_users() {
        let (got, out) = python_report(user, &code);
        assert_eq!(
            got["socket"], "No such file or directory",
            "as {user:?}: {out}"
        );
        assert!(
            listener.accept().is_err(),
            "as {user:?}: the host socket's listener received a connection"
        );
        assert_eq!(got["proc"], serde_json::json!([1, 2]), "as {user:?}: {out}");
        let cmdlines = got["cmdlines"].to_string();
        assert!(cmdlines.contains("sandbox-exec"), "{cmdlines}");
        assert!(
            !cmdlines.contains(me.split(' ').next().unwrap_or("?")),
            "as {user:?}: the firewall's command line is visible: {cmdlines}"
        );
        let mounts = got["mountinfo"].as_str().unwrap_or("");
        assert!(
            !mounts.contains(&dir.path().display().to_string()),
            "as {user:?}: {mounts}"
        );
        assert!(!mounts.contains(" /run "), "as {user:?}: {mounts}");
        assert!(
            mounts.contains(" / ") && mounts.contains(" /usr "),
            "{mounts}"
        );
        assert_eq!(got["root"], serde_json::Value::Null, "no /run: {out}");
    }
}

/// The environment is applied at the server's own start, after every
/// layer: an `LD_PRELOAD` library in it is loaded by the server (not
/// root, `no_new_privs` set) and by no launcher.
#[test]
fn the_environment_reaches_only_the_server_after_every_layer() {
    if !layers_here_or_refused() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = open_tmp(0o755);
    let lib = dir.path().join("mark.so");
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::set_permissions(&out_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let src = dir.path().join("mark.c");
    std::fs::write(
        &src,
        r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/prctl.h>
__attribute__((constructor)) static void mark(void) {
    const char *to = getenv("MARK");
    char exe[256] = {0};
    if (!to) return;
    readlink("/proc/self/exe", exe, sizeof exe - 1);
    FILE *f = fopen(to, "a");
    if (!f) return;
    fprintf(f, "uid=%d nnp=%d exe=%s\n", (int)getuid(), prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0), exe);
    fclose(f);
}
"#,
    )
    .unwrap();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("a C compiler (cc) builds the preload library");
    assert!(built.success());
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
    for user in launcher_users() {
        let marks = out_dir.join(format!("marks-{}", user.unwrap_or(0)));
        let env = serde_json::json!({"LD_PRELOAD": lib, "MARK": marks}).to_string();
        let spec =
            serde_json::json!({"network": "none", "read": [dir.path()], "write": [&out_dir]})
                .to_string();
        let o = firewall_as(
            user,
            &[
                "sandbox-exec",
                "--spec",
                &spec,
                "--env-stdin",
                "--",
                "/usr/bin/python3",
                "-c",
                "import os; print(os.environ.get('MARK'))",
            ],
            format!("{env}\n").as_bytes(),
        );
        assert!(o.status.success(), "{}", text(&o));
        let lines = std::fs::read_to_string(&marks).unwrap_or_default();
        let lines: Vec<&str> = lines.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "as {user:?}: only the server loaded it: {lines:?}"
        );
        assert!(lines[0].contains("python"), "{lines:?}");
        assert!(lines[0].contains("nnp=1"), "{lines:?}");
        assert!(!lines[0].starts_with("uid=0 "), "{lines:?}");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(&marks.display().to_string()),
            "the server has its environment"
        );
    }
}

/// Processes are counted per server: one server that forks to its
/// `processes` limit and holds them does not keep others from starting
/// and forking (each has a uid, or a user namespace, of its own).
#[test]
fn one_servers_fork_bomb_does_not_stop_another() {
    if !layers_here_or_refused() {
        return;
    }
    let hold = "import os, time\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n            time.sleep(20); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('held', n, e.strerror, flush=True)\ntime.sleep(20)";
    let work = "import os\nkids = []\nfor _ in range(5):\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    kids.append(pid)\nfor k in kids: os.waitpid(k, 0)\nprint('forked 5')";
    for user in launcher_users() {
        let spawn = |uid: u32, code: &str| {
            let spec = r#"{"network":"none","processes":12}"#;
            let mut args: Vec<String> = Vec::new();
            let bin = match user {
                None => env!("CARGO_BIN_EXE_mcp-firewall").to_owned(),
                Some(u) => {
                    args.extend([
                        format!("--reuid={u}"),
                        format!("--regid={u}"),
                        "--clear-groups".to_owned(),
                        shared_binary().display().to_string(),
                    ]);
                    "setpriv".to_owned()
                }
            };
            args.extend([
                "sandbox-exec".to_owned(),
                "--spec".to_owned(),
                spec.to_owned(),
            ]);
            if user.is_none() && nix::unistd::getuid().is_root() {
                args.extend(["--uid".to_owned(), uid.to_string()]);
            }
            args.extend([
                "--".into(),
                "/usr/bin/python3".into(),
                "-c".into(),
                code.into(),
            ]);
            Command::new(bin)
                .args(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let mut bomb = spawn(1_700_100_001, hold);
        let mut first = String::new();
        {
            use std::io::BufRead;
            let mut r = std::io::BufReader::new(bomb.stdout.as_mut().unwrap());
            r.read_line(&mut first).unwrap();
        }
        if !first.starts_with("held") {
            let _ = bomb.kill();
            let out = bomb.wait_with_output().unwrap();
            panic!("as {user:?}: {first}{}", text(&out));
        }
        let others: Vec<_> = (0..3u32).map(|i| spawn(1_700_100_002 + i, work)).collect();
        for o in others {
            let out = o.wait_with_output().unwrap();
            assert!(
                String::from_utf8_lossy(&out.stdout).contains("forked 5"),
                "as {user:?}: another server could not start or fork: {}",
                text(&out)
            );
        }
        let _ = bomb.kill();
        let _ = bomb.wait();
    }
}

/// A launcher that dies takes its sandbox with it: the init's
/// parent-death signal survives its change of user, and the kernel ends
/// the namespace with its init.
#[test]
fn a_dead_launcher_leaves_no_server_behind() {
    if !layers_here_or_refused() || !nix::unistd::getuid().is_root() {
        return;
    }
    const UID: u32 = 1_700_100_099;
    let alive = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
            .filter(|s| {
                s.lines().any(|l| {
                    l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&UID.to_string())
                }) && !s
                    .lines()
                    .any(|l| l.starts_with("State:") && l.contains('Z'))
            })
            .count()
    };
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args([
            "sandbox-exec",
            "--spec",
            r#"{"network":"none"}"#,
            "--uid",
            &UID.to_string(),
        ])
        .args(["--", "/bin/sleep", "30"])
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while alive() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while alive() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the init and server outlived their launcher"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
