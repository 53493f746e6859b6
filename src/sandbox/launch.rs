//! `mcp-firewall sandbox-exec`: how a server is started confined, in two
//! steps.
//!
//! 1. **The launcher** (started by the firewall in a process group of its
//!    own, with an empty environment) makes the namespaces: a user
//!    namespace when the firewall is not root, the network namespace (and
//!    the egress forwarder in it), then PID, IPC and UTS namespaces. It
//!    starts itself again as the first process of the new PID namespace,
//!    then only waits for it and exits as it did.
//! 2. **The init** (`--init-of`) builds the private root ([`super::root`]),
//!    becomes the server's own user, applies the limits, `no_new_privs`,
//!    Landlock and seccomp to itself, reads the server's environment from
//!    the first line of its stdin (`--env-stdin`: never on a command line,
//!    never seen by a launcher), and starts the server with that
//!    environment and nothing else. It stays as the namespace's init: it
//!    reaps what the server leaves, exits as the server did, and when it
//!    ends the kernel ends every process of the namespace.
//!
//! Where namespaces cannot be made and the sandbox is not `required`, the
//! launcher applies what it can to itself and executes the server
//! directly.

use std::path::{Path, PathBuf};

use super::access::{self, Identity};
use super::{net, root, seccomp, Layer, Report, SandboxError, Spec};

/// What `sandbox-exec` was asked.
#[derive(Debug, Clone, Default)]
pub struct Args {
    /// The spec, as JSON.
    pub spec: String,
    /// Only apply the layers and print the report.
    pub probe: bool,
    /// The egress proxy's socket (an allow-list).
    pub egress_socket: Option<PathBuf>,
    /// The uid a root firewall runs the server as.
    pub uid: Option<u32>,
    /// The gid a root firewall runs the server as (default: the uid).
    pub gid: Option<u32>,
    /// An empty directory for the private root (a fresh temporary one
    /// when absent).
    pub root: Option<PathBuf>,
    /// The server's environment is the first line of stdin.
    pub env_stdin: bool,
    /// The init step: the launcher's report so far.
    pub init_of: Option<String>,
    /// The firewall's uid when it is not root (the init step).
    pub outer_uid: Option<u32>,
    /// The server's command.
    pub command: Vec<String>,
}

/// Exit status when a required layer is missing or the request is wrong.
pub const REFUSED: u8 = 126;
/// Exit status when the command cannot be executed.
pub const CANNOT_EXECUTE: u8 = 127;

/// Runs `sandbox-exec`; the process's exit status.
pub fn main(args: &Args) -> u8 {
    let spec: Spec = match serde_json::from_str(&args.spec) {
        Ok(s) => s,
        Err(e) => return refuse(&format!("invalid --spec: {e}")),
    };
    let program = args.command.first().map(String::as_str).unwrap_or("");
    if program.is_empty() && !args.probe {
        return refuse("no command after --");
    }
    let resolved = super::which(program).unwrap_or_else(|| PathBuf::from(program));
    match &args.init_of {
        Some(outer) => init(args, &spec, &resolved, outer),
        None => launcher(args, &spec, &resolved),
    }
}

fn refuse(why: &str) -> u8 {
    eprintln!("mcp-firewall sandbox-exec: {why}");
    REFUSED
}

/// Step 1: the namespaces, then the init.
fn launcher(args: &Args, spec: &Spec, program: &Path) -> u8 {
    let mut report = Report::default();
    let me = nix::unistd::getuid();
    let outer_uid = (!me.is_root()).then(|| me.as_raw());
    let userns = enter_user_namespace(outer_uid);
    let egress = args.egress_socket.as_deref().map(|socket| net::Egress {
        socket,
        probe: args.probe,
    });
    let wants_netns = matches!(spec.network, super::Network::None) || egress.is_some();
    if wants_netns {
        let made = userns.clone().and_then(|()| net::apply(egress));
        if let Err(e) = report.layer(spec, Layer::NetNamespace, made) {
            return refuse(&e.to_string());
        }
    }
    let made = userns.and_then(|()| enter_pid_namespace());
    if let Err(why) = made {
        let confined = egress.is_some();
        return run_without_init(args, spec, program, outer_uid, confined, &why, report);
    }
    report.applied.push(Layer::IpcNamespace);
    start_init(args, outer_uid, &report)
}

/// A firewall that is not root (`outer_uid`) makes every namespace in a
/// user namespace of the server's own, as its root.
fn enter_user_namespace(outer_uid: Option<u32>) -> Result<(), String> {
    use nix::sched::{unshare, CloneFlags};
    let Some(uid) = outer_uid else {
        return Ok(());
    };
    let gid = nix::unistd::getgid().as_raw();
    unshare(CloneFlags::CLONE_NEWUSER)
        .map_err(|e| format!("unshare(CLONE_NEWUSER): {e} (are user namespaces allowed?)"))
        .and_then(|()| access::write_id_maps(&format!("0 {uid} 1"), &format!("0 {gid} 1")))
}

/// Makes the PID, IPC and UTS namespaces the init starts in.
fn enter_pid_namespace() -> Result<(), String> {
    use nix::sched::{unshare, CloneFlags};
    unshare(CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWUTS)
        .map_err(|e| format!("unshare(CLONE_NEWPID|CLONE_NEWIPC|CLONE_NEWUTS): {e}"))
}

/// No init (the PID namespace could not be made, `why`): the layers this
/// process can still apply, then the server in its place.
fn run_without_init(
    args: &Args,
    spec: &Spec,
    program: &Path,
    outer_uid: Option<u32>,
    egress: bool,
    why: &str,
    mut report: Report,
) -> u8 {
    for l in [
        Layer::PidNamespace,
        Layer::MountNamespace,
        Layer::IpcNamespace,
    ] {
        if let Err(e) = report.layer(spec, l, Err(why.to_owned())) {
            return refuse(&e.to_string());
        }
    }
    let identity = match outer_uid {
        None => root_identity(args),
        Some(_) => Identity::AsIs,
    };
    match confine_rest(spec, program, egress, identity, &[], &mut report) {
        Ok(()) => finish(args, program, report, None),
        Err(e) => refuse(&e.to_string()),
    }
}

/// Starts the init, first process of the new PID namespace, waits for it
/// and exits as it did.
fn start_init(args: &Args, outer_uid: Option<u32>, report: &Report) -> u8 {
    let temp_root = match &args.root {
        Some(_) => None,
        None => match fresh_dir() {
            Ok(d) => Some(d),
            Err(e) => return refuse(&format!("a directory for the private root: {e}")),
        },
    };
    let root_dir = args
        .root
        .clone()
        .or_else(|| temp_root.clone())
        .unwrap_or_default();
    let me_exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return refuse(&format!("cannot find its own program: {e}")),
    };
    let mut cmd = init_command(&me_exe, args, report, &root_dir, outer_uid);
    // The firewall's SIGTERM is for the server: this process outlives it
    // to report how the server ended.
    block_termination_signals();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return refuse(&format!("cannot start the sandbox's init: {e}")),
    };
    // The server's stdin and stdout are the init's: this process keeps no
    // copy (the server's end of stdout closes when the server's does).
    drop_stdio();
    let status = child.wait();
    if let Some(d) = temp_root {
        let _ = std::fs::remove_dir(d);
    }
    match status {
        Ok(s) => exit_code(s),
        Err(e) => refuse(&format!("waiting for the sandbox's init: {e}")),
    }
}

/// The command that starts this program again as the init, with the
/// launcher's report so far and an empty environment.
fn init_command(
    me_exe: &Path,
    args: &Args,
    report: &Report,
    root_dir: &Path,
    outer_uid: Option<u32>,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(me_exe);
    cmd.arg("sandbox-exec")
        .arg("--spec")
        .arg(&args.spec)
        .arg("--init-of")
        .arg(serde_json::to_string(report).unwrap_or_default())
        .arg("--root")
        .arg(root_dir);
    if let Some(uid) = args.uid {
        cmd.arg("--uid").arg(uid.to_string());
    }
    if let Some(gid) = args.gid {
        cmd.arg("--gid").arg(gid.to_string());
    }
    if let Some(uid) = outer_uid {
        cmd.arg("--outer-uid").arg(uid.to_string());
    }
    if args.probe {
        cmd.arg("--probe");
    }
    if args.env_stdin {
        cmd.arg("--env-stdin");
    }
    if let Some(socket) = &args.egress_socket {
        cmd.arg("--egress-socket").arg(socket);
    }
    cmd.arg("--").args(&args.command).env_clear();
    cmd
}

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread.
fn block_termination_signals() {
    let mut blocked = nix::sys::signal::SigSet::empty();
    for s in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGHUP,
    ] {
        blocked.add(s);
    }
    let _ = blocked.thread_block();
}

/// The exit status that repeats how a child ended: its code, or 128 plus
/// the signal that ended it.
fn exit_code(s: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        _ => 1,
    }
}

/// Who a root launcher runs the server as: `--uid` (default `nobody`) and
/// `--gid` (default the uid).
fn root_identity(args: &Args) -> Identity {
    let uid = args.uid.unwrap_or(super::NOBODY);
    Identity::Uid(uid, args.gid.unwrap_or(uid))
}

/// Points this process's stdin and stdout at `/dev/null`: the server's are
/// its own, and a copy kept here would hold its stdout open.
fn drop_stdio() {
    if let Ok(null) = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
    }
}

/// What the server reads: the runtime, its program's package and `read`.
fn read_list(spec: &Spec, program: &Path) -> Vec<PathBuf> {
    let mut r = super::runtime_read(super::program_dir(program).as_deref());
    r.extend(spec.read.iter().cloned());
    r
}

/// A new empty directory (mode 0700, a name nobody can guess) under the
/// system's temporary directory.
fn fresh_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let name = format!(
        "mcp-firewall-root-{}",
        hex::encode(rand::random::<[u8; 12]>())
    );
    let dir = std::env::temp_dir().join(name);
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// The layers a process applies to itself last: limits, identity,
/// `no_new_privs`, Landlock, seccomp.
fn confine_rest(
    spec: &Spec,
    program: &Path,
    egress: bool,
    identity: Identity,
    extra_write: &[PathBuf],
    report: &mut Report,
) -> Result<(), SandboxError> {
    report.layer(spec, Layer::Rlimits, access::rlimits(spec))?;
    report.layer(spec, Layer::Unprivileged, access::unprivileged(identity))?;
    report.layer(
        spec,
        Layer::NoNewPrivs,
        nix::sys::prctl::set_no_new_privs().map_err(|e| e.to_string()),
    )?;
    let read = read_list(spec, program);
    let write: Vec<PathBuf> = super::RUNTIME_WRITE
        .iter()
        .map(PathBuf::from)
        .chain(spec.write.iter().cloned())
        .chain(extra_write.iter().cloned())
        .collect();
    let (fs, net) = access::landlock(&read, &write, &access::ports(spec, egress));
    report.layer(spec, Layer::LandlockFs, fs)?;
    report.layer(spec, Layer::LandlockNet, net)?;
    report.layer(spec, Layer::LandlockScope, access::landlock_scope())?;
    report.layer(spec, Layer::Seccomp, seccomp::apply())?;
    Ok(())
}

/// Step 2, the first process of the PID namespace.
fn init(args: &Args, spec: &Spec, program: &Path, outer: &str) -> u8 {
    // The launcher's end is the sandbox's end.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let mut report: Report = match serde_json::from_str(outer) {
        Ok(r) => r,
        Err(e) => return refuse(&format!("invalid --init-of: {e}")),
    };
    let pid1 = if nix::unistd::getpid().as_raw() == 1 {
        Ok(())
    } else {
        Err("not the first process of a PID namespace".to_owned())
    };
    let view = root::View {
        read: read_list(spec, program),
        write: spec.write.clone(),
        root: args.root.as_deref().unwrap_or(Path::new("/nonexistent")),
    };
    let built = root::build(&view);
    let (mount, proc) = match built {
        Ok(b) => (Ok(()), b.proc),
        Err(e) => (Err(e.clone()), Err(format!("no private root: {e}"))),
    };
    let steps = [
        (Layer::PidNamespace, pid1.and(proc)),
        (Layer::MountNamespace, mount),
    ];
    for (l, outcome) in steps {
        if let Err(e) = report.layer(spec, l, outcome) {
            return refuse(&e.to_string());
        }
    }
    // The IPC namespace was made with the PID namespace: reported in
    // order.
    if let Some(i) = report
        .applied
        .iter()
        .position(|l| *l == Layer::IpcNamespace)
    {
        let l = report.applied.remove(i);
        report.applied.push(l);
    }
    let identity = match args.outer_uid {
        Some(uid) => Identity::Nested(uid),
        None => root_identity(args),
    };
    let private = [PathBuf::from("/tmp"), PathBuf::from("/dev/shm")];
    let egress = args.egress_socket.is_some();
    if let Err(e) = confine_rest(spec, program, egress, identity, &private, &mut report) {
        return refuse(&e.to_string());
    }
    // Changing credentials cleared the parent-death signal: set it again,
    // so the launcher's end still ends the namespace.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let uid = nix::unistd::getuid();
    finish(args, program, report, Some(uid.as_raw()))
}

/// Reports, then (unless probing) starts the server: as a child that this
/// init waits for (`as_init`), or in place of this process.
fn finish(args: &Args, program: &Path, report: Report, as_init: Option<u32>) -> u8 {
    for (layer, why) in &report.missing {
        eprintln!(
            "mcp-firewall sandbox-exec: running without {}: {why}",
            layer.name()
        );
    }
    if args.probe {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
        return 0;
    }
    let env = if args.env_stdin {
        match env_line() {
            Ok(e) => e,
            Err(e) => return refuse(&format!("reading the environment: {e}")),
        }
    } else {
        Vec::new()
    };
    let shown = args.command.first().map(String::as_str).unwrap_or("");
    let mut cmd = std::process::Command::new(program);
    cmd.args(args.command.iter().skip(1)).env_clear().envs(env);
    let who = format!("uid {}", nix::unistd::getuid());
    let Some(_) = as_init else {
        use std::os::unix::process::CommandExt;
        let e = cmd.exec();
        eprintln!("mcp-firewall sandbox-exec: cannot execute {shown} as {who}: {e}");
        return CANNOT_EXECUTE;
    };
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcp-firewall sandbox-exec: cannot execute {shown} as {who}: {e}");
            return CANNOT_EXECUTE;
        }
    };
    // This process keeps no copy of the server's stdin and stdout.
    drop_stdio();
    reap_until(child.id())
}

/// Reaps every process of the namespace until the server (`server`) has
/// ended; exits as it did.
fn reap_until(server: u32) -> u8 {
    use nix::sys::wait::{waitpid, WaitStatus};
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid.as_raw() as u32 == server => {
                return u8::try_from(code).unwrap_or(1)
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid.as_raw() as u32 == server => {
                return u8::try_from(128 + sig as i32).unwrap_or(1)
            }
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 1,
        }
    }
}

/// Longest environment line.
const MAX_ENV: usize = 1 << 20;

/// The server's environment: the first line of stdin, a JSON object of
/// strings, read a byte at a time so nothing after it is consumed.
fn env_line() -> Result<Vec<(String, String)>, String> {
    use std::io::Read;
    use std::os::fd::AsFd;
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| e.to_string())?;
    let mut f = std::fs::File::from(fd);
    let mut line = Vec::with_capacity(1024);
    let mut b = [0u8; 1];
    loop {
        match f.read(&mut b) {
            Ok(0) => break,
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
        }
        if line.len() > MAX_ENV {
            return Err(format!("longer than {MAX_ENV} bytes"));
        }
    }
    if line.is_empty() {
        return Ok(Vec::new());
    }
    let map: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&line).map_err(|e| format!("not a JSON object of strings: {e}"))?;
    Ok(map.into_iter().collect())
}
